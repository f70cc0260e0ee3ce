//! The confirm loop: about once an interval, push the node's increments and reservations and read totals.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use recovea_core::timestamp::Timestamp;
use tokio::time::Instant;

use crate::counters::{Counters, SOON};
use crate::shared::SharedCounters;

/// How stale other nodes' spend may be while they spend on a window this node holds.
const WHILE_OTHERS_SPEND: Duration = Duration::from_millis(100);

/// Runs until `shutdown`: syncs `counters` with `shared` every `interval` (at once when a window is
/// seen for the first time), then makes one last attempt so that a graceful stop leaves no
/// increment behind (signal `shutdown` after draining requests). A failed sync leaves the
/// counters unconfirmed and their increments pending for the next try.
pub async fn sync_loop(
    counters: Arc<Counters>,
    shared: Arc<dyn SharedCounters>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    sync_loop_with_clock(counters, shared, interval, shutdown, || {
        Timestamp::from_system_time(SystemTime::now())
    })
    .await;
}

/// [`sync_loop`] with the wall clock passed in (tests drive it with paused time).
pub async fn sync_loop_with_clock(
    counters: Arc<Counters>,
    shared: Arc<dyn SharedCounters>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
    clock: impl Fn() -> Timestamp,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let interval = interval.max(Duration::from_millis(1));
    let mut failing = false;
    let mut last_sync = Instant::now();
    // The first sync at once; then every interval, or sooner when asked.
    let mut due = last_sync;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(due) => {}
            gap = counters.sync_asked() => {
                // Keep at least SOON between syncs, so that a busy cap costs the store at most a
                // few dozen full syncs a second per node.
                due = due.min(last_sync + gap.max(SOON));
                continue;
            }
        }
        last_sync = Instant::now();
        due = last_sync + interval;
        match counters.sync_with(shared.as_ref(), clock()).await {
            Ok(outcome) => {
                if outcome.others_active {
                    // Other nodes are spending on a window this node holds: follow them closely
                    // even while this node is idle, so that its next burst of requests is not
                    // decided on a view a whole tick old.
                    counters.sync_within(WHILE_OTHERS_SPEND);
                }
                if std::mem::replace(&mut failing, false) {
                    tracing::info!(windows = outcome.windows, "spend counters confirmed again");
                }
                if !outcome.missing.is_empty() {
                    tracing::info!(
                        windows = outcome.missing.len(),
                        "spend counters missing from the store: rebuild from the ledger"
                    );
                }
            }
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "spend counters cannot be confirmed; increments are kept for the next sync");
            }
            Err(error) => tracing::debug!(%error, "spend counters still unconfirmed"),
        }
    }
    match tokio::time::timeout(interval, counters.sync_with(shared.as_ref(), clock())).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::warn!(%error, "last sync of the spend counters failed"),
        Err(_) => tracing::warn!("last sync of the spend counters timed out"),
    }
}
