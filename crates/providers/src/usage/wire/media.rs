//! OpenAI's media APIs: images made, speech and transcription, billed by tokens or by the second.

use recovea_core::usage::Usage;
use serde::Deserialize;

use super::{Count, Seconds, TextChars};
use crate::usage::lenient::StrOrNothing;

/// An Images API answer (`/v1/images/generations`, `/edits`, `/variations`), or one event of its
/// stream (`image_generation.completed`): the images made, and the token usage gpt-image models
/// report (DALL-E's answers carry none).
#[derive(Deserialize)]
pub(in crate::usage) struct ImagesAnswer<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: StrOrNothing<'a>,
    pub data: Option<Count>,
    pub usage: Option<TokensUsage>,
}

/// The usage of the Images API, of speech (`speech.audio.done`) and of token-billed transcription
/// (`"type": "tokens"`), or a duration (`"type": "duration"`, `seconds`).
#[derive(Deserialize)]
pub(in crate::usage) struct TokensUsage {
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
pub(in crate::usage) struct TranscriptionAnswer {
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
pub(in crate::usage) struct SpeechEvent {
    pub usage: Option<TokensUsage>,
}
