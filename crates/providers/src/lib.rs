//! What differs between providers: which credential a path goes to, how its auth header looks, and
//! which headers must not cross the proxy.

pub mod headers;
pub mod jobs;
#[cfg(test)]
mod json_strategy;
pub mod media;
pub mod multipart;
pub mod realtime;
pub mod request_body;
pub mod rewrite;
pub mod route;
pub mod sse;
pub mod usage;
mod walk;

pub use route::{
    Route, body_is_a_file, is_credential_name, model_the_provider_runs, route, route_for, without_key_param,
};

/// Parses a JSON body. One that is valid UTF-8 (any real one) is checked once, whole, rather than
/// string by string as `from_slice` does (about a hundred instructions a string); one that is not
/// is parsed by `from_slice` still, so that what is accepted does not change.
pub(crate) fn from_json<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

/// Checks that `url` is an absolute http(s) URL without query or fragment, and drops a trailing
/// slash so that the request path (`/v1/...`) can be appended as is.
pub fn normalize_base_url(url: &str) -> Result<String, String> {
    let trimmed = url.trim().trim_end_matches('/');
    let uri: http::Uri = trimmed.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{url:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    if uri.query().is_some() || trimmed.contains('#') {
        return Err(format!("{url:?} must not carry a query or fragment"));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_that_is_not_utf8_where_it_is_skipped_reads_as_before() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Head<'a> {
            model: &'a str,
        }
        let body = b"{\"junk\":\"\xff\",\"model\":\"m\"}";
        assert_eq!(from_json::<Head<'_>>(body).expect("parses"), Head { model: "m" });
        assert!(from_json::<Head<'_>>(b"{\"model\":\"\xff\"}").is_err());
        assert_eq!(
            from_json::<Head<'_>>(br#"{"model":"gpt-4o"}"#).expect("parses"),
            Head { model: "gpt-4o" }
        );
    }

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(
            normalize_base_url("https://api.groq.com/openai/").as_deref(),
            Ok("https://api.groq.com/openai")
        );
        assert_eq!(normalize_base_url("http://127.0.0.1:9").as_deref(), Ok("http://127.0.0.1:9"));
        for bad in ["", "api.openai.com", "ftp://x", "https://x/?a=1", "https://x/#f", "http://"] {
            assert!(normalize_base_url(bad).is_err(), "{bad}");
        }
    }
}
