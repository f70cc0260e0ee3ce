//! The last phase, finish: every request ends in [`finish`], once, when its outcome is final: one
//! access-log line at `info`, and the request's latency, time to first byte, tokens, cost and cap
//! refusal in the metrics. When that is depends on how it went ([`FinishAt`]): the gateway's own
//! answers finish as they are made, a fail-open pass when the provider's answer's body ends, and a
//! request sent to the provider with its receipt, which the meter writes (tokens and cost known).
//!
//! The line names who, where and how it ended, never a secret nor a byte of prompt or completion.

use std::time::{Duration, Instant};

use http::Response;
use tracing::field::display;

use recovea_core::caps::CapRefusal;
use recovea_core::snapshot::ProviderKind;
use recovea_upstream::{ResponseBody, on_end};

use crate::metrics::{Finished, Metrics, Outcome};

/// The `tracing` target of the access log: `--log info,recovea::access=off` silences it too.
pub(crate) const TARGET: &str = "recovea::access";

/// When a request's one [`finish`] runs, by how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishAt {
    /// As its answer is made: one of the gateway's own, whole from the start.
    Now,
    /// When the provider's answer's body ends, is cut or is dropped: a fail-open pass, which
    /// streams the provider's answer and has no receipt ([`when_body_ends`]).
    BodyEnd,
    /// With its receipt, written by the meter however the request ends: an admitted request sent
    /// to the provider, answered or not. A Realtime session finishes with each response's receipt
    /// instead (an upgrade the provider does not switch has one receipt, free).
    Receipt,
}

impl FinishAt {
    /// When a request that ended as `outcome` finishes; `admitted`: the node admitted it (only an
    /// admitted request has a receipt).
    pub(crate) fn of(outcome: Outcome, admitted: bool) -> Self {
        match outcome {
            // Sent: an admitted request has its receipt; a fail-open pass the provider did not
            // answer ends with the gateway's own answer.
            Outcome::Forwarded
            | Outcome::UpstreamUnreachable
            | Outcome::UpstreamTimeout
            | Outcome::ClientClosed => {
                if admitted {
                    Self::Receipt
                } else {
                    Self::Now
                }
            }
            Outcome::FailOpen => Self::BodyEnd,
            Outcome::InvalidKey
            | Outcome::ProviderNotConfigured
            | Outcome::BodyTooLarge
            | Outcome::BodyUnreadable
            | Outcome::BodyMemoryBusy
            | Outcome::UnknownRoute
            | Outcome::BudgetExceeded
            | Outcome::BudgetUnverifiable
            | Outcome::BudgetUnmeterable
            | Outcome::RateLimited
            | Outcome::InvalidRequest
            | Outcome::UnsupportedTransferCoding
            | Outcome::ModelNotAllowed
            | Outcome::EndpointNotAllowed
            | Outcome::ConcurrencyLimited
            | Outcome::InvalidTags => Self::Now,
        }
    }
}

/// The one end of every request: `request` counted in the metrics and, unless `log` is off, its
/// line written. A request is counted by its outcome (`recovea_requests_total`) when its answer's
/// head goes out; one no answer was made for (its client left first: `ClientClosed`) is counted
/// here.
pub(crate) fn finish(metrics: &Metrics, log: bool, request: &Finished<'_>) {
    if request.outcome == Outcome::ClientClosed {
        metrics.request(request.outcome);
    }
    metrics.finished(request);
    if log {
        write(request);
    }
}

/// A request that finishes when its answer's body ends ([`FinishAt::BodyEnd`]): `report` (which
/// calls [`finish`]) is given `request` then, its total measured from `received_at`, when the body
/// ends, is cut, or is dropped. Such a request has no receipt, so `request` has no metered facts.
pub(crate) fn when_body_ends<F>(
    request: &Finished<'_>,
    received_at: Instant,
    response: Response<ResponseBody>,
    report: F,
) -> Response<ResponseBody>
where
    F: FnOnce(&Finished<'_>) + Send + Unpin + 'static,
{
    debug_assert!(request.metered.is_none(), "a metered request finishes with its receipt");
    let waiting = Waiting {
        report,
        request_id: request.request_id.to_owned(),
        org_id: request.org_id.map(str::to_owned),
        key_id: request.key_id.map(str::to_owned),
        route: request.route.map(str::to_owned),
        provider: request.provider,
        model: request.model.map(str::to_owned),
        status: request.status,
        outcome: request.outcome,
        fail_open: request.fail_open,
        cap: request.cap.clone(),
        ttfb: request.ttfb,
        received_at,
    };
    response.map(|body| on_end(body, move |_| waiting.finish()))
}

/// What [`when_body_ends`] keeps of the request until then: all of it but its total.
struct Waiting<F: FnOnce(&Finished<'_>)> {
    report: F,
    request_id: String,
    org_id: Option<String>,
    key_id: Option<String>,
    route: Option<String>,
    provider: Option<ProviderKind>,
    model: Option<String>,
    status: u16,
    outcome: Outcome,
    fail_open: Option<&'static str>,
    cap: Option<CapRefusal>,
    ttfb: Option<Duration>,
    received_at: Instant,
}

impl<F: FnOnce(&Finished<'_>)> Waiting<F> {
    fn finish(self) {
        let request = Finished {
            request_id: &self.request_id,
            org_id: self.org_id.as_deref(),
            key_id: self.key_id.as_deref(),
            route: self.route.as_deref(),
            provider: self.provider,
            model: self.model.as_deref(),
            status: self.status,
            outcome: self.outcome,
            fail_open: self.fail_open,
            cap: self.cap,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The outcomes of a request the node answers itself, refusing it.
    fn refusals() -> impl Iterator<Item = Outcome> {
        let sent = [
            Outcome::Forwarded,
            Outcome::UpstreamUnreachable,
            Outcome::UpstreamTimeout,
            Outcome::ClientClosed,
        ];
        Outcome::ALL.into_iter().filter(move |o| *o != Outcome::FailOpen && !sent.contains(o))
    }

    #[test]
    fn a_request_sent_to_the_provider_finishes_with_its_receipt_when_it_has_one() {
        for outcome in [
            Outcome::Forwarded,
            Outcome::UpstreamUnreachable,
            Outcome::UpstreamTimeout,
            Outcome::ClientClosed,
        ] {
            assert_eq!(FinishAt::of(outcome, true), FinishAt::Receipt, "{outcome:?}");
            // A fail-open pass the provider did not answer gets the gateway's own answer.
            assert_eq!(FinishAt::of(outcome, false), FinishAt::Now, "{outcome:?}");
        }
    }

    #[test]
    fn a_fail_open_pass_finishes_when_its_answer_ends() {
        assert_eq!(FinishAt::of(Outcome::FailOpen, false), FinishAt::BodyEnd);
    }

    #[test]
    fn a_refusal_finishes_as_it_is_made_admitted_or_not() {
        let mut seen = 0;
        for outcome in refusals() {
            assert_eq!(FinishAt::of(outcome, true), FinishAt::Now, "{outcome:?}");
            assert_eq!(FinishAt::of(outcome, false), FinishAt::Now, "{outcome:?}");
            seen += 1;
        }
        assert_eq!(seen, Outcome::ALL.len() - 5, "every outcome but the sent ones and a pass");
    }

    fn ended(outcome: Outcome) -> Finished<'static> {
        Finished {
            request_id: "req_1",
            org_id: None,
            key_id: None,
            route: Some("openai"),
            provider: Some(ProviderKind::OpenAi),
            model: None,
            status: 499,
            outcome,
            fail_open: None,
            cap: None,
            metered: None,
            ttfb: None,
            total: Duration::from_millis(3),
        }
    }

    #[test]
    fn finish_counts_a_request_no_answer_was_made_for_and_no_other() {
        let metrics = Metrics::new(
            std::sync::Arc::default(),
            recovea_counters::Counters::new("node_test"),
            std::sync::Arc::default(),
        );
        finish(&metrics, false, &ended(Outcome::ClientClosed));
        finish(&metrics, false, &ended(Outcome::Forwarded));
        let rendered = metrics.render();
        assert!(rendered.contains("recovea_requests_total{outcome=\"client_closed\"} 1"), "{rendered}");
        assert!(rendered.contains("recovea_requests_total{outcome=\"forwarded\"} 0"), "{rendered}");
    }
}
