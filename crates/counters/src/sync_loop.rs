//! The confirm loop: about once an interval, push the node's increments and reservations and read totals.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use recovea_core::timestamp::Timestamp;
use tokio::time::MissedTickBehavior;

use crate::counters::{AT_THE_LINE, Counters, SOON};

/// How stale other nodes' spend may be while they spend on a window this node holds.
const WHILE_OTHERS_SPEND: Duration = Duration::from_millis(100);
use crate::shared::SharedCounters;

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
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    let mut last_sync = tokio::time::Instant::now();
    let mut last_exchange = last_sync;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
            gap = counters.sync_asked() => {
                // Woken early: keep the gap asked for, so that a busy cap near its line costs the
                // store at most a few dozen syncs a second per node.
                tokio::time::sleep_until(last_sync + gap.max(SOON).min(interval)).await;
            }
            () = counters.race_asked() => {
                // A request near an armed cap's line: exchange the racing windows alone, back to
                // back while such requests flow. A failure is the regular sync's to report.
                tokio::time::sleep_until(last_exchange.max(last_sync) + AT_THE_LINE).await;
                last_exchange = tokio::time::Instant::now();
                if let Err(error) = counters.exchange_racing(shared.as_ref(), clock()).await {
                    tracing::debug!(%error, "the racing windows could not be exchanged");
                }
                continue;
            }
        }
        last_sync = tokio::time::Instant::now();
        let result = counters.sync_with(shared.as_ref(), clock()).await;
        match result {
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
