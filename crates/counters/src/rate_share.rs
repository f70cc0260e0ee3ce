//! Per-key rate limits shared across nodes: the store (in-process or Redis) and other nodes' consumption read from it.
//!
//! The store counts, per key, the requests admitted and the tokens charged in each minute of *its*
//! clock (Redis `TIME`, so that nodes whose clocks disagree still add to the same minute), and
//! keeps the current minute and the one before. A node pushes what it consumed since its last sync
//! and reads both minutes back in the same atomic step; comparing that with its previous read
//! ([`RateTotals::others_since`]) gives what the other nodes consumed in between, which the node
//! charges into its own GCRA lanes. Deciding stays local and nothing here is on the request path.
//!
//! Counting per minute rather than one running total bounds what a read can ever charge: after a
//! long outage, or on a key this node meets for the first time, it is at most about a minute of the
//! other nodes' consumption, never hours of it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use recovea_core::ids::KeyId;
use redis::{ErrorKind, RedisError, Script};

use crate::redis_store::counter_error;
use crate::redis_target::Link;
use crate::shared::CounterError;

const MINUTE_MS: u64 = 60_000;

/// A key's entry in the store lives this long after its last write. It must outlive the minute
/// after its last write (still read as "the minute before"); past that, nothing of it is read.
pub const RATE_KEY_TTL: Duration = Duration::from_secs(120);

/// Requests admitted and tokens charged for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateUsage {
    pub requests: u64,
    pub tokens: u64,
}

impl RateUsage {
    pub const ZERO: Self = Self { requests: 0, tokens: 0 };

    pub fn is_zero(&self) -> bool {
        *self == Self::ZERO
    }

    pub fn saturating_add(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(other.requests),
            tokens: self.tokens.saturating_add(other.tokens),
        }
    }

    pub fn saturating_sub(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_sub(other.requests),
            tokens: self.tokens.saturating_sub(other.tokens),
        }
    }

    /// What grew from `old` to `self`. A total below what was seen means the store lost the key
    /// (expiry, flush, restart) after that read: all it holds now came since, so all of it is new.
    fn grown_from(self, old: Self) -> Self {
        let part = |new: u64, old: u64| if new >= old { new - old } else { new };
        Self { requests: part(self.requests, old.requests), tokens: part(self.tokens, old.tokens) }
    }

    /// `self × numerator / denominator`, rounded up so that a part is never read as none.
    fn scaled_up(self, numerator: u64, denominator: u64) -> Self {
        let part = |n: u64| {
            let scaled = (u128::from(n) * u128::from(numerator)).div_ceil(u128::from(denominator.max(1)));
            u64::try_from(scaled).unwrap_or(u64::MAX)
        };
        Self { requests: part(self.requests), tokens: part(self.tokens) }
    }
}

/// One key's totals over all nodes, as the store read them right after applying a push.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateTotals {
    /// The store's clock at the read (unix ms); its minute is the "current" one below.
    pub at_ms: u64,
    /// Everything counted in the store's current minute, this push included.
    pub current: RateUsage,
    /// Everything counted in the minute before.
    pub previous: RateUsage,
}

impl RateTotals {
    fn minute(&self) -> u64 {
        self.at_ms / MINUTE_MS
    }

    /// What the other nodes consumed between `last` (this node's previous read of the key, `None`
    /// if it has none) and this read, whose push carried `pushed` of this node's own consumption.
    /// Never negative, whatever the store lost or whichever way its clock moved.
    pub fn others_since(&self, last: Option<&Self>, pushed: RateUsage) -> RateUsage {
        let fresh = match last {
            Some(last) if last.minute() == self.minute() => {
                self.current.grown_from(last.current).saturating_add(self.previous.grown_from(last.previous))
            }
            // The minute turned: what was current then is the previous minute now, and nobody has
            // written to the minute before that since.
            Some(last) if last.minute() + 1 == self.minute() => {
                self.current.saturating_add(self.previous.grown_from(last.current))
            }
            // The store's clock went back (a failover to a server whose clock lags): the minutes
            // cannot be matched, so this read only becomes the new baseline.
            Some(last) if last.minute() > self.minute() => return RateUsage::ZERO,
            // No baseline, or the last read is older than anything the store still holds: every
            // count is new to this node, but not all of it is recent, so the minute before counts
            // only for the part of it that falls within the last sixty seconds.
            _ => {
                let into_minute = self.at_ms % MINUTE_MS;
                self.current.saturating_add(self.previous.scaled_up(MINUTE_MS - into_minute, MINUTE_MS))
            }
        };
        fresh.saturating_sub(pushed)
    }
}

/// The store the nodes share per-key rate limits through.
pub trait RateShare: Send + Sync + 'static {
    /// Adds each key's usage to the store's current minute and reads the key's totals after it,
    /// atomically per key: one [`RateTotals`] per entry of `push`, in order. A zero usage only
    /// reads. An empty push only checks that the store answers. On `Err` nothing may be assumed
    /// about what was applied.
    fn exchange<'a>(
        &'a self,
        push: &'a [(KeyId, RateUsage)],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<RateTotals>, CounterError>> + Send + 'a>>;
}

type Clock = Box<dyn Fn() -> u64 + Send + Sync>;

/// The store of one process: the same semantics as Redis, in memory, on this process's clock.
/// Shares limits between limiters of one process (tests); never unavailable.
pub struct InProcessRateShare {
    clock: Clock,
    keys: Mutex<HashMap<KeyId, StoredRate>>,
}

#[derive(Debug, Clone, Copy)]
struct StoredRate {
    minute: u64,
    current: RateUsage,
    previous: RateUsage,
    expires_at_ms: u64,
}

impl std::fmt::Debug for InProcessRateShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessRateShare").finish_non_exhaustive()
    }
}

impl Default for InProcessRateShare {
    fn default() -> Self {
        Self::with_clock(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }
}

impl InProcessRateShare {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store on the given clock (unix ms), for tests that move time.
    pub fn with_clock(clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self { clock: Box::new(clock), keys: Mutex::new(HashMap::new()) }
    }

    /// Forgets every count, as a Redis flush or restart would.
    pub fn clear(&self) {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    fn exchange_now(&self, push: &[(KeyId, RateUsage)]) -> Vec<RateTotals> {
        let now = (self.clock)();
        let minute = now / MINUTE_MS;
        let ttl = u64::try_from(RATE_KEY_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.retain(|_, stored| stored.expires_at_ms > now);
        push.iter()
            .map(|(key, usage)| {
                if let Some(stored) = keys.get_mut(key)
                    && stored.minute < minute
                {
                    stored.previous =
                        if stored.minute + 1 == minute { stored.current } else { RateUsage::ZERO };
                    stored.current = RateUsage::ZERO;
                    stored.minute = minute;
                }
                if !usage.is_zero() {
                    let stored = keys.entry(key.clone()).or_insert(StoredRate {
                        minute,
                        current: RateUsage::ZERO,
                        previous: RateUsage::ZERO,
                        expires_at_ms: 0,
                    });
                    stored.current = stored.current.saturating_add(*usage);
                    stored.expires_at_ms = now.saturating_add(ttl);
                }
                keys.get(key).map_or(RateTotals { at_ms: now, ..RateTotals::default() }, |stored| {
                    RateTotals { at_ms: now, current: stored.current, previous: stored.previous }
                })
            })
            .collect()
    }
}

impl RateShare for InProcessRateShare {
    fn exchange<'a>(
        &'a self,
        push: &'a [(KeyId, RateUsage)],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<RateTotals>, CounterError>> + Send + 'a>> {
        Box::pin(std::future::ready(Ok(self.exchange_now(push))))
    }
}

/// One key's share of a sync, atomic: add this node's consumption to the current minute of the
/// server's clock, drop minutes older than the one before, read both minutes back. Counts go
/// through HINCRBY on the decimal strings given; Lua's numbers (doubles) only carry the clock and
/// the replies.
///
/// KEYS[1]: hash of `r:<minute>` (requests) and `t:<minute>` (tokens), minute = unix seconds / 60.
/// ARGV: requests to add, tokens to add, expire after this many ms without a write.
/// Returns { server time (unix ms), requests, tokens (this minute), requests, tokens (the one before) }.
const RATE_SCRIPT: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local key, requests, tokens, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local time = redis.call('TIME')
local minute = math.floor(tonumber(time[1]) / 60)
local now, before = tostring(minute), tostring(minute - 1)
if requests ~= '0' or tokens ~= '0' then
  for _, field in ipairs(redis.call('HKEYS', key)) do
    local m = string.sub(field, 3)
    if m ~= now and m ~= before then redis.call('HDEL', key, field) end
  end
  redis.call('HINCRBY', key, 'r:' .. now, requests)
  redis.call('HINCRBY', key, 't:' .. now, tokens)
  redis.call('PEXPIRE', key, ttl)
end
local v = redis.call('HMGET', key, 'r:' .. now, 't:' .. now, 'r:' .. before, 't:' .. before)
return { tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000),
  tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4] or '0') }
";

/// Per-key rate limits shared through Redis (or Valkey): one script per key, all keys of a sync in
/// one pipeline. Connects lazily and reconnects after any failure, so a node starts and serves
/// while Redis is down (each node then enforces the limits alone).
pub struct RedisRateShare {
    link: Link,
    prefix: String,
    timeout: Duration,
    script: Script,
}

impl std::fmt::Debug for RedisRateShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: it is not shown.
        f.debug_struct("RedisRateShare")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisRateShare {
    /// The bound on connecting and on one sync's round trip unless [`with_timeout`](Self::with_timeout) says otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    /// Checks the URL (`redis://host:port/db`) and the key prefix (no `{` or `}`); does not
    /// connect.
    pub fn new(url: &str, prefix: &str) -> Result<Self, CounterError> {
        Self::with_tls(url, &crate::RedisTls::default(), prefix)
    }

    /// As [`Self::new`], `rediss://` URLs with `tls`'s certificates.
    pub fn with_tls(url: &str, tls: &crate::RedisTls, prefix: &str) -> Result<Self, CounterError> {
        if prefix.contains(['{', '}']) {
            return Err(CounterError::Config("the key prefix must not contain '{' or '}'".to_owned()));
        }
        Ok(Self {
            link: Link::new(url, tls)?,
            prefix: prefix.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
            script: Script::new(RATE_SCRIPT),
        })
    }

    /// Bounds connecting and each sync's round trip by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The Redis key holding `key`'s counts. The braces are a hash tag, so that a Redis Cluster
    /// keeps all of one key's counts on one slot.
    pub fn key_for(&self, key: &KeyId) -> String {
        format!("{}:{{{}}}", self.prefix, key.as_str())
    }

    async fn exchange_once(&self, push: &[(KeyId, RateUsage)]) -> Result<Vec<RateTotals>, RedisError> {
        let mut connection = self.link.connection(self.timeout, &[&self.script]).await?;
        if push.is_empty() {
            redis::cmd("PING").query_async::<()>(&mut connection).await?;
            return Ok(Vec::new());
        }
        let ttl_ms = u64::try_from(RATE_KEY_TTL.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        for (key, usage) in push {
            pipe.cmd("EVALSHA")
                .arg(self.script.get_hash())
                .arg(1)
                .arg(self.key_for(key))
                .arg(usage.requests)
                .arg(usage.tokens)
                .arg(ttl_ms);
        }
        // A server that lost the script (SCRIPT FLUSH, a restart, a failover) ran none of the
        // commands that name it: those are sent again.
        let replies: Vec<Vec<i64>> = connection.each(&pipe, &[&self.script]).await?;
        replies.iter().map(|reply| parse_reply(reply)).collect()
    }
}

fn parse_reply(reply: &[i64]) -> Result<RateTotals, RedisError> {
    let bad = || RedisError::from((ErrorKind::UnexpectedReturnType, "malformed rate sync reply"));
    let count = |n: &i64| u64::try_from(*n).map_err(|_| bad());
    let [at_ms, requests, tokens, previous_requests, previous_tokens] = reply else { return Err(bad()) };
    Ok(RateTotals {
        at_ms: count(at_ms)?,
        current: RateUsage { requests: count(requests)?, tokens: count(tokens)? },
        previous: RateUsage { requests: count(previous_requests)?, tokens: count(previous_tokens)? },
    })
}

impl RateShare for RedisRateShare {
    fn exchange<'a>(
        &'a self,
        push: &'a [(KeyId, RateUsage)],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<RateTotals>, CounterError>> + Send + 'a>> {
        Box::pin(async move {
            let error = match tokio::time::timeout(self.timeout, self.exchange_once(push)).await {
                Ok(Ok(totals)) if totals.len() == push.len() => return Ok(totals),
                Ok(Ok(_)) => CounterError::Protocol("one reply per key expected".to_owned()),
                Ok(Err(e)) => counter_error(&e),
                Err(_) => CounterError::Timeout,
            };
            // Whatever went wrong, the next sync starts on a fresh connection.
            self.link.forget().await;
            Err(error)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    const T0: u64 = 1_700_000_040_000; // a minute's start

    fn usage(requests: u64, tokens: u64) -> RateUsage {
        RateUsage { requests, tokens }
    }

    fn totals(at_ms: u64, current: (u64, u64), previous: (u64, u64)) -> RateTotals {
        RateTotals { at_ms, current: usage(current.0, current.1), previous: usage(previous.0, previous.1) }
    }

    #[test]
    fn within_a_minute_others_are_the_growth_less_this_nodes_push() {
        let last = totals(T0 + 1_000, (5, 500), (2, 20));
        let read = totals(T0 + 1_250, (9, 900), (2, 20));
        assert_eq!(read.others_since(Some(&last), usage(1, 100)), usage(3, 300));
    }

    #[test]
    fn when_the_minute_turns_the_last_current_is_compared_with_the_new_previous() {
        let last = totals(T0 + 59_900, (5, 500), (2, 20));
        let read = totals(T0 + 60_100, (1, 10), (7, 700));
        // Two more landed in the old minute, one in the new one, and it was this node's.
        assert_eq!(read.others_since(Some(&last), usage(1, 10)), usage(2, 200));
    }

    #[test]
    fn a_first_read_counts_the_last_minute_less_this_nodes_push() {
        let read = totals(T0 + 15_000, (4, 40), (8, 80));
        // Three quarters of the minute before still falls within the last sixty seconds.
        assert_eq!(read.others_since(None, usage(1, 10)), usage(3 + 6, 30 + 60));
        // A part of a request is a request: the minute before never rounds down to nothing.
        let read = totals(T0 + 59_999, (0, 0), (1, 1));
        assert_eq!(read.others_since(None, RateUsage::ZERO), usage(1, 1));
    }

    #[test]
    fn a_read_after_a_long_gap_counts_like_a_first_read() {
        let last = totals(T0, (50, 5000), (50, 5000));
        let read = totals(T0 + 3 * MINUTE_MS, (4, 40), (0, 0));
        assert_eq!(read.others_since(Some(&last), usage(1, 10)), usage(3, 30));
    }

    #[test]
    fn totals_that_went_back_count_only_what_came_after_and_never_negative() {
        // The store lost the key: it holds only what was pushed since, this node's included.
        let last = totals(T0 + 1_000, (9, 900), (5, 50));
        let read = totals(T0 + 1_250, (3, 30), (0, 0));
        assert_eq!(read.others_since(Some(&last), usage(1, 10)), usage(2, 20));
        // This node's push alone is all the store holds: nothing of the others.
        let read = totals(T0 + 1_250, (1, 10), (0, 0));
        assert_eq!(read.others_since(Some(&last), usage(1, 10)), RateUsage::ZERO);
        // More pushed than read (a store that lost the push itself): nothing, not a negative.
        assert_eq!(read.others_since(Some(&last), usage(5, 500)), RateUsage::ZERO);
    }

    #[test]
    fn a_store_clock_that_went_back_only_sets_a_new_baseline() {
        let last = totals(T0 + 60_500, (3, 30), (9, 90));
        let read = totals(T0 + 59_000, (20, 200), (1, 1));
        assert_eq!(read.others_since(Some(&last), usage(1, 1)), RateUsage::ZERO);
    }

    fn key(name: &str) -> KeyId {
        KeyId::parse(name).expect("id")
    }

    fn exchange(store: &InProcessRateShare, push: &[(KeyId, RateUsage)]) -> Vec<RateTotals> {
        store.exchange_now(push)
    }

    #[test]
    fn the_in_process_store_keeps_two_minutes_and_forgets_idle_keys() {
        let clock = Arc::new(AtomicU64::new(T0 + 10_000));
        let store = {
            let clock = Arc::clone(&clock);
            InProcessRateShare::with_clock(move || clock.load(Ordering::SeqCst))
        };
        let (a, b) = (key("key_a"), key("key_b"));
        let read = exchange(&store, &[(a.clone(), usage(2, 20)), (b.clone(), RateUsage::ZERO)]);
        assert_eq!(read, vec![totals(T0 + 10_000, (2, 20), (0, 0)), totals(T0 + 10_000, (0, 0), (0, 0))]);

        clock.store(T0 + 70_000, Ordering::SeqCst);
        let read = exchange(&store, &[(a.clone(), usage(1, 10))]);
        assert_eq!(read, vec![totals(T0 + 70_000, (1, 10), (2, 20))], "the minute turned");

        clock.store(T0 + 130_000, Ordering::SeqCst);
        let read = exchange(&store, &[(a.clone(), RateUsage::ZERO)]);
        assert_eq!(read, vec![totals(T0 + 130_000, (0, 0), (1, 10))], "a read without a write rolls too");

        // The key was last written at T0 + 70 s; it expires two minutes later.
        clock.store(T0 + 70_000 + 120_000, Ordering::SeqCst);
        let read = exchange(&store, &[(a, RateUsage::ZERO)]);
        assert_eq!(read, vec![totals(T0 + 190_000, (0, 0), (0, 0))]);
        assert!(store.keys.lock().expect("lock").is_empty(), "reads create nothing");
    }

    #[test]
    fn a_redis_prefix_may_not_hold_a_hash_tag() {
        assert!(matches!(RedisRateShare::new("redis://127.0.0.1:6379", "a{b"), Err(CounterError::Config(_))));
        assert!(matches!(RedisRateShare::new("nope://", "p"), Err(CounterError::Config(_))));
        let share = RedisRateShare::new("redis://127.0.0.1:6379", "p").expect("valid");
        assert_eq!(share.key_for(&key("key_x1")), "p:{key_x1}");
    }

    #[test]
    fn malformed_replies_are_refused() {
        assert!(parse_reply(&[1, 2, 3, 4]).is_err());
        assert!(parse_reply(&[1, 2, -3, 4, 5]).is_err());
        assert_eq!(parse_reply(&[T0 as i64, 2, 3, 4, 5]).ok(), Some(totals(T0, (2, 3), (4, 5))));
    }
}
