//! HTTP/1.1 to a provider, on the request's own task. The future that awaits the answer writes the
//! request and reads the response head; the response body reads the rest as the client's connection
//! polls it, and gives the connection back to its pool once the answer is read. A general-purpose
//! client drives each connection from a task of its own, with a channel and a wake-up between that
//! task and the request's at every step: here there is none.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use recovea_http1::{Decoder, ResponseHead, ThroughProxy, final_head_in, parse_response, request_head};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::Home;
use crate::body::BoxError;

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

/// How a provider's connection failed an answer, besides bytes the codec refuses
/// ([`recovea_http1::Error`]) and the socket's own errors.
#[derive(Debug)]
pub(super) enum Cut {
    /// Closed before a whole response head.
    BeforeHead,
    /// Closed before the body's end.
    BeforeEnd,
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BeforeHead => "the server closed the connection without answering",
            Self::BeforeEnd => "the server closed the connection before the answer's end",
        })
    }
}

impl std::error::Error for Cut {}

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
        let through_proxy =
            self.via_proxy.as_ref().map(|proxy| ThroughProxy { authorization: proxy.authorization.as_ref() });
        let mut out = request_head(request, host, through_proxy);
        if body.len() <= JOIN_BODY_BYTES {
            out.extend_from_slice(body);
        }
        let parts = [&out[..], if body.len() > JOIN_BODY_BYTES { &body[..] } else { &[] }];
        let mut sent = [0; 2];
        let whole = std::future::poll_fn(|cx| self.poll_write_request(cx, parts, &mut sent)).await?;
        let ResponseHead { parts, framing, keep_alive } = loop {
            match parse_response::<MAX_HEADERS>(&mut self.buf, request.method(), MAX_HEAD_BYTES) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(e) => return Err(Failure::Unanswered(e.into())),
            }
            self.buf.reserve(READ_BYTES);
            let nothing_yet = self.buf.is_empty() && whole;
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) if nothing_yet => return Err(Failure::Silent(Cut::BeforeHead.into())),
                Ok(0) => return Err(Failure::Unanswered(Cut::BeforeHead.into())),
                Ok(_) => {}
                Err(e) if nothing_yet => return Err(Failure::Silent(e.into())),
                Err(e) => return Err(Failure::Unanswered(e.into())),
            }
        };
        // A connection whose request was cut short carries nothing more.
        let keep_alive = keep_alive && whole;
        let decoder = Decoder::new(framing);
        let mut body = Body { connection: Some(self), decoder, keep_alive, home: Some(home), failed: None };
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
                Poll::Ready(Err(_)) if final_head_in::<MAX_HEADERS>(&self.buf, MAX_HEAD_BYTES) => {
                    return Poll::Ready(Ok(false));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Failure::Unwritten(e))),
                Poll::Pending => loop {
                    if final_head_in::<MAX_HEADERS>(&self.buf, MAX_HEAD_BYTES) {
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

/// A provider's response body, read off its connection as it is polled.
pub(crate) struct Body {
    /// `None` once the body is read (the connection given back or closed) or has failed.
    connection: Option<Connection>,
    decoder: Decoder,
    keep_alive: bool,
    home: Option<Home>,
    /// The error the next poll reports.
    failed: Option<BoxError>,
}

impl Body {
    /// Once the body is read, the connection goes back to its pool if it can carry another request
    /// (nothing read past the answer), and is closed otherwise.
    fn release_when_read(&mut self) {
        if !self.decoder.is_done() {
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
            if let Err(e) = this.decoder.skip_framing(&mut connection.buf) {
                return this.fail(cx, e.into());
            }
            let data = this.decoder.take_data(&mut connection.buf);
            // The end may already be in the buffer: seen now, the connection is free for the next
            // request before this one's last bytes have even gone to the client.
            // An error here is met again, and reported, at the next poll: after this data.
            if data.is_some() {
                let _ = this.decoder.skip_framing(&mut connection.buf);
            }
            this.release_when_read();
            if let Some(data) = data {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            let Some(connection) = this.connection.as_mut() else { return Poll::Ready(None) };
            connection.buf.reserve(READ_BYTES);
            match tokio_util::io::poll_read_buf(Pin::new(&mut connection.io), cx, &mut connection.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.decoder == Decoder::UntilClose => {
                    this.decoder = Decoder::Done;
                    this.connection = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => return this.fail(cx, Cut::BeforeEnd.into()),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(cx, e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.exact_remaining().map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The bytes an HTTP/1.1 connection travels on.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use recovea_http1::{Error, FramingError};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;
    use crate::{ProviderNetwork, Upstream, UpstreamError};

    const LIMIT: Duration = Duration::from_secs(5);

    /// A provider that answers every connection's first request with `answer`, then closes it.
    async fn provider(answer: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let _ = stream.read(&mut request).await;
                    let _ = stream.write_all(answer).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        url
    }

    /// The same `Content-Length` and transfer-coding rules as the client side's: an answer whose
    /// end could be read two ways, or whose bytes are coded, is no answer (a 502).
    #[tokio::test]
    async fn an_answer_whose_framing_the_codec_refuses_is_no_answer() {
        let cases: [(&[u8], FramingError); 4] = [
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nhi", FramingError::LengthRepeated),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nContent-Length: 2\r\n\r\nhi",
                FramingError::LengthRepeated,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
                FramingError::CodingUnsupported,
            ),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nhi", FramingError::ChunkedNotLast),
        ];
        for (answer, refused) in cases {
            let url = provider(answer).await;
            let upstream = Upstream::new(LIMIT, 0, &ProviderNetwork::default());
            let request =
                Request::post(format!("{url}/v1/x")).body(Bytes::from_static(b"{}")).expect("request");
            let name = String::from_utf8_lossy(answer);
            match upstream.send(request, LIMIT).await.err() {
                Some(UpstreamError::Unreachable(e)) => {
                    assert_eq!(e.downcast_ref::<Error>(), Some(&Error::Framing(refused)), "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        let url = provider(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi").await;
        let request = Request::post(format!("{url}/v1/x")).body(Bytes::from_static(b"{}")).expect("request");
        assert!(
            Upstream::new(LIMIT, 0, &ProviderNetwork::default()).send(request, LIMIT).await.is_ok(),
            "and one length is an answer"
        );
    }
}
