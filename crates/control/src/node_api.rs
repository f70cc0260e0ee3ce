//! What nodes call, with the node token: the feed poll, receipt ingest, and spend rebuilds from
//! the ledger. A node holds no database credentials: these are its only way to the store.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use recovea_core::feed::{NodeStatus, WindowSpend};
use recovea_core::ids::CapId;
use recovea_core::keys;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{CapWindow, Counted};
use recovea_store::NodeRecord;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::admin::{Reply, ReplyBody};
use crate::rebuild::rebuild_window;
use crate::{ApiError, Control};

/// A node's report is stored at most this often while its version stays the same.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// A node that has not polled for this long is no longer listed: nodes come and go.
const FORGET_NODES_AFTER: Duration = Duration::from_secs(60 * 60);

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
            return Err(ApiError::NotFound("This control plane serves no nodes (no --node-token).".into()));
        };
        let presented = authorization.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).unwrap_or("");
        if presented.is_empty() || keys::hash_secret(presented) != access.token_hash {
            return Err(ApiError::NodeUnauthorized);
        }
        match path {
            POLL => {
                let status: NodeStatus = parse(&body)?;
                self.inner.metrics.polls.fetch_add(1, Relaxed);
                self.remember_node(&status);
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
                            .map_err(|e| ApiError::BadRequest(format!("body: receipts[{i}]: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
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
                        .ok_or_else(|| ApiError::BadRequest("windows: cap_id".into()))?;
                    let wanted =
                        CapWindow { cap, start: Timestamp(window.start_ms), end: Timestamp(window.end_ms) };
                    let counted: Vec<Counted> = window
                        .counted
                        .iter()
                        .map(|c| Counted { node_id: c.node_id.clone(), since: Timestamp(c.since_ms) })
                        .collect();
                    let sources = self.spend_sources();
                    let total = self.off_thread(move || rebuild_window(&sources, &wanted, &counted)).await?;
                    window.total_nanos = total.map(|t| t.total.0);
                    window.last_start_ms = total.and_then(|t| t.last_start).map(|at| at.0);
                    answered.push(window);
                }
                Ok(Some(json_reply(json!({ "windows": answered }))))
            }
            _ => Err(ApiError::NotFound("Unknown node path.".into())),
        }
    }

    /// Records a node's report in the store, where every replica reads it: at once when its
    /// version changed, else at most every [`REPORT_EVERY`]. The poll does not wait for it.
    fn remember_node(&self, status: &NodeStatus) {
        {
            let mut reported = self.inner.node_reports.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = reported
                .get(&status.node_id)
                .is_some_and(|(at, version)| *version == status.version && at.elapsed() < REPORT_EVERY);
            if fresh {
                return;
            }
            reported.retain(|_, (at, _)| at.elapsed() < FORGET_NODES_AFTER);
            reported.insert(status.node_id.clone(), (Instant::now(), status.version));
        }
        let record = NodeRecord {
            id: status.node_id.clone(),
            feed_version: status.version,
            snapshot_age_ms: status.snapshot_age_ms,
            counters_confirmed_at: status.counters_confirmed_at_ms.map(Timestamp),
            fail_open_total: status.fail_open_total,
            seen_at: now(),
            clock_offset_ms: status.clock_offset_ms,
        };
        let store = Arc::clone(&self.inner.store);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = store.record_node(&record) {
                tracing::warn!(node_id = %record.id, error = %e, "a node's report could not be stored");
            }
        });
    }

    /// How many nodes reported to this replica within the last hour.
    pub(crate) fn nodes_reporting(&self) -> usize {
        let reported = self.inner.node_reports.lock().unwrap_or_else(|p| p.into_inner());
        reported.values().filter(|(at, _)| at.elapsed() < FORGET_NODES_AFTER).count()
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
                })
            })
            .collect();
        Ok(json_reply(json!({ "nodes": nodes, "feed_version": self.inner.feed.version() })))
    }
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn parse<'a, T: Deserialize<'a>>(body: &'a Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("body: {e}")))
}

fn json_reply(body: Value) -> Reply {
    Reply { status: StatusCode::OK, body: ReplyBody::Json(body) }
}

fn raw(body: Bytes) -> Reply {
    Reply { status: StatusCode::OK, body: ReplyBody::Raw(body) }
}
