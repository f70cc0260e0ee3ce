//! The gateway node: an HTTP server that reads a request's Recovea key, admits it against the
//! in-memory snapshot, and streams it to the organization's provider with the managed key swapped in.
//!
//! **Invariant:** nothing here waits on a database or the control plane. The only inputs of a
//! decision are the snapshot installed in memory, the request and the clock.

mod access_log;
mod alarm;
mod body;
mod control_link;
pub mod feed;
pub mod log_writer;
mod metering;
mod metrics;
mod proxy;
mod ratelimit;
mod refusal;
mod server;
pub mod spool;
mod stall;
mod throttled;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use recovea_core::Snapshot;
use recovea_core::snapshot::ProviderKind;
use recovea_counters::Counters;

pub use control_link::ControlLink;
pub use feed::follow_feed;
pub use metrics::Outcome;
pub use server::{Server, serve};
pub use upstream::egress::Egress;
pub use upstream::{DEFAULT_HTTP2_CONNECTIONS, ProviderNetwork};

/// Arms the failpoints named in the `FAILPOINTS` environment variable, for as long as the guard
/// lives (the whole process). Only builds with the `failpoints` feature (tests) have failpoints;
/// in every other build this does nothing and nothing can trigger one.
pub fn failpoints_from_env() -> FailpointsGuard {
    FailpointsGuard {
        #[cfg(feature = "failpoints")]
        _scenario: fail::FailScenario::setup(),
    }
}

/// Keeps the failpoints of [`failpoints_from_env`] armed while it lives.
pub struct FailpointsGuard {
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}

/// The node's settings as given (flags, environment); [`GatewayConfig::new`] validates them.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub openai_base_url: String,
    pub anthropic_base_url: String,
    pub max_body_bytes: u64,
    pub upstream_timeout: Duration,
    pub connect_timeout: Duration,
    pub body_read_timeout: Duration,
    /// An armed cap whose counters were not confirmed for longer than this answers 503.
    pub counter_max_age: Duration,
}

/// A validated node configuration: only [`GatewayConfig::new`] builds one.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    openai_base_url: String,
    anthropic_base_url: String,
    max_body_bytes: u64,
    upstream_timeout: Duration,
    connect_timeout: Duration,
    body_read_timeout: Duration,
    counter_max_age: Duration,
    stream_idle_timeout: Duration,
    alarm_webhook: Option<http::Uri>,
    alarm_interval: Duration,
    network: upstream::ProviderNetwork,
    max_connections: usize,
    release_freed_memory: fn(),
    access_log: bool,
}

/// How long a fail-open reason stays quiet after its alarm, unless [`GatewayConfig::with_alarm`]
/// says otherwise.
pub const DEFAULT_ALARM_INTERVAL: Duration = Duration::from_secs(10);

/// How long an answer may go without a byte from its provider, or without its client taking a
/// byte, before it is cut, unless [`GatewayConfig::with_stream_idle_timeout`] says otherwise. As long
/// as the wait for an answer's head (`--upstream-timeout`'s default): a reasoning model may think
/// for minutes between two events of a stream, as it may before a whole answer.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl GatewayConfig {
    pub fn new(settings: GatewaySettings) -> Result<Self, ConfigError> {
        for (flag, value) in [
            ("--upstream-timeout", settings.upstream_timeout),
            ("--connect-timeout", settings.connect_timeout),
            ("--request-body-timeout", settings.body_read_timeout),
            ("--counter-max-age", settings.counter_max_age),
        ] {
            if value.is_zero() {
                return Err(ConfigError(format!("{flag} must be greater than zero")));
            }
        }
        let base_url = |flag: &str, url: &str| {
            recovea_providers::normalize_base_url(url).map_err(|why| ConfigError(format!("{flag}: {why}")))
        };
        Ok(Self {
            openai_base_url: base_url("--openai-base-url", &settings.openai_base_url)?,
            anthropic_base_url: base_url("--anthropic-base-url", &settings.anthropic_base_url)?,
            max_body_bytes: settings.max_body_bytes,
            upstream_timeout: settings.upstream_timeout,
            connect_timeout: settings.connect_timeout,
            body_read_timeout: settings.body_read_timeout,
            counter_max_age: settings.counter_max_age,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            alarm_webhook: None,
            alarm_interval: DEFAULT_ALARM_INTERVAL,
            network: upstream::ProviderNetwork::default(),
            max_connections: default_max_connections(None),
            release_freed_memory: || {},
            access_log: true,
        })
    }

    /// How the process's allocator gives back at once what the thread calling it freed: called on
    /// the feed's thread after each state it installs, since a replaced snapshot of a million keys
    /// is hundreds of MiB that an allocator may otherwise keep.
    pub fn with_memory_release(mut self, release_freed_memory: fn()) -> Self {
        self.release_freed_memory = release_freed_memory;
        self
    }

    /// Fail-open passes alarm at most once per reason per `interval`, in the log and, when
    /// `webhook` is given, by a POST to it.
    pub fn with_alarm(mut self, webhook: Option<&str>, interval: Duration) -> Result<Self, ConfigError> {
        if interval.is_zero() {
            return Err(ConfigError("--alarm-interval must be greater than zero".into()));
        }
        self.alarm_webhook = webhook
            .map(|url| {
                alarm::parse_webhook(url).map_err(|why| ConfigError(format!("--alarm-webhook: {why}")))
            })
            .transpose()?;
        self.alarm_interval = interval;
        Ok(self)
    }

    /// An answer whose provider sends nothing, or whose client reads nothing, for `limit` is cut:
    /// its receipt is written from what passed, and its cap reservation settled by it.
    pub fn with_stream_idle_timeout(mut self, limit: Duration) -> Result<Self, ConfigError> {
        if limit.is_zero() {
            return Err(ConfigError("--stream-idle-timeout must be greater than zero".into()));
        }
        self.stream_idle_timeout = limit;
        Ok(self)
    }

    /// At most `max` client connections are open at once: past it a new one is closed at once, and
    /// near it idle ones are closed first (see [`server`]).
    pub fn with_max_connections(mut self, max: usize) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError("--max-connections must be greater than zero".into()));
        }
        self.max_connections = max;
        Ok(self)
    }

    /// Whether each proxied request writes its access-log line (at `info`, target
    /// `recovea::access`); on by default. Its metrics are counted either way.
    pub fn with_access_log(mut self, on: bool) -> Self {
        self.access_log = on;
        self
    }

    /// Providers (and the alarm webhook) are reached as `network` says: its trusted certificates,
    /// its egress proxy, its bound on HTTP/2 connections.
    pub fn with_network(mut self, network: upstream::ProviderNetwork) -> Self {
        self.network = network;
        self
    }

    fn default_base_url(&self, kind: ProviderKind) -> &str {
        match kind {
            ProviderKind::OpenAi => &self.openai_base_url,
            ProviderKind::Anthropic => &self.anthropic_base_url,
        }
    }
}

/// Whether a node can decide requests, and if not, what it waits for (its `/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// No state installed yet: every request would pass fail-open.
    NoState,
    /// The counters of its armed caps were not confirmed since the state was installed.
    CountersUnconfirmed,
}

/// Descriptors a node keeps for itself beyond its connections: listeners, the spool's files, the
/// ledger, the runtimes' own, Redis, the log.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The client connections a node holds at most by default, given the process's descriptor limit
/// (`None`: unknown). Each client connection may hold a provider connection too, so each counts
/// twice against what is left after [`RESERVED_DESCRIPTORS`].
pub fn default_max_connections(descriptor_limit: Option<u64>) -> usize {
    let limit = descriptor_limit.unwrap_or(1024);
    usize::try_from((limit.saturating_sub(RESERVED_DESCRIPTORS) / 2).max(16)).unwrap_or(usize::MAX)
}

/// One gateway node's shared state: cheap to clone, shared by every connection.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

struct Shared {
    snapshot: ArcSwapOption<Snapshot>,
    config: GatewayConfig,
    upstream: upstream::Upstream,
    metrics: metrics::Metrics,
    meter: metering::Meter,
    counters: Arc<Counters>,
    limiter: ratelimit::RateLimiter,
    alarm: alarm::Alarm,
    /// Set once the node was first ready: it then stays ready.
    ready: std::sync::atomic::AtomicBool,
    /// Wakes the connections waiting for a next request when the bound on connections nears:
    /// they close, to make room (see [`server`]).
    shed_idle: tokio::sync::Notify,
}

impl Gateway {
    /// A node that meters into `spool`, its receipts signed with `node_id`, and decides caps from
    /// `counters`.
    pub fn new(config: GatewayConfig, spool: &spool::Spool, node_id: &str, counters: Arc<Counters>) -> Self {
        let upstream =
            upstream::Upstream::new(config.connect_timeout, server::connection_workers(), &config.network)
                .with_idle_limit(config.stream_idle_timeout);
        let metrics = metrics::Metrics::new(
            Arc::clone(&spool.stats),
            Arc::clone(&counters),
            Arc::clone(&upstream.stats),
        );
        let alarm =
            alarm::Alarm::new(config.alarm_webhook.clone(), config.alarm_interval, node_id, &config.network);
        let meter = metering::Meter::new(spool.sender.clone(), node_id.to_owned(), config.access_log);
        Self {
            shared: Arc::new(Shared {
                snapshot: ArcSwapOption::empty(),
                config,
                upstream,
                metrics,
                meter,
                counters,
                limiter: ratelimit::RateLimiter::default(),
                alarm,
                ready: std::sync::atomic::AtomicBool::new(false),
                shed_idle: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Makes `snapshot` the state every following request is decided from. Readers never wait.
    pub fn install_snapshot(&self, snapshot: Arc<Snapshot>) {
        // The armed caps' current windows are confirmed from the next sync on, so that the first
        // request a cap sees on this node already decides from the shared spend.
        let now = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        let armed: Vec<_> = snapshot
            .orgs()
            .flat_map(|org| org.caps.iter().filter(|cap| cap.hard_stop))
            .map(|cap| recovea_counters::Covered {
                window: proxy::cap_window(cap, now),
                line: Some(cap.limit),
            })
            .collect();
        self.shared.counters.track(&armed);
        self.shared.snapshot.store(Some(snapshot));
        self.snapshot_current();
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
