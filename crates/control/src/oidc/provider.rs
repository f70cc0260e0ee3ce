//! The relying party's calls to the provider: its discovery document and signing keys, fetched and
//! kept for a while, and its token endpoint, where a code becomes an ID token. The I/O of sign-on
//! is here; every decision it carries out is a pure function of the modules beside it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use recovea_upstream::{Upstream, UpstreamError};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::Mutex;
use url::Url;

use super::config::{OidcConfig, secure_url};
use super::flow::{Callback, LoginAttempt, printable};
use super::jwt::{self, Expected, KeySet, TokenError};
use super::{SignInError, VerifiedPerson};

/// The discovery document and the keys are asked for again after this long: a provider's
/// endpoints rarely move, and a key it withdraws stops being trusted within the hour.
const DOCUMENT_MAX_AGE: Duration = Duration::from_secs(60 * 60);
/// The least time between two fetches of the keys outside their schedule: a token naming a key we
/// do not know makes us look once (the provider may have rotated), and a stream of tokens naming
/// forged keys makes us look no more often than this. Failed fetches of either document count too,
/// so that a provider in trouble is not asked at every sign-in while what we hold still serves.
const MIN_REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// Connecting to the provider, and then its whole answer, each take at most this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// A discovery document, a key set or a token answer is a few KiB.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// The OpenID Connect relying party: one provider, one client.
pub struct RelyingParty {
    config: OidcConfig,
    http: Upstream,
    discovery: Mutex<Cached<Arc<Discovery>>>,
    keys: Mutex<Cached<Arc<KeySet>>>,
    /// [`MIN_REFETCH_INTERVAL`] unless [`RelyingParty::with_refetch_interval`] says otherwise.
    refetch_interval: Duration,
}

/// A document as last fetched, and when it was fetched and last asked for. Behind an async lock:
/// sign-ins that find it stale wait for the one fetch rather than each making their own.
struct Cached<T> {
    value: Option<T>,
    fetched_at: Option<Instant>,
    asked_at: Option<Instant>,
}

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Self { value: None, fetched_at: None, asked_at: None }
    }
}

impl<T: Clone> Cached<T> {
    /// The value, if fetched less than `max_age` ago.
    fn fresh(&self, now: Instant, max_age: Duration) -> Option<T> {
        let fetched_at = self.fetched_at?;
        (now.saturating_duration_since(fetched_at) < max_age).then(|| self.value.clone()).flatten()
    }

    /// Whether the provider may be asked again now: never asked, or not within `interval`.
    fn may_ask(&self, now: Instant, interval: Duration) -> bool {
        self.asked_at.is_none_or(|asked| now.saturating_duration_since(asked) >= interval)
    }

    /// What serves without asking the provider: the value while fresh, or a stale one while the
    /// provider was asked within `interval`.
    fn without_asking(&self, now: Instant, interval: Duration) -> Option<T> {
        self.fresh(now, DOCUMENT_MAX_AGE)
            .or_else(|| self.value.clone().filter(|_| !self.may_ask(now, interval)))
    }

    fn record(&mut self, value: T, now: Instant) {
        self.value = Some(value);
        self.fetched_at = Some(now);
    }

    /// What was just `fetched`, or when that failed, the value held: a provider down for a while
    /// signs people in with what it last said.
    fn or_held(&self, fetched: Result<T, SignInError>, what: &str) -> Result<T, SignInError> {
        match (fetched, &self.value) {
            (Ok(value), _) => Ok(value),
            (Err(e), Some(held)) => {
                tracing::warn!(error = %e, what, "single sign-on: the provider could not be asked again; what it said last still serves");
                Ok(held.clone())
            }
            (Err(e), None) => Err(e),
        }
    }
}

/// What we use of the provider's discovery document (OpenID Connect Discovery 1.0, section 3).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Discovery {
    pub(crate) authorization_endpoint: Url,
    pub(crate) token_endpoint: Url,
    pub(crate) jwks_uri: Url,
    pub(crate) client_auth: ClientAuth,
    /// The provider names itself in its authorization responses (RFC 9207): a response without
    /// its name is then refused.
    pub(crate) iss_parameter: bool,
}

/// How the client secret goes to the token endpoint (RFC 6749, section 2.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    /// `Authorization: Basic`: the default, and what every provider must take.
    Basic,
    /// In the form, for a provider whose document lists only that.
    Post,
}

#[derive(Deserialize)]
struct DiscoveryText {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
    code_challenge_methods_supported: Option<Vec<String>>,
    response_types_supported: Option<Vec<String>>,
    #[serde(default)]
    authorization_response_iss_parameter_supported: bool,
}

impl Discovery {
    /// Reads `json`, the document of the provider we know as `issuer`. Refused: a document naming
    /// another issuer (section 4.3), an endpoint in clear to another machine, a provider without
    /// the code flow, PKCE S256 or a client secret we can present.
    pub(crate) fn read(json: &[u8], issuer: &str) -> Result<Self, String> {
        let text: DiscoveryText = serde_json::from_slice(json)
            .map_err(|e| format!("the discovery document does not parse: {e}"))?;
        if text.issuer != issuer {
            return Err(format!(
                "the discovery document names the issuer {:?}, not {issuer:?} (--oidc-issuer must match it exactly)",
                printable(&text.issuer)
            ));
        }
        let endpoint = |name: &str, url: &str| secure_url(url).map_err(|why| format!("its {name}: {why}"));
        let lists = |list: &Option<Vec<String>>, item: &str| {
            list.as_ref().is_none_or(|l| l.iter().any(|i| i == item))
        };
        if !lists(&text.response_types_supported, "code") {
            return Err("the provider does not offer the authorization code flow".into());
        }
        if !lists(&text.code_challenge_methods_supported, "S256") {
            return Err("the provider does not take PKCE with S256".into());
        }
        // Absent, the list is `client_secret_basic` alone (section 3).
        let client_auth = match &text.token_endpoint_auth_methods_supported {
            None => ClientAuth::Basic,
            Some(methods) if methods.iter().any(|m| m == "client_secret_basic") => ClientAuth::Basic,
            Some(methods) if methods.iter().any(|m| m == "client_secret_post") => ClientAuth::Post,
            Some(_) => {
                return Err(
                    "the provider's token endpoint takes neither client_secret_basic nor client_secret_post"
                        .into(),
                );
            }
        };
        Ok(Self {
            authorization_endpoint: endpoint("authorization_endpoint", &text.authorization_endpoint)?,
            token_endpoint: endpoint("token_endpoint", &text.token_endpoint)?,
            jwks_uri: endpoint("jwks_uri", &text.jwks_uri)?,
            client_auth,
            iss_parameter: text.authorization_response_iss_parameter_supported,
        })
    }
}

impl RelyingParty {
    pub fn new(config: OidcConfig) -> Self {
        let http = Upstream::new(CONNECT_TIMEOUT, 0, &config.network);
        Self {
            config,
            http,
            discovery: Mutex::default(),
            keys: Mutex::default(),
            refetch_interval: MIN_REFETCH_INTERVAL,
        }
    }

    /// Asks the provider outside the schedule at most once per `interval` (tests shorten it to
    /// watch a refetch happen).
    pub fn with_refetch_interval(mut self, interval: Duration) -> Self {
        self.refetch_interval = interval;
        self
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// Fetches the discovery document and the keys now, so that a provider set up wrong shows in
    /// the log at start rather than at the first sign-in.
    pub async fn warm_up(&self) -> Result<usize, SignInError> {
        self.discovery().await?;
        Ok(self.keys().await?.len())
    }

    /// A new login: where to send the browser, and the attempt to keep until it comes back.
    pub async fn begin(&self) -> Result<(String, LoginAttempt), SignInError> {
        let discovery = self.discovery().await?;
        let attempt = LoginAttempt::generate().map_err(|_| SignInError::RandomUnavailable)?;
        let location = attempt.authorization_url(
            &discovery.authorization_endpoint,
            &self.config.client_id,
            &self.config.redirect_url,
            &self.config.scopes,
        );
        Ok((location, attempt))
    }

    /// The person `attempt`'s callback (its query string) signs in, verified at `now`.
    pub async fn finish(
        &self,
        attempt: &LoginAttempt,
        callback_query: &str,
        now: SystemTime,
    ) -> Result<VerifiedPerson, SignInError> {
        let discovery = self.discovery().await?;
        let callback = Callback::parse(callback_query).map_err(SignInError::Callback)?;
        let code = attempt
            .code_from(&callback, &self.config.issuer, discovery.iss_parameter)
            .map_err(SignInError::Callback)?;
        let id_token = self.exchange_code(code, attempt).await?;
        self.verify_id_token(&id_token, attempt.nonce(), now).await
    }

    /// Trades `code` for the ID token at the token endpoint, with `attempt`'s PKCE verifier and
    /// the client secret.
    pub async fn exchange_code(&self, code: &str, attempt: &LoginAttempt) -> Result<String, SignInError> {
        let discovery = self.discovery().await?;
        // The form is finished before any await: its serializer is not `Send`, and the console
        // calls this from a connection's task.
        let form = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "authorization_code")
                .append_pair("code", code)
                .append_pair("redirect_uri", &self.config.redirect_url)
                .append_pair("code_verifier", attempt.verifier());
            if let ClientAuth::Post = discovery.client_auth {
                form.append_pair("client_id", &self.config.client_id)
                    .append_pair("client_secret", self.config.client_secret.expose());
            }
            form.finish()
        };
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(discovery.token_endpoint.as_str())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json");
        match discovery.client_auth {
            ClientAuth::Basic => request = request.header(header::AUTHORIZATION, self.basic_authorization()?),
            ClientAuth::Post => {}
        }
        let request = request
            .body(Bytes::from(form))
            .map_err(|_| SignInError::Provider("its token endpoint is not a URL we can call".into()))?;
        let (status, body) = self.call(request, "token endpoint").await?;
        #[derive(Deserialize)]
        struct Tokens {
            id_token: String,
        }
        #[derive(Deserialize)]
        struct Refusal {
            error: String,
        }
        match status {
            StatusCode::OK => serde_json::from_slice::<Tokens>(&body)
                .map(|tokens| tokens.id_token)
                .map_err(|_| SignInError::Provider("its token endpoint answered no ID token".into())),
            _ => Err(match serde_json::from_slice::<Refusal>(&body) {
                Ok(refusal) => SignInError::CodeRefused(printable(&refusal.error)),
                Err(_) => SignInError::Provider(format!("its token endpoint answered {status}")),
            }),
        }
    }

    /// `id_token` checked against the provider's keys (fetched again once, within
    /// [`MIN_REFETCH_INTERVAL`], when it names a key we do not hold), this client, `nonce` and `now`.
    pub async fn verify_id_token(
        &self,
        id_token: &str,
        nonce: &str,
        now: SystemTime,
    ) -> Result<VerifiedPerson, SignInError> {
        let expected = Expected { issuer: &self.config.issuer, client_id: &self.config.client_id, nonce };
        let keys = self.keys().await?;
        let claims = match jwt::verify(id_token, &keys, &expected, now) {
            Err(TokenError::UnknownKey { .. }) => match self.keys_again(&keys).await {
                Some(renewed) => jwt::verify(id_token, &renewed, &expected, now),
                None => jwt::verify(id_token, &keys, &expected, now),
            },
            verified => verified,
        }
        .map_err(SignInError::IdToken)?;
        Ok(VerifiedPerson::from_claims(claims))
    }

    /// `Authorization: Basic` with the client id and secret, each form-encoded first (RFC 6749,
    /// section 2.3.1); marked sensitive, so that no header dump shows it.
    fn basic_authorization(&self) -> Result<HeaderValue, SignInError> {
        let encode = |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
        let pair =
            format!("{}:{}", encode(&self.config.client_id), encode(self.config.client_secret.expose()));
        let mut value = HeaderValue::try_from(format!("Basic {}", STANDARD.encode(pair)))
            .map_err(|_| SignInError::Provider("the client credentials do not fit a header".into()))?;
        value.set_sensitive(true);
        Ok(value)
    }

    async fn discovery(&self) -> Result<Arc<Discovery>, SignInError> {
        let mut cached = self.discovery.lock().await;
        let now = Instant::now();
        if let Some(discovery) = cached.without_asking(now, self.refetch_interval) {
            return Ok(discovery);
        }
        cached.asked_at = Some(now);
        let fetched = async {
            let url = Url::parse(&self.config.discovery_url())
                .map_err(|_| SignInError::Provider("--oidc-issuer gives no discovery URL".into()))?;
            let body = self.get(&url, "discovery document").await?;
            Discovery::read(&body, &self.config.issuer).map(Arc::new).map_err(SignInError::Provider)
        };
        let fetched = fetched.await;
        if let Ok(discovery) = &fetched {
            cached.record(Arc::clone(discovery), now);
        }
        cached.or_held(fetched, "discovery document")
    }

    async fn keys(&self) -> Result<Arc<KeySet>, SignInError> {
        let mut cached = self.keys.lock().await;
        let now = Instant::now();
        if let Some(keys) = cached.without_asking(now, self.refetch_interval) {
            return Ok(keys);
        }
        let fetched = self.fetch_keys(&mut cached, now).await;
        cached.or_held(fetched, "keys")
    }

    /// The keys fetched again after `seen` lacked a token's key: those another sign-in fetched
    /// meanwhile, else a new fetch if one is allowed now, else nothing.
    async fn keys_again(&self, seen: &Arc<KeySet>) -> Option<Arc<KeySet>> {
        let mut cached = self.keys.lock().await;
        if let Some(current) = cached.value.as_ref().filter(|current| !Arc::ptr_eq(current, seen)) {
            return Some(Arc::clone(current));
        }
        let now = Instant::now();
        if !cached.may_ask(now, self.refetch_interval) {
            return None;
        }
        match self.fetch_keys(&mut cached, now).await {
            Ok(keys) => Some(keys),
            Err(e) => {
                tracing::warn!(error = %e, "single sign-on: the provider's keys could not be fetched again");
                None
            }
        }
    }

    async fn fetch_keys(
        &self,
        cached: &mut Cached<Arc<KeySet>>,
        now: Instant,
    ) -> Result<Arc<KeySet>, SignInError> {
        cached.asked_at = Some(now);
        let discovery = self.discovery().await?;
        let body = self.get(&discovery.jwks_uri, "keys").await?;
        let keys = KeySet::parse(&body).map_err(|why| SignInError::Provider(format!("its keys: {why}")))?;
        if keys.is_empty() {
            return Err(SignInError::Provider("its key set holds no signing key we can verify".into()));
        }
        let keys = Arc::new(keys);
        cached.record(Arc::clone(&keys), now);
        Ok(keys)
    }

    /// A document the provider must answer `200` with.
    async fn get(&self, url: &Url, what: &str) -> Result<Bytes, SignInError> {
        let request = Request::get(url.as_str())
            .header(header::ACCEPT, "application/json")
            .body(Bytes::new())
            .map_err(|_| SignInError::Provider(format!("its {what} is not a URL we can call")))?;
        match self.call(request, what).await? {
            (StatusCode::OK, body) => Ok(body),
            (status, _) => Err(SignInError::Provider(format!("its {what} answered {status}"))),
        }
    }

    /// One exchange with the provider, its whole answer within [`ANSWER_TIMEOUT`]. Errors name
    /// what was asked for, never a header or a body we sent.
    async fn call(&self, request: Request<Bytes>, what: &str) -> Result<(StatusCode, Bytes), SignInError> {
        let answer = self.http.send(request, ANSWER_TIMEOUT).await.map_err(|e| {
            SignInError::Provider(match e {
                UpstreamError::Unreachable(e) => format!("its {what} could not be reached: {e}"),
                UpstreamError::Timeout => format!("its {what} did not answer in time"),
            })
        })?;
        let status = answer.status();
        let body = tokio::time::timeout(
            ANSWER_TIMEOUT,
            Limited::new(answer.into_body(), MAX_DOCUMENT_BYTES).collect(),
        )
        .await
        .map_err(|_| SignInError::Provider(format!("its {what} did not answer in time")))?
        .map_err(|_| SignInError::Provider(format!("its {what}'s answer broke off or is too large")))?
        .to_bytes();
        Ok((status, body))
    }
}

impl VerifiedPerson {
    /// The person a verified token's claims describe. An email the provider says it has not
    /// verified is left out: anyone could have typed it.
    fn from_claims(claims: Map<String, Value>) -> Self {
        let subject = claims.get("sub").and_then(Value::as_str).unwrap_or_default().to_owned();
        let verified = claims.get("email_verified").and_then(Value::as_bool) != Some(false);
        let email = claims.get("email").and_then(Value::as_str).filter(|_| verified).map(str::to_owned);
        Self { subject, email, claims }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://login.example.com";

    fn document(change: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut document = json!({
            "issuer": ISSUER,
            "authorization_endpoint": "https://login.example.com/auth",
            "token_endpoint": "https://login.example.com/token",
            "jwks_uri": "https://login.example.com/jwks",
            "response_types_supported": ["code", "id_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["private_key_jwt", "client_secret_basic"],
            "authorization_response_iss_parameter_supported": true
        });
        change(&mut document);
        document.to_string().into_bytes()
    }

    #[test]
    fn a_providers_document_gives_its_endpoints_and_ways() {
        let discovery = Discovery::read(&document(|_| {}), ISSUER).expect("valid");
        assert_eq!(discovery.token_endpoint.as_str(), "https://login.example.com/token");
        assert_eq!(discovery.client_auth, ClientAuth::Basic);
        assert!(discovery.iss_parameter);
        let minimal = document(|d| {
            for optional in [
                "response_types_supported",
                "code_challenge_methods_supported",
                "token_endpoint_auth_methods_supported",
                "authorization_response_iss_parameter_supported",
            ] {
                d.as_object_mut().map(|o| o.remove(optional));
            }
        });
        let discovery = Discovery::read(&minimal, ISSUER).expect("valid");
        assert_eq!(discovery.client_auth, ClientAuth::Basic, "the default method");
        assert!(!discovery.iss_parameter);
        let post_only =
            document(|d| d["token_endpoint_auth_methods_supported"] = json!(["client_secret_post"]));
        assert_eq!(Discovery::read(&post_only, ISSUER).expect("valid").client_auth, ClientAuth::Post);
    }

    #[test]
    fn a_document_we_cannot_use_is_refused_with_the_reason() {
        let refused =
            |change: fn(&mut Value)| Discovery::read(&document(change), ISSUER).expect_err("refused");
        assert!(
            refused(|d| d["issuer"] = json!("https://login.example.com/")).contains("must match it exactly")
        );
        assert!(
            refused(|d| d["token_endpoint"] = json!("http://login.example.com/token"))
                .contains("token_endpoint")
        );
        assert!(refused(|d| d["code_challenge_methods_supported"] = json!(["plain"])).contains("S256"));
        assert!(refused(|d| d["response_types_supported"] = json!(["id_token"])).contains("code flow"));
        assert!(
            refused(|d| d["token_endpoint_auth_methods_supported"] = json!(["private_key_jwt"]))
                .contains("client_secret_basic")
        );
        assert!(refused(|d| d["jwks_uri"] = json!(null)).contains("does not parse"));
    }

    #[test]
    fn a_document_is_kept_for_its_age_and_asked_for_at_most_once_an_interval() {
        let start = Instant::now();
        let mut cached: Cached<u32> = Cached::default();
        assert_eq!(cached.fresh(start, DOCUMENT_MAX_AGE), None);
        assert!(cached.may_ask(start, MIN_REFETCH_INTERVAL));
        cached.asked_at = Some(start);
        cached.record(1, start);
        assert_eq!(
            cached.fresh(start + DOCUMENT_MAX_AGE - Duration::from_secs(1), DOCUMENT_MAX_AGE),
            Some(1)
        );
        assert_eq!(cached.fresh(start + DOCUMENT_MAX_AGE, DOCUMENT_MAX_AGE), None);
        assert!(
            !cached.may_ask(start + MIN_REFETCH_INTERVAL - Duration::from_millis(1), MIN_REFETCH_INTERVAL)
        );
        assert!(cached.may_ask(start + MIN_REFETCH_INTERVAL, MIN_REFETCH_INTERVAL));
        // Stale, it still serves without asking while the provider was asked within the interval.
        let stale = start + DOCUMENT_MAX_AGE;
        cached.asked_at = Some(stale);
        assert_eq!(cached.without_asking(stale + Duration::from_secs(1), MIN_REFETCH_INTERVAL), Some(1));
        assert_eq!(cached.without_asking(stale + MIN_REFETCH_INTERVAL, MIN_REFETCH_INTERVAL), None);
        let failed = cached.or_held(Err(SignInError::Provider("down".into())), "keys");
        assert_eq!(failed.ok(), Some(1), "what the provider said last still serves");
        let empty: Cached<u32> = Cached::default();
        assert!(empty.or_held(Err(SignInError::Provider("down".into())), "keys").is_err());
    }

    #[test]
    fn an_email_the_provider_has_not_verified_is_left_out() {
        let person = |claims: Value| match claims {
            Value::Object(map) => VerifiedPerson::from_claims(map),
            _ => panic!("an object"),
        };
        let verified = person(json!({"sub": "s", "email": "a@example.com", "email_verified": true}));
        assert_eq!((verified.subject.as_str(), verified.email.as_deref()), ("s", Some("a@example.com")));
        assert_eq!(
            person(json!({"sub": "s", "email": "a@example.com"})).email.as_deref(),
            Some("a@example.com")
        );
        assert_eq!(
            person(json!({"sub": "s", "email": "a@example.com", "email_verified": false})).email,
            None
        );
    }
}
