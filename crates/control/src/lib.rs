//! The control plane: the admin API over the control store, and the snapshots it publishes to the
//! serving node(s) after every change.
//!
//! **Invariant:** the control plane is never on the request path. Nodes decide from the snapshot it
//! publishes; if it stops, they keep serving what they last received.

mod admin;
pub mod client;
mod error;
pub mod random;
mod server;
mod snapshot;

use std::sync::Arc;

use recovea_core::Snapshot;
use recovea_core::crypto::MasterKey;
use recovea_store::ControlStore;

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
    master_key: MasterKey,
    admin_token_hash: [u8; 32],
    publish: Publish,
    /// Serialises rebuilds so that an older state is never published after a newer one.
    publishing: tokio::sync::Mutex<u64>,
}

impl Control {
    pub fn new(
        store: Arc<dyn ControlStore>,
        master_key: MasterKey,
        admin_token: &str,
        publish: Publish,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                master_key,
                admin_token_hash: sha256(admin_token.as_bytes()),
                publish,
                publishing: tokio::sync::Mutex::new(0),
            }),
        }
    }

    /// Rebuilds the snapshot from the store and publishes it, unless a newer one already went out.
    pub async fn publish_latest(&self) -> Result<(), ApiError> {
        let mut published = self.inner.publishing.lock().await;
        let store = Arc::clone(&self.inner.store);
        let state =
            tokio::task::spawn_blocking(move || store.state()).await.map_err(ApiError::internal)??;
        if state.version < *published {
            return Ok(());
        }
        let version = state.version;
        let snapshot = build_snapshot(&state, &self.inner.master_key);
        (self.inner.publish)(Arc::new(snapshot));
        *published = version;
        Ok(())
    }
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}
