//! The HTTP server: connections, the script's effects, and the mock's in-process handle. Which
//! answer a request gets is `routes`'s; the `/__mock/` control endpoints are `control`'s.

mod control;
mod routes;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::body::MockBody;
use crate::jobs::{JobEnd, JobError, JobInfo, JobSettings, JobUsage, Jobs};
use crate::openai;
use crate::realtime::{self, Realtime};
use crate::request::Answer;
use crate::script::{Behaviour, InvalidBehaviour, Log, Plan, RecordedRequest, Script};
use control::control;
use routes::{error_body, route};

/// A running mock provider; it stops serving when dropped or shut down.
pub struct MockProvider {
    addr: SocketAddr,
    transport: Transport,
    shared: Arc<Shared>,
    /// Dropping or signalling it stops the accept loop and every open connection.
    stop: watch::Sender<()>,
    accept: Option<JoinHandle<()>>,
}

/// State shared by all connections.
pub(crate) struct Shared {
    pub(crate) log: Log,
    script: Script,
    /// The number of the last provider request, for ids and `x-request-id`.
    counter: AtomicU64,
    models: Bytes,
    jobs: Jobs,
    pub(crate) realtime: Realtime,
    transport: Transport,
    /// `http://127.0.0.1:PORT` (`https://` over TLS) for the URLs the mock hands out; `None` when
    /// it listens on an unspecified address, where the request's `Host` tells the way back.
    own_url: Option<String>,
    /// Changes when the mock stops: what ends sessions that outlive their HTTP connection.
    pub(crate) stopped: watch::Receiver<()>,
}

/// Makes hyper drop the connection without answering (the script's `close_without_response`,
/// or a request body that could not be read).
#[derive(Debug)]
struct Dropped;

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection dropped by the mock")
    }
}

impl std::error::Error for Dropped {}

impl MockProvider {
    /// Serves on an ephemeral port of 127.0.0.1.
    ///
    /// # Panics
    ///
    /// If no local port can be bound, which leaves a test nothing to do anyway.
    pub async fn start() -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("binding an ephemeral port on 127.0.0.1")
    }

    /// Serves on `addr`.
    pub async fn start_on(addr: SocketAddr) -> io::Result<Self> {
        Self::serve(TcpListener::bind(addr).await?)
    }

    /// Serves on an already bound listener. Must be called within a tokio runtime.
    pub fn serve(listener: TcpListener) -> io::Result<Self> {
        Self::serve_over(listener, Transport::Plain)
    }

    /// Serves on an ephemeral port of 127.0.0.1 over TLS (see [`Transport::Tls`]).
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start_tls(max_streams: u32) -> Self {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("binding an ephemeral port on 127.0.0.1");
        Self::serve_over(listener, Transport::Tls { max_streams }).expect("a bound listener's address")
    }

    /// Serves on an already bound listener, over `transport`. Must be called within a tokio runtime.
    pub fn serve_over(listener: TcpListener, transport: Transport) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(());
        let shared = Arc::new(Shared {
            log: Log::default(),
            script: Script::default(),
            counter: AtomicU64::new(0),
            models: openai::models(),
            jobs: Jobs::default(),
            realtime: Realtime::default(),
            transport,
            own_url: (!addr.ip().is_unspecified()).then(|| base_url(transport, &addr.to_string())),
            stopped: stopped.clone(),
        });
        let accept = tokio::spawn(accept_loop(listener, transport, Arc::clone(&shared), stopped));
        Ok(Self { addr, transport, shared, stop, accept: Some(accept) })
    }

    /// `http://127.0.0.1:PORT` (`https://` over TLS), without a trailing slash.
    pub fn url(&self) -> String {
        base_url(self.transport, &self.addr.to_string())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every provider request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log.snapshot()
    }

    /// Every provider request received so far, once there are at least `count` of them: each
    /// request recorded wakes the wait, which fails after [`crate::wait::DEADLINE`].
    ///
    /// # Panics
    ///
    /// When fewer than `count` requests arrived in time.
    pub async fn received(&self, count: usize) -> Vec<RecordedRequest> {
        let within = crate::wait::DEADLINE;
        if tokio::time::timeout(within, self.until_received(count)).await.is_err() {
            panic!("the mock received {} of {count} requests within {within:?}", self.shared.log.len());
        }
        self.requests()
    }

    /// Resolves once at least `count` requests are in the log, however long that takes: for a
    /// test with a deadline of its own (`tokio::time::timeout`).
    pub async fn until_received(&self, count: usize) {
        let mut recorded = self.shared.log.watch();
        while self.shared.log.len() < count {
            // The sender lives as long as the mock.
            let _ = recorded.changed().await;
        }
    }

    /// Queues `behaviour` for the next request(s).
    ///
    /// # Panics
    ///
    /// If the behaviour is invalid (see [`Self::try_script`]): a test's mistake to fix at once.
    pub fn script(&self, behaviour: Behaviour) {
        if let Err(e) = self.try_script(behaviour) {
            panic!("{e}");
        }
    }

    /// Queues `behaviour`, unless its status or a header cannot be sent.
    pub fn try_script(&self, behaviour: Behaviour) -> Result<(), InvalidBehaviour> {
        let (plan, times) = behaviour.prepare()?;
        self.shared.script.push(plan, times);
        Ok(())
    }

    /// Clears the request log, the script, the jobs (with their settings and files) and the queued
    /// Realtime usages, and restarts request and job numbering at 1. Open Realtime sessions stay.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Keeps only the `limit` most recent requests in the log (0 records nothing).
    /// The log is unbounded by default.
    pub fn set_record_limit(&self, limit: usize) {
        self.shared.log.set_limit(limit);
    }

    /// Stops accepting, closes open connections, and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(());
        if let Some(accept) = self.accept.take() {
            // The loop ends on the signal; a join error only means it had already been aborted.
            let _ = accept.await;
        }
    }
}

/// Deferred jobs (see [`crate::jobs`] and the crate docs).
impl MockProvider {
    /// Every job, oldest first, with its current status and how often it was retrieved.
    pub fn jobs(&self) -> Vec<JobInfo> {
        self.shared.jobs.list()
    }

    /// Ends job `id` now (`POST /__mock/jobs/{id}`); returns it as listed afterwards.
    pub fn end_job(&self, id: &str, end: JobEnd) -> Result<JobInfo, JobError> {
        self.shared.jobs.end(id, end)
    }

    /// The job settings in force.
    pub fn job_settings(&self) -> JobSettings {
        self.shared.jobs.settings()
    }

    /// Replaces every job setting.
    pub fn set_job_settings(&self, settings: JobSettings) {
        self.shared.jobs.set_settings(settings);
    }

    /// The retrieval on which jobs created from now on end (default 2; 0: never by retrieval).
    pub fn set_retrievals_to_finish(&self, retrievals: u32) {
        self.shared.jobs.update_settings(|s| s.retrievals_to_finish = retrievals);
    }

    /// The usage every batch line and background response reports from now on (`None`: the rules).
    pub fn set_job_usage(&self, usage: Option<JobUsage>) {
        self.shared.jobs.update_settings(|s| s.usage = usage);
    }

    /// How many lines ran in a batch cut short without a given count (`None`: half, rounded down).
    pub fn set_cancel_ran(&self, ran: Option<usize>) {
        self.shared.jobs.update_settings(|s| s.cancel_ran = ran);
    }

    /// The usage of a background response cut short (`None`: its input tokens, no output).
    pub fn set_partial_usage(&self, usage: Option<JobUsage>) {
        self.shared.jobs.update_settings(|s| s.partial_usage = usage);
    }
}

/// Realtime sessions (see [`crate::realtime`] and the crate docs).
impl MockProvider {
    /// Appends usage objects that the next `response.done` events report, one each, in order
    /// (a [`RealtimeUsage`](crate::RealtimeUsage) or any JSON, sent verbatim).
    pub fn queue_realtime_usage<I>(&self, usages: I)
    where
        I: IntoIterator,
        I::Item: Into<serde_json::Value>,
    {
        self.shared.realtime.queue_usages(usages.into_iter().map(Into::into));
    }

    /// How many Realtime sessions are open.
    pub fn realtime_sessions(&self) -> usize {
        self.shared.realtime.open_sessions()
    }

    /// Closes every open Realtime session from the provider's side with a close frame of `code`
    /// and `reason`; returns how many were open.
    ///
    /// # Panics
    ///
    /// If the frame cannot be sent (a code outside 1000-4999, or 1004-1006, 1015; a reason over
    /// 123 bytes): a test's mistake to fix at once.
    pub fn close_realtime_sessions(&self, code: u16, reason: &str) -> usize {
        if let Some(why) = realtime::close_problem(code, reason) {
            panic!("{why}");
        }
        self.shared.realtime.close_all(code, reason)
    }
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        self.stop.send_replace(());
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
    }
}

impl Shared {
    fn reset(&self) {
        self.log.clear();
        self.script.clear();
        self.counter.store(0, Ordering::Relaxed);
        self.jobs.reset();
        self.realtime.reset();
    }
}

fn base_url(transport: Transport, authority: &str) -> String {
    match transport {
        Transport::Plain => format!("http://{authority}"),
        Transport::Tls { .. } => format!("https://{authority}"),
    }
}

/// How the mock speaks on its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// HTTP/1.1, or HTTP/2 for a client that opens with its preface (h2c).
    Plain,
    /// TLS with the tests' certificate for `127.0.0.1` ([`crate::tls`]), offering HTTP/2 and then
    /// HTTP/1.1 by ALPN; an HTTP/2 connection allows `max_streams` concurrent streams, as a
    /// provider's `SETTINGS_MAX_CONCURRENT_STREAMS` does.
    Tls { max_streams: u32 },
}

async fn accept_loop(
    listener: TcpListener,
    transport: Transport,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    let tls = match transport {
        Transport::Plain => None,
        Transport::Tls { max_streams } => {
            builder.http2().max_concurrent_streams(max_streams);
            Some(tokio_rustls::TlsAcceptor::from(crate::tls::server_config(&[b"h2", b"http/1.1"])))
        }
    };
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.changed() => return,
        };
        let stream = match stream {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Typically out of file descriptors: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Nagle would delay small SSE events and hurt latency measurements.
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let shared = Arc::clone(&shared);
        let mut stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(Arc::clone(&shared), req));
            let served = async {
                match tls {
                    None => {
                        let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await;
                    }
                    Some(tls) => {
                        let Ok(stream) = tls.accept(stream).await else { return };
                        let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await;
                    }
                }
            };
            tokio::select! {
                () = served => {}
                _ = stopped.changed() => {}
            }
        });
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<MockBody>, Dropped> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    if let Some(action) = parts.uri.path().strip_prefix("/__mock/") {
        return Ok(control(&shared, &parts.method, action, &body));
    }
    let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;
    let plan = shared.script.next();
    let path = parts.uri.path();
    let path_and_query = parts.uri.path_and_query().map_or(path, |pq| pq.as_str());
    shared.log.record(&parts.method, path_and_query, &parts.headers, &body);

    let plan = plan.as_deref();
    if let Some(plan) = plan {
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        if plan.close {
            return Err(Dropped);
        }
    }
    let anthropic = path.starts_with("/v1/messages");
    let answer = match plan {
        Some(Plan { status, body: scripted, .. }) if status.is_some() || scripted.is_some() => {
            let status = status.unwrap_or(StatusCode::OK);
            let body = scripted.clone().unwrap_or_else(|| {
                error_body(path, status, &format!("mock: scripted error (status {})", status.as_u16()))
            });
            Answer::Json(status, body)
        }
        _ if realtime::is_realtime_path(path) => {
            // The upgrade is taken out of the request, which the path must not borrow then.
            let path_and_query = path_and_query.to_owned();
            let response = realtime::accept(&shared, &mut parts, &path_and_query);
            return Ok(finish(response, anthropic, n, plan));
        }
        _ => route(&shared, &parts, &body, n, plan),
    };

    let response = match answer {
        Answer::Json(status, json) => {
            let mut r = Response::new(MockBody::json(json));
            *r.status_mut() = status;
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Answer::Raw(content_type, bytes) => {
            let mut r = Response::new(MockBody::json(bytes));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        Answer::Events(events) => {
            let (gap, cut, stall) =
                plan.map_or((Duration::ZERO, None, None), |p| (p.chunk_delay, p.cut_after, p.stall_after));
            let mut r = Response::new(MockBody::events(events, gap, cut, stall));
            let headers = r.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            r
        }
    };
    Ok(finish(response, anthropic, n, plan))
}

/// Adds the request id header and the script's headers.
fn finish(
    mut response: Response<MockBody>,
    anthropic: bool,
    n: u64,
    plan: Option<&Plan>,
) -> Response<MockBody> {
    let id_header = if anthropic { "request-id" } else { "x-request-id" };
    let id = HeaderValue::try_from(format!("mock-req-{n}")).expect("ASCII letters and digits");
    response.headers_mut().insert(HeaderName::from_static(id_header), id);
    if let Some(plan) = plan {
        for (name, value) in &plan.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}
