//! What the gateway's in-process tests share: one node over real sockets in front of the mock
//! provider ([`Harness`]), its receipts shipped to memory, and the requests sent to it. Each test
//! file says only what is its own: its settings (struct update over [`settings`]), its snapshot and
//! keys, and helpers no other file needs. Included by each test file with `mod support;`.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovea_core::Timestamp;
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink, SerializedReceipt};
use recovea_core::window::Window;
use recovea_counters::{Counters, InProcess};
use recovea_gateway::spool::Spool;
use recovea_gateway::{Gateway, GatewaySettings};
use recovea_testkit::MockProvider;

/// Receipts as the ledger would get them, each delivery told to whoever awaits one.
pub struct MemorySink {
    receipts: std::sync::Mutex<Vec<Receipt>>,
    delivered: tokio::sync::watch::Sender<()>,
}

impl Default for MemorySink {
    fn default() -> Self {
        Self { receipts: std::sync::Mutex::default(), delivered: tokio::sync::watch::Sender::new(()) }
    }
}

impl MemorySink {
    /// Every receipt delivered so far, in the order delivered.
    pub fn all(&self) -> Vec<Receipt> {
        self.receipts.lock().expect("lock").clone()
    }

    /// Every receipt delivered, once there are at least `count`: each delivery wakes the wait.
    pub async fn at_least(&self, count: usize) -> Vec<Receipt> {
        let mut delivered = self.delivered.subscribe();
        let arrived = async {
            loop {
                let receipts = self.all();
                if receipts.len() >= count {
                    return receipts;
                }
                // The sender lives as long as the sink.
                let _ = delivered.changed().await;
            }
        };
        let within = recovea_testkit::wait::DEADLINE;
        match tokio::time::timeout(within, arrived).await {
            Ok(receipts) => receipts,
            Err(_) => panic!("only {} of {count} receipts arrived within {within:?}", self.all().len()),
        }
    }
}

impl ReceiptSink for MemorySink {
    fn deliver(
        &self,
        batch: Vec<SerializedReceipt>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DeliveryError>> + Send + '_>> {
        self.receipts.lock().expect("lock").extend(batch.into_iter().map(SerializedReceipt::into_receipt));
        self.delivered.send_replace(());
        Box::pin(async { Ok(()) })
    }
}

/// Ships `spool`'s receipts into memory for the rest of the test.
pub fn ship_to_memory(spool: Arc<Spool>) -> Arc<MemorySink> {
    let receipts = Arc::new(MemorySink::default());
    let sink: Arc<dyn ReceiptSink> = receipts.clone();
    tokio::spawn(async move { spool.ship(sink, std::future::pending()).await });
    receipts
}

/// Serves `gateway` on a port of its own until the returned sender is dropped: its URL, and that
/// sender.
pub async fn serve(gateway: &Gateway) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(recovea_gateway::serve(gateway.clone(), listener, async move {
        let _ = stopped.await;
    }));
    (url, stop)
}

/// A directory removed when the test ends.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "recovea-gateway-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The cap the tests' snapshots hold: `id`, of org_acme (of its key key_live when `scope` is a
/// key's), `limit_usd` a `window`, armed when `hard_stop`, with no alerts. Another organization's:
/// `Cap { org_id, ..cap(...) }`.
pub fn cap(id: &str, scope: Scope, window: Window, limit_usd: &str, hard_stop: bool) -> Cap {
    Cap {
        id: CapId::parse(id).expect("id"),
        org_id: OrgId::parse("org_acme").expect("id"),
        scope,
        key_id: (scope == Scope::Key).then(|| KeyId::parse("key_live").expect("id")),
        window,
        limit: Nanos::parse_usd(limit_usd).expect("limit"),
        hard_stop,
        alert_at_permille: Vec::new(),
        alert_webhook: None,
    }
}

/// A node's settings with both default providers at `provider_url`: a 1 MiB body limit and timeouts
/// no test here reaches by accident. A test that needs another value says so with struct update
/// syntax: `GatewaySettings { max_body_bytes: 64, ..settings(&mock.url()) }`.
pub fn settings(provider_url: &str) -> GatewaySettings {
    GatewaySettings {
        openai_base_url: provider_url.to_owned(),
        anthropic_base_url: provider_url.to_owned(),
        max_body_bytes: 1 << 20,
        upstream_timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_millis(500),
        body_read_timeout: Duration::from_secs(2),
        counter_max_age: Duration::from_secs(60),
        gemini_base_url: recovea_gateway::DEFAULT_GEMINI_BASE_URL.to_owned(),
        body_memory: None,
        stream_idle_timeout: recovea_gateway::DEFAULT_STREAM_IDLE_TIMEOUT,
        max_connections: recovea_gateway::default_max_connections(None),
        alarm_webhook: None,
        alarm_interval: recovea_gateway::DEFAULT_ALARM_INTERVAL,
        metrics_token: None,
        traces: None,
    }
}

/// One gateway node, `node_test`, serving on a port of its own in front of `mock`, its receipts
/// shipped to memory. It stops, and its spool directory goes, when the harness is dropped.
pub struct Harness {
    pub mock: MockProvider,
    pub gateway: Gateway,
    pub url: String,
    pub client: Client<HttpConnector, Full<Bytes>>,
    /// Every receipt delivered so far; [`Harness::receipts`] waits for them.
    pub receipts: Arc<MemorySink>,
    pub counters: Arc<Counters>,
    _spool_dir: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Harness {
    /// Serves a node built from `config` in front of `mock`, holding `snapshot` if there is one
    /// (without one the node is not ready and every request fails open). Its counters are not
    /// confirmed: see [`Harness::confirm`].
    pub async fn serve(
        mock: MockProvider,
        config: recovea_gateway::GatewayConfig,
        snapshot: Option<recovea_core::Snapshot>,
    ) -> Self {
        let spool_dir = TempDir::new();
        let spool = Arc::new(Spool::open(&spool_dir.0).expect("spool"));
        let counters = Counters::new("node_test");
        let gateway = Gateway::new(config, &spool, "node_test", Arc::clone(&counters));
        let receipts = ship_to_memory(spool);
        if let Some(snapshot) = snapshot {
            gateway.install_snapshot(Arc::new(snapshot));
        }
        let (url, stop) = serve(&gateway).await;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self { mock, gateway, url, client, receipts, counters, _spool_dir: spool_dir, stop: Some(stop) }
    }

    /// Stops the node as `SIGTERM` does: it drains, and the receipts it owes are still delivered.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Confirms the counters against `store`, as `serve`'s sync loop does.
    pub async fn confirm(&self, store: &InProcess) {
        self.counters
            .sync_with(store, Timestamp::from_system_time(std::time::SystemTime::now()))
            .await
            .expect("sync");
    }

    /// Waits (with a deadline) until the provider has received `count` requests.
    pub async fn forwarded(&self, count: usize) {
        self.mock.received(count).await;
    }

    /// Waits (with a deadline) until `count` receipts have been delivered, and returns them; fails
    /// on more.
    pub async fn receipts(&self, count: usize) -> Vec<Receipt> {
        let receipts = self.receipts.at_least(count).await;
        assert_eq!(receipts.len(), count, "more receipts than admitted requests: {receipts:#?}");
        receipts
    }

    /// The receipts delivered up to the one of `request_id` (an admitted request sent after those
    /// that must have none), which must be the last: the spool delivers in the order written, so a
    /// receipt that should not exist cannot hide behind it by being late.
    pub async fn receipts_through(&self, request_id: &str) -> Vec<Receipt> {
        let mut count = 1;
        loop {
            let receipts = self.receipts.at_least(count).await;
            if let Some(at) = receipts.iter().position(|r| r.request_id.as_str() == request_id) {
                assert_eq!(at + 1, receipts.len(), "receipts after {request_id}'s: {receipts:#?}");
                return receipts;
            }
            count = receipts.len() + 1;
        }
    }

    /// Sends `request` with `body` and returns the gateway's answer, its body unread.
    pub async fn send(&self, request: http::request::Builder, body: &str) -> Response<hyper::body::Incoming> {
        let request = request.body(Full::new(Bytes::from(body.to_owned()))).expect("request");
        self.client.request(request).await.expect("gateway answers")
    }

    /// What `/metrics` renders now.
    pub async fn metrics(&self) -> String {
        let request = Request::get(format!("{}/metrics", self.url)).body(Full::default()).expect("request");
        let response = self.client.request(request).await.expect("gateway answers");
        let body = http_body_util::BodyExt::collect(response.into_body()).await.expect("complete body");
        String::from_utf8(body.to_bytes().to_vec()).expect("utf-8")
    }

    /// The value of one metric's series, `name{labels}` as `/metrics` writes it; fails when absent.
    pub async fn metric(&self, series: &str) -> u64 {
        let metrics = self.metrics().await;
        let prefix = format!("{series} ");
        let line = metrics.lines().find_map(|line| line.strip_prefix(&prefix));
        line.unwrap_or_else(|| panic!("no {series} in:\n{metrics}")).parse().expect("a count")
    }

    /// A JSON POST to `path` on this node, no key yet.
    pub fn post(&self, path: &str) -> http::request::Builder {
        Request::post(format!("{}{path}", self.url)).header("content-type", "application/json")
    }

    /// A JSON POST to `path` with `secret` as a bearer key, as the OpenAI SDKs send it.
    pub fn post_as(&self, path: &str, secret: &str) -> http::request::Builder {
        self.post(path).header("authorization", format!("Bearer {secret}"))
    }
}
