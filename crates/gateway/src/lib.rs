//! The gateway node: an HTTP server that reads a request's Recovea key, admits it against the
//! in-memory snapshot, and streams it to the organization's provider with the managed key swapped in.
//!
//! **Invariant:** nothing here waits on a database or the control plane. The only inputs of a
//! decision are the snapshot installed in memory, the request and the clock.

mod metrics;
mod proxy;
mod server;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use recovea_core::Snapshot;
use recovea_core::snapshot::ProviderKind;

pub use metrics::Outcome;
pub use server::serve;

/// A validated node configuration: only [`GatewayConfig::new`] builds one.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    openai_base_url: String,
    anthropic_base_url: String,
    max_body_bytes: u64,
    upstream_timeout: Duration,
    connect_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl GatewayConfig {
    pub fn new(
        openai_base_url: &str,
        anthropic_base_url: &str,
        max_body_bytes: u64,
        upstream_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        if upstream_timeout.is_zero() {
            return Err(ConfigError("--upstream-timeout must be greater than zero".into()));
        }
        if connect_timeout.is_zero() {
            return Err(ConfigError("--connect-timeout must be greater than zero".into()));
        }
        Ok(Self {
            openai_base_url: recovea_providers::normalize_base_url(openai_base_url)
                .map_err(|why| ConfigError(format!("--openai-base-url: {why}")))?,
            anthropic_base_url: recovea_providers::normalize_base_url(anthropic_base_url)
                .map_err(|why| ConfigError(format!("--anthropic-base-url: {why}")))?,
            max_body_bytes,
            upstream_timeout,
            connect_timeout,
        })
    }

    fn default_base_url(&self, kind: ProviderKind) -> &str {
        match kind {
            ProviderKind::OpenAi => &self.openai_base_url,
            ProviderKind::Anthropic => &self.anthropic_base_url,
        }
    }
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
}

impl Gateway {
    pub fn new(config: GatewayConfig) -> Self {
        let upstream = upstream::Upstream::new(config.connect_timeout);
        Self {
            shared: Arc::new(Shared {
                snapshot: ArcSwapOption::empty(),
                config,
                upstream,
                metrics: metrics::Metrics::default(),
            }),
        }
    }

    /// Makes `snapshot` the state every following request is decided from. Readers never wait.
    pub fn install_snapshot(&self, snapshot: Arc<Snapshot>) {
        self.shared.snapshot.store(Some(snapshot));
        self.shared.metrics.snapshot_installed();
    }

    /// Whether the node has state to decide from.
    pub fn is_ready(&self) -> bool {
        self.shared.snapshot.load().is_some()
    }
}
