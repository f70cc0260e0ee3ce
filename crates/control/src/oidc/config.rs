//! Sign-on settings as the flags give them, validated into an [`OidcConfig`] that holds only
//! usable values: a secure issuer, a callback the console serves, and a way for someone to sign in.

use std::fmt;

use recovea_core::ConfigError;
use recovea_core::config_error::non_blank;
use recovea_upstream::{Egress, ProviderNetwork};
use url::{Host, Url};

use super::CALLBACK_PATH;
use super::access::AccessRules;

/// The scopes asked for when `--oidc-scopes` is not given: the person's id, name and email.
pub const DEFAULT_SCOPES: &str = "openid email profile";
/// The claim that lists a person's groups when `--oidc-groups-claim` is not given.
pub const DEFAULT_GROUPS_CLAIM: &str = "groups";

/// Sign-on as the flags give it. Every field is checked by [`OidcConfig::new`].
pub struct OidcSettings {
    /// `--oidc-issuer`: compared byte for byte with the provider's `iss`.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// `--oidc-redirect-url`: where the provider sends the browser back, as registered with it.
    pub redirect_url: String,
    /// Space- or comma-separated; `openid` is added when missing.
    pub scopes: String,
    pub org_claim: Option<String>,
    pub role_claim: Option<String>,
    pub groups_claim: String,
    pub operator_group: Option<String>,
    /// `--oidc-ca-file`'s PEM: trusted for the provider beside the public web's roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// The client secret: kept out of `Debug`, logs and errors.
#[derive(Clone)]
pub(crate) struct ClientSecret(String);

impl ClientSecret {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ClientSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientSecret(..)")
    }
}

/// Validated sign-on settings: build them with [`OidcConfig::new`].
#[derive(Clone)]
pub struct OidcConfig {
    pub(crate) issuer: String,
    pub(crate) client_id: String,
    pub(crate) client_secret: ClientSecret,
    pub(crate) redirect_url: String,
    /// `openid` first, no repeats, joined by spaces.
    pub(crate) scopes: String,
    pub(crate) access: AccessRules,
    pub(crate) network: ProviderNetwork,
}

impl fmt::Debug for OidcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("redirect_url", &self.redirect_url)
            .field("scopes", &self.scopes)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl OidcConfig {
    /// Checks `settings`. An error names the flag at fault and never holds the client secret.
    pub fn new(settings: OidcSettings) -> Result<Self, ConfigError> {
        let issuer = settings.issuer.trim().to_owned();
        let issuer_url = secure_url(&issuer).map_err(|why| ConfigError::flag("oidc-issuer", why))?;
        if issuer_url.query().is_some() || issuer_url.fragment().is_some() {
            return Err(ConfigError::flag("oidc-issuer", "an issuer has no query or fragment"));
        }
        let client_id = non_blank("oidc-client-id", &settings.client_id)?;
        let client_secret = ClientSecret(non_blank("oidc-client-secret", &settings.client_secret)?);
        let redirect_url = settings.redirect_url.trim().to_owned();
        let redirect =
            secure_url(&redirect_url).map_err(|why| ConfigError::flag("oidc-redirect-url", why))?;
        if redirect.path() != CALLBACK_PATH || redirect.query().is_some() || redirect.fragment().is_some() {
            return Err(ConfigError::flag(
                "oidc-redirect-url",
                format!(
                    "must be the console's address followed by {CALLBACK_PATH} \
                     (https://recovea.example.com{CALLBACK_PATH})"
                ),
            ));
        }
        let scopes = scopes(&settings.scopes)?;
        let claim = |flag: &'static str, name: Option<&str>| -> Result<Option<String>, ConfigError> {
            name.map(|name| non_blank(flag, name)).transpose()
        };
        let access = AccessRules {
            org_claim: claim("oidc-org-claim", settings.org_claim.as_deref())?,
            role_claim: claim("oidc-role-claim", settings.role_claim.as_deref())?,
            groups_claim: non_blank("oidc-groups-claim", &settings.groups_claim)?,
            operator_group: claim("oidc-operator-group", settings.operator_group.as_deref())?,
        };
        if access.org_claim.is_none() && access.operator_group.is_none() {
            return Err(ConfigError::general(
                "single sign-on needs --oidc-org-claim or --oidc-operator-group (or both): \
                 otherwise no one could sign in",
            ));
        }
        if access.role_claim.is_some() && access.org_claim.is_none() {
            return Err(ConfigError::flag(
                "oidc-role-claim",
                "needs --oidc-org-claim: a role is held in an organization",
            ));
        }
        let network = ProviderNetwork::new(settings.ca_pem.as_deref(), false, Egress::default(), 1)
            .map_err(|e| e.as_flag("upstream-ca-file", "oidc-ca-file"))?;
        Ok(Self { issuer, client_id, client_secret, redirect_url, scopes, access, network })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn redirect_url(&self) -> &str {
        &self.redirect_url
    }

    /// Where the provider's discovery document is (OpenID Connect Discovery 1.0, section 4).
    pub(crate) fn discovery_url(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'))
    }

    /// Whether the browser reaches the console over TLS: the login cookie is then `Secure`.
    pub(crate) fn console_over_tls(&self) -> bool {
        self.redirect_url.starts_with("https:")
    }
}

/// `url` parsed, when it is `https`, or plain `http` to this machine (a provider run beside us,
/// as the tests do): a token or a code never crosses a network in clear.
pub(crate) fn secure_url(url: &str) -> Result<Url, String> {
    let parsed = Url::parse(url).map_err(|e| format!("{url:?} is not a URL ({e})"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("a URL with credentials in it is refused".into());
    }
    let loopback = match parsed.host() {
        Some(Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(address)) => address.is_loopback(),
        Some(Host::Ipv6(address)) => address.is_loopback(),
        None => return Err(format!("{url:?} has no host")),
    };
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if loopback => Ok(parsed),
        "http" => Err(format!("{url:?} must be https (plain http only to localhost)")),
        _ => Err(format!("{url:?} must start with https://")),
    }
}

/// `--oidc-scopes` as the authorization request sends it: `openid` first (without it the
/// provider answers no ID token), each scope once.
fn scopes(given: &str) -> Result<String, ConfigError> {
    let mut scopes = vec!["openid"];
    for scope in given.split([' ', ',']).filter(|s| !s.is_empty()) {
        // RFC 6749, section 3.3: printable ASCII but space, `"` and `\`.
        if !scope.bytes().all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E)) {
            return Err(ConfigError::flag("oidc-scopes", format!("{scope:?} is not a scope")));
        }
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    Ok(scopes.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OidcSettings {
        OidcSettings {
            issuer: "https://login.example.com/realms/acme".into(),
            client_id: "recovea".into(),
            client_secret: "s3cret-value".into(),
            redirect_url: "https://recovea.example.com/console/oidc/callback".into(),
            scopes: DEFAULT_SCOPES.into(),
            org_claim: Some("recovea_org".into()),
            role_claim: Some("recovea_role".into()),
            groups_claim: DEFAULT_GROUPS_CLAIM.into(),
            operator_group: Some("recovea-operators".into()),
            ca_pem: None,
        }
    }

    fn refused(change: impl FnOnce(&mut OidcSettings)) -> String {
        let mut settings = settings();
        change(&mut settings);
        let error = OidcConfig::new(settings).expect_err("refused").to_string();
        assert!(!error.contains("s3cret-value"), "{error}");
        error
    }

    #[test]
    fn a_complete_setting_is_taken_and_its_secret_stays_out_of_debug() {
        let config = OidcConfig::new(settings()).expect("valid");
        assert_eq!(config.issuer(), "https://login.example.com/realms/acme");
        assert_eq!(
            config.discovery_url(),
            "https://login.example.com/realms/acme/.well-known/openid-configuration"
        );
        assert!(config.console_over_tls());
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret-value"), "{debug}");
        assert!(debug.contains("ClientSecret(..)"), "{debug}");
    }

    #[test]
    fn a_trailing_slash_stays_in_the_issuer_but_not_in_the_discovery_url() {
        let mut with_slash = settings();
        with_slash.issuer = "https://login.example.com/".into();
        let config = OidcConfig::new(with_slash).expect("valid");
        assert_eq!(config.issuer(), "https://login.example.com/");
        assert_eq!(config.discovery_url(), "https://login.example.com/.well-known/openid-configuration");
    }

    #[test]
    fn plain_http_is_taken_only_to_this_machine() {
        for loopback in ["http://127.0.0.1:4000", "http://localhost:4000/oidc", "http://[::1]:4000"] {
            let mut local = settings();
            local.issuer = loopback.into();
            assert!(OidcConfig::new(local).is_ok(), "{loopback}");
        }
        for insecure in ["http://login.example.com", "http://10.0.0.5", "ftp://login.example.com"] {
            let error = refused(|s| s.issuer = insecure.into());
            assert!(error.starts_with("--oidc-issuer:"), "{error}");
        }
        let error = refused(|s| s.redirect_url = "http://recovea.example.com/console/oidc/callback".into());
        assert!(error.starts_with("--oidc-redirect-url:"), "{error}");
    }

    #[test]
    fn an_issuer_with_a_query_fragment_or_credentials_is_refused() {
        for bad in [
            "https://login.example.com?x=1",
            "https://login.example.com#top",
            "https://u:p@login.example.com",
        ] {
            let error = refused(|s| s.issuer = bad.into());
            assert!(error.starts_with("--oidc-issuer:"), "{error}");
        }
    }

    #[test]
    fn the_redirect_url_must_land_on_the_consoles_callback() {
        let error = refused(|s| s.redirect_url = "https://recovea.example.com/callback".into());
        assert!(error.contains(CALLBACK_PATH), "{error}");
        let mut local = settings();
        local.redirect_url = "http://127.0.0.1:8081/console/oidc/callback".into();
        let config = OidcConfig::new(local).expect("valid");
        assert!(!config.console_over_tls());
    }

    #[test]
    fn someone_must_be_able_to_sign_in() {
        let error = refused(|s| {
            s.org_claim = None;
            s.role_claim = None;
            s.operator_group = None;
        });
        assert!(error.contains("--oidc-org-claim"), "{error}");
        let error = refused(|s| s.org_claim = None);
        assert!(error.starts_with("--oidc-role-claim"), "{error}");
        let mut operators_only = settings();
        operators_only.org_claim = None;
        operators_only.role_claim = None;
        assert!(OidcConfig::new(operators_only).is_ok());
    }

    #[test]
    fn blank_values_name_their_flag() {
        assert!(refused(|s| s.client_id = " ".into()).starts_with("--oidc-client-id"));
        assert!(refused(|s| s.client_secret = String::new()).starts_with("--oidc-client-secret"));
        assert!(refused(|s| s.groups_claim = String::new()).starts_with("--oidc-groups-claim"));
        assert!(refused(|s| s.org_claim = Some(" ".into())).starts_with("--oidc-org-claim"));
    }

    #[test]
    fn scopes_start_with_openid_once_each() {
        assert_eq!(scopes("email profile").expect("valid"), "openid email profile");
        assert_eq!(scopes("openid,groups, email openid").expect("valid"), "openid groups email");
        assert_eq!(scopes("").expect("valid"), "openid");
        assert!(scopes("email \"x\"").is_err());
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_names_the_oidc_flag() {
        let error = refused(|s| s.ca_pem = Some(b"not a certificate".to_vec()));
        assert!(error.starts_with("--oidc-ca-file"), "{error}");
    }
}
