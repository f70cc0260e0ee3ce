//! The node's HTTP server: accepts connections (HTTP/1.1 and HTTP/2), serves the health and metrics
//! endpoints, hands every other request to the proxy, and drains in-flight requests on shutdown.
//! HTTP/1.1's common case is served by [`h1`]; hyper serves the rest.

#[cfg(test)]
mod differential;
mod h1;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use recovea_core::answer::WireShape;
use recovea_http1::RequestError;
use recovea_upstream::{BoxError, ResponseBody};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::metrics::HandOver;
use crate::node::{Gateway, Readiness};
use crate::proxy::{self, REQUEST_ID, RequestContext};
use crate::throttled::Throttled;

/// From this share of `--max-connections` on, idle client connections are closed to make room.
const SHED_AT_PERCENT: usize = 90;

/// A client connection's place under `--max-connections`, freed when the connection ends.
struct Slot {
    gateway: Gateway,
    /// Connections open once this one was counted.
    open: usize,
}

impl Slot {
    /// A place, unless `max` connections are open.
    fn take(gateway: &Gateway, max: usize) -> Option<Self> {
        let connections = &gateway.shared.metrics.connections.open;
        let open = connections.fetch_add(1, Relaxed) + 1;
        if open > max {
            connections.fetch_sub(1, Relaxed);
            return None;
        }
        Some(Self { gateway: gateway.clone(), open })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gateway.shared.metrics.connections.open.fetch_sub(1, Relaxed);
    }
}

/// How long shutdown waits for in-flight requests (streams included) before it stops anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// A client that takes longer to send a request's head is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a connection thread wakes with nothing else to do (see `serve_handed_over`).
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The gateway on its listener, with its connection threads running.
///
/// The caller's runtime only accepts. Each connection is handed to one of
/// [`crate::node::connection_workers`] threads, each with its own single-threaded runtime and its
/// own pool of provider connections (see [`recovea_upstream`]): a request, its client connection
/// and its provider connection then live on one thread, and none of its wake-ups crosses threads
/// or goes through a work-stealing queue, which under load cost more than the proxying itself.
pub struct Server {
    listener: TcpListener,
    workers: Workers,
    gateway: Gateway,
}

impl Server {
    /// Starts the connection threads. An error means the gateway cannot serve at all: the caller
    /// should stop rather than run without it.
    pub fn start(gateway: &Gateway, listener: TcpListener) -> std::io::Result<Self> {
        Ok(Self { listener, workers: Workers::start(gateway)?, gateway: gateway.clone() })
    }

    /// Serves until `shutdown` resolves, then drains open connections.
    ///
    /// At most `--max-connections` client connections are open at once: past it a new one is
    /// closed at once (its descriptors are what the node must keep for the connections it serves,
    /// its spool and its providers), and from [`SHED_AT_PERCENT`] of it on, each new one wakes the
    /// connections waiting for a next request, which close: a storm of idle connections cannot
    /// take the room of clients that send requests.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Self { listener, mut workers, gateway } = self;
        let _own = listener.local_addr().ok().map(recovea_upstream::listening_on);
        // Every connection holds a receiver: `true` asks it to finish its request in flight and
        // close; the sender's `closed` says when all have.
        let (drain, _) = watch::channel(false);
        let max = gateway.shared.config.max_connections;
        let shed_at = (max.saturating_mul(SHED_AT_PERCENT) / 100).max(1);
        let (mut refusals, mut accept_errors) = (Throttled::default(), Throttled::default());
        let connections = &gateway.shared.metrics.connections.open;
        // Connections shed only when woken, and only those idle long enough: a storm that filled
        // the room with new ones is shed by a later beat if nothing else wakes them.
        let mut beat = tokio::time::interval(HEARTBEAT);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = beat.tick() => {
                    if connections.load(Relaxed) >= shed_at {
                        gateway.shared.shed_idle.notify_waiters();
                    }
                }
                accepted = listener.accept() => {
                    let stream = match accepted.and_then(|(stream, _)| stream.into_std()) {
                        Ok(stream) => stream,
                        Err(e) => {
                            // Running out of file descriptors must not end the server: wait and retry.
                            if let Some(count) = accept_errors.note() {
                                tracing::warn!(error = %e, count, "accept failed");
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Some(slot) = Slot::take(&gateway, max) else {
                        // Room for the next one: the idle ones that waited a while go.
                        gateway.shared.shed_idle.notify_waiters();
                        gateway.shared.metrics.connections.refused.fetch_add(1, Relaxed);
                        if let Some(count) = refusals.note() {
                            tracing::warn!(max, count, "client connections at --max-connections: new ones closed");
                        }
                        drop(stream);
                        continue;
                    };
                    if slot.open >= shed_at {
                        gateway.shared.shed_idle.notify_waiters();
                    }
                    workers.hand_over(stream, drain.subscribe(), slot);
                }
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        drain.send_replace(true);
        // Sessions are asked to close at once: they may last an hour, and their responses done
        // are metered already; each writes the receipts it still owes as it closes.
        let sessions = &gateway.shared.sessions;
        sessions.send_replace(true);
        let drained = async { tokio::join!(drain.closed(), sessions.closed()) };
        if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
            tracing::warn!("shutdown: some connections were still open after the drain timeout");
        }
        workers.stop().await;
    }
}

/// [`Server::start`], then [`Server::serve`].
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    Server::start(&gateway, listener)?.serve(shutdown).await;
    Ok(())
}

type Handover = (std::net::TcpStream, watch::Receiver<bool>, Slot);

/// The connection threads, each fed accepted connections in turn.
struct Workers {
    senders: Vec<mpsc::UnboundedSender<Handover>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    next: usize,
}

impl Workers {
    fn start(gateway: &Gateway) -> std::io::Result<Self> {
        let mut workers = Self { senders: Vec::new(), threads: Vec::new(), next: 0 };
        for lane in 1..=gateway.shared.upstream.worker_lanes() {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let (sender, receiver) = mpsc::unbounded_channel();
            let gateway = gateway.clone();
            let thread =
                std::thread::Builder::new().name(format!("recovea-conn-{lane}")).spawn(move || {
                    recovea_upstream::use_lane(lane);
                    runtime.block_on(serve_handed_over(gateway, receiver));
                })?;
            workers.senders.push(sender);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    fn hand_over(&mut self, stream: std::net::TcpStream, drain: watch::Receiver<bool>, slot: Slot) {
        self.next = self.next.wrapping_add(1);
        // A worker only stops when its sender is dropped, so the send cannot fail while `self` lives.
        let _ = self.senders[self.next % self.senders.len()].send((stream, drain, slot));
    }

    /// Ends every worker once the connections it serves are drained (or abandoned).
    async fn stop(self) {
        drop(self.senders);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// One connection thread: serves every connection handed to it until the server stops.
async fn serve_handed_over(gateway: Gateway, mut handed: mpsc::UnboundedReceiver<Handover>) {
    let builder = std::sync::Arc::new(hyper_builder());
    // The runtime's timer wakes the thread at its earliest deadline, and a timer set earlier than
    // that must wake the thread to say so: a system call. Each request sets a header read timer
    // (30 s) while the earliest deadline is often a request's 600 s upstream limit, so that every
    // request paid one. With a deadline always at most a second away, none does. The beat also
    // closes the thread's provider connections that the providers closed.
    let pool = gateway.clone();
    tokio::spawn(async move {
        let mut beat = tokio::time::interval(HEARTBEAT);
        loop {
            beat.tick().await;
            pool.shared.upstream.prune();
        }
    });
    let limits = Limits {
        max_body: gateway.shared.config.max_body_bytes,
        idle: gateway.shared.config.stream_idle_timeout,
    };
    while let Some((stream, drain, slot)) = handed.recv().await {
        let stream = match stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "an accepted connection could not be served");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (gateway, builder) = (gateway.clone(), std::sync::Arc::clone(&builder));
        tokio::spawn(async move {
            serve_connection(stream, drain, &builder, limits, gateway).await;
            drop(slot);
        });
    }
}

/// hyper's server, as every connection handed to it gets it.
fn hyper_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder
}

/// What answers the requests of client connections: the gateway, or a test's own handler.
pub(crate) trait Answerer: Clone + Send + Sync + 'static {
    /// Answers one request: HTTP/1.1 read by [`h1`], or anything hyper read.
    fn answer<B>(&self, request: Request<B>) -> impl Future<Output = Response<ResponseBody>> + Send
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>;

    /// Answers an HTTP/1 request whose head breaks the rules of [`recovea_http1::request_facts`]
    /// (its `Host`, its framing): it is never forwarded, and its connection ends with the answer,
    /// in `shape`, the envelope of the request's dialect (its path and `anthropic-version` were read).
    fn refuse(&self, error: RequestError, shape: WireShape) -> Response<ResponseBody>;

    /// A connection went to hyper's server, for `reason`.
    fn handed_over(&self, reason: HandOver);

    /// Wakes, once, the connections waiting for a next request, which then close; `None`: never.
    fn idle_shed(&self) -> Option<&tokio::sync::Notify> {
        None
    }

    /// A connection waiting for a next request was closed to make room.
    fn shed(&self) {}
}

impl Answerer for Gateway {
    fn answer<B>(&self, request: Request<B>) -> impl Future<Output = Response<ResponseBody>> + Send
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.handle(request)
    }

    fn refuse(&self, error: RequestError, shape: WireShape) -> Response<ResponseBody> {
        proxy::refuse_head(&self.shared, error, shape)
    }

    fn handed_over(&self, reason: HandOver) {
        self.shared.metrics.handed_over(reason);
    }

    fn idle_shed(&self) -> Option<&tokio::sync::Notify> {
        Some(&self.shared.shed_idle)
    }

    fn shed(&self) {
        self.shared.metrics.connections.shed.fetch_add(1, Relaxed);
    }
}

/// What every client connection of a node is held to.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// A longer request body goes to hyper, so that the proxy refuses it unread.
    max_body: u64,
    /// A client that takes no byte of its answer for this long has its connection closed.
    idle: Duration,
}

/// Serves one client connection until it ends: HTTP/1.1's common case in [`h1`], then, if it asks
/// for anything else, hyper for the rest of it, with every byte read so far in front.
async fn serve_connection<A: Answerer, Io: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: Io,
    mut drain: watch::Receiver<bool>,
    builder: &auto::Builder<TokioExecutor>,
    limits: Limits,
    answerer: A,
) {
    let Limits { max_body, idle } = limits;
    let Some(handed) = h1::serve(stream, &mut drain, max_body, idle, &answerer).await else { return };
    answerer.handed_over(handed.reason);
    let service = service_fn(move |request: Request<Incoming>| {
        let answerer = answerer.clone();
        async move {
            // hyper passes on what these rules refuse: they are held where the request is seen.
            if request.version() <= Version::HTTP_11
                && let Err(error) = head_rules(&request)
            {
                return Ok::<_, Infallible>(answerer.refuse(error, proxy::shape_of(&request)));
            }
            let http2 = request.version() == Version::HTTP_2;
            let response = answerer.answer(request).await;
            // A stream its client gives no room is not polled: only a watchdog sees it.
            Ok(if http2 { recovea_upstream::watch_unread(response, idle) } else { response })
        }
    });
    let io = TokioIo::new(h1::Rewind::new(handed.io, handed.read, idle));
    // Upgrades too: a Realtime session's connection outlives its request (see `realtime`).
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        // First: a drain that came while the connection was ours must not cancel the
        // request it hands over before hyper has read it.
        biased;
        ended = connection.as_mut() => ended,
        () = drained(&mut drain) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The rules of [`recovea_http1::request_facts`], over a head hyper parsed: the same function the
/// gateway's own parser applies. Of the `Content-Length` rule, nothing reaches here: hyper answers
/// a list (`5, 5`) with its own 400, and passes one of several identical lines on as one.
fn head_rules<B>(request: &Request<B>) -> Result<(), RequestError> {
    let lines = request.headers().iter().map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()));
    recovea_http1::request_facts(request.version(), lines).map(|_| ())
}

/// Resolves once the server drains (or is gone).
async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|draining| *draining).await;
}

impl Gateway {
    /// `GET /metrics`: Prometheus text, or `401` to a scrape without the token `--metrics-token`
    /// asks for.
    pub fn metrics(&self, headers: &http::HeaderMap) -> Response<ResponseBody> {
        if !self.may_scrape(headers) {
            let mut refused =
                text(StatusCode::UNAUTHORIZED, "text/plain", "a bearer token is needed\n".into());
            refused.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused;
        }
        let mut metrics = self.shared.metrics.render();
        if let Some(tracer) = &self.shared.tracer {
            tracer.render_metrics(&mut metrics);
        }
        text(StatusCode::OK, "text/plain; version=0.0.4", metrics)
    }

    /// Serves `GET /metrics`, and nothing else, on `listener` (`--metrics-listen`, an address of
    /// the operator's own) until `shutdown`.
    pub async fn serve_metrics(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let _own = listener.local_addr().ok().map(recovea_upstream::listening_on);
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "the metrics listener could not accept a connection");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return,
            };
            let gateway = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let answer = match (request.method(), request.uri().path()) {
                        (&Method::GET, "/metrics") => gateway.metrics(request.headers()),
                        _ => {
                            text(StatusCode::NOT_FOUND, "text/plain", "only /metrics is served here\n".into())
                        }
                    };
                    std::future::ready(Ok::<_, std::convert::Infallible>(answer))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    }

    /// Whether a scrape of `/metrics` presents the token `--metrics-token` asks for (any scrape
    /// does when there is none).
    fn may_scrape(&self, headers: &http::HeaderMap) -> bool {
        let Some(expected) = &self.shared.config.metrics_token_hash else { return true };
        let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        presented
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|token| recovea_core::keys::hash_secret(token.trim()) == *expected)
    }

    /// Answers one request: the node's own endpoints, or the proxy for everything else.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mut ctx = RequestContext::new(self.shared.now());
        let own = match (request.method(), request.uri().path()) {
            (&Method::GET, "/healthz") => Some(text(StatusCode::OK, "text/plain", "ok\n".into())),
            (&Method::GET, "/readyz") => Some(match self.readiness() {
                Readiness::Ready => text(StatusCode::OK, "text/plain", "ready\n".into()),
                Readiness::NoState => {
                    text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no snapshot yet\n".into())
                }
                Readiness::CountersUnconfirmed => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "the counters of armed caps are not confirmed yet\n".into(),
                ),
            }),
            // With `--metrics-listen`, `/metrics` is served there alone (an unknown path here).
            (&Method::GET, "/metrics") if !self.shared.config.metrics_elsewhere => {
                Some(self.metrics(request.headers()))
            }
            _ => None,
        };
        match own {
            Some(mut response) => {
                response.headers_mut().insert(REQUEST_ID, ctx.request_id.clone());
                response
            }
            None => proxy::handle(&self.shared, &mut ctx, request).await,
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(BoxError::from).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
