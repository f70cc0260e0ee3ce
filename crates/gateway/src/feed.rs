//! The node's side of the feed: follow the control plane's state (the whole state, then changes),
//! install each version as the serving snapshot, and keep the last one sealed on disk so that a
//! node restarted while the control plane is away still boots with state.
//!
//! When the feed stops, nothing changes for traffic: the node serves its last snapshot, stays
//! ready, and its snapshot age grows.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use recovea_core::crypto::{MasterKey, NONCE_LEN};
use recovea_core::feed::{FeedError, FeedMessage, FeedState, NodeStatus, Opened, SavedState};
use recovea_core::timestamp::Timestamp;
use tokio::sync::watch;

use crate::control_link::ControlLink;
use crate::node::Gateway;

pub mod book;

/// How long a poll may wait for a change. Every answer confirms the state, so this bounds the
/// snapshot age of a node whose feed is healthy.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// Beyond the wait, how long the answer may take (a whole state of millions of keys).
const POLL_SLACK: Duration = Duration::from_secs(60);
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// A feed that stays down is logged again this often, not at every retry.
const LOG_EVERY: Duration = Duration::from_secs(30);
/// The sealed file a node keeps its last state in, inside its data dir.
pub const SAVED_STATE_FILE: &str = "snapshot.sealed";

impl Gateway {
    /// Opens `state` and makes it the serving snapshot. A state that does not open is refused
    /// whole: the node keeps what it serves.
    pub fn install_state(&self, state: &FeedState, master_key: &MasterKey) -> bool {
        self.install_opened(state.version, state.open(master_key))
    }

    fn install_opened(&self, version: u64, opened: Result<Opened, FeedError>) -> bool {
        match opened {
            Ok(opened) => {
                for (org_id, name) in &opened.unopened {
                    tracing::error!(
                        org_id = %org_id,
                        provider = %name,
                        "a provider key does not open under this master key; the credential is not served"
                    );
                }
                self.install_snapshot(Arc::new(opened.snapshot));
                self.shared.metrics.feed_version(version);
                true
            }
            Err(e) => {
                tracing::error!(version, error = %e, "a state from the control plane was refused");
                false
            }
        }
    }

    /// Loads the state saved in `data_dir`, if any, and serves it; its age counts from when the
    /// control plane last confirmed it. Returns it, for [`follow_feed`] to continue from.
    pub fn boot_from_saved(&self, data_dir: &Path, master_key: &MasterKey) -> Option<SavedState> {
        let path = data_dir.join(SAVED_STATE_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "the saved state could not be read");
                return None;
            }
        };
        let Some(saved) = SavedState::open(master_key, &bytes) else {
            tracing::error!(path = %path.display(), "the saved state does not open under this master key; ignored");
            return None;
        };
        if !self.install_state(&saved.state, master_key) {
            return None;
        }
        self.shared.metrics.snapshot_confirmed(Timestamp(saved.confirmed_at_ms));
        tracing::info!(version = saved.state.version, "serving the saved state until the feed answers");
        Some(saved)
    }
}

/// Follows the feed until `shutdown`: polls, applies, installs, saves. `saved` is the state the
/// node booted from, if any.
pub async fn follow_feed(
    gateway: Gateway,
    link: Arc<ControlLink>,
    master_key: MasterKey,
    node_id: String,
    data_dir: PathBuf,
    saved: Option<SavedState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (to_save, saving) = watch::channel(None);
    let saver = tokio::spawn(save_states(saving, data_dir.join(SAVED_STATE_FILE), master_key.clone()));
    let mut held: Option<Arc<FeedState>> = saved.map(|s| Arc::new(s.state));
    let mut retry = RETRY_FIRST;
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut logged_at: Option<tokio::time::Instant> = None;
    let mut dead_lettered = 0;
    loop {
        let set_aside = gateway.shared.metrics.receipts_dead_lettered();
        if set_aside > std::mem::replace(&mut dead_lettered, set_aside) {
            gateway.shared.alarm.dead_lettered(set_aside);
        }
        if let Some(offset_ms) =
            gateway.shared.counters.clock_offset_ms().filter(|ms| recovea_core::timestamp::clock_drifted(*ms))
        {
            gateway.shared.alarm.clock_offset(offset_ms);
        }
        let status = NodeStatus {
            node_id: node_id.clone(),
            version: held.as_ref().map(|s| s.version),
            snapshot_age_ms: gateway.shared.metrics.snapshot_age_ms(),
            counters_confirmed_at_ms: gateway.shared.counters.confirmed_at().map(|t| t.0),
            fail_open_total: gateway.shared.metrics.fail_open_total(),
            clock_offset_ms: gateway.shared.counters.clock_offset_ms(),
            wait_ms: u64::try_from(POLL_WAIT.as_millis()).unwrap_or(u64::MAX),
        };
        let answer = tokio::select! {
            answer = link.post("/feed/v1/poll", &status, POLL_WAIT + POLL_SLACK) => answer,
            () = &mut shutdown => break,
        };
        let outcome = match answer {
            Ok((StatusCode::NO_CONTENT, _)) => Ok(()),
            Ok((StatusCode::OK, body)) => match serde_json::from_slice::<FeedMessage>(&body) {
                Ok(message) => apply(&gateway, &master_key, &mut held, message, &to_save),
                Err(e) => Err(format!("the feed sent an unreadable message: {e}")),
            },
            Ok((status, body)) => Err(format!(
                "the control plane's feed answered {status}: {}",
                crate::control_link::one_line(&body)
            )),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                gateway.snapshot_current();
                if failing_since.take().is_some() {
                    tracing::info!("the feed answers again");
                }
                retry = RETRY_FIRST;
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                if logged_at.is_none_or(|at| at < since || at.elapsed() >= LOG_EVERY) {
                    tracing::warn!(error = %e, "the feed is unavailable; serving the last state");
                    logged_at = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = &mut shutdown => break,
                }
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
    drop(to_save);
    let _ = saver.await;
}

/// Applies one feed message to the held state and serves the result. Changes are applied to the
/// serving snapshot itself, so that one revoked key of a million costs a copy of the table, not a
/// rebuild of it.
fn apply(
    gateway: &Gateway,
    master_key: &MasterKey,
    held: &mut Option<Arc<FeedState>>,
    message: FeedMessage,
    to_save: &watch::Sender<Option<Arc<FeedState>>>,
) -> Result<(), String> {
    let version = match message {
        FeedMessage::State(state) => {
            if !gateway.install_state(&state, master_key) {
                return Err(format!("version {} was refused", state.version));
            }
            let version = state.version;
            *held = Some(Arc::new(state));
            version
        }
        FeedMessage::Changes(changes) => {
            let serving = gateway.shared.snapshot.load_full();
            let held_version = held.as_ref().map(|state| state.version);
            let Some(serving) =
                serving.filter(|s| Some(s.version) == held_version && changes.from == s.version)
            else {
                // Forget the version so that the next poll asks for the whole state.
                *held = None;
                return Err(format!(
                    "changes from version {} do not apply to {held_version:?}",
                    changes.from
                ));
            };
            if !gateway.install_opened(changes.version, changes.open_onto(&serving, master_key)) {
                *held = None;
                return Err(format!("version {} was refused", changes.version));
            }
            let Some(current) = held.as_mut() else { return Err("no state held".into()) };
            // The saver may still be writing the previous state: then (only) it is copied.
            Arc::make_mut(current).apply(changes).map_err(|e| e.to_string())?;
            current.version
        }
    };
    tracing::debug!(version, "state installed");
    to_save.send_replace(held.clone());
    (gateway.shared.config.release_freed_memory)();
    Ok(())
}

/// Writes each newest state to `path`, sealed, replacing the file atomically; a state superseded
/// before its turn is skipped.
async fn save_states(
    mut states: watch::Receiver<Option<Arc<FeedState>>>,
    path: PathBuf,
    master_key: MasterKey,
) {
    while states.changed().await.is_ok() {
        let Some(state) = states.borrow_and_update().clone() else { continue };
        let (target, master_key) = (path.clone(), master_key.clone());
        let saved = tokio::task::spawn_blocking(move || {
            let mut nonce = [0u8; NONCE_LEN];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
                .map_err(|_| std::io::Error::other("no randomness for a nonce"))?;
            write_atomically(&target, &SavedState::seal(&state, now(), &master_key, nonce))
        })
        .await;
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(path = %path.display(), error = %e, "the state could not be saved"),
            Err(e) => tracing::warn!(error = %e, "saving the state failed"),
        }
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&partial, path)
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}
