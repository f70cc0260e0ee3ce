//! Responses: a head read (the gateway's provider side, interim heads skipped) and a head written
//! (the gateway's client side).

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{self, HeaderMap};
use http::{Method, Response, StatusCode, Version};

use crate::error::{Error, FramingError};
use crate::framing::{CodingRule, Framing, LengthRule};
use crate::request::header_map;
use crate::{has_token, push_header};

/// A final response head, its header values sharing the bytes it was read from.
#[derive(Debug)]
pub struct ResponseHead {
    pub parts: http::response::Parts,
    pub framing: Framing,
    /// Whether the connection can carry another request once the body is read.
    pub keep_alive: bool,
}

/// The final response head at the start of `buf` (an answer to `method`), taken off it; `None`
/// while it is incomplete. Interim (1xx) heads before it are taken off and dropped. At most
/// `LINES` header lines and, as for requests, only the first `max_bytes` of each head are read.
pub fn parse_response<const LINES: usize>(
    buf: &mut BytesMut,
    method: &Method,
    max_bytes: usize,
) -> Result<Option<ResponseHead>, Error> {
    loop {
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; LINES];
        let mut parsed = httparse::Response::new(&mut []);
        let window = &buf[..buf.len().min(max_bytes)];
        let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            window,
            &mut lines,
        ) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if window.len() < max_bytes => return Ok(None),
            Ok(httparse::Status::Partial) => return Err(Error::HeadTooLong),
            Err(e) => return Err(Error::Malformed(e)),
        };
        let code = parsed.code.unwrap_or(0);
        if code == 101 {
            return Err(Error::SwitchingProtocols);
        }
        if is_interim(code) {
            let _ = buf.split_to(length);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| Error::Status)?;
        let version = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
        let base = window.as_ptr() as usize;
        let spans: Vec<[usize; 4]> = parsed
            .headers
            .iter()
            .map(|line| {
                let name = line.name.as_ptr() as usize - base;
                let value = line.value.as_ptr() as usize - base;
                [name, name + line.name.len(), value, value + line.value.len()]
            })
            .collect();
        let head = buf.split_to(length).freeze();
        let mut headers = header_map(&head, &spans)?;
        let framing = response_framing(method, status, &headers)?;
        // Both framings at once is how responses are split (RFC 9112, section 6.3): the body is
        // read as chunked, the length the client would be told is dropped, and the connection is
        // not trusted with another request.
        let both =
            headers.contains_key(header::TRANSFER_ENCODING) && headers.contains_key(header::CONTENT_LENGTH);
        if both {
            headers.remove(header::CONTENT_LENGTH);
        }
        let keep_alive = version == Version::HTTP_11
            && !both
            && framing != Framing::UntilClose
            && !has_token(&headers, &header::CONNECTION, "close");
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        return Ok(Some(ResponseHead { parts: response.into_parts().0, framing, keep_alive }));
    }
}

/// Whether [`parse_response`] would give something other than `Ok(None)` for `buf`: a final head
/// is there (after any interim ones), or something that is not one, or a head too long. Takes
/// nothing off `buf`.
pub fn final_head_in<const LINES: usize>(mut buf: &[u8], max_bytes: usize) -> bool {
    loop {
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; LINES];
        let mut parsed = httparse::Response::new(&mut []);
        let window = &buf[..buf.len().min(max_bytes)];
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            window,
            &mut lines,
        ) {
            Ok(httparse::Status::Complete(length)) if parsed.code.is_some_and(is_interim) => {
                buf = &buf[length..];
            }
            Ok(httparse::Status::Complete(_)) | Err(_) => return true,
            Ok(httparse::Status::Partial) => return window.len() >= max_bytes,
        }
    }
}

/// A 1xx head other than 101: one that a final head follows.
fn is_interim(code: u16) -> bool {
    (100..200).contains(&code) && code != 101
}

/// How the answer's body is delimited (RFC 9112, section 6.3), under the same `Content-Length` and
/// transfer-coding rules as requests.
fn response_framing(
    method: &Method,
    status: StatusCode,
    headers: &HeaderMap,
) -> Result<Framing, FramingError> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::None);
    }
    let mut codings = CodingRule::default();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        codings.line(value.as_bytes());
    }
    if codings.finish()? {
        return Ok(Framing::Chunked);
    }
    let mut length = LengthRule::default();
    for value in headers.get_all(header::CONTENT_LENGTH) {
        length.line(value.as_bytes());
    }
    Ok(length.finish()?.map_or(Framing::UntilClose, Framing::Length))
}

/// The status line and headers of an answer the gateway writes, with its framing (`framing`
/// decides: a `Content-Length` or `Transfer-Encoding` among `parts` is dropped), `Connection:
/// close` when the connection ends after it, and `date` unless `parts` has one. The order is
/// hyper's, so that both of the gateway's ways of answering write the same bytes.
pub fn response_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    framing: Framing,
    close: bool,
    date: &[u8],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            push_header(out, name.as_str(), value.as_bytes());
        }
    }
    if close && !has_token(&parts.headers, &header::CONNECTION, "close") {
        push_header(out, "connection", b"close");
    }
    match framing {
        Framing::Length(length) => {
            push_header(out, "content-length", itoa::Buffer::new().format(length).as_bytes());
        }
        Framing::Chunked => push_header(out, "transfer-encoding", b"chunked"),
        Framing::None | Framing::UntilClose => {}
    }
    if !parts.headers.contains_key(header::DATE) {
        push_header(out, "date", date);
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::framing::Decoder;

    const LINES: usize = 16;
    const MAX_BYTES: usize = 1024;

    fn head(wire: &str, method: Method) -> Result<Option<ResponseHead>, Error> {
        parse_response::<LINES>(&mut BytesMut::from(wire.as_bytes()), &method, MAX_BYTES)
    }

    #[test]
    fn the_head_says_how_the_body_ends_and_whether_the_connection_is_kept() {
        let cases = [
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::POST, Framing::Length(5), true),
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Method::POST, Framing::Length(0), true),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::HEAD, Framing::None, true),
            ("HTTP/1.1 204 No Content\r\n\r\n", Method::POST, Framing::None, true),
            ("HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n", Method::GET, Framing::None, true),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
                Method::POST,
                Framing::Chunked,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", Method::POST, Framing::UntilClose, false),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: Close\r\n\r\n",
                Method::POST,
                Framing::Length(5),
                false,
            ),
            ("HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n", Method::POST, Framing::Length(5), false),
            (
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\n",
                Method::POST,
                Framing::Length(5),
                true,
            ),
        ];
        for (wire, method, framing, keep_alive) in cases {
            let read = head(wire, method).expect("valid").expect("complete");
            assert_eq!((read.framing, read.keep_alive), (framing, keep_alive), "{wire:?}");
        }
        let read = head(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nx-request-id: abc\r\nX-Multi: a\r\nx-multi: b\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\nhi",
            Method::POST,
        )
        .expect("valid")
        .expect("complete");
        assert_eq!(read.parts.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(read.parts.headers["x-request-id"], "abc");
        assert_eq!(read.parts.headers.get_all("x-multi").iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(!read.parts.headers.contains_key("content-length"), "a length beside chunks is dropped");
    }

    #[test]
    fn a_head_is_incomplete_until_its_empty_line_and_broken_ones_are_errors() {
        assert!(head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n", Method::POST).expect("valid").is_none());
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "a: b\r\n".repeat(LINES + 1));
        let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_BYTES));
        for (wire, error) in [
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                Error::Framing(FramingError::LengthRepeated),
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", Error::Framing(FramingError::LengthRepeated)),
            ("HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n", Error::Framing(FramingError::LengthInvalid)),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5x\r\n\r\n", Error::Framing(FramingError::LengthInvalid)),
            ("HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n", Error::Framing(FramingError::LengthInvalid)),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                Error::Framing(FramingError::ChunkedNotLast),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                Error::Framing(FramingError::CodingUnsupported),
            ),
            ("HTTP/1.1 2000 OK\r\n\r\n", Error::Malformed(httparse::Error::Status)),
            ("HTTP/1.1 200 OK\r\nbad header\r\n\r\n", Error::Malformed(httparse::Error::HeaderName)),
            (
                "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
                Error::SwitchingProtocols,
            ),
            (&many, Error::Malformed(httparse::Error::TooManyHeaders)),
            (&long, Error::HeadTooLong),
        ] {
            assert_eq!(head(wire, Method::POST).map(|_| ()), Err(error), "{wire:?}");
        }
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"[..]);
        parse_response::<LINES>(&mut buf, &Method::GET, MAX_BYTES).expect("valid").expect("complete");
        assert_eq!(&buf[..], b"hi", "the body stays in the buffer");
    }

    #[test]
    fn a_final_head_is_seen_past_interim_ones_without_taking_anything() {
        assert!(!final_head_in::<LINES>(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2", MAX_BYTES));
        assert!(final_head_in::<LINES>(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 X\r\n\r\n", MAX_BYTES));
        assert!(final_head_in::<LINES>(b"garbage\r\n", MAX_BYTES), "not a head: reading it says so");
        assert!(final_head_in::<LINES>(
            format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_BYTES)).as_bytes(),
            MAX_BYTES
        ));
    }

    #[test]
    fn the_answer_head_is_written_in_hypers_order() {
        let mut response = Response::new(());
        response.headers_mut().insert("content-type", "application/json".parse().expect("value"));
        response.headers_mut().insert("content-length", "99".parse().expect("value"));
        let (parts, ()) = response.into_parts();
        let mut out = Vec::new();
        response_head(&mut out, &parts, Framing::Length(2), true, b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            String::from_utf8(out).expect("text"),
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 2\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\n"
        );
        let mut out = Vec::new();
        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::NO_CONTENT;
        parts.headers.insert("date", "then".parse().expect("value"));
        response_head(&mut out, &parts, Framing::None, false, b"now");
        assert_eq!(String::from_utf8(out).expect("text"), "HTTP/1.1 204 No Content\r\ndate: then\r\n\r\n");
    }

    /// What reading a response off `pieces` gave: its head (as text, `None` if it never completed),
    /// then its body's data and how the body ended.
    type Read = (Result<Option<String>, Error>, Vec<u8>, Result<Decoder, crate::ChunkError>);

    fn read(method: &Method, pieces: &[&[u8]]) -> Read {
        let mut buf = BytesMut::new();
        let mut pieces = pieces.iter();
        let head = loop {
            match parse_response::<LINES>(&mut buf, method, MAX_BYTES) {
                Ok(Some(head)) => break head,
                Ok(None) => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return (Ok(None), Vec::new(), Ok(Decoder::Done)),
                },
                Err(e) => return (Err(e), Vec::new(), Ok(Decoder::Done)),
            }
        };
        let text = format!(
            "{:?} {:?} {:?} {:?}",
            head.parts.status, head.parts.headers, head.framing, head.keep_alive
        );
        let mut decoder = Decoder::new(head.framing);
        let mut data = Vec::new();
        loop {
            loop {
                if let Err(e) = decoder.skip_framing(&mut buf) {
                    return (Ok(Some(text)), data, Err(e));
                }
                match decoder.take_data(&mut buf) {
                    Some(piece) => data.extend_from_slice(&piece),
                    None => break,
                }
            }
            if decoder.is_done() {
                return (Ok(Some(text)), data, Ok(decoder));
            }
            match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return (Ok(Some(text)), data, Ok(decoder)),
            }
        }
    }

    proptest! {
        /// A response, whole or cut anywhere, reads the same: head, data and end.
        #[test]
        fn a_response_reads_alike_however_it_is_cut(
            interim in any::<bool>(),
            status in prop_oneof![Just(200u16), Just(204), Just(404), Just(500)],
            lines in proptest::collection::vec(
                prop_oneof![
                    Just("content-length: 5".to_owned()),
                    Just("transfer-encoding: chunked".to_owned()),
                    Just("connection: close".to_owned()),
                    "x-[a-z]{1,5}: [ -~]{0,12}",
                ],
                0..5,
            ),
            body in prop_oneof![
                Just(b"hello".to_vec()),
                Just(b"5\r\nhello\r\n0\r\n\r\n".to_vec()),
                Just(b"5\r\nhel".to_vec()),
                Just(b"zz\r\n".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..30),
            ],
            head_method in any::<bool>(),
            cuts in proptest::collection::vec(0usize..300, 0..8),
        ) {
            let mut wire = Vec::new();
            if interim {
                wire.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            wire.extend_from_slice(format!("HTTP/1.1 {status} X\r\n").as_bytes());
            for line in &lines {
                wire.extend_from_slice(format!("{line}\r\n").as_bytes());
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&body);
            let method = if head_method { Method::HEAD } else { Method::POST };
            let pieces = crate::cut_at(&wire, cuts);
            prop_assert_eq!(read(&method, &pieces), read(&method, &[&wire]));
            for end in 0..=wire.len() {
                let mut buf = BytesMut::from(&wire[..end]);
                let parsed = parse_response::<LINES>(&mut buf, &method, MAX_BYTES);
                prop_assert_eq!(final_head_in::<LINES>(&wire[..end], MAX_BYTES), !matches!(parsed, Ok(None)));
            }
        }
    }

    #[test]
    fn header_values_share_the_bytes_they_were_read_from() {
        let wire = Bytes::from_static(b"HTTP/1.1 200 OK\r\nx-a: shared\r\n\r\n");
        let mut buf = BytesMut::from(&wire[..]);
        let start = buf.as_ptr() as usize;
        let read =
            parse_response::<LINES>(&mut buf, &Method::GET, MAX_BYTES).expect("valid").expect("complete");
        let value = read.parts.headers["x-a"].as_bytes().as_ptr() as usize;
        assert_eq!(value - start, 22, "the value points into the buffer, not a copy");
    }
}
