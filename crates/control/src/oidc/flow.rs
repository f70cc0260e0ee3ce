//! The browser's round trip through the provider, as pure steps: a login attempt's state, nonce
//! and PKCE verifier, the authorization request carrying them, and the checks on the callback.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::digest;
use url::Url;

use crate::random;

/// Random bytes behind each of the state, the nonce and the PKCE verifier: 256 bits, which
/// base64url writes as 43 characters (RFC 7636's shortest verifier).
const SECRET_BYTES: usize = 32;

/// What one login keeps between sending the browser to the provider and its return: the caller
/// holds it (server side) until the callback, and uses it once.
#[derive(Clone, PartialEq, Eq)]
pub struct LoginAttempt {
    /// Sent out and expected back on the callback: ties the callback to this attempt.
    state: String,
    /// Sent out and expected in the ID token: ties the token to this attempt.
    nonce: String,
    /// Kept here; only its SHA-256 goes out. The token endpoint wants it with the code, so a
    /// code caught on the way back is useless to whoever caught it.
    verifier: String,
}

impl fmt::Debug for LoginAttempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginAttempt").field("state", &self.state).finish_non_exhaustive()
    }
}

impl LoginAttempt {
    /// An attempt drawn from the operating system's random generator.
    pub fn generate() -> Result<Self, random::RandomUnavailable> {
        Ok(Self::from_entropy(random::bytes()?))
    }

    /// An attempt made from `entropy`: the state, the nonce and the verifier each from a third.
    pub fn from_entropy(entropy: [u8; 3 * SECRET_BYTES]) -> Self {
        let (state, rest) = entropy.split_at(SECRET_BYTES);
        let (nonce, verifier) = rest.split_at(SECRET_BYTES);
        Self {
            state: URL_SAFE_NO_PAD.encode(state),
            nonce: URL_SAFE_NO_PAD.encode(nonce),
            verifier: URL_SAFE_NO_PAD.encode(verifier),
        }
    }

    pub fn state(&self) -> &str {
        &self.state
    }

    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    pub(crate) fn verifier(&self) -> &str {
        &self.verifier
    }

    /// The browser's way to the provider's `authorization_endpoint`: the authorization code flow
    /// (OpenID Connect Core 1.0, section 3.1.2.1) with PKCE S256 (RFC 7636).
    pub fn authorization_url(
        &self,
        endpoint: &Url,
        client_id: &str,
        redirect_url: &str,
        scopes: &str,
    ) -> String {
        let mut url = endpoint.clone();
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", redirect_url)
            .append_pair("scope", scopes)
            .append_pair("state", &self.state)
            .append_pair("nonce", &self.nonce)
            .append_pair("code_challenge", &pkce_challenge(&self.verifier))
            .append_pair("code_challenge_method", "S256");
        url.into()
    }

    /// The code in `callback` if it answers this attempt: its state is ours, and its issuer,
    /// when the provider names one (RFC 9207), is the one we sent the browser to. A provider
    /// that says it names itself must (`iss_required`), so that a response from another provider
    /// the browser was sent to cannot pass for this one's.
    pub fn code_from<'a>(
        &self,
        callback: &'a Callback,
        issuer: &str,
        iss_required: bool,
    ) -> Result<&'a str, CallbackError> {
        match callback {
            Callback::Denied { state: Some(state), .. } if !same_secret(state, &self.state) => {
                Err(CallbackError::WrongState)
            }
            Callback::Denied { error, .. } => Err(CallbackError::Denied(error.clone())),
            Callback::Code { code, state, iss } => {
                if !same_secret(state, &self.state) {
                    return Err(CallbackError::WrongState);
                }
                match iss {
                    Some(iss) if iss != issuer => Err(CallbackError::WrongIssuer),
                    None if iss_required => Err(CallbackError::WrongIssuer),
                    _ => Ok(code),
                }
            }
        }
    }
}

/// `BASE64URL(SHA256(verifier))` (RFC 7636, section 4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, verifier.as_bytes()))
}

/// Whether two secrets are equal, in a time that tells nothing of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the provider sent the browser back with (RFC 6749, sections 4.1.2 and 4.1.2.1).
#[derive(Debug, PartialEq, Eq)]
pub enum Callback {
    Code {
        code: String,
        state: String,
        iss: Option<String>,
    },
    /// The provider refused: its `error` code (`access_denied` when the person said no).
    Denied {
        error: String,
        state: Option<String>,
    },
}

/// Why a callback is not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum CallbackError {
    /// No `code` and `state`, nor an `error`.
    Malformed,
    /// The provider answered with this error code.
    Denied(String),
    /// Not the state this browser's login sent: another login's callback, or a forged one.
    WrongState,
    WrongIssuer,
}

impl Callback {
    /// The state the callback carries, if any.
    pub fn state(&self) -> Option<&str> {
        match self {
            Callback::Code { state, .. } => Some(state),
            Callback::Denied { state, .. } => state.as_deref(),
        }
    }

    /// Reads the callback's query string.
    pub fn parse(query: &str) -> Result<Self, CallbackError> {
        let (mut code, mut state, mut iss, mut error) = (None, None, None, None);
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match &*name {
                "code" => &mut code,
                "state" => &mut state,
                "iss" => &mut iss,
                "error" => &mut error,
                _ => continue,
            };
            // A parameter given twice is ambiguous (RFC 6749, section 3.1): refused.
            if slot.replace(value.into_owned()).is_some() {
                return Err(CallbackError::Malformed);
            }
        }
        match (error, code, state) {
            (Some(error), _, state) => Ok(Callback::Denied { error: printable(&error), state }),
            (None, Some(code), Some(state)) if !code.is_empty() => Ok(Callback::Code { code, state, iss }),
            _ => Err(CallbackError::Malformed),
        }
    }
}

/// A provider's error code as it may be logged and shown: the characters RFC 6749 allows in one
/// (printable ASCII but `"` and `\`), at most 64 of them.
pub(crate) fn printable(code: &str) -> String {
    code.chars().filter(|c| matches!(*c as u32, 0x20..=0x21 | 0x23..=0x5B | 0x5D..=0x7E)).take(64).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn attempt() -> LoginAttempt {
        let mut entropy = [0u8; 96];
        for (i, byte) in entropy.iter_mut().enumerate() {
            *byte = i as u8;
        }
        LoginAttempt::from_entropy(entropy)
    }

    #[test]
    fn the_pkce_challenge_is_rfc_7636s_example() {
        // RFC 7636, appendix B.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn state_nonce_and_verifier_are_distinct_43_character_secrets() {
        let attempt = LoginAttempt::generate().expect("random");
        for secret in [attempt.state(), attempt.nonce(), attempt.verifier()] {
            assert_eq!(secret.len(), 43);
            assert!(secret.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{secret}");
        }
        assert_ne!(attempt.state(), attempt.nonce());
        assert_ne!(attempt.nonce(), attempt.verifier());
        assert_ne!(attempt, LoginAttempt::generate().expect("random"));
        let debug = format!("{attempt:?}");
        assert!(!debug.contains(attempt.verifier()) && !debug.contains(attempt.nonce()), "{debug}");
    }

    #[test]
    fn the_authorization_url_carries_the_challenge_never_the_verifier() {
        let attempt = attempt();
        let endpoint = Url::parse("https://login.example.com/auth?tenant=a").expect("url");
        let url = attempt.authorization_url(
            &endpoint,
            "recovea",
            "https://recovea.example.com/console/oidc/callback",
            "openid email",
        );
        let parsed = Url::parse(&url).expect("url");
        let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
        let get = |name: &str| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("tenant"), Some("a"), "the endpoint's own query is kept");
        assert_eq!(get("response_type"), Some("code"));
        assert_eq!(get("client_id"), Some("recovea"));
        assert_eq!(get("redirect_uri"), Some("https://recovea.example.com/console/oidc/callback"));
        assert_eq!(get("scope"), Some("openid email"));
        assert_eq!(get("state"), Some(attempt.state()));
        assert_eq!(get("nonce"), Some(attempt.nonce()));
        assert_eq!(get("code_challenge"), Some(pkce_challenge(attempt.verifier()).as_str()));
        assert_eq!(get("code_challenge_method"), Some("S256"));
        assert!(!url.contains(attempt.verifier()));
    }

    #[test]
    fn a_callback_gives_its_code_only_for_its_own_state_and_issuer() {
        let attempt = attempt();
        let issuer = "https://login.example.com";
        let query = format!("code=abc&state={}&iss=https%3A%2F%2Flogin.example.com", attempt.state());
        let callback = Callback::parse(&query).expect("parses");
        assert_eq!(attempt.code_from(&callback, issuer, true), Ok("abc"));

        let other = LoginAttempt::generate().expect("random");
        assert_eq!(other.code_from(&callback, issuer, true), Err(CallbackError::WrongState));
        assert_eq!(
            attempt.code_from(&callback, "https://evil.example.com", false),
            Err(CallbackError::WrongIssuer)
        );

        let silent = Callback::parse(&format!("code=abc&state={}", attempt.state())).expect("parses");
        assert_eq!(attempt.code_from(&silent, issuer, false), Ok("abc"));
        assert_eq!(attempt.code_from(&silent, issuer, true), Err(CallbackError::WrongIssuer));
    }

    #[test]
    fn a_refusal_or_a_broken_callback_gives_no_code() {
        let attempt = attempt();
        let query = format!("error=access_denied&error_description=no&state={}", attempt.state());
        let denied = Callback::parse(&query).expect("parses");
        assert_eq!(
            denied,
            Callback::Denied { error: "access_denied".into(), state: Some(attempt.state().into()) }
        );
        assert_eq!(
            attempt.code_from(&denied, "i", false),
            Err(CallbackError::Denied("access_denied".into()))
        );
        let forged = Callback::parse("error=access_denied&state=another").expect("parses");
        assert_eq!(attempt.code_from(&forged, "i", false), Err(CallbackError::WrongState));
        for broken in
            ["", "code=abc", "state=s", "code=&state=s", "code=a&code=b&state=s", "code=a&state=s&state=t"]
        {
            assert_eq!(Callback::parse(broken), Err(CallbackError::Malformed), "{broken}");
        }
        let hostile = Callback::parse("error=%22%3Cscript%3E%0A").expect("parses");
        assert_eq!(hostile, Callback::Denied { error: "<script>".into(), state: None });
    }

    proptest! {
        #[test]
        fn attempts_from_different_entropy_share_no_secret(a in any::<[u8; 32]>(), b in any::<[u8; 32]>()) {
            prop_assume!(a != b);
            let mut first = [0u8; 96];
            first[..32].copy_from_slice(&a);
            let mut second = first;
            second[..32].copy_from_slice(&b);
            prop_assert_ne!(LoginAttempt::from_entropy(first).state, LoginAttempt::from_entropy(second).state);
        }

        #[test]
        fn only_the_exact_state_is_the_same_secret(a in "[A-Za-z0-9_-]{0,50}", b in "[A-Za-z0-9_-]{0,50}") {
            prop_assert_eq!(same_secret(&a, &b), a == b);
        }

        #[test]
        fn parsing_any_query_never_panics(query in ".{0,200}") {
            let _ = Callback::parse(&query);
        }
    }
}
