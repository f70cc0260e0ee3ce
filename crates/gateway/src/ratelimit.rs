//! The node's per-key rate limiter: a GCRA lane for requests and one for tokens per key, in
//! sharded maps so that keys rarely contend, and their sharing with other nodes through a store.
//!
//! Tokens are charged when the receipt is known. Decisions are always local: when nodes share a
//! store, a background sync pushes what this node consumed per key and charges into its lanes
//! what the other nodes consumed since its last sync, so the request path never waits on the store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use recovea_core::ids::KeyId;
use recovea_core::ratelimit::{Gcra, KeyLimits};
use recovea_counters::{CounterError, RateShare, RateTotals, RateUsage};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

const SHARDS: usize = 16;
/// A shard keeps at most this many keys before forgetting those whose lanes have drained.
const PRUNE_ABOVE: usize = 4096;
/// A key stays in the sync this long after this node last saw it asked for. The store holds two
/// minutes; a key met again after that starts afresh from the store's last minute.
const SHARE_FOR_US: u64 = 120_000_000;
/// The least time between two syncs asked for early (a key met for the first time).
const WOKEN_SYNC_GAP: Duration = Duration::from_millis(20);
/// While the store keeps failing, a warning at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

#[derive(Default, Clone, Copy)]
struct Lanes {
    requests_tat_us: u64,
    tokens_tat_us: u64,
    /// The limits of the last request, to charge other nodes' consumption between requests.
    limits: KeyLimits,
    /// Whether the sync carries this key.
    shared: bool,
    /// When this node last saw the key asked for or charged.
    used_at_us: u64,
    /// What this node consumed since the last sync took it.
    unsent: RateUsage,
    /// The store's totals at the last successful sync: the baseline of the next.
    last_read: Option<RateTotals>,
}

#[derive(Default)]
pub(crate) struct RateLimiter {
    shards: [Mutex<HashMap<KeyId, Lanes>>; SHARDS],
    /// Woken when a key starts being shared, so that what the others did with it arrives early.
    key_met: Notify,
    /// Syncs the store answered.
    pub(crate) syncs: AtomicU64,
}

/// One key's part of a sync, taken under its shard's lock and applied after the store answered.
struct Taken {
    key: KeyId,
    pushed: RateUsage,
    last_read: Option<RateTotals>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Lanes {
    /// Records that the key is in use; whether it just started being shared.
    fn touch(&mut self, limits: KeyLimits, now: u64) -> bool {
        self.limits = limits;
        self.used_at_us = now;
        !std::mem::replace(&mut self.shared, true)
    }
}

impl RateLimiter {
    fn shard(&self, key: &KeyId) -> &Mutex<HashMap<KeyId, Lanes>> {
        let hash = key.as_str().bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(usize::from(b)));
        &self.shards[hash % SHARDS]
    }

    /// Admits one request of `key` under `limits`, or says how many milliseconds to wait.
    pub(crate) fn admit(&self, key: &KeyId, limits: KeyLimits) -> Result<(), u64> {
        if limits.is_unlimited() {
            return Ok(());
        }
        let now = now_us();
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if shard.len() > PRUNE_ABOVE {
            shard.retain(|_, lanes| lanes.requests_tat_us > now || lanes.tokens_tat_us > now);
        }
        let lanes = shard.entry(key.clone()).or_default();
        // A refused key is in use too: while its client retries, it keeps learning what the other
        // nodes admit.
        let met = lanes.touch(limits, now);
        let decision = Self::decide(lanes, limits, now);
        if decision.is_ok() {
            lanes.unsent.requests = lanes.unsent.requests.saturating_add(1);
        }
        drop(shard);
        if met {
            self.key_met.notify_one();
        }
        decision
    }

    fn decide(lanes: &mut Lanes, limits: KeyLimits, now: u64) -> Result<(), u64> {
        if let Some(tokens) = limits.tokens_per_minute.and_then(Gcra::per_minute) {
            tokens.has_room(lanes.tokens_tat_us, now).map_err(to_ms)?;
        }
        if let Some(requests) = limits.requests_per_minute.and_then(Gcra::per_minute) {
            lanes.requests_tat_us = requests.check(lanes.requests_tat_us, now, 1).map_err(to_ms)?;
        }
        Ok(())
    }

    /// Charges the tokens a finished request used against its key's token lane.
    pub(crate) fn charge_tokens(&self, key: &KeyId, limits: KeyLimits, tokens: u64) {
        let Some(lane) = limits.tokens_per_minute.and_then(Gcra::per_minute) else { return };
        let now = now_us();
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let lanes = shard.entry(key.clone()).or_default();
        let met = lanes.touch(limits, now);
        lanes.tokens_tat_us = lane.charge(lanes.tokens_tat_us, now, tokens);
        lanes.unsent.tokens = lanes.unsent.tokens.saturating_add(tokens);
        drop(shard);
        if met {
            self.key_met.notify_one();
        }
    }

    /// Takes what every shared key consumed since the last sync, and stops sharing the keys this
    /// node has not seen for [`SHARE_FOR_US`].
    fn take_unsent(&self, now: u64) -> Vec<Taken> {
        let mut taken = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (key, lanes) in shard.iter_mut().filter(|(_, lanes)| lanes.shared) {
                if now.saturating_sub(lanes.used_at_us) > SHARE_FOR_US {
                    lanes.shared = false;
                    lanes.unsent = RateUsage::ZERO;
                    lanes.last_read = None;
                    continue;
                }
                let pushed = std::mem::take(&mut lanes.unsent);
                taken.push(Taken { key: key.clone(), pushed, last_read: lanes.last_read });
            }
        }
        taken
    }

    /// Charges each key's lanes with what the other nodes consumed since the key's last read.
    fn apply(&self, taken: Vec<Taken>, reads: Vec<RateTotals>, now: u64) {
        for (taken, read) in taken.into_iter().zip(reads) {
            let others = read.others_since(taken.last_read.as_ref(), taken.pushed);
            let mut shard = self.shard(&taken.key).lock().unwrap_or_else(|p| p.into_inner());
            // A key pruned meanwhile had drained lanes; it starts afresh when met again.
            let Some(lanes) = shard.get_mut(&taken.key) else { continue };
            if others.requests > 0
                && let Some(lane) = lanes.limits.requests_per_minute.and_then(Gcra::per_minute)
            {
                lanes.requests_tat_us = lane.charge(lanes.requests_tat_us, now, others.requests);
            }
            if others.tokens > 0
                && let Some(lane) = lanes.limits.tokens_per_minute.and_then(Gcra::per_minute)
            {
                lanes.tokens_tat_us = lane.charge(lanes.tokens_tat_us, now, others.tokens);
            }
            lanes.last_read = Some(read);
        }
    }

    /// One sync: push what this node consumed, charge what the others did; how many keys it
    /// carried. On failure what was taken is dropped rather than kept for the next sync: kept, a
    /// long outage would come back as one push that blocks the key on every other node for as long.
    async fn sync(&self, share: &dyn RateShare) -> Result<usize, CounterError> {
        let taken = self.take_unsent(now_us());
        let push: Vec<(KeyId, RateUsage)> = taken.iter().map(|t| (t.key.clone(), t.pushed)).collect();
        let reads = share.exchange(&push).await?;
        if reads.len() != push.len() {
            return Err(CounterError::Protocol("one read per key expected".to_owned()));
        }
        self.apply(taken, reads, now_us());
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(push.len())
    }

    /// Syncs with `share` every `interval`, and early when a key is met, until `shutdown`. A
    /// failing store only means each node enforces the limits alone meanwhile.
    pub(crate) async fn share(
        &self,
        share: &dyn RateShare,
        interval: Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        let interval = interval.max(Duration::from_millis(1));
        let mut shutdown = std::pin::pin!(shutdown);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_sync = Instant::now();
        let mut failing = false;
        let mut warned_at: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
                () = self.key_met.notified() => {
                    // Keys met in a burst cost the store a few dozen syncs a second, not one each.
                    tokio::time::sleep_until(last_sync + WOKEN_SYNC_GAP.min(interval)).await;
                }
            }
            last_sync = Instant::now();
            let result = tokio::select! {
                biased;
                () = &mut shutdown => return,
                result = self.sync(share) => result,
            };
            match result {
                Ok(keys) => {
                    if std::mem::replace(&mut failing, false) {
                        tracing::info!(keys, "shared rate limits sync again");
                    }
                }
                Err(error) => {
                    failing = true;
                    if warned_at.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                        warned_at = Some(Instant::now());
                        tracing::warn!(%error, "shared rate limits cannot sync; each node enforces them alone meanwhile");
                    } else {
                        tracing::debug!(%error, "shared rate limits still cannot sync");
                    }
                }
            }
        }
    }
}

fn to_ms(wait_us: u64) -> u64 {
    wait_us.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use recovea_counters::InProcessRateShare;

    use super::*;

    #[test]
    fn requests_over_the_minute_wait_and_tokens_block_once_spent() {
        let limiter = RateLimiter::default();
        let key = KeyId::parse("key_a").expect("id");
        let limits = KeyLimits { requests_per_minute: Some(2), tokens_per_minute: None };
        assert_eq!(limiter.admit(&key, limits), Ok(()));
        assert_eq!(limiter.admit(&key, limits), Ok(()));
        let wait = limiter.admit(&key, limits).expect_err("a third request in the minute waits");
        assert!((29_000..=30_000).contains(&wait), "{wait}");

        let other = KeyId::parse("key_b").expect("id");
        let tokens = KeyLimits { requests_per_minute: None, tokens_per_minute: Some(1000) };
        assert_eq!(limiter.admit(&other, tokens), Ok(()));
        limiter.charge_tokens(&other, tokens, 5000);
        assert!(limiter.admit(&other, tokens).is_err(), "five minutes of tokens spent");
        assert_eq!(limiter.admit(&key, KeyLimits::default()), Ok(()), "no limits, no lane");
    }

    /// A store whose clock stays in one minute, so that no test straddles two.
    fn store() -> Arc<InProcessRateShare> {
        Arc::new(InProcessRateShare::with_clock(|| 1_700_000_040_000 + 30_000))
    }

    fn sync(limiter: &RateLimiter, share: &dyn RateShare) -> usize {
        futures_util::FutureExt::now_or_never(limiter.sync(share))
            .expect("the in-process store answers at once")
            .expect("the in-process store never fails")
    }

    fn admitted(limiter: &RateLimiter, key: &KeyId, limits: KeyLimits, tries: usize) -> usize {
        (0..tries).filter(|_| limiter.admit(key, limits).is_ok()).count()
    }

    const TEN_A_MINUTE: KeyLimits = KeyLimits { requests_per_minute: Some(10), tokens_per_minute: None };

    #[test]
    fn two_nodes_sharing_a_store_admit_one_limit_between_them() {
        let (store, a, b) = (store(), RateLimiter::default(), RateLimiter::default());
        let key = KeyId::parse("key_shared").expect("id");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 4), 4);
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 3), 3);
        assert_eq!(sync(&a, store.as_ref()), 1);
        assert_eq!(sync(&b, store.as_ref()), 1, "b learns a's 4");
        assert_eq!(sync(&a, store.as_ref()), 1, "a learns b's 3");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 5), 3, "7 of the 10 were spent on both nodes");
        assert_eq!(sync(&a, store.as_ref()), 1);
        assert_eq!(sync(&b, store.as_ref()), 1);
        let wait = b.admit(&key, TEN_A_MINUTE).expect_err("b knows all 10 are spent");
        assert!((1..=6_000).contains(&wait), "the next in at most a tenth of a minute, not {wait} ms");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 1), 0);

        // Neither node charges its own consumption twice: with nothing new, nothing changes.
        let before = a.shard(&key).lock().expect("lock")[&key].requests_tat_us;
        sync(&a, store.as_ref());
        assert_eq!(a.shard(&key).lock().expect("lock")[&key].requests_tat_us, before);
    }

    #[test]
    fn tokens_charged_on_one_node_block_the_key_on_the_other() {
        let (store, a, b) = (store(), RateLimiter::default(), RateLimiter::default());
        let key = KeyId::parse("key_tokens").expect("id");
        let limits = KeyLimits { requests_per_minute: None, tokens_per_minute: Some(1000) };
        assert_eq!(b.admit(&key, limits), Ok(()));
        sync(&b, store.as_ref());
        assert_eq!(a.admit(&key, limits), Ok(()));
        a.charge_tokens(&key, limits, 3000);
        sync(&a, store.as_ref());
        assert_eq!(b.admit(&key, limits), Ok(()), "b has not heard yet: it decides alone");
        sync(&b, store.as_ref());
        let wait = b.admit(&key, limits).expect_err("three minutes of tokens spent on a");
        assert!((110_000..=120_000).contains(&wait), "{wait}");
    }

    #[test]
    fn a_store_that_lost_its_counts_charges_nothing_it_did_not_see() {
        let (store, a, b) = (store(), RateLimiter::default(), RateLimiter::default());
        let key = KeyId::parse("key_flushed").expect("id");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 5), 5);
        sync(&a, store.as_ref());
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 1), 1);
        sync(&b, store.as_ref());
        store.clear();
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 1), 1);
        sync(&b, store.as_ref());
        sync(&a, store.as_ref());
        // a holds its own 5 and b's one after the flush; b's one before it went with the store
        // before a read it: 6, and no panic, no negative charge on either side.
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 10), 4);
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 10), 3, "b still holds its 2 and a's 5");
    }

    #[test]
    fn a_store_down_leaves_each_node_enforcing_the_limit_alone() {
        let (store, a, b) = (store(), RateLimiter::default(), RateLimiter::default());
        let key = KeyId::parse("key_alone").expect("id");
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 1), 1);
        sync(&b, store.as_ref());
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 4), 4);
        let failed = futures_util::FutureExt::now_or_never(a.sync(&recovea_counters::fakes::Unreachable))
            .expect("at once");
        assert!(matches!(failed, Err(CounterError::Unavailable(_))), "{failed:?}");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 20), 6, "a goes on deciding alone");
        // Back: what a admitted while the store was down is not pushed in one late lump, only
        // what it admitted since the failed sync.
        sync(&a, store.as_ref());
        sync(&b, store.as_ref());
        assert_eq!(admitted(&b, &key, TEN_A_MINUTE, 20), 3, "b holds its 1 and a's last 6");
        assert_eq!(admitted(&a, &key, TEN_A_MINUTE, 1), 0);
    }

    #[test]
    fn keys_not_seen_for_two_minutes_leave_the_sync() {
        let limiter = RateLimiter::default();
        let key = KeyId::parse("key_idle").expect("id");
        assert_eq!(limiter.admit(&key, TEN_A_MINUTE), Ok(()));
        let now = now_us();
        assert_eq!(limiter.take_unsent(now).len(), 1);
        assert_eq!(limiter.take_unsent(now + SHARE_FOR_US + 1_000_000).len(), 0);
        let lanes = limiter.shard(&key).lock().expect("lock")[&key];
        assert!(!lanes.shared && lanes.last_read.is_none(), "met again, it starts afresh");
        assert_eq!(limiter.admit(&key, KeyLimits::default()), Ok(()));
        assert_eq!(limiter.take_unsent(now_us()).len(), 0, "unlimited keys are never shared");
    }

    #[tokio::test]
    async fn the_share_loop_syncs_early_for_a_new_key_and_ends_on_shutdown() {
        let limiter_arc = Arc::new(RateLimiter::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let store: Arc<dyn RateShare> = store();
        let limiter = Arc::clone(&limiter_arc);
        let task = tokio::spawn(async move {
            limiter
                .share(store.as_ref(), Duration::from_secs(3600), async move {
                    let _ = stopped.await;
                })
                .await;
        });
        // The first tick is at once; the next would be an hour away, but a new key wakes it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while limiter_arc.syncs.load(Ordering::Relaxed) < 1 {
            assert!(Instant::now() < deadline, "the first sync never came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let key = KeyId::parse("key_new").expect("id");
        assert_eq!(limiter_arc.admit(&key, TEN_A_MINUTE), Ok(()));
        while limiter_arc.shard(&key).lock().expect("lock")[&key].last_read.is_none() {
            assert!(Instant::now() < deadline, "a new key did not wake the sync");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(()).expect("the loop listens");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ends on shutdown")
            .expect("no panic");
    }
}
