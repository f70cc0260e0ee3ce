//! The fail-open alarm. Every pass through unadmitted is a fault of ours that someone must hear
//! about, yet a fault that hits every request must flood neither the log nor the webhook: each
//! reason alarms at most once per interval, and its alarm says how many passes it stands for.
//!
//! Nothing here waits on the request path: the decision is two atomics, and the webhook is fed
//! through a bounded queue to a task of its own, so a slow or failing webhook never reaches
//! traffic.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Limited};
use recovea_core::{FailOpenReason, Timestamp};
use recovea_upstream::{ProviderNetwork, Upstream};
use tokio::sync::mpsc;

use crate::metrics::{FAIL_OPEN_REASONS, reason_index};

/// With at most one alarm per reason per interval, the queue fills only when the webhook has hung
/// for many intervals; later alarms are then dropped, and the log and the metric still have them.
const QUEUE: usize = 32;
const WEBHOOK_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a webhook's answer read, only so that its connection can be reused.
const WEBHOOK_ANSWER_LIMIT: usize = 16 << 10;

/// Checks the webhook URL of the settings: http or https, with a host.
pub(crate) fn parse_webhook(url: &str) -> Result<Uri, String> {
    let trimmed = url.trim();
    // `Uri` would drop a fragment silently; a URL with one was probably not meant.
    if trimmed.contains('#') {
        return Err(format!("{url:?} must not carry a fragment"));
    }
    let uri: Uri = trimmed.parse().map_err(|_| format!("{url:?} is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{url:?} must start with http:// or https://"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(uri)
}

/// One reason's share of the rate limit.
#[derive(Default)]
struct Lane {
    /// Milliseconds after [`Alarm::epoch`] before which the reason stays quiet; 0 until its first
    /// alarm, so that the first pass always alarms.
    quiet_until_ms: AtomicU64,
    /// Passes since the reason's last alarm.
    passes: AtomicU64,
}

/// What the webhook task sends.
enum Raised {
    FailOpen {
        reason: FailOpenReason,
        /// Passes the alarm stands for: this one and those kept quiet since the previous alarm.
        count: u64,
        at: Timestamp,
    },
    /// The node's clock stands this far from the shared counter store's (past the tolerance).
    ClockOffset { offset_ms: i64, at: Timestamp },
    /// Receipts the ledger refused as invalid were set aside in the spool's dead-letter file:
    /// this many since the node started.
    DeadLetter { total: u64, at: Timestamp },
}

impl Raised {
    fn label(&self) -> &'static str {
        match self {
            Self::FailOpen { reason, .. } => reason.label(),
            Self::ClockOffset { .. } => "clock_offset",
            Self::DeadLetter { .. } => "receipts_dead_lettered",
        }
    }

    fn body(&self, node_id: &str) -> serde_json::Value {
        match self {
            Self::FailOpen { reason, count, at } => serde_json::json!({
                "alarm": "fail_open",
                "reason": reason.label(),
                "count": count,
                "node_id": node_id,
                "at": at.to_rfc3339(),
            }),
            Self::ClockOffset { offset_ms, at } => serde_json::json!({
                "alarm": "clock_offset",
                "offset_ms": offset_ms,
                "tolerance_ms": recovea_core::timestamp::CLOCK_TOLERANCE_MS,
                "node_id": node_id,
                "at": at.to_rfc3339(),
            }),
            Self::DeadLetter { total, at } => serde_json::json!({
                "alarm": "receipts_dead_lettered",
                "total": total,
                "file": crate::spool::DEAD_LETTER_FILE,
                "node_id": node_id,
                "at": at.to_rfc3339(),
            }),
        }
    }
}

pub(crate) struct Alarm {
    node_id: String,
    interval_ms: u64,
    epoch: Instant,
    lanes: [Lane; FAIL_OPEN_REASONS.len()],
    /// The clock's alarm and the dead letters', each quiet for an interval as each fail-open
    /// reason's is.
    clock: Lane,
    dead_letter: Lane,
    webhook: Option<mpsc::Sender<Raised>>,
}

impl Alarm {
    /// An alarm that logs, and POSTs to `webhook` (reached as providers are, through `network`)
    /// when there is one. The webhook task needs the tokio runtime the node runs on.
    pub(crate) fn new(
        webhook: Option<Uri>,
        interval: Duration,
        node_id: &str,
        network: &ProviderNetwork,
    ) -> Self {
        let webhook = webhook.and_then(|url| match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (queue, queued) = mpsc::channel(QUEUE);
                runtime.spawn(deliver(url, node_id.to_owned(), network.clone(), queued));
                Some(queue)
            }
            Err(_) => {
                tracing::error!("no tokio runtime: fail-open alarms will not reach the webhook");
                None
            }
        });
        Self {
            node_id: node_id.to_owned(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            lanes: Default::default(),
            clock: Lane::default(),
            dead_letter: Lane::default(),
            webhook,
        }
    }

    /// Counts one fail-open pass, and raises the alarm if its reason has been quiet for an interval.
    pub(crate) fn raise(&self, reason: FailOpenReason, request_id: &HeaderValue) {
        let lane = &self.lanes[reason_index(reason)];
        lane.passes.fetch_add(1, Relaxed);
        if !self.due(lane) {
            return;
        }
        let count = lane.passes.swap(0, Relaxed).max(1);
        let suppressed = count - 1;
        tracing::error!(
            alarm = "fail_open",
            reason = reason.label(),
            count,
            suppressed,
            node_id = %self.node_id,
            request_id = %request_id.to_str().unwrap_or_default(),
            "fail-open: request passed through unadmitted (Recovea key removed, no managed key, no \
             caps, no receipt); {suppressed} more such passes since this reason's last alarm"
        );
        self.send(Raised::FailOpen { reason, count, at: Timestamp::from_system_time(SystemTime::now()) });
    }

    /// The node's clock stands `offset_ms` from the shared counter store's, past the tolerance:
    /// logged and sent to the webhook at most once an interval while it lasts.
    pub(crate) fn clock_offset(&self, offset_ms: i64) {
        if !self.due(&self.clock) {
            return;
        }
        tracing::error!(
            alarm = "clock_offset",
            offset_ms,
            tolerance_ms = recovea_core::timestamp::CLOCK_TOLERANCE_MS,
            node_id = %self.node_id,
            "this node's clock stands {offset_ms} ms from the shared counter store's: windows are \
             decided on the store's clock, but the node's own (receipts' times, logs) is off; fix its \
             time synchronization"
        );
        self.send(Raised::ClockOffset { offset_ms, at: Timestamp::from_system_time(SystemTime::now()) });
    }

    /// Receipts were set aside in the spool's dead-letter file (`total` since the node started):
    /// sent to the webhook at most once an interval (the spool logs each receipt).
    pub(crate) fn dead_lettered(&self, total: u64) {
        if self.due(&self.dead_letter) {
            self.send(Raised::DeadLetter { total, at: Timestamp::from_system_time(SystemTime::now()) });
        }
    }

    /// Whether `lane` has been quiet for an interval; if so it is quiet for the next one. Of the
    /// callers that find the interval over, only the one that moves it on is told so.
    fn due(&self, lane: &Lane) -> bool {
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let quiet_until = lane.quiet_until_ms.load(Relaxed);
        let next = now_ms.saturating_add(self.interval_ms);
        now_ms >= quiet_until
            && lane.quiet_until_ms.compare_exchange(quiet_until, next, Relaxed, Relaxed).is_ok()
    }

    fn send(&self, raised: Raised) {
        let Some(webhook) = &self.webhook else { return };
        let label = raised.label();
        if webhook.try_send(raised).is_err() {
            tracing::warn!(reason = label, "alarm webhook queue full: alarm not sent");
        }
    }
}

/// Sends each alarm to the webhook in turn; a failure is logged and the alarm given up, since the
/// next one of its reason carries the count on.
async fn deliver(url: Uri, node_id: String, network: ProviderNetwork, mut queued: mpsc::Receiver<Raised>) {
    let client = Upstream::new(WEBHOOK_CONNECT_TIMEOUT, 0, &network);
    while let Some(raised) = queued.recv().await {
        let body = raised.body(&node_id);
        let request = Request::post(url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, "recovea-gateway")
            .body(Bytes::from(body.to_string()));
        let Ok(request) = request else { continue };
        // The URL may carry a token: it stays out of the log.
        match client.send(request, WEBHOOK_TIMEOUT).await {
            Ok(response) => {
                let status = response.status();
                let answer = Limited::new(response.into_body(), WEBHOOK_ANSWER_LIMIT).collect();
                let _ = tokio::time::timeout(WEBHOOK_TIMEOUT, answer).await;
                if !status.is_success() {
                    tracing::warn!(
                        reason = raised.label(),
                        status = status.as_u16(),
                        "alarm webhook refused the alarm"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(reason = raised.label(), error = ?e, "alarm webhook unreachable");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_checked() {
        let uri = parse_webhook(" https://hooks.example.com/recovea?token=abc ").expect("valid");
        assert_eq!(uri.host(), Some("hooks.example.com"));
        assert!(parse_webhook("http://127.0.0.1:9/alarm").is_ok());
        for bad in ["", "hooks.example.com/x", "ftp://x/y", "http://", "https://x/#f", "not a url"] {
            assert!(parse_webhook(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_reason_alarms_once_per_interval_and_counts_the_quiet_passes() {
        let alarm = Alarm::new(None, Duration::from_secs(3600), "node_test", &ProviderNetwork::default());
        let id = HeaderValue::from_static("req_test");
        for _ in 0..5 {
            alarm.raise(FailOpenReason::SnapshotError, &id);
        }
        let lane = &alarm.lanes[reason_index(FailOpenReason::SnapshotError)];
        assert_eq!(lane.passes.load(Relaxed), 4, "the first pass alarmed; four were kept quiet");
        alarm.raise(FailOpenReason::AdmissionPanic, &id);
        let other = &alarm.lanes[reason_index(FailOpenReason::AdmissionPanic)];
        assert_eq!(other.passes.load(Relaxed), 0, "another reason alarms on its own");
        // The interval is over: the next pass alarms for all five.
        lane.quiet_until_ms.store(0, Relaxed);
        alarm.raise(FailOpenReason::SnapshotError, &id);
        assert_eq!(lane.passes.load(Relaxed), 0);
    }
}
