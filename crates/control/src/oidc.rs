//! Single sign-on: an OpenID Connect relying party (authorization code flow with PKCE S256, state
//! and nonce) that signs people in through one provider and maps their claims to an access
//! decision: the operator, an organization's admin or viewer, or no one.
//!
//! The console calls [`SignOn`]: [`SignOn::login`] to send a browser to the provider, and
//! [`SignOn::callback`] when it comes back. The pure parts (the claims' mapping in [`access`], the
//! login's secrets and callback checks in [`flow`], ID token verification in [`jwt`]) take their
//! inputs, keys and clock as arguments; [`provider`] does the I/O.

pub mod access;
pub mod config;
pub mod flow;
pub mod jwt;
mod pending;
pub mod provider;

use std::fmt;
use std::time::{Instant, SystemTime};

use serde_json::{Map, Value};

pub use access::{Access, AccessRules, Refusal, Role};
pub use config::{OidcConfig, OidcSettings};
pub use flow::{Callback, CallbackError, LoginAttempt};
pub use jwt::TokenError;
pub use pending::LOGIN_TTL;
pub use provider::RelyingParty;

use pending::PendingLogins;

/// Where the provider sends the browser back: the path of `--oidc-redirect-url`, which the
/// console serves.
pub const CALLBACK_PATH: &str = "/console/oidc/callback";
/// The cookie that ties a browser to the login it started: it holds the login's state, which the
/// callback must carry too.
pub const LOGIN_COOKIE: &str = "recovea_oidc";

/// A person the provider vouches for: its subject (`sub`), email when the provider does not say
/// it is unverified, and every claim of the ID token.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedPerson {
    pub subject: String,
    pub email: Option<String>,
    pub claims: Map<String, Value>,
}

/// Why a sign-in failed. `Display` is for the log (it holds no secret: no client secret, code,
/// token or verifier); [`SignInError::for_person`] is what the browser may be shown.
#[derive(Debug)]
pub enum SignInError {
    /// The provider could not be reached or answered something unusable (its documents, its keys,
    /// its token endpoint): the operator's to fix.
    Provider(String),
    /// The token endpoint refused the code, with this error code (`invalid_grant`: used, expired,
    /// or issued to another client or login).
    CodeRefused(String),
    Callback(CallbackError),
    /// No login of this browser is waiting: none was started here, it expired or was finished, or
    /// the callback belongs to another browser.
    NoLoginWaiting,
    IdToken(TokenError),
    RandomUnavailable,
}

impl fmt::Display for SignInError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignInError::Provider(why) => write!(f, "the sign-on provider: {why}"),
            SignInError::CodeRefused(error) => {
                write!(f, "the provider's token endpoint refused the code ({error})")
            }
            SignInError::Callback(CallbackError::Malformed) => {
                f.write_str("the callback carries no code and state")
            }
            SignInError::Callback(CallbackError::Denied(error)) => {
                write!(f, "the provider refused the sign-in ({error})")
            }
            SignInError::Callback(CallbackError::WrongState) => {
                f.write_str("the callback's state is not this login's")
            }
            SignInError::Callback(CallbackError::WrongIssuer) => {
                f.write_str("the callback does not come from the configured issuer")
            }
            SignInError::NoLoginWaiting => f.write_str("no login of this browser is waiting"),
            SignInError::IdToken(why) => why.fmt(f),
            SignInError::RandomUnavailable => f.write_str("the operating system's random generator failed"),
        }
    }
}

impl std::error::Error for SignInError {}

impl SignInError {
    /// What the person signing in is told: enough to try again or ask the operator, nothing of
    /// the provider's set-up.
    pub fn for_person(&self) -> &'static str {
        match self {
            SignInError::Provider(_) | SignInError::RandomUnavailable => {
                "Single sign-on is unavailable right now. Try again later, or ask your operator."
            }
            SignInError::Callback(CallbackError::Denied(_)) => {
                "The sign-in was cancelled or refused by the provider."
            }
            SignInError::NoLoginWaiting | SignInError::CodeRefused(_) | SignInError::Callback(_) => {
                "This sign-in has expired or was started elsewhere. Please sign in again."
            }
            SignInError::IdToken(_) => "The provider's answer could not be verified. Please sign in again.",
        }
    }
}

/// Where to send the browser, and the login cookie to set with it.
#[derive(Debug)]
pub struct LoginRedirect {
    /// The provider's authorization URL: the `Location` of a `302`.
    pub location: String,
    /// The cookie's value (the login's state), for [`SignOn::callback`].
    pub binding: String,
    /// The whole `Set-Cookie` value: `HttpOnly`, `SameSite=Lax` (the provider's redirect back is
    /// a navigation from another site, which `Strict` would strip), scoped to the callback's
    /// folder, for [`LOGIN_TTL`], `Secure` when the console is reached over https.
    pub set_cookie: String,
}

/// The outcome of a callback: who signed in, and what they may do.
#[derive(Clone, Debug, PartialEq)]
pub struct SignedIn {
    pub person: VerifiedPerson,
    pub access: Access,
}

/// Sign-on as the console uses it: the relying party, the logins on their way, the claims' rules.
/// Logins wait in this process's memory, as console sessions do: behind several control plane
/// replicas, the callback must reach the replica that sent the browser away (sticky sessions).
pub struct SignOn {
    party: RelyingParty,
    pending: PendingLogins,
}

impl SignOn {
    pub fn new(config: OidcConfig) -> Self {
        Self::with_party(RelyingParty::new(config))
    }

    pub fn with_party(party: RelyingParty) -> Self {
        Self { party, pending: PendingLogins::default() }
    }

    pub fn party(&self) -> &RelyingParty {
        &self.party
    }

    /// Starts a login: the browser goes to [`LoginRedirect::location`] with
    /// [`LoginRedirect::set_cookie`] set. The attempt (state, nonce, PKCE verifier) stays here.
    pub async fn login(&self) -> Result<LoginRedirect, SignInError> {
        let (location, attempt) = self.party.begin().await?;
        let binding = attempt.state().to_owned();
        let set_cookie = format!(
            "{LOGIN_COOKIE}={binding}; HttpOnly; SameSite=Lax; Path={}; Max-Age={}{}",
            login_cookie_path(),
            LOGIN_TTL.as_secs(),
            self.secure_attribute()
        );
        self.pending.insert(attempt, Instant::now());
        Ok(LoginRedirect { location, binding, set_cookie })
    }

    /// Finishes the login that `binding` (the [`LOGIN_COOKIE`] the browser sent, if any) started,
    /// with the callback's query string, verifying the ID token at `now`. A callback that carries
    /// this browser's state uses the login up, whatever the outcome: a second one finds
    /// [`SignInError::NoLoginWaiting`]. One that does not (another browser's, or a link from
    /// another site, which the `Lax` cookie goes with) is refused and leaves the login waiting. An
    /// [`Access::Org`] names an organization the caller must still find in the store.
    pub async fn callback(
        &self,
        callback_query: &str,
        binding: Option<&str>,
        now: SystemTime,
    ) -> Result<SignedIn, SignInError> {
        let binding = binding.ok_or(SignInError::NoLoginWaiting)?;
        let callback = Callback::parse(callback_query).map_err(SignInError::Callback)?;
        if !callback.state().is_some_and(|state| flow::same_secret(state, binding)) {
            return Err(SignInError::Callback(CallbackError::WrongState));
        }
        let attempt = self.pending.take(binding, Instant::now()).ok_or(SignInError::NoLoginWaiting)?;
        let person = self.party.finish(&attempt, callback_query, now).await?;
        let access = access::decide(&person.claims, &self.party.config().access);
        Ok(SignedIn { person, access })
    }

    /// The `Set-Cookie` value that makes the browser forget its login cookie, for the callback's
    /// answer.
    pub fn clear_login_cookie(&self) -> String {
        format!(
            "{LOGIN_COOKIE}=; HttpOnly; SameSite=Lax; Path={}; Max-Age=0{}",
            login_cookie_path(),
            self.secure_attribute()
        )
    }

    fn secure_attribute(&self) -> &'static str {
        if self.party.config().console_over_tls() { "; Secure" } else { "" }
    }
}

/// The folder of [`CALLBACK_PATH`]: the login cookie goes nowhere else.
fn login_cookie_path() -> &'static str {
    CALLBACK_PATH.rsplit_once('/').map_or("/", |(folder, _)| folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign_on(redirect_url: &str) -> SignOn {
        let config = OidcConfig::new(OidcSettings {
            issuer: "http://127.0.0.1:9".into(),
            client_id: "recovea".into(),
            client_secret: "s3cret".into(),
            redirect_url: redirect_url.into(),
            scopes: config::DEFAULT_SCOPES.into(),
            org_claim: Some("org".into()),
            role_claim: None,
            groups_claim: config::DEFAULT_GROUPS_CLAIM.into(),
            operator_group: None,
            ca_pem: None,
        })
        .expect("valid");
        SignOn::new(config)
    }

    #[test]
    fn the_login_cookie_lives_in_the_callbacks_folder_and_is_secure_over_https() {
        assert_eq!(login_cookie_path(), "/console/oidc");
        let plain = sign_on("http://127.0.0.1:8081/console/oidc/callback");
        assert_eq!(
            plain.clear_login_cookie(),
            "recovea_oidc=; HttpOnly; SameSite=Lax; Path=/console/oidc; Max-Age=0"
        );
        let tls = sign_on("https://recovea.example.com/console/oidc/callback");
        assert!(tls.clear_login_cookie().ends_with("; Secure"));
    }

    #[tokio::test]
    async fn a_callback_without_a_waiting_login_is_refused_before_any_call() {
        let sign_on = sign_on("http://127.0.0.1:8081/console/oidc/callback");
        let now = SystemTime::now();
        for binding in [None, Some("never-issued")] {
            let refused = sign_on.callback("code=c&state=never-issued", binding, now).await;
            assert!(matches!(refused, Err(SignInError::NoLoginWaiting)), "{refused:?}");
        }
        let refused = sign_on.callback("code=c&state=another", Some("never-issued"), now).await;
        assert!(matches!(refused, Err(SignInError::Callback(CallbackError::WrongState))), "{refused:?}");
    }

    #[test]
    fn what_a_person_is_told_holds_nothing_of_the_set_up() {
        let errors = [
            SignInError::Provider("its token endpoint could not be reached: 10.0.0.5:443".into()),
            SignInError::CodeRefused("invalid_client".into()),
            SignInError::IdToken(TokenError::WrongAudience),
        ];
        for error in errors {
            let told = error.for_person();
            assert!(!told.contains("10.0.0.5") && !told.contains("invalid_client"), "{told}");
        }
    }
}
