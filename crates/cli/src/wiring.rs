//! The parts `serve`, `control` and `node` assemble alike: secrets from flags or the data dir, the
//! store, the counters store, and the background tasks that stop together.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use recovea_counters::{
    Counters, InProcess, RateShare, Redis, RedisRateShare, RedisTls, SharedCounters, StoreOptions,
};
use recovea_gateway::spool::{Keeps, MemoryBound, Spool};
use recovea_store::{ControlStore, JobStore, PostgresStore, ReceiptLedger, SqliteStore};
use tokio::sync::watch;

use recovea_control::jobs::{PollerSettings, ProviderDefaults};
use recovea_control::oidc::{OidcConfig, SignOn};
use recovea_core::ConfigError;
use recovea_core::config_error::non_blank;
use recovea_store::postgres::Bounds;
use recovea_upstream::{ProviderNetwork, Upstream};

use crate::args::{AdminArgs, GatewayArgs, ProviderArgs, operator_token};
use crate::data_dir;
use crate::failure::{Failure, Problems};

/// The control store, the receipt ledger and the jobs: one database behind the three traits.
pub(crate) struct Stores {
    pub(crate) store: Arc<dyn ControlStore>,
    pub(crate) ledger: Arc<dyn ReceiptLedger>,
    pub(crate) jobs: Arc<dyn JobStore>,
}

/// The poller's settings: its interval, a provider client as nodes have (reaching providers
/// through `network`, as `providers` sets it), and the kinds' default base URLs.
pub(crate) fn poller_settings(
    interval: Duration,
    providers: &ProviderArgs,
    network: &ProviderNetwork,
    alerts: Option<Arc<recovea_control::alerts::Alerts>>,
) -> PollerSettings {
    PollerSettings {
        interval,
        upstream: Upstream::new(providers.connect_timeout, 0, network),
        defaults: ProviderDefaults {
            openai: providers.openai_base_url.clone(),
            anthropic: providers.anthropic_base_url.clone(),
            gemini: providers.gemini_base_url.clone(),
        },
        alerts,
    }
}

/// The admin API's settings (`serve`, `control`), every one checked before anything starts.
pub(crate) struct AdminSettings {
    pub(crate) bounds: Bounds,
    pub(crate) sign_on: Option<OidcConfig>,
    admin_token: Option<String>,
    alert_signing_secret: Option<String>,
}

impl AdminSettings {
    /// The settings of `admin`, or each one that is wrong.
    pub(crate) fn check(admin: &AdminArgs) -> Result<Self, Failure> {
        let mut problems = Problems::default();
        let bounds = problems.check(admin.database_bounds());
        let sign_on = problems.check(admin.oidc.config());
        let admin_token = admin.admin_token.as_deref().map(|token| operator_token("admin-token", token));
        let admin_token = problems.check(admin_token.transpose());
        let alert_signing_secret =
            admin.alert_signing_secret.as_deref().map(|secret| non_blank("alert-signing-secret", secret));
        let alert_signing_secret = problems.check(alert_signing_secret.transpose());
        let (Some(bounds), Some(sign_on), Some(admin_token), Some(alert_signing_secret)) =
            (bounds, sign_on, admin_token, alert_signing_secret)
        else {
            return Err(problems.into());
        };
        Ok(Self { bounds, sign_on, admin_token, alert_signing_secret })
    }

    /// The admin token given, else the one saved in (or generated into) the data dir, and whether
    /// it was generated now.
    pub(crate) fn admin_token(&self, data_dir: &Path) -> Result<(String, bool), String> {
        match &self.admin_token {
            Some(token) => Ok((token.clone(), false)),
            None => data_dir::admin_token(data_dir).map(|saved| (saved.value, saved.generated)),
        }
    }

    /// The alert signing secret given, else the one saved in (or generated into) the data dir.
    pub(crate) fn alert_signing_secret(&self, data_dir: &Path) -> Result<String, String> {
        match &self.alert_signing_secret {
            Some(secret) => Ok(secret.clone()),
            None => data_dir::alert_signing_secret(data_dir),
        }
    }
}

/// Single sign-on, when an issuer is given. Its provider's documents are fetched at once in the
/// background, so that a provider set up wrong shows in the log at start; the control plane
/// starts all the same (the admin token still signs in).
pub(crate) fn sign_on(config: Option<OidcConfig>) -> Option<Arc<SignOn>> {
    let config = config?;
    let sign_on = Arc::new(SignOn::new(config));
    let warming = Arc::clone(&sign_on);
    tokio::spawn(async move {
        let issuer = warming.party().config().issuer();
        match warming.party().warm_up().await {
            Ok(keys) => tracing::info!(
                issuer,
                keys,
                "single sign-on: the provider's discovery document and keys are read"
            ),
            Err(e) => tracing::warn!(
                issuer,
                error = %e,
                "single sign-on: the provider cannot be used yet; each sign-in tries again"
            ),
        }
    });
    Some(sign_on)
}

/// Opens `--database-url` (`sqlite://PATH`, `postgres://...`) or the SQLite file in the data dir.
/// `serve` takes SQLite only: it is the zero-setup process.
pub(crate) fn open_stores(
    url: Option<&str>,
    data_dir: &Path,
    postgres_allowed: bool,
    bounds: Bounds,
) -> Result<Stores, ConfigError> {
    fn both<S: ControlStore + ReceiptLedger + JobStore>(store: S) -> Stores {
        let store = Arc::new(store);
        Stores { store: store.clone(), ledger: store.clone(), jobs: store }
    }
    let sqlite = |path: &Path| {
        SqliteStore::open(path)
            .map(both)
            .map_err(|e| ConfigError::flag("database-url", format!("{}: {e}", path.display())))
    };
    match url {
        None => sqlite(&data_dir.join("recovea.db")),
        Some(url) => match url.strip_prefix("sqlite://") {
            Some(path) if !path.is_empty() => sqlite(Path::new(path)),
            _ if postgres_allowed && (url.starts_with("postgres://") || url.starts_with("postgresql://")) => {
                // The URL may carry a password: errors name the scheme only.
                PostgresStore::connect_bounded(url, bounds)
                    .map(both)
                    .map_err(|e| ConfigError::flag("database-url", format!("(postgres) {e}")))
            }
            _ if postgres_allowed => {
                Err(ConfigError::flag("database-url", "expected sqlite://PATH or postgres://..."))
            }
            _ => Err(ConfigError::flag(
                "database-url",
                "`serve` takes sqlite://PATH; run `control` for PostgreSQL",
            )),
        },
    }
}

/// The node's spend counters and the store they sync with: shared through Redis when
/// `--redis-url` is given (other nodes spend on the same caps, so the store decides at armed
/// caps' lines), else exact counters in this process.
pub(crate) fn counters(
    node_id: &str,
    redis: Option<&(String, RedisTls)>,
) -> Result<(Arc<Counters>, Arc<dyn SharedCounters>), ConfigError> {
    Ok(match redis {
        None => (Counters::new(node_id), Arc::new(InProcess::new(StoreOptions::default()))),
        Some((url, tls)) => {
            let redis: Arc<dyn SharedCounters> = Arc::new(
                Redis::with_tls(url, tls, StoreOptions::default())
                    .map_err(|e| ConfigError::flag("redis-url", e.to_string()))?,
            );
            (Counters::shared(node_id, Arc::clone(&redis)), redis)
        }
    })
}

/// Rate limits shared through Redis when `--redis-url` is given; without it each node limits alone.
pub(crate) fn rate_share(
    redis: Option<&(String, RedisTls)>,
) -> Result<Option<Arc<dyn RateShare>>, ConfigError> {
    let Some((url, tls)) = redis else { return Ok(None) };
    let share = RedisRateShare::with_tls(url, tls, "recovea:rate")
        .map_err(|e| ConfigError::flag("redis-url", e.to_string()))?;
    Ok(Some(Arc::new(share)))
}

/// How often a node exchanges its keys' usage with the others: the lag of a shared rate limit.
pub(crate) const RATE_SHARE_INTERVAL: Duration = Duration::from_millis(250);

pub(crate) fn open_spool(data_dir: &Path, bound: MemoryBound, keeps: Keeps) -> Result<Arc<Spool>, String> {
    let dir = data_dir.join("spool");
    Spool::open_bounded(&dir, bound, keeps).map(Arc::new).map_err(|e| format!("{}: {e}", dir.display()))
}

/// One signal that every background task watches; sent once, at shutdown.
#[derive(Clone)]
pub(crate) struct Stop(watch::Sender<bool>);

impl Stop {
    pub(crate) fn new() -> Self {
        Self(watch::Sender::new(false))
    }

    /// Resolves once [`Stop::stop`] was called.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    pub(crate) fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// `--metrics-listen`: `/metrics` on a listener of its own, served until `shutdown`; its address is
/// printed as the others are.
pub(crate) async fn serve_metrics_apart(
    args: &GatewayArgs,
    gateway: &recovea_gateway::Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Failure> {
    let Some(addr) = args.metrics_listen else { return Ok(()) };
    let listener = bind("metrics-listen", addr).await?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("recovea metrics: http://{bound}/metrics");
    tokio::spawn(gateway.clone().serve_metrics(listener, shutdown));
    Ok(())
}

/// A listener on `addr`, given by `flag`.
pub(crate) async fn bind(
    flag: &'static str,
    addr: std::net::SocketAddr,
) -> Result<tokio::net::TcpListener, ConfigError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| ConfigError::flag(flag, format!("{addr}: {e}")))
}
