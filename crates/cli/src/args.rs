//! The flags of `serve`, `control` and `node`, each with its environment variable, in groups that
//! the commands share.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use recovea_core::crypto::MasterKey;
use recovea_counters::RedisTls;
use recovea_gateway::log_writer::{DEFAULT_LOG_QUEUE_LINES, LogFlusher, bounded_stderr};
use recovea_gateway::spool::{DEFAULT_MEMORY_BOUND, MemoryBound};
use recovea_gateway::{
    ConfigError, DEFAULT_HTTP2_CONNECTIONS, Egress, GatewayConfig, GatewaySettings, PrivateNetworks,
    ProviderNetwork, TraceTarget, default_max_connections,
};

use crate::failure::{Failure, Problems};
use crate::size;

/// What every long-running command takes.
#[derive(Args)]
pub(crate) struct CommonArgs {
    /// Holds the SQLite file (`serve`, `control`), the generated secrets, the spool and the saved state.
    #[arg(long, env = "RECOVEA_DATA_DIR", default_value = "./recovea-data")]
    pub(crate) data_dir: PathBuf,
    /// Log filter, in `RUST_LOG` syntax.
    #[arg(long, env = "RECOVEA_LOG", default_value = "info")]
    pub(crate) log: String,
    /// `text` for people, `json` (one object per line) for log pipelines.
    #[arg(long, env = "RECOVEA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrivateNetworksArg {
    Allow,
    Deny,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The gateway node's flags (`serve`, `node`).
#[derive(Args)]
pub(crate) struct GatewayArgs {
    /// Gateway address.
    #[arg(long, env = "RECOVEA_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,
    #[command(flatten)]
    pub(crate) providers: ProviderArgs,
    /// Largest request body accepted (bytes, or with a KiB/MiB/GiB suffix); larger ones get 413.
    #[arg(long, env = "RECOVEA_MAX_BODY_SIZE", default_value = "32MiB", value_parser = size::parse_bytes)]
    max_body_size: u64,
    /// The memory every request body being read may take at once (bytes, or with a suffix): past
    /// it a body waits, unread, for room, and gets 503 body_memory_busy if none comes within the
    /// request body timeout. One organization may hold half of it.
    #[arg(long, env = "RECOVEA_BODY_MEMORY", default_value = "256MiB", value_parser = size::parse_bytes)]
    body_memory: u64,
    /// How long to wait for a provider's response headers before answering 504.
    #[arg(long, env = "RECOVEA_UPSTREAM_TIMEOUT", default_value = "600s", value_parser = humantime::parse_duration)]
    upstream_timeout: Duration,
    /// How long an answer may go without a byte from its provider, or without its client reading a
    /// byte, before it is cut (its receipt estimated, its cap reservation released). Generous:
    /// a reasoning model can be silent for minutes mid-stream.
    #[arg(long, env = "RECOVEA_STREAM_IDLE_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    stream_idle_timeout: Duration,
    /// How long a client may take to send its request body before it gets 408.
    #[arg(long, env = "RECOVEA_REQUEST_BODY_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    request_body_timeout: Duration,
    /// An armed cap whose counters were not confirmed for longer than this answers 503.
    #[arg(long, env = "RECOVEA_COUNTER_MAX_AGE", default_value = "60s", value_parser = humantime::parse_duration)]
    counter_max_age: Duration,
    /// Shared spend counters and rate limits (`redis://HOST:PORT/DB`, `rediss://` for TLS, an ACL
    /// user and password as `rediss://USER:PASSWORD@HOST:PORT/DB`; a Redis Cluster as
    /// `redis+cluster://HOST:PORT,HOST:PORT`; a primary found through Sentinel as
    /// `redis+sentinel://HOST:PORT,HOST:PORT/MASTER_NAME`); without it, they live in this process.
    #[arg(long, env = "RECOVEA_REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,
    /// A PEM file of certificate authorities trusted for a `rediss://` Redis, instead of the public
    /// web's roots.
    #[arg(long, env = "RECOVEA_REDIS_CA_FILE")]
    redis_ca_file: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for a `rediss://` Redis that asks for one; with its key.
    #[arg(long, env = "RECOVEA_REDIS_CERT_FILE", requires = "redis_key_file")]
    redis_cert_file: Option<std::path::PathBuf>,
    /// The private key (PEM) of the Redis client certificate.
    #[arg(long, env = "RECOVEA_REDIS_KEY_FILE", requires = "redis_cert_file")]
    redis_key_file: Option<std::path::PathBuf>,
    /// Where fail-open alarms are POSTed (JSON), besides the error log.
    #[arg(long, env = "RECOVEA_ALARM_WEBHOOK")]
    alarm_webhook: Option<String>,
    /// The least time between two alarms for one reason; passes in between are counted in the next.
    #[arg(long, env = "RECOVEA_ALARM_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    alarm_interval: Duration,
    /// The most client connections open at once: past it new ones are closed at once, and near it
    /// (90%) idle ones are closed first. By default, half of what the process's descriptor limit
    /// leaves after 64 for the node itself (a connection may hold a provider connection too).
    #[arg(long, env = "RECOVEA_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// The most receipts held in memory while the disk refuses them (full, failing); past it, or
    /// past --spool-memory-bytes, a receipt is lost (counted and logged).
    #[arg(long, env = "RECOVEA_SPOOL_MEMORY_RECEIPTS", default_value_t = DEFAULT_MEMORY_BOUND.receipts)]
    spool_memory_receipts: usize,
    /// The most bytes of receipts held in memory while the disk refuses them (bytes, or with a
    /// KiB/MiB/GiB suffix).
    #[arg(long, env = "RECOVEA_SPOOL_MEMORY_BYTES", default_value = "64MiB", value_parser = size::parse_bytes)]
    spool_memory_bytes: u64,
    /// One line per proxied request at `info` (target `recovea::access`): who, where, status,
    /// outcome, tokens, cost, time to first byte and total time. `false` turns it off.
    #[arg(long, env = "RECOVEA_ACCESS_LOG", default_value_t = true, action = clap::ArgAction::Set)]
    access_log: bool,
    /// Serves `/metrics` on this address of its own instead of the gateway's port (which then
    /// does not answer it): keeps it off the customers' load balancer.
    #[arg(long, env = "RECOVEA_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// A bearer token `/metrics` asks for (`Authorization: Bearer <token>`); without it, `/metrics`
    /// needs none. It shows every organization's totals: keep it off a public load balancer, or set this.
    #[arg(long, env = "RECOVEA_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
    /// Sends a trace of each request (a span with a child per phase) to this OTLP/HTTP collector
    /// (`http://collector:4318`, or the full URL of its traces endpoint). Off without it.
    #[arg(long, env = "RECOVEA_OTLP_ENDPOINT", hide_env_values = true)]
    otlp_endpoint: Option<String>,
    /// The `service.name` of the traces.
    #[arg(long, env = "RECOVEA_OTLP_SERVICE_NAME", default_value = recovea_gateway::DEFAULT_SERVICE_NAME)]
    otlp_service_name: String,
}

/// How providers are reached, by nodes and by the control plane's job poller alike.
#[derive(Args)]
pub(crate) struct ProviderArgs {
    /// Default base URL of openai-kind credentials, and where a fail-open pass goes.
    #[arg(long, env = "RECOVEA_OPENAI_BASE_URL", default_value = "https://api.openai.com")]
    pub(crate) openai_base_url: String,
    /// Default base URL of anthropic-kind credentials, and where a fail-open pass goes.
    #[arg(long, env = "RECOVEA_ANTHROPIC_BASE_URL", default_value = "https://api.anthropic.com")]
    pub(crate) anthropic_base_url: String,
    /// Default base URL of gemini-kind credentials, and where a fail-open pass goes.
    #[arg(long, env = "RECOVEA_GEMINI_BASE_URL", default_value = recovea_gateway::DEFAULT_GEMINI_BASE_URL)]
    pub(crate) gemini_base_url: String,
    /// How long to wait for a connection to a provider before answering 502.
    #[arg(long, env = "RECOVEA_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) connect_timeout: Duration,
    /// PEM file of certificate authorities trusted for providers beside the public web's roots: a
    /// corporate CA, or a self-hosted model's.
    #[arg(long, env = "RECOVEA_UPSTREAM_CA_FILE")]
    pub(crate) upstream_ca_file: Option<PathBuf>,
    /// Trust only --upstream-ca-file's authorities for providers, not the public web's roots.
    #[arg(long, env = "RECOVEA_UPSTREAM_CA_ONLY")]
    pub(crate) upstream_ca_only: bool,
    /// Egress proxy to providers, `http://[user:password@]host[:port]` (`CONNECT` for https, absolute
    /// URIs for http). Without it, https_proxy/HTTPS_PROXY, http_proxy/HTTP_PROXY and
    /// all_proxy/ALL_PROXY apply, as for curl.
    #[arg(long, env = "RECOVEA_UPSTREAM_PROXY", hide_env_values = true)]
    pub(crate) upstream_proxy: Option<String>,
    /// Providers reached without the proxy: comma-separated names (with their subdomains), IP
    /// addresses, CIDR blocks, or `*`. Without it, no_proxy/NO_PROXY applies.
    #[arg(long, env = "RECOVEA_UPSTREAM_NO_PROXY")]
    pub(crate) upstream_no_proxy: Option<String>,
    /// The most HTTP/2 connections opened to one provider: another opens when every one has as
    /// many streams as the provider allows, and an extra one closes after 10 s unused.
    #[arg(long, env = "RECOVEA_UPSTREAM_HTTP2_CONNECTIONS", default_value_t = DEFAULT_HTTP2_CONNECTIONS)]
    pub(crate) upstream_http2_connections: usize,
    /// Whether provider, proxy and webhook connections may go to private networks (10/8,
    /// 172.16/12, 192.168/16, 100.64/10, fc00::/7, loopback): `allow` (self-hosted models live
    /// there) or `deny`. Cloud metadata services (link-local addresses) and this process's own
    /// listeners are never reached either way.
    #[arg(long, env = "RECOVEA_UPSTREAM_PRIVATE_NETWORKS", value_enum, default_value = "allow")]
    pub(crate) upstream_private_networks: PrivateNetworksArg,
}

impl ProviderArgs {
    /// How providers are reached: the flags, then the proxy variables of the environment.
    pub(crate) fn network(&self) -> Result<ProviderNetwork, ConfigError> {
        let ca = read_file("upstream-ca-file", self.upstream_ca_file.as_deref())?;
        let egress =
            Egress::new(self.upstream_proxy.as_deref(), self.upstream_no_proxy.as_deref(), |name| {
                std::env::var(name).ok()
            })?;
        let private = match self.upstream_private_networks {
            PrivateNetworksArg::Allow => PrivateNetworks::Allow,
            PrivateNetworksArg::Deny => PrivateNetworks::Deny,
        };
        ProviderNetwork::new(ca.as_deref(), self.upstream_ca_only, egress, self.upstream_http2_connections)
            .map(|network| network.with_private_networks(private))
    }
}

impl GatewayArgs {
    /// The node's configuration, every setting checked: a start-up that fails names every wrong
    /// setting at once.
    pub(crate) fn config(&self) -> Result<GatewayConfig, Failure> {
        let providers = &self.providers;
        let settings = GatewaySettings {
            openai_base_url: providers.openai_base_url.clone(),
            anthropic_base_url: providers.anthropic_base_url.clone(),
            gemini_base_url: providers.gemini_base_url.clone(),
            max_body_bytes: self.max_body_size,
            body_memory: Some(self.body_memory),
            upstream_timeout: self.upstream_timeout,
            connect_timeout: providers.connect_timeout,
            body_read_timeout: self.request_body_timeout,
            counter_max_age: self.counter_max_age,
            stream_idle_timeout: self.stream_idle_timeout,
            max_connections: self
                .max_connections
                .unwrap_or_else(|| default_max_connections(descriptor_limit())),
            alarm_webhook: self.alarm_webhook.clone(),
            alarm_interval: self.alarm_interval,
            metrics_token: self.metrics_token.clone(),
            traces: self.otlp_endpoint.as_ref().map(|endpoint| TraceTarget {
                endpoint: endpoint.clone(),
                service_name: Some(self.otlp_service_name.clone()),
            }),
        };
        let mut problems = Problems::default();
        let config = problems.check(GatewayConfig::new(settings));
        let network = problems.check(providers.network());
        let (Some(config), Some(network)) = (config, network) else { return Err(problems.into()) };
        Ok(config
            .with_network(network)
            .with_memory_release(crate::allocator::release_freed_memory)
            .with_access_log(self.access_log)
            .with_metrics_elsewhere(self.metrics_listen.is_some()))
    }

    /// The shared Redis, if any: its URL and the certificates read from their files.
    pub(crate) fn redis(&self) -> Result<Option<(String, RedisTls)>, ConfigError> {
        let Some(url) = &self.redis_url else { return Ok(None) };
        let ca = read_file("redis-ca-file", self.redis_ca_file.as_deref())?;
        let cert = read_file("redis-cert-file", self.redis_cert_file.as_deref())?;
        let key = read_file("redis-key-file", self.redis_key_file.as_deref())?;
        let client = cert.zip(key);
        Ok(Some((url.clone(), RedisTls { ca, client })))
    }

    /// How many receipts the spool may hold in memory while the disk refuses them.
    pub(crate) fn spool_memory(&self) -> MemoryBound {
        let bytes = usize::try_from(self.spool_memory_bytes).unwrap_or(usize::MAX);
        MemoryBound { receipts: self.spool_memory_receipts, bytes }
    }
}

/// The process's soft limit on open descriptors (`None`: unknown, or no limit), from
/// `/proc/self/limits`: the node bounds its connections within it.
fn descriptor_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

/// The admin API's flags (`serve`, `control`).
#[derive(Args)]
pub(crate) struct AdminArgs {
    /// Admin API address.
    #[arg(long, env = "RECOVEA_ADMIN_LISTEN", default_value = "127.0.0.1:8081")]
    pub(crate) admin_listen: SocketAddr,
    /// `sqlite://PATH` or (`control`) `postgres://...`; defaults to a SQLite file in the data dir.
    #[arg(long, env = "RECOVEA_DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Bearer token of the admin API; generated on first start and saved in the data dir when not given.
    #[arg(long, env = "RECOVEA_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// Key of the HMAC-SHA256 signature on alert webhooks; generated into the data dir when not given.
    #[arg(long, env = "RECOVEA_ALERT_SIGNING_SECRET", hide_env_values = true)]
    pub(crate) alert_signing_secret: Option<String>,
    /// PostgreSQL cancels a statement that runs longer (`statement_timeout`).
    #[arg(long, env = "RECOVEA_DATABASE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) database_timeout: Duration,
    /// How long a store call waits for a database connection when all are busy or the database
    /// is unreachable, before the admin API answers 503.
    #[arg(long, env = "RECOVEA_DATABASE_POOL_WAIT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) database_pool_wait: Duration,
    /// Boxed: ten flags that most deployments leave unset would make `serve`'s and `control`'s
    /// flags far larger than the other commands'.
    #[command(flatten)]
    pub(crate) oidc: Box<OidcArgs>,
}

/// Single sign-on to the console through an OpenID Connect provider (`serve`, `control`).
#[derive(Args)]
pub(crate) struct OidcArgs {
    /// Signs people in to the console through this OpenID Connect provider: its issuer URL, exactly
    /// as its discovery document names it (https, or http to localhost). Off without it.
    #[arg(
        long,
        env = "RECOVEA_OIDC_ISSUER",
        requires = "oidc_client_id",
        requires = "oidc_client_secret",
        requires = "oidc_redirect_url"
    )]
    pub(crate) oidc_issuer: Option<String>,
    /// The client id Recovea's console has at the provider.
    #[arg(long, env = "RECOVEA_OIDC_CLIENT_ID", requires = "oidc_issuer")]
    pub(crate) oidc_client_id: Option<String>,
    /// The client secret Recovea's console has at the provider.
    #[arg(long, env = "RECOVEA_OIDC_CLIENT_SECRET", hide_env_values = true, requires = "oidc_issuer")]
    pub(crate) oidc_client_secret: Option<String>,
    /// Where the provider sends people back: the console's address followed by
    /// /console/oidc/callback, as registered with the provider.
    #[arg(long, env = "RECOVEA_OIDC_REDIRECT_URL", requires = "oidc_issuer")]
    pub(crate) oidc_redirect_url: Option<String>,
    /// The scopes asked of the provider, space- or comma-separated (openid is always asked): those
    /// that put the claims below in the ID token.
    #[arg(long, env = "RECOVEA_OIDC_SCOPES", default_value = recovea_control::oidc::config::DEFAULT_SCOPES)]
    pub(crate) oidc_scopes: String,
    /// The ID token claim that holds a person's organization id (org_...): they sign in to that
    /// organization alone.
    #[arg(long, env = "RECOVEA_OIDC_ORG_CLAIM", requires = "oidc_issuer")]
    pub(crate) oidc_org_claim: Option<String>,
    /// The ID token claim that holds a person's role in their organization, admin or viewer.
    /// Without it, everyone signed in to an organization is a viewer.
    #[arg(long, env = "RECOVEA_OIDC_ROLE_CLAIM", requires = "oidc_org_claim")]
    pub(crate) oidc_role_claim: Option<String>,
    /// The ID token claim that lists a person's groups.
    #[arg(long, env = "RECOVEA_OIDC_GROUPS_CLAIM", default_value = recovea_control::oidc::config::DEFAULT_GROUPS_CLAIM)]
    pub(crate) oidc_groups_claim: String,
    /// The group whose members sign in as the operator (everything the admin token reaches),
    /// whatever organization their account names.
    #[arg(long, env = "RECOVEA_OIDC_OPERATOR_GROUP", requires = "oidc_issuer")]
    pub(crate) oidc_operator_group: Option<String>,
    /// A PEM file of certificate authorities trusted for the provider beside the public web's
    /// roots: a provider behind a private CA.
    #[arg(long, env = "RECOVEA_OIDC_CA_FILE", requires = "oidc_issuer")]
    pub(crate) oidc_ca_file: Option<PathBuf>,
}

impl OidcArgs {
    /// The validated sign-on settings, when an issuer is given.
    pub(crate) fn config(&self) -> Result<Option<recovea_control::oidc::OidcConfig>, ConfigError> {
        let Some(issuer) = &self.oidc_issuer else { return Ok(None) };
        let given = |value: &Option<String>| value.clone().unwrap_or_default();
        recovea_control::oidc::OidcConfig::new(recovea_control::oidc::OidcSettings {
            issuer: issuer.clone(),
            client_id: given(&self.oidc_client_id),
            client_secret: given(&self.oidc_client_secret),
            redirect_url: given(&self.oidc_redirect_url),
            scopes: self.oidc_scopes.clone(),
            org_claim: self.oidc_org_claim.clone(),
            role_claim: self.oidc_role_claim.clone(),
            groups_claim: self.oidc_groups_claim.clone(),
            operator_group: self.oidc_operator_group.clone(),
            ca_pem: read_file("oidc-ca-file", self.oidc_ca_file.as_deref())?,
        })
        .map(Some)
    }
}

impl AdminArgs {
    /// The PostgreSQL store's bounds.
    pub(crate) fn database_bounds(&self) -> Result<recovea_store::postgres::Bounds, Vec<ConfigError>> {
        let wrong: Vec<ConfigError> =
            [("database-timeout", self.database_timeout), ("database-pool-wait", self.database_pool_wait)]
                .into_iter()
                .filter(|(_, value)| value.is_zero())
                .map(|(flag, _)| ConfigError::zero(flag))
                .collect();
        if !wrong.is_empty() {
            return Err(wrong);
        }
        Ok(recovea_store::postgres::Bounds {
            statement_timeout: self.database_timeout,
            pool_wait: self.database_pool_wait,
            ..recovea_store::postgres::DEFAULT_BOUNDS
        })
    }

    /// How long a store call may take before the admin API answers 503: past the database's own
    /// bounds, so that they end a slow call first, and a frozen database is answered all the same.
    pub(crate) fn store_limit(&self) -> Duration {
        self.database_timeout + self.database_pool_wait + Duration::from_secs(1)
    }
}

/// The deferred jobs' poller (`serve`, `control`).
#[derive(Args)]
pub(crate) struct JobArgs {
    /// How long after a poll a running job (a batch, a background response) is polled again at
    /// its provider, until it ends and is settled from the provider's usage.
    #[arg(long, env = "RECOVEA_JOB_POLL_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) job_poll_interval: Duration,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    #[command(flatten)]
    pub(crate) gateway: GatewayArgs,
    #[command(flatten)]
    pub(crate) admin: AdminArgs,
    #[command(flatten)]
    pub(crate) jobs: JobArgs,
    /// 64 hex characters that seal provider keys at rest; generated into the data dir when not given.
    #[arg(long, env = "RECOVEA_MASTER_KEY", hide_env_values = true)]
    pub(crate) master_key: Option<String>,
}

#[derive(Args)]
pub(crate) struct ControlArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    #[command(flatten)]
    pub(crate) admin: AdminArgs,
    #[command(flatten)]
    pub(crate) jobs: JobArgs,
    /// How the job poller reaches providers (as nodes do).
    #[command(flatten)]
    pub(crate) providers: ProviderArgs,
    /// 64 hex characters that seal provider keys at rest and in the feed; the same on every node.
    #[arg(long, env = "RECOVEA_MASTER_KEY", hide_env_values = true)]
    pub(crate) master_key: String,
    /// The shared secret every node may present, besides the node credentials issued through the
    /// admin API (the stronger choice: each node its own, revocable alone).
    #[arg(long, env = "RECOVEA_NODE_TOKEN", hide_env_values = true)]
    pub(crate) node_token: Option<String>,
}

#[derive(Args)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    #[command(flatten)]
    pub(crate) gateway: GatewayArgs,
    /// The control plane: where the node gets its feed and delivers its receipts. Several replicas
    /// (the flag repeated, or a comma-separated list): each call goes to the one that answered last,
    /// and to the next in order, round the list, while one cannot be reached or serve.
    #[arg(long, env = "RECOVEA_CONTROL_URL", required = true, value_delimiter = ',')]
    pub(crate) control_url: Vec<String>,
    /// A PEM file of certificate authorities trusted for the control plane's TLS (a private CA in
    /// front of the replicas), beside the public web's roots.
    #[arg(long, env = "RECOVEA_CONTROL_CA_FILE")]
    pub(crate) control_ca_file: Option<std::path::PathBuf>,
    /// What the node presents to the control plane: its own node credential's token (`rnt_...`,
    /// from `recovea admin node-credentials create`), or the shared node token.
    #[arg(long, env = "RECOVEA_NODE_TOKEN", hide_env_values = true)]
    pub(crate) node_token: String,
    /// 64 hex characters: the control plane's master key, which opens provider keys from the feed.
    #[arg(long, env = "RECOVEA_MASTER_KEY", hide_env_values = true)]
    pub(crate) master_key: String,
}

pub(crate) fn parse_master_key(hex: &str) -> Result<MasterKey, ConfigError> {
    MasterKey::parse_hex(hex).map_err(|e| ConfigError::flag("master-key", e.to_string()))
}

/// The contents of the file given to `flag`, if one was.
pub(crate) fn read_file(
    flag: &'static str,
    path: Option<&std::path::Path>,
) -> Result<Option<Vec<u8>>, ConfigError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| ConfigError::flag(flag, format!("cannot read {}: {e}", path.display())))
    };
    path.map(read).transpose()
}

/// An operator's bearer token given to `flag` (`recovea_core::keys::operator_token`).
pub(crate) fn operator_token(flag: &'static str, value: &str) -> Result<String, ConfigError> {
    recovea_core::keys::operator_token(value).map(str::to_owned).map_err(|why| ConfigError::flag(flag, why))
}

/// Installs the log subscriber: text or JSON lines on stderr, through a bounded queue that drops
/// (and counts) lines rather than make a request wait for a slow stderr. The log is written out
/// when the returned flusher drops.
pub(crate) fn init_logging(common: &CommonArgs) -> Result<LogFlusher, Failure> {
    let filter = tracing_subscriber::EnvFilter::try_new(&common.log)
        .map_err(|e| ConfigError::flag("log", format!("{:?}: {e}", common.log)))?;
    // Colour codes only for a person at a terminal: in a file or a pipeline they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, flusher) = bounded_stderr(DEFAULT_LOG_QUEUE_LINES)
        .map_err(|e| format!("could not start the log's writing thread: {e}"))?;
    let logs =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(move || writer.clone()).with_ansi(ansi);
    match common.log_format {
        LogFormat::Text => logs.fmt_fields(crate::log_fields::TextFields).init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
    Ok(flusher)
}

/// Listens for SIGTERM and Ctrl-C from the call on, and resolves on the first. Called before the
/// banner: a signal that comes while the process starts (a deployment stopping a pod it just
/// started) must drain and log as later ones do, not kill the process by the default action.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (term, interrupt) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                // Registering fails only without a runtime's signal driver: the default actions stay.
                _ => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
