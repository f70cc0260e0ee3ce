//! What the gateway's in-process tests share: a receipt sink in memory and a temporary directory.
//! Included by each test file with `#[path]`.

#![allow(dead_code)]

use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink};

/// Receipts as the ledger would get them.
#[derive(Default)]
pub struct MemorySink(pub std::sync::Mutex<Vec<Receipt>>);

impl ReceiptSink for MemorySink {
    fn deliver<'a>(
        &'a self,
        batch: &'a [Receipt],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DeliveryError>> + Send + 'a>> {
        self.0.lock().expect("lock").extend_from_slice(batch);
        Box::pin(async { Ok(()) })
    }
}

/// A directory removed when the test ends.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "recovea-gateway-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
