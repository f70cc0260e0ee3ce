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

/// Headers of a provider's answer that name the account behind the key (the operator's, for a
/// managed key) or set state on the gateway's own domain: never passed to a client.
pub const ACCOUNT_HEADERS: [&str; 4] =
    ["openai-organization", "openai-project", "anthropic-organization-id", "set-cookie"];

/// A provider's answer's headers as a client gets them: without hop-by-hop headers
/// ([`remove_hop_by_hop`]) nor [`ACCOUNT_HEADERS`].
pub fn for_client(headers: &mut HeaderMap) {
    remove_hop_by_hop(headers);
    remove_account(headers);
}

/// Removes [`ACCOUNT_HEADERS`] (from an upgrade's `101` too, whose hop-by-hop headers stay).
pub fn remove_account(headers: &mut HeaderMap) {
    for name in ACCOUNT_HEADERS {
        headers.remove(name);
    }
}

/// Removes hop-by-hop headers, including those the `Connection` header names, and `Upgrade`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Usually there are none: one pass over the names is cheaper than nine removals by hash.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE) {
        return;
    }
    let named = connection_named(headers);
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
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

/// Whether the client sent a provider key of its own (`Authorization`, `x-api-key`, `api-key` or
/// `x-goog-api-key` that is not a Recovea key): only then does a key in `x-recovea-key` mean "forward my provider key untouched".
pub fn has_provider_auth(headers: &HeaderMap) -> bool {
    headers.get_all(header::AUTHORIZATION).iter().any(|v| !is_recovea_bearer(v))
        || PROVIDER_KEY_HEADERS.iter().any(|name| headers.get_all(name).iter().any(|v| !is_recovea_key(v)))
}

/// Makes the headers [`for_provider`] made for a WebSocket upgrade ask the provider for it again
/// (`Connection: upgrade`, `Upgrade: websocket`, which cross no hop by themselves), without any
/// extension: a compressed stream could not be read as it passes.
pub fn for_upgrade(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
}

/// Whether the request asks to become a WebSocket (`Upgrade: websocket`, any case, among the
/// protocols it lists).
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers.get_all(header::UPGRADE).iter().any(|value| {
        value.to_str().is_ok_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket")))
    })
}

/// The headers a request carries to its provider, made in one pass over the client's (a chat
/// request spent some 3,000 instructions in a dozen lookups and removals by hash before): the
/// hop-by-hop headers and those `Connection` names go, and so do every Recovea key wherever it
/// travels, the attribution tags (the provider never sees them), `Host` and the client's framing.
/// With a managed key, whatever auth the client sent goes too and the kind's own header carries
/// the managed key. The answer is asked uncompressed, since the usage tap reads it as it passes;
/// `Content-Length` is set when the client framed a body or `body_len` is not zero.
pub fn for_provider(
    client: HeaderMap,
    managed: Option<(ProviderKind, &str)>,
    body_len: usize,
) -> Result<HeaderMap, InvalidKey> {
    let named = connection_named(&client);
    let mut framed = false;
    let mut out = HeaderMap::with_capacity(client.len() + 3);
    let mut current: Option<HeaderName> = None;
    for (name, value) in client {
        // `into_iter` names only the first of a name's values.
        if let Some(name) = name {
            current = Some(name);
        }
        let Some(name) = &current else { continue };
        framed |= name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING;
        if !stays(name, &value, managed.is_some(), &named) {
            continue;
        }
        out.append(name.clone(), value);
    }
    if let Some((kind, api_key)) = managed {
        let (name, value) = managed_key(kind, api_key)?;
        out.insert(name, value);
    }
    if framed || body_len != 0 {
        out.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    out.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    Ok(out)
}

/// Sent by clients to tag a request's receipt; the gateway's alone.
const TAGS: HeaderName = HeaderName::from_static(recovea_core::tags::HEADER);
/// What a cloud metadata service asks of a request for the machine's credentials: no provider
/// needs it, and a client has no business sending it through the gateway.
const METADATA_FLAVOR: HeaderName = HeaderName::from_static("metadata-flavor");

/// Whether a client's header goes on to the provider (see [`for_provider`]).
fn stays(name: &HeaderName, value: &HeaderValue, managed: bool, named: &[HeaderName]) -> bool {
    let gateways = HOP_BY_HOP.contains(name)
        || name == header::UPGRADE
        || name == RECOVEA_KEY
        || name == TAGS
        || name == METADATA_FLAVOR
        || name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == header::ACCEPT_ENCODING
        || named.contains(name);
    if gateways {
        return false;
    }
    if name == header::AUTHORIZATION {
        return !managed && !is_recovea_bearer(value);
    }
    if PROVIDER_KEY_HEADERS.contains(name) {
        return !managed && !is_recovea_key(value);
    }
    true
}

/// The names a `Connection` header lists: they describe the client's connection only.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// The managed key in the header its provider kind reads it from.
fn managed_key(kind: ProviderKind, api_key: &str) -> Result<(HeaderName, HeaderValue), InvalidKey> {
    let (name, text) = match kind {
        ProviderKind::OpenAi => {
            let mut bearer = String::with_capacity("Bearer ".len() + api_key.len());
            bearer.push_str("Bearer ");
            bearer.push_str(api_key);
            (header::AUTHORIZATION, bearer)
        }
        ProviderKind::Anthropic => (API_KEY, api_key.to_owned()),
        ProviderKind::AzureOpenAi => (AZURE_API_KEY, api_key.to_owned()),
        ProviderKind::Gemini => (GOOG_API_KEY, api_key.to_owned()),
    };
    let mut value = HeaderValue::try_from(text).map_err(|_| InvalidKey)?;
    value.set_sensitive(true);
    Ok((name, value))
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
    fn a_metadata_services_header_never_reaches_a_provider() {
        let client = map(&[("metadata-flavor", "Google"), ("content-type", "application/json")]);
        let sent =
            for_provider(client, Some((ProviderKind::OpenAi, "sk-managed-0123456789")), 2).expect("headers");
        assert!(sent.get("metadata-flavor").is_none());
        assert_eq!(sent["content-type"], "application/json");
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

    const RK: &str = "rk_0123456789012345678901234567890123456789";

    #[test]
    fn recovea_key_is_removed_wherever_it_is() {
        let h = map(&[
            ("x-recovea-key", RK),
            ("authorization", &format!("Bearer {RK}")),
            ("authorization", "Bearer sk-own"),
            ("x-api-key", RK),
            ("anthropic-version", "2023-06-01"),
            ("x-recovea-tags", "team=search"),
        ]);
        let h = for_provider(h, None, 0).expect("valid");
        assert_eq!(h.get_all("authorization").iter().collect::<Vec<_>>(), vec!["Bearer sk-own"]);
        assert!(!h.contains_key("x-api-key"));
        assert!(!h.contains_key("x-recovea-key"));
        assert!(!h.contains_key("x-recovea-tags"), "tags are the gateway's");
        assert!(h.contains_key("anthropic-version"));
        let own = map(&[("authorization", "Bearer sk-own"), ("x-api-key", "sk-ant-own"), ("te", "trailers")]);
        let h = for_provider(own, None, 0).expect("valid");
        let kept = map(&[
            ("authorization", "Bearer sk-own"),
            ("x-api-key", "sk-ant-own"),
            ("accept-encoding", "identity"),
        ]);
        assert_eq!(h, kept, "a request without a Recovea key keeps its auth; te goes");
    }

    #[test]
    fn the_providers_request_is_framed_by_the_gateway() {
        let h = map(&[("host", "gw"), ("content-length", "5"), ("accept-encoding", "gzip")]);
        let h = for_provider(h, None, 7).expect("valid");
        assert_eq!(h, map(&[("content-length", "7"), ("accept-encoding", "identity")]));
        let h = for_provider(map(&[("transfer-encoding", "chunked")]), None, 0).expect("valid");
        assert_eq!(h.get("content-length").expect("a framed empty body keeps its length"), "0");
        let h = for_provider(HeaderMap::new(), None, 0).expect("valid");
        assert!(!h.contains_key("content-length"), "no body, no framing");
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
        let client = || map(&[("authorization", "Bearer sk-client"), ("x-api-key", "sk-client")]);
        let h = for_provider(client(), Some((ProviderKind::OpenAi, "sk-managed")), 0).expect("valid");
        assert_eq!(h.get("authorization").expect("set"), "Bearer sk-managed");
        assert!(h.get("authorization").expect("set").is_sensitive());
        assert!(!h.contains_key("x-api-key"));
        let h = for_provider(client(), Some((ProviderKind::Anthropic, "sk-ant")), 0).expect("valid");
        assert_eq!(h.get("x-api-key").expect("set"), "sk-ant");
        assert!(!h.contains_key("authorization"));
        let bad = for_provider(client(), Some((ProviderKind::Anthropic, "bad\nkey")), 0);
        assert_eq!(bad, Err(InvalidKey));
    }

    #[test]
    fn azure_and_gemini_keys_go_in_their_headers_and_replace_the_clients() {
        let client =
            [("authorization", "Bearer t"), ("api-key", "az-client"), ("x-goog-api-key", "g-client")];
        let h =
            for_provider(map(&client), Some((ProviderKind::AzureOpenAi, "az-managed")), 0).expect("valid");
        assert_eq!(h, map(&[("api-key", "az-managed"), ("accept-encoding", "identity")]));
        let h = for_provider(map(&client), Some((ProviderKind::Gemini, "g-managed")), 0).expect("valid");
        assert_eq!(h, map(&[("x-goog-api-key", "g-managed"), ("accept-encoding", "identity")]));
    }

    #[test]
    fn recovea_keys_in_azure_and_google_headers_are_removed_and_not_provider_auth() {
        let h = map(&[("api-key", RK), ("x-goog-api-key", RK)]);
        assert!(!has_provider_auth(&h));
        assert_eq!(for_provider(h, None, 0).expect("valid"), map(&[("accept-encoding", "identity")]));
        assert!(has_provider_auth(&map(&[("api-key", "azure-own")])));
        assert!(has_provider_auth(&map(&[("x-goog-api-key", "AIza-own")])));
    }

    /// The edits [`for_provider`] replaced, one removal after another, as the gateway made them.
    mod by_removals {
        use super::*;

        pub fn for_provider(
            mut h: HeaderMap,
            managed: Option<(ProviderKind, &str)>,
            body_len: usize,
        ) -> Result<HeaderMap, InvalidKey> {
            let had_length =
                h.contains_key(header::CONTENT_LENGTH) || h.contains_key(header::TRANSFER_ENCODING);
            remove_hop_by_hop(&mut h);
            h.remove(RECOVEA_KEY);
            remove_values(&mut h, header::AUTHORIZATION, is_recovea_bearer);
            for name in PROVIDER_KEY_HEADERS {
                remove_values(&mut h, name, is_recovea_key);
            }
            h.remove(recovea_core::tags::HEADER);
            h.remove(METADATA_FLAVOR);
            h.remove(header::HOST);
            h.remove(header::CONTENT_LENGTH);
            if let Some((kind, key)) = managed {
                h.remove(header::AUTHORIZATION);
                for name in PROVIDER_KEY_HEADERS {
                    h.remove(name);
                }
                let (name, value) = managed_key(kind, key)?;
                h.insert(name, value);
            }
            if had_length || body_len != 0 {
                h.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
            }
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            Ok(h)
        }

        fn remove_values(h: &mut HeaderMap, name: HeaderName, is_recovea: fn(&HeaderValue) -> bool) {
            let kept: Vec<HeaderValue> =
                h.get_all(&name).iter().filter(|v| !is_recovea(v)).cloned().collect();
            h.remove(&name);
            for value in kept {
                h.append(name.clone(), value);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn one_pass_makes_what_the_removals_made(
            pairs in proptest::collection::vec((0..NAMES.len(), 0..VALUES.len()), 0..12),
            managed in proptest::option::of((0..4usize, proptest::bool::ANY)),
            body_len in 0..3usize,
        ) {
            let bearer = format!("Bearer {RK}");
            let values = VALUES.map(|v| if v == "BEARER_RK" { bearer.as_str() } else { v });
            let client: Vec<(&'static str, &str)> = pairs.iter().map(|&(n, v)| (NAMES[n], values[v])).collect();
            let kinds = [ProviderKind::OpenAi, ProviderKind::Anthropic, ProviderKind::AzureOpenAi, ProviderKind::Gemini];
            let managed = managed.map(|(kind, valid)| (kinds[kind], if valid { "sk-managed" } else { "bad\nkey" }));
            let one_pass = for_provider(map(&client), managed, body_len);
            let removals = by_removals::for_provider(map(&client), managed, body_len);
            proptest::prop_assert_eq!(one_pass, removals, "{:?} {:?}", client, managed);
        }
    }

    const NAMES: [&str; 18] = [
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-recovea-key",
        "x-recovea-tags",
        "host",
        "content-length",
        "transfer-encoding",
        "accept-encoding",
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "content-type",
        "anthropic-version",
        "x-private",
        "proxy-authorization",
    ];
    const VALUES: [&str; 9] = [
        RK,
        "BEARER_RK",
        "Bearer sk-own",
        "sk-own",
        "x-private",
        "keep-alive, x-private",
        "gzip",
        "authorization, x-recovea-key",
        "5",
    ];
}
