//! The pooled client that carries requests to providers: HTTP/1.1 and HTTP/2 over rustls.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Why a provider gave no answer.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// Connection refused, DNS or TLS failure, connect timeout, or a connection lost before the
    /// response head: the provider could not be reached.
    Unreachable(hyper_util::client::legacy::Error),
    /// Connected, but no response head within the limit.
    Timeout,
}

pub(crate) struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Upstream {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let https = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build(https);
        Self { client }
    }

    /// Sends `request` and waits at most `timeout` for the response head. The body then streams.
    pub(crate) async fn send(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(UpstreamError::Unreachable(e)),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }
}
