//! Header rules of the hop: what is dropped both ways, where the Recovea key is removed, and how
//! each provider kind carries its key.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use recovea_core::credential::{API_KEY, AZURE_API_KEY, GOOG_API_KEY, PROVIDER_KEY_HEADERS, RECOVEA_KEY};
use recovea_core::keys::SECRET_PREFIX;
use recovea_core::snapshot::ProviderKind;

/// Sent by every Anthropic SDK: it marks a request as Anthropic's, whatever its path.
pub const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// Headers that describe one connection, not the message (RFC 9110 section 7.6.1), plus the
/// non-standard ones proxies are known to meet.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including those the `Connection` header names, and `Upgrade`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Usually there are none: one pass over the names is cheaper than nine removals by hash.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Removes every place a Recovea key can travel in, whichever one the request used.
pub fn remove_recovea_key(headers: &mut HeaderMap) {
    headers.remove(RECOVEA_KEY);
    remove_values(headers, header::AUTHORIZATION, is_recovea_bearer);
    for name in PROVIDER_KEY_HEADERS {
        remove_values(headers, name, is_recovea_key);
    }
}

/// `x-api-key: rk_...` (or `api-key`, `x-goog-api-key`). Read as bytes: a value that is not text but starts like a Recovea key is
/// treated as one, so that it never reaches a provider.
fn is_recovea_key(value: &HeaderValue) -> bool {
    value.as_bytes().trim_ascii().starts_with(SECRET_PREFIX.as_bytes())
}

/// `Authorization: Bearer rk_...` (whatever the scheme's name), read as bytes as [`is_recovea_key`].
fn is_recovea_bearer(value: &HeaderValue) -> bool {
    let value = value.as_bytes();
    value
        .iter()
        .position(|&b| b == b' ')
        .is_some_and(|space| value[space + 1..].trim_ascii().starts_with(SECRET_PREFIX.as_bytes()))
}

fn remove_values(headers: &mut HeaderMap, name: HeaderName, is_recovea: fn(&HeaderValue) -> bool) {
    let values = headers.get_all(&name);
    if !values.iter().any(is_recovea) {
        return;
    }
    if values.iter().all(is_recovea) {
        headers.remove(&name);
        return;
    }
    let kept: Vec<HeaderValue> = headers.get_all(&name).iter().filter(|v| !is_recovea(v)).cloned().collect();
    headers.remove(&name);
    for value in kept {
        headers.append(name.clone(), value);
    }
}

/// Whether the client sent a provider key of its own (`Authorization`, `x-api-key`, `api-key` or
/// `x-goog-api-key` that is not a Recovea key): only then does a key in `x-recovea-key` mean "forward my provider key untouched".
pub fn has_provider_auth(headers: &HeaderMap) -> bool {
    headers.get_all(header::AUTHORIZATION).iter().any(|v| !is_recovea_bearer(v))
        || PROVIDER_KEY_HEADERS.iter().any(|name| headers.get_all(name).iter().any(|v| !is_recovea_key(v)))
}

/// Replaces whatever provider auth the client sent with the managed key, in the kind's own header.
pub fn set_managed_key(headers: &mut HeaderMap, kind: ProviderKind, api_key: &str) -> Result<(), InvalidKey> {
    headers.remove(header::AUTHORIZATION);
    for name in PROVIDER_KEY_HEADERS {
        headers.remove(name);
    }
    let value = |key: &str| {
        let mut value = HeaderValue::try_from(key).map_err(|_| InvalidKey)?;
        value.set_sensitive(true);
        Ok::<_, InvalidKey>(value)
    };
    match kind {
        ProviderKind::OpenAi => {
            let mut bearer = String::with_capacity("Bearer ".len() + api_key.len());
            bearer.push_str("Bearer ");
            bearer.push_str(api_key);
            let mut value = HeaderValue::try_from(bearer).map_err(|_| InvalidKey)?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        ProviderKind::Anthropic => {
            headers.insert(API_KEY, value(api_key)?);
        }
        ProviderKind::AzureOpenAi => {
            headers.insert(AZURE_API_KEY, value(api_key)?);
        }
        ProviderKind::Gemini => {
            headers.insert(GOOG_API_KEY, value(api_key)?);
        }
    }
    Ok(())
}

/// A stored provider key that cannot be a header value (the admin API refuses those; this guards
/// the hop all the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidKey;

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_str(v).expect("valid"));
        }
        m
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("content-type", "application/json"),
        ]);
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-type"));
    }

    #[test]
    fn recovea_key_is_removed_wherever_it_is() {
        let rk = "rk_0123456789012345678901234567890123456789";
        let mut h = map(&[
            ("x-recovea-key", rk),
            ("authorization", &format!("Bearer {rk}")),
            ("authorization", "Bearer sk-own"),
            ("x-api-key", rk),
            ("anthropic-version", "2023-06-01"),
        ]);
        remove_recovea_key(&mut h);
        assert_eq!(h.get_all("authorization").iter().collect::<Vec<_>>(), vec!["Bearer sk-own"]);
        assert!(!h.contains_key("x-api-key"));
        assert!(!h.contains_key("x-recovea-key"));
        assert!(h.contains_key("anthropic-version"));
        let own = map(&[("authorization", "Bearer sk-own"), ("x-api-key", "sk-ant-own"), ("te", "trailers")]);
        let mut h = own.clone();
        remove_recovea_key(&mut h);
        assert_eq!(h, own, "a request without a Recovea key keeps its auth");
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "te goes");
    }

    #[test]
    fn own_provider_auth_is_told_from_recovea_keys() {
        let rk = "rk_0123456789012345678901234567890123456789";
        assert!(!has_provider_auth(&map(&[("x-recovea-key", rk)])));
        assert!(!has_provider_auth(&map(&[("authorization", &format!("Bearer {rk}")), ("x-api-key", rk)])));
        assert!(has_provider_auth(&map(&[("authorization", "Bearer sk-own")])));
        assert!(has_provider_auth(&map(&[("x-api-key", "sk-ant-own")])));
    }

    #[test]
    fn managed_key_goes_in_the_kinds_header() {
        let mut h = map(&[("authorization", "Bearer sk-client"), ("x-api-key", "sk-client")]);
        set_managed_key(&mut h, ProviderKind::OpenAi, "sk-managed").expect("valid");
        assert_eq!(h.get("authorization").expect("set"), "Bearer sk-managed");
        assert!(!h.contains_key("x-api-key"));
        set_managed_key(&mut h, ProviderKind::Anthropic, "sk-ant").expect("valid");
        assert_eq!(h.get("x-api-key").expect("set"), "sk-ant");
        assert!(!h.contains_key("authorization"));
        assert_eq!(set_managed_key(&mut h, ProviderKind::Anthropic, "bad\nkey"), Err(InvalidKey));
    }

    #[test]
    fn azure_and_gemini_keys_go_in_their_headers_and_replace_the_clients() {
        let client =
            [("authorization", "Bearer t"), ("api-key", "az-client"), ("x-goog-api-key", "g-client")];
        let mut h = map(&client);
        set_managed_key(&mut h, ProviderKind::AzureOpenAi, "az-managed").expect("valid");
        assert_eq!((h.len(), h.get("api-key").expect("set").to_str().ok()), (1, Some("az-managed")));
        let mut h = map(&client);
        set_managed_key(&mut h, ProviderKind::Gemini, "g-managed").expect("valid");
        assert_eq!((h.len(), h.get("x-goog-api-key").expect("set").to_str().ok()), (1, Some("g-managed")));
    }

    #[test]
    fn recovea_keys_in_azure_and_google_headers_are_removed_and_not_provider_auth() {
        let rk = "rk_0123456789012345678901234567890123456789";
        let mut h = map(&[("api-key", rk), ("x-goog-api-key", rk)]);
        assert!(!has_provider_auth(&h));
        remove_recovea_key(&mut h);
        assert!(h.is_empty());
        assert!(has_provider_auth(&map(&[("api-key", "azure-own")])));
        assert!(has_provider_auth(&map(&[("x-goog-api-key", "AIza-own")])));
    }
}
