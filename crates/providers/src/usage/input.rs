//! Counting what a request gives the model to read while the request is parsed for its other
//! facts, so that the estimate costs no second parse and no `serde_json::Value`.
//!
//! The count must equal what the rule gives on the request parsed as a `Value`, which shapes three
//! choices here: every value is parsed as fully as a `Value` parse would (so that a body the
//! `Value` parse refuses is refused here too, and counts 0), a repeated member name counts only its
//! last member (a `Value` map keeps the last), and an object's `type` may come after the members it
//! decides about, so an object's members are held until its end.
//!
//! `tools` is counted here, so its tools' names (and their `function`'s) are checked for repeats
//! here too, as they are read (`request_body::ambiguity`), and its built-in web search tools found, with
//! their call limits (`max_uses`), for the reservation.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::request_body::ambiguity::{self, LISTED_INSIDE, Names, Place, Watched};

use super::{CHARS_PER_TOKEN, INPUT_FIELDS, MEDIA_PART_TOKENS, MEDIA_PART_TYPES, REQUEST_OVERHEAD_TOKENS};

mod strict;
mod tools;

pub(crate) use strict::{Checked, Key};
use tools::{GEMINI_SEARCH_TOOLS, both};
pub(crate) use tools::{PaidTools, SearchLimit, SearchTools};

/// Objects with more members than this find repeated names by sorting rather than by comparing
/// every pair, so that a hostile object cannot make the count quadratic.
const PAIRWISE_MEMBERS: usize = 16;

/// What the estimate counts: characters, and media parts (counted flat, whatever their size).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputCount {
    chars: u64,
    media_parts: u64,
}

impl InputCount {
    fn chars(chars: u64) -> Self {
        Self { chars, media_parts: 0 }
    }

    fn add(&mut self, other: InputCount) {
        self.chars = self.chars.saturating_add(other.chars);
        self.media_parts = self.media_parts.saturating_add(other.media_parts);
    }

    /// `ceil(chars / 4) + 1,000 per media part + 3`.
    pub(crate) fn tokens(self) -> u64 {
        self.chars
            .div_ceil(CHARS_PER_TOKEN)
            .saturating_add(self.media_parts.saturating_mul(MEDIA_PART_TOKENS))
            .saturating_add(REQUEST_OVERHEAD_TOKENS)
    }
}

/// The counts of a request's input fields, one slot each: a repeated field replaces its slot.
#[derive(Default)]
pub(crate) struct InputFields<'de> {
    slots: [Option<InputCount>; INPUT_FIELDS.len()],
    /// Members of the objects being counted, innermost last; reused across the whole request.
    members: Vec<Member<'de>>,
    /// The web search tools among `tools`, as [`Counted::web_search`].
    web_search: Option<SearchLimit>,
    /// The other paid tools among `tools`.
    paid: PaidTools,
}

/// The member a value is the value of, where its name matters to the count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Other,
    /// `type`: it may name a media part or a web search tool.
    Type,
    /// `max_uses`: a web search tool's call limit.
    MaxUses,
}

/// One member of an object being counted.
struct Member<'de> {
    key: Cow<'de, str>,
    /// The key's characters and the value's count.
    count: InputCount,
    /// The value is a string naming a media part type.
    media_type: bool,
    /// A later member has the same name, so this one does not count.
    repeated: bool,
    /// The member makes its object a web search tool (`type` naming one, or Gemini's member).
    web_search: bool,
    /// The value of a `max_uses` member.
    max_uses: Option<u64>,
    /// The member is a `type` naming a paid tool.
    paid: PaidTools,
}

/// What one value counts, and whether it is a string naming a media part type.
struct Counted {
    count: InputCount,
    media_type: bool,
    /// A web search tool (an array: some among its elements), with its call limit.
    web_search: Option<SearchLimit>,
    /// The string of a `type` naming a web search tool.
    names_search: bool,
    /// The number of a `max_uses` member.
    max_uses: Option<u64>,
    /// The paid tools the value is or holds (an object by its `type`, an array by its elements).
    paid: PaidTools,
    /// The paid tool a `type` string names.
    names_paid: PaidTools,
}

impl<'de> InputFields<'de> {
    /// Counts the value of a top-level member when its key names an input field; `Ok(false)` (and
    /// the value left unread) when it does not. `watch`: the value is one whose objects' names are
    /// checked for repeats, and where the first repeat goes.
    pub(crate) fn count_if_input<A: MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
        watch: Option<(Watched, &mut Option<String>)>,
    ) -> Result<bool, A::Error> {
        let Some(slot) = INPUT_FIELDS.iter().position(|field| *field == key) else { return Ok(false) };
        let watch = watch.map(|(watched, first_repeat)| Watch { watched, first_repeat });
        let counted =
            map.next_value_seed(CountValue { members: &mut self.members, role: Role::Other, watch })?;
        self.slots[slot] = Some(counted.count);
        if key == "tools" {
            self.web_search = counted.web_search;
            self.paid = counted.paid;
        }
        Ok(true)
    }

    /// The web search tools `tools` offers: `None` when it offers none, else their call limit.
    pub(crate) fn web_search(&self) -> Option<SearchLimit> {
        self.web_search
    }

    /// The other paid tools `tools` offers.
    pub(crate) fn paid_tools(&self) -> PaidTools {
        self.paid
    }

    /// The input fields' count all together.
    pub(crate) fn total(&self) -> InputCount {
        let mut total = InputCount::default();
        for count in self.slots.iter().flatten() {
            total.add(*count);
        }
        total
    }
}

/// Counts one value; `role`: the member it is the value of.
struct CountValue<'m, 'de> {
    members: &'m mut Vec<Member<'de>>,
    role: Role,
    /// Whether the value is one whose objects' names are checked (a tool, its `function`), while no
    /// repeat is found yet.
    watch: Option<Watch<'m>>,
}

/// A value whose objects' names are checked, and where the first repeat goes.
struct Watch<'m> {
    watched: Watched,
    first_repeat: &'m mut Option<String>,
}

impl Watch<'_> {
    /// The watch of the value of the member `name` of the object at `place`, if it is one.
    fn member(&mut self, place: Place, name: &str) -> Option<Watch<'_>> {
        let watched = Watched::member(place, name)?;
        self.first_repeat.is_none().then_some(Watch { watched, first_repeat: &mut *self.first_repeat })
    }
}

impl<'de> DeserializeSeed<'de> for CountValue<'_, 'de> {
    type Value = Counted;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Counted, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CountValue<'_, 'de> {
    type Value = Counted;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Counted, E> {
        Ok(Counted::nothing())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Counted, E> {
        Ok(Counted::number())
    }

    fn visit_u64<E>(self, value: u64) -> Result<Counted, E> {
        Ok(Counted { max_uses: (self.role == Role::MaxUses).then_some(value), ..Counted::number() })
    }

    fn visit_f64<E>(self, value: f64) -> Result<Counted, E> {
        // A `Value` holds a float it cannot represent as null, which counts nothing.
        Ok(if value.is_finite() { Counted::number() } else { Counted::nothing() })
    }

    fn visit_str<E>(self, text: &str) -> Result<Counted, E> {
        Ok(Counted {
            count: InputCount::chars(text.chars().count() as u64),
            media_type: self.role == Role::Type && MEDIA_PART_TYPES.contains(&text),
            web_search: None,
            names_search: self.role == Role::Type && text.starts_with("web_search"),
            max_uses: None,
            paid: PaidTools::default(),
            names_paid: if self.role == Role::Type { PaidTools::named(text) } else { PaidTools::default() },
        })
    }

    fn visit_unit<E>(self) -> Result<Counted, E> {
        Ok(Counted::nothing())
    }

    fn visit_none<E>(self) -> Result<Counted, E> {
        Ok(Counted::nothing())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Counted, A::Error> {
        let mut count = InputCount::default();
        let mut web_search = None;
        let mut paid = PaidTools::default();
        let mut index = 0;
        loop {
            // Each element of `tools` is a tool, while no repeat is found yet.
            let watch = match &mut self.watch {
                Some(Watch { watched: Watched::Tools, first_repeat }) if first_repeat.is_none() => {
                    Some(Watch { watched: Watched::Object(Place::Tool(index)), first_repeat })
                }
                _ => None,
            };
            let element = CountValue { members: &mut *self.members, role: Role::Other, watch };
            let Some(item) = seq.next_element_seed(element)? else { break };
            count.add(item.count);
            web_search = both(web_search, item.web_search);
            paid = paid.or(item.paid);
            index += 1;
        }
        Ok(Counted { count, web_search, paid, ..Counted::nothing() })
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Counted, A::Error> {
        let start = self.members.len();
        let mut names = match &self.watch {
            Some(Watch { watched: Watched::Object(place), .. }) => {
                Some((*place, Names::<LISTED_INSIDE>::new()))
            }
            _ => None,
        };
        while let Some(key) = map.next_key_seed(Key)? {
            let role = match &*key {
                "type" => Role::Type,
                "max_uses" => Role::MaxUses,
                _ => Role::Other,
            };
            let mut watch = None;
            if let (Some((place, names)), Some(outer)) = (&mut names, &mut self.watch) {
                ambiguity::note(names, *place, &key, outer.first_repeat);
                watch = outer.member(*place, &key);
            }
            let value = map.next_value_seed(CountValue { members: &mut *self.members, role, watch })?;
            let mut count = InputCount::chars(key.chars().count() as u64);
            count.add(value.count);
            // Every member of every object of the input passes here: one byte decides most.
            let web_search =
                value.names_search || (key.starts_with('g') && GEMINI_SEARCH_TOOLS.contains(&&*key));
            let max_uses = value.max_uses;
            // A `type` string names its tool; an object's or an array's own tools stay with it.
            let paid = value.names_paid;
            self.members.push(Member {
                key,
                count,
                media_type: value.media_type,
                repeated: false,
                web_search,
                max_uses,
                paid,
            });
        }
        let counted = count_object(&mut self.members[start..]);
        self.members.truncate(start);
        Ok(counted)
    }
}

impl Counted {
    fn nothing() -> Self {
        Self {
            count: InputCount::default(),
            media_type: false,
            web_search: None,
            names_search: false,
            max_uses: None,
            paid: PaidTools::default(),
            names_paid: PaidTools::default(),
        }
    }

    fn number() -> Self {
        Self { count: InputCount::chars(CHARS_PER_TOKEN), ..Self::nothing() }
    }
}

/// An object's count from its members: one media part when its `type` names one, else its
/// members' keys and values, a repeated name counted once, by its last member. Whether it is a web
/// search tool, and its `max_uses`, are read the same way.
fn count_object(members: &mut [Member<'_>]) -> Counted {
    mark_repeated(members);
    let mut count = InputCount::default();
    let (mut web_search, mut max_uses, mut paid) = (false, None, PaidTools::default());
    for member in members.iter().filter(|m| !m.repeated) {
        if member.media_type {
            return Counted { count: InputCount { chars: 0, media_parts: 1 }, ..Counted::nothing() };
        }
        count.add(member.count);
        web_search |= member.web_search;
        max_uses = max_uses.or(member.max_uses);
        paid = paid.or(member.paid);
    }
    Counted { count, web_search: web_search.then_some(max_uses), paid, ..Counted::nothing() }
}

/// Marks every member that a later member of the same name replaces.
fn mark_repeated(members: &mut [Member<'_>]) {
    if members.len() <= PAIRWISE_MEMBERS {
        for i in 0..members.len() {
            let (head, tail) = members.split_at_mut(i + 1);
            head[i].repeated = tail.iter().any(|later| later.key == head[i].key);
        }
        return;
    }
    let mut order: Vec<usize> = (0..members.len()).collect();
    // Stable: equal names stay in document order, so the last of each run is the one kept.
    order.sort_by(|&a, &b| members[a].key.cmp(&members[b].key));
    for pair in order.windows(2) {
        if members[pair[0]].key == members[pair[1]].key {
            members[pair[0]].repeated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::super::{
        CHARS_PER_TOKEN, INPUT_FIELDS, MEDIA_PART_TOKENS, MEDIA_PART_TYPES, REQUEST_OVERHEAD_TOKENS,
    };
    use crate::request_body::ambiguity::tests::reference_first_repeat;
    use crate::request_body::ambiguity::{lenient_scan, starts_with_byte_order_mark};
    use crate::request_body::{self, Ambiguity, BodyReading};
    use crate::rewrite::{force_include_usage, force_include_usage_with};

    /// The estimate as it was computed before the single pass: the body parsed into a `Value`.
    fn reference_estimate(request_body: &[u8]) -> u64 {
        #[derive(Default)]
        struct Count {
            chars: u64,
            media_parts: u64,
        }
        impl Count {
            fn add(&mut self, value: &Value) {
                match value {
                    Value::String(text) => {
                        self.chars = self.chars.saturating_add(text.chars().count() as u64)
                    }
                    Value::Number(_) => self.chars = self.chars.saturating_add(CHARS_PER_TOKEN),
                    Value::Array(items) => items.iter().for_each(|item| self.add(item)),
                    Value::Object(fields) => {
                        if fields
                            .get("type")
                            .and_then(Value::as_str)
                            .is_some_and(|t| MEDIA_PART_TYPES.contains(&t))
                        {
                            self.media_parts += 1;
                            return;
                        }
                        for (key, value) in fields {
                            self.chars = self.chars.saturating_add(key.chars().count() as u64);
                            self.add(value);
                        }
                    }
                    Value::Bool(_) | Value::Null => {}
                }
            }
        }
        let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(request_body) else { return 0 };
        let mut count = Count::default();
        for field in INPUT_FIELDS {
            if let Some(value) = request.get(field) {
                count.add(value);
            }
        }
        count
            .chars
            .div_ceil(CHARS_PER_TOKEN)
            .saturating_add(count.media_parts.saturating_mul(MEDIA_PART_TOKENS))
            .saturating_add(REQUEST_OVERHEAD_TOKENS)
    }

    /// The single pass reads as `request_body::facts`, the `Value` estimate and the rule of repeats read;
    /// the repeats of a body the strict pass refuses are as the lenient scan finds them.
    fn assert_same(body: &[u8]) {
        let read = request_body::read(body);
        let ambiguity = if starts_with_byte_order_mark(body) {
            Some(Ambiguity::ByteOrderMark)
        } else {
            let lenient =
                || (body.trim_ascii_start().first() == Some(&b'{')).then(|| lenient_scan(body)).flatten();
            match reference_first_repeat(body) {
                Some(first_repeat) => {
                    // Where the strict pass reads, the lenient scan finds the same.
                    assert_eq!(lenient(), first_repeat, "{}", String::from_utf8_lossy(body));
                    first_repeat
                }
                None => lenient(),
            }
            .map(Ambiguity::RepeatedMember)
        };
        assert_eq!(
            read,
            BodyReading {
                facts: request_body::facts(body),
                input_tokens: reference_estimate(body),
                ambiguity
            },
            "{}",
            String::from_utf8_lossy(body)
        );
    }

    /// Member names: the request's own, `type` (plain and escaped), and a few others, few enough
    /// that objects often repeat one.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(vec![
                "messages", "system", "input", "prompt", "instructions", "tools", "functions", "model",
                "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens",
                "include_usage", "content", "role", "max_uses", "google_search", "max_tool_calls",
                "service_tier", "web_search_options",
            ])
            .prop_map(|k| format!("\"{k}\"")),
            3 => Just("\"type\"".to_owned()),
            1 => Just(r#""t\u0079pe""#.to_owned()),
            1 => Just(r#""mess\u0061ges""#.to_owned()),
            1 => "[a-c]{1,2}".prop_map(|k| format!("\"{k}\"")),
            1 => Just("\"é✓\"".to_owned()),
        ]
    }

    /// JSON text (mostly valid, sometimes not): what `Value` cannot express too, such as repeated
    /// names, escapes, numbers out of range, lone surrogates and invalid UTF-8.
    fn json_text() -> impl Strategy<Value = Vec<u8>> {
        let valid = prop_oneof![
            4 => Just(b"null".to_vec()),
            4 => Just(b"true".to_vec()),
            4 => Just(b"false".to_vec()),
            6 => Just(b"7".to_vec()),
            4 => Just(b"-2.5e3".to_vec()),
            2 => Just(b"18446744073709551616".to_vec()),
            2 => Just(b"0.1e-400".to_vec()),
            12 => prop::sample::select(MEDIA_PART_TYPES.to_vec()).prop_map(|t| format!("\"{t}\"").into_bytes()),
            6 => Just(br#""text""#.to_vec()),
            4 => prop::sample::select(vec![
                "web_search", "web_search_20250305", "flex", "priority", "file_search", "code_interpreter",
            ])
                .prop_map(|t| format!("\"{t}\"").into_bytes()),
            4 => Just(br#""im\u0061ge""#.to_vec()),
            6 => Just("\"héllo ✓ 𝄞\"".as_bytes().to_vec()),
            4 => Just(br#""a\"b\\c\n""#.to_vec()),
            2 => Just(br#""\ud834\udd1e""#.to_vec()),
            20 => "[ -~]{0,12}".prop_map(|s| serde_json::to_vec(&s).unwrap_or_default()),
        ];
        let refused =
            prop::sample::select(vec![&b"1e400"[..], br#""\ud800""#, b"\"\xff\""]).prop_map(<[u8]>::to_vec);
        // What a `Value` parse refuses is rare, so that most texts parse and their counts compare.
        let leaf = prop_oneof![80 => valid, 1 => refused];
        leaf.prop_recursive(4, 48, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(|items| {
                    let mut out = b"[".to_vec();
                    out.extend(items.join(&b","[..]));
                    out.push(b']');
                    out
                }),
                prop::collection::vec((key(), inner), 0..20).prop_map(|members| {
                    let mut out = b"{".to_vec();
                    for (i, (key, value)) in members.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(key.as_bytes());
                        out.extend_from_slice(b" : ");
                        out.extend_from_slice(value);
                    }
                    out.push(b'}');
                    out
                }),
            ]
        })
    }

    /// A request: a top-level object of such members, sometimes damaged by one byte.
    fn request() -> impl Strategy<Value = Vec<u8>> {
        let value = prop_oneof![
            3 => json_text(),
            1 => prop::sample::select(vec![
                &br#""gpt-4o""#[..], b"true", br#"{"include_usage":true}"#, br#"{"include_usage":false,"x":1}"#, b"64",
            ])
            .prop_map(<[u8]>::to_vec),
        ];
        let top_key = prop_oneof![
            3 => prop::sample::select(INPUT_FIELDS.to_vec()).prop_map(|k| format!("\"{k}\"")),
            1 => key(),
        ];
        let head = prop::collection::vec(
            prop::sample::select(vec![
                &br#""model":"gpt-4o""#[..],
                br#""stream":true"#,
                br#""stream_options":{"include_usage":true}"#,
                br#""max_tokens":64"#,
                br#""max_output_tokens":9"#,
            ]),
            0..4,
        );
        let members = (head, prop::collection::vec((top_key, value), 0..8)).prop_map(|(head, members)| {
            let members =
                head.into_iter().map(<[u8]>::to_vec).chain(members.into_iter().map(|(key, value)| {
                    let mut member = key.into_bytes();
                    member.push(b':');
                    member.extend(value);
                    member
                }));
            let mut out = b" {".to_vec();
            out.extend(members.collect::<Vec<_>>().join(&b","[..]));
            out.extend_from_slice(b"}\n");
            out
        });
        (members, prop::option::weighted(0.1, any::<(prop::sample::Index, u8)>())).prop_map(
            |(mut body, damage)| {
                if let Some((at, byte)) = damage
                    && !body.is_empty()
                {
                    let at = at.index(body.len());
                    body[at] = byte;
                }
                body
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn the_single_pass_reads_what_facts_and_the_value_estimate_read(body in request()) {
            assert_same(&body);
            // The gateway estimates once, before the rewrite, for the receipt too: the rewrite must
            // not change the estimate, and given the facts it must rewrite as without them.
            let read = request_body::read(&body);
            let rewritten = force_include_usage_with(&body, &read.facts);
            prop_assert_eq!(&rewritten, &force_include_usage(&body));
            if let Some(rewritten) = rewritten {
                prop_assert_eq!(reference_estimate(&rewritten), read.input_tokens);
            }
        }

        #[test]
        fn any_json_text_is_read_alike(body in json_text()) {
            assert_same(&body);
        }

        #[test]
        fn any_bytes_are_read_alike(body in prop::collection::vec(any::<u8>(), 0..64)) {
            assert_same(&body);
        }
    }

    #[test]
    fn a_media_part_counts_flat_whatever_comes_before_its_type() {
        let body = br#"{"messages":[{"content":[{"image_url":{"url":"data:AAAA"},"type":"image_url"}],"role":"user"}]}"#;
        // "content" + "role" + "user" = 15 chars -> 4 tokens, one media part, 3 overhead.
        assert_eq!(request_body::read(body).input_tokens, 4 + 1_000 + 3);
        assert_same(body);
    }

    #[test]
    fn a_repeated_name_counts_its_last_member_only() {
        for body in [
            &br#"{"messages":"aaaaaaaaaaaa","messages":"b"}"#[..],
            br#"{"input":[{"type":"image_url","type":"text","a":"x","a":"yy"}]}"#,
            br#"{"input":[{"type":"text","t\u0079pe":"input_image"}]}"#,
            br#"{"model":"a","model":"b","input":"hello"}"#,
        ] {
            assert_same(body);
        }
        let many: Vec<String> = (0..40).map(|i| format!(r#""k{}":"{}""#, i % 7, "x".repeat(i))).collect();
        assert_same(format!(r#"{{"tools":[{{{}}}]}}"#, many.join(",")).as_bytes());
    }

    #[test]
    fn what_a_value_parse_refuses_counts_nothing_while_facts_may_still_read_it() {
        let deep =
            format!(r#"{{"model":"m","stream":true,"metadata":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
        for body in [
            &b"{\"model\":\"m\",\"stream\":true,\"user\":\"\xff\",\"input\":\"abc\"}"[..],
            br#"{"model":"m","temperature":1e400,"input":"abc"}"#,
            br#"{"model":"m","user":"\udc00","input":"abc"}"#,
            deep.as_bytes(),
        ] {
            let read = request_body::read(body);
            assert_eq!(read.input_tokens, 0);
            assert_eq!(read.facts.model.as_deref(), Some("m"));
            assert_same(body);
        }
    }
}
