//! `/metrics`: every count of the node in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use recovea_core::channel::Unseen;

use super::histogram::{self, Histogram};
use super::labels::{
    CAP_CODES, CAP_SCOPES, CAP_WINDOWS, FAIL_OPEN_REASONS, HandOver, LINE_ANSWERS, Outcome, PROVIDERS,
    STATUS_CLASSES,
};
use super::{ByProviderOutcome, Metrics, unix_ms};

impl Metrics {
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(1024);
        let load = |n: &AtomicU64| n.load(Relaxed);
        labelled(
            &mut out,
            ("recovea_requests_total", "Requests through the proxy, by how they ended.", "outcome"),
            Outcome::ALL.iter().map(|o| (o.label(), load(&self.requests[*o as usize]))),
        );
        labelled(
            &mut out,
            ("recovea_fail_open_total", "Requests passed through unadmitted, by reason.", "reason"),
            FAIL_OPEN_REASONS.iter().zip(&self.fail_open).map(|(r, n)| (r.label(), load(n))),
        );
        labelled(
            &mut out,
            (
                "recovea_unmetered_requests_total",
                "Requests forwarded that are billed where the gateway cannot see them (no armed cap covered their key), by endpoint.",
                "endpoint",
            ),
            Unseen::LABELS.iter().zip(&self.unmetered).map(|(e, n)| (*e, load(n))),
        );
        let _ = writeln!(
            out,
            "# HELP recovea_realtime_sessions Realtime sessions relayed now.\n# TYPE recovea_realtime_sessions gauge\nrecovea_realtime_sessions {}",
            load(&self.realtime_sessions)
        );
        let _ = writeln!(
            out,
            "# HELP recovea_realtime_cuts_total Realtime sessions an armed cap cut at its line.\n# TYPE recovea_realtime_cuts_total counter\nrecovea_realtime_cuts_total {}",
            load(&self.realtime_cuts)
        );
        labelled(
            &mut out,
            (
                "recovea_cap_line_asks_total",
                "Requests near an armed cap's line that asked the shared counter store, by its answer.",
                "answer",
            ),
            LINE_ANSWERS.iter().zip(&self.line_asks).map(|(a, n)| (*a, load(n))),
        );
        labelled(
            &mut out,
            (
                "recovea_cap_line_decisions_total",
                "Requests near an armed cap's line, decided after asking the shared counter store: admitted or refused.",
                "decision",
            ),
            ["admitted", "refused"].into_iter().zip(&self.line_decisions).map(|(d, n)| (d, load(n))),
        );
        out.push_str("# HELP recovea_cap_refusals_total Requests refused by an armed cap: reached (budget_exceeded, 402), unable to confirm its spend (budget_unverifiable, 503), or covering a request billed where the gateway cannot see it (budget_unmeterable, 402), by the cap's scope and window.\n# TYPE recovea_cap_refusals_total counter\n");
        for (code, by_scope) in CAP_CODES.iter().zip(&self.cap_refusals) {
            for (scope, by_window) in CAP_SCOPES.iter().zip(by_scope) {
                for (window, n) in CAP_WINDOWS.iter().zip(by_window) {
                    let _ = writeln!(
                        out,
                        "recovea_cap_refusals_total{{code=\"{code}\",scope=\"{}\",window=\"{}\"}} {}",
                        scope.as_str(),
                        window.as_str(),
                        load(n)
                    );
                }
            }
        }
        histogram::render_family(
            &mut out,
            (
                "recovea_request_duration_seconds",
                "From a proxied request's head received to its answer's end, by provider kind and outcome.",
            ),
            ("provider", "outcome"),
            series(&self.latency),
        );
        histogram::render_family(
            &mut out,
            (
                "recovea_upstream_ttfb_seconds",
                "From a request sent to the provider to its answer's head, by provider kind and outcome.",
            ),
            ("provider", "outcome"),
            series(&self.upstream_ttfb),
        );
        out.push_str("# HELP recovea_upstream_responses_total Answers from providers, by provider kind and status class.\n# TYPE recovea_upstream_responses_total counter\n");
        for (provider, by_class) in PROVIDERS.iter().zip(&self.upstream_status) {
            for (class, n) in STATUS_CLASSES.iter().zip(by_class) {
                let _ = writeln!(
                    out,
                    "recovea_upstream_responses_total{{provider=\"{provider}\",class=\"{class}\"}} {}",
                    load(n)
                );
            }
        }
        self.by_model.render(&mut out);
        labelled(
            &mut out,
            (
                "recovea_upstream_connections_opened_total",
                "Connections opened to providers, by protocol.",
                "protocol",
            ),
            self.upstream.opened_by_protocol().into_iter(),
        );
        labelled(
            &mut out,
            (
                "recovea_upstream_retries_total",
                "Requests sent again on a new connection, by why it was safe.",
                "reason",
            ),
            self.upstream.retries_by_reason().into_iter(),
        );
        labelled(
            &mut out,
            (
                "recovea_http1_handed_over_total",
                "Client connections handed to hyper's server, by what their request asked for.",
                "reason",
            ),
            HandOver::ALL.iter().map(|r| (r.label(), load(&self.handed_over[*r as usize]))),
        );
        let counters = [
            (
                "recovea_client_connections_refused_total",
                "Client connections closed at once: the node held --max-connections.",
                self.connections.refused.load(Relaxed),
            ),
            (
                "recovea_client_connections_shed_total",
                "Idle client connections closed to make room as --max-connections neared.",
                self.connections.shed.load(Relaxed),
            ),
            (
                "recovea_receipts_estimated_total",
                "Receipts whose usage the provider did not report.",
                self.receipts_estimated.load(Relaxed),
            ),
            (
                "recovea_receipts_unpriced_total",
                "Receipts of models without a price of their own, costed at their kind's fallback price (priced=false).",
                self.receipts_unpriced.load(Relaxed),
            ),
            (
                "recovea_receipts_delivered_total",
                "Receipts delivered from the spool to the ledger.",
                self.spool.delivered.load(Relaxed),
            ),
            (
                "recovea_receipts_dropped_total",
                "Receipts lost: the disk refused them while memory held as many as its bound allows.",
                self.spool.dropped.load(Relaxed),
            ),
            (
                "recovea_receipts_dead_lettered_total",
                "Receipts the ledger refused as invalid, set aside in the spool's dead-letter file.",
                self.spool.dead_lettered.load(Relaxed),
            ),
            (
                "recovea_spool_writes_total",
                "Writes that appended receipts to the spool: receipts that end together share one.",
                self.spool.writes.load(Relaxed),
            ),
            (
                "recovea_spool_receipts_read_back_total",
                "Receipts read back from the spool's files for delivery: memory no longer held them.",
                self.spool.read_back.load(Relaxed),
            ),
            (
                "recovea_spool_corrupt_lines_total",
                "Spool lines that could not be read back.",
                self.spool.corrupt.load(Relaxed),
            ),
            (
                "recovea_log_lines_dropped_total",
                "Log lines dropped because the log's queue was full (stderr slower than the lines came).",
                crate::log_writer::log_lines_dropped(),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let gauges = [
            (
                "recovea_receipts_pending",
                "Receipts in the spool (or held in memory) not yet delivered.",
                u64::try_from(self.spool.pending.load(Relaxed)).unwrap_or(0),
            ),
            (
                "recovea_receipts_held",
                "Receipts the disk refused, held in memory until appended or delivered.",
                self.spool.held.load(Relaxed),
            ),
            ("recovea_spool_bytes", "The size of the spool's segment files.", self.spool.bytes.load(Relaxed)),
            (
                "recovea_snapshot_version",
                "The feed version of the state the node serves (0: none yet).",
                self.feed_version.load(Relaxed),
            ),
            (
                "recovea_client_connections",
                "Client connections open.",
                u64::try_from(self.connections.open.load(Relaxed)).unwrap_or(u64::MAX),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        if let Some(confirmed) = self.counters.confirmed_at() {
            let age = unix_ms().saturating_sub(u64::try_from(confirmed.0).unwrap_or(0)) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "# HELP recovea_counters_age_seconds Time since the spend counters were last confirmed.\n# TYPE recovea_counters_age_seconds gauge\nrecovea_counters_age_seconds {age:.3}"
            );
        }
        // Zero without a shared store; the deadline only where requests ask one.
        let round_trip = self.counters.store_round_trip();
        let _ = writeln!(
            out,
            "# HELP recovea_shared_store_round_trip_seconds The shared counter store's recent round trip (a moving average; 0 without one).\n# TYPE recovea_shared_store_round_trip_seconds gauge\nrecovea_shared_store_round_trip_seconds {:.6}",
            round_trip.as_secs_f64()
        );
        let offset_ms = self.counters.clock_offset_ms().unwrap_or(0);
        let _ = writeln!(
            out,
            "# HELP recovea_clock_offset_seconds The shared counter store's clock less this node's, as last measured (0 without one); windows are decided on the store's.\n# TYPE recovea_clock_offset_seconds gauge\nrecovea_clock_offset_seconds {:.3}",
            offset_ms as f64 / 1000.0
        );
        let (lost, given_back) = self.counters.lost_windows_rebuilt();
        let _ = writeln!(
            out,
            "# HELP recovea_spend_windows_lost_total Spend windows the shared counter store lost after they were seeded (a flush, a restart without persistence), each rebuilt from the ledger and the nodes' writers.\n# TYPE recovea_spend_windows_lost_total counter\nrecovea_spend_windows_lost_total {lost}\n# HELP recovea_lost_spend_rebuilt_usd_total Spend the ledger gave back to the windows the store lost: what no live node's writer held.\n# TYPE recovea_lost_spend_rebuilt_usd_total counter\nrecovea_lost_spend_rebuilt_usd_total {given_back}",
        );
        if self.counters.counting() == recovea_core::caps::Counting::Shared {
            let _ = writeln!(
                out,
                "# HELP recovea_cap_line_deadline_seconds How long a request near an armed cap's line waits for the store's answer before its spend counts as unconfirmed.\n# TYPE recovea_cap_line_deadline_seconds gauge\nrecovea_cap_line_deadline_seconds {:.3}",
                recovea_counters::line_deadline(round_trip).as_secs_f64()
            );
        }
        let confirmed = self.snapshot_confirmed_ms.load(Relaxed);
        if confirmed > 0 {
            let age = unix_ms().saturating_sub(confirmed) as f64 / 1000.0;
            out.push_str(
                "# HELP recovea_snapshot_age_seconds Time since the serving state was last confirmed as the latest.\n",
            );
            out.push_str("# TYPE recovea_snapshot_age_seconds gauge\n");
            let _ = writeln!(out, "recovea_snapshot_age_seconds {age:.3}");
        }
        out
    }
}

/// Every histogram of a family, with its provider and outcome labels.
fn series(by: &ByProviderOutcome) -> impl Iterator<Item = (&'static str, &'static str, &Histogram)> + '_ {
    PROVIDERS.iter().zip(by.iter()).flat_map(|(provider, by_outcome)| {
        Outcome::ALL.iter().map(move |o| (*provider, o.label(), &by_outcome[*o as usize]))
    })
}

/// A counter with one label: its help and type, then a line per label value.
fn labelled<'a>(
    out: &mut String,
    (name, help, label): (&str, &str, &str),
    values: impl Iterator<Item = (&'a str, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (value, n) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::SystemTime;

    use recovea_core::FailOpenReason;
    use recovea_core::snapshot::ProviderKind;
    use recovea_counters::Counters;

    #[test]
    fn renders_every_label_with_its_count() {
        let m = Metrics::new(Arc::default(), Counters::new("node_test"), Arc::default());
        m.request(Outcome::InvalidKey);
        m.request(Outcome::InvalidKey);
        m.fail_open(FailOpenReason::RateLimiterError);
        let text = m.render();
        assert!(text.contains("recovea_requests_total{outcome=\"invalid_key\"} 2\n"), "{text}");
        assert!(text.contains("recovea_requests_total{outcome=\"forwarded\"} 0\n"), "{text}");
        assert!(text.contains("recovea_fail_open_total{reason=\"rate_limiter_error\"} 1\n"), "{text}");
        for reason in ["no_snapshot", "snapshot_error", "admission_panic"] {
            assert!(text.contains(&format!("recovea_fail_open_total{{reason=\"{reason}\"}} 0\n")), "{text}");
        }
        assert!(!text.contains("snapshot_age"), "no snapshot yet: {text}");
        for reason in ["unwritten", "refused", "silent"] {
            assert!(
                text.contains(&format!("recovea_upstream_retries_total{{reason=\"{reason}\"}} 0\n")),
                "{text}"
            );
        }
        m.snapshot_confirmed(recovea_core::Timestamp::from_system_time(SystemTime::now()));
        assert!(m.render().contains("recovea_snapshot_age_seconds "));
    }

    #[test]
    fn providers_answers_are_counted_by_kind_and_status_class() {
        let m = Metrics::new(Arc::default(), Counters::new("node_test"), Arc::default());
        m.upstream_answered(ProviderKind::Anthropic, 529);
        m.upstream_answered(ProviderKind::Anthropic, 503);
        m.upstream_answered(ProviderKind::OpenAi, 429);
        m.upstream_answered(ProviderKind::OpenAi, 200);
        // Not a status: counted nowhere.
        m.upstream_answered(ProviderKind::OpenAi, 999);
        let text = m.render();
        let lines: Vec<&str> =
            text.lines().filter(|l| l.starts_with("recovea_upstream_responses_total{")).collect();
        assert_eq!(lines.len(), ProviderKind::ALL.len() * STATUS_CLASSES.len(), "{text}");
        for line in [
            "recovea_upstream_responses_total{provider=\"anthropic\",class=\"5xx\"} 2",
            "recovea_upstream_responses_total{provider=\"openai\",class=\"4xx\"} 1",
            "recovea_upstream_responses_total{provider=\"openai\",class=\"2xx\"} 1",
            "recovea_upstream_responses_total{provider=\"gemini\",class=\"5xx\"} 0",
        ] {
            assert!(lines.contains(&line), "{line} in {text}");
        }
        let counted: u64 =
            lines.iter().map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)).sum();
        assert_eq!(counted, 4);
    }

    #[test]
    fn every_hand_over_reason_is_rendered_in_its_own_slot() {
        let m = Metrics::new(Arc::default(), Counters::new("node_test"), Arc::default());
        m.handed_over(HandOver::Expect);
        m.handed_over(HandOver::Expect);
        m.handed_over(HandOver::Unparsable);
        let text = m.render();
        for (i, reason) in HandOver::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "{reason:?}");
            let n = match reason {
                HandOver::Expect => 2,
                HandOver::Unparsable => 1,
                _ => 0,
            };
            let line = format!("recovea_http1_handed_over_total{{reason=\"{}\"}} {n}\n", reason.label());
            assert!(text.contains(&line), "{line}{text}");
        }
    }
}
