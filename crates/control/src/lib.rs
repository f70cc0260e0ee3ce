//! The control plane: the admin API over the control store, and the snapshots it publishes to the
//! serving node(s) after every change.
//!
//! **Invariant:** the control plane is never on the request path. Nodes decide from the snapshot it
//! publishes; if it stops, they keep serving what they last received.

mod admin;
pub mod alerts;
pub mod client;
mod error;
pub mod ingest;
pub mod random;
pub mod rebuild;
mod server;
mod snapshot;

use std::sync::Arc;

use recovea_core::Snapshot;
use recovea_core::crypto::MasterKey;
use recovea_core::snapshot::Prices;
use recovea_store::{ControlStore, ReceiptLedger};

pub use error::ApiError;
pub use server::serve;
pub use snapshot::build_snapshot;

/// Receives every new snapshot; in `recovea serve` it installs it straight into the gateway.
pub type Publish = Arc<dyn Fn(Arc<Snapshot>) + Send + Sync>;

#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ControlStore>,
    ledger: Arc<dyn ReceiptLedger>,
    /// The serving node's counters, when they are in this process: the spend report compares them
    /// with the ledger.
    counters: std::sync::OnceLock<Arc<recovea_counters::Counters>>,
    /// The prices of the last published snapshot, for `GET /prices`.
    prices: std::sync::Mutex<Prices>,
    master_key: MasterKey,
    /// Compared as hashes, so the comparison takes the same time whatever the presented token.
    admin_token_hash: recovea_core::keys::KeyHash,
    publish: Publish,
    /// The version last published; the lock serialises rebuilds so that an older state is never
    /// published after a newer one.
    published: tokio::sync::Mutex<Option<u64>>,
}

impl Control {
    pub fn new(
        store: Arc<dyn ControlStore>,
        ledger: Arc<dyn ReceiptLedger>,
        master_key: MasterKey,
        admin_token: &str,
        publish: Publish,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                ledger,
                counters: std::sync::OnceLock::new(),
                prices: std::sync::Mutex::new(Prices::default()),
                master_key,
                admin_token_hash: recovea_core::keys::hash_secret(admin_token),
                publish,
                published: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The counters of the node in this process: a new cap's window is seeded from the ledger
    /// before the cap is published, and the spend report reconciles them with the ledger.
    pub fn reconcile_with(&self, counters: Arc<recovea_counters::Counters>) {
        let _ = self.inner.counters.set(counters);
    }

    /// Rebuilds the snapshot from the store and publishes it, unless it is already out.
    pub async fn publish_latest(&self) -> Result<(), ApiError> {
        let mut published = self.inner.published.lock().await;
        let store = Arc::clone(&self.inner.store);
        let state =
            tokio::task::spawn_blocking(move || store.state()).await.map_err(ApiError::internal)??;
        if published.is_some_and(|version| state.version <= version) {
            return Ok(());
        }
        let snapshot = build_snapshot(&state, &self.inner.master_key);
        *self.inner.prices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            snapshot.prices().clone();
        (self.inner.publish)(Arc::new(snapshot));
        *published = Some(state.version);
        Ok(())
    }

    /// Republishes whenever the store's version moves past the published one, until `shutdown`.
    /// Admin changes publish at once; this catches what they could not (a failed rebuild) and
    /// changes made by anyone else sharing the store.
    pub async fn keep_published(
        self,
        interval: std::time::Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut shutdown => return,
            }
            let store = Arc::clone(&self.inner.store);
            let current = match tokio::task::spawn_blocking(move || store.version()).await {
                Ok(Ok(version)) => version,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading the store's version failed");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the store's version failed");
                    continue;
                }
            };
            let published = *self.inner.published.lock().await;
            if published.is_none_or(|version| current > version)
                && let Err(e) = self.publish_latest().await
            {
                tracing::warn!(error = ?e, "publishing the latest state failed; retrying");
            }
        }
    }
}
