//! Counters tell the truth: a window the counter store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend.

use std::sync::Arc;

use recovea_counters::{CapWindow, SpendSource, WindowSpendFuture};
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

/// The ledger as a [`SpendSource`]: `serve` rebuilds its counters straight from it.
pub struct LedgerSpend {
    pub store: Arc<dyn ControlStore>,
    pub ledger: Arc<dyn ReceiptLedger>,
}

impl SpendSource for LedgerSpend {
    fn window_spend<'a>(&'a self, windows: &'a [CapWindow]) -> WindowSpendFuture<'a> {
        let (store, ledger, windows) = (Arc::clone(&self.store), Arc::clone(&self.ledger), windows.to_vec());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                windows
                    .iter()
                    .map(|w| rebuild_window(store.as_ref(), ledger.as_ref(), w))
                    .collect::<recovea_store::Result<Vec<_>>>()
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
        })
    }
}
