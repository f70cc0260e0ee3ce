//! A primary killed under traffic, on a Redis Cluster (its replica is promoted) and behind
//! Sentinel (the sentinels promote the replica, the nodes find it through them): the nodes' syncs
//! fail for a moment, then every increment is counted exactly once, without a restart.
//!
//! Each test starts its own servers (`redis-server` and `redis-cli` must be installed: the tests
//! fail, never skip, without them) and prints what it measured on one line starting with
//! `failover:`; `bench/failover.sh` collects those lines over several runs for BENCHMARKS.md.

use std::time::{Duration, Instant, SystemTime};

use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{CapWindow, Counters, Rebuilt, Redis, StoreOptions, Unseeded};

use recovea_testkit::redis_topologies::{Cluster, Sentinels};

/// How long after the kill the counters must be exact again: the cluster's node timeout and the
/// sentinels' down-after are a second, an election a few more.
const RECOVERY: Duration = Duration::from_secs(20);
/// Between two rounds of traffic.
const TICK: Duration = Duration::from_millis(25);

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn window() -> CapWindow {
    let now = wall();
    CapWindow {
        org: OrgId::parse("org_failover").expect("org id"),
        cap: CapId::parse("cap_failover").expect("cap id"),
        start: Timestamp(now.0 - 60_000),
        end: Timestamp(now.0 + 3_600_000),
    }
}

/// What a run saw after the kill.
#[derive(Debug)]
struct Seen {
    /// From the kill to the first failed sync (none failed: `None`).
    first_failure: Option<Duration>,
    /// From the kill to the last failed sync.
    last_failure: Option<Duration>,
    /// From the kill to a round whose syncs all succeeded with both nodes' views exact.
    exact: Duration,
    failed_syncs: usize,
}

/// Two nodes spend one nano-dollar each per round and sync (a, b, then a again, so that a's
/// view holds b's spend); `kill` runs after `warm_up` rounds. Returns what the rounds after it saw.
async fn traffic(store: &Redis, warm_up: usize, kill: impl FnOnce()) -> Seen {
    let w = window();
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    a.seed(&Unseeded::fresh(w.clone()), Rebuilt { total: Nanos::ZERO, last_start: None });
    a.sync_with(store, wall()).await.expect("the first sync");
    let mut added = 0_i64;
    let round = || {
        let (a, b, w) = (&a, &b, &w);
        async move {
            a.add(std::slice::from_ref(w), Nanos(1), wall());
            b.add(std::slice::from_ref(w), Nanos(1), wall());
            let mut failed = 0;
            for node in [a, b, a] {
                if node.sync_with(store, wall()).await.is_err() {
                    failed += 1;
                }
            }
            // Rounds a tick apart: the failover takes its time, counted in rounds.
            tokio::time::sleep(TICK).await;
            failed
        }
    };
    for _ in 0..warm_up {
        assert_eq!(round().await, 0, "every sync succeeds before the kill");
        added += 2;
    }
    kill();
    let killed_at = Instant::now();
    let mut seen = Seen { first_failure: None, last_failure: None, exact: Duration::ZERO, failed_syncs: 0 };
    loop {
        let failed = round().await;
        added += 2;
        let since_kill = killed_at.elapsed();
        if failed > 0 {
            seen.first_failure.get_or_insert(since_kill);
            seen.last_failure = Some(since_kill);
            seen.failed_syncs += failed;
        }
        let view =
            |node: &Counters| recovea_core::caps::SpendView::spend(node, &w.org, &w.cap, w.start).spent;
        if failed == 0 && view(&a) == Nanos(added) && b.confirmed_at().is_some() {
            seen.exact = since_kill;
            return seen;
        }
        assert!(
            since_kill < RECOVERY,
            "the counters are not exact {RECOVERY:?} after the kill: node a sees {:?} of {added}; {seen:?}",
            view(&a)
        );
    }
}

fn options() -> StoreOptions {
    StoreOptions { timeout: Duration::from_millis(500), ..StoreOptions::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_killed_under_traffic_is_a_blip() {
    let mut cluster = tokio::task::spawn_blocking(Cluster::start).await.expect("cluster");
    let store = Redis::new(&cluster.url(), options()).expect("store");
    let w = window();
    let [total_key, _, _] = store.window_keys(&w.org, &w.cap, w.start);
    let victim = cluster.primary_of(&total_key);
    let seen = traffic(&store, 40, || {
        // Everything written so far is on the replica (later writes may not be: they are pushed
        // again, as cumulative totals, and counted once).
        let primary = cluster.servers[victim].url();
        let client = redis::Client::open(primary).expect("url");
        let mut connection = client.get_connection().expect("connect to the primary");
        let _: i64 = redis::cmd("WAIT").arg(1).arg(2_000).query(&mut connection).expect("WAIT");
        cluster.servers[victim].kill();
    })
    .await;
    println!(
        "failover: cluster, syncs failed from {:?} to {:?} after the kill ({} failed), counters exact {:?} after it",
        seen.first_failure, seen.last_failure, seen.failed_syncs, seen.exact
    );
    assert!(seen.failed_syncs > 0, "the kill was seen: the syncs went to its slot's primary");
    cluster.wait_until_ok();
    assert_ne!(cluster.primary_of(&total_key), victim, "the replica serves the slot now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_behind_sentinel_killed_under_traffic_is_a_blip() {
    let mut sentinels = tokio::task::spawn_blocking(Sentinels::start).await.expect("sentinels");
    let store = Redis::new(&sentinels.url(), options()).expect("store");
    let (primary, replica) = (sentinels.servers[0].port, sentinels.servers[1].port);
    let seen = traffic(&store, 40, || {
        let client = redis::Client::open(sentinels.servers[0].url()).expect("url");
        let mut connection = client.get_connection().expect("connect to the primary");
        let _: i64 = redis::cmd("WAIT").arg(1).arg(2_000).query(&mut connection).expect("WAIT");
        sentinels.server(primary).kill();
    })
    .await;
    println!(
        "failover: sentinel, syncs failed from {:?} to {:?} after the kill ({} failed), counters exact {:?} after it",
        seen.first_failure, seen.last_failure, seen.failed_syncs, seen.exact
    );
    assert!(seen.failed_syncs > 0, "the kill was seen: the syncs went to the primary");
    sentinels.wait_until_primary_is(replica);
}
