//! Phase forward, and the answer on its way back: the request as the provider sees it (no
//! hop-by-hop headers, no Recovea key, the provider's auth), sent through the node's pooled
//! client; an admitted request's answer metered as it streams (its receipt written however the
//! request ends), a Realtime session's upgrade asked and the session relayed.

use std::sync::Arc;

use bytes::Bytes;
use http::header;
use http::request::Parts;
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use recovea_core::admission::Admitted;
use recovea_core::snapshot::{Prices, ProviderKind};
use recovea_providers::request_body::RequestFacts;
use recovea_providers::rewrite;
use recovea_providers::usage::{Surface, Tapped};
use recovea_providers::{Route, headers};
use recovea_upstream::{ResponseBody, UpstreamError};

use super::RequestContext;
use super::admit::Target;
use super::spend::Spend;
use crate::line;
use crate::metered_body::{MeteredBody, PendingReceipt};
use crate::metering::{Metered, Timing};
use crate::node::Shared;
use crate::realtime;
use crate::refusal::Refusal;
use crate::trace::Phase;

/// What the phases before it decided of a request the provider is about to be sent.
pub(super) struct Outbound<'r> {
    pub(super) route: Route<'r>,
    pub(super) target: Target,
    /// The routed path without its query.
    pub(super) endpoint: &'r str,
    pub(super) surface: Surface,
    pub(super) facts: RequestFacts,
    pub(super) input_tokens: u64,
    pub(super) prices: Prices,
    pub(super) spend: Spend,
}

/// Phase forward: the request sent and its answer on its way back, metered when the request was
/// admitted; an admitted Realtime upgrade opens a session instead ([`session`]).
pub(super) async fn forward(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
    mut parts: Parts,
    mut body: Bytes,
    outbound: Outbound<'_>,
) -> Result<Response<ResponseBody>, Refusal> {
    // Usage is read from the stream; OpenAI streams carry it only when asked. A fail-open pass is
    // not metered: its body goes as the client sent it.
    let mut strip_usage_chunk = false;
    if ctx.admitted.is_some()
        && matches!(outbound.surface, Surface::ChatCompletions | Surface::Completions)
        && let Some(rewritten) = rewrite::force_include_usage_with(&body, &outbound.facts)
    {
        body = Bytes::from(rewritten);
        strip_usage_chunk = !outbound.facts.client_asked_usage;
    }
    let on_upgrade =
        outbound.spend.session.then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>()).flatten();
    let request = upstream_request(&mut parts, &outbound.route, &outbound.target, body)?;
    let kind = outbound.target.kind;
    if let (Some(admitted), Some(on_upgrade)) = (&ctx.admitted, on_upgrade) {
        let admitted = admitted.clone();
        return session(shared, ctx, admitted, outbound, on_upgrade, request).await;
    }
    let Some(metered) = metered(shared, ctx, outbound) else {
        // A fail-open pass: no receipt, its answer as it comes.
        ctx.trace.start(Phase::Upstream);
        return answered(shared, ctx, kind, request).await;
    };
    // From here the provider is called: the receipt is written however the request ends, a
    // client gone before the answer's head included.
    let metered = PendingReceipt::new(Arc::clone(shared), metered);
    ctx.trace.start(Phase::Upstream);
    match answered(shared, ctx, kind, request).await {
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
            Err(refusal)
        }
    }
}

/// The provider's answer to `request`, counted by its status.
async fn answered(
    shared: &Shared,
    ctx: &mut RequestContext,
    kind: ProviderKind,
    request: Request<Bytes>,
) -> Result<Response<ResponseBody>, Refusal> {
    let result = send(shared, ctx, request).await;
    if let Ok(response) = &result {
        ctx.trace.end(Phase::Upstream);
        shared.metrics.upstream_answered(kind, response.status().as_u16());
    }
    result
}

/// What the receipt of an admitted request is made of, as it is sent; `None` for a fail-open
/// pass, which has none.
fn metered(shared: &Arc<Shared>, ctx: &mut RequestContext, outbound: Outbound<'_>) -> Option<Metered> {
    let admitted = ctx.admitted.as_ref()?;
    let Outbound { route, target, endpoint, surface, facts, input_tokens, prices, spend } = outbound;
    Some(Metered {
        request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
        org_id: admitted.org.id.to_string(),
        key_id: admitted.key_id.to_string(),
        provider: route.credential.to_owned(),
        provider_key: target.provider_key(),
        endpoint: endpoint.to_owned(),
        request_model: facts.model,
        kind: target.kind,
        scope: target.scope,
        stream: facts.stream || recovea_providers::usage::streams_by_path(endpoint),
        surface,
        input_tokens,
        media: facts.media,
        started_at: ctx.started_at,
        prices,
        tags: std::mem::take(&mut ctx.tags),
        charge: spend.charge,
        creating: spend.creating,
        settle: Some(line::settle(shared, admitted, spend.reservation)),
        timing: Timing::since(ctx.received_at),
        trace: ctx.trace.usage_slot(),
    })
}

/// An admitted Realtime upgrade: the provider is asked to upgrade, then the session is relayed, its
/// responses metered one by one as they end (`realtime`), each checked at the caps before it is
/// asked for. Its place among the key's requests in flight goes with it.
async fn session(
    shared: &Arc<Shared>,
    ctx: &mut RequestContext,
    admitted: Admitted,
    outbound: Outbound<'_>,
    on_upgrade: hyper::upgrade::OnUpgrade,
    mut request: Request<Bytes>,
) -> Result<Response<ResponseBody>, Refusal> {
    let Outbound { route, target, endpoint, prices, .. } = outbound;
    headers::for_upgrade(request.headers_mut());
    let session = realtime::SessionFacts {
        request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
        provider: route.credential.to_owned(),
        provider_key: target.provider_key(),
        kind: target.kind,
        scope: target.scope,
        endpoint: endpoint.to_owned(),
        model: recovea_providers::realtime::model_in_query(route.upstream_path).map(str::to_owned),
        prices,
        tags: std::mem::take(&mut ctx.tags),
        _in_flight: ctx.in_flight.take(),
    };
    ctx.trace.start(Phase::Upstream);
    realtime::open(shared, admitted, session, on_upgrade, request).await
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

/// The provider's answer, its body still streaming.
async fn send(
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
