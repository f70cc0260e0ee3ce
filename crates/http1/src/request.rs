//! Requests: a head parsed in place (the gateway's client side), the rules it is held to, and a head
//! written (the gateway's provider side).

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use crate::error::{Error, HostError, RequestError};
use crate::framing::{CodingRule, Framing, LengthRule};
use crate::{elements, push_header};

/// A request head parsed in place: everything in it borrows the buffer it was read into.
#[derive(Debug)]
pub struct RequestHead<'b> {
    pub method: &'b str,
    pub target: &'b str,
    /// `HTTP_10` or `HTTP_11`: the only versions a request line may name.
    pub version: Version,
    pub lines: &'b [httparse::Header<'b>],
    /// The head's length, its empty line included: where the body starts.
    pub length: usize,
    /// What was parsed, so that the head's parts can be found in it again.
    parsed: &'b [u8],
}

/// The request head at the start of `buf`; `None` while it is incomplete. Only the first
/// `max_bytes` of `buf` are read, so that a head longer than that is [`Error::HeadTooLong`]
/// however its bytes arrived; one with more lines than `lines` holds is
/// `Malformed(TooManyHeaders)`.
pub fn parse_request<'b>(
    buf: &'b [u8],
    lines: &'b mut [MaybeUninit<httparse::Header<'b>>],
    max_bytes: usize,
) -> Result<Option<RequestHead<'b>>, Error> {
    let parsed = &buf[..buf.len().min(max_bytes)];
    let mut request = httparse::Request::new(&mut []);
    let length = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        parsed,
        lines,
    ) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if parsed.len() < max_bytes => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(Error::HeadTooLong),
        Err(e) => return Err(Error::Malformed(e)),
    };
    // A complete parse sets all three.
    let (Some(method), Some(target), Some(minor)) = (request.method, request.path, request.version) else {
        return Err(Error::Malformed(httparse::Error::Version));
    };
    let version = if minor == 0 { Version::HTTP_10 } else { Version::HTTP_11 };
    Ok(Some(RequestHead { method, target, version, lines: request.headers, length, parsed }))
}

impl<'b> RequestHead<'b> {
    /// What the head says of its body and connection, under the rules requests are held to.
    pub fn facts(&self) -> Result<RequestFacts, RequestError> {
        request_facts(self.version, self.lines.iter().map(|line| (line.name.as_bytes(), line.value)))
    }

    /// Where the target and each line lie in the head, so that they can share its bytes once the
    /// head is split off the buffer (they borrow it until then).
    pub fn layout(&self) -> HeadLayout {
        let base = self.parsed.as_ptr() as usize;
        let at = |part: &[u8]| part.as_ptr() as usize - base;
        let lines = self
            .lines
            .iter()
            .map(|line| {
                let (name, value) = (at(line.name.as_bytes()), at(line.value));
                [name, name + line.name.len(), value, value + line.value.len()]
            })
            .collect();
        let target = at(self.target.as_bytes());
        HeadLayout { target: target..target + self.target.len(), lines }
    }
}

/// Where a head's target and lines lie: offsets from its first byte (name start, name end, value
/// start, value end for each line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadLayout {
    target: Range<usize>,
    lines: Vec<[usize; 4]>,
}

impl HeadLayout {
    /// The target of `head` (the bytes the layout was taken from), sharing them.
    pub fn target(&self, head: &Bytes) -> Result<Uri, Error> {
        Uri::from_maybe_shared(head.slice(self.target.clone())).map_err(|_| Error::Target)
    }

    /// The header lines of `head`, their values sharing its bytes.
    pub fn headers(&self, head: &Bytes) -> Result<HeaderMap, Error> {
        header_map(head, &self.lines)
    }

    /// The target's bytes in `head` (the bytes the layout was taken from, or a buffer that starts
    /// with them), unchecked.
    pub fn raw_target<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.target.clone()]
    }

    /// The header lines' names in `head`, in order, unchecked.
    pub fn names<'h>(&'h self, head: &'h [u8]) -> impl Iterator<Item = &'h [u8]> {
        self.lines.iter().map(move |&[start, end, _, _]| &head[start..end])
    }
}

/// The header lines at `spans` of `head`, their values sharing its bytes.
pub(crate) fn header_map(head: &Bytes, spans: &[[usize; 4]]) -> Result<HeaderMap, Error> {
    let mut headers = HeaderMap::with_capacity(spans.len());
    for &[name_start, name_end, value_start, value_end] in spans {
        let name = HeaderName::from_bytes(&head[name_start..name_end]).map_err(|_| Error::Header)?;
        let value =
            HeaderValue::from_maybe_shared(head.slice(value_start..value_end)).map_err(|_| Error::Header)?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// What a request head says of its body and its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// `None`, `Length` or `Chunked`: a request body never runs until the connection closes.
    pub framing: Framing,
    /// The connection ends after the answer: the client asks so, or speaks HTTP/1.0 without
    /// `keep-alive`, or framed its body both ways (RFC 9112, section 6.3: the length is ignored and
    /// the connection closed after).
    pub close: bool,
    /// An `Expect` line.
    pub expect: bool,
    /// An `Upgrade` line, or `upgrade` in `Connection`.
    pub upgrade: bool,
}

/// The rules a request head is held to, over its header lines (name, value) in order: exactly one
/// valid `Host` in HTTP/1.1 (at most one in HTTP/1.0), the one `Content-Length` rule, no transfer
/// coding but `chunked`. A `Transfer-Encoding` makes any `Content-Length` moot, as hyper's server
/// and RFC 9112 read it. Both the gateway's own parser and the requests hyper parsed for it go
/// through this one function.
pub fn request_facts<'a>(
    version: Version,
    lines: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<RequestFacts, RequestError> {
    let mut hosts = 0u32;
    let mut host_valid = true;
    let mut length = LengthRule::default();
    let mut codings = CodingRule::default();
    let (mut close, mut keep_alive, mut expect, mut upgrade) = (false, false, false, false);
    // Most lines are none of these: their length alone says so.
    for (name, value) in lines {
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                hosts = hosts.saturating_add(1);
                host_valid &= is_host(value);
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => length.line(value),
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => codings.line(value),
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for option in elements(value) {
                    close |= option.eq_ignore_ascii_case(b"close");
                    keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
                    upgrade |= option.eq_ignore_ascii_case(b"upgrade");
                }
            }
            6 if name.eq_ignore_ascii_case(b"expect") => expect = true,
            7 if name.eq_ignore_ascii_case(b"upgrade") => upgrade = true,
            _ => {}
        }
    }
    match hosts {
        0 if version == Version::HTTP_11 => return Err(HostError::Missing.into()),
        0 => {}
        1 if host_valid => {}
        1 => return Err(HostError::Invalid.into()),
        _ => return Err(HostError::Repeated.into()),
    }
    let framing = if codings.finish()? {
        close |= length.is_present();
        Framing::Chunked
    } else {
        length.finish()?.map_or(Framing::None, Framing::Length)
    };
    close |= version == Version::HTTP_10 && !keep_alive;
    Ok(RequestFacts { framing, close, expect, upgrade })
}

/// Whether a `Host` value is `uri-host [ ":" port ]` (RFC 9110, section 7.2; RFC 3986, section
/// 3.2.2): an IP literal in brackets, or a registered name or IPv4 address (unreserved characters,
/// percent escapes, sub-delimiters; empty allowed), then an optional port of digits. One pass over
/// the bytes: every request's `Host` goes through it.
fn is_host(value: &[u8]) -> bool {
    if let Some(literal) = value.strip_prefix(b"[") {
        let Some(end) = literal.iter().position(|&b| b == b']') else { return false };
        let inside = &literal[..end];
        // `%` for an IPv6 zone (`[fe80::1%25en0]`, RFC 6874).
        if inside.is_empty() || !inside.iter().all(|&b| HOST_BYTES[usize::from(b)] || b == b':' || b == b'%')
        {
            return false;
        }
        return match literal[end + 1..].split_first() {
            None => true,
            Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
            Some(_) => false,
        };
    }
    let mut rest = value;
    while let Some((&b, tail)) = rest.split_first() {
        rest = match b {
            b if HOST_BYTES[usize::from(b)] => tail,
            b'%' => match tail {
                [high, low, tail @ ..] if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => tail,
                _ => return false,
            },
            b':' => return tail.iter().all(u8::is_ascii_digit),
            _ => return false,
        };
    }
    true
}

/// The unreserved characters and sub-delimiters of RFC 3986: what a registered name is made of
/// besides percent escapes. A table, because every request's `Host` is checked byte by byte.
const HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = is_unreserved(b as u8) || is_sub_delim(b as u8);
        b += 1;
    }
    table
};

const fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

/// A request sent to an egress proxy rather than to the provider: it names its target whole
/// (absolute form, RFC 9112 §3.2.2) and shows the proxy its credentials, if any.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThroughProxy<'a> {
    /// The `Proxy-Authorization` value.
    pub authorization: Option<&'a HeaderValue>,
}

/// The head of `request` as the gateway sends it to a provider: `METHOD /path?query HTTP/1.1` (or,
/// `through_proxy`, `METHOD scheme://authority/path?query HTTP/1.1`), its headers (`host` when it
/// has none: `host` is then the line), and a `Content-Length` of the body's own in place of any
/// framing it came with (the body is always sent whole).
pub fn request_head(
    request: &Request<Bytes>,
    host: &HeaderValue,
    through_proxy: Option<ThroughProxy<'_>>,
) -> Vec<u8> {
    let headers = request.headers();
    let mut out = Vec::with_capacity(256 + headers.len() * 48);
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    if through_proxy.is_some()
        && let (Some(scheme), Some(authority)) = (request.uri().scheme(), request.uri().authority())
    {
        out.extend_from_slice(scheme.as_str().as_bytes());
        out.extend_from_slice(b"://");
        out.extend_from_slice(authority.as_str().as_bytes());
    }
    // `path()` is never empty: `/` stands in for a URI with none (`https://host?x=1`).
    out.extend_from_slice(request.uri().path().as_bytes());
    if let Some(query) = request.uri().query() {
        out.push(b'?');
        out.extend_from_slice(query.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if !headers.contains_key(header::HOST) {
        push_header(&mut out, header::HOST.as_str(), host.as_bytes());
    }
    let mut had_length = false;
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            had_length = true;
            continue;
        }
        push_header(&mut out, name.as_str(), value.as_bytes());
    }
    if let Some(ThroughProxy { authorization: Some(authorization) }) = through_proxy {
        push_header(&mut out, "proxy-authorization", authorization.as_bytes());
    }
    let body = request.body();
    let method = request.method();
    if had_length || !body.is_empty() || [Method::POST, Method::PUT, Method::PATCH].contains(method) {
        let mut digits = itoa::Buffer::new();
        push_header(&mut out, header::CONTENT_LENGTH.as_str(), digits.format(body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::error::FramingError;

    const MAX_BYTES: usize = 1024;

    /// What reading a request off `pieces` gave: the head's parts as text, its facts, and its
    /// length; `Ok(None)` if it never completed.
    type Read = Result<Option<(String, Result<RequestFacts, RequestError>, usize)>, Error>;

    fn read(pieces: &[&[u8]]) -> Read {
        let mut buf = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            let mut lines = [const { MaybeUninit::uninit() }; 8];
            if let Some(head) = parse_request(&buf, &mut lines, MAX_BYTES)? {
                let text = format!("{} {} {:?} {:?}", head.method, head.target, head.version, head.lines);
                return Ok(Some((text, head.facts(), head.length)));
            }
        }
        Ok(None)
    }

    fn facts(head: &str) -> Result<RequestFacts, RequestError> {
        let mut lines = [const { MaybeUninit::uninit() }; 16];
        parse_request(head.as_bytes(), &mut lines, MAX_BYTES).expect("parses").expect("complete").facts()
    }

    fn framed(framing: Framing, close: bool) -> Result<RequestFacts, RequestError> {
        Ok(RequestFacts { framing, close, expect: false, upgrade: false })
    }

    #[test]
    fn a_request_has_exactly_one_valid_host_in_http_1_1() {
        assert_eq!(facts("GET / HTTP/1.1\r\nhost: a\r\n\r\n"), framed(Framing::None, false));
        assert_eq!(facts("GET / HTTP/1.1\r\n\r\n"), Err(RequestError::Host(HostError::Missing)));
        assert_eq!(
            facts("GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"),
            Err(RequestError::Host(HostError::Repeated))
        );
        assert_eq!(facts("GET / HTTP/1.0\r\n\r\n"), framed(Framing::None, true), "HTTP/1.0 may leave it out");
        assert_eq!(
            facts("GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n"),
            Err(RequestError::Host(HostError::Repeated))
        );
        for valid in [
            "",
            "a",
            "example.com:8080",
            "127.0.0.1:80",
            "[::1]:9",
            "[v1.x]",
            "[fe80::1%25en0]:80",
            "my_host.local",
            "a%2Db",
            ":80",
            "xn--bcher-kva.example",
        ] {
            assert!(is_host(valid.as_bytes()), "{valid:?}");
        }
        for invalid in
            ["a b", "user@host", "a:b", "host:80:90", "[::1", "[]", "[::1]x", "a%2", "a/b", "a\tb", "é"]
        {
            assert!(!is_host(invalid.as_bytes()), "{invalid:?}");
            assert_eq!(
                facts(&format!("GET / HTTP/1.1\r\nhost: {invalid}\r\n\r\n")),
                Err(RequestError::Host(HostError::Invalid)),
                "{invalid:?}"
            );
        }
    }

    #[test]
    fn the_body_is_framed_by_one_length_or_by_chunks_alone() {
        let head = |lines: &str| facts(&format!("POST / HTTP/1.1\r\nhost: a\r\n{lines}\r\n"));
        assert_eq!(head("content-length: 5\r\n"), framed(Framing::Length(5), false));
        assert_eq!(head("transfer-encoding: chunked\r\n"), framed(Framing::Chunked, false));
        assert_eq!(
            head("content-length: 5\r\ntransfer-encoding: chunked\r\n"),
            framed(Framing::Chunked, true),
            "the length is moot, and the connection closes after"
        );
        assert_eq!(
            head("content-length: 5, 5\r\n"),
            Err(RequestError::Framing(FramingError::LengthRepeated))
        );
        assert_eq!(
            head("content-length: 5\r\ncontent-length: 5\r\n"),
            Err(RequestError::Framing(FramingError::LengthRepeated))
        );
        assert_eq!(head("content-length: +5\r\n"), Err(RequestError::Framing(FramingError::LengthInvalid)));
        for coding in ["gzip, chunked", "identity, chunked"] {
            assert_eq!(
                head(&format!("transfer-encoding: {coding}\r\n")),
                Err(RequestError::Framing(FramingError::CodingUnsupported))
            );
        }
        assert_eq!(
            head("transfer-encoding: chunked, gzip\r\n"),
            Err(RequestError::Framing(FramingError::ChunkedNotLast))
        );
        assert_eq!(
            head("transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n"),
            Err(RequestError::Framing(FramingError::ChunkedRepeated))
        );
    }

    #[test]
    fn the_head_says_whether_the_connection_closes_and_what_else_it_asks() {
        let head = |version: &str, lines: &str| facts(&format!("GET / {version}\r\nhost: a\r\n{lines}\r\n"));
        assert_eq!(head("HTTP/1.1", "connection: keep-alive, Close\r\n"), framed(Framing::None, true));
        assert_eq!(head("HTTP/1.0", "connection: keep-alive\r\n"), framed(Framing::None, false));
        assert_eq!(head("HTTP/1.0", ""), framed(Framing::None, true));
        let expecting = head("HTTP/1.1", "Expect: 100-continue\r\n").expect("valid");
        assert!(expecting.expect && !expecting.upgrade);
        for upgrade in
            ["connection: upgrade\r\nupgrade: websocket\r\n", "upgrade: h2c\r\n", "connection: Upgrade\r\n"]
        {
            assert!(head("HTTP/1.1", upgrade).expect("valid").upgrade, "{upgrade:?}");
        }
    }

    #[test]
    fn the_layout_finds_the_target_and_lines_in_the_split_off_head() {
        let wire = b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: a\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\nbody";
        let mut lines = [const { MaybeUninit::uninit() }; 8];
        let head = parse_request(wire, &mut lines, MAX_BYTES).expect("parses").expect("complete");
        assert_eq!((head.method, head.version, head.length), ("POST", Version::HTTP_11, wire.len() - 4));
        let layout = head.layout();
        let bytes = Bytes::copy_from_slice(&wire[..head.length]);
        assert_eq!(layout.target(&bytes).expect("uri"), "/v1/chat?x=1");
        let headers = layout.headers(&bytes).expect("headers");
        assert_eq!(headers["host"], "a");
        assert_eq!(headers.get_all("x-multi").iter().collect::<Vec<_>>(), ["1", "2"]);
        // httparse takes a backquote in a target, `http` does not.
        let bad = b"GET /a`b HTTP/1.1\r\nhost: a\r\n\r\n";
        let mut lines = [const { MaybeUninit::uninit() }; 8];
        let head = parse_request(bad, &mut lines, MAX_BYTES).expect("parses").expect("complete");
        assert_eq!(head.layout().target(&Bytes::copy_from_slice(bad)).map(|_| ()), Err(Error::Target));
    }

    #[test]
    fn a_head_too_long_or_with_too_many_lines_is_an_error_however_it_is_cut() {
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(MAX_BYTES));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "a: b\r\n".repeat(9));
        for (wire, error) in [
            (long.as_bytes(), Error::HeadTooLong),
            (many.as_bytes(), Error::Malformed(httparse::Error::TooManyHeaders)),
            (b"GET /a b HTTP/1.1\r\n\r\n", Error::Malformed(httparse::Error::Version)),
        ] {
            assert_eq!(read(&[wire]), Err(error));
            assert_eq!(read(&wire.chunks(7).collect::<Vec<_>>()), Err(error));
        }
        let mut lines = [const { MaybeUninit::uninit() }; 8];
        let exact = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(MAX_BYTES - 23));
        assert_eq!(exact.len(), MAX_BYTES);
        assert!(parse_request(exact.as_bytes(), &mut lines, MAX_BYTES).expect("fits").is_some());
    }

    proptest! {
        /// A request head, whole or cut anywhere, reads the same: the same parts, facts and length.
        #[test]
        fn a_request_head_reads_alike_however_it_is_cut(
            method in prop_oneof![Just("GET"), Just("POST"), Just("HEAD"), Just("BREW")],
            target in "/[a-z0-9/?=&%]{0,30}",
            minor in 0u8..2,
            lines in proptest::collection::vec(
                (
                    prop_oneof![Just("host"), Just("Content-Length"), Just("transfer-encoding"), Just("connection"), Just("x-a")],
                    "[ -~]{0,20}",
                ),
                0..10,
            ),
            body in proptest::collection::vec(any::<u8>(), 0..40),
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let mut wire = format!("{method} {target} HTTP/1.{minor}\r\n").into_bytes();
            for (name, value) in &lines {
                wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&body);
            let pieces = crate::cut_at(&wire, cuts);
            let whole = read(&[&wire]);
            prop_assert!(matches!(whole, Ok(Some(_)) | Err(_)), "a whole head is complete: {whole:?}");
            prop_assert_eq!(read(&pieces), whole);
        }
    }

    #[test]
    fn a_request_through_an_egress_proxy_names_its_target_whole_and_shows_the_credentials() {
        let post = Request::post("http://10.0.0.5:8000/v1/chat?x=1")
            .body(Bytes::from_static(b"{}"))
            .expect("request");
        let host = HeaderValue::from_static("10.0.0.5:8000");
        let credentials = HeaderValue::from_static("Basic dTpw");
        let proxy = ThroughProxy { authorization: Some(&credentials) };
        assert_eq!(
            String::from_utf8(request_head(&post, &host, Some(proxy))).expect("text"),
            "POST http://10.0.0.5:8000/v1/chat?x=1 HTTP/1.1\r\nhost: 10.0.0.5:8000\r\n\
             proxy-authorization: Basic dTpw\r\ncontent-length: 2\r\n\r\n"
        );
    }

    #[test]
    fn the_provider_request_head_carries_host_and_the_body_length() {
        let post = Request::post("http://127.0.0.1:9/v1/chat?x=1")
            .header("authorization", "Bearer sk")
            .header("content-length", "999")
            .header("transfer-encoding", "chunked")
            .body(Bytes::from_static(b"{}"))
            .expect("request");
        let host = HeaderValue::from_static("127.0.0.1:9");
        assert_eq!(
            String::from_utf8(request_head(&post, &host, None)).expect("text"),
            "POST /v1/chat?x=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\nauthorization: Bearer sk\r\ncontent-length: 2\r\n\r\n"
        );
        let get =
            Request::get("http://h/v1/models").header("host", "other").body(Bytes::new()).expect("request");
        assert_eq!(
            String::from_utf8(request_head(&get, &host, None)).expect("text"),
            "GET /v1/models HTTP/1.1\r\nhost: other\r\n\r\n"
        );
        let query_only = Request::get("http://h?x=1").body(Bytes::new()).expect("request");
        assert!(
            String::from_utf8(request_head(&query_only, &host, None))
                .expect("text")
                .starts_with("GET /?x=1 HTTP/1.1\r\n")
        );
        let empty_post = Request::post("http://h/x").body(Bytes::new()).expect("request");
        assert!(
            String::from_utf8(request_head(&empty_post, &host, None))
                .expect("text")
                .ends_with("content-length: 0\r\n\r\n")
        );
    }
}
