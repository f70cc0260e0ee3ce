//! A stream's usage, read event by event as the events go by: what each API's events report, and
//! the OpenAI chunks kept unread until they are known to matter.

use std::sync::LazyLock;

use memchr::memmem;
use recovea_core::usage::Usage;

use super::answer::{note_gemini_searches, owned_model, read_completion};
use super::lenient::StrOrNothing;
use super::wire::{
    AnthropicEvent, AnthropicUsage, GeminiResponse, ImagesAnswer, OutputChars, ResponsesEvent, SpeechEvent,
    TranscriptionAnswer,
};
use super::{Surface, Tapped, estimate_output_tokens};
use crate::sse::SseEvent;

/// The most text of stream chunks kept unread (see [`Tally::unread`]); beyond it they are read
/// at once, so that a long stream costs no more memory than this. Every open stream holds up to
/// this much (a node holds ten thousand at once): 64 KiB took a 20 s stream to 116 KiB of RSS.
const MAX_UNREAD_BYTES: usize = 16 << 10;

/// What the events of a stream have told so far.
#[derive(Debug, Default)]
pub(super) struct Tally {
    usage: Option<Usage>,
    /// Anthropic reports usage in `message_start` and again, final, in `message_delta`.
    anthropic: Option<AnthropicUsage>,
    anthropic_final: bool,
    /// A Gemini stream reports usage in every event; only the last event, the one with a
    /// `finishReason`, has the whole output count.
    gemini_reported: bool,
    gemini_final: bool,
    output_chars: u64,
    model: Option<String>,
    /// The distinct web searches a Gemini stream's events named.
    gemini_searches: Vec<String>,
    /// OpenAI chunks not read yet. Once the model is known, a chunk that cannot carry usage adds
    /// only characters, which count only if the stream ends without usage; reading a chunk costs
    /// more than keeping it, and a stream the gateway asked usage for reports it.
    unread: Unread,
}

/// Chunk texts one after another, and where each ends.
#[derive(Debug, Default)]
struct Unread {
    text: String,
    ends: Vec<usize>,
}

/// Whether a stream chunk may carry usage: false only when every `"usage"` key in it is followed
/// by `null` (or there is none) and it holds no `\u` escape (a key can be spelled with those).
pub(crate) fn may_carry_usage(chunk: &[u8]) -> bool {
    may_have_usage(chunk) || memchr::memchr_iter(b'\\', chunk).any(|at| chunk.get(at + 1) == Some(&b'u'))
}

/// False only when every `"usage"` in the bytes is followed by `: null` (or there is none).
fn may_have_usage(chunk: &[u8]) -> bool {
    static KEY: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
    let mut rest = chunk;
    while let Some(at) = KEY.find(rest) {
        let after = rest[at + KEY.needle().len()..].trim_ascii_start();
        let value = after.strip_prefix(b":").map_or(after, <[u8]>::trim_ascii_start);
        if !value.starts_with(b"null") {
            return true;
        }
        rest = &rest[at + 1..];
    }
    false
}

impl Tally {
    pub(super) fn read(&mut self, surface: Surface, event: &SseEvent<'_>) {
        match surface {
            Surface::ChatCompletions | Surface::Completions => self.read_openai_chunk(event.data),
            Surface::Responses => self.read_responses_event(event),
            Surface::Messages => self.read_anthropic_event(event),
            Surface::GenerateContent => self.read_gemini_event(event.data),
            Surface::Images => self.read_images_event(event.data),
            Surface::Speech => self.read_speech_event(event.data),
            Surface::Transcription => self.read_transcription_event(event.data),
            Surface::Embeddings | Surface::Other => {}
        }
    }

    /// A gpt-image stream: each `...completed` event (one per image) reports that image's usage.
    fn read_images_event(&mut self, data: &str) {
        let Ok(event) = serde_json::from_str::<ImagesAnswer>(data) else { return };
        if let (true, Some(usage)) = (event.kind.as_str().ends_with(".completed"), &event.usage) {
            let usage = usage.to_image_usage();
            self.usage = Some(self.usage.map_or(usage, |sum| sum.saturating_add(usage)));
        }
    }

    /// A speech stream: `speech.audio.done` reports the usage.
    fn read_speech_event(&mut self, data: &str) {
        if !may_have_usage(data.as_bytes()) {
            return;
        }
        if let Ok(SpeechEvent { usage: Some(usage) }) = serde_json::from_str(data) {
            self.usage = Some(usage.to_speech_usage());
        }
    }

    /// A transcription stream: `transcript.text.done` reports the usage.
    fn read_transcription_event(&mut self, data: &str) {
        if !may_have_usage(data.as_bytes()) {
            return;
        }
        if let Ok(answer) = serde_json::from_str::<TranscriptionAnswer>(data)
            && let Some(usage) = answer.to_usage()
        {
            self.usage = Some(usage);
        }
    }

    /// Every chunk carries text, so every chunk is parsed, into borrowing types that skip what is
    /// not counted; the usage chunk is the one whose `usage` is not null.
    fn read_openai_chunk(&mut self, data: &str) {
        if data.trim_ascii() == "[DONE]" {
            return;
        }
        if self.model.is_some() && !may_carry_usage(data.as_bytes()) {
            // Read before the text would pass the bound, not after: past it the buffer would grow
            // to twice the bound, and keep that capacity for the rest of the stream.
            if self.unread.text.len() + data.len() > MAX_UNREAD_BYTES {
                self.read_unread();
            }
            self.unread.text.push_str(data);
            self.unread.ends.push(self.unread.text.len());
            return;
        }
        let Some(chunk) = read_completion(data) else { return };
        self.output_chars = self.output_chars.saturating_add(chunk.output_chars);
        self.note_model(&chunk.model);
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
    }

    /// Only the events that carry text, the model or usage are parsed; the event line names them,
    /// and a stream without event lines is read by the `type` inside.
    fn read_responses_event(&mut self, event: &SseEvent<'_>) {
        if event.event.is_some_and(|name| !is_read_responses_event(name)) {
            return;
        }
        let Ok(parsed) = serde_json::from_str::<ResponsesEvent>(event.data) else { return };
        let kind = match parsed.kind.as_str() {
            "" => event.event.unwrap_or(""),
            kind => kind,
        };
        match kind {
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta" => {
                let chars = parsed.delta.map_or(0, |d| d.0);
                self.output_chars = self.output_chars.saturating_add(chars);
            }
            "response.created" | "response.in_progress" => {
                if let Some(response) = parsed.response {
                    self.note_model(&response.model);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(response) = parsed.response {
                    self.note_model(&response.model);
                    if let Some(usage) = response.to_usage() {
                        self.usage = Some(usage);
                    }
                }
            }
            _ => {}
        }
    }

    fn read_anthropic_event(&mut self, event: &SseEvent<'_>) {
        if event
            .event
            .is_some_and(|name| !matches!(name, "message_start" | "message_delta" | "content_block_delta"))
        {
            return;
        }
        let Ok(parsed) = serde_json::from_str::<AnthropicEvent>(event.data) else { return };
        let kind = match parsed.kind.as_str() {
            "" => event.event.unwrap_or(""),
            kind => kind,
        };
        match kind {
            "message_start" => {
                if let Some(message) = parsed.message {
                    self.note_model(&message.model);
                    if let Some(usage) = message.usage {
                        self.anthropic = Some(self.anthropic.unwrap_or_default().updated_by(usage));
                    }
                }
            }
            "message_delta" => {
                if let Some(usage) = parsed.usage {
                    self.anthropic = Some(self.anthropic.unwrap_or_default().updated_by(usage));
                    self.anthropic_final = true;
                }
            }
            "content_block_delta" => {
                let chars = parsed.delta.map_or(0, |d| d.output_chars());
                self.output_chars = self.output_chars.saturating_add(chars);
            }
            _ => {}
        }
    }

    /// Every event of an `alt=sse` stream is a whole `GenerateContentResponse`; each report of usage
    /// is cumulative, so the last one wins.
    fn read_gemini_event(&mut self, data: &str) {
        let Ok(response) = serde_json::from_str::<GeminiResponse>(data) else { return };
        let chars = response.candidates.map_or(0, |c| c.total);
        self.output_chars = self.output_chars.saturating_add(chars);
        self.note_model(&response.model);
        self.gemini_final |= names_finish_reason(data.as_bytes());
        note_gemini_searches(data.as_bytes(), &mut self.gemini_searches);
        if let Some(usage) = response.usage {
            self.usage = Some(usage.to_usage());
            self.gemini_reported = true;
        }
        if let Some(usage) = &mut self.usage {
            usage.web_search_calls = self.gemini_searches.len() as u64;
        }
    }

    /// Counts the characters of the chunks kept unread (the only thing they can tell).
    fn read_unread(&mut self) {
        let mut start = 0;
        for &end in &self.unread.ends {
            if let Some(chunk) = read_completion(&self.unread.text[start..end]) {
                self.output_chars = self.output_chars.saturating_add(chunk.output_chars);
            }
            start = end;
        }
        self.unread.text.clear();
        self.unread.ends.clear();
    }

    fn note_model(&mut self, model: &StrOrNothing<'_>) {
        if self.model.is_none() {
            self.model = owned_model(model);
        }
    }

    pub(super) fn into_tapped(mut self) -> Tapped {
        let anthropic = self.anthropic.map(|reported| {
            let mut usage = reported.to_usage();
            if !self.anthropic_final {
                // Cut before `message_delta`: the input counts of `message_start` are exact, but
                // its output count is a placeholder (1 or so); the text seen says more.
                usage.output_tokens = usage.output_tokens.max(estimate_output_tokens(self.output_chars));
            }
            usage
        });
        let gemini_cut = self.gemini_reported && !self.gemini_final;
        if gemini_cut && let Some(usage) = &mut self.usage {
            // Cut before the last event: its prompt count is exact, its output count is of the
            // events before, if any; the text seen says more.
            usage.output_tokens = usage.output_tokens.max(estimate_output_tokens(self.output_chars));
        }
        let partial = (self.anthropic.is_some() && !self.anthropic_final) || gemini_cut;
        let usage = anthropic.or(self.usage);
        if usage.is_none() {
            self.read_unread();
        }
        Tapped {
            usage,
            output_chars: if usage.is_some() { 0 } else { self.output_chars },
            model: self.model,
            partial,
            created: None,
        }
    }
}

/// Whether a Gemini event has a `"finishReason"` member: the last event of a stream does. Inside a
/// JSON string a quote is escaped, so the quoted name followed by a colon is only ever a key.
fn names_finish_reason(data: &[u8]) -> bool {
    static KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"finishReason\""));
    KEY.find_iter(data).any(|at| data[at + KEY.needle().len()..].trim_ascii_start().starts_with(b":"))
}

fn is_read_responses_event(name: &str) -> bool {
    matches!(
        name,
        "response.output_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta"
            | "response.created"
            | "response.in_progress"
            | "response.completed"
            | "response.incomplete"
            | "response.failed"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Surface;
    use crate::usage::tests::tap;

    /// A chunk kept unread tells only characters; they are read when no usage came, whatever the
    /// number and size of the chunks, and a usage spelled with escapes is still found.
    #[test]
    fn chunks_kept_unread_count_when_no_usage_comes() {
        let chunk =
            |text: &str| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
        let first = "data: {\"model\":\"gpt-x\",\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\n";
        let long = "x".repeat(MAX_UNREAD_BYTES / 3);
        for texts in [vec!["cd", "e"], vec![long.as_str(), long.as_str(), long.as_str(), long.as_str(), "y"]]
        {
            let stream: String =
                std::iter::once(first.to_owned()).chain(texts.iter().map(|t| chunk(t))).collect();
            let tapped = tap(Surface::ChatCompletions, true, &stream);
            let chars = 2 + texts.iter().map(|t| t.len() as u64).sum::<u64>();
            assert_eq!(
                (tapped.usage, tapped.output_chars, tapped.model.as_deref()),
                (None, chars, Some("gpt-x"))
            );
            let usage =
                "data: {\"choices\":[],\"us\\u0061ge\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
            let tapped = tap(Surface::ChatCompletions, true, &format!("{stream}{usage}"));
            assert_eq!((tapped.usage.map(|u| u.output_tokens), tapped.output_chars), (Some(4), 0));
        }
    }

    /// The look for a non-null `"usage"` as it was, byte by byte.
    fn reference_may_have_usage(event: &[u8]) -> bool {
        const KEY: &[u8] = b"\"usage\"";
        let mut rest = event;
        while let Some(quote) = rest.iter().position(|&b| b == b'"') {
            rest = &rest[quote..];
            if let Some(after) = rest.strip_prefix(KEY) {
                let after = after.trim_ascii_start();
                let value = after.strip_prefix(b":").map_or(after, <[u8]>::trim_ascii_start);
                if !value.starts_with(b"null") {
                    return true;
                }
            }
            rest = &rest[1..];
        }
        false
    }

    proptest::proptest! {
        #[test]
        fn the_usage_look_finds_what_it_found_byte_by_byte(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "\"usage\"", "\"usage", "usage\"", ":", " ", "null", "nul", "{", "}", "\"", "g", "xyzxyzxyz", "é",
                ]),
                0..32,
            ),
        ) {
            let event = pieces.concat();
            proptest::prop_assert_eq!(may_have_usage(event.as_bytes()), reference_may_have_usage(event.as_bytes()));
        }
    }
}
