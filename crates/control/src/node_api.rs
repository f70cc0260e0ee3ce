//! What nodes call, with a node credential's token or the shared node token: the feed poll,
//! receipt ingest, and spend rebuilds from the ledger. A node holds no database credentials: these
//! are its only way to the store.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use recovea_core::feed::{NodeStatus, WindowSpend};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys;
use recovea_core::node_access::{is_credential_token, key_to_look_up, may_deliver};
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;
use recovea_counters::Counted;
use recovea_store::{NodeRecord, PresentedCredential};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::admin::{Reply, ReplyBody};
use crate::rebuild::rebuild_window;
use crate::{ApiError, Control, NodeAccess};

/// A node's report is stored at most this often while its version stays the same.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// A node that has not polled for this long is no longer listed: nodes come and go.
const FORGET_NODES_AFTER: Duration = Duration::from_secs(60 * 60);
/// The most key owners remembered; past it they are forgotten and read again. A key's
/// organization never changes, so a remembered owner is right for ever: the bound is memory only.
const MOST_KEY_OWNERS: usize = 100_000;

/// The organization of each key whose receipts were ingested, read from the store the first time
/// one of its receipts comes: a key created a moment ago through another replica, or revoked
/// since (its receipts made before are still its organization's), is in the store, whatever this
/// replica last published.
#[derive(Default)]
pub(crate) struct KeyOwners {
    known: std::sync::Mutex<std::collections::HashMap<KeyId, OrgId>>,
}

impl KeyOwners {
    /// The owners of `keys` remembered, and the keys whose owner is not.
    fn split(&self, keys: Vec<KeyId>) -> (std::collections::HashMap<KeyId, OrgId>, Vec<KeyId>) {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let mut owners = std::collections::HashMap::new();
        let mut missing = Vec::new();
        for key in keys {
            match known.get(&key) {
                Some(org) => {
                    owners.insert(key, org.clone());
                }
                None => missing.push(key),
            }
        }
        (owners, missing)
    }

    fn remember(&self, found: &[(KeyId, OrgId)]) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() + found.len() > MOST_KEY_OWNERS {
            known.clear();
        }
        known.extend(found.iter().cloned());
    }
}

/// The node paths, relative to the root.
pub(crate) const POLL: &str = "/feed/v1/poll";
pub(crate) const SPEND: &str = "/feed/v1/spend";
pub(crate) const RECEIPTS: &str = "/ingest/v1/receipts";
pub(crate) const JOBS: &str = "/feed/v1/jobs";

/// Each receipt is kept as the node wrote it: the ledger stores that text, checked to be a
/// receipt, rather than serialize it again.
#[derive(Deserialize)]
struct ReceiptBatch<'a> {
    #[serde(borrow)]
    receipts: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct SpendQuery {
    windows: Vec<WindowSpend>,
}

impl Control {
    /// Whether `path` is one of the node endpoints.
    pub(crate) fn is_node_path(path: &str) -> bool {
        matches!(path, POLL | SPEND | RECEIPTS | JOBS)
    }

    /// Answers a node's call; `None` asks for an empty `204` (a poll that saw no change).
    pub(crate) async fn node_call(
        &self,
        path: &str,
        authorization: Option<&str>,
        body: Bytes,
    ) -> Result<Option<Reply>, ApiError> {
        let Some(access) = self.inner.nodes.get() else {
            return Err(ApiError::NotFound(
                "This process serves no nodes: recovea serve runs its own node inside.".into(),
            ));
        };
        let caller = self.node_caller(access, authorization).await?;
        match path {
            POLL => {
                let status: NodeStatus = parse(&body)?;
                self.inner.metrics.polls.fetch_add(1, Relaxed);
                self.remember_node(&status, caller);
                let wait = Duration::from_millis(status.wait_ms);
                Ok(self.inner.feed.poll(status.version, wait).await.map(raw))
            }
            RECEIPTS => {
                let batch: ReceiptBatch<'_> = parse(&body)?;
                let receipts = batch
                    .receipts
                    .iter()
                    .enumerate()
                    .map(|(i, text)| {
                        SerializedReceipt::parse(text.get())
                            .map_err(|e| ApiError::bad_request(format!("body: receipts[{i}]: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.check_owners(&receipts, &caller).await?;
                let accepted = receipts.len();
                // Whatever failed, the receipts stay in the node's spool: it sends them again.
                access.sink.deliver(receipts).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
                self.inner.metrics.receipts.fetch_add(accepted as u64, Relaxed);
                Ok(Some(json_reply(json!({"accepted": accepted}))))
            }
            JOBS => {
                let Some(jobs) = self.inner.jobs.get() else {
                    return Err(ApiError::NotFound("This control plane keeps no jobs.".into()));
                };
                let poll: recovea_core::jobs::BookPoll = parse(&body)?;
                let wait = Duration::from_millis(poll.wait_ms).min(crate::feed::MAX_WAIT);
                Ok(jobs.poll(poll.epoch, poll.seq, wait).await.map(raw))
            }
            SPEND => {
                let query: SpendQuery = parse(&body)?;
                let mut answered = Vec::with_capacity(query.windows.len());
                for mut window in query.windows {
                    let cap = CapId::parse(&window.cap_id)
                        .ok_or_else(|| ApiError::bad_field("windows", "cap_id"))?;
                    let span = (Timestamp(window.start_ms), Timestamp(window.end_ms));
                    let counted: Vec<Counted> = window
                        .counted
                        .iter()
                        .map(|c| Counted { node_id: c.node_id.clone(), since: Timestamp(c.since_ms) })
                        .collect();
                    let sources = self.spend_sources();
                    let total =
                        self.off_thread(move || rebuild_window(&sources, &cap, span, &counted)).await?;
                    window.total_nanos = total.map(|t| t.total.0);
                    window.last_start_ms = total.and_then(|t| t.last_start).map(|at| at.0);
                    answered.push(window);
                }
                Ok(Some(json_reply(json!({ "windows": answered }))))
            }
            _ => Err(ApiError::NotFound("Unknown node path.".into())),
        }
    }

    /// Who presents `authorization`: the shared node token (compared in memory), or a node
    /// credential, looked up in the store at each call so that a revocation made through any
    /// replica is refused at once. A token of neither kind costs no database read.
    async fn node_caller(
        &self,
        access: &NodeAccess,
        authorization: Option<&str>,
    ) -> Result<PresentedCredential, ApiError> {
        let presented = authorization.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).unwrap_or("");
        if presented.is_empty() {
            return Err(ApiError::NodeUnauthorized);
        }
        // Comparing digests keeps the comparison's timing independent of the token's characters.
        let hash = keys::hash_secret(presented);
        if access.shared_token_hash == Some(hash) {
            return Ok(PresentedCredential::Shared);
        }
        if !is_credential_token(presented) {
            return Err(ApiError::NodeUnauthorized);
        }
        match self.store(move |s| s.node_credential_by_hash(hash)).await? {
            Some(credential) if credential.revoked_at.is_none() => {
                Ok(PresentedCredential::Own { id: credential.id, name: credential.name })
            }
            _ => Err(ApiError::NodeUnauthorized),
        }
    }

    /// Refuses the batch (`400`, which the node takes as refused: it sends its receipts again one
    /// at a time and sets aside the one refused alone) when a receipt may not be delivered
    /// (`core::node_access::may_deliver`): its key is not a key of the organization it names.
    async fn check_owners(
        &self,
        receipts: &[SerializedReceipt],
        caller: &PresentedCredential,
    ) -> Result<(), ApiError> {
        let mut keys: Vec<KeyId> = receipts.iter().filter_map(|r| key_to_look_up(r.receipt())).collect();
        keys.sort();
        keys.dedup();
        let (mut owners, missing) = self.inner.key_owners.split(keys);
        if !missing.is_empty() {
            let found = self.store(move |s| s.key_owners(&missing)).await?;
            self.inner.key_owners.remember(&found);
            owners.extend(found);
        }
        for (i, serialized) in receipts.iter().enumerate() {
            let receipt = serialized.receipt();
            let owner = key_to_look_up(receipt).and_then(|key| owners.get(&key));
            if let Err(why) = may_deliver(receipt, owner) {
                tracing::warn!(
                    credential = %shown(caller),
                    receipt_id = %receipt.id.escape_debug(),
                    why = %why,
                    "a node delivered a receipt it may not: the batch is refused"
                );
                return Err(ApiError::bad_request(format!("body: receipts[{i}]: {why}")));
            }
        }
        Ok(())
    }

    /// Records a node's report in the store, where every replica reads it: at once when its
    /// version or its credential changed, else at most every [`REPORT_EVERY`]. The poll does not
    /// wait for it; the write is bounded as every store call is: a database that does not answer
    /// within the limit is logged and makes the control plane not ready, as an admin call would.
    fn remember_node(&self, status: &NodeStatus, credential: PresentedCredential) {
        {
            let mut reported = self.inner.node_reports.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = reported.get(&status.node_id).is_some_and(|(at, version, presented)| {
                *version == status.version && *presented == credential && at.elapsed() < REPORT_EVERY
            });
            if fresh {
                return;
            }
            reported.retain(|_, (at, _, _)| at.elapsed() < FORGET_NODES_AFTER);
            reported.insert(status.node_id.clone(), (Instant::now(), status.version, credential.clone()));
        }
        let record = NodeRecord {
            id: status.node_id.clone(),
            feed_version: status.version,
            snapshot_age_ms: status.snapshot_age_ms,
            counters_confirmed_at: status.counters_confirmed_at_ms.map(Timestamp),
            fail_open_total: status.fail_open_total,
            seen_at: now(),
            clock_offset_ms: status.clock_offset_ms,
            credential: Some(credential),
        };
        let (control, store) = (self.clone(), Arc::clone(&self.inner.store));
        tokio::spawn(async move {
            let node_id = record.id.clone();
            if let Err(e) = control.off_thread(move || store.record_node(&record)).await {
                tracing::warn!(node_id = %node_id, error = ?e, "a node's report could not be stored");
            }
        });
    }

    /// How many nodes reported to this replica within the last hour.
    pub(crate) fn nodes_reporting(&self) -> usize {
        let reported = self.inner.node_reports.lock().unwrap_or_else(|p| p.into_inner());
        reported.values().filter(|(at, _, _)| at.elapsed() < FORGET_NODES_AFTER).count()
    }

    /// `GET /admin/v1/nodes`: what each node seen within the last hour last reported, to any replica.
    pub(crate) async fn list_nodes(&self) -> Result<Reply, ApiError> {
        let now = now();
        let forget_ms = i64::try_from(FORGET_NODES_AFTER.as_millis()).unwrap_or(i64::MAX);
        let since = Timestamp(now.0.saturating_sub(forget_ms));
        let nodes: Vec<Value> = self
            .store(move |s| s.nodes(since))
            .await?
            .into_iter()
            .map(|node| {
                let since_seen = u64::try_from(now.0.saturating_sub(node.seen_at.0)).unwrap_or(0);
                let (credential_id, credential_name) = match &node.credential {
                    None => (None, None),
                    Some(PresentedCredential::Shared) => (Some("shared"), None),
                    Some(PresentedCredential::Own { id, name }) => (Some(id.as_str()), Some(name.as_str())),
                };
                json!({
                    "id": node.id,
                    "feed_version": node.feed_version,
                    // The age the node reported, grown by the time since it reported it.
                    "snapshot_age_seconds": node.snapshot_age_ms.map(|ms| (ms + since_seen) / 1000),
                    "counters_confirmed_at": node.counters_confirmed_at.map(Timestamp::to_rfc3339),
                    "fail_open_total": node.fail_open_total,
                    "last_seen_at": node.seen_at.to_rfc3339(),
                    "clock_offset_ms": node.clock_offset_ms,
                    "clock_drifted": node.clock_offset_ms.map(recovea_core::timestamp::clock_drifted),
                    // The credential it presented last: its own (id and name), or `shared`.
                    "credential_id": credential_id,
                    "credential_name": credential_name,
                })
            })
            .collect();
        Ok(json_reply(json!({ "nodes": nodes, "feed_version": self.inner.feed.version() })))
    }
}

/// A credential as the log names it: its id, or `shared`.
fn shown(credential: &PresentedCredential) -> &str {
    match credential {
        PresentedCredential::Shared => "shared",
        PresentedCredential::Own { id, .. } => id.as_str(),
    }
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn parse<'a, T: Deserialize<'a>>(body: &'a Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body: {e}")))
}

fn json_reply(body: Value) -> Reply {
    Reply { status: StatusCode::OK, body: ReplyBody::Json(body) }
}

fn raw(body: Bytes) -> Reply {
    Reply { status: StatusCode::OK, body: ReplyBody::Raw(body) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> KeyId {
        KeyId::parse(&format!("key_{n}")).expect("key id")
    }

    #[tokio::test]
    async fn a_report_the_frozen_database_does_not_take_is_known_within_the_limit() {
        use crate::bounded::frozen::FrozenStore;
        use recovea_store::SqliteStore;

        let dir = std::env::temp_dir().join(format!("recovea-node-api-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("dir");
        let sqlite = Arc::new(SqliteStore::open(&dir.join("db")).expect("store"));
        let store = FrozenStore::new(sqlite.clone());
        let limit = Duration::from_millis(100);
        let master_key = recovea_core::crypto::MasterKey::from_bytes([7; 32]);
        let control = Control::new(store.clone(), sqlite.clone(), master_key, "admin", Arc::new(|_| {}))
            .with_store_limit(limit);
        control.serve_nodes(Some("node-token"), Arc::new(crate::ingest::LedgerSink::new(sqlite, None)));

        let thaw = store.freeze();
        let poll = Bytes::from_static(br#"{"node_id":"node-a","version":null,"wait_ms":0}"#);
        let asked = Instant::now();
        let answer = tokio::time::timeout(limit, control.node_call(POLL, Some("Bearer node-token"), poll))
            .await
            .expect("a poll does not wait on the report");
        assert!(matches!(answer, Ok(None)), "nothing published yet: {:?}", answer.err());
        // The report's write gives up within the limit: the control plane says it is not ready
        // (`/readyz`) rather than wait on the database with it.
        while control.inner.store_answers.load(std::sync::atomic::Ordering::Acquire) {
            assert!(asked.elapsed() < limit * 20, "the report is still waiting on the frozen database");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(store.held(), 1, "the report asked the database");
        drop(thaw);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_owners_are_remembered_and_forgotten_whole_past_the_bound() {
        let owners = KeyOwners::default();
        let org = OrgId::parse("org_a").expect("org id");
        owners.remember(&[(key(1), org.clone())]);
        let (known, missing) = owners.split(vec![key(1), key(2)]);
        assert_eq!((known.get(&key(1)), missing), (Some(&org), vec![key(2)]));
        let many: Vec<(KeyId, OrgId)> = (2..=MOST_KEY_OWNERS + 1).map(|n| (key(n), org.clone())).collect();
        owners.remember(&many);
        let (_, missing) = owners.split(vec![key(1), key(2)]);
        assert_eq!(missing, vec![key(1)], "past the bound, the older owners are read again");
    }
}
