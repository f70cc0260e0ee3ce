//! Counters tell the truth: a window the counter store does not hold (a restart, a flush, a new
//! cap) is rebuilt from the ledger, the source of truth for spend. The counters hold what nodes
//! meter; deferred jobs' settled costs live in the book of jobs, which every line counts beside
//! them, so a rebuild leaves those out (`JobStore::counted_spend`), as it leaves out the receipts
//! the store's writers already hold (`Unseeded::counted`).

use std::sync::Arc;
use std::time::Duration;

use recovea_core::ids::CapId;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{Counted, Rebuilt, SpendSource, Unseeded, WindowSpendFuture};
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
    cap: &CapId,
    (start, end): (Timestamp, Timestamp),
    counted: &[Counted],
) -> recovea_store::Result<Option<Rebuilt>> {
    let Some(record) = sources.store.cap(cap)? else { return Ok(None) };
    let cap = record.cap;
    let (org, key) = (&cap.org_id, cap.key_id.as_ref());
    let counted: Vec<(&str, recovea_core::Timestamp)> =
        counted.iter().map(|c| (c.node_id.as_str(), c.since)).collect();
    let read = match &sources.jobs {
        Some(jobs) => jobs.counted_spend(org, key, start, end, &counted)?,
        None => sources.ledger.spend_uncounted(org, key, start, end, &counted)?,
    };
    Ok(Some(Rebuilt { total: read.spend, last_start: read.last_start }))
}

/// The ledger as a [`SpendSource`]: `serve` rebuilds its counters straight from it, each window
/// within the control plane's store limit (see [`crate::bounded`]). A window the database does not
/// answer for in time fails the rebuild, which the counters retry at their next sync.
pub struct LedgerSpend {
    sources: SpendSources,
    limit: Duration,
}

impl LedgerSpend {
    pub fn new(sources: SpendSources, limit: Duration) -> Self {
        Self { sources, limit }
    }
}

impl SpendSource for LedgerSpend {
    fn window_spend<'a>(&'a self, windows: &'a [Unseeded]) -> WindowSpendFuture<'a> {
        Box::pin(async move {
            let mut rebuilt = Vec::with_capacity(windows.len());
            // One bounded call per window, as the node endpoint makes them: a long list on a slow
            // but answering database is not cut short, a frozen one fails at the first window.
            for unseeded in windows {
                let (sources, unseeded) = (self.sources.clone(), unseeded.clone());
                let window = crate::bounded::off_thread(self.limit, move || {
                    rebuild_window(&sources, &unseeded.window.cap, unseeded.window.span(), &unseeded.counted)
                })
                .await
                .map_err(|e| e.to_string())?;
                rebuilt.push(window);
            }
            Ok(rebuilt)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::frozen::FrozenStore;
    use recovea_counters::CapWindow;
    use recovea_store::SqliteStore;

    #[tokio::test]
    async fn a_rebuild_on_a_frozen_database_fails_within_the_limit_and_succeeds_once_it_thaws() {
        let dir = std::env::temp_dir().join(format!("recovea-rebuild-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("dir");
        let sqlite = Arc::new(SqliteStore::open(&dir.join("db")).expect("store"));
        let store = FrozenStore::new(sqlite.clone());
        let sources = SpendSources { store: store.clone(), ledger: sqlite, jobs: None };
        let limit = Duration::from_millis(100);
        let spend = LedgerSpend::new(sources, limit);
        let window = CapWindow {
            org: recovea_core::ids::OrgId::parse("org_a").expect("id"),
            cap: CapId::parse("cap_a").expect("id"),
            start: Timestamp(0),
            end: Timestamp(1),
        };
        let windows = [Unseeded { window, counted: Vec::new(), incarnation: 0 }];

        let thaw = store.freeze();
        let asked = std::time::Instant::now();
        // Well past the limit, well short of a hang: the rebuild loop waits on nothing longer.
        let answer = tokio::time::timeout(limit * 20, spend.window_spend(&windows))
            .await
            .expect("the rebuild answers while the database is frozen");
        assert!(answer.is_err(), "a frozen database rebuilds nothing: {answer:?}");
        assert!(asked.elapsed() < limit * 20);
        assert_eq!(store.held(), 1, "the rebuild asked the database");

        // The counters retry at their next sync: by then the database answers.
        drop(thaw);
        let rebuilt = spend.window_spend(&windows).await.expect("answers once thawed");
        assert_eq!(rebuilt, vec![None], "no such cap: nothing to seed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
