//! The node's configuration: the settings as given (flags, environment), validated once into a
//! [`GatewayConfig`] that cannot be built any other way.

use std::time::Duration;

pub use recovea_core::ConfigError;
use recovea_core::snapshot::ProviderKind;
use recovea_upstream::{DEFAULT_STREAM_IDLE_TIMEOUT, ProviderNetwork};

use crate::alarm::parse_webhook;

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
/// [`GatewayConfig::with_gemini_base_url`] says otherwise.
pub const DEFAULT_GEMINI_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// The memory request bodies may take at once, unless [`GatewayConfig::with_body_memory`] says
/// otherwise (or twice the largest body allowed, when that is more).
pub const DEFAULT_BODY_MEMORY: u64 = 256 << 20;

/// How long a fail-open reason stays quiet after its alarm, unless [`GatewayConfig::with_alarm`]
/// says otherwise.
pub const DEFAULT_ALARM_INTERVAL: Duration = Duration::from_secs(10);

impl GatewayConfig {
    /// The configuration of `settings`, or every setting that is wrong.
    pub fn new(settings: GatewaySettings) -> Result<Self, Vec<ConfigError>> {
        let mut wrong: Vec<ConfigError> = [
            ("upstream-timeout", settings.upstream_timeout),
            ("connect-timeout", settings.connect_timeout),
            ("request-body-timeout", settings.body_read_timeout),
            ("counter-max-age", settings.counter_max_age),
        ]
        .into_iter()
        .filter(|(_, value)| value.is_zero())
        .map(|(flag, _)| ConfigError::zero(flag))
        .collect();
        let mut base_url =
            |flag: &'static str, url: &str| base_url(flag, url).map_err(|e| wrong.push(e)).ok();
        let openai_base_url = base_url("openai-base-url", &settings.openai_base_url);
        let anthropic_base_url = base_url("anthropic-base-url", &settings.anthropic_base_url);
        let (Some(openai_base_url), Some(anthropic_base_url), true) =
            (openai_base_url, anthropic_base_url, wrong.is_empty())
        else {
            return Err(wrong);
        };
        Ok(Self {
            openai_base_url,
            anthropic_base_url,
            gemini_base_url: DEFAULT_GEMINI_BASE_URL.to_owned(),
            max_body_bytes: settings.max_body_bytes,
            body_memory: DEFAULT_BODY_MEMORY.max(2 * settings.max_body_bytes),
            upstream_timeout: settings.upstream_timeout,
            connect_timeout: settings.connect_timeout,
            body_read_timeout: settings.body_read_timeout,
            counter_max_age: settings.counter_max_age,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            alarm_webhook: None,
            alarm_interval: DEFAULT_ALARM_INTERVAL,
            network: ProviderNetwork::default(),
            max_connections: default_max_connections(None),
            release_freed_memory: || {},
            access_log: true,
            traces: None,
            metrics_token_hash: None,
            metrics_elsewhere: false,
        })
    }

    /// Exports a span per request, with a child per phase, to the OTLP/HTTP collector at
    /// `endpoint` (`http://collector:4318`, or the full URL of its traces endpoint), under
    /// `service_name` ([`crate::DEFAULT_SERVICE_NAME`] by default).
    pub fn with_traces(mut self, endpoint: &str, service_name: Option<&str>) -> Result<Self, ConfigError> {
        self.traces = Some(crate::trace::TraceSettings::new(endpoint, service_name)?);
        Ok(self)
    }

    /// How the process's allocator gives back at once what the thread calling it freed: called on
    /// the feed's thread after each state it installs, since a replaced snapshot of a million keys
    /// is hundreds of MiB that an allocator may otherwise keep.
    pub fn with_memory_release(mut self, release_freed_memory: fn()) -> Self {
        self.release_freed_memory = release_freed_memory;
        self
    }

    /// Fail-open passes alarm at most once per reason per `interval`, in the log and, when
    /// `webhook` is given, by a POST to it. Both settings are checked: an error names each wrong one.
    pub fn with_alarm(mut self, webhook: Option<&str>, interval: Duration) -> Result<Self, Vec<ConfigError>> {
        let webhook =
            webhook.map(|url| parse_webhook(url).map_err(|why| ConfigError::flag("alarm-webhook", why)));
        let wrong: Vec<ConfigError> = [interval.is_zero().then(|| ConfigError::zero("alarm-interval"))]
            .into_iter()
            .flatten()
            .chain(webhook.clone().and_then(Result::err))
            .collect();
        if !wrong.is_empty() {
            return Err(wrong);
        }
        self.alarm_webhook = webhook.and_then(Result::ok);
        self.alarm_interval = interval;
        Ok(self)
    }

    /// An answer whose provider sends nothing, or whose client reads nothing, for `limit` is cut:
    /// its receipt is written from what passed, and its cap reservation settled by it.
    pub fn with_stream_idle_timeout(mut self, limit: Duration) -> Result<Self, ConfigError> {
        if limit.is_zero() {
            return Err(ConfigError::zero("stream-idle-timeout"));
        }
        self.stream_idle_timeout = limit;
        Ok(self)
    }

    /// At most `max` client connections are open at once: past it a new one is closed at once, and
    /// near it idle ones are closed first (see [`crate::server`]).
    pub fn with_max_connections(mut self, max: usize) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::zero("max-connections"));
        }
        self.max_connections = max;
        Ok(self)
    }

    /// The memory every request body being read may take at once: past it a body waits, unread,
    /// for room. One organization may hold half of it, so it must hold two of the largest bodies.
    pub fn with_body_memory(mut self, bytes: u64) -> Result<Self, ConfigError> {
        if bytes < 2 * self.max_body_bytes {
            return Err(ConfigError::flag(
                "body-memory",
                "must be at least twice --max-body-size (one organization may hold half of it)",
            ));
        }
        self.body_memory = bytes;
        Ok(self)
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

    /// `/metrics` answers only a scrape that presents `Authorization: Bearer <token>`.
    pub fn with_metrics_token(mut self, token: Option<&str>) -> Result<Self, ConfigError> {
        self.metrics_token_hash = match token.map(recovea_core::keys::operator_token) {
            Some(Err(why)) => return Err(ConfigError::flag("metrics-token", why)),
            Some(Ok(token)) => Some(recovea_core::keys::hash_secret(token)),
            None => None,
        };
        Ok(self)
    }

    /// Providers (and the alarm webhook) are reached as `network` says: its trusted certificates,
    /// its egress proxy, its bound on HTTP/2 connections.
    pub fn with_network(mut self, network: ProviderNetwork) -> Self {
        self.network = network;
        self
    }

    /// Credentials of kind `gemini` without a base URL of their own are sent here.
    pub fn with_gemini_base_url(mut self, url: &str) -> Result<Self, ConfigError> {
        self.gemini_base_url = base_url("gemini-base-url", url)?;
        Ok(self)
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
