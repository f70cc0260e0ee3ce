//! Realtime's events, as far as metering reads them: what each server event tells (a response
//! done and its usage, a response begun, an error, the session's model and whether the server
//! answers by itself), and whether a client event asks for a response. Pure: the relay hands over
//! each whole text message.

use recovea_core::usage::Usage;
use serde::Deserialize;
use serde_json::Value;

/// What a server event tells the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// `response.done`, with its usage when it reports one.
    ResponseDone { usage: Option<Usage> },
    /// `response.created`: a response the server began (asked for, or of its own accord).
    ResponseCreated,
    /// `error`: a client event was refused (a `response.create` among them: it makes no response).
    Error,
    /// `session.created` or `session.updated`: the session's model, and whether the server starts
    /// responses by itself (turn detection on, `create_response` not off).
    Session { model: Option<String>, auto_responses: bool },
    /// Anything else: deltas, transcripts, buffers.
    Other,
}

/// The event types [`server_event`] tells apart.
const MATTERING: [&str; 5] =
    ["response.done", "response.created", "error", "session.created", "session.updated"];

/// Whether a server message may be one [`server_event`] reads, from its start: `false` only when
/// its `type` (its first member, or one after a few members of plain scalar values such as
/// `event_id`, as the providers write events) is none of those, so that the relay can let an audio
/// delta, the bulk of a session, go by unread.
pub fn may_matter(head: &[u8]) -> bool {
    leading_type(head).is_none_or(|kind| MATTERING.contains(&kind))
}

/// How many members before `type` the sniff reads past.
const MEMBERS_BEFORE_TYPE: usize = 3;

/// The event's type when the object names it early (`{"type":"...",` or `{"event_id":"...",
/// "type":"...",`), read from its start.
fn leading_type(head: &[u8]) -> Option<&str> {
    let mut rest = skip_space(head.strip_prefix(b"{")?);
    for _ in 0..=MEMBERS_BEFORE_TYPE {
        let (name, after) = plain_string(rest)?;
        let value = skip_space(skip_space(after).strip_prefix(b":")?);
        if name == b"type" {
            return std::str::from_utf8(plain_string(value)?.0).ok();
        }
        let after = match value.first()? {
            b'"' => plain_string(value)?.1,
            b'-' | b'0'..=b'9' => {
                let n = value
                    .iter()
                    .take_while(|b| matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .count();
                &value[n..]
            }
            _ => return None,
        };
        rest = skip_space(skip_space(after).strip_prefix(b",")?);
    }
    None
}

/// A string without escapes at the start of `bytes`: its contents, and what follows it.
fn plain_string(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = bytes.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    (rest[end] == b'"').then(|| (&rest[..end], &rest[end + 1..]))
}

fn skip_space(bytes: &[u8]) -> &[u8] {
    let n = bytes.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &bytes[n..]
}

/// Reads a server event (one whole text message).
pub fn server_event(message: &[u8]) -> ServerEvent {
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
        #[serde(default)]
        response: Option<Response>,
        #[serde(default)]
        session: Option<Value>,
    }
    #[derive(Deserialize)]
    struct Response {
        usage: Option<RealtimeUsage>,
    }
    let Ok(event) = crate::from_json::<Event<'_>>(message) else { return ServerEvent::Other };
    match event.kind {
        "response.done" => ServerEvent::ResponseDone {
            usage: event.response.and_then(|r| r.usage).map(RealtimeUsage::into_usage),
        },
        "response.created" => ServerEvent::ResponseCreated,
        "error" => ServerEvent::Error,
        "session.created" | "session.updated" => {
            let session = event.session.unwrap_or(Value::Null);
            let model = session.get("model").and_then(Value::as_str).map(str::to_owned);
            // GA keeps turn detection under `audio.input`; the beta at the session's top.
            let turn = session
                .get("audio")
                .and_then(|a| a.get("input"))
                .and_then(|i| i.get("turn_detection"))
                .or_else(|| session.get("turn_detection"));
            let auto_responses = turn.is_some_and(|turn| {
                turn.is_object() && turn.get("create_response").and_then(Value::as_bool) != Some(false)
            });
            ServerEvent::Session { model, auto_responses }
        }
        _ => ServerEvent::Other,
    }
}

/// The model a Realtime upgrade names in its query: OpenAI's `model`, or Azure's `deployment`.
pub fn model_in_query(path_and_query: &str) -> Option<&str> {
    let (_, query) = path_and_query.split_once('?')?;
    let value = |name: &str| {
        query.split('&').find_map(|pair| pair.split_once('=').filter(|(n, _)| *n == name).map(|(_, v)| v))
    };
    value("model").or_else(|| value("deployment")).filter(|model| !model.is_empty() && model.len() <= 256)
}

/// Whether a client event (one whole text message) asks the server for a response.
pub fn asks_for_response(message: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
    }
    crate::from_json::<Event<'_>>(message).is_ok_and(|event| event.kind == "response.create")
}

/// `response.usage`: totals, and their text, audio, image and cached parts.
#[derive(Deserialize)]
struct RealtimeUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_token_details: Option<InputDetails>,
    #[serde(default)]
    output_token_details: Option<OutputDetails>,
}

#[derive(Deserialize, Default)]
struct InputDetails {
    #[serde(default)]
    audio_tokens: u64,
    #[serde(default)]
    cached_tokens: u64,
    #[serde(default)]
    cached_tokens_details: Option<CachedDetails>,
}

#[derive(Deserialize, Default)]
struct CachedDetails {
    #[serde(default)]
    audio_tokens: u64,
}

#[derive(Deserialize, Default)]
struct OutputDetails {
    #[serde(default)]
    audio_tokens: u64,
}

impl RealtimeUsage {
    /// In the receipt's terms: totals, with their audio and cached parts (image input is billed
    /// as text input).
    fn into_usage(self) -> Usage {
        let input = self.input_token_details.unwrap_or_default();
        let cached_audio = input.cached_tokens_details.unwrap_or_default().audio_tokens;
        Usage {
            input_tokens: self.input_tokens,
            cached_input_tokens: input.cached_tokens,
            audio_input_tokens: input.audio_tokens,
            cached_audio_input_tokens: cached_audio,
            output_tokens: self.output_tokens,
            audio_output_tokens: self.output_token_details.unwrap_or_default().audio_tokens,
            ..Usage::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_done_gives_its_text_audio_and_cached_tokens() {
        let done = br#"{"type":"response.done","event_id":"e1","response":{"id":"r1","status":"completed","output":[{"type":"message"}],"usage":{"total_tokens":1900,"input_tokens":900,"output_tokens":1000,"input_token_details":{"text_tokens":100,"audio_tokens":800,"image_tokens":0,"cached_tokens":300,"cached_tokens_details":{"text_tokens":100,"audio_tokens":200,"image_tokens":0}},"output_token_details":{"text_tokens":100,"audio_tokens":900}}}}"#;
        assert!(may_matter(&done[..40]));
        assert!(may_matter(&done[..5]), "too short to tell: it may");
        let usage = Usage {
            input_tokens: 900,
            cached_input_tokens: 300,
            audio_input_tokens: 800,
            cached_audio_input_tokens: 200,
            output_tokens: 1000,
            audio_output_tokens: 900,
            ..Usage::default()
        };
        assert_eq!(server_event(done), ServerEvent::ResponseDone { usage: Some(usage) });
        assert_eq!(
            server_event(br#"{"type":"response.done","response":{"usage":null}}"#),
            ServerEvent::ResponseDone { usage: None }
        );
    }

    #[test]
    fn sessions_say_their_model_and_whether_the_server_answers_by_itself() {
        let ga = br#"{"type":"session.created","session":{"model":"gpt-realtime","audio":{"input":{"turn_detection":{"type":"server_vad"}}}}}"#;
        assert_eq!(
            server_event(ga),
            ServerEvent::Session { model: Some("gpt-realtime".into()), auto_responses: true }
        );
        let manual = br#"{"type":"session.updated","session":{"turn_detection":{"type":"server_vad","create_response":false}}}"#;
        assert_eq!(server_event(manual), ServerEvent::Session { model: None, auto_responses: false });
        let none = br#"{"type":"session.updated","session":{"model":"m","audio":{"input":{"turn_detection":null}}}}"#;
        assert_eq!(
            server_event(none),
            ServerEvent::Session { model: Some("m".into()), auto_responses: false }
        );
    }

    #[test]
    fn the_model_is_read_from_the_upgrades_query() {
        assert_eq!(model_in_query("/v1/realtime?model=gpt-realtime"), Some("gpt-realtime"));
        assert_eq!(
            model_in_query("/openai/realtime?api-version=2025-04-01-preview&deployment=rt"),
            Some("rt")
        );
        assert_eq!(model_in_query("/v1/realtime"), None);
        assert_eq!(model_in_query("/v1/realtime?model="), None);
    }

    #[test]
    fn client_events_ask_for_a_response_only_by_name() {
        assert!(asks_for_response(br#"{"type":"response.create","response":{"instructions":"hi"}}"#));
        assert!(asks_for_response(br#"{"event_id":"x","type":"response.create"}"#));
        assert!(!asks_for_response(br#"{"type":"response.cancel"}"#));
        assert!(!asks_for_response(
            br#"{"type":"conversation.item.create","item":{"type":"response.create"}}"#
        ));
        assert!(!asks_for_response(b"not json"));
        assert!(!may_matter(br#"{"type":"response.output_audio.delta","delta":"AAAA"#));
        assert!(!may_matter(br#"{ "type" : "response.output_text.delta""#));
        // After a few plain members, as providers write `event_id` first.
        assert!(!may_matter(br#"{"event_id":"event_1","type":"response.output_audio.delta","delta":"AA"#));
        assert!(!may_matter(br#"{"event_id":"e","output_index":0,"content_index":-1,"type":"x.delta"}"#));
        assert!(may_matter(br#"{"event_id":"event_1","type":"response.done","response":{"#));
        // Behind an object, too many members, or an escape, the type may be anything: read the
        // whole message.
        assert!(may_matter(br#"{"event_id":"e1","response":{"type":"x"#));
        assert!(may_matter(br#"{"a":1,"b":2,"c":3,"d":4,"type":"x.delta"}"#));
        assert!(may_matter(br#"{"event_id":"e\"1","type":"x.delta"}"#));
        assert!(may_matter(br#"{"type":"response.done","event_id":"e"#));
        assert!(may_matter(br#"{"type":"resp\u006fnse.done"}"#), "an escape is not judged");
        assert_eq!(server_event(br#"{"type":"response.output_text.delta"}"#), ServerEvent::Other);
    }
}
