//! Model allowlists: which models a key or an organization may use (`allowed_models`), and the
//! rule that both lists must allow a request's model.
//!
//! A list holds exact names (`gpt-4o-mini`) and prefixes (`claude-*`: a single `*`, last). No list
//! (`None`) allows every model; an empty list allows none.

use serde::{Deserialize, Serialize};

/// The longest model name a request may send, in bytes: a receipt, a log line and a span carry it,
/// and no provider names a model anywhere near this long.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

/// Whether a request's model name may reach a receipt, a log line and a label: at most
/// [`MAX_MODEL_NAME_BYTES`], and no control character (a line break would forge a log line, an
/// escape sequence would reach an operator's terminal).
pub fn is_well_formed_name(model: &str) -> bool {
    model.len() <= MAX_MODEL_NAME_BYTES && !model.chars().any(char::is_control)
}

/// The most patterns one list may hold.
pub const MAX_PATTERNS: usize = 256;
/// The longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 200;

/// A validated allowlist: every pattern non-empty, printable ASCII without spaces, at most one `*`
/// and only at its end. Built by [`ModelAllowlist::parse`] (or read from JSON through it), so a
/// list that breaks these rules cannot exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct ModelAllowlist {
    patterns: Box<[String]>,
}

/// Why a list was refused; the text names the pattern, for the admin API's 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError(pub String);

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PatternError {}

impl ModelAllowlist {
    pub fn parse(patterns: Vec<String>) -> Result<Self, PatternError> {
        check_patterns(&patterns, "model", |b| b.is_ascii_graphic(), "printable ASCII, without spaces")?;
        Ok(Self { patterns: patterns.into() })
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether some pattern matches `model`: equal to it, or, ending with `*`, a prefix of it.
    pub fn allows(&self, model: &str) -> bool {
        any_matches(&self.patterns, model)
    }
}

/// Whether some pattern of a list is `text`, or, ending with `*`, a prefix of it: the rule of
/// model and endpoint allowlists alike.
pub(crate) fn any_matches(patterns: &[String], text: &str) -> bool {
    patterns.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => text.starts_with(prefix),
        None => pattern == text,
    })
}

/// The rules every allowlist's patterns keep: at most [`MAX_PATTERNS`] of them, each non-empty,
/// at most [`MAX_PATTERN_LEN`] bytes, every byte passing `byte_allowed` (`bytes_rule` says which
/// do), one `*` at most and only last. `noun` names the list's entries in the messages.
pub(crate) fn check_patterns(
    patterns: &[String],
    noun: &str,
    byte_allowed: fn(u8) -> bool,
    bytes_rule: &str,
) -> Result<(), PatternError> {
    if patterns.len() > MAX_PATTERNS {
        return Err(PatternError(format!("at most {MAX_PATTERNS} {noun}s may be listed")));
    }
    for pattern in patterns {
        let shown: String = pattern.chars().take(MAX_PATTERN_LEN).collect();
        if pattern.is_empty() {
            return Err(PatternError(format!("a {noun} pattern may not be empty")));
        }
        if pattern.len() > MAX_PATTERN_LEN {
            return Err(PatternError(format!(
                "{noun} pattern longer than {MAX_PATTERN_LEN} bytes: {shown:?}"
            )));
        }
        if !pattern.bytes().all(byte_allowed) {
            return Err(PatternError(format!("{noun} pattern {shown:?} may hold only {bytes_rule}")));
        }
        if pattern.trim_end_matches('*').contains('*') || pattern.ends_with("**") {
            return Err(PatternError(format!("{noun} pattern {shown:?} may hold one '*', only at its end")));
        }
    }
    Ok(())
}

impl TryFrom<Vec<String>> for ModelAllowlist {
    type Error = PatternError;

    fn try_from(patterns: Vec<String>) -> Result<Self, PatternError> {
        Self::parse(patterns)
    }
}

impl From<ModelAllowlist> for Vec<String> {
    fn from(list: ModelAllowlist) -> Self {
        list.patterns.into_vec()
    }
}

/// Whether a request for `model` may go on: the key's list and its organization's list must both
/// allow it (a missing list allows everything). A request that names no model (a `GET /v1/models`,
/// a file upload) has nothing to refuse, and goes on.
pub fn model_allowed(
    key: Option<&ModelAllowlist>,
    org: Option<&ModelAllowlist>,
    model: Option<&str>,
) -> bool {
    let Some(model) = model else { return true };
    key.is_none_or(|list| list.allows(model)) && org.is_none_or(|list| list.allows(model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(patterns: &[&str]) -> ModelAllowlist {
        ModelAllowlist::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).expect("valid")
    }

    #[test]
    fn exact_names_and_prefixes() {
        let allowed = list(&["gpt-4o-mini", "claude-*"]);
        assert!(allowed.allows("gpt-4o-mini"));
        assert!(!allowed.allows("gpt-4o"));
        assert!(!allowed.allows("gpt-4o-mini-2024"), "an exact name is not a prefix");
        assert!(allowed.allows("claude-sonnet-4-5"));
        assert!(allowed.allows("claude-"));
        assert!(!allowed.allows("claude"));
        assert!(list(&["*"]).allows("anything"));
        assert!(!list(&[]).allows("gpt-4o"), "an empty list allows nothing");
    }

    #[test]
    fn both_lists_must_allow() {
        let gpt = list(&["gpt-*"]);
        let mini = list(&["gpt-4o-mini"]);
        assert!(model_allowed(None, None, Some("o3")), "no lists: everything");
        assert!(model_allowed(Some(&gpt), None, Some("gpt-4o")));
        assert!(!model_allowed(None, Some(&mini), Some("gpt-4o")));
        assert!(model_allowed(Some(&gpt), Some(&mini), Some("gpt-4o-mini")));
        assert!(!model_allowed(Some(&gpt), Some(&mini), Some("gpt-4o")), "the organization's list refuses");
        assert!(!model_allowed(Some(&mini), Some(&gpt), Some("gpt-4o")), "the key's list refuses");
        assert!(model_allowed(Some(&list(&[])), Some(&mini), None), "no model named, nothing refused");
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["", "gpt*4", "*gpt", "gpt**", "gpt 4", "gpt\u{e9}", "a\tb"] {
            assert!(ModelAllowlist::parse(vec![bad.to_owned()]).is_err(), "{bad:?}");
        }
        assert!(ModelAllowlist::parse(vec!["x".repeat(MAX_PATTERN_LEN + 1)]).is_err());
        assert!(ModelAllowlist::parse(vec!["x".repeat(MAX_PATTERN_LEN)]).is_ok());
        assert!(ModelAllowlist::parse(vec!["m".to_owned(); MAX_PATTERNS + 1]).is_err());
        let error = ModelAllowlist::parse(vec!["a*b".into()]).expect_err("refused");
        assert!(error.0.contains("\"a*b\""), "{error}");
    }

    #[test]
    fn json_is_a_list_of_strings_and_is_validated() {
        let allowed = list(&["gpt-4o", "claude-*"]);
        let text = serde_json::to_string(&allowed).expect("serialises");
        assert_eq!(text, r#"["gpt-4o","claude-*"]"#);
        assert_eq!(serde_json::from_str::<ModelAllowlist>(&text).expect("reads"), allowed);
        assert!(serde_json::from_str::<ModelAllowlist>(r#"["a*b"]"#).is_err());
    }

    proptest! {
        /// A prefix pattern allows exactly the names that start with it; an exact one only itself.
        #[test]
        fn matching_is_prefix_or_equality(prefix in "[a-z0-9.-]{0,12}", model in "[a-z0-9.-]{0,16}") {
            let star = list(&[&format!("{prefix}*")]);
            prop_assert_eq!(star.allows(&model), model.starts_with(&prefix));
            if !prefix.is_empty() {
                let exact = list(&[&prefix]);
                prop_assert_eq!(exact.allows(&model), model == prefix);
            }
        }

        /// Adding a pattern never takes a model away, and the rule is the conjunction of the lists.
        #[test]
        fn lists_only_widen_and_both_must_allow(
            key in prop::collection::vec("[a-c]{1,3}\\*?", 0..4),
            org in prop::collection::vec("[a-c]{1,3}\\*?", 0..4),
            extra in "[a-c]{1,3}\\*?",
            model in "[a-c]{0,4}",
        ) {
            let key_list = ModelAllowlist::parse(key.clone()).expect("valid");
            let org_list = ModelAllowlist::parse(org).expect("valid");
            let mut wider = key;
            wider.push(extra);
            let wider = ModelAllowlist::parse(wider).expect("valid");
            prop_assert!(!key_list.allows(&model) || wider.allows(&model));
            prop_assert_eq!(
                model_allowed(Some(&key_list), Some(&org_list), Some(&model)),
                key_list.allows(&model) && org_list.allows(&model)
            );
            prop_assert!(model_allowed(None, None, Some(&model)));
        }
    }
}
