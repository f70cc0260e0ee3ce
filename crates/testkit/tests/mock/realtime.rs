//! Realtime sessions over real sockets: a raw RFC 6455 handshake, then tungstenite's client.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{Method, StatusCode};
use recovea_testkit::{
    Behaviour, DEFAULT_REALTIME_USAGE, MockProvider, REPLY_PIECES, REPLY_TEXT, RealtimeUsage,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::{call, post};

type Ws = WebSocketStream<TcpStream>;

/// RFC 6455's sample key and the accept value it must produce.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// What the server answered a handshake with.
struct Handshake {
    status: u16,
    head: String,
    body: Vec<u8>,
    ws: Option<Ws>,
}

async fn handshake(mock: &MockProvider, path: &str, headers: &[(&str, &str)]) -> Handshake {
    let mut stream = TcpStream::connect(mock.addr()).await.expect("connect");
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n",
        mock.addr()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("send the handshake");
    // Byte by byte, so that no frame sent right after the head is read with it.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await.expect("the response head"));
    }
    let head = String::from_utf8(head).expect("an ASCII head").to_lowercase();
    let status = head[9..12].parse().expect("a status code");
    if status == 101 {
        let ws = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
        return Handshake { status, head, body: Vec::new(), ws: Some(ws) };
    }
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().expect("a length"));
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.expect("the error body");
    Handshake { status, head, body, ws: None }
}

async fn connect(mock: &MockProvider, path: &str) -> Ws {
    let answer = handshake(mock, path, &[("Authorization", "Bearer sk-test")]).await;
    assert_eq!(answer.status, 101, "{}", answer.head);
    answer.ws.expect("a socket")
}

async fn next_message(ws: &mut Ws) -> Message {
    tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("a frame in time")
        .expect("the socket open")
        .expect("a valid frame")
}

/// The next server event, pings and pongs skipped.
async fn next_event(ws: &mut Ws) -> Value {
    loop {
        match next_message(ws).await {
            Message::Text(text) => return serde_json::from_str(&text).expect("a JSON event"),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("expected an event, got {other:?}"),
        }
    }
}

async fn send(ws: &mut Ws, event: &Value) {
    ws.send(Message::text(event.to_string())).await.expect("send an event");
}

/// Events up to and including `response.done`.
async fn response_events(ws: &mut Ws) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let event = next_event(ws).await;
        let done = event["type"] == "response.done";
        events.push(event);
        if done {
            return events;
        }
    }
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().expect("a type")).collect()
}

async fn wait_for_sessions(mock: &MockProvider, open: usize) {
    let what = format!("{open} sessions open");
    recovea_testkit::eventually(recovea_testkit::wait::DEADLINE, &what, || async {
        (mock.realtime_sessions() == open).then_some(())
    })
    .await;
}

#[tokio::test]
async fn realtime_session_reports_the_queued_usages_in_order() {
    let mock = MockProvider::start().await;
    let first = RealtimeUsage {
        input_audio_tokens: 13,
        cached_text_tokens: 64,
        output_audio_tokens: 91,
        ..RealtimeUsage::text(119, 30)
    };
    let second = json!({"total_tokens": 3, "input_tokens": 1, "output_tokens": 2});
    let queued = post(&mock, "/__mock/realtime/usage", json!([first.to_json(), second])).await;
    assert_eq!(queued.status, StatusCode::NO_CONTENT);

    let answer =
        handshake(&mock, "/v1/realtime?model=gpt-realtime", &[("Authorization", "Bearer sk-test")]).await;
    assert_eq!(answer.status, 101);
    assert!(
        answer.head.contains(&format!("sec-websocket-accept: {}", ACCEPT.to_lowercase())),
        "{}",
        answer.head
    );
    assert!(answer.head.contains("upgrade: websocket"));
    let mut ws = answer.ws.expect("a socket");

    let created = next_event(&mut ws).await;
    assert_eq!(created["type"], "session.created");
    assert!(created["event_id"].is_string());
    assert_eq!(created["session"]["type"], "realtime");
    assert_eq!(created["session"]["model"], "gpt-realtime");
    assert_eq!(created["session"]["output_modalities"], json!(["text"]));
    assert_eq!(mock.realtime_sessions(), 1);
    let state = call(&mock, Method::GET, "/__mock/realtime", None).await.json();
    assert_eq!(state, json!({"open_sessions": 1, "queued_usages": 2}));

    send(
        &mut ws,
        &json!({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}),
    )
    .await;
    assert_eq!(next_event(&mut ws).await["type"], "session.updated");
    let item =
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi"}]});
    send(&mut ws, &json!({"type": "conversation.item.create", "item": item})).await;
    let added = next_event(&mut ws).await;
    assert_eq!(added["type"], "conversation.item.added");
    assert_eq!(added["item"]["content"], item["content"]);
    assert_eq!(next_event(&mut ws).await["type"], "conversation.item.done");
    send(&mut ws, &json!({"type": "input_audio_buffer.append", "audio": "AAAA"})).await;

    send(&mut ws, &json!({"type": "response.create"})).await;
    let events = response_events(&mut ws).await;
    let mut expected = vec!["response.created", "response.output_item.added", "response.content_part.added"];
    expected.extend(REPLY_PIECES.map(|_| "response.output_text.delta"));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]);
    assert_eq!(types(&events), expected);
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert!(events[0]["response"]["usage"].is_null());
    let text: String = events.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(text, REPLY_TEXT);
    let done = &events[events.len() - 1]["response"];
    assert_eq!(done["object"], "realtime.response");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0], json!({"type": "output_text", "text": REPLY_TEXT}));
    assert_eq!(done["usage"], first.to_json());
    assert_eq!(done["usage"]["total_tokens"], 253);

    send(&mut ws, &json!({"type": "response.create"})).await;
    assert_eq!(response_events(&mut ws).await.last().expect("done")["response"]["usage"], second);
    send(&mut ws, &json!({"type": "response.create", "response": {"instructions": "Again."}})).await;
    let usage = response_events(&mut ws).await.last().expect("done")["response"]["usage"].clone();
    assert_eq!(usage, DEFAULT_REALTIME_USAGE.to_json());

    send(&mut ws, &json!({"type": "response.fly"})).await;
    let error = next_event(&mut ws).await;
    assert_eq!(
        (error["type"].as_str(), error["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error"))
    );

    // Pings are answered at once, with their payload.
    ws.send(Message::Ping(b"are you there".to_vec().into())).await.expect("ping");
    match next_message(&mut ws).await {
        Message::Pong(payload) => assert_eq!(&payload[..], b"are you there"),
        other => panic!("expected a pong, got {other:?}"),
    }

    // Every client event reached the log, after the handshake.
    let log = mock.requests();
    assert_eq!((log[0].method.as_str(), log[0].path.as_str()), ("GET", "/v1/realtime?model=gpt-realtime"));
    let events: Vec<Value> = log[1..]
        .iter()
        .map(|r| {
            assert_eq!((r.method.as_str(), r.path.as_str()), ("WS", "/v1/realtime?model=gpt-realtime"));
            r.body_json().expect("the raw JSON text")
        })
        .collect();
    assert_eq!(
        types(&events),
        [
            "session.update",
            "conversation.item.create",
            "input_audio_buffer.append",
            "response.create",
            "response.create",
            "response.create",
            "response.fly",
        ]
    );
    let wire = call(&mock, Method::GET, "/__mock/requests", None).await.json();
    assert_eq!(wire[4]["method"], "WS");
    assert_eq!(wire[4]["body"], r#"{"type":"response.create"}"#);

    // The client closes: the mock answers the close frame and the session ends.
    ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Normal, reason: "done".into() })))
        .await
        .expect("close");
    match next_message(&mut ws).await {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Normal),
        other => panic!("expected the close reply, got {other:?}"),
    }
    wait_for_sessions(&mock, 0).await;
}

#[tokio::test]
async fn realtime_audio_output_when_asked() {
    let mock = MockProvider::start().await;
    let mut ws = connect(&mock, "/v1/realtime?model=gpt-realtime").await;
    next_event(&mut ws).await;
    send(
        &mut ws,
        &json!({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}}),
    )
    .await;
    assert_eq!(next_event(&mut ws).await["session"]["output_modalities"], json!(["audio"]));
    send(&mut ws, &json!({"type": "response.create"})).await;
    let events = response_events(&mut ws).await;
    let audio: Vec<&Value> = events.iter().filter(|e| e["type"] == "response.output_audio.delta").collect();
    assert_eq!(audio.len(), REPLY_PIECES.len());
    assert!(audio.iter().all(|e| e["delta"].as_str().is_some_and(|d| !d.is_empty() && d.len() % 4 == 0)));
    let transcript: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_audio_transcript.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(transcript, REPLY_TEXT);
    let done = &events[events.len() - 1]["response"];
    assert_eq!(done["output_modalities"], json!(["audio"]));
    assert_eq!(done["output"][0]["content"][0], json!({"type": "output_audio", "transcript": REPLY_TEXT}));

    // A response may ask for text in an audio session.
    send(&mut ws, &json!({"type": "response.create", "response": {"output_modalities": ["text"]}})).await;
    let events = response_events(&mut ws).await;
    assert!(types(&events).contains(&"response.output_text.delta"));
}

#[tokio::test]
async fn realtime_handshake_needs_a_key_and_takes_azure_paths() {
    let mock = MockProvider::start().await;
    let refused = handshake(&mock, "/v1/realtime?model=gpt-realtime", &[]).await;
    assert_eq!(refused.status, 401);
    let error: Value = serde_json::from_slice(&refused.body).expect("a JSON error");
    assert_eq!(error["error"]["code"], "invalid_api_key");
    assert_eq!(mock.realtime_sessions(), 0);

    let not_upgraded = call(&mock, Method::GET, "/v1/realtime?model=gpt-realtime", None).await;
    assert_eq!(not_upgraded.status, StatusCode::BAD_REQUEST);
    // The script applies to the handshake like to any request.
    mock.script(Behaviour::error(429).header("retry-after", "2"));
    let limited =
        handshake(&mock, "/v1/realtime?model=gpt-realtime", &[("Authorization", "Bearer sk-test")]).await;
    assert_eq!(limited.status, 429);
    assert!(limited.head.contains("retry-after: 2"));

    let azure = "/openai/realtime?api-version=2025-04-01-preview&deployment=my-realtime";
    let answer = handshake(&mock, azure, &[("api-key", "azure-key")]).await;
    assert_eq!(answer.status, 101, "{}", answer.head);
    let mut ws = answer.ws.expect("a socket");
    assert_eq!(next_event(&mut ws).await["session"]["model"], "my-realtime");
    let no_version = handshake(&mock, "/openai/realtime?deployment=my-realtime", &[("api-key", "k")]).await;
    assert_eq!(no_version.status, 404);

    let mut ws = connect(&mock, "/openai/v1/realtime?model=gpt-realtime-mini").await;
    assert_eq!(next_event(&mut ws).await["session"]["model"], "gpt-realtime-mini");

    // The beta protocol's names when the handshake asks for it.
    let answer = handshake(
        &mock,
        "/v1/realtime?model=gpt-4o-realtime-preview",
        &[("Authorization", "Bearer sk-test"), ("OpenAI-Beta", "realtime=v1")],
    )
    .await;
    let mut ws = answer.ws.expect("a socket");
    assert!(next_event(&mut ws).await["session"].get("modalities").is_some());
    send(&mut ws, &json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": []}})).await;
    assert_eq!(next_event(&mut ws).await["type"], "conversation.item.created");
    send(&mut ws, &json!({"type": "response.create"})).await;
    assert!(types(&response_events(&mut ws).await).contains(&"response.text.delta"));
}

#[tokio::test]
async fn realtime_sessions_closed_by_the_provider() {
    let mock = MockProvider::start().await;
    let mut first = connect(&mock, "/v1/realtime?model=gpt-realtime").await;
    let mut second = connect(&mock, "/v1/realtime?model=gpt-realtime").await;
    next_event(&mut first).await;
    next_event(&mut second).await;
    assert_eq!(mock.realtime_sessions(), 2);

    let reserved = post(&mock, "/__mock/realtime/close", json!({"code": 1005})).await;
    assert_eq!(reserved.status, StatusCode::BAD_REQUEST);
    let closed = post(&mock, "/__mock/realtime/close", json!({"code": 4000, "reason": "maintenance"})).await;
    assert_eq!(closed.json(), json!({"closed": 2}));
    for ws in [&mut first, &mut second] {
        match next_message(ws).await {
            Message::Close(Some(frame)) => {
                assert_eq!(u16::from(frame.code), 4000);
                assert_eq!(frame.reason.as_str(), "maintenance");
            }
            other => panic!("expected a close frame, got {other:?}"),
        }
        // tungstenite has answered the close; the stream then ends.
        assert!(
            tokio::time::timeout(Duration::from_secs(5), ws.next()).await.expect("the end in time").is_none()
        );
    }
    wait_for_sessions(&mock, 0).await;

    // A session opened afterwards is not concerned by the earlier order.
    let mut third = connect(&mock, "/v1/realtime?model=gpt-realtime").await;
    assert_eq!(next_event(&mut third).await["type"], "session.created");
    send(&mut third, &json!({"type": "response.create"})).await;
    assert_eq!(response_events(&mut third).await.last().expect("done")["type"], "response.done");
    assert_eq!(mock.close_realtime_sessions(1001, "going away"), 1);
    assert!(matches!(next_message(&mut third).await, Message::Close(Some(f)) if f.code == CloseCode::Away));
    // Reading on sends tungstenite's close reply, which ends the session without the grace wait.
    assert!(
        tokio::time::timeout(Duration::from_secs(5), third.next()).await.expect("the end in time").is_none()
    );
    wait_for_sessions(&mock, 0).await;
}
