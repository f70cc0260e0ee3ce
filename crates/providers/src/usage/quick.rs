//! A quick read of an OpenAI completion (a whole answer or one stream chunk) by [`Walk`], for the
//! shapes providers send; the serde types of [`super::wire`] read the rest.
//!
//! It gives up (`None`) at anything it would not read exactly as serde does: an escaped model
//! name or key, a number where serde would parse one (text is counted), an object given
//! as an array, a repeated field, deep nesting, any syntax error. So it never answers differently
//! from serde, only sometimes not at all (a property test holds it to that).

use std::borrow::Cow;

use recovea_core::pricing::ServiceTier;
use recovea_core::usage::Usage;

use super::lenient::StrOrNothing;
use crate::walk::{Seen, Walk};

/// What one completion tells.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct CompletionRead<'a> {
    pub usage: Option<Usage>,
    pub output_chars: u64,
    pub model: StrOrNothing<'a>,
}

/// Reads a chat completion, a legacy completion or one chunk of either; `None` when it cannot
/// tell the answer quickly (serde then reads it, and decides whether it parses at all).
pub(super) fn completion(text: &str) -> Option<CompletionRead<'_>> {
    let mut walk = Walk::new(text);
    let mut read = CompletionRead::default();
    let mut seen = Seen::default();
    let mut tier = ServiceTier::Standard;
    walk.object(0, |walk, key| {
        match key {
            b"model" => {
                seen.first(0)?;
                read.model = model(walk, 1)?;
            }
            b"choices" => {
                seen.first(1)?;
                read.output_chars = walk.sum_of(1, choice)?;
            }
            b"usage" => {
                seen.first(2)?;
                read.usage = walk.nullable(|walk| openai_usage(walk, 1))?;
            }
            b"service_tier" => {
                seen.first(3)?;
                tier = ServiceTier::parse(model(walk, 1)?.as_str());
            }
            _ => walk.skip(1)?,
        }
        Some(())
    })?;
    if let Some(usage) = &mut read.usage {
        usage.service_tier = tier;
    }
    // serde refuses anything but whitespace after the value.
    walk.at_end().then_some(read)
}

/// `OpenAiChoice`: `message`, `delta` and `text`.
fn choice(walk: &mut Walk<'_>, depth: u32) -> Option<u64> {
    walk.chars_of_fields(depth, &[b"message", b"delta", b"text"], |walk, field| match field {
        0 | 1 => Some(walk.nullable(|walk| message(walk, depth + 1))?.unwrap_or(0)),
        _ => walk.text_chars(depth + 1),
    })
}

/// `OpenAiMessage`: `content`, `refusal`, `tool_calls` and `function_call`.
fn message(walk: &mut Walk<'_>, depth: u32) -> Option<u64> {
    walk.chars_of_fields(depth, &[b"content", b"refusal", b"tool_calls", b"function_call"], |walk, field| {
        match field {
            0 | 1 => walk.text_chars(depth + 1),
            2 => walk.sum_of(depth + 1, tool_call),
            _ => Some(walk.nullable(|walk| function(walk, depth + 1))?.unwrap_or(0)),
        }
    })
}

/// `OpenAiToolCall`: its `function`.
fn tool_call(walk: &mut Walk<'_>, depth: u32) -> Option<u64> {
    walk.chars_of_fields(depth, &[b"function"], |walk, _| {
        Some(walk.nullable(|walk| function(walk, depth + 1))?.unwrap_or(0))
    })
}

/// `OpenAiFunction`: the characters of its `arguments`.
fn function(walk: &mut Walk<'_>, depth: u32) -> Option<u64> {
    walk.chars_of_fields(depth, &[b"arguments"], |walk, _| walk.text_chars(depth + 1))
}

/// `OpenAiUsage`, as `to_usage` gives it.
fn openai_usage(walk: &mut Walk<'_>, depth: u32) -> Option<Usage> {
    let mut usage = Usage::default();
    let mut total = None;
    let mut seen = Seen::default();
    let detail = |walk: &mut Walk<'_>, name: &'static [u8]| {
        Some(walk.nullable(|walk| two_counts(walk, depth + 1, name))?.unwrap_or_default())
    };
    walk.object(depth, |walk, key| {
        match key {
            b"prompt_tokens" => {
                seen.first(0)?;
                usage.input_tokens = walk.count()?.unwrap_or(0);
            }
            b"completion_tokens" => {
                seen.first(1)?;
                usage.output_tokens = walk.count()?.unwrap_or(0);
            }
            b"prompt_tokens_details" => {
                seen.first(2)?;
                (usage.cached_input_tokens, usage.audio_input_tokens) = detail(walk, b"cached_tokens")?;
            }
            b"completion_tokens_details" => {
                seen.first(3)?;
                (usage.reasoning_tokens, usage.audio_output_tokens) = detail(walk, b"reasoning_tokens")?;
            }
            b"total_tokens" => {
                seen.first(4)?;
                total = walk.count()?;
            }
            _ => walk.skip(depth + 1)?,
        }
        Some(())
    })?;
    usage.output_tokens = super::wire::output_within_total(usage.input_tokens, usage.output_tokens, total);
    Some(usage)
}

/// `CachedDetails` or `ReasoningDetails`: the count `name` and `audio_tokens` (0 when absent or null).
fn two_counts(walk: &mut Walk<'_>, depth: u32, name: &[u8]) -> Option<(u64, u64)> {
    let mut counts = (0, 0);
    let mut seen = Seen::default();
    walk.object(depth, |walk, key| {
        if key == name {
            seen.first(0)?;
            counts.0 = walk.count()?.unwrap_or(0);
        } else if key == b"audio_tokens" {
            seen.first(1)?;
            counts.1 = walk.count()?.unwrap_or(0);
        } else {
            walk.skip(depth + 1)?;
        }
        Some(())
    })?;
    Some(counts)
}

/// `StrOrNothing`: a string without escapes, or nothing for any other value.
fn model<'a>(walk: &mut Walk<'a>, depth: u32) -> Option<StrOrNothing<'a>> {
    match walk.peek()? {
        b'"' => {
            let text = walk.string()?;
            Some(StrOrNothing(Some(Cow::Borrowed(text.plain()?))))
        }
        b'{' | b'[' | b't' | b'f' | b'n' => walk.skip(depth).map(|()| StrOrNothing(None)),
        // serde parses a number here, and refuses one out of range: left to it.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::*;
    use crate::json_strategy::{
        INVALID, NUMBERS, STRINGS, UNICODE_ESCAPES, any_value, array_of, edits, garbled, object_of,
    };
    use crate::usage::wire::OpenAiCompletion;

    fn by_serde(text: &str) -> Option<CompletionRead<'_>> {
        serde_json::from_str(text).ok().map(OpenAiCompletion::into_read)
    }

    /// Answers as providers send them (the mock's, and OpenAI's with escapes and tool calls): the
    /// walk reads each, and as serde does.
    #[test]
    fn what_providers_send_is_read_quickly() {
        let answers = [
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","service_tier":"default","system_fingerprint":"fp_mock","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#,
            "{\n  \"id\": \"chatcmpl-2\",\n  \"object\": \"chat.completion\",\n  \"created\": 1741569952,\n  \"model\": \"gpt-4.1-2025-04-14\",\n  \"choices\": [\n    {\n      \"index\": 0,\n      \"message\": {\n        \"role\": \"assistant\",\n        \"content\": \"Line one.\\nLine \\\"two\\\" \u{e9}t\u{e9} \u{1f600}\",\n        \"refusal\": null,\n        \"annotations\": []\n      },\n      \"logprobs\": null,\n      \"finish_reason\": \"stop\"\n    }\n  ],\n  \"usage\": {\n    \"prompt_tokens\": 19,\n    \"completion_tokens\": 10,\n    \"total_tokens\": 29,\n    \"prompt_tokens_details\": {\"cached_tokens\": 3, \"audio_tokens\": 0},\n    \"completion_tokens_details\": {\"reasoning_tokens\": 4}\n  },\n  \"service_tier\": \"default\"\n}\n",
            r#"{"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris, France\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":82,"completion_tokens":17}}"#,
            r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"\n\nThis is a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#,
        ];
        for answer in answers {
            let quick = completion(answer);
            assert!(quick.is_some(), "not read quickly: {answer}");
            assert_eq!(quick, by_serde(answer), "{answer}");
        }
        let read = completion(answers[3]).expect("read");
        assert_eq!(
            read.output_chars,
            "Line one.\nLine \"two\" \u{e9}t\u{e9} \u{1f600}".chars().count() as u64
        );
        assert_eq!(
            read.usage,
            Some(Usage {
                input_tokens: 19,
                cached_input_tokens: 3,
                output_tokens: 10,
                reasoning_tokens: 4,
                ..Usage::default()
            })
        );
    }

    /// Audio tokens each way and the tier served are read quickly too, as serde reads them.
    #[test]
    fn audio_tokens_and_the_tier_are_read() {
        let answer = r#"{"model":"gpt-audio","choices":[{"message":{"content":null}}],"usage":{"prompt_tokens":9100,"completion_tokens":9050,"total_tokens":18150,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":9000},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":9000}},"service_tier":"priority"}"#;
        let quick = completion(answer);
        assert_eq!(quick, by_serde(answer));
        assert_eq!(
            quick.and_then(|read| read.usage),
            Some(Usage {
                input_tokens: 9100,
                output_tokens: 9050,
                audio_input_tokens: 9000,
                audio_output_tokens: 9000,
                service_tier: ServiceTier::Priority,
                ..Usage::default()
            })
        );
        let escaped = answer.replace(r#""priority""#, r#""pri\u006frity""#);
        assert_eq!(completion(&escaped), None);
        assert_eq!(
            by_serde(&escaped).and_then(|r| r.usage).map(|u| u.service_tier),
            Some(ServiceTier::Priority)
        );
    }

    #[test]
    fn what_serde_reads_differently_or_refuses_is_left_to_it() {
        for text in [
            r#"{"mod\u0065l":"x"}"#,
            r#"{"model":"gpt\u002d4"}"#,
            r#"{"choices":[{"text":"\ud83d"}]}"#,
            r#"{"choices":[{"text":"\ude00x"}]}"#,
            r#"{"usage":{"prompt_tokens":1.0}}"#,
            r#"{"usage":{"prompt_tokens":18446744073709551616}}"#,
            r#"{"usage":{"prompt_tokens":-1}}"#,
            r#"{"choices":[{"text":1e400}]}"#,
            r#"{"choices":[["delta"]]}"#,
            r#"["gpt",[],null]"#,
            r#"{"usage":null,"usage":null}"#,
            r#"{"x":01}"#,
            r#"{"x":"a	b"}"#,
            r#"{"x":1,}"#,
            r#"{"x":1} x"#,
            r#"{"x":"\q"}"#,
        ] {
            assert_eq!(completion(text), None, "{text}");
        }
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert_eq!(completion(&deep), None);
    }

    const KEYS: [&str; 27] = [
        "service_tier",
        "audio_tokens",
        "model",
        "choices",
        "usage",
        "message",
        "delta",
        "text",
        "content",
        "refusal",
        "tool_calls",
        "function_call",
        "function",
        "arguments",
        "prompt_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "reasoning_tokens",
        "id",
        "index",
        "role",
        "object",
        r"mod\u0065l",
        r"cont\u0065nt",
        r"mod\/el",
    ];

    fn completion_text() -> BoxedStrategy<String> {
        let count = || {
            prop_oneof![
                100 => select(vec!["0", "7", "42", "18446744073709551615"]),
                10 => Just("null"),
                3 => select(NUMBERS.to_vec()),
                1 => select(INVALID.to_vec()),
            ]
            .prop_map(String::from)
            .boxed()
        };
        let text = || {
            prop_oneof![
                30 => select(STRINGS.to_vec()).prop_map(String::from),
                1 => select(UNICODE_ESCAPES.to_vec()).prop_map(String::from),
                3 => any_value(&KEYS),
            ]
            .boxed()
        };
        let nullable =
            |object: BoxedStrategy<String>| prop_oneof![5 => object, 1 => Just("null".to_owned())].boxed();
        let function = || object_of(&KEYS, vec![("arguments", text())]);
        let tool_call = object_of(&KEYS, vec![("function", nullable(function())), ("id", text())]);
        let message = || {
            object_of(
                &KEYS,
                vec![
                    ("content", text()),
                    ("refusal", text()),
                    ("tool_calls", array_of(tool_call.clone())),
                    ("function_call", nullable(function())),
                    ("role", text()),
                ],
            )
        };
        let choice = object_of(
            &KEYS,
            vec![
                ("message", nullable(message())),
                ("delta", nullable(message())),
                ("text", text()),
                ("index", count()),
            ],
        );
        let usage = object_of(
            &KEYS,
            vec![
                ("prompt_tokens", count()),
                ("completion_tokens", count()),
                (
                    "prompt_tokens_details",
                    nullable(object_of(&KEYS, vec![("cached_tokens", count()), ("audio_tokens", count())])),
                ),
                (
                    "completion_tokens_details",
                    nullable(object_of(
                        &KEYS,
                        vec![("reasoning_tokens", count()), ("audio_tokens", count())],
                    )),
                ),
            ],
        );
        let tier = prop_oneof![
            10 => select(vec!["\"default\"", "\"priority\"", "\"flex\"", "\"fast\"", "\"pri\\u006frity\""])
                .prop_map(String::from),
            1 => text(),
        ];
        object_of(
            &KEYS,
            vec![
                ("model", text()),
                ("choices", array_of(choice)),
                ("usage", nullable(usage)),
                ("service_tier", tier.boxed()),
            ],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Whatever the walk answers, serde answers the same; cut or garbled texts included.
        #[test]
        fn the_walk_answers_as_serde_does(
            text in completion_text(),
            edit in edits(),
        ) {
            let text = garbled(text, edit);
            if let Some(quick) = completion(&text) {
                prop_assert_eq!(Some(quick), by_serde(&text), "{}", text);
            }
        }
    }
}
