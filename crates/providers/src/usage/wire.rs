//! The parts of the providers' answer shapes the tap reads, as borrowing serde types that skip the rest.

use std::fmt;
use std::marker::PhantomData;

use recovea_core::pricing::ServiceTier;
use recovea_core::usage::Usage;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::lenient::StrOrNothing;
use super::quick::CompletionRead;

/// An OpenAI chat completion or legacy completion: a whole JSON answer or one stream chunk.
#[derive(Deserialize)]
pub(super) struct OpenAiCompletion<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub choices: Option<SumOf<OpenAiChoice>>,
    pub usage: Option<OpenAiUsage>,
    /// The tier the request was served at (`default`, `flex`, `priority`).
    #[serde(default)]
    pub service_tier: Tier,
}

impl<'a> OpenAiCompletion<'a> {
    pub fn into_read(self) -> CompletionRead<'a> {
        let tier = self.service_tier.0;
        CompletionRead {
            usage: self.usage.map(|usage| Usage { service_tier: tier, ..usage.to_usage() }),
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

/// `prompt_tokens_details` (chat) and `input_tokens_details` (Responses): the cached part of the
/// input, and its audio part (chat with audio).
#[derive(Deserialize)]
struct CachedDetails {
    cached_tokens: Option<u64>,
    audio_tokens: Option<u64>,
}

/// `completion_tokens_details` and `output_tokens_details`: the reasoning part of the output, and
/// its audio part.
#[derive(Deserialize)]
struct ReasoningDetails {
    reasoning_tokens: Option<u64>,
    audio_tokens: Option<u64>,
}

/// An embeddings answer; its vectors are skipped unread.
#[derive(Deserialize)]
pub(super) struct OpenAiEmbeddings<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<OpenAiUsage>,
}

/// A Responses API answer (`/v1/responses`), or the `response` of a stream event: its usage, the
/// text and built-in tool calls of its output items (in a stream only the final snapshot's tell
/// the calls), and the tier it was served at.
#[derive(Deserialize)]
pub(super) struct Response<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<ResponsesUsage>,
    pub output: Option<ResponseOutput>,
    #[serde(default)]
    pub service_tier: Tier,
}

impl Response<'_> {
    /// Its usage with the tier it was served at and the tool calls of its output.
    pub fn to_usage(&self) -> Option<Usage> {
        let usage = self.usage.as_ref()?.to_usage();
        let usage = self.output.as_ref().map_or(usage, |output| output.tools.add_to(usage));
        Some(Usage { service_tier: self.service_tier.0, ..usage })
    }
}

/// A message item (`content` parts), a function call (`arguments`), or a built-in tool's call
/// (`type` `web_search_call`, `file_search_call`, `code_interpreter_call` and its `container_id`).
#[derive(Deserialize)]
pub(super) struct ResponseOutputItem<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: StrOrNothing<'a>,
    #[serde(borrow, default)]
    container_id: StrOrNothing<'a>,
    content: Option<SumOf<ResponseContentPart>>,
    arguments: Option<TextChars>,
}

/// A Responses answer's `output`: the characters of its text and the built-in tools it called.
#[derive(Debug, Default)]
pub(super) struct ResponseOutput {
    pub chars: u64,
    pub tools: ToolCalls,
}

/// The built-in tool calls of a Responses answer, as OpenAI bills them: each web search and file
/// search call, and each code interpreter container (a session, however many calls ran in it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct ToolCalls {
    pub web_search: u64,
    pub file_search: u64,
    /// The distinct containers code ran in; a call that names none counts a container of its own.
    pub containers: Vec<String>,
    pub unnamed_sessions: u64,
}

impl ToolCalls {
    pub fn add_to(&self, usage: Usage) -> Usage {
        let sessions = (self.containers.len() as u64).saturating_add(self.unnamed_sessions);
        Usage {
            web_search_calls: usage.web_search_calls.saturating_add(self.web_search),
            file_search_calls: usage.file_search_calls.saturating_add(self.file_search),
            code_interpreter_sessions: usage.code_interpreter_sessions.saturating_add(sessions),
            ..usage
        }
    }

    fn note(&mut self, item: &ResponseOutputItem<'_>) {
        match item.kind.as_str() {
            "web_search_call" => self.web_search = self.web_search.saturating_add(1),
            "file_search_call" => self.file_search = self.file_search.saturating_add(1),
            "code_interpreter_call" => match item.container_id.0.as_deref() {
                Some(id) if !id.is_empty() => {
                    if !self.containers.iter().any(|known| known == id) {
                        self.containers.push(id.to_owned());
                    }
                }
                _ => self.unnamed_sessions = self.unnamed_sessions.saturating_add(1),
            },
            _ => {}
        }
    }
}

impl<'de> Deserialize<'de> for ResponseOutput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Reading;
        impl<'de> Visitor<'de> for Reading {
            type Value = ResponseOutput;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut output = ResponseOutput::default();
                while let Some(item) = seq.next_element::<ResponseOutputItem<'de>>()? {
                    output.chars = output.chars.saturating_add(item.output_chars());
                    output.tools.note(&item);
                }
                Ok(output)
            }
        }
        deserializer.deserialize_seq(Reading)
    }
}

/// A `service_tier` of any JSON type: a string names a tier ([`ServiceTier::parse`]), anything else
/// is the standard one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tier(pub ServiceTier);

impl<'de> Deserialize<'de> for Tier {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = StrOrNothing::deserialize(deserializer)?;
        Ok(Tier(ServiceTier::parse(name.as_str())))
    }
}

/// Whole seconds of audio from a number of seconds, rounded up (`usage.seconds`, a verbose
/// transcription's `duration`: both may carry a fraction); anything but a number is none.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seconds(pub Option<u64>);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Reading;
        impl<'de> Visitor<'de> for Reading {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Seconds, E> {
                Ok(Seconds(Some(n)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Seconds, E> {
                Ok(Seconds(u64::try_from(n).ok()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Seconds, E> {
                // A duration, not money: rounded up to the second, as a second begun is billed.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let seconds = (n.is_finite() && n >= 0.0).then(|| n.ceil().min(u64::MAX as f64) as u64);
                Ok(Seconds(seconds))
            }
            fn visit_str<E>(self, _: &str) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_unit<E>(self) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Seconds, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| Seconds(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Seconds, A::Error> {
                IgnoredAny.visit_map(map).map(|_| Seconds(None))
            }
        }
        deserializer.deserialize_any(Reading)
    }
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
    /// The cache writes by how long they are kept: the hour's are billed at their own price.
    cache_creation: Option<AnthropicCacheCreation>,
    /// The server tools' requests: each web search is billed.
    server_tool_use: Option<AnthropicServerToolUse>,
    service_tier: Option<Tier>,
}

#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
struct AnthropicCacheCreation {
    ephemeral_1h_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
struct AnthropicServerToolUse {
    web_search_requests: Option<u64>,
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
    /// The prompt, the cached content and the candidates by modality: audio and image tokens
    /// have prices of their own.
    #[serde(alias = "prompt_tokens_details")]
    prompt_tokens_details: Option<Modalities>,
    #[serde(alias = "cache_tokens_details")]
    cache_tokens_details: Option<Modalities>,
    #[serde(alias = "candidates_tokens_details")]
    candidates_tokens_details: Option<Modalities>,
}

/// Gemini's tokens by modality (`[{"modality": "AUDIO", "tokenCount": 10}]`): the audio and
/// image parts (video is billed as image input, as Gemini prices it; text is the rest).
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(from = "Vec<ModalityCount>")]
pub(super) struct Modalities {
    audio: u64,
    image: u64,
}

#[derive(Deserialize)]
struct ModalityCount {
    #[serde(default)]
    modality: Option<String>,
    #[serde(rename = "tokenCount", alias = "token_count", default)]
    token_count: Option<u64>,
}

impl From<Vec<ModalityCount>> for Modalities {
    fn from(counts: Vec<ModalityCount>) -> Self {
        counts.iter().fold(Modalities::default(), |sum, count| {
            let tokens = count.token_count.unwrap_or(0);
            match count.modality.as_deref() {
                Some("AUDIO") => Modalities { audio: sum.audio.saturating_add(tokens), ..sum },
                Some("IMAGE" | "VIDEO") => Modalities { image: sum.image.saturating_add(tokens), ..sum },
                _ => sum,
            }
        })
    }
}

/// A Gemini answer's grounding: the web searches its candidates ran (`groundingMetadata`'s
/// `webSearchQueries`), read only from an answer that names them.
#[derive(Deserialize)]
pub(super) struct GeminiGrounding {
    candidates: Option<Vec<GroundedCandidate>>,
}

#[derive(Deserialize)]
struct GroundedCandidate {
    #[serde(rename = "groundingMetadata", alias = "grounding_metadata")]
    grounding_metadata: Option<GroundingMetadata>,
}

#[derive(Deserialize)]
struct GroundingMetadata {
    #[serde(rename = "webSearchQueries", alias = "web_search_queries")]
    web_search_queries: Option<Vec<serde_json::Value>>,
}

impl GeminiGrounding {
    /// Adds the distinct queries of this answer to `queries`.
    pub fn note_queries(self, queries: &mut Vec<String>) {
        let found = self.candidates.into_iter().flatten().filter_map(|c| c.grounding_metadata);
        for query in found.filter_map(|g| g.web_search_queries).flatten() {
            if let serde_json::Value::String(query) = query
                && !queries.contains(&query)
            {
                queries.push(query);
            }
        }
    }
}

/// An Images API answer (`/v1/images/generations`, `/edits`, `/variations`), or one event of its
/// stream (`image_generation.completed`): the images made, and the token usage gpt-image models
/// report (DALL-E's answers carry none).
#[derive(Deserialize)]
pub(super) struct ImagesAnswer<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    pub data: Option<Count>,
    pub usage: Option<TokensUsage>,
}

/// The usage of the Images API, of speech (`speech.audio.done`) and of token-billed transcription
/// (`"type": "tokens"`), or a duration (`"type": "duration"`, `seconds`).
#[derive(Deserialize)]
pub(super) struct TokensUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    #[serde(alias = "input_token_details")]
    input_tokens_details: Option<ModalDetails>,
    output_tokens_details: Option<ModalDetails>,
    #[serde(default)]
    seconds: Seconds,
}

/// Input or output tokens by modality.
#[derive(Deserialize)]
struct ModalDetails {
    image_tokens: Option<u64>,
    audio_tokens: Option<u64>,
}

impl TokensUsage {
    /// An image answer's: its output is images, unless it says otherwise.
    pub fn to_image_usage(&self) -> Usage {
        let output = self.output_tokens.unwrap_or(0);
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0),
            image_input_tokens: self.input_tokens_details.as_ref().and_then(|d| d.image_tokens).unwrap_or(0),
            output_tokens: output,
            image_output_tokens: self
                .output_tokens_details
                .as_ref()
                .map_or(output, |d| d.image_tokens.unwrap_or(0)),
            ..Usage::default()
        }
    }

    /// Speech's: its output is audio.
    pub fn to_speech_usage(&self) -> Usage {
        let output = self.output_tokens.unwrap_or(0);
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0),
            output_tokens: output,
            audio_output_tokens: output,
            ..Usage::default()
        }
    }

    /// A transcription's: seconds, or tokens whose input is audio as its details say.
    pub fn to_transcription_usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens.unwrap_or(0),
            audio_input_tokens: self.input_tokens_details.as_ref().and_then(|d| d.audio_tokens).unwrap_or(0),
            output_tokens: self.output_tokens.unwrap_or(0),
            seconds: self.seconds.0.unwrap_or(0),
            ..Usage::default()
        }
    }
}

/// A transcription or translation answer in JSON (`json`, `verbose_json`, or an event of its
/// stream, `transcript.text.done`): its `usage`, else a verbose answer's `duration`.
#[derive(Deserialize)]
pub(super) struct TranscriptionAnswer {
    pub usage: Option<TokensUsage>,
    #[serde(default)]
    pub duration: Seconds,
    pub text: Option<TextChars>,
}

impl TranscriptionAnswer {
    pub fn to_usage(&self) -> Option<Usage> {
        match (&self.usage, self.duration.0) {
            (Some(usage), _) => Some(usage.to_transcription_usage()),
            (None, Some(seconds)) => Some(Usage { seconds, ..Usage::default() }),
            (None, None) => None,
        }
    }
}

/// One event of a speech stream (`stream_format: "sse"`): `speech.audio.done` carries the usage.
#[derive(Deserialize)]
pub(super) struct SpeechEvent {
    pub usage: Option<TokensUsage>,
}

/// The number of elements of a JSON array, each skipped unread.
pub(super) struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> Visitor<'de> for Counting {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut count = 0u64;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    count = count.saturating_add(1);
                }
                Ok(Count(count))
            }
        }
        deserializer.deserialize_seq(Counting)
    }
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

impl OutputChars for ResponseOutputItem<'_> {
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
            audio_input_tokens: self.prompt_tokens_details.as_ref().and_then(|d| d.audio_tokens).unwrap_or(0),
            audio_output_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.audio_tokens)
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
            cache_creation: newer.cache_creation.or(self.cache_creation),
            server_tool_use: newer.server_tool_use.or(self.server_tool_use),
            service_tier: newer.service_tier.or(self.service_tier),
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
            // The hour's part of the writes, never more than the writes themselves.
            cache_write_1h_input_tokens: self
                .cache_creation
                .and_then(|c| c.ephemeral_1h_input_tokens)
                .unwrap_or(0)
                .min(cache_write),
            output_tokens: self.output_tokens.unwrap_or(0),
            reasoning_tokens: 0,
            web_search_calls: self.server_tool_use.and_then(|s| s.web_search_requests).unwrap_or(0),
            service_tier: self.service_tier.map_or(ServiceTier::Standard, |tier| tier.0),
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
            audio_input_tokens: self.prompt_tokens_details.map_or(0, |d| d.audio),
            image_input_tokens: self.prompt_tokens_details.map_or(0, |d| d.image),
            cached_audio_input_tokens: self.cache_tokens_details.map_or(0, |d| d.audio),
            cached_image_input_tokens: self.cache_tokens_details.map_or(0, |d| d.image),
            audio_output_tokens: self.candidates_tokens_details.map_or(0, |d| d.audio),
            image_output_tokens: self.candidates_tokens_details.map_or(0, |d| d.image),
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
