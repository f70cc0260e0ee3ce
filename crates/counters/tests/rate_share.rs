//! One suite, two rate shares: `InProcessRateShare` and `RedisRateShare` (127.0.0.1:6379, or
//! `RECOVEA_TEST_REDIS_URL`).
//!
//! Redis must be running: these tests fail, never skip, without it. Each test uses its own random
//! key prefix and deletes its keys when done.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use recovea_core::ids::KeyId;
#[path = "support/test_redis.rs"]
mod test_redis;
use recovea_counters::{
    CounterError, InProcessRateShare, RATE_KEY_TTL, RateShare, RateTotals, RateUsage, RedisRateShare,
};
use test_redis::{Deployment, Inspect, TestRedis};

#[derive(Debug, Clone, Copy)]
enum Backend {
    InProcess,
    Redis(&'static Deployment),
}

/// A rate share under test, and a way to reach behind it.
struct Store {
    share: Arc<dyn RateShare>,
    in_process: Option<Arc<InProcessRateShare>>,
    redis: Option<(Arc<RedisRateShare>, TestRedis)>,
}

impl Store {
    async fn new(backend: Backend) -> Self {
        match backend {
            Backend::InProcess => {
                let store = Arc::new(InProcessRateShare::new());
                Self { share: Arc::clone(&store) as Arc<dyn RateShare>, in_process: Some(store), redis: None }
            }
            Backend::Redis(deployment) => {
                let redis = TestRedis::on(deployment).await;
                let store = Arc::new(RedisRateShare::new(&redis.url, &redis.prefix).expect("share"));
                Self {
                    share: Arc::clone(&store) as Arc<dyn RateShare>,
                    in_process: None,
                    redis: Some((store, redis)),
                }
            }
        }
    }

    /// Loses everything, as a flush or a restart of the store would.
    async fn flush(&self) {
        if let Some(store) = &self.in_process {
            store.clear();
        }
        if let Some((_, redis)) = &self.redis {
            redis.clear();
        }
    }
}

fn key(name: &str) -> KeyId {
    KeyId::parse(name).expect("id")
}

fn usage(requests: u64, tokens: u64) -> RateUsage {
    RateUsage { requests, tokens }
}

/// What one node keeps between syncs: its last read per key.
#[derive(Default)]
struct Node {
    last: std::collections::HashMap<KeyId, RateTotals>,
}

impl Node {
    /// Pushes `push`, and says what the other nodes consumed of each key since this node's last read.
    async fn sync(&mut self, store: &Store, push: &[(KeyId, RateUsage)]) -> Vec<RateUsage> {
        let reads = store.share.exchange(push).await.expect("the store answers");
        assert_eq!(reads.len(), push.len(), "one read per key");
        push.iter()
            .zip(reads)
            .map(|((key, pushed), read)| {
                let others = read.others_since(self.last.get(key), *pushed);
                self.last.insert(key.clone(), read);
                others
            })
            .collect()
    }
}

async fn two_nodes_see_each_others_consumption_and_not_their_own(backend: Backend) {
    let store = Store::new(backend).await;
    assert_eq!(store.share.exchange(&[]).await, Ok(Vec::new()), "an empty push only checks the store");
    let (mut a, mut b) = (Node::default(), Node::default());
    let (k1, k2) = (key("key_one"), key("key_two"));

    let seen = a.sync(&store, &[(k1.clone(), usage(3, 300)), (k2.clone(), usage(1, 0))]).await;
    assert_eq!(seen, vec![RateUsage::ZERO, RateUsage::ZERO], "a node's own push is not the others'");

    let seen = b.sync(&store, &[(k2.clone(), usage(2, 20)), (k1.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![usage(1, 0), usage(3, 300)], "first reads count what others did, in push order");

    let seen = a.sync(&store, &[(k1.clone(), usage(1, 100)), (k2.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![RateUsage::ZERO, usage(2, 20)]);

    let seen = b.sync(&store, &[(k1.clone(), RateUsage::ZERO), (k2.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![usage(1, 100), RateUsage::ZERO], "only what is new since the last read");

    // A read of a key nobody used creates nothing and reads nothing.
    let unused = key("key_unused");
    let seen = a.sync(&store, &[(unused.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![RateUsage::ZERO]);
    if let Some((share, redis)) = &store.redis {
        let exists: i64 = redis.query(redis::cmd("EXISTS").arg(share.key_for(&unused))).expect("EXISTS");
        assert_eq!(exists, 0, "a read creates no key");
        let ttl_ms: i64 = redis.query(redis::cmd("PTTL").arg(share.key_for(&k1))).expect("PTTL");
        let max = i64::try_from(RATE_KEY_TTL.as_millis()).expect("ms");
        assert!(ttl_ms > 0 && ttl_ms <= max, "a used key expires after {max} ms idle, not {ttl_ms}");
    }

    // The store loses everything: totals go back, and no node panics nor reads a negative.
    store.flush().await;
    let seen = a.sync(&store, &[(k1.clone(), usage(1, 10)), (k2.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![RateUsage::ZERO, RateUsage::ZERO], "all the store holds is a's own push");
    let seen = b.sync(&store, &[(k1.clone(), RateUsage::ZERO), (k2.clone(), usage(1, 1))]).await;
    assert_eq!(seen, vec![usage(1, 10), RateUsage::ZERO], "what came after the flush is new");
    let seen = a.sync(&store, &[(k1.clone(), RateUsage::ZERO), (k2.clone(), RateUsage::ZERO)]).await;
    assert_eq!(seen, vec![RateUsage::ZERO, usage(1, 1)]);
}

#[tokio::test]
async fn in_process_two_nodes_see_each_others_consumption_and_not_their_own() {
    two_nodes_see_each_others_consumption_and_not_their_own(Backend::InProcess).await;
}

#[tokio::test]
async fn redis_two_nodes_see_each_others_consumption_and_not_their_own() {
    two_nodes_see_each_others_consumption_and_not_their_own(Backend::Redis(test_redis::local())).await;
}

async fn many_keys_in_one_sync_keep_their_order(backend: Backend) {
    let store = Store::new(backend).await;
    let push: Vec<(KeyId, RateUsage)> =
        (0..200u64).map(|n| (key(&format!("key_k{n}")), usage(n % 7 + 1, n * 10))).collect();
    let reads = store.share.exchange(&push).await.expect("the store answers");
    for ((key, pushed), read) in push.iter().zip(&reads) {
        assert_eq!(read.current.saturating_add(read.previous), *pushed, "{key}");
    }
}

#[tokio::test]
async fn in_process_many_keys_in_one_sync_keep_their_order() {
    many_keys_in_one_sync_keep_their_order(Backend::InProcess).await;
}

#[tokio::test]
async fn redis_many_keys_in_one_sync_keep_their_order() {
    many_keys_in_one_sync_keep_their_order(Backend::Redis(test_redis::local())).await;
}

/// Each key's counts live in its own slot; one sync names many keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_on_a_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(recovea_testkit::redis_topologies::Cluster::start)
        .await
        .expect("cluster");
    let deployment = test_redis::leak(cluster.url(), Inspect::Cluster(cluster.server_urls()));
    two_nodes_see_each_others_consumption_and_not_their_own(Backend::Redis(deployment)).await;
    many_keys_in_one_sync_keep_their_order(Backend::Redis(deployment)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_through_sentinel() {
    let sentinels = tokio::task::spawn_blocking(recovea_testkit::redis_topologies::Sentinels::start)
        .await
        .expect("sentinels");
    let deployment = test_redis::leak(sentinels.url(), Inspect::Server(sentinels.servers[0].url()));
    two_nodes_see_each_others_consumption_and_not_their_own(Backend::Redis(deployment)).await;
    many_keys_in_one_sync_keep_their_order(Backend::Redis(deployment)).await;
}

#[tokio::test]
async fn redis_down_fails_the_sync_within_its_timeout() {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let share = RedisRateShare::new(&format!("redis://127.0.0.1:{port}"), "recovea-test:down")
        .expect("share")
        .with_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let result = share.exchange(&[(key("key_a"), usage(1, 1))]).await;
    assert!(matches!(result, Err(CounterError::Unavailable(_) | CounterError::Timeout)), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "bounded by the timeout: {:?}", started.elapsed());
}
