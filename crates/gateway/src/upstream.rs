//! The pooled client that carries requests to providers: HTTP/1.1 and HTTP/2 over rustls.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::proxy::BoxError;

/// Why a provider gave no answer.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// Connection refused, DNS or TLS failure, connect timeout, or a connection lost before the
    /// response head: the provider could not be reached.
    Unreachable(hyper_util::client::legacy::Error),
    /// Connected, but no response head within the limit.
    Timeout,
}

type Connector = ConnectWithin<HttpsConnector<HttpConnector>>;

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
/// thread (lane 0). A pooled connection is driven by a task on the thread that opened it; sharing
/// one pool between threads would hand a request on one thread a connection driven by another,
/// and every write and read of that request would then wake the other thread.
pub(crate) struct Upstream {
    lanes: Vec<Client<Connector, Full<Bytes>>>,
}

impl Upstream {
    pub(crate) fn new(connect_timeout: Duration, workers: usize) -> Self {
        Self { lanes: (0..=workers).map(|_| client(connect_timeout)).collect() }
    }

    /// How many connection workers have a pool of their own.
    pub(crate) fn worker_lanes(&self) -> usize {
        self.lanes.len() - 1
    }

    /// Sends `request` and waits at most `timeout` for the response head. The body then streams.
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let client = &self.lanes[LANE.get() % self.lanes.len()];
        match tokio::time::timeout(timeout, client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(UpstreamError::Unreachable(e)),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }
}

fn client(connect_timeout: Duration) -> Client<Connector, Full<Bytes>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(60)));
    let https = HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .build(ConnectWithin { inner: https, limit: connect_timeout })
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
