//! Logins on their way through the provider: each attempt kept in memory under its state until its
//! callback takes it, once, or it expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::flow::LoginAttempt;

/// How long a person has at the provider's sign-in page before the login must start again.
pub const LOGIN_TTL: Duration = Duration::from_secs(10 * 60);
/// Bounds the memory that starting logins (which anyone may do) can take: past it the attempt
/// closest to its end gives way.
const MAX_PENDING_LOGINS: usize = 4096;

#[derive(Default)]
pub(crate) struct PendingLogins {
    by_state: Mutex<HashMap<String, (LoginAttempt, Instant)>>,
}

impl PendingLogins {
    pub(crate) fn insert(&self, attempt: LoginAttempt, now: Instant) {
        let mut pending = self.lock();
        pending.retain(|_, (_, expires)| *expires > now);
        if pending.len() >= MAX_PENDING_LOGINS
            && let Some(oldest) =
                pending.iter().min_by_key(|(_, (_, expires))| *expires).map(|(state, _)| state.clone())
        {
            pending.remove(&oldest);
        }
        pending.insert(attempt.state().to_owned(), (attempt, now + LOGIN_TTL));
    }

    /// The live attempt whose state is `state`, which no later call gets again.
    pub(crate) fn take(&self, state: &str, now: Instant) -> Option<LoginAttempt> {
        let (attempt, expires) = self.lock().remove(state)?;
        (expires > now).then_some(attempt)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LoginAttempt, Instant)>> {
        self.by_state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_is_taken_once_and_only_before_it_expires() {
        let pending = PendingLogins::default();
        let now = Instant::now();
        let attempt = LoginAttempt::generate().expect("random");
        pending.insert(attempt.clone(), now);
        assert!(pending.take("another state", now).is_none());
        assert_eq!(pending.take(attempt.state(), now), Some(attempt.clone()));
        assert!(pending.take(attempt.state(), now).is_none(), "used once");
        pending.insert(attempt.clone(), now);
        assert!(pending.take(attempt.state(), now + LOGIN_TTL).is_none(), "expired");
    }

    #[test]
    fn the_oldest_attempt_gives_way_past_the_bound() {
        let pending = PendingLogins::default();
        let start = Instant::now();
        let first = LoginAttempt::generate().expect("random");
        pending.insert(first.clone(), start);
        for i in 1..MAX_PENDING_LOGINS as u32 {
            pending.insert(
                LoginAttempt::generate().expect("random"),
                start + Duration::from_millis(u64::from(i)),
            );
        }
        let last = LoginAttempt::generate().expect("random");
        let later = start + Duration::from_secs(1);
        pending.insert(last.clone(), later);
        assert_eq!(pending.lock().len(), MAX_PENDING_LOGINS);
        assert!(pending.take(first.state(), later).is_none());
        assert!(pending.take(last.state(), later).is_some());
    }
}
