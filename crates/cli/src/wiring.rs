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
use recovea_control::oidc::SignOn;
use recovea_upstream::Upstream;

use crate::args::{AdminArgs, GatewayArgs, OidcArgs, ProviderArgs, non_blank, operator_token};
use crate::data_dir;

/// The control store, the receipt ledger and the jobs: one database behind the three traits.
pub(crate) struct Stores {
    pub(crate) store: Arc<dyn ControlStore>,
    pub(crate) ledger: Arc<dyn ReceiptLedger>,
    pub(crate) jobs: Arc<dyn JobStore>,
}

/// The poller's settings: its interval, a provider client as nodes have (`network`), and the
/// kinds' default base URLs.
pub(crate) fn poller_settings(
    interval: Duration,
    providers: &ProviderArgs,
    alerts: Option<Arc<recovea_control::alerts::Alerts>>,
) -> Result<PollerSettings, String> {
    let network = providers.network()?;
    Ok(PollerSettings {
        interval,
        upstream: Upstream::new(providers.connect_timeout, 0, &network),
        defaults: ProviderDefaults {
            openai: providers.openai_base_url.clone(),
            anthropic: providers.anthropic_base_url.clone(),
            gemini: providers.gemini_base_url.clone(),
        },
        alerts,
    })
}

/// Single sign-on from the `--oidc-*` flags, when an issuer is given. Its provider's documents are
/// fetched at once in the background, so that a provider set up wrong shows in the log at start;
/// the control plane starts all the same (the admin token still signs in).
pub(crate) fn sign_on(args: &OidcArgs) -> Result<Option<Arc<SignOn>>, String> {
    let Some(config) = args.config()? else { return Ok(None) };
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
    Ok(Some(sign_on))
}

/// Opens `--database-url` (`sqlite://PATH`, `postgres://...`) or the SQLite file in the data dir.
/// `serve` takes SQLite only: it is the zero-setup process.
pub(crate) fn open_stores(
    url: Option<&str>,
    data_dir: &Path,
    postgres_allowed: bool,
    bounds: recovea_store::postgres::Bounds,
) -> Result<Stores, String> {
    fn both<S: ControlStore + ReceiptLedger + JobStore>(store: S) -> Stores {
        let store = Arc::new(store);
        Stores { store: store.clone(), ledger: store.clone(), jobs: store }
    }
    let sqlite = |path: &Path| {
        SqliteStore::open(path).map(both).map_err(|e| format!("--database-url {}: {e}", path.display()))
    };
    match url {
        None => sqlite(&data_dir.join("recovea.db")),
        Some(url) => match url.strip_prefix("sqlite://") {
            Some(path) if !path.is_empty() => sqlite(Path::new(path)),
            _ if postgres_allowed && (url.starts_with("postgres://") || url.starts_with("postgresql://")) => {
                // The URL may carry a password: errors name the scheme only.
                PostgresStore::connect_bounded(url, bounds)
                    .map(both)
                    .map_err(|e| format!("--database-url (postgres): {e}"))
            }
            _ if postgres_allowed => {
                Err("--database-url: expected sqlite://PATH or postgres://...".to_owned())
            }
            _ => Err("--database-url: `serve` takes sqlite://PATH; run `control` for PostgreSQL".to_owned()),
        },
    }
}

/// The admin token from the flag, else the one saved in (or generated into) the data dir, and
/// whether it was generated now.
pub(crate) fn admin_token(admin: &AdminArgs, data_dir: &Path) -> Result<(String, bool), String> {
    match &admin.admin_token {
        Some(token) => Ok((operator_token("--admin-token", token)?, false)),
        None => data_dir::admin_token(data_dir).map(|saved| (saved.value, saved.generated)),
    }
}

pub(crate) fn alert_signing_secret(admin: &AdminArgs, data_dir: &Path) -> Result<String, String> {
    match &admin.alert_signing_secret {
        Some(secret) => non_blank("--alert-signing-secret", secret),
        None => data_dir::alert_signing_secret(data_dir),
    }
}

/// The node's spend counters and the store they sync with: shared through Redis when
/// `--redis-url` is given (other nodes spend on the same caps, so the store decides at armed
/// caps' lines), else exact counters in this process.
pub(crate) fn counters(
    node_id: &str,
    redis: Option<&(String, RedisTls)>,
) -> Result<(Arc<Counters>, Arc<dyn SharedCounters>), String> {
    Ok(match redis {
        None => (Counters::new(node_id), Arc::new(InProcess::new(StoreOptions::default()))),
        Some((url, tls)) => {
            let redis: Arc<dyn SharedCounters> = Arc::new(
                Redis::with_tls(url, tls, StoreOptions::default())
                    .map_err(|e| format!("--redis-url: {e}"))?,
            );
            (Counters::shared(node_id, Arc::clone(&redis)), redis)
        }
    })
}

/// Rate limits shared through Redis when `--redis-url` is given; without it each node limits alone.
pub(crate) fn rate_share(redis: Option<&(String, RedisTls)>) -> Result<Option<Arc<dyn RateShare>>, String> {
    let Some((url, tls)) = redis else { return Ok(None) };
    let share =
        RedisRateShare::with_tls(url, tls, "recovea:rate").map_err(|e| format!("--redis-url: {e}"))?;
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
) -> Result<(), String> {
    let Some(addr) = args.metrics_listen else { return Ok(()) };
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("recovea metrics: http://{bound}/metrics");
    tokio::spawn(gateway.clone().serve_metrics(listener, shutdown));
    Ok(())
}
