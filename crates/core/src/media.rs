//! What an images or audio request asks for that its answer may not say (image size, quality and
//! count, the characters spoken, the audio sent), and the usage billed from it when the answer
//! carries none.

use crate::pricing::{Price, PriceScope, PriceTable};
use crate::usage::Usage;

/// Audio bytes per second assumed for a file whose format does not say: 128 kbit/s, a common MP3
/// rate. A WAV file's own header says its rate.
pub const DEFAULT_AUDIO_BYTES_PER_SECOND: u64 = 16_000;

/// Audio tokens a token-priced voice (gpt-4o-mini-tts) speaks per input character, estimated:
/// OpenAI puts it at about $0.015 a minute ($12 per million audio tokens: 1,250 tokens) for about
/// 900 characters a minute of speech.
const SPOKEN_AUDIO_TOKENS_PER_CHAR: (u64, u64) = (3, 2);

/// Audio tokens per second of transcribed audio, estimated for a token-priced model with no price
/// per second (OpenAI's audio models read about ten a second).
const AUDIO_TOKENS_PER_SECOND: u64 = 10;

/// About four characters of text per token.
const CHARS_PER_TOKEN: u64 = 4;

/// Which media API a request called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MediaKind {
    /// Images generated or edited (`/v1/images/...`).
    #[default]
    Images,
    /// Text to speech (`/v1/audio/speech`).
    Speech,
    /// Transcription or translation (`/v1/audio/transcriptions`, `/v1/audio/translations`).
    Transcription,
}

/// What the request said, read from its JSON body or multipart form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MediaRequest {
    pub kind: MediaKind,
    /// The images' `size` (`1024x1792`), `quality` (`hd`, `high`) and number (`n`), as sent.
    pub size: Option<String>,
    pub quality: Option<String>,
    pub n: Option<u64>,
    /// The characters of the text to speak (`input`).
    pub characters: u64,
    /// The bytes of the audio file sent, and its bytes per second when its header says (WAV).
    pub audio_bytes: u64,
    pub audio_bytes_per_second: Option<u64>,
}

impl MediaRequest {
    /// The quality an image is billed at: the request's, else the model's default as OpenAI
    /// documents it (DALL-E 3: `standard`; gpt-image: `auto`, estimated as `high`, the dearest).
    /// DALL-E 2 has one quality, and none is named.
    pub fn image_quality(&self, model: &str) -> Option<&str> {
        let asked = self.quality.as_deref().filter(|q| !q.is_empty());
        if model.starts_with("dall-e-2") {
            return None;
        }
        match asked {
            Some("auto") | None if model.contains("gpt-image") => Some("high"),
            None if model.starts_with("dall-e-3") => Some("standard"),
            other => other,
        }
    }

    /// The size an image is billed at: the request's, else `1024x1024`, the default of every
    /// OpenAI image model (gpt-image's `auto` estimated so).
    pub fn image_size(&self) -> &str {
        match self.size.as_deref() {
            Some(size) if !size.is_empty() && size != "auto" => size,
            _ => "1024x1024",
        }
    }

    /// The images asked for (`n`, 1 by default).
    pub fn images(&self) -> u64 {
        self.n.unwrap_or(1)
    }

    /// The seconds of audio sent, estimated from the file's bytes: at its header's rate (WAV), else
    /// [`DEFAULT_AUDIO_BYTES_PER_SECOND`]; a second begun counts whole.
    pub fn audio_seconds(&self) -> u64 {
        let rate = self.audio_bytes_per_second.filter(|&r| r > 0).unwrap_or(DEFAULT_AUDIO_BYTES_PER_SECOND);
        self.audio_bytes.div_ceil(rate)
    }

    /// `price` (the model's, as its credential resolves it) with the price of one image of this
    /// request's quality and size when the table has one (`dall-e-3#hd-1024x1792`).
    pub fn price(
        &self,
        table: &PriceTable,
        model: Option<&str>,
        scope: &PriceScope,
        mut price: Price,
    ) -> Price {
        if let (MediaKind::Images, Some(model)) = (self.kind, model)
            && let Some(per_image) =
                table.image_price(model, self.image_quality(model), self.image_size(), scope)
        {
            price.per_image = Some(per_image);
        }
        price
    }

    /// The usage of a request whose answer reported none, and whether it is exact.
    ///
    /// - Text to speech priced per character (tts-1, tts-1-hd): the characters of `input`, exact:
    ///   that is what the provider bills. Priced per token (gpt-4o-mini-tts): input at four
    ///   characters a token, and [`SPOKEN_AUDIO_TOKENS_PER_CHAR`] audio tokens out, estimated.
    /// - Transcription: the seconds of the file ([`Self::audio_seconds`]); for a model with no
    ///   price per second, ten audio tokens a second in. Estimated.
    /// - Images: `n` images, estimated (an answer that came whole says how many it holds).
    pub fn unreported_usage(&self, price: &Price) -> (Usage, bool) {
        match self.kind {
            MediaKind::Speech if price.per_million_characters.is_some() => {
                (Usage { characters: self.characters, ..Usage::default() }, true)
            }
            MediaKind::Speech => {
                let (num, den) = SPOKEN_AUDIO_TOKENS_PER_CHAR;
                let audio = self.characters.saturating_mul(num).div_ceil(den);
                let usage = Usage {
                    input_tokens: self.characters.div_ceil(CHARS_PER_TOKEN),
                    output_tokens: audio,
                    audio_output_tokens: audio,
                    ..Usage::default()
                };
                (usage, false)
            }
            MediaKind::Transcription if price.per_million_seconds.is_some() => {
                (Usage { seconds: self.audio_seconds(), ..Usage::default() }, false)
            }
            MediaKind::Transcription => {
                let audio = self.audio_seconds().saturating_mul(AUDIO_TOKENS_PER_SECOND);
                (Usage { input_tokens: audio, audio_input_tokens: audio, ..Usage::default() }, false)
            }
            MediaKind::Images => (Usage { images: self.images(), ..Usage::default() }, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Nanos;

    #[test]
    fn image_defaults_follow_each_model() {
        let none = MediaRequest::default();
        assert_eq!((none.image_quality("dall-e-3"), none.image_size()), (Some("standard"), "1024x1024"));
        assert_eq!(none.image_quality("dall-e-2"), None);
        assert_eq!(none.image_quality("gpt-image-1"), Some("high"));
        let asked =
            MediaRequest { quality: Some("hd".into()), size: Some("1792x1024".into()), n: Some(3), ..none };
        assert_eq!(
            (asked.image_quality("dall-e-3"), asked.image_size(), asked.images()),
            (Some("hd"), "1792x1024", 3)
        );
        assert_eq!(asked.image_quality("dall-e-2"), None);
    }

    #[test]
    fn speech_is_exact_per_character_and_estimated_per_token() {
        let speech = MediaRequest { kind: MediaKind::Speech, characters: 4_000, ..MediaRequest::default() };
        let per_char = Price { per_million_characters: Some(Nanos(15_000_000_000)), ..Price::default() };
        assert_eq!(
            speech.unreported_usage(&per_char),
            (Usage { characters: 4_000, ..Usage::default() }, true)
        );
        let (usage, exact) = speech.unreported_usage(&Price::default());
        assert!(!exact);
        assert_eq!((usage.input_tokens, usage.audio_output_tokens), (1_000, 6_000));
    }

    #[test]
    fn audio_seconds_come_from_the_bytes() {
        let mp3 = MediaRequest {
            kind: MediaKind::Transcription,
            audio_bytes: 9_600_000,
            ..MediaRequest::default()
        };
        assert_eq!(mp3.audio_seconds(), 600);
        let wav = MediaRequest { audio_bytes: 32_001, audio_bytes_per_second: Some(32_000), ..mp3.clone() };
        assert_eq!(wav.audio_seconds(), 2);
        let per_second = Price { per_million_seconds: Some(Nanos(100_000_000_000)), ..Price::default() };
        assert_eq!(mp3.unreported_usage(&per_second), (Usage { seconds: 600, ..Usage::default() }, false));
        let (tokens, _) = mp3.unreported_usage(&Price::default());
        assert_eq!(tokens.audio_input_tokens, 6_000);
    }
}
