//! OpenAI's chat completions, legacy completions, embeddings and Responses API.

use std::fmt;

use recovea_core::usage::Usage;
use serde::Deserialize;
use serde::de::{Deserializer, SeqAccess, Visitor};

use super::{OutputChars, SumOf, TextChars, Tier, chars, output_within_total};
use crate::usage::lenient::StrOrNothing;
use crate::usage::quick::CompletionRead;

/// An OpenAI chat completion or legacy completion: a whole JSON answer or one stream chunk.
#[derive(Deserialize)]
pub(in crate::usage) struct OpenAiCompletion<'a> {
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
pub(in crate::usage) struct OpenAiChoice {
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
pub(in crate::usage) struct OpenAiUsage {
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
pub(in crate::usage) struct OpenAiEmbeddings<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<OpenAiUsage>,
}

/// A Responses API answer (`/v1/responses`), or the `response` of a stream event: its usage, the
/// text and built-in tool calls of its output items (in a stream only the final snapshot's tell
/// the calls), and the tier it was served at.
#[derive(Deserialize)]
pub(in crate::usage) struct Response<'a> {
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
pub(in crate::usage) struct ResponseOutputItem<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: StrOrNothing<'a>,
    #[serde(borrow, default)]
    container_id: StrOrNothing<'a>,
    content: Option<SumOf<ResponseContentPart>>,
    arguments: Option<TextChars>,
}

/// A Responses answer's `output`: the characters of its text and the built-in tools it called.
#[derive(Debug, Default)]
pub(in crate::usage) struct ResponseOutput {
    pub chars: u64,
    pub tools: ToolCalls,
}

/// The built-in tool calls of a Responses answer, as OpenAI bills them: each web search and file
/// search call, and each code interpreter container (a session, however many calls ran in it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(in crate::usage) struct ToolCalls {
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

#[derive(Deserialize)]
struct ResponseContentPart {
    text: Option<TextChars>,
    refusal: Option<TextChars>,
}

/// One Responses stream event: a text delta, or a `response` snapshot.
#[derive(Deserialize)]
pub(in crate::usage) struct ResponsesEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    pub delta: Option<TextChars>,
    #[serde(borrow)]
    pub response: Option<Response<'a>>,
}

/// `input_tokens` includes cached tokens, `output_tokens` includes reasoning tokens.
#[derive(Deserialize)]
pub(in crate::usage) struct ResponsesUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<CachedDetails>,
    output_tokens_details: Option<ReasoningDetails>,
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
