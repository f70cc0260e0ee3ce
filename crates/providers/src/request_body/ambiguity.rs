//! What would make the gateway read a request body otherwise than its provider does: a member
//! named twice in an object the gateway reads (providers keep the last, serde's derived readers
//! refuse the object, and the gateway would read no model and no stream), or a byte-order mark
//! (which a provider's decoder may drop, where the gateway reads no JSON at all).
//!
//! The strict pass ([`super::RequestPass`]) notes repeats as it reads; a body it refuses is looked
//! at again by [`lenient_scan`], as leniently as [`super::facts`] reads it, so that a repeat cannot
//! hide behind a construct the strict pass refuses and a provider accepts (a lone surrogate, a
//! number out of range, deep nesting).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::value::{
    BorrowedStrDeserializer, MapAccessDeserializer, SeqAccessDeserializer, StrDeserializer,
};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use crate::usage::input::Key;

/// How many names the request object's [`Names`] lists before it hashes them: a rich chat request
/// has about 25 members at its top, listed faster than hashed and without an allocation; past this,
/// a hash set keeps a hostile object of 100,000 members linear.
pub(crate) const LISTED_AT_TOP: usize = 32;

/// How many names the objects inside it (`stream_options`, a tool) list before they hash them:
/// they have a handful.
pub(crate) const LISTED_INSIDE: usize = 8;

/// The most characters of a repeated member's name its path keeps: it is the client's text, and
/// it goes into an answer.
pub const MAX_NAME_CHARS: usize = 128;

/// The byte-order marks of UTF-8, UTF-16 and UTF-32 (UTF-32's little-endian one starts with
/// UTF-16's). JSON has none; a decoder that honours one reads a body the gateway does not.
const BYTE_ORDER_MARKS: [&[u8]; 4] = [b"\xEF\xBB\xBF", b"\xFE\xFF", b"\xFF\xFE", b"\x00\x00\xFE\xFF"];

/// Why the gateway cannot be sure to read a body as its provider does: the provider would run
/// another request than the one the gateway checked against the allowlist and the caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ambiguity {
    /// The body starts with a byte-order mark, after any whitespace.
    ByteOrderMark,
    /// A member named twice in an object the gateway reads, the first such in the body (the
    /// earliest second naming): its path, as `stream`, `stream_options.include_usage`,
    /// `generationConfig.maxOutputTokens`, `tools[2].type` or `tools[0].function.name`, its name
    /// cut to [`MAX_NAME_CHARS`] characters. The name is the client's text, unescaped.
    RepeatedMember(String),
}

/// The objects whose members' names are checked for repeats: those the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The request object itself.
    Request,
    StreamOptions,
    /// Gemini's.
    GenerationConfig,
    /// An element of `tools`, by its index.
    Tool(usize),
    /// The `function` object of an element of `tools`.
    ToolFunction(usize),
}

impl Place {
    /// The path of the member called `name` in this object.
    pub(crate) fn path(self, name: &str) -> String {
        let name = match name.char_indices().nth(MAX_NAME_CHARS) {
            Some((cut, _)) => &name[..cut],
            None => name,
        };
        match self {
            Place::Request => name.to_owned(),
            Place::StreamOptions => format!("stream_options.{name}"),
            Place::GenerationConfig => format!("generationConfig.{name}"),
            Place::Tool(index) => format!("tools[{index}].{name}"),
            Place::ToolFunction(index) => format!("tools[{index}].function.{name}"),
        }
    }
}

/// A value whose objects' names are checked: an object the gateway reads, or the list of tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    Object(Place),
    /// The request's `tools`: each element is a tool.
    Tools,
}

impl Watched {
    /// The member called `name` of the object at `place`, when the gateway reads it.
    pub(crate) fn member(place: Place, name: &str) -> Option<Watched> {
        match (place, name) {
            (Place::Request, "stream_options") => Some(Watched::Object(Place::StreamOptions)),
            (Place::Request, "generationConfig") => Some(Watched::Object(Place::GenerationConfig)),
            (Place::Request, "tools") => Some(Watched::Tools),
            (Place::Tool(index), "function") => Some(Watched::Object(Place::ToolFunction(index))),
            _ => None,
        }
    }
}

/// The names of one object's members read so far: up to `LISTED` of them in a list on the stack,
/// a bit of `seen` set for each, so that most new names are told new without a comparison; past
/// that, or for a name with an escape (which the body does not hold as such), in a hash set.
pub(crate) struct Names<'de, const LISTED: usize = LISTED_INSIDE> {
    /// One bit per name, by [`seen_bit`]: a clear bit means no listed name is this one.
    seen: u64,
    listed: [&'de str; LISTED],
    count: usize,
    /// Every name, once the list is full or a name is not the body's own text. Hashed with std's
    /// keyed hash: the names are the client's to choose.
    hashed: Option<HashSet<Cow<'de, str>>>,
}

impl<'de, const LISTED: usize> Names<'de, LISTED> {
    pub(crate) fn new() -> Self {
        Self { seen: 0, listed: [""; LISTED], count: 0, hashed: None }
    }

    /// Whether no member before had this name; it is remembered, without a copy when it is the
    /// body's own text (every name without an escape): hence a `Cow`.
    #[expect(clippy::ptr_arg)]
    #[inline]
    pub(crate) fn first(&mut self, name: &Cow<'de, str>) -> bool {
        if let Some(hashed) = &mut self.hashed {
            return hashed.insert(name.clone());
        }
        let &Cow::Borrowed(borrowed) = name else { return self.hash_all(name.clone()) };
        let bit = seen_bit(borrowed);
        if self.seen & bit != 0 && self.listed[..self.count].contains(&borrowed) {
            return false;
        }
        if self.count == LISTED {
            return self.hash_all(name.clone());
        }
        self.seen |= bit;
        self.listed[self.count] = borrowed;
        self.count += 1;
        true
    }

    /// Moves the listed names to the hash set, with `name`; whether `name` is new.
    fn hash_all(&mut self, name: Cow<'de, str>) -> bool {
        let mut hashed: HashSet<Cow<'de, str>> = HashSet::with_capacity(2 * (self.count + 1));
        hashed.extend(self.listed[..self.count].iter().map(|listed| Cow::Borrowed(*listed)));
        let first = hashed.insert(name);
        self.hashed = Some(hashed);
        first
    }
}

/// A name's bit in [`Names::seen`], from its length and its first and last bytes: cheap, and
/// apart for the names a request holds.
#[inline]
fn seen_bit(name: &str) -> u64 {
    let bytes = name.as_bytes();
    let (first, last) = (bytes.first().copied().unwrap_or(0), bytes.last().copied().unwrap_or(0));
    let mix = (bytes.len() as u32).wrapping_mul(31) ^ u32::from(first).wrapping_mul(7) ^ u32::from(last);
    1 << (mix % 64)
}

/// Notes `name`, read in the object at `place` whose names so far are `names`, as the body's first
/// repeat when it is one and none was found before. (`&Cow`: see [`Names::first`].)
#[expect(clippy::ptr_arg)]
#[inline]
pub(crate) fn note<'de, const LISTED: usize>(
    names: &mut Names<'de, LISTED>,
    place: Place,
    name: &Cow<'de, str>,
    first_repeat: &mut Option<String>,
) {
    if !names.first(name) && first_repeat.is_none() {
        *first_repeat = Some(place.path(name));
    }
}

/// Whether the body starts with a byte-order mark, after any whitespace: read from its bytes, so
/// whatever follows the mark. (Whitespace before a mark makes the body no JSON for any reader; it
/// is refused all the same, since nothing is lost and no reader's leniency need be guessed.)
pub(crate) fn starts_with_byte_order_mark(body: &[u8]) -> bool {
    let start = body.trim_ascii_start();
    BYTE_ORDER_MARKS.iter().any(|mark| start.starts_with(mark))
}

/// Reads a value exactly as `serde_json::Value` reads it, noting a name repeated among the
/// members of the object it is (at `place`; objects inside it are not looked into).
pub(crate) struct NotedValue<'f> {
    pub(crate) place: Place,
    pub(crate) first_repeat: &'f mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for NotedValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NotedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Value::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq))
    }

    /// `Value`'s own reading of the object, its keys seen on their way.
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        let noting =
            NotingMap { map, names: Names::new(), place: self.place, first_repeat: self.first_repeat };
        Value::deserialize(MapAccessDeserializer::new(noting))
    }
}

/// An object's members as they are read, each key noted on its way to its reader.
struct NotingMap<'f, 'de, A> {
    map: A,
    names: Names<'de>,
    place: Place,
    first_repeat: &'f mut Option<String>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for NotingMap<'_, 'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        let key = NotingKey {
            seed,
            names: &mut self.names,
            place: self.place,
            first_repeat: &mut *self.first_repeat,
        };
        self.map.next_key_seed(key)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A key read as a string, noted, then handed to the reader's own seed.
struct NotingKey<'n, 'de, K> {
    seed: K,
    names: &'n mut Names<'de>,
    place: Place,
    first_repeat: &'n mut Option<String>,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for NotingKey<'_, 'de, K> {
    type Value = K::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<K::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for NotingKey<'_, 'de, K> {
    type Value = K::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, name: &'de str) -> Result<K::Value, E> {
        note(self.names, self.place, &Cow::Borrowed(name), self.first_repeat);
        self.seed.deserialize(BorrowedStrDeserializer::new(name))
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<K::Value, E> {
        note(self.names, self.place, &Cow::Owned(name.to_owned()), self.first_repeat);
        self.seed.deserialize(StrDeserializer::new(name))
    }
}

/// The first repeated member of a body that starts with `{`, read as leniently as
/// [`super::facts`] reads it: the objects the gateway reads are looked into, every other value
/// is skipped unchecked (any UTF-8, number and depth). What it found before an error stands.
pub(crate) fn lenient_scan(body: &[u8]) -> Option<String> {
    let mut first_repeat = None;
    let request = Scanned { watched: Watched::Object(Place::Request), first_repeat: &mut first_repeat };
    // An error ends the scan where it is: what came before it was read.
    let _ = match std::str::from_utf8(body) {
        Ok(text) => request.deserialize(&mut serde_json::Deserializer::from_str(text)),
        Err(_) => request.deserialize(&mut serde_json::Deserializer::from_slice(body)),
    };
    first_repeat
}

/// One watched value of the lenient scan: its objects' names are noted, anything else passes.
struct Scanned<'f> {
    watched: Watched,
    first_repeat: &'f mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for Scanned<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scanned<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.watched != Watched::Tools {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        }
        let mut index = 0;
        loop {
            let tool = Scanned {
                watched: Watched::Object(Place::Tool(index)),
                first_repeat: &mut *self.first_repeat,
            };
            if seq.next_element_seed(tool)?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Watched::Object(place) = self.watched else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut names = Names::<LISTED_AT_TOP>::new();
        while let Some(name) = map.next_key_seed(Key)? {
            note(&mut names, place, &name, self.first_repeat);
            match Watched::member(place, &name) {
                Some(watched) => {
                    map.next_value_seed(Scanned { watched, first_repeat: &mut *self.first_repeat })?
                }
                None => map.next_value::<IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::*;
    use crate::request_body;

    /// A JSON text as a tree that keeps every member, repeated names included, read as strictly as
    /// a `Value` parse.
    enum Node {
        Object(Vec<(String, Node)>),
        Array(Vec<Node>),
        Scalar,
    }

    impl<'de> Deserialize<'de> for Node {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
            struct NodeVisitor;
            impl<'de> Visitor<'de> for NodeVisitor {
                type Value = Node;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_unit<E>(self) -> Result<Node, E> {
                    Ok(Node::Scalar)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                    let mut items = Vec::new();
                    while let Some(item) = seq.next_element()? {
                        items.push(item);
                    }
                    Ok(Node::Array(items))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                    let mut members = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        members.push(member);
                    }
                    Ok(Node::Object(members))
                }
            }
            deserializer.deserialize_any(NodeVisitor)
        }
    }

    /// The first repeat as the rule says it, on the whole tree: in the body's order, a member's
    /// name is checked before its value is looked into. `None` when the body is no JSON object the
    /// strict pass would read.
    pub(crate) fn reference_first_repeat(body: &[u8]) -> Option<Option<String>> {
        fn in_object(members: &[(String, Node)], place: Place) -> Option<String> {
            let mut seen: Vec<&str> = Vec::new();
            for (name, value) in members {
                if seen.contains(&name.as_str()) {
                    return Some(place.path(name));
                }
                seen.push(name);
                if let Some(found) = in_value(value, Watched::member(place, name)) {
                    return Some(found);
                }
            }
            None
        }
        fn in_value(value: &Node, watched: Option<Watched>) -> Option<String> {
            match (watched?, value) {
                (Watched::Object(place), Node::Object(members)) => in_object(members, place),
                (Watched::Tools, Node::Array(tools)) => tools
                    .iter()
                    .enumerate()
                    .find_map(|(index, tool)| in_value(tool, Some(Watched::Object(Place::Tool(index))))),
                _ => None,
            }
        }
        if body.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let tree: Node = serde_json::from_slice(body).ok()?;
        Some(in_value(&tree, Some(Watched::Object(Place::Request))))
    }

    fn repeated(body: &str) -> Option<Ambiguity> {
        request_body::read(body.as_bytes()).ambiguity
    }

    fn member(path: &str) -> Option<Ambiguity> {
        Some(Ambiguity::RepeatedMember(path.to_owned()))
    }

    #[test]
    fn the_issues_body_names_stream_twice() {
        let body =
            r#"{"model":"o3","stream":false,"messages":[{"role":"user","content":"Hi"}],"stream":true}"#;
        let read = request_body::read(body.as_bytes());
        assert_eq!(read.ambiguity, member("stream"));
        // Read as before: no model and no stream, which is why it is refused.
        assert_eq!(read.facts, request_body::facts(body.as_bytes()));
        assert_eq!(read.facts.model, None);
        assert_eq!(repeated(r#"{"model":"gpt-4o-mini","messages":[],"model":"o3"}"#), member("model"));
        // A name spelled with an escape is the same name.
        assert_eq!(repeated(r#"{"stream":true,"str\u0065am":false}"#), member("stream"));
        // Any member of the request, not only those the gateway reads.
        assert_eq!(repeated(r#"{"temperature":1,"n":2,"temperature":0}"#), member("temperature"));
    }

    #[test]
    fn repeats_inside_the_objects_the_gateway_reads_name_their_path() {
        for (body, path) in [
            (
                r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}"#,
                "stream_options.include_usage",
            ),
            (
                r#"{"generationConfig":{"maxOutputTokens":1,"temperature":0,"maxOutputTokens":9000}}"#,
                "generationConfig.maxOutputTokens",
            ),
            (
                r#"{"tools":[{"type":"function"},{"type":"a"},{"type":"web_search","name":"x","type":"function"}]}"#,
                "tools[2].type",
            ),
            (
                r#"{"tools":[{"type":"function","function":{"name":"a","parameters":{},"name":"b"}}]}"#,
                "tools[0].function.name",
            ),
            (r#"{"model":"m","tools":[{"name":"a","max_uses":1,"max_uses":50}]}"#, "tools[0].max_uses"),
        ] {
            assert_eq!(repeated(body), member(path), "{body}");
            assert_eq!(reference_first_repeat(body.as_bytes()), Some(Some(path.to_owned())), "{body}");
        }
    }

    #[test]
    fn repeats_in_objects_the_gateway_does_not_read_are_the_providers_business() {
        for body in [
            r#"{"messages":[{"role":"user","role":"system","content":"Hi"}]}"#,
            r#"{"metadata":{"a":"1","a":"2"}}"#,
            r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","type":"x"}}}]}"#,
            r#"{"stream_options":{"x":{"y":1,"y":2}}}"#,
            r#"{"response_format":{"type":"json_schema","type":"text"}}"#,
            r#"{"contents":[{"parts":[{"text":"a","text":"b"}]}],"tools":{"function":{"a":1,"a":2}}}"#,
            r#"{"tools":[[{"type":1,"type":2}]],"generationConfig":[{"a":1,"a":2}]}"#,
        ] {
            assert_eq!(repeated(body), None, "{body}");
        }
    }

    #[test]
    fn the_first_repeat_in_the_body_is_the_one_named() {
        // The earliest second naming, whether at the top or inside.
        let body = r#"{"a":1,"b":1,"stream_options":{"x":1,"x":2},"b":2,"a":2}"#;
        assert_eq!(repeated(body), member("stream_options.x"));
        assert_eq!(repeated(r#"{"a":1,"b":1,"b":2,"a":2}"#), member("b"));
        let body = r#"{"tools":[{"type":"a"}],"tools":[{"type":"a","type":"b"}]}"#;
        assert_eq!(repeated(body), member("tools"));
    }

    #[test]
    fn a_long_name_is_cut_in_its_path() {
        let name = "é".repeat(10_000);
        let body = format!(r#"{{"tools":[{{"{name}":1,"{name}":2}}]}}"#);
        let Some(Ambiguity::RepeatedMember(path)) = repeated(&body) else { panic!("a repeat") };
        assert_eq!(path, format!("tools[0].{}", "é".repeat(MAX_NAME_CHARS)));
    }

    #[test]
    fn an_object_of_a_hundred_thousand_members_is_read_in_linear_time() {
        let members: Vec<String> = (0..100_000).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let distinct = format!("{{{}}}", members.join(","));
        let started = std::time::Instant::now();
        assert_eq!(repeated(&distinct), None);
        let last_again = format!("{{{},\"k99999\":0}}", members.join(","));
        assert_eq!(repeated(&last_again), member("k99999"));
        let in_options = format!(r#"{{"stream_options":{{{},"k0":0}}}}"#, members.join(","));
        assert_eq!(repeated(&in_options), member("stream_options.k0"));
        let in_a_tool = format!(r#"{{"tools":[{{{},"k5":0}}]}}"#, members.join(","));
        assert_eq!(repeated(&in_a_tool), member("tools[0].k5"));
        // Pairwise, 10^10 comparisons would take minutes; hashed, these take well under a second
        // even unoptimised.
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }

    #[test]
    fn names_turn_to_a_hash_set_past_the_listed_ones_and_keep_every_name() {
        let names: Vec<String> = (0..LISTED_INSIDE * 3).map(|i| format!("n{i}")).collect();
        let mut seen = Names::<LISTED_INSIDE>::new();
        for name in &names {
            assert!(seen.first(&Cow::Borrowed(name.as_str())), "{name}");
            assert_eq!(
                seen.hashed.is_some(),
                seen.count == LISTED_INSIDE && name != &names[LISTED_INSIDE - 1]
            );
        }
        for name in &names {
            assert!(!seen.first(&Cow::Owned(name.clone())), "{name}");
            assert!(!seen.first(&Cow::Borrowed(name.as_str())), "{name}");
        }
        // A name with an escape is not the body's text: it moves the list to the hash set.
        let mut seen = Names::<LISTED_INSIDE>::new();
        assert!(seen.first(&Cow::Borrowed("stream")));
        assert!(seen.hashed.is_none());
        assert!(!seen.first(&Cow::Owned("stream".to_owned())));
        assert!(seen.first(&Cow::Owned("model".to_owned())));
        assert!(!seen.first(&Cow::Borrowed("model")));
        // Names alike in length and ends share a bit, and are still told apart.
        let mut seen = Names::<LISTED_INSIDE>::new();
        for (name, first) in [("aab", true), ("acb", true), ("adb", true), ("aeb", true), ("acb", false)] {
            assert_eq!(seen_bit("aab"), seen_bit(name), "{name}: all alike");
            assert_eq!(seen.first(&Cow::Borrowed(name)), first, "{name}");
        }
    }

    #[test]
    fn a_byte_order_mark_is_refused_before_anything_is_read() {
        for body in [
            &b"\xEF\xBB\xBF{\"model\":\"o3\",\"stream\":true}"[..],
            b" \n\t\xEF\xBB\xBF{}",
            b"\xEF\xBB\xBF",
            b"\xFF\xFE{\x00}\x00",
            b"\xFE\xFF\x00{\x00}",
            b"\x00\x00\xFE\xFF\x00\x00\x00{",
            b"\xFF\xFE\x00\x00{\x00\x00\x00",
        ] {
            let read = request_body::read(body);
            assert_eq!(read.ambiguity, Some(Ambiguity::ByteOrderMark), "{body:?}");
            assert_eq!(read.facts, request_body::facts(body), "{body:?}");
        }
        for body in [
            &b"{\"content\":\"\xEF\xBB\xBF\"}"[..],
            "{\"content\":\"\u{feff}\"}".as_bytes(),
            b"\xEF\xBB",
            b"\xEF",
            b"",
            b"   ",
            b"\xFF",
        ] {
            assert_eq!(request_body::read(body).ambiguity, None, "{body:?}");
        }
    }

    /// A repeat after (or before) what the strict pass refuses is found all the same, since a
    /// provider may accept what the strict pass refuses.
    #[test]
    fn a_repeat_cannot_hide_behind_what_the_strict_pass_refuses() {
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        for (body, path) in [
            (r#"{"model":"gpt-4o-mini","user":"\udc00","model":"o3"}"#.to_owned(), "model"),
            (r#"{"model":"gpt-4o-mini","temperature":1e400,"model":"o3"}"#.to_owned(), "model"),
            (format!(r#"{{"model":"gpt-4o-mini","metadata":{deep},"model":"o3"}}"#), "model"),
            (format!(r#"{{"stream":false,"stream":true,"metadata":{deep}}}"#), "stream"),
            (format!(r#"{{"messages":{deep},"tools":[{{"type":"a","type":"b"}}]}}"#), "tools[0].type"),
            (r#"{"messages":"\udc00","stream_options":{"a":1,"a":1e400}}"#.to_owned(), "stream_options.a"),
        ] {
            assert_eq!(repeated(&body), member(path), "{body}");
            assert_eq!(reference_first_repeat(body.as_bytes()), None, "the strict pass refuses {body}");
        }
        let invalid_utf8 = b"{\"user\":\"\xff\",\"model\":\"a\",\"model\":\"b\"}";
        assert_eq!(request_body::read(invalid_utf8).ambiguity, member("model"));
    }

    /// Member names: those the gateway reads and a few others, some spelled with escapes or
    /// needing them, few enough that repeats are likely where they are allowed.
    fn name() -> impl Strategy<Value = String> {
        select(vec![
            "model",
            "stream",
            "stream_options",
            "generationConfig",
            "tools",
            "function",
            "type",
            "name",
            "include_usage",
            "maxOutputTokens",
            "messages",
            "max_tokens",
            "parameters",
            "a",
            "é✓",
            "q\"uote",
            "back\\slash",
            "tab\t",
            "\u{1f600}",
        ])
        .prop_map(str::to_owned)
    }

    /// A name as JSON text: plainly, or its first character as a `\u` escape.
    fn spelled(name: &str, escape_first: bool) -> String {
        let plain = serde_json::to_string(name).unwrap_or_default();
        match name.chars().next() {
            Some(first) if escape_first && first.is_ascii() => {
                format!("\"\\u{:04x}{}", first as u32, &plain[1 + first.len_utf8()..])
            }
            _ => plain,
        }
    }

    /// An object's text from its members; `distinct`: a name's later members are left out.
    fn object_text(members: &[(String, bool, String)], distinct: bool) -> String {
        let mut seen = std::collections::HashSet::new();
        let members: Vec<String> = members
            .iter()
            .filter(|(name, _, _)| !distinct || seen.insert(name.clone()))
            .map(|(name, escape, value)| format!("{}:{value}", spelled(name, *escape)))
            .collect();
        format!("{{{}}}", members.join(","))
    }

    /// Any JSON value: its objects may repeat names, which only the objects the gateway reads
    /// must not.
    fn any_value() -> BoxedStrategy<String> {
        let leaf = select(vec!["null", "true", "1", "-2.5e3", r#""text""#, r#""\ud83d\ude00""#, r#""""#])
            .prop_map(str::to_owned);
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((name(), any::<bool>(), inner), 0..5)
                    .prop_map(|members| object_text(&members, false)),
            ]
        })
        .boxed()
    }

    /// An object the gateway reads: distinct names, its values any.
    fn read_object(value: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop::collection::vec((name(), any::<bool>(), value), 0..6)
            .prop_map(|members| object_text(&members, true))
            .boxed()
    }

    /// A name other than `watched`, whose value may be anything.
    fn name_but(watched: &'static [&'static str]) -> impl Strategy<Value = String> {
        name().prop_filter("a member the gateway reads", move |name| !watched.contains(&name.as_str()))
    }

    /// A tool: distinct names, and its `function` (when an object) distinct too.
    fn tool() -> BoxedStrategy<String> {
        let member = prop_oneof![
            3 => (name_but(&["function"]), any::<bool>(), any_value()),
            1 => (Just("function".to_owned()), any::<bool>(), read_object(any_value())),
        ];
        prop::collection::vec(member, 0..5).prop_map(|members| object_text(&members, true)).boxed()
    }

    /// The members of a request without a repeat where the gateway reads.
    fn unambiguous_members() -> impl Strategy<Value = Vec<(String, bool, String)>> {
        let member = prop_oneof![
            4 => (name_but(&["stream_options", "generationConfig", "tools"]), any::<bool>(), any_value()),
            1 => (Just("stream_options".to_owned()), any::<bool>(), read_object(any_value())),
            1 => (Just("generationConfig".to_owned()), any::<bool>(), read_object(any_value())),
            1 => (
                Just("tools".to_owned()),
                any::<bool>(),
                prop::collection::vec(tool(), 0..4).prop_map(|tools| format!("[{}]", tools.join(","))),
            ),
        ];
        prop::collection::vec(member, 0..8).prop_map(|members| {
            let mut seen = std::collections::HashSet::new();
            members.into_iter().filter(|(name, _, _)| seen.insert(name.clone())).collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// A body without a repeat where the gateway reads, nor a byte-order mark, is never
        /// refused, whatever repeats inside the rest; and it is read as before.
        #[test]
        fn a_body_without_repeats_is_never_ambiguous(members in unambiguous_members()) {
            let body = object_text(&members, false);
            let read = request_body::read(body.as_bytes());
            prop_assert_eq!(&read.ambiguity, &None, "{}", body);
            prop_assert_eq!(&read.facts, &request_body::facts(body.as_bytes()), "{}", body);
            prop_assert_eq!(lenient_scan(body.as_bytes()), None, "{}", body);
            prop_assert_eq!(reference_first_repeat(body.as_bytes()), Some(None), "{}", body);
        }

        /// A copy of any member of the request, put anywhere in it, is the repeat named.
        #[test]
        fn a_copy_of_a_top_level_member_is_named(
            members in unambiguous_members(),
            which in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            escape in any::<bool>(),
        ) {
            prop_assume!(!members.is_empty());
            let (name, _, value) = members[which.index(members.len())].clone();
            let mut members = members;
            members.insert(at.index(members.len() + 1), (name.clone(), escape, value));
            let body = object_text(&members, false);
            let expected = Some(Ambiguity::RepeatedMember(name));
            prop_assert_eq!(&request_body::read(body.as_bytes()).ambiguity, &expected, "{}", body);
        }

        /// A copy of a member of `stream_options`, `generationConfig`, a tool or its function is
        /// named by its path.
        #[test]
        fn a_copy_inside_an_object_the_gateway_reads_is_named_by_its_path(
            members in unambiguous_members(),
            place in select(vec!["stream_options", "generationConfig", "tools", "function"]),
            inner in prop::collection::vec((name_but(&["function"]), any::<bool>(), any_value()), 1..5),
            which in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            tool_at in any::<prop::sample::Index>(),
        ) {
            let mut inner: Vec<(String, bool, String)> = {
                let mut seen = std::collections::HashSet::new();
                inner.into_iter().filter(|(name, _, _)| seen.insert(name.clone())).collect()
            };
            let (name, escape, value) = inner[which.index(inner.len())].clone();
            inner.insert(at.index(inner.len() + 1), (name.clone(), !escape, value));
            let object = object_text(&inner, false);
            // The request without that member, then with it last: a repeat of its own is its first.
            let mut members: Vec<(String, bool, String)> = members;
            let (member, value, path) = match place {
                "tools" | "function" => {
                    let tools: Vec<String> = (0..3).map(|_| "{}".to_owned()).collect();
                    let index = tool_at.index(tools.len());
                    let mut tools = tools;
                    if place == "tools" {
                        tools[index] = object;
                        (String::from("tools"), format!("[{}]", tools.join(",")), format!("tools[{index}].{name}"))
                    } else {
                        tools[index] = format!(r#"{{"type":"function","function":{object}}}"#);
                        (String::from("tools"), format!("[{}]", tools.join(",")), format!("tools[{index}].function.{name}"))
                    }
                }
                other => (other.to_owned(), object, format!("{other}.{name}")),
            };
            members.retain(|(existing, _, _)| *existing != member);
            members.push((member, false, value));
            let body = object_text(&members, false);
            let expected = Some(Ambiguity::RepeatedMember(path));
            prop_assert_eq!(&request_body::read(body.as_bytes()).ambiguity, &expected, "{}", body);
            prop_assert_eq!(&lenient_scan(body.as_bytes()).map(Ambiguity::RepeatedMember), &expected, "{}", body);
        }
    }
}
