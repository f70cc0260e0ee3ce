//! The node's configuration: the settings as given (flags, environment), validated once into a
//! [`GatewayConfig`] that cannot be built any other way.

use std::time::Duration;

pub use recovea_core::ConfigError;
use recovea_core::config_error::Problems;
use recovea_core::snapshot::ProviderKind;
use recovea_upstream::ProviderNetwork;

use crate::alarm::parse_webhook;

/// The node's settings as given (flags, environment); [`GatewayConfig::new`] validates them all
/// at once. What is not a setting to check (how providers are reached, already validated as a
/// [`ProviderNetwork`]; the allocator's release; the log's and `/metrics`' switches) is given by
/// the `with_*` calls.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub openai_base_url: String,
    pub anthropic_base_url: String,
    /// Where credentials of kind `gemini` without a base URL of their own are sent
    /// ([`DEFAULT_GEMINI_BASE_URL`] by default).
    pub gemini_base_url: String,
    pub max_body_bytes: u64,
    /// The memory every request body being read may take at once: past it a body waits, unread,
    /// for room. One organization may hold half of it, so it must hold two of the largest bodies.
    /// `None`: [`DEFAULT_BODY_MEMORY`], or twice the largest body when that is more.
    pub body_memory: Option<u64>,
    pub upstream_timeout: Duration,
    pub connect_timeout: Duration,
    pub body_read_timeout: Duration,
    /// An armed cap whose counters were not confirmed for longer than this answers 503.
    pub counter_max_age: Duration,
    /// An answer whose provider sends nothing, or whose client reads nothing, for this long is
    /// cut: its receipt is written from what passed, and its cap reservation settled by it.
    pub stream_idle_timeout: Duration,
    /// At most this many client connections are open at once: past it a new one is closed at once,
    /// and near it idle ones are closed first (see [`crate::server`]).
    pub max_connections: usize,
    /// Fail-open passes alarm at most once per reason per `alarm_interval`, in the log and, when
    /// `alarm_webhook` is given, by a POST to it.
    pub alarm_webhook: Option<String>,
    pub alarm_interval: Duration,
    /// `/metrics` answers only a scrape that presents `Authorization: Bearer <token>`.
    pub metrics_token: Option<String>,
    /// Where traces go; `None`: traces are off.
    pub traces: Option<TraceTarget>,
}

/// A span per request, with a child per phase, exported to the OTLP/HTTP collector at `endpoint`
/// (`http://collector:4318`, or the full URL of its traces endpoint), under `service_name`
/// ([`crate::DEFAULT_SERVICE_NAME`] by default).
#[derive(Debug, Clone)]
pub struct TraceTarget {
    pub endpoint: String,
    pub service_name: Option<String>,
}

/// A validated node configuration: only [`GatewayConfig::new`] builds one.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub(crate) openai_base_url: String,
    pub(crate) anthropic_base_url: String,
    pub(crate) gemini_base_url: String,
    pub(crate) max_body_bytes: u64,
    /// The memory every request body being read may take at once (see [`crate::body_budget`]).
    pub(crate) body_memory: u64,
    pub(crate) upstream_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) body_read_timeout: Duration,
    pub(crate) counter_max_age: Duration,
    pub(crate) stream_idle_timeout: Duration,
    pub(crate) alarm_webhook: Option<http::Uri>,
    pub(crate) alarm_interval: Duration,
    pub(crate) network: ProviderNetwork,
    pub(crate) max_connections: usize,
    pub(crate) release_freed_memory: fn(),
    pub(crate) access_log: bool,
    /// Where traces go; `None`: traces are off.
    pub(crate) traces: Option<crate::trace::TraceSettings>,
    /// The hash of the bearer `/metrics` asks for; `None`: it asks for none.
    pub(crate) metrics_token_hash: Option<recovea_core::keys::KeyHash>,
    /// `/metrics` is served on a listener of its own (`Gateway::serve_metrics`), not the gateway's.
    pub(crate) metrics_elsewhere: bool,
}

/// Where credentials of kind `gemini` without a base URL go, unless
/// [`GatewaySettings::gemini_base_url`] says otherwise.
pub const DEFAULT_GEMINI_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// The memory request bodies may take at once, unless [`GatewaySettings::body_memory`] says
/// otherwise (or twice the largest body allowed, when that is more).
pub const DEFAULT_BODY_MEMORY: u64 = 256 << 20;

/// How long a fail-open reason stays quiet after its alarm, unless
/// [`GatewaySettings::alarm_interval`] says otherwise.
pub const DEFAULT_ALARM_INTERVAL: Duration = Duration::from_secs(10);

impl GatewayConfig {
    /// The configuration of `settings`, or every setting that is wrong.
    pub fn new(settings: GatewaySettings) -> Result<Self, Vec<ConfigError>> {
        let mut problems = Problems::default();
        let zero = [
            ("upstream-timeout", settings.upstream_timeout),
            ("connect-timeout", settings.connect_timeout),
            ("request-body-timeout", settings.body_read_timeout),
            ("counter-max-age", settings.counter_max_age),
            ("stream-idle-timeout", settings.stream_idle_timeout),
            ("alarm-interval", settings.alarm_interval),
        ]
        .into_iter()
        .filter(|(_, value)| value.is_zero())
        .map(|(flag, _)| ConfigError::zero(flag));
        zero.for_each(|problem| problems.push(problem));
        if settings.max_connections == 0 {
            problems.push(ConfigError::zero("max-connections"));
        }
        let openai_base_url = problems.check(base_url("openai-base-url", &settings.openai_base_url));
        let anthropic_base_url = problems.check(base_url("anthropic-base-url", &settings.anthropic_base_url));
        let gemini_base_url = problems.check(base_url("gemini-base-url", &settings.gemini_base_url));
        let alarm_webhook = settings
            .alarm_webhook
            .as_deref()
            .map(|url| parse_webhook(url).map_err(|why| ConfigError::flag("alarm-webhook", why)));
        let alarm_webhook = problems.check(alarm_webhook.transpose());
        let metrics_token_hash = settings.metrics_token.as_deref().map(|token| {
            let token = recovea_core::keys::operator_token(token)
                .map_err(|why| ConfigError::flag("metrics-token", why));
            token.map(recovea_core::keys::hash_secret)
        });
        let metrics_token_hash = problems.check(metrics_token_hash.transpose());
        let traces = settings
            .traces
            .as_ref()
            .map(|target| crate::trace::TraceSettings::new(&target.endpoint, target.service_name.as_deref()));
        let traces = problems.check(traces.transpose());
        let body_memory = problems.check(body_memory(settings.body_memory, settings.max_body_bytes));
        let (
            Some(openai_base_url),
            Some(anthropic_base_url),
            Some(gemini_base_url),
            Some(alarm_webhook),
            Some(metrics_token_hash),
            Some(traces),
            Some(body_memory),
            true,
        ) = (
            openai_base_url,
            anthropic_base_url,
            gemini_base_url,
            alarm_webhook,
            metrics_token_hash,
            traces,
            body_memory,
            problems.is_empty(),
        )
        else {
            return Err(problems.into());
        };
        Ok(Self {
            openai_base_url,
            anthropic_base_url,
            gemini_base_url,
            max_body_bytes: settings.max_body_bytes,
            body_memory,
            upstream_timeout: settings.upstream_timeout,
            connect_timeout: settings.connect_timeout,
            body_read_timeout: settings.body_read_timeout,
            counter_max_age: settings.counter_max_age,
            stream_idle_timeout: settings.stream_idle_timeout,
            alarm_webhook,
            alarm_interval: settings.alarm_interval,
            network: ProviderNetwork::default(),
            max_connections: settings.max_connections,
            release_freed_memory: || {},
            access_log: true,
            traces,
            metrics_token_hash,
            metrics_elsewhere: false,
        })
    }

    /// How the process's allocator gives back at once what the thread calling it freed: called on
    /// the feed's thread after each state it installs, since a replaced snapshot of a million keys
    /// is hundreds of MiB that an allocator may otherwise keep.
    pub fn with_memory_release(mut self, release_freed_memory: fn()) -> Self {
        self.release_freed_memory = release_freed_memory;
        self
    }

    /// Whether each proxied request writes its access-log line (at `info`, target
    /// `recovea::access`); on by default. Its metrics are counted either way.
    pub fn with_access_log(mut self, on: bool) -> Self {
        self.access_log = on;
        self
    }

    /// `/metrics` is served on a listener of its own (`--metrics-listen`): the gateway's port does
    /// not answer it.
    pub fn with_metrics_elsewhere(mut self, elsewhere: bool) -> Self {
        self.metrics_elsewhere = elsewhere;
        self
    }

    /// Providers (and the alarm webhook) are reached as `network` says: its trusted certificates,
    /// its egress proxy, its bound on HTTP/2 connections.
    pub fn with_network(mut self, network: ProviderNetwork) -> Self {
        self.network = network;
        self
    }

    /// How providers are reached: the control plane's job poller in the same process reaches them
    /// as the node does.
    pub fn network(&self) -> &ProviderNetwork {
        &self.network
    }

    /// The node's base URL for a kind; `None` for Azure OpenAI, whose endpoint is each resource's
    /// own (a credential of that kind always has one).
    pub(crate) fn default_base_url(&self, kind: ProviderKind) -> Option<&str> {
        match kind {
            ProviderKind::OpenAi => Some(&self.openai_base_url),
            ProviderKind::Anthropic => Some(&self.anthropic_base_url),
            ProviderKind::Gemini => Some(&self.gemini_base_url),
            ProviderKind::AzureOpenAi => None,
        }
    }
}

/// The memory bodies may take at once: `given`, which must hold two of the largest bodies, or by
/// default [`DEFAULT_BODY_MEMORY`] or two of the largest bodies, whichever is more.
fn body_memory(given: Option<u64>, max_body_bytes: u64) -> Result<u64, ConfigError> {
    match given {
        None => Ok(DEFAULT_BODY_MEMORY.max(2 * max_body_bytes)),
        Some(bytes) if bytes >= 2 * max_body_bytes => Ok(bytes),
        Some(_) => Err(ConfigError::flag(
            "body-memory",
            "must be at least twice --max-body-size (one organization may hold half of it)",
        )),
    }
}

/// A provider's base URL as `flag` gives it, normalized.
fn base_url(flag: &'static str, url: &str) -> Result<String, ConfigError> {
    recovea_providers::normalize_base_url(url).map_err(|why| ConfigError::flag(flag, why))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> GatewaySettings {
        GatewaySettings {
            openai_base_url: "https://api.openai.com".into(),
            anthropic_base_url: "https://api.anthropic.com".into(),
            gemini_base_url: DEFAULT_GEMINI_BASE_URL.into(),
            max_body_bytes: 1 << 20,
            body_memory: None,
            upstream_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            body_read_timeout: Duration::from_secs(1),
            counter_max_age: Duration::from_secs(1),
            stream_idle_timeout: Duration::from_secs(1),
            max_connections: 16,
            alarm_webhook: None,
            alarm_interval: Duration::from_secs(1),
            metrics_token: None,
            traces: None,
        }
    }

    #[test]
    fn every_wrong_setting_is_named_at_once() {
        let wrong = GatewayConfig::new(GatewaySettings {
            anthropic_base_url: "nowhere".into(),
            gemini_base_url: "ftp://x".into(),
            body_memory: Some(1 << 20),
            connect_timeout: Duration::ZERO,
            stream_idle_timeout: Duration::ZERO,
            max_connections: 0,
            alarm_webhook: Some("hooks.example.com".into()),
            metrics_token: Some("short".into()),
            traces: Some(TraceTarget { endpoint: "collector".into(), service_name: Some(" ".into()) }),
            ..settings()
        })
        .expect_err("all wrong");
        let mut flags: Vec<_> = wrong.iter().filter_map(|e| e.flag).collect();
        flags.sort_unstable();
        assert_eq!(
            flags,
            [
                "alarm-webhook",
                "anthropic-base-url",
                "body-memory",
                "connect-timeout",
                "gemini-base-url",
                "max-connections",
                "metrics-token",
                "otlp-endpoint",
                "stream-idle-timeout",
            ]
        );
    }

    #[test]
    fn body_memory_holds_two_of_the_largest_bodies() {
        let large = GatewaySettings { max_body_bytes: 200 << 20, ..settings() };
        let config = GatewayConfig::new(large.clone()).expect("valid");
        assert_eq!(config.body_memory, 400 << 20, "by default, two of the largest bodies when more");
        assert_eq!(GatewayConfig::new(settings()).expect("valid").body_memory, DEFAULT_BODY_MEMORY);
        let given = GatewayConfig::new(GatewaySettings { body_memory: Some(400 << 20), ..large.clone() });
        assert_eq!(given.expect("valid").body_memory, 400 << 20);
        assert!(GatewayConfig::new(GatewaySettings { body_memory: Some(399 << 20), ..large }).is_err());
    }
}
