//! The node's per-key rate limiter: a GCRA lane for requests and one for tokens per key, in
//! sharded maps so that keys rarely contend. Tokens are charged when the receipt is known.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use recovea_core::ids::KeyId;
use recovea_core::ratelimit::{Gcra, KeyLimits};

const SHARDS: usize = 16;
/// A shard keeps at most this many keys before forgetting those whose lanes have drained.
const PRUNE_ABOVE: usize = 4096;

#[derive(Default, Clone, Copy)]
struct Lanes {
    requests_tat_us: u64,
    tokens_tat_us: u64,
}

#[derive(Default)]
pub(crate) struct RateLimiter {
    shards: [Mutex<HashMap<KeyId, Lanes>>; SHARDS],
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
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
        lanes.tokens_tat_us = lane.charge(lanes.tokens_tat_us, now, tokens);
    }
}

fn to_ms(wait_us: u64) -> u64 {
    wait_us.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
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
}
