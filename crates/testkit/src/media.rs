//! OpenAI's images and audio APIs: `images/generations` and `images/edits` (gpt-image models
//! answer with token usage, DALL-E's with none), `audio/speech` (raw audio, or events ending in
//! `speech.audio.done` with usage when `stream_format` is `sse`), and `audio/transcriptions` and
//! `audio/translations` (a multipart form: whisper-1 answers its `usage` in seconds, or a verbose
//! answer's `duration`; the gpt-4o transcribe models in tokens).
//!
//! The figures the mock reports: an image's usage is [`GPT_IMAGE_OUTPUT_TOKENS`] out and the
//! prompt's words in; speech is one input token per word and [`SPEECH_AUDIO_TOKENS_PER_WORD`]
//! audio tokens out per word; a transcription lasts one second per [`AUDIO_BYTES_PER_SECOND`]
//! bytes of its file (at least one) and reads ten audio tokens a second. A scripted `usage`
//! replaces any of them verbatim.

use bytes::Bytes;
use serde::Deserialize;

use crate::multipart;
use crate::request::{Answer, json_string};
use crate::sse;

/// Output tokens of one gpt-image answer: a 1024x1024 image at `high` quality.
pub const GPT_IMAGE_OUTPUT_TOKENS: u64 = 4_160;
/// Audio tokens of spoken output per input word.
pub const SPEECH_AUDIO_TOKENS_PER_WORD: u64 = 5;
/// The bytes of a transcribed file per second of its audio (128 kbit/s).
pub const AUDIO_BYTES_PER_SECOND: u64 = 16_000;
/// What a speech answer's audio bytes are, whatever the request asked.
const AUDIO: &[u8] = b"ID3\x04\0\0\0\0\0\0mock-audio";
/// The text of every transcription.
const TRANSCRIPT: &str = "This is a mock transcript.";

/// The JSON fields of an images or speech request that shape the answer.
#[derive(Deserialize, Default)]
#[serde(default)]
struct MediaFields {
    model: Option<String>,
    prompt: Option<String>,
    input: Option<String>,
    n: Option<u64>,
    stream_format: Option<String>,
}

/// What the request sent, from its JSON body or its multipart form.
struct MediaRequest {
    fields: MediaFields,
    file_bytes: u64,
    response_format: Option<String>,
}

fn read(content_type: Option<&str>, body: &[u8]) -> MediaRequest {
    if let Some(boundary) = content_type.and_then(multipart::boundary) {
        let mut read = MediaRequest { fields: MediaFields::default(), file_bytes: 0, response_format: None };
        for part in multipart::parse(body, &boundary).unwrap_or_default() {
            let text = || String::from_utf8_lossy(part.data).trim().to_owned();
            match part.name.as_str() {
                "model" => read.fields.model = Some(text()),
                "prompt" => read.fields.prompt = Some(text()),
                "n" => read.fields.n = text().parse().ok(),
                "response_format" => read.response_format = Some(text()),
                "file" | "image" | "image[]" => read.file_bytes += part.data.len() as u64,
                _ => {}
            }
        }
        return read;
    }
    let fields = serde_json::from_slice(body).unwrap_or_default();
    MediaRequest { fields, file_bytes: 0, response_format: None }
}

fn words(text: Option<&str>) -> u64 {
    text.map_or(0, |t| t.split_whitespace().count() as u64)
}

/// `POST /v1/images/generations` and `/v1/images/edits`.
pub(crate) fn images(
    n: u64,
    created: u64,
    content_type: Option<&str>,
    body: &[u8],
    usage: Option<&str>,
) -> Answer {
    let request = read(content_type, body);
    let model = request.fields.model.as_deref().unwrap_or("dall-e-2");
    let count = request.fields.n.unwrap_or(1).clamp(1, 10);
    let data: Vec<String> = (0..count)
        .map(|i| {
            if model.starts_with("dall-e") {
                format!(
                    r#"{{"revised_prompt":"A mock image.","url":"https://mock.invalid/img-{n}-{i}.png"}}"#
                )
            } else {
                r#"{"b64_json":"iVBORw0KGgo="}"#.to_owned()
            }
        })
        .collect();
    let data = data.join(",");
    if model.starts_with("dall-e") {
        return Answer::ok(format!(r#"{{"created":{created},"data":[{data}]}}"#));
    }
    let input = words(request.fields.prompt.as_deref()) + 1;
    let usage = usage.map_or_else(
        || {
            let output = GPT_IMAGE_OUTPUT_TOKENS * count;
            format!(
                concat!(
                    r#"{{"input_tokens":{},"input_tokens_details":{{"text_tokens":{},"image_tokens":0}},"#,
                    r#""output_tokens":{},"total_tokens":{}}}"#
                ),
                input,
                input,
                output,
                input + output
            )
        },
        str::to_owned,
    );
    Answer::ok(format!(
        r#"{{"created":{created},"background":"opaque","data":[{data}],"output_format":"png","usage":{usage}}}"#
    ))
}

/// `POST /v1/audio/speech`.
pub(crate) fn speech(body: &[u8], usage: Option<&str>) -> Answer {
    let request = read(Some("application/json"), body);
    if request.fields.stream_format.as_deref() != Some("sse") {
        return Answer::Raw("audio/mpeg", Bytes::from_static(AUDIO));
    }
    let input = words(request.fields.input.as_deref());
    let usage = usage.map_or_else(
        || {
            let output = input * SPEECH_AUDIO_TOKENS_PER_WORD;
            format!(
                r#"{{"input_tokens":{input},"output_tokens":{output},"total_tokens":{}}}"#,
                input + output
            )
        },
        str::to_owned,
    );
    Answer::Events(vec![
        sse::data(r#"{"type":"speech.audio.delta","audio":"SUQzBAAAAAAA"}"#),
        sse::data(&format!(r#"{{"type":"speech.audio.done","usage":{usage}}}"#)),
    ])
}

/// `POST /v1/audio/transcriptions` and `/v1/audio/translations`.
pub(crate) fn transcription(content_type: Option<&str>, body: &[u8], usage: Option<&str>) -> Answer {
    let request = read(content_type, body);
    let model = request.fields.model.as_deref().unwrap_or("whisper-1");
    let seconds = request.file_bytes.div_ceil(AUDIO_BYTES_PER_SECOND).max(1);
    let text = json_string(TRANSCRIPT);
    match request.response_format.as_deref() {
        Some("text" | "srt" | "vtt") => {
            return Answer::Raw("text/plain; charset=utf-8", Bytes::from(TRANSCRIPT));
        }
        Some("verbose_json") if usage.is_none() => {
            return Answer::ok(format!(
                r#"{{"task":"transcribe","language":"english","duration":{seconds}.0,"text":{text},"segments":[]}}"#
            ));
        }
        _ => {}
    }
    let usage = usage.map_or_else(
        || {
            if model == "whisper-1" {
                format!(r#"{{"type":"duration","seconds":{seconds}}}"#)
            } else {
                let audio = seconds * 10;
                let output = words(Some(TRANSCRIPT));
                format!(
                    concat!(
                        r#"{{"type":"tokens","input_tokens":{},"input_token_details":{{"text_tokens":0,"audio_tokens":{}}},"#,
                        r#""output_tokens":{},"total_tokens":{}}}"#
                    ),
                    audio,
                    audio,
                    output,
                    audio + output
                )
            }
        },
        str::to_owned,
    );
    Answer::ok(format!(r#"{{"text":{text},"usage":{usage}}}"#))
}
