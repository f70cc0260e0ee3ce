//! Making an OpenAI stream report its usage, and hiding that report from a client that did not ask.

pub(crate) mod ambiguity;
mod json_object;

use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use recovea_core::estimate::TierAsked;

use crate::sse::SseReader;
use crate::usage::input::{Checked, InputFields, Key, PaidTools, SearchTools};
use crate::walk::{Seen, Walk};
use ambiguity::{LISTED_AT_TOP, Names, NotedValue, Place, Watched};

pub use ambiguity::{Ambiguity, MAX_NAME_CHARS};

/// A held event larger than this cannot be OpenAI's usage-only chunk (a few hundred bytes), so it
/// is passed on without waiting for its end.
const MAX_HELD_EVENT_BYTES: usize = 64 << 10;

const INCLUDE_USAGE_OPTIONS: &[u8] = br#"{"include_usage":true}"#;

/// What the gateway needs to know of a request body before forwarding it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    pub model: Option<String>,
    /// `"stream": true`.
    pub stream: bool,
    /// `"stream_options": {"include_usage": true}`: the client wants the usage chunk itself.
    pub client_asked_usage: bool,
    /// The most output the client allows (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`, or Gemini's `generationConfig.maxOutputTokens`), for the reservation a
    /// spend cap makes before the answer is known.
    pub max_output_tokens: Option<u64>,
    /// `"background": true`: the Responses API runs the request as a job and answers at once.
    pub background: bool,
    /// An images or audio request's own facts (size, quality, `n`, characters, audio bytes), read
    /// by [`crate::media::read`] on those paths alone; `None` elsewhere.
    pub media: Option<Box<recovea_core::media::MediaRequest>>,
    /// For the reservation: the `service_tier` asked (OpenAI's, Anthropic's); a built-in web
    /// search tool among `tools` (OpenAI's `web_search*`, Anthropic's `web_search_*`, Gemini's
    /// `google_search`); and the fewest tool calls the request allows (`max_tool_calls`, the web
    /// search tools' `max_uses` summed).
    pub service_tier: TierAsked,
    pub web_search: bool,
    pub tool_call_limit: Option<u64>,
    /// The other built-in tools among `tools` that bill a fee of their own: OpenAI's
    /// `file_search` (per call, at most `max_tool_calls`) and `code_interpreter` (per container
    /// session).
    pub file_search: bool,
    pub code_interpreter: bool,
    pub max_tool_calls: Option<u64>,
}

/// A request body read once: what [`inspect`] tells, and what
/// [`crate::usage::estimate_input_tokens`] estimates, each exactly as those give it, and whether
/// the body could be read otherwise by its provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InspectedRequest {
    pub facts: RequestFacts,
    /// Estimated input tokens, for a cap's reservation and for a receipt without reported usage.
    pub input_tokens: u64,
    /// A byte-order mark, or the first member named twice in an object the gateway reads (the
    /// request, `stream_options`, `generationConfig`, each of `tools` and its `function`). The
    /// facts and the estimate are given all the same, as for any other body.
    pub ambiguity: Option<Ambiguity>,
}

/// The request members `inspect` reads; the rest is skipped unread.
#[derive(Deserialize, Default)]
struct RequestHead {
    #[serde(default)]
    model: Value,
    #[serde(default)]
    stream: Value,
    #[serde(default)]
    stream_options: Value,
    #[serde(default)]
    max_tokens: Value,
    #[serde(default)]
    max_completion_tokens: Value,
    #[serde(default)]
    max_output_tokens: Value,
    /// Gemini's: `generationConfig.maxOutputTokens` is its output limit.
    #[serde(default, rename = "generationConfig")]
    generation_config: Value,
    #[serde(default)]
    background: Value,
    #[serde(default)]
    service_tier: Value,
    #[serde(default)]
    max_tool_calls: Value,
    /// Chat Completions' built-in web search (the search models): an object turns it on.
    #[serde(default)]
    web_search_options: Value,
    /// Read by `inspect` alone: [`inspect_and_estimate`] counts `tools` as input, and finds its web
    /// search tools as it does.
    #[serde(default)]
    tools: SearchTools,
}

/// The chunk OpenAI sends last when asked for usage: no choices, a usage block.
#[derive(Deserialize)]
struct UsageOnlyProbe {
    choices: Option<Vec<IgnoredAny>>,
    usage: Option<IgnoredAny>,
}

/// Removes the usage-only chunk (`"choices": []` with a non-null `usage`) from an OpenAI chat or
/// completions event stream whose client did not ask for usage; every other byte passes unchanged
/// and in order. An event is held until its blank line shows whether it is that chunk.
#[derive(Debug)]
pub struct UsageChunkFilter {
    /// The bytes of the current, incomplete event.
    held: Vec<u8>,
    /// No byte of the current line yet: a line end here ends the event.
    line_empty: bool,
    /// The last byte was a `\r` ending a line: a `\n` next belongs to it.
    after_cr: bool,
    /// `held` is a whole event whose final `\r` may yet be followed by its `\n`.
    end_pending: bool,
    /// The current event outgrew a usage chunk: its bytes go on as they come.
    passing: bool,
}

/// The bytes to send on: a slice of the chunk while they are one run of it, a copy otherwise.
struct Output<'c> {
    chunk: &'c Bytes,
    run: Option<Range<usize>>,
    copy: Option<Vec<u8>>,
}

/// Reads `model`, `stream` and `stream_options.include_usage`; anything but a JSON object gives
/// the default (no model, not streaming).
pub fn inspect(body: &[u8]) -> RequestFacts {
    // A struct also deserializes from an array, by position; a request is only ever an object.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return RequestFacts::default();
    }
    crate::from_json::<RequestHead>(body).map_or_else(|_| RequestFacts::default(), RequestHead::facts)
}

/// [`inspect`], the input estimate and the body's ambiguity from one parse of the body.
pub fn inspect_and_estimate(body: &[u8]) -> InspectedRequest {
    if ambiguity::starts_with_byte_order_mark(body) {
        // No JSON to the gateway (nor to `inspect`), a request to a decoder that drops the mark.
        return InspectedRequest { ambiguity: Some(Ambiguity::ByteOrderMark), ..InspectedRequest::default() };
    }
    if body.trim_ascii_start().first() != Some(&b'{') {
        return InspectedRequest::default();
    }
    // As `crate::from_json`: valid UTF-8 checked once, whole.
    let pass = match std::str::from_utf8(body) {
        Ok(text) => RequestPass::read(serde_json::Deserializer::from_str(text)),
        Err(_) => RequestPass::read(serde_json::Deserializer::from_slice(body)),
    };
    match pass {
        Ok(pass) => InspectedRequest {
            facts: if pass.repeated_head {
                RequestFacts::default()
            } else {
                pass.head.facts().with_tools(pass.input.web_search(), pass.input.paid_tools())
            },
            input_tokens: pass.input.total().tokens(),
            ambiguity: pass.first_repeat.map(Ambiguity::RepeatedMember),
        },
        // The pass reads every member as strictly as a `Value` parse, so a `Value` parse refuses the
        // body too and the estimate is 0; `inspect` skips the members it does not read (unchecked
        // UTF-8, numbers out of range, any depth) and may still accept it, and so may a provider:
        // the repeats are looked for as leniently.
        Err(_) => InspectedRequest {
            facts: inspect(body),
            input_tokens: 0,
            ambiguity: ambiguity::lenient_scan(body).map(Ambiguity::RepeatedMember),
        },
    }
}

impl RequestHead {
    fn facts(self) -> RequestFacts {
        let SearchTools(tools, paid) = self.tools;
        RequestFacts {
            // The parsed string itself, not a copy of it.
            model: match self.model {
                Value::String(model) => Some(model),
                _ => None,
            },
            stream: self.stream == Value::Bool(true),
            client_asked_usage: self.stream_options.get("include_usage") == Some(&Value::Bool(true)),
            max_output_tokens: [self.max_completion_tokens, self.max_output_tokens, self.max_tokens]
                .iter()
                .find_map(Value::as_u64)
                .or_else(|| self.generation_config.get("maxOutputTokens").and_then(Value::as_u64)),
            background: self.background == Value::Bool(true),
            media: None,
            service_tier: TierAsked::parse(self.service_tier.as_str()),
            web_search: self.web_search_options.is_object(),
            tool_call_limit: self.max_tool_calls.as_u64(),
            file_search: false,
            code_interpreter: false,
            max_tool_calls: self.max_tool_calls.as_u64(),
        }
        .with_tools(tools, paid)
    }
}

impl RequestFacts {
    /// The facts with the web search tools `tools` offers, and their call limit (`None`: none).
    fn with_tools(mut self, web_search: Option<Option<u64>>, paid: PaidTools) -> RequestFacts {
        self.file_search = paid.file_search;
        self.code_interpreter = paid.code_interpreter;
        if let Some(max_uses) = web_search {
            self.web_search = true;
            self.tool_call_limit = match (self.tool_call_limit, max_uses) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (one, other) => one.or(other),
            };
        }
        self
    }
}

/// What [`inspect_and_estimate`] gathers from the members of the request object.
#[derive(Default)]
struct RequestPass<'de> {
    head: RequestHead,
    /// A member `RequestHead` reads appeared twice, which fails `inspect`'s parse.
    repeated_head: bool,
    /// Which of `head`'s members were read, in the order `visit_map` names them: an explicit
    /// `null` reads the same as an absent member, so the value cannot tell.
    seen_head: [bool; 12],
    input: InputFields<'de>,
    /// The path of the first member named twice in an object the gateway reads.
    first_repeat: Option<String>,
}

impl<'de> RequestPass<'de> {
    /// The pass over a whole body, which must hold one value and nothing after it.
    fn read<R: serde_json::de::Read<'de>>(
        mut deserializer: serde_json::Deserializer<R>,
    ) -> serde_json::Result<Self> {
        let pass = RequestPass::default().deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(pass)
    }
}

impl<'de> DeserializeSeed<'de> for RequestPass<'de> {
    type Value = Self;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RequestPass<'de> {
    type Value = Self;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self, A::Error> {
        // On the stack rather than in `self`, which is moved on return.
        let mut names = Names::<LISTED_AT_TOP>::new();
        while let Some(key) = map.next_key_seed(Key)? {
            if self.first_repeat.is_none() {
                ambiguity::note(&mut names, Place::Request, &key, &mut self.first_repeat);
            }
            let (index, slot) = match &*key {
                "model" => (0, &mut self.head.model),
                "stream" => (1, &mut self.head.stream),
                "stream_options" => (2, &mut self.head.stream_options),
                "max_tokens" => (3, &mut self.head.max_tokens),
                "max_completion_tokens" => (4, &mut self.head.max_completion_tokens),
                "max_output_tokens" => (5, &mut self.head.max_output_tokens),
                "generationConfig" => (6, &mut self.head.generation_config),
                "background" => (7, &mut self.head.background),
                "service_tier" => (8, &mut self.head.service_tier),
                "max_tool_calls" => (9, &mut self.head.max_tool_calls),
                "web_search_options" => (11, &mut self.head.web_search_options),
                other => {
                    // `tools` is counted as input: its objects' names are checked as it is. It is
                    // one of `RequestHead`'s members all the same (`inspect` reads it there).
                    if other == "tools" {
                        self.repeated_head |= std::mem::replace(&mut self.seen_head[10], true);
                    }
                    let watch = (other == "tools" && self.first_repeat.is_none())
                        .then_some((Watched::Tools, &mut self.first_repeat));
                    if !self.input.count_if_input(other, &mut map, watch)? {
                        map.next_value_seed(Checked)?;
                    }
                    continue;
                }
            };
            self.repeated_head |= std::mem::replace(&mut self.seen_head[index], true);
            *slot = match Watched::member(Place::Request, &key) {
                Some(Watched::Object(place)) if self.first_repeat.is_none() => {
                    map.next_value_seed(NotedValue { place, first_repeat: &mut self.first_repeat })?
                }
                _ => map.next_value()?,
            };
        }
        Ok(self)
    }
}

/// For an OpenAI chat completions or legacy completions streaming request: the body with
/// `stream_options.include_usage` set to `true`, every other byte as sent (members of
/// `stream_options` kept; a missing `stream_options` appended as the last member). `None` when the
/// body needs no change: not streaming, already `true`, or not a JSON object.
pub fn force_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    force_include_usage_with(body, &inspect(body))
}

/// [`force_include_usage`] given the body's facts, already read (`inspect(body)` exactly).
pub fn force_include_usage_with(body: &[u8], facts: &RequestFacts) -> Option<Vec<u8>> {
    if !facts.stream || facts.client_asked_usage {
        return None;
    }
    let span = json_object::value_span(body)?;
    let object = &body[span.clone()];
    let members = json_object::members(object)?;
    let options = json_object::find(object, &members, "stream_options").map(|m| &object[m.value.clone()]);
    let new_options = match options {
        Some(options) if options.first() == Some(&b'{') => {
            let option_members = json_object::members(options)?;
            json_object::set_member(options, &option_members, "include_usage", b"true")?
        }
        _ => INCLUDE_USAGE_OPTIONS.to_vec(),
    };
    let edited = json_object::set_member(object, &members, "stream_options", &new_options)?;
    let mut rewritten = Vec::with_capacity(body.len() - object.len() + edited.len());
    rewritten.extend_from_slice(&body[..span.start]);
    rewritten.extend_from_slice(&edited);
    rewritten.extend_from_slice(&body[span.end..]);
    Some(rewritten)
}

impl Default for UsageChunkFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageChunkFilter {
    pub fn new() -> Self {
        Self { held: Vec::new(), line_empty: true, after_cr: false, end_pending: false, passing: false }
    }

    /// The bytes to send the client now (maybe none).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        let bytes = &chunk[..];
        let mut out = Output::new(&chunk);
        if bytes.is_empty() {
            return out.into_bytes();
        }
        let mut at = 0;
        let mut event_start = 0;
        if std::mem::take(&mut self.end_pending) {
            at = usize::from(bytes[0] == b'\n');
            self.end_event(&chunk, 0..at, &mut out);
            event_start = at;
        } else if std::mem::take(&mut self.after_cr) && bytes[0] == b'\n' {
            at = 1;
        }
        while at < bytes.len() {
            let Some(offset) = memchr::memchr2(b'\n', b'\r', &bytes[at..]) else {
                self.line_empty = false;
                break;
            };
            let line_end = at + offset;
            let blank = self.line_empty && offset == 0;
            self.line_empty = true;
            at = line_end + 1;
            if bytes[line_end] == b'\r' {
                match bytes.get(at) {
                    Some(b'\n') => at += 1,
                    Some(_) => {}
                    None if blank => self.end_pending = true,
                    None => self.after_cr = true,
                }
            }
            if blank && !self.end_pending {
                self.end_event(&chunk, event_start..at, &mut out);
                event_start = at;
            }
        }
        self.hold(&chunk, event_start..bytes.len(), &mut out);
        out.into_bytes()
    }

    /// What is left at the end of the stream: an incomplete trailing event, as it came.
    pub fn finish(&mut self) -> Bytes {
        let whole_event = self.end_pending && !self.passing;
        let held = std::mem::take(&mut self.held);
        *self = Self::new();
        if whole_event && is_usage_only_event(&held) { Bytes::new() } else { Bytes::from(held) }
    }

    /// The current event ends with `chunk[tail]`.
    fn end_event(&mut self, chunk: &Bytes, tail: Range<usize>, out: &mut Output<'_>) {
        if std::mem::take(&mut self.passing) {
            out.keep(tail);
        } else if self.held.is_empty() {
            if !is_usage_only_event(&chunk[tail.clone()]) {
                out.keep(tail);
            }
        } else {
            self.held.extend_from_slice(&chunk[tail]);
            if !is_usage_only_event(&self.held) {
                out.push_copy(&self.held);
            }
            self.held.clear();
            self.held.shrink_to(MAX_HELD_EVENT_BYTES);
        }
    }

    /// `chunk[part]` continues the current event.
    fn hold(&mut self, chunk: &Bytes, part: Range<usize>, out: &mut Output<'_>) {
        if self.passing {
            out.keep(part);
        } else if self.held.len() + part.len() > MAX_HELD_EVENT_BYTES {
            out.push_copy(&self.held);
            out.keep(part);
            self.held.clear();
            self.held.shrink_to(MAX_HELD_EVENT_BYTES);
            self.passing = true;
        } else {
            self.held.extend_from_slice(&chunk[part]);
        }
    }
}

impl<'c> Output<'c> {
    fn new(chunk: &'c Bytes) -> Self {
        Self { chunk, run: None, copy: None }
    }

    fn keep(&mut self, part: Range<usize>) {
        if part.is_empty() {
            return;
        }
        if self.copy.is_none() {
            match &mut self.run {
                None => return self.run = Some(part),
                Some(run) if run.end == part.start => return run.end = part.end,
                Some(_) => {}
            }
        }
        let chunk = self.chunk;
        self.push_copy(&chunk[part]);
    }

    fn push_copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let copy = self.copy.get_or_insert_with(|| match self.run.take() {
            Some(run) => self.chunk[run].to_vec(),
            None => Vec::new(),
        });
        copy.extend_from_slice(bytes);
    }

    fn into_bytes(self) -> Bytes {
        match (self.copy, self.run) {
            (Some(copy), _) => Bytes::from(copy),
            (None, Some(run)) => self.chunk.slice(run),
            (None, None) => Bytes::new(),
        }
    }
}

/// Whether one whole event (its bytes up to and including its blank line) is the usage-only chunk.
/// A cheap look for a non-null `"usage"` member comes first, since with usage forced every chunk
/// carries `"usage":null`.
fn is_usage_only_event(event: &[u8]) -> bool {
    if !crate::usage::may_carry_usage(event) {
        return false;
    }
    let mut usage_only = false;
    SseReader::new().push(event, |e| usage_only |= is_usage_only(e.data));
    usage_only
}

/// The event's data is the usage-only chunk: read by the walk where it can tell, by serde otherwise.
fn is_usage_only(data: &str) -> bool {
    quick_usage_only(data).unwrap_or_else(|| usage_only_by_serde(data))
}

fn usage_only_by_serde(data: &str) -> bool {
    serde_json::from_str::<UsageOnlyProbe>(data)
        .is_ok_and(|probe| probe.usage.is_some() && probe.choices.as_ref().is_some_and(Vec::is_empty))
}

/// [`UsageOnlyProbe`] read by [`Walk`]: `None` where it would not read as serde does.
fn quick_usage_only(data: &str) -> Option<bool> {
    let mut walk = Walk::new(data);
    let (mut no_choices, mut usage) = (false, false);
    let mut seen = Seen::default();
    walk.object(0, |walk, key| {
        match key {
            b"choices" => {
                seen.first(0)?;
                let mut elements = 0;
                let choices = walk.nullable(|walk| {
                    walk.array(1, |walk| {
                        elements += 1;
                        walk.skip(2)
                    })
                })?;
                no_choices = choices.is_some() && elements == 0;
            }
            b"usage" => {
                seen.first(1)?;
                usage = walk.nullable(|walk| walk.skip(1))?.is_some();
            }
            _ => walk.skip(1)?,
        }
        Some(())
    })?;
    walk.at_end().then_some(no_choices && usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forced(body: &str) -> Option<String> {
        force_include_usage(body.as_bytes()).map(|b| String::from_utf8(b).expect("utf-8"))
    }

    #[test]
    fn inspect_reads_model_stream_and_include_usage() {
        let facts = inspect(br#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#);
        assert_eq!(
            facts,
            RequestFacts {
                model: Some("gpt-4o".into()),
                stream: true,
                client_asked_usage: true,
                max_output_tokens: None,
                background: false,
                ..RequestFacts::default()
            }
        );
        let facts = inspect(br#"{"model":"gpt-4o","stream":"true","stream_options":{"include_usage":1}}"#);
        assert_eq!(
            facts,
            RequestFacts {
                model: Some("gpt-4o".into()),
                stream: false,
                client_asked_usage: false,
                max_output_tokens: None,
                background: false,
                ..RequestFacts::default()
            }
        );
        assert_eq!(inspect(br#"{"max_tokens":64}"#).max_output_tokens, Some(64));
        let background = br#"{"model":"o3-pro","input":"hi","background":true}"#;
        assert!(inspect(background).background);
        assert!(inspect_and_estimate(background).facts.background);
        assert!(!inspect(br#"{"model":"o3-pro","background":"true"}"#).background);
        assert_eq!(inspect(br#"{"max_output_tokens":9,"max_tokens":64}"#).max_output_tokens, Some(9));
        assert_eq!(inspect(br#"{"max_completion_tokens":7}"#).max_output_tokens, Some(7));
        let gemini = br#"{"contents":[],"generationConfig":{"temperature":0.2,"maxOutputTokens":300}}"#;
        assert_eq!(inspect(gemini).max_output_tokens, Some(300));
        assert_eq!(inspect_and_estimate(gemini).facts.max_output_tokens, Some(300));
        for not_a_request in [&b"not json"[..], b"", b"[\"gpt\",true]", b"{\"model\":", b"null"] {
            assert_eq!(inspect(not_a_request), RequestFacts::default());
        }
    }

    #[test]
    fn inspect_reads_the_tier_asked_and_the_tool_call_limit() {
        use recovea_core::pricing::ServiceTier;
        let facts = |body: &str| inspect_and_estimate(body.as_bytes()).facts;
        assert_eq!(facts(r#"{"service_tier":"flex"}"#).service_tier, TierAsked::Named(ServiceTier::Flex));
        assert_eq!(
            facts(r#"{"service_tier":"priority"}"#).service_tier,
            TierAsked::Named(ServiceTier::Priority)
        );
        assert_eq!(
            facts(r#"{"service_tier":"default"}"#).service_tier,
            TierAsked::Named(ServiceTier::Standard)
        );
        assert_eq!(
            facts(r#"{"service_tier":"standard_only"}"#).service_tier,
            TierAsked::Named(ServiceTier::Standard)
        );
        assert_eq!(facts(r#"{"service_tier":"auto"}"#).service_tier, TierAsked::Provider);
        assert_eq!(facts(r#"{"model":"gpt-5"}"#).service_tier, TierAsked::Provider);
        assert_eq!(inspect(br#"{"service_tier":"flex"}"#).service_tier, TierAsked::Named(ServiceTier::Flex));

        // OpenAI's Responses: a web search tool, limited by `max_tool_calls`.
        // The other paid tools, in both passes alike; never a function's schema naming one.
        let paid = r#"{"model":"gpt-5","tools":[{"type":"file_search","vector_store_ids":["vs_1"]},{"type":"code_interpreter","container":{"type":"auto"}}]}"#;
        assert_eq!((facts(paid).file_search, facts(paid).code_interpreter), (true, true));
        assert_eq!(
            (inspect(paid.as_bytes()).file_search, inspect(paid.as_bytes()).code_interpreter),
            (true, true)
        );
        let schema = r#"{"tools":[{"type":"function","function":{"parameters":{"type":"file_search"}}}]}"#;
        assert!(!facts(schema).file_search && !inspect(schema.as_bytes()).file_search);
        // Chat Completions' search models: `web_search_options`, as one in `inspect`.
        let chat = r#"{"model":"gpt-4o-search-preview","web_search_options":{},"messages":[]}"#;
        assert_eq!((facts(chat).web_search, facts(chat).tool_call_limit), (true, None));
        assert!(inspect(chat.as_bytes()).web_search);
        assert!(!facts(r#"{"web_search_options":null}"#).web_search);
        let responses = facts(r#"{"model":"gpt-5","tools":[{"type":"web_search"}],"max_tool_calls":3}"#);
        assert_eq!((responses.web_search, responses.tool_call_limit), (true, Some(3)));
        let unlimited = facts(r#"{"tools":[{"type":"function","name":"f"},{"type":"web_search_preview"}]}"#);
        assert_eq!((unlimited.web_search, unlimited.tool_call_limit), (true, None));
        // Anthropic's: `max_uses` on the tool, whatever the order of its members.
        let anthropic =
            facts(r#"{"tools":[{"max_uses":5,"name":"web_search","type":"web_search_20250305"}]}"#);
        assert_eq!((anthropic.web_search, anthropic.tool_call_limit), (true, Some(5)));
        let two = facts(
            r#"{"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20250305","max_uses":3}]}"#,
        );
        assert_eq!(two.tool_call_limit, Some(5));
        let one_unlimited = facts(
            r#"{"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20250305"}]}"#,
        );
        assert_eq!(one_unlimited.tool_call_limit, None);
        let both = facts(r#"{"max_tool_calls":4,"tools":[{"type":"web_search_20250305","max_uses":2}]}"#);
        assert_eq!(both.tool_call_limit, Some(2));
        // Gemini's grounding.
        assert!(facts(r#"{"contents":[],"tools":[{"google_search":{}}]}"#).web_search);
        // Not a search tool: a function's schema naming one, a message's item, an unrelated `max_uses`.
        let nested = r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"web_search"}}}],
            "input":[{"type":"web_search_call"}],"max_uses":3}"#;
        assert_eq!((facts(nested).web_search, facts(nested).tool_call_limit), (false, None));
        assert!(!facts(r#"{"tools":[{"type":"function","max_uses":2}]}"#).web_search);
        // `inspect` reads the same facts, as leniently as it reads the rest.
        for body in [
            r#"{"model":"gpt-5","tools":[{"type":"web_search"}],"max_tool_calls":3}"#,
            r#"{"tools":[{"max_uses":5,"name":"web_search","type":"web_search_20250305"}]}"#,
            r#"{"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20250305"}]}"#,
            r#"{"tools":[[{"type":"web_search","max_uses":2}],{"google_search":{}, "max_uses":1}]}"#,
            r#"{"tools":[{"type":"image_url","google_search":{}}],"max_tool_calls":1}"#,
            r#"{"tools":[{"type":"web_search","max_uses":1.0}, "web_search", 3, null, {"type":7}]}"#,
            r#"{"tools":{"type":"web_search","max_uses":4}}"#,
            r#"{"tools":[{"type":"web_search","max_uses":4,"max_uses":-1}]}"#,
            r#"{"tools":[{"type":"web_search"}],"tools":[]}"#,
            r#"{"tools":[{"t\u0079pe":"web_search_preview","max_uses":9}]}"#,
            nested,
        ] {
            assert_eq!(facts(body), inspect(body.as_bytes()), "{body}");
        }
        assert!(!facts(r#"{"tools":[{"type":"image_url","google_search":{}}]}"#).web_search);
        assert_eq!(facts(r#"{"tools":{"type":"web_search","max_uses":4}}"#).tool_call_limit, Some(4));
        assert_eq!(
            facts(r#"{"model":"m","tools":[],"tools":[{"type":"web_search"}]}"#),
            RequestFacts::default()
        );
        // The estimate is the same as without the facts.
        let body =
            br#"{"tools":[{"type":"web_search","max_uses":2}],"max_tool_calls":1,"service_tier":"flex"}"#;
        assert_eq!(inspect_and_estimate(body).input_tokens, crate::usage::estimate_input_tokens(body));
        // A repeat of either member is the body's ambiguity.
        let repeated = inspect_and_estimate(br#"{"service_tier":"flex","service_tier":"priority"}"#);
        assert_eq!(repeated.ambiguity, Some(Ambiguity::RepeatedMember("service_tier".into())));
        let repeated =
            inspect_and_estimate(br#"{"tools":[{"type":"web_search_20250305","max_uses":1,"max_uses":9}]}"#);
        assert_eq!(repeated.ambiguity, Some(Ambiguity::RepeatedMember("tools[0].max_uses".into())));
    }

    #[test]
    fn include_usage_is_added_when_absent() {
        assert_eq!(
            forced(r#"{"model":"gpt-4o","messages":[],"stream":true}"#).as_deref(),
            Some(r#"{"model":"gpt-4o","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            forced("{\n  \"stream\": true\n}\n").as_deref(),
            Some("{\n  \"stream\": true,\"stream_options\":{\"include_usage\":true}\n}\n")
        );
    }

    #[test]
    fn include_usage_false_becomes_true_and_other_options_stay() {
        assert_eq!(
            forced(r#"{"stream":true,"stream_options":{"include_usage":false},"n":1}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#)
        );
        assert_eq!(
            forced(r#"{"stream_options":{"include_obfuscation":false},"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_obfuscation":false,"include_usage":true},"stream":true}"#)
        );
        assert_eq!(
            forced(r#"{"stream":true,"stream_options":null}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
    }

    #[test]
    fn no_change_when_not_needed() {
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"model":"gpt-4o","messages":[]}"#,
            r#"{"stream":false}"#,
            "not json",
            "[1]",
            "",
        ] {
            assert_eq!(forced(body), None, "{body}");
        }
    }

    #[test]
    fn forced_bodies_read_back_as_asking_for_usage() {
        let body = r#" {"messages":[{"role":"user","content":"say \"stream_options\" {"}],"stream":true} "#;
        let rewritten = force_include_usage(body.as_bytes()).expect("rewritten");
        assert!(inspect(&rewritten).client_asked_usage);
        let before: Value = serde_json::from_str(body).expect("json");
        let mut after: Value = serde_json::from_slice(&rewritten).expect("json");
        after.as_object_mut().expect("object").remove("stream_options");
        assert_eq!(before, after);
    }

    const CHUNK: &str =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn filtered(pieces: &[&str]) -> String {
        let mut filter = UsageChunkFilter::new();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend_from_slice(&filter.push(Bytes::copy_from_slice(piece.as_bytes())));
        }
        out.extend_from_slice(&filter.finish());
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn the_usage_only_chunk_is_removed_and_the_rest_kept() {
        let stream = format!("{CHUNK}{CHUNK}{USAGE}{DONE}");
        assert_eq!(filtered(&[&stream]), format!("{CHUNK}{CHUNK}{DONE}"));
        let (a, b) = stream.split_at(CHUNK.len() + 30);
        assert_eq!(filtered(&[a, b]), format!("{CHUNK}{CHUNK}{DONE}"));
    }

    #[test]
    fn whole_events_pass_without_copy_and_the_tail_waits() {
        let mut filter = UsageChunkFilter::new();
        let chunk = Bytes::from(format!("{CHUNK}data: {{\"id\""));
        let out = filter.push(chunk.clone());
        assert_eq!(out, chunk.slice(..CHUNK.len()));
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert_eq!(filter.finish(), Bytes::from_static(b"data: {\"id\""));
    }

    #[test]
    fn usage_chunk_ending_in_a_lone_cr_is_removed_at_finish() {
        let usage_cr = USAGE.replace('\n', "\r");
        assert_eq!(filtered(&[CHUNK, &usage_cr]), CHUNK);
        let usage_crlf = USAGE.replace('\n', "\r\n");
        let (a, b) = usage_crlf.split_at(usage_crlf.len() - 1);
        assert_eq!(filtered(&[CHUNK, a, b, DONE]), format!("{CHUNK}{DONE}"));
    }

    #[test]
    fn a_usage_chunk_with_choices_is_kept() {
        let with_choice = "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n";
        assert_eq!(filtered(&[with_choice]), with_choice);
        let null_usage = "data: {\"choices\":[],\"usage\" : null}\n\n";
        assert_eq!(filtered(&[null_usage]), null_usage);
    }

    #[test]
    fn usage_named_only_inside_text_or_as_null_keeps_the_event() {
        for kept in [
            "data: {\"choices\":[{\"delta\":{\"content\":\"the \\\"usage\\\": {} field\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"note\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":1}\",\"usage\" :\tnull}\n\n",
            "data: {\"choices\":[],\"x\":\"usage\"}\n\n",
        ] {
            assert_eq!(filtered(&[CHUNK, kept, DONE]), format!("{CHUNK}{kept}{DONE}"), "{kept}");
        }
        // A null `usage` deeper in does not hide the real one after it.
        let nested_null =
            "data: {\"choices\":[],\"meta\":{\"usage\":null},\"usage\":{\"prompt_tokens\":1}}\n\n";
        assert_eq!(filtered(&[CHUNK, nested_null, DONE]), format!("{CHUNK}{DONE}"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Whatever the walk tells of a chunk, serde's probe tells the same.
        #[test]
        fn the_walk_finds_the_usage_only_chunk_as_serde_does(
            members in proptest::collection::vec(
                (
                    proptest::sample::select(vec!["choices", "usage", "id", "choices", "usage", r"us\u0061ge"]),
                    proptest::sample::select(vec![
                        "[]", "[ ]", "[{}]", "[1,[2]]", "null", "{}", "{\"prompt_tokens\":3}", "0", "\"\"", "nul", "[,]", "01",
                    ]),
                ),
                0..4,
            ),
            comma in proptest::sample::select(vec![",", " ,\n"]),
            after in proptest::sample::select(vec!["", " ", "\n", "x", "}"]),
        ) {
            let members: Vec<String> = members.iter().map(|(key, value)| format!("\"{key}\":{value}")).collect();
            let data = format!("{{{}}}{after}", members.join(comma));
            if let Some(quick) = quick_usage_only(&data) {
                proptest::prop_assert_eq!(quick, usage_only_by_serde(&data), "{}", data);
            }
        }
    }

    #[test]
    fn a_large_event_is_passed_on_before_its_end() {
        let mut filter = UsageChunkFilter::new();
        let big = format!("data: {}", "x".repeat(MAX_HELD_EVENT_BYTES));
        assert_eq!(filter.push(Bytes::from(big.clone())).len(), big.len());
        assert_eq!(filter.push(Bytes::from_static(b"y\n\n")), Bytes::from_static(b"y\n\n"));
        assert_eq!(filter.push(Bytes::from(USAGE)), Bytes::new());
        assert!(filter.finish().is_empty());
    }
}
