//! The parts of the providers' answer shapes the tap reads, as borrowing serde types that skip the rest:
//! one module a provider's shapes (OpenAI's media APIs apart), and here what they all read with.

use std::fmt;
use std::marker::PhantomData;

use recovea_core::pricing::ServiceTier;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::lenient::StrOrNothing;

mod anthropic;
mod gemini;
mod media;
mod openai;

pub(super) use anthropic::{AnthropicEvent, AnthropicMessage, AnthropicUsage};
pub(super) use gemini::{GeminiGrounding, GeminiResponse};
pub(super) use media::{ImagesAnswer, SpeechEvent, TranscriptionAnswer};
pub(super) use openai::{OpenAiCompletion, OpenAiEmbeddings, Response, ResponsesEvent};

/// A `service_tier` of any JSON type: a string names a tier ([`ServiceTier::parse`]), anything else
/// is the standard one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tier(pub ServiceTier);

impl<'de> Deserialize<'de> for Tier {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = StrOrNothing::deserialize(deserializer)?;
        Ok(Tier(ServiceTier::parse(name.as_str())))
    }
}

/// Whole seconds of audio from a number of seconds, rounded up (`usage.seconds`, a verbose
/// transcription's `duration`: both may carry a fraction); anything but a number is none.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seconds(pub Option<u64>);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Reading;
        impl<'de> Visitor<'de> for Reading {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Seconds, E> {
                Ok(Seconds(Some(n)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Seconds, E> {
                Ok(Seconds(u64::try_from(n).ok()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Seconds, E> {
                // A duration, not money: rounded up to the second, as a second begun is billed.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let seconds = (n.is_finite() && n >= 0.0).then(|| n.ceil().min(u64::MAX as f64) as u64);
                Ok(Seconds(seconds))
            }
            fn visit_str<E>(self, _: &str) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_unit<E>(self) -> Result<Seconds, E> {
                Ok(Seconds(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Seconds, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| Seconds(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Seconds, A::Error> {
                IgnoredAny.visit_map(map).map(|_| Seconds(None))
            }
        }
        deserializer.deserialize_any(Reading)
    }
}

/// The number of elements of a JSON array, each skipped unread.
pub(super) struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> Visitor<'de> for Counting {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut count = 0u64;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    count = count.saturating_add(1);
                }
                Ok(Count(count))
            }
        }
        deserializer.deserialize_seq(Counting)
    }
}

/// Output characters a piece of an answer carries.
pub(super) trait OutputChars {
    fn output_chars(&self) -> u64;
}

fn chars(text: Option<TextChars>) -> u64 {
    text.map_or(0, |t| t.0)
}

/// The output of an OpenAI-shaped usage: `completion_tokens`, or what `total_tokens` leaves beyond
/// the prompt when that is more. OpenAI's total is their sum; Gemini's OpenAI-compatible endpoint
/// leaves its thinking tokens out of `completion_tokens` but counts them in `total_tokens` (and bills
/// them as output), so a total that says more is believed.
pub(super) fn output_within_total(prompt: u64, completion: u64, total: Option<u64>) -> u64 {
    total.map_or(completion, |total| completion.max(total.saturating_sub(prompt)))
}

/// The summed output characters of a JSON array's elements, counted without collecting them.
pub(super) struct SumOf<T> {
    pub total: u64,
    element: PhantomData<T>,
}

impl<'de, T: Deserialize<'de> + OutputChars> Deserialize<'de> for SumOf<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Summing<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + OutputChars> Visitor<'de> for Summing<T> {
            type Value = SumOf<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut total = 0u64;
                while let Some(element) = seq.next_element::<T>()? {
                    total = total.saturating_add(element.output_chars());
                }
                Ok(SumOf { total, element: PhantomData })
            }
        }
        deserializer.deserialize_seq(Summing(PhantomData))
    }
}

/// The characters of every string inside a JSON value of any type (object keys aside): the text
/// of a string, of content parts, or of a tool call's arguments object.
#[derive(Clone, Copy)]
pub(super) struct TextChars(pub u64);

impl<'de> Deserialize<'de> for TextChars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counting;
        impl<'de> Visitor<'de> for Counting {
            type Value = TextChars;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, text: &str) -> Result<TextChars, E> {
                Ok(TextChars(text.chars().count() as u64))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_unit<E>(self) -> Result<TextChars, E> {
                Ok(TextChars(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextChars, A::Error> {
                let mut total = 0u64;
                while let Some(TextChars(n)) = seq.next_element()? {
                    total = total.saturating_add(n);
                }
                Ok(TextChars(total))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextChars, A::Error> {
                let mut total = 0u64;
                while let Some((IgnoredAny, TextChars(n))) = map.next_entry()? {
                    total = total.saturating_add(n);
                }
                Ok(TextChars(total))
            }
        }
        deserializer.deserialize_any(Counting)
    }
}
