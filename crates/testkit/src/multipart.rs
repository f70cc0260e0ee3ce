//! Just enough of `multipart/form-data` (RFC 7578) to take a file upload: named parts, an optional
//! file name, the bytes. Uploads to the mock are small, so plain searches suffice.

/// One part of a form.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Part<'a> {
    pub(crate) name: String,
    pub(crate) filename: Option<String>,
    pub(crate) data: &'a [u8],
}

/// The boundary of a `multipart/form-data` content type, or `None` for any other type.
pub(crate) fn boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params_of(params)
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value)
        .filter(|b| !b.is_empty() && b.len() <= 70)
}

/// The parts of `body`, or `None` when it is not a well-formed form with that boundary.
pub(crate) fn parse<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    // A preamble may precede the first delimiter; every later one follows a CRLF.
    let mut at =
        if body.starts_with(delimiter) { 0 } else { find(body, &[b"\r\n", delimiter].concat())? + 2 };
    let mut parts = Vec::new();
    loop {
        let rest = &body[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        // Transport padding (spaces and tabs) may stand before the line break.
        let padding = rest.iter().take_while(|b| **b == b' ' || **b == b'\t').count();
        let rest = rest[padding..].strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        let content = &rest[head_end + 4..];
        let end = find(content, &[b"\r\n", delimiter].concat())?;
        let (name, filename) = disposition(head)?;
        parts.push(Part { name, filename, data: &content[..end] });
        at = body.len() - content.len() + end + 2;
    }
}

/// The `name` and `filename` of a part's `Content-Disposition: form-data` header.
fn disposition(head: &str) -> Option<(String, Option<String>)> {
    let value = head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("content-disposition").then_some(value)
    })?;
    let (kind, params) = value.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("form-data") {
        return None;
    }
    let params = params_of(params);
    let get = |key: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(key)).map(|(_, v)| v.clone());
    Some((get("name")?, get("filename")))
}

/// `; a=b; c="d; e"` as name-value pairs, quotes removed and backslash escapes resolved.
fn params_of(text: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ';' || c.is_whitespace()).is_some() {}
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ';')).collect();
        if name.is_empty() {
            return params;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.extend(chars.next()),
                        c => value.push(c),
                    }
                }
            } else {
                value = std::iter::from_fn(|| chars.next_if(|c| *c != ';')).collect();
            }
        }
        params.push((name.trim().to_owned(), value.trim_end().to_owned()));
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_boundary_quoted_or_not() {
        assert_eq!(boundary("multipart/form-data; boundary=abc").as_deref(), Some("abc"));
        assert_eq!(boundary(r#"Multipart/Form-Data;charset=x; Boundary="a b;c""#).as_deref(), Some("a b;c"));
        assert_eq!(boundary("application/json; boundary=abc"), None);
        assert_eq!(boundary("multipart/form-data"), None);
        assert_eq!(boundary("multipart/form-data; boundary="), None);
    }

    #[test]
    fn parses_fields_and_files() {
        let body = concat!(
            "preamble\r\n",
            "--XyZ\r\n",
            "Content-Disposition: form-data; name=\"purpose\"\r\n",
            "\r\n",
            "batch\r\n",
            "--XyZ  \r\n",
            "content-disposition: form-data; name=\"file\"; filename=\"in \\\"1\\\".jsonl\"\r\n",
            "Content-Type: application/octet-stream\r\n",
            "\r\n",
            "{\"a\":1}\r\n{\"b\":2}\r\n",
            "\r\n",
            "--XyZ--\r\n",
            "epilogue"
        );
        let parts = parse(body.as_bytes(), "XyZ").expect("well formed");
        assert_eq!(
            parts,
            [
                Part { name: "purpose".into(), filename: None, data: b"batch" },
                Part {
                    name: "file".into(),
                    filename: Some("in \"1\".jsonl".into()),
                    data: b"{\"a\":1}\r\n{\"b\":2}\r\n"
                },
            ]
        );
    }

    #[test]
    fn rejects_broken_forms() {
        assert_eq!(parse(b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nno end", "b"), None);
        assert_eq!(parse(b"no delimiter at all", "b"), None);
        assert_eq!(parse(b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--", "b"), None);
        assert_eq!(parse(b"--b--\r\n", "b"), Some(vec![]));
    }
}
