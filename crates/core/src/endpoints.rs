//! Endpoint allowlists: which provider endpoints a key or an organization may call
//! (`allowed_endpoints`), and the rule that both lists must allow a request's endpoint.
//!
//! A list holds paths as the provider sees them, without the query: exact paths
//! (`/v1/chat/completions`) and prefixes (`/v1/files*`: a single `*`, last). A request's endpoint
//! is its path after routing: what a receipt names as `endpoint` (`/openai/v1/...` and
//! `/{name}/v1/...` are matched as `/v1/...`; Azure's `/openai/deployments/{d}/...` and Gemini's
//! `/v1beta/models/{m}:{method}` as they are). Matching is byte for byte, case included. No list
//! (`None`) allows every endpoint; an empty list allows none.
//!
//! Routing refuses a path with a `.` or `..` segment (literal or percent-encoded) or an encoded
//! slash before any list is read, so a prefix cannot be walked out of (`/v1/chat/../files`).

use serde::{Deserialize, Serialize};

pub use crate::models::{MAX_PATTERN_LEN, MAX_PATTERNS, PatternError};

/// A validated endpoint allowlist: every pattern starts with `/`, holds printable ASCII without
/// spaces, no `?` or `#`, and at most one `*`, only at its end. Built by
/// [`EndpointAllowlist::parse`] (or read from JSON through it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct EndpointAllowlist {
    patterns: Box<[String]>,
}

impl EndpointAllowlist {
    pub fn parse(patterns: Vec<String>) -> Result<Self, PatternError> {
        if let Some(pattern) = patterns.iter().find(|pattern| !pattern.starts_with('/')) {
            let shown: String = pattern.chars().take(MAX_PATTERN_LEN).collect();
            return Err(PatternError(format!("endpoint pattern {shown:?} must start with '/'")));
        }
        let byte_allowed = |b: u8| b.is_ascii_graphic() && b != b'?' && b != b'#';
        let rule = "printable ASCII, without spaces, '?' or '#'";
        crate::models::check_patterns(&patterns, "endpoint", byte_allowed, rule)?;
        Ok(Self { patterns: patterns.into() })
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether some pattern matches `endpoint` (a path without its query): equal to it, or,
    /// ending with `*`, a prefix of it.
    pub fn allows(&self, endpoint: &str) -> bool {
        crate::models::any_matches(&self.patterns, endpoint)
    }
}

impl TryFrom<Vec<String>> for EndpointAllowlist {
    type Error = PatternError;

    fn try_from(patterns: Vec<String>) -> Result<Self, PatternError> {
        Self::parse(patterns)
    }
}

impl From<EndpointAllowlist> for Vec<String> {
    fn from(list: EndpointAllowlist) -> Self {
        list.patterns.into_vec()
    }
}

/// Whether a request to `endpoint` may go on: the key's list and its organization's list must both
/// allow it (a missing list allows everything).
pub fn endpoint_allowed(
    key: Option<&EndpointAllowlist>,
    org: Option<&EndpointAllowlist>,
    endpoint: &str,
) -> bool {
    key.is_none_or(|list| list.allows(endpoint)) && org.is_none_or(|list| list.allows(endpoint))
}

/// The path of an upstream path and query: what a list is matched against.
pub fn endpoint_of(upstream_path: &str) -> &str {
    upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(patterns: &[&str]) -> EndpointAllowlist {
        EndpointAllowlist::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).expect("valid")
    }

    #[test]
    fn exact_paths_and_prefixes() {
        let inference = list(&["/v1/chat/completions", "/v1/embeddings", "/openai/deployments/*"]);
        assert!(inference.allows("/v1/chat/completions"));
        assert!(!inference.allows("/v1/chat/completions/chatcmpl-1"), "stored completions are another path");
        assert!(!inference.allows("/v1/files"));
        assert!(inference.allows("/openai/deployments/gpt4o/chat/completions"));
        assert!(!inference.allows("/openai/files"));
        let files = list(&["/v1/files*"]);
        assert!(files.allows("/v1/files"));
        assert!(files.allows("/v1/files/file-1/content"));
        assert!(!files.allows("/V1/files"), "case counts");
        assert!(list(&["/*"]).allows("/v1beta/models/gemini-2.5-flash:generateContent"));
        assert!(!list(&[]).allows("/v1/chat/completions"), "an empty list allows nothing");
    }

    #[test]
    fn both_lists_must_allow() {
        let v1 = list(&["/v1/*"]);
        let chat = list(&["/v1/chat/completions"]);
        assert!(endpoint_allowed(None, None, "/v1/files"));
        assert!(endpoint_allowed(Some(&v1), None, "/v1/files"));
        assert!(!endpoint_allowed(None, Some(&chat), "/v1/files"));
        assert!(endpoint_allowed(Some(&v1), Some(&chat), "/v1/chat/completions"));
        assert!(!endpoint_allowed(Some(&v1), Some(&chat), "/v1/files"), "the organization's list refuses");
        assert!(!endpoint_allowed(Some(&chat), Some(&v1), "/v1/files"), "the key's list refuses");
    }

    #[test]
    fn the_query_is_not_part_of_the_endpoint() {
        assert_eq!(endpoint_of("/v1/files?purpose=batch"), "/v1/files");
        assert_eq!(endpoint_of("/v1/files"), "/v1/files");
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in
            ["", "v1/files", "*", "/v1*/files", "/v1/**", "/v1/a b", "/v1/files?x=1", "/v1/\u{e9}", "/a#b"]
        {
            assert!(EndpointAllowlist::parse(vec![bad.to_owned()]).is_err(), "{bad:?}");
        }
        assert!(EndpointAllowlist::parse(vec![format!("/{}", "x".repeat(MAX_PATTERN_LEN))]).is_err());
        assert!(EndpointAllowlist::parse(vec!["/m".to_owned(); MAX_PATTERNS + 1]).is_err());
        let error = EndpointAllowlist::parse(vec!["files".into()]).expect_err("refused");
        assert!(error.0.contains("\"files\""), "{error}");
    }

    #[test]
    fn json_is_a_list_of_strings_and_is_validated() {
        let allowed = list(&["/v1/chat/completions", "/v1/files*"]);
        let text = serde_json::to_string(&allowed).expect("serialises");
        assert_eq!(text, r#"["/v1/chat/completions","/v1/files*"]"#);
        assert_eq!(serde_json::from_str::<EndpointAllowlist>(&text).expect("reads"), allowed);
        assert!(serde_json::from_str::<EndpointAllowlist>(r#"["v1"]"#).is_err());
    }

    proptest! {
        /// A prefix pattern allows exactly the paths that start with it; an exact one only itself;
        /// and the rule is the conjunction of the two lists.
        #[test]
        fn matching_is_prefix_or_equality_and_both_must_allow(
            prefix in "/[a-z0-9/]{0,10}",
            path in "/[a-z0-9/]{0,14}",
            key in prop::collection::vec("/[a-c/]{0,3}\\*?", 0..4),
            org in prop::collection::vec("/[a-c/]{0,3}\\*?", 0..4),
        ) {
            let star = list(&[&format!("{prefix}*")]);
            prop_assert_eq!(star.allows(&path), path.starts_with(&prefix));
            prop_assert_eq!(list(&[&prefix]).allows(&path), path == prefix);
            let key = EndpointAllowlist::parse(key).expect("valid");
            let org = EndpointAllowlist::parse(org).expect("valid");
            prop_assert_eq!(
                endpoint_allowed(Some(&key), Some(&org), &path),
                key.allows(&path) && org.allows(&path)
            );
            prop_assert!(endpoint_allowed(None, None, &path));
        }
    }
}
