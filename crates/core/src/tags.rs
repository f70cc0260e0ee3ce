//! Attribution tags: `x-recovea-tags: team=search,feature=autocomplete` on a request, kept on its
//! receipt so that spend can be filtered and summed by them.
//!
//! A header holds at most [`MAX_TAGS`] `key=value` pairs separated by commas (spaces around either
//! are ignored; several header lines are one list). A key is 1 to [`MAX_KEY_LEN`] characters of
//! `a-z`, `0-9`, `_`, `-` and `.`; a value 1 to [`MAX_VALUE_LEN`] of `A-Z`, `a-z`, `0-9`, `_`, `-`,
//! `.`, `:` and `/`. A key appears once. Tags are kept sorted by key, so that a receipt's tags and
//! their text ([`to_text`], `team=search,feature=x` in key order) do not depend on the client's order.

use std::collections::BTreeMap;

/// Tags by key.
pub type Tags = BTreeMap<String, String>;

/// The header that carries them; never forwarded to the provider.
pub const HEADER: &str = "x-recovea-tags";
pub const MAX_TAGS: usize = 10;
pub const MAX_KEY_LEN: usize = 32;
pub const MAX_VALUE_LEN: usize = 64;

/// Why a header was refused: the text completes "Invalid x-recovea-tags: ...".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagError(pub String);

impl std::fmt::Display for TagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TagError {}

pub fn is_key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.')
}

pub fn is_value_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/')
}

/// Reads the lines of an `x-recovea-tags` header (as bytes: a line that is not text is refused).
/// Lines that hold only spaces add nothing.
pub fn parse<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Result<Tags, TagError> {
    let mut tags = Tags::new();
    for line in lines {
        let line = std::str::from_utf8(line).map_err(|_| {
            TagError("the header is not text; expected key=value pairs separated by commas".into())
        })?;
        if line.trim().is_empty() {
            continue;
        }
        for pair in line.split(',') {
            let (key, value) = parse_pair(pair)?;
            if tags.contains_key(key) {
                return Err(TagError(format!("the key '{key}' is given twice")));
            }
            if tags.len() == MAX_TAGS {
                return Err(TagError(format!("at most {MAX_TAGS} tags")));
            }
            tags.insert(key.to_owned(), value.to_owned());
        }
    }
    Ok(tags)
}

fn parse_pair(pair: &str) -> Result<(&str, &str), TagError> {
    let shown = |text: &str| text.chars().take(MAX_VALUE_LEN + 1).collect::<String>();
    let Some((key, value)) = pair.split_once('=') else {
        return Err(TagError(format!("'{}' is not key=value", shown(pair.trim()))));
    };
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(is_key_char) {
        return Err(TagError(format!(
            "the key '{}' must be 1 to {MAX_KEY_LEN} characters of a-z, 0-9, '_', '-' and '.'",
            shown(key)
        )));
    }
    if value.is_empty() || value.len() > MAX_VALUE_LEN || !value.bytes().all(is_value_char) {
        return Err(TagError(format!(
            "the value of '{key}' must be 1 to {MAX_VALUE_LEN} characters of A-Z, a-z, 0-9, '_', '-', '.', ':' and '/'"
        )));
    }
    Ok((key, value))
}

/// The tags as text, `key=value` pairs in key order separated by commas (empty for no tags): how
/// the ledger stores them and the CSV export shows them. [`parse`] reads it back.
pub fn to_text(tags: &Tags) -> String {
    let mut out = String::new();
    for (key, value) in tags {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(key);
        out.push('=');
        out.push_str(value);
    }
    out
}

/// A receipts filter, `key:value` (the API's `tag=team:search`): the tag it asks for.
pub fn parse_filter(text: &str) -> Result<(String, String), TagError> {
    let (key, value) = text.split_once(':').ok_or_else(|| TagError(format!("'{text}' is not key:value")))?;
    let (key, value) = parse_pair(&format!("{key}={value}")).map(|(k, v)| (k.to_owned(), v.to_owned()))?;
    Ok((key, value))
}

/// Whether a stored tags text (see [`to_text`]) holds `key=value`. Values cannot hold `,` or `=`,
/// so one pair is found whole or not at all.
pub fn text_has(text: &str, key: &str, value: &str) -> bool {
    text.split(',').any(|pair| pair.split_once('=') == Some((key, value)))
}

/// The value of `key` in a stored tags text, if it has one.
pub fn text_value<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    text.split(',').find_map(|pair| pair.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(line: &str) -> Result<Tags, TagError> {
        parse([line.as_bytes()])
    }

    #[test]
    fn pairs_are_read_sorted_and_trimmed() {
        let tags = one(" team=search , feature=autocomplete").expect("valid");
        assert_eq!(to_text(&tags), "feature=autocomplete,team=search");
        assert_eq!(tags["team"], "search");
        let lines = parse([&b"team=search"[..], b"env=prod/eu-1:blue", b"  "]).expect("valid");
        assert_eq!(to_text(&lines), "env=prod/eu-1:blue,team=search");
        assert_eq!(one("").expect("nothing"), Tags::new());
        assert_eq!(parse(Vec::<&[u8]>::new()).expect("nothing"), Tags::new());
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let cases = [
            ("team", "'team' is not key=value"),
            ("team=search,", "'' is not key=value"),
            ("Team=search", "the key 'Team' must be"),
            ("=search", "the key '' must be"),
            ("team=", "the value of 'team' must be"),
            ("team=a b", "the value of 'team' must be"),
            ("team=a=b", "the value of 'team' must be"),
            ("team=a,team=b", "the key 'team' is given twice"),
        ];
        for (header, start) in cases {
            let error = one(header).expect_err(header);
            assert!(error.0.starts_with(start), "{header}: {error}");
        }
        let long_key = format!("{}=v", "k".repeat(MAX_KEY_LEN + 1));
        assert!(one(&long_key).is_err());
        assert!(one(&format!("{}=v", "k".repeat(MAX_KEY_LEN))).is_ok());
        assert!(one(&format!("k={}", "v".repeat(MAX_VALUE_LEN + 1))).is_err());
        let eleven: Vec<String> = (0..=MAX_TAGS).map(|n| format!("k{n}=v")).collect();
        assert_eq!(one(&eleven.join(",")).expect_err("too many").0, "at most 10 tags");
        assert!(one(&eleven[..MAX_TAGS].join(",")).is_ok());
        assert!(parse([&[0xff, b'=', b'v'][..]]).is_err());
    }

    #[test]
    fn filters_and_stored_text() {
        assert_eq!(parse_filter("team:search").expect("valid"), ("team".into(), "search".into()));
        assert_eq!(parse_filter("env:prod:eu").expect("valid"), ("env".into(), "prod:eu".into()));
        assert!(parse_filter("team").is_err());
        assert!(parse_filter("team:").is_err());
        assert!(text_has("feature=x,team=search", "team", "search"));
        assert!(!text_has("feature=x,team=search2", "team", "search"));
        assert!(!text_has("", "team", "search"));
        assert_eq!(text_value("feature=x,team=search", "team"), Some("search"));
        assert_eq!(text_value("feature=x", "team"), None);
    }

    fn tag() -> impl Strategy<Value = (String, String)> {
        ("[a-z0-9_.-]{1,32}", "[A-Za-z0-9_.:/-]{1,64}")
    }

    proptest! {
        /// Valid tags, in any order and spacing, read back as themselves, and their text too.
        #[test]
        fn valid_tags_round_trip(tags in prop::collection::btree_map("[a-z0-9_.-]{1,32}", "[A-Za-z0-9_.:/-]{1,64}", 0..=10), spaces in "[ ]{0,2}") {
            let mut pairs: Vec<String> = tags.iter().map(|(k, v)| format!("{spaces}{k}{spaces}={v}{spaces}")).collect();
            pairs.reverse();
            let parsed = one(&pairs.join(",")).expect("valid");
            prop_assert_eq!(&parsed, &tags);
            prop_assert_eq!(one(&to_text(&tags)).expect("its own text"), tags.clone());
            let text = to_text(&tags);
            for (key, value) in &tags {
                prop_assert!(text_has(&text, key, value));
                prop_assert_eq!(text_value(&text, key), Some(value.as_str()));
            }
        }

        /// Any header either reads within the bounds or is refused; nothing else happens.
        #[test]
        fn any_header_is_bounded_or_refused(header in "[ -~]{0,200}") {
            if let Ok(tags) = one(&header) {
                prop_assert!(tags.len() <= MAX_TAGS);
                for (key, value) in &tags {
                    prop_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(is_key_char));
                    prop_assert!(!value.is_empty() && value.len() <= MAX_VALUE_LEN && value.bytes().all(is_value_char));
                }
            }
        }

        #[test]
        fn one_tag_parses(t in tag()) {
            let header = format!("{}={}", t.0, t.1);
            prop_assert_eq!(one(&header).expect("valid").into_iter().collect::<Vec<_>>(), vec![t]);
        }
    }
}
