//! Properties of the stream readers: chunk boundaries and line-end styles never change what comes out.

use bytes::Bytes;
use proptest::prelude::*;
use recovea_providers::rewrite::UsageChunkFilter;
use recovea_providers::sse::SseReader;
use recovea_providers::usage::{Surface, Tapped, UsageTap};

type Event = (Option<String>, String);

fn read(reader: &mut SseReader, pieces: &[&[u8]]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut keep = |e: &recovea_providers::sse::SseEvent<'_>| {
        events.push((e.event.map(str::to_owned), e.data.to_owned()));
    };
    for piece in pieces {
        reader.push(piece, &mut keep);
    }
    reader.finish(&mut keep);
    events
}

/// Cuts `bytes` at the given points (taken modulo its length).
fn split<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}

/// Bytes that look like an event stream often enough to exercise every rule, and sometimes don't.
fn stream_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"id: 1".to_vec()),
        Just(b": comment".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just("é✓".as_bytes().to_vec()),
        Just(b"\xEF\xBB\xBF".to_vec()),
        Just(br#"{"choices":[],"usage":{"prompt_tokens":1}}"#.to_vec()),
        "[a-z{}\":, ]{1,8}".prop_map(String::into_bytes),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(token, 0..48).prop_map(|tokens| tokens.concat())
}

#[derive(Debug, Clone)]
struct EventSpec {
    name: Option<String>,
    data: Vec<String>,
    comment: bool,
}

fn event_specs() -> impl Strategy<Value = Vec<EventSpec>> {
    let spec =
        (proptest::option::of("[a-z_.]{1,12}"), prop::collection::vec("[ -~é✓]{0,20}", 0..4), any::<bool>())
            .prop_map(|(name, data, comment)| EventSpec { name, data, comment });
    prop::collection::vec(spec, 0..12)
}

fn serialize(specs: &[EventSpec], line_end: &str) -> Vec<u8> {
    let mut out = String::new();
    for spec in specs {
        if spec.comment {
            out.push_str(": keep-alive");
            out.push_str(line_end);
        }
        if let Some(name) = &spec.name {
            out.push_str(&format!("event: {name}{line_end}"));
        }
        for line in &spec.data {
            out.push_str(&format!("data: {line}{line_end}"));
        }
        out.push_str(line_end);
    }
    out.into_bytes()
}

/// What a reader must dispatch for these specs: events with data, their lines joined by `\n`.
fn expected_events(specs: &[EventSpec]) -> Vec<Event> {
    specs
        .iter()
        .filter(|spec| !spec.data.is_empty())
        .map(|spec| (spec.name.clone(), spec.data.join("\n")))
        .collect()
}

fn filter(pieces: &[&[u8]]) -> Vec<u8> {
    let mut filter = UsageChunkFilter::new();
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&filter.push(Bytes::copy_from_slice(piece)));
    }
    out.extend_from_slice(&filter.finish());
    out
}

#[derive(Debug, Clone)]
enum Chunk {
    Text(String),
    UsageOnly(u32),
    UsageWithChoices,
    Done,
    Comment,
}

impl Chunk {
    fn render(&self, line_end: &str) -> String {
        match self {
            Chunk::Text(text) => format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}}}}],\"usage\":null}}{line_end}{line_end}",
                serde_json::to_string(text).unwrap_or_default()
            ),
            Chunk::UsageOnly(n) => format!(
                "data: {{\"id\":\"c\",\"choices\": [ ],\"usage\": {{\"prompt_tokens\":{n},\"completion_tokens\":2}}}}{line_end}{line_end}"
            ),
            Chunk::UsageWithChoices => {
                format!(
                    "data: {{\"choices\":[{{\"delta\":{{}}}}],\"usage\":{{\"prompt_tokens\":1}}}}{line_end}{line_end}"
                )
            }
            Chunk::Done => format!("data: [DONE]{line_end}{line_end}"),
            Chunk::Comment => format!(": ping{line_end}{line_end}"),
        }
    }
}

fn chunks() -> impl Strategy<Value = Vec<Chunk>> {
    let chunk = prop_oneof![
        4 => "[ -~é✓🦊]{0,12}".prop_map(Chunk::Text),
        1 => any::<u32>().prop_map(Chunk::UsageOnly),
        1 => Just(Chunk::UsageWithChoices),
        1 => Just(Chunk::Done),
        1 => Just(Chunk::Comment),
    ];
    prop::collection::vec(chunk, 0..16)
}

/// One event of a Gemini stream: its text, and the usage it reports (prompt, candidates, thoughts).
#[derive(Debug, Clone)]
struct GeminiChunk {
    text: String,
    usage: Option<(u32, u32, u32)>,
}

fn gemini_chunks() -> impl Strategy<Value = Vec<GeminiChunk>> {
    let chunk = ("[ -~é✓🦊]{0,12}", proptest::option::of((0u32..5000, 0u32..5000, 0u32..5000)))
        .prop_map(|(text, usage)| GeminiChunk { text, usage });
    prop::collection::vec(chunk, 1..10)
}

/// The chunks as `GenerateContentResponse`s, the last one finished.
fn gemini_responses(chunks: &[GeminiChunk]) -> Vec<String> {
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let finish = if i + 1 == chunks.len() { r#","finishReason":"STOP""# } else { "" };
            let usage = chunk.usage.map_or(String::new(), |(prompt, candidates, thoughts)| {
                format!(
                    r#","usageMetadata":{{"promptTokenCount":{prompt},"candidatesTokenCount":{candidates},"thoughtsTokenCount":{thoughts}}}"#
                )
            });
            format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"text":{}}}],"role":"model"}}{finish},"index":0}}]{usage},"modelVersion":"gemini-x"}}"#,
                serde_json::to_string(&chunk.text).unwrap_or_default()
            )
        })
        .collect()
}

fn tap_pieces(surface: Surface, event_stream: bool, pieces: &[&[u8]]) -> Tapped {
    let mut tap = UsageTap::new(surface, event_stream);
    for piece in pieces {
        tap.observe(&bytes::Bytes::copy_from_slice(piece));
    }
    tap.finish()
}

fn line_end() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_split_reads_the_same_events_as_the_whole(stream in stream_soup(), cuts in prop::collection::vec(any::<usize>(), 0..12)) {
        let whole = read(&mut SseReader::new(), &[&stream]);
        let pieces = split(&stream, &cuts);
        prop_assert_eq!(read(&mut SseReader::new(), &pieces), whole);
    }

    #[test]
    fn any_split_drops_the_same_oversized_events(stream in stream_soup(), cuts in prop::collection::vec(any::<usize>(), 0..12)) {
        let whole = read(&mut SseReader::with_max_event_bytes(24), &[&stream]);
        let pieces = split(&stream, &cuts);
        prop_assert_eq!(read(&mut SseReader::with_max_event_bytes(24), &pieces), whole);
    }

    #[test]
    fn lf_crlf_and_cr_read_alike(specs in event_specs(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let expected = expected_events(&specs);
        for line_end in ["\n", "\r\n", "\r"] {
            let stream = serialize(&specs, line_end);
            prop_assert_eq!(&read(&mut SseReader::new(), &split(&stream, &cuts)), &expected, "{:?}", line_end);
        }
    }

    #[test]
    fn the_filter_removes_exactly_the_usage_only_events(
        stream in chunks(),
        ends in prop::collection::vec(line_end(), 16),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut input = String::new();
        let mut expected = String::new();
        for (chunk, end) in stream.iter().zip(ends.iter().cycle()) {
            // A lone CR then an LF opening the next event would read as one CRLF.
            let end = if *end == "\r" { "\r\n" } else { end };
            let text = chunk.render(end);
            input.push_str(&text);
            if !matches!(chunk, Chunk::UsageOnly(_)) {
                expected.push_str(&text);
            }
        }
        let out = filter(&split(input.as_bytes(), &cuts));
        prop_assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    #[test]
    fn the_filter_passes_streams_without_a_usage_chunk_unchanged(stream in stream_soup(), cuts in prop::collection::vec(any::<usize>(), 0..12)) {
        let has_usage_chunk = stream.windows(7).any(|w| w == b"\"usage\"");
        let out = filter(&split(&stream, &cuts));
        if !has_usage_chunk {
            prop_assert_eq!(&out, &stream);
        }
        prop_assert_eq!(out, filter(&[&stream]));
    }

    /// A Gemini stream, as `alt=sse` events with any line ends or as the JSON array, cut anywhere:
    /// the last usage reported wins, in the receipt's terms, and the model is the first named.
    #[test]
    fn gemini_streams_read_the_last_usage_over_any_split(
        chunks in gemini_chunks(),
        end in line_end(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let responses = gemini_responses(&chunks);
        let chars: u64 = chunks.iter().map(|c| c.text.chars().count() as u64).sum();
        let last = chunks.iter().rev().find_map(|c| c.usage);
        let expected = Tapped {
            usage: last.map(|(prompt, candidates, thoughts)| recovea_core::usage::Usage {
                input_tokens: u64::from(prompt),
                output_tokens: u64::from(candidates) + u64::from(thoughts),
                reasoning_tokens: u64::from(thoughts),
                ..Default::default()
            }),
            output_chars: if last.is_some() { 0 } else { chars },
            model: Some("gemini-x".to_owned()),
            partial: false,
            created: None,
        };
        let sse: String = responses.iter().map(|r| format!("data: {r}{end}{end}")).collect();
        prop_assert_eq!(&tap_pieces(Surface::GenerateContent, true, &split(sse.as_bytes(), &cuts)), &expected);
        let array = format!("[{}]", responses.join("\n,\r\n"));
        prop_assert_eq!(&tap_pieces(Surface::GenerateContent, false, &split(array.as_bytes(), &cuts)), &expected);
    }
}
