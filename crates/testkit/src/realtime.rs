//! OpenAI's Realtime API over WebSocket (GA event names; the beta ones when the handshake carries
//! `OpenAI-Beta: realtime=v1`).
//!
//! The mock answers the HTTP/1.1 upgrade itself (RFC 6455's `Sec-WebSocket-Accept`) and hands the
//! upgraded connection to tungstenite for framing. Every response's usage comes from a queue that
//! tests fill, so that they can check what the gateway meters for each `response.done`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::header::{CONNECTION, CONTENT_TYPE, HeaderValue, UPGRADE};
use http::request::Parts;
use http::{HeaderMap, Method, Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use crate::body::MockBody;
use crate::server::Shared;
use crate::usage::{REPLY_PIECES, REPLY_TEXT, reply_piece};

/// The model of a session whose URL names none.
const DEFAULT_MODEL: &str = "gpt-realtime";
/// RFC 6455's GUID, appended to the client's key before hashing.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// How long a session closed by the mock waits for the client's close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Bytes of silence (24 kHz 16-bit mono PCM, 10 ms) per audio delta.
const AUDIO_CHUNK: usize = 480;
/// Client events the mock accepts without answering them.
const SILENT_EVENTS: [&str; 6] = [
    "input_audio_buffer.append",
    "output_audio_buffer.clear",
    "conversation.item.retrieve",
    "conversation.item.truncate",
    "conversation.item.delete",
    "response.cancel",
];

/// Token counts of one Realtime response, as `response.done` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RealtimeUsage {
    pub input_text_tokens: u64,
    pub input_audio_tokens: u64,
    pub input_image_tokens: u64,
    /// Cached tokens are part of the input tokens above.
    pub cached_text_tokens: u64,
    pub cached_audio_tokens: u64,
    pub cached_image_tokens: u64,
    pub output_text_tokens: u64,
    pub output_audio_tokens: u64,
}

/// An event as the provider writes it: `type` first, then `event_id`, then the rest (serde_json
/// would sort them, putting a delta's `delta` before its `type`).
fn wire_event(event: &Value) -> String {
    let Value::Object(members) = event else { return event.to_string() };
    let first = ["type", "event_id"];
    let member = |(name, value): (&String, &Value)| format!("{}:{value}", Value::from(name.as_str()));
    let leading = first.iter().filter_map(|name| members.get_key_value(*name));
    let rest = members.iter().filter(|(name, _)| !first.contains(&name.as_str()));
    let parts: Vec<String> = leading.chain(rest).map(member).collect();
    format!("{{{}}}", parts.join(","))
}

/// Queued in place of a usage object, the response is begun and streamed but never ends: no
/// `.done` events, no `response.done`.
pub const UNFINISHED_RESPONSE: &str = "unfinished";

/// What a response reports when no usage is queued: 10 text tokens in, 5 out.
pub const DEFAULT_REALTIME_USAGE: RealtimeUsage = RealtimeUsage::text(10, 5);

impl RealtimeUsage {
    /// Text only, nothing cached.
    pub const fn text(input: u64, output: u64) -> Self {
        Self {
            input_text_tokens: input,
            input_audio_tokens: 0,
            input_image_tokens: 0,
            cached_text_tokens: 0,
            cached_audio_tokens: 0,
            cached_image_tokens: 0,
            output_text_tokens: output,
            output_audio_tokens: 0,
        }
    }

    /// The GA `response.usage` object.
    pub fn to_json(&self) -> Value {
        let input = self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens;
        let output = self.output_text_tokens + self.output_audio_tokens;
        let cached = self.cached_text_tokens + self.cached_audio_tokens + self.cached_image_tokens;
        json!({
            "total_tokens": input + output,
            "input_tokens": input,
            "output_tokens": output,
            "input_token_details": {
                "text_tokens": self.input_text_tokens,
                "audio_tokens": self.input_audio_tokens,
                "image_tokens": self.input_image_tokens,
                "cached_tokens": cached,
                "cached_tokens_details": {
                    "text_tokens": self.cached_text_tokens,
                    "audio_tokens": self.cached_audio_tokens,
                    "image_tokens": self.cached_image_tokens,
                },
            },
            "output_token_details": {"text_tokens": self.output_text_tokens, "audio_tokens": self.output_audio_tokens},
        })
    }
}

impl From<RealtimeUsage> for Value {
    fn from(usage: RealtimeUsage) -> Self {
        usage.to_json()
    }
}

/// The sessions of one mock and what tests set for them.
pub(crate) struct Realtime {
    usages: Mutex<VecDeque<Value>>,
    open: AtomicUsize,
    /// Numbers sessions, for their ids.
    sessions: AtomicU64,
    /// A close order for the sessions open when it is given.
    close: watch::Sender<Option<CloseOrder>>,
}

#[derive(Clone)]
struct CloseOrder {
    code: u16,
    reason: String,
}

impl Default for Realtime {
    fn default() -> Self {
        Self {
            usages: Mutex::default(),
            open: AtomicUsize::new(0),
            sessions: AtomicU64::new(0),
            close: watch::channel(None).0,
        }
    }
}

impl Realtime {
    fn usages(&self) -> MutexGuard<'_, VecDeque<Value>> {
        self.usages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn queue_usages(&self, usages: impl IntoIterator<Item = Value>) {
        self.usages().extend(usages);
    }

    pub(crate) fn queued_usages(&self) -> usize {
        self.usages().len()
    }

    fn next_usage(&self) -> Value {
        self.usages().pop_front().unwrap_or_else(|| DEFAULT_REALTIME_USAGE.to_json())
    }

    pub(crate) fn open_sessions(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Closes every open session with `code`; returns how many were open.
    pub(crate) fn close_all(&self, code: u16, reason: &str) -> usize {
        self.close.send_replace(Some(CloseOrder { code, reason: reason.to_owned() }));
        self.open_sessions()
    }

    /// Forgets the queued usages; open sessions stay open.
    pub(crate) fn reset(&self) {
        self.usages().clear();
    }
}

/// Counts a session as open for as long as it lives.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a close frame with `code` and `reason` cannot be sent, if it cannot (RFC 6455: 1004-1006
/// and 1015 are reserved, below 1000 unused, 5000 and above undefined; a control frame's payload
/// holds at most 125 bytes, 2 of them the code).
pub(crate) fn close_problem(code: u16, reason: &str) -> Option<String> {
    if !(1000..5000).contains(&code) || matches!(code, 1004..=1006 | 1015) {
        return Some(format!("close code {code} cannot be sent"));
    }
    (reason.len() > 123).then(|| format!("a close reason holds at most 123 bytes, not {}", reason.len()))
}

/// Whether `path` is one of the Realtime WebSocket paths: OpenAI's, Azure's v1 and its legacy one.
pub(crate) fn is_realtime_path(path: &str) -> bool {
    matches!(path, "/v1/realtime" | "/openai/v1/realtime" | "/openai/realtime")
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| pair.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn error(status: StatusCode, message: &str) -> Response<MockBody> {
    let mut response = Response::new(MockBody::json(crate::openai::error_body(status, message)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Answers a request on a Realtime path: 101 and a session, or the error a provider gives.
pub(crate) fn accept(shared: &Arc<Shared>, parts: &mut Parts, path_and_query: &str) -> Response<MockBody> {
    let path = parts.uri.path();
    let query = parts.uri.query().unwrap_or_default();
    if path == "/openai/realtime" && query_value(query, "api-version").is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "Resource not found: the api-version query parameter is required",
        );
    }
    let headers = &parts.headers;
    let bearer = header(headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| !token.trim().is_empty());
    let api_key = header(headers, "api-key").is_some_and(|key| !key.trim().is_empty());
    if !bearer && !api_key {
        return error(
            StatusCode::UNAUTHORIZED,
            "You didn't provide an API key. You need to provide your API key in an Authorization header \
             using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        );
    }
    let upgrade = header(headers, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let connection = header(headers, "connection")
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")));
    let key = header(headers, "sec-websocket-key").filter(|k| !k.is_empty());
    let (true, true, Some(key)) = (upgrade && parts.method == Method::GET, connection, key) else {
        return error(
            StatusCode::BAD_REQUEST,
            "The Realtime API is served over WebSocket: expected an upgrade.",
        );
    };
    if header(headers, "sec-websocket-version") != Some("13") {
        let mut response = error(StatusCode::UPGRADE_REQUIRED, "Unsupported WebSocket version: 13 only.");
        response.headers_mut().insert("sec-websocket-version", HeaderValue::from_static("13"));
        return response;
    }
    let Some(on_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
        return error(StatusCode::BAD_REQUEST, "WebSocket upgrades need HTTP/1.1.");
    };
    let accept = accept_key(key);
    let info = SessionInfo {
        path: path_and_query.to_owned(),
        model: query_value(query, "model")
            .or_else(|| query_value(query, "deployment"))
            .unwrap_or(DEFAULT_MODEL)
            .to_owned(),
        beta: header(headers, "openai-beta").is_some_and(|v| v.contains("realtime=v1")),
        number: shared.realtime.sessions.fetch_add(1, Ordering::Relaxed) + 1,
    };
    tokio::spawn(serve(Arc::clone(shared), on_upgrade, info));
    let mut response = Response::new(MockBody::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert("sec-websocket-accept", HeaderValue::try_from(accept).expect("base64 is ASCII"));
    response
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
fn accept_key(key: &str) -> String {
    let mut sha1 = sha1_smol::Sha1::new();
    sha1.update(key.as_bytes());
    sha1.update(WEBSOCKET_GUID.as_bytes());
    crate::openai::base64_encode(&sha1.digest().bytes())
}

struct SessionInfo {
    /// The handshake's path and query, the path of the session's log entries.
    path: String,
    model: String,
    /// The beta protocol's event names.
    beta: bool,
    number: u64,
}

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

async fn serve(shared: Arc<Shared>, on_upgrade: OnUpgrade, info: SessionInfo) {
    let Ok(upgraded) = on_upgrade.await else { return };
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
    let realtime = &shared.realtime;
    realtime.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(&realtime.open);
    let mut close = realtime.close.subscribe();
    // Only orders given from now on concern this session.
    close.borrow_and_update();
    let mut stopped = shared.stopped.clone();
    let mut session =
        Session { ws, info, modalities: vec!["text".to_owned()], events: 0, items: 0, responses: 0 };
    let created = session.session_event("session.created");
    if session.send(created).await.is_err() {
        return;
    }
    let ws_method = Method::from_bytes(b"WS").expect("a valid method token");
    loop {
        tokio::select! {
            message = session.ws.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    shared.log.record(&ws_method, &session.info.path, &HeaderMap::new(), text.as_bytes());
                    let replies = session.answer(text.as_str(), &shared);
                    for reply in replies {
                        if session.send(reply).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Ok(Message::Binary(data))) => {
                    shared.log.record(&ws_method, &session.info.path, &HeaderMap::new(), &data);
                }
                // tungstenite has queued the pong; send it now rather than with the next frame.
                Some(Ok(Message::Ping(_))) => {
                    if session.ws.flush().await.is_err() {
                        return;
                    }
                }
                // The close reply is queued too; the next read sends it and ends the stream.
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return,
            },
            changed = close.changed() => {
                let order = close.borrow_and_update().clone();
                if let (Ok(()), Some(order)) = (changed, order) {
                    let frame = CloseFrame { code: CloseCode::from(order.code), reason: order.reason.into() };
                    if session.ws.send(Message::Close(Some(frame))).await.is_ok() {
                        // Wait for the client's close frame, as the closing handshake asks.
                        let _ = tokio::time::timeout(CLOSE_GRACE, async {
                            while let Some(Ok(_)) = session.ws.next().await {}
                        })
                        .await;
                    }
                }
                return;
            }
            _ = stopped.changed() => return,
        }
    }
}

/// One session's state.
struct Session {
    ws: Socket,
    info: SessionInfo,
    /// Output modalities, from the last `session.update` (text until then).
    modalities: Vec<String>,
    events: u64,
    items: u64,
    responses: u64,
}

impl Session {
    async fn send(&mut self, event: Value) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        self.ws.send(Message::text(wire_event(&event))).await
    }

    /// `event` with its `type` and a fresh `event_id`.
    fn event(&mut self, kind: &str, mut event: Value) -> Value {
        self.events += 1;
        event["type"] = json!(kind);
        event["event_id"] = json!(format!("event_mock{}_{}", self.info.number, self.events));
        event
    }

    fn modalities_key(&self) -> &'static str {
        if self.info.beta { "modalities" } else { "output_modalities" }
    }

    fn session_object(&self) -> Value {
        let mut session = json!({
            "object": "realtime.session",
            "id": format!("sess_mock{}", self.info.number),
            "model": self.info.model,
            "instructions": "",
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
        });
        session[self.modalities_key()] = json!(self.modalities);
        if self.info.beta {
            session["voice"] = json!("alloy");
            session["input_audio_format"] = json!("pcm16");
            session["output_audio_format"] = json!("pcm16");
        } else {
            session["type"] = json!("realtime");
            session["audio"] = json!({
                "input": {"format": {"type": "audio/pcm", "rate": 24000}},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"},
            });
        }
        session
    }

    fn session_event(&mut self, kind: &str) -> Value {
        let session = self.session_object();
        self.event(kind, json!({"session": session}))
    }

    fn error_event(&mut self, code: &str, message: &str, event_id: Option<&Value>) -> Value {
        let error = json!({
            "type": "invalid_request_error", "code": code, "message": message, "param": null,
            "event_id": event_id.cloned().unwrap_or(Value::Null),
        });
        self.event("error", json!({"error": error}))
    }

    /// The server events that answer one client event.
    fn answer(&mut self, text: &str, shared: &Shared) -> Vec<Value> {
        let Ok(event) = serde_json::from_str::<Value>(text) else {
            return vec![self.error_event("invalid_json", "The event is not valid JSON.", None)];
        };
        let client_id = event.get("event_id");
        match event["type"].as_str() {
            Some("session.update") => {
                let asked = &event["session"];
                let modalities = asked.get("output_modalities").or_else(|| asked.get("modalities"));
                if let Some(list) = modalities.and_then(Value::as_array) {
                    self.modalities = list.iter().filter_map(Value::as_str).map(str::to_owned).collect();
                }
                vec![self.session_event("session.updated")]
            }
            Some("conversation.item.create") => self.item_created(&event["item"]),
            Some("input_audio_buffer.commit") => {
                let item_id = self.next_item_id();
                vec![self.event(
                    "input_audio_buffer.committed",
                    json!({"previous_item_id": null, "item_id": item_id}),
                )]
            }
            Some("input_audio_buffer.clear") => vec![self.event("input_audio_buffer.cleared", json!({}))],
            Some("response.create") => {
                let usage = shared.realtime.next_usage();
                self.respond(&event["response"], usage)
            }
            Some(kind) if SILENT_EVENTS.contains(&kind) => Vec::new(),
            Some(kind) => {
                let message = format!("Invalid value: '{kind}'. It is not a client event type.");
                vec![self.error_event("invalid_value", &message, client_id)]
            }
            None => vec![self.error_event("invalid_event", "The 'type' field is missing.", client_id)],
        }
    }

    fn next_item_id(&mut self) -> String {
        self.items += 1;
        format!("item_mock{}_{}", self.info.number, self.items)
    }

    /// GA answers an added item with `conversation.item.added` then `.done`; beta with `.created`.
    fn item_created(&mut self, item: &Value) -> Vec<Value> {
        let mut item = if item.is_object() { item.clone() } else { json!({}) };
        if item.get("id").is_none() {
            item["id"] = json!(self.next_item_id());
        }
        item["object"] = json!("realtime.item");
        item["status"] = json!("completed");
        if self.info.beta {
            return vec![
                self.event("conversation.item.created", json!({"previous_item_id": null, "item": item})),
            ];
        }
        vec![
            self.event("conversation.item.added", json!({"previous_item_id": null, "item": item.clone()})),
            self.event("conversation.item.done", json!({"previous_item_id": null, "item": item})),
        ]
    }

    /// `response.created`, one delta per reply piece (audio and its transcript when audio is
    /// asked for), the `.done` events, and `response.done` with `usage`.
    fn respond(&mut self, asked: &Value, usage: Value) -> Vec<Value> {
        let modalities = asked
            .get("output_modalities")
            .or_else(|| asked.get("modalities"))
            .and_then(Value::as_array)
            .map_or_else(
                || self.modalities.clone(),
                |list| list.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            );
        let audio = modalities.iter().any(|m| m == "audio");
        let beta = self.info.beta;
        self.responses += 1;
        let response_id = format!("resp_mock_rt{}_{}", self.info.number, self.responses);
        let conversation_id = format!("conv_mock{}", self.info.number);
        let item_id = self.next_item_id();
        let name = |ga: &str, old: &str| if beta { old.to_owned() } else { ga.to_owned() };
        let part_type = match (audio, beta) {
            (true, false) => "output_audio",
            (true, true) => "audio",
            (false, false) => "output_text",
            (false, true) => "text",
        };
        let text_key = if audio { "transcript" } else { "text" };
        let part = |text: &str| json!({"type": part_type, text_key: text});
        let item = |status: &str, content: Value| {
            json!({"id": item_id, "object": "realtime.item", "type": "message", "status": status,
                   "role": "assistant", "content": content})
        };
        let response = |status: &str, output: Value, usage: Value| {
            let mut r = json!({
                "object": "realtime.response", "id": response_id, "status": status, "status_details": null,
                "output": output, "conversation_id": conversation_id, "max_output_tokens": "inf",
                "usage": usage, "metadata": null,
            });
            r[if beta { "modalities" } else { "output_modalities" }] = json!(modalities);
            r
        };
        // The fields every content event carries, plus its own.
        let at = |extra: Value| {
            let mut v = json!({"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0});
            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(extra.clone());
            }
            v
        };
        let mut events: Vec<(String, Value)> = vec![
            ("response.created".into(), json!({"response": response("in_progress", json!([]), Value::Null)})),
            (
                "response.output_item.added".into(),
                json!({"response_id": response_id, "output_index": 0, "item": item("in_progress", json!([]))}),
            ),
            ("response.content_part.added".into(), at(json!({"part": part("")}))),
        ];
        let silence = crate::openai::base64_encode(&[0; AUDIO_CHUNK]);
        for piece in (0..REPLY_PIECES.len()).map(reply_piece) {
            if audio {
                events.push((
                    name("response.output_audio.delta", "response.audio.delta"),
                    at(json!({"delta": silence})),
                ));
                events.push((
                    name("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
                    at(json!({"delta": piece})),
                ));
            } else {
                events.push((
                    name("response.output_text.delta", "response.text.delta"),
                    at(json!({"delta": piece})),
                ));
            }
        }
        if usage == UNFINISHED_RESPONSE {
            // The response never ends: what a session cut mid-response leaves behind.
            return events.into_iter().map(|(kind, body)| self.event(&kind, body)).collect();
        }
        if audio {
            events.push((name("response.output_audio.done", "response.audio.done"), at(json!({}))));
            events.push((
                name("response.output_audio_transcript.done", "response.audio_transcript.done"),
                at(json!({"transcript": REPLY_TEXT})),
            ));
        } else {
            events.push((
                name("response.output_text.done", "response.text.done"),
                at(json!({"text": REPLY_TEXT})),
            ));
        }
        let done_item = item("completed", json!([part(REPLY_TEXT)]));
        events.push(("response.content_part.done".into(), at(json!({"part": part(REPLY_TEXT)}))));
        events.push((
            "response.output_item.done".into(),
            json!({"response_id": response_id, "output_index": 0, "item": done_item.clone()}),
        ));
        events.push((
            "response.done".into(),
            json!({"response": response("completed", json!([done_item]), usage)}),
        ));
        events.into_iter().map(|(kind, body)| self.event(&kind, body)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_lead_with_their_type_and_parse_back_whole() {
        let event =
            json!({"delta": "AAAA", "type": "response.output_audio.delta", "event_id": "e1", "item_id": "i"});
        let wire = wire_event(&event);
        assert!(wire.starts_with(r#"{"type":"response.output_audio.delta","event_id":"e1","#), "{wire}");
        assert_eq!(serde_json::from_str::<Value>(&wire).expect("json"), event);
    }

    #[test]
    fn only_sendable_close_frames() {
        for code in [1000, 1011, 3000, 4999] {
            assert_eq!(close_problem(code, "bye"), None);
        }
        for code in [0, 999, 1005, 1015, 5000] {
            assert!(close_problem(code, "").is_some(), "{code}");
        }
        assert!(close_problem(1000, &"x".repeat(124)).is_some());
    }

    #[test]
    fn accept_key_matches_rfc_6455() {
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn usage_totals_add_up() {
        let usage = RealtimeUsage {
            input_audio_tokens: 13,
            cached_text_tokens: 64,
            output_audio_tokens: 91,
            ..RealtimeUsage::text(119, 30)
        }
        .to_json();
        assert_eq!(usage["total_tokens"], 253);
        assert_eq!(usage["input_tokens"], 132);
        assert_eq!(usage["output_tokens"], 121);
        assert_eq!(usage["input_token_details"]["cached_tokens"], 64);
    }
}
