//! Receipt ingest: batches from nodes' spools into the ledger, idempotent by receipt id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink};
use recovea_store::ReceiptLedger;

/// Writes delivered batches into the ledger. In `serve` a node's spool ships straight here.
pub struct LedgerSink {
    ledger: Arc<dyn ReceiptLedger>,
}

impl LedgerSink {
    pub fn new(ledger: Arc<dyn ReceiptLedger>) -> Self {
        Self { ledger }
    }
}

impl ReceiptSink for LedgerSink {
    fn deliver<'a>(
        &'a self,
        batch: &'a [Receipt],
    ) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send + 'a>> {
        let ledger = Arc::clone(&self.ledger);
        let batch = batch.to_vec();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || ledger.insert_receipts(&batch))
                .await
                .map_err(|e| DeliveryError(e.to_string()))?
                .map(|_| ())
                .map_err(|e| DeliveryError(e.to_string()))
        })
    }
}
