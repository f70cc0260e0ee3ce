//! What the gateway reads of a request body before forwarding it: its facts (model, streaming,
//! output limit, tier, paid tools), its input estimate, and whether a provider could read it
//! otherwise (its ambiguity), all from one parse. Nothing here changes a byte of the body.

pub(crate) mod ambiguity;

use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use recovea_core::estimate::TierAsked;

use crate::usage::input::{Checked, InputFields, Key, PaidTools, SearchTools};
use ambiguity::{LISTED_AT_TOP, Names, NotedValue, Place, Watched};

pub use ambiguity::{Ambiguity, MAX_NAME_CHARS};

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

/// A request body read once: what [`facts`] tells, and what
/// [`crate::usage::estimate_input_tokens`] estimates, each exactly as those give it, and whether
/// the body could be read otherwise by its provider.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyReading {
    pub facts: RequestFacts,
    /// Estimated input tokens, for a cap's reservation and for a receipt without reported usage.
    pub input_tokens: u64,
    /// A byte-order mark, or the first member named twice in an object the gateway reads (the
    /// request, `stream_options`, `generationConfig`, each of `tools` and its `function`). The
    /// facts and the estimate are given all the same, as for any other body.
    pub ambiguity: Option<Ambiguity>,
}

/// The request members `facts` reads; the rest is skipped unread.
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
    /// Read by `facts` alone: [`read`] counts `tools` as input, and finds its web
    /// search tools as it does.
    #[serde(default)]
    tools: SearchTools,
}

/// Reads `model`, `stream` and `stream_options.include_usage`; anything but a JSON object gives
/// the default (no model, not streaming).
pub fn facts(body: &[u8]) -> RequestFacts {
    // A struct also deserializes from an array, by position; a request is only ever an object.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return RequestFacts::default();
    }
    crate::from_json::<RequestHead>(body).map_or_else(|_| RequestFacts::default(), RequestHead::facts)
}

/// [`facts`], the input estimate and the body's ambiguity from one parse of the body.
pub fn read(body: &[u8]) -> BodyReading {
    if ambiguity::starts_with_byte_order_mark(body) {
        // No JSON to the gateway (nor to `facts`), a request to a decoder that drops the mark.
        return BodyReading { ambiguity: Some(Ambiguity::ByteOrderMark), ..BodyReading::default() };
    }
    if body.trim_ascii_start().first() != Some(&b'{') {
        return BodyReading::default();
    }
    // As `crate::from_json`: valid UTF-8 checked once, whole.
    let pass = match std::str::from_utf8(body) {
        Ok(text) => RequestPass::read(serde_json::Deserializer::from_str(text)),
        Err(_) => RequestPass::read(serde_json::Deserializer::from_slice(body)),
    };
    match pass {
        Ok(pass) => BodyReading {
            facts: if pass.repeated_head {
                RequestFacts::default()
            } else {
                pass.head.facts().with_tools(pass.input.web_search(), pass.input.paid_tools())
            },
            input_tokens: pass.input.total().tokens(),
            ambiguity: pass.first_repeat.map(Ambiguity::RepeatedMember),
        },
        // The pass reads every member as strictly as a `Value` parse, so a `Value` parse refuses the
        // body too and the estimate is 0; `facts` skips the members it does not read (unchecked
        // UTF-8, numbers out of range, any depth) and may still accept it, and so may a provider:
        // the repeats are looked for as leniently.
        Err(_) => BodyReading {
            facts: facts(body),
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

/// What [`read`] gathers from the members of the request object.
#[derive(Default)]
struct RequestPass<'de> {
    head: RequestHead,
    /// A member `RequestHead` reads appeared twice, which fails `facts`'s parse.
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
                    // one of `RequestHead`'s members all the same (`facts` reads it there).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_model_stream_and_include_usage() {
        let got = facts(br#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#);
        assert_eq!(
            got,
            RequestFacts {
                model: Some("gpt-4o".into()),
                stream: true,
                client_asked_usage: true,
                max_output_tokens: None,
                background: false,
                ..RequestFacts::default()
            }
        );
        let got = facts(br#"{"model":"gpt-4o","stream":"true","stream_options":{"include_usage":1}}"#);
        assert_eq!(
            got,
            RequestFacts {
                model: Some("gpt-4o".into()),
                stream: false,
                client_asked_usage: false,
                max_output_tokens: None,
                background: false,
                ..RequestFacts::default()
            }
        );
        assert_eq!(facts(br#"{"max_tokens":64}"#).max_output_tokens, Some(64));
        let background = br#"{"model":"o3-pro","input":"hi","background":true}"#;
        assert!(facts(background).background);
        assert!(read(background).facts.background);
        assert!(!facts(br#"{"model":"o3-pro","background":"true"}"#).background);
        assert_eq!(facts(br#"{"max_output_tokens":9,"max_tokens":64}"#).max_output_tokens, Some(9));
        assert_eq!(facts(br#"{"max_completion_tokens":7}"#).max_output_tokens, Some(7));
        let gemini = br#"{"contents":[],"generationConfig":{"temperature":0.2,"maxOutputTokens":300}}"#;
        assert_eq!(facts(gemini).max_output_tokens, Some(300));
        assert_eq!(read(gemini).facts.max_output_tokens, Some(300));
        for not_a_request in [&b"not json"[..], b"", b"[\"gpt\",true]", b"{\"model\":", b"null"] {
            assert_eq!(facts(not_a_request), RequestFacts::default());
        }
    }

    #[test]
    fn facts_are_the_tier_asked_and_the_tool_call_limit() {
        use recovea_core::pricing::ServiceTier;
        let one_pass = |body: &str| read(body.as_bytes()).facts;
        assert_eq!(one_pass(r#"{"service_tier":"flex"}"#).service_tier, TierAsked::Named(ServiceTier::Flex));
        assert_eq!(
            one_pass(r#"{"service_tier":"priority"}"#).service_tier,
            TierAsked::Named(ServiceTier::Priority)
        );
        assert_eq!(
            one_pass(r#"{"service_tier":"default"}"#).service_tier,
            TierAsked::Named(ServiceTier::Standard)
        );
        assert_eq!(
            one_pass(r#"{"service_tier":"standard_only"}"#).service_tier,
            TierAsked::Named(ServiceTier::Standard)
        );
        assert_eq!(one_pass(r#"{"service_tier":"auto"}"#).service_tier, TierAsked::Provider);
        assert_eq!(one_pass(r#"{"model":"gpt-5"}"#).service_tier, TierAsked::Provider);
        assert_eq!(facts(br#"{"service_tier":"flex"}"#).service_tier, TierAsked::Named(ServiceTier::Flex));

        // OpenAI's Responses: a web search tool, limited by `max_tool_calls`.
        // The other paid tools, in both passes alike; never a function's schema naming one.
        let paid = r#"{"model":"gpt-5","tools":[{"type":"file_search","vector_store_ids":["vs_1"]},{"type":"code_interpreter","container":{"type":"auto"}}]}"#;
        assert_eq!((one_pass(paid).file_search, one_pass(paid).code_interpreter), (true, true));
        assert_eq!(
            (facts(paid.as_bytes()).file_search, facts(paid.as_bytes()).code_interpreter),
            (true, true)
        );
        let schema = r#"{"tools":[{"type":"function","function":{"parameters":{"type":"file_search"}}}]}"#;
        assert!(!one_pass(schema).file_search && !facts(schema.as_bytes()).file_search);
        // Chat Completions' search models: `web_search_options`, as one in `facts`.
        let chat = r#"{"model":"gpt-4o-search-preview","web_search_options":{},"messages":[]}"#;
        assert_eq!((one_pass(chat).web_search, one_pass(chat).tool_call_limit), (true, None));
        assert!(facts(chat.as_bytes()).web_search);
        assert!(!one_pass(r#"{"web_search_options":null}"#).web_search);
        let responses = one_pass(r#"{"model":"gpt-5","tools":[{"type":"web_search"}],"max_tool_calls":3}"#);
        assert_eq!((responses.web_search, responses.tool_call_limit), (true, Some(3)));
        let unlimited =
            one_pass(r#"{"tools":[{"type":"function","name":"f"},{"type":"web_search_preview"}]}"#);
        assert_eq!((unlimited.web_search, unlimited.tool_call_limit), (true, None));
        // Anthropic's: `max_uses` on the tool, whatever the order of its members.
        let anthropic =
            one_pass(r#"{"tools":[{"max_uses":5,"name":"web_search","type":"web_search_20250305"}]}"#);
        assert_eq!((anthropic.web_search, anthropic.tool_call_limit), (true, Some(5)));
        let two = one_pass(
            r#"{"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20250305","max_uses":3}]}"#,
        );
        assert_eq!(two.tool_call_limit, Some(5));
        let one_unlimited = one_pass(
            r#"{"tools":[{"type":"web_search_20250305","max_uses":2},{"type":"web_search_20250305"}]}"#,
        );
        assert_eq!(one_unlimited.tool_call_limit, None);
        let both = one_pass(r#"{"max_tool_calls":4,"tools":[{"type":"web_search_20250305","max_uses":2}]}"#);
        assert_eq!(both.tool_call_limit, Some(2));
        // Gemini's grounding.
        assert!(one_pass(r#"{"contents":[],"tools":[{"google_search":{}}]}"#).web_search);
        // Not a search tool: a function's schema naming one, a message's item, an unrelated `max_uses`.
        let nested = r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"web_search"}}}],
            "input":[{"type":"web_search_call"}],"max_uses":3}"#;
        assert_eq!((one_pass(nested).web_search, one_pass(nested).tool_call_limit), (false, None));
        assert!(!one_pass(r#"{"tools":[{"type":"function","max_uses":2}]}"#).web_search);
        // `facts` reads the same facts, as leniently as it reads the rest.
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
            assert_eq!(one_pass(body), facts(body.as_bytes()), "{body}");
        }
        assert!(!one_pass(r#"{"tools":[{"type":"image_url","google_search":{}}]}"#).web_search);
        assert_eq!(one_pass(r#"{"tools":{"type":"web_search","max_uses":4}}"#).tool_call_limit, Some(4));
        assert_eq!(
            one_pass(r#"{"model":"m","tools":[],"tools":[{"type":"web_search"}]}"#),
            RequestFacts::default()
        );
        // The estimate is the same as without the facts.
        let body =
            br#"{"tools":[{"type":"web_search","max_uses":2}],"max_tool_calls":1,"service_tier":"flex"}"#;
        assert_eq!(read(body).input_tokens, crate::usage::estimate_input_tokens(body));
        // A repeat of either member is the body's ambiguity.
        let repeated = read(br#"{"service_tier":"flex","service_tier":"priority"}"#);
        assert_eq!(repeated.ambiguity, Some(Ambiguity::RepeatedMember("service_tier".into())));
        let repeated = read(br#"{"tools":[{"type":"web_search_20250305","max_uses":1,"max_uses":9}]}"#);
        assert_eq!(repeated.ambiguity, Some(Ambiguity::RepeatedMember("tools[0].max_uses".into())));
    }
}
