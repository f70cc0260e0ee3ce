//! The node's calls to the control plane, all authenticated with the node token: the feed poll,
//! receipt delivery, and spend rebuilds. None of them is ever on a request's path.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use recovea_core::feed::{CountedSince, WindowSpend};
use recovea_core::money::Nanos;
use recovea_core::receipt::{DeliveryError, ReceiptSink, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_counters::{Rebuilt, SpendSource, Unseeded, WindowSpendFuture};
use recovea_upstream::{DEFAULT_HTTP2_CONNECTIONS, ProviderNetwork, Upstream, UpstreamError};
use serde::Serialize;

use recovea_core::ConfigError;

/// The largest answer accepted from the control plane: a whole state of millions of keys.
const MAX_ANSWER_BYTES: usize = 2 << 30;
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The node's link to the control plane: one or more of its replicas, each call going to the one
/// that answered last and, when it cannot be reached or answers that it cannot serve (`502`,
/// `503`, `504`), to the next in the order given, round the list; so that nodes need no load
/// balancer in front of the replicas.
pub struct ControlLink {
    base_urls: Vec<String>,
    /// The replica that answered last: where the next call goes first.
    current: AtomicUsize,
    authorization: http::HeaderValue,
    client: Upstream,
}

impl std::fmt::Debug for ControlLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlLink").field("base_urls", &self.base_urls).finish_non_exhaustive()
    }
}

impl ControlLink {
    /// A link to the replicas at `control_urls`, trusting the certificates of `ca_pem` (PEM)
    /// beside the public web's roots for those behind TLS.
    pub fn new(
        control_urls: &[String],
        node_token: &str,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, ConfigError> {
        let base_urls = control_urls
            .iter()
            .map(|url| {
                recovea_providers::normalize_base_url(url)
                    .map_err(|why| ConfigError::flag("control-url", why))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if base_urls.is_empty() {
            return Err(ConfigError::flag("control-url", "at least one is needed"));
        }
        if node_token.trim().is_empty() {
            return Err(ConfigError::flag("node-token", "must not be empty"));
        }
        let mut authorization = http::HeaderValue::from_str(&format!("Bearer {}", node_token.trim()))
            .map_err(|_| ConfigError::flag("node-token", "must be printable ASCII"))?;
        authorization.set_sensitive(true);
        let network = ProviderNetwork::new(
            ca_pem,
            false,
            recovea_upstream::Egress::default(),
            DEFAULT_HTTP2_CONNECTIONS,
        )
        .map_err(|e| e.as_flag("upstream-ca-file", "control-ca-file"))?;
        Ok(Self {
            base_urls,
            current: AtomicUsize::new(0),
            authorization,
            client: Upstream::new(Duration::from_secs(5), 0, &network),
        })
    }

    /// POSTs `body` as JSON to `path` and returns the status and the whole answer. The text of an
    /// error is for the node's log.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: &impl Serialize,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        self.send_json(path, body, timeout).await
    }

    /// POSTs `body`, JSON text already, to `path` at the replica that answered last, or the next
    /// ones round the list while one cannot serve it; as [`Self::post`].
    async fn send_json(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        let body = Bytes::from(body);
        let first = self.current.load(Relaxed);
        let mut last = Err("no control plane".to_owned());
        for attempt in 0..self.base_urls.len() {
            let at = (first + attempt) % self.base_urls.len();
            last = self.send_to(&self.base_urls[at], path, body.clone(), timeout).await;
            let unable = |status: &StatusCode| {
                matches!(
                    *status,
                    StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
                )
            };
            match &last {
                Ok((status, _)) if !unable(status) => {
                    self.current.store(at, Relaxed);
                    return last;
                }
                Ok((status, _)) => {
                    tracing::debug!(replica = %self.base_urls[at], %status, "control plane replica cannot serve: trying the next")
                }
                Err(why) => {
                    tracing::debug!(replica = %self.base_urls[at], why, "control plane replica unreachable: trying the next")
                }
            }
        }
        last
    }

    /// One POST to the replica at `base_url`.
    async fn send_to(
        &self,
        base_url: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        let request = Request::post(format!("{base_url}{path}"))
            .header(header::AUTHORIZATION, self.authorization.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| e.to_string())?;
        let response = self.client.send(request, timeout).await.map_err(|e| match e {
            UpstreamError::Unreachable(e) => format!("control plane unreachable: {e}"),
            UpstreamError::Timeout => "control plane did not answer in time".to_owned(),
        })?;
        let status = response.status();
        let read =
            tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect());
        let body = read
            .await
            .map_err(|_| "control plane answer timed out".to_owned())?
            .map_err(|e| format!("control plane answer unreadable: {e}"))?
            .to_bytes();
        Ok((status, body))
    }

    /// Fails unless the answer is `200 OK`.
    async fn post_ok(&self, path: &str, body: Vec<u8>) -> Result<Bytes, String> {
        match self.send_json(path, body, CALL_TIMEOUT).await? {
            (StatusCode::OK, body) => Ok(body),
            (status, body) => Err(format!("control plane answered {status}: {}", one_line(&body))),
        }
    }
}

/// The start of an answer's body for a log line: on one line (the control plane's error bodies are
/// indented JSON), at most 200 characters.
pub(crate) fn one_line(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(400)]);
    let mut line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = line.char_indices().nth(200) {
        line.truncate(cut);
    }
    line
}

/// `{"receipts":[...]}`, written from each receipt's own JSON text rather than serialized again.
fn receipt_batch(batch: &[SerializedReceipt]) -> Vec<u8> {
    let texts: usize = batch.iter().map(|r| r.json().len() + 1).sum();
    let mut body = Vec::with_capacity(texts + 16);
    body.extend_from_slice(br#"{"receipts":["#);
    for (i, receipt) in batch.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(receipt.json().as_bytes());
    }
    body.extend_from_slice(b"]}");
    body
}

/// A node's spool ships to the control plane's ingest, which is idempotent by receipt id.
impl ReceiptSink for ControlLink {
    fn deliver(
        &self,
        batch: Vec<SerializedReceipt>,
    ) -> Pin<Box<dyn Future<Output = Result<(), DeliveryError>> + Send + '_>> {
        Box::pin(async move {
            match self.send_json("/ingest/v1/receipts", receipt_batch(&batch), CALL_TIMEOUT).await {
                Ok((StatusCode::OK, _)) => Ok(()),
                // The batch does not parse, or is over the control plane's limit: sent again as it
                // is, it would be refused again, and every later receipt would wait behind it.
                Ok((status @ (StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE), body)) => {
                    let why = format!("control plane answered {status}: {}", one_line(&body));
                    Err(DeliveryError::Refused { why, batch })
                }
                Ok((status, body)) => Err(DeliveryError::Failed(format!(
                    "control plane answered {status}: {}",
                    one_line(&body)
                ))),
                Err(why) => Err(DeliveryError::Failed(why)),
            }
        })
    }
}

#[derive(Serialize, serde::Deserialize)]
struct Windows {
    windows: Vec<WindowSpend>,
}

/// A node's lost counter windows are rebuilt from the control plane's ledger.
impl SpendSource for ControlLink {
    fn window_spend<'a>(&'a self, windows: &'a [Unseeded]) -> WindowSpendFuture<'a> {
        Box::pin(async move {
            let query = Windows {
                windows: windows
                    .iter()
                    .map(|u| WindowSpend {
                        cap_id: u.window.cap.as_str().to_owned(),
                        start_ms: u.window.start.0,
                        end_ms: u.window.end.0,
                        total_nanos: None,
                        last_start_ms: None,
                        counted: u
                            .counted
                            .iter()
                            .map(|c| CountedSince { node_id: c.node_id.clone(), since_ms: c.since.0 })
                            .collect(),
                    })
                    .collect(),
            };
            let body = self
                .post_ok("/feed/v1/spend", serde_json::to_vec(&query).map_err(|e| e.to_string())?)
                .await?;
            let answer: Windows = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if answer.windows.len() != windows.len() {
                return Err("control plane answered for other windows".to_owned());
            }
            Ok(answer
                .windows
                .iter()
                .map(|w| {
                    let last_start = w.last_start_ms.map(Timestamp);
                    w.total_nanos.map(|total| Rebuilt { total: Nanos(total), last_start })
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn an_indented_error_body_is_logged_on_one_short_line() {
        let body = b"{\n  \"error\": {\n    \"message\": \"Invalid node token.\",\n    \"code\": \"unauthorized\"\n  }\n}";
        assert_eq!(
            one_line(body),
            r#"{ "error": { "message": "Invalid node token.", "code": "unauthorized" } }"#
        );
        let long = "é".repeat(1000);
        assert_eq!(one_line(long.as_bytes()).chars().count(), 200);
        assert_eq!(one_line(&[0xff, b'\n', b'x']), "\u{fffd} x");
    }
}
