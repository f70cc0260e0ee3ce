//! Gemini's `GenerateContentResponse`: its candidates, usage by modality, and grounding.

use recovea_core::usage::Usage;
use serde::Deserialize;

use super::{OutputChars, SumOf, TextChars, chars};
use crate::usage::lenient::StrOrNothing;

/// A Gemini `GenerateContentResponse`: a whole answer, one element of a streamed JSON array, or
/// one event of an `alt=sse` stream. The REST API writes its names in camelCase; the snake_case
/// spellings its protobuf JSON also allows are read too.
#[derive(Deserialize)]
pub(in crate::usage) struct GeminiResponse<'a> {
    #[serde(rename = "modelVersion", alias = "model_version", borrow, default)]
    pub model: StrOrNothing<'a>,
    pub candidates: Option<SumOf<GeminiCandidate>>,
    #[serde(rename = "usageMetadata", alias = "usage_metadata")]
    pub usage: Option<GeminiUsage>,
}

#[derive(Deserialize)]
pub(in crate::usage) struct GeminiCandidate {
    content: Option<GeminiContent>,
}

#[derive(Deserialize)]
struct GeminiContent {
    parts: Option<SumOf<GeminiPart>>,
}

/// A part of a candidate: `text` (answer or thought), or a function call (its name and arguments'
/// strings counted).
#[derive(Deserialize)]
pub(in crate::usage) struct GeminiPart {
    text: Option<TextChars>,
    #[serde(rename = "functionCall", alias = "function_call")]
    function_call: Option<TextChars>,
}

/// Gemini's `usageMetadata`. `promptTokenCount` includes `cachedContentTokenCount`; the tokens of
/// tool-use prompts (`toolUsePromptTokenCount`) and of thoughts (`thoughtsTokenCount`) are counted
/// apart from the prompt and the candidates, and billed as input and output respectively.
#[derive(Debug, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(in crate::usage) struct GeminiUsage {
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
pub(in crate::usage) struct Modalities {
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
pub(in crate::usage) struct GeminiGrounding {
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
