//! The admin API's HTTP server: authentication, body limits, and writing replies and errors.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::admin::query::decode_path_segment;
use crate::admin::{Caller, OPENAPI, Reply, ReplyBody};
use crate::{ApiError, Control, console};

const PREFIX: &str = "/admin/v1/";
/// Admin bodies are small JSON documents.
const MAX_BODY_BYTES: usize = 1 << 20;
/// A node's batch of receipts is the largest thing a node sends.
const MAX_NODE_BODY_BYTES: usize = 64 << 20;

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve(control: Control, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    // A webhook or base URL naming the admin API itself would loop.
    let _own = listener.local_addr().ok().map(recovea_upstream::listening_on);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let control = control.clone();
                let service = service_fn(move |request: Request<Incoming>| {
                    let control = control.clone();
                    async move { Ok::<_, Infallible>(control.handle_from(request, Some(peer)).await) }
                });
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service).into_owned());
                tokio::spawn(connection);
            }
            () = &mut shutdown => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
}

impl Control {
    /// Answers one admin request from an unknown address.
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.handle_from(request, None).await
    }

    /// Answers one admin request from `client`, which the changes it makes are recorded with.
    pub async fn handle_from<B>(
        &self,
        request: Request<B>,
        client: Option<SocketAddr>,
    ) -> Response<Full<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path().to_owned();
        if request.method() == Method::GET && path == "/healthz" {
            return json_response(StatusCode::OK, Bytes::from_static(b"{\"status\":\"ok\"}"));
        }
        if request.method() == Method::GET && path == "/readyz" {
            if self.is_ready() {
                return json_response(StatusCode::OK, Bytes::from_static(b"{\"status\":\"ready\"}"));
            }
            let body = if self.inner.loaded.load(std::sync::atomic::Ordering::Acquire) {
                Bytes::from_static(b"{\"status\":\"the database does not answer\"}")
            } else {
                Bytes::from_static(b"{\"status\":\"no state loaded yet\"}")
            };
            return json_response(StatusCode::SERVICE_UNAVAILABLE, body);
        }
        if request.method() == Method::GET && path == "/metrics" {
            let mut response = Response::new(Full::new(Bytes::from(self.render_metrics())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            return response;
        }
        if request.method() == Method::GET && path == "/admin/v1/openapi.json" {
            return json_response(StatusCode::OK, Bytes::from_static(OPENAPI.as_bytes()));
        }
        if console::serves(&path) && !Control::is_node_path(&path) {
            return self.console(request, client).await;
        }
        let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let result = match path.strip_prefix(PREFIX) {
            None if Control::is_node_path(&path) => {
                if request.method() != Method::POST {
                    return error_response(ApiError::MethodNotAllowed);
                }
                let authorization = authorization.map(str::to_owned);
                match Limited::new(request.into_body(), MAX_NODE_BODY_BYTES).collect().await {
                    Ok(body) => {
                        match self.node_call(&path, authorization.as_deref(), body.to_bytes()).await {
                            Ok(Some(reply)) => Ok(reply),
                            Ok(None) => {
                                let mut response = Response::new(Full::new(Bytes::new()));
                                *response.status_mut() = StatusCode::NO_CONTENT;
                                return response;
                            }
                            Err(ApiError::NodeUnauthorized) => {
                                // Who tried, never what they presented.
                                let client = client.map_or_else(|| "-".to_owned(), |a| a.ip().to_string());
                                tracing::warn!(client, path = %path.escape_debug(), "a wrong node token was refused");
                                Err(ApiError::NodeUnauthorized)
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(_) => Err(ApiError::bad_request("body: unreadable or larger than 64 MiB")),
                }
            }
            None => Err(ApiError::NotFound("Unknown admin path.".into())),
            Some(rest) => match self.authenticate(authorization, client, &path, Instant::now()).await {
                Err(refused) => Err(refused),
                Ok((principal, auth)) => {
                    let caller = Caller { principal, auth, client };
                    let method = request.method().clone();
                    let query = request.uri().query().unwrap_or("").to_owned();
                    let segments: Option<Vec<String>> =
                        rest.trim_end_matches('/').split('/').map(decode_path_segment).collect();
                    let Some(segments) = segments else {
                        return error_response(ApiError::bad_request("path: bad percent-escape"));
                    };
                    match Limited::new(request.into_body(), MAX_BODY_BYTES).collect().await {
                        Ok(body) => {
                            // A change and its publication run to the end even if the client hangs up:
                            // a revocation saved but never served would be worse than none.
                            let control = self.clone();
                            let work = tokio::spawn(async move {
                                let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
                                control.route(caller, &method, &segments, &query, body.to_bytes()).await
                            });
                            work.await.unwrap_or_else(|e| Err(ApiError::internal(e)))
                        }
                        Err(_) => Err(ApiError::bad_request("body: unreadable or larger than 1 MiB")),
                    }
                }
            },
        };
        match result {
            Ok(Reply { status, body: ReplyBody::Json(body) }) => {
                json_response(status, Bytes::from(serde_json::to_vec_pretty(&body).unwrap_or_default()))
            }
            Ok(Reply { status, body: ReplyBody::Raw(body) }) => json_response(status, body),
            Ok(Reply { status, body: ReplyBody::Csv(text) }) => {
                let mut response = Response::new(Full::new(Bytes::from(text)));
                *response.status_mut() = status;
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
                response
            }
            Err(error) => error_response(error),
        }
    }
}

impl Control {
    fn render_metrics(&self) -> String {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::with_capacity(512);
        let version = self.inner.feed.version();
        let _ = writeln!(out, "# HELP recovea_feed_version The version of the state fed to nodes.");
        let _ = writeln!(out, "# TYPE recovea_feed_version gauge");
        let _ = writeln!(out, "recovea_feed_version {}", version.unwrap_or(0));
        let _ = writeln!(out, "# HELP recovea_feed_polls_total Feed polls answered.");
        let _ = writeln!(out, "# TYPE recovea_feed_polls_total counter");
        let _ = writeln!(out, "recovea_feed_polls_total {}", self.inner.metrics.polls.load(Relaxed));
        let _ = writeln!(
            out,
            "# HELP recovea_receipts_ingested_total Receipts delivered by nodes (replays included)."
        );
        let _ = writeln!(out, "# TYPE recovea_receipts_ingested_total counter");
        let _ =
            writeln!(out, "recovea_receipts_ingested_total {}", self.inner.metrics.receipts.load(Relaxed));
        let _ =
            writeln!(out, "# HELP recovea_nodes Nodes that polled this control plane within the last hour.");
        let _ = writeln!(out, "# TYPE recovea_nodes gauge");
        let _ = writeln!(out, "recovea_nodes {}", self.nodes_reporting());
        let metrics = &self.inner.metrics;
        for (name, help, value) in [
            ("recovea_job_polls_total", "Polls of deferred jobs at their providers.", &metrics.job_polls),
            (
                "recovea_job_poll_errors_total",
                "Polls of deferred jobs that failed (retried later).",
                &metrics.job_poll_errors,
            ),
            (
                "recovea_jobs_settled_total",
                "Deferred jobs settled from their providers' usage.",
                &metrics.jobs_settled,
            ),
        ] {
            let _ =
                writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", value.load(Relaxed));
        }
        if let Some(jobs) = self.inner.jobs.get() {
            let pending = jobs.pending();
            let _ = writeln!(
                out,
                "# HELP recovea_jobs_pending Deferred jobs holding their estimate until they settle.\n# TYPE recovea_jobs_pending gauge\nrecovea_jobs_pending {pending}"
            );
        }
        out
    }
}

fn error_response(error: ApiError) -> Response<Full<Bytes>> {
    let answer = error.answer();
    let mut response = json_response(
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(answer.body),
    );
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::try_from(value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn json_response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
