//! Console sessions: a random id in an `HttpOnly; SameSite=Strict` cookie, mapped in memory to its
//! expiry, its CSRF token and who signed in (the [`Principal`] every page calls the API as).
//!
//! The token itself never leaves the sign-in form: the cookie holds a random id that means
//! nothing outside this process, so a restart signs everyone out, and signing out forgets the id
//! at once (an HMAC-signed cookie could not be withdrawn before it expires).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::principal::Principal;
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
    /// Who signed in: the operator, an organization token, or a person through single sign-on.
    pub(crate) principal: Principal,
    expires: Instant,
}

#[derive(Default)]
pub(crate) struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Opens a session for `principal`; returns its id (for the cookie) and the session (its CSRF
    /// token, for the forms).
    pub(crate) fn open(
        &self,
        now: Instant,
        principal: Principal,
    ) -> Result<(String, Session), random::RandomUnavailable> {
        let id = random::token("", ID_LEN)?;
        let session = Session { csrf: random::token("", ID_LEN)?, principal, expires: now + LIFETIME };
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
        let (id, session) = sessions.open(now, Principal::Operator).expect("random");
        assert_eq!(id.len(), ID_LEN);
        assert_ne!(id, session.csrf, "the id and the CSRF token are drawn separately");
        assert_eq!(sessions.get(&id, now).map(|s| s.csrf), Some(session.csrf.clone()));
        assert!(sessions.get(&id, now + LIFETIME).is_none(), "expired at its lifetime");
        assert!(sessions.get(&id, now).is_none(), "an expired session is forgotten");
        let (id, _) = sessions.open(now, Principal::Operator).expect("random");
        sessions.close(&id);
        assert!(sessions.get(&id, now).is_none());
        assert!(sessions.get("not-a-session", now).is_none());
    }

    #[test]
    fn a_session_keeps_who_opened_it() {
        let sessions = Sessions::default();
        let now = Instant::now();
        let person = Principal::Person {
            subject: "s1".into(),
            email: None,
            reach: crate::principal::Reach::Everything,
        };
        let (id, _) = sessions.open(now, person.clone()).expect("random");
        assert_eq!(sessions.get(&id, now).map(|s| s.principal), Some(person));
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let (first, _) = sessions.open(start, Principal::Operator).expect("random");
        for i in 1..=MAX_SESSIONS as u64 {
            sessions.open(start + Duration::from_millis(i), Principal::Operator).expect("random");
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(sessions.get(&first, start).is_none(), "the session closest to its end went first");
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let (_, session) = sessions.open(Instant::now(), Principal::Operator).expect("random");
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
