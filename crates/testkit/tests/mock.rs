//! The mock provider driven over real HTTP: endpoints, wire formats, script and control endpoints.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovea_testkit::{Behaviour, MockProvider, OUTPUT_TOKENS, REPLY_PIECES, REPLY_TEXT, reply_text};
use serde_json::{Value, json};

// Deferred jobs and Realtime sessions, in files of their own (under `mock/`, where cargo does not
// take them for test targets of their own).
#[path = "mock/jobs.rs"]
mod jobs;
#[path = "mock/realtime.rs"]
mod realtime;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn request(mock: &MockProvider, method: Method, path: &str, body: Option<&Value>) -> Request<Full<Bytes>> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    Request::builder()
        .method(method)
        .uri(format!("{}{path}", mock.url()))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .body(Full::new(body))
        .expect("valid request")
}

async fn call(mock: &MockProvider, method: Method, path: &str, body: Option<&Value>) -> Reply {
    let response = client().request(request(mock, method, path, body)).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("complete body").to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

async fn post(mock: &MockProvider, path: &str, body: Value) -> Reply {
    call(mock, Method::POST, path, Some(&body)).await
}

/// One SSE event: its `event:` name, if any, and its `data:`.
#[derive(Debug)]
struct Event {
    name: Option<String>,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).expect("JSON event data")
    }
}

fn parse_sse(body: &[u8]) -> Vec<Event> {
    let text = std::str::from_utf8(body).expect("UTF-8 SSE");
    assert!(text.ends_with("\n\n"), "SSE body must end with a blank line: {text:?}");
    text.trim_end_matches('\n')
        .split("\n\n")
        .map(|block| {
            let mut event = Event { name: None, data: String::new() };
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data = data.to_owned();
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            event
        })
        .collect()
}

fn chat_body(stream: bool, include_usage: Option<bool>) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello please"}]}
        ],
        "stream": stream,
    });
    if let Some(include) = include_usage {
        body["stream_options"] = json!({"include_usage": include});
    }
    body
}

/// Words in [`chat_body`] (2 + 3) plus the overhead.
const CHAT_INPUT: u64 = 6;

#[tokio::test]
async fn chat_completion_json() {
    let mock = MockProvider::start().await;
    let reply = post(&mock, "/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("x-request-id"), Some("mock-req-1"));
    let v = reply.json();
    assert!(v["id"].as_str().expect("id").starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().expect("created") > 1_600_000_000);
    assert_eq!(v["model"], "gpt-4o-mini");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY_TEXT);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["usage"],
        json!({
            "prompt_tokens": CHAT_INPUT, "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": CHAT_INPUT + OUTPUT_TOKENS,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        })
    );
}

#[tokio::test]
async fn chat_stream_with_include_usage() {
    let mock = MockProvider::start().await;
    let reply = post(&mock, "/v1/chat/completions", chat_body(true, Some(true))).await;
    assert_eq!(reply.header("content-type"), Some("text/event-stream; charset=utf-8"));
    assert!(reply.header("content-length").is_none(), "SSE goes out chunked");
    let events = parse_sse(&reply.body);
    assert_eq!(events.len(), REPLY_PIECES.len() + 4);
    assert_eq!(events.last().expect("events").data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    assert!(events.iter().all(|e| e.name.is_none()));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, REPLY_TEXT);
    let (usage_chunk, others) = chunks.split_last().expect("chunks");
    for chunk in others {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-4o-mini");
        assert_eq!(chunk.get("usage"), Some(&Value::Null), "{chunk}");
    }
    assert_eq!(others.last().expect("finish")["choices"][0]["finish_reason"], "stop");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], CHAT_INPUT);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], OUTPUT_TOKENS);
    assert_eq!(usage_chunk["usage"]["total_tokens"], CHAT_INPUT + OUTPUT_TOKENS);
}

#[tokio::test]
async fn chat_stream_without_include_usage_has_no_usage_field() {
    let mock = MockProvider::start().await;
    for include in [None, Some(false)] {
        let reply = post(&mock, "/v1/chat/completions", chat_body(true, include)).await;
        let events = parse_sse(&reply.body);
        assert_eq!(events.len(), REPLY_PIECES.len() + 3);
        assert_eq!(events.last().expect("events").data, "[DONE]");
        for event in &events[..events.len() - 1] {
            let chunk = event.json();
            assert!(chunk.get("usage").is_none(), "{chunk}");
            assert_eq!(chunk["choices"].as_array().expect("choices").len(), 1);
        }
    }
}

#[tokio::test]
async fn legacy_completions_json_and_stream() {
    let mock = MockProvider::start().await;
    let body = json!({"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time"});
    let v = post(&mock, "/v1/completions", body.clone()).await.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], REPLY_TEXT);
    assert_eq!(v["usage"], json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}));

    let mut stream = body;
    stream["stream"] = json!(true);
    stream["stream_options"] = json!({"include_usage": true});
    let events = parse_sse(&post(&mock, "/v1/completions", stream).await.body);
    assert_eq!(events.last().expect("events").data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, REPLY_TEXT);
    let (last, others) = chunks.split_last().expect("chunks");
    assert!(others.iter().all(|c| c["object"] == "text_completion" && c["usage"].is_null()));
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["total_tokens"], 10);
}

#[tokio::test]
async fn responses_json() {
    let mock = MockProvider::start().await;
    let body = json!({"model": "gpt-4o", "instructions": "Be kind", "input": "Tell me a joke"});
    let v = post(&mock, "/v1/responses", body).await.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-4o");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output"][0]["content"][0]["text"], REPLY_TEXT);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12})
    );
}

#[tokio::test]
async fn responses_stream_event_sequence() {
    let mock = MockProvider::start().await;
    let body = json!({"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}], "stream": true});
    let events = parse_sse(&post(&mock, "/v1/responses", body).await.body);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().expect("named")).collect();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(REPLY_PIECES.map(|_| "response.output_text.delta"));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    for (i, event) in events.iter().enumerate() {
        let v = event.json();
        assert_eq!(v["type"], event.name.as_deref().expect("named"));
        assert_eq!(v["sequence_number"], i);
    }
    let deltas: String = events
        .iter()
        .filter(|e| e.name.as_deref() == Some("response.output_text.delta"))
        .map(|e| e.json()["delta"].as_str().expect("delta").to_owned())
        .collect();
    assert_eq!(deltas, REPLY_TEXT);
    let created = events[0].json();
    assert_eq!(created["response"]["status"], "in_progress");
    assert!(created["response"]["usage"].is_null());
    let completed = events.last().expect("events").json();
    assert_eq!(completed["response"]["status"], "completed");
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], REPLY_TEXT);
    assert_eq!(completed["response"]["usage"]["input_tokens"], 2);
    assert_eq!(completed["response"]["usage"]["total_tokens"], 7);
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let digits: Vec<u8> = chunk.iter().filter(|c| **c != b'=').map(|c| value(*c)).collect();
        let n = digits.iter().enumerate().fold(0u32, |n, (i, d)| n | u32::from(*d) << (18 - 6 * i));
        out.extend(&n.to_be_bytes()[1..digits.len()]);
    }
    out
}

#[tokio::test]
async fn embeddings_float_and_base64_agree() {
    let mock = MockProvider::start().await;
    let input = json!(["hello world", "goodbye"]);
    let floats = post(
        &mock,
        "/v1/embeddings",
        json!({"model": "text-embedding-3-small", "input": input, "encoding_format": "float"}),
    )
    .await
    .json();
    assert_eq!(floats["object"], "list");
    assert_eq!(floats["model"], "text-embedding-3-small");
    assert_eq!(floats["usage"], json!({"prompt_tokens": 4, "total_tokens": 4}));
    let data = floats["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    assert_eq!(data[1]["object"], "embedding");

    let base64 = post(
        &mock,
        "/v1/embeddings",
        json!({"model": "text-embedding-3-small", "input": input, "encoding_format": "base64"}),
    )
    .await
    .json();
    for (f, b) in data.iter().zip(base64["data"].as_array().expect("data")) {
        let bytes = decode_base64(b["embedding"].as_str().expect("base64 string"));
        let decoded: Vec<f64> =
            bytes.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().expect("4 bytes")))).collect();
        let expected: Vec<f64> =
            f["embedding"].as_array().expect("floats").iter().map(|v| v.as_f64().expect("f64")).collect();
        assert_eq!(decoded.len(), recovea_testkit::DEFAULT_EMBEDDING_DIMENSIONS);
        assert_eq!(decoded, expected);
    }

    let tokens = post(&mock, "/v1/embeddings", json!({"model": "m", "input": [[1, 2, 3]], "dimensions": 3}))
        .await
        .json();
    assert_eq!(tokens["data"][0]["embedding"].as_array().expect("floats").len(), 3);
    assert_eq!(tokens["usage"]["prompt_tokens"], 4);

    let bad =
        post(&mock, "/v1/embeddings", json!({"model": "m", "input": "x", "encoding_format": "hex"})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");
}

fn messages_body(stream: bool) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": "Hello there"}],
        "stream": stream,
    })
}

#[tokio::test]
async fn anthropic_messages_json() {
    let mock = MockProvider::start().await;
    let reply = post(&mock, "/v1/messages", messages_body(false)).await;
    assert_eq!(reply.header("request-id"), Some("mock-req-1"));
    assert!(reply.header("x-request-id").is_none());
    let v = reply.json();
    assert!(v["id"].as_str().expect("id").starts_with("msg_"));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-sonnet-4-5");
    assert_eq!(v["content"], json!([{"type": "text", "text": REPLY_TEXT}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
               "output_tokens": 5})
    );
    let count = post(&mock, "/v1/messages/count_tokens", messages_body(false)).await.json();
    assert_eq!(count, json!({"input_tokens": 6}));
}

#[tokio::test]
async fn anthropic_messages_stream_event_sequence() {
    let mock = MockProvider::start().await;
    let reply = post(&mock, "/v1/messages", messages_body(true)).await;
    assert_eq!(reply.header("content-type"), Some("text/event-stream; charset=utf-8"));
    let events = parse_sse(&reply.body);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().expect("named")).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(REPLY_PIECES.map(|_| "content_block_delta"));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for event in &events {
        assert_eq!(event.json()["type"], event.name.as_deref().expect("named"));
    }
    let start = events[0].json();
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(
        start["message"]["usage"],
        json!({"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
               "output_tokens": 1})
    );
    let text: String = events[3..3 + REPLY_PIECES.len()]
        .iter()
        .map(|e| {
            let v = e.json();
            assert_eq!(v["delta"]["type"], "text_delta");
            v["delta"]["text"].as_str().expect("text").to_owned()
        })
        .collect();
    assert_eq!(text, REPLY_TEXT);
    let delta = events[events.len() - 2].json();
    assert_eq!(delta["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));
    assert_eq!(delta["usage"], json!({"output_tokens": 5}));
}

#[tokio::test]
async fn models_and_unknown_paths() {
    let mock = MockProvider::start().await;
    let models = call(&mock, Method::GET, "/v1/models", None).await;
    assert_eq!(models.status, StatusCode::OK);
    let v = models.json();
    assert_eq!(v["object"], "list");
    assert!(v["data"].as_array().expect("data").iter().all(|m| m["object"] == "model"));
    let one = call(&mock, Method::GET, "/v1/models/gpt-4o", None).await.json();
    assert_eq!(one["id"], "gpt-4o");

    let missing = call(&mock, Method::POST, "/v1/nothing", Some(&json!({}))).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let error = &missing.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["param"].is_null());
    assert!(error["message"].as_str().expect("message").contains("/v1/nothing"));
    assert_eq!(missing.header("x-request-id"), Some("mock-req-3"));

    let bad_json = call(&mock, Method::POST, "/v1/messages", None).await;
    assert_eq!(bad_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad_json.json()["type"], "error");
}

#[tokio::test]
async fn scripted_errors_default_bodies_and_times() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::error(429).header("retry-after", "3").times(2));
    mock.script(Behaviour::error(529));
    mock.script(Behaviour::default().status(418).body(json!({"teapot": true})));

    let first = post(&mock, "/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.header("retry-after"), Some("3"));
    assert_eq!(first.header("x-request-id"), Some("mock-req-1"));
    let error = first.json();
    assert_eq!(error["error"]["type"], "requests");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert!(error["error"]["param"].is_null());
    assert!(error["error"]["message"].is_string());

    let second = post(&mock, "/v1/messages", messages_body(true)).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.header("content-type"), Some("application/json"));
    assert_eq!(second.json()["type"], "error");
    assert_eq!(second.json()["error"]["type"], "rate_limit_error");

    let third = post(&mock, "/v1/messages", messages_body(false)).await;
    assert_eq!(third.status.as_u16(), 529);
    assert_eq!(third.json()["error"]["type"], "overloaded_error");

    let fourth = post(&mock, "/v1/responses", json!({"input": "x"})).await;
    assert_eq!(fourth.status.as_u16(), 418);
    assert_eq!(fourth.json(), json!({"teapot": true}));

    let normal = post(&mock, "/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(normal.status, StatusCode::OK);
    assert!(normal.header("retry-after").is_none());
}

#[tokio::test]
async fn scripted_usage_replaces_usage_everywhere() {
    let mock = MockProvider::start().await;
    let usage = json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                       "prompt_tokens_details": {"cached_tokens": 40}});
    mock.script(Behaviour::default().usage(usage.clone()).times(2));
    let v = post(&mock, "/v1/chat/completions", chat_body(false, None)).await.json();
    assert_eq!(v["usage"], usage);
    let events = parse_sse(&post(&mock, "/v1/chat/completions", chat_body(true, Some(true))).await.body);
    assert_eq!(events[events.len() - 2].json()["usage"], usage);

    let usage = json!({"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 30});
    mock.script(Behaviour::default().usage(usage.clone()).times(2));
    assert_eq!(post(&mock, "/v1/messages", messages_body(false)).await.json()["usage"], usage);
    let events = parse_sse(&post(&mock, "/v1/messages", messages_body(true)).await.body);
    assert_eq!(events[0].json()["message"]["usage"], usage);
    assert_eq!(events[events.len() - 2].json()["usage"], usage);
}

#[tokio::test]
async fn scripted_pieces_lengthen_the_answer_and_its_usage() {
    let mock = MockProvider::start().await;
    let pieces = 12;
    let text = reply_text(pieces);
    assert!(text.starts_with(REPLY_TEXT) && text.ends_with("This is"), "{text:?}");
    mock.script(Behaviour::default().pieces(pieces).times(6));

    let v = post(&mock, "/v1/chat/completions", chat_body(false, None)).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(v["usage"]["completion_tokens"], pieces);
    assert_eq!(v["usage"]["total_tokens"], CHAT_INPUT + pieces as u64);

    let events = parse_sse(&post(&mock, "/v1/chat/completions", chat_body(true, Some(true))).await.body);
    assert_eq!(events.len(), pieces + 4);
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    assert_eq!(chunks.last().expect("usage chunk")["usage"]["completion_tokens"], pieces);

    let body = json!({"model": "gpt-3.5-turbo-instruct", "prompt": "Say hello", "stream": true,
                      "stream_options": {"include_usage": true}});
    let events = parse_sse(&post(&mock, "/v1/completions", body).await.body);
    assert_eq!(events.len(), pieces + 3);
    assert_eq!(events[events.len() - 2].json()["usage"]["completion_tokens"], pieces);

    let body = json!({"model": "gpt-4o-mini", "input": "Say hello", "stream": true});
    let events = parse_sse(&post(&mock, "/v1/responses", body).await.body);
    let deltas: String = events
        .iter()
        .filter(|e| e.name.as_deref() == Some("response.output_text.delta"))
        .map(|e| e.json()["delta"].as_str().expect("delta").to_owned())
        .collect();
    assert_eq!(deltas, text);
    let completed = events.last().expect("completed").json();
    assert_eq!(completed["response"]["usage"]["output_tokens"], pieces);

    let events = parse_sse(&post(&mock, "/v1/messages", messages_body(true)).await.body);
    assert_eq!(events.iter().filter(|e| e.name.as_deref() == Some("content_block_delta")).count(), pieces);
    assert_eq!(events[events.len() - 2].json()["usage"]["output_tokens"], pieces);
    let v = post(&mock, "/v1/messages", messages_body(false)).await.json();
    assert_eq!(v["content"][0]["text"], text.as_str());
    assert_eq!(v["usage"]["output_tokens"], pieces);

    // Past the script, the default answer again.
    let v = post(&mock, "/v1/chat/completions", chat_body(false, None)).await.json();
    assert_eq!(v["usage"]["completion_tokens"], OUTPUT_TOKENS);
}

#[tokio::test]
async fn delay_postpones_the_response_head() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().delay_ms(150));
    let started = Instant::now();
    let reply = post(&mock, "/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn chunk_delay_paces_events() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().chunk_delay_ms(20));
    let response = client()
        .request(request(&mock, Method::POST, "/v1/chat/completions", Some(&chat_body(true, None))))
        .await
        .expect("response");
    let started = Instant::now();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames.push(data);
        }
    }
    let events = parse_sse(&frames.concat());
    assert_eq!(events.len(), REPLY_PIECES.len() + 3);
    assert!(frames.len() >= events.len(), "one frame per event");
    assert!(started.elapsed() >= Duration::from_millis(20 * (events.len() as u64 - 1)));
}

#[tokio::test]
async fn cut_stream_ends_with_an_error_after_the_given_events() {
    let mock = MockProvider::start().await;
    for cut in [0, 3, 100] {
        mock.script(Behaviour::default().cut_after_events(cut));
        let response = client()
            .request(request(&mock, Method::POST, "/v1/messages", Some(&messages_body(true))))
            .await
            .expect("response head");
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        let mut received = Vec::new();
        loop {
            match body.frame().await {
                Some(Ok(frame)) => received.extend(frame.into_data().unwrap_or_default()),
                Some(Err(_)) => break,
                None => panic!("the body ended cleanly after {received:?}"),
            }
        }
        let sent = if received.is_empty() { 0 } else { parse_sse(&received).len() };
        assert_eq!(sent, cut.min(REPLY_PIECES.len() + 6), "cut after {cut}");
    }
    // The mock keeps serving after cutting connections.
    assert_eq!(post(&mock, "/v1/messages", messages_body(false)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn close_without_response_drops_the_connection() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().close_without_response());
    let result = client()
        .request(request(&mock, Method::POST, "/v1/chat/completions", Some(&chat_body(false, None))))
        .await;
    assert!(result.is_err(), "expected no response");
    let log = mock.requests();
    assert_eq!(log.len(), 1, "the request was read before the connection was dropped");
    assert_eq!(log[0].path, "/v1/chat/completions");
    assert_eq!(post(&mock, "/v1/chat/completions", chat_body(false, None)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn request_log_records_everything_in_order() {
    let mock = MockProvider::start().await;
    let body = chat_body(false, None);
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("{}/v1/chat/completions?api-version=1", mock.url()))
        .header("Authorization", "Bearer sk-one")
        .header("X-Custom", "a")
        .header("x-custom", "b")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    client().request(req).await.expect("response");
    call(&mock, Method::GET, "/v1/models", None).await;
    call(&mock, Method::GET, "/__mock/requests", None).await;

    let log = mock.requests();
    assert_eq!(log.len(), 2, "control calls are not recorded");
    assert_eq!(log[0].method, "POST");
    assert_eq!(log[0].path, "/v1/chat/completions?api-version=1");
    assert_eq!(log[0].header("authorization"), Some("Bearer sk-one"));
    assert_eq!(log[0].header("AUTHORIZATION"), Some("Bearer sk-one"));
    let custom: Vec<_> = log[0].headers.iter().filter(|(n, _)| n == "x-custom").map(|(_, v)| v).collect();
    assert_eq!(custom, ["a", "b"]);
    assert!(log[0].headers.iter().all(|(n, _)| *n == n.to_lowercase()));
    assert_eq!(log[0].body_json(), Some(body));
    assert_eq!(log[1].method, "GET");
    assert_eq!(log[1].path, "/v1/models");
    assert!(log[1].body.is_empty());

    mock.script(Behaviour::error(500));
    mock.reset();
    assert!(mock.requests().is_empty());
    let after = post(&mock, "/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(after.status, StatusCode::OK, "reset clears the script");
    assert_eq!(after.header("x-request-id"), Some("mock-req-1"), "reset restarts numbering");
}

#[tokio::test]
async fn control_endpoints() {
    let mock = MockProvider::start().await;
    let scripted = post(&mock, "/__mock/script", json!({"status": 503, "times": 1})).await;
    assert_eq!(scripted.status, StatusCode::NO_CONTENT);
    let unknown = post(&mock, "/__mock/script", json!({"statuss": 503})).await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    let bad_header = post(&mock, "/__mock/script", json!({"headers": {"a b": "c"}})).await;
    assert_eq!(bad_header.status, StatusCode::BAD_REQUEST);

    let failed = post(&mock, "/v1/embeddings", json!({"input": "x"})).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.json()["error"]["type"], "server_error");

    let mut log = call(&mock, Method::GET, "/__mock/requests", None).await.json();
    // When the head was read: a Unix time in milliseconds, of about now.
    let at_ms = log[0].as_object_mut().and_then(|entry| entry.remove("at_ms")).and_then(|at| at.as_u64());
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    assert!(at_ms.is_some_and(|at| u128::from(at).abs_diff(now_ms) < 60_000), "{at_ms:?}");
    assert_eq!(
        log,
        json!([{
            "method": "POST",
            "path": "/v1/embeddings",
            "headers": [
                ["content-type", "application/json"],
                ["authorization", "Bearer sk-test"],
                ["host", mock.addr().to_string()],
                ["content-length", "13"],
            ],
            "body": r#"{"input":"x"}"#,
        }])
    );

    assert_eq!(post(&mock, "/__mock/reset", json!({})).await.status, StatusCode::NO_CONTENT);
    assert_eq!(call(&mock, Method::GET, "/__mock/requests", None).await.json(), json!([]));
    assert_eq!(call(&mock, Method::GET, "/__mock/nope", None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn keep_alive_and_http2_prior_knowledge() {
    let mock = MockProvider::start().await;
    let stream = tokio::net::TcpStream::connect(mock.addr()).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    for _ in 0..3 {
        let response = sender
            .send_request(request(&mock, Method::POST, "/v1/chat/completions", Some(&chat_body(true, None))))
            .await
            .expect("response on the same connection");
        let body = response.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(parse_sse(&body).last().expect("events").data, "[DONE]");
    }

    let h2: HttpClient = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let response = h2
        .request(request(&mock, Method::POST, "/v1/messages", Some(&messages_body(false))))
        .await
        .expect("h2 response");
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(serde_json::from_slice::<Value>(&body).expect("json")["type"], "message");
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    mock.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

fn gemini_body() -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": "Say hello"}]}]})
}

#[tokio::test]
async fn gemini_generate_content_json_sse_and_array() {
    let mock = MockProvider::start().await;
    let whole = post(&mock, "/v1beta/models/gemini-2.5-flash:generateContent", gemini_body()).await;
    assert_eq!(whole.status, StatusCode::OK);
    let answer = whole.json();
    assert_eq!(answer["candidates"][0]["content"]["parts"][0]["text"], REPLY_TEXT);
    assert_eq!(answer["modelVersion"], "gemini-2.5-flash");
    let usage = &answer["usageMetadata"];
    assert_eq!(
        (usage["promptTokenCount"].as_u64(), usage["candidatesTokenCount"].as_u64()),
        (Some(3), Some(5))
    );

    // `alt=sse`: one event per piece, CRLF-terminated, the whole count in the last only.
    let sse = post(&mock, "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse", gemini_body()).await;
    assert!(sse.header("content-type").is_some_and(|v| v.starts_with("text/event-stream")));
    let text = std::str::from_utf8(&sse.body).expect("utf-8");
    let events: Vec<Value> = text
        .split("\r\n\r\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").expect("data")).expect("json"))
        .collect();
    assert_eq!(events.len(), REPLY_PIECES.len());
    let pieces: String = events
        .iter()
        .map(|e| e["candidates"][0]["content"]["parts"][0]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(pieces, REPLY_TEXT);
    assert!(
        events[..events.len() - 1].iter().all(|e| e["usageMetadata"].get("candidatesTokenCount").is_none())
    );
    let last = &events[events.len() - 1];
    assert_eq!(
        (
            last["usageMetadata"]["candidatesTokenCount"].as_u64(),
            last["candidates"][0]["finishReason"].as_str()
        ),
        (Some(OUTPUT_TOKENS), Some("STOP"))
    );

    // Without `alt=sse`: the same responses as one JSON array.
    let array = post(&mock, "/v1beta/models/gemini-2.5-flash:streamGenerateContent", gemini_body()).await;
    assert_eq!(array.json().as_array().map(Vec::len), Some(REPLY_PIECES.len()));

    let unknown = post(&mock, "/v1beta/models/gemini-2.5-flash:fly", gemini_body()).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["status"], "NOT_FOUND");
}

#[tokio::test]
async fn azure_deployments_need_an_api_version_and_answer_as_openai() {
    let mock = MockProvider::start().await;
    let no_version = post(&mock, "/openai/deployments/prod/chat/completions", chat_body(false, None)).await;
    assert_eq!(no_version.status, StatusCode::NOT_FOUND);
    let body = json!({"messages": [{"role": "user", "content": "Say hello"}]});
    let answer = post(&mock, "/openai/deployments/prod/chat/completions?api-version=2024-10-21", body).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["model"], "prod", "a body without a model: the deployment's name");
    let v1 = post(&mock, "/openai/v1/chat/completions", chat_body(false, None)).await;
    assert_eq!(v1.json()["object"], "chat.completion");
    let compat = post(&mock, "/v1beta/openai/chat/completions", chat_body(false, None)).await;
    assert_eq!(compat.json()["choices"][0]["message"]["content"], REPLY_TEXT);
}
