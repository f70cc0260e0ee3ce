//! What the client's connections ([`crate::server::h1`]) take from HTTP/1.1 besides the codec
//! (`recovea_http1`), which the providers' connections ([`crate::upstream::h1`]) already use.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::proxy::BoxError;

/// Where one header line's name and value lie in a head: offsets from its first byte.
pub(crate) type Span = [usize; 4];

/// The spans of `lines`, which `httparse` parsed out of `head`, so that the header values can
/// share the head's bytes once it is split off the read buffer (the lines borrow the buffer).
pub(crate) fn line_spans(head: &[u8], lines: &[httparse::Header<'_>]) -> Vec<Span> {
    let base = head.as_ptr() as usize;
    lines
        .iter()
        .map(|line| {
            let name = line.name.as_ptr() as usize - base;
            let value = line.value.as_ptr() as usize - base;
            [name, name + line.name.len(), value, value + line.value.len()]
        })
        .collect()
}

/// The header lines of `head` at `spans`, their values sharing its bytes.
pub(crate) fn header_map(head: &Bytes, spans: &[Span]) -> Result<HeaderMap, BoxError> {
    let mut headers = HeaderMap::with_capacity(spans.len());
    for &[name_start, name_end, value_start, value_end] in spans {
        let name = HeaderName::from_bytes(&head[name_start..name_end])?;
        let value = HeaderValue::from_maybe_shared(head.slice(value_start..value_end))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The comma-separated tokens of every `name` line, trimmed.
pub(crate) fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
}

pub(crate) fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    tokens(headers, name).any(|t| t.eq_ignore_ascii_case(token))
}

pub(crate) fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}
