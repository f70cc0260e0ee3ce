//! Setting one member of a JSON object by editing its bytes, so every other byte (order, spacing) stays as sent.

use std::ops::Range;

/// Where one member of an object sits, in the object's bytes.
pub(super) struct Member {
    key: Range<usize>,
    pub value: Range<usize>,
}

/// The span of the one JSON value in `text`, surrounding whitespace left out.
pub(super) fn value_span(text: &[u8]) -> Option<Range<usize>> {
    let start = skip_whitespace(text, 0);
    let end = value_end(text, start)?;
    (skip_whitespace(text, end) == text.len()).then_some(start..end)
}

/// The members of `object`, which must span one object exactly (`{` to `}`). A scanner, not a
/// validator: callers hand it JSON that serde_json has accepted, and it never panics on the rest.
pub(super) fn members(object: &[u8]) -> Option<Vec<Member>> {
    if object.first() != Some(&b'{') {
        return None;
    }
    let mut members = Vec::new();
    let mut at = skip_whitespace(object, 1);
    if object.get(at) == Some(&b'}') {
        return (at + 1 == object.len()).then_some(members);
    }
    loop {
        if object.get(at) != Some(&b'"') {
            return None;
        }
        let key = at..string_end(object, at)?;
        at = skip_whitespace(object, key.end);
        if object.get(at) != Some(&b':') {
            return None;
        }
        let value_start = skip_whitespace(object, at + 1);
        let value = value_start..value_end(object, value_start)?;
        at = skip_whitespace(object, value.end);
        members.push(Member { key, value });
        match object.get(at)? {
            b',' => at = skip_whitespace(object, at + 1),
            b'}' => return (at + 1 == object.len()).then_some(members),
            _ => return None,
        }
    }
}

/// The last member named `key`: the one a JSON parser keeps when a name repeats.
pub(super) fn find<'m>(object: &[u8], members: &'m [Member], key: &str) -> Option<&'m Member> {
    members.iter().rev().find(|member| key_is(&object[member.key.clone()], key))
}

/// `object` (with its `members`) with member `key` set to the JSON `value`: the member replaced in
/// place when present, else appended after the last one.
pub(super) fn set_member(object: &[u8], members: &[Member], key: &str, value: &[u8]) -> Option<Vec<u8>> {
    let mut edited = Vec::with_capacity(object.len() + key.len() + value.len() + 4);
    if let Some(member) = find(object, members, key) {
        edited.extend_from_slice(&object[..member.value.start]);
        edited.extend_from_slice(value);
        edited.extend_from_slice(&object[member.value.end..]);
        return Some(edited);
    }
    let insert_at = members.last().map_or(1, |last| last.value.end);
    edited.extend_from_slice(&object[..insert_at]);
    if !members.is_empty() {
        edited.push(b',');
    }
    serde_json::to_writer(&mut edited, key).ok()?;
    edited.push(b':');
    edited.extend_from_slice(value);
    edited.extend_from_slice(&object[insert_at..]);
    Some(edited)
}

/// Whether a quoted member name is `key`, escapes decoded.
fn key_is(quoted: &[u8], key: &str) -> bool {
    let raw = &quoted[1..quoted.len() - 1];
    if raw.contains(&b'\\') {
        serde_json::from_slice::<String>(quoted).is_ok_and(|name| name == key)
    } else {
        raw == key.as_bytes()
    }
}

fn skip_whitespace(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The end of the string opening at `start`, past its closing quote.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut at = start + 1;
    loop {
        match text.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => at += 2,
            _ => at += 1,
        }
    }
}

/// The end of the value starting at `start`.
fn value_end(text: &[u8], start: usize) -> Option<usize> {
    match text.get(start)? {
        b'"' => string_end(text, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = start;
            loop {
                match text.get(at)? {
                    b'"' => {
                        at = string_end(text, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let scalar = text[start..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(text.len() - start);
            (scalar > 0).then_some(start + scalar)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(object: &str, key: &str, value: &str) -> Option<String> {
        let members = members(object.as_bytes())?;
        let edited = set_member(object.as_bytes(), &members, key, value.as_bytes())?;
        String::from_utf8(edited).ok()
    }

    #[test]
    fn replaces_in_place_or_appends_after_the_last_member() {
        assert_eq!(
            set(r#"{"a": 1, "b" : [2,"}"]}"#, "a", "3").as_deref(),
            Some(r#"{"a": 3, "b" : [2,"}"]}"#)
        );
        assert_eq!(set(r#"{"a":1 }"#, "b", "true").as_deref(), Some(r#"{"a":1,"b":true }"#));
        assert_eq!(set("{ }", "b", "true").as_deref(), Some(r#"{"b":true }"#));
        assert_eq!(set(r#"{"a":1,"a":2}"#, "a", "0").as_deref(), Some(r#"{"a":1,"a":0}"#));
        assert_eq!(set(r#"{"\u0061":"x\"y"}"#, "a", "0").as_deref(), Some(r#"{"\u0061":0}"#));
    }

    #[test]
    fn refuses_what_is_not_one_object() {
        for bad in ["", "[]", "{", r#"{"a"}"#, r#"{"a":1"#, r#"{"a":1} "#, r#"{"a":}"#, r#"{"a":1,}"#] {
            assert!(members(bad.as_bytes()).is_none(), "{bad}");
        }
        assert_eq!(value_span(b"  {\"a\":1}\n"), Some(2..9));
        assert_eq!(value_span(b"{} x"), None);
    }
}
