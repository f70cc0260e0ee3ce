//! Two gateway nodes sharing one key's rate limit through a real Redis (127.0.0.1:6379, or
//! `RECOVEA_TEST_REDIS_URL`): together they admit about the limit, not each of them the limit.
//!
//! Redis must be running: the test fails, never skips, without it. It uses its own random key
//! prefix; its keys expire on their own two minutes after the test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovea_core::Answer;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_counters::{Counters, RateShare, RedisRateShare};
use recovea_gateway::spool::Spool;
use recovea_gateway::{Gateway, GatewayConfig};
use recovea_testkit::MockProvider;
use recovea_testkit::wait::{DEADLINE, eventually};
use tokio::net::TcpListener;

mod support;

use support::TempDir;

const LIMITED_KEY: &str = "rk_limited00000000000000000000000000000000000006";
const PER_MINUTE: u32 = 10;
const SYNC_EVERY: Duration = Duration::from_millis(20);
const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}"#;

fn redis_url() -> String {
    std::env::var("RECOVEA_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// One gateway node, serving on its own port, its rate limits shared through `share`.
struct Node {
    gateway: Gateway,
    url: String,
    _spool: Arc<Spool>,
    _spool_dir: TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Node {
    async fn start(name: &str, mock: &MockProvider, share: Arc<dyn RateShare>) -> Self {
        let config = GatewayConfig::new(support::settings(&mock.url())).expect("valid config");
        let spool_dir = TempDir::new();
        let spool = Arc::new(Spool::open(&spool_dir.0).expect("spool"));
        let gateway = Gateway::new(config, &spool, name, Counters::new(name));
        gateway.install_snapshot(Arc::new(snapshot()));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = futures_util::FutureExt::shared(async move {
            let _ = stopped.await;
        });
        tokio::spawn(gateway.share_rate_limits(share, SYNC_EVERY, stopped.clone()));
        tokio::spawn(recovea_gateway::serve(gateway.clone(), listener, stopped));
        Self { gateway, url, _spool: spool, _spool_dir: spool_dir, _stop: stop }
    }

    /// Waits (with a deadline) until a sync that began after this call has been answered.
    async fn synced(&self) {
        // The first sync answered may have taken its push before this call; the one after it
        // began after.
        let target = self.gateway.rate_limit_syncs() + 2;
        let answered = || async { (self.gateway.rate_limit_syncs() >= target).then_some(()) };
        eventually(DEADLINE, "a rate limit sync answered (is Redis up?)", answered).await;
    }
}

fn snapshot() -> recovea_core::Snapshot {
    let org = OrgId::parse("org_acme").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone());
    b.provider(
        &org,
        ProviderCredential::new(
            "openai".into(),
            ProviderKind::OpenAi,
            None,
            "sk-managed-openai-0123456789".into(),
        ),
    );
    b.key_with_limits(
        hash_secret(LIMITED_KEY),
        KeyId::parse("key_limited").expect("id"),
        org,
        None,
        KeyLimits { requests_per_minute: Some(PER_MINUTE), tokens_per_minute: None },
    );
    b.build()
}

/// Sends one chat request to `node`; its status, and for a refusal how long it says to wait.
async fn chat(client: &Client<HttpConnector, Full<Bytes>>, node: &Node) -> (StatusCode, Option<u64>) {
    let request = Request::post(format!("{}/v1/chat/completions", node.url))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {LIMITED_KEY}"))
        .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
        .expect("request");
    let response = client.request(request).await.expect("gateway answers");
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS {
        response.into_body().collect().await.expect("complete body");
        return (status, None);
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .unwrap_or_else(|| panic!("a 429 carries {name}"))
            .to_str()
            .expect("text")
            .to_owned()
    };
    let wait_ms: u64 = header("retry-after-ms").parse().expect("a number of ms");
    assert_eq!(header("retry-after"), wait_ms.div_ceil(1000).max(1).to_string());
    let body = response.into_body().collect().await.expect("complete body").to_bytes();
    let expected = Answer::rate_limited(wait_ms);
    assert_eq!(status.as_u16(), expected.status);
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        std::str::from_utf8(&expected.body).expect("utf-8")
    );
    (status, Some(wait_ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_redis_admit_one_limit_between_them() {
    let url = redis_url();
    let suffix: String = std::iter::repeat_with(fastrand::alphanumeric).take(16).collect();
    let prefix = format!("recovea-test:{suffix}");
    let share = |url: &str| -> Arc<dyn RateShare> {
        Arc::new(RedisRateShare::new(url, &prefix).expect("share").with_timeout(Duration::from_secs(2)))
    };
    let (share_a, share_b) = (share(&url), share(&url));
    share_a.exchange(&[]).await.unwrap_or_else(|e| {
        panic!("this test needs Redis at {url} (redis-server --save '' --appendonly no): {e}")
    });

    let mock = MockProvider::start().await;
    let nodes = [Node::start("node_a", &mock, share_a).await, Node::start("node_b", &mock, share_b).await];
    let client = Client::builder(TokioExecutor::new()).build_http();

    let rounds = 3 * PER_MINUTE as usize;
    let mut admitted = [0usize; 2];
    let mut refused = [0usize; 2];
    let started = Instant::now();
    for round in 0..rounds {
        let (here, there) = (round % 2, 1 - round % 2);
        let (status, wait_ms) = chat(&client, &nodes[here]).await;
        match status {
            StatusCode::OK => admitted[here] += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                refused[here] += 1;
                let wait_ms = wait_ms.expect("a wait");
                // Ten a minute: the lane refills one request every 6 s.
                assert!((1..=6_000).contains(&wait_ms), "wait {wait_ms} ms");
            }
            other => panic!("round {round}: {other}"),
        }
        // Paced so that each node has heard of the other's requests before its next decision:
        // this node pushes, then the other reads.
        nodes[here].synced().await;
        nodes[there].synced().await;
    }
    let elapsed = started.elapsed();

    // One lane of ten a minute, shared, admits at most ten at once plus one per 6 s that passes
    // (the GCRA refill); the pacing above leaves no admission unseen by the other node, so
    // nothing more. Without sharing each node would admit ten of its own: twenty.
    let total = admitted[0] + admitted[1];
    let refill = usize::try_from(elapsed.as_millis() / 6_000).expect("small");
    assert!(
        (PER_MINUTE as usize..=PER_MINUTE as usize + refill).contains(&total),
        "admitted {admitted:?} (refused {refused:?}) in {elapsed:?}: {total}, not {PER_MINUTE} + at most {refill}"
    );
    assert!(
        refused[0] > 0 && refused[1] > 0,
        "both nodes refuse once the shared limit is spent: {refused:?}"
    );
    assert!(admitted[0] > 0 && admitted[1] > 0, "both nodes admitted their share: {admitted:?}");
    assert_eq!(mock.requests().len(), total, "a refused request is not forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_holds_no_request_back() {
    // Accepts connections and never answers a byte: every sync hangs until its timeout.
    let blackhole = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let blackhole_url = format!("redis://{}", blackhole.local_addr().expect("addr"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = blackhole.accept().await {
            held.push(socket);
        }
    });
    let share: Arc<dyn RateShare> = Arc::new(
        RedisRateShare::new(&blackhole_url, "recovea-test:blackhole")
            .expect("share")
            .with_timeout(Duration::from_secs(30)),
    );
    let mock = MockProvider::start().await;
    let node = Node::start("node_alone", &mock, share).await;
    let client = Client::builder(TokioExecutor::new()).build_http();

    let mut statuses = Vec::new();
    for _ in 0..PER_MINUTE + 2 {
        let started = Instant::now();
        statuses.push(chat(&client, &node).await.0);
        assert!(started.elapsed() < Duration::from_secs(2), "a request waited {:?}", started.elapsed());
    }
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, PER_MINUTE as usize, "the node enforces the limit alone: {statuses:?}");
    assert_eq!(statuses.last(), Some(&StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(node.gateway.rate_limit_syncs(), 0, "no sync was answered");
}
