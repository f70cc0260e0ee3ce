//! Redis topologies of a test's own, on loopback ports: a Redis Cluster (three primaries, each with
//! a replica) and a primary with a replica watched by three sentinels. Every process is killed when
//! the value is dropped. `redis-server` and `redis-cli` must be installed: the tests fail, never
//! skip, without them.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `redis-server` process (a data server or a sentinel), killed on drop.
pub struct Process {
    pub port: u16,
    child: Option<Child>,
}

impl Process {
    fn start(port: u16, args: &[String]) -> Self {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed to run this test");
        let process = Self { port, child: Some(child) };
        process.wait_until(|| ping(port), "answer PING");
        process
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process at once (SIGKILL): a crash, not a shutdown.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn wait_until(&self, mut ready: impl FnMut() -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(Instant::now() < deadline, "redis-server on port {} did not {what}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ping(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else { return false };
    let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
        return false;
    };
    redis::cmd("PING").query::<String>(&mut connection).is_ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A free port for a cluster's server, whose bus listens 10,000 ports higher: at most 55,535, both free.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A directory of the test's own for the servers' files (cluster and sentinel state).
fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recovea-{what}-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn data_server_args(port: u16, dir: &std::path::Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A Redis Cluster of three primaries, each with one replica.
pub struct Cluster {
    pub servers: Vec<Process>,
    pub dir: PathBuf,
}

impl Cluster {
    pub fn start() -> Self {
        let dir = scratch("cluster");
        let servers: Vec<Process> = (0..6)
            .map(|_| {
                let port = free_cluster_port();
                let mut args = data_server_args(port, &dir);
                args.extend(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        // A primary that stops answering is replaced by its replica this soon.
                        "--cluster-node-timeout",
                        "1000",
                        // A replica takes over however long ago it last heard from its primary
                        // (the default refuses one idle for a while, as a test's may be).
                        "--cluster-replica-validity-factor",
                        "0",
                    ]
                    .map(str::to_owned),
                );
                Process::start(port, &args)
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for server in &servers {
            create.arg(format!("127.0.0.1:{}", server.port));
        }
        let status = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed to run this test");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Self { servers, dir };
        cluster.wait_until_ok();
        cluster
    }

    /// `redis+cluster://` with every server as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.servers.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Plain URLs of the servers that still run.
    pub fn server_urls(&self) -> Vec<String> {
        self.servers.iter().filter(|s| s.is_running()).map(Process::url).collect()
    }

    /// Waits until every running server says the cluster is ok and every slot is served.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self.servers.iter().filter(|s| s.is_running()).all(|server| {
                let info = info(server.port, "CLUSTER", "INFO");
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not settle");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server that serves `key`'s slot as primary now.
    pub fn primary_of(&self, key: &str) -> usize {
        let slot: i64 = query(self.servers[0].port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        let shards: redis::Value = query(self.servers[0].port, redis::cmd("CLUSTER").arg("SLOTS"));
        let redis::Value::Array(ranges) = shards else { panic!("CLUSTER SLOTS: {shards:?}") };
        for range in ranges {
            let redis::Value::Array(parts) = range else { continue };
            let (
                Some(redis::Value::Int(from)),
                Some(redis::Value::Int(to)),
                Some(redis::Value::Array(primary)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            if (*from..=*to).contains(&slot) {
                let Some(redis::Value::Int(port)) = primary.get(1) else {
                    panic!("CLUSTER SLOTS: {primary:?}")
                };
                return self
                    .servers
                    .iter()
                    .position(|s| i64::from(s.port) == *port)
                    .expect("a server of the cluster");
            }
        }
        panic!("no primary serves slot {slot}")
    }
}

/// A primary and its replica, watched by three sentinels that name it `recovea`.
pub struct Sentinels {
    pub servers: Vec<Process>,
    pub sentinels: Vec<Process>,
    pub dir: PathBuf,
}

pub const SENTINEL_MASTER: &str = "recovea";

impl Sentinels {
    pub fn start() -> Self {
        let dir = scratch("sentinel");
        let primary_port = free_port();
        let primary = Process::start(primary_port, &data_server_args(primary_port, &dir));
        let replica_port = free_port();
        let mut args = data_server_args(replica_port, &dir);
        args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary_port.to_string()]);
        let replica = Process::start(replica_port, &args);
        replica.wait_until(
            || info(replica_port, "INFO", "replication").contains("master_link_status:up"),
            "sync",
        );
        let sentinels = (0..3)
            .map(|i| {
                let port = free_port();
                let config = dir.join(format!("sentinel-{i}.conf"));
                std::fs::write(
                    &config,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                         sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                         sentinel failover-timeout {SENTINEL_MASTER} 5000\n",
                        dir = dir.display()
                    ),
                )
                .expect("sentinel config");
                Process::start(port, &[config.display().to_string(), "--sentinel".to_owned()])
            })
            .collect();
        let topology = Self { servers: vec![primary, replica], sentinels, dir };
        topology.wait_until_primary_is(primary_port);
        topology
    }

    /// `redis+sentinel://` with every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The port of the primary every sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let named: Vec<Option<u16>> = self
            .sentinels
            .iter()
            .map(|sentinel| {
                let reply: Vec<String> = query(
                    sentinel.port,
                    redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(SENTINEL_MASTER),
                );
                reply.get(1).and_then(|port| port.parse().ok())
            })
            .collect();
        named.windows(2).all(|pair| pair[0] == pair[1]).then(|| named[0]).flatten()
    }

    /// Waits until every sentinel names `port` the primary, and it says so itself.
    pub fn wait_until_primary_is(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.primary_port() != Some(port) || !info(port, "INFO", "replication").contains("role:master")
        {
            assert!(Instant::now() < deadline, "the sentinels do not agree on 127.0.0.1:{port}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The data server behind `port`.
    pub fn server(&mut self, port: u16) -> &mut Process {
        self.servers.iter_mut().find(|s| s.port == port).expect("a data server")
    }
}

fn query<T: redis::FromRedisValue>(port: u16, command: &mut redis::Cmd) -> T {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let mut connection =
        client.get_connection_with_timeout(Duration::from_secs(2)).expect("connect to a test server");
    command.query(&mut connection).expect("a test server's answer")
}

fn info(port: u16, command: &str, section: &str) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return String::new();
    };
    redis::cmd(command).arg(section).query(&mut connection).unwrap_or_default()
}
