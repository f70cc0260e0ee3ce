//! A gateway node's life in a process, written once for `serve` and `node`: its tasks started (the
//! shipper, the counters' sync and rebuild, rate sharing, the server, the tracer), then, at
//! shutdown, ended in the one order that loses no receipt: every task but the shipper stops (the
//! server drains its requests), the spool writes out what they left in its queue, and only then
//! the shipper delivers what is left and stops, the tracer with it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use recovea_core::receipt::ReceiptSink;
use recovea_counters::{Counters, RateShare, SharedCounters, SpendSource, rebuild_missing, sync_loop};
use recovea_gateway::spool::Spool;
use recovea_gateway::{Gateway, Server};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::wiring::{RATE_SHARE_INTERVAL, Stop};

/// How often a node syncs its counters when nothing asks sooner.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// What a node is made of, and where its receipts and rebuilt windows come from.
pub(crate) struct NodeParts {
    pub(crate) gateway: Gateway,
    pub(crate) spool: Arc<Spool>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) shared_counters: Arc<dyn SharedCounters>,
    pub(crate) rate_share: Option<Arc<dyn RateShare>>,
    /// Where the spool delivers: the control plane's ingest, or the ledger in this process.
    pub(crate) sink: Arc<dyn ReceiptSink>,
    /// Where a window the counter store lacks is rebuilt from.
    pub(crate) spend: Arc<dyn SpendSource>,
}

/// The node's tasks, and the process's own that stop with them (the feed, the admin API...).
pub(crate) struct Lifecycle {
    stop: Stop,
    stop_shipping: Stop,
    spool: Option<Arc<Spool>>,
    shipper: Option<JoinHandle<()>>,
    /// Awaited first: it stops sharing before the rest winds down.
    rate_sharer: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    tracer: Option<JoinHandle<()>>,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        Self {
            stop: Stop::new(),
            stop_shipping: Stop::new(),
            spool: None,
            shipper: None,
            rate_sharer: None,
            tasks: Vec::new(),
            tracer: None,
        }
    }

    /// Resolves when the servers and every task but the shipper are to stop.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stop.stopped()
    }

    /// Runs `task` until the shutdown; it is awaited before the spool is synced.
    pub(crate) fn spawn<T: Send + 'static>(&mut self, task: impl Future<Output = T> + Send + 'static) {
        self.tasks.push(tokio::spawn(async move {
            task.await;
        }));
    }

    /// Starts the node: the shipper, the counters' sync and rebuild, rate sharing, the server on
    /// `listener` and the tracer.
    pub(crate) fn start_node(&mut self, node: NodeParts, listener: TcpListener) -> Result<(), String> {
        let NodeParts { gateway, spool, counters, shared_counters, rate_share, sink, spend } = node;
        let (shipping, stopped) = (Arc::clone(&spool), self.stop_shipping.stopped());
        self.shipper = Some(tokio::spawn(async move { shipping.ship(sink, stopped).await }));
        self.spool = Some(spool);
        self.spawn(sync_loop(Arc::clone(&counters), shared_counters, SYNC_INTERVAL, self.stopped()));
        self.spawn(rebuild_missing(counters, spend, self.stopped()));
        self.rate_sharer = rate_share
            .map(|share| tokio::spawn(gateway.share_rate_limits(share, RATE_SHARE_INTERVAL, self.stopped())));
        let server = Server::start(&gateway, listener)
            .map_err(|e| format!("starting the gateway's connection threads: {e}"))?;
        self.spawn(server.serve(self.stopped()));
        // Stops with the shipper, after the drained requests queued their spans.
        self.tracer = gateway.export_traces(self.stop_shipping.stopped()).map(tokio::spawn);
        Ok(())
    }

    /// Waits for `shutdown`, then ends everything in order (see the module's doc).
    pub(crate) async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        self.stop.stop();
        if let Some(rate_sharer) = self.rate_sharer {
            let _ = rate_sharer.await;
        }
        for task in self.tasks {
            let _ = task.await;
        }
        // Every response is done: write out what they left in the spool's queue, then deliver it.
        if let Some(spool) = &self.spool {
            spool.sync().await;
        }
        self.stop_shipping.stop();
        if let Some(shipper) = self.shipper {
            let _ = shipper.await;
        }
        if let Some(tracer) = self.tracer {
            let _ = tracer.await;
        }
    }
}
