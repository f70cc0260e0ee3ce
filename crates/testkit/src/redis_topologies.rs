//! Redis topologies of a test's own, on loopback ports: a Redis Cluster (three primaries, each with
//! a replica; over TLS with an ACL user if asked) and a primary with a replica watched by three
//! sentinels. Every process is killed when the value is dropped. `redis-server` and `redis-cli` must
//! be installed: the tests fail, never skip, without them. The servers are asked with `redis-cli`,
//! which speaks TLS as the servers do.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `redis-server` process (a data server or a sentinel), killed on drop.
pub struct Process {
    pub port: u16,
    child: Option<Child>,
}

impl Process {
    fn start(port: u16, args: &[String], cli: &Cli) -> Self {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed to run this test");
        let process = Self { port, child: Some(child) };
        process.wait_until(|| cli.ask(port, &["PING"]).trim() == "PONG", "answer PING");
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

/// How `redis-cli` reaches the servers: its connection flags (TLS, user and password).
#[derive(Default, Clone)]
struct Cli(Vec<String>);

impl Cli {
    /// `command`'s answer from the server on `port`; empty if it does not answer.
    fn ask(&self, port: u16, command: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(&self.0)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(command)
            .stderr(Stdio::null())
            .output()
            .expect("redis-cli must be installed to run this test");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
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

fn data_server_args(port: u16, dir: &Path) -> Vec<String> {
    let port = port.to_string();
    [
        "--port",
        &port,
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

/// TLS for a cluster: every port TLS only (clients, replication and the cluster bus), the
/// certificates of `testkit::pki::issue` in `dir` (clients must show one), and one ACL user besides
/// a disabled `default`.
pub struct ClusterTls {
    pub dir: PathBuf,
    pub user: String,
    pub password: String,
}

impl ClusterTls {
    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn server_args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> =
            ["--port", "0", "--tls-port", &port.to_string()].map(str::to_owned).to_vec();
        for (flag, value) in [
            ("--tls-cluster", "yes".to_owned()),
            ("--tls-replication", "yes".to_owned()),
            ("--tls-auth-clients", "yes".to_owned()),
            ("--tls-cert-file", self.file("server.pem")),
            ("--tls-key-file", self.file("server.key")),
            ("--tls-ca-cert-file", self.file("ca.pem")),
            ("--masteruser", self.user.clone()),
            ("--masterauth", self.password.clone()),
        ] {
            args.extend([flag.to_owned(), value]);
        }
        args.extend(["--user", "default", "off", "--user", &self.user, "on"].map(str::to_owned));
        args.extend([format!(">{}", self.password), "~*".into(), "&*".into(), "+@all".into()]);
        args
    }

    fn cli(&self) -> Cli {
        Cli(vec![
            "--tls".into(),
            "--cacert".into(),
            self.file("ca.pem"),
            "--cert".into(),
            self.file("client.pem"),
            "--key".into(),
            self.file("client.key"),
            "--user".into(),
            self.user.clone(),
            "--pass".into(),
            self.password.clone(),
        ])
    }
}

/// A Redis Cluster of three primaries, each with one replica.
pub struct Cluster {
    pub servers: Vec<Process>,
    pub dir: PathBuf,
    cli: Cli,
    scheme: &'static str,
    credentials: String,
}

impl Cluster {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster that speaks only TLS, to clients with a certificate and `tls`'s user.
    pub fn start_tls(tls: &ClusterTls) -> Self {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&ClusterTls>) -> Self {
        let dir = scratch("cluster");
        let cli = tls.map(ClusterTls::cli).unwrap_or_default();
        let servers: Vec<Process> = (0..6)
            .map(|_| {
                let port = free_cluster_port();
                let mut args = data_server_args(port, &dir);
                if let Some(tls) = tls {
                    args.extend(tls.server_args(port));
                }
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
                Process::start(port, &args, &cli)
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.args(&cli.0).arg("--cluster").arg("create");
        for server in &servers {
            create.arg(format!("127.0.0.1:{}", server.port));
        }
        let status = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli must be installed to run this test");
        assert!(status.success(), "redis-cli --cluster create failed");
        let (scheme, credentials) = match tls {
            Some(tls) => ("rediss", format!("{}:{}@", tls.user, tls.password)),
            None => ("redis", String::new()),
        };
        let cluster = Self { servers, dir, cli, scheme, credentials };
        cluster.wait_until_ok();
        cluster
    }

    /// `redis+cluster://` (`rediss+cluster://` over TLS, with the user) with every server as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.servers.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("{}+cluster://{}{}", self.scheme, self.credentials, seeds.join(","))
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
                let info = self.cli.ask(server.port, &["CLUSTER", "INFO"]);
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
        let asked = self.servers.iter().find(|s| s.is_running()).expect("a running server").port;
        let slot: u16 = self.cli.ask(asked, &["CLUSTER", "KEYSLOT", key]).trim().parse().expect("a slot");
        for line in self.cli.ask(asked, &["CLUSTER", "NODES"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else { continue };
            if !flags.contains("master") || flags.contains("fail") {
                continue;
            }
            let serves = fields.iter().skip(8).any(|range| {
                let (low, high) = range.split_once('-').unwrap_or((range, range));
                matches!((low.parse::<u16>(), high.parse::<u16>()), (Ok(low), Ok(high)) if (low..=high).contains(&slot))
            });
            if serves {
                let port = address.split('@').next().and_then(|a| a.rsplit(':').next());
                let port: u16 = port.and_then(|p| p.parse().ok()).expect("a server's port");
                return self.servers.iter().position(|s| s.port == port).expect("a server of the cluster");
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
        let (dir, cli) = (scratch("sentinel"), Cli::default());
        let primary_port = free_port();
        let primary = Process::start(primary_port, &data_server_args(primary_port, &dir), &cli);
        let replica_port = free_port();
        let mut args = data_server_args(replica_port, &dir);
        args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), primary_port.to_string()]);
        let replica = Process::start(replica_port, &args, &cli);
        replica.wait_until(
            || cli.ask(replica_port, &["INFO", "replication"]).contains("master_link_status:up"),
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
                Process::start(port, &[config.display().to_string(), "--sentinel".to_owned()], &cli)
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
                let answer = Cli::default()
                    .ask(sentinel.port, &["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER]);
                answer.lines().nth(1).and_then(|port| port.trim().parse().ok())
            })
            .collect();
        named.windows(2).all(|pair| pair[0] == pair[1]).then(|| named[0]).flatten()
    }

    /// Waits until every sentinel names `port` the primary, and it says so itself.
    pub fn wait_until_primary_is(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.primary_port() != Some(port)
            || !Cli::default().ask(port, &["INFO", "replication"]).contains("role:master")
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
