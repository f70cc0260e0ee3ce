//! Receipt ingest: batches from nodes' spools into the ledger, idempotent by receipt id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::collections::BTreeSet;
use std::time::SystemTime;

use recovea_core::ids::OrgId;
use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink};
use recovea_core::timestamp::Timestamp;

use crate::alerts::Alerts;
use recovea_store::ReceiptLedger;

/// Writes delivered batches into the ledger, then raises the cap alerts they cross. In `serve` a
/// node's spool ships straight here.
pub struct LedgerSink {
    ledger: Arc<dyn ReceiptLedger>,
    alerts: Option<Arc<Alerts>>,
}

impl LedgerSink {
    pub fn new(ledger: Arc<dyn ReceiptLedger>, alerts: Option<Arc<Alerts>>) -> Self {
        Self { ledger, alerts }
    }
}

impl ReceiptSink for LedgerSink {
    fn deliver<'a>(
        &'a self,
        batch: &'a [Receipt],
    ) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send + 'a>> {
        let ledger = Arc::clone(&self.ledger);
        let alerts = self.alerts.clone();
        let batch = batch.to_vec();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                ledger.insert_receipts(&batch).map_err(|e| DeliveryError(e.to_string()))?;
                if let Some(alerts) = alerts {
                    let orgs: BTreeSet<OrgId> =
                        batch.iter().filter_map(|r| OrgId::parse(&r.org_id)).collect();
                    alerts.evaluate(&orgs, Timestamp::from_system_time(SystemTime::now()));
                }
                Ok(())
            })
            .await
            .map_err(|e| DeliveryError(e.to_string()))?
        })
    }
}
