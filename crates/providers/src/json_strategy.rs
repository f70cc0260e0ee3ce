//! Strategies for JSON texts shaped like what a reader expects, with odd values, repeated and
//! unknown members and garbling mixed in: for the property tests that hold the walk to serde.

use proptest::prelude::*;
use proptest::sample::select;

/// JSON numbers: serde refuses some where it reads a count or counts text.
pub(crate) const NUMBERS: [&str; 11] = [
    "0",
    "7",
    "42",
    "-1",
    "-0",
    "1.5",
    "1e3",
    "1E+2",
    "18446744073709551615",
    "18446744073709551616",
    "1e400",
];
pub(crate) const STRINGS: [&str; 8] = [
    r#""""#,
    r#""hi""#,
    "\"h\u{e9}llo \u{65e5}\u{672c}\"",
    "\"\u{1f600}\"",
    r#""a\nb""#,
    r#""\"q\"""#,
    r#""\/\\\b\f\r\t""#,
    r#""gpt-4o""#,
];
/// Strings the walk leaves to serde.
pub(crate) const UNICODE_ESCAPES: [&str; 2] = [r#""\u00e9""#, r#""\ud83d\ude00""#];
/// Not JSON.
pub(crate) const INVALID: [&str; 6] = ["nul", "01", "1.", "-", r#""x\qy""#, "\"tab\there\""];

/// Any JSON value (and a few that are not), its objects' keys from `keys`.
pub(crate) fn any_value(keys: &'static [&'static str]) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        100 => select(vec!["null", "true", "false"]),
        100 => select(NUMBERS.to_vec()),
        300 => select(STRINGS.to_vec()),
        10 => select(UNICODE_ESCAPES.to_vec()),
        3 => select(INVALID.to_vec()),
    ]
    .prop_map(String::from);
    leaf.prop_recursive(3, 16, 4, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec((select(keys), inner), 0..4).prop_map(|members| {
                let members: Vec<String> =
                    members.iter().map(|(key, value)| format!("\"{key}\":{value}")).collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
    .boxed()
}

/// An object with `fields` in their shape (mostly) or any value, in any order, among others
/// (named mostly by no field, sometimes from `keys`), sometimes one of them twice.
pub(crate) fn object_of(
    keys: &'static [&'static str],
    fields: Vec<(&'static str, BoxedStrategy<String>)>,
) -> BoxedStrategy<String> {
    let known: Vec<BoxedStrategy<Option<String>>> = fields
        .into_iter()
        .map(|(key, value)| {
            proptest::option::weighted(0.8, prop_oneof![19 => value, 1 => any_value(keys)])
                .prop_map(move |value| value.map(|value| format!("\"{key}\":{value}")))
                .boxed()
        })
        .collect();
    let key = prop_oneof![
        30 => select(vec!["id", "index", "role", "object", "total_tokens", r"mod\/el"]),
        1 => select(keys),
    ];
    let other = (key, any_value(keys)).prop_map(|(key, value)| format!("\"{key}\":{value}"));
    (
        known,
        proptest::collection::vec(other, 0..3),
        proptest::bool::weighted(0.05),
        select(vec![",", ", ", " ,\n"]),
    )
        .prop_flat_map(|(known, other, twice, comma)| {
            let mut members: Vec<String> = known.into_iter().flatten().chain(other).collect();
            if twice && let Some(first) = members.first().cloned() {
                members.push(first);
            }
            Just(members).prop_shuffle().prop_map(move |members| format!("{{{}}}", members.join(comma)))
        })
        .boxed()
}

/// An array of `element`s, or sometimes `null`.
pub(crate) fn array_of(element: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![
        9 => proptest::collection::vec(element, 0..3).prop_map(|items| format!("[{}]", items.join(","))),
        1 => Just("null".to_owned()),
    ]
    .boxed()
}

/// Maybe one edit of a text: a byte removed (`""`) or something inserted, somewhere.
pub(crate) fn edits() -> impl Strategy<Value = Option<(prop::sample::Index, &'static str)>> {
    proptest::option::weighted(
        0.2,
        (any::<prop::sample::Index>(), select(vec!["", " ", "\n", "\"", ",", "}", "]", "\\", "0", "\u{e9}"])),
    )
}

/// `text` with `edit` made (at a character boundary).
pub(crate) fn garbled(mut text: String, edit: Option<(prop::sample::Index, &str)>) -> String {
    if let Some((at, insert)) = edit {
        let mut at = at.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        if insert.is_empty() {
            if at < text.len() {
                text.remove(at);
            }
        } else {
            text.insert_str(at, insert);
        }
    }
    text
}
