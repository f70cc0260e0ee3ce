//! `recovea control`: the control plane alone, on SQLite or PostgreSQL. Several replicas may share
//! one PostgreSQL: each polls the store's version and feeds its nodes whatever any of them changed.

use std::sync::Arc;
use std::time::Duration;

use recovea_control::Control;
use recovea_control::alerts::Alerts;
use recovea_control::ingest::LedgerSink;
use recovea_control::jobs::Jobs;

use crate::args::{ControlArgs, init_logging, operator_token, parse_master_key, shutdown_signal};
use crate::data_dir;
use crate::failure::{Failure, Problems};
use crate::wiring::{AdminSettings, Stop, bind, open_stores, poller_settings, sign_on};

pub(crate) async fn run(args: ControlArgs) -> Result<(), Failure> {
    let _log = init_logging(&args.common)?;
    let shutdown = shutdown_signal();
    // Every setting is checked before anything starts: a start-up that fails names each wrong one.
    let mut problems = Problems::default();
    let master_key = problems.check(parse_master_key(&args.master_key));
    let admin = problems.check(AdminSettings::check(&args.admin));
    let node_token = problems
        .check(args.node_token.as_deref().map(|token| operator_token("node-token", token)).transpose());
    let network = problems.check(args.providers.network());
    let (Some(master_key), Some(admin), Some(node_token), Some(network)) =
        (master_key, admin, node_token, network)
    else {
        return Err(problems.into());
    };
    let data_dir = &args.common.data_dir;
    data_dir::create(data_dir)?;
    let (admin_token, token_generated) = admin.admin_token(data_dir)?;
    let alert_secret = admin.alert_signing_secret(data_dir)?;
    let url = args.admin.database_url.clone();
    let data = data_dir.clone();
    let bounds = admin.bounds;
    let stores = tokio::task::spawn_blocking(move || open_stores(url.as_deref(), &data, true, bounds))
        .await
        .map_err(|e| e.to_string())??;
    let limit = args.admin.store_limit();
    let jobs = Jobs::new(Arc::clone(&stores.jobs), limit);
    let control =
        Control::new(stores.store.clone(), stores.ledger.clone(), master_key, &admin_token, Arc::new(|_| {}))
            .with_store_limit(limit)
            .with_jobs(Arc::clone(&jobs));
    let control = match sign_on(admin.sign_on) {
        Some(sign_on) => control.with_sign_on(sign_on),
        None => control,
    };
    let alerts = Alerts::start(stores.store.clone(), stores.ledger.clone(), &alert_secret, limit);
    let poll_interval = args.jobs.job_poll_interval;
    // Nodes are always served: each presents a node credential issued through the admin API, or
    // the shared --node-token when one is set.
    if node_token.is_none() {
        tracing::info!(
            "no --node-token: only nodes presenting a node credential can follow this control plane"
        );
    }
    let sink = Arc::new(
        LedgerSink::new(stores.ledger.clone(), Some(Arc::clone(&alerts)))
            .with_limit(limit)
            .with_jobs(Arc::clone(&jobs), poll_interval),
    );
    control.serve_nodes(node_token.as_deref(), sink);
    let poller = poller_settings(poll_interval, &args.providers, &network, Some(alerts));
    control.publish_latest().await.map_err(|e| format!("loading the initial state: {e:?}"))?;
    jobs.refresh().await.map_err(|e| format!("reading the book of jobs: {e}"))?;
    let listener = bind("admin-listen", args.admin.admin_listen).await?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if token_generated {
        println!(
            "admin token:     {admin_token}  (saved in {}; printed only this once)",
            data_dir.join(data_dir::ADMIN_TOKEN_FILE).display()
        );
    }
    println!("recovea admin:   http://{addr}/admin/v1");

    let stop = Stop::new();
    let publisher = tokio::spawn(control.clone().keep_published(Duration::from_millis(250), stop.stopped()));
    let book_keeper = tokio::spawn(Arc::clone(&jobs).keep_fresh(stop.stopped()));
    let job_poller = tokio::spawn(control.clone().poll_jobs(poller, stop.stopped()));
    let server = tokio::spawn(recovea_control::serve(control, listener, stop.stopped()));
    shutdown.await;
    tracing::info!("shutting down");
    stop.stop();
    let _ = tokio::join!(server, publisher, book_keeper, job_poller);
    Ok(())
}
