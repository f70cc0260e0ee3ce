//! A whole JSON answer read at its end, whatever its API: its usage, output characters and model.

use std::sync::LazyLock;

use memchr::memmem;
use recovea_core::usage::Usage;

use super::lenient::StrOrNothing;
use super::quick::{self, CompletionRead};
use super::wire::{
    AnthropicMessage, AnthropicUsage, GeminiGrounding, GeminiResponse, ImagesAnswer, OpenAiCompletion,
    OpenAiEmbeddings, Response, TranscriptionAnswer,
};
use super::{Surface, Tapped};

/// Reads a whole JSON answer of `surface`; an error body or a body that does not parse has no
/// usage. (Also how a job's results are read: each is an answer of its API.)
pub fn read_json(surface: Surface, body: &[u8]) -> Tapped {
    let parsed = match surface {
        Surface::ChatCompletions | Surface::Completions => {
            let read = match std::str::from_utf8(body) {
                Ok(text) => read_completion(text),
                Err(_) => serde_json::from_slice(body).ok().map(OpenAiCompletion::into_read),
            };
            read.map(|read| (read.usage, read.output_chars, read.model))
        }
        Surface::Embeddings => crate::from_json(body).ok().map(|a: OpenAiEmbeddings| {
            let usage = a.usage.map(|u| Usage { output_tokens: 0, reasoning_tokens: 0, ..u.to_usage() });
            (usage, 0, a.model)
        }),
        Surface::Responses => crate::from_json(body)
            .ok()
            .map(|a: Response| (a.to_usage(), a.output.as_ref().map_or(0, |o| o.chars), a.model)),
        Surface::Messages => crate::from_json(body).ok().map(|a: AnthropicMessage| {
            (a.usage.map(AnthropicUsage::to_usage), a.content.map_or(0, |c| c.total), a.model)
        }),
        Surface::GenerateContent => read_gemini_json(body),
        Surface::Images => {
            crate::from_json(body).ok().map(|a: ImagesAnswer| (images_usage(&a), 0, StrOrNothing::default()))
        }
        Surface::Transcription => crate::from_json(body)
            .ok()
            .map(|a: TranscriptionAnswer| (a.to_usage(), a.text.map_or(0, |t| t.0), StrOrNothing::default())),
        Surface::Speech | Surface::Other => None,
    };
    parsed.map_or_else(Tapped::default, |(usage, output_chars, model)| Tapped {
        output_chars: if usage.is_some() { 0 } else { output_chars },
        usage,
        model: owned_model(&model),
        partial: false,
        created: None,
    })
}

/// An Images answer's usage: gpt-image models' tokens, else (DALL-E) the images it holds.
fn images_usage(answer: &ImagesAnswer<'_>) -> Option<Usage> {
    match (&answer.usage, &answer.data) {
        (Some(usage), _) => Some(usage.to_image_usage()),
        (None, Some(data)) => Some(Usage { images: data.0, ..Usage::default() }),
        (None, None) => None,
    }
}

/// The distinct web searches of Gemini answers (`groundingMetadata.webSearchQueries`), read only
/// from a body that names them: grounding is rare, and the plain answer is not read twice.
pub(super) fn note_gemini_searches(body: &[u8], queries: &mut Vec<String>) {
    static KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"webSearchQueries"));
    static SNAKE: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"web_search_queries"));
    if KEY.find(body).is_none() && SNAKE.find(body).is_none() {
        return;
    }
    if body.trim_ascii_start().starts_with(b"[") {
        if let Ok(answers) = crate::from_json::<Vec<GeminiGrounding>>(body) {
            answers.into_iter().for_each(|answer| answer.note_queries(queries));
        }
    } else if let Ok(answer) = crate::from_json::<GeminiGrounding>(body) {
        answer.note_queries(queries);
    }
}

/// A Gemini answer: one `GenerateContentResponse`, or the JSON array `:streamGenerateContent` sends
/// without `alt=sse`, whose last `usageMetadata` is the final count.
fn read_gemini_json(body: &[u8]) -> Option<(Option<Usage>, u64, StrOrNothing<'_>)> {
    let starts_array = body.trim_ascii_start().starts_with(b"[");
    let responses: Vec<GeminiResponse<'_>> =
        if starts_array { crate::from_json(body).ok()? } else { vec![crate::from_json(body).ok()?] };
    let mut read = (None, 0u64, StrOrNothing::default());
    for response in responses {
        read.1 = read.1.saturating_add(response.candidates.map_or(0, |c| c.total));
        if read.2.0.is_none() {
            read.2 = response.model;
        }
        if let Some(usage) = response.usage {
            read.0 = Some(usage.to_usage());
        }
    }
    let mut queries = Vec::new();
    note_gemini_searches(body, &mut queries);
    if let Some(usage) = &mut read.0 {
        usage.web_search_calls = queries.len() as u64;
    }
    Some(read)
}

/// An OpenAI completion or chunk: the quick walk where it can tell, serde otherwise; `None` when
/// it does not parse.
pub(super) fn read_completion(text: &str) -> Option<CompletionRead<'_>> {
    quick::completion(text).or_else(|| serde_json::from_str(text).ok().map(OpenAiCompletion::into_read))
}

pub(super) fn owned_model(model: &StrOrNothing<'_>) -> Option<String> {
    Some(model.as_str()).filter(|m| !m.is_empty()).map(str::to_owned)
}
