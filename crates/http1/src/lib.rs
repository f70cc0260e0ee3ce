//! HTTP/1.1 on the wire, without I/O: heads parsed into typed results, the rules both sides of the
//! gateway hold messages to (exactly one `Host`, one `Content-Length`, no transfer coding but
//! `chunked`), how a body is framed, chunked bodies decoded and encoded, and what to do with the
//! request at the start of a client's buffer (`classify`).
//!
//! The gateway's client connections (a request head read in place, its header values sharing the
//! read buffer) and its provider connections (a request head written, a response head and body
//! read) both go through this crate, so that a message means the same on either side. Nothing
//! here reads a clock or a socket: every function takes the bytes read so far, and gives the same
//! answer however those bytes were cut.

mod classify;
mod error;
mod framing;
mod request;
mod response;

use http::header::{HeaderMap, HeaderName};

pub use classify::{Classified, HTTP2_PREFACE, HandOver, Limits, Refusal, WholeRequest, classify};
pub use error::{ChunkError, Error, FramingError, HostError, RequestError};
pub use framing::{ChunkState, Decoder, Framing, MAX_CHUNK_LINE_BYTES, chunk_size_line, content_length};
pub use request::{
    HeadLayout, RequestFacts, RequestHead, ThroughProxy, parse_request, request_facts, request_head,
};
pub use response::{ResponseHead, final_head_in, parse_response, response_head};

/// The comma-separated elements of every `name` line, trimmed.
pub fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
}

/// Whether any `name` line lists `token` (case aside).
pub fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    tokens(headers, name).any(|t| t.eq_ignore_ascii_case(token))
}

/// `name: value` and its CRLF.
pub fn push_header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The comma-separated elements of one field value, trimmed, empty ones skipped (RFC 9110,
/// section 5.6.1: a recipient ignores them).
fn elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|element| !element.is_empty())
}

/// `wire` cut at `cuts` (any order, any values; past the end means the end), as reads would give
/// it: the property tests' way to say "any cut of the input".
#[cfg(test)]
pub(crate) fn cut_at(wire: &[u8], cuts: impl IntoIterator<Item = usize>) -> Vec<&[u8]> {
    let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(wire.len())).collect();
    cuts.sort_unstable();
    cuts.push(wire.len());
    let mut from = 0;
    cuts.into_iter()
        .map(|to| {
            let piece = &wire[from..to];
            from = to;
            piece
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use http::header;

    use super::*;

    #[test]
    fn tokens_are_read_across_lines_and_empty_elements_skipped() {
        let mut headers = HeaderMap::new();
        headers.append(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        headers.append(header::CONNECTION, HeaderValue::from_static(" close "));
        assert_eq!(
            tokens(&headers, &header::CONNECTION).collect::<Vec<_>>(),
            ["keep-alive", "Upgrade", "close"]
        );
        assert!(has_token(&headers, &header::CONNECTION, "upgrade"));
        assert!(!has_token(&headers, &header::CONNECTION, "te"));
        assert_eq!(elements(b" gzip,, chunked ,").collect::<Vec<_>>(), [&b"gzip"[..], b"chunked"]);
    }
}
