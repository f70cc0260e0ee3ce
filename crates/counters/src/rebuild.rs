//! Counters tell the truth: a window the shared store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend, through a [`SpendSource`].
//!
//! The ledger lags the nodes (receipts wait in their spools), and the nodes' writers push all they
//! ever counted to a store that lost their records, so the two are joined without a gap or an
//! overlap: each writer tells the store from when it holds every receipt of its node (its
//! `since`), and the seed is the ledger's sum less those receipts ([`Unseeded::counted`]). A
//! receipt is then counted by its node's writer or by the seed, never both, whether or not the
//! ledger has it yet.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;

use crate::counters::Counters;
use crate::shared::Unseeded;

/// What [`SpendSource::window_spend`] returns.
pub type WindowSpendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Option<Rebuilt>>, String>> + Send + 'a>>;

/// A window's seed as the ledger gave it (see [`Counters::seed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// Every receipt of the window but those the counted nodes' writers hold.
    pub total: Nanos,
    /// The latest start of a receipt the ledger held in the window, counted or not (`None`: it
    /// held none): no receipt that started after it is in `total`.
    pub last_start: Option<Timestamp>,
}

/// Where a window's spend is read from: the ledger itself in the control plane, the control
/// plane's spend endpoint on a node.
pub trait SpendSource: Send + Sync + 'static {
    /// One answer per window, in order: the sum of its receipts but those of each counted node
    /// that started at or after its `since` ([`Rebuilt`]), or `None` when its cap no longer
    /// exists. The text of an error is for operators' logs.
    fn window_spend<'a>(&'a self, windows: &'a [Unseeded]) -> WindowSpendFuture<'a>;
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
                Ok(rebuilt) => {
                    for (unseeded, rebuilt) in windows.iter().zip(rebuilt) {
                        if let Some(rebuilt) = rebuilt {
                            counters.seed(unseeded, rebuilt);
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
