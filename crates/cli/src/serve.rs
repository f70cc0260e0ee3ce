//! `recovea serve`: the admin API and one gateway node in one process, on embedded SQLite.

use std::sync::Arc;
use std::time::Duration;

use recovea_control::alerts::Alerts;
use recovea_control::ingest::LedgerSink;
use recovea_control::jobs::Jobs;
use recovea_control::rebuild::{LedgerSpend, SpendSources, rebuild_window};
use recovea_control::{Control, Publication};
use recovea_core::crypto::MasterKey;
use recovea_counters::{CapWindow, Counters, Unseeded};
use recovea_gateway::Gateway;
use recovea_gateway::spool::Keeps;

use crate::allocator;
use crate::args::{ServeArgs, init_logging, parse_master_key, shutdown_signal};
use crate::data_dir;
use crate::failure::{Failure, Problems};
use crate::lifecycle::{Lifecycle, NodeParts};
use crate::wiring::{
    AdminSettings, Stores, bind, counters, open_spool, open_stores, poller_settings, rate_share,
    serve_metrics_apart, sign_on,
};

pub(crate) async fn run(args: ServeArgs) -> Result<(), Failure> {
    let _log = init_logging(&args.common)?;
    let shutdown = shutdown_signal();
    // Every setting is checked before anything starts: a start-up that fails names each wrong one.
    let mut problems = Problems::default();
    let config = problems.check(args.gateway.config());
    let admin = problems.check(AdminSettings::check(&args.admin));
    let given_key = problems.check(args.master_key.as_deref().map(parse_master_key).transpose());
    let redis = problems.check(args.gateway.redis());
    let (Some(config), Some(admin), Some(given_key), Some(redis)) = (config, admin, given_key, redis) else {
        return Err(problems.into());
    };
    let data_dir = &args.common.data_dir;
    data_dir::create(data_dir)?;
    let master_key = match given_key {
        Some(key) => key,
        None => {
            let saved = data_dir::master_key(data_dir)?;
            MasterKey::parse_hex(&saved.value)
                .map_err(|e| format!("the master key saved in the data dir: {e}"))?
        }
    };
    let stores = open_stores(args.admin.database_url.as_deref(), data_dir, false, admin.bounds)?;
    let jobs = Jobs::new(Arc::clone(&stores.jobs), args.admin.store_limit());
    let Stores { store, ledger, .. } = stores;
    let (admin_token, token_generated) = admin.admin_token(data_dir)?;
    let node_id = data_dir::node_id(data_dir)?;
    let alert_secret = admin.alert_signing_secret(data_dir)?;
    let spool = open_spool(data_dir, args.gateway.spool_memory(), Keeps::Receipts)?;

    let (counters, shared_counters) = counters(&node_id, redis.as_ref())?;
    let rate_share = rate_share(redis.as_ref())?;
    let network = config.network().clone();
    let gateway = Gateway::new(config, &spool, &node_id, Arc::clone(&counters));
    let publish_to = gateway.clone();
    let opener = master_key.clone();
    let control = Control::new(
        store.clone(),
        ledger.clone(),
        master_key,
        &admin_token,
        Arc::new(move |publication| match publication {
            Publication::State(state) => {
                publish_to.install_state(&state, &opener);
                drop(state);
                allocator::release_freed_memory();
            }
            Publication::Current => publish_to.snapshot_current(),
        }),
    )
    .with_store_limit(args.admin.store_limit())
    .with_jobs(Arc::clone(&jobs));
    let control = match sign_on(admin.sign_on) {
        Some(sign_on) => control.with_sign_on(sign_on),
        None => control,
    };
    control.reconcile_with(counters.clone());
    // The node in this process counts every new book of jobs at once.
    let book_to = gateway.clone();
    jobs.install_into(Arc::new(move |book| book_to.install_book(book)));
    jobs.refresh().await.map_err(|e| format!("reading the book of jobs: {e}"))?;
    let gateway_listener = bind("listen", args.gateway.listen).await?;
    let admin_listener = bind("admin-listen", args.admin.admin_listen).await?;
    control.publish_latest().await.map_err(|e| format!("loading the initial state: {e:?}"))?;
    // The ledger first gets what the spool still holds, then every cap's current window is rebuilt
    // from it, so that no cap is enforced on a partial figure after a restart.
    let alerts = Alerts::start(store.clone(), ledger.clone(), &alert_secret, args.admin.store_limit());
    let poll_interval = args.jobs.job_poll_interval;
    let sink = Arc::new(
        LedgerSink::new(ledger.clone(), Some(Arc::clone(&alerts)))
            .with_limit(args.admin.store_limit())
            .with_jobs(Arc::clone(&jobs), poll_interval),
    );
    let poller = poller_settings(poll_interval, &args.gateway.providers, &network, Some(alerts));
    if let Err(e) = spool.ship_available(sink.as_ref()).await {
        tracing::warn!(error = %e, "the spool could not be delivered at start-up; it will be retried");
    }
    let sources = control.spend_sources();
    seed_current_windows(&counters, &sources).await?;

    let gateway_addr = gateway_listener.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = admin_listener.local_addr().map_err(|e| e.to_string())?;
    println!("recovea gateway: http://{gateway_addr}");
    if token_generated {
        println!(
            "admin token:     {admin_token}  (saved in {}; printed only this once)",
            data_dir.join(data_dir::ADMIN_TOKEN_FILE).display()
        );
    }
    let mut life = Lifecycle::new();
    serve_metrics_apart(&args.gateway, &gateway, life.stopped()).await?;
    // The admin URL comes last: scripts wait for it as the sign that both servers are up.
    println!("recovea admin:   http://{admin_addr}/admin/v1");

    life.spawn(Arc::clone(&jobs).keep_fresh(life.stopped()));
    life.spawn(control.clone().poll_jobs(poller, life.stopped()));
    life.spawn(control.clone().keep_published(Duration::from_millis(250), life.stopped()));
    life.spawn(recovea_control::serve(control, admin_listener, life.stopped()));
    let parts = NodeParts {
        gateway,
        spool,
        counters,
        shared_counters,
        rate_share,
        sink,
        spend: Arc::new(LedgerSpend::new(sources, args.admin.store_limit())),
    };
    life.start_node(parts, gateway_listener)?;
    life.run_until(shutdown).await;
    Ok(())
}

/// Seeds the counters with each cap's current window as the ledger has it (jobs' settlements
/// aside: the book of jobs counts those).
async fn seed_current_windows(counters: &Arc<Counters>, sources: &SpendSources) -> Result<(), String> {
    let (sources, counters) = (sources.clone(), Arc::clone(counters));
    tokio::task::spawn_blocking(move || {
        let store = &sources.store;
        let now = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        for org in store.list_orgs().map_err(|e| e.to_string())? {
            for record in store.caps(&org.id).map_err(|e| e.to_string())? {
                let window = CapWindow {
                    org: org.id.clone(),
                    cap: record.cap.id.clone(),
                    start: record.cap.window.start(now),
                    end: record.cap.window.end(now),
                };
                if let Some(rebuilt) =
                    rebuild_window(&sources, &window.cap, window.span(), &[]).map_err(|e| e.to_string())?
                {
                    counters.seed(&Unseeded::fresh(window), rebuilt);
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| e.to_string())?
}
