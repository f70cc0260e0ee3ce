//! The feed: what nodes poll for their state (the whole state once, then changes).
//!
//! A poll is a long poll: it is answered at once when the node is behind, otherwise when the next
//! version is published or its wait runs out (`204`). Every answer confirms to the node that it
//! holds the latest state, which is how it measures its snapshot's age.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use recovea_core::feed::{FeedChanges, FeedMessage, FeedState};
use tokio::sync::watch;

/// How many versions of changes are kept for nodes a little behind; further behind, the whole state.
const KEPT_CHANGES: usize = 64;
/// The longest a poll is held open.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A published version, with its whole state serialized once, on first demand.
struct Published {
    state: Arc<FeedState>,
    /// Changes leading to each of the last versions, oldest first: `changes[i].version` is the
    /// version after applying it.
    changes: VecDeque<Arc<FeedChanges>>,
    full: OnceLock<Bytes>,
}

pub(crate) struct Feed {
    current: watch::Sender<Option<Arc<Published>>>,
}

impl Feed {
    pub(crate) fn new() -> Self {
        Self { current: watch::Sender::new(None) }
    }

    /// Makes `state` the one nodes are fed; the changes from the previous version are kept.
    pub(crate) fn publish(&self, state: Arc<FeedState>) {
        self.current.send_modify(|current| {
            let mut changes = VecDeque::new();
            if let Some(previous) = current.as_ref() {
                if previous.state.version >= state.version {
                    return;
                }
                changes = previous.changes.clone();
                changes.push_back(Arc::new(state.changes_since(&previous.state)));
                while changes.len() > KEPT_CHANGES {
                    changes.pop_front();
                }
            }
            *current = Some(Arc::new(Published { state, changes, full: OnceLock::new() }));
        });
    }

    pub(crate) fn version(&self) -> Option<u64> {
        self.current.borrow().as_ref().map(|p| p.state.version)
    }

    /// Answers a node holding `held`: the body to send, or `None` when nothing changed within `wait`.
    pub(crate) async fn poll(&self, held: Option<u64>, wait: Duration) -> Option<Bytes> {
        let wait = wait.min(MAX_WAIT);
        let mut current = self.current.subscribe();
        let behind = |published: &Option<Arc<Published>>| {
            published.as_ref().is_some_and(|p| held.is_none_or(|v| v != p.state.version))
        };
        if !behind(&current.borrow_and_update()) {
            let _ = tokio::time::timeout(wait, current.wait_for(behind)).await;
        }
        let published = current.borrow().clone()?;
        if !behind(&Some(Arc::clone(&published))) {
            return None;
        }
        Some(answer(&published, held))
    }
}

/// Changes when the node holds a version the kept changes start from, else the whole state.
fn answer(published: &Published, held: Option<u64>) -> Bytes {
    if let Some(held) = held
        && let Some(first) = published.changes.iter().position(|c| c.from == held)
    {
        let mut steps = published.changes.iter().skip(first);
        if let Some(first) = steps.next() {
            let merged = steps.fold((**first).clone(), |merged, next| merged.then((**next).clone()));
            return Bytes::from(serde_json::to_vec(&FeedMessage::Changes(merged)).unwrap_or_default());
        }
    }
    published.full.get_or_init(|| Bytes::from(published.state.message_json())).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::feed::KeyWire;
    use recovea_core::keys::KeyHash;

    fn state(version: u64, keys: &[u8]) -> Arc<FeedState> {
        let mut state = FeedState { version, ..FeedState::default() };
        for n in keys {
            let key = KeyWire {
                id: recovea_core::ids::KeyId::parse(&format!("key_{n}")).expect("a valid key id"),
                org_id: recovea_core::ids::OrgId::parse("org_a").expect("a valid organization id"),
                expires_at_ms: None,
                requests_per_minute: None,
                tokens_per_minute: None,
                allowed_models: None,
                allowed_endpoints: None,
                max_concurrent_requests: None,
            };
            state.keys.insert(KeyHash([*n; 32]), key);
        }
        Arc::new(state)
    }

    async fn poll(feed: &Feed, version: Option<u64>, wait_ms: u64) -> Option<FeedMessage> {
        let body = feed.poll(version, Duration::from_millis(wait_ms)).await?;
        Some(serde_json::from_slice(&body).expect("a feed message"))
    }

    #[tokio::test]
    async fn a_node_gets_the_whole_state_then_merged_changes_then_waits() {
        let feed = Feed::new();
        assert_eq!(poll(&feed, None, 0).await, None, "nothing published yet");
        feed.publish(state(1, &[1, 2]));
        assert_eq!(poll(&feed, None, 0).await, Some(FeedMessage::State((*state(1, &[1, 2])).clone())));
        feed.publish(state(2, &[1, 2, 3]));
        feed.publish(state(3, &[2, 3]));
        let Some(FeedMessage::Changes(changes)) = poll(&feed, Some(1), 0).await else {
            panic!("a node one version behind gets changes")
        };
        let mut applied = (*state(1, &[1, 2])).clone();
        applied.apply(changes).expect("the merged changes apply to version 1");
        assert_eq!(applied, *state(3, &[2, 3]));
        assert_eq!(poll(&feed, Some(3), 0).await, None, "current: nothing to send");
        assert!(matches!(poll(&feed, Some(99), 0).await, Some(FeedMessage::State(_))), "unknown: whole");
    }

    #[tokio::test]
    async fn a_waiting_poll_is_answered_as_soon_as_a_version_is_published() {
        let feed = Arc::new(Feed::new());
        feed.publish(state(1, &[1]));
        let waiting = tokio::spawn({
            let feed = Arc::clone(&feed);
            async move { poll(&feed, Some(1), 20_000).await }
        });
        tokio::task::yield_now().await;
        feed.publish(state(2, &[]));
        let answered =
            tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").expect("ran");
        assert!(matches!(answered, Some(FeedMessage::Changes(c)) if c.version == 2));
    }
}
