//! Counters tell the truth: a window the shared store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend, through a [`SpendSource`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use recovea_core::money::Nanos;

use crate::counters::{CapWindow, Counters};

/// What [`SpendSource::window_spend`] returns.
pub type WindowSpendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Option<Nanos>>, String>> + Send + 'a>>;

/// Where a window's spend is read from: the ledger itself in the control plane, the control
/// plane's spend endpoint on a node.
pub trait SpendSource: Send + Sync + 'static {
    /// One answer per window, in order: the sum of its receipts, or `None` when its cap no longer
    /// exists. The text of an error is for operators' logs.
    fn window_spend<'a>(&'a self, windows: &'a [CapWindow]) -> WindowSpendFuture<'a>;
}

/// Seeds every window the counters report missing, as they report them, until `shutdown`. A
/// failed read is retried when the next sync reports the window missing again.
pub async fn rebuild_missing(
    counters: Arc<Counters>,
    source: Arc<dyn SpendSource>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut missing = counters.subscribe_missing();
    loop {
        let windows = missing.borrow_and_update().clone();
        if !windows.is_empty() {
            match source.window_spend(&windows).await {
                Ok(totals) => {
                    for (window, total) in windows.iter().zip(totals) {
                        if let Some(total) = total {
                            tracing::info!(cap_id = %window.cap, total = %total, "spend counter rebuilt from the ledger");
                            counters.seed(window, total);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rebuilding spend counters failed; retrying at the next sync")
                }
            }
        }
        tokio::select! {
            changed = missing.changed() => if changed.is_err() { return },
            () = &mut shutdown => return,
        }
    }
}
