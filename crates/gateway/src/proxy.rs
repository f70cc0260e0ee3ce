//! One request's way through the node, as named phases: route check, read credential, admit,
//! route, read body, forward, respond. [`RequestContext`] carries what each phase learned.

use std::panic::AssertUnwindSafe;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use recovea_core::admission::{Admitted, Decision, FailOpenReason};
use recovea_core::answer::WireShape;
use recovea_core::models;
use recovea_core::pricing::PriceScope;
use recovea_core::snapshot::ProviderKind;
use recovea_core::tags::{self, Tags};
use recovea_core::{Snapshot, Timestamp, credential};
use recovea_http1::RequestError;
use recovea_providers::{Route, headers};

use std::sync::Arc;

use recovea_core::caps;
use recovea_core::channel::{self, RequestLine};
use recovea_core::ids::OrgId;
use recovea_providers::rewrite::{self, InspectedRequest};
use recovea_providers::usage::{Surface, Tapped};
use recovea_upstream::{BoxError, ResponseBody, UpstreamError};

use crate::access_log;
use crate::line;
use crate::metered_body::{MeteredBody, PendingReceipt};
use crate::metering::{Metered, Timing};
use crate::metrics::{Finished, Outcome};
use crate::node::Shared;
use crate::realtime;
use crate::refusal::{BodyLeft, Refusal, Refused};
use crate::trace::{Phase, Trace};

mod spend;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Where a provider's own request id goes, since `x-request-id` carries the gateway's.
const UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");

/// What the phases of one request learned, in the order they learned it.
pub(crate) struct RequestContext {
    pub(crate) request_id: HeaderValue,
    received_at: Instant,
    started_at: Timestamp,
    /// The name of the credential the path routes to.
    credential: Option<String>,
    /// Who is calling, once admitted.
    admitted: Option<Admitted>,
    /// The admitted request's attribution tags (`x-recovea-tags`).
    tags: Tags,
    /// Why the request was passed through unadmitted, if it was.
    fail_open: Option<FailOpenReason>,
    outcome: Outcome,
    /// The armed cap that refused the request, if one did.
    cap_refusal: Option<caps::CapRefusal>,
    /// The model a request refused after its body was read asked for, for its access-log line
    /// (an admitted request's receipt names its own).
    refused_model: Option<String>,
    /// The request's spans, when traces are on.
    trace: Trace,
    /// Its place among the key's requests in flight (`max_concurrent_requests`), once admitted.
    in_flight: Option<crate::inflight::Slot>,
}

impl RequestContext {
    /// A request received at `started_at` (on the store's clock: [`Shared::now`]).
    pub(crate) fn new(started_at: Timestamp) -> Self {
        // Time-ordered, so that receipts (whose ids are these) land at the end of the ledger's index.
        let mut id = String::with_capacity(24);
        id.push_str("req_");
        let unix_ms = u64::try_from(started_at.0).unwrap_or(0);
        recovea_core::ids::push_time_ordered(&mut id, unix_ms, 20 - recovea_core::ids::TIME_LEN, || {
            fastrand::u8(..)
        });
        let request_id = HeaderValue::try_from(id).expect("base62 is a valid header value");
        Self {
            request_id,
            received_at: Instant::now(),
            started_at,
            credential: None,
            admitted: None,
            tags: Tags::new(),
            fail_open: None,
            outcome: Outcome::Forwarded,
            cap_refusal: None,
            refused_model: None,
            trace: Trace::default(),
            in_flight: None,
        }
    }
}

/// `fail::fail_point!` with the `failpoints` feature, which only tests enable; nothing otherwise.
/// Each point takes the `fail` actions (`FAILPOINTS=admission.snapshot=return`, `...=panic`).
macro_rules! failpoint {
    ($($point:tt)*) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($($point)*);
    };
}

/// Where an admitted (or failed-open) request goes and with which provider auth.
struct Target {
    kind: ProviderKind,
    /// Where the request's model is priced (the credential's namespace and fallback).
    scope: PriceScope,
    base_url: String,
    /// The managed key to inject, with its kind; `None` leaves the client's own auth in place.
    managed_key: Option<(ProviderKind, String)>,
}

impl Target {
    /// Who pays the provider: the organization, when its managed key goes in, else the client.
    fn provider_key(&self) -> recovea_core::receipt::ProviderKey {
        match self.managed_key {
            Some(_) => recovea_core::receipt::ProviderKey::Managed,
            None => recovea_core::receipt::ProviderKey::Client,
        }
    }
}

/// The envelope of the gateway's own answers to `request`: its dialect's, so that its SDK shows
/// their message.
pub(crate) fn shape_of<B>(request: &Request<B>) -> WireShape {
    WireShape::of_request(request.uri().path(), request.headers().contains_key(headers::ANTHROPIC_VERSION))
}

/// Runs the phases for one proxied request and always produces a response.
pub(crate) async fn handle<B>(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
    request: Request<B>,
) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let http1 = request.version() <= Version::HTTP_11;
    let shape = shape_of(&request);
    ctx.trace = Trace::begin(shared.tracer.as_ref(), request.headers());
    let response = match run(shared, ctx, request).await {
        // A slot is held until the answer's last byte, or its client leaving.
        Ok(response) => response.map(|body| crate::inflight::held_by(body, ctx.in_flight.take())),
        Err(refused) => {
            ctx.in_flight = None;
            ctx.refused(&refused.refusal);
            refused.response(shape, http1)
        }
    };
    let response = respond(shared, ctx, response);
    let mut trace = std::mem::take(&mut ctx.trace);
    trace.finish(|| ctx.trace_facts(), response)
}

impl Drop for RequestContext {
    /// A request dropped before `handle` took its trace (its client left before the answer's
    /// head) still ends its trace, as `client_closed`.
    fn drop(&mut self) {
        let mut trace = std::mem::take(&mut self.trace);
        trace.abandoned(crate::metering::CLIENT_CLOSED, || crate::trace::Facts {
            outcome: Outcome::ClientClosed,
            ..self.trace_facts()
        });
    }
}

impl RequestContext {
    /// What the request's span says of it.
    fn trace_facts(&self) -> crate::trace::Facts<'_> {
        crate::trace::Facts {
            request_id: self.request_id.to_str().unwrap_or_default(),
            org_id: self.admitted.as_ref().map(|a| a.org.id.as_str()),
            key_id: self.admitted.as_ref().map(|a| a.key_id.as_str()),
            provider: self.credential.as_deref(),
            outcome: self.outcome,
            fail_open: self.fail_open,
        }
    }
}

async fn run<B>(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
    request: Request<B>,
) -> Result<Response<ResponseBody>, Refused>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let has_body = parts.headers.contains_key(header::TRANSFER_ENCODING)
        || parts.headers.get(header::CONTENT_LENGTH).is_some_and(|v| v != "0");
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
    ctx.trace.start(Phase::Admit);
    let (route, target) = match plan(shared, ctx, &parts.headers, &path_and_query) {
        Ok(planned) => planned,
        Err(refusal) => {
            // A small body is read and dropped so that the connection can carry the next request.
            let read = discard(body).await;
            return Err(Refused::new(refusal, BodyLeft::of(has_body, read)));
        }
    };

    ctx.trace.end(Phase::Admit);
    let tenant = ctx.admitted.as_ref().map(|admitted| &admitted.org.id);
    // Refused before its body was read: the connection ends with the answer. From here on a
    // refusal leaves nothing of the request on the connection (`Refused::from`).
    let mut body = read_body(shared, tenant, &parts.headers, body)
        .await
        .map_err(|refusal| Refused::new(refusal, BodyLeft::of(has_body, false)))?;
    let endpoint = route.upstream_path.split_once('?').map_or(route.upstream_path, |(path, _)| path);
    let surface = Surface::of(target.kind, endpoint);
    // One parse gives the facts and the input estimate that the caps and the receipt both need,
    // and whether the provider could read the body otherwise.
    let InspectedRequest { mut facts, input_tokens, ambiguity } = rewrite::inspect_and_estimate(&body);
    if let Some(ambiguity) = ambiguity
        && ctx.admitted.is_some()
        && !recovea_providers::body_is_a_file(endpoint)
    {
        // Before the allowlist, the caps and the provider: what the gateway read (its model, its
        // stream, its limits) may not be what the provider runs. A fail-open pass reads nothing
        // and goes as sent.
        ctx.trace.request(endpoint, None);
        return Err(Refusal::AmbiguousBody(ambiguity).into());
    }
    let content_type = || parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if let Some(media) = recovea_providers::media::read(surface, content_type, &body) {
        // Images and audio: what the answer may not carry (size, quality, `n`, characters, the
        // audio's length), and the model of a multipart form, which the JSON read cannot see.
        if facts.model.is_none() {
            facts.model = media.model;
        }
        facts.media = Some(Box::new(media.request));
    }
    if facts.model.is_none() {
        // Gemini names the model in the path (`models/{model}:generateContent`), a Realtime
        // session in its query (`?model=`, Azure's `deployment=`).
        facts.model = recovea_providers::usage::model_in_path(endpoint)
            .or_else(|| {
                headers::is_websocket_upgrade(&parts.headers)
                    .then(|| recovea_providers::realtime::model_in_query(route.upstream_path))
                    .flatten()
            })
            .map(str::to_owned);
    }
    if ctx.admitted.is_some() {
        // Whatever names the model, the body or the path, reaches the receipt, the log line and
        // the span: bounded and printable before anything else is done with it.
        let runs = recovea_providers::model_the_provider_runs(endpoint, None);
        if facts.model.iter().map(String::as_str).chain(runs).any(|m| !models::is_well_formed_name(m)) {
            facts.model = None;
            ctx.trace.request(endpoint, None);
            return Err(Refusal::ModelName.into());
        }
    }
    ctx.trace.request(endpoint, facts.model.as_deref());
    if let Some(admitted) = &ctx.admitted {
        // The model the provider runs: Azure's deployment and Gemini's model in the path outrank
        // whatever the body names.
        let runs = recovea_providers::model_the_provider_runs(endpoint, facts.model.as_deref());
        if !admitted.allows_model(runs) {
            // Before the caps and the provider: nothing is reserved, called or metered.
            let refused = runs.unwrap_or_default().to_owned();
            ctx.refused_model = Some(refused.clone());
            return Err(Refusal::ModelNotAllowed(refused).into());
        }
    }
    let channel = channel::classify(RequestLine {
        method: &parts.method,
        upstream_path: endpoint,
        websocket: headers::is_websocket_upgrade(&parts.headers),
        background: facts.background,
    });
    let prices = shared.snapshot.load().as_deref().map(|s| s.prices().clone()).unwrap_or_default();
    let spend = match &ctx.admitted {
        Some(admitted) => {
            ctx.trace.start(Phase::Caps);
            let request = spend::Request {
                channel,
                line: format!("{} {endpoint}", parts.method),
                headers: &parts.headers,
                body: &body,
                facts: &facts,
                input_tokens,
                prices: &prices,
                scope: &target.scope,
                org_id: admitted.org.id.as_str(),
                credential: route.credential,
                managed: target.managed_key.is_some(),
                now: ctx.started_at,
            };
            match spend::decide(shared, admitted, request).await {
                Ok(spend) => {
                    ctx.trace.end(Phase::Caps);
                    spend
                }
                Err(refusal) => {
                    ctx.refused_model = facts.model.take();
                    return Err(refusal.into());
                }
            }
        }
        None => spend::Spend::default(),
    };
    // Usage is read from the stream; OpenAI streams carry it only when asked. A fail-open pass is
    // not metered: its body goes as the client sent it.
    let mut strip_usage_chunk = false;
    if ctx.admitted.is_some()
        && matches!(surface, Surface::ChatCompletions | Surface::Completions)
        && let Some(rewritten) = rewrite::force_include_usage_with(&body, &facts)
    {
        body = Bytes::from(rewritten);
        strip_usage_chunk = !facts.client_asked_usage;
    }
    let on_upgrade = spend.session.then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>()).flatten();
    let mut upstream_request = upstream_request(&mut parts, &route, &target, body)?;
    if let (Some(admitted), Some(on_upgrade)) = (&ctx.admitted, on_upgrade) {
        // A Realtime session: the provider is asked to upgrade, then the session is relayed.
        headers::for_upgrade(upstream_request.headers_mut());
        let session = realtime::SessionFacts {
            request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
            provider: route.credential.to_owned(),
            provider_key: target.provider_key(),
            kind: target.kind,
            scope: target.scope.clone(),
            endpoint: endpoint.to_owned(),
            model: recovea_providers::realtime::model_in_query(route.upstream_path).map(str::to_owned),
            prices,
            tags: std::mem::take(&mut ctx.tags),
            _in_flight: ctx.in_flight.take(),
        };
        ctx.trace.start(Phase::Upstream);
        return Ok(realtime::open(shared, admitted.clone(), session, on_upgrade, upstream_request).await?);
    }
    let metered = ctx.admitted.as_ref().map(|admitted| {
        // From here the provider is called: the receipt is written however the request ends, a
        // client gone before the answer's head included.
        PendingReceipt::new(
            Arc::clone(shared),
            Metered {
                request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
                org_id: admitted.org.id.to_string(),
                key_id: admitted.key_id.to_string(),
                provider: route.credential.to_owned(),
                provider_key: target.provider_key(),
                endpoint: endpoint.to_owned(),
                request_model: facts.model.clone(),
                kind: target.kind,
                scope: target.scope.clone(),
                stream: facts.stream || recovea_providers::usage::streams_by_path(endpoint),
                surface,
                input_tokens,
                media: facts.media.take(),
                started_at: ctx.started_at,
                prices,
                tags: std::mem::take(&mut ctx.tags),
                charge: spend.charge,
                creating: spend.creating,
                settle: Some(line::settle(shared, admitted, spend.reservation)),
                timing: Timing::since(ctx.received_at),
                trace: ctx.trace.usage_slot(),
            },
        )
    });
    ctx.trace.start(Phase::Upstream);
    let result = forward(shared, ctx, upstream_request).await;
    if let Ok(response) = &result {
        ctx.trace.end(Phase::Upstream);
        shared.metrics.upstream_answered(target.kind, response.status().as_u16());
    }
    let Some(metered) = metered else { return Ok(result?) };
    match result {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            let event_stream = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let status = parts.status.as_u16();
            let strip = strip_usage_chunk && parts.status.is_success();
            if strip {
                // The usage chunk comes out of the body: the provider's length no longer holds.
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let body =
                MeteredBody::new(body, Arc::clone(shared), metered.take(), status, event_stream, strip);
            Ok(Response::from_parts(parts, body.boxed_unsync()))
        }
        Err(refusal) => {
            // Admitted but never answered: the receipt says so.
            shared.meter.record(&shared.metrics, metered.take(), refusal.answer().status, Tapped::default());
            Err(refusal.into())
        }
    }
}

/// Phases route check, read credential, admit and route: where the request goes, or why not.
fn plan<'p>(
    shared: &Shared,
    ctx: &mut RequestContext,
    request_headers: &HeaderMap,
    path_and_query: &'p str,
) -> Result<(Route<'p>, Target), Refusal> {
    let anthropic_version = request_headers.contains_key(headers::ANTHROPIC_VERSION);
    let route =
        recovea_providers::route_for(path_and_query, anthropic_version).ok_or(Refusal::UnknownRoute)?;
    ctx.credential = Some(route.credential.to_owned());
    let target = match admission(shared, request_headers, ctx.started_at) {
        Admission::Admit(admitted) => {
            // Before the credential, the body, the caps and the provider: nothing is read,
            // reserved or sent for an endpoint the key may not call, nor past its requests in flight.
            let endpoint = recovea_core::endpoints::endpoint_of(route.upstream_path);
            if !admitted.allows_endpoint(endpoint) {
                let refusal = Refusal::EndpointNotAllowed(endpoint.to_owned());
                ctx.admitted = Some(admitted);
                return Err(refusal);
            }
            match shared.in_flight.take(&admitted) {
                Ok(slot) => ctx.in_flight = slot,
                Err(full) => {
                    ctx.admitted = Some(admitted);
                    return Err(Refusal::ConcurrencyLimited(full));
                }
            }
            let target = target_for(shared, &route, &admitted, request_headers)?;
            // Only an admitted request has a receipt to carry them; a fail-open pass drops them unread.
            ctx.tags = tags::parse(request_headers.get_all(tags::HEADER).iter().map(HeaderValue::as_bytes))
                .map_err(|e| Refusal::InvalidTags(e.0))?;
            ctx.admitted = Some(admitted);
            target
        }
        Admission::Refuse(refusal) => return Err(refusal),
        Admission::FailOpen(reason) => {
            // Whatever admission had learned is forgotten: no managed key, no caps, no receipt.
            ctx.outcome = Outcome::FailOpen;
            ctx.fail_open = Some(reason);
            shared.metrics.fail_open(reason);
            shared.alarm.raise(reason, &ctx.request_id);
            let not_configured = || Refusal::ProviderNotConfigured(route.credential.to_owned());
            let kind = route.fallback_kind.ok_or_else(not_configured)?;
            let base_url = shared.config.default_base_url(kind).ok_or_else(not_configured)?;
            Target {
                kind,
                scope: PriceScope::of_kind(kind),
                base_url: base_url.to_owned(),
                managed_key: None,
            }
        }
    };
    Ok((route, target))
}

/// The most of a refused request's body read just to keep its connection open.
const DISCARD_LIMIT: usize = 64 << 10;
const DISCARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads a refused request's body to its end when it is small and quick; whether it was.
async fn discard<B>(body: B) -> bool
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        return true;
    }
    if body.size_hint().lower() > DISCARD_LIMIT as u64 {
        return false;
    }
    matches!(
        tokio::time::timeout(DISCARD_TIMEOUT, Limited::new(body, DISCARD_LIMIT).collect()).await,
        Ok(Ok(_))
    )
}

/// What the admission phase decided.
enum Admission {
    Admit(Admitted),
    Refuse(Refusal),
    /// Pass through unadmitted, as if the node knew no key.
    FailOpen(FailOpenReason),
}

/// Phases read credential, admit and rate limit. A fault anywhere in them (an error of the
/// snapshot lookup or of the limiter, a panic) is ours, not the caller's: the request passes
/// through unadmitted rather than fail, even when the key was already found. `now`: when the
/// request came.
fn admission(shared: &Shared, request_headers: &HeaderMap, now: Timestamp) -> Admission {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        failpoint!("admission.panic");
        let snapshot = match load_snapshot(shared) {
            Ok(snapshot) => snapshot,
            Err(reason) => return Admission::FailOpen(reason),
        };
        match recovea_core::admit(snapshot.as_deref(), credential::read(request_headers), now) {
            Decision::Admit(admitted) => match rate_limit(shared, &admitted) {
                Ok(Ok(())) => Admission::Admit(admitted),
                Ok(Err(wait_ms)) => Admission::Refuse(Refusal::RateLimited(wait_ms)),
                Err(reason) => Admission::FailOpen(reason),
            },
            Decision::Refuse(answer) => Admission::Refuse(Refusal::Admission(answer)),
            Decision::FailOpen(reason) => Admission::FailOpen(reason),
        }
    }))
    .unwrap_or(Admission::FailOpen(FailOpenReason::AdmissionPanic))
}

/// The snapshot to decide from. Loading it from memory cannot fail; the failpoint stands for the
/// error a cache or store lookup in its place could return.
fn load_snapshot(shared: &Shared) -> Result<arc_swap::Guard<Option<Arc<Snapshot>>>, FailOpenReason> {
    failpoint!("admission.snapshot", |_| Err(FailOpenReason::SnapshotError));
    Ok(shared.snapshot.load())
}

/// Phase rate limit: the key's requests and tokens per minute, or how many milliseconds to wait.
/// The in-memory limiter cannot err; the failpoint stands for one that can (a shared store).
fn rate_limit(shared: &Shared, admitted: &Admitted) -> Result<Result<(), u64>, FailOpenReason> {
    failpoint!("admission.rate_limiter", |_| Err(FailOpenReason::RateLimiterError));
    Ok(shared.limiter.admit(&admitted.key_id, admitted.limits))
}

/// Phase route: the organization's credential, or the client's own provider key when it sent its
/// Recovea key in `x-recovea-key` together with a provider key of its own.
fn target_for(
    shared: &Shared,
    route: &Route<'_>,
    admitted: &Admitted,
    request_headers: &HeaderMap,
) -> Result<Target, Refusal> {
    let brings_own =
        admitted.credential_header.brings_own_provider_key() && headers::has_provider_auth(request_headers);
    let not_configured = || Refusal::ProviderNotConfigured(route.credential.to_owned());
    match (admitted.org.provider(route.credential), route.fallback_kind) {
        (Some(credential), _) => Ok(Target {
            kind: credential.kind,
            scope: credential.scope.clone(),
            base_url: match &credential.base_url {
                Some(url) => url.clone(),
                None => {
                    shared.config.default_base_url(credential.kind).ok_or_else(not_configured)?.to_owned()
                }
            },
            managed_key: (!brings_own).then(|| (credential.kind, credential.api_key.clone())),
        }),
        (None, Some(kind)) if brings_own => Ok(Target {
            kind,
            scope: PriceScope::of_kind(kind),
            base_url: shared.config.default_base_url(kind).ok_or_else(not_configured)?.to_owned(),
            managed_key: None,
        }),
        (None, _) => Err(not_configured()),
    }
}

/// Phase read body: buffered, within the size limit and the time limit, in room the node's body
/// budget gives `tenant` ([`crate::body_budget`]).
async fn read_body<B>(
    shared: &Shared,
    tenant: Option<&OrgId>,
    request_headers: &HeaderMap,
    body: B,
) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let limit = shared.config.max_body_bytes;
    let declared =
        request_headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) || body.size_hint().lower() > limit {
        return Err(Refusal::BodyTooLarge(limit));
    }
    let mut body = std::pin::pin!(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)));
    // Most bodies come whole with the request's head (the gateway's own HTTP/1 server hands them
    // over so): one frame, nothing to collect, no room to hold and no timer. A timer costs more
    // than the read, and one due before the thread's next wake-up costs a system call to set.
    let first = match std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await {
        Poll::Ready(None) => return Ok(Bytes::new()),
        Poll::Ready(Some(Err(e))) => return Err(body_refusal(&e, limit)),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) if body.is_end_stream() => return Ok(data),
            Ok(data) => data,
            Err(_) => Bytes::new(),
        },
        Poll::Pending => Bytes::new(),
    };
    let deadline = tokio::time::Instant::now() + shared.config.body_read_timeout;
    let budget = &shared.body_budget;
    let room_for = |bytes: u64| async move {
        tokio::time::timeout_at(deadline, budget.hold(tenant, bytes))
            .await
            .map_err(|_| Refusal::BodyMemoryBusy)
    };
    // Room for the whole body when it says its length; else for what came and a step more.
    let expected = declared.unwrap_or(first.len() as u64 + BODY_STEP).min(limit);
    let mut room = room_for(expected).await?;
    let mut buffer = Vec::with_capacity(usize::try_from(expected).unwrap_or(usize::MAX));
    buffer.extend_from_slice(&first);
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|e| body_refusal(&e, limit))?.into_data() else { continue };
            let needed = (buffer.len() + data.len()) as u64;
            if needed > room.bytes() {
                // Doubling, as a vector grows: the buffer is allocated to exactly the room held,
                // so what the budget counts is what the body takes, copied O(n) times in all.
                let grown = needed.max(room.bytes().saturating_mul(2)).min(limit.max(needed));
                room.merge(room_for(grown - room.bytes()).await?);
                buffer.reserve_exact(usize::try_from(room.bytes()).unwrap_or(usize::MAX) - buffer.len());
            }
            buffer.extend_from_slice(&data);
        }
        Ok(())
    };
    // Waiting for room counts in the body's time: a body that finds none in it is refused as
    // such (`room_for`'s own timeout is polled first), one that is not sent in it as late.
    tokio::time::timeout_at(deadline, read).await.map_err(|_| Refusal::BodyTimeout)??;
    Ok(room.keep(buffer))
}

/// The room a body that does not say its length asks for first, beyond what came with its head;
/// it doubles from there.
const BODY_STEP: u64 = 64 << 10;

/// The refusal of a body that failed to read: too long, or cut.
fn body_refusal(error: &BoxError, limit: u64) -> Refusal {
    if error.is::<LengthLimitError>() { Refusal::BodyTooLarge(limit) } else { Refusal::BodyUnreadable }
}

/// The request as the provider sees it: no hop-by-hop headers, no Recovea key, the provider's auth.
fn upstream_request(
    parts: &mut Parts,
    route: &Route<'_>,
    target: &Target,
    body: Bytes,
) -> Result<Request<Bytes>, Refusal> {
    let managed = target.managed_key.as_ref().map(|(kind, key)| (*kind, key.as_str()));
    // The admin API accepts only keys that are valid header values, so this holds.
    let provider_headers = headers::for_provider(std::mem::take(&mut parts.headers), managed, body.len())
        .map_err(|_| Refusal::ProviderNotConfigured(route.credential.to_owned()))?;
    // A key in the URL is Gemini's other way to take one: it never reaches the provider.
    let upstream_path = recovea_providers::without_key_param(route.upstream_path);
    let mut uri = String::with_capacity(target.base_url.len() + upstream_path.len());
    uri.push_str(&target.base_url);
    uri.push_str(&upstream_path);
    let uri = Uri::try_from(uri).map_err(|_| Refusal::UnknownRoute)?;
    let mut builder = Request::builder().method(parts.method.clone()).uri(uri).version(Version::HTTP_11);
    if let Some(headers) = builder.headers_mut() {
        *headers = provider_headers;
    }
    builder.body(body).map_err(|_| Refusal::UnknownRoute)
}

/// Phase forward: the provider's answer, its body still streaming.
async fn forward(
    shared: &Shared,
    ctx: &RequestContext,
    request: Request<Bytes>,
) -> Result<Response<ResponseBody>, Refusal> {
    match shared.upstream.send(request, shared.config.upstream_timeout).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            headers::for_client(&mut parts.headers);
            Ok(Response::from_parts(parts, body.boxed_unsync()))
        }
        Err(UpstreamError::Unreachable(e)) => {
            tracing::warn!(request_id = %ctx.request_id.to_str().unwrap_or_default(), error = %e, "provider unreachable");
            Err(Refusal::UpstreamUnreachable)
        }
        Err(UpstreamError::Timeout) => Err(Refusal::UpstreamTimeout),
    }
}

/// Answers a request refused for its head before any phase ran (no route, no admission, no
/// receipt), counted and logged as every answer is.
pub(crate) fn refuse_head(
    shared: &Arc<Shared>,
    error: RequestError,
    shape: WireShape,
) -> Response<ResponseBody> {
    let mut ctx = RequestContext::new(shared.now());
    ctx.outcome = Refusal::Head(error).outcome();
    respond(shared, &ctx, crate::refusal::head_refusal(error, shape))
}

/// Phase respond: every answer carries the gateway's request id; the outcome is counted and logged.
fn respond(
    shared: &Arc<Shared>,
    ctx: &RequestContext,
    mut response: Response<ResponseBody>,
) -> Response<ResponseBody> {
    let headers = response.headers_mut();
    if let Some(provider_id) = headers.remove(&REQUEST_ID) {
        headers.insert(UPSTREAM_REQUEST_ID, provider_id);
    }
    headers.insert(REQUEST_ID, ctx.request_id.clone());
    shared.metrics.request(ctx.outcome);
    ctx.finish(shared, response)
}

impl RequestContext {
    /// The request ends with one of the gateway's own answers.
    fn refused(&mut self, refusal: &Refusal) {
        self.outcome = refusal.outcome();
        if let Refusal::Budget(cap) = refusal {
            self.cap_refusal = Some(cap.clone());
        }
    }

    /// The access-log line and metrics of a request the meter does not finish (the meter
    /// finishes every request it writes a receipt for): now for an answer of the gateway's own,
    /// at the end of its body for a fail-open pass.
    fn finish(&self, shared: &Arc<Shared>, response: Response<ResponseBody>) -> Response<ResponseBody> {
        let sent = matches!(
            self.outcome,
            Outcome::Forwarded | Outcome::UpstreamUnreachable | Outcome::UpstreamTimeout
        );
        if self.admitted.is_some() && sent {
            return response;
        }
        let route = self.credential.as_deref();
        let provider = match (&self.admitted, route) {
            (Some(admitted), Some(name)) => {
                admitted.org.provider(name).map(|c| c.kind).or_else(|| ProviderKind::parse(name))
            }
            (None, Some(name)) => ProviderKind::parse(name),
            (_, None) => None,
        };
        let elapsed = self.received_at.elapsed();
        let request = Finished {
            request_id: self.request_id.to_str().unwrap_or_default(),
            org_id: self.admitted.as_ref().map(|a| a.org.id.as_str()),
            key_id: self.admitted.as_ref().map(|a| a.key_id.as_str()),
            route,
            provider,
            model: self.refused_model.as_deref(),
            status: response.status().as_u16(),
            outcome: self.outcome,
            fail_open: self.fail_open.map(FailOpenReason::label),
            cap: self.cap_refusal.clone(),
            metered: None,
            ttfb: (self.outcome == Outcome::FailOpen).then_some(elapsed),
            total: elapsed,
        };
        if self.outcome == Outcome::FailOpen {
            let shared = Arc::clone(shared);
            return access_log::when_body_ends(&request, self.received_at, response, move |request| {
                access_log::finished(&shared.metrics, shared.config.access_log, request);
            });
        }
        access_log::finished(&shared.metrics, shared.config.access_log, &request);
        response
    }
}
