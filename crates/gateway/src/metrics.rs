//! The node's counters, kept in atomics and printed in the Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use recovea_core::FailOpenReason;
use recovea_core::caps::LineAnswer;

use recovea_counters::Counters;

use crate::spool::SpoolStats;
use crate::upstream::{Retry, UpstreamStats};

/// How a request through the proxy ended; each is a label of `recovea_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and answered by the provider (whatever its status).
    Forwarded,
    FailOpen,
    InvalidKey,
    ProviderNotConfigured,
    BodyTooLarge,
    BodyUnreadable,
    UnknownRoute,
    UpstreamUnreachable,
    UpstreamTimeout,
    BudgetExceeded,
    BudgetUnverifiable,
    RateLimited,
    /// An HTTP/1 head without exactly one valid `Host`, or whose body's length cannot be told.
    InvalidRequest,
    /// An HTTP/1 body in a transfer coding other than `chunked`.
    UnsupportedTransferCoding,
    /// The key's or its organization's model allowlist does not list the model.
    ModelNotAllowed,
    /// `x-recovea-tags` breaks the tag rules.
    InvalidTags,
}

impl Outcome {
    const ALL: [Outcome; 16] = [
        Self::RateLimited,
        Self::BudgetExceeded,
        Self::BudgetUnverifiable,
        Self::Forwarded,
        Self::FailOpen,
        Self::InvalidKey,
        Self::ProviderNotConfigured,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::UnknownRoute,
        Self::UpstreamUnreachable,
        Self::UpstreamTimeout,
        Self::InvalidRequest,
        Self::UnsupportedTransferCoding,
        Self::ModelNotAllowed,
        Self::InvalidTags,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::FailOpen => "fail_open",
            Self::InvalidKey => "invalid_key",
            Self::ProviderNotConfigured => "provider_not_configured",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::UnknownRoute => "unknown_route",
            Self::UpstreamUnreachable => "upstream_unreachable",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::BudgetExceeded => "budget_exceeded",
            Self::BudgetUnverifiable => "budget_unverifiable",
            Self::RateLimited => "rate_limited",
            Self::InvalidRequest => "invalid_request",
            Self::UnsupportedTransferCoding => "unsupported_transfer_coding",
            Self::ModelNotAllowed => "model_not_allowed",
            Self::InvalidTags => "invalid_tags",
        }
    }
}

/// Why a client connection went to hyper's server, from the request that asked for what the
/// gateway's own HTTP/1.1 does not serve; each is a label of `recovea_http1_handed_over_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The body did not follow its head within a moment.
    TrailingBody,
    ChunkedBody,
    /// A declared length over `--max-body-size`: the proxy refuses it unread.
    BodyTooLarge,
    Expect,
    Upgrade,
    Http10,
    HeadOrConnect,
    /// The HTTP/2 preface (prior knowledge).
    Http2,
    HeadTooLong,
    TooManyLines,
    /// A head that does not parse (hyper answers `400`).
    Unparsable,
}

impl HandOver {
    pub(crate) const ALL: [HandOver; 11] = [
        Self::TrailingBody,
        Self::ChunkedBody,
        Self::BodyTooLarge,
        Self::Expect,
        Self::Upgrade,
        Self::Http10,
        Self::HeadOrConnect,
        Self::Http2,
        Self::HeadTooLong,
        Self::TooManyLines,
        Self::Unparsable,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::TrailingBody => "trailing_body",
            Self::ChunkedBody => "chunked_body",
            Self::BodyTooLarge => "body_too_large",
            Self::Expect => "expect",
            Self::Upgrade => "upgrade",
            Self::Http10 => "http10",
            Self::HeadOrConnect => "head_or_connect",
            Self::Http2 => "http2",
            Self::HeadTooLong => "head_too_long",
            Self::TooManyLines => "too_many_lines",
            Self::Unparsable => "unparsable",
        }
    }
}

/// Every reason, in the order [`reason_index`] numbers them.
pub(crate) const FAIL_OPEN_REASONS: [FailOpenReason; 4] = [
    FailOpenReason::NoSnapshot,
    FailOpenReason::SnapshotError,
    FailOpenReason::RateLimiterError,
    FailOpenReason::AdmissionPanic,
];

/// A reason's slot in [`FAIL_OPEN_REASONS`]; exhaustive, so that a new reason cannot be counted
/// under another's label.
pub(crate) fn reason_index(reason: FailOpenReason) -> usize {
    match reason {
        FailOpenReason::NoSnapshot => 0,
        FailOpenReason::SnapshotError => 1,
        FailOpenReason::RateLimiterError => 2,
        FailOpenReason::AdmissionPanic => 3,
    }
}

/// The labels of `recovea_cap_line_asks_total`: admitted, refused at the line, then the answers
/// after which the request decided from its own view: contended to the end, a window still
/// unseeded to the end, no answer in time.
const LINE_ANSWERS: [&str; 5] = ["reserved", "at_line", "contended", "unseeded", "unanswered"];

/// The node's client connections: open now, refused at the bound, closed while idle to make room.
#[derive(Default)]
pub(crate) struct ConnectionStats {
    pub(crate) open: std::sync::atomic::AtomicUsize,
    pub(crate) refused: AtomicU64,
    pub(crate) shed: AtomicU64,
}

pub(crate) struct Metrics {
    pub(crate) connections: ConnectionStats,
    requests: [AtomicU64; Outcome::ALL.len()],
    fail_open: [AtomicU64; FAIL_OPEN_REASONS.len()],
    /// Unix milliseconds of the last time the serving state was known to be the latest (its
    /// install, or the control plane saying so); 0 before the first.
    snapshot_confirmed_ms: AtomicU64,
    receipts_estimated: AtomicU64,
    receipts_unpriced: AtomicU64,
    /// Requests that asked the shared counter store at an armed cap's line, by its answer
    /// (see [`LINE_ANSWERS`]).
    line_asks: [AtomicU64; LINE_ANSWERS.len()],
    handed_over: [AtomicU64; HandOver::ALL.len()],
    spool: Arc<SpoolStats>,
    counters: Arc<Counters>,
    upstream: Arc<UpstreamStats>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Metrics {
    pub(crate) fn new(spool: Arc<SpoolStats>, counters: Arc<Counters>, upstream: Arc<UpstreamStats>) -> Self {
        Self {
            requests: Default::default(),
            fail_open: Default::default(),
            snapshot_confirmed_ms: AtomicU64::new(0),
            receipts_estimated: AtomicU64::new(0),
            receipts_unpriced: AtomicU64::new(0),
            line_asks: Default::default(),
            connections: ConnectionStats::default(),
            handed_over: Default::default(),
            spool,
            counters,
            upstream,
        }
    }

    pub(crate) fn receipt_estimated(&self) {
        self.receipts_estimated.fetch_add(1, Relaxed);
    }

    pub(crate) fn receipt_unpriced(&self) {
        self.receipts_unpriced.fetch_add(1, Relaxed);
    }

    /// A request asked the shared store at an armed cap's line; `None`: no answer in time.
    pub(crate) fn line_ask(&self, answer: Option<LineAnswer>) {
        let index = match answer {
            Some(LineAnswer::Reserved) => 0,
            Some(LineAnswer::AtLine(_)) => 1,
            Some(LineAnswer::Contended) => 2,
            Some(LineAnswer::Unseeded) => 3,
            None => 4,
        };
        self.line_asks[index].fetch_add(1, Relaxed);
    }

    pub(crate) fn handed_over(&self, reason: HandOver) {
        self.handed_over[reason as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn request(&self, outcome: Outcome) {
        self.requests[outcome as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn fail_open(&self, reason: FailOpenReason) {
        self.fail_open[reason_index(reason)].fetch_add(1, Relaxed);
    }

    /// The control plane confirmed the serving state as current at `at` (a node booting from its
    /// saved state reports the age it had when saved).
    pub(crate) fn snapshot_confirmed(&self, at: recovea_core::Timestamp) {
        self.snapshot_confirmed_ms.store(u64::try_from(at.0).unwrap_or(0), Relaxed);
    }

    /// Milliseconds since the serving state was last confirmed; `None` without one.
    pub(crate) fn snapshot_age_ms(&self) -> Option<u64> {
        let confirmed = self.snapshot_confirmed_ms.load(Relaxed);
        (confirmed > 0).then(|| unix_ms().saturating_sub(confirmed))
    }

    pub(crate) fn fail_open_total(&self) -> u64 {
        self.fail_open.iter().map(|n| n.load(Relaxed)).sum()
    }

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
                "recovea_cap_line_asks_total",
                "Requests near an armed cap's line that asked the shared counter store, by its answer.",
                "answer",
            ),
            LINE_ANSWERS.iter().zip(&self.line_asks).map(|(a, n)| (*a, load(n))),
        );
        labelled(
            &mut out,
            (
                "recovea_upstream_connections_opened_total",
                "Connections opened to providers, by protocol.",
                "protocol",
            ),
            ["http1", "http2"].into_iter().zip(&self.upstream.opened).map(|(p, n)| (p, load(n))),
        );
        labelled(
            &mut out,
            (
                "recovea_upstream_retries_total",
                "Requests sent again on a new connection, by why it was safe.",
                "reason",
            ),
            Retry::ALL.iter().map(|r| (r.label(), load(&self.upstream.retries[*r as usize]))),
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
                "recovea_spool_corrupt_lines_total",
                "Spool lines that could not be read back.",
                self.spool.corrupt.load(Relaxed),
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

    #[test]
    fn every_reason_has_its_own_slot() {
        for (i, reason) in FAIL_OPEN_REASONS.iter().enumerate() {
            assert_eq!(reason_index(*reason), i, "{reason:?}");
        }
    }
}
