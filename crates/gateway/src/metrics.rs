//! The node's counters, kept in atomics and printed in the Prometheus text format.

mod histogram;
mod labels;
mod models;
mod render;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use recovea_core::FailOpenReason;
use recovea_core::caps::{CapRefusal, LineAnswer};
use recovea_core::channel::Unseen;
use recovea_core::money::Nanos;
use recovea_core::snapshot::ProviderKind;
use recovea_core::usage::Usage;

use recovea_counters::Counters;
use recovea_upstream::UpstreamStats;

use crate::spool::SpoolStats;
use histogram::Histogram;
pub use labels::Outcome;
use labels::{
    CAP_CODES, CAP_SCOPES, CAP_WINDOWS, LINE_ANSWERS, PROVIDERS, STATUS_CLASSES, cap_refusal_index,
    provider_index,
};
pub(crate) use labels::{FAIL_OPEN_REASONS, HandOver, reason_index};

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
}
