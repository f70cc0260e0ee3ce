//! Cap alerts: raised once per cap, window and threshold as receipts arrive, stored, and POSTed to
//! the cap's webhook with an HMAC signature and retries. A failing webhook never reaches traffic:
//! all of this runs in the control plane, after the receipts are in the ledger.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::Full;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovea_core::ids::OrgId;
use recovea_core::timestamp::Timestamp;
use recovea_store::{AlertRecord, CapRecord, ControlStore, ReceiptLedger};
use ring::hmac;
use serde_json::json;
use tokio::sync::mpsc;

use crate::admin::caps::{alert_json, cap_json};
use crate::random;

/// Header carrying `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "x-recovea-signature";
/// Delivery attempts per alert, with doubling delays from one second.
const ATTEMPTS: u32 = 6;

/// Evaluates caps against the ledger and hands new alerts to the webhook deliverer.
pub struct Alerts {
    store: Arc<dyn ControlStore>,
    ledger: Arc<dyn ReceiptLedger>,
    deliveries: mpsc::UnboundedSender<(AlertRecord, CapRecord)>,
}

impl Alerts {
    /// Starts the deliverer task; alerts are signed with `signing_secret`.
    pub fn start(
        store: Arc<dyn ControlStore>,
        ledger: Arc<dyn ReceiptLedger>,
        signing_secret: &str,
    ) -> Arc<Self> {
        let (deliveries, queue) = mpsc::unbounded_channel();
        let key = hmac::Key::new(hmac::HMAC_SHA256, signing_secret.as_bytes());
        tokio::spawn(deliver(Arc::clone(&store), queue, key));
        Arc::new(Self { store, ledger, deliveries })
    }

    /// Raises the alerts that the spend of these organizations now crosses. Blocking: call it off
    /// the async threads (ingest does, after inserting a batch).
    pub fn evaluate(&self, orgs: &BTreeSet<OrgId>, now: Timestamp) {
        for org in orgs {
            if let Err(e) = self.evaluate_org(org, now) {
                tracing::warn!(org_id = %org, error = %e, "evaluating cap alerts failed");
            }
        }
    }

    fn evaluate_org(&self, org: &OrgId, now: Timestamp) -> recovea_store::Result<()> {
        for record in self.store.caps(org)? {
            let cap = &record.cap;
            if cap.alert_at_permille.is_empty() {
                continue;
            }
            let (start, end) = (cap.window.start(now), cap.window.end(now));
            let spend = self.ledger.spend(org, cap.key_id.as_ref(), start, end)?;
            for &threshold in &cap.alert_at_permille {
                // spend / limit >= threshold / 1000, in integers.
                let crossed = spend.0 > 0
                    && i128::from(spend.0) * 1000 >= i128::from(cap.limit.0) * i128::from(threshold);
                if !crossed {
                    continue;
                }
                let alert = AlertRecord {
                    id: random::token("alert_", 20)
                        .map_err(|e| recovea_store::StoreError::Backend(e.to_string()))?,
                    cap_id: cap.id.clone(),
                    org_id: org.clone(),
                    window_start: start,
                    threshold_permille: threshold,
                    spend,
                    limit: cap.limit,
                    raised_at: now,
                    delivered_at: None,
                    attempts: 0,
                };
                if self.store.raise_alert(&alert)? {
                    tracing::info!(cap_id = %cap.id, threshold, "cap alert raised");
                    if cap.alert_webhook.is_some() {
                        let _ = self.deliveries.send((alert, record.clone()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The signature of a webhook body sent at `unix_seconds`.
pub fn sign(key: &hmac::Key, unix_seconds: u64, body: &[u8]) -> String {
    let mut message = format!("{unix_seconds}.").into_bytes();
    message.extend_from_slice(body);
    let tag = hmac::sign(key, &message);
    let hex = recovea_core::hex::encode(tag.as_ref());
    format!("t={unix_seconds},v1={hex}")
}

async fn deliver(
    store: Arc<dyn ControlStore>,
    mut queue: mpsc::UnboundedReceiver<(AlertRecord, CapRecord)>,
    key: hmac::Key,
) {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let https =
        HttpsConnectorBuilder::new().with_webpki_roots().https_or_http().enable_http1().wrap_connector(http);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let key = Arc::new(key);
    while let Some((alert, cap)) = queue.recv().await {
        let (client, key, store) = (client.clone(), Arc::clone(&key), Arc::clone(&store));
        // Each alert retries on its own, so that one dead webhook does not hold up the others.
        tokio::spawn(async move {
            let Some(url) = cap.cap.alert_webhook.clone() else { return };
            let body = Bytes::from(
                json!({ "type": "cap.alert", "alert": alert_json(&alert), "cap": cap_json(&cap) })
                    .to_string(),
            );
            let mut delay = Duration::from_secs(1);
            for attempt in 1..=ATTEMPTS {
                let sent_at =
                    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let request = Request::post(&url)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header(SIGNATURE_HEADER, sign(&key, sent_at, &body))
                    .body(Full::new(body.clone()));
                let delivered = match request {
                    Ok(request) => matches!(
                        tokio::time::timeout(Duration::from_secs(10), client.request(request)).await,
                        Ok(Ok(response)) if response.status().is_success()
                    ),
                    Err(_) => false,
                };
                let at = delivered.then(|| Timestamp::from_system_time(SystemTime::now()));
                let (store, id) = (Arc::clone(&store), alert.id.clone());
                let _ = tokio::task::spawn_blocking(move || store.alert_delivery(&id, at)).await;
                if delivered {
                    return;
                }
                tracing::warn!(alert_id = %alert.id, attempt, "alert webhook delivery failed");
                if attempt < ATTEMPTS {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_time_and_body() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"secret");
        let signature = sign(&key, 1_700_000_000, b"{}");
        let expected = hmac::sign(&key, b"1700000000.{}");
        let hex = recovea_core::hex::encode(expected.as_ref());
        assert_eq!(signature, format!("t=1700000000,v1={hex}"));
        assert_eq!(hex.len(), 64);
    }
}
