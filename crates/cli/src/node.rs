//! `recovea node`: a gateway node fed by a control plane. It holds no database credentials: its
//! state comes from the feed (or, while the control plane is away at start, from the state it
//! saved), its receipts go to the control plane's ingest, and its counters to Redis.

use std::sync::Arc;

use recovea_core::receipt::ReceiptSink;
use recovea_gateway::spool::Keeps;
use recovea_gateway::{ControlLink, Gateway, follow_book, follow_feed};

use crate::args::{NodeArgs, init_logging, operator_token, parse_master_key, read_file, shutdown_signal};
use crate::data_dir;
use crate::failure::{Failure, Problems};
use crate::lifecycle::{Lifecycle, NodeParts};
use crate::wiring::{bind, counters, open_spool, rate_share, serve_metrics_apart};

pub(crate) async fn run(args: NodeArgs) -> Result<(), Failure> {
    let _log = init_logging(&args.common)?;
    let shutdown = shutdown_signal();
    // Every setting is checked before anything starts: a start-up that fails names each wrong one.
    let mut problems = Problems::default();
    let config = problems.check(args.gateway.config());
    let master_key = problems.check(parse_master_key(&args.master_key));
    let node_token = problems.check(operator_token("node-token", &args.node_token));
    let ca = problems.check(read_file("control-ca-file", args.control_ca_file.as_deref()));
    let link = match (node_token, ca) {
        (Some(node_token), Some(ca)) => {
            problems.check(ControlLink::new(&args.control_url, &node_token, ca.as_deref()))
        }
        _ => None,
    };
    let redis = problems.check(args.gateway.redis());
    let (Some(config), Some(master_key), Some(link), Some(redis)) = (config, master_key, link, redis) else {
        return Err(problems.into());
    };
    let link = Arc::new(link);
    let data_dir = &args.common.data_dir;
    data_dir::create(data_dir)?;
    let node_id = data_dir::node_id(data_dir)?;
    // The control plane's ingest is sent the receipts' text alone.
    let spool = open_spool(data_dir, args.gateway.spool_memory(), Keeps::Text)?;
    let (counters, shared_counters) = counters(&node_id, redis.as_ref())?;
    let rate_share = rate_share(redis.as_ref())?;
    let gateway = Gateway::new(config, &spool, &node_id, Arc::clone(&counters));
    let saved = gateway.boot_from_saved(data_dir, &master_key);
    gateway.boot_book_from_saved(data_dir);
    let listener = bind("listen", args.gateway.listen).await?;
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
