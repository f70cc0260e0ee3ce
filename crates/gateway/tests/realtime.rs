//! Realtime sessions through a node, over real sockets: the upgrade is forwarded, both directions
//! relayed, each `response.done` metered at its own prices, and the session cut at an armed cap's
//! line, the client's next `response.create` never reaching the provider.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::usage::UsageSource;
use recovea_core::window::Window;
use recovea_counters::InProcess;
use recovea_gateway::GatewayConfig;
use recovea_testkit::wait::{DEADLINE, eventually};
use recovea_testkit::{MockProvider, RealtimeUsage, UNFINISHED_RESPONSE};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

mod support;

use support::Harness;

const KEY: &str = "rk_live0000000000000000000000000000000000000001";
/// RFC 6455's sample key.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

type Ws = WebSocketStream<TcpStream>;

async fn node(caps: Vec<Cap>) -> Harness {
    node_with(caps, "openai", ProviderKind::OpenAi, None, None).await
}

/// A node whose organization's one credential is `name`, of `kind`, pointing at the mock; the
/// key allowed only `allowed` models, and at most `in_flight` requests at once, when given.
async fn node_with(
    caps: Vec<Cap>,
    name: &str,
    kind: ProviderKind,
    allowed: Option<&[&str]>,
    in_flight: Option<u32>,
) -> Harness {
    let mock = MockProvider::start().await;
    let config = GatewayConfig::new(support::settings(&mock.url())).expect("config");
    let org = OrgId::parse("org_acme").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone());
    let credential =
        ProviderCredential::new(name.into(), kind, Some(mock.url()), "sk-managed-realtime".into());
    b.provider(&org, credential);
    for cap in caps {
        b.cap(cap);
    }
    b.key(hash_secret(KEY), KeyId::parse("key_live").expect("id"), org, None);
    if let Some(models) = allowed {
        let list = ModelAllowlist::parse(models.iter().map(|m| (*m).to_owned()).collect()).expect("list");
        b.key_allowed_models(hash_secret(KEY), list);
    }
    if let Some(limit) = in_flight {
        b.key_max_concurrent_requests(hash_secret(KEY), limit);
    }
    let h = Harness::serve(mock, config, Some(b.build())).await;
    h.confirm(&InProcess::default()).await;
    h
}

fn cap(limit_usd: &str) -> Cap {
    support::cap("cap_1", Scope::Organization, Window::Month, limit_usd, true)
}

/// The node's answer to an upgrade: its status and head, and the socket when it switched.
async fn upgrade(h: &Harness, path: &str) -> (u16, String, Option<Ws>) {
    let address = h.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
         Authorization: Bearer {KEY}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("handshake");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.expect("the response head"));
    }
    let head = String::from_utf8(head).expect("ASCII").to_lowercase();
    let status: u16 = head[9..12].parse().expect("a status");
    let ws = (status == 101).then_some(());
    match ws {
        Some(()) => (status, head, Some(WebSocketStream::from_raw_socket(stream, Role::Client, None).await)),
        None => (status, head, None),
    }
}

/// The next event of type `kind` (others skipped), or the close frame's code when the socket closes.
async fn next(ws: &mut Ws, kind: &str) -> Result<Value, Option<CloseCode>> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("in time");
        match message {
            Some(Ok(Message::Text(text))) => {
                let event: Value = serde_json::from_str(&text).expect("json");
                if event["type"] == kind || event["type"] == "error" {
                    return Ok(event);
                }
            }
            Some(Ok(Message::Close(frame))) => return Err(frame.map(|f| f.code)),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return Err(None),
        }
    }
}

async fn send(ws: &mut Ws, event: Value) {
    ws.send(Message::text(event.to_string())).await.expect("send");
}

#[tokio::test]
async fn a_session_is_relayed_and_each_response_metered_at_its_own_prices() {
    let h = node(Vec::new()).await;
    // gpt-realtime: $4 / $16 text, $32 / $64 audio, $0.40 cached.
    let audio = RealtimeUsage {
        input_text_tokens: 1_000,
        input_audio_tokens: 9_000,
        cached_text_tokens: 500,
        cached_audio_tokens: 1_000,
        output_text_tokens: 2_000,
        output_audio_tokens: 9_000,
        ..RealtimeUsage::default()
    };
    h.mock.queue_realtime_usage([audio, RealtimeUsage::text(10, 5)]);
    let (status, head, ws) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 101, "{head}");
    assert!(!head.contains("permessage-deflate"), "no extension was negotiated: {head}");
    let mut ws = ws.expect("a socket");
    assert_eq!(next(&mut ws, "session.created").await.expect("event")["type"], "session.created");
    send(&mut ws, json!({"type": "response.create"})).await;
    let done = next(&mut ws, "response.done").await.expect("event");
    assert_eq!(done["response"]["usage"]["output_token_details"]["audio_tokens"], 9_000);
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.done").await.expect("event");
    ws.send(Message::Ping(b"hi".to_vec().into())).await.expect("ping");
    let pong = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(Ok(Message::Pong(data))) = ws.next().await {
                return data;
            }
        }
    })
    .await
    .expect("a pong");
    assert_eq!(&pong[..], b"hi");
    ws.close(None).await.expect("close");

    let receipts = h.receipts(2).await;
    let first = &receipts[0];
    assert_eq!((first.endpoint.as_str(), first.model.as_deref()), ("/v1/realtime", Some("gpt-realtime")));
    assert_eq!(
        (first.audio_input_tokens, first.cached_audio_input_tokens, first.audio_output_tokens),
        (9_000, 1_000, 9_000)
    );
    // Text in: (1,000 - 500 cached) x $4; cached text 500 x $0.40; audio in (9,000 - 1,000) x $32;
    // cached audio 1,000 x $0.40; text out 2,000 x $16; audio out 9,000 x $64.
    let expected = 500 * 4_000 + 500 * 400 + 8_000 * 32_000 + 1_000 * 400 + 2_000 * 16_000 + 9_000 * 64_000;
    assert_eq!(first.cost_usd, Nanos(expected));
    assert_ne!(receipts[0].id, receipts[1].id, "one receipt a response");
    // The provider got the managed key, never the Recovea key.
    let upgrade = h.mock.requests().into_iter().find(|r| r.method == "GET").expect("the upgrade");
    assert!(upgrade.headers.iter().any(|(n, v)| n == "authorization" && v == "Bearer sk-managed-realtime"));
    assert!(!upgrade.headers.iter().any(|(_, v)| v.contains("rk_")));
}

#[tokio::test]
async fn a_session_holds_its_place_among_the_keys_requests_in_flight_until_it_closes() {
    let h = node_with(Vec::new(), "openai", ProviderKind::OpenAi, None, Some(1)).await;
    let (status, _, ws) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 101);
    let mut ws = ws.expect("a socket");
    next(&mut ws, "session.created").await.expect("the session is open");
    // While it is open, the key's one place is taken: a second session is refused.
    let (status, head, _) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 429, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    ws.close(None).await.expect("close");
    // Closed, it gives its place back.
    eventually(DEADLINE, "the session's place given back", || async {
        let (status, _, _) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
        assert!([101, 429].contains(&status), "{status}");
        (status == 101).then_some(())
    })
    .await;
}

#[tokio::test]
async fn at_the_line_the_next_response_create_is_not_forwarded_and_the_session_is_cut() {
    // The first response costs $1.04 (1,000 audio tokens in, 16,000 out at $64): past $1.00.
    let h = node(vec![cap("1.00")]).await;
    let costly =
        RealtimeUsage { input_audio_tokens: 1_000, output_audio_tokens: 16_000, ..RealtimeUsage::default() };
    h.mock.queue_realtime_usage([costly]);
    let (status, _, ws) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 101);
    let mut ws = ws.expect("a socket");
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.done").await.expect("the first response");
    h.receipts(1).await;
    send(&mut ws, json!({"type": "response.create", "response": {"instructions": "more"}})).await;
    let error = next(&mut ws, "error").await.expect("the error event");
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "insufficient_quota", "code": "budget_exceeded", "message": "Monthly spend cap reached.", "param": null}})
    );
    assert_eq!(next(&mut ws, "none").await, Err(Some(CloseCode::Policy)), "closed with 1008");
    let creates = h
        .mock
        .requests()
        .into_iter()
        .filter(|r| r.method == "WS" && String::from_utf8_lossy(&r.body).contains("response.create"))
        .count();
    assert_eq!(creates, 1, "the second response.create never reached the provider");
    assert_eq!(h.metric("recovea_realtime_cuts_total").await, 1);

    // The line reached, a new session is refused at its upgrade like any request.
    let (status, _, _) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 402);
}

#[tokio::test]
async fn a_response_cut_with_its_session_is_billed_for_what_it_had_read() {
    let h = node(Vec::new()).await;
    h.mock.queue_realtime_usage([
        RealtimeUsage { input_audio_tokens: 2_000, output_audio_tokens: 100, ..RealtimeUsage::default() }
            .to_json(),
        json!(UNFINISHED_RESPONSE),
    ]);
    let (status, _, ws) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 101);
    let mut ws = ws.expect("a socket");
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.done").await.expect("the first response");
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.created").await.expect("the second response begins");
    // The client leaves before the second response ends: the provider bills what it read.
    drop(ws);

    let receipts = h.receipts(2).await;
    let cut = receipts.iter().find(|r| r.usage_source == UsageSource::Estimated).expect("the cut response");
    assert_eq!((cut.input_tokens, cut.audio_input_tokens, cut.output_tokens), (2_000, 2_000, 0));
    // 2,000 audio tokens in at $32 per million.
    assert_eq!(cut.cost_usd, Nanos(2_000 * 32_000));
    assert!(cut.request_id.ends_with(".r2"), "{}", cut.request_id);
}

#[tokio::test]
async fn a_stopping_node_closes_its_sessions_going_away_and_bills_what_they_began() {
    let mut h = node(Vec::new()).await;
    h.mock.queue_realtime_usage([json!(UNFINISHED_RESPONSE)]);
    let before = h.metric("recovea_client_connections").await;
    let (status, _, ws) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 101);
    let mut ws = ws.expect("a socket");
    let during = h.metric("recovea_client_connections").await;
    assert_eq!(during, before + 1, "a session holds its connection");
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.created").await.expect("the response begins");
    h.stop();
    assert_eq!(next(&mut ws, "none").await, Err(Some(CloseCode::Away)), "closed with 1001");
    let receipts = h.receipts(1).await;
    assert_eq!(receipts[0].usage_source, UsageSource::Estimated, "the unfinished response");
}

#[tokio::test]
async fn an_azure_realtime_session_goes_to_the_resource_with_its_key_and_is_metered() {
    let h = node_with(Vec::new(), "azure", ProviderKind::AzureOpenAi, None, None).await;
    h.mock.queue_realtime_usage([RealtimeUsage::text(1_000, 100).to_json()]);
    let path = "/openai/realtime?api-version=2025-04-01-preview&deployment=gpt-realtime";
    let (status, head, ws) = upgrade(&h, path).await;
    assert_eq!(status, 101, "{head}");
    let mut ws = ws.expect("a socket");
    send(&mut ws, json!({"type": "response.create"})).await;
    next(&mut ws, "response.done").await.expect("a response");
    ws.close(None).await.expect("close");
    let receipts = h.receipts(1).await;
    assert_eq!(
        (receipts[0].endpoint.as_str(), receipts[0].provider.as_str(), receipts[0].model.as_deref()),
        ("/openai/realtime", "azure", Some("gpt-realtime"))
    );
    // gpt-realtime's text prices: 1,000 in at $4, 100 out at $16 per million.
    assert_eq!(receipts[0].cost_usd, Nanos(1_000 * 4_000 + 100 * 16_000));
    let upgrade = h.mock.requests().into_iter().find(|r| r.method == "GET").expect("the upgrade");
    assert_eq!(upgrade.path, path);
    assert_eq!(upgrade.header("api-key"), Some("sk-managed-realtime"));
    assert!(!upgrade.headers.iter().any(|(_, v)| v.contains("rk_")));
}

#[tokio::test]
async fn an_upgrade_the_provider_refuses_goes_back_as_it_came_with_a_free_receipt() {
    let h = node_with(Vec::new(), "azure", ProviderKind::AzureOpenAi, None, None).await;
    // Azure's legacy path without its api-version: the provider answers 404, switching nothing.
    let (status, head, ws) = upgrade(&h, "/openai/realtime?deployment=gpt-realtime").await;
    assert_eq!(status, 404, "{head}");
    assert!(ws.is_none());
    let receipts = h.receipts(1).await;
    assert_eq!(
        (receipts[0].status, receipts[0].endpoint.as_str(), receipts[0].cost_usd),
        (404, "/openai/realtime", Nanos::ZERO),
        "a request like any other: its receipt, free"
    );
    assert_eq!(h.metric("recovea_realtime_sessions").await, 0, "no session was opened");
}

#[tokio::test]
async fn a_websocket_upgrade_elsewhere_than_realtime_is_outside_sight() {
    let h = node(vec![cap("1000.00")]).await;
    let (status, head, _) = upgrade(&h, "/v1/responses").await;
    assert_eq!(status, 402, "{head}");
    assert!(h.mock.requests().is_empty(), "nothing reached the provider");
    assert_eq!(
        h.metric(
            "recovea_cap_refusals_total{code=\"budget_unmeterable\",scope=\"organization\",window=\"month\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_realtime_session_for_a_model_the_key_may_not_use_is_refused_403() {
    let h = node_with(Vec::new(), "openai", ProviderKind::OpenAi, Some(&["gpt-4o-mini"]), None).await;
    // The session's model is in its query: the allowlist holds it as it holds a body's.
    let (status, head, _) = upgrade(&h, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(status, 403, "{head}");
    assert!(h.mock.requests().is_empty(), "a refused session never reaches the provider");
    let (status, head, _) = upgrade(&h, "/v1/realtime?model=gpt-4o-mini").await;
    assert_eq!(status, 101, "an allowed model's session goes through: {head}");
}
