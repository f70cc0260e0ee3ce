//! One request's way through the node, as named phases: read credential, admit, route, read body,
//! forward, respond. [`RequestContext`] carries what each phase learned to the next.

use std::panic::AssertUnwindSafe;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use recovea_core::admission::{Admitted, Decision, FailOpenReason};
use recovea_core::snapshot::ProviderKind;
use recovea_core::{Answer, Timestamp, credential};
use recovea_providers::{Route, headers};

use crate::Shared;
use crate::metrics::Outcome;
use crate::upstream::UpstreamError;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Where a provider's own request id goes, since `x-request-id` carries the gateway's.
const UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");
/// How long a client may take to send its request body.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the phases of one request learned, in the order they learned it.
pub(crate) struct RequestContext {
    pub(crate) request_id: HeaderValue,
    pub(crate) outcome: Outcome,
}

impl RequestContext {
    pub(crate) fn new() -> Self {
        let mut id = String::with_capacity(24);
        id.push_str("req_");
        recovea_core::ids::push_base62(&mut id, 20, || fastrand::u8(..));
        let request_id = HeaderValue::try_from(id).expect("base62 is a valid header value");
        Self { request_id, outcome: Outcome::Forwarded }
    }
}

/// Where an admitted (or failed-open) request goes and with which provider auth.
struct Target {
    base_url: String,
    /// The managed key to inject, with its kind; `None` leaves the client's own auth in place.
    managed_key: Option<(ProviderKind, String)>,
}

/// Runs the phases for one proxied request and always produces a response.
pub(crate) async fn handle<B>(
    shared: &Shared,
    ctx: &mut RequestContext,
    request: Request<B>,
) -> Response<ResponseBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let response = match run(shared, ctx, request).await {
        Ok(response) => response,
        Err((outcome, answer)) => {
            ctx.outcome = outcome;
            answer_response(answer)
        }
    };
    respond(shared, ctx, response)
}

type Refusal = (Outcome, Answer);

async fn run<B>(
    shared: &Shared,
    ctx: &mut RequestContext,
    request: Request<B>,
) -> Result<Response<ResponseBody>, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
    let Some(route) = recovea_providers::route(&path_and_query) else {
        return Err((Outcome::UnknownRoute, Answer::unknown_route()));
    };

    // Phases: read credential, then admit.
    let decision = admit(shared, &parts.headers);

    // Phase: route to a target.
    let target = match decision {
        Decision::Admit(admitted) => target_for(shared, &route, &admitted)?,
        Decision::Refuse(answer) => return Err((Outcome::InvalidKey, answer)),
        Decision::FailOpen(reason) => {
            ctx.outcome = Outcome::FailOpen;
            shared.metrics.fail_open(reason);
            tracing::error!(reason = reason.label(), request_id = ?ctx.request_id, "fail-open pass: forwarding unadmitted");
            let kind = route.fallback_kind.ok_or_else(|| {
                (Outcome::ProviderNotConfigured, Answer::provider_not_configured(route.credential))
            })?;
            Target { base_url: shared.config.default_base_url(kind).to_owned(), managed_key: None }
        }
    };

    // Phase: read body.
    let body = read_body(shared.config.max_body_bytes, &parts.headers, body).await?;

    // Phase: forward.
    headers::remove_hop_by_hop(&mut parts.headers);
    headers::remove_recovea_key(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some((kind, key)) = &target.managed_key {
        // The admin API accepts only keys that are valid header values, so this holds.
        headers::set_managed_key(&mut parts.headers, *kind, key).map_err(|_| {
            (Outcome::ProviderNotConfigured, Answer::provider_not_configured(route.credential))
        })?;
    }
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    parts.uri = format!("{}{}", target.base_url, route.upstream_path)
        .parse::<Uri>()
        .map_err(|_| (Outcome::UnknownRoute, Answer::unknown_route()))?;
    parts.version = Version::HTTP_11;
    let upstream_request = Request::from_parts(parts, Full::new(body));

    match shared.upstream.send(upstream_request, shared.config.upstream_timeout).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            headers::remove_hop_by_hop(&mut parts.headers);
            let body = body.map_err(BoxError::from).boxed_unsync();
            Ok(Response::from_parts(parts, body))
        }
        Err(UpstreamError::Unreachable(e)) => {
            tracing::warn!(request_id = ?ctx.request_id, error = %e, "provider unreachable");
            Err((Outcome::UpstreamUnreachable, Answer::upstream_unreachable()))
        }
        Err(UpstreamError::Timeout) => Err((Outcome::UpstreamTimeout, Answer::upstream_timeout())),
    }
}

/// Reads the credential and decides. A panic inside admission is a fault of ours, so the request
/// passes through rather than fail.
fn admit(shared: &Shared, request_headers: &http::HeaderMap) -> Decision {
    let now = Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    );
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let snapshot = shared.snapshot.load();
        recovea_core::admit(snapshot.as_deref(), credential::read(request_headers), now)
    }))
    .unwrap_or(Decision::FailOpen(FailOpenReason::AdmissionFault))
}

fn target_for(shared: &Shared, route: &Route<'_>, admitted: &Admitted) -> Result<Target, Refusal> {
    let own_key = admitted.credential_header.brings_own_provider_key();
    match admitted.org.provider(route.credential) {
        Some(credential) => Ok(Target {
            base_url: credential
                .base_url
                .clone()
                .unwrap_or_else(|| shared.config.default_base_url(credential.kind).to_owned()),
            managed_key: (!own_key).then(|| (credential.kind, credential.api_key.clone())),
        }),
        None => match route.fallback_kind {
            Some(kind) if own_key => {
                Ok(Target { base_url: shared.config.default_base_url(kind).to_owned(), managed_key: None })
            }
            _ => Err((Outcome::ProviderNotConfigured, Answer::provider_not_configured(route.credential))),
        },
    }
}

async fn read_body<B>(limit: u64, request_headers: &http::HeaderMap, body: B) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let too_large = || (Outcome::BodyTooLarge, Answer::request_too_large(limit));
    let declared =
        request_headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) || body.size_hint().lower() > limit {
        return Err(too_large());
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let unreadable = || (Outcome::BodyUnreadable, Answer::request_body_unreadable());
    match tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(_)) | Err(_) => Err(unreadable()),
    }
}

/// Turns one of the gateway's own answers into a response.
pub(crate) fn answer_response(answer: Answer) -> Response<ResponseBody> {
    let mut response =
        Response::new(Full::new(Bytes::from(answer.body)).map_err(BoxError::from).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The last phase: every answer carries the gateway's request id, and the outcome is counted.
fn respond(
    shared: &Shared,
    ctx: &RequestContext,
    mut response: Response<ResponseBody>,
) -> Response<ResponseBody> {
    let headers = response.headers_mut();
    if let Some(provider_id) = headers.remove(&REQUEST_ID) {
        headers.insert(UPSTREAM_REQUEST_ID, provider_id);
    }
    headers.insert(REQUEST_ID, ctx.request_id.clone());
    shared.metrics.request(ctx.outcome);
    response
}
