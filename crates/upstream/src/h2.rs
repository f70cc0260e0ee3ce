//! HTTP/2 to a provider, by the `h2` crate: a connection carries as many concurrent requests as the
//! provider allows (`SETTINGS_MAX_CONCURRENT_STREAMS`), and this module counts them, so that the
//! pool (`super`) opens another connection instead of queueing behind a full one. hyper's client
//! would queue, and hides both counts.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{Reason, RecvStream};
use http::{HeaderMap, Request, Response, header};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::body::BoxError;

/// The window of one stream: a fast answer is never held up by it (an LLM's answer is far smaller),
/// and what it lets a provider send ahead of a slow client is bounded by it.
const STREAM_WINDOW: u32 = 1 << 20;
/// The window of a connection, shared by its streams: enough for every stream of a busy
/// connection to run ahead at once.
const CONNECTION_WINDOW: u32 = 16 << 20;
/// Until the provider's settings arrive, a connection is taken to allow this many streams: the
/// least RFC 9113 §6.5.2 recommends a server allow.
const ASSUMED_MAX_STREAMS: usize = 100;
/// A response head longer than this is refused, as over HTTP/1.1.
const MAX_HEADER_LIST: u32 = 64 << 10;

/// A connection, shared by every request it carries.
#[derive(Clone)]
pub(super) struct Multiplexed {
    sender: SendRequest<Bytes>,
    state: Arc<State>,
}

/// What the pool reads of a connection without polling it.
struct State {
    /// Requests claimed and not yet done (their answer's body read or dropped).
    open: AtomicUsize,
    /// The connection ended (the provider's GOAWAY, an error, or a close).
    closed: AtomicBool,
    /// When its last request was done, for the pool to close connections idle too long.
    idle_since: std::sync::Mutex<Instant>,
}

/// Why a request did not get its answer's head.
pub(super) enum Failure {
    /// The provider never received it, or said it did not act on it (`REFUSED_STREAM`, or a
    /// `GOAWAY` whose last stream is below it, RFC 9113 §8.7): it may go on another connection.
    Unprocessed(h2::Error),
    /// Sent, but no answer: the provider may have acted on it.
    Unanswered(h2::Error),
}

impl From<Failure> for BoxError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Unprocessed(e) | Failure::Unanswered(e) => Box::new(e),
        }
    }
}

/// Hands the connection's I/O to a task that drives it, as HTTP/2 needs (pings, windows and the
/// frames of every stream); the task marks the connection closed when it ends.
pub(super) async fn handshake<T>(io: T) -> Result<Multiplexed, h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_max_send_streams(ASSUMED_MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .enable_push(false)
        .handshake(io)
        .await?;
    let state = Arc::new(State {
        open: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        idle_since: std::sync::Mutex::new(Instant::now()),
    });
    let watched = Arc::clone(&state);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "an HTTP/2 connection to a provider ended");
        }
        watched.closed.store(true, Ordering::Release);
    });
    Ok(Multiplexed { sender, state })
}

impl Multiplexed {
    pub(super) fn is_closed(&self) -> bool {
        self.state.closed.load(Ordering::Acquire)
    }

    /// Requests it carries now.
    pub(super) fn open(&self) -> usize {
        self.state.open.load(Ordering::Relaxed)
    }

    /// Whether it can take another request without the request waiting for one to end.
    pub(super) fn has_room(&self) -> bool {
        !self.is_closed() && self.open() < self.sender.current_max_send_streams()
    }

    /// Whether it carried nothing for `limit`.
    pub(super) fn idle_for(&self, limit: Duration, now: Instant) -> bool {
        self.open() == 0 && now.duration_since(*lock(&self.state.idle_since)) >= limit
    }

    /// Counts a request on it, until the returned stream (or its answer's body) is dropped.
    pub(super) fn claim(&self) -> Claimed {
        self.state.open.fetch_add(1, Ordering::Relaxed);
        Claimed { sender: self.sender.clone(), slot: Slot(Arc::clone(&self.state)) }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request's place on a connection; dropping it frees the place.
struct Slot(Arc<State>);

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            *lock(&self.0.idle_since) = Instant::now();
        }
    }
}

/// A request counted on a connection, not yet sent.
pub(super) struct Claimed {
    sender: SendRequest<Bytes>,
    slot: Slot,
}

impl Claimed {
    /// Sends `request` (its URI absolute) and waits for the answer's head. When the connection
    /// has no stream free (the provider lowered its limit, or the pool is at its bound), waits
    /// for one.
    pub(super) async fn send(self, request: &Request<Bytes>) -> Result<Response<Body>, Failure> {
        let Self { sender, slot } = self;
        // Not ready means the connection is gone before the stream opened: nothing was sent.
        let mut sender = sender.ready().await.map_err(Failure::Unprocessed)?;
        let body = request.body();
        let (answer, mut sending) =
            sender.send_request(head(request), body.is_empty()).map_err(Failure::Unprocessed)?;
        if !body.is_empty() {
            // Queued whole: h2 sends it as the provider's window allows.
            sending.send_data(body.clone(), true).map_err(Failure::Unanswered)?;
        }
        let response = answer.await.map_err(|e| {
            let refused = e.is_remote() && (e.is_go_away() || e.reason() == Some(Reason::REFUSED_STREAM));
            if refused { Failure::Unprocessed(e) } else { Failure::Unanswered(e) }
        })?;
        Ok(response.map(|stream| Body { stream, trailers: false, _slot: slot }))
    }
}

/// The head of `request` for HTTP/2: its URI gives `:scheme`, `:authority` and `:path`; the headers
/// HTTP/2 forbids (RFC 9113 §8.2.2) and `Host` (the authority says it) are left out.
fn head(request: &Request<Bytes>) -> Request<()> {
    let mut headers = HeaderMap::with_capacity(request.headers().len());
    for (name, value) in request.headers() {
        let forbidden = matches!(
            *name,
            header::HOST
                | header::CONNECTION
                | header::TRANSFER_ENCODING
                | header::UPGRADE
                | header::TE
                | header::CONTENT_LENGTH
        ) || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection";
        if !forbidden {
            headers.append(name, value.clone());
        }
    }
    let mut head = Request::new(());
    *head.method_mut() = request.method().clone();
    *head.uri_mut() = request.uri().clone();
    *head.headers_mut() = headers;
    if !request.body().is_empty() {
        let mut digits = itoa::Buffer::new();
        let length = http::HeaderValue::from_str(digits.format(request.body().len()))
            .unwrap_or_else(|_| http::HeaderValue::from_static("0"));
        head.headers_mut().insert(header::CONTENT_LENGTH, length);
    }
    head
}

/// An answer's body over HTTP/2. What is read is given back to the provider's window at once: the
/// body is read only as fast as the client takes it, so the window bounds what waits in memory.
pub(crate) struct Body {
    stream: RecvStream,
    trailers: bool,
    _slot: Slot,
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.trailers {
            match ready!(this.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Fails only once the stream is gone, which the next poll reports.
                    let _ = this.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.trailers = true,
            }
        }
        match ready!(this.stream.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
