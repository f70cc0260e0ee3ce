//! One request's way through the node, as named phases: route check to route ([`admit`]), read
//! body to model allowlist ([`body`]), check spend ([`spend`]), forward and respond ([`forward`]).
//! [`run`] calls them in order, [`RequestContext`] carries what each learned, and [`handle`] is the
//! request's one way out, refused or answered.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, Version};
use recovea_core::Timestamp;
use recovea_core::admission::{Admitted, FailOpenReason};
use recovea_core::answer::WireShape;
use recovea_core::caps;
use recovea_core::channel::{self, RequestLine};
use recovea_core::snapshot::ProviderKind;
use recovea_core::tags::Tags;
use recovea_http1::RequestError;
use recovea_providers::headers;
use recovea_providers::usage::Surface;
use recovea_upstream::{BoxError, ResponseBody};

use crate::access_log::{self, FinishAt};
use crate::metrics::{Finished, Outcome};
use crate::node::Shared;
use crate::refusal::{BodyLeft, Refusal, Refused};
use crate::trace::{Phase, Trace};

mod admit;
mod body;
mod forward;
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
    respond(shared, ctx, response)
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

/// The phases, in order; each refusal says what it left of the request on the connection.
async fn run<B>(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
    request: Request<B>,
) -> Result<Response<ResponseBody>, Refused>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let has_body = parts.headers.contains_key(header::TRANSFER_ENCODING)
        || parts.headers.get(header::CONTENT_LENGTH).is_some_and(|v| v != "0");
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();

    // Route check, read credential, admit, rate limit, endpoint allowlist, requests in flight,
    // tags, route.
    ctx.trace.start(Phase::Admit);
    let (route, target) = match admit::plan(shared, ctx, &parts.headers, &path_and_query) {
        Ok(planned) => planned,
        Err(refusal) => {
            // A small body is read and dropped so that the connection can carry the next request.
            let read = body::discard(body).await;
            return Err(Refused::new(refusal, BodyLeft::of(has_body, read)));
        }
    };
    ctx.trace.end(Phase::Admit);

    // Read body: refused before it was read, the connection ends with the answer. From here on a
    // refusal leaves nothing of the request on the connection (`Refused::from`).
    let tenant = ctx.admitted.as_ref().map(|admitted| &admitted.org.id);
    let body = body::read(shared, tenant, &parts.headers, body)
        .await
        .map_err(|refusal| Refused::new(refusal, BodyLeft::of(has_body, false)))?;

    // What the body says, and the model allowlist.
    let endpoint = route.upstream_path.split_once('?').map_or(route.upstream_path, |(path, _)| path);
    let surface = Surface::of(target.kind, endpoint);
    let body::Read { mut facts, input_tokens } =
        body::inspect(ctx, &parts.headers, &route, endpoint, surface, &body)?;

    // Check spend, by the request's channel: how it spends decides what it reserves.
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

    // Forward, and the answer back: a Realtime session's relay, or the provider's answer, metered.
    let outbound = forward::Outbound { route, target, endpoint, surface, facts, input_tokens, prices, spend };
    Ok(forward::forward(shared, ctx, parts, body, outbound).await?)
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
    respond(shared, &mut ctx, crate::refusal::head_refusal(error, shape))
}

/// Phase respond: every answer carries the gateway's request id; the outcome is counted and logged.
fn respond(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
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

    /// The request's one end: its log line and counts ([`Self::logged`]), and its trace, which
    /// follows the answer's body to its last byte.
    fn finish(&mut self, shared: &Arc<Shared>, response: Response<ResponseBody>) -> Response<ResponseBody> {
        let response = self.logged(shared, response);
        let mut trace = std::mem::take(&mut self.trace);
        trace.finish(|| self.trace_facts(), response)
    }

    /// [`access_log::finish`] now for an answer of the gateway's own, when its body ends for a
    /// fail-open pass, and nothing here for a request the meter writes a receipt for, which
    /// finishes with it ([`FinishAt`]).
    fn logged(&self, shared: &Arc<Shared>, response: Response<ResponseBody>) -> Response<ResponseBody> {
        let at = FinishAt::of(self.outcome, self.admitted.is_some());
        if at == FinishAt::Receipt {
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
            // A pass's answer is the provider's: its head came now.
            ttfb: (at == FinishAt::BodyEnd).then_some(elapsed),
            total: elapsed,
        };
        let log = shared.config.access_log;
        if at == FinishAt::BodyEnd {
            let shared = Arc::clone(shared);
            return access_log::when_body_ends(&request, self.received_at, response, move |request| {
                access_log::finish(&shared.metrics, log, request);
            });
        }
        access_log::finish(&shared.metrics, log, &request);
        response
    }
}
