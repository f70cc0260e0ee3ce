//! Token usage read from a provider's answer as it passes, and estimated when it carries none.

pub(crate) mod input;
mod lenient;
mod quick;
mod wire;

use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem;
use recovea_core::snapshot::ProviderKind;
use recovea_core::usage::Usage;

use crate::sse::{SseEvent, SseReader};
use lenient::StrOrNothing;
use quick::CompletionRead;
use wire::{
    AnthropicEvent, AnthropicMessage, AnthropicUsage, GeminiGrounding, GeminiResponse, ImagesAnswer,
    OpenAiCompletion, OpenAiEmbeddings, OutputChars, Response, ResponsesEvent, SpeechEvent,
    TranscriptionAnswer,
};

/// The most of an answer the tap keeps: a JSON body it parses at the end, or one stream event.
/// Beyond it the usage is given up (`None`) rather than memory grown without bound.
pub const MAX_TAPPED_BYTES: usize = 16 << 20;

/// The most text of stream chunks kept unread (see [`Tally::unread`]); beyond it they are read
/// at once, so that a long stream costs no more memory than this. Every open stream holds up to
/// this much (a node holds ten thousand at once): 64 KiB took a 20 s stream to 116 KiB of RSS.
const MAX_UNREAD_BYTES: usize = 16 << 10;

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

/// Which API answered, and so which usage shape to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    ChatCompletions,
    Completions,
    Responses,
    Embeddings,
    Messages,
    /// Gemini's `models/{model}:generateContent` and `:streamGenerateContent` (a JSON array, or
    /// events with `alt=sse`).
    GenerateContent,
    /// The Images API (`images/generations`, `images/edits`, `images/variations`): gpt-image
    /// models' token usage, or the images an answer holds (DALL-E's carry no usage).
    Images,
    /// Text to speech (`audio/speech`): raw audio, whose usage is the request's (its characters);
    /// a stream (`stream_format: "sse"`) reports tokens in `speech.audio.done`.
    Speech,
    /// Transcription and translation (`audio/transcriptions`, `audio/translations`): `usage` in
    /// seconds or tokens, or a verbose answer's `duration`.
    Transcription,
    /// Anything else (models, files, `messages/count_tokens`, batches): not tapped.
    Other,
}

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

/// What the events of a stream have told so far.
#[derive(Debug, Default)]
struct Tally {
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

impl Surface {
    /// The surface of an upstream path (a query is ignored).
    pub fn of(kind: ProviderKind, upstream_path: &str) -> Surface {
        // The path alone decides: the answer's shape follows the API called, not the vendor, and
        // each kind's compatible endpoints answer in that API's shape (Anthropic's
        // `/v1/chat/completions` answers like OpenAI; third parties serve `/v1/messages` too).
        let _ = kind;
        let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
        if let Some(method) = gemini_method(path) {
            return match method {
                "generateContent" | "streamGenerateContent" => Surface::GenerateContent,
                _ => Surface::Other,
            };
        }
        // Azure's and Gemini's OpenAI-compatible paths answer in OpenAI's shapes.
        let api = if let Some(rest) = path.strip_prefix("/openai/deployments/") {
            rest.split_once('/').map_or("", |(_deployment, api)| api)
        } else {
            ["/openai/v1/", "/v1beta/openai/", "/openai/", "/v1/"]
                .iter()
                .find_map(|root| path.strip_prefix(root))
                .unwrap_or("")
        };
        match api {
            "chat/completions" => Surface::ChatCompletions,
            "completions" => Surface::Completions,
            "responses" => Surface::Responses,
            "embeddings" => Surface::Embeddings,
            "messages" if path == "/v1/messages" => Surface::Messages,
            "images/generations" | "images/edits" | "images/variations" => Surface::Images,
            "audio/speech" => Surface::Speech,
            "audio/transcriptions" | "audio/translations" => Surface::Transcription,
            _ => Surface::Other,
        }
    }
}

/// Gemini's `models/{model}:{method}` under `/v1beta/` or `/v1/`: the method.
fn gemini_method(path: &str) -> Option<&str> {
    gemini_call(path).map(|(_, method)| method)
}

/// Gemini's `/v1beta/models/{model}:{method}` (or `/v1/`, or `tunedModels/`), one of its methods:
/// the model and method. (An OpenAI fine-tuned model's id, `ft:...`, is none.)
fn gemini_call(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1beta/").or_else(|| path.strip_prefix("/v1/"))?;
    let rest = rest.strip_prefix("models/").or_else(|| rest.strip_prefix("tunedModels/"))?;
    let (model, method) = rest.rsplit_once(':')?;
    let known = recovea_core::answer::GEMINI_MODEL_METHODS.contains(&method);
    (known && !model.is_empty() && !model.contains(['/', ':'])).then_some((model, method))
}

/// The model a request names in its path rather than its body (Gemini's `models/{model}:...`).
pub fn model_in_path(upstream_path: &str) -> Option<&str> {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    gemini_call(path).map(|(model, _)| model)
}

/// Whether the path asks for a stream whatever the body says (Gemini's `:streamGenerateContent`).
pub fn streams_by_path(upstream_path: &str) -> bool {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    gemini_method(path) == Some("streamGenerateContent")
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
fn note_gemini_searches(body: &[u8], queries: &mut Vec<String>) {
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

/// An OpenAI completion or chunk: the quick walk where it can tell, serde otherwise; `None` when
/// it does not parse.
fn read_completion(text: &str) -> Option<CompletionRead<'_>> {
    quick::completion(text).or_else(|| serde_json::from_str(text).ok().map(OpenAiCompletion::into_read))
}

fn owned_model(model: &StrOrNothing<'_>) -> Option<String> {
    Some(model.as_str()).filter(|m| !m.is_empty()).map(str::to_owned)
}

impl Tally {
    fn read(&mut self, surface: Surface, event: &SseEvent<'_>) {
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

    fn into_tapped(mut self) -> Tapped {
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

/// Estimates a request's input tokens when the provider reported none:
/// `ceil(chars / 4) + 1,000 per media part + 3`, where `chars` counts, inside `messages`, `system`,
/// `input`, `prompt`, `instructions`, `tools`, `functions` and Gemini's `contents` and
/// `systemInstruction` (or `system_instruction`), every string's and object key's
/// characters, and 4 per number (so a token-id array counts a token per id). An image, file or
/// audio part (`type` `image_url`, `input_image`, `image`, `document`, `input_file`, `file`,
/// `input_audio`) counts as 1,000 tokens whatever its size. A body that is not a JSON object: 0.
///
/// The request path has this from [`crate::rewrite::inspect_and_estimate`], in the parse that reads
/// the request's other facts.
pub fn estimate_input_tokens(request_body: &[u8]) -> u64 {
    crate::rewrite::inspect_and_estimate(request_body).input_tokens
}

/// Estimates output tokens from the characters seen: `ceil(chars / 4)`.
pub fn estimate_output_tokens(output_chars: u64) -> u64 {
    output_chars.div_ceil(CHARS_PER_TOKEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(surface: Surface, event_stream: bool, body: &str) -> Tapped {
        let mut tap = UsageTap::new(surface, event_stream);
        tap.observe(&Bytes::copy_from_slice(body.as_bytes()));
        tap.finish()
    }

    #[test]
    fn surfaces_follow_the_path() {
        use ProviderKind::{Anthropic, OpenAi};
        assert_eq!(Surface::of(OpenAi, "/v1/chat/completions"), Surface::ChatCompletions);
        assert_eq!(Surface::of(OpenAi, "/v1/chat/completions?x=1"), Surface::ChatCompletions);
        assert_eq!(Surface::of(OpenAi, "/v1/completions"), Surface::Completions);
        assert_eq!(Surface::of(OpenAi, "/v1/responses"), Surface::Responses);
        assert_eq!(Surface::of(OpenAi, "/v1/embeddings"), Surface::Embeddings);
        assert_eq!(Surface::of(Anthropic, "/v1/messages"), Surface::Messages);
        assert_eq!(Surface::of(Anthropic, "/v1/messages?beta=true"), Surface::Messages);
        assert_eq!(Surface::of(Anthropic, "/v1/chat/completions"), Surface::ChatCompletions);
        for other in
            ["/v1/messages/count_tokens", "/v1/messages/batches", "/v1/models", "/v1/responses/resp_1", ""]
        {
            assert_eq!(Surface::of(Anthropic, other), Surface::Other, "{other}");
            assert_eq!(Surface::of(OpenAi, other), Surface::Other, "{other}");
        }
    }

    #[test]
    fn azure_and_gemini_paths_have_openai_and_gemini_surfaces() {
        use ProviderKind::{AzureOpenAi, Gemini};
        for (path, surface) in [
            ("/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21", Surface::ChatCompletions),
            ("/openai/deployments/my-gpt/completions", Surface::Completions),
            ("/openai/deployments/emb/embeddings?api-version=1", Surface::Embeddings),
            ("/openai/v1/chat/completions", Surface::ChatCompletions),
            ("/openai/v1/responses", Surface::Responses),
            ("/openai/responses?api-version=2025-04-01-preview", Surface::Responses),
            ("/openai/deployments/my-gpt/chat/completions/extra", Surface::Other),
            ("/openai/v1/messages", Surface::Other),
        ] {
            assert_eq!(Surface::of(AzureOpenAi, path), surface, "{path}");
        }
        for (path, surface) in [
            ("/v1beta/openai/chat/completions", Surface::ChatCompletions),
            ("/v1beta/openai/embeddings", Surface::Embeddings),
            ("/v1beta/models/gemini-2.5-flash:generateContent", Surface::GenerateContent),
            ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", Surface::GenerateContent),
            ("/v1/models/gemini-2.5-flash:generateContent", Surface::GenerateContent),
            ("/v1beta/models/gemini-2.5-flash:countTokens", Surface::Other),
            ("/v1beta/models/gemini-2.5-flash:embedContent", Surface::Other),
            ("/v1beta/models", Surface::Other),
        ] {
            assert_eq!(Surface::of(Gemini, path), surface, "{path}");
        }
    }

    #[test]
    fn gemini_names_its_model_in_the_path() {
        assert_eq!(model_in_path("/v1beta/models/gemini-2.5-pro:generateContent"), Some("gemini-2.5-pro"));
        assert_eq!(
            model_in_path("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"),
            Some("gemini-2.5-pro")
        );
        assert_eq!(model_in_path("/v1beta/tunedModels/mine:generateContent"), Some("mine"));
        assert_eq!(model_in_path("/v1/models/ft:gpt-4o-mini:acme::abc"), None);
        assert!(streams_by_path("/v1beta/models/m:streamGenerateContent?alt=sse"));
        assert!(!streams_by_path("/v1beta/models/m:generateContent"));
        for path in [
            "/v1/chat/completions",
            "/v1beta/models/:generateContent",
            "/v1beta/models/a/b:x",
            "/v1/models/gpt-4o",
        ] {
            assert_eq!(model_in_path(path), None, "{path}");
        }
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

    #[test]
    fn output_estimate_rounds_up() {
        assert_eq!(estimate_output_tokens(0), 0);
        assert_eq!(estimate_output_tokens(1), 1);
        assert_eq!(estimate_output_tokens(8), 2);
        assert_eq!(estimate_output_tokens(9), 3);
    }
}
