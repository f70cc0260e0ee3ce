//! Wrong tokens by client address, for the admin API and the console's sign-in alike: a guesser is
//! answered `429` after a few, without any work or log line being spared for the right token, which
//! is always let in (behind a proxy every client shares its address: one guesser there must not
//! lock the operator out).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use recovea_core::ratelimit::Gcra;

/// Wrong tokens a client address may present a minute: ten at once, then one every six seconds.
/// Enough for a person who mistypes; a guesser of a 32-character token gets nowhere either way,
/// but need not be given the CPU and the log lines.
pub(crate) const WRONG_TOKENS_PER_MINUTE: u32 = 10;
/// Bounds the memory wrong tokens can take: past this the address closest to a full allowance is
/// forgotten.
const MAX_CLIENTS: usize = 4096;

/// Wrong tokens by client address (`None`: a client whose address is unknown), each a GCRA
/// lane's arrival time in microseconds since `epoch`. Only wrong tokens count.
pub(crate) struct WrongTokens {
    epoch: Instant,
    lane: Gcra,
    by_client: Mutex<HashMap<Option<IpAddr>, u64>>,
}

impl Default for WrongTokens {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            lane: Gcra::per_minute(WRONG_TOKENS_PER_MINUTE).unwrap_or_else(|| unreachable!("a rate above 0")),
            by_client: Mutex::new(HashMap::new()),
        }
    }
}

impl WrongTokens {
    /// `Err(wait)` when `client` has used up its wrong tokens: how long until it may try again.
    pub(crate) fn may_try(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let now_us = self.micros(now);
        let tat = self.lock().get(&client).copied().unwrap_or(0);
        self.lane.check(tat, now_us, 1).map(|_| ()).map_err(Duration::from_micros)
    }

    /// Counts a wrong token from `client`.
    pub(crate) fn failed(&self, client: Option<IpAddr>, now: Instant) {
        let now_us = self.micros(now);
        let mut clients = self.lock();
        if !clients.contains_key(&client) && clients.len() >= MAX_CLIENTS {
            clients.retain(|_, tat| *tat > now_us);
            if clients.len() >= MAX_CLIENTS
                && let Some(oldest) = clients.iter().min_by_key(|(_, tat)| **tat).map(|(c, _)| *c)
            {
                clients.remove(&oldest);
            }
        }
        let tat = clients.entry(client).or_insert(0);
        *tat = self.lane.charge(*tat, now_us, 1);
    }

    fn micros(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Option<IpAddr>, u64>> {
        self.by_client.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A wait as the whole seconds a `retry-after` says (rounded up).
pub(crate) fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_tokens_are_limited_per_client_address() {
        let attempts = WrongTokens::default();
        let now = Instant::now();
        let (a, b) = (Some(IpAddr::from([192, 0, 2, 1])), Some(IpAddr::from([192, 0, 2, 2])));
        for n in 0..WRONG_TOKENS_PER_MINUTE {
            assert_eq!(attempts.may_try(a, now), Ok(()), "attempt {n}");
            attempts.failed(a, now);
        }
        let wait = attempts.may_try(a, now).expect_err("the eleventh wrong token waits");
        assert_eq!(wait, Duration::from_secs(6), "a minute over ten");
        assert_eq!(attempts.may_try(b, now), Ok(()), "another address is not held back");
        assert_eq!(attempts.may_try(None, now), Ok(()));
        assert_eq!(attempts.may_try(a, now + wait), Ok(()), "and may try again once that has passed");
    }

    #[test]
    fn clients_are_bounded() {
        let attempts = WrongTokens::default();
        let now = Instant::now();
        for i in 0..=MAX_CLIENTS as u32 {
            attempts.failed(Some(IpAddr::from(i.to_be_bytes())), now + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(attempts.lock().len(), MAX_CLIENTS);
        assert!(!attempts.lock().contains_key(&Some(IpAddr::from(0_u32.to_be_bytes()))), "the oldest went");
    }
}
