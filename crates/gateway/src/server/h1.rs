//! Client connections over HTTP/1.1, served by the gateway itself in the common case and handed to
//! hyper's server for everything else.
//!
//! Nearly every request a gateway sees is an HTTP/1.1 request whose head and body (of a declared
//! length) arrive together, answered with a JSON document or an event stream. Such a request is
//! parsed in place (its header values share the read buffer) and the answer's head goes out in the
//! same write as its first bytes: no dispatcher state machine, no body channel. A connection that
//! asks for anything else is handed to hyper for the rest of its life, that request included, so
//! that every corner of the protocol keeps hyper's handling: a body that does not follow its head
//! at once (the proxy answers a refused request without waiting for it, and times a slow body
//! out), a chunked or
//! oversized body, `Expect`, an upgrade, HTTP/1.0, `HEAD` or `CONNECT`, an HTTP/2 preface, and a
//! head that does not parse or is long (hyper's `400` and `431`). A head that breaks the rules of
//! [`recovea_http1::request_facts`] (its `Host`, its framing) is answered here and the connection
//! closed: hyper would pass it on.
//!
//! Which of these a request is, [`recovea_http1::classify`] decides on the bytes read so far; this
//! module reads them, times the body, builds the `http::Request`, and carries the decision out.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use http::header;
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::Full;
use recovea_core::answer::WireShape;
use recovea_http1::{
    Classified, Framing, HeadLayout, Limits, Refusal, RequestError, WholeRequest, chunk_size_line, classify,
    has_token, response_head,
};
use recovea_providers::headers::ANTHROPIC_VERSION;
use recovea_upstream::{ResponseBody, Stall};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_util::io::poll_read_buf;

use super::{Answerer, HEADER_READ_TIMEOUT};
use crate::metrics::HandOver;

/// A request head longer than this goes to hyper, which takes up to its own limit.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// A request with more header lines than this goes to hyper.
const MAX_HEADERS: usize = 64;
/// Each read asks for at least this much room.
const READ_BYTES: usize = 8 << 10;
/// How long a body may trail its head before the connection goes to hyper. Clients that write the
/// two separately (Python's httpx does) send the body within microseconds; one that waits for an
/// answer first (a refusal comes before the body is read) gets it from hyper after this.
const BODY_GRACE: Duration = Duration::from_millis(5);
/// The largest body read before its request is admitted: a larger one goes to hyper, and the
/// proxy reads it after admission, in room from the node's body budget (`crate::body_budget`), so
/// that what a connection holds before anyone knows who sent it stays small.
const MAX_UNADMITTED_BODY: u64 = 64 << 10;
/// The most of a pipelined next request read while an answer is still being written.
const MAX_PIPELINED: usize = 64 << 10;
/// How long, and how much, of what a client sends after a refused head is read before its connection
/// is closed.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// A connection that is hyper's from here: the bytes already read from it (which hyper reads
/// first), and why.
pub(super) struct HandedOver<Io> {
    pub(super) io: Io,
    pub(super) read: Bytes,
    pub(super) reason: HandOver,
}

/// Serves requests on `io` with `answerer` until the client or the drain closes it, or until it
/// goes to hyper (`Some`). A body longer than `max_body` goes to hyper, so that the proxy refuses
/// it unread. A client that takes no byte of its answer for `idle` (it stopped reading) has its
/// connection closed.
pub(super) async fn serve<A: Answerer, Io: AsyncRead + AsyncWrite + Unpin>(
    mut io: Io,
    drain: &mut watch::Receiver<bool>,
    max_body: u64,
    idle: Duration,
    answerer: &A,
) -> Option<HandedOver<Io>> {
    let mut buf = BytesMut::with_capacity(READ_BYTES);
    let mut out = Vec::with_capacity(1024);
    let timer = tokio::time::sleep(HEADER_READ_TIMEOUT);
    tokio::pin!(timer);
    let stall = Stall::new(idle);
    tokio::pin!(stall);
    loop {
        let waiting = Waiting { timer: timer.as_mut(), drain, shed: answerer.idle_shed() };
        let (request, close) = match read_request(&mut io, &mut buf, waiting, max_body).await {
            Read::Request(request, close) => (request, close),
            Read::Refuse(error, shape) => {
                // Whatever follows a head that breaks the rules cannot be trusted to be the next
                // request: the connection ends with the answer.
                let response = answerer.refuse(error, shape);
                let _ = write_response(&mut io, &mut buf, &mut out, response, true, stall.as_mut()).await;
                let _ = io.shutdown().await;
                linger(&mut io, &mut buf).await;
                return None;
            }
            Read::Closed => return None,
            Read::Shed => {
                answerer.shed();
                return None;
            }
            Read::HandOver(reason) => return Some(HandedOver { io, read: buf.freeze(), reason }),
        };
        // A client that hangs up before its answer cancels it (the proxy records why).
        let answering = answerer.answer(request);
        tokio::pin!(answering);
        let Ok(response) = unless_hangup(&mut io, &mut buf, |cx| answering.as_mut().poll(cx)).await else {
            return None;
        };
        let close = close || *drain.borrow();
        if !write_response(&mut io, &mut buf, &mut out, response, close, stall.as_mut()).await || close {
            // A FIN after what was written, rather than a bare close.
            let _ = io.shutdown().await;
            return None;
        }
    }
}

/// Reads and drops what the client still sends (the body of a refused request) until it closes,
/// for [`LINGER`] and [`LINGER_BYTES`] at most: a socket closed with bytes unread is reset, and a
/// reset can destroy the answer before the client has read it.
async fn linger(io: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) {
    let mut dropped = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while dropped < LINGER_BYTES {
            buf.clear();
            buf.reserve(READ_BYTES);
            match io.read_buf(buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => dropped += n,
            }
        }
    })
    .await;
}

/// How long a connection must have waited for a next request before it may be shed.
const SHED_AFTER_IDLE: Duration = Duration::from_millis(100);

/// Resolves when `shed` is notified; never without one.
async fn shed_wait(shed: Option<&tokio::sync::Notify>) {
    match shed {
        Some(shed) => shed.notified().await,
        None => std::future::pending().await,
    }
}

// Each value is made once a request and moved once: a box would cost an allocation a request.
#[expect(clippy::large_enum_variant)]
enum Read {
    /// A request, and whether the connection ends after its answer.
    Request(Request<Full<Bytes>>, bool),
    /// A head that breaks the rules, answered without reading further, in the shape its path and
    /// headers ask for.
    Refuse(RequestError, WireShape),
    Closed,
    /// Closed while idle, to make room for other clients.
    Shed,
    HandOver(HandOver),
}

/// What ends the wait for a next request besides the request itself.
struct Waiting<'a> {
    /// The header read timeout, then the body's grace.
    timer: Pin<&'a mut Sleep>,
    drain: &'a mut watch::Receiver<bool>,
    /// Wakes an idle connection that must close to make room; `None`: none ever must.
    shed: Option<&'a tokio::sync::Notify>,
}

/// The next request. Its head must come within the header read timeout (an idle connection is
/// closed after it, as hyper does), its body within [`BODY_GRACE`] of the head. A connection that
/// has sent nothing of it yet closes when the node sheds idle connections.
async fn read_request(
    io: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    waiting: Waiting<'_>,
    max_body: u64,
) -> Read {
    let Waiting { mut timer, drain, shed } = waiting;
    let idle_since = Instant::now();
    timer.as_mut().reset(idle_since + HEADER_READ_TIMEOUT);
    let mut awaiting_body = false;
    loop {
        match parse(buf, max_body) {
            Parsed::Request(request, close) => {
                if awaiting_body {
                    // Not left due while the answer is awaited: a wake-up for nothing.
                    timer.as_mut().reset(Instant::now() + HEADER_READ_TIMEOUT);
                }
                return Read::Request(request, close);
            }
            Parsed::Refuse(error, shape) => return Read::Refuse(error, shape),
            Parsed::HandOver(reason) => return Read::HandOver(reason),
            Parsed::AwaitingBody if !awaiting_body => {
                awaiting_body = true;
                timer.as_mut().reset(Instant::now() + BODY_GRACE);
            }
            Parsed::AwaitingBody | Parsed::Partial => {}
        }
        buf.reserve(READ_BYTES);
        tokio::select! {
            biased;
            read = io.read_buf(buf) => match read {
                Ok(0) | Err(_) => return Read::Closed,
                Ok(_) => {}
            },
            () = timer.as_mut() => {
                return if awaiting_body { Read::HandOver(HandOver::TrailingBody) } else { Read::Closed };
            }
            // A drain closes a connection between requests at once, as hyper does, even with part
            // of a next request read: no answer was begun, so the client may send it again.
            () = super::drained(drain) => return Read::Closed,
            // A connection that only just came, or just had its answer, is most likely a client
            // about to send: the idle ones that go are those that have waited a while.
            () = shed_wait(shed), if buf.is_empty() => {
                if idle_since.elapsed() >= SHED_AFTER_IDLE {
                    return Read::Shed;
                }
            }
        }
    }
}

// Each value is made once a request and moved once: a box would cost an allocation a request.
#[expect(clippy::large_enum_variant)]
enum Parsed {
    Request(Request<Full<Bytes>>, bool),
    /// The head is incomplete.
    Partial,
    /// The head is whole, its body not yet.
    AwaitingBody,
    Refuse(RequestError, WireShape),
    HandOver(HandOver),
}

/// The request at the start of `buf`, taken off it once its head is whole and its body with it.
/// What it is, `recovea_http1::classify` decides; here it is only built.
fn parse(buf: &mut BytesMut, max_body: u64) -> Parsed {
    let limits = Limits { head_bytes: MAX_HEAD_BYTES, body: max_body, unadmitted_body: MAX_UNADMITTED_BODY };
    let whole = match classify::<MAX_HEADERS>(buf, limits) {
        Classified::Request(whole) => whole,
        Classified::Partial => return Parsed::Partial,
        Classified::AwaitingBody => return Parsed::AwaitingBody,
        Classified::Refuse(Refusal { error, layout }) => {
            return Parsed::Refuse(error, shape_of(buf, &layout));
        }
        Classified::HandOver(reason) => return Parsed::HandOver(reason.into()),
    };
    let WholeRequest { method, layout, head, body, close } = whole;
    let head = buf.split_to(head).freeze();
    let body = buf.split_to(body.len()).freeze();
    let built = layout.target(&head).and_then(|uri| Ok((uri, layout.headers(&head)?)));
    let Ok((uri, headers)) = built else {
        // hyper answers what it cannot read: the request goes back in front of the rest.
        let mut whole = BytesMut::with_capacity(head.len() + body.len() + buf.len());
        for part in [&head[..], &body[..], &buf[..]] {
            whole.extend_from_slice(part);
        }
        *buf = whole;
        return Parsed::HandOver(HandOver::Unparsable);
    };
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Parsed::Request(request, close)
}

/// The envelope of the answer to a head refused after it was parsed (`head`, laid out by
/// `layout`): the one its path and `anthropic-version` ask for, as every other answer of the
/// gateway's (`proxy::shape_of`).
fn shape_of(head: &[u8], layout: &HeadLayout) -> WireShape {
    let anthropic =
        layout.names(head).any(|name| name.eq_ignore_ascii_case(ANTHROPIC_VERSION.as_str().as_bytes()));
    // An absolute-form target (`http://host/v1/messages`) names its path as hyper reads it.
    let uri = http::Uri::try_from(layout.raw_target(head)).ok();
    WireShape::of_request(uri.as_ref().map_or("", http::Uri::path), anthropic)
}

/// Writes `response`; whether the connection can carry another request after it. The head goes
/// out with the body's first bytes when they are already there, and each later piece of the body
/// in one write. While the body is awaited, a client that hangs up ends it (the body is dropped,
/// which cancels the provider's request); a next request that comes meanwhile is kept in `buf`.
/// A client that takes nothing for `stall`'s limit ends it the same way.
async fn write_response(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    response: Response<ResponseBody>,
    close: bool,
    mut stall: Pin<&mut Stall>,
) -> bool {
    let (parts, mut body) = response.into_parts();
    let close = close || has_token(&parts.headers, &header::CONNECTION, "close");
    let status = parts.status;
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::None
    } else {
        // A length header the body does not match (a provider's, once the usage chunk is taken out)
        // would cut the answer or run into the next: the body's own length decides, or chunks.
        body.size_hint().exact().map_or(Framing::Chunked, Framing::Length)
    };
    out.clear();
    with_date(|date| response_head(out, &parts, framing, close, date));
    if framing == Framing::None {
        return write_all(io, &mut [IoSlice::new(out)], stall).await.is_ok() && !close;
    }
    let (mut head_sent, mut looked_again) = (false, false);
    let mut sent = 0u64;
    let mut size = [0u8; 18];
    loop {
        // The first look does not wait, so that bytes already there join the head; nor does a
        // second one turn of the runtime later, which finds a last frame that waited only for its
        // receipt's line (written with the others of that turn: `spool::Written`).
        let frame = if head_sent {
            match unless_hangup(io, buf, |cx| Pin::new(&mut body).poll_frame(cx)).await {
                Ok(frame) => frame,
                Err(Hangup) => return false,
            }
        } else {
            match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(frame) => frame,
                Poll::Pending if !looked_again => {
                    looked_again = true;
                    tokio::task::yield_now().await;
                    continue;
                }
                Poll::Pending => {
                    if write_all(io, &mut [IoSlice::new(out)], stall.as_mut()).await.is_err() {
                        return false;
                    }
                    head_sent = true;
                    continue;
                }
            }
        };
        let data = match frame {
            None => break,
            // A provider's cut: the client sees the answer end short.
            Some(Err(_)) => return false,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers are not passed on.
                Err(_) => continue,
            },
        };
        let end = body.is_end_stream();
        if data.is_empty() && !end {
            continue;
        }
        sent += data.len() as u64;
        let head = if head_sent { &[][..] } else { &out[..] };
        let written = match framing {
            Framing::Length(length) if sent > length => return false,
            Framing::Chunked => {
                let size = chunk_size_line(&mut size, data.len());
                let tail: &[u8] = if end { b"\r\n0\r\n\r\n" } else { b"\r\n" };
                let slices = if data.is_empty() {
                    &mut [IoSlice::new(head), IoSlice::new(&tail[2..])][..]
                } else {
                    &mut [IoSlice::new(head), IoSlice::new(size), IoSlice::new(&data), IoSlice::new(tail)][..]
                };
                write_all(io, slices, stall.as_mut()).await
            }
            _ => write_all(io, &mut [IoSlice::new(head), IoSlice::new(&data)], stall.as_mut()).await,
        };
        if written.is_err() {
            return false;
        }
        head_sent = true;
        if end {
            return !close_after_length(framing, sent) && !close;
        }
    }
    // The body ended without saying so with its last bytes.
    let head = if head_sent { &[][..] } else { &out[..] };
    let tail: &[u8] = if framing == Framing::Chunked { b"0\r\n\r\n" } else { b"" };
    if write_all(io, &mut [IoSlice::new(head), IoSlice::new(tail)], stall).await.is_err() {
        return false;
    }
    !close_after_length(framing, sent) && !close
}

/// A body shorter than its declared length leaves the client waiting for the rest: only closing
/// the connection tells it that nothing more comes.
fn close_after_length(framing: Framing, sent: u64) -> bool {
    matches!(framing, Framing::Length(length) if length != sent)
}

/// `f` of the `Date` value, formatted once a second per thread.
fn with_date<T>(f: impl FnOnce(&[u8]) -> T) -> T {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second || text.is_empty() {
            *text = httpdate::fmt_http_date(now);
            *at = second;
        }
        f(text.as_bytes())
    })
}

/// The client closed its connection (or it failed) while its answer was awaited or written.
struct Hangup;

/// What `poll` gives, unless the client hangs up first: the connection is read meanwhile, and what
/// a client sends ahead (its next request) is kept in `buf`, up to [`MAX_PIPELINED`].
async fn unless_hangup<T>(
    io: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
) -> Result<T, Hangup> {
    poll_fn(|cx| {
        if let Poll::Ready(value) = poll(cx) {
            return Poll::Ready(Ok(value));
        }
        while buf.len() < MAX_PIPELINED {
            // Room is made only when none is left: while the answer is awaited the buffer's block
            // is shared with the request, and a new one would cost an allocation a request.
            if buf.capacity() == buf.len() {
                buf.reserve(READ_BYTES);
            }
            match poll_read_buf(Pin::new(&mut *io), cx, buf) {
                Poll::Pending => break,
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Err(Hangup)),
                Poll::Ready(Ok(_)) => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// Writes every slice, in as few system calls as the socket allows. A client that takes no byte
/// for `stall`'s limit (it stopped reading: the socket stays full) fails the write.
async fn write_all(
    io: &mut (impl AsyncWrite + Unpin),
    mut slices: &mut [IoSlice<'_>],
    mut stall: Pin<&mut Stall>,
) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let written = poll_fn(|cx| write_or_stall(Pin::new(&mut *io), cx, slices, stall.as_mut())).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

/// One vectored write, failed with `TimedOut` once the socket has taken nothing for `stall`'s limit.
/// A write the socket takes at once touches no timer.
fn write_or_stall<W: AsyncWrite>(
    io: Pin<&mut W>,
    cx: &mut Context<'_>,
    slices: &[IoSlice<'_>],
    stall: Pin<&mut Stall>,
) -> Poll<io::Result<usize>> {
    match io.poll_write_vectored(cx, slices) {
        Poll::Pending => match stall.poll_stalled(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        },
        written => {
            stall.moved();
            written
        }
    }
}

/// A connection with bytes already read from it in front, which are read first: how a connection
/// goes to hyper. Its writes fail once the client has taken nothing for the idle limit, which ends
/// hyper's connection (and with it the request it was answering).
pub(super) struct Rewind<Io> {
    read: Bytes,
    io: Io,
    // Boxed to keep the connection `Unpin`, as hyper wants: one allocation per connection handed over.
    stall: Pin<Box<Stall>>,
}

impl<Io> Rewind<Io> {
    pub(super) fn new(io: Io, read: Bytes, idle: Duration) -> Self {
        Self { read, io, stall: Box::pin(Stall::new(idle)) }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Rewind<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read[..n]);
        self.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Rewind<Io> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        write_or_stall(Pin::new(&mut this.io), cx, slices, this.stall.as_mut())
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use http::HeaderValue;
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::io::{AsyncWriteExt, DuplexStream};
    use tokio::task::JoinHandle;

    use super::*;
    use recovea_upstream::BoxError;

    const MAX_BODY: u64 = 1024;
    /// How long a client may take none of its answer.
    const IDLE: Duration = Duration::from_millis(300);
    /// How much the wire between a test's client and its server holds in each direction.
    const WIRE_BYTES: usize = 64 << 10;

    /// Set when dropped: shows that a request's answer (or its body) was abandoned.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn full(text: String) -> ResponseBody {
        Full::new(Bytes::from(text)).map_err(BoxError::from).boxed_unsync()
    }

    /// A body of pieces that says it has ended with its last one, of no length known beforehand.
    struct Pieces(std::collections::VecDeque<&'static str>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|piece| Ok(Frame::data(Bytes::from(piece)))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// What [`serve`] returned, in time.
    async fn ended(server: JoinHandle<Option<HandedOver<DuplexStream>>>) -> Option<HandedOver<DuplexStream>> {
        tokio::time::timeout(Duration::from_secs(5), server).await.expect("in time").expect("served")
    }

    /// Answers with [`answer`], and tells whether any request reached it.
    #[derive(Clone)]
    struct Test {
        dropped: Arc<AtomicBool>,
        answered: Arc<AtomicBool>,
    }

    impl Answerer for Test {
        fn answer<B>(&self, request: Request<B>) -> impl Future<Output = Response<ResponseBody>> + Send
        where
            B: http_body::Body<Data = Bytes> + Send + 'static,
            B::Error: Into<BoxError>,
        {
            self.answered.store(true, Ordering::SeqCst);
            answer(request, Arc::clone(&self.dropped))
        }

        fn refuse(&self, error: RequestError, shape: WireShape) -> Response<ResponseBody> {
            crate::refusal::head_refusal(error, shape)
        }

        fn handed_over(&self, _: HandOver) {}
    }

    /// Answers by path: `/echo` (and `/slow`, after a while) tells what it received; `/stream`
    /// streams pieces, saying which is the last, and `/stream-on` only after them; `/close` asks
    /// for the connection to end; `/wrong-length` declares a length its body does not have;
    /// `/empty` is a 204; `/hang` never answers and `/endless` never ends its body, each setting
    /// `dropped` once abandoned.
    async fn answer<B>(request: Request<B>, dropped: Arc<AtomicBool>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.map(|body| body.to_bytes()).unwrap_or_default();
        let body = String::from_utf8_lossy(&body).into_owned();
        if parts.uri.path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match parts.uri.path() {
            "/stream" => Response::new(Pieces(["hello", "", " streaming", " world"].into()).boxed_unsync()),
            "/stream-on" => {
                let pieces = ["hello", "", " world"].map(|p| Ok(Frame::data(Bytes::from(p))));
                Response::new(StreamBody::new(futures_util::stream::iter(pieces)).boxed_unsync())
            }
            "/wrong-length" => {
                let mut response = Response::new(full("abc".into()));
                response.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
                response
            }
            "/empty" => {
                let mut response = Response::new(full(String::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            "/close" => {
                let mut response = Response::new(full("bye".into()));
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            "/hang" => {
                let _dropped = Dropped(dropped);
                std::future::pending().await
            }
            "/flood" => {
                // Without end, as fast as it is read: only a client that stops reading can end it.
                let guard = Dropped(dropped);
                let piece = Bytes::from(vec![b'x'; 64 << 10]);
                let flood = futures_util::stream::unfold(guard, move |guard| {
                    let piece = piece.clone();
                    async move { Some((Ok(Frame::data(piece)), guard)) }
                });
                Response::new(StreamBody::new(flood).boxed_unsync())
            }
            "/endless" => {
                // One piece, then nothing: only the client's hang-up can end it.
                let guard = Dropped(dropped);
                let first = futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(b"tick")))]);
                let rest = futures_util::stream::unfold(guard, |guard| async move {
                    std::future::pending::<()>().await;
                    Some((Ok(Frame::data(Bytes::new())), guard))
                });
                Response::new(StreamBody::new(futures_util::StreamExt::chain(first, rest)).boxed_unsync())
            }
            _ => {
                let host = parts.headers.get(header::HOST).map_or("", |h| h.to_str().unwrap_or(""));
                let echo = format!("{} {} host={host} body={body}", parts.method, parts.uri);
                Response::new(full(echo))
            }
        }
    }

    struct Served {
        client: Client,
        drain: watch::Sender<bool>,
        dropped: Arc<AtomicBool>,
        answered: Arc<AtomicBool>,
        server: JoinHandle<Option<HandedOver<DuplexStream>>>,
    }

    /// A connection served by [`serve`] with [`answer`], and its client end: an in-memory wire, so
    /// that the tests (on paused time) decide when each byte arrives, not the scheduler.
    async fn connect() -> Served {
        let (client, io) = tokio::io::duplex(WIRE_BYTES);
        let (drain, mut draining) = watch::channel(false);
        let test =
            Test { dropped: Arc::new(AtomicBool::new(false)), answered: Arc::new(AtomicBool::new(false)) };
        let (dropped, answered) = (Arc::clone(&test.dropped), Arc::clone(&test.answered));
        let server = tokio::spawn(async move { serve(io, &mut draining, MAX_BODY, IDLE, &test).await });
        Served { client: Client { io: client, read: Vec::new() }, drain, dropped, answered, server }
    }

    /// The client end: what it read and has not yet taken as a response.
    struct Client {
        io: DuplexStream,
        read: Vec<u8>,
    }

    impl Client {
        async fn send(&mut self, bytes: &[u8]) {
            self.io.write_all(bytes).await.expect("write");
        }

        /// One response: its head without the `date` line (checked present) and its body as
        /// framed on the wire.
        async fn response(&mut self) -> (String, String) {
            tokio::time::timeout(Duration::from_secs(5), self.read_response())
                .await
                .expect("a response in time")
        }

        async fn read_response(&mut self) -> (String, String) {
            let head_end = loop {
                if let Some(end) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                assert_ne!(self.io.read_buf(&mut self.read).await.expect("read"), 0, "closed mid-head");
            };
            let head = String::from_utf8(self.read[..head_end].to_vec()).expect("text");
            assert!(head.lines().any(|l| l.starts_with("date: ") && l.ends_with(" GMT")), "{head}");
            let head: String = head.split_inclusive("\r\n").filter(|l| !l.starts_with("date: ")).collect();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map(|l| l.parse().expect("length"));
            let chunked = head.contains("\r\ntransfer-encoding: chunked\r\n");
            let body_end = loop {
                let body = &self.read[head_end..];
                let end = match (length, chunked) {
                    (Some(length), _) => (body.len() >= length).then_some(length),
                    (None, true) => body.windows(5).position(|w| w == b"0\r\n\r\n").map(|at| at + 5),
                    (None, false) => Some(0),
                };
                if let Some(end) = end {
                    break head_end + end;
                }
                assert_ne!(self.io.read_buf(&mut self.read).await.expect("read"), 0, "closed mid-body");
            };
            let body = String::from_utf8(self.read[head_end..body_end].to_vec()).expect("text");
            self.read.drain(..body_end);
            (head, body)
        }

        /// Whether the server closes the connection (with nothing more sent).
        async fn closed(&mut self) -> bool {
            let read =
                tokio::time::timeout(Duration::from_secs(5), self.io.read_to_end(&mut self.read)).await;
            matches!(read, Ok(Ok(0))) && self.read.is_empty()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_answered_in_order_on_one_connection_pipelined_or_not() {
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client
            .send(
                b"POST /echo?x=1 HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhelloGET /echo HTTP/1.1\r\nhost: b\r\n\r\n",
            )
            .await;
        let first = client.response().await;
        assert_eq!(
            first,
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 32\r\n\r\n".into(),
                "POST /echo?x=1 host=a body=hello".into()
            )
        );
        assert_eq!(client.response().await.1, "GET /echo host=b body=");
        // The next request sent while the answer is awaited waits for it.
        client.send(b"GET /slow HTTP/1.1\r\nhost: h\r\n\r\n").await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        client.send(b"GET /echo HTTP/1.1\r\nhost: h\r\n\r\n").await;
        assert_eq!(client.response().await.1, "GET /slow host=h body=");
        assert_eq!(client.response().await.1, "GET /echo host=h body=");
        drop(client);
        assert!(ended(server).await.is_none(), "closed, not handed over");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_framed_by_their_bodies() {
        let Served { mut client, drain: _drain, .. } = connect().await;
        client
            .send(b"GET /stream HTTP/1.1\r\nhost: h\r\n\r\nGET /stream-on HTTP/1.1\r\nhost: h\r\n\r\n")
            .await;
        let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(
            client.response().await,
            (chunked.into(), "5\r\nhello\r\nA\r\n streaming\r\n6\r\n world\r\n0\r\n\r\n".into())
        );
        assert_eq!(
            client.response().await,
            (chunked.into(), "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".into())
        );
        client
            .send(b"GET /wrong-length HTTP/1.1\r\nhost: h\r\n\r\nGET /empty HTTP/1.1\r\nhost: h\r\n\r\n")
            .await;
        assert_eq!(
            client.response().await,
            ("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n".into(), "abc".into())
        );
        client.send(b"GET /echo HTTP/1.1\r\nhost: h\r\n\r\n").await;
        assert_eq!(client.response().await, ("HTTP/1.1 204 No Content\r\n\r\n".into(), String::new()));
        assert_eq!(client.response().await.1, "GET /echo host=h body=", "and the connection goes on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_trails_its_head_is_waited_for_a_moment() {
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client.send(b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 11\r\n\r\nhel").await;
        // Paused time moves only once both ends wait: the server has read the head by then.
        tokio::time::sleep(BODY_GRACE / 2).await;
        client.send(b"lo world").await;
        assert_eq!(client.response().await.1, "POST /echo host=h body=hello world");
        client.send(b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 11\r\n\r\nhel").await;
        tokio::time::sleep(BODY_GRACE * 2).await;
        client.send(b"lo world").await;
        let handed = ended(server).await.expect("then handed over");
        assert_eq!(handed.reason, HandOver::TrailingBody);
        assert_eq!(handed.read, &b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 11\r\n\r\nhel"[..]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_asks_to_close_or_a_client_that_does_ends_the_connection() {
        let Served { mut client, drain: _drain, .. } = connect().await;
        client.send(b"GET /close HTTP/1.1\r\nhost: h\r\n\r\n").await;
        assert_eq!(
            client.response().await.0,
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\n"
        );
        assert!(client.closed().await);

        let Served { mut client, drain: _drain, .. } = connect().await;
        client.send(b"GET /echo HTTP/1.1\r\nhost: h\r\nconnection: keep-alive, Close\r\n\r\n").await;
        let (head, _) = client.response().await;
        assert_eq!(head, "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 22\r\n\r\n");
        assert!(client.closed().await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_hangs_up_abandons_its_request_waiting_or_streaming() {
        for path in ["/hang", "/endless"] {
            let Served { mut client, dropped, server, drain: _drain, .. } = connect().await;
            client.send(format!("GET {path} HTTP/1.1\r\nhost: h\r\n\r\n").as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!dropped.load(Ordering::SeqCst), "{path}: still going");
            drop(client);
            assert!(ended(server).await.is_none());
            assert!(dropped.load(Ordering::SeqCst), "{path}: abandoned with the connection");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_has_its_connection_closed_and_its_answer_dropped() {
        let Served { mut client, dropped, server, drain: _drain, .. } = connect().await;
        client.send(b"GET /flood HTTP/1.1\r\nhost: h\r\n\r\n").await;
        // Never read: once the socket is full, nothing more goes out, and after the limit the
        // connection is closed.
        assert!(ended(server).await.is_none());
        assert!(dropped.load(Ordering::SeqCst), "the answer is dropped with the connection");
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            let mut total = 0usize;
            let mut chunk = vec![0u8; 1 << 20];
            loop {
                match client.io.read(&mut chunk).await {
                    Ok(0) | Err(_) => return total,
                    Ok(n) => total += n,
                }
            }
        })
        .await
        .expect("the connection ends");
        assert!(read > 0, "what the socket took before the stall is still delivered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_closes_idle_connections_and_lets_a_request_in_flight_finish() {
        let Served { mut client, drain, server, .. } = connect().await;
        drain.send_replace(true);
        assert!(client.closed().await);
        assert!(ended(server).await.is_none());

        let Served { mut client, drain, .. } = connect().await;
        client.send(b"POST /slow HTTP/1.1\r\nhost: h\r\ncontent-length: 4\r\n\r\nabcd").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        drain.send_replace(true);
        let (head, body) = client.response().await;
        assert_eq!(body, "POST /slow host=h body=abcd");
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(client.closed().await);
    }

    /// Including a body still on its way: the proxy may answer before it comes (a refusal), or
    /// time it out.
    #[tokio::test(start_paused = true)]
    async fn anything_else_goes_to_hyper_with_every_byte_read_and_why() {
        let long_head =
            format!("GET /echo HTTP/1.1\r\nhost: h\r\nx-long: {}\r\n\r\n", "a".repeat(4 * MAX_HEAD_BYTES));
        let many_lines = format!("GET /echo HTTP/1.1\r\nhost: h\r\n{}\r\n", "x-a: b\r\n".repeat(MAX_HEADERS));
        let cases: [(&[u8], HandOver); 13] = [
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", HandOver::ChunkedBody),
            (
                b"POST /echo HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                HandOver::ChunkedBody,
            ),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n", HandOver::Expect),
            (b"GET /echo HTTP/1.1\r\nhost: h\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n", HandOver::Upgrade),
            (b"GET /echo HTTP/1.0\r\n\r\n", HandOver::Http10),
            // hyper holds the rules for these: the head is not read further here.
            (b"GET /echo HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n", HandOver::Http10),
            (b"HEAD /echo HTTP/1.1\r\n\r\n", HandOver::HeadOrConnect),
            (b"CONNECT example.com:443 HTTP/1.1\r\nhost: h\r\n\r\n", HandOver::HeadOrConnect),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HandOver::Http2),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 1025\r\n\r\n", HandOver::BodyTooLarge),
            (b"GET /e cho HTTP/1.1\r\nhost: h\r\n\r\n", HandOver::Unparsable),
            (long_head.as_bytes(), HandOver::HeadTooLong),
            (many_lines.as_bytes(), HandOver::TooManyLines),
        ];
        for (case, reason) in cases {
            let name = String::from_utf8_lossy(&case[..case.len().min(60)]).into_owned();
            let Served { mut client, server, answered, drain: _drain, .. } = connect().await;
            client.send(case).await;
            let handed = tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .unwrap_or_else(|_| panic!("not handed over at once: {name}"))
                .expect("served")
                .unwrap_or_else(|| panic!("not handed over: {name}"));
            assert_eq!(handed.reason, reason, "{name}");
            assert!(!answered.load(Ordering::SeqCst), "{name}");
            // Every byte read goes with it: all of it, or all of a head longer than the limit.
            if case == long_head.as_bytes() {
                assert!(case.starts_with(&handed.read) && handed.read.len() >= MAX_HEAD_BYTES);
            } else {
                assert_eq!(handed.read, case, "{name}");
            }
        }
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client.send(b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 11\r\n\r\nhel").await;
        let handed = ended(server).await.expect("handed over after a moment");
        assert_eq!(handed.reason, HandOver::TrailingBody);
    }

    /// `PRI * HTTP/2` does not parse before the preface is whole: the reason is the same however
    /// the network cut it.
    #[tokio::test(start_paused = true)]
    async fn a_cut_http2_preface_is_waited_for_whole() {
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client.send(b"PRI * HTTP/2").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.send(b".0\r\n\r\nSM\r\n\r\n").await;
        let handed = ended(server).await.expect("handed over");
        assert_eq!(handed.reason, HandOver::Http2);
        assert_eq!(handed.read, &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..]);
    }

    /// RFC 9112: one `Host`, one length, no coding but chunked. hyper would take these; here the
    /// answer is the gateway's, at once (the body is not waited for), and the connection ends.
    #[tokio::test(start_paused = true)]
    async fn a_head_that_breaks_the_rules_is_refused_and_its_connection_closed() {
        let cases: [(&[u8], &str); 8] = [
            (b"GET /echo HTTP/1.1\r\n\r\n", "invalid_request"),
            (b"GET /echo HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n", "invalid_request"),
            (b"GET /echo HTTP/1.1\r\nhost: a b\r\n\r\n", "invalid_request"),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 1, 1\r\n\r\na", "invalid_request"),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\na", "invalid_request"),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ncontent-length: +1\r\n\r\na", "invalid_request"),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\n", "unsupported_transfer_coding"),
            (b"POST /echo HTTP/1.1\r\nhost: h\r\ntransfer-encoding: identity\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n", "unsupported_transfer_coding"),
        ];
        for (case, code) in cases {
            let name = String::from_utf8_lossy(case).into_owned();
            let Served { mut client, server, answered, drain: _drain, .. } = connect().await;
            client.send(case).await;
            let (head, body) = client.response().await;
            let status = if code == "invalid_request" { "400 Bad Request" } else { "501 Not Implemented" };
            let expected = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            assert_eq!(head, expected, "{name}");
            let error: serde_json::Value = serde_json::from_str(&body).expect("json");
            assert_eq!(error["error"]["code"], code, "{name}");
            assert!(client.closed().await, "{name}");
            // The server reads on until the client closes too.
            drop(client);
            assert!(ended(server).await.is_none(), "{name}: answered here, not by hyper");
            assert!(!answered.load(Ordering::SeqCst), "{name}: never answered as a request");
        }
    }

    /// The refusal does not wait for the body it refuses, and reads what the client sends of it
    /// meanwhile, so that the client is not reset before it reads the answer.
    #[tokio::test(start_paused = true)]
    async fn a_client_still_sending_a_refused_body_gets_the_answer() {
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client.send(b"POST /echo HTTP/1.1\r\nhost: h\r\ntransfer-encoding: gzip, chunked\r\n\r\n").await;
        let piece = format!("{:x}\r\n{}\r\n", 60_000, "x".repeat(60_000));
        for _ in 0..8 {
            client.send(piece.as_bytes()).await;
        }
        assert_eq!(client.response().await.0.lines().next(), Some("HTTP/1.1 501 Not Implemented"));
        drop(client);
        assert!(ended(server).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_handed_over_reads_what_was_read_first() {
        let Served { mut client, server, drain: _drain, .. } = connect().await;
        client.send(b"GET /echo HTTP/1.0\r\n\r\n").await;
        let handed = ended(server).await.expect("handed over");
        let mut rewind = Rewind::new(handed.io, handed.read, IDLE);
        client.send(b"more").await;
        let mut seen = vec![0; 5];
        rewind.read_exact(&mut seen).await.expect("read");
        assert_eq!(seen, b"GET /");
        let mut rest = vec![0; 21];
        rewind.read_exact(&mut rest).await.expect("read");
        assert_eq!(rest, b"echo HTTP/1.0\r\n\r\nmore");
        rewind.write_all(b"to the client").await.expect("write");
        let mut echoed = vec![0; 13];
        client.io.read_exact(&mut echoed).await.expect("read");
        assert_eq!(echoed, b"to the client");
    }
}
