//! Which way a connection to a provider leaves the process: straight to the provider, or through an
//! egress proxy, chosen as curl chooses it.
//!
//! `--upstream-proxy` (or, without it, `https_proxy`/`HTTPS_PROXY` for `https` providers,
//! `http_proxy`/`HTTP_PROXY` for `http` ones, then `all_proxy`/`ALL_PROXY`) names an `http://`
//! proxy; `https` goes through it by `CONNECT`, `http` in absolute form. `--upstream-no-proxy` (or
//! `no_proxy`/`NO_PROXY`) lists the hosts reached directly: `*` for all, a name (which covers its
//! subdomains, with or without a leading dot), an IP address, or a CIDR block. A proxy URL's
//! credentials become a `Proxy-Authorization: Basic` header and appear nowhere else.

use std::fmt;
use std::net::IpAddr;

use base64::Engine;
use http::HeaderValue;
use http::uri::Scheme;
use recovea_core::ConfigError;

/// The proxies chosen, and the hosts that bypass them.
#[derive(Clone, Default)]
pub struct Egress {
    http: Option<Proxy>,
    https: Option<Proxy>,
    bypass: Vec<Bypass>,
}

/// An egress proxy.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Proxy {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `Basic …` from the URL's user and password.
    pub(crate) authorization: Option<HeaderValue>,
}

/// Where an egress setting came from: its flag, or a variable of the environment curl reads too.
#[derive(Clone, Copy)]
enum Given {
    Flag(&'static str),
    Variable(&'static str),
}

impl Given {
    fn refused(self, why: String) -> ConfigError {
        match self {
            Given::Flag(flag) => ConfigError::flag(flag, why),
            Given::Variable(name) => ConfigError::general(format!("{name}: {why}")),
        }
    }
}

/// A host reached without the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bypass {
    Everything,
    /// A name and every name under it.
    Domain(String),
    /// An address, or a block of them: the address and how many leading bits must match.
    Network(IpAddr, u8),
}

impl Egress {
    /// The egress given by `proxy` and `no_proxy` (the flags) or else by the environment, which
    /// `env` reads. An empty value counts as unset. An error names the flag or variable at fault,
    /// never the value (it may hold a password).
    pub fn new(
        proxy: Option<&str>,
        no_proxy: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let set = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
        let first = |names: &[&'static str]| {
            names.iter().find_map(|&name| set(env(name)).map(|v| (Given::Variable(name), v)))
        };
        let flag = set(proxy.map(str::to_owned)).map(|v| (Given::Flag("upstream-proxy"), v));
        let all = first(&["all_proxy", "ALL_PROXY"]);
        let https = flag.clone().or_else(|| first(&["https_proxy", "HTTPS_PROXY"])).or_else(|| all.clone());
        let http = flag.or_else(|| first(&["http_proxy", "HTTP_PROXY"])).or(all);
        let parse = |chosen: Option<(Given, String)>| {
            chosen.map(|(given, url)| Proxy::parse(&url).map_err(|why| given.refused(why))).transpose()
        };
        let bypass = set(no_proxy.map(str::to_owned))
            .map(|v| (Given::Flag("upstream-no-proxy"), v))
            .or_else(|| first(&["no_proxy", "NO_PROXY"]));
        let bypass = match bypass {
            Some((given, list)) => parse_bypass(&list).map_err(|why| given.refused(why))?,
            None => Vec::new(),
        };
        Ok(Self { http: parse(http)?, https: parse(https)?, bypass })
    }

    /// The proxy a connection to `host` over `scheme` goes through, if any.
    pub(crate) fn proxy_for(&self, scheme: &Scheme, host: &str) -> Option<&Proxy> {
        let proxy = if *scheme == Scheme::HTTPS { self.https.as_ref() } else { self.http.as_ref() }?;
        let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
        (!self.bypass.iter().any(|b| b.covers(host))).then_some(proxy)
    }
}

impl Proxy {
    /// An `http://[user[:password]@]host[:port]` URL (`host:port` alone means `http://`, and the
    /// port defaults to 1080, as for curl).
    fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let absolute = if url.contains("://") { url.to_owned() } else { format!("http://{url}") };
        let parsed = url::Url::parse(&absolute).map_err(|e| format!("not a proxy URL ({e})"))?;
        if parsed.scheme() != "http" {
            return Err(format!("a {}:// proxy is not supported; give an http:// one", parsed.scheme()));
        }
        let host = match parsed.host() {
            Some(url::Host::Domain(name)) => name.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("the proxy URL has no host".into()),
        };
        let authorization = if parsed.username().is_empty() && parsed.password().is_none() {
            None
        } else {
            let decode = |part: &str| percent_encoding::percent_decode_str(part).collect::<Vec<u8>>();
            let mut credentials = decode(parsed.username());
            credentials.push(b':');
            credentials.extend(decode(parsed.password().unwrap_or_default()));
            let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
            let mut value = HeaderValue::try_from(format!("Basic {encoded}"))
                .map_err(|_| "the proxy's credentials cannot be sent".to_owned())?;
            value.set_sensitive(true);
            Some(value)
        };
        Ok(Self { host, port: parsed.port().unwrap_or(1080), authorization })
    }
}

/// Never the credentials.
impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let credentials = if self.authorization.is_some() { "<credentials>@" } else { "" };
        write!(f, "http://{credentials}{}:{}", self.host, self.port)
    }
}

impl fmt::Debug for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Egress")
            .field("http", &self.http)
            .field("https", &self.https)
            .field("bypass", &self.bypass)
            .finish()
    }
}

fn parse_bypass(list: &str) -> Result<Vec<Bypass>, String> {
    let mut bypass = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let entry = entry.to_ascii_lowercase();
        if entry == "*" {
            bypass.push(Bypass::Everything);
            continue;
        }
        if let Some((address, bits)) = entry.split_once('/') {
            let address: IpAddr = address.parse().map_err(|_| format!("{entry} is not a CIDR block"))?;
            let most = if address.is_ipv4() { 32 } else { 128 };
            let bits = bits
                .parse::<u8>()
                .ok()
                .filter(|&b| b <= most)
                .ok_or(format!("{entry} is not a CIDR block"))?;
            bypass.push(Bypass::Network(address, bits));
            continue;
        }
        let bare = entry.trim_start_matches('[').trim_end_matches(']');
        if let Ok(address) = bare.parse::<IpAddr>() {
            bypass.push(Bypass::Network(address, if address.is_ipv4() { 32 } else { 128 }));
            continue;
        }
        // A port is not told apart, as curl does not; a leading dot or `*.` means the same as none.
        let name = entry.split(':').next().unwrap_or_default();
        let name = name.trim_start_matches("*.").trim_start_matches('.').trim_end_matches('.');
        if !name.is_empty() {
            bypass.push(Bypass::Domain(name.to_owned()));
        }
    }
    Ok(bypass)
}

impl Bypass {
    fn covers(&self, host: &str) -> bool {
        match self {
            Bypass::Everything => true,
            Bypass::Domain(name) => {
                host.eq_ignore_ascii_case(name)
                    || (host.len() > name.len()
                        && host.as_bytes()[host.len() - name.len() - 1] == b'.'
                        && host[host.len() - name.len()..].eq_ignore_ascii_case(name))
            }
            Bypass::Network(network, bits) => {
                host.parse::<IpAddr>().is_ok_and(|ip| within(ip, *network, *bits))
            }
        }
    }
}

fn within(ip: IpAddr, network: IpAddr, bits: u8) -> bool {
    let (ip, network, width) = match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(network)) => {
            (u128::from(ip.to_bits()), u128::from(network.to_bits()), 32)
        }
        (IpAddr::V6(ip), IpAddr::V6(network)) => (ip.to_bits(), network.to_bits(), 128),
        _ => return false,
    };
    let ignored = width - u32::from(bits);
    ignored >= 128 || (ip >> ignored) == (network >> ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(proxy: Option<&str>, no_proxy: Option<&str>, env: &[(&str, &str)]) -> Result<Egress, String> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Egress::new(proxy, no_proxy, move |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
            .map_err(|e| e.to_string())
    }

    fn via(egress: &Egress, scheme: Scheme, host: &str) -> Option<String> {
        egress.proxy_for(&scheme, host).map(|p| format!("{p:?}"))
    }

    #[test]
    fn each_scheme_takes_its_variable_and_the_flag_takes_both() {
        let env = [("HTTPS_PROXY", "http://secure:3128"), ("http_proxy", "plain:8080")];
        let e = egress(None, None, &env).expect("valid");
        assert_eq!(via(&e, Scheme::HTTPS, "api.openai.com").as_deref(), Some("http://secure:3128"));
        assert_eq!(via(&e, Scheme::HTTP, "vllm.local").as_deref(), Some("http://plain:8080"));
        let e = egress(Some("http://flag:1"), None, &env).expect("valid");
        assert_eq!(via(&e, Scheme::HTTPS, "x").as_deref(), Some("http://flag:1"));
        assert_eq!(via(&e, Scheme::HTTP, "x").as_deref(), Some("http://flag:1"));
        let e = egress(None, None, &[("ALL_PROXY", "all"), ("https_proxy", "")]).expect("valid");
        assert_eq!(via(&e, Scheme::HTTPS, "x").as_deref(), Some("http://all:1080"), "empty is unset");
        let e = egress(None, None, &[("https_proxy", "http://lower:1"), ("HTTPS_PROXY", "http://upper:1")]);
        assert_eq!(via(&e.expect("valid"), Scheme::HTTPS, "x").as_deref(), Some("http://lower:1"));
        assert_eq!(via(&egress(None, None, &[]).expect("valid"), Scheme::HTTPS, "x"), None);
    }

    #[test]
    fn no_proxy_covers_names_their_subdomains_addresses_and_blocks() {
        let list = "localhost, .internal.example,corp.example:8443, 10.0.0.0/8, ::1, 192.168.1.7";
        let e = egress(Some("http://p:1"), None, &[("NO_PROXY", list)]).expect("valid");
        for direct in [
            "localhost",
            "a.internal.example",
            "internal.example",
            "corp.example",
            "x.corp.example",
            "10.2.3.4",
            "[::1]",
            "192.168.1.7",
            "LOCALHOST.",
        ] {
            assert_eq!(via(&e, Scheme::HTTPS, direct), None, "{direct}");
        }
        for proxied in ["api.openai.com", "notcorp.example", "11.0.0.1", "192.168.1.8", "example"] {
            assert!(via(&e, Scheme::HTTPS, proxied).is_some(), "{proxied}");
        }
        let all = egress(Some("http://p:1"), Some("*"), &[]).expect("valid");
        assert_eq!(via(&all, Scheme::HTTPS, "anything"), None);
        let flag_wins = egress(Some("http://p:1"), Some("a.example"), &[("NO_PROXY", "*")]).expect("valid");
        assert!(via(&flag_wins, Scheme::HTTPS, "b.example").is_some());
    }

    #[test]
    fn credentials_become_a_basic_header_and_are_never_shown() {
        let e = egress(Some("http://us%40er:p%3Ass@proxy.corp:3128"), None, &[]).expect("valid");
        let proxy = e.proxy_for(&Scheme::HTTPS, "api.openai.com").expect("proxied");
        // base64("us@er:p:ss")
        assert_eq!(proxy.authorization.as_ref().expect("credentials"), "Basic dXNAZXI6cDpzcw==");
        assert!(proxy.authorization.as_ref().expect("credentials").is_sensitive());
        let shown = format!("{e:?}");
        assert!(shown.contains("http://<credentials>@proxy.corp:3128"), "{shown}");
        assert!(!shown.contains("p%3Ass") && !shown.contains("dXNA"), "{shown}");
    }

    #[test]
    fn a_bad_value_is_named_by_where_it_came_from_without_its_text() {
        let secret = "socks5://user:hunter2@proxy:1080";
        let error = egress(None, None, &[("HTTPS_PROXY", secret)]).expect_err("unsupported");
        assert!(error.starts_with("HTTPS_PROXY: a socks5:// proxy is not supported"), "{error}");
        assert!(!error.contains("hunter2"));
        let error = egress(Some("http://user:hunter2@[bad"), None, &[]).expect_err("unparsable");
        assert!(error.starts_with("--upstream-proxy: not a proxy URL"), "{error}");
        assert!(!error.contains("hunter2"));
        let error = egress(None, None, &[("no_proxy", "10.0.0.0/33")]).expect_err("bad block");
        assert_eq!(error, "no_proxy: 10.0.0.0/33 is not a CIDR block");
    }
}
