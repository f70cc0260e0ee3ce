//! Query strings and path segments of admin requests, percent-decoded.

use recovea_core::timestamp::Timestamp;

use crate::ApiError;

/// A decoded query string.
#[derive(Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn parse(query: &str) -> Result<Self, ApiError> {
        let mut pairs = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_decode(s).ok_or_else(|| ApiError::bad_field(name, "bad escape"));
            pairs.push((decode(name)?, decode(value)?));
        }
        Ok(Self(pairs))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Every pair, in the order given.
    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    pub(crate) fn time(&self, name: &str) -> Result<Option<Timestamp>, ApiError> {
        self.get(name)
            .map(|text| {
                Timestamp::parse_rfc3339(text)
                    .ok_or_else(|| ApiError::bad_field(name, "expected an RFC 3339 time"))
            })
            .transpose()
    }
}

/// A path segment, where `+` is itself (unlike in a query).
pub(crate) fn decode_path_segment(segment: &str) -> Option<String> {
    percent_decode(&segment.replace('+', "%2B"))
}

/// A query name or value: `%XX` escapes, and `+` for a space.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let p = Params::parse("from=2026-11-30T00%3A00%3A00%2B01%3A00&key_id=key_a&x").expect("parses");
        assert_eq!(p.get("from"), Some("2026-11-30T00:00:00+01:00"));
        assert_eq!(p.get("key_id"), Some("key_a"));
        assert_eq!(p.get("x"), Some(""));
        assert!(Params::parse("a=%zz").is_err());
        assert_eq!(decode_path_segment("openai%2Fgpt-4o+x").as_deref(), Some("openai/gpt-4o+x"));
    }
}
