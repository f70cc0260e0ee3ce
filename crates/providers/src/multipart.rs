//! `multipart/form-data` bodies (RFC 7578), read in place: how a file reaches `POST /v1/files`.
//! Pure and bounded: a body that does not follow the format gives `None`, never a panic.

use memchr::memmem;

/// One part of a form: its field name, file name and bytes (a slice of the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: Option<&'a str>,
    pub filename: Option<&'a str>,
    pub body: &'a [u8],
}

/// The most parts a form is read to; a form with more is not read (a file upload has two).
const MAX_PARTS: usize = 64;
/// The longest boundary RFC 2046 allows.
const MAX_BOUNDARY: usize = 70;

/// The boundary a `multipart/form-data` content type names, unquoted.
pub fn boundary(content_type: &str) -> Option<&str> {
    let (media, params) = content_type.split_once(';')?;
    if !media.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params.split(';').find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim().eq_ignore_ascii_case("boundary").then(|| value.trim())
    })?;
    let boundary = boundary.strip_prefix('"').and_then(|b| b.strip_suffix('"')).unwrap_or(boundary);
    (!boundary.is_empty() && boundary.len() <= MAX_BOUNDARY).then_some(boundary)
}

/// The parts of `body`, delimited by `boundary`; `None` when it is not such a form.
pub fn parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delimiter = format!("--{boundary}");
    let finder = memmem::Finder::new(delimiter.as_bytes());
    // The first delimiter opens the body, or follows a preamble and its line end.
    let first = finder.find(body)?;
    if first != 0 && !body[..first].ends_with(b"\r\n") && !body[..first].ends_with(b"\n") {
        return None;
    }
    let mut at = first + delimiter.len();
    let mut parts = Vec::new();
    loop {
        let rest = body.get(at..)?;
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        let rest = skip_line_end(rest.trim_ascii_start_spaces())?;
        let head_end = memmem::find(rest, b"\r\n\r\n")
            .map(|n| (n, 4))
            .or_else(|| memmem::find(rest, b"\n\n").map(|n| (n, 2)))?;
        let head = std::str::from_utf8(&rest[..head_end.0]).ok()?;
        let content = &rest[head_end.0 + head_end.1..];
        // The part's content ends at the line end before the next delimiter.
        let end = finder.find_iter(content).find(|&n| content[..n].ends_with(b"\n"))?;
        let data = &content[..end];
        let data = data.strip_suffix(b"\r\n").or_else(|| data.strip_suffix(b"\n")).unwrap_or(data);
        let (name, filename) = disposition(head);
        parts.push(Part { name, filename, body: data });
        if parts.len() > MAX_PARTS {
            return None;
        }
        at = body.len() - content.len() + end + delimiter.len();
    }
}

trait TrimSpaces {
    fn trim_ascii_start_spaces(&self) -> &Self;
}

impl TrimSpaces for [u8] {
    /// Transport padding (spaces and tabs) may follow a delimiter before its line end.
    fn trim_ascii_start_spaces(&self) -> &[u8] {
        let n = self.iter().take_while(|b| matches!(b, b' ' | b'\t')).count();
        &self[n..]
    }
}

fn skip_line_end(rest: &[u8]) -> Option<&[u8]> {
    rest.strip_prefix(b"\r\n").or_else(|| rest.strip_prefix(b"\n"))
}

/// `name` and `filename` of a part's `Content-Disposition: form-data; ...` header.
fn disposition(head: &str) -> (Option<&str>, Option<&str>) {
    let Some(value) = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("content-disposition").then_some(value)
    }) else {
        return (None, None);
    };
    let param = |wanted: &str| {
        value.split(';').skip(1).find_map(|param| {
            let (name, value) = param.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case(wanted) {
                return None;
            }
            let value = value.trim();
            Some(value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value))
        })
    };
    (param("name"), param("filename"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A form as the `openai` Python SDK (httpx) sends it.
    const FORM: &[u8] = b"--b0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
Content-Type: application/octet-stream\r\n\r\n{\"a\":1}\n{\"b\":2}\n\r\n--b0undary--\r\n";

    #[test]
    fn boundaries_are_read_from_the_content_type() {
        assert_eq!(boundary("multipart/form-data; boundary=b0undary"), Some("b0undary"));
        assert_eq!(boundary("Multipart/Form-Data;charset=utf-8; Boundary=\"a b\""), Some("a b"));
        for not_a_form in [
            "application/json",
            "multipart/form-data",
            "multipart/mixed; boundary=x",
            "multipart/form-data; boundary=",
        ] {
            assert_eq!(boundary(not_a_form), None, "{not_a_form}");
        }
    }

    #[test]
    fn a_file_upload_reads_as_its_two_parts() {
        let parts = parts(FORM, "b0undary").expect("a form");
        assert_eq!(
            parts,
            [
                Part { name: Some("purpose"), filename: None, body: b"batch" },
                Part { name: Some("file"), filename: Some("in.jsonl"), body: b"{\"a\":1}\n{\"b\":2}\n" },
            ]
        );
    }

    #[test]
    fn what_is_not_a_form_reads_as_none() {
        assert_eq!(parts(b"", "b"), None);
        assert_eq!(parts(b"--b\r\nno head end", "b"), None);
        assert_eq!(parts(b"junk--b\r\n\r\nx\r\n--b--", "b"), None, "a delimiter must open a line");
        let unterminated = &FORM[..FORM.len() - 16];
        assert_eq!(parts(unterminated, "b0undary"), None);
    }

    proptest! {
        /// Whatever the bytes, reading them ends, without a panic, and every part is a slice of them.
        #[test]
        fn any_bytes_read_without_panicking(body in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..400) {
            let _ = parts(&body, "b");
            let cut = cut.min(FORM.len());
            let _ = parts(&FORM[..cut], "b0undary");
        }

        /// A file's bytes come back whole, whatever they hold but the delimiter itself.
        #[test]
        fn a_file_comes_back_as_sent(file in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assume!(memmem::find(&file, b"--zz").is_none());
            let mut form = b"--zz\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n".to_vec();
            form.extend_from_slice(&file);
            form.extend_from_slice(b"\r\n--zz--\r\n");
            let read = parts(&form, "zz").expect("a form");
            prop_assert_eq!(read.len(), 1);
            prop_assert_eq!(read[0].body, &file[..]);
        }
    }
}
