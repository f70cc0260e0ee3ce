//! The paid tools a request offers (web search, with its call limits, file search, code
//! interpreter), read leniently, as `request_body::facts` reads a body.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};

use crate::usage::MEDIA_PART_TYPES;

/// Gemini's search tools, named by their one member (`{"google_search": {}}`).
pub(super) const GEMINI_SEARCH_TOOLS: [&str; 4] =
    ["google_search", "googleSearch", "google_search_retrieval", "googleSearchRetrieval"];

/// The built-in tools besides web search that bill a fee of their own, as a request offers them
/// (OpenAI's `file_search`, a call at a time, and `code_interpreter`, a container session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PaidTools {
    pub file_search: bool,
    pub code_interpreter: bool,
}

impl PaidTools {
    /// The tool a `type` string names.
    pub(super) fn named(kind: &str) -> PaidTools {
        PaidTools { file_search: kind == "file_search", code_interpreter: kind == "code_interpreter" }
    }

    pub(super) fn or(self, other: PaidTools) -> PaidTools {
        PaidTools {
            file_search: self.file_search || other.file_search,
            code_interpreter: self.code_interpreter || other.code_interpreter,
        }
    }
}

/// The call limit of the web search tools found (their `max_uses` summed); `None`: one of them
/// sets none.
pub(crate) type SearchLimit = Option<u64>;

/// The web search tools of a `tools` value as [`InputFields::web_search`] finds them, read as
/// leniently as `request_body::facts` reads a body (what it does not need, skipped unchecked), so that
/// `request_body::facts` and the counting pass give the same facts.
#[derive(Default)]
pub(crate) struct SearchTools(pub(crate) Option<SearchLimit>, pub(crate) PaidTools);

impl<'de> serde::Deserialize<'de> for SearchTools {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SearchToolsVisitor)
    }
}

struct SearchToolsVisitor;

/// A value read only for what [`SearchTools`] needs of it: a string, or an unsigned number.
enum Plain {
    Text(String),
    Number(u64),
    Other,
}

impl<'de> serde::Deserialize<'de> for Plain {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PlainVisitor)
    }
}

struct PlainVisitor;

impl<'de> Visitor<'de> for PlainVisitor {
    type Value = Plain;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, text: &str) -> Result<Plain, E> {
        Ok(Plain::Text(text.to_owned()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Plain, E> {
        Ok(Plain::Number(value))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Plain, E> {
        Ok(Plain::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Plain, E> {
        Ok(Plain::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Plain, E> {
        Ok(Plain::Other)
    }

    fn visit_unit<E>(self) -> Result<Plain, E> {
        Ok(Plain::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Plain, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Plain::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Plain, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Plain::Other)
    }
}

impl<'de> Visitor<'de> for SearchToolsVisitor {
    type Value = SearchTools;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, _: &str) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    fn visit_unit<E>(self) -> Result<SearchTools, E> {
        Ok(SearchTools::default())
    }

    /// As [`CountValue::visit_seq`]: the elements' tools together.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SearchTools, A::Error> {
        let (mut found, mut paid) = (None, PaidTools::default());
        while let Some(SearchTools(item, item_paid)) = seq.next_element()? {
            found = both(found, item);
            paid = paid.or(item_paid);
        }
        Ok(SearchTools(found, paid))
    }

    /// As [`count_object`]: a web search tool by its last `type` or a Gemini member, with its last
    /// `max_uses`; never a media part.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SearchTools, A::Error> {
        let (mut kind, mut gemini, mut max_uses) = (None, false, None);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "type" => kind = Some(map.next_value::<Plain>()?),
                "max_uses" => {
                    max_uses = match map.next_value::<Plain>()? {
                        Plain::Number(n) => Some(n),
                        _ => None,
                    }
                }
                other => {
                    gemini |= GEMINI_SEARCH_TOOLS.contains(&other);
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let (media, search, paid) = match &kind {
            Some(Plain::Text(kind)) => (
                MEDIA_PART_TYPES.contains(&kind.as_str()),
                kind.starts_with("web_search"),
                PaidTools::named(kind),
            ),
            _ => (false, false, PaidTools::default()),
        };
        if media {
            return Ok(SearchTools::default());
        }
        Ok(SearchTools((search || gemini).then_some(max_uses), paid))
    }
}

/// Two sets of web search tools together: their limits summed, none when either has none.
pub(super) fn both(a: Option<SearchLimit>, b: Option<SearchLimit>) -> Option<SearchLimit> {
    match (a, b) {
        (None, one) | (one, None) => one,
        (Some(a), Some(b)) => Some(a.zip(b).map(|(a, b)| a.saturating_add(b))),
    }
}
