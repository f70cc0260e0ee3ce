//! One gateway node's state, shared by every connection: the snapshot decisions are read from,
//! the configuration, and the parts each phase of a request uses (provider pool, meter, counters,
//! rate limiter, alarm, metrics).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use recovea_core::Snapshot;
use recovea_core::Timestamp;
use recovea_core::caps::Cap;
use recovea_counters::{CapWindow, Counters, RateShare};
use recovea_upstream::Upstream;

use crate::config::GatewayConfig;
use crate::{alarm, body_budget, jobs, metering, metrics, ratelimit, spool, trace};

/// Whether a node can decide requests, and if not, what it waits for (its `/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// No state installed yet: every request would pass fail-open.
    NoState,
    /// The counters of its armed caps were not confirmed since the state was installed.
    CountersUnconfirmed,
}

/// One gateway node's shared state: cheap to clone, shared by every connection.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) snapshot: ArcSwapOption<Snapshot>,
    pub(crate) config: GatewayConfig,
    pub(crate) upstream: Upstream,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) meter: metering::Meter,
    pub(crate) counters: Arc<Counters>,
    pub(crate) limiter: ratelimit::RateLimiter,
    /// The memory request bodies are read into (`--body-memory`).
    pub(crate) body_budget: body_budget::BodyBudget,
    pub(crate) alarm: alarm::Alarm,
    /// Set once the node was first ready: it then stays ready.
    pub(crate) ready: std::sync::atomic::AtomicBool,
    /// Wakes the connections waiting for a next request when the bound on connections nears:
    /// they close, to make room (see [`crate::server`]).
    pub(crate) shed_idle: tokio::sync::Notify,
    /// Where requests' spans go; `None` when traces are off.
    pub(crate) tracer: Option<Arc<trace::Tracer>>,
    /// The book of deferred jobs, and the jobs and batch files the book does not have yet.
    pub(crate) jobs: Arc<jobs::NodeJobs>,
    /// Each Realtime session holds a receiver: `true` asks it to close, as the node stops; the
    /// sender's `closed` says when all have (see [`crate::realtime`]).
    pub(crate) sessions: tokio::sync::watch::Sender<bool>,
    /// Requests in flight by key and organization, for `max_concurrent_requests`.
    pub(crate) in_flight: Arc<crate::inflight::InFlight>,
}

impl Shared {
    /// Now, on the shared counter store's clock (this node's own without one): which window of a
    /// cap a request falls in is decided on one clock that every node agrees on.
    pub(crate) fn now(&self) -> recovea_core::Timestamp {
        let system = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        self.counters.on_store_clock(system)
    }
}

impl Gateway {
    /// A node that meters into `spool`, its receipts signed with `node_id`, and decides caps from
    /// `counters`.
    pub fn new(config: GatewayConfig, spool: &spool::Spool, node_id: &str, counters: Arc<Counters>) -> Self {
        let upstream = Upstream::new(config.connect_timeout, connection_workers(), &config.network)
            .with_idle_limit(config.stream_idle_timeout);
        let metrics = metrics::Metrics::new(
            Arc::clone(&spool.stats),
            Arc::clone(&counters),
            Arc::clone(upstream.stats()),
        );
        let alarm =
            alarm::Alarm::new(config.alarm_webhook.clone(), config.alarm_interval, node_id, &config.network);
        let jobs = Arc::new(jobs::NodeJobs::default());
        let meter = metering::Meter::new(
            spool.sender.clone(),
            node_id.to_owned(),
            config.access_log,
            Arc::clone(&jobs),
        );
        let tracer = config.traces.clone().map(|settings| Arc::new(trace::Tracer::new(settings)));
        Self {
            shared: Arc::new(Shared {
                snapshot: ArcSwapOption::empty(),
                body_budget: body_budget::BodyBudget::new(config.body_memory),
                config,
                upstream,
                metrics,
                meter,
                counters,
                limiter: ratelimit::RateLimiter::default(),
                alarm,
                ready: std::sync::atomic::AtomicBool::new(false),
                shed_idle: tokio::sync::Notify::new(),
                sessions: tokio::sync::watch::Sender::new(false),
                in_flight: Arc::default(),
                tracer,
                jobs,
            }),
        }
    }

    /// Makes `snapshot` the state every following request is decided from. Readers never wait.
    pub fn install_snapshot(&self, snapshot: Arc<Snapshot>) {
        // The armed caps' current windows are confirmed from the next sync on, so that the first
        // request a cap sees on this node already decides from the shared spend.
        let now = self.shared.now();
        let armed: Vec<_> = snapshot
            .orgs()
            .flat_map(|org| org.caps.iter().filter(|cap| cap.hard_stop))
            .map(|cap| recovea_counters::Covered { window: cap_window(cap, now), line: Some(cap.limit) })
            .collect();
        self.shared.counters.track(&armed);
        self.shared.jobs.count(Some(snapshot.as_ref()), &self.shared.counters);
        self.shared.snapshot.store(Some(snapshot));
        self.snapshot_current();
    }

    /// Makes `book` the control plane's book of deferred jobs this node counts: its holds and
    /// settled spend on every armed line, and the batch files it names.
    pub fn install_book(&self, book: recovea_core::jobs::JobBook) {
        let snapshot = self.shared.snapshot.load();
        self.shared.jobs.install(book, snapshot.as_deref(), &self.shared.counters);
    }

    /// The book of deferred jobs installed last.
    pub fn book(&self) -> Arc<recovea_core::jobs::JobBook> {
        self.shared.jobs.book()
    }

    /// The state served was just confirmed as the latest (its age starts again from zero).
    pub fn snapshot_current(&self) {
        let now = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        self.shared.metrics.snapshot_confirmed(now);
    }

    /// Whether the node can decide every request: its state is installed and, once, the counters
    /// of its armed caps were confirmed after it (so that no request finds them unconfirmed and
    /// answers 503). Once ready, it stays so: a counter store lost later is the caps' answer
    /// (fail closed for armed caps, as the product page says), not a reason to turn traffic away.
    pub fn is_ready(&self) -> bool {
        self.readiness() == Readiness::Ready
    }

    /// What the node still waits for before it is ready.
    pub fn readiness(&self) -> Readiness {
        if self.shared.ready.load(std::sync::atomic::Ordering::Acquire) {
            return Readiness::Ready;
        }
        if self.shared.snapshot.load().is_none() {
            return Readiness::NoState;
        }
        if !self.shared.counters.tracked_confirmed() {
            return Readiness::CountersUnconfirmed;
        }
        self.shared.ready.store(true, std::sync::atomic::Ordering::Release);
        Readiness::Ready
    }
}

impl Gateway {
    /// Shares this node's per-key rate limits with the other nodes of `share` until `shutdown`:
    /// every `interval` (about 250 ms), and early when a key is met, it pushes what this node
    /// admitted and charged per key and charges into its lanes what the others did meanwhile.
    /// Requests never wait on it; when the store fails, the node keeps enforcing the limits
    /// alone. Run one per gateway; the future owns what it needs, so it can be spawned as is.
    pub fn share_rate_limits<S>(
        &self,
        share: Arc<dyn RateShare>,
        interval: Duration,
        shutdown: S,
    ) -> impl Future<Output = ()> + Send + use<S>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        async move { shared.limiter.share(share.as_ref(), interval, shutdown).await }
    }

    /// Exports the requests' spans to the OTLP endpoint until `shutdown`, then what is queued.
    /// `None` when traces are off (or already exported). Requests never wait on it.
    pub fn export_traces<S>(&self, shutdown: S) -> Option<impl Future<Output = ()> + Send + use<S>>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        let tracer = Arc::clone(self.shared.tracer.as_ref()?);
        tracer.export(self.shared.config.network.clone(), shutdown)
    }

    /// How many syncs of the shared rate limits the store answered since start (for health checks
    /// and tests).
    pub fn rate_limit_syncs(&self) -> u64 {
        self.shared.limiter.syncs.load(Ordering::Relaxed)
    }
}

/// How many threads serve connections: one per core the process may run on.
pub(crate) fn connection_workers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The window of `cap` that `at` falls in: where a request started then counts its spend.
pub(crate) fn cap_window(cap: &Cap, at: Timestamp) -> CapWindow {
    CapWindow {
        org: cap.org_id.clone(),
        cap: cap.id.clone(),
        start: cap.window.start(at),
        end: cap.window.end(at),
    }
}
