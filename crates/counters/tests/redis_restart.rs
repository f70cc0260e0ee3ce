//! Redis going away and coming back empty: the sync fails, the node stays unconfirmed with its
//! increments pending, then recovers, reports the lost windows and counts its increments once.
//!
//! Starts its own `redis-server` (it must be installed: the test fails, never skips, without it).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use recovea_core::caps::SpendView;
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{CapWindow, Counted, Counters, Rebuilt, Redis, STORE_REFILL, StoreOptions, Unseeded};

/// A `redis-server` of this test's own, killed on drop.
struct Server {
    child: Child,
}

impl Server {
    async fn start(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed to run this test");
        let server = Self { child };
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
        let what = format!("redis-server up on port {port}");
        recovea_testkit::eventually(recovea_testkit::wait::DEADLINE, &what, || async {
            let mut connection = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("PING").query_async::<()>(&mut connection).await.ok()
        })
        .await;
        server
    }

    fn kill(mut self) {
        self.child.kill().expect("kill redis-server");
        self.child.wait().expect("reap redis-server");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn org() -> OrgId {
    OrgId::parse("org_restart").expect("org id")
}

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

#[tokio::test]
async fn a_restarted_redis_is_a_flush_and_pending_increments_count_once() {
    let port = free_port();
    let server = Server::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let options = StoreOptions { timeout: Duration::from_millis(500), ..StoreOptions::default() };
    let store = Redis::new(&url, options).expect("store");
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let now = wall();
    let cap = CapId::parse("cap_restart").expect("cap id");
    let w = CapWindow {
        org: org(),
        cap: cap.clone(),
        start: Timestamp(now.0 - 60_000),
        end: Timestamp(now.0 + 3_600_000),
    };

    // Rebuilt from the ledger (100, none of it this node's), then spend on top.
    a.seed(
        &Unseeded::fresh(w.clone()),
        Rebuilt { total: Nanos(100), last_start: Some(Timestamp(now.0 - 1_000)) },
    );
    let outcome = a.sync_with(&store, now).await.expect("sync with redis up");
    assert!(outcome.missing.is_empty());
    let started = wall();
    a.add(std::slice::from_ref(&w), Nanos(5), started);
    a.sync_with(&store, now).await.expect("sync with redis up");
    assert_eq!(a.confirmed_at(), Some(now));

    server.kill();
    a.add(std::slice::from_ref(&w), Nanos(3), wall());
    for later in [1_000, 2_000] {
        assert!(a.sync_with(&store, Timestamp(now.0 + later)).await.is_err(), "redis is down");
        assert_eq!(a.confirmed_at(), Some(now), "confirmation stops advancing");
        let spend = a.spend(&w.org, &cap, w.start);
        assert_eq!(
            (spend.spent, spend.confirmed_at),
            (Nanos(108), Some(now)),
            "pending spend still counts here"
        );
    }

    let _server = Server::start(port).await;
    let recovered = Timestamp(now.0 + 3_000);
    let outcome = a.sync_with(&store, recovered).await.expect("sync recovers on a fresh server");
    assert!(
        outcome.missing.is_empty(),
        "the store lost its data: no window is rebuilt before every node has pushed again"
    );
    assert_eq!(a.spend(&w.org, &cap, w.start).spent, Nanos(108), "the view does not drop to the store's 8");
    // The behaviour under test: the store's refill time passes before the window is rebuilt.
    tokio::time::sleep(STORE_REFILL).await;
    let outcome = a.sync_with(&store, recovered).await.expect("sync");
    let [lost] = &outcome.missing[..] else {
        panic!("the flushed window is reported: {:?}", outcome.missing)
    };
    assert_eq!(lost.window, w);
    assert_eq!(
        lost.counted,
        [Counted { node_id: "node-a".to_owned(), since: started }],
        "the ledger is to leave out what this node's writer holds"
    );
    assert_eq!(a.missing(), vec![lost.clone()]);
    assert_eq!(a.confirmed_at(), Some(recovered));
    assert_eq!(a.spend(&w.org, &cap, w.start).spent, Nanos(108));

    let client = redis::Client::open(url.as_str()).expect("url");
    let connection = client.get_multiplexed_async_connection().await.expect("connect");
    let [total_key, _, _] = store.window_keys(&w.org, &cap, w.start);
    let raw_total = |mut connection: redis::aio::MultiplexedConnection| {
        let key = total_key.clone();
        async move {
            redis::cmd("HGET").arg(key).arg("total").query_async::<i64>(&mut connection).await.expect("HGET")
        }
    };
    assert_eq!(raw_total(connection.clone()).await, 8, "all this node's writer ever counted, once");
    a.sync_with(&store, Timestamp(now.0 + 4_000)).await.expect("sync");
    assert_eq!(raw_total(connection.clone()).await, 8, "and not again");

    // The rebuild: the ledger holds 108, of which this node's 8 are left out.
    a.seed(lost, Rebuilt { total: Nanos(100), last_start: Some(started) });
    assert!(a.missing().is_empty());
    let outcome = a.sync_with(&store, Timestamp(now.0 + 5_000)).await.expect("sync");
    assert!(outcome.missing.is_empty());
    assert_eq!(raw_total(connection.clone()).await, 108);
    b.spend(&w.org, &cap, w.start);
    b.sync_with(&store, Timestamp(now.0 + 5_000)).await.expect("sync b");
    assert_eq!(b.spend(&w.org, &cap, w.start).spent, Nanos(108));
    assert_eq!(a.spend(&w.org, &cap, w.start).spent, Nanos(108));
}

#[tokio::test]
async fn scripts_flushed_from_the_server_are_loaded_again() {
    let port = free_port();
    let _server = Server::start(port).await;
    let url = format!("redis://127.0.0.1:{port}");
    let store = Redis::new(&url, StoreOptions::default()).expect("store");
    let a = Counters::new("node-a");
    let now = wall();
    let w = CapWindow {
        org: org(),
        cap: CapId::parse("cap_scripts").expect("cap id"),
        start: Timestamp(now.0 - 60_000),
        end: Timestamp(now.0 + 3_600_000),
    };
    a.add(std::slice::from_ref(&w), Nanos(5), wall());
    a.sync_with(&store, now).await.expect("sync");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut connection = client.get_multiplexed_async_connection().await.expect("connect");
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut connection).await.expect("SCRIPT FLUSH");
    a.add(std::slice::from_ref(&w), Nanos(2), wall());
    a.sync_with(&store, Timestamp(now.0 + 1_000)).await.expect("sync after SCRIPT FLUSH");
    assert_eq!(a.confirmed_at(), Some(Timestamp(now.0 + 1_000)));
    let [total_key, _, _] = store.window_keys(&w.org, &w.cap, w.start);
    let total: i64 =
        redis::cmd("HGET").arg(total_key).arg("total").query_async(&mut connection).await.expect("HGET");
    assert_eq!(total, 7);
}
