//! The client that carries requests to providers: HTTP/1.1 (our own, run on the request's task)
//! and HTTP/2 (the `h2` crate, when TLS negotiates it), with a pool of connections for each
//! connection worker.
//!
//! A crate of its own so that whatever reaches providers reaches them alike: the gateway's nodes
//! (and their calls to the control plane, the OTLP collector and the alarm webhook), and the
//! control plane's job poller, trust the same roots (the public web's, or a private CA's beside or
//! instead of them), leave through the same egress proxy and speak HTTP/2 the same way. A
//! [`ProviderNetwork`] says how providers are reached (certificates, [`Egress`], the HTTP/2
//! connection bound); an [`Upstream`] built from it and a connect timeout sends requests
//! ([`Upstream::send`]), whose answers' bodies ([`UpstreamBody`]) fail once they stall.
//!
//! The boxed error and the answer body the gateway's request path passes around ([`BoxError`],
//! [`ResponseBody`], [`on_end`]) and its silence limits ([`Stall`], [`watch_unread`]) are here too,
//! since the client's answers are made of them.

mod body;
mod connect;
mod destination;
mod egress;
mod h1;
mod h2;
mod network;
mod stall;
mod upgrade;

pub use body::{BoxError, ResponseBody, on_end};
pub use destination::{
    Destinations, Listening, PrivateNetworks, is_metadata_host, is_metadata_service, listening_on,
};
pub use egress::Egress;
pub use network::ProviderNetwork;
pub use stall::{Stall, watch_unread};
pub use upgrade::{Switched, UpgradedIo};

use std::cell::Cell;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Method, Request, Response};
use http_body::{Frame, SizeHint};
use tokio::sync::watch;

use self::connect::{Connected, Connector};
use crate::stall::Stalled;

/// Why a provider gave no answer.
#[derive(Debug)]
pub enum UpstreamError {
    /// Connection refused, DNS or TLS failure, connect timeout, or a connection lost before the
    /// response head: the provider could not be reached.
    Unreachable(BoxError),
    /// Connected, but no response head within the limit.
    Timeout,
}

/// A pooled HTTP/1.1 connection unused this long is closed, as is the first HTTP/2 connection to
/// an origin.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An HTTP/2 connection beyond an origin's first closes once it has carried nothing this long: it
/// was opened for a burst that is over.
const EXTRA_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most idle connections one worker keeps to one provider; beyond, a connection whose answer
/// was read closes.
const MAX_PER_ORIGIN: usize = 256;
/// The most HTTP/2 connections an [`Upstream`] opens to one provider, unless
/// [`ProviderNetwork::new`] is told otherwise: at the 100 concurrent streams most providers allow
/// on each, room for 25,600 answers in flight.
pub const DEFAULT_HTTP2_CONNECTIONS: usize = 256;

/// How long an answer may go without a byte from its provider, or without its client taking a
/// byte, before it is cut, unless [`Upstream::with_idle_limit`] (the gateway's
/// `--stream-idle-timeout`) says otherwise. As long as the wait for an answer's head
/// (`--upstream-timeout`'s default): a reasoning model may think for minutes between two events of
/// a stream, as it may before a whole answer.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

thread_local! {
    /// Which pool of provider connections this thread's requests use: 0 for any thread that is not
    /// a connection worker (tests calling the gateway directly, for one).
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// Makes the calling thread use pool `lane` (a connection worker's own).
pub fn use_lane(lane: usize) {
    LANE.set(lane);
}

/// One pool of provider connections per connection worker (lanes 1 to n) and one for every other
/// thread (lane 0). A connection's socket belongs to the runtime of the thread that opened it;
/// sharing one pool between threads would hand a request on one thread a socket woken by another.
///
/// A lane is a short list of origins. An HTTP/1.1 request takes the origin's most recently used idle
/// connection that is still open, and its answer's body gives the connection back once read: no
/// task, channel or hash per request, as a general-purpose pool needs. An HTTP/2 request takes a
/// place on the first of the origin's connections with a stream free; when none has, one request
/// opens another connection (up to the lane's share of the bound) while the others wait for it.
pub struct Upstream {
    connector: Connector,
    lanes: Lanes,
    /// The most HTTP/2 connections one lane opens to one origin.
    http2_per_lane: usize,
    /// An answer's body that brings nothing for this long fails (see [`UpstreamBody`]).
    idle_limit: Duration,
    stats: Arc<UpstreamStats>,
}

type Lanes = Arc<[Mutex<Vec<Origin>>]>;

/// What the pool counts, for `/metrics`.
#[derive(Default)]
pub struct UpstreamStats {
    /// Connections opened, by protocol: HTTP/1.1, HTTP/2.
    pub(crate) opened: [AtomicU64; 2],
    /// Requests sent again on another connection, by [`Retry`].
    pub(crate) retries: [AtomicU64; 3],
}

impl UpstreamStats {
    /// Connections opened so far, by protocol: `http1`, `http2`.
    pub fn opened_by_protocol(&self) -> [(&'static str, u64); 2] {
        let [http1, http2] = &self.opened;
        [("http1", http1.load(Relaxed)), ("http2", http2.load(Relaxed))]
    }

    /// Requests sent again on a new connection so far, by why it was safe: `unwritten`, `refused`,
    /// `silent`.
    pub fn retries_by_reason(&self) -> [(&'static str, u64); 3] {
        Retry::ALL.map(|why| (why.label(), self.retries[why as usize].load(Relaxed)))
    }
}

/// What a provider's origin was last spoken to in over TLS; plain `http` is always HTTP/1.1.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// No connection made yet.
    Unknown,
    Http1,
    Http2,
}

/// The outcome of opening a connection, for the requests waiting on it: `None` while it opens.
type Opened = Option<Result<(), Arc<str>>>;

/// The connections of one lane to one scheme and authority.
struct Origin {
    scheme: Scheme,
    authority: Authority,
    /// The `Host` header of its HTTP/1.1 requests.
    host: HeaderValue,
    speaks: Speaks,
    idle: Vec<h1::Connection>,
    http2: Vec<h2::Multiplexed>,
    /// A connection being opened for requests that found no stream free: they wait for it rather
    /// than each opening its own.
    opening: Option<watch::Receiver<Opened>>,
}

/// Where an HTTP/1.1 connection goes back once its answer is read. Origins are never removed
/// from a lane, so an index stays good.
pub(crate) struct Home {
    lanes: Lanes,
    lane: usize,
    origin: usize,
}

impl Home {
    fn give_back(self, connection: h1::Connection) {
        let mut origins = lock(&self.lanes[self.lane]);
        if let Some(origin) = origins.get_mut(self.origin)
            && origin.idle.len() < MAX_PER_ORIGIN
        {
            origin.idle.push(connection);
        }
    }
}

/// What a request goes out on.
enum Carrier {
    Http1(h1::Connection),
    Http2(h2::Claimed),
}

/// What a request does next to find its carrier.
enum Next {
    /// A pooled connection (reused).
    Pooled(Carrier),
    /// Waits for the connection another request is opening, then looks again.
    Wait(watch::Receiver<Opened>),
    /// Opens a connection that other requests wait for.
    Open(watch::Sender<Opened>),
    /// Opens an HTTP/1.1 connection of its own: one carries one request at a time.
    Connect,
}

/// Why a request went again on another connection: the labels of
/// `recovea_upstream_retries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// HTTP/1.1: a reused connection could not take the request (the provider had closed it).
    Unwritten,
    /// HTTP/2: the provider refused the stream or its `GOAWAY` left it unprocessed.
    Refused,
    /// A safe method (`GET`, `HEAD`, `OPTIONS`) whose reused connection closed before a byte of
    /// the answer.
    Silent,
}

impl Retry {
    pub(crate) const ALL: [Retry; 3] = [Retry::Unwritten, Retry::Refused, Retry::Silent];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Retry::Unwritten => "unwritten",
            Retry::Refused => "refused",
            Retry::Silent => "silent",
        }
    }
}

/// How an exchange failed, as far as retrying it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failed {
    /// The provider cannot have acted on the request: it was never written whole, or the provider
    /// said it did not process it.
    Unprocessed,
    /// Written whole; the connection closed before any byte of an answer.
    Silent,
    /// Anything else: the provider may have acted on it, or answered in part.
    Unanswered,
}

/// Whether a request whose exchange failed as `failed` goes again on another connection. Only
/// where the provider cannot have acted on it, or where acting twice changes nothing and bills
/// nothing (a safe method, RFC 9110 §9.2.1): a generation sent twice could be charged twice, so a
/// `POST` the provider received is never sent again. At most once, on a connection that was
/// reused (a fresh one failing says the provider is in trouble) or refused by HTTP/2.
fn retry_for(failed: Failed, method: &Method, reused: bool, protocol_refused: bool) -> Option<Retry> {
    let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    match failed {
        Failed::Unprocessed if protocol_refused => Some(Retry::Refused),
        Failed::Unprocessed if reused => Some(Retry::Unwritten),
        Failed::Silent if reused && safe => Some(Retry::Silent),
        _ => None,
    }
}

impl Upstream {
    /// A client with a pool for each of `workers` connection workers (see [`use_lane`]) and one for
    /// every other thread, reaching providers as `network` says, each connection set up within
    /// `connect_timeout`.
    pub fn new(connect_timeout: Duration, workers: usize, network: &ProviderNetwork) -> Self {
        let lanes = workers + 1;
        Self {
            connector: Connector::new(connect_timeout, network),
            lanes: (0..lanes).map(|_| Mutex::new(Vec::new())).collect(),
            http2_per_lane: network.http2_connections.div_ceil(workers.max(1)),
            idle_limit: DEFAULT_STREAM_IDLE_TIMEOUT,
            stats: Arc::default(),
        }
    }

    /// Answers whose provider sends no byte of the body for `limit` fail.
    pub fn with_idle_limit(mut self, limit: Duration) -> Self {
        self.idle_limit = limit;
        self
    }

    /// Prunes the calling thread's pool: the connections the provider closed or that were idle too
    /// long close (see `Origin::prune`). A connection worker calls it every second.
    pub fn prune(&self) {
        let now = Instant::now();
        let lane = &self.lanes[LANE.get() % self.lanes.len()];
        for origin in lock(lane).iter_mut() {
            origin.prune(now);
        }
    }

    /// How many connection workers have a pool of their own.
    pub fn worker_lanes(&self) -> usize {
        self.lanes.len() - 1
    }

    /// What the pool counts, shared with whoever renders it.
    pub fn stats(&self) -> &Arc<UpstreamStats> {
        &self.stats
    }

    /// Sends `request` (whose URI is absolute) and waits at most `timeout` for the response head.
    /// The body then streams, each wait for its next bytes limited by the idle limit.
    pub async fn send(
        &self,
        request: Request<Bytes>,
        timeout: Duration,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // Boxed: a dispatch future is some 1.3 KB, moved twice into the timeout and again with
        // every future that awaits this one; a box moves a pointer.
        match tokio::time::timeout(timeout, Box::pin(self.dispatch(request))).await {
            Ok(Ok(response)) => Ok(response.map(|body| UpstreamBody::new(body, self.idle_limit))),
            Ok(Err(e)) => Err(UpstreamError::Unreachable(e)),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn dispatch(&self, request: Request<Bytes>) -> Result<Response<Carried>, BoxError> {
        let (scheme, authority) = match (request.uri().scheme(), request.uri().authority()) {
            (Some(scheme), Some(authority)) => (scheme.clone(), authority.clone()),
            _ => return Err(format!("not an absolute URI: {}", request.uri()).into()),
        };
        let lane = LANE.get() % self.lanes.len();
        let (origin, host) = {
            let mut origins = lock(&self.lanes[lane]);
            let origin = origin_of(&mut origins, &scheme, &authority)?;
            (origin, origins[origin].host.clone())
        };
        let home = || Home { lanes: Arc::clone(&self.lanes), lane, origin };
        let mut retried = false;
        loop {
            // A retry goes on a new connection, never on another pooled one that may be as stale.
            let next = if retried {
                Next::Connect
            } else {
                lock(&self.lanes[lane])[origin].next(self.http2_per_lane)
            };
            let (carrier, reused) = match next {
                Next::Pooled(carrier) => (carrier, true),
                Next::Wait(mut opened) => {
                    // A closed channel: the request opening it was dropped; look again.
                    if let Ok(outcome) = opened.wait_for(Option::is_some).await
                        && let Some(Err(why)) = &*outcome
                    {
                        return Err(why.to_string().into());
                    }
                    continue;
                }
                Next::Open(done) => {
                    let opening = Opening { home: home(), done: Some(done) };
                    // Boxed: connecting (TLS included) is a large future, and most requests never make one.
                    let connected = Box::pin(self.connector.connect(&scheme, &authority)).await;
                    (opening.finish(connected, &self.stats)?, false)
                }
                Next::Connect => {
                    let connected = Box::pin(self.connector.connect(&scheme, &authority)).await?;
                    (lock(&self.lanes[lane])[origin].adopt(connected, &self.stats), false)
                }
            };
            let (failed, error, refused) = match carrier {
                Carrier::Http1(connection) => match connection.exchange(&request, &host, home()).await {
                    Ok(response) => return Ok(response.map(Carried::Http1)),
                    Err(h1::Failure::Unwritten(e)) => (Failed::Unprocessed, e.into(), false),
                    Err(h1::Failure::Silent(e)) => (Failed::Silent, e, false),
                    Err(h1::Failure::Unanswered(e)) => (Failed::Unanswered, e, false),
                },
                Carrier::Http2(claimed) => match claimed.send(&request).await {
                    Ok(response) => return Ok(response.map(Carried::Http2)),
                    Err(h2::Failure::Unprocessed(e)) => (Failed::Unprocessed, e.into(), true),
                    Err(h2::Failure::Unanswered(e)) => (Failed::Unanswered, e.into(), false),
                },
            };
            match retry_for(failed, request.method(), reused, refused) {
                Some(why) if !retried => {
                    retried = true;
                    self.stats.retries[why as usize].fetch_add(1, Relaxed);
                    tracing::debug!(?why, error = %error, "a request goes again on a new connection");
                }
                _ => return Err(error),
            }
        }
    }
}

/// A connection being opened that other requests wait for. Dropped unfinished (its request was
/// abandoned), it lets them look again.
struct Opening {
    home: Home,
    done: Option<watch::Sender<Opened>>,
}

impl Opening {
    /// Pools what `connected` gave and tells the waiting requests; the carrier of the request
    /// that opened it.
    fn finish(
        mut self,
        connected: Result<Connected, BoxError>,
        stats: &UpstreamStats,
    ) -> Result<Carrier, BoxError> {
        let outcome;
        let carrier = {
            let mut origins = lock(&self.home.lanes[self.home.lane]);
            let origin = &mut origins[self.home.origin];
            origin.opening = None;
            match connected {
                Ok(connected) => {
                    outcome = Ok(());
                    Ok(origin.adopt(connected, stats))
                }
                Err(e) => {
                    outcome = Err(Arc::from(e.to_string()));
                    Err(e)
                }
            }
        };
        if let Some(done) = self.done.take() {
            done.send_replace(Some(outcome));
        }
        carrier
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if self.done.is_some() {
            lock(&self.home.lanes[self.home.lane])[self.home.origin].opening = None;
        }
    }
}

/// The place of the origin of `scheme` and `authority` in a lane's list, added if new.
fn origin_of(origins: &mut Vec<Origin>, scheme: &Scheme, authority: &Authority) -> Result<usize, BoxError> {
    if let Some(at) = origins.iter().position(|o| o.scheme == *scheme && o.authority == *authority) {
        return Ok(at);
    }
    origins.push(Origin {
        scheme: scheme.clone(),
        authority: authority.clone(),
        host: host_header(scheme, authority)?,
        speaks: if *scheme == Scheme::HTTPS { Speaks::Unknown } else { Speaks::Http1 },
        idle: Vec::new(),
        http2: Vec::new(),
        opening: None,
    });
    Ok(origins.len() - 1)
}

/// `host[:port]`, the port only when it is not the scheme's own, as an HTTP/1.1 server expects.
fn host_header(scheme: &Scheme, authority: &Authority) -> Result<HeaderValue, BoxError> {
    let default_port = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => format!("{}:{port}", authority.host()),
        _ => authority.host().to_owned(),
    };
    Ok(HeaderValue::try_from(host)?)
}

impl Origin {
    /// What the next request does: take a pooled connection (the multiplexed one with a stream
    /// free, or the most recently used idle one still open), wait for one being opened, or open one.
    fn next(&mut self, http2_bound: usize) -> Next {
        if self.speaks == Speaks::Http1 {
            let now = Instant::now();
            while let Some(mut connection) = self.idle.pop() {
                if usable(&mut connection, now) {
                    return Next::Pooled(Carrier::Http1(connection));
                }
            }
            return Next::Connect;
        }
        self.http2.retain(|connection| !connection.is_closed());
        if let Some(free) = self.http2.iter().find(|connection| connection.has_room()) {
            return Next::Pooled(Carrier::Http2(free.claim()));
        }
        if let Some(opening) = &self.opening {
            return Next::Wait(opening.clone());
        }
        if self.http2.len() >= http2_bound
            && let Some(least) = self.http2.iter().min_by_key(|connection| connection.open())
        {
            // At the bound: the request waits on the least busy connection for a stream to end.
            return Next::Pooled(Carrier::Http2(least.claim()));
        }
        let (done, opened) = watch::channel(None);
        self.opening = Some(opened);
        Next::Open(done)
    }

    /// Takes a new connection into the pool: an HTTP/2 one for every request, an HTTP/1.1 one for
    /// the request that opened it. Returns that request's carrier.
    fn adopt(&mut self, connected: Connected, stats: &UpstreamStats) -> Carrier {
        match connected {
            Connected::Http1(connection) => {
                stats.opened[0].fetch_add(1, Relaxed);
                if self.speaks == Speaks::Unknown || self.speaks == Speaks::Http2 {
                    self.speaks = Speaks::Http1;
                }
                Carrier::Http1(connection)
            }
            Connected::Http2(connection) => {
                stats.opened[1].fetch_add(1, Relaxed);
                self.speaks = Speaks::Http2;
                let claimed = connection.claim();
                self.http2.push(connection);
                Carrier::Http2(claimed)
            }
        }
    }

    /// Drops the idle connections that the provider closed or that were unused too long: without
    /// it, a closed one would hold its socket until the next request to its origin. HTTP/2
    /// connections beyond the first close sooner, once their burst is over.
    fn prune(&mut self, now: Instant) {
        self.idle.retain_mut(|c| usable(c, now));
        let tokio_now = tokio::time::Instant::now();
        let mut kept = 0;
        self.http2.retain(|connection| {
            let limit = if kept == 0 { IDLE_TIMEOUT } else { EXTRA_IDLE_TIMEOUT };
            let keep = !connection.is_closed() && !connection.idle_for(limit, tokio_now);
            kept += usize::from(keep);
            keep
        });
    }
}

/// Whether an idle connection can carry a request: still open, and not idle too long.
fn usable(connection: &mut h1::Connection, now: Instant) -> bool {
    connection.is_open() && now.duration_since(connection.idle_since) <= IDLE_TIMEOUT
}

fn lock(lane: &Mutex<Vec<Origin>>) -> MutexGuard<'_, Vec<Origin>> {
    // A panic while holding the lock leaves at worst a connection list to prune.
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

pin_project_lite::pin_project! {
    /// A provider's answer body. One that brings nothing for the idle limit while it is awaited
    /// (a provider stalled mid-answer, streamed or not) fails: its connection is closed, and the
    /// client's connection cuts the answer there, as for any provider's cut. The timer is that of
    /// [`Stall`]: nothing per piece that flows but moving a deadline.
    pub struct UpstreamBody {
        carried: Carried,
        #[pin]
        stall: Stall,
    }
}

impl UpstreamBody {
    fn new(carried: Carried, idle_limit: Duration) -> Self {
        Self { carried, stall: Stall::new(idle_limit) }
    }
}

/// A provider's answer body, by the protocol that carries it.
pub(crate) enum Carried {
    Http1(h1::Body),
    Http2(h2::Body),
    /// Cut for its silence; its connection is gone.
    Cut,
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = match this.carried {
            Carried::Http1(body) => Pin::new(body).poll_frame(cx),
            Carried::Http2(body) => Pin::new(body).poll_frame(cx).map_err(BoxError::from),
            Carried::Cut => return Poll::Ready(None),
        };
        if polled.is_ready() {
            this.stall.moved();
            return polled;
        }
        if this.stall.as_mut().poll_stalled(cx).is_pending() {
            return Poll::Pending;
        }
        *this.carried = Carried::Cut;
        let limit = this.stall.limit();
        tracing::warn!(?limit, "a provider sent nothing more of its answer: the answer is cut");
        Poll::Ready(Some(Err(Stalled { what: "the provider sent nothing", limit }.into())))
    }

    fn is_end_stream(&self) -> bool {
        match &self.carried {
            Carried::Http1(body) => body.is_end_stream(),
            Carried::Http2(body) => body.is_end_stream(),
            Carried::Cut => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.carried {
            Carried::Http1(body) => body.size_hint(),
            Carried::Http2(body) => body.size_hint(),
            Carried::Cut => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use http_body_util::{BodyExt, Full};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    use super::*;

    /// How a test provider answers one request (its head as text, its body): the bytes to send,
    /// and whether to close the connection after them, without saying so.
    type Script = fn(&str, &[u8]) -> (Vec<u8>, bool);

    /// A provider that answers each request as `script` says, counting the connections it accepts.
    async fn scripted(script: Script) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, SeqCst);
                tokio::spawn(answer_as(stream, script));
            }
        });
        (url, accepted)
    }

    /// Answers the requests that come on `stream` as `script` says.
    async fn answer_as<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, script: Script) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let end = loop {
                if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .map_or(0, |n| n.parse::<usize>().expect("length"));
            while buf.len() < end + length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let (answer, close) = script(&head, &buf[end..end + length]);
            buf.drain(..end + length);
            if stream.write_all(&answer).await.is_err() || stream.flush().await.is_err() || close {
                return;
            }
        }
    }

    /// A provider on `https://127.0.0.1`, certified by the tests' CA (`recovea_testkit::tls`), that
    /// offers `protocol` by ALPN: over HTTP/1.1 it answers "hi", over HTTP/2 "over h2".
    async fn tls_provider(protocol: &[u8]) -> (String, Arc<AtomicUsize>) {
        let acceptor = tokio_rustls::TlsAcceptor::from(recovea_testkit::tls::server_config(&[protocol]));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let http2 = protocol == b"h2";
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    if !http2 {
                        return answer_as(stream, |_, _| (ok("hi"), false)).await;
                    }
                    let answer = hyper::service::service_fn(|_| async {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("over h2"))))
                    });
                    let server =
                        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let _ = server.serve_connection(hyper_util::rt::TokioIo::new(stream), answer).await;
                });
            }
        });
        (url, accepted)
    }

    /// A client of plain `http` providers.
    fn plain() -> Upstream {
        Upstream::new(LIMIT, 0, &ProviderNetwork::default())
    }

    /// A client that trusts the tests' CA only.
    fn trusting_test_ca() -> ProviderNetwork {
        let ca = recovea_testkit::tls::CA_PEM;
        ProviderNetwork::new(Some(ca), true, Egress::default(), DEFAULT_HTTP2_CONNECTIONS).expect("valid")
    }

    fn ok(body: &str) -> Vec<u8> {
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
    }

    fn get(url: &str) -> Request<Bytes> {
        Request::get(format!("{url}/v1/models")).body(Bytes::new()).expect("request")
    }

    async fn length(response: Response<UpstreamBody>) -> usize {
        response.into_body().collect().await.expect("body").to_bytes().len()
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_connection_carries_one_request_after_another_and_concurrent_ones_get_their_own() {
        // Too large to be read off the connection before the client reads it.
        const BODY: usize = 4 << 20;
        let (url, accepted) = scripted(|_, _| (ok(&"o".repeat(BODY)), false)).await;
        let upstream = plain();
        for _ in 0..3 {
            let response = upstream.send(get(&url), LIMIT).await.expect("answered");
            assert_eq!(length(response).await, BODY);
        }
        assert_eq!(accepted.load(SeqCst), 1, "one connection for requests one after another");
        // A connection whose answer is still coming is busy: the next request opens another.
        let first = upstream.send(get(&url), LIMIT).await.expect("answered");
        let second = upstream.send(get(&url), LIMIT).await.expect("answered");
        assert_eq!(accepted.load(SeqCst), 2);
        assert_eq!((length(first).await, length(second).await), (BODY, BODY));
        for _ in 0..3 {
            length(upstream.send(get(&url), LIMIT).await.expect("answered")).await;
        }
        assert_eq!(accepted.load(SeqCst), 2, "both connections are reused once free");
    }

    #[tokio::test]
    async fn a_connection_the_provider_closed_is_not_used_again() {
        let (url, accepted) = scripted(|_, _| (ok("hi"), true)).await;
        let upstream = plain();
        for _ in 0..3 {
            let response = upstream.send(get(&url), LIMIT).await.expect("answered");
            assert_eq!(length(response).await, 2);
            until_every_idle_connection_is_closed(&upstream).await;
        }
        assert_eq!(accepted.load(SeqCst), 3);
        let kept = || lock(&upstream.lanes[0]).iter().map(|origin| origin.idle.len()).sum::<usize>();
        assert_eq!(kept(), 1, "the closed ones left the list when passed over: only the last is kept");
        upstream.prune();
        assert_eq!(kept(), 0, "the last one, closed too, leaves at the prune");
    }

    /// Waits (with a deadline) until the reactor has seen the provider's hang-up on each pooled
    /// connection, which the provider sent before its answer was read whole.
    async fn until_every_idle_connection_is_closed(upstream: &Upstream) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let open =
            || lock(&upstream.lanes[0]).iter_mut().any(|o| o.idle.iter_mut().any(h1::Connection::is_open));
        while open() {
            assert!(Instant::now() < deadline, "a hang-up never reached the client's socket");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The bodies of two requests in a row to a provider answering as `script` says, and how many
    /// connections they took. Neither waits for anything but the answer: a body read to the
    /// provider's hang-up, or one whose answer says `close`, leaves no connection to pool.
    async fn twice(method: http::Method, script: Script) -> (Vec<String>, usize) {
        let (url, accepted) = scripted(script).await;
        let upstream = plain();
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let request = Request::builder().method(method.clone()).uri(format!("{url}/v1/x"));
            let response =
                upstream.send(request.body(Bytes::new()).expect("request"), LIMIT).await.expect("answered");
            let body = response.into_body().collect().await.expect("body").to_bytes();
            bodies.push(String::from_utf8(body.to_vec()).expect("text"));
        }
        (bodies, accepted.load(SeqCst))
    }

    #[tokio::test]
    async fn each_way_of_ending_an_answer_is_read_whole_and_the_connection_kept_when_it_can_be() {
        let chunked = twice(http::Method::POST, |_, _| {
            let answer = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\n";
            (answer.into(), false)
        });
        assert_eq!(chunked.await, (vec!["hello world".to_owned(); 2], 1));
        let until_close =
            twice(http::Method::POST, |_, _| (b"HTTP/1.1 200 OK\r\n\r\nuntil close".to_vec(), true));
        assert_eq!(until_close.await, (vec!["until close".to_owned(); 2], 2));
        let said_close = twice(http::Method::POST, |_, _| {
            (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi".to_vec(), false)
        });
        assert_eq!(said_close.await, (vec!["hi".to_owned(); 2], 2));
        let continued = twice(http::Method::POST, |_, _| {
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n".to_vec(), false)
        });
        assert_eq!(continued.await, (vec![String::new(); 2], 1));
        let head = twice(http::Method::HEAD, |_, _| {
            (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n".to_vec(), false)
        });
        assert_eq!(head.await, (vec![String::new(); 2], 1));
    }

    #[tokio::test]
    async fn the_request_reaches_the_provider_as_sent() {
        let (url, _) = scripted(|head, body| {
            let echo = format!("{head}{}", String::from_utf8_lossy(body));
            (ok(&echo), false)
        })
        .await;
        let upstream = plain();
        for length in [10, 100_000] {
            let body = "b".repeat(length);
            let request = Request::post(format!("{url}/v1/echo?q=1"))
                .header("content-type", "application/json")
                .body(Bytes::from(body.clone()))
                .expect("request");
            let response = upstream.send(request, LIMIT).await.expect("answered");
            let echo = response.into_body().collect().await.expect("body").to_bytes();
            let authority = url.trim_start_matches("http://");
            let sent = format!(
                "POST /v1/echo?q=1 HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
                 content-length: {length}\r\n\r\n{body}"
            );
            assert_eq!(String::from_utf8_lossy(&echo), sent);
        }
    }

    #[tokio::test]
    async fn an_answer_cut_short_or_malformed_is_an_error_and_its_connection_is_not_kept() {
        let cases: [Script; 3] = [
            |_, _| (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(), true),
            |_, _| (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab".to_vec(), true),
            |_, _| {
                (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n".to_vec(), false)
            },
        ];
        for script in cases {
            let (url, accepted) = scripted(script).await;
            let upstream = plain();
            for _ in 0..2 {
                let response = upstream.send(get(&url), LIMIT).await.expect("a head");
                assert!(response.into_body().collect().await.is_err());
            }
            assert_eq!(accepted.load(SeqCst), 2);
        }
        let heads: [Script; 3] = [
            |_, _| (b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n".to_vec(), false),
            |_, _| (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n".to_vec(), false),
            |_, _| (Vec::new(), true),
        ];
        for script in heads {
            let (url, _) = scripted(script).await;
            let upstream = plain();
            assert!(matches!(upstream.send(get(&url), LIMIT).await, Err(UpstreamError::Unreachable(_))));
        }
    }

    #[tokio::test]
    async fn an_answer_that_comes_before_the_request_body_ends_is_the_answer() {
        // A provider that reads a request's head, refuses it, and reads nothing more for a while.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                stream.read_exact(&mut byte).await.expect("head");
                head.push(byte[0]);
            }
            let answer = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\n\r\ntoo big";
            stream.write_all(answer).await.expect("answer");
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let upstream = plain();
        // Far more than the socket buffers hold: the write stalls until the provider reads.
        let request =
            Request::post(format!("{url}/v1/x")).body(Bytes::from(vec![b'x'; 64 << 20])).expect("request");
        let response = upstream.send(request, LIMIT).await.expect("the provider's answer, not a timeout");
        assert_eq!(response.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(response.into_body().collect().await.expect("body").to_bytes(), "too big");
        let idle = lock(&upstream.lanes[0]).iter().map(|origin| origin.idle.len()).sum::<usize>();
        assert_eq!(idle, 0, "a connection whose request was cut short is not kept");
    }

    #[tokio::test]
    async fn an_answer_whose_provider_stops_sending_fails_after_the_idle_limit() {
        // Three bytes of ten, then nothing, the connection left open: only the limit ends it.
        let (url, _) =
            scripted(|_, _| (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(), false)).await;
        let upstream = plain().with_idle_limit(Duration::from_millis(200));
        let mut body = std::pin::pin!(upstream.send(get(&url), LIMIT).await.expect("answered").into_body());
        let first = body.frame().await.expect("a frame").expect("data").into_data().expect("data");
        assert_eq!(first, "abc");
        let cut = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("cut in time")
            .expect("a frame");
        let error = cut.expect_err("the stall is an error");
        assert!(error.is::<Stalled>(), "{error}");
        assert!(http_body::Body::is_end_stream(&*body));
        let idle = lock(&upstream.lanes[0]).iter().map(|origin| origin.idle.len()).sum::<usize>();
        assert_eq!(idle, 0, "the stalled connection is not kept");
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        const BODY: usize = 4 << 20;
        let (url, accepted) = scripted(|_, _| (ok(&"o".repeat(BODY)), false)).await;
        let upstream = plain();
        let mut body = Box::pin(upstream.send(get(&url), LIMIT).await.expect("answered").into_body());
        body.frame().await.expect("a frame").expect("data");
        drop(body);
        let idle = lock(&upstream.lanes[0]).iter().map(|origin| origin.idle.len()).sum::<usize>();
        assert_eq!(idle, 0, "the connection of a body not read to its end is not kept");
        assert_eq!(length(upstream.send(get(&url), LIMIT).await.expect("answered")).await, BODY);
        assert_eq!(accepted.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn a_provider_over_tls_is_spoken_to_in_the_protocol_it_offers_on_one_connection() {
        for (protocol, version, answer) in
            [(&b"http/1.1"[..], http::Version::HTTP_11, "hi"), (&b"h2"[..], http::Version::HTTP_2, "over h2")]
        {
            let (url, accepted) = tls_provider(protocol).await;
            let upstream = Upstream::new(LIMIT, 0, &trusting_test_ca());
            for _ in 0..3 {
                let response = upstream.send(get(&url), LIMIT).await.expect("answered");
                assert_eq!(response.version(), version);
                let body = response.into_body().collect().await.expect("body").to_bytes();
                assert_eq!(body, answer);
            }
            assert_eq!(accepted.load(SeqCst), 1, "{version:?}");
        }
    }

    #[tokio::test]
    async fn a_provider_whose_certificate_is_not_trusted_is_unreachable() {
        let (url, _) = tls_provider(b"http/1.1").await;
        let upstream = plain();
        assert!(matches!(upstream.send(get(&url), LIMIT).await, Err(UpstreamError::Unreachable(_))));
    }

    #[tokio::test]
    async fn an_unreachable_provider_and_a_relative_uri_are_errors() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let upstream = plain();
        assert!(matches!(upstream.send(get(&url), LIMIT).await, Err(UpstreamError::Unreachable(_))));
        let relative = Request::get("/v1/models").body(Bytes::new()).expect("request");
        assert!(matches!(upstream.send(relative, LIMIT).await, Err(UpstreamError::Unreachable(_))));
    }

    /// The number of HTTP/2 connections lane 0 keeps to its one origin.
    fn http2_pooled(upstream: &Upstream) -> usize {
        lock(&upstream.lanes[0]).iter().map(|origin| origin.http2.len()).sum()
    }

    #[tokio::test]
    async fn http2_opens_another_connection_when_every_stream_is_taken_and_extras_close_when_idle() {
        const STREAMS: usize = 500;
        const ALLOWED: u32 = 100;
        // A provider over TLS and HTTP/2 that allows 100 streams a connection; each answer sends its
        // first bytes at once and its last once released.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let acceptor = tokio_rustls::TlsAcceptor::from(recovea_testkit::tls::server_config(&[b"h2"]));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, SeqCst);
                let (acceptor, released) = (acceptor.clone(), released.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let answer = hyper::service::service_fn(move |_| {
                        let mut released = released.clone();
                        async move {
                            use futures_util::StreamExt;
                            let first = futures_util::stream::iter([Ok(Frame::data(Bytes::from("first")))]);
                            let last = futures_util::stream::once(async move {
                                let _ = released.wait_for(|done| *done).await;
                                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from("last")))
                            });
                            Ok::<_, std::convert::Infallible>(Response::new(http_body_util::StreamBody::new(
                                first.chain(last),
                            )))
                        }
                    });
                    let mut server =
                        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                    server.max_concurrent_streams(ALLOWED);
                    let _ = server.serve_connection(hyper_util::rt::TokioIo::new(stream), answer).await;
                });
            }
        });
        let upstream = Arc::new(Upstream::new(LIMIT, 0, &trusting_test_ca()));
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..STREAMS {
            let (upstream, url) = (Arc::clone(&upstream), url.clone());
            streams.spawn(async move {
                let response = upstream.send(get(&url), LIMIT).await.expect("answered");
                let mut body = Box::pin(response.into_body());
                let first = body.frame().await.expect("a frame").expect("data").into_data().expect("data");
                assert_eq!(first, "first");
                body
            });
        }
        // Every stream has its first bytes while none has ended: none waited for another.
        let mut bodies = Vec::new();
        let all_started = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(body) = streams.join_next().await {
                bodies.push(body.expect("a stream"));
            }
        });
        all_started.await.expect("every stream started without another ending");
        assert_eq!(bodies.len(), STREAMS);
        assert_eq!(
            accepted.load(SeqCst),
            STREAMS / ALLOWED as usize,
            "as many connections as needed, no more"
        );
        assert_eq!(http2_pooled(&upstream), STREAMS / ALLOWED as usize);
        assert_eq!(upstream.stats.opened[1].load(Relaxed), (STREAMS / ALLOWED as usize) as u64);
        release.send_replace(true);
        for body in bodies {
            let rest = body.collect().await.expect("the rest").to_bytes();
            assert_eq!(rest, "last");
        }
        // Once the burst is over, the extra connections close and the first stays for the next.
        upstream.prune();
        assert_eq!(http2_pooled(&upstream), STREAMS / ALLOWED as usize, "not idle long enough yet");
        tokio::time::pause();
        tokio::time::advance(EXTRA_IDLE_TIMEOUT + Duration::from_secs(1)).await;
        upstream.prune();
        assert_eq!(http2_pooled(&upstream), 1);
    }

    /// A network trusting the tests' CA, going out through `egress`.
    fn through(egress: Egress) -> ProviderNetwork {
        let ca = recovea_testkit::tls::CA_PEM;
        ProviderNetwork::new(Some(ca), false, egress, DEFAULT_HTTP2_CONNECTIONS).expect("valid")
    }

    fn egress(proxy: &str, no_proxy: Option<&str>) -> Egress {
        Egress::new(Some(proxy), no_proxy, |_| None).expect("valid")
    }

    #[tokio::test]
    async fn https_goes_through_the_egress_proxy_by_connect_and_http_in_absolute_form() {
        use recovea_testkit::proxy::{Asked, ConnectProxy};

        // "user:pass"
        let proxy = ConnectProxy::start(Some("Basic dXNlcjpwYXNz")).await;
        let via = egress(&format!("http://user:pass@{}", proxy.addr()), None);
        let mut expected = Vec::new();
        for (protocol, answer) in [(&b"http/1.1"[..], "hi"), (&b"h2"[..], "over h2")] {
            let (url, _) = tls_provider(protocol).await;
            let upstream = Upstream::new(LIMIT, 0, &through(via.clone()));
            let response = upstream.send(get(&url), LIMIT).await.expect("answered through the tunnel");
            assert_eq!(response.into_body().collect().await.expect("body").to_bytes(), answer);
            let authority = url.trim_start_matches("https://");
            expected.push(format!("CONNECT {authority} HTTP/1.1"));
        }
        let (url, _) = scripted(|_, _| (ok("plain"), false)).await;
        let upstream = Upstream::new(LIMIT, 0, &through(via));
        let response = upstream.send(get(&url), LIMIT).await.expect("answered through the proxy");
        assert_eq!(response.into_body().collect().await.expect("body").to_bytes(), "plain");
        expected.push(format!("GET {url}/v1/models HTTP/1.1"));
        let shown = Some("Basic dXNlcjpwYXNz".to_owned());
        let asked: Vec<Asked> = expected
            .into_iter()
            .map(|request_line| Asked { request_line, authorization: shown.clone() })
            .collect();
        assert_eq!(proxy.asked(), asked);

        // Wrong credentials: the proxy's refusal is the error, and the password is in none of it.
        let (url, _) = tls_provider(b"h2").await;
        let upstream =
            Upstream::new(LIMIT, 0, &through(egress(&format!("http://user:hunter2@{}", proxy.addr()), None)));
        match upstream.send(get(&url), LIMIT).await {
            Err(UpstreamError::Unreachable(e)) => {
                let e = e.to_string();
                assert!(e.contains("407"), "{e}");
                assert!(!e.contains("hunter2"), "{e}");
            }
            other => panic!("expected the proxy's refusal, got {:?}", other.map(|r| r.status())),
        }
        // A host the no-proxy list names is reached directly.
        let before = proxy.asked().len();
        let direct = egress(&format!("http://user:pass@{}", proxy.addr()), Some("127.0.0.1"));
        let upstream = Upstream::new(LIMIT, 0, &through(direct));
        assert_eq!(length(upstream.send(get(&url), LIMIT).await.expect("answered directly")).await, 7);
        assert_eq!(proxy.asked().len(), before);
    }

    #[tokio::test]
    async fn a_reused_connection_closed_unanswered_is_retried_only_for_a_safe_method() {
        // Each connection answers its first request and closes on its second without a word.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    for answered in [true, false] {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        if answered {
                            stream.write_all(&ok("hi")).await.expect("answer");
                        }
                    }
                });
            }
        });
        let upstream = plain();
        let retried = || upstream.stats.retries[Retry::Silent as usize].load(Relaxed);
        assert_eq!(length(upstream.send(get(&url), LIMIT).await.expect("first")).await, 2);
        // The pooled connection closes on this GET: it goes again on a new one.
        assert_eq!(length(upstream.send(get(&url), LIMIT).await.expect("retried")).await, 2);
        assert_eq!((accepted.load(SeqCst), retried()), (2, 1));
        // A POST the provider received may have been acted on: it is not sent again.
        let post = Request::post(format!("{url}/v1/chat/completions")).body(Bytes::new()).expect("request");
        assert!(matches!(upstream.send(post, LIMIT).await, Err(UpstreamError::Unreachable(_))));
        assert_eq!((accepted.load(SeqCst), retried()), (2, 1));
    }

    #[tokio::test]
    async fn a_stream_the_provider_refused_goes_again_on_a_new_connection_whatever_its_method() {
        // The first connection refuses every stream (REFUSED_STREAM: not processed); later ones answer.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let acceptor = tokio_rustls::TlsAcceptor::from(recovea_testkit::tls::server_config(&[b"h2"]));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let refuse = counter.fetch_add(1, SeqCst) == 0;
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let Ok(mut connection) = ::h2::server::handshake(stream).await else { return };
                    while let Some(Ok((_, mut respond))) = connection.accept().await {
                        if refuse {
                            respond.send_reset(::h2::Reason::REFUSED_STREAM);
                            continue;
                        }
                        let Ok(mut body) = respond.send_response(Response::new(()), false) else { return };
                        let _ = body.send_data(Bytes::from("over h2"), true);
                    }
                });
            }
        });
        let upstream = Upstream::new(LIMIT, 0, &trusting_test_ca());
        let post =
            Request::post(format!("{url}/v1/chat/completions")).body(Bytes::from("{}")).expect("request");
        let response = upstream.send(post, LIMIT).await.expect("answered on the second connection");
        assert_eq!(response.into_body().collect().await.expect("body").to_bytes(), "over h2");
        assert_eq!(accepted.load(SeqCst), 2);
        assert_eq!(upstream.stats.retries[Retry::Refused as usize].load(Relaxed), 1);
    }

    #[test]
    fn only_a_request_the_provider_cannot_have_acted_on_or_a_safe_one_is_retried() {
        let (get, post) = (Method::GET, Method::POST);
        assert_eq!(retry_for(Failed::Unprocessed, &post, true, false), Some(Retry::Unwritten));
        assert_eq!(retry_for(Failed::Unprocessed, &post, false, false), None, "a fresh connection failing");
        assert_eq!(retry_for(Failed::Unprocessed, &post, false, true), Some(Retry::Refused));
        assert_eq!(retry_for(Failed::Silent, &get, true, false), Some(Retry::Silent));
        assert_eq!(retry_for(Failed::Silent, &Method::HEAD, true, false), Some(Retry::Silent));
        assert_eq!(retry_for(Failed::Silent, &post, true, false), None, "a generation may be billed");
        assert_eq!(retry_for(Failed::Silent, &get, false, false), None);
        for method in [&get, &post] {
            assert_eq!(retry_for(Failed::Unanswered, method, true, false), None);
        }
    }
}
