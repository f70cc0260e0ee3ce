//! Reading the Recovea key a request presents, from the headers the contract names, in their order.

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};

use crate::keys::SECRET_PREFIX;

pub const RECOVEA_KEY_HEADER: &str = "x-recovea-key";
pub const API_KEY_HEADER: &str = "x-api-key";
/// How the Azure OpenAI SDKs send their key.
pub const AZURE_API_KEY_HEADER: &str = "api-key";
/// How the Google Gen AI SDKs send their key.
pub const GOOG_API_KEY_HEADER: &str = "x-goog-api-key";
/// The two as header names, made once at compile time rather than from their text at each lookup.
pub const RECOVEA_KEY: HeaderName = HeaderName::from_static(RECOVEA_KEY_HEADER);
pub const API_KEY: HeaderName = HeaderName::from_static(API_KEY_HEADER);
pub const AZURE_API_KEY: HeaderName = HeaderName::from_static(AZURE_API_KEY_HEADER);
pub const GOOG_API_KEY: HeaderName = HeaderName::from_static(GOOG_API_KEY_HEADER);
/// The key headers of the providers' SDKs, in the order a Recovea key is looked for in them.
pub const PROVIDER_KEY_HEADERS: [HeaderName; 3] = [API_KEY, AZURE_API_KEY, GOOG_API_KEY];

/// Where the key was found; it decides which header is stripped and whether the client brings its own
/// provider key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialHeader {
    /// `x-recovea-key`: the client brings its own provider key in the provider's usual header.
    RecoveaKey,
    /// `Authorization: Bearer rk_...` (how the OpenAI SDKs send their key).
    AuthorizationBearer,
    /// `x-api-key: rk_...` (how the Anthropic SDKs send theirs), or the same in `api-key` (Azure
    /// OpenAI's SDKs) or `x-goog-api-key` (Google's).
    ApiKey,
}

/// The key a request presented. `secret` may still be malformed: admission decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential<'h> {
    pub secret: &'h str,
    pub header: CredentialHeader,
}

impl CredentialHeader {
    /// Whether the client sent its own provider key and wants it forwarded untouched.
    pub fn brings_own_provider_key(self) -> bool {
        self == Self::RecoveaKey
    }
}

/// Reads the key from `x-recovea-key`, then `Authorization: Bearer rk_...`, then `x-api-key: rk_...`,
/// `api-key: rk_...` and `x-goog-api-key: rk_...`.
///
/// A bearer token or `x-api-key` that is not a Recovea key belongs to a provider and is not ours to
/// read. A non-text `x-recovea-key` is read as an empty (so malformed) key rather than ignored.
pub fn read(headers: &HeaderMap) -> Option<Credential<'_>> {
    if let Some(value) = headers.get(RECOVEA_KEY) {
        let secret = value.to_str().unwrap_or("").trim();
        return Some(Credential { secret, header: CredentialHeader::RecoveaKey });
    }
    let bearer = headers
        .get_all(AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(bearer_token)
        .find(|token| token.starts_with(SECRET_PREFIX));
    if let Some(secret) = bearer {
        return Some(Credential { secret, header: CredentialHeader::AuthorizationBearer });
    }
    PROVIDER_KEY_HEADERS
        .iter()
        .flat_map(|name| headers.get_all(name))
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .find(|v| v.starts_with(SECRET_PREFIX))
        .map(|secret| Credential { secret, header: CredentialHeader::ApiKey })
}

fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("valid header"));
        }
        map
    }

    #[test]
    fn recovea_header_wins() {
        let h =
            headers(&[("authorization", "Bearer rk_b"), ("x-recovea-key", "rk_a"), ("x-api-key", "rk_c")]);
        assert_eq!(read(&h), Some(Credential { secret: "rk_a", header: CredentialHeader::RecoveaKey }));
    }

    #[test]
    fn bearer_before_api_key() {
        let h = headers(&[("x-api-key", "rk_c"), ("authorization", "bearer  rk_b")]);
        assert_eq!(
            read(&h),
            Some(Credential { secret: "rk_b", header: CredentialHeader::AuthorizationBearer })
        );
    }

    #[test]
    fn provider_keys_are_not_ours() {
        let h = headers(&[("authorization", "Bearer sk-proj-123"), ("x-api-key", "sk-ant-1")]);
        assert_eq!(read(&h), None);
        let h = headers(&[("authorization", "Bearer sk-proj-123"), ("x-api-key", "rk_c")]);
        assert_eq!(read(&h), Some(Credential { secret: "rk_c", header: CredentialHeader::ApiKey }));
        assert_eq!(read(&headers(&[("authorization", "Basic rk_x")])), None);
    }

    #[test]
    fn azure_and_google_key_headers_carry_recovea_keys_too() {
        let key = |secret| Some(Credential { secret, header: CredentialHeader::ApiKey });
        assert_eq!(read(&headers(&[("api-key", "rk_az")])), key("rk_az"));
        assert_eq!(read(&headers(&[("x-goog-api-key", "rk_g")])), key("rk_g"));
        assert_eq!(read(&headers(&[("x-goog-api-key", "rk_g"), ("x-api-key", "rk_c")])), key("rk_c"));
        assert_eq!(read(&headers(&[("api-key", "azure-key"), ("x-goog-api-key", "AIza-key")])), None);
    }

    #[test]
    fn unreadable_recovea_header_is_an_empty_key() {
        let mut h = HeaderMap::new();
        h.insert("x-recovea-key", HeaderValue::from_bytes(b"rk_\xff").expect("opaque bytes are valid"));
        assert_eq!(read(&h), Some(Credential { secret: "", header: CredentialHeader::RecoveaKey }));
    }
}
