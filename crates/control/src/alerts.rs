//! Cap alerts: raised once per cap, window and threshold as receipts arrive, stored, and POSTed to
//! the cap's webhook with an HMAC signature and retries. A failing webhook never reaches traffic:
//! all of this runs in the control plane, after the receipts are in the ledger.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::Full;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_store::{AlertRecord, CapRecord, ControlStore, ReceiptLedger};
use ring::hmac;
use serde_json::json;
use tokio::sync::mpsc;

use crate::admin::caps::alert_json;
use crate::random;
use recovea_store::audit::{cap_json, permille_number};

/// Header carrying `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "x-recovea-signature";
/// Delivery attempts per alert, with doubling delays from one second.
const ATTEMPTS: u32 = 6;

/// Evaluates caps against the ledger and hands new alerts to the webhook deliverer.
pub struct Alerts {
    store: Arc<dyn ControlStore>,
    ledger: Arc<dyn ReceiptLedger>,
    deliveries: mpsc::UnboundedSender<(AlertRecord, CapRecord)>,
    /// Each cap window's spend as last known, so that a batch adds its cost rather than summing
    /// the whole window in the ledger again.
    totals: Mutex<HashMap<(CapId, Timestamp), WindowTotal>>,
    /// Thresholds known to be raised (cap, window start, threshold): not offered to the store again.
    raised: Mutex<HashSet<(CapId, Timestamp, u32)>>,
}

struct WindowTotal {
    spend: Nanos,
    summed_at: Instant,
    /// How long that sum took the ledger.
    took: Duration,
}

impl WindowTotal {
    /// Whether the running total may still be added to, rather than the window summed again: for
    /// [`RESUM_EVERY`], and longer when summing is slow (a window of millions of receipts), so that
    /// summing takes at most a hundredth of the time.
    fn trusted_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.summed_at) < self.trusted_for()
    }

    fn trusted_for(&self) -> Duration {
        RESUM_EVERY.max(self.took * 100)
    }
}

/// How long a running total is trusted before the window is summed in the ledger again.
const RESUM_EVERY: Duration = Duration::from_secs(10);

impl Alerts {
    /// Starts the deliverer task; alerts are signed with `signing_secret`, and each delivery
    /// attempt is recorded in the store within `limit` (the control plane's store limit).
    pub fn start(
        store: Arc<dyn ControlStore>,
        ledger: Arc<dyn ReceiptLedger>,
        signing_secret: &str,
        limit: Duration,
    ) -> Arc<Self> {
        let (deliveries, queue) = mpsc::unbounded_channel();
        let key = hmac::Key::new(hmac::HMAC_SHA256, signing_secret.as_bytes());
        tokio::spawn(deliver(Arc::clone(&store), queue, key, limit));
        // Alerts raised before a restart and not yet delivered resume their remaining attempts.
        let (undelivered, resume) = (Arc::clone(&store), deliveries.clone());
        tokio::task::spawn_blocking(move || match undelivered_alerts(undelivered.as_ref()) {
            Ok(pending) => {
                for alert in pending {
                    let _ = resume.send(alert);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "undelivered alerts could not be read; they are not retried")
            }
        });
        Arc::new(Self {
            store,
            ledger,
            deliveries,
            totals: Mutex::new(HashMap::new()),
            raised: Mutex::new(HashSet::new()),
        })
    }

    /// Raises the alerts that a batch just inserted into the ledger crosses, in the windows its
    /// receipts were made in (a receipt delivered after midnight still counts for its own day).
    /// `all_new`: every receipt of the batch was new to the ledger, so the running totals may add
    /// it; otherwise they are summed from the ledger again. Blocking: call it off the async
    /// threads (ingest does, after inserting a batch).
    pub fn evaluate_batch(&self, batch: &[SerializedReceipt], all_new: bool, now: Timestamp) {
        let mut by_org: BTreeMap<OrgId, Vec<&Receipt>> = BTreeMap::new();
        for receipt in batch.iter().map(SerializedReceipt::receipt) {
            if let Some(org) = OrgId::parse(&receipt.org_id) {
                by_org.entry(org).or_default().push(receipt);
            }
        }
        for (org, receipts) in by_org {
            if let Err(e) = self.evaluate_org(&org, &receipts, all_new, now) {
                tracing::warn!(org_id = %org, error = %e, "evaluating cap alerts failed");
            }
        }
    }

    fn evaluate_org(
        &self,
        org: &OrgId,
        receipts: &[&Receipt],
        all_new: bool,
        now: Timestamp,
    ) -> recovea_store::Result<()> {
        for record in self.store.caps(org)? {
            let cap = &record.cap;
            if cap.alert_at_permille.is_empty() {
                continue;
            }
            // The batch's cost in each window of this cap that its receipts fall in.
            let mut windows: BTreeMap<Timestamp, Nanos> = BTreeMap::new();
            for receipt in receipts {
                let covered = match cap.scope {
                    Scope::Organization => true,
                    Scope::Key => cap.key_id.as_ref().is_some_and(|k| k.as_str() == receipt.key_id),
                };
                if covered {
                    let added = windows.entry(cap.window.start(receipt.started_at)).or_default();
                    *added = added.saturating_add(receipt.cost_usd);
                }
            }
            for (start, added) in windows {
                let spend = self.window_spend(cap, start, added, all_new)?;
                self.raise_crossed(&record, start, spend, now)?;
            }
        }
        Ok(())
    }

    /// A window's spend after the batch: the running total plus the batch when it is known and
    /// recent, else the ledger's sum (which includes the batch). Totals are summed again every
    /// [`RESUM_EVERY`] (or a hundred times as long as the last sum took) because other control
    /// replicas ingest into the same ledger.
    fn window_spend(
        &self,
        cap: &Cap,
        start: Timestamp,
        added: Nanos,
        all_new: bool,
    ) -> recovea_store::Result<Nanos> {
        let key = (cap.id.clone(), start);
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        if all_new
            && let Some(total) = totals.get_mut(&key)
            && total.trusted_at(Instant::now())
        {
            total.spend = total.spend.saturating_add(added);
            return Ok(total.spend);
        }
        drop(totals);
        let end = cap.window.end(start);
        let summing = Instant::now();
        let spend = self.ledger.spend(&cap.org_id, cap.key_id.as_ref(), start, end)?;
        let took = summing.elapsed();
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        // Windows that ended long ago are not summed again; forget them.
        totals.retain(|_, total| total.summed_at.elapsed() < total.trusted_for() * 10);
        totals.insert(key, WindowTotal { spend, summed_at: Instant::now(), took });
        Ok(spend)
    }

    /// Raises (once per cap, window and threshold) every alert `spend` crosses.
    fn raise_crossed(
        &self,
        record: &CapRecord,
        start: Timestamp,
        spend: Nanos,
        now: Timestamp,
    ) -> recovea_store::Result<()> {
        let cap = &record.cap;
        for &threshold in &cap.alert_at_permille {
            // spend / limit >= threshold / 1000, in integers.
            let crossed =
                spend.0 > 0 && i128::from(spend.0) * 1000 >= i128::from(cap.limit.0) * i128::from(threshold);
            let raised_key = (cap.id.clone(), start, threshold);
            if !crossed || self.raised.lock().unwrap_or_else(|p| p.into_inner()).contains(&raised_key) {
                continue;
            }
            let alert = AlertRecord {
                id: random::token("alert_", 20)
                    .map_err(|e| recovea_store::StoreError::Backend(e.to_string()))?,
                cap_id: cap.id.clone(),
                org_id: cap.org_id.clone(),
                window_start: start,
                threshold_permille: threshold,
                spend,
                limit: cap.limit,
                raised_at: now,
                delivered_at: None,
                attempts: 0,
            };
            if self.store.raise_alert(&alert)? {
                // As the API gives it (0.5), not in thousandths.
                let threshold = permille_number(threshold);
                tracing::info!(cap_id = %cap.id, %threshold, "cap alert raised");
                if cap.alert_webhook.is_some() {
                    let _ = self.deliveries.send((alert, record.clone()));
                }
            }
            // Raised now or before (by this process or another): the store will not take it again.
            self.raised.lock().unwrap_or_else(|p| p.into_inner()).insert(raised_key);
        }
        Ok(())
    }
}

/// Alerts whose webhook has attempts left, with their caps.
fn undelivered_alerts(store: &dyn ControlStore) -> recovea_store::Result<Vec<(AlertRecord, CapRecord)>> {
    let mut pending = Vec::new();
    for org in store.list_orgs()? {
        for alert in store.alerts(&org.id)? {
            if alert.delivered_at.is_some() || alert.attempts >= ATTEMPTS {
                continue;
            }
            if let Some(cap) = store.cap(&alert.cap_id)?.filter(|c| c.cap.alert_webhook.is_some()) {
                pending.push((alert, cap));
            }
        }
    }
    Ok(pending)
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
    limit: Duration,
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
            for attempt in alert.attempts + 1..=ATTEMPTS {
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
                // Recorded within the store limit: a frozen database costs the attempts that
                // limit, never holds them up. An attempt it missed is not counted, and a delivery
                // it missed leaves the alert undelivered in the store: the next start sends it
                // again, as it sends any alert left undelivered.
                let (store, id) = (Arc::clone(&store), alert.id.clone());
                let recorded = crate::bounded::off_thread(limit, move || store.alert_delivery(&id, at));
                if let Err(e) = recorded.await {
                    tracing::warn!(alert_id = %alert.id, attempt, error = %e, "an alert's delivery attempt was not recorded");
                }
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
    use crate::bounded::frozen::FrozenStore;
    use crate::ingest::LedgerSink;
    use recovea_core::receipt::ReceiptSink;
    use recovea_core::window::Window;
    use recovea_store::{OrgRecord, SqliteStore};
    use tokio::sync::oneshot;

    const DAY_MS: i64 = 24 * 60 * 60 * 1000;

    fn receipt(n: u32, started_at: Timestamp, cost: &str) -> SerializedReceipt {
        SerializedReceipt::new(Receipt {
            model: Some("m".into()),
            cost_usd: Nanos::parse_usd(cost).expect("usd"),
            started_at,
            finished_at: started_at,
            ..Receipt::example(&format!("rcpt_{n}"))
        })
    }

    /// A webhook receiver that answers 200 to every POST and hands over each request's text.
    async fn receiver() -> (String, mpsc::UnboundedReceiver<String>) {
        let (url, mut held) = held_receiver().await;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some((request, answer)) = held.recv().await {
                let _ = answer.send(200);
                let _ = tx.send(request);
            }
        });
        (url, rx)
    }

    /// A webhook receiver that hands over each request's text with the means to answer it: the
    /// status the test sends back.
    async fn held_receiver() -> (String, mpsc::UnboundedReceiver<(String, oneshot::Sender<u16>)>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut text = Vec::new();
                    let mut buf = [0u8; 4096];
                    // Headers, then as many body bytes as content-length says.
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        text.extend_from_slice(&buf[..n]);
                        let request = String::from_utf8_lossy(&text).into_owned();
                        if let Some((head, body)) = request.split_once("\r\n\r\n") {
                            let length = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().to_owned())
                                })
                                .and_then(|v| v.parse::<usize>().ok())
                                .unwrap_or(0);
                            if body.len() >= length {
                                let (answer, status) = oneshot::channel();
                                let _ = tx.send((request, answer));
                                let status = status.await.unwrap_or(500);
                                let head = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                                let _ = stream.write_all(head.as_bytes()).await;
                                break;
                            }
                        }
                    }
                });
            }
        });
        (url, rx)
    }

    fn audit() -> recovea_store::AuditContext {
        recovea_store::AuditContext {
            id: format!("aud_{:016x}", fastrand::u64(..)),
            at: Timestamp(0),
            auth: recovea_store::AuditAuth::AdminToken,
            actor: recovea_store::AuditActor::Operator,
            client: None,
        }
    }

    /// A SQLite store in a directory of its own, holding org_a and its cap_a over `window` with
    /// alerts at `alert_at` (thousandths) posted to `webhook`.
    fn store_with_cap(
        window: Window,
        alert_at: Vec<u32>,
        webhook: Option<String>,
    ) -> (std::path::PathBuf, Arc<SqliteStore>, OrgId) {
        let dir = std::env::temp_dir().join(format!("recovea-alerts-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("dir");
        let store = Arc::new(SqliteStore::open(&dir.join("db")).expect("store"));
        let org = OrgId::parse("org_a").expect("id");
        store
            .create_org(
                &OrgRecord {
                    id: org.clone(),
                    name: "a".into(),
                    created_at: Timestamp(0),
                    allowed_models: None,
                    allowed_endpoints: None,
                    max_concurrent_requests: None,
                },
                &audit(),
            )
            .expect("org");
        let cap = Cap {
            id: CapId::parse("cap_a").expect("id"),
            org_id: org.clone(),
            scope: Scope::Organization,
            key_id: None,
            window,
            limit: Nanos::parse_usd("1.00").expect("usd"),
            hard_stop: false,
            alert_at_permille: alert_at,
            alert_webhook: webhook,
        };
        store.create_cap(&CapRecord { cap, created_at: Timestamp(0) }, &audit()).expect("cap");
        (dir, store, org)
    }

    #[tokio::test]
    async fn alerts_left_undelivered_by_a_restart_are_delivered_at_the_next_start() {
        let (url, mut posts) = receiver().await;
        let (dir, store, org) = store_with_cap(Window::Month, vec![500, 800], Some(url));
        let alert = |id: &str, threshold: u32| AlertRecord {
            id: id.into(),
            cap_id: CapId::parse("cap_a").expect("id"),
            org_id: org.clone(),
            window_start: Timestamp(0),
            threshold_permille: threshold,
            spend: Nanos::parse_usd("0.90").expect("usd"),
            limit: Nanos::parse_usd("1.00").expect("usd"),
            raised_at: Timestamp(1),
            delivered_at: None,
            attempts: 0,
        };
        // Raised before the restart: one with attempts left, one that used them all.
        store.raise_alert(&alert("alert_pending", 500)).expect("raised");
        store.raise_alert(&alert("alert_spent", 800)).expect("raised");
        for _ in 0..2 {
            store.alert_delivery("alert_pending", None).expect("attempt");
        }
        for _ in 0..ATTEMPTS {
            store.alert_delivery("alert_spent", None).expect("attempt");
        }

        let _alerts = Alerts::start(store.clone(), store.clone(), "secret", crate::DEFAULT_STORE_LIMIT);
        let request = tokio::time::timeout(Duration::from_secs(10), posts.recv())
            .await
            .expect("posted")
            .expect("a request");
        assert!(request.contains("alert_pending"), "{request}");
        assert!(request.to_ascii_lowercase().contains(SIGNATURE_HEADER), "{request}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.alerts(&org).expect("alerts").iter().all(|a| a.delivered_at.is_none()) {
            assert!(Instant::now() < deadline, "the delivery was not recorded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let other = tokio::time::timeout(Duration::from_millis(300), posts.recv()).await;
        assert!(other.is_err(), "no other alert is sent: {other:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_frozen_database_does_not_hold_up_a_webhooks_next_attempt() {
        let (url, mut posts) = held_receiver().await;
        let (dir, sqlite, org) = store_with_cap(Window::Month, vec![500], Some(url));
        let pending = AlertRecord {
            id: "alert_pending".into(),
            cap_id: CapId::parse("cap_a").expect("id"),
            org_id: org,
            window_start: Timestamp(0),
            threshold_permille: 500,
            spend: Nanos::parse_usd("0.60").expect("usd"),
            limit: Nanos::parse_usd("1.00").expect("usd"),
            raised_at: Timestamp(1),
            delivered_at: None,
            attempts: 0,
        };
        sqlite.raise_alert(&pending).expect("raised");
        let store = FrozenStore::new(sqlite.clone());
        let limit = Duration::from_millis(100);
        let _alerts = Alerts::start(store.clone(), sqlite.clone(), "secret", limit);
        let (first, answer) = tokio::time::timeout(Duration::from_secs(10), posts.recv())
            .await
            .expect("posted")
            .expect("a request");
        assert!(first.contains("alert_pending"), "{first}");

        // The database freezes before the failed attempt is recorded: the next attempt comes a
        // second after the record gave up (the limit), not once the database answers again.
        let thaw = store.freeze();
        let _ = answer.send(500);
        let (second, answer) = tokio::time::timeout(Duration::from_secs(5), posts.recv())
            .await
            .expect("the webhook is tried again while the database is frozen")
            .expect("a request");
        assert!(second.contains("alert_pending"), "{second}");
        assert!(store.held() >= 1, "recording the first attempt asked the database");
        let _ = answer.send(200);
        drop(thaw);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn batches_raise_alerts_in_their_receipts_windows_once_each() {
        let (dir, store, org) = store_with_cap(Window::Day, vec![500], None);
        let alerts = Alerts::start(store.clone(), store.clone(), "secret", crate::DEFAULT_STORE_LIMIT);
        let sink = LedgerSink::new(store.clone(), Some(alerts));
        let today = Timestamp(Timestamp::from_system_time(SystemTime::now()).0 / DAY_MS * DAY_MS);
        let yesterday = Timestamp(today.0 - DAY_MS);

        // Delivered today, made yesterday: it crosses yesterday's threshold, not today's.
        sink.deliver(vec![receipt(1, Timestamp(yesterday.0 + 5), "0.60")]).await.expect("delivered");
        let raised = |store: &SqliteStore| {
            let mut starts: Vec<i64> =
                store.alerts(&org).expect("alerts").iter().map(|a| a.window_start.0).collect();
            starts.sort_unstable();
            starts
        };
        assert_eq!(raised(&store), vec![yesterday.0]);
        // Today's spend crosses half the limit on the second batch only (running total 0.30 + 0.30).
        sink.deliver(vec![receipt(2, Timestamp(today.0 + 5), "0.30")]).await.expect("delivered");
        assert_eq!(raised(&store), vec![yesterday.0]);
        let third = vec![receipt(3, Timestamp(today.0 + 6), "0.30")];
        sink.deliver(third.clone()).await.expect("delivered");
        assert_eq!(raised(&store), vec![yesterday.0, today.0]);
        // A replayed batch counts once: no new alert, no double-counted spend.
        sink.deliver(third).await.expect("delivered");
        assert_eq!(raised(&store), vec![yesterday.0, today.0]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_slow_sum_is_trusted_for_longer() {
        let at = Instant::now();
        let trusted = |took_ms: u64, later: u64| {
            let total =
                WindowTotal { spend: Nanos::ZERO, summed_at: at, took: Duration::from_millis(took_ms) };
            total.trusted_at(at + Duration::from_secs(later))
        };
        assert!(trusted(1, 5));
        assert!(!trusted(1, 20), "a quick sum is redone after 10 s");
        assert!(trusted(500, 20), "a sum that took 0.5 s is redone after 50 s");
        assert!(!trusted(500, 60));
    }

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
