//! Single sign-on against a real OpenID Connect provider: npm's `oidc-provider` (tests/oidc,
//! installed by scripts/install-oidc-provider), started on a loopback port for each test. A
//! cookie-keeping client plays the browser through the provider's login and consent pages; the
//! relying party does the rest over real HTTP. Without Node.js and npm these tests fail, never skip.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use recovea_control::oidc::{
    Access, Callback, CallbackError, OidcConfig, OidcSettings, Refusal, RelyingParty, Role, SignInError,
    SignOn, TokenError,
};
use recovea_upstream::{ProviderNetwork, Upstream};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use serde_json::{Value, json};
use url::Url;

/// Where the provider sends the browser back; nothing listens there: the browser stops at it.
const REDIRECT_URL: &str = "http://127.0.0.1:9/console/oidc/callback";
/// How long a whole sign-in may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The provider of tests/oidc/provider.mjs, stopped when dropped (and by itself when this process
/// ends: it exits when its standard input closes).
struct TestProvider {
    child: Child,
    issuer: String,
}

impl TestProvider {
    fn start() -> Self {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let script = repo_root().join("scripts/install-oidc-provider");
            let status = Command::new(&script).status().expect("scripts/install-oidc-provider runs");
            assert!(
                status.success(),
                "scripts/install-oidc-provider failed: the sign-on tests need node and npm"
            );
        });
        let mut child = Command::new("node")
            .arg(repo_root().join("tests/oidc/provider.mjs"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node starts (Node.js 20 or later is needed)");
        let errors = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let kept = Arc::clone(&errors);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(issuer) = line.strip_prefix("issuer ") {
                    let _ = tx.send(issuer.to_owned());
                }
            }
        });
        let issuer = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the OpenID Connect provider did not start: {}",
                errors.lock().unwrap_or_else(|p| p.into_inner())
            )
        });
        Self { child, issuer }
    }

    /// Settings for `client` of this provider (its secret is `<client>-secret`), mapping the
    /// accounts' claims as an operator would.
    fn settings(&self, client: &str) -> OidcSettings {
        OidcSettings {
            issuer: self.issuer.clone(),
            client_id: client.to_owned(),
            client_secret: format!("{client}-secret"),
            redirect_url: REDIRECT_URL.to_owned(),
            scopes: "openid email profile recovea".to_owned(),
            org_claim: Some("recovea_org".to_owned()),
            role_claim: Some("recovea_role".to_owned()),
            groups_claim: "groups".to_owned(),
            operator_group: Some("recovea-operators".to_owned()),
            ca_pem: None,
        }
    }

    fn config(&self, client: &str) -> OidcConfig {
        OidcConfig::new(self.settings(client)).expect("valid settings")
    }

    /// How many times the provider's keys were fetched.
    async fn key_fetches(&self) -> u64 {
        let mut browser = Browser::new();
        let answer = browser.get(&format!("{}/_test/stats", self.issuer)).await;
        let stats: Value = serde_json::from_slice(&answer.body).expect("stats");
        stats["jwks"].as_u64().expect("a count")
    }
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a browser gets back.
struct Answer {
    status: StatusCode,
    location: Option<String>,
    body: Bytes,
}

/// A browser as far as the provider's pages need one: it keeps cookies (by name and path) and
/// submits forms. No JavaScript: the provider's login and consent pages need none.
struct Browser {
    http: Upstream,
    /// (name, value, path)
    cookies: Vec<(String, String, String)>,
}

impl Browser {
    fn new() -> Self {
        Self {
            http: Upstream::new(Duration::from_secs(5), 0, &ProviderNetwork::default()),
            cookies: Vec::new(),
        }
    }

    async fn get(&mut self, url: &str) -> Answer {
        self.send(Request::get(url), Bytes::new()).await
    }

    async fn post_form(&mut self, url: &str, fields: &[(&str, &str)]) -> Answer {
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
        let request = Request::post(url).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        self.send(request, Bytes::from(body)).await
    }

    async fn send(&mut self, request: http::request::Builder, body: Bytes) -> Answer {
        let url = Url::parse(&request.uri_ref().expect("a URI").to_string()).expect("an absolute URL");
        let cookie = self
            .cookies
            .iter()
            .filter(|(_, _, path)| url.path().starts_with(path.as_str()))
            .map(|(name, value, _)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("; ");
        let request = if cookie.is_empty() { request } else { request.header(header::COOKIE, cookie) };
        let answer = self.http.send(request.body(body).expect("a request"), Duration::from_secs(10)).await;
        let answer = answer.unwrap_or_else(|e| panic!("{url}: {e:?}"));
        for set in answer.headers().get_all(header::SET_COOKIE) {
            self.keep_cookie(set.to_str().expect("ASCII"));
        }
        let status = answer.status();
        let location = answer
            .headers()
            .get(header::LOCATION)
            .map(|l| url.join(l.to_str().expect("ASCII")).expect("a URL").to_string());
        let body = answer.into_body().collect().await.expect("a body").to_bytes();
        Answer { status, location, body }
    }

    /// Keeps (or, expired, forgets) the cookie a `Set-Cookie` value sets.
    fn keep_cookie(&mut self, set_cookie: &str) {
        let mut parts = set_cookie.split(';').map(str::trim);
        let Some((name, value)) = parts.next().and_then(|pair| pair.split_once('=')) else { return };
        let mut path = "/".to_owned();
        let mut expired = false;
        for attribute in parts {
            let (key, val) = attribute.split_once('=').unwrap_or((attribute, ""));
            match key.to_ascii_lowercase().as_str() {
                "path" => path = val.to_owned(),
                "max-age" => expired |= val.parse::<i64>().is_ok_and(|age| age <= 0),
                // The provider forgets a cookie by dating it 1970.
                "expires" => expired |= val.contains("1970"),
                _ => {}
            }
        }
        self.cookies.retain(|(n, _, p)| !(n == name && *p == path));
        if !expired {
            self.cookies.push((name.to_owned(), value.to_owned(), path));
        }
    }

    /// Follows `start` through the provider's login (as `login`, any password) and consent pages
    /// until it redirects to [`REDIRECT_URL`]; returns that redirect's query string.
    async fn sign_in(&mut self, start: &str, login: &str) -> String {
        tokio::time::timeout(DEADLINE, self.sign_in_unbounded(start, login))
            .await
            .expect("signed in within the deadline")
    }

    async fn sign_in_unbounded(&mut self, start: &str, login: &str) -> String {
        let mut answer = self.get(start).await;
        for _ in 0..20 {
            if let Some(location) = answer.location.clone() {
                if let Some(query) = location.strip_prefix(REDIRECT_URL) {
                    return query.trim_start_matches('?').to_owned();
                }
                answer = self.get(&location).await;
                continue;
            }
            let page = String::from_utf8_lossy(&answer.body).into_owned();
            assert_eq!(answer.status, StatusCode::OK, "{page}");
            let action = form_action(&page).unwrap_or_else(|| panic!("no form on the page: {page}"));
            answer = if page.contains(r#"name="prompt" value="login""#) {
                self.post_form(&action, &[("prompt", "login"), ("login", login), ("password", "any")]).await
            } else if page.contains(r#"name="prompt" value="consent""#) {
                self.post_form(&action, &[("prompt", "consent")]).await
            } else {
                panic!("a page neither login nor consent: {page}")
            };
        }
        panic!("the provider never sent the browser back")
    }
}

/// The `action` of the page's first form.
fn form_action(page: &str) -> Option<String> {
    let form = &page[page.find("<form")?..];
    let start = form.find("action=\"")? + "action=\"".len();
    let end = start + form[start..].find('"')?;
    Some(form[start..end].replace("&amp;", "&"))
}

/// The code of a callback's query.
fn code_of(query: &str) -> String {
    match Callback::parse(query).expect("a callback") {
        Callback::Code { code, .. } => code,
        Callback::Denied { error, .. } => panic!("the provider refused: {error}"),
    }
}

/// `claims` signed ES256 by a key of the test's own, under `kid`.
fn forged_token(kid: &str, claims: &Value) -> String {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("a key");
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).expect("a key");
    let header = json!({"alg": "ES256", "kid": kid, "typ": "JWT"});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = key.sign(&rng, input.as_bytes()).expect("signs");
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[tokio::test]
async fn an_organization_admin_signs_in_through_the_provider() {
    let provider = TestProvider::start();
    let sign_on = SignOn::new(provider.config("recovea"));
    let login = sign_on.login().await.expect("a login starts");
    assert!(login.location.starts_with(&format!("{}/auth?", provider.issuer)), "{}", login.location);
    assert!(login.set_cookie.starts_with(&format!("recovea_oidc={}; HttpOnly; SameSite=Lax", login.binding)));
    let query = Browser::new().sign_in(&login.location, "alice").await;
    let signed_in =
        sign_on.callback(&query, Some(&login.binding), SystemTime::now()).await.expect("signed in");
    assert_eq!(signed_in.person.subject, "alice");
    assert_eq!(signed_in.person.email.as_deref(), Some("alice@acme.example"));
    assert_eq!(signed_in.person.claims["iss"], json!(provider.issuer));
    let Access::Org { org_id, role } = signed_in.access else { panic!("{:?}", signed_in.access) };
    assert_eq!((org_id.as_str(), role), ("org_acme", Role::Admin));

    // The login is used up: the same callback again finds nothing waiting.
    let replayed = sign_on.callback(&query, Some(&login.binding), SystemTime::now()).await;
    assert!(matches!(replayed, Err(SignInError::NoLoginWaiting)), "{replayed:?}");
}

#[tokio::test]
async fn each_account_gets_what_its_claims_say() {
    let provider = TestProvider::start();
    let sign_on = SignOn::new(provider.config("recovea"));
    for (account, expected) in [
        ("olga", Access::Operator),
        (
            "victor",
            Access::Org {
                org_id: recovea_core::ids::OrgId::parse("org_acme").expect("id"),
                role: Role::Viewer,
            },
        ),
        ("nobody", Access::Refused(Refusal::NoOrganization { claim: "recovea_org".into() })),
    ] {
        let login = sign_on.login().await.expect("a login starts");
        let query = Browser::new().sign_in(&login.location, account).await;
        let signed_in =
            sign_on.callback(&query, Some(&login.binding), SystemTime::now()).await.expect("signed in");
        assert_eq!(signed_in.access, expected, "{account}");
        if account == "nobody" {
            assert_eq!(signed_in.person.email, None, "the provider says it did not verify this email");
        }
    }
}

#[tokio::test]
async fn es256_id_tokens_verify_and_hs256_ones_are_refused() {
    let provider = TestProvider::start();
    let es256 = SignOn::new(provider.config("recovea-es256"));
    let login = es256.login().await.expect("a login starts");
    let query = Browser::new().sign_in(&login.location, "alice").await;
    let signed_in = es256.callback(&query, Some(&login.binding), SystemTime::now()).await.expect("signed in");
    assert_eq!(signed_in.person.subject, "alice");

    // An HMAC signature's key is the client secret: whoever holds it could sign any person in.
    let hs256 = SignOn::new(provider.config("recovea-hs256"));
    let login = hs256.login().await.expect("a login starts");
    let query = Browser::new().sign_in(&login.location, "alice").await;
    let refused = hs256.callback(&query, Some(&login.binding), SystemTime::now()).await;
    assert!(
        matches!(&refused, Err(SignInError::IdToken(TokenError::UnsupportedAlgorithm(alg))) if alg == "HS256"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_callback_for_another_login_or_browser_is_refused() {
    let provider = TestProvider::start();
    let sign_on = SignOn::new(provider.config("recovea"));
    let first = sign_on.login().await.expect("a login starts");
    let second = sign_on.login().await.expect("a login starts");
    let query = Browser::new().sign_in(&first.location, "alice").await;
    // The first login's callback, brought by the browser that started the second (login CSRF).
    let refused = sign_on.callback(&query, Some(&second.binding), SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::Callback(CallbackError::WrongState))), "{refused:?}");
    // Without the login cookie at all.
    let refused = sign_on.callback(&query, None, SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::NoLoginWaiting)), "{refused:?}");
    // Neither used a login up: the second still signs its own browser in.
    let query = Browser::new().sign_in(&second.location, "victor").await;
    let signed_in =
        sign_on.callback(&query, Some(&second.binding), SystemTime::now()).await.expect("signed in");
    assert_eq!(signed_in.person.subject, "victor");
}

#[tokio::test]
async fn an_id_token_that_answers_another_nonce_is_refused() {
    let provider = TestProvider::start();
    let party = RelyingParty::new(provider.config("recovea"));
    let (location, attempt) = party.begin().await.expect("a login starts");
    // The browser reaches the provider with a nonce that is not this attempt's (an injected
    // authorization response): state and PKCE hold, the ID token's nonce does not.
    let mut url = Url::parse(&location).expect("a URL");
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| {
            let v = if k == "nonce" { "another-nonce".to_owned() } else { v.into_owned() };
            (k.into_owned(), v)
        })
        .collect();
    url.query_pairs_mut().clear().extend_pairs(pairs);
    let query = Browser::new().sign_in(url.as_str(), "alice").await;
    let refused = party.finish(&attempt, &query, SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::WrongNonce))), "{refused:?}");
}

#[tokio::test]
async fn another_clients_token_and_code_are_refused() {
    let provider = TestProvider::start();
    let ours = RelyingParty::new(provider.config("recovea"));
    let other = RelyingParty::new(provider.config("other-client"));

    let (location, attempt) = other.begin().await.expect("a login starts");
    let code = code_of(&Browser::new().sign_in(&location, "alice").await);
    let their_token = other.exchange_code(&code, &attempt).await.expect("the other client's ID token");
    let refused = ours.verify_id_token(&their_token, attempt.nonce(), SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::WrongAudience))), "{refused:?}");

    let (location, attempt) = other.begin().await.expect("a login starts");
    let their_code = code_of(&Browser::new().sign_in(&location, "alice").await);
    let refused = ours.exchange_code(&their_code, &attempt).await;
    assert!(
        matches!(&refused, Err(SignInError::CodeRefused(error)) if error == "invalid_grant"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_real_id_token_is_refused_once_expired_or_before_it_was_issued() {
    let provider = TestProvider::start();
    let party = RelyingParty::new(provider.config("recovea"));
    let (location, attempt) = party.begin().await.expect("a login starts");
    let code = code_of(&Browser::new().sign_in(&location, "alice").await);
    let token = party.exchange_code(&code, &attempt).await.expect("an ID token");
    let now = SystemTime::now();
    assert!(party.verify_id_token(&token, attempt.nonce(), now).await.is_ok());
    let later = now + Duration::from_secs(2 * 60 * 60);
    let refused = party.verify_id_token(&token, attempt.nonce(), later).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::Expired))), "{refused:?}");
    let earlier = now - Duration::from_secs(2 * 60 * 60);
    let refused = party.verify_id_token(&token, attempt.nonce(), earlier).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::IssuedInTheFuture))), "{refused:?}");
}

#[tokio::test]
async fn forged_keys_are_refused_and_make_us_ask_for_keys_at_most_once_an_interval() {
    let provider = TestProvider::start();
    let party = RelyingParty::new(provider.config("recovea"));
    assert_eq!(party.warm_up().await.expect("keys"), 2, "the provider's RSA and EC keys");
    assert_eq!(provider.key_fetches().await, 1);
    let claims = json!({"iss": provider.issuer, "aud": "recovea", "sub": "mallory", "nonce": "n",
        "iat": unix_now(), "exp": unix_now() + 300, "recovea_org": "org_acme", "recovea_role": "admin"});
    for i in 0..5 {
        let forged = forged_token(&format!("forged-{i}"), &claims);
        let refused = party.verify_id_token(&forged, "n", SystemTime::now()).await;
        assert!(matches!(refused, Err(SignInError::IdToken(TokenError::UnknownKey { .. }))), "{refused:?}");
    }
    assert_eq!(provider.key_fetches().await, 1, "no fetch within the interval, whatever the tokens name");

    // The provider's own key id, our signature.
    let refused = party.verify_id_token(&forged_token("ec-1", &claims), "n", SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::BadSignature))), "{refused:?}");

    // With no interval, an unknown key makes us look once more (a rotated key would be found).
    let eager = RelyingParty::new(provider.config("recovea")).with_refetch_interval(Duration::ZERO);
    eager.warm_up().await.expect("keys");
    assert_eq!(provider.key_fetches().await, 2);
    let refused = eager.verify_id_token(&forged_token("forged", &claims), "n", SystemTime::now()).await;
    assert!(matches!(refused, Err(SignInError::IdToken(TokenError::UnknownKey { .. }))), "{refused:?}");
    assert_eq!(provider.key_fetches().await, 3);
}

#[tokio::test]
async fn a_wrong_client_secret_is_refused_and_never_told() {
    let provider = TestProvider::start();
    let mut settings = provider.settings("recovea");
    settings.client_secret = "not-the-secret-4242".to_owned();
    let sign_on = SignOn::new(OidcConfig::new(settings).expect("valid settings"));
    let login = sign_on.login().await.expect("a login starts");
    let query = Browser::new().sign_in(&login.location, "alice").await;
    let refused = sign_on.callback(&query, Some(&login.binding), SystemTime::now()).await;
    let error = refused.expect_err("refused");
    assert!(matches!(&error, SignInError::CodeRefused(code) if code == "invalid_client"), "{error:?}");
    for text in [error.to_string(), format!("{error:?}"), error.for_person().to_owned()] {
        assert!(!text.contains("not-the-secret-4242"), "{text}");
    }
}

#[tokio::test]
async fn a_provider_that_is_not_the_configured_issuer_or_is_down_starts_no_login() {
    let provider = TestProvider::start();
    let mut settings = provider.settings("recovea");
    settings.issuer = format!("{}/", provider.issuer);
    let refused = SignOn::new(OidcConfig::new(settings).expect("valid settings")).login().await;
    assert!(
        matches!(&refused, Err(SignInError::Provider(why)) if why.contains("must match it exactly")),
        "{refused:?}"
    );

    let mut settings = provider.settings("recovea");
    settings.issuer = "http://127.0.0.1:1".to_owned();
    let refused = SignOn::new(OidcConfig::new(settings).expect("valid settings")).login().await;
    assert!(
        matches!(&refused, Err(SignInError::Provider(why)) if why.contains("could not be reached")),
        "{refused:?}"
    );
}
