//! The node's HTTP server: accepts connections (HTTP/1.1 and HTTP/2), serves the health and metrics
//! endpoints, hands every other request to the proxy, and drains in-flight requests on shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::Gateway;
use crate::proxy::{self, BoxError, REQUEST_ID, RequestContext, ResponseBody};

/// How long shutdown waits for in-flight requests (streams included) before it stops anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains open connections.
pub async fn serve(gateway: Gateway, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Running out of file descriptors must not end the server: wait and retry.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let gateway = gateway.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, Infallible>(gateway.handle(request).await) }
                });
                let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("shutdown: some connections were still open after the drain timeout");
    }
}

impl Gateway {
    /// Answers one request: the node's own endpoints, or the proxy for everything else.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mut ctx = RequestContext::new();
        let own = match (request.method(), request.uri().path()) {
            (&Method::GET, "/healthz") => Some(text(StatusCode::OK, "text/plain", "ok\n".into())),
            (&Method::GET, "/readyz") => Some(if self.is_ready() {
                text(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no snapshot yet\n".into())
            }),
            (&Method::GET, "/metrics") => {
                Some(text(StatusCode::OK, "text/plain; version=0.0.4", self.shared.metrics.render()))
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
