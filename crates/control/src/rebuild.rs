//! Counters tell the truth: a window the counter store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend. The counters hold what nodes
//! meter; deferred jobs' settled costs live in the book of jobs, which every line counts beside
//! them, so a rebuild leaves those out (`JobStore::counted_spend`), as it leaves out the receipts
//! the store's writers already hold (`Unseeded::counted`).

use std::sync::Arc;

use recovea_counters::{CapWindow, Counted, Rebuilt, SpendSource, Unseeded, WindowSpendFuture};
use recovea_store::{ControlStore, JobStore, ReceiptLedger};

/// Where a window's spend is rebuilt from.
#[derive(Clone)]
pub struct SpendSources {
    pub store: Arc<dyn ControlStore>,
    pub ledger: Arc<dyn ReceiptLedger>,
    /// Without it, the ledger's whole sum (no job was ever settled).
    pub jobs: Option<Arc<dyn JobStore>>,
}

/// The seed of an unseeded window: the sum of its receipts in the ledger, jobs' settlements left
/// out (the book holds them), and so are the counted nodes' receipts from their `since` (their
/// writers hold them). `None`: the cap no longer exists.
pub fn rebuild_window(
    sources: &SpendSources,
    window: &CapWindow,
    counted: &[Counted],
) -> recovea_store::Result<Option<Rebuilt>> {
    let Some(record) = sources.store.cap(&window.cap)? else { return Ok(None) };
    let cap = record.cap;
    let (org, key) = (&cap.org_id, cap.key_id.as_ref());
    let counted: Vec<(&str, recovea_core::Timestamp)> =
        counted.iter().map(|c| (c.node_id.as_str(), c.since)).collect();
    let read = match &sources.jobs {
        Some(jobs) => jobs.counted_spend(org, key, window.start, window.end, &counted)?,
        None => sources.ledger.spend_uncounted(org, key, window.start, window.end, &counted)?,
    };
    Ok(Some(Rebuilt { total: read.spend, last_start: read.last_start }))
}

/// The ledger as a [`SpendSource`]: `serve` rebuilds its counters straight from it.
pub struct LedgerSpend(pub SpendSources);

impl SpendSource for LedgerSpend {
    fn window_spend<'a>(&'a self, windows: &'a [Unseeded]) -> WindowSpendFuture<'a> {
        let (sources, windows) = (self.0.clone(), windows.to_vec());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                windows
                    .iter()
                    .map(|u| rebuild_window(&sources, &u.window, &u.counted))
                    .collect::<recovea_store::Result<Vec<_>>>()
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
        })
    }
}
