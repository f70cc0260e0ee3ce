//! The facts of an images or audio request its answer may not carry, read from its JSON body or
//! its multipart form: the model a form names, image size, quality and count, the characters to
//! speak, and the audio file's size. Read only on those paths, so a chat request pays nothing.

use recovea_core::media::{MediaKind, MediaRequest};
use serde::Deserialize;
use serde_json::Value;

use crate::multipart;
use crate::usage::Surface;

/// What [`read`] finds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadMedia {
    pub request: MediaRequest,
    /// The model a multipart form names (a JSON body's is read with its other facts), or the one
    /// the Images API runs when none is named (a JSON body's own name, when it has one, wins).
    pub model: Option<String>,
}

/// The JSON members read; the rest is skipped.
#[derive(Deserialize, Default)]
struct MediaJson {
    #[serde(default)]
    size: Value,
    #[serde(default)]
    quality: Value,
    #[serde(default)]
    n: Value,
    #[serde(default)]
    input: Value,
}

/// The media facts of a request to `surface` (`None`, at once, for any other surface), from its
/// body, JSON or a `multipart/form-data` form as its content type says (asked only on those
/// paths). A body that reads as neither gives the defaults: the request is still billed by what
/// its answer says, or at its defaults.
pub fn read<'h>(
    surface: Surface,
    content_type: impl FnOnce() -> Option<&'h str>,
    body: &[u8],
) -> Option<ReadMedia> {
    let kind = match surface {
        Surface::Images => MediaKind::Images,
        Surface::Speech => MediaKind::Speech,
        Surface::Transcription => MediaKind::Transcription,
        _ => return None,
    };
    let mut read = ReadMedia { request: MediaRequest { kind, ..MediaRequest::default() }, model: None };
    if let Some(boundary) = content_type().and_then(multipart::boundary) {
        read_form(&mut read, body, boundary);
    } else if let Ok(json) = crate::from_json::<MediaJson>(body) {
        let text = |value: Value| match value {
            Value::String(text) => Some(text),
            _ => None,
        };
        let request = &mut read.request;
        request.n = json.n.as_u64();
        request.size = text(json.size);
        request.quality = text(json.quality);
        if kind == MediaKind::Speech {
            request.characters = text(json.input).map_or(0, |input| input.chars().count() as u64);
        }
    }
    if kind == MediaKind::Images && read.model.is_none() {
        // The Images API runs DALL-E 2 for a request that names no model, as OpenAI documents.
        read.model = Some(DEFAULT_IMAGE_MODEL.to_owned());
    }
    Some(read)
}

/// The model the Images API runs when the request names none.
const DEFAULT_IMAGE_MODEL: &str = "dall-e-2";

/// A form's fields (`model`, `size`, `quality`, `n`) and its audio `file`.
fn read_form(read: &mut ReadMedia, body: &[u8], boundary: &str) {
    let Some(parts) = multipart::parts(body, boundary) else { return };
    let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(|t| t.trim().to_owned());
    for part in parts {
        match part.name {
            Some("model") => read.model = text(part.body).filter(|m| !m.is_empty()),
            Some("size") => read.request.size = text(part.body),
            Some("quality") => read.request.quality = text(part.body),
            Some("n") => read.request.n = text(part.body).and_then(|n| n.parse().ok()),
            Some("file") if read.request.kind == MediaKind::Transcription => {
                read.request.audio_bytes = part.body.len() as u64;
                read.request.audio_bytes_per_second = wav_bytes_per_second(part.body);
            }
            _ => {}
        }
    }
}

/// A WAV file's byte rate, from its `fmt ` chunk (RIFF: `RIFF`, size, `WAVE`, then `fmt `, its
/// size, format, channels, sample rate, and the byte rate at offset 28).
fn wav_bytes_per_second(file: &[u8]) -> Option<u64> {
    let header = file.get(..32)?;
    if &header[..4] != b"RIFF" || &header[8..12] != b"WAVE" || &header[12..16] != b"fmt " {
        return None;
    }
    let rate = u32::from_le_bytes(header[28..32].try_into().ok()?);
    (rate > 0).then_some(u64::from(rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_surfaces_have_no_media_facts() {
        assert_eq!(read(Surface::ChatCompletions, || None, br#"{"n":2}"#), None);
    }

    #[test]
    fn image_and_speech_facts_come_from_json() {
        let images = read(
            Surface::Images,
            || Some("application/json"),
            br#"{"model":"dall-e-3","prompt":"a cat","size":"1792x1024","quality":"hd","n":2}"#,
        )
        .expect("images");
        assert_eq!(
            images.request,
            MediaRequest {
                kind: MediaKind::Images,
                size: Some("1792x1024".into()),
                quality: Some("hd".into()),
                n: Some(2),
                ..MediaRequest::default()
            }
        );
        let speech = read(
            Surface::Speech,
            || None,
            "{\"model\":\"tts-1\",\"input\":\"h\u{e9}llo\",\"voice\":\"alloy\"}".as_bytes(),
        )
        .expect("speech");
        assert_eq!(speech.request.characters, 5);
        let odd = read(Surface::Images, || None, br#"{"size":1,"n":"2"}"#).expect("images");
        assert_eq!((odd.request.size, odd.request.n), (None, None));
        assert_eq!(odd.model.as_deref(), Some("dall-e-2"), "the model the API runs unnamed");
        assert_eq!(speech.model, None);
    }

    #[test]
    fn a_transcription_form_names_its_model_and_file() {
        let mut wav =
            b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data".to_vec();
        wav.extend(std::iter::repeat_n(0u8, 64_000));
        let mut form = b"--xyz\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n".to_vec();
        form.extend_from_slice(&wav);
        form.extend_from_slice(b"\r\n--xyz--\r\n");
        let read =
            read(Surface::Transcription, || Some("multipart/form-data; boundary=xyz"), &form).expect("read");
        assert_eq!(read.model.as_deref(), Some("whisper-1"));
        assert_eq!(read.request.audio_bytes, wav.len() as u64);
        assert_eq!(read.request.audio_bytes_per_second, Some(32_000));
        assert_eq!(read.request.audio_seconds(), 3);
    }
}
