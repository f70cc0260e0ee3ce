//! Token usage read from a provider's answer as it passes, and estimated when it carries none.

mod answer;
pub(crate) mod input;
mod lenient;
mod quick;
mod stream;
mod surface;
mod wire;

use bytes::Bytes;
use recovea_core::usage::Usage;

use crate::sse::SseReader;
pub use answer::read_json;
use stream::Tally;
pub(crate) use stream::may_carry_usage;
pub use surface::{Surface, model_in_path, streams_by_path};

/// The most of an answer the tap keeps: a JSON body it parses at the end, or one stream event.
/// Beyond it the usage is given up (`None`) rather than memory grown without bound.
pub const MAX_TAPPED_BYTES: usize = 16 << 20;

/// The estimation rule of thumb: about four characters of English per token.
const CHARS_PER_TOKEN: u64 = 4;

/// Tokens every request costs beyond its text (OpenAI primes each reply with 3).
const REQUEST_OVERHEAD_TOKENS: u64 = 3;

/// One image, file or audio part of a request, whatever its size: its bytes say little about its
/// tokens (a 1024x1024 image is about 765 tokens at OpenAI, about 1,600 at Anthropic).
const MEDIA_PART_TOKENS: u64 = 1_000;

/// The request fields that hold what the model reads (`contents` and `systemInstruction`: Gemini's).
const INPUT_FIELDS: [&str; 10] = [
    "messages",
    "system",
    "input",
    "prompt",
    "instructions",
    "tools",
    "functions",
    "contents",
    "systemInstruction",
    "system_instruction",
];

/// Content part types whose payload is media, counted flat rather than by characters.
const MEDIA_PART_TYPES: [&str; 7] =
    ["image_url", "input_image", "image", "document", "input_file", "file", "input_audio"];

/// What the tap learned from one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tapped {
    /// The provider's own report; `None` when the answer carried none (cut, error, oversized).
    pub usage: Option<Usage>,
    /// Characters of generated text, tool arguments and thinking, for an estimate: counted only
    /// when the answer reports no usage of its own (0 when it does), since only then is there
    /// anything to estimate.
    pub output_chars: u64,
    /// The model that answered, as the provider names it.
    pub model: Option<String>,
    /// `usage` is partly estimated: the stream ended before the provider's final count (an Anthropic
    /// stream cut before `message_delta`), so the receipt must not call it the provider's.
    pub partial: bool,
    /// What the answer created, when the tap was asked ([`UsageTap::naming`]): the provider's id
    /// of an uploaded file or of a job still to run.
    pub created: Option<String>,
}

/// What a request creates, whose id its answer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// A file (`POST /v1/files`).
    File,
    /// A deferred job of this kind; a background response counts only while it is still to run.
    Job(recovea_core::channel::JobKind),
}

/// Watches a response body go by and reads its usage, without changing or holding back a byte.
#[derive(Debug)]
pub struct UsageTap {
    surface: Surface,
    body: TappedBody,
    creation: Option<Creation>,
}

#[derive(Debug)]
enum TappedBody {
    /// A JSON answer, kept until it is whole.
    Json { kept: Kept, overflowed: bool },
    /// An event stream, read event by event (boxed, so a JSON tap stays small).
    Events(Box<EventTap>),
    /// Nothing to read here.
    Ignored,
}

/// A stream's reader and what its events told so far.
#[derive(Debug)]
struct EventTap {
    reader: SseReader,
    tally: Tally,
}

/// The bytes of a JSON answer so far. Most answers come in one chunk: that one is kept as it came,
/// shared with the body it passes on in, not copied.
#[derive(Debug, Default)]
enum Kept {
    #[default]
    Nothing,
    One(Bytes),
    Joined(Vec<u8>),
}

impl Kept {
    fn as_slice(&self) -> &[u8] {
        match self {
            Kept::Nothing => &[],
            Kept::One(chunk) => chunk,
            Kept::Joined(joined) => joined,
        }
    }

    fn push(&mut self, chunk: &Bytes) {
        match self {
            Kept::Nothing => *self = Kept::One(chunk.clone()),
            Kept::One(first) => *self = Kept::Joined([&first[..], chunk].concat()),
            Kept::Joined(joined) => joined.extend_from_slice(chunk),
        }
    }
}

impl UsageTap {
    /// `event_stream`: the response's content type is `text/event-stream`.
    pub fn new(surface: Surface, event_stream: bool) -> Self {
        let body = match (surface, event_stream) {
            // A speech answer without events is the audio itself.
            (Surface::Other, _) | (Surface::Embeddings, true) | (Surface::Speech, false) => {
                TappedBody::Ignored
            }
            (_, true) => TappedBody::Events(Box::new(EventTap {
                reader: SseReader::with_max_event_bytes(MAX_TAPPED_BYTES),
                tally: Tally::default(),
            })),
            (_, false) => TappedBody::Json { kept: Kept::Nothing, overflowed: false },
        };
        Self { surface, body, creation: None }
    }

    /// Also reads the id of what the request created from a JSON answer (an answer the tap
    /// would otherwise ignore is kept for it, within the same bound).
    pub fn naming(mut self, creation: Creation, event_stream: bool) -> Self {
        if !event_stream && matches!(self.body, TappedBody::Ignored) {
            self.body = TappedBody::Json { kept: Kept::Nothing, overflowed: false };
        }
        self.creation = Some(creation);
        self
    }

    /// Sees the next bytes of the body.
    pub fn observe(&mut self, chunk: &Bytes) {
        match &mut self.body {
            TappedBody::Json { kept, overflowed: overflowed @ false } => {
                if kept.as_slice().len() + chunk.len() > MAX_TAPPED_BYTES {
                    *kept = Kept::Nothing;
                    *overflowed = true;
                } else {
                    kept.push(chunk);
                }
            }
            TappedBody::Events(tap) => {
                let (surface, EventTap { reader, tally }) = (self.surface, &mut **tap);
                reader.push(chunk, |event| tally.read(surface, event));
            }
            TappedBody::Json { overflowed: true, .. } | TappedBody::Ignored => {}
        }
    }

    /// At the end of the body, whole or cut.
    pub fn finish(self) -> Tapped {
        match self.body {
            TappedBody::Json { overflowed: true, .. } | TappedBody::Ignored => Tapped::default(),
            TappedBody::Json { kept, overflowed: false } => {
                let body = kept.as_slice();
                let created = match self.creation {
                    Some(Creation::File) => crate::jobs::created_id(None, body),
                    Some(Creation::Job(kind @ recovea_core::channel::JobKind::BackgroundResponse)) => {
                        crate::jobs::background_pending(body)
                            .then(|| crate::jobs::created_id(Some(kind), body))
                            .flatten()
                    }
                    Some(Creation::Job(kind)) => crate::jobs::created_id(Some(kind), body),
                    None => None,
                };
                Tapped { created, ..read_json(self.surface, body) }
            }
            TappedBody::Events(tap) => {
                let EventTap { mut reader, mut tally } = *tap;
                let surface = self.surface;
                reader.finish(|event| tally.read(surface, event));
                tally.into_tapped()
            }
        }
    }
}

/// Estimates a request's input tokens when the provider reported none:
/// `ceil(chars / 4) + 1,000 per media part + 3`, where `chars` counts, inside `messages`, `system`,
/// `input`, `prompt`, `instructions`, `tools`, `functions` and Gemini's `contents` and
/// `systemInstruction` (or `system_instruction`), every string's and object key's
/// characters, and 4 per number (so a token-id array counts a token per id). An image, file or
/// audio part (`type` `image_url`, `input_image`, `image`, `document`, `input_file`, `file`,
/// `input_audio`) counts as 1,000 tokens whatever its size. A body that is not a JSON object: 0.
///
/// The request path has this from [`crate::request_body::read`], in the parse that reads
/// the request's other facts.
pub fn estimate_input_tokens(request_body: &[u8]) -> u64 {
    crate::request_body::read(request_body).input_tokens
}

/// Estimates output tokens from the characters seen: `ceil(chars / 4)`.
pub fn estimate_output_tokens(output_chars: u64) -> u64 {
    output_chars.div_ceil(CHARS_PER_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn tap(surface: Surface, event_stream: bool, body: &str) -> Tapped {
        let mut tap = UsageTap::new(surface, event_stream);
        tap.observe(&Bytes::copy_from_slice(body.as_bytes()));
        tap.finish()
    }

    #[test]
    fn gemini_usage_in_the_receipts_terms() {
        let body = r#"{"candidates":[{"content":{"parts":[{"text":"ab"}]}}],"usageMetadata":{"promptTokenCount":100,"cachedContentTokenCount":60,"candidatesTokenCount":7,"thoughtsTokenCount":20,"toolUsePromptTokenCount":5},"modelVersion":"gemini-2.5-pro"}"#;
        let tapped = tap(Surface::GenerateContent, false, body);
        assert_eq!(
            tapped.usage,
            Some(Usage {
                input_tokens: 105,
                cached_input_tokens: 60,
                output_tokens: 27,
                reasoning_tokens: 20,
                ..Usage::default()
            })
        );
        assert_eq!(tapped.model.as_deref(), Some("gemini-2.5-pro"));
        let without = tap(
            Surface::GenerateContent,
            false,
            r#"{"candidates":[{"content":{"parts":[{"text":"abc"}]}}]}"#,
        );
        assert_eq!((without.usage, without.output_chars), (None, 3));
        assert_eq!(tap(Surface::GenerateContent, false, "[{\"candidates\":"), Tapped::default());
    }

    #[test]
    fn an_openai_total_that_says_more_than_its_parts_is_believed() {
        // Gemini's OpenAI-compatible endpoint leaves thinking out of completion_tokens.
        for body in [
            r#"{"model":"gemini-2.5-flash","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":131}}"#,
            r#"{"model": "gemini-2.5-flash", "choices": [], "usage": {"total_tokens": 131, "prompt_tokens": 8, "completion_tokens": 3}}"#,
        ] {
            let usage = tap(Surface::ChatCompletions, false, body).usage.expect("usage");
            assert_eq!((usage.input_tokens, usage.output_tokens), (8, 123), "{body}");
        }
        let consistent =
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":3,"total_tokens":11}}"#;
        assert_eq!(tap(Surface::ChatCompletions, false, consistent).usage.map(|u| u.output_tokens), Some(3));
    }

    #[test]
    fn anthropic_stream_keeps_the_latest_value_of_each_field() {
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":7}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":12,\"output_tokens\":9}}\n\n";
        let usage = tap(Surface::Messages, true, stream).usage;
        assert_eq!(
            usage,
            Some(Usage { input_tokens: 17, cached_input_tokens: 5, output_tokens: 9, ..Usage::default() })
        );
    }

    #[test]
    fn json_over_the_cap_gives_no_usage() {
        let mut tap = UsageTap::new(Surface::ChatCompletions, false);
        let filler = vec![b' '; MAX_TAPPED_BYTES];
        tap.observe(&Bytes::from_static(b"{\"usage\":{\"prompt_tokens\":1}}"));
        tap.observe(&Bytes::from(filler));
        assert_eq!(tap.finish(), Tapped::default());
    }

    #[test]
    fn odd_types_do_not_lose_the_usage_beside_them() {
        let body = r#"{"model":{"not":"a string"},"choices":[{"message":{"content":["a","bc"]}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let tapped = tap(Surface::ChatCompletions, false, body);
        assert_eq!(tapped.model, None);
        assert_eq!(tapped.usage.map(|u| (u.input_tokens, u.output_tokens)), Some((3, 4)));
        let without_usage = body.replace(r#","usage":{"prompt_tokens":3,"completion_tokens":4}"#, "");
        assert_eq!(tap(Surface::ChatCompletions, false, &without_usage).output_chars, 3);
    }

    #[test]
    fn escaped_model_names_are_decoded() {
        let tapped = tap(Surface::Completions, false, r#"{"model":"gpt\u002d3","choices":[{"text":"é"}]}"#);
        assert_eq!(
            tapped,
            Tapped {
                usage: None,
                output_chars: 1,
                model: Some("gpt-3".into()),
                partial: false,
                created: None
            }
        );
    }

    #[test]
    fn other_surfaces_and_event_streams_of_embeddings_are_not_read() {
        assert_eq!(tap(Surface::Other, false, r#"{"usage":{"prompt_tokens":3}}"#), Tapped::default());
        assert_eq!(
            tap(Surface::Embeddings, true, "data: {\"usage\":{\"prompt_tokens\":3}}\n\n"),
            Tapped::default()
        );
    }

    #[test]
    fn input_estimate_counts_text_keys_numbers_and_media() {
        // "role"+"user"+"content"+"hello world" = 4+4+7+11 = 26 chars -> 7 tokens, + 3 overhead.
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hello world"}],"temperature":1}"#;
        assert_eq!(estimate_input_tokens(chat), 10);
        // One image part whatever its size, plus "role"+"user"+"content" = 15 chars -> 4 tokens.
        let image = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#;
        assert_eq!(estimate_input_tokens(image), 4 + 1_000 + 3);
        // Token ids: one token each.
        assert_eq!(estimate_input_tokens(br#"{"input":[[1,2,3],[4]]}"#), 4 + 3);
        assert_eq!(estimate_input_tokens(b"not json"), 0);
        assert_eq!(estimate_input_tokens(b"[1,2]"), 0);
    }

    #[test]
    fn usage_named_inside_text_is_text() {
        let stream = "data: {\"model\":\"gpt-x\",\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":99}\"}}],\"usage\":null}\n\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n";
        let tapped = tap(Surface::ChatCompletions, true, stream);
        assert_eq!(tapped.usage.map(|u| (u.input_tokens, u.output_tokens)), Some((3, 4)));
        assert_eq!(tapped.model.as_deref(), Some("gpt-x"));
        let cut = stream.split("data: {\"choices\":[],").next().expect("the chunks before the usage");
        assert_eq!(tap(Surface::ChatCompletions, true, cut).output_chars, 28 + 5);
    }

    #[test]
    fn output_estimate_rounds_up() {
        assert_eq!(estimate_output_tokens(0), 0);
        assert_eq!(estimate_output_tokens(1), 1);
        assert_eq!(estimate_output_tokens(8), 2);
        assert_eq!(estimate_output_tokens(9), 3);
    }
}
