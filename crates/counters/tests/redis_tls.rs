//! The shared store and rate sharing over TLS, with an ACL user: a `redis-server` of this test's
//! own listening with `tls-port` only, its certificate signed by a CA made here (`openssl`), asking
//! every client for a certificate of that CA, and knowing one user (`recovea`) besides a disabled
//! `default`. Fails, never skips, without `redis-server` or `openssl`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use recovea_core::timestamp::Timestamp;
use recovea_counters::{Redis, RedisRateShare, RedisTls, SharedCounters, StoreOptions, SyncPush};
use recovea_testkit::wait::DEADLINE;

const PASSWORD: &str = "s3cret-acl-password";

struct Server {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("recovea-redis-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory");
        recovea_testkit::pki::issue(&dir, &["IP:127.0.0.1"], "recovea");
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let file = |name: &str| dir.join(name).display().to_string();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--tls-auth-clients", "yes"])
            .args(["--tls-cert-file", &file("server.pem"), "--tls-key-file", &file("server.key")])
            .args(["--tls-ca-cert-file", &file("ca.pem")])
            .args([
                "--user",
                "default",
                "off",
                "--user",
                "recovea",
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed to run this test");
        // Up when a sync first succeeds (the test asks until then).
        Self { child, dir, port }
    }

    fn url(&self, password: &str) -> String {
        format!("rediss://recovea:{password}@127.0.0.1:{}/0", self.port)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).expect("a certificate")
    }

    fn tls(&self, ca: &str, client: bool) -> RedisTls {
        RedisTls {
            ca: Some(self.read(ca)),
            client: client.then(|| (self.read("client.pem"), self.read("client.key"))),
        }
    }
}

/// One sync with nothing to push: the connection, the scripts loaded, the store's clock read.
async fn sync(url: &str, tls: &RedisTls) -> Result<(), String> {
    let options = StoreOptions { timeout: Duration::from_millis(1500), ..StoreOptions::default() };
    let store = Redis::with_tls(url, tls, options).map_err(|e| e.to_string())?;
    let push = SyncPush { seq: 1, node_id: "node-tls".into(), windows: Vec::new() };
    let read = store
        .sync("node-tls", &push, Timestamp::from_system_time(SystemTime::now()))
        .await
        .map_err(|e| e.to_string())?;
    assert!(read.store_time.is_some(), "Redis's clock came back");
    Ok(())
}

#[tokio::test]
async fn the_store_reaches_redis_over_tls_as_an_acl_user_and_only_so() {
    let server = Server::start();
    let url = server.url(PASSWORD);
    let tls = server.tls("ca.pem", true);
    let what = "a sync over TLS, trusting the test's CA, with a client certificate, as recovea";
    recovea_testkit::eventually(DEADLINE, what, || async { sync(&url, &tls).await.ok() }).await;

    // Rate sharing takes the same settings.
    let share = RedisRateShare::with_tls(&url, &server.tls("ca.pem", true), "recovea:rate").expect("a share");
    use recovea_counters::RateShare;
    share.exchange(&[]).await.expect("an exchange over TLS");

    for (what, url, tls) in [
        ("another CA", url.clone(), server.tls("other-ca.pem", true)),
        (
            "the public web's roots",
            url.clone(),
            RedisTls { ca: None, client: Some((server.read("client.pem"), server.read("client.key"))) },
        ),
        ("no client certificate", url.clone(), server.tls("ca.pem", false)),
        ("a wrong password", server.url("not-the-password"), server.tls("ca.pem", true)),
    ] {
        let refused = sync(&url, &tls).await.expect_err(what);
        assert!(!refused.contains(PASSWORD) && !refused.contains("not-the-password"), "{what}: {refused}");
    }
    let plain = format!("redis://recovea:{PASSWORD}@127.0.0.1:{}/0", server.port);
    let refused =
        Redis::with_tls(&plain, &server.tls("ca.pem", true), StoreOptions::default()).expect_err("refused");
    assert!(refused.to_string().contains("rediss://"), "{refused}");
}

/// A Redis Cluster that speaks only TLS (to clients, between its servers and to its replicas),
/// asks for a client certificate and knows one ACL user: `rediss+cluster://` with the same
/// certificate options reaches it, counts a window on one of its shards and shares rate limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_reaches_a_redis_cluster_over_tls_as_an_acl_user() {
    let dir = std::env::temp_dir().join(format!("recovea-redis-tls-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory");
    recovea_testkit::pki::issue(&dir, &["IP:127.0.0.1"], "recovea");
    let tls = recovea_testkit::redis_topologies::ClusterTls {
        dir: dir.clone(),
        user: "recovea".to_owned(),
        password: PASSWORD.to_owned(),
    };
    let cluster =
        tokio::task::spawn_blocking(move || recovea_testkit::redis_topologies::Cluster::start_tls(&tls))
            .await
            .expect("a TLS cluster");
    let read = |name: &str| std::fs::read(dir.join(name)).expect("a certificate");
    let certificates =
        RedisTls { ca: Some(read("ca.pem")), client: Some((read("client.pem"), read("client.key"))) };
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://recovea:"), "{url}");

    let options = StoreOptions { timeout: Duration::from_millis(1500), ..StoreOptions::default() };
    let store = Redis::with_tls(&url, &certificates, options).expect("a store");
    let now = Timestamp::from_system_time(SystemTime::now());
    let window = recovea_counters::CapWindow {
        org: recovea_core::ids::OrgId::parse("org_tls").expect("id"),
        cap: recovea_core::ids::CapId::parse("cap_tls").expect("id"),
        start: Timestamp(now.0 - 1_000),
        end: Timestamp(now.0 + 60_000),
    };
    let node = recovea_counters::Counters::new("node-tls");
    node.seed(
        &recovea_counters::Unseeded::fresh(window.clone()),
        recovea_counters::Rebuilt { total: recovea_core::money::Nanos::ZERO, last_start: None },
    );
    node.add(std::slice::from_ref(&window), recovea_core::money::Nanos(5), now);
    node.sync_with(&store, now).await.expect("a sync over TLS");
    let other = recovea_counters::Counters::new("node-other");
    other.sync_with(&store, now).await.expect("a sync");
    let spend = recovea_core::caps::SpendView::spend(other.as_ref(), &window.org, &window.cap, window.start);
    other.sync_with(&store, now).await.expect("a sync");
    let seen = recovea_core::caps::SpendView::spend(other.as_ref(), &window.org, &window.cap, window.start);
    assert_eq!((spend.spent.0, seen.spent.0), (0, 5), "another node reads the window through the cluster");

    use recovea_counters::RateShare;
    let share = RedisRateShare::with_tls(&url, &certificates, "recovea:rate").expect("a share");
    let key = recovea_core::ids::KeyId::parse("key_tls").expect("id");
    share
        .exchange(&[(key, recovea_counters::RateUsage { requests: 1, tokens: 2 })])
        .await
        .expect("an exchange");

    let wrong = url.replace(PASSWORD, "not-the-password");
    let store = Redis::with_tls(&wrong, &certificates, StoreOptions::default()).expect("a store");
    let refused = node.sync_with(&store, now).await.expect_err("a wrong password").to_string();
    assert!(!refused.contains(PASSWORD) && !refused.contains("not-the-password"), "{refused}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
