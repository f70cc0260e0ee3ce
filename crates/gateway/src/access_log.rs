//! The last phase of a request: once its outcome is final, one access-log line at `info` and the
//! request's latency, time to first byte, tokens and cost in the metrics. A metered request ends
//! in the meter (after its body, when tokens and cost are known); every other one (refused,
//! passed fail-open) ends in the proxy.
//!
//! The line names who, where and how it ended, never a secret nor a byte of prompt or completion.

use std::time::{Duration, Instant};

use http::Response;
use tracing::field::display;

use recovea_core::snapshot::ProviderKind;
use recovea_upstream::{ResponseBody, on_end};

use crate::metrics::{Finished, Metrics, Outcome};

/// The `tracing` target of the access log: `--log info,recovea::access=off` silences it too.
pub(crate) const TARGET: &str = "recovea::access";

/// Counts the request in the metrics and, unless `log` is off, writes its line.
pub(crate) fn finished(metrics: &Metrics, log: bool, request: &Finished<'_>) {
    metrics.finished(request);
    if log {
        write(request);
    }
}

/// A request the gateway does not meter but whose answer streams from the provider (a fail-open
/// pass): `report` (which calls [`finished`]) is given its line when the body ends, is cut, or is
/// dropped.
pub(crate) fn when_body_ends<F>(
    request: &Finished<'_>,
    received_at: Instant,
    response: Response<ResponseBody>,
    report: F,
) -> Response<ResponseBody>
where
    F: FnOnce(&Finished<'_>) + Send + Unpin + 'static,
{
    let pass = Pass {
        report,
        request_id: request.request_id.to_owned(),
        route: request.route.map(str::to_owned),
        provider: request.provider,
        status: request.status,
        outcome: request.outcome,
        fail_open: request.fail_open,
        ttfb: request.ttfb,
        received_at,
    };
    response.map(|body| on_end(body, move |_| pass.finish()))
}

/// What [`when_body_ends`] keeps of the request until then.
struct Pass<F: FnOnce(&Finished<'_>)> {
    report: F,
    request_id: String,
    route: Option<String>,
    provider: Option<ProviderKind>,
    status: u16,
    outcome: Outcome,
    fail_open: Option<&'static str>,
    ttfb: Option<Duration>,
    received_at: Instant,
}

impl<F: FnOnce(&Finished<'_>)> Pass<F> {
    fn finish(self) {
        let request = Finished {
            request_id: &self.request_id,
            org_id: None,
            key_id: None,
            route: self.route.as_deref(),
            provider: self.provider,
            model: None,
            status: self.status,
            outcome: self.outcome,
            fail_open: self.fail_open,
            cap: None,
            metered: None,
            ttfb: self.ttfb,
            total: self.received_at.elapsed(),
        };
        (self.report)(&request);
    }
}

fn write<'a>(request: &Finished<'a>) {
    let usage = request.metered.as_ref().map(|m| m.usage);
    let (scope, window) = match &request.cap {
        Some(refusal) => (Some(refusal.cap_scope().as_str()), Some(refusal.cap_window().as_str())),
        None => (None, None),
    };
    // Strings as `Display`, so that the text format writes them bare (JSON writes every value as a
    // plain string either way).
    let text = |s: Option<&'a str>| s.map(display);
    tracing::info!(
        target: TARGET,
        request_id = %request.request_id,
        org_id = text(request.org_id),
        key_id = text(request.key_id),
        route = text(request.route),
        provider = text(request.provider.map(ProviderKind::as_str)),
        model = text(request.model),
        status = request.status,
        outcome = %request.outcome.label(),
        fail_open_reason = text(request.fail_open),
        cap_scope = text(scope),
        cap_window = text(window),
        input_tokens = usage.map(|u| u.input_tokens),
        output_tokens = usage.map(|u| u.output_tokens),
        cached_input_tokens = usage.map(|u| u.cached_input_tokens),
        cache_write_input_tokens = usage.map(|u| u.cache_write_input_tokens),
        usage_estimated = request.metered.as_ref().map(|m| m.usage_estimated),
        cost_usd = request.metered.as_ref().map(|m| display(m.cost)),
        ttfb_ms = request.ttfb.map(millis),
        total_ms = millis(request.total),
        "request"
    );
}

/// Milliseconds to the microsecond.
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}
