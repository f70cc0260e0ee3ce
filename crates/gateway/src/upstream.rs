//! The client that carries requests to providers: HTTP/1.1 and HTTP/2 over rustls, with a pool of
//! connections for each connection worker.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::Either;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::TokioExecutor;
use tower_service::Service;

use crate::proxy::BoxError;

/// Why a provider gave no answer.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// Connection refused, DNS or TLS failure, connect timeout, or a connection lost before the
    /// response head: the provider could not be reached.
    Unreachable(BoxError),
    /// Connected, but no response head within the limit.
    Timeout,
}

type Connector = ConnectWithin<HttpsConnector<HttpConnector>>;
type Body = Full<Bytes>;

/// A pooled connection unused this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often an origin's list is pruned of closed and idle connections: not on every request,
/// which at a few hundred connections costs more than the request's own pool work.
const PRUNE_EVERY: Duration = Duration::from_secs(1);
/// The most connections one worker keeps to one provider; beyond, a connection serves its request
/// and closes.
const MAX_PER_ORIGIN: usize = 256;

thread_local! {
    /// Which pool of provider connections this thread's requests use: 0 for any thread that is not
    /// a connection worker (tests calling the gateway directly, for one).
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// Makes the calling thread use pool `lane` (a connection worker's own).
pub(crate) fn use_lane(lane: usize) {
    LANE.set(lane);
}

/// One pool of provider connections per connection worker (lanes 1 to n) and one for every other
/// thread (lane 0). A connection is driven by a task on the thread that opened it; sharing one pool
/// between threads would hand a request on one thread a connection driven by another, and every
/// write and read of that request would then wake the other thread.
///
/// A lane is a short list of origins, each with its connections. A request takes the most
/// recently used connection that is ready (an HTTP/1.1 connection is ready again once the last
/// response's body has been read), hands its request to it, and leaves it in the list: no task,
/// channel or hash per request, as a general-purpose pool needs.
pub(crate) struct Upstream {
    connector: Connector,
    lanes: Vec<Mutex<Vec<Origin>>>,
}

/// The connections of one lane to one scheme and authority.
struct Origin {
    scheme: Scheme,
    authority: Authority,
    connections: Vec<Connection>,
    pruned_at: Instant,
}

struct Connection {
    sender: Sender,
    last_used: Instant,
}

enum Sender {
    Http1(http1::SendRequest<Body>),
    /// Multiplexed: one connection carries every request to its origin.
    Http2(http2::SendRequest<Body>),
}

impl Upstream {
    pub(crate) fn new(connect_timeout: Duration, workers: usize) -> Self {
        Self {
            connector: ConnectWithin { inner: https_connector(), limit: connect_timeout },
            lanes: (0..=workers).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// How many connection workers have a pool of their own.
    pub(crate) fn worker_lanes(&self) -> usize {
        self.lanes.len() - 1
    }

    /// Sends `request` (whose URI is absolute) and waits at most `timeout` for the response head.
    /// The body then streams.
    pub(crate) async fn send(
        &self,
        request: Request<Body>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(timeout, self.dispatch(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(UpstreamError::Unreachable(e)),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn dispatch(&self, request: Request<Body>) -> Result<Response<Incoming>, BoxError> {
        let (scheme, authority) = match (request.uri().scheme(), request.uri().authority()) {
            (Some(scheme), Some(authority)) => (scheme.clone(), authority.clone()),
            _ => return Err(format!("not an absolute URI: {}", request.uri()).into()),
        };
        let lane = &self.lanes[LANE.get() % self.lanes.len()];
        let pooled = send_pooled(&mut lock(lane), &scheme, &authority, request);
        let request = match pooled {
            Pooled::Sent(response) => match response.await {
                Ok(response) => return Ok(response),
                // A pooled connection that closed meanwhile gives the request back unsent.
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => with_absolute_uri(unsent, &scheme, &authority),
                    None => return Err(failed.into_error().into()),
                },
            },
            Pooled::NoneReady(request) => request,
        };
        // Boxed: connecting (TLS included) is a large future, and most requests never make one.
        let mut sender = Box::pin(self.connect(request.uri().clone())).await?;
        let response = sender.try_send(request);
        keep(&mut lock(lane), scheme, authority, sender);
        response.await.map_err(|failed| failed.into_error().into())
    }

    /// A new connection to the origin of `uri`, HTTP/2 when TLS negotiated it, driven by a task on
    /// this thread.
    async fn connect(&self, uri: Uri) -> Result<Sender, BoxError> {
        let mut connector = self.connector.clone();
        futures_util::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let io = connector.call(uri).await?;
        if io.connected().is_negotiated_h2() {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(connection);
            Ok(Sender::Http2(sender))
        } else {
            let (sender, connection) = http1::handshake(io).await?;
            tokio::spawn(connection);
            Ok(Sender::Http1(sender))
        }
    }
}

fn lock(lane: &Mutex<Vec<Origin>>) -> MutexGuard<'_, Vec<Origin>> {
    // A panic while holding the lock leaves at worst a connection list to prune.
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds a new connection to its origin's list, unless the list is full.
fn keep(origins: &mut Vec<Origin>, scheme: Scheme, authority: Authority, sender: Sender) {
    let at = match origins.iter().position(|o| o.scheme == scheme && o.authority == authority) {
        Some(at) => at,
        None => {
            origins.push(Origin { scheme, authority, connections: Vec::new(), pruned_at: Instant::now() });
            origins.len() - 1
        }
    };
    let connections = &mut origins[at].connections;
    if connections.len() >= MAX_PER_ORIGIN {
        connections.retain(|c| !c.sender.is_closed());
    }
    if connections.len() < MAX_PER_ORIGIN {
        connections.push(Connection { sender, last_used: Instant::now() });
    }
}

/// The response head, or the error; an error before the request was written gives it back.
type ResponseHead = Result<Response<Incoming>, TrySendError<Request<Body>>>;

/// What the pool did with a request.
#[allow(clippy::large_enum_variant, reason = "made and matched once a request, never stored")]
enum Pooled<F> {
    /// Handed to a pooled connection: the response head to wait for.
    Sent(F),
    NoneReady(Request<Body>),
}

/// Hands `request` to the most recently used ready connection to its origin, dropping the closed
/// and the long idle on the way (at most every [`PRUNE_EVERY`]).
fn send_pooled(
    origins: &mut [Origin],
    scheme: &Scheme,
    authority: &Authority,
    request: Request<Body>,
) -> Pooled<impl Future<Output = ResponseHead> + use<>> {
    let Some(origin) = origins.iter_mut().find(|o| o.scheme == *scheme && o.authority == *authority) else {
        return Pooled::NoneReady(request);
    };
    let now = Instant::now();
    if now.duration_since(origin.pruned_at) >= PRUNE_EVERY {
        let idle_too_long =
            |c: &Connection| c.sender.is_ready() && now.duration_since(c.last_used) > IDLE_TIMEOUT;
        origin.connections.retain(|c| !c.sender.is_closed() && !idle_too_long(c));
        origin.pruned_at = now;
    }
    // A closed connection is never ready, so one not yet pruned is passed over.
    match origin.connections.iter_mut().rev().find(|c| c.sender.is_ready()) {
        Some(connection) => {
            connection.last_used = now;
            Pooled::Sent(connection.sender.try_send(request))
        }
        None => Pooled::NoneReady(request),
    }
}

impl Sender {
    fn is_ready(&self) -> bool {
        match self {
            Sender::Http1(sender) => sender.is_ready(),
            Sender::Http2(sender) => sender.is_ready(),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sender::Http1(sender) => sender.is_closed(),
            Sender::Http2(sender) => sender.is_closed(),
        }
    }

    /// Hands the request to the connection at once; the future waits for the response head. An
    /// HTTP/1.1 request goes in origin form with a `Host` header; HTTP/2 takes the absolute URI.
    fn try_send(&mut self, request: Request<Body>) -> impl Future<Output = ResponseHead> + use<> {
        match self {
            Sender::Http1(sender) => Either::Left(sender.try_send_request(origin_form(request))),
            Sender::Http2(sender) => Either::Right(sender.try_send_request(request)),
        }
    }
}

/// `/path?query` with a `Host` header, as an HTTP/1.1 server expects.
fn origin_form(mut request: Request<Body>) -> Request<Body> {
    let uri = request.uri();
    if let (Some(authority), None) = (uri.authority(), request.headers().get(header::HOST)) {
        let default_port = match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        };
        let host = match uri.port_u16() {
            // `host:port` is the authority itself, unless it carries user information.
            Some(port) if port != default_port && !authority.as_str().contains('@') => {
                HeaderValue::from_str(authority.as_str())
            }
            Some(port) if port != default_port => {
                HeaderValue::from_str(&format!("{}:{port}", authority.host()))
            }
            _ => HeaderValue::from_str(authority.host()),
        };
        if let Ok(host) = host {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    let path = request.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    *request.uri_mut() = Uri::from(path);
    request
}

/// A request given back unsent, in origin form perhaps (its path kept), made absolute again for
/// another connection.
fn with_absolute_uri(mut request: Request<Body>, scheme: &Scheme, authority: &Authority) -> Request<Body> {
    let path = request.uri().path_and_query().cloned();
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(scheme.clone());
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(path.unwrap_or_else(|| PathAndQuery::from_static("/")));
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    request
}

fn https_connector() -> HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(60)));
    HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http)
}

/// Bounds the whole connection set-up (DNS, TCP and the TLS handshake) by one limit: a provider
/// that accepts but never completes a handshake is as unreachable as one that refuses.
#[derive(Clone)]
struct ConnectWithin<C> {
    inner: C,
    limit: Duration,
}

#[derive(Debug)]
struct ConnectTimeout;

impl std::fmt::Display for ConnectTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connecting to the provider timed out")
    }
}

impl std::error::Error for ConnectTimeout {}

impl<C> tower_service::Service<Uri> for ConnectWithin<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimeout) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A provider that answers every request with `body_bytes` of `o`, counting the connections it
    /// accepts. With `hang_up`, it closes each connection after one answer, without saying so.
    async fn provider(body_bytes: usize, hang_up: bool) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {body_bytes}\r\n\r\n");
                        answer.extend(std::iter::repeat_n('o', body_bytes));
                        if stream.write_all(answer.as_bytes()).await.is_err() || hang_up {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    fn get(url: &str) -> Request<Body> {
        Request::get(format!("{url}/v1/models")).body(Full::new(Bytes::new())).expect("request")
    }

    async fn length(response: Response<Incoming>) -> usize {
        response.into_body().collect().await.expect("body").to_bytes().len()
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_connection_carries_one_request_after_another_and_concurrent_ones_get_their_own() {
        // Too large to be read off the connection before the client reads it.
        const BODY: usize = 4 << 20;
        let (url, accepted) = provider(BODY, false).await;
        let upstream = Upstream::new(LIMIT, 0);
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
        let (url, accepted) = provider(2, true).await;
        let upstream = Upstream::new(LIMIT, 0);
        for _ in 0..3 {
            let response = upstream.send(get(&url), LIMIT).await.expect("answered");
            assert_eq!(length(response).await, 2);
            // The hang-up reaches the client's connection task.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(SeqCst), 3);
        // The closed ones leave the list at the next prune.
        tokio::time::sleep(PRUNE_EVERY).await;
        length(upstream.send(get(&url), LIMIT).await.expect("answered")).await;
        let kept = lock(&upstream.lanes[0]).iter().map(|origin| origin.connections.len()).sum::<usize>();
        assert_eq!(kept, 1, "only the connection just opened");
    }

    #[tokio::test]
    async fn an_unreachable_provider_and_a_relative_uri_are_errors() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let upstream = Upstream::new(LIMIT, 0);
        assert!(matches!(upstream.send(get(&url), LIMIT).await, Err(UpstreamError::Unreachable(_))));
        let relative = Request::get("/v1/models").body(Full::new(Bytes::new())).expect("request");
        assert!(matches!(upstream.send(relative, LIMIT).await, Err(UpstreamError::Unreachable(_))));
    }
}
