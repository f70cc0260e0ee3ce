//! The parts of the providers' answer shapes the tap reads, as borrowing serde types that skip the rest.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use recovea_core::usage::Usage;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::quick::CompletionRead;

/// An OpenAI chat completion or legacy completion: a whole JSON answer or one stream chunk.
#[derive(Deserialize)]
pub(super) struct OpenAiCompletion<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub choices: Option<SumOf<OpenAiChoice>>,
    pub usage: Option<OpenAiUsage>,
}

impl<'a> OpenAiCompletion<'a> {
    pub fn into_read(self) -> CompletionRead<'a> {
        CompletionRead {
            usage: self.usage.map(|usage| usage.to_usage()),
            output_chars: self.choices.map_or(0, |choices| choices.total),
            model: self.model,
        }
    }
}

/// A choice of any OpenAI completion shape: `message` (chat answer), `delta` (chat chunk) or
/// `text` (legacy completions, answer or chunk).
#[derive(Deserialize)]
pub(super) struct OpenAiChoice {
    message: Option<OpenAiMessage>,
    delta: Option<OpenAiMessage>,
    text: Option<TextChars>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    content: Option<TextChars>,
    refusal: Option<TextChars>,
    tool_calls: Option<SumOf<OpenAiToolCall>>,
    function_call: Option<OpenAiFunction>,
}

#[derive(Deserialize)]
struct OpenAiToolCall {
    function: Option<OpenAiFunction>,
}

#[derive(Deserialize)]
struct OpenAiFunction {
    arguments: Option<TextChars>,
}

/// Chat completions, legacy completions and embeddings: `prompt_tokens` includes cached tokens,
/// `completion_tokens` includes reasoning tokens.
#[derive(Deserialize)]
pub(super) struct OpenAiUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    prompt_tokens_details: Option<CachedDetails>,
    completion_tokens_details: Option<ReasoningDetails>,
}

#[derive(Deserialize)]
struct CachedDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ReasoningDetails {
    reasoning_tokens: Option<u64>,
}

/// An embeddings answer; its vectors are skipped unread.
#[derive(Deserialize)]
pub(super) struct OpenAiEmbeddings<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<OpenAiUsage>,
}

/// A Responses API answer (`/v1/responses`), or the `response` of a stream event.
#[derive(Deserialize)]
pub(super) struct Response<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<ResponsesUsage>,
}

/// A whole Responses answer, with the text of its output items.
#[derive(Deserialize)]
pub(super) struct ResponseBody<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<ResponsesUsage>,
    pub output: Option<SumOf<ResponseOutputItem>>,
}

/// A message item (`content` parts) or a function call (`arguments`).
#[derive(Deserialize)]
pub(super) struct ResponseOutputItem {
    content: Option<SumOf<ResponseContentPart>>,
    arguments: Option<TextChars>,
}

#[derive(Deserialize)]
struct ResponseContentPart {
    text: Option<TextChars>,
    refusal: Option<TextChars>,
}

/// One Responses stream event: a text delta, or a `response` snapshot.
#[derive(Deserialize)]
pub(super) struct ResponsesEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    pub delta: Option<TextChars>,
    #[serde(borrow)]
    pub response: Option<Response<'a>>,
}

/// `input_tokens` includes cached tokens, `output_tokens` includes reasoning tokens.
#[derive(Deserialize)]
pub(super) struct ResponsesUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<CachedDetails>,
    output_tokens_details: Option<ReasoningDetails>,
}

/// An Anthropic message answer.
#[derive(Deserialize)]
pub(super) struct AnthropicMessage<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub content: Option<SumOf<AnthropicBlock>>,
    pub usage: Option<AnthropicUsage>,
}

/// A content block: `text`, `thinking`, or a tool call's `input` (its string values counted).
#[derive(Deserialize)]
pub(super) struct AnthropicBlock {
    text: Option<TextChars>,
    thinking: Option<TextChars>,
    input: Option<TextChars>,
}

/// One Anthropic stream event: `message_start` (message), `message_delta` (usage) or
/// `content_block_delta` (delta).
#[derive(Deserialize)]
pub(super) struct AnthropicEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    #[serde(borrow)]
    pub message: Option<AnthropicMessageStart<'a>>,
    pub usage: Option<AnthropicUsage>,
    pub delta: Option<AnthropicDelta>,
}

#[derive(Deserialize)]
pub(super) struct AnthropicMessageStart<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<AnthropicUsage>,
}

/// `text_delta`, `input_json_delta` or `thinking_delta`; `signature_delta` carries no output.
#[derive(Deserialize)]
pub(super) struct AnthropicDelta {
    text: Option<TextChars>,
    partial_json: Option<TextChars>,
    thinking: Option<TextChars>,
}

/// Anthropic's `input_tokens` excludes cache reads and writes. In a stream each report is
/// cumulative, and a later one may leave fields out, hence every field optional.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct AnthropicUsage {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

/// A Gemini `GenerateContentResponse`: a whole answer, one element of a streamed JSON array, or
/// one event of an `alt=sse` stream. The REST API writes its names in camelCase; the snake_case
/// spellings its protobuf JSON also allows are read too.
#[derive(Deserialize)]
pub(super) struct GeminiResponse<'a> {
    #[serde(rename = "modelVersion", alias = "model_version", borrow, default)]
    pub model: StrOrNothing<'a>,
    pub candidates: Option<SumOf<GeminiCandidate>>,
    #[serde(rename = "usageMetadata", alias = "usage_metadata")]
    pub usage: Option<GeminiUsage>,
}

#[derive(Deserialize)]
pub(super) struct GeminiCandidate {
    content: Option<GeminiContent>,
}

#[derive(Deserialize)]
struct GeminiContent {
    parts: Option<SumOf<GeminiPart>>,
}

/// A part of a candidate: `text` (answer or thought), or a function call (its name and arguments'
/// strings counted).
#[derive(Deserialize)]
pub(super) struct GeminiPart {
    text: Option<TextChars>,
    #[serde(rename = "functionCall", alias = "function_call")]
    function_call: Option<TextChars>,
}

/// Gemini's `usageMetadata`. `promptTokenCount` includes `cachedContentTokenCount`; the tokens of
/// tool-use prompts (`toolUsePromptTokenCount`) and of thoughts (`thoughtsTokenCount`) are counted
/// apart from the prompt and the candidates, and billed as input and output respectively.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct GeminiUsage {
    #[serde(alias = "prompt_token_count")]
    prompt_token_count: Option<u64>,
    #[serde(alias = "cached_content_token_count")]
    cached_content_token_count: Option<u64>,
    #[serde(alias = "candidates_token_count")]
    candidates_token_count: Option<u64>,
    #[serde(alias = "thoughts_token_count")]
    thoughts_token_count: Option<u64>,
    #[serde(alias = "tool_use_prompt_token_count")]
    tool_use_prompt_token_count: Option<u64>,
}

/// Output characters a piece of an answer carries.
pub(super) trait OutputChars {
    fn output_chars(&self) -> u64;
}

impl OutputChars for OpenAiChoice {
    fn output_chars(&self) -> u64 {
        self.message.as_ref().map_or(0, OutputChars::output_chars)
            + self.delta.as_ref().map_or(0, OutputChars::output_chars)
            + chars(self.text)
    }
}

impl OutputChars for OpenAiMessage {
    fn output_chars(&self) -> u64 {
        chars(self.content)
            + chars(self.refusal)
            + self.tool_calls.as_ref().map_or(0, |calls| calls.total)
            + self.function_call.as_ref().map_or(0, OutputChars::output_chars)
    }
}

impl OutputChars for OpenAiToolCall {
    fn output_chars(&self) -> u64 {
        self.function.as_ref().map_or(0, OutputChars::output_chars)
    }
}

impl OutputChars for OpenAiFunction {
    fn output_chars(&self) -> u64 {
        chars(self.arguments)
    }
}

impl OutputChars for ResponseOutputItem {
    fn output_chars(&self) -> u64 {
        self.content.as_ref().map_or(0, |parts| parts.total) + chars(self.arguments)
    }
}

impl OutputChars for ResponseContentPart {
    fn output_chars(&self) -> u64 {
        chars(self.text) + chars(self.refusal)
    }
}

impl OutputChars for AnthropicBlock {
    fn output_chars(&self) -> u64 {
        chars(self.text) + chars(self.thinking) + chars(self.input)
    }
}

impl OutputChars for AnthropicDelta {
    fn output_chars(&self) -> u64 {
        chars(self.text) + chars(self.partial_json) + chars(self.thinking)
    }
}

impl OutputChars for GeminiCandidate {
    fn output_chars(&self) -> u64 {
        self.content.as_ref().and_then(|c| c.parts.as_ref()).map_or(0, |parts| parts.total)
    }
}

impl OutputChars for GeminiPart {
    fn output_chars(&self) -> u64 {
        chars(self.text) + chars(self.function_call)
    }
}

fn chars(text: Option<TextChars>) -> u64 {
    text.map_or(0, |t| t.0)
}

impl OpenAiUsage {
    pub fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_input_tokens: 0,
            output_tokens: output_within_total(
                self.prompt_tokens.unwrap_or(0),
                self.completion_tokens.unwrap_or(0),
                self.total_tokens,
            ),
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            ..Usage::default()
        }
    }
}

/// The output of an OpenAI-shaped usage: `completion_tokens`, or what `total_tokens` leaves beyond
/// the prompt when that is more. OpenAI's total is their sum; Gemini's OpenAI-compatible endpoint
/// leaves its thinking tokens out of `completion_tokens` but counts them in `total_tokens` (and bills
/// them as output), so a total that says more is believed.
pub(super) fn output_within_total(prompt: u64, completion: u64, total: Option<u64>) -> u64 {
    total.map_or(completion, |total| completion.max(total.saturating_sub(prompt)))
}

impl ResponsesUsage {
    pub fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0),
            cached_input_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_input_tokens: 0,
            output_tokens: self.output_tokens.unwrap_or(0),
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            ..Usage::default()
        }
    }
}

impl AnthropicUsage {
    /// This report laid over an earlier one: each field the newer report carries replaces the
    /// older value, since stream reports are cumulative, never increments.
    pub fn updated_by(self, newer: Self) -> Self {
        Self {
            input_tokens: newer.input_tokens.or(self.input_tokens),
            cache_creation_input_tokens: newer
                .cache_creation_input_tokens
                .or(self.cache_creation_input_tokens),
            cache_read_input_tokens: newer.cache_read_input_tokens.or(self.cache_read_input_tokens),
            output_tokens: newer.output_tokens.or(self.output_tokens),
        }
    }

    /// In the receipt's terms: input counts cache reads and writes too.
    pub fn to_usage(self) -> Usage {
        let cache_read = self.cache_read_input_tokens.unwrap_or(0);
        let cache_write = self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(cache_read)
                .saturating_add(cache_write),
            cached_input_tokens: cache_read,
            cache_write_input_tokens: cache_write,
            output_tokens: self.output_tokens.unwrap_or(0),
            reasoning_tokens: 0,
            ..Usage::default()
        }
    }
}

impl GeminiUsage {
    /// In the receipt's terms: input is the prompt (cached content included) and the tool-use
    /// prompts; output is the candidates and the thoughts, the thoughts being its reasoning part.
    pub fn to_usage(self) -> Usage {
        let thoughts = self.thoughts_token_count.unwrap_or(0);
        Usage {
            input_tokens: self
                .prompt_token_count
                .unwrap_or(0)
                .saturating_add(self.tool_use_prompt_token_count.unwrap_or(0)),
            cached_input_tokens: self.cached_content_token_count.unwrap_or(0),
            cache_write_input_tokens: 0,
            output_tokens: self.candidates_token_count.unwrap_or(0).saturating_add(thoughts),
            reasoning_tokens: thoughts,
            ..Usage::default()
        }
    }
}

/// The summed output characters of a JSON array's elements, counted without collecting them.
pub(super) struct SumOf<T> {
    pub total: u64,
    element: PhantomData<T>,
}

impl<'de, T: Deserialize<'de> + OutputChars> Deserialize<'de> for SumOf<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Summing<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + OutputChars> Visitor<'de> for Summing<T> {
            type Value = SumOf<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut total = 0u64;
                while let Some(element) = seq.next_element::<T>()? {
                    total = total.saturating_add(element.output_chars());
                }
                Ok(SumOf { total, element: PhantomData })
            }
        }
        deserializer.deserialize_seq(Summing(PhantomData))
    }
}

/// The characters of every string inside a JSON value of any type (object keys aside): the text
/// of a string, of content parts, or of a tool call's arguments object.
#[derive(Clone, Copy)]
pub(super) struct TextChars(pub u64);

impl<'de> Deserialize<'de> for TextChars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> Visitor<'de> for Counting {
            type Value = TextChars;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, text: &str) -> Result<TextChars, E> {
                Ok(TextChars(text.chars().count() as u64))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_unit<E>(self) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextChars, A::Error> {
                let mut total = 0u64;
                while let Some(TextChars(n)) = seq.next_element()? {
                    total = total.saturating_add(n);
                }
                Ok(TextChars(total))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextChars, A::Error> {
                let mut total = 0u64;
                while let Some((IgnoredAny, TextChars(n))) = map.next_entry()? {
                    total = total.saturating_add(n);
                }
                Ok(TextChars(total))
            }
        }
        deserializer.deserialize_any(Counting)
    }
}

/// A JSON value kept only when it is a string (borrowed when it has no escapes), so that an odd
/// `model` or `type` never fails the parse of the usage beside it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct StrOrNothing<'a>(pub Option<Cow<'a, str>>);

impl<'a> StrOrNothing<'a> {
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrOrNothing<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keeping<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Keeping<'a> {
            type Value = StrOrNothing<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(StrOrNothing(Some(Cow::Borrowed(text))))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(StrOrNothing(Some(Cow::Owned(text.to_owned()))))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| StrOrNothing(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(map).map(|_| StrOrNothing(None))
            }
        }
        deserializer.deserialize_any(Keeping(PhantomData))
    }
}
