//! `recovea serve`: the admin API and one gateway node in one process, on embedded SQLite.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use recovea_control::Control;
use recovea_control::alerts::Alerts;
use recovea_control::ingest::LedgerSink;
use recovea_control::rebuild::{rebuild_missing, rebuild_window};
use recovea_core::crypto::MasterKey;
use recovea_counters::{CapWindow, Counters, InProcess, Redis, SharedCounters, StoreOptions, sync_loop};
use recovea_gateway::spool::Spool;
use recovea_gateway::{Gateway, GatewayConfig, GatewaySettings};
use recovea_store::ControlStore;
use recovea_store::SqliteStore;
use tokio::net::TcpListener;

use crate::{ServeArgs, data_dir};

pub(crate) async fn run(args: ServeArgs) -> Result<(), String> {
    init_logging(&args.log)?;
    let config = GatewayConfig::new(GatewaySettings {
        openai_base_url: args.openai_base_url.clone(),
        anthropic_base_url: args.anthropic_base_url.clone(),
        max_body_bytes: args.max_body_size,
        upstream_timeout: args.upstream_timeout,
        connect_timeout: args.connect_timeout,
        body_read_timeout: args.request_body_timeout,
        counter_max_age: args.counter_max_age,
    })
    .map_err(|e| e.to_string())?;
    data_dir::create(&args.data_dir)?;
    let database = sqlite_path(&args)?;
    let master_key = match &args.master_key {
        Some(hex) => MasterKey::parse_hex(hex).map_err(|e| format!("--master-key: {e}"))?,
        None => {
            let saved = data_dir::master_key(&args.data_dir)?;
            MasterKey::parse_hex(&saved.value)
                .map_err(|e| format!("the master key saved in the data dir: {e}"))?
        }
    };
    let (admin_token, token_generated) = match &args.admin_token {
        Some(token) if token.trim().is_empty() => return Err("--admin-token: must not be empty".into()),
        Some(token) => (token.trim().to_owned(), false),
        None => {
            let saved = data_dir::admin_token(&args.data_dir)?;
            (saved.value, saved.generated)
        }
    };
    let store = Arc::new(
        SqliteStore::open(&database).map_err(|e| format!("--database-url {}: {e}", database.display()))?,
    );
    let node_id = data_dir::node_id(&args.data_dir)?;
    let alert_secret = match &args.alert_signing_secret {
        Some(secret) if secret.trim().is_empty() => {
            return Err("--alert-signing-secret: must not be empty".into());
        }
        Some(secret) => secret.trim().to_owned(),
        None => data_dir::alert_signing_secret(&args.data_dir)?,
    };
    let spool_dir = args.data_dir.join("spool");
    let spool = Arc::new(Spool::open(&spool_dir).map_err(|e| format!("{}: {e}", spool_dir.display()))?);

    let counters = Counters::new(&node_id);
    let shared_counters: Arc<dyn SharedCounters> = match &args.redis_url {
        None => Arc::new(InProcess::new(StoreOptions::default())),
        Some(url) => {
            Arc::new(Redis::new(url, StoreOptions::default()).map_err(|e| format!("--redis-url: {e}"))?)
        }
    };
    let gateway = Gateway::new(config, &spool, &node_id, Arc::clone(&counters));
    let publish_to = gateway.clone();
    let control = Control::new(
        store.clone(),
        store.clone(),
        master_key,
        &admin_token,
        Arc::new(move |snapshot| publish_to.install_snapshot(snapshot)),
    );
    control.reconcile_with(counters.clone());
    let gateway_listener =
        TcpListener::bind(args.listen).await.map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let admin_listener = TcpListener::bind(args.admin_listen)
        .await
        .map_err(|e| format!("--admin-listen {}: {e}", args.admin_listen))?;
    control.publish_latest().await.map_err(|e| format!("loading the initial state: {e:?}"))?;
    // The ledger first gets what the spool still holds, then every cap's current window is rebuilt
    // from it, so that no cap is enforced on a partial figure after a restart.
    let sink = Arc::new(LedgerSink::new(
        store.clone(),
        Some(Alerts::start(store.clone(), store.clone(), &alert_secret)),
    ));
    if let Err(e) = spool.ship_available(sink.as_ref()).await {
        tracing::warn!(error = %e, "the spool could not be delivered at start-up; it will be retried");
    }
    seed_current_windows(&counters, &store).await?;

    let gateway_addr = gateway_listener.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = admin_listener.local_addr().map_err(|e| e.to_string())?;
    println!("recovea gateway: http://{gateway_addr}");
    if token_generated {
        println!(
            "admin token:     {admin_token}  (saved in {}; printed only this once)",
            args.data_dir.join(data_dir::ADMIN_TOKEN_FILE).display()
        );
    }
    // The admin URL comes last: scripts wait for it as the sign that both servers are up.
    println!("recovea admin:   http://{admin_addr}/admin/v1");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    // The shipper stops last, once the servers have drained and the spool is synced.
    let (stop_shipping, shipping_stopped) = tokio::sync::watch::channel(false);
    let shipper = {
        let spool = Arc::clone(&spool);
        tokio::spawn(async move { spool.ship(sink, wait(shipping_stopped)).await })
    };
    let syncer = tokio::spawn(sync_loop(
        Arc::clone(&counters),
        shared_counters,
        Duration::from_secs(1),
        wait(stopped.clone()),
    ));
    let rebuilder = tokio::spawn(rebuild_missing(
        Arc::clone(&counters),
        store.clone(),
        store.clone(),
        wait(stopped.clone()),
    ));
    let publisher =
        tokio::spawn(control.clone().keep_published(Duration::from_millis(250), wait(stopped.clone())));
    let admin = tokio::spawn(recovea_control::serve(control, admin_listener, wait(stopped.clone())));
    let node = tokio::spawn(recovea_gateway::serve(gateway, gateway_listener, wait(stopped)));
    shutdown_signal().await;
    tracing::info!("shutting down: draining in-flight requests");
    let _ = stop.send(true);
    let _ = tokio::join!(admin, node, publisher, syncer, rebuilder);
    // Every response is done: write out what they left in the spool's queue, then deliver it.
    spool.sync().await;
    let _ = stop_shipping.send(true);
    let _ = shipper.await;
    Ok(())
}

/// Seeds the counters with each cap's current window as the ledger has it.
async fn seed_current_windows(counters: &Arc<Counters>, store: &Arc<SqliteStore>) -> Result<(), String> {
    let store = Arc::clone(store);
    let counters = Arc::clone(counters);
    tokio::task::spawn_blocking(move || {
        let now = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        for org in store.list_orgs().map_err(|e| e.to_string())? {
            for record in store.caps(&org.id).map_err(|e| e.to_string())? {
                let window = CapWindow {
                    cap: record.cap.id.clone(),
                    start: record.cap.window.start(now),
                    end: record.cap.window.end(now),
                };
                if let Some(total) =
                    rebuild_window(store.as_ref(), store.as_ref(), &window).map_err(|e| e.to_string())?
                {
                    counters.seed(&window, total);
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| e.to_string())?
}

fn sqlite_path(args: &ServeArgs) -> Result<PathBuf, String> {
    match &args.database_url {
        None => Ok(args.data_dir.join("recovea.db")),
        Some(url) => match url.strip_prefix("sqlite://") {
            Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
            _ => Err(format!("--database-url {url:?}: `serve` takes sqlite://PATH")),
        },
    }
}

fn init_logging(filter: &str) -> Result<(), String> {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| format!("--log {filter:?}: {e}"))?;
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
