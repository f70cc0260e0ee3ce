//! Receipt ingest: batches from nodes' spools into the ledger, idempotent by receipt id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::{Duration, SystemTime};

use recovea_core::receipt::{DeliveryError, ReceiptSink, SerializedReceipt};
use recovea_core::timestamp::Timestamp;

use crate::DEFAULT_STORE_LIMIT;
use crate::alerts::Alerts;
use crate::jobs::Jobs;
use recovea_store::ReceiptLedger;

/// Writes delivered batches into the ledger, then raises the cap alerts they cross. In `serve` a
/// node's spool ships straight here.
pub struct LedgerSink {
    ledger: Arc<dyn ReceiptLedger>,
    alerts: Option<Arc<Alerts>>,
    /// One batch at a time from insert to alerts: a batch's cost is added to the running totals
    /// exactly once only if no other batch lands between its insert and its evaluation.
    one_batch: Arc<std::sync::Mutex<()>>,
    /// A delivery that takes longer fails (and is sent again): the database is frozen or gone.
    limit: Duration,
    /// Where the jobs and batch files that receipts announce are recorded, and how long after its
    /// creation a job is first polled.
    jobs: Option<(Arc<Jobs>, Duration)>,
}

impl LedgerSink {
    pub fn new(ledger: Arc<dyn ReceiptLedger>, alerts: Option<Arc<Alerts>>) -> Self {
        Self {
            ledger,
            alerts,
            one_batch: Arc::new(std::sync::Mutex::new(())),
            limit: DEFAULT_STORE_LIMIT,
            jobs: None,
        }
    }

    /// Records the jobs and batch files the receipts announce in `jobs` (a job first polled
    /// `poll_after` its creation); a delivery is acknowledged only once they are recorded.
    pub fn with_jobs(mut self, jobs: Arc<Jobs>, poll_after: Duration) -> Self {
        self.jobs = Some((jobs, poll_after));
        self
    }

    /// A delivery that takes longer than `limit` fails, to be sent again.
    pub fn with_limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }
}

impl ReceiptSink for LedgerSink {
    fn deliver(
        &self,
        batch: Vec<SerializedReceipt>,
    ) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send + '_>> {
        let ledger = Arc::clone(&self.ledger);
        let alerts = self.alerts.clone();
        let one_batch = Arc::clone(&self.one_batch);
        let limit = self.limit;
        let jobs = self.jobs.clone();
        Box::pin(async move {
            let recording = jobs.clone();
            let recorded = crate::bounded::off_thread(limit, move || {
                let _one_batch = one_batch.lock().unwrap_or_else(|p| p.into_inner());
                let inserted = ledger.insert_receipts(&batch)?;
                if let Some(alerts) = alerts {
                    let now = Timestamp::from_system_time(SystemTime::now());
                    alerts.evaluate_batch(&batch, inserted == batch.len(), now);
                }
                // Replayed, a batch records its jobs again: once each, by their keys.
                match recording {
                    Some((jobs, poll_after)) => jobs.record(&batch, poll_after),
                    None => Ok(false),
                }
            })
            .await
            .map_err(|e| DeliveryError::Failed(e.to_string()))?;
            if recorded && let Some((jobs, _)) = jobs {
                // The book nodes count changed: read it back now rather than at the next look.
                if let Err(e) = jobs.refresh().await {
                    tracing::warn!(error = %e, "reading the book of jobs after new jobs failed");
                }
            }
            Ok(())
        })
    }
}
