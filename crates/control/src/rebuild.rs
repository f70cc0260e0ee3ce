//! Counters tell the truth: a window the counter store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend.

use std::future::Future;
use std::sync::Arc;

use recovea_counters::{CapWindow, Counters};
use recovea_store::{ControlStore, ReceiptLedger};

/// Seeds `window` with the sum of its receipts in the ledger. `None`: the cap no longer exists.
pub fn rebuild_window(
    store: &dyn ControlStore,
    ledger: &dyn ReceiptLedger,
    window: &CapWindow,
) -> recovea_store::Result<Option<recovea_core::money::Nanos>> {
    let Some(record) = store.cap(&window.cap)? else { return Ok(None) };
    let cap = record.cap;
    ledger.spend(&cap.org_id, cap.key_id.as_ref(), window.start, window.end).map(Some)
}

/// Rebuilds every window the counters report missing, as they report them, until `shutdown`.
pub async fn rebuild_missing(
    counters: Arc<Counters>,
    store: Arc<dyn ControlStore>,
    ledger: Arc<dyn ReceiptLedger>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut missing = counters.subscribe_missing();
    loop {
        let windows = missing.borrow_and_update().clone();
        for window in windows {
            let (store, ledger, w) = (Arc::clone(&store), Arc::clone(&ledger), window.clone());
            match tokio::task::spawn_blocking(move || rebuild_window(store.as_ref(), ledger.as_ref(), &w))
                .await
            {
                Ok(Ok(Some(total))) => {
                    tracing::info!(cap_id = %window.cap, total = %total, "spend counter rebuilt from the ledger");
                    counters.seed(&window, total);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(cap_id = %window.cap, error = %e, "rebuilding a spend counter failed")
                }
                Err(e) => tracing::warn!(error = %e, "rebuilding a spend counter failed"),
            }
        }
        tokio::select! {
            changed = missing.changed() => if changed.is_err() { return },
            () = &mut shutdown => return,
        }
    }
}
