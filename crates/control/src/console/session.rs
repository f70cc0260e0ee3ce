//! Console sessions: a random id in an `HttpOnly; SameSite=Strict` cookie, mapped in memory to its
//! expiry and its CSRF token.
//!
//! The admin token itself never leaves the sign-in form: the cookie holds a random id that means
//! nothing outside this process, so a restart signs everyone out, and signing out forgets the id
//! at once (an HMAC-signed cookie could not be withdrawn before it expires).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use recovea_core::ratelimit::Gcra;

use crate::random;

pub(crate) const COOKIE: &str = "recovea_session";
/// A session lasts a working day from sign-in, then the token is asked for again.
pub(crate) const LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// Bounds the memory sign-ins can take: past this the session closest to its end is dropped.
const MAX_SESSIONS: usize = 1024;
/// 32 base62 characters: about 190 bits.
const ID_LEN: usize = 32;

#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) csrf: String,
    expires: Instant,
}

#[derive(Default)]
pub(crate) struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Opens a session; returns its id (for the cookie) and CSRF token (for the forms).
    pub(crate) fn open(&self, now: Instant) -> Result<(String, Session), random::RandomUnavailable> {
        let id = random::token("", ID_LEN)?;
        let session = Session { csrf: random::token("", ID_LEN)?, expires: now + LIFETIME };
        let mut sessions = self.lock();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.expires).map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    /// The live session with this id, if any.
    pub(crate) fn get(&self, id: &str, now: Instant) -> Option<Session> {
        let mut sessions = self.lock();
        match sessions.get(id) {
            Some(session) if session.expires > now => Some(session.clone()),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    pub(crate) fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Wrong tokens a client address may present a minute: ten at once, then one every six seconds.
/// Enough for a person who mistypes; a guesser of a 32-character token gets nowhere either way,
/// but need not be given the CPU and the log lines.
pub(crate) const SIGN_IN_ATTEMPTS_PER_MINUTE: u32 = 10;
/// Bounds the memory wrong tokens can take: past this the address closest to a full allowance is
/// forgotten.
const MAX_SIGN_IN_CLIENTS: usize = 4096;

/// Failed sign-ins by client address (`None`: a client whose address is unknown), each a GCRA
/// lane's arrival time in microseconds since `epoch`. Only wrong tokens count.
pub(crate) struct SignInAttempts {
    epoch: Instant,
    lane: Gcra,
    by_client: Mutex<HashMap<Option<IpAddr>, u64>>,
}

impl Default for SignInAttempts {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            lane: Gcra::per_minute(SIGN_IN_ATTEMPTS_PER_MINUTE)
                .unwrap_or_else(|| unreachable!("a rate above 0")),
            by_client: Mutex::new(HashMap::new()),
        }
    }
}

impl SignInAttempts {
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
        if !clients.contains_key(&client) && clients.len() >= MAX_SIGN_IN_CLIENTS {
            clients.retain(|_, tat| *tat > now_us);
            if clients.len() >= MAX_SIGN_IN_CLIENTS
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

impl Session {
    /// Whether a form's `csrf` field is this session's token, compared in constant time.
    pub(crate) fn csrf_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| constant_time_eq(p.as_bytes(), self.csrf.as_bytes()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session id in a `Cookie` header, if there is one.
pub(crate) fn cookie_value<'a>(cookie_header: &'a str, name: &str) -> Option<&'a str> {
    cookie_header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
}

/// The `Set-Cookie` value that holds a session id. `secure` when the browser reached us over TLS
/// (directly or through a proxy that says so): the cookie is then never sent in clear.
pub(crate) fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        LIFETIME.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that makes the browser forget its session.
pub(crate) fn clear_cookie(secure: bool) -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{}", if secure { "; Secure" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_until_it_expires_or_is_closed() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let (id, session) = sessions.open(now).expect("random");
        assert_eq!(id.len(), ID_LEN);
        assert_ne!(id, session.csrf, "the id and the CSRF token are drawn separately");
        assert_eq!(sessions.get(&id, now).map(|s| s.csrf), Some(session.csrf.clone()));
        assert!(sessions.get(&id, now + LIFETIME).is_none(), "expired at its lifetime");
        assert!(sessions.get(&id, now).is_none(), "an expired session is forgotten");
        let (id, _) = sessions.open(now).expect("random");
        sessions.close(&id);
        assert!(sessions.get(&id, now).is_none());
        assert!(sessions.get("not-a-session", now).is_none());
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let (first, _) = sessions.open(start).expect("random");
        for i in 1..=MAX_SESSIONS as u64 {
            sessions.open(start + Duration::from_millis(i)).expect("random");
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(sessions.get(&first, start).is_none(), "the session closest to its end went first");
    }

    #[test]
    fn wrong_tokens_are_limited_per_client_address() {
        let attempts = SignInAttempts::default();
        let now = Instant::now();
        let (a, b) = (Some(IpAddr::from([192, 0, 2, 1])), Some(IpAddr::from([192, 0, 2, 2])));
        for n in 0..SIGN_IN_ATTEMPTS_PER_MINUTE {
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
    fn sign_in_clients_are_bounded() {
        let attempts = SignInAttempts::default();
        let now = Instant::now();
        for i in 0..=MAX_SIGN_IN_CLIENTS as u32 {
            attempts.failed(Some(IpAddr::from(i.to_be_bytes())), now + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(attempts.lock().len(), MAX_SIGN_IN_CLIENTS);
        assert!(!attempts.lock().contains_key(&Some(IpAddr::from(0_u32.to_be_bytes()))), "the oldest went");
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let (_, session) = sessions.open(Instant::now()).expect("random");
        assert!(session.csrf_matches(Some(&session.csrf)));
        assert!(!session.csrf_matches(None));
        assert!(!session.csrf_matches(Some("")));
        assert!(!session.csrf_matches(Some(&session.csrf[1..])));
        let mut wrong = session.csrf.clone();
        wrong.push('x');
        assert!(!session.csrf_matches(Some(&wrong)));
    }

    #[test]
    fn cookies_are_read_by_name_and_set_strictly() {
        assert_eq!(cookie_value("a=1; recovea_session=abc; b=2", COOKIE), Some("abc"));
        assert_eq!(cookie_value("xrecovea_session=abc", COOKIE), None);
        assert_eq!(cookie_value("", COOKIE), None);
        let set = set_cookie("abc", false);
        assert!(set.starts_with("recovea_session=abc; HttpOnly; SameSite=Strict; Path=/;"), "{set}");
        assert!(!set.contains("Secure"));
        assert!(set_cookie("abc", true).ends_with("; Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
    }
}
