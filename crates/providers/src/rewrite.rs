//! Making an OpenAI stream report its usage, and hiding that report from a client that did not ask.

mod json_object;

use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::request_body::{self, RequestFacts};
use crate::sse::SseReader;
use crate::walk::{Seen, Walk};

/// A held event larger than this cannot be OpenAI's usage-only chunk (a few hundred bytes), so it
/// is passed on without waiting for its end.
const MAX_HELD_EVENT_BYTES: usize = 64 << 10;

const INCLUDE_USAGE_OPTIONS: &[u8] = br#"{"include_usage":true}"#;

/// The chunk OpenAI sends last when asked for usage: no choices, a usage block.
#[derive(Deserialize)]
struct UsageOnlyProbe {
    choices: Option<Vec<IgnoredAny>>,
    usage: Option<IgnoredAny>,
}

/// Removes the usage-only chunk (`"choices": []` with a non-null `usage`) from an OpenAI chat or
/// completions event stream whose client did not ask for usage; every other byte passes unchanged
/// and in order. An event is held until its blank line shows whether it is that chunk.
#[derive(Debug)]
pub struct UsageChunkFilter {
    /// The bytes of the current, incomplete event.
    held: Vec<u8>,
    /// No byte of the current line yet: a line end here ends the event.
    line_empty: bool,
    /// The last byte was a `\r` ending a line: a `\n` next belongs to it.
    after_cr: bool,
    /// `held` is a whole event whose final `\r` may yet be followed by its `\n`.
    end_pending: bool,
    /// The current event outgrew a usage chunk: its bytes go on as they come.
    passing: bool,
}

/// The bytes to send on: a slice of the chunk while they are one run of it, a copy otherwise.
struct Output<'c> {
    chunk: &'c Bytes,
    run: Option<Range<usize>>,
    copy: Option<Vec<u8>>,
}

/// For an OpenAI chat completions or legacy completions streaming request: the body with
/// `stream_options.include_usage` set to `true`, every other byte as sent (members of
/// `stream_options` kept; a missing `stream_options` appended as the last member). `None` when the
/// body needs no change: not streaming, already `true`, or not a JSON object.
pub fn force_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    force_include_usage_with(body, &request_body::facts(body))
}

/// [`force_include_usage`] given the body's facts, already read (`request_body::facts(body)` exactly).
pub fn force_include_usage_with(body: &[u8], facts: &RequestFacts) -> Option<Vec<u8>> {
    if !facts.stream || facts.client_asked_usage {
        return None;
    }
    let span = json_object::value_span(body)?;
    let object = &body[span.clone()];
    let members = json_object::members(object)?;
    let options = json_object::find(object, &members, "stream_options").map(|m| &object[m.value.clone()]);
    let new_options = match options {
        Some(options) if options.first() == Some(&b'{') => {
            let option_members = json_object::members(options)?;
            json_object::set_member(options, &option_members, "include_usage", b"true")?
        }
        _ => INCLUDE_USAGE_OPTIONS.to_vec(),
    };
    let edited = json_object::set_member(object, &members, "stream_options", &new_options)?;
    let mut rewritten = Vec::with_capacity(body.len() - object.len() + edited.len());
    rewritten.extend_from_slice(&body[..span.start]);
    rewritten.extend_from_slice(&edited);
    rewritten.extend_from_slice(&body[span.end..]);
    Some(rewritten)
}

impl Default for UsageChunkFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageChunkFilter {
    pub fn new() -> Self {
        Self { held: Vec::new(), line_empty: true, after_cr: false, end_pending: false, passing: false }
    }

    /// The bytes to send the client now (maybe none).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        let bytes = &chunk[..];
        let mut out = Output::new(&chunk);
        if bytes.is_empty() {
            return out.into_bytes();
        }
        let mut at = 0;
        let mut event_start = 0;
        if std::mem::take(&mut self.end_pending) {
            at = usize::from(bytes[0] == b'\n');
            self.end_event(&chunk, 0..at, &mut out);
            event_start = at;
        } else if std::mem::take(&mut self.after_cr) && bytes[0] == b'\n' {
            at = 1;
        }
        while at < bytes.len() {
            let Some(offset) = memchr::memchr2(b'\n', b'\r', &bytes[at..]) else {
                self.line_empty = false;
                break;
            };
            let line_end = at + offset;
            let blank = self.line_empty && offset == 0;
            self.line_empty = true;
            at = line_end + 1;
            if bytes[line_end] == b'\r' {
                match bytes.get(at) {
                    Some(b'\n') => at += 1,
                    Some(_) => {}
                    None if blank => self.end_pending = true,
                    None => self.after_cr = true,
                }
            }
            if blank && !self.end_pending {
                self.end_event(&chunk, event_start..at, &mut out);
                event_start = at;
            }
        }
        self.hold(&chunk, event_start..bytes.len(), &mut out);
        out.into_bytes()
    }

    /// What is left at the end of the stream: an incomplete trailing event, as it came.
    pub fn finish(&mut self) -> Bytes {
        let whole_event = self.end_pending && !self.passing;
        let held = std::mem::take(&mut self.held);
        *self = Self::new();
        if whole_event && is_usage_only_event(&held) { Bytes::new() } else { Bytes::from(held) }
    }

    /// The current event ends with `chunk[tail]`.
    fn end_event(&mut self, chunk: &Bytes, tail: Range<usize>, out: &mut Output<'_>) {
        if std::mem::take(&mut self.passing) {
            out.keep(tail);
        } else if self.held.is_empty() {
            if !is_usage_only_event(&chunk[tail.clone()]) {
                out.keep(tail);
            }
        } else {
            self.held.extend_from_slice(&chunk[tail]);
            if !is_usage_only_event(&self.held) {
                out.push_copy(&self.held);
            }
            self.held.clear();
            self.held.shrink_to(MAX_HELD_EVENT_BYTES);
        }
    }

    /// `chunk[part]` continues the current event.
    fn hold(&mut self, chunk: &Bytes, part: Range<usize>, out: &mut Output<'_>) {
        if self.passing {
            out.keep(part);
        } else if self.held.len() + part.len() > MAX_HELD_EVENT_BYTES {
            out.push_copy(&self.held);
            out.keep(part);
            self.held.clear();
            self.held.shrink_to(MAX_HELD_EVENT_BYTES);
            self.passing = true;
        } else {
            self.held.extend_from_slice(&chunk[part]);
        }
    }
}

impl<'c> Output<'c> {
    fn new(chunk: &'c Bytes) -> Self {
        Self { chunk, run: None, copy: None }
    }

    fn keep(&mut self, part: Range<usize>) {
        if part.is_empty() {
            return;
        }
        if self.copy.is_none() {
            match &mut self.run {
                None => return self.run = Some(part),
                Some(run) if run.end == part.start => return run.end = part.end,
                Some(_) => {}
            }
        }
        let chunk = self.chunk;
        self.push_copy(&chunk[part]);
    }

    fn push_copy(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let copy = self.copy.get_or_insert_with(|| match self.run.take() {
            Some(run) => self.chunk[run].to_vec(),
            None => Vec::new(),
        });
        copy.extend_from_slice(bytes);
    }

    fn into_bytes(self) -> Bytes {
        match (self.copy, self.run) {
            (Some(copy), _) => Bytes::from(copy),
            (None, Some(run)) => self.chunk.slice(run),
            (None, None) => Bytes::new(),
        }
    }
}

/// Whether one whole event (its bytes up to and including its blank line) is the usage-only chunk.
/// A cheap look for a non-null `"usage"` member comes first, since with usage forced every chunk
/// carries `"usage":null`.
fn is_usage_only_event(event: &[u8]) -> bool {
    if !crate::usage::may_carry_usage(event) {
        return false;
    }
    let mut usage_only = false;
    SseReader::new().push(event, |e| usage_only |= is_usage_only(e.data));
    usage_only
}

/// The event's data is the usage-only chunk: read by the walk where it can tell, by serde otherwise.
fn is_usage_only(data: &str) -> bool {
    quick_usage_only(data).unwrap_or_else(|| usage_only_by_serde(data))
}

fn usage_only_by_serde(data: &str) -> bool {
    serde_json::from_str::<UsageOnlyProbe>(data)
        .is_ok_and(|probe| probe.usage.is_some() && probe.choices.as_ref().is_some_and(Vec::is_empty))
}

/// [`UsageOnlyProbe`] read by [`Walk`]: `None` where it would not read as serde does.
fn quick_usage_only(data: &str) -> Option<bool> {
    let mut walk = Walk::new(data);
    let (mut no_choices, mut usage) = (false, false);
    let mut seen = Seen::default();
    walk.object(0, |walk, key| {
        match key {
            b"choices" => {
                seen.first(0)?;
                let mut elements = 0;
                let choices = walk.nullable(|walk| {
                    walk.array(1, |walk| {
                        elements += 1;
                        walk.skip(2)
                    })
                })?;
                no_choices = choices.is_some() && elements == 0;
            }
            b"usage" => {
                seen.first(1)?;
                usage = walk.nullable(|walk| walk.skip(1))?.is_some();
            }
            _ => walk.skip(1)?,
        }
        Some(())
    })?;
    walk.at_end().then_some(no_choices && usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn forced(body: &str) -> Option<String> {
        force_include_usage(body.as_bytes()).map(|b| String::from_utf8(b).expect("utf-8"))
    }

    #[test]
    fn include_usage_is_added_when_absent() {
        assert_eq!(
            forced(r#"{"model":"gpt-4o","messages":[],"stream":true}"#).as_deref(),
            Some(r#"{"model":"gpt-4o","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            forced("{\n  \"stream\": true\n}\n").as_deref(),
            Some("{\n  \"stream\": true,\"stream_options\":{\"include_usage\":true}\n}\n")
        );
    }

    #[test]
    fn include_usage_false_becomes_true_and_other_options_stay() {
        assert_eq!(
            forced(r#"{"stream":true,"stream_options":{"include_usage":false},"n":1}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#)
        );
        assert_eq!(
            forced(r#"{"stream_options":{"include_obfuscation":false},"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_obfuscation":false,"include_usage":true},"stream":true}"#)
        );
        assert_eq!(
            forced(r#"{"stream":true,"stream_options":null}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
    }

    #[test]
    fn no_change_when_not_needed() {
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"model":"gpt-4o","messages":[]}"#,
            r#"{"stream":false}"#,
            "not json",
            "[1]",
            "",
        ] {
            assert_eq!(forced(body), None, "{body}");
        }
    }

    #[test]
    fn forced_bodies_read_back_as_asking_for_usage() {
        let body = r#" {"messages":[{"role":"user","content":"say \"stream_options\" {"}],"stream":true} "#;
        let rewritten = force_include_usage(body.as_bytes()).expect("rewritten");
        assert!(request_body::facts(&rewritten).client_asked_usage);
        let before: Value = serde_json::from_str(body).expect("json");
        let mut after: Value = serde_json::from_slice(&rewritten).expect("json");
        after.as_object_mut().expect("object").remove("stream_options");
        assert_eq!(before, after);
    }

    const CHUNK: &str =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn filtered(pieces: &[&str]) -> String {
        let mut filter = UsageChunkFilter::new();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend_from_slice(&filter.push(Bytes::copy_from_slice(piece.as_bytes())));
        }
        out.extend_from_slice(&filter.finish());
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn the_usage_only_chunk_is_removed_and_the_rest_kept() {
        let stream = format!("{CHUNK}{CHUNK}{USAGE}{DONE}");
        assert_eq!(filtered(&[&stream]), format!("{CHUNK}{CHUNK}{DONE}"));
        let (a, b) = stream.split_at(CHUNK.len() + 30);
        assert_eq!(filtered(&[a, b]), format!("{CHUNK}{CHUNK}{DONE}"));
    }

    #[test]
    fn whole_events_pass_without_copy_and_the_tail_waits() {
        let mut filter = UsageChunkFilter::new();
        let chunk = Bytes::from(format!("{CHUNK}data: {{\"id\""));
        let out = filter.push(chunk.clone());
        assert_eq!(out, chunk.slice(..CHUNK.len()));
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert_eq!(filter.finish(), Bytes::from_static(b"data: {\"id\""));
    }

    #[test]
    fn usage_chunk_ending_in_a_lone_cr_is_removed_at_finish() {
        let usage_cr = USAGE.replace('\n', "\r");
        assert_eq!(filtered(&[CHUNK, &usage_cr]), CHUNK);
        let usage_crlf = USAGE.replace('\n', "\r\n");
        let (a, b) = usage_crlf.split_at(usage_crlf.len() - 1);
        assert_eq!(filtered(&[CHUNK, a, b, DONE]), format!("{CHUNK}{DONE}"));
    }

    #[test]
    fn a_usage_chunk_with_choices_is_kept() {
        let with_choice = "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n";
        assert_eq!(filtered(&[with_choice]), with_choice);
        let null_usage = "data: {\"choices\":[],\"usage\" : null}\n\n";
        assert_eq!(filtered(&[null_usage]), null_usage);
    }

    #[test]
    fn usage_named_only_inside_text_or_as_null_keeps_the_event() {
        for kept in [
            "data: {\"choices\":[{\"delta\":{\"content\":\"the \\\"usage\\\": {} field\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"note\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":1}\",\"usage\" :\tnull}\n\n",
            "data: {\"choices\":[],\"x\":\"usage\"}\n\n",
        ] {
            assert_eq!(filtered(&[CHUNK, kept, DONE]), format!("{CHUNK}{kept}{DONE}"), "{kept}");
        }
        // A null `usage` deeper in does not hide the real one after it.
        let nested_null =
            "data: {\"choices\":[],\"meta\":{\"usage\":null},\"usage\":{\"prompt_tokens\":1}}\n\n";
        assert_eq!(filtered(&[CHUNK, nested_null, DONE]), format!("{CHUNK}{DONE}"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Whatever the walk tells of a chunk, serde's probe tells the same.
        #[test]
        fn the_walk_finds_the_usage_only_chunk_as_serde_does(
            members in proptest::collection::vec(
                (
                    proptest::sample::select(vec!["choices", "usage", "id", "choices", "usage", r"us\u0061ge"]),
                    proptest::sample::select(vec![
                        "[]", "[ ]", "[{}]", "[1,[2]]", "null", "{}", "{\"prompt_tokens\":3}", "0", "\"\"", "nul", "[,]", "01",
                    ]),
                ),
                0..4,
            ),
            comma in proptest::sample::select(vec![",", " ,\n"]),
            after in proptest::sample::select(vec!["", " ", "\n", "x", "}"]),
        ) {
            let members: Vec<String> = members.iter().map(|(key, value)| format!("\"{key}\":{value}")).collect();
            let data = format!("{{{}}}{after}", members.join(comma));
            if let Some(quick) = quick_usage_only(&data) {
                proptest::prop_assert_eq!(quick, usage_only_by_serde(&data), "{}", data);
            }
        }
    }

    #[test]
    fn a_large_event_is_passed_on_before_its_end() {
        let mut filter = UsageChunkFilter::new();
        let big = format!("data: {}", "x".repeat(MAX_HELD_EVENT_BYTES));
        assert_eq!(filter.push(Bytes::from(big.clone())).len(), big.len());
        assert_eq!(filter.push(Bytes::from_static(b"y\n\n")), Bytes::from_static(b"y\n\n"));
        assert_eq!(filter.push(Bytes::from(USAGE)), Bytes::new());
        assert!(filter.finish().is_empty());
    }
}
