//! The request path in-process, over real sockets: a gateway node in front of the mock provider.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use recovea_core::answer::WireShape;
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::CapId;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::money::Nanos;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::receipt::Receipt;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::usage::UsageSource;
use recovea_core::window::Window;
use recovea_core::{Answer, Timestamp};
use recovea_counters::InProcess;
use recovea_gateway::{GatewayConfig, GatewaySettings};
use recovea_testkit::wait::{DEADLINE, eventually};
use recovea_testkit::{Behaviour, MockProvider};
use tokio::net::TcpListener;

mod support;

use support::{Harness, cap};

const KEY: &str = "rk_live0000000000000000000000000000000000000001";
const BYO_KEY: &str = "rk_byo00000000000000000000000000000000000000002";
const EXPIRED_KEY: &str = "rk_expired00000000000000000000000000000000000003";
const NO_CREDENTIALS_KEY: &str = "rk_bare0000000000000000000000000000000000000004";
const UNKNOWN_KEY: &str = "rk_unknown00000000000000000000000000000000000005";
const LIMITED_KEY: &str = "rk_limited00000000000000000000000000000000000006";
const MANAGED_OPENAI: &str = "sk-managed-openai-0123456789";
const MANAGED_ANTHROPIC: &str = "sk-ant-managed-0123456789";
const MANAGED_GROQ: &str = "gsk-managed-0123456789";

fn config(openai: &str, anthropic: &str, max_body: u64, timeout: Duration) -> GatewayConfig {
    GatewayConfig::new(GatewaySettings {
        openai_base_url: openai.into(),
        anthropic_base_url: anthropic.into(),
        max_body_bytes: max_body,
        upstream_timeout: timeout,
        ..support::settings(openai)
    })
    .expect("valid config")
}

impl Harness {
    async fn start() -> Self {
        let mock = MockProvider::start().await;
        let cfg = config(&mock.url(), &mock.url(), 1024 * 1024, Duration::from_secs(30));
        Self::with_config(mock, cfg, true).await
    }

    async fn with_config(mock: MockProvider, config: GatewayConfig, install: bool) -> Self {
        Self::with_caps(mock, config, install, Vec::new()).await
    }

    /// A gateway whose snapshot (if `install`) gives org_acme `caps`; its counters unconfirmed.
    async fn with_caps(mock: MockProvider, config: GatewayConfig, install: bool, caps: Vec<Cap>) -> Self {
        let snapshot = install.then(|| snapshot(&mock.url(), caps));
        Self::serve(mock, config, snapshot).await
    }
}

fn snapshot(mock_url: &str, caps: Vec<Cap>) -> recovea_core::Snapshot {
    let org = OrgId::parse("org_acme").expect("id");
    let bare = OrgId::parse("org_bare").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone()).org(bare.clone());
    let credential = |name: &str, kind, base_url: Option<String>, key: &str| {
        ProviderCredential::new(name.into(), kind, base_url, key.into())
    };
    b.provider(&org, credential("openai", ProviderKind::OpenAi, None, MANAGED_OPENAI));
    b.provider(&org, credential("anthropic", ProviderKind::Anthropic, None, MANAGED_ANTHROPIC));
    b.provider(
        &org,
        credential("groq", ProviderKind::OpenAi, Some(format!("{mock_url}/groq")), MANAGED_GROQ),
    );
    for cap in caps {
        b.cap(cap);
    }
    b.key(hash_secret(KEY), KeyId::parse("key_live").expect("id"), org.clone(), None);
    b.key_with_limits(
        hash_secret(LIMITED_KEY),
        KeyId::parse("key_limited").expect("id"),
        org.clone(),
        None,
        KeyLimits { requests_per_minute: Some(2), tokens_per_minute: None },
    );
    b.key(hash_secret(BYO_KEY), KeyId::parse("key_byo").expect("id"), bare.clone(), None);
    b.key(hash_secret(EXPIRED_KEY), KeyId::parse("key_expired").expect("id"), org, Some(Timestamp(1)));
    b.key(hash_secret(NO_CREDENTIALS_KEY), KeyId::parse("key_bare").expect("id"), bare, None);
    b.build()
}

const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}"#;
const MESSAGES: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}"#;

async fn body_of(response: Response<hyper::body::Incoming>) -> Bytes {
    response.into_body().collect().await.expect("complete body").to_bytes()
}

fn assert_answer(status: StatusCode, body: &[u8], expected: &Answer) {
    assert_eq!(status.as_u16(), expected.status);
    assert_eq!(
        std::str::from_utf8(body).expect("utf-8"),
        std::str::from_utf8(&expected.body).expect("utf-8")
    );
}

/// No trace of the Recovea key anywhere in what the provider received.
fn assert_no_recovea_key(mock: &MockProvider) {
    for request in mock.requests() {
        for (name, value) in &request.headers {
            assert!(!value.contains("rk_"), "header {name} carried a Recovea key");
        }
        assert!(!String::from_utf8_lossy(&request.body).contains("rk_"));
    }
}

#[tokio::test]
async fn openai_route_swaps_in_the_managed_bearer_key() {
    let h = Harness::start().await;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::OK);
    let request_id =
        response.headers().get("x-request-id").expect("request id").to_str().expect("text").to_owned();
    assert!(request_id.starts_with("req_"), "{request_id}");
    assert_eq!(response.headers().get("x-upstream-request-id").expect("provider id"), "mock-req-1");
    let body: serde_json::Value = serde_json::from_slice(&body_of(response).await).expect("json");
    assert_eq!(body["object"], "chat.completion");

    let seen = h.mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), Some(format!("Bearer {MANAGED_OPENAI}").as_str()));
    assert_eq!(seen[0].body, Bytes::from_static(CHAT.as_bytes()));
    assert_no_recovea_key(&h.mock);
}

#[tokio::test]
async fn anthropic_route_uses_x_api_key() {
    let h = Harness::start().await;
    let response = h
        .send(
            h.post("/v1/messages?beta=true")
                .header("x-api-key", KEY)
                .header("anthropic-version", "2023-06-01"),
            MESSAGES,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = h.mock.requests();
    assert_eq!(seen[0].path, "/v1/messages?beta=true");
    assert_eq!(seen[0].header("x-api-key"), Some(MANAGED_ANTHROPIC));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_no_recovea_key(&h.mock);
}

#[tokio::test]
async fn named_route_goes_to_that_credentials_base_url() {
    let h = Harness::start().await;
    let response = h.send(h.post_as("/groq/v1/chat/completions", KEY), CHAT).await;
    // The mock has no `/groq/v1/...` endpoint: its 404 proves where the request went.
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let seen = h.mock.requests();
    assert_eq!(seen[0].path, "/groq/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), Some(format!("Bearer {MANAGED_GROQ}").as_str()));
}

#[tokio::test]
async fn a_key_in_x_recovea_key_forwards_the_clients_own_provider_key() {
    let h = Harness::start().await;
    let response = h
        .send(
            h.post("/v1/chat/completions")
                .header("x-recovea-key", BYO_KEY)
                .header("authorization", "Bearer sk-client-own"),
            CHAT,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = h
        .send(
            h.post("/v1/chat/completions")
                .header("x-recovea-key", KEY)
                .header("authorization", "Bearer sk-client-2"),
            CHAT,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = h.mock.requests();
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-client-own"));
    assert_eq!(
        seen[1].header("authorization"),
        Some("Bearer sk-client-2"),
        "own key wins over the managed one"
    );
    assert_no_recovea_key(&h.mock);
}

#[tokio::test]
async fn x_recovea_key_without_a_provider_key_uses_the_managed_one_or_is_refused() {
    let h = Harness::start().await;
    let response = h.send(h.post("/v1/chat/completions").header("x-recovea-key", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        h.mock.requests()[0].header("authorization"),
        Some(format!("Bearer {MANAGED_OPENAI}").as_str())
    );
    // No credential on the route and none brought: nothing to forward with.
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let response = h.send(h.post(path).header("x-recovea-key", BYO_KEY), CHAT).await;
        let status = response.status();
        let (credential, shape) = if path == "/v1/messages" {
            ("anthropic", WireShape::Anthropic)
        } else {
            ("openai", WireShape::OpenAi)
        };
        let expected = Answer::provider_not_configured(credential).shaped(shape);
        assert_answer(status, &body_of(response).await, &expected);
    }
    assert_eq!(h.mock.requests().len(), 1);
}

#[tokio::test]
async fn paths_that_climb_out_of_the_base_url_are_not_forwarded() {
    let h = Harness::start().await;
    for path in ["/groq/v1/../../secret", "/v1/%2e%2e/admin", "/groq/v1/a%2Fb"] {
        let response = h.send(h.post_as(path, KEY), CHAT).await;
        let status = response.status();
        assert_answer(status, &body_of(response).await, &Answer::unknown_route());
    }
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn every_bad_key_gets_the_identical_401_and_nothing_is_forwarded() {
    let h = Harness::start().await;
    let mut answers = Vec::new();
    for (case, header) in [
        ("unknown", Some(("authorization", format!("Bearer {UNKNOWN_KEY}")))),
        ("expired", Some(("authorization", format!("Bearer {EXPIRED_KEY}")))),
        ("malformed", Some(("x-recovea-key", "rk_short".to_owned()))),
        ("malformed api key", Some(("x-api-key", "rk_!!".to_owned()))),
        ("missing", None),
        ("provider key only", Some(("authorization", "Bearer sk-not-ours".to_owned()))),
    ] {
        let mut request = h.post("/v1/chat/completions");
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let response = h.send(request, CHAT).await;
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(n, _)| *n != "x-request-id" && *n != "date")
            .map(|(n, v)| (n.to_string(), v.to_str().expect("text").to_owned()))
            .collect();
        headers.sort();
        let status = response.status();
        let body = body_of(response).await;
        assert_answer(status, &body, &Answer::invalid_api_key());
        answers.push((case, status, headers, body));
    }
    for (case, status, headers, body) in &answers[1..] {
        assert_eq!((status, headers, body), (&answers[0].1, &answers[0].2, &answers[0].3), "{case}");
    }
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn a_route_without_a_credential_is_refused_with_400() {
    let h = Harness::start().await;
    let response = h.send(h.post_as("/v1/chat/completions", NO_CREDENTIALS_KEY), CHAT).await;
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::provider_not_configured("openai"));
    let response =
        h.send(h.post("/mistral/v1/chat/completions").header("x-recovea-key", BYO_KEY), CHAT).await;
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::provider_not_configured("mistral"));
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_declared_or_streamed() {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 64, Duration::from_secs(5));
    let h = Harness::with_config(mock, cfg, true).await;
    let big = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(100));
    let response = h.send(h.post_as("/v1/chat/completions", KEY), &big).await;
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::request_too_large(64));

    // Without a content-length (chunked), the limit holds all the same.
    let (mut sender, body) = futures_channel_body();
    let request = Request::post(format!("{}/v1/chat/completions", h.url))
        .header("authorization", format!("Bearer {KEY}"))
        .body(body)
        .expect("request");
    let client = Client::builder(TokioExecutor::new()).build_http();
    let pending = tokio::spawn(async move { client.request(request).await });
    for _ in 0..4 {
        sender.send(Bytes::from_static(b"0123456789abcdef0123456789")).await;
    }
    drop(sender);
    let response = pending.await.expect("join").expect("answer");
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::request_too_large(64));
    assert!(h.mock.requests().is_empty());
}

/// A request body streamed in pieces, without a declared length.
fn futures_channel_body() -> (ChunkSender, http_body_util::StreamBody<ChunkStream>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    (ChunkSender(tx), http_body_util::StreamBody::new(ChunkStream(rx)))
}

struct ChunkSender(tokio::sync::mpsc::Sender<Bytes>);

impl ChunkSender {
    async fn send(&mut self, chunk: Bytes) {
        // The gateway may already have answered 413 and stopped reading: that is fine.
        let _ = self.0.send(chunk).await;
    }
}

struct ChunkStream(tokio::sync::mpsc::Receiver<Bytes>);

impl futures_util::Stream for ChunkStream {
    type Item = Result<http_body::Frame<Bytes>, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

#[tokio::test]
async fn unreachable_provider_is_502_and_tls_failure_too() {
    let mock = MockProvider::start().await;
    // A port nobody listens on: bind one, then free it.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let cfg = config(
        &format!("http://{closed}"),
        &format!("https://{}", mock.addr()),
        1 << 20,
        Duration::from_secs(5),
    );
    let h = Harness::with_config(mock, cfg, true).await;
    // The snapshot's credentials use the node defaults for openai and anthropic.
    let refused = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    let status = refused.status();
    assert_answer(status, &body_of(refused).await, &Answer::upstream_unreachable());
    // TLS spoken to a plain-HTTP port fails the handshake.
    let tls = h.send(h.post("/v1/messages").header("x-api-key", KEY), MESSAGES).await;
    let status = tls.status();
    assert_answer(status, &body_of(tls).await, &Answer::upstream_unreachable().shaped(WireShape::Anthropic));
}

#[tokio::test]
async fn a_stalled_tls_handshake_or_a_dns_failure_is_502() {
    // Accepts connections and never says a word: the TLS handshake cannot complete.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let mock = MockProvider::start().await;
    let cfg = config(
        &format!("https://{silent_addr}"),
        "http://recovea-test-host.invalid",
        1 << 20,
        Duration::from_secs(30),
    );
    let h = Harness::with_config(mock, cfg, true).await;
    let started = std::time::Instant::now();
    let stalled = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    let status = stalled.status();
    assert_answer(status, &body_of(stalled).await, &Answer::upstream_unreachable());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the connect timeout, not the response timeout, applies"
    );
    let dns = h.send(h.post("/v1/messages").header("x-api-key", KEY), MESSAGES).await;
    let status = dns.status();
    assert_answer(status, &body_of(dns).await, &Answer::upstream_unreachable().shaped(WireShape::Anthropic));
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408() {
    let h = Harness::start().await;
    let (mut sender, body) = futures_channel_body();
    let request = Request::post(format!("{}/v1/chat/completions", h.url))
        .header("authorization", format!("Bearer {KEY}"))
        .body(body)
        .expect("request");
    let client = Client::builder(TokioExecutor::new()).build_http();
    let pending = tokio::spawn(async move { client.request(request).await });
    sender.send(Bytes::from_static(b"{\"model\":")).await;
    // The sender stays open and silent: the gateway's body timeout (2 s here) answers.
    let response = pending.await.expect("join").expect("answer");
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::request_body_timeout());
    drop(sender);
    assert!(h.mock.requests().is_empty());
}

#[tokio::test]
async fn a_request_without_a_body_is_sent_without_one() {
    let h = Harness::start().await;
    let response = h
        .send(
            Request::get(format!("{}/v1/models", h.url)).header("authorization", format!("Bearer {KEY}")),
            "",
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = &h.mock.requests()[0];
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.header("content-length"), None);
    assert_eq!(seen.header("transfer-encoding"), None);
}

#[tokio::test]
async fn no_response_headers_within_the_timeout_is_504() {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_millis(200));
    let h = Harness::with_config(mock, cfg, true).await;
    h.mock.script(Behaviour::default().delay_ms(5_000));
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::upstream_timeout());
}

#[tokio::test]
async fn provider_errors_come_back_unchanged() {
    let h = Harness::start().await;
    let error = serde_json::json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}});
    h.mock.script(
        Behaviour::error(429).body(error.clone()).header("retry-after", "7").header("x-custom", "kept"),
    );
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers().get("retry-after").expect("kept"), "7");
    assert_eq!(response.headers().get("x-custom").expect("kept"), "kept");
    let body: serde_json::Value = serde_json::from_slice(&body_of(response).await).expect("json");
    assert_eq!(body, error);
}

#[tokio::test]
async fn hop_by_hop_headers_do_not_cross() {
    let h = Harness::start().await;
    h.mock.script(
        Behaviour::default()
            .header("keep-alive", "timeout=5")
            .header("proxy-authenticate", "Basic")
            .header("x-kept", "yes"),
    );
    let response = h
        .send(
            h.post_as("/v1/chat/completions", KEY)
                .header("connection", "keep-alive, x-connection-private")
                .header("x-connection-private", "1")
                .header("proxy-authorization", "Basic abc")
                .header("te", "trailers")
                .header("x-kept", "yes"),
            CHAT,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers().get("keep-alive"), None);
    assert_eq!(response.headers().get("proxy-authenticate"), None);
    assert_eq!(response.headers().get("x-kept").expect("end-to-end header"), "yes");
    let seen = &h.mock.requests()[0];
    for dropped in ["x-connection-private", "proxy-authorization", "te", "keep-alive"] {
        assert_eq!(seen.header(dropped), None, "{dropped}");
    }
    assert_eq!(seen.header("x-kept"), Some("yes"));
    assert_eq!(seen.header("host"), Some(h.mock.addr().to_string().as_str()));
}

#[tokio::test]
async fn streams_pass_through_event_by_event() {
    let h = Harness::start().await;
    // Ten seconds between events: a buffering proxy could not deliver the first one in time.
    h.mock.script(Behaviour::default().chunk_delay_ms(10_000));
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response
            .headers()
            .get("content-type")
            .expect("type")
            .to_str()
            .expect("text")
            .starts_with("text/event-stream")
    );
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first event arrives before the stream ends")
        .expect("a frame")
        .expect("data");
    let first = first.into_data().expect("data frame");
    assert!(first.starts_with(b"data: {"), "{first:?}");
    assert!(std::str::from_utf8(&first).expect("utf-8").contains("chat.completion.chunk"));
}

#[tokio::test]
async fn a_cut_stream_reaches_the_client_as_a_cut_stream() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().cut_after_events(2));
    let stream =
        r#"{"model":"claude","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post("/v1/messages").header("x-api-key", KEY), stream).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.into_body().collect().await.is_err(), "the client must see the stream end abnormally");
}

#[tokio::test]
async fn without_a_snapshot_requests_fail_open_with_the_key_stripped() {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    let h = Harness::with_config(mock, cfg, false).await;
    assert!(!h.gateway.is_ready());
    let response = h
        .send(
            h.post("/v1/chat/completions")
                .header("x-recovea-key", KEY)
                .header("authorization", "Bearer sk-client-own"),
            CHAT,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = h.send(h.post("/v1/messages").header("x-api-key", KEY), MESSAGES).await;
    // The mock accepts any key; a real provider would refuse, and that answer would come back as is.
    assert_eq!(response.status(), StatusCode::OK);
    let seen = h.mock.requests();
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-client-own"));
    assert_eq!(seen[1].header("x-api-key"), None, "no managed key on a fail-open pass");
    assert_no_recovea_key(&h.mock);

    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    assert!(text.contains("recovea_fail_open_total{reason=\"no_snapshot\"} 2\n"), "{text}");
    let ready = h.send(Request::get(format!("{}/readyz", h.url)), "").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn unknown_paths_are_404_and_health_endpoints_answer() {
    let h = Harness::start().await;
    let response = h.send(h.post_as("/v2/whatever", KEY), CHAT).await;
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::unknown_route());
    for path in ["/healthz", "/readyz"] {
        let response = h.send(Request::get(format!("{}{path}", h.url)), "").await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert!(response.headers().contains_key("x-request-id"));
    }
}

/// Reads one answer off a raw connection: its status line and its body (content-length framed).
async fn raw_answer(io: &mut tokio::net::TcpStream, read: &mut Vec<u8>) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let deadline = Duration::from_secs(5);
    loop {
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(read[..end].to_vec()).expect("text");
            let length: usize = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
                .map_or(0, |l| l.parse().expect("length"));
            if read.len() >= end + 4 + length {
                let body = String::from_utf8(read[end + 4..end + 4 + length].to_vec()).expect("text");
                read.drain(..end + 4 + length);
                return (head.lines().next().unwrap_or_default().to_owned(), body);
            }
        }
        let n = tokio::time::timeout(deadline, io.read_buf(read)).await.expect("in time").expect("read");
        assert_ne!(n, 0, "closed: {}", String::from_utf8_lossy(read));
    }
}

#[tokio::test]
async fn requests_the_gateway_hands_to_hyper_are_answered_alike() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start().await;
    let address = h.url.trim_start_matches("http://");
    let head = |version: &str, extra: &str| {
        format!(
            "POST /v1/chat/completions {version}\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
            CHAT.len()
        )
    };
    // Head and body together: the gateway's own HTTP/1.1.
    let mut io = tokio::net::TcpStream::connect(address).await.expect("connect");
    let mut read = Vec::new();
    io.write_all(format!("{}{CHAT}", head("HTTP/1.1", "")).as_bytes()).await.expect("write");
    let (status, body) = raw_answer(&mut io, &mut read).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("chat.completion"), "{body}");
    // `Expect: 100-continue`: the rest of the connection is hyper's, and it goes on.
    io.write_all(head("HTTP/1.1", "expect: 100-continue\r\n").as_bytes()).await.expect("write");
    let (status, _) = raw_answer(&mut io, &mut read).await;
    assert_eq!(status, "HTTP/1.1 100 Continue");
    io.write_all(CHAT.as_bytes()).await.expect("write");
    let (status, body) = raw_answer(&mut io, &mut read).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("chat.completion"), "{body}");
    io.write_all(format!("{}{CHAT}", head("HTTP/1.1", "")).as_bytes()).await.expect("write");
    assert_eq!(raw_answer(&mut io, &mut read).await.0, "HTTP/1.1 200 OK");
    // HTTP/1.0, and a head that does not parse.
    let mut io = tokio::net::TcpStream::connect(address).await.expect("connect");
    io.write_all(format!("{}{CHAT}", head("HTTP/1.0", "")).as_bytes()).await.expect("write");
    let (status, body) = raw_answer(&mut io, &mut Vec::new()).await;
    assert!(status.ends_with(" 200 OK") && body.contains("chat.completion"), "{status} {body}");
    let mut io = tokio::net::TcpStream::connect(address).await.expect("connect");
    io.write_all(b"POST /v1/chat completions HTTP/1.1\r\n\r\n").await.expect("write");
    assert_eq!(raw_answer(&mut io, &mut Vec::new()).await.0, "HTTP/1.1 400 Bad Request");
    assert_eq!(h.receipts(4).await.len(), 4);
    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    for (reason, n) in
        [("expect", 1), ("http10", 1), ("unparsable", 1), ("chunked_body", 0), ("trailing_body", 0)]
    {
        let line = format!("recovea_http1_handed_over_total{{reason=\"{reason}\"}} {n}\n");
        assert!(text.contains(&line), "{line}{text}");
    }
}

/// Everything the gateway sends on a raw connection until it closes it, cut into answers
/// (`content-length` framed): each head with its `date` and `x-request-id` values masked, and its
/// body.
async fn answers_until_closed(address: &str, request: &[u8]) -> Vec<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut io = tokio::net::TcpStream::connect(address).await.expect("connect");
    io.write_all(request).await.expect("write");
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), io.read_to_end(&mut read))
        .await
        .expect("the gateway closes the connection")
        .expect("read");
    let mut answers = Vec::new();
    let mut rest = &read[..];
    while !rest.is_empty() {
        let end = rest.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole head") + 4;
        let head = std::str::from_utf8(&rest[..end]).expect("text");
        let mut length = 0;
        let masked: String = head
            .split_inclusive("\r\n")
            .map(|line| match line.split_once(": ") {
                Some(("date", _)) => "date: <date>\r\n".to_owned(),
                Some(("x-request-id", id)) => {
                    assert!(id.starts_with("req_"), "{id}");
                    "x-request-id: <id>\r\n".to_owned()
                }
                Some(("content-length", n)) => {
                    length = n.trim_end().parse().expect("length");
                    line.to_owned()
                }
                _ => line.to_owned(),
            })
            .collect();
        let body = std::str::from_utf8(&rest[end..end + length]).expect("text").to_owned();
        answers.push((masked, body));
        rest = &rest[end + length..];
    }
    answers
}

/// The gateway's answer to a head it refuses, as both its HTTP/1.1 and hyper write it.
fn refused(answer: &Answer, reason: &str) -> (String, String) {
    let head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\nx-request-id: <id>\r\n\
         content-length: {}\r\ndate: <date>\r\n\r\n",
        answer.status,
        answer.body.len()
    );
    (head, String::from_utf8(answer.body.clone()).expect("utf-8"))
}

/// A first request that hands the connection to hyper (HTTP/1.0, kept alive), and its answer.
const TO_HYPER: &str = "GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n";

/// A chat request with `lines` (which frame its body) in its head.
fn chat(lines: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\n\
         {lines}\r\n{CHAT}"
    )
}

/// The chat request's own `content-length` line.
fn length() -> String {
    format!("content-length: {}\r\n", CHAT.len())
}

fn chunked_chat(lines: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\n{lines}\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    )
}

/// RFC 9112, section 3.2, whether the gateway's own HTTP/1.1 reads the request or hyper does (which
/// would pass it on): a 400, the connection closed, nothing forwarded.
#[tokio::test]
async fn a_request_without_exactly_one_host_is_refused_and_never_forwarded() {
    let h = Harness::start().await;
    let address = h.url.trim_start_matches("http://");
    let expected = refused(&Answer::invalid_host(), "Bad Request");
    let length = length();
    let cases = [
        chat(&length),
        chat(&format!("host: gw\r\nHost: gw\r\n{length}")),
        chat(&format!("host: gw gw\r\n{length}")),
        format!("{TO_HYPER}{}", chat(&length)),
        format!("{TO_HYPER}{}", chat(&format!("host: gw\r\nhost: other\r\n{length}"))),
        format!("{TO_HYPER}{}", chunked_chat("host: gw\r\ntransfer-encoding: chunked\r\n")),
    ];
    for case in &cases {
        let answers = answers_until_closed(address, case.as_bytes()).await;
        let refusal = answers.last().expect("an answer");
        assert_eq!(refusal, &expected, "{case}");
        if case.starts_with(TO_HYPER) {
            assert_eq!(answers.len(), 2, "{case}");
            assert!(answers[0].0.starts_with("HTTP/1.0 200 OK\r\n"), "{answers:?}");
        } else {
            assert_eq!(answers.len(), 1, "{case}");
        }
    }
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");
    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    assert!(text.contains("recovea_requests_total{outcome=\"invalid_request\"} 6\n"), "{text}");
    assert!(text.contains("recovea_http1_handed_over_total{reason=\"http10\"} 3\n"), "{text}");
}

/// A body coded otherwise than in chunks alone would reach the provider still coded, labelled as
/// plain JSON: a 501, on either of the gateway's HTTP/1.1 paths, and nothing forwarded.
#[tokio::test]
async fn a_request_in_a_transfer_coding_but_chunked_is_refused_and_never_forwarded() {
    let h = Harness::start().await;
    let address = h.url.trim_start_matches("http://");
    let unsupported = refused(&Answer::unsupported_transfer_coding(), "Not Implemented");
    let invalid = refused(&Answer::invalid_transfer_encoding(), "Bad Request");
    let cases = [
        (chunked_chat("transfer-encoding: gzip, chunked\r\n"), &unsupported),
        (chunked_chat("transfer-encoding: identity, chunked\r\n"), &unsupported),
        (chunked_chat("transfer-encoding: identity\r\ntransfer-encoding: chunked\r\n"), &unsupported),
        (chunked_chat("transfer-encoding: chunked, chunked\r\n"), &invalid),
        (format!("{TO_HYPER}{}", chunked_chat("transfer-encoding: gzip, chunked\r\n")), &unsupported),
        (format!("{TO_HYPER}{}", chunked_chat("transfer-encoding: identity, chunked\r\n")), &unsupported),
        (format!("{TO_HYPER}{}", chunked_chat("transfer-encoding: chunked, chunked\r\n")), &invalid),
    ];
    for (case, expected) in &cases {
        let answers = answers_until_closed(address, case.as_bytes()).await;
        assert_eq!(answers.last(), Some(*expected), "{case}");
        assert_eq!(answers.len(), if case.starts_with(TO_HYPER) { 2 } else { 1 }, "{case}");
    }
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");
    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    assert!(text.contains("recovea_requests_total{outcome=\"unsupported_transfer_coding\"} 5\n"), "{text}");
    assert!(text.contains("recovea_requests_total{outcome=\"invalid_request\"} 2\n"), "{text}");
    // Chunked alone goes through, by hyper.
    let answers = answers_until_closed(
        address,
        format!(
            "{}{}",
            chunked_chat("transfer-encoding: chunked\r\n"),
            "GET /x HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(answers[0].0.starts_with("HTTP/1.1 200 OK\r\n"), "{answers:?}");
    assert_eq!(h.mock.requests().len(), 1);
}

/// A refused head whose path and headers were read is answered in the request's dialect, as every
/// answer of the gateway's: on an Anthropic route in Anthropic's envelope, on a Gemini route in
/// Google's, whichever of the gateway's HTTP/1.1 paths read it.
#[tokio::test]
async fn a_head_refused_on_an_anthropic_or_gemini_route_is_in_its_envelope() {
    let h = Harness::start().await;
    let address = h.url.trim_start_matches("http://");
    let messages = |lines: &str| {
        format!(
            "POST /v1/messages HTTP/1.1\r\nx-api-key: {KEY}\r\ncontent-type: application/json\r\n\
             {lines}\r\n{CHAT}"
        )
    };
    let length = length();
    let no_host = refused(&Answer::invalid_host().shaped(WireShape::Anthropic), "Bad Request");
    let coded =
        refused(&Answer::unsupported_transfer_coding().shaped(WireShape::Anthropic), "Not Implemented");
    let twice = refused(&Answer::invalid_content_length().shaped(WireShape::Anthropic), "Bad Request");
    let models_twice = format!(
        "POST /v1/models HTTP/1.1\r\nhost: gw\r\nanthropic-version: 2023-06-01\r\n{length}{length}\r\n{CHAT}"
    );
    let generate = |lines: &str| {
        format!(
            "POST /v1beta/models/gemini-2.5-flash:generateContent HTTP/1.1\r\nx-goog-api-key: {KEY}\r\n\
             {lines}\r\n{CHAT}"
        )
    };
    let gemini_no_host = refused(&Answer::invalid_host().shaped(WireShape::Gemini), "Bad Request");
    let gemini_coded =
        refused(&Answer::unsupported_transfer_coding().shaped(WireShape::Gemini), "Not Implemented");
    let cases = [
        (messages(&length), &no_host),
        (generate(&length), &gemini_no_host),
        (
            format!("{TO_HYPER}{}", generate("host: gw\r\ntransfer-encoding: gzip, chunked\r\n")),
            &gemini_coded,
        ),
        (format!("{TO_HYPER}{}", messages(&format!("host: gw\r\nhost: gw\r\n{length}"))), &no_host),
        (format!("{TO_HYPER}{}", messages("host: gw\r\ntransfer-encoding: gzip, chunked\r\n")), &coded),
        (models_twice, &twice),
    ];
    for (case, expected) in &cases {
        let answers = answers_until_closed(address, case.as_bytes()).await;
        assert_eq!(answers.last(), Some(*expected), "{case}");
        assert_eq!(answers.len(), if case.starts_with(TO_HYPER) { 2 } else { 1 }, "{case}");
    }
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");
}

/// One Content-Length rule: one line, one number. The gateway's own HTTP/1.1 refuses a list
/// (`74, 74`) and a repeated line with its answer. On a connection hyper already serves, hyper
/// refuses the list itself and keeps one of two identical lines (it passes the head on with one):
/// the other reading RFC 9110 allows, and what is forwarded carries the gateway's own length.
#[tokio::test]
async fn a_request_whose_length_is_repeated_is_refused_by_the_gateways_own_http1() {
    let h = Harness::start().await;
    let address = h.url.trim_start_matches("http://");
    let expected = refused(&Answer::invalid_content_length(), "Bad Request");
    let (n, length) = (CHAT.len(), length());
    for case in [
        chat(&format!("host: gw\r\n{length}{length}")),
        chat(&format!("host: gw\r\ncontent-length: {n}, {n}\r\n")),
    ] {
        assert_eq!(
            answers_until_closed(address, case.as_bytes()).await,
            std::slice::from_ref(&expected),
            "{case}"
        );
    }
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");

    let list = format!("{TO_HYPER}{}", chat(&format!("host: gw\r\ncontent-length: {n}, {n}\r\n")));
    let answers = answers_until_closed(address, list.as_bytes()).await;
    assert_eq!(
        answers[1],
        ("HTTP/1.0 400 Bad Request\r\ncontent-length: 0\r\ndate: <date>\r\n\r\n".into(), String::new())
    );
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");

    let repeated =
        format!("{TO_HYPER}{}", chat(&format!("host: gw\r\nconnection: close\r\n{length}{length}")));
    let answers = answers_until_closed(address, repeated.as_bytes()).await;
    assert!(answers[1].0.starts_with("HTTP/1.1 200 OK\r\n"), "{answers:?}");
    let forwarded = h.mock.requests();
    assert_eq!(forwarded.len(), 1);
    let lengths: Vec<&str> = forwarded[0]
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(lengths, [n.to_string()], "one length, the gateway's");
}

// Metering: every admitted request gets exactly one receipt, from the provider's usage or an estimate.

fn receipt_for<'r>(receipts: &'r [Receipt], response_request_id: &str) -> &'r Receipt {
    receipts.iter().find(|r| r.request_id == response_request_id).expect("a receipt for the request")
}

fn request_id(response: &Response<hyper::body::Incoming>) -> String {
    response.headers().get("x-request-id").expect("id").to_str().expect("text").to_owned()
}

#[tokio::test]
async fn a_chat_completion_gets_an_exact_receipt() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().usage(serde_json::json!({
        "prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
        "prompt_tokens_details": {"cached_tokens": 400},
        "completion_tokens_details": {"reasoning_tokens": 50}
    })));
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions?x=1", KEY), body).await;
    let id = request_id(&response);
    body_of(response).await;
    let receipts = h.receipts(1).await;
    let r = receipt_for(&receipts, &id);
    assert_eq!(r.id, id.replace("req_", "rcpt_"));
    assert_eq!(
        (r.org_id.as_str(), r.key_id.as_str(), r.provider.as_str()),
        ("org_acme", "key_live", "openai")
    );
    assert_eq!(
        (r.endpoint.as_str(), r.status, r.stream, r.model.as_deref()),
        ("/v1/chat/completions", 200, false, Some("gpt-4o"))
    );
    assert_eq!(
        (r.input_tokens, r.cached_input_tokens, r.output_tokens, r.reasoning_tokens),
        (1000, 400, 200, 50)
    );
    // 600 x $2.50 + 400 x $1.25 + 200 x $10.00 per million tokens.
    assert_eq!(r.cost_usd.to_usd_string(), "0.004");
    assert_eq!((r.usage_source, r.priced, r.node_id.as_str()), (UsageSource::Provider, true, "node_test"));
    assert!(r.finished_at >= r.started_at);
}

#[tokio::test]
async fn a_stream_that_did_not_ask_for_usage_is_metered_without_showing_it() {
    let h = Harness::start().await;
    let stream =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    let id = request_id(&response);
    let text = String::from_utf8(body_of(response).await.to_vec()).expect("utf-8");
    assert!(!text.contains("\"prompt_tokens\""), "the client did not ask for usage: {text}");
    assert!(text.contains("This") && text.ends_with("data: [DONE]\n\n"), "{text}");
    let sent = h.mock.requests()[0].body_json().expect("json");
    assert_eq!(sent["stream_options"]["include_usage"], true, "the gateway asked for usage upstream");

    let receipts = h.receipts(1).await;
    let r = receipt_for(&receipts, &id);
    // The mock counts 1 + the words of the messages (3) in and 5 pieces out.
    assert_eq!(
        (r.input_tokens, r.output_tokens, r.stream, r.usage_source),
        (3, 5, true, UsageSource::Provider)
    );
    // 3 x $0.15 + 5 x $0.60 per million tokens.
    assert_eq!(r.cost_usd.to_usd_string(), "0.00000345");
}

#[tokio::test]
async fn a_stream_that_asked_for_usage_gets_it() {
    let h = Harness::start().await;
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    let text = String::from_utf8(body_of(response).await.to_vec()).expect("utf-8");
    assert!(text.contains("\"prompt_tokens\":2"), "{text}");
    assert_eq!(h.receipts(1).await[0].input_tokens, 2);
}

#[tokio::test]
async fn anthropic_cache_reads_and_writes_are_input_and_priced_apart() {
    let h = Harness::start().await;
    let usage = serde_json::json!({"input_tokens": 100, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 300, "output_tokens": 50});
    h.mock.script(Behaviour::default().usage(usage));
    let stream = r#"{"model":"claude-sonnet-4-5","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post("/v1/messages").header("x-api-key", KEY), stream).await;
    body_of(response).await;
    let r = h.receipts(1).await.remove(0);
    assert_eq!(
        (r.input_tokens, r.cached_input_tokens, r.cache_write_input_tokens, r.output_tokens),
        (420, 300, 20, 50)
    );
    // 100 x $3 + 300 x $0.30 + 20 x $3.75 + 50 x $15 per million tokens.
    assert_eq!(r.cost_usd.to_usd_string(), "0.001215");
    assert_eq!(r.provider, "anthropic");
}

#[tokio::test]
async fn a_cut_stream_still_gets_an_estimated_receipt() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().cut_after_events(3));
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Say hello to everyone"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    assert!(response.into_body().collect().await.is_err());
    let r = h.receipts(1).await.remove(0);
    assert_eq!(r.usage_source, UsageSource::Estimated);
    assert!(r.input_tokens > 0, "input is estimated from the request");
    assert!(r.priced && r.cost_usd.0 > 0);
    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    assert!(text.contains("recovea_receipts_estimated_total 1\n"), "{text}");
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_still_gets_its_receipt() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().chunk_delay_ms(2_000));
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    let mut body = response.into_body();
    body.frame().await.expect("a first frame").expect("data");
    drop(body);
    let r = h.receipts(1).await.remove(0);
    assert_eq!((r.usage_source, r.status), (UsageSource::Estimated, 200));
}

#[tokio::test]
async fn provider_errors_cost_nothing_and_unpriced_models_cost_the_fallback() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::error(500));
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    body_of(response).await;
    let unpriced = r#"{"model":"mystery-model-9","messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), unpriced).await;
    body_of(response).await;
    let receipts = h.receipts(2).await;
    let error = receipts.iter().find(|r| r.status == 500).expect("the error's receipt");
    assert_eq!((error.cost_usd.0, error.input_tokens, error.output_tokens), (0, 0, 0));
    let mystery = receipts.iter().find(|r| r.model.as_deref() == Some("mystery-model-9")).expect("receipt");
    assert_eq!((mystery.priced, mystery.input_tokens), (false, 2));
    assert_eq!(mystery.priced_as.as_deref(), Some("fallback:openai"));
    // The openai kind's dearest prices: 2 input x $150 + 5 output x $600 per million tokens.
    assert_eq!(mystery.cost_usd, Nanos::parse_usd("0.0033").expect("amount"));
    let metrics = h.send(Request::get(format!("{}/metrics", h.url)), "").await;
    let text = String::from_utf8(body_of(metrics).await.to_vec()).expect("utf-8");
    assert!(text.contains("recovea_receipts_unpriced_total 1\n"), "{text}");
}

#[tokio::test]
async fn refusals_and_fail_open_passes_write_no_receipt_but_admitted_failures_do() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let mock = MockProvider::start().await;
    let cfg = config(&format!("http://{closed}"), &mock.url(), 1 << 20, Duration::from_secs(5));
    let h = Harness::with_config(mock, cfg, true).await;
    let response = h.send(h.post_as("/v1/chat/completions", UNKNOWN_KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = h.send(h.post_as("/v1/chat/completions", NO_CREDENTIALS_KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let receipts = h.receipts(1).await;
    assert_eq!((receipts[0].status, receipts[0].cost_usd.0), (502, 0));

    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    let unready = Harness::with_config(mock, cfg, false).await;
    let response = unready
        .send(
            unready
                .post("/v1/chat/completions")
                .header("x-recovea-key", KEY)
                .header("authorization", "Bearer sk-own"),
            CHAT,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await;
    // Then a state, and an admitted request: its receipt is the first delivered (the spool keeps
    // the order receipts were written in), so the pass before it wrote none.
    unready.gateway.install_snapshot(std::sync::Arc::new(snapshot(&unready.mock.url(), Vec::new())));
    let response = unready.send(unready.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::OK);
    let admitted = response.headers()["x-request-id"].to_str().expect("ascii").to_owned();
    body_of(response).await;
    let receipts = unready.receipts(1).await;
    assert_eq!(receipts[0].request_id, admitted, "a fail-open pass writes no receipt: {receipts:?}");
}

// Caps: 402 at the line, 503 when spend cannot be confirmed, soft caps that never refuse.

fn assert_refusal(status: StatusCode, headers: &http::HeaderMap, body: &[u8], expected: &Answer) {
    assert_answer(status, body, expected);
    for (name, value) in &expected.headers {
        assert_eq!(headers.get(*name).map(|v| v.to_str().expect("text")), Some(value.as_str()), "{name}");
    }
}

/// $0.00075 a request: 1000 input and 1000 output tokens of gpt-4o-mini.
const COSTLY: &str = r#"{"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000}"#;

#[tokio::test]
async fn sequential_requests_are_refused_exactly_at_the_line() {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    let caps = vec![cap("cap_month", Scope::Organization, Window::Month, "0.00225", true)];
    let h = Harness::with_caps(mock, cfg, true, caps).await;
    h.confirm(&InProcess::default()).await;
    h.mock.script(Behaviour::default().usage(serde_json::from_str(COSTLY).expect("json")).times(10));
    let chat = r#"{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"Hi"}]}"#;
    for n in 1..=3 {
        let response = h.send(h.post_as("/v1/chat/completions", KEY), chat).await;
        assert_eq!(response.status(), StatusCode::OK, "request {n} is under the line");
        body_of(response).await;
    }
    // Three requests spent exactly the limit: the fourth is refused without reaching the provider.
    let response = h.send(h.post_as("/v1/chat/completions", KEY), chat).await;
    let (status, headers) = (response.status(), response.headers().clone());
    assert_refusal(
        status,
        &headers,
        &body_of(response).await,
        &Answer::budget_exceeded("organization", "month", "Monthly"),
    );
    assert_eq!(headers.get("retry-after"), None, "a reached cap gives no retry hint");
    assert_eq!(h.mock.requests().len(), 3);
    // Another organization's request after it (its own key, no cap): its receipt would come after
    // one the refused request should not have.
    let byo = h.post("/v1/chat/completions").header("x-recovea-key", BYO_KEY);
    let admitted = h.send(byo.header("authorization", "Bearer sk-client-own"), chat).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    let id = admitted.headers()["x-request-id"].to_str().expect("text").to_owned();
    body_of(admitted).await;
    assert_eq!(h.receipts_through(&id).await.len(), 4, "a refused request has no receipt");
}

/// What `cap` holds reserved now, in its current window.
fn reserved_on(h: &Harness, cap: &str, window: Window) -> Nanos {
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let cap = CapId::parse(cap).expect("id");
    let org = OrgId::parse("org_acme").expect("id");
    recovea_core::caps::SpendView::spend(h.counters.as_ref(), &org, &cap, window.start(now)).reserved
}

/// What `body` reserves while the provider holds it a second, on a gateway whose org has `caps`
/// (the first of them read); with `next_refused`, the same request sent meanwhile is refused.
async fn reserved_in_flight(caps: Vec<Cap>, body: &str, next_refused: bool) -> Nanos {
    reserved_in_flight_at("/v1/chat/completions", caps, body, next_refused).await
}

/// [`reserved_in_flight`] for a request to `path`.
async fn reserved_in_flight_at(path: &str, caps: Vec<Cap>, body: &str, next_refused: bool) -> Nanos {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    let (cap, window) = (caps[0].id.to_string(), caps[0].window);
    let h = Harness::with_caps(mock, cfg, true, caps).await;
    h.confirm(&InProcess::default()).await;
    h.mock.script(Behaviour::default().delay_ms(1_000).times(1));
    let in_flight = h.send(h.post_as(path, KEY), body);
    let watch = async {
        h.forwarded(1).await;
        let reserved = reserved_on(&h, &cap, window);
        if next_refused {
            let refused = h.send(h.post_as(path, KEY), body).await;
            let (status, headers) = (refused.status(), refused.headers().clone());
            assert_refusal(
                status,
                &headers,
                &body_of(refused).await,
                &Answer::budget_exceeded("organization", "month", "Monthly"),
            );
        }
        reserved
    };
    let (response, reserved) = tokio::join!(in_flight, watch);
    assert_eq!(response.status(), StatusCode::OK);
    body_of(response).await;
    h.receipts(1).await;
    assert_eq!(reserved_on(&h, &cap, window), Nanos::ZERO, "the receipt settles the reservation");
    reserved
}

#[tokio::test]
async fn a_request_without_an_output_limit_reserves_the_models_most_output_under_an_armed_cap() {
    // gpt-4o-mini: $0.15 and $0.60 per Mtok, priority $0.25 and $1; at most 16,384 output tokens.
    let uncapped =
        r#"{"model":"gpt-4o-mini","service_tier":"default","messages":[{"role":"user","content":"Hi"}]}"#;
    let input = recovea_providers::usage::estimate_input_tokens(uncapped.as_bytes());
    // Prices in nano-dollars a token ($0.15 per Mtok: 150).
    let at = |input_price: u64, output_tokens: u64, output_price: u64| {
        Nanos((input * input_price + output_tokens * output_price) as i64)
    };
    // Far from any line (a soft cap alone): 1,024 output tokens, as before.
    let soft = vec![cap("cap_soft", Scope::Organization, Window::Week, "100", false)];
    assert_eq!(reserved_in_flight(soft, uncapped, false).await, at(150, 1024, 600));
    // Under an armed cap: the model's most output, 16,384 tokens.
    let armed = vec![cap("cap_month", Scope::Organization, Window::Month, "100", true)];
    assert_eq!(reserved_in_flight(armed.clone(), uncapped, false).await, at(150, 16_384, 600));
    // A tier left to the provider may be served at priority: reserved at its rates.
    let auto = uncapped.replace(r#""service_tier":"default","#, "");
    assert_eq!(reserved_in_flight(armed.clone(), &auto, false).await, at(250, 16_384, 1000));
    // An output limit is reserved as it is, armed cap or not.
    let capped = uncapped.replace(r#""service_tier""#, r#""max_tokens":100,"service_tier""#);
    assert_eq!(reserved_in_flight(armed, &capped, false).await, at(150, 100, 600));

    // At $0.005, one request's worst case ($0.0098) is past the line, its typical estimate
    // ($0.0006) far below it: while it is in flight, the next request is refused.
    let tight = vec![cap("cap_month", Scope::Organization, Window::Month, "0.005", true)];
    assert_eq!(reserved_in_flight(tight, uncapped, true).await, at(150, 16_384, 600));
}

#[tokio::test]
async fn images_and_speech_reserve_what_they_ask_for() {
    let armed = || vec![cap("cap_month", Scope::Organization, Window::Month, "100", true)];
    let usd = |usd: &str| Nanos::parse_usd(usd).expect("usd");
    // Two DALL-E 3 HD 1024x1792 images: $0.12 each, the table's price of that size and quality.
    let images = r#"{"model":"dall-e-3","prompt":"a lighthouse","n":2,"quality":"hd","size":"1024x1792"}"#;
    assert_eq!(reserved_in_flight_at("/v1/images/generations", armed(), images, false).await, usd("0.24"));
    // tts-1 speaking 4,000 characters: $15 per million characters.
    let text = "a".repeat(4_000);
    let speech = format!(r#"{{"model":"tts-1","voice":"alloy","input":"{text}"}}"#);
    assert_eq!(reserved_in_flight_at("/v1/audio/speech", armed(), &speech, false).await, usd("0.06"));
}

#[tokio::test]
async fn an_armed_cap_that_cannot_confirm_its_spend_answers_503_and_a_soft_cap_never_refuses() {
    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    // Never confirmed: the node has not synced its counters once.
    let caps = vec![cap("cap_day", Scope::Key, Window::Day, "100", true)];
    let h = Harness::with_caps(mock, cfg, true, caps).await;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    let (status, headers) = (response.status(), response.headers().clone());
    assert_refusal(
        status,
        &headers,
        &body_of(response).await,
        &Answer::budget_unverifiable("key", "day", "Daily"),
    );
    assert!(h.mock.requests().is_empty(), "the provider is never called for a refused request");
    // It clears by itself once the counters are confirmed.
    h.confirm(&InProcess::default()).await;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::OK);

    let mock = MockProvider::start().await;
    let cfg = config(&mock.url(), &mock.url(), 1 << 20, Duration::from_secs(5));
    let soft = vec![cap("cap_soft", Scope::Organization, Window::Week, "0", false)];
    let h = Harness::with_caps(mock, cfg, true, soft).await;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a soft cap at its line, never confirmed, still lets traffic through"
    );
}

#[tokio::test]
async fn a_refused_request_keeps_its_connection_unless_its_body_is_too_big_to_read() {
    let h = Harness::start().await;
    let response = h.send(h.post_as("/v1/chat/completions", UNKNOWN_KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers().get("connection"), None, "a small body is read, the connection stays");
    let big =
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(200_000));
    let response = h.send(h.post_as("/v1/chat/completions", UNKNOWN_KEY), &big).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers().get("connection").expect("connection header"), "close");
}

#[tokio::test]
async fn a_key_over_its_rate_limit_gets_429_saying_when_to_retry() {
    let h = Harness::start().await;
    for _ in 0..2 {
        let response = h.send(h.post_as("/v1/chat/completions", LIMITED_KEY), CHAT).await;
        assert_eq!(response.status(), StatusCode::OK);
        body_of(response).await;
    }
    let response = h.send(h.post_as("/v1/chat/completions", LIMITED_KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait_ms: u64 = response
        .headers()
        .get("retry-after-ms")
        .expect("ms hint")
        .to_str()
        .expect("text")
        .parse()
        .expect("number");
    assert!((29_000..=30_000).contains(&wait_ms), "two a minute: the next in about 30 s, not {wait_ms} ms");
    assert_eq!(response.headers().get("retry-after").expect("hint"), &wait_ms.div_ceil(1000).to_string());
    let status = response.status();
    assert_answer(status, &body_of(response).await, &Answer::rate_limited(wait_ms));
    assert_eq!(h.mock.requests().len(), 2, "a rate-limited request is not forwarded");
    // Other keys are not held back by this one's limit.
    let response = h.send(h.post_as("/v1/chat/completions", KEY), CHAT).await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_gone_before_the_answer_still_gets_a_receipt() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().delay_ms(30_000));
    let request = h.post_as("/v1/chat/completions", KEY);
    // The client gives up once the provider has its request, long before the answer.
    let gone = tokio::select! {
        _ = h.send(request, CHAT) => false,
        () = h.forwarded(1) => true,
    };
    assert!(gone, "the client gives up before the provider answers");
    let r = h.receipts(1).await.remove(0);
    assert_eq!((r.status, r.usage_source), (499, UsageSource::Estimated));
    assert!(r.input_tokens > 0 && r.cost_usd.0 > 0, "the provider was sent the input: it is estimated");
}

#[tokio::test]
async fn spend_already_in_flight_counts_against_a_cap_created_meanwhile() {
    let h = Harness::start().await;
    h.mock.script(Behaviour::default().delay_ms(1_000).usage(serde_json::from_str(COSTLY).expect("json")));
    let chat = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}"#;
    let request = h.post_as("/v1/chat/completions", KEY);
    let in_flight = h.send(request, chat);
    let add_cap = async {
        // The request is admitted with no cap; one arrives while the provider works.
        h.forwarded(1).await;
        let caps = vec![cap("cap_new", Scope::Organization, Window::Month, "1", true)];
        h.gateway.install_snapshot(Arc::new(snapshot(&h.mock.url(), caps)));
    };
    let (response, ()) = tokio::join!(in_flight, add_cap);
    body_of(response).await;
    h.receipts(1).await;
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let spent = recovea_core::caps::SpendView::spend(
        h.counters.as_ref(),
        &OrgId::parse("org_acme").expect("id"),
        &CapId::parse("cap_new").expect("id"),
        Window::Month.start(now),
    )
    .spent;
    assert_eq!(spent.to_usd_string(), "0.00075", "the new cap counts the request it did not see admitted");
}

// Stalls: an answer whose provider sends nothing, or whose client reads nothing, for the idle limit
// is cut, and what it held is given back.

/// How long an answer may stall in these tests.
const IDLE: Duration = Duration::from_millis(300);

/// A gateway whose answers are cut after [`IDLE`] of silence, its org under `caps`.
async fn stalling(caps: Vec<Cap>) -> Harness {
    let mock = MockProvider::start().await;
    let settings = GatewaySettings {
        stream_idle_timeout: IDLE,
        upstream_timeout: Duration::from_secs(5),
        ..support::settings(&mock.url())
    };
    let cfg = GatewayConfig::new(settings).expect("valid config");
    let h = Harness::with_caps(mock, cfg, true, caps).await;
    h.confirm(&InProcess::default()).await;
    h
}

/// Reads `body` until it ends or fails: the data it gave, and whether it ended cleanly.
async fn read_until_cut(body: hyper::body::Incoming) -> (String, bool) {
    let mut body = std::pin::pin!(body);
    let mut data = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match body.frame().await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => data.extend_from_slice(&frame.into_data().unwrap_or_default()),
            }
        }
    });
    let clean = read.await.expect("the stream ends in time");
    (String::from_utf8(data).expect("utf-8"), clean)
}

#[tokio::test]
async fn a_stream_whose_provider_stalls_is_cut_and_gets_an_estimated_receipt() {
    let h = stalling(Vec::new()).await;
    h.mock.script(Behaviour::default().stall_after_events(2));
    let stream = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stream).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (data, clean) = read_until_cut(response.into_body()).await;
    assert!(!clean, "the client sees the stream cut, not ended");
    assert_eq!(
        data.matches("data: ").count(),
        2,
        "the events sent before the stall, nothing invented: {data}"
    );
    let r = h.receipts(1).await.remove(0);
    assert_eq!((r.status, r.usage_source), (200, UsageSource::Estimated));
    assert!(r.input_tokens > 0 && r.cost_usd.0 > 0, "the input was sent: it is estimated");
}

#[tokio::test]
async fn a_stalled_stream_releases_its_reservation() {
    // One request's reservation (100,000 output tokens of gpt-4o-mini: $0.06) is past the line.
    let caps = vec![cap("cap_month", Scope::Organization, Window::Month, "0.01", true)];
    let h = stalling(caps).await;
    h.mock.script(Behaviour::default().stall_after_events(1));
    let stalled = r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"Hi"}]}"#;
    let chat = r#"{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"Hi"}]}"#;
    let response = h.send(h.post_as("/v1/chat/completions", KEY), stalled).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut stalled_body = response.into_body();
    stalled_body.frame().await.expect("a first event").expect("data");
    // While the stream holds its reservation, the cap refuses.
    let refused = h.send(h.post_as("/v1/chat/completions", KEY), chat).await;
    let (status, headers) = (refused.status(), refused.headers().clone());
    assert_refusal(
        status,
        &headers,
        &body_of(refused).await,
        &Answer::budget_exceeded("organization", "month", "Monthly"),
    );
    // The idle limit cuts the stall; its receipt settles the reservation at its estimated cost.
    let (_, clean) = read_until_cut(stalled_body).await;
    assert!(!clean);
    eventually(DEADLINE, "the cap admitting again after the stall was cut", || async {
        let response = h.send(h.post_as("/v1/chat/completions", KEY), chat).await;
        let status = response.status();
        body_of(response).await;
        assert!([StatusCode::OK, StatusCode::PAYMENT_REQUIRED].contains(&status), "{status}");
        (status == StatusCode::OK).then_some(())
    })
    .await;
    let receipts = h.receipts(2).await;
    let cut = receipts.iter().find(|r| r.stream).expect("the stalled stream's receipt");
    assert_eq!(cut.usage_source, UsageSource::Estimated);
    assert!(
        cut.cost_usd < Nanos::parse_usd("0.01").expect("usd"),
        "settled at its estimate, not its reservation"
    );
}

/// A big answer (12 MiB), more than a client that stops reading and the sockets between can hold.
fn big_answer() -> Behaviour {
    Behaviour::default().body(serde_json::json!({ "padding": "x".repeat(12 << 20) }))
}

/// Sends `request` on a raw connection that then reads nothing (its receive buffer small), and
/// waits for the gateway to give up on it: the receipt comes, and the connection ends short.
async fn stop_reading(h: &Harness, request: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = h.url.trim_start_matches("http://").parse().expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("buffer size");
    let mut io = socket.connect(address).await.expect("connect");
    io.write_all(request).await.expect("write");
    // Reading nothing: the answer's body can only be dropped by the idle limit.
    let r = h.receipts(1).await.remove(0);
    assert_eq!(r.status, 200);
    let mut total = 0usize;
    let mut chunk = vec![0u8; 1 << 20];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match io.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection is closed");
    assert!(total < 12 << 20, "the answer was cut ({total} bytes read)");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_and_gets_its_receipt() {
    let h = stalling(Vec::new()).await;
    h.mock.script(big_answer());
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    stop_reading(&h, head.as_bytes()).await;
}

#[tokio::test]
async fn a_client_that_stops_reading_on_a_connection_handed_to_hyper_is_cut_too() {
    let h = stalling(Vec::new()).await;
    h.mock.script(big_answer());
    // A chunked request body: the connection is hyper's.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    );
    stop_reading(&h, head.as_bytes()).await;
}

#[tokio::test]
async fn an_http2_stream_its_client_gives_no_room_is_cut() {
    let h = stalling(Vec::new()).await;
    h.mock.script(big_answer());
    // hyper's client grants a stream room only as its body is read: this one never is, while the
    // connection itself keeps being read.
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let request = h
        .post("/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Full::new(Bytes::from(CHAT)))
        .expect("request");
    let response = client.request(request).await.expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    let r = h.receipts(1).await.remove(0);
    assert_eq!(r.status, 200);
    // Read now, the stream ends short of the answer.
    let (data, clean) = read_until_cut(response.into_body()).await;
    assert!(!clean && data.len() < 12 << 20, "cut after {} bytes", data.len());
}

/// A chat body of exactly `bytes` bytes.
fn chat_of(bytes: usize) -> String {
    let head = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    format!("{head}{}{tail}", "x".repeat(bytes - head.len() - tail.len()))
}

/// The node's memory for request bodies: an organization that holds its whole share makes its own
/// next large body wait, unread, and answer `503 body_memory_busy` when no room comes in the body's
/// time, while another organization's large body is read and answered meanwhile.
#[tokio::test]
async fn a_body_without_room_in_the_nodes_memory_is_503_while_another_organizations_is_read() {
    let mock = MockProvider::start().await;
    let settings =
        GatewaySettings { body_read_timeout: Duration::from_secs(1), ..support::settings(&mock.url()) };
    // 1 MiB bodies at most, 2 MiB for all of them: one organization may hold 1 MiB.
    let config =
        GatewayConfig::new(GatewaySettings { body_memory: Some(2 << 20), ..settings }).expect("valid config");
    let h = Harness::with_config(mock, config, true).await;
    // The first body holds org_acme's share while the provider takes 3 s to answer it.
    h.mock.script(Behaviour::default().delay_ms(3000));
    let holder = {
        let request = h.post_as("/v1/chat/completions", KEY).body(Full::new(Bytes::from(chat_of(1 << 20))));
        let client = h.client.clone();
        tokio::spawn(async move { client.request(request.expect("request")).await.expect("answer").status() })
    };
    h.mock.received(1).await;
    let waiter = {
        let request = h.post_as("/v1/chat/completions", KEY).body(Full::new(Bytes::from(chat_of(100 << 10))));
        let client = h.client.clone();
        tokio::spawn(async move {
            let response = client.request(request.expect("request")).await.expect("answer");
            (response.status(), body_of(response).await)
        })
    };
    let other = h
        .send(
            h.post("/v1/chat/completions")
                .header("x-recovea-key", BYO_KEY)
                .header("authorization", "Bearer sk-client-own"),
            &chat_of(100 << 10),
        )
        .await;
    assert_eq!(other.status(), StatusCode::OK, "another organization's body finds room");
    assert!(!waiter.is_finished(), "org_acme's second body still waits for room");
    let (status, body) = waiter.await.expect("join");
    assert_answer(status, &body, &Answer::body_memory_busy());
    assert_eq!(holder.await.expect("join"), StatusCode::OK);
    assert_eq!(h.mock.requests().len(), 2, "the refused body never reached the provider");
    assert!(h.metrics().await.contains(r#"outcome="body_memory_busy""#));
}

/// A body that does not say its length is read in room that grows as it comes (doubling from
/// 64 KiB), and reaches the provider whole.
#[tokio::test]
async fn a_large_body_without_a_length_is_read_whole_in_growing_room() {
    let h = Harness::start().await;
    let body = chat_of(700 << 10);
    let (mut sender, stream) = futures_channel_body();
    let request = Request::post(format!("{}/v1/chat/completions", h.url))
        .header("authorization", format!("Bearer {KEY}"))
        .body(stream)
        .expect("request");
    let client = Client::builder(TokioExecutor::new()).build_http();
    let pending = tokio::spawn(async move { client.request(request).await });
    for piece in body.as_bytes().chunks(16 << 10) {
        sender.send(Bytes::copy_from_slice(piece)).await;
    }
    drop(sender);
    let response = pending.await.expect("join").expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(h.mock.requests()[0].body, body, "the provider got the body as sent");
}
