//! Traces over OTLP (`--otlp-endpoint`): each proxied request is a span named `request`, with one
//! child per phase it reached (`admit`, `caps`, `upstream`, `stream`), exported over OTLP/HTTP with
//! protobuf by a task of its own.
//!
//! **Free when off:** without an endpoint the request context's [`Trace`] is `None`, and every
//! call from the request path is one branch on it: no span, no allocation, no atomic.
//! When on, a request's spans are built once, when it ends, from the instants its phases noted,
//! and go to the exporter through a bounded queue that never waits: when it is full they are
//! dropped and counted (`recovea_trace_spans_dropped_total`).
//!
//! Attributes name the request (ids, route, provider, model, status, outcome, tokens, cost), never
//! a secret nor a word of a prompt or a completion. A client's `traceparent` becomes the parent of
//! the request's span; the gateway's own trace context is not sent on to the provider.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use recovea_core::money::Nanos;
use recovea_core::{ConfigError, FailOpenReason};
use recovea_upstream::{ProviderNetwork, ResponseBody, Upstream, on_end};
use tokio::sync::mpsc;

use crate::metrics::Outcome;

/// Requests whose spans may wait for the exporter; past that they are dropped and counted.
const QUEUE_REQUESTS: usize = 2048;
/// The most spans in one export.
const MAX_BATCH_SPANS: usize = 512;
/// How long spans wait for a batch to fill before they are sent anyway.
const BATCH_INTERVAL: Duration = Duration::from_secs(1);
const EXPORT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a collector's answer read.
const EXPORT_ANSWER_LIMIT: usize = 64 << 10;
/// The OTLP/HTTP path of traces, added to an endpoint given without a path.
const TRACES_PATH: &str = "/v1/traces";
pub const DEFAULT_SERVICE_NAME: &str = "recovea";

/// Where traces go and under which service name: checked, so that a node with a bad endpoint does
/// not start.
#[derive(Debug, Clone)]
pub(crate) struct TraceSettings {
    endpoint: Uri,
    service_name: String,
}

impl TraceSettings {
    /// `endpoint` is the collector's OTLP/HTTP URL: `http://collector:4318` (the traces path
    /// `/v1/traces` is added) or the full URL of its traces endpoint.
    pub(crate) fn new(endpoint: &str, service_name: Option<&str>) -> Result<Self, ConfigError> {
        let refused = |why: String| ConfigError::flag("otlp-endpoint", why);
        let mut endpoint = crate::alarm::parse_webhook(endpoint).map_err(refused)?;
        if endpoint.path() == "/" && endpoint.query().is_none() {
            let base = endpoint.to_string();
            endpoint = format!("{}{TRACES_PATH}", base.trim_end_matches('/'))
                .parse()
                .map_err(|_| refused("not a URL".to_owned()))?;
        }
        let service_name = service_name.map_or(DEFAULT_SERVICE_NAME, str::trim);
        if service_name.is_empty() {
            return Err(ConfigError::flag("otlp-service-name", "must not be blank"));
        }
        Ok(Self { endpoint, service_name: service_name.to_owned() })
    }

    /// The URL spans are posted to.
    pub(crate) fn endpoint(&self) -> &Uri {
        &self.endpoint
    }
}

/// The node's side of the queue to the exporter, shared by every request.
pub(crate) struct Tracer {
    queue: mpsc::Sender<Vec<SpanData>>,
    /// The exporter's end, until [`crate::Gateway::export_traces`] takes it.
    receiver: Mutex<Option<mpsc::Receiver<Vec<SpanData>>>>,
    settings: TraceSettings,
    scope: InstrumentationScope,
    dropped: AtomicU64,
}

impl Tracer {
    pub(crate) fn new(settings: TraceSettings) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE_REQUESTS);
        Self {
            queue,
            receiver: Mutex::new(Some(receiver)),
            settings,
            scope: InstrumentationScope::builder("recovea-gateway")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Hands a finished request's spans to the exporter without waiting; drops them when full.
    fn send(&self, spans: Vec<SpanData>) {
        let count = spans.len() as u64;
        if self.queue.try_send(spans).is_err() {
            self.dropped.fetch_add(count, Relaxed);
        }
    }

    /// The trace's lines of `/metrics`.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "# HELP recovea_trace_spans_dropped_total Spans dropped because the exporter's queue was full.\n\
             # TYPE recovea_trace_spans_dropped_total counter\n\
             recovea_trace_spans_dropped_total {}\n",
            self.dropped.load(Relaxed)
        );
    }

    /// Exports what requests queued, in batches, until `shutdown`; then sends what is left.
    /// `None` when the exporter already runs (it takes the queue's one receiving end).
    pub(crate) fn export<S>(
        self: Arc<Self>,
        network: ProviderNetwork,
        shutdown: S,
    ) -> Option<impl std::future::Future<Output = ()> + Send + use<S>>
    where
        S: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut receiver = self.receiver.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let client = ExportClient(Arc::new(Upstream::new(EXPORT_CONNECT_TIMEOUT, 0, &network)));
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(self.settings.endpoint().to_string())
            .with_timeout(EXPORT_TIMEOUT)
            .build();
        let mut exporter = match exporter {
            Ok(exporter) => exporter,
            Err(e) => {
                tracing::error!(error = %e, "traces: the OTLP exporter could not be built; no trace is sent");
                return None;
            }
        };
        exporter.set_resource(
            &Resource::builder_empty().with_service_name(self.settings.service_name.clone()).build(),
        );
        Some(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            let mut batch: Vec<SpanData> = Vec::new();
            let mut tick = tokio::time::interval(BATCH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    spans = receiver.recv() => match spans {
                        Some(spans) => {
                            batch.extend(spans);
                            if batch.len() >= MAX_BATCH_SPANS {
                                send_batch(&exporter, &mut batch).await;
                            }
                        }
                        None => break,
                    },
                    _ = tick.tick() => send_batch(&exporter, &mut batch).await,
                    () = &mut shutdown => break,
                }
            }
            // What the requests finished before shutdown had queued still goes.
            receiver.close();
            while let Some(spans) = receiver.recv().await {
                batch.extend(spans);
            }
            send_batch(&exporter, &mut batch).await;
        })
    }
}

async fn send_batch(exporter: &opentelemetry_otlp::SpanExporter, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let count = spans.len();
    if let Err(e) = exporter.export(spans).await {
        // The endpoint may carry a token: the error names the failure, not the URL.
        tracing::warn!(spans = count, error = %e, "traces: export to the OTLP endpoint failed");
    }
}

/// The exporter's HTTP client: the node's own provider client (its TLS roots, its egress proxy).
#[derive(Clone)]
struct ExportClient(Arc<Upstream>);

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExportClient")
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, opentelemetry_http::HttpError> {
        let response = self.0.send(request, EXPORT_TIMEOUT).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(EXPORT_TIMEOUT, Limited::new(body, EXPORT_ANSWER_LIMIT).collect())
            .await
            .map_err(|_| "the collector's answer timed out")??
            .to_bytes();
        Ok(Response::from_parts(parts, body))
    }
}

/// The phases a request's span has a child for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Read credential, admit, rate limit, route.
    Admit,
    /// Check the spend caps and reserve on them.
    Caps,
    /// Send to the provider, up to its answer's head.
    Upstream,
    /// The provider's answer's body, to its end.
    Stream,
}

impl Phase {
    const ALL: [Phase; 4] = [Phase::Admit, Phase::Caps, Phase::Upstream, Phase::Stream];

    fn name(self) -> &'static str {
        match self {
            Phase::Admit => "admit",
            Phase::Caps => "caps",
            Phase::Upstream => "upstream",
            Phase::Stream => "stream",
        }
    }
}

/// One request's trace: `None` when traces are off, and then every call is a branch and nothing else.
#[derive(Default)]
pub(crate) struct Trace(Option<Box<RequestTrace>>);

/// What a traced request noted so far.
pub(crate) struct RequestTrace {
    tracer: Arc<Tracer>,
    trace_id: TraceId,
    span_id: SpanId,
    /// The client's span, from its `traceparent`.
    parent: Option<SpanContext>,
    started: SystemTime,
    /// Each phase's start and end, in [`Phase::ALL`]'s order.
    phases: [(Option<SystemTime>, Option<SystemTime>); 4],
    attributes: Vec<KeyValue>,
    /// The receipt's tokens and cost, filled in by the meter when it settles.
    usage: Arc<OnceLock<KnownUsage>>,
}

/// What the receipt learned, for the request's span.
#[derive(Debug, Clone)]
pub(crate) struct KnownUsage {
    pub(crate) model: Option<String>,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost: Nanos,
}

/// Where the meter puts a traced request's usage; `None` when the request is not traced.
pub(crate) type UsageSlot = Option<Arc<OnceLock<KnownUsage>>>;

/// What the request's context knows when its answer's head goes out.
pub(crate) struct Facts<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) org_id: Option<&'a str>,
    pub(crate) key_id: Option<&'a str>,
    pub(crate) provider: Option<&'a str>,
    pub(crate) outcome: Outcome,
    pub(crate) fail_open: Option<FailOpenReason>,
}

impl Trace {
    /// Starts a request's trace when traces are on.
    #[inline]
    pub(crate) fn begin(tracer: Option<&Arc<Tracer>>, request_headers: &HeaderMap) -> Self {
        match tracer {
            None => Self(None),
            Some(tracer) => Self(Some(Box::new(RequestTrace::new(tracer, request_headers)))),
        }
    }

    #[inline]
    pub(crate) fn start(&mut self, phase: Phase) {
        if let Some(trace) = &mut self.0 {
            trace.phases[phase as usize].0 = Some(SystemTime::now());
        }
    }

    #[inline]
    pub(crate) fn end(&mut self, phase: Phase) {
        if let Some(trace) = &mut self.0 {
            trace.phases[phase as usize].1 = Some(SystemTime::now());
        }
    }

    /// Notes what the request's body said: the route's endpoint and the model asked for.
    #[inline]
    pub(crate) fn request(&mut self, endpoint: &str, model: Option<&str>) {
        if let Some(trace) = &mut self.0 {
            trace.attributes.push(KeyValue::new("recovea.route", endpoint.to_owned()));
            if let Some(model) = model {
                trace.attributes.push(KeyValue::new("gen_ai.request.model", model.to_owned()));
            }
        }
    }

    /// Where the meter puts the receipt's tokens and cost.
    #[inline]
    pub(crate) fn usage_slot(&self) -> UsageSlot {
        self.0.as_ref().map(|trace| Arc::clone(&trace.usage))
    }

    /// Ends the trace of a request abandoned before its answer went out (its client left first)
    /// with the `status` its receipt has. `facts` is called only when the request is traced.
    pub(crate) fn abandoned<'a>(&mut self, status: u16, facts: impl FnOnce() -> Facts<'a>) {
        if let Some(mut trace) = self.0.take() {
            trace.note(&facts(), status);
            trace.send(SystemTime::now(), status);
        }
    }

    /// Ends the trace with the answer: at once for the gateway's own answers, when its body ends
    /// for the provider's. `facts` is called only when the request is traced.
    #[inline]
    pub(crate) fn finish<'a>(
        &mut self,
        facts: impl FnOnce() -> Facts<'a>,
        response: Response<ResponseBody>,
    ) -> Response<ResponseBody> {
        match self.0.take() {
            None => response,
            Some(trace) => trace.follow(&facts(), response),
        }
    }
}

/// Notes the receipt's usage into a traced request's slot.
#[inline]
pub(crate) fn usage_known(slot: &UsageSlot, usage: impl FnOnce() -> KnownUsage) {
    if let Some(slot) = slot {
        let _ = slot.set(usage());
    }
}

impl RequestTrace {
    fn new(tracer: &Arc<Tracer>, request_headers: &HeaderMap) -> Self {
        let parent =
            request_headers.get("traceparent").and_then(|v| v.to_str().ok()).and_then(parse_traceparent);
        let trace_id = parent.as_ref().map_or_else(|| TraceId::from(fastrand::u128(1..)), |p| p.trace_id());
        Self {
            tracer: Arc::clone(tracer),
            trace_id,
            span_id: new_span_id(),
            parent,
            started: SystemTime::now(),
            phases: Default::default(),
            attributes: Vec::with_capacity(16),
            usage: Arc::new(OnceLock::new()),
        }
    }

    /// Adds what the context knew at the answer's head.
    fn note(&mut self, facts: &Facts<'_>, status: u16) {
        let attributes = &mut self.attributes;
        attributes.push(KeyValue::new("recovea.request_id", facts.request_id.to_owned()));
        if let Some(org) = facts.org_id {
            attributes.push(KeyValue::new("recovea.org_id", org.to_owned()));
        }
        if let Some(key) = facts.key_id {
            attributes.push(KeyValue::new("recovea.key_id", key.to_owned()));
        }
        if let Some(provider) = facts.provider {
            attributes.push(KeyValue::new("recovea.provider", provider.to_owned()));
        }
        attributes.push(KeyValue::new("recovea.outcome", facts.outcome.label()));
        if let Some(reason) = facts.fail_open {
            attributes.push(KeyValue::new("recovea.fail_open_reason", reason.label()));
        }
        attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
    }

    /// Ends the trace at the answer's head, or follows the provider's answer to its body's end.
    fn follow(
        mut self: Box<Self>,
        facts: &Facts<'_>,
        response: Response<ResponseBody>,
    ) -> Response<ResponseBody> {
        let status = response.status().as_u16();
        self.note(facts, status);
        let now = SystemTime::now();
        if self.phases[Phase::Upstream as usize].1.is_none() {
            // The gateway's own answer: nothing more to wait for.
            self.send(now, status);
            return response;
        }
        self.phases[Phase::Stream as usize].0 = Some(now);
        // The body's end ends the trace, after the receipt it settles when dropped.
        response.map(|body| {
            on_end(body, move |completed| {
                let now = SystemTime::now();
                if completed {
                    self.phases[Phase::Stream as usize].1 = Some(now);
                }
                self.send(now, status);
            })
        })
    }

    /// Builds the request's spans and queues them for the exporter.
    fn send(mut self: Box<Self>, end: SystemTime, status: u16) {
        if let Some(usage) = self.usage.get() {
            if let Some(model) = &usage.model {
                self.attributes.push(KeyValue::new("gen_ai.response.model", model.clone()));
            }
            self.attributes.push(KeyValue::new("gen_ai.usage.input_tokens", clamp(usage.input_tokens)));
            self.attributes.push(KeyValue::new("gen_ai.usage.output_tokens", clamp(usage.output_tokens)));
            // Exact: a decimal string of dollars, never a float.
            self.attributes.push(KeyValue::new("recovea.cost_usd", usage.cost.to_usd_string()));
        }
        let failed = status >= 500;
        let flags = TraceFlags::SAMPLED;
        let context = SpanContext::new(self.trace_id, self.span_id, flags, false, TraceState::default());
        let mut spans = Vec::with_capacity(1 + Phase::ALL.len());
        for phase in Phase::ALL {
            let (Some(start), ended) = self.phases[phase as usize] else { continue };
            spans.push(self.span(
                phase.name(),
                SpanContext::new(self.trace_id, new_span_id(), flags, false, TraceState::default()),
                (self.span_id, false),
                (start, ended.unwrap_or(end)),
                Vec::new(),
                // A phase the request never finished: refused in it, or the answer's body cut.
                if ended.is_none() {
                    Status::error("ended before the phase completed")
                } else {
                    Status::Unset
                },
            ));
        }
        let parent = self.parent.as_ref().map_or((SpanId::INVALID, false), |p| (p.span_id(), true));
        let attributes = std::mem::take(&mut self.attributes);
        let status_of_root = if failed { Status::error(format!("status {status}")) } else { Status::Unset };
        spans.push(self.span("request", context, parent, (self.started, end), attributes, status_of_root));
        self.tracer.send(spans);
    }

    fn span(
        &self,
        name: &'static str,
        span_context: SpanContext,
        (parent_span_id, parent_span_is_remote): (SpanId, bool),
        (start_time, end_time): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context,
            parent_span_id,
            parent_span_is_remote,
            span_kind: if name == "request" { SpanKind::Server } else { SpanKind::Internal },
            name: Cow::Borrowed(name),
            start_time,
            end_time,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.tracer.scope.clone(),
        }
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn new_span_id() -> SpanId {
    SpanId::from(fastrand::u64(1..))
}

/// A W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), as the remote parent it names;
/// `None` when it breaks the format or names the all-zero ids.
pub(crate) fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let version = parts.next()?;
    let (trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; a later version may add some after them.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex(version, 2) || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from(u128::from_str_radix(trace_id, 16).ok()?);
    let span_id = SpanId::from(u64::from_str_radix(span_id, 16).ok()?);
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    Some(SpanContext::new(trace_id, span_id, flags, true, TraceState::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_parent() {
        let parent = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("a valid traceparent");
        assert_eq!(parent.trace_id(), TraceId::from(0x4bf92f3577b34da6a3ce929d0e0e4736));
        assert_eq!(parent.span_id(), SpanId::from(0x00f067aa0ba902b7));
        assert!(parent.is_remote());
    }

    #[test]
    fn a_broken_traceparent_is_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn off_is_an_empty_option_and_nothing_more() {
        // A niche-optimised `Option<Box<_>>`: one word, and the request path branches on it alone.
        assert_eq!(std::mem::size_of::<Trace>(), std::mem::size_of::<usize>());
        let mut trace = Trace::begin(None, &HeaderMap::new());
        trace.start(Phase::Admit);
        trace.request("/v1/chat/completions", Some("gpt-4o-mini"));
        assert!(trace.0.is_none());
        assert!(trace.usage_slot().is_none());
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let settings = TraceSettings::new("http://127.0.0.1:4318", None).expect("valid");
        let tracer = Arc::new(Tracer::new(settings));
        // Nothing exports: the queue holds QUEUE_REQUESTS requests, then drops their spans.
        for _ in 0..QUEUE_REQUESTS + 3 {
            let trace = Box::new(RequestTrace::new(&tracer, &HeaderMap::new()));
            trace.send(SystemTime::now(), 200);
        }
        let mut metrics = String::new();
        tracer.render_metrics(&mut metrics);
        assert!(metrics.contains("\nrecovea_trace_spans_dropped_total 3\n"), "{metrics}");
    }

    #[test]
    fn a_request_without_traceparent_is_a_root_and_with_one_a_child() {
        let settings = TraceSettings::new("http://127.0.0.1:4318", None).expect("valid");
        let tracer = Arc::new(Tracer::new(settings));
        let mut headers = HeaderMap::new();
        let trace = RequestTrace::new(&tracer, &headers);
        assert!(trace.parent.is_none());
        assert_ne!(trace.trace_id, TraceId::INVALID);
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
        );
        let trace = RequestTrace::new(&tracer, &headers);
        assert_eq!(trace.trace_id, TraceId::from(0x4bf92f3577b34da6a3ce929d0e0e4736));
    }

    #[test]
    fn an_endpoint_without_a_path_gets_the_traces_path() {
        let settings = TraceSettings::new("http://collector:4318", None).expect("valid");
        assert_eq!(settings.endpoint().to_string(), "http://collector:4318/v1/traces");
        let settings = TraceSettings::new("https://c.example/otlp/v1/traces", Some("edge")).expect("valid");
        assert_eq!(settings.endpoint().to_string(), "https://c.example/otlp/v1/traces");
        assert!(TraceSettings::new("collector:4318", None).is_err());
        assert!(TraceSettings::new("http://c:4318", Some(" ")).is_err());
    }
}
