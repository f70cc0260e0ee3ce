//! `recovea node`: a gateway node fed by a control plane. It holds no database credentials: its
//! state comes from the feed (or, while the control plane is away at start, from the state it
//! saved), its receipts go to the control plane's ingest, and its counters to Redis.

use std::sync::Arc;

use recovea_core::receipt::ReceiptSink;
use recovea_gateway::spool::Keeps;
use recovea_gateway::{ControlLink, Gateway, follow_book, follow_feed};
use tokio::net::TcpListener;

use crate::args::{NodeArgs, init_logging, operator_token, parse_master_key, read_file, shutdown_signal};
use crate::data_dir;
use crate::lifecycle::{Lifecycle, NodeParts};
use crate::wiring::{counters, open_spool, rate_share, serve_metrics_apart};

pub(crate) async fn run(args: NodeArgs) -> Result<(), String> {
    let _log = init_logging(&args.common)?;
    let shutdown = shutdown_signal();
    let config = args.gateway.config()?;
    let master_key = parse_master_key(&args.master_key)?;
    let node_token = operator_token("--node-token", &args.node_token)?;
    let ca = read_file("--control-ca-file", args.control_ca_file.as_deref())?;
    let link =
        Arc::new(ControlLink::new(&args.control_url, &node_token, ca.as_deref()).map_err(|e| e.to_string())?);
    let data_dir = &args.common.data_dir;
    data_dir::create(data_dir)?;
    let node_id = data_dir::node_id(data_dir)?;
    // The control plane's ingest is sent the receipts' text alone.
    let spool = open_spool(data_dir, args.gateway.spool_memory(), Keeps::Text)?;
    let redis = args.gateway.redis()?;
    let (counters, shared_counters) = counters(&node_id, redis.as_ref())?;
    let rate_share = rate_share(redis.as_ref())?;
    let gateway = Gateway::new(config, &spool, &node_id, Arc::clone(&counters));
    let saved = gateway.boot_from_saved(data_dir, &master_key);
    gateway.boot_book_from_saved(data_dir);
    let listener = TcpListener::bind(args.gateway.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.gateway.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("recovea node {node_id}: http://{addr}");

    let mut life = Lifecycle::new();
    serve_metrics_apart(&args.gateway, &gateway, life.stopped()).await?;
    life.spawn(follow_feed(
        gateway.clone(),
        Arc::clone(&link),
        master_key,
        node_id,
        data_dir.clone(),
        saved,
        life.stopped(),
    ));
    life.spawn(follow_book(gateway.clone(), Arc::clone(&link), data_dir.clone(), life.stopped()));
    let parts = NodeParts {
        gateway,
        spool,
        counters,
        shared_counters,
        rate_share,
        sink: Arc::clone(&link) as Arc<dyn ReceiptSink>,
        spend: link,
    };
    life.start_node(parts, listener)?;
    life.run_until(shutdown).await;
    Ok(())
}
