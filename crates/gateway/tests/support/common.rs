//! What the gateway's in-process tests share: a receipt sink in memory and a temporary directory.
//! Included by each test file with `#[path]`.

#![allow(dead_code)]

use std::sync::Arc;

use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink, SerializedReceipt};
use recovea_gateway::Gateway;
use recovea_gateway::spool::Spool;

/// Receipts as the ledger would get them.
#[derive(Default)]
pub struct MemorySink(pub std::sync::Mutex<Vec<Receipt>>);

impl ReceiptSink for MemorySink {
    fn deliver(
        &self,
        batch: Vec<SerializedReceipt>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DeliveryError>> + Send + '_>> {
        self.0.lock().expect("lock").extend(batch.into_iter().map(SerializedReceipt::into_receipt));
        Box::pin(async { Ok(()) })
    }
}

/// Ships `spool`'s receipts into memory for the rest of the test.
pub fn ship_to_memory(spool: Arc<Spool>) -> Arc<MemorySink> {
    let receipts = Arc::new(MemorySink::default());
    let sink: Arc<dyn ReceiptSink> = receipts.clone();
    tokio::spawn(async move { spool.ship(sink, std::future::pending()).await });
    receipts
}

/// Serves `gateway` on a port of its own until the returned sender is dropped: its URL, and that
/// sender.
pub async fn serve(gateway: &Gateway) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(recovea_gateway::serve(gateway.clone(), listener, async move {
        let _ = stopped.await;
    }));
    (url, stop)
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
