//! Phases route check, read credential, admit, rate limit, endpoint allowlist, requests in
//! flight, tags and route: where a request goes and with which provider auth ([`Target`]), or why
//! not. Read credential, admit and rate limit run inside one `catch_unwind`: a fault of ours there
//! is a fail-open pass, never the caller's refusal.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderValue;
use recovea_core::admission::{Admitted, Decision, FailOpenReason};
use recovea_core::pricing::PriceScope;
use recovea_core::snapshot::ProviderKind;
use recovea_core::tags;
use recovea_core::{Snapshot, Timestamp, credential};
use recovea_providers::{Route, headers};

use super::RequestContext;
use crate::metrics::Outcome;
use crate::node::Shared;
use crate::refusal::Refusal;

/// `fail::fail_point!` with the `failpoints` feature, which only tests enable; nothing otherwise.
/// Each point takes the `fail` actions (`FAILPOINTS=admission.snapshot=return`, `...=panic`).
macro_rules! failpoint {
    ($($point:tt)*) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($($point)*);
    };
}

/// Where an admitted (or failed-open) request goes and with which provider auth.
pub(super) struct Target {
    pub(super) kind: ProviderKind,
    /// Where the request's model is priced (the credential's namespace and fallback).
    pub(super) scope: PriceScope,
    pub(super) base_url: String,
    /// The managed key to inject, with its kind; `None` leaves the client's own auth in place.
    pub(super) managed_key: Option<(ProviderKind, String)>,
}

impl Target {
    /// Who pays the provider: the organization, when its managed key goes in, else the client.
    pub(super) fn provider_key(&self) -> recovea_core::receipt::ProviderKey {
        match self.managed_key {
            Some(_) => recovea_core::receipt::ProviderKey::Managed,
            None => recovea_core::receipt::ProviderKey::Client,
        }
    }
}

/// Phases route check, read credential, admit, rate limit, endpoint allowlist, requests in flight,
/// tags and route: where the request goes, or why not. What it learns goes on `ctx` (the route's
/// credential, who is calling, their tags and slot in flight, or why it fails open).
pub(super) fn plan<'p>(
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
