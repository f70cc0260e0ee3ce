//! HTTP/1.1 to a provider, on the request's own task. The future that awaits the answer writes the
//! request and reads the response head; the response body reads the rest as the client's connection
//! polls it, and gives the connection back to its pool once the answer is read. A general-purpose
//! client drives each connection from a task of its own, with a channel and a wake-up between that
//! task and the request's at every step: here there is none.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::Home;
use super::connect::Io;
use crate::http1::{has_token, header_map, last_token_is, line_spans, push_header};
use crate::proxy::BoxError;

/// A response head longer than this is refused.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// The most header lines a response head may have.
const MAX_HEADERS: usize = 128;
/// Each read asks for at least this much room.
const READ_BYTES: usize = 16 << 10;
/// A request body at most this long goes out in the same write as its head.
const JOIN_BODY_BYTES: usize = 16 << 10;

/// An HTTP/1.1 connection between two requests.
pub(super) struct Connection {
    io: Io,
    /// Read but not yet used: always empty between two requests.
    buf: BytesMut,
    pub(super) idle_since: Instant,
    /// Set on a connection to an egress proxy: requests name their target in absolute form.
    via_proxy: Option<ViaProxy>,
}

/// What requests through an egress proxy carry for it.
struct ViaProxy {
    /// `Proxy-Authorization`, from the proxy URL's credentials.
    authorization: Option<HeaderValue>,
}

/// Why an exchange failed.
pub(super) enum Failure {
    /// The request could not be written: on a connection reused from the pool, the provider most
    /// likely closed it meanwhile, and the request may go on a new one.
    Unwritten(io::Error),
    /// Written whole, and the connection closed (or was reset) before any byte of an answer.
    Silent(BoxError),
    /// Written, but no usable answer: the provider may have acted on the request.
    Unanswered(BoxError),
}

impl Connection {
    pub(super) fn new(io: Io) -> Self {
        Self { io, buf: BytesMut::new(), idle_since: Instant::now(), via_proxy: None }
    }

    /// The connection goes to an egress proxy, which forwards each request to the provider its
    /// absolute URI names (RFC 9112 §3.2.2), shown `authorization` if given.
    pub(super) fn through_proxy(mut self, authorization: Option<HeaderValue>) -> Self {
        self.via_proxy = Some(ViaProxy { authorization });
        self
    }

    /// Whether an idle connection can carry another request: the provider has neither closed it nor
    /// sent anything unasked. Reads what the reactor already knows of the socket: no system call
    /// unless it saw the socket become readable.
    pub(super) fn is_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        matches!(Pin::new(&mut self.io).poll_read(&mut cx, &mut probe), Poll::Pending)
    }

    /// Writes `request` (its URI absolute or not; `host` is the `Host` header unless it has one)
    /// and reads the answer's head. The body is read as the answer's body is polled; once it is,
    /// the connection goes back to `home`.
    pub(super) async fn exchange(
        mut self,
        request: &Request<Bytes>,
        host: &HeaderValue,
        home: Home,
    ) -> Result<Response<Body>, Failure> {
        let body = request.body();
        let mut out = request_head(request, host, self.via_proxy.as_ref());
        if body.len() <= JOIN_BODY_BYTES {
            out.extend_from_slice(body);
        }
        let parts = [&out[..], if body.len() > JOIN_BODY_BYTES { &body[..] } else { &[] }];
        let mut sent = [0; 2];
        let whole = std::future::poll_fn(|cx| self.poll_write_request(cx, parts, &mut sent)).await?;
        let (parts, framing, keep_alive) = loop {
            if let Some(head) = parse_head(&mut self.buf, request.method()).map_err(Failure::Unanswered)? {
                break head;
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(Failure::Unanswered("the provider's response head is too long".into()));
            }
            self.buf.reserve(READ_BYTES);
            let nothing_yet = self.buf.is_empty() && whole;
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) => {
                    let e = "the provider closed the connection without answering".into();
                    return Err(if nothing_yet { Failure::Silent(e) } else { Failure::Unanswered(e) });
                }
                Ok(_) => {}
                Err(e) if nothing_yet => return Err(Failure::Silent(e.into())),
                Err(e) => return Err(Failure::Unanswered(e.into())),
            }
        };
        // A connection whose request was cut short carries nothing more.
        let keep_alive = keep_alive && whole;
        let mut body = Body { connection: Some(self), framing, keep_alive, home: Some(home), failed: None };
        body.release_when_read();
        Ok(Response::from_parts(parts, body))
    }

    /// Writes `parts` in order, `sent` saying how far each went; `true` once all of it is out.
    /// While the provider takes no more, what it sent is read: a provider refusing a large body
    /// (413, 401) answers before the body's end and may stop reading it. That answer, a whole
    /// response head, ends the writing (`false`) and is the exchange's.
    fn poll_write_request(
        &mut self,
        cx: &mut Context<'_>,
        parts: [&[u8]; 2],
        sent: &mut [usize; 2],
    ) -> Poll<Result<bool, Failure>> {
        loop {
            let Some(part) = (0..2).find(|&i| sent[i] < parts[i].len()) else {
                return Pin::new(&mut self.io)
                    .poll_flush(cx)
                    .map(|r| r.map(|()| true).map_err(Failure::Unwritten));
            };
            match Pin::new(&mut self.io).poll_write(cx, &parts[part][sent[part]..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Failure::Unwritten(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => sent[part] += n,
                Poll::Ready(Err(_)) if final_head_in(&self.buf) => return Poll::Ready(Ok(false)),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Failure::Unwritten(e))),
                Poll::Pending => loop {
                    if final_head_in(&self.buf) || self.buf.len() > MAX_HEAD_BYTES {
                        return Poll::Ready(Ok(false));
                    }
                    self.buf.reserve(READ_BYTES);
                    match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf) {
                        Poll::Ready(Ok(n)) if n > 0 => {}
                        // Nothing to read, or nothing more ever: the write's wake-up comes first.
                        _ => return Poll::Pending,
                    }
                },
            }
        }
    }
}

/// Whether `buf` starts with a final response head (after any interim ones), or with something
/// that is not a response head at all (which reading the head then reports).
fn final_head_in(mut buf: &[u8]) -> bool {
    loop {
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut lines,
        ) {
            Ok(httparse::Status::Complete(length)) if parsed.code.is_some_and(is_interim) => {
                buf = &buf[length..];
            }
            Ok(httparse::Status::Complete(_)) | Err(_) => return true,
            Ok(httparse::Status::Partial) => return false,
        }
    }
}

/// A 1xx head other than 101: one that a final head follows.
fn is_interim(code: u16) -> bool {
    (100..200).contains(&code) && code != 101
}

/// `METHOD /path HTTP/1.1`, the headers, and a `Content-Length` of the body's own.
fn request_head(request: &Request<Bytes>, host: &HeaderValue, via_proxy: Option<&ViaProxy>) -> Vec<u8> {
    let headers = request.headers();
    let mut out = Vec::with_capacity(256 + headers.len() * 48);
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    if via_proxy.is_some()
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
        // The body is sent whole, with a length of its own.
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            had_length = true;
            continue;
        }
        push_header(&mut out, name.as_str(), value.as_bytes());
    }
    if let Some(ViaProxy { authorization: Some(authorization) }) = via_proxy {
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

/// The final response head at the start of `buf`, taken off it; `None` while it is incomplete.
/// Interim (1xx) heads before it are dropped.
fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<(http::response::Parts, Framing, bool)>, BoxError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut lines,
        )? {
            httparse::Status::Complete(length) => length,
            httparse::Status::Partial => return Ok(None),
        };
        let code = parsed.code.unwrap_or(0);
        if code == 101 {
            return Err("the provider switched protocols, which no request asked for".into());
        }
        if is_interim(code) {
            let _ = buf.split_to(length);
            continue;
        }
        let status = StatusCode::from_u16(code)?;
        let version = if parsed.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
        let spans = line_spans(buf, parsed.headers);
        let head = buf.split_to(length).freeze();
        let mut headers = header_map(&head, &spans)?;
        let framing = framing(method, status, &headers)?;
        // Both framings at once is how requests are smuggled (RFC 9112, section 6.3): the body is
        // read as chunked, the length the client would be told is dropped, and the connection
        // is not trusted with another request.
        let both =
            headers.contains_key(header::TRANSFER_ENCODING) && headers.contains_key(header::CONTENT_LENGTH);
        if both {
            headers.remove(header::CONTENT_LENGTH);
        }
        let keep_alive = version == Version::HTTP_11
            && !both
            && !matches!(framing, Framing::UntilClose)
            && !has_token(&headers, &header::CONNECTION, "close");
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        return Ok(Some((response.into_parts().0, framing, keep_alive)));
    }
}

/// How the answer's body is delimited (RFC 9112, section 6.3).
fn framing(method: &Method, status: StatusCode, headers: &HeaderMap) -> Result<Framing, BoxError> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Done);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return Ok(if last_token_is(headers, &header::TRANSFER_ENCODING, "chunked") {
            Framing::Chunked(Chunked::Size)
        } else {
            Framing::UntilClose
        });
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for item in value.to_str()?.split(',') {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                return Err("the provider's content-length is not a number".into());
            }
            let n: u64 = item.parse()?;
            if length.is_some_and(|seen| seen != n) {
                return Err("the provider sent two different content-lengths".into());
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) => Framing::Done,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// Where the reading of a body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// This many bytes of body are still to come.
    Length(u64),
    Chunked(Chunked),
    /// The body ends when the provider closes the connection.
    UntilClose,
    Done,
}

/// Where the reading of a chunked body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunked {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// Trailer lines are next, up to an empty line.
    Trailers,
}

/// A chunk-size or trailer line longer than this is refused.
const MAX_LINE_BYTES: usize = 4 << 10;

impl Framing {
    /// Takes the framing bytes at the start of `buf` (chunk sizes, the CRLFs after chunks, trailers)
    /// as far as `buf` goes: it stops at data, at the end of the body, or where more bytes are needed.
    /// Malformed framing is an error, and the same error again at the next call: nothing of it is
    /// taken.
    pub(super) fn skip_framing(&mut self, buf: &mut BytesMut) -> Result<(), BoxError> {
        while let Framing::Chunked(state) = self {
            match *state {
                Chunked::Data(_) => return Ok(()),
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(());
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("the provider's chunk does not end in CRLF".into());
                    }
                    let _ = buf.split_to(2);
                    *state = Chunked::Size;
                }
                Chunked::Size => {
                    let Some(length) = line_length(buf)? else { return Ok(()) };
                    let size = chunk_size(&buf[..length])?;
                    let _ = buf.split_to(length + 2);
                    *state = if size == 0 { Chunked::Trailers } else { Chunked::Data(size) };
                }
                Chunked::Trailers => {
                    let Some(length) = line_length(buf)? else { return Ok(()) };
                    let _ = buf.split_to(length + 2);
                    if length == 0 {
                        *self = Framing::Done;
                    }
                }
            }
        }
        Ok(())
    }

    /// The body data at the start of `buf`, as far as it goes, taken off it.
    pub(super) fn take_data(&mut self, buf: &mut BytesMut) -> Option<Bytes> {
        if buf.is_empty() {
            return None;
        }
        let (remaining, then) = match self {
            Framing::Length(remaining) => (remaining, Framing::Done),
            Framing::Chunked(Chunked::Data(remaining)) => (remaining, Framing::Chunked(Chunked::DataEnd)),
            Framing::UntilClose => return Some(buf.split().freeze()),
            Framing::Chunked(_) | Framing::Done => return None,
        };
        let n = usize::try_from(*remaining).unwrap_or(usize::MAX).min(buf.len());
        *remaining -= n as u64;
        if *remaining == 0 {
            *self = then;
        }
        Some(buf.split_to(n).freeze())
    }
}

/// The length of the CRLF-terminated line at the start of `buf`, without its CRLF; `None` while
/// incomplete.
fn line_length(buf: &[u8]) -> Result<Option<usize>, BoxError> {
    match buf.windows(2).position(|w| w == b"\r\n") {
        Some(length) if length <= MAX_LINE_BYTES => Ok(Some(length)),
        None if buf.len() <= MAX_LINE_BYTES => Ok(None),
        _ => Err("the provider's chunk line is too long".into()),
    }
}

/// The hexadecimal size at the start of a chunk-size line: spaces or tabs may follow it, then an
/// extension (`;...`, ignored, without control characters) or nothing.
fn chunk_size(line: &[u8]) -> Result<u64, BoxError> {
    let malformed = || -> BoxError { "the provider's chunk size is malformed".into() };
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let rest = &rest[rest.iter().take_while(|&&b| b == b' ' || b == b'\t').count()..];
    let extension_ok = match rest.split_first() {
        None => true,
        Some((b';', extension)) => !extension.iter().any(|&b| b.is_ascii_control() && b != b'\t'),
        Some(_) => false,
    };
    if digits == 0 || !extension_ok {
        return Err(malformed());
    }
    line[..digits].iter().try_fold(0u64, |size, &digit| {
        let value = u64::from((digit as char).to_digit(16).ok_or_else(malformed)?);
        size.checked_mul(16).and_then(|size| size.checked_add(value)).ok_or_else(malformed)
    })
}

/// A provider's response body, read off its connection as it is polled.
pub(crate) struct Body {
    /// `None` once the body is read (the connection given back or closed) or has failed.
    connection: Option<Connection>,
    framing: Framing,
    keep_alive: bool,
    home: Option<Home>,
    /// The error the next poll reports.
    failed: Option<BoxError>,
}

impl Body {
    /// Once the body is read, the connection goes back to its pool if it can carry another request
    /// (nothing read past the answer), and is closed otherwise.
    fn release_when_read(&mut self) {
        if self.framing != Framing::Done {
            return;
        }
        if let (Some(mut connection), Some(home)) = (self.connection.take(), self.home.take())
            && self.keep_alive
            && connection.buf.is_empty()
        {
            connection.idle_since = Instant::now();
            home.give_back(connection);
        }
    }

    /// Closes the connection, and reports `error` at the next poll, which it asks for at once: the
    /// client's connection first sends what it was given, so that the client sees the answer
    /// cut where the provider cut it rather than lose the part it already had.
    fn fail(
        &mut self,
        cx: &mut Context<'_>,
        error: BoxError,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.connection = None;
        self.failed = Some(error);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        loop {
            let Some(connection) = this.connection.as_mut() else { return Poll::Ready(None) };
            if let Err(e) = this.framing.skip_framing(&mut connection.buf) {
                return this.fail(cx, e);
            }
            let data = this.framing.take_data(&mut connection.buf);
            // The end may already be in the buffer: seen now, the connection is free for the next
            // request before this one's last bytes have even gone to the client.
            // An error here is met again, and reported, at the next poll: after this data.
            if data.is_some() {
                let _ = this.framing.skip_framing(&mut connection.buf);
            }
            this.release_when_read();
            if let Some(data) = data {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let Some(connection) = this.connection.as_mut() else { return Poll::Ready(None) };
            connection.buf.reserve(READ_BYTES);
            match tokio_util::io::poll_read_buf(Pin::new(&mut connection.io), cx, &mut connection.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.framing == Framing::UntilClose => {
                    this.framing = Framing::Done;
                    this.connection = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    return this
                        .fail(cx, "the provider closed the connection before the answer's end".into());
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(cx, e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(remaining) => SizeHint::with_exact(remaining),
            Framing::Done => SizeHint::with_exact(0),
            Framing::Chunked(_) | Framing::UntilClose => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The data a body gave, and what was left in the buffer after it.
    type ReadBack = (Vec<u8>, Vec<u8>);

    /// Feeds `wire` to `framing` in pieces cut at `cuts`, as reads would; the data it gives, and
    /// what is left in the buffer once it is done (`None` if it is still waiting for more).
    fn read_body(mut framing: Framing, wire: &[u8], cuts: &[usize]) -> Result<Option<ReadBack>, BoxError> {
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut from = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(wire.len())).collect();
        cuts.sort_unstable();
        cuts.push(wire.len());
        for to in cuts {
            buf.extend_from_slice(&wire[from..to.max(from)]);
            from = to.max(from);
            loop {
                framing.skip_framing(&mut buf)?;
                match framing.take_data(&mut buf) {
                    Some(piece) => data.extend_from_slice(&piece),
                    None => break,
                }
            }
            if framing == Framing::Done {
                buf.extend_from_slice(&wire[from..]);
                return Ok(Some((data, buf.to_vec())));
            }
        }
        Ok(None)
    }

    /// `body` in chunks of the given sizes (the rest in one more), with extensions and trailers.
    fn chunked(body: &[u8], sizes: &[usize], extension: bool, upper: bool, trailers: usize) -> Vec<u8> {
        let mut wire = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().copied().chain(std::iter::once(usize::MAX));
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(usize::MAX).clamp(1, rest.len());
            let size = if upper { format!("{n:X}") } else { format!("{n:x}") };
            wire.extend_from_slice(size.as_bytes());
            if extension {
                wire.extend_from_slice(b" ;name=\"value\"");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&rest[..n]);
            wire.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        wire.extend_from_slice(b"0\r\n");
        for i in 0..trailers {
            wire.extend_from_slice(format!("x-trailer-{i}: {i}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        wire
    }

    proptest! {
        #[test]
        fn a_chunked_body_reads_back_whole_however_it_is_cut(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            sizes in proptest::collection::vec(1usize..700, 0..8),
            cuts in proptest::collection::vec(0usize..4000, 0..12),
            extension in any::<bool>(),
            upper in any::<bool>(),
            trailers in 0usize..3,
        ) {
            let mut wire = chunked(&body, &sizes, extension, upper, trailers);
            wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            let (data, left) = read_body(Framing::Chunked(Chunked::Size), &wire, &cuts).expect("read").expect("done");
            prop_assert_eq!(data, body);
            prop_assert_eq!(left, b"HTTP/1.1 200 OK\r\n".to_vec());
        }

        #[test]
        fn a_body_of_known_length_reads_back_whole_and_nothing_past_it(
            body in proptest::collection::vec(any::<u8>(), 1..3000),
            cuts in proptest::collection::vec(0usize..4000, 0..12),
        ) {
            let mut wire = body.clone();
            wire.extend_from_slice(b"next");
            let (data, left) = read_body(Framing::Length(body.len() as u64), &wire, &cuts).expect("read").expect("done");
            prop_assert_eq!(data, body);
            prop_assert_eq!(left, b"next".to_vec());
        }
    }

    #[test]
    fn malformed_chunk_framing_is_an_error_however_it_is_cut() {
        let long_line = format!("1;{}", "x".repeat(MAX_LINE_BYTES + 1));
        let cases: [&[u8]; 8] = [
            b"zz\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"10000000000000000\r\n",
            b"5 junk\r\nhello\r\n0\r\n\r\n",
            b"\r\nhello\r\n0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5;a\x0bb\r\nhello\r\n0\r\n\r\n",
            long_line.as_bytes(),
        ];
        for wire in cases {
            for cut in [0, 1, 3, wire.len()] {
                let read = read_body(Framing::Chunked(Chunked::Size), wire, &[cut]);
                assert!(read.is_err(), "{:?} cut at {cut}: {read:?}", String::from_utf8_lossy(wire));
            }
        }
    }

    #[test]
    fn chunk_sizes_may_have_leading_zeros_and_trailing_blanks() {
        let wire = b"0005 \t;ext=\"v\"\r\nhello\r\n000000000000000006\t\r\n world\r\n0 \r\n\r\n";
        let read = read_body(Framing::Chunked(Chunked::Size), wire, &[]).expect("valid").expect("done");
        assert_eq!(read, (b"hello world".to_vec(), Vec::new()));
    }

    #[test]
    fn malformed_framing_stays_an_error_at_the_next_call() {
        let mut framing = Framing::Chunked(Chunked::Size);
        let mut buf = BytesMut::from(&b"2\r\nhiXX"[..]);
        framing.skip_framing(&mut buf).expect("size line");
        assert_eq!(framing.take_data(&mut buf).as_deref(), Some(&b"hi"[..]));
        assert!(framing.skip_framing(&mut buf).is_err());
        assert!(framing.skip_framing(&mut buf).is_err(), "nothing of the bad framing was taken");
    }

    fn head(wire: &str, method: Method) -> Result<Option<(http::response::Parts, Framing, bool)>, BoxError> {
        parse_head(&mut BytesMut::from(wire.as_bytes()), &method)
    }

    #[test]
    fn the_head_says_how_the_body_ends_and_whether_the_connection_is_kept() {
        let cases = [
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::POST, Framing::Length(5), true),
            ("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", Method::POST, Framing::Length(5), true),
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Method::POST, Framing::Done, true),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", Method::HEAD, Framing::Done, true),
            ("HTTP/1.1 204 No Content\r\n\r\n", Method::POST, Framing::Done, true),
            ("HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n", Method::GET, Framing::Done, true),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
                Method::POST,
                Framing::Chunked(Chunked::Size),
                false,
            ),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", Method::POST, Framing::UntilClose, false),
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
            let (_, read_framing, read_keep_alive) = head(wire, method).expect("valid").expect("complete");
            assert_eq!((read_framing, read_keep_alive), (framing, keep_alive), "{wire:?}");
        }
        let (parts, _, _) = head(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nx-request-id: abc\r\nX-Multi: a\r\nx-multi: b\r\ncontent-length: 2\r\n\r\nhi",
            Method::POST,
        )
        .expect("valid")
        .expect("complete");
        assert_eq!(parts.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(parts.headers["x-request-id"], "abc");
        assert_eq!(parts.headers.get_all("x-multi").iter().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn a_head_is_incomplete_until_its_empty_line_and_bad_lengths_are_errors() {
        assert!(head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n", Method::POST).expect("valid").is_none());
        for wire in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5x\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        ] {
            assert!(head(wire, Method::POST).is_err(), "{wire:?}");
        }
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"[..]);
        parse_head(&mut buf, &Method::GET).expect("valid").expect("complete");
        assert_eq!(&buf[..], b"hi", "the body stays in the buffer");
    }

    #[test]
    fn a_request_through_an_egress_proxy_names_its_target_whole_and_shows_the_credentials() {
        let post = Request::post("http://10.0.0.5:8000/v1/chat?x=1")
            .body(Bytes::from_static(b"{}"))
            .expect("request");
        let host = HeaderValue::from_static("10.0.0.5:8000");
        let proxy = ViaProxy { authorization: Some(HeaderValue::from_static("Basic dTpw")) };
        assert_eq!(
            String::from_utf8(request_head(&post, &host, Some(&proxy))).expect("text"),
            "POST http://10.0.0.5:8000/v1/chat?x=1 HTTP/1.1\r\nhost: 10.0.0.5:8000\r\n\
             proxy-authorization: Basic dTpw\r\ncontent-length: 2\r\n\r\n"
        );
    }

    #[test]
    fn the_request_head_carries_host_and_the_body_length() {
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
