//! The node's counters, kept in atomics and printed in the Prometheus text format.

mod histogram;
mod models;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use recovea_core::FailOpenReason;
use recovea_core::caps::{CapRefusal, LineAnswer, Scope};
use recovea_core::channel::Unseen;
use recovea_core::money::Nanos;
use recovea_core::snapshot::ProviderKind;
use recovea_core::usage::Usage;
use recovea_core::window::Window;

use recovea_counters::Counters;
use recovea_upstream::UpstreamStats;

use crate::spool::SpoolStats;
use histogram::Histogram;

/// What a finished request's line and metrics say of it.
pub(crate) struct Finished<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) org_id: Option<&'a str>,
    pub(crate) key_id: Option<&'a str>,
    /// The credential name the path routes to (`openai`, `anthropic`, or a named route's).
    pub(crate) route: Option<&'a str>,
    /// The kind of provider the request went to (or would have).
    pub(crate) provider: Option<ProviderKind>,
    pub(crate) model: Option<&'a str>,
    pub(crate) status: u16,
    pub(crate) outcome: Outcome,
    /// Why a pass failed open (its reason's label).
    pub(crate) fail_open: Option<&'static str>,
    /// Which armed cap refused it.
    pub(crate) cap: Option<CapRefusal>,
    pub(crate) metered: Option<MeteredFacts<'a>>,
    /// From the request sent to the provider's answer's head.
    pub(crate) ttfb: Option<Duration>,
    /// From the request's head received to its answer's end.
    pub(crate) total: Duration,
}

/// What the receipt of a metered request settled.
pub(crate) struct MeteredFacts<'a> {
    pub(crate) usage: &'a Usage,
    pub(crate) cost: Nanos,
    /// The price table's entry the model was priced as; `None`: the fallback price.
    pub(crate) priced_as: Option<&'a str>,
    pub(crate) usage_estimated: bool,
}

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
    /// No room in the node's memory for request bodies (`--body-memory`) in time.
    BodyMemoryBusy,
    UnknownRoute,
    UpstreamUnreachable,
    UpstreamTimeout,
    BudgetExceeded,
    BudgetUnverifiable,
    /// Billed where the gateway cannot see it, while an armed cap covers the key.
    BudgetUnmeterable,
    RateLimited,
    /// An HTTP/1 head without exactly one valid `Host`, or whose body's length cannot be told; a
    /// body that names a member twice where the gateway reads, or starts with a byte-order mark.
    InvalidRequest,
    /// An HTTP/1 body in a transfer coding other than `chunked`.
    UnsupportedTransferCoding,
    /// The key's or its organization's model allowlist does not list the model.
    ModelNotAllowed,
    /// The key's or its organization's endpoint allowlist does not list the endpoint.
    EndpointNotAllowed,
    /// The key or its organization has its most requests in flight on this node.
    ConcurrencyLimited,
    /// `x-recovea-tags` breaks the tag rules.
    InvalidTags,
    /// Admitted and sent, but its client went away before the provider's answer came (its
    /// receipt says status 499).
    ClientClosed,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 21] = [
        Self::RateLimited,
        Self::BudgetExceeded,
        Self::BudgetUnverifiable,
        Self::BudgetUnmeterable,
        Self::Forwarded,
        Self::FailOpen,
        Self::InvalidKey,
        Self::ProviderNotConfigured,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::BodyMemoryBusy,
        Self::UnknownRoute,
        Self::UpstreamUnreachable,
        Self::UpstreamTimeout,
        Self::InvalidRequest,
        Self::UnsupportedTransferCoding,
        Self::ModelNotAllowed,
        Self::EndpointNotAllowed,
        Self::ConcurrencyLimited,
        Self::InvalidTags,
        Self::ClientClosed,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::FailOpen => "fail_open",
            Self::InvalidKey => "invalid_key",
            Self::ProviderNotConfigured => "provider_not_configured",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::BodyMemoryBusy => "body_memory_busy",
            Self::UnknownRoute => "unknown_route",
            Self::UpstreamUnreachable => "upstream_unreachable",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::BudgetExceeded => "budget_exceeded",
            Self::BudgetUnverifiable => "budget_unverifiable",
            Self::BudgetUnmeterable => "budget_unmeterable",
            Self::RateLimited => "rate_limited",
            Self::InvalidRequest => "invalid_request",
            Self::UnsupportedTransferCoding => "unsupported_transfer_coding",
            Self::ModelNotAllowed => "model_not_allowed",
            Self::EndpointNotAllowed => "endpoint_not_allowed",
            Self::ConcurrencyLimited => "concurrency_limited",
            Self::InvalidTags => "invalid_tags",
            Self::ClientClosed => "client_closed",
        }
    }
}

/// Why a client connection went to hyper's server, from the request that asked for what the
/// gateway's own HTTP/1.1 does not serve; each is a label of `recovea_http1_handed_over_total`.
/// Each of `recovea_http1::classify`'s reasons, and one of time that only the connection sees
/// (`TrailingBody`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The body did not follow its head within a moment.
    TrailingBody,
    ChunkedBody,
    /// A declared length over `--max-body-size`: the proxy refuses it unread.
    BodyTooLarge,
    /// A declared length over what the gateway reads before admission: the proxy reads it in
    /// room from the node's body budget.
    LargeBody,
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
    pub(crate) const ALL: [HandOver; 12] = [
        Self::TrailingBody,
        Self::ChunkedBody,
        Self::BodyTooLarge,
        Self::LargeBody,
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
            Self::LargeBody => "large_body",
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

// Exhaustive, so that a reason the codec adds cannot be counted under another's label.
impl From<recovea_http1::HandOver> for HandOver {
    fn from(reason: recovea_http1::HandOver) -> Self {
        use recovea_http1::HandOver as Codec;
        match reason {
            Codec::ChunkedBody => Self::ChunkedBody,
            Codec::BodyTooLarge => Self::BodyTooLarge,
            Codec::LargeBody => Self::LargeBody,
            Codec::Expect => Self::Expect,
            Codec::Upgrade => Self::Upgrade,
            Codec::Http10 => Self::Http10,
            Codec::HeadOrConnect => Self::HeadOrConnect,
            Codec::Http2 => Self::Http2,
            Codec::HeadTooLong => Self::HeadTooLong,
            Codec::TooManyLines => Self::TooManyLines,
            Codec::Unparsable => Self::Unparsable,
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
/// after which the request's spend could not be confirmed (`503`, unless spend made reached the
/// limit): contended to the end, a window still unseeded to the end, no answer in time.
const LINE_ANSWERS: [&str; 5] = ["reserved", "at_line", "contended", "unseeded", "unanswered"];

/// The `provider` label of the latency histograms: the kind of provider a request went to (or
/// would have), `none` when it was refused before one was known.
const PROVIDERS: [&str; ProviderKind::ALL.len() + 1] =
    ["openai", "anthropic", "azure_openai", "gemini", "none"];

/// The labels of `recovea_upstream_responses_total`'s `class`: a status's hundreds.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

fn provider_index(kind: Option<ProviderKind>) -> usize {
    kind.map_or(ProviderKind::ALL.len(), ProviderKind::index)
}

/// The labels of `recovea_cap_refusals_total`, by [`cap_refusal_index`].
const CAP_CODES: [&str; 3] = ["budget_exceeded", "budget_unverifiable", "budget_unmeterable"];
const CAP_SCOPES: [Scope; 2] = [Scope::Organization, Scope::Key];
const CAP_WINDOWS: [Window; 3] = [Window::Day, Window::Week, Window::Month];

/// A refusal's slot: code, scope, window.
fn cap_refusal_index(refusal: &CapRefusal) -> (usize, usize, usize) {
    let (code, scope, window) = match refusal {
        CapRefusal::Exceeded { scope, window } | CapRefusal::BatchExceeds { scope, window, .. } => {
            (0, *scope, *window)
        }
        CapRefusal::Unverifiable { scope, window } => (1, *scope, *window),
        CapRefusal::Unmeterable { scope, window, .. } => (2, *scope, *window),
    };
    let scope = match scope {
        Scope::Organization => 0,
        Scope::Key => 1,
    };
    let window = match window {
        Window::Day => 0,
        Window::Week => 1,
        Window::Month => 2,
    };
    (code, scope, window)
}

/// A histogram per provider label and outcome.
type ByProviderOutcome = [[Histogram; Outcome::ALL.len()]; PROVIDERS.len()];

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
    /// Requests forwarded while billed where the gateway cannot see them, by endpoint
    /// (`Unseen::LABELS`).
    unmetered: [AtomicU64; Unseen::LABELS.len()],
    /// Realtime sessions open now, and those an armed cap cut.
    realtime_sessions: AtomicU64,
    realtime_cuts: AtomicU64,
    /// Requests that asked the shared counter store at an armed cap's line, by its answer
    /// (see [`LINE_ANSWERS`]).
    line_asks: [AtomicU64; LINE_ANSWERS.len()],
    handed_over: [AtomicU64; HandOver::ALL.len()],
    /// Requests decided after asking the shared store at an armed cap's line: admitted, refused.
    line_decisions: [AtomicU64; 2],
    /// Armed caps' refusals by code, scope and window.
    cap_refusals: [[[AtomicU64; CAP_WINDOWS.len()]; CAP_SCOPES.len()]; CAP_CODES.len()],
    /// From a request's head received to its answer's end.
    latency: Box<ByProviderOutcome>,
    /// From a request sent to the provider to the provider's answer's head.
    upstream_ttfb: Box<ByProviderOutcome>,
    /// Providers' answers by provider kind and status class: the outcome `forwarded` is any answer.
    upstream_status: [[AtomicU64; STATUS_CLASSES.len()]; ProviderKind::ALL.len()],
    by_model: models::ByModel,
    /// The version of the state served (0: none yet).
    feed_version: AtomicU64,
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
            unmetered: Default::default(),
            realtime_sessions: AtomicU64::new(0),
            realtime_cuts: AtomicU64::new(0),
            line_asks: Default::default(),
            connections: ConnectionStats::default(),
            handed_over: Default::default(),
            line_decisions: Default::default(),
            cap_refusals: Default::default(),
            latency: Box::default(),
            upstream_ttfb: Box::default(),
            upstream_status: Default::default(),
            by_model: models::ByModel::default(),
            feed_version: AtomicU64::new(0),
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

    pub(crate) fn realtime_opened(&self) {
        self.realtime_sessions.fetch_add(1, Relaxed);
    }

    pub(crate) fn realtime_closed(&self) {
        self.realtime_sessions.fetch_sub(1, Relaxed);
    }

    pub(crate) fn realtime_cut(&self) {
        self.realtime_cuts.fetch_add(1, Relaxed);
    }

    /// A request billed where the gateway cannot see it was forwarded (no armed cap covered it).
    pub(crate) fn unmetered(&self, endpoint: Unseen) {
        self.unmetered[endpoint.index()].fetch_add(1, Relaxed);
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

    /// A request that asked the shared store at an armed cap's line was decided.
    pub(crate) fn line_decided(&self, admitted: bool) {
        self.line_decisions[usize::from(!admitted)].fetch_add(1, Relaxed);
    }

    /// The node serves the state of this feed version.
    pub(crate) fn feed_version(&self, version: u64) {
        self.feed_version.store(version, Relaxed);
    }

    /// A request's outcome is final: its latency, time to first byte, tokens and cost, and the
    /// cap that refused it, are counted.
    pub(crate) fn finished(&self, request: &Finished<'_>) {
        let (provider, outcome) = (provider_index(request.provider), request.outcome as usize);
        self.latency[provider][outcome].observe(request.total);
        if let Some(ttfb) = request.ttfb {
            self.upstream_ttfb[provider][outcome].observe(ttfb);
        }
        if let (Some(metered), Some(kind)) = (&request.metered, request.provider) {
            let cost = u64::try_from(metered.cost.0).unwrap_or(0);
            self.by_model.add(kind, metered.priced_as, metered.usage, cost);
        }
        if let Some(refusal) = &request.cap {
            let (code, scope, window) = cap_refusal_index(refusal);
            self.cap_refusals[code][scope][window].fetch_add(1, Relaxed);
        }
    }

    /// A provider of `kind` answered with `status` (its head; the body may still fail).
    pub(crate) fn upstream_answered(&self, kind: ProviderKind, status: u16) {
        if let Some(class) = usize::from(status / 100).checked_sub(1).filter(|c| *c < STATUS_CLASSES.len()) {
            self.upstream_status[kind.index()][class].fetch_add(1, Relaxed);
        }
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

    /// Receipts set aside in the spool's dead-letter file since the node started.
    pub(crate) fn receipts_dead_lettered(&self) -> u64 {
        self.spool.dead_lettered.load(Relaxed)
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

    #[test]
    fn every_reason_has_its_own_slot() {
        for (i, reason) in FAIL_OPEN_REASONS.iter().enumerate() {
            assert_eq!(reason_index(*reason), i, "{reason:?}");
        }
    }
}
