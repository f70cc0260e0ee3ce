//! The documented, deterministic token accounting and the fixed reply it describes.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The text of every generated answer.
pub const REPLY_TEXT: &str = "This is a mock response.";

/// [`REPLY_TEXT`] as streamed: one delta per piece.
pub const REPLY_PIECES: [&str; 5] = ["This", " is", " a", " mock", " response."];

/// Output tokens of every generated answer: one per piece.
pub const OUTPUT_TOKENS: u64 = REPLY_PIECES.len() as u64;

/// The most pieces a scripted [`Behaviour::pieces`](crate::Behaviour::pieces) may ask for, so
/// that a typo cannot make the mock build an answer wildly.
pub const MAX_PIECES: usize = 1_000_000;

/// Piece `i` of an answer of any length: [`REPLY_PIECES`] repeated in turn.
pub fn reply_piece(i: usize) -> &'static str {
    REPLY_PIECES[i % REPLY_PIECES.len()]
}

/// The text of an answer of `pieces` pieces: [`reply_piece`] 0 to `pieces - 1`, joined;
/// [`REPLY_TEXT`] for the default 5.
pub fn reply_text(pieces: usize) -> String {
    (0..pieces).map(reply_piece).collect()
}

/// Added to the counted words so that even an empty prompt costs something, like a real one.
pub const INPUT_TOKEN_OVERHEAD: u64 = 1;

/// Vector length of embeddings when the request has no `dimensions`.
pub const DEFAULT_EMBEDDING_DIMENSIONS: usize = 8;

/// Keys whose values hold prompt text in any of the supported request shapes.
const TEXT_KEYS: [&str; 6] = ["content", "text", "input", "prompt", "system", "instructions"];

/// Input tokens the mock charges for a request body, or `None` when it is not JSON.
///
/// See the crate documentation for the rule.
pub fn input_tokens(body: &[u8]) -> Option<u64> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let words = Walk { in_text: false }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(words + INPUT_TOKEN_OVERHEAD)
}

/// Counts words while walking the JSON without building it, to keep the hot path allocation-free.
#[derive(Clone, Copy)]
struct Walk {
    in_text: bool,
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<u64, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_i64<E>(self, _: i64) -> Result<u64, E> {
        Ok(u64::from(self.in_text))
    }

    fn visit_u64<E>(self, _: u64) -> Result<u64, E> {
        Ok(u64::from(self.in_text))
    }

    fn visit_f64<E>(self, _: f64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_str<E>(self, s: &str) -> Result<u64, E> {
        Ok(if self.in_text { s.split_whitespace().count() as u64 } else { 0 })
    }

    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut words = 0;
        while let Some(n) = seq.next_element_seed(self)? {
            words += n;
        }
        Ok(words)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut words = 0;
        while let Some(in_text) = map.next_key_seed(IsTextKey)? {
            words += map.next_value_seed(Walk { in_text })?;
        }
        Ok(words)
    }
}

/// Reads an object key and tells whether it names prompt text.
struct IsTextKey;

impl<'de> DeserializeSeed<'de> for IsTextKey {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_str(self)
    }
}

impl Visitor<'_> for IsTextKey {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(TEXT_KEYS.contains(&key))
    }
}

/// Usage objects in each provider's shape, as JSON text.
pub(crate) mod shapes {
    pub(crate) fn chat(input: u64, output: u64) -> String {
        format!(
            concat!(
                r#"{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"#,
                r#""prompt_tokens_details":{{"cached_tokens":0,"audio_tokens":0}},"#,
                r#""completion_tokens_details":{{"reasoning_tokens":0,"audio_tokens":0,"#,
                r#""accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}}"#
            ),
            input,
            output,
            input + output
        )
    }

    pub(crate) fn legacy(input: u64, output: u64) -> String {
        format!(
            r#"{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}"#,
            input,
            output,
            input + output
        )
    }

    pub(crate) fn responses(input: u64, output: u64) -> String {
        format!(
            concat!(
                r#"{{"input_tokens":{},"input_tokens_details":{{"cached_tokens":0}},"#,
                r#""output_tokens":{},"output_tokens_details":{{"reasoning_tokens":0}},"#,
                r#""total_tokens":{}}}"#
            ),
            input,
            output,
            input + output
        )
    }

    /// Gemini's `usageMetadata` of a whole answer.
    pub(crate) fn gemini(input: u64, output: u64) -> String {
        format!(
            concat!(
                r#"{{"promptTokenCount":{},"candidatesTokenCount":{},"totalTokenCount":{},"#,
                r#""promptTokensDetails":[{{"modality":"TEXT","tokenCount":{}}}]}}"#
            ),
            input,
            output,
            input + output,
            input
        )
    }

    /// Gemini's `usageMetadata` of a stream chunk before the last: the prompt only.
    pub(crate) fn gemini_prompt_only(input: u64) -> String {
        format!(r#"{{"promptTokenCount":{input},"totalTokenCount":{input}}}"#)
    }

    pub(crate) fn embeddings(input: u64) -> String {
        format!(r#"{{"prompt_tokens":{input},"total_tokens":{input}}}"#)
    }

    pub(crate) fn anthropic(input: u64, output: u64) -> String {
        format!(
            concat!(
                r#"{{"input_tokens":{},"cache_creation_input_tokens":0,"#,
                r#""cache_read_input_tokens":0,"output_tokens":{}}}"#
            ),
            input, output
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_under_text_keys_only() {
        let body = br#"{"model":"m x","messages":[{"role":"user","content":"Say  hello\nnow"},
            {"role":"user","content":[{"type":"text","text":"hi there"},{"type":"image_url","image_url":{"url":"a b"}}]}]}"#;
        assert_eq!(input_tokens(body), Some(3 + 2 + INPUT_TOKEN_OVERHEAD));
    }

    #[test]
    fn counts_system_instructions_and_token_arrays() {
        assert_eq!(input_tokens(br#"{"system":"a b","messages":[]}"#), Some(3));
        assert_eq!(input_tokens(br#"{"instructions":"a","input":"b c"}"#), Some(4));
        assert_eq!(input_tokens(br#"{"input":[[1,2,3],[4]]}"#), Some(5));
        assert_eq!(input_tokens(br#"{"prompt":["a b","c"]}"#), Some(4));
        assert_eq!(input_tokens(b"{}"), Some(1));
    }

    #[test]
    fn rejects_non_json() {
        assert_eq!(input_tokens(b"{"), None);
        assert_eq!(input_tokens(b"{} x"), None);
    }

    #[test]
    fn pieces_repeat_the_reply_in_turn() {
        assert_eq!(reply_text(REPLY_PIECES.len()), REPLY_TEXT);
        assert_eq!(reply_text(7), format!("{REPLY_TEXT}This is"));
        assert_eq!(reply_text(0), "");
        assert_eq!(reply_piece(5), "This");
    }

    #[test]
    fn usage_shapes_are_json() {
        for text in [
            shapes::chat(3, 5),
            shapes::legacy(3, 5),
            shapes::responses(3, 5),
            shapes::embeddings(3),
            shapes::anthropic(3, 5),
        ] {
            let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert!(value.is_object());
        }
    }
}
