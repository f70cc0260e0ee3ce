//! Anthropic's messages: an answer, and the events of its stream.

use recovea_core::pricing::ServiceTier;
use recovea_core::usage::Usage;
use serde::Deserialize;

use super::{OutputChars, SumOf, TextChars, Tier, chars};
use crate::usage::lenient::StrOrNothing;

/// An Anthropic message answer.
#[derive(Deserialize)]
pub(in crate::usage) struct AnthropicMessage<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub content: Option<SumOf<AnthropicBlock>>,
    pub usage: Option<AnthropicUsage>,
}

/// A content block: `text`, `thinking`, or a tool call's `input` (its string values counted).
#[derive(Deserialize)]
pub(in crate::usage) struct AnthropicBlock {
    text: Option<TextChars>,
    thinking: Option<TextChars>,
    input: Option<TextChars>,
}

/// One Anthropic stream event: `message_start` (message), `message_delta` (usage) or
/// `content_block_delta` (delta).
#[derive(Deserialize)]
pub(in crate::usage) struct AnthropicEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    #[serde(borrow)]
    pub message: Option<AnthropicMessageStart<'a>>,
    pub usage: Option<AnthropicUsage>,
    pub delta: Option<AnthropicDelta>,
}

#[derive(Deserialize)]
pub(in crate::usage) struct AnthropicMessageStart<'a> {
    #[serde(borrow, default)]
    pub model: StrOrNothing<'a>,
    pub usage: Option<AnthropicUsage>,
}

/// `text_delta`, `input_json_delta` or `thinking_delta`; `signature_delta` carries no output.
#[derive(Deserialize)]
pub(in crate::usage) struct AnthropicDelta {
    text: Option<TextChars>,
    partial_json: Option<TextChars>,
    thinking: Option<TextChars>,
}

/// Anthropic's `input_tokens` excludes cache reads and writes. In a stream each report is
/// cumulative, and a later one may leave fields out, hence every field optional.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::usage) struct AnthropicUsage {
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
