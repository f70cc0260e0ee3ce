//! Attempts by client address, each kind in its own allowance: wrong tokens, for the admin API and
//! the console's sign-in alike (a guesser is answered `429` after a few, without any work or log
//! line being spared for the right token, which is always let in: behind a proxy every client shares
//! its address, and one guesser there must not lock the operator out), and single sign-on's logins
//! started (each holds a waiting login in memory, which a flood from one address must not evict).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use recovea_core::ratelimit::Gcra;

/// Wrong tokens a client address may present a minute: ten at once, then one every six seconds.
/// Enough for a person who mistypes; a guesser of a 32-character token gets nowhere either way,
/// but need not be given the CPU and the log lines.
pub(crate) const WRONG_TOKENS_PER_MINUTE: u32 = 10;
/// Logins through single sign-on a client address may start a minute: thirty at once, then one
/// every two seconds. A person starts one; a team behind one proxy signing in at nine starts a few;
/// evicting the 4,096 logins that wait (`oidc::pending`) from one address takes over two hours.
pub(crate) const SIGN_ON_STARTS_PER_MINUTE: u32 = 30;
/// Bounds the memory attempts can take: past this the address closest to a full allowance is
/// forgotten.
const MAX_CLIENTS: usize = 4096;

/// Attempts of one kind by client address (`None`: a client whose address is unknown), each a GCRA
/// lane's arrival time in microseconds since `epoch`. Only what the caller counts counts.
pub(crate) struct Attempts {
    epoch: Instant,
    lane: Gcra,
    by_client: Mutex<HashMap<Option<IpAddr>, u64>>,
}

impl Attempts {
    /// `per_minute` attempts a minute from each address, as many of them at once.
    pub(crate) fn per_minute(per_minute: u32) -> Self {
        Self {
            epoch: Instant::now(),
            lane: Gcra::per_minute(per_minute.max(1)).unwrap_or_else(|| unreachable!("a rate above 0")),
            by_client: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(wait)` when `client` has used up its attempts: how long until it may try again.
    pub(crate) fn may_try(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let now_us = self.micros(now);
        let tat = self.lock().get(&client).copied().unwrap_or(0);
        self.lane.check(tat, now_us, 1).map(|_| ()).map_err(Duration::from_micros)
    }

    /// Counts an attempt from `client`.
    pub(crate) fn count(&self, client: Option<IpAddr>, now: Instant) {
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
        let attempts = Attempts::per_minute(WRONG_TOKENS_PER_MINUTE);
        let now = Instant::now();
        let (a, b) = (Some(IpAddr::from([192, 0, 2, 1])), Some(IpAddr::from([192, 0, 2, 2])));
        for n in 0..WRONG_TOKENS_PER_MINUTE {
            assert_eq!(attempts.may_try(a, now), Ok(()), "attempt {n}");
            attempts.count(a, now);
        }
        let wait = attempts.may_try(a, now).expect_err("the eleventh wrong token waits");
        assert_eq!(wait, Duration::from_secs(6), "a minute over ten");
        assert_eq!(attempts.may_try(b, now), Ok(()), "another address is not held back");
        assert_eq!(attempts.may_try(None, now), Ok(()));
        assert_eq!(attempts.may_try(a, now + wait), Ok(()), "and may try again once that has passed");
    }

    #[test]
    fn sign_on_starts_have_their_own_allowance() {
        let starts = Attempts::per_minute(SIGN_ON_STARTS_PER_MINUTE);
        let now = Instant::now();
        let a = Some(IpAddr::from([192, 0, 2, 1]));
        for n in 0..SIGN_ON_STARTS_PER_MINUTE {
            assert_eq!(starts.may_try(a, now), Ok(()), "start {n}");
            starts.count(a, now);
        }
        assert_eq!(starts.may_try(a, now), Err(Duration::from_secs(2)), "then one every two seconds");
    }

    #[test]
    fn clients_are_bounded() {
        let attempts = Attempts::per_minute(WRONG_TOKENS_PER_MINUTE);
        let now = Instant::now();
        for i in 0..=MAX_CLIENTS as u32 {
            attempts.count(Some(IpAddr::from(i.to_be_bytes())), now + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(attempts.lock().len(), MAX_CLIENTS);
        assert!(!attempts.lock().contains_key(&Some(IpAddr::from(0_u32.to_be_bytes()))), "the oldest went");
    }
}
