//! One suite, every store: `InProcess`, and `Redis` on one server (127.0.0.1:6379, or
//! `RECOVEA_TEST_REDIS_URL`), on a Redis Cluster of three primaries and through Sentinel (both
//! started by the test, on loopback ports).
//!
//! Redis must be installed and the local one running: these tests fail, never skip, without it.
//! Each test uses its own random key prefix and deletes its keys when done.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use recovea_core::caps::LineAnswer;
use recovea_core::caps::{CapSpend, SpendView};
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{
    CapWindow, Counted, Counters, Covered, InProcess, Rebuilt, Redis, STORE_REFILL, SharedCounters,
    StoreOptions, SyncPush, SyncRead, Unseeded, WindowPush,
};

use recovea_counters::fakes::{AnswerLost, Unreachable};

#[path = "support/test_redis.rs"]
mod test_redis;
use test_redis::{Deployment, Inspect, TestRedis};

use recovea_testkit::redis_topologies::{Cluster, Sentinels};

#[derive(Debug, Clone, Copy)]
enum Backend {
    InProcess,
    Redis(&'static Deployment),
}

/// A store under test, and a way to look at it from outside.
struct Store {
    shared: Arc<dyn SharedCounters>,
    in_process: Option<Arc<InProcess>>,
    redis: Option<(Arc<Redis>, TestRedis)>,
}

impl Store {
    async fn new(backend: Backend, options: StoreOptions) -> Self {
        match backend {
            Backend::InProcess => {
                let store = Arc::new(InProcess::new(options));
                Self {
                    shared: Arc::clone(&store) as Arc<dyn SharedCounters>,
                    in_process: Some(store),
                    redis: None,
                }
            }
            Backend::Redis(deployment) => {
                let redis = TestRedis::on(deployment).await;
                let options = StoreOptions { prefix: redis.prefix.clone(), ..options };
                let store = Arc::new(Redis::new(&redis.url, options).expect("store"));
                Self {
                    shared: Arc::clone(&store) as Arc<dyn SharedCounters>,
                    in_process: None,
                    redis: Some((store, redis)),
                }
            }
        }
    }

    /// Whether the store still holds anything of the window.
    async fn holds(&self, w: &CapWindow, now: Timestamp) -> bool {
        if let Some(store) = &self.in_process {
            return store.contains(&w.cap, w.start, now);
        }
        let (store, redis) = self.redis.as_ref().expect("a backend");
        let mut exists = redis::cmd("EXISTS");
        for key in store.window_keys(&w.org, &w.cap, w.start) {
            exists.arg(key);
        }
        redis.query::<i64>(&exists).expect("EXISTS") > 0
    }

    /// Loses every window, as a flushed or restarted store does.
    fn wipe(&self) {
        match (&self.in_process, &self.redis) {
            (Some(store), _) => store.clear(),
            (_, Some((_, redis))) => redis.clear(),
            _ => unreachable!("a backend"),
        }
    }

    async fn raw_total(&self, w: &CapWindow) -> Option<i64> {
        let (store, redis) = self.redis.as_ref()?;
        let [total, _, _] = store.window_keys(&w.org, &w.cap, w.start);
        redis.query(redis::cmd("HGET").arg(total).arg("total")).expect("HGET")
    }
}

fn org() -> OrgId {
    OrgId::parse("org_shared").expect("org id")
}

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn cap() -> CapId {
    let suffix: String = std::iter::repeat_with(fastrand::alphanumeric).take(20).collect();
    CapId::parse(&format!("cap_{suffix}")).expect("cap id")
}

/// A window that started a minute ago and ends in an hour.
fn current_window() -> CapWindow {
    let now = wall();
    CapWindow { org: org(), cap: cap(), start: Timestamp(now.0 - 60_000), end: Timestamp(now.0 + 3_600_000) }
}

/// Windows of caps that do not refuse.
fn soft(windows: &[CapWindow]) -> Vec<Covered> {
    windows.iter().map(|window| Covered { window: window.clone(), line: None }).collect()
}

fn spend(counters: &Counters, w: &CapWindow) -> CapSpend {
    counters.spend(&w.org, &w.cap, w.start)
}

async fn sync(counters: &Counters, store: &dyn SharedCounters, now: Timestamp) {
    counters.sync_with(store, now).await.expect("sync");
}

async fn totals_converge_across_nodes(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let w = current_window();
    a.add(std::slice::from_ref(&w), Nanos(5), wall());
    b.add(std::slice::from_ref(&w), Nanos(7), wall());
    b.reserve(&soft(std::slice::from_ref(&w)), Nanos(100), wall()).settle(Nanos(11));
    assert_eq!(spend(&a, &w).spent, Nanos(5));
    assert_eq!(spend(&b, &w).spent, Nanos(18));
    let now = wall();
    sync(&a, store.shared.as_ref(), now).await;
    sync(&b, store.shared.as_ref(), now).await;
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!(spend(&a, &w).spent, Nanos(23));
    assert_eq!(spend(&b, &w).spent, Nanos(23));
    assert_eq!(spend(&a, &w).confirmed_at, Some(now));
    sync(&b, store.shared.as_ref(), now).await;
    assert_eq!(spend(&b, &w).spent, Nanos(23), "a sync with nothing new adds nothing");
    if let Some(total) = store.raw_total(&w).await {
        assert_eq!(total, 23);
    }
}

async fn reservations_of_one_node_are_seen_by_the_other(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let w = current_window();
    let on_a = a.reserve(&soft(std::slice::from_ref(&w)), Nanos(10), wall());
    let on_b = b.reserve(&soft(std::slice::from_ref(&w)), Nanos(4), wall());
    let now = wall();
    sync(&a, store.shared.as_ref(), now).await;
    sync(&b, store.shared.as_ref(), now).await;
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!(spend(&a, &w).reserved, Nanos(14));
    assert_eq!(spend(&b, &w).reserved, Nanos(14));
    drop(on_a);
    on_b.settle(Nanos(3));
    sync(&a, store.shared.as_ref(), now).await;
    sync(&b, store.shared.as_ref(), now).await;
    assert_eq!((spend(&b, &w).spent, spend(&b, &w).reserved), (Nanos(3), Nanos::ZERO));
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!((spend(&a, &w).spent, spend(&a, &w).reserved), (Nanos(3), Nanos::ZERO));
}

async fn reservations_of_a_silent_node_expire(backend: Backend) {
    // Reservations are dated on the store's clock (Redis's own), so the test lets real time pass.
    let ttl = Duration::from_millis(400);
    let store = Store::new(backend, StoreOptions { reservation_ttl: ttl, ..StoreOptions::default() }).await;
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let w = current_window();
    let _held_by_a_node_that_stops_syncing = a.reserve(&soft(std::slice::from_ref(&w)), Nanos(10), wall());
    sync(&a, store.shared.as_ref(), wall()).await;
    spend(&b, &w);
    sync(&b, store.shared.as_ref(), wall()).await;
    assert_eq!(spend(&b, &w).reserved, Nanos(10), "alive within its ttl");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    sync(&b, store.shared.as_ref(), wall()).await;
    assert_eq!(spend(&b, &w).reserved, Nanos::ZERO, "expired at its ttl");
    sync(&a, store.shared.as_ref(), wall()).await;
    sync(&b, store.shared.as_ref(), wall()).await;
    assert_eq!(spend(&b, &w).reserved, Nanos(10), "renewed when the node syncs again");
}

/// Nodes whose clocks disagree by 30 s: Redis dates every reservation on its own clock, so each
/// node's live reservations stay live for the others; and each node measures how far its clock
/// stands from the store's, which is the clock it decides windows on.
async fn reservations_are_dated_on_the_stores_clock(backend: Backend) {
    let ttl = Duration::from_secs(15);
    let store = Store::new(backend, StoreOptions { reservation_ttl: ttl, ..StoreOptions::default() }).await;
    let (behind, ahead) = (Counters::new("node-behind"), Counters::new("node-ahead"));
    let w = current_window();
    let _held = behind.reserve(&soft(std::slice::from_ref(&w)), Nanos(10), wall());
    let skew = 30_000;
    sync(&behind, store.shared.as_ref(), Timestamp(wall().0 - skew)).await;
    spend(&ahead, &w);
    sync(&ahead, store.shared.as_ref(), Timestamp(wall().0 + skew)).await;
    assert_eq!(spend(&ahead, &w).reserved, Nanos(10), "a reservation made 30 s \"ago\" is live");
    let (behind_offset, ahead_offset) = (behind.clock_offset_ms(), ahead.clock_offset_ms());
    let near = |offset: Option<i64>, expected: i64| offset.is_some_and(|o| (o - expected).abs() < 1_000);
    assert!(near(behind_offset, skew), "{behind_offset:?}");
    assert!(near(ahead_offset, -skew), "{ahead_offset:?}");
    let on_store_clock = ahead.on_store_clock(Timestamp(wall().0 + skew));
    assert!((on_store_clock.0 - wall().0).abs() < 1_000, "corrected to the store's clock");
}

async fn keys_expire_after_the_window_ends(backend: Backend) {
    let margin = Duration::from_millis(300);
    let store = Store::new(backend, StoreOptions { key_margin: margin, ..StoreOptions::default() }).await;
    let a = Counters::new("node-a");
    let now = wall();
    let w =
        CapWindow { org: org(), cap: cap(), start: Timestamp(now.0 - 1_000), end: Timestamp(now.0 + 300) };
    let _live = a.reserve(&soft(std::slice::from_ref(&w)), Nanos(1), wall());
    a.add(std::slice::from_ref(&w), Nanos(5), wall());
    sync(&a, store.shared.as_ref(), now).await;
    assert!(store.holds(&w, wall()).await, "held while the window runs");
    let gone = || async { (!store.holds(&w, wall()).await).then_some(()) };
    recovea_testkit::eventually(Duration::from_secs(10), "the keys gone after the window's end", gone).await;
    assert!(wall().0 >= w.end.0 + 300, "not before the end plus the margin");
}

async fn pending_increments_survive_failed_syncs_and_count_once(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let lost = AnswerLost(Arc::clone(&store.shared));
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let w = current_window();
    let now = wall();
    a.add(std::slice::from_ref(&w), Nanos(5), wall());
    assert!(a.sync_with(&Unreachable, now).await.is_err());
    assert!(a.sync_with(&lost, Timestamp(now.0 + 1)).await.is_err());
    a.add(std::slice::from_ref(&w), Nanos(3), wall());
    assert!(a.sync_with(&lost, Timestamp(now.0 + 2)).await.is_err());
    assert!(a.sync_with(&Unreachable, Timestamp(now.0 + 3)).await.is_err());
    assert_eq!(a.confirmed_at(), None);
    assert_eq!(spend(&a, &w).spent, Nanos(8), "pending, still counted on this node");
    sync(&a, store.shared.as_ref(), Timestamp(now.0 + 4)).await;
    assert_eq!(spend(&a, &w).spent, Nanos(8));
    spend(&b, &w);
    sync(&b, store.shared.as_ref(), Timestamp(now.0 + 5)).await;
    assert_eq!(spend(&b, &w).spent, Nanos(8), "counted once in the store");
    sync(&a, store.shared.as_ref(), Timestamp(now.0 + 6)).await;
    sync(&b, store.shared.as_ref(), Timestamp(now.0 + 7)).await;
    assert_eq!(spend(&b, &w).spent, Nanos(8));
}

async fn pushes_are_idempotent_by_sequence(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let w = current_window();
    let now = wall();
    let push = |seq: u64, entry: u64, cumulative: i64| SyncPush {
        seq,
        node_id: "n".to_owned(),
        windows: vec![WindowPush {
            org: w.org.clone(),
            cap: w.cap.clone(),
            start: w.start,
            end: Some(w.end),
            entry,
            cumulative: Nanos(cumulative),
            since: Some(now),
            reserved: Nanos::ZERO,
            seed: None,
            spare: Nanos::ZERO,
            grow: Nanos::ZERO,
            ceiling: None,
            fold: Vec::new(),
        }],
    };
    let total = |read: SyncRead| read.windows[0].total;
    let shared = store.shared.as_ref();
    assert_eq!(total(shared.sync("n", &push(1, 0, 5), now).await.expect("sync")), Nanos(5));
    assert_eq!(total(shared.sync("n", &push(1, 0, 5), now).await.expect("retry")), Nanos(5));
    assert_eq!(total(shared.sync("n", &push(3, 0, 9), now).await.expect("sync")), Nanos(9));
    assert_eq!(
        total(shared.sync("n", &push(2, 0, 7), now).await.expect("late")),
        Nanos(9),
        "stale push ignored"
    );
    assert_eq!(total(shared.sync("n", &push(4, 1, 4), now).await.expect("new entry")), Nanos(13));
    assert_eq!(
        total(shared.sync("m", &push(1, 0, 10), now).await.expect("no record")),
        Nanos(23),
        "a writer the store holds no record of counts all it ever counted"
    );
    let big = (1_i64 << 53) + 1;
    assert_eq!(
        total(shared.sync("n", &push(5, 0, 9 + big), now).await.expect("big")),
        Nanos(23 + big),
        "exact past 2^53"
    );
    assert_eq!(total(shared.sync("n", &push(6, 0, 10 + big), now).await.expect("big")), Nanos(24 + big));
}

/// What `sync` read of one window that the store does not hold seeded.
fn unseeded(outcome: &recovea_counters::SyncOutcome) -> Unseeded {
    let [unseeded] = &outcome.missing[..] else { panic!("one window missing: {:?}", outcome.missing) };
    unseeded.clone()
}

fn counted(nodes: &[(&str, Timestamp)]) -> Vec<Counted> {
    nodes.iter().map(|(node, since)| Counted { node_id: (*node).to_owned(), since: *since }).collect()
}

async fn a_seed_adds_the_ledgers_other_receipts_to_what_the_writers_hold(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (Counters::new("node-a"), Counters::new("node-b"));
    let w = current_window();
    let now = wall();
    let (a_since, b_since) = (Timestamp(now.0 - 2_000), Timestamp(now.0 - 1_000));
    a.add(std::slice::from_ref(&w), Nanos(5), a_since);
    let outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
    let read_for_a = unseeded(&outcome);
    assert_eq!(read_for_a.counted, counted(&[("node-a", a_since)]), "a new window has no ledger total yet");
    spend(&b, &w);
    let outcome = b.sync_with(store.shared.as_ref(), now).await.expect("sync");
    assert!(outcome.missing.is_empty(), "b only reads the window: it cannot name its end");
    b.add(std::slice::from_ref(&w), Nanos::ZERO, b_since);
    let read_for_b = unseeded(&b.sync_with(store.shared.as_ref(), now).await.expect("sync"));
    assert_eq!(read_for_b.counted, counted(&[("node-a", a_since), ("node-b", b_since)]));

    // The ledger holds 100 of other nodes, a's 5 and b's 0: each seed leaves out its writers'.
    let ledger = |total: i64| Rebuilt { total: Nanos(total), last_start: Some(now) };
    a.seed(&read_for_a, ledger(100));
    b.seed(&read_for_b, ledger(100));
    a.add(std::slice::from_ref(&w), Nanos(1), now);
    let outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
    assert_eq!(
        unseeded(&outcome).counted,
        read_for_b.counted,
        "a's seed is refused (read before b counted): the window is reported again"
    );
    assert_eq!(store.raw_total(&w).await.unwrap_or(6), 6);
    sync(&b, store.shared.as_ref(), now).await;
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!(spend(&a, &w).spent, Nanos(106), "b's seed adds to the writers' 6");
    assert_eq!(spend(&b, &w).spent, Nanos(106));
    assert!(a.missing().is_empty() && b.missing().is_empty());

    // However late the ledger (c's receipts all still in its spool), nothing is lost or doubled.
    let lagging = CapWindow { org: org(), cap: CapId::parse("cap_lagging").expect("id"), ..w.clone() };
    let c = Counters::new("node-c");
    c.add(std::slice::from_ref(&lagging), Nanos(50), now);
    let read = unseeded(&c.sync_with(store.shared.as_ref(), now).await.expect("sync"));
    c.seed(&read, Rebuilt { total: Nanos(10), last_start: Some(Timestamp(now.0 - 5_000)) });
    c.add(std::slice::from_ref(&lagging), Nanos(2), now);
    sync(&c, store.shared.as_ref(), now).await;
    assert_eq!(spend(&c, &lagging).spent, Nanos(62), "the writer's 52 and the ledger's other 10");
    assert!(c.missing().is_empty());
}

async fn a_writer_counted_late_keeps_the_seed_only_if_they_cannot_overlap(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b, c) = (Counters::new("node-a"), Counters::new("node-b"), Counters::new("node-c"));
    let w = current_window();
    let now = wall();
    a.add(std::slice::from_ref(&w), Nanos(5), Timestamp(now.0 - 3_000));
    let read = unseeded(&a.sync_with(store.shared.as_ref(), now).await.expect("sync"));
    // The ledger's latest receipt started 2 s ago; 100 of it is b's and others'.
    a.seed(&read, Rebuilt { total: Nanos(100), last_start: Some(Timestamp(now.0 - 2_000)) });
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!(spend(&a, &w).spent, Nanos(105));

    // c's first request started after every receipt in the seed: none of c's is in it.
    c.add(std::slice::from_ref(&w), Nanos(7), Timestamp(now.0 - 1_000));
    assert!(
        c.sync_with(store.shared.as_ref(), now).await.expect("sync").missing.is_empty(),
        "the seed stays"
    );
    assert_eq!(spend(&c, &w).spent, Nanos(112));

    // b counts from before the seed's latest receipt: the seed may hold some of b's. It goes.
    b.add(std::slice::from_ref(&w), Nanos(20), Timestamp(now.0 - 2_500));
    let read = unseeded(&b.sync_with(store.shared.as_ref(), now).await.expect("sync"));
    assert_eq!(spend(&b, &w).spent, Nanos(32), "the writers' 5 + 7 + 20, the seed taken back");
    assert_eq!(
        read.counted,
        counted(&[
            ("node-a", Timestamp(now.0 - 3_000)),
            ("node-b", Timestamp(now.0 - 2_500)),
            ("node-c", Timestamp(now.0 - 1_000))
        ])
    );
    // Read again, b's 20 left out of the ledger's 100: 80.
    b.seed(&read, Rebuilt { total: Nanos(80), last_start: Some(Timestamp(now.0 - 1_000)) });
    sync(&b, store.shared.as_ref(), now).await;
    sync(&a, store.shared.as_ref(), now).await;
    assert_eq!(spend(&a, &w).spent, Nanos(112));
}

async fn a_seed_read_before_the_store_lost_the_window_is_refused_after(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let a = Counters::new("node-a");
    let w = current_window();
    let now = wall();
    a.add(std::slice::from_ref(&w), Nanos(5), now);
    let read = unseeded(&a.sync_with(store.shared.as_ref(), now).await.expect("sync"));
    store.wipe();
    a.seed(&read, Rebuilt { total: Nanos(100), last_start: Some(now) });
    let mut outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
    if store.redis.is_some() {
        // Redis says its data began anew: nothing is rebuilt before every node has pushed again.
        assert!(outcome.missing.is_empty(), "{:?}", outcome.missing);
        // The behaviour under test: the store's refill time passes before the window is rebuilt.
        tokio::time::sleep(STORE_REFILL).await;
        outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
    }
    let read_again = unseeded(&outcome);
    assert_ne!(read_again.incarnation, read.incarnation, "a new life of the window");
    assert_eq!(read_again.counted, read.counted);
    assert_eq!(spend(&a, &w).spent, Nanos(105), "the view keeps what the seed said");
    assert_eq!(store.raw_total(&w).await.unwrap_or(5), 5, "the store took the writer's 5 alone");
}

/// A node with no window to push is confirmed by a store that answers, and measures its clock.
async fn a_node_with_nothing_to_push_is_confirmed(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let a = Counters::new("node-a");
    let now = wall();
    let outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
    assert_eq!(outcome.windows, 0);
    assert_eq!(a.confirmed_at(), Some(now));
    assert_eq!(a.clock_offset_ms().is_some(), store.redis.is_some(), "Redis's clock is measured");
}

async fn a_window_only_read_creates_nothing(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let a = Counters::new("node-a");
    let w = current_window();
    assert_eq!(spend(&a, &w).spent, Nanos::ZERO);
    let outcome = a.sync_with(store.shared.as_ref(), wall()).await.expect("sync");
    assert_eq!(outcome.windows, 1);
    assert!(!store.holds(&w, wall()).await);
}

/// Windows of armed caps of this limit.
fn armed_at(windows: &[CapWindow], limit: Nanos) -> Vec<Covered> {
    windows.iter().map(|window| Covered { window: window.clone(), line: Some(limit) }).collect()
}

/// A window seeded at `total` in the store, as the ledger's rebuild leaves it.
async fn seeded(store: &Store, total: i64) -> CapWindow {
    let w = current_window();
    let seeder = Counters::new("seeder");
    seeder.seed(&Unseeded::fresh(w.clone()), Rebuilt { total: Nanos(total), last_start: Some(w.start) });
    sync(&seeder, store.shared.as_ref(), wall()).await;
    w
}

async fn at_the_line_a_request_is_checked_and_reserved_in_one_step(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (
        Counters::shared("node-a", Arc::clone(&store.shared)),
        Counters::shared("node-b", Arc::clone(&store.shared)),
    );
    // Past 2^53, where a double would lose the last nano-dollar.
    let base = (1_i64 << 53) + 1;
    let w = seeded(&store, base).await;
    let line = |extra: i64| armed_at(std::slice::from_ref(&w), Nanos(base + extra));
    let now = wall();
    let mut first = a.reserve(&line(100), Nanos(60), wall());
    assert_eq!(a.ask_at_line(&mut first, now).await, Some(LineAnswer::Reserved));
    first.hold_at_line();
    let mut second = b.reserve(&line(100), Nanos(40), wall());
    assert_eq!(b.ask_at_line(&mut second, now).await, Some(LineAnswer::Reserved), "one nano under the line");
    second.hold_at_line();
    let mut third = b.reserve(&line(100), Nanos(1), wall());
    assert_eq!(b.ask_at_line(&mut third, now).await, Some(LineAnswer::AtLine(0)), "at the line");
    drop(third);
    // The records are folded into each node's own reservation by its push: counted once.
    for node in [&a, &b, &a] {
        sync(node, store.shared.as_ref(), now).await;
    }
    assert_eq!(spend(&a, &w).reserved, Nanos(100));
    first.settle(Nanos(50));
    drop(second);
    sync(&a, store.shared.as_ref(), now).await;
    sync(&b, store.shared.as_ref(), now).await;
    let mut fourth = b.reserve(&line(100), Nanos(60), wall());
    assert_eq!(b.ask_at_line(&mut fourth, now).await, Some(LineAnswer::Reserved), "settled below the line");
}

/// A request meets its organization's cap and its key's: both lines are checked, and both
/// reserved or neither, in one step (on a cluster, both windows share a slot).
async fn one_request_is_checked_at_every_line_it_meets_in_one_step(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (
        Counters::shared("node-a", Arc::clone(&store.shared)),
        Counters::shared("node-b", Arc::clone(&store.shared)),
    );
    let base = 1_000;
    let (org_window, key_window) = (seeded(&store, base).await, seeded(&store, base).await);
    assert_ne!(org_window.cap, key_window.cap);
    let lines = || {
        vec![
            Covered { window: org_window.clone(), line: Some(Nanos(base + 100)) },
            Covered { window: key_window.clone(), line: Some(Nanos(base + 40)) },
        ]
    };
    let now = wall();
    let mut first = a.reserve(&lines(), Nanos(60), wall());
    assert_eq!(a.ask_at_line(&mut first, now).await, Some(LineAnswer::Reserved));
    first.hold_at_line();
    let mut second = b.reserve(&lines(), Nanos(30), wall());
    assert_eq!(
        b.ask_at_line(&mut second, now).await,
        Some(LineAnswer::AtLine(1)),
        "the key's line is reached"
    );
    drop(second);
    for node in [&a, &b] {
        sync(node, store.shared.as_ref(), now).await;
    }
    assert_eq!(
        spend(&b, &org_window).reserved,
        Nanos(60),
        "the refused request reserved nothing at the other line"
    );
    assert_eq!(spend(&b, &key_window).reserved, Nanos(60));
}

async fn at_an_unseeded_window_a_request_waits_for_the_ledgers_total(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let a = Counters::shared("node-a", Arc::clone(&store.shared));
    let now = wall();
    let w = current_window();
    let covered = armed_at(std::slice::from_ref(&w), Nanos(100));

    // Nobody seeds: the store cannot vouch for the window, writes nothing for it, and after a
    // bounded wait the request decides from its own view.
    let mut blind = a.reserve(&covered, Nanos(1), wall());
    assert_eq!(a.ask_at_line(&mut blind, now).await, Some(LineAnswer::Unseeded));
    assert!(!store.holds(&w, wall()).await, "nothing written for an unseeded window");
    drop(blind);

    // The node's rebuild (here by hand: the sync finds the window missing, the ledger's total is
    // seeded and pushed) lands while the request asks again: the store then decides it. The ask
    // is polled first and sends its first question; the rebuild starts at once rather than after
    // a sleep, so that a slow machine cannot push it past the ask's bounded wait.
    let mut first = a.reserve(&covered, Nanos(10), wall());
    let rebuild = async {
        let outcome = a.sync_with(store.shared.as_ref(), now).await.expect("sync");
        a.seed(&unseeded(&outcome), Rebuilt { total: Nanos(95), last_start: Some(w.start) });
        sync(&a, store.shared.as_ref(), now).await;
    };
    let (answer, ()) = tokio::join!(a.ask_at_line(&mut first, now), rebuild);
    assert_eq!(answer, Some(LineAnswer::Reserved), "95 seeded < 100: the store reserved it");
    first.hold_at_line();
    let mut second = a.reserve(&covered, Nanos(1), wall());
    assert_eq!(a.ask_at_line(&mut second, now).await, Some(LineAnswer::AtLine(0)), "95 + 10 >= 100");
}

async fn spare_stops_at_the_ceiling_and_contends_until_given_back(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (
        Counters::shared("node-a", Arc::clone(&store.shared)),
        Counters::shared("node-b", Arc::clone(&store.shared)),
    );
    let now = wall();
    // a knows no spend and asks a sixteenth of 1000 (62): the ceiling (800) leaves 10 above 790.
    let crowded = seeded(&store, 790).await;
    let covered = armed_at(std::slice::from_ref(&crowded), Nanos(1_000));
    a.track(&covered);
    sync(&a, store.shared.as_ref(), now).await;
    let from_spare = a.reserve(&covered, Nanos(10), wall());
    assert!(!from_spare.is_pending(), "granted up to the ceiling");
    assert!(a.reserve(&covered, Nanos(1), wall()).is_pending(), "and no further");
    drop(from_spare);

    // a holds a sixteenth of 1600 (100); b's requests fill the rest of the way to the line.
    let w = seeded(&store, 0).await;
    let covered = armed_at(std::slice::from_ref(&w), Nanos(1_600));
    a.track(&covered);
    sync(&a, store.shared.as_ref(), now).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut request = b.reserve(&covered, Nanos(500), wall());
        assert_eq!(b.ask_at_line(&mut request, now).await, Some(LineAnswer::Reserved));
        request.hold_at_line();
        held.push(request);
    }
    let mut contended = b.reserve(&covered, Nanos(1), wall());
    assert_eq!(
        b.ask_at_line(&mut contended, now).await,
        Some(LineAnswer::Contended),
        "at the line only with a's spare counted"
    );
    drop(contended);
    // a reads that the window is near its line, then gives its spare back.
    sync(&a, store.shared.as_ref(), now).await;
    sync(&a, store.shared.as_ref(), now).await;
    let mut admitted = b.reserve(&covered, Nanos(1), wall());
    assert_eq!(b.ask_at_line(&mut admitted, now).await, Some(LineAnswer::Reserved));
}

async fn a_batch_must_fit_and_the_books_spend_counts_at_the_line(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let (a, b) = (
        Counters::shared("node-a", Arc::clone(&store.shared)),
        Counters::shared("node-b", Arc::clone(&store.shared)),
    );
    let now = wall();
    let w = seeded(&store, 900).await;
    let covered = armed_at(std::slice::from_ref(&w), Nanos(1_000));
    // A request may pass the line by itself: 900 + 150 is admitted, the line not yet reached.
    let mut request = a.reserve(&covered, Nanos(150), wall());
    assert_eq!(a.ask_at_line(&mut request, now).await, Some(LineAnswer::Reserved));
    drop(request);
    // Its record leaves the store with a's next push.
    sync(&a, store.shared.as_ref(), now).await;
    // A batch must fit: 900 + 101 is refused, 900 + 100 is not.
    let mut batch = a.reserve_to_fit(&covered, Nanos(101), wall());
    assert_eq!(a.ask_at_line(&mut batch, now).await, Some(LineAnswer::AtLine(0)));
    drop(batch);
    let mut fits = a.reserve_to_fit(&covered, Nanos(100), wall());
    assert_eq!(a.ask_at_line(&mut fits, now).await, Some(LineAnswer::Reserved));
    drop(fits);
    sync(&a, store.shared.as_ref(), now).await;

    // The book holds 60 on the window (a job pending elsewhere): each node counts it in its view
    // and at the line, though the store does not hold it.
    for node in [&a, &b] {
        node.set_external(&[(w.clone(), Nanos(60))]);
        sync(node, store.shared.as_ref(), now).await;
        assert_eq!(spend(node, &w).spent, Nanos(960));
    }
    let mut batch = b.reserve_to_fit(&covered, Nanos(41), wall());
    assert_eq!(b.ask_at_line(&mut batch, now).await, Some(LineAnswer::AtLine(0)), "900 + 60 + 41 > 1000");
    drop(batch);
    let mut request = b.reserve(&covered, Nanos(500), wall());
    assert_eq!(b.ask_at_line(&mut request, now).await, Some(LineAnswer::Reserved), "960 < 1000");
    drop(request);
    sync(&b, store.shared.as_ref(), now).await;
    // The job settled under its hold: the book's figure drops, and so does the view.
    b.set_external(&[]);
    assert_eq!(spend(&b, &w).spent, Nanos(900));
    let mut batch = b.reserve_to_fit(&covered, Nanos(100), wall());
    assert_eq!(b.ask_at_line(&mut batch, now).await, Some(LineAnswer::Reserved));
}

async fn spare_leaves_room_for_the_books_spend(backend: Backend) {
    let store = Store::new(backend, StoreOptions::default()).await;
    let a = Counters::shared("node-a", Arc::clone(&store.shared));
    let now = wall();
    // 700 spent and 90 held by the book: the ceiling (800) leaves room for 10 of spare at most.
    let w = seeded(&store, 700).await;
    let covered = armed_at(std::slice::from_ref(&w), Nanos(1_000));
    a.set_external(&[(w.clone(), Nanos(90))]);
    a.track(&covered);
    sync(&a, store.shared.as_ref(), now).await;
    let from_spare = a.reserve(&covered, Nanos(10), wall());
    assert!(!from_spare.is_pending(), "granted up to the ceiling, the book's spend counted");
    assert!(a.reserve(&covered, Nanos(1), wall()).is_pending(), "and no further");
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod in_process {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::InProcess).await })*
        }
        mod redis_store {
            $(#[tokio::test] async fn $name() { super::$name(super::Backend::Redis(super::test_redis::local())).await })*
        }

        /// Every case, one after the other, on one deployment (a cluster or sentinels take seconds
        /// to start: one of each serves the whole suite), the store's own clock included.
        async fn every_case(backend: Backend) {
            $($name(backend).await;)*
            reservations_are_dated_on_the_stores_clock(backend).await;
        }
    };
}

/// Only a store with a clock of its own (not the in-process one, which is the node's).
#[tokio::test]
async fn redis_dates_reservations_on_its_own_clock() {
    reservations_are_dated_on_the_stores_clock(Backend::Redis(test_redis::local())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_on_a_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.expect("cluster");
    let deployment = test_redis::leak(cluster.url(), Inspect::Cluster(cluster.server_urls()));
    every_case(Backend::Redis(deployment)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_through_sentinel() {
    let sentinels = tokio::task::spawn_blocking(Sentinels::start).await.expect("sentinels");
    let primary = sentinels.servers[0].url();
    let deployment = test_redis::leak(sentinels.url(), Inspect::Server(primary));
    every_case(Backend::Redis(deployment)).await;
}

suite!(
    totals_converge_across_nodes,
    reservations_of_one_node_are_seen_by_the_other,
    reservations_of_a_silent_node_expire,
    keys_expire_after_the_window_ends,
    pending_increments_survive_failed_syncs_and_count_once,
    pushes_are_idempotent_by_sequence,
    a_seed_adds_the_ledgers_other_receipts_to_what_the_writers_hold,
    a_writer_counted_late_keeps_the_seed_only_if_they_cannot_overlap,
    a_seed_read_before_the_store_lost_the_window_is_refused_after,
    a_window_only_read_creates_nothing,
    a_node_with_nothing_to_push_is_confirmed,
    at_the_line_a_request_is_checked_and_reserved_in_one_step,
    one_request_is_checked_at_every_line_it_meets_in_one_step,
    at_an_unseeded_window_a_request_waits_for_the_ledgers_total,
    spare_stops_at_the_ceiling_and_contends_until_given_back,
    a_batch_must_fit_and_the_books_spend_counts_at_the_line,
    spare_leaves_room_for_the_books_spend,
);
