//! The tap against recorded-shape provider answers: each fixture, fed whole, byte by byte and in random pieces (and, for streams, with CRLF and CR line ends), gives exactly its expected `Tapped`.

use std::path::{Path, PathBuf};

use recovea_core::pricing::ServiceTier;
use recovea_core::usage::Usage;
use recovea_providers::rewrite::UsageChunkFilter;
use recovea_providers::usage::{Surface, Tapped, UsageTap};
use serde_json::Value;

struct Fixture {
    name: String,
    body: Vec<u8>,
    surface: Surface,
    event_stream: bool,
    expected: Tapped,
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load_fixtures() -> Vec<Fixture> {
    let mut fixtures: Vec<Fixture> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures dir")
        .map(|entry| entry.expect("entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.strip_suffix(".expected.json")?.to_owned();
            Some(load(&name, &path))
        })
        .collect();
    fixtures.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(fixtures.len() >= 19, "fixtures went missing: {}", fixtures.len());
    fixtures
}

fn load(name: &str, expected_path: &Path) -> Fixture {
    let expected: Value = serde_json::from_slice(&std::fs::read(expected_path).expect("read")).expect("json");
    let event_stream = expected["event_stream"].as_bool().expect("event_stream");
    let body_path = fixtures_dir().join(format!("{name}.{}", if event_stream { "sse" } else { "json" }));
    let body = std::fs::read(&body_path).unwrap_or_else(|e| panic!("{}: {e}", body_path.display()));
    let surface = match expected["surface"].as_str().expect("surface") {
        "ChatCompletions" => Surface::ChatCompletions,
        "Completions" => Surface::Completions,
        "Responses" => Surface::Responses,
        "Embeddings" => Surface::Embeddings,
        "Messages" => Surface::Messages,
        "GenerateContent" => Surface::GenerateContent,
        "Images" => Surface::Images,
        "Speech" => Surface::Speech,
        "Transcription" => Surface::Transcription,
        other => panic!("{name}: unknown surface {other}"),
    };
    let usage = match &expected["usage"] {
        Value::Null => None,
        usage => {
            let field = |key: &str| usage[key].as_u64().unwrap_or_else(|| panic!("{name}: usage.{key}"));
            // The other quantities are named only where a fixture has them.
            let optional = |key: &str| usage[key].as_u64().unwrap_or(0);
            Some(Usage {
                input_tokens: field("input_tokens"),
                cached_input_tokens: field("cached_input_tokens"),
                cache_write_input_tokens: field("cache_write_input_tokens"),
                output_tokens: field("output_tokens"),
                reasoning_tokens: field("reasoning_tokens"),
                cache_write_1h_input_tokens: optional("cache_write_1h_input_tokens"),
                audio_input_tokens: optional("audio_input_tokens"),
                cached_audio_input_tokens: optional("cached_audio_input_tokens"),
                audio_output_tokens: optional("audio_output_tokens"),
                image_input_tokens: optional("image_input_tokens"),
                cached_image_input_tokens: optional("cached_image_input_tokens"),
                image_output_tokens: optional("image_output_tokens"),
                characters: optional("characters"),
                seconds: optional("seconds"),
                images: optional("images"),
                web_search_calls: optional("web_search_calls"),
                file_search_calls: optional("file_search_calls"),
                code_interpreter_sessions: optional("code_interpreter_sessions"),
                service_tier: ServiceTier::parse(usage["service_tier"].as_str().unwrap_or("default")),
            })
        }
    };
    let expected = Tapped {
        usage,
        output_chars: expected["output_chars"].as_u64().expect("output_chars"),
        model: expected["model"].as_str().map(str::to_owned),
        partial: expected["partial"].as_bool().unwrap_or(false),
        created: None,
    };
    Fixture { name: name.to_owned(), body, surface, event_stream, expected }
}

/// A small deterministic generator, so a failing split can be replayed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Every way of cutting the body the test tries: whole, byte by byte, and random pieces.
fn chunkings(body: &[u8]) -> Vec<(String, Vec<&[u8]>)> {
    let mut ways = vec![("whole".to_owned(), vec![body]), ("bytes".to_owned(), body.chunks(1).collect())];
    for seed in 0..8u64 {
        let mut rng = SplitMix(seed);
        let mut pieces = Vec::new();
        let mut rest = body;
        while !rest.is_empty() {
            let len = (rng.next() % 97 + 1) as usize;
            let (piece, tail) = rest.split_at(len.min(rest.len()));
            pieces.push(piece);
            rest = tail;
        }
        ways.push((format!("random seed {seed}"), pieces));
    }
    ways
}

fn tap(surface: Surface, event_stream: bool, pieces: &[&[u8]]) -> Tapped {
    let mut tap = UsageTap::new(surface, event_stream);
    for piece in pieces {
        tap.observe(&bytes::Bytes::copy_from_slice(piece));
    }
    tap.finish()
}

fn with_line_ends(body: &[u8], line_end: &str) -> Vec<u8> {
    String::from_utf8(body.to_vec()).expect("utf-8").replace('\n', line_end).into_bytes()
}

#[test]
fn every_fixture_gives_its_expected_tapped_in_every_chunking() {
    for fixture in load_fixtures() {
        let mut bodies = vec![("as recorded", fixture.body.clone())];
        if fixture.event_stream {
            bodies.push(("CRLF", with_line_ends(&fixture.body, "\r\n")));
            bodies.push(("CR", with_line_ends(&fixture.body, "\r")));
        }
        // A fixture's `output_chars` are the characters its answer holds; the tap counts them only
        // when the answer reports no usage (the filter test below checks them for the OpenAI streams
        // that do, once their usage chunk is gone).
        let chars = if fixture.expected.usage.is_some() { 0 } else { fixture.expected.output_chars };
        let expected = Tapped { output_chars: chars, ..fixture.expected.clone() };
        for (line_ends, body) in &bodies {
            for (how, pieces) in chunkings(body) {
                let tapped = tap(fixture.surface, fixture.event_stream, &pieces);
                assert_eq!(tapped, expected, "{} ({line_ends}, {how})", fixture.name);
            }
        }
    }
}

#[test]
fn the_corpus_covers_every_surface_both_ways_and_the_hard_cases() {
    let fixtures = load_fixtures();
    for surface in [
        Surface::ChatCompletions,
        Surface::Completions,
        Surface::Responses,
        Surface::Messages,
        Surface::GenerateContent,
    ] {
        for event_stream in [false, true] {
            assert!(
                fixtures.iter().any(|f| f.surface == surface && f.event_stream == event_stream),
                "{surface:?} event_stream={event_stream}"
            );
        }
    }
    assert!(fixtures.iter().any(|f| f.surface == Surface::Embeddings));
    // What the providers bill beside plain tokens: each in at least one answer.
    for surface in [Surface::Images, Surface::Speech, Surface::Transcription] {
        assert!(fixtures.iter().any(|f| f.surface == surface), "{surface:?}");
    }
    let billed = |check: &dyn Fn(&Usage) -> bool| {
        fixtures.iter().any(|f| f.expected.usage.as_ref().is_some_and(check))
    };
    assert!(billed(&|u| u.audio_input_tokens > 0 && u.audio_output_tokens > 0));
    assert!(billed(&|u| u.service_tier == ServiceTier::Priority));
    assert!(billed(&|u| u.service_tier == ServiceTier::Flex));
    assert!(billed(&|u| u.cache_write_1h_input_tokens > 0));
    assert!(billed(&|u| u.web_search_calls > 0 && u.code_interpreter_sessions > 0));
    assert!(billed(&|u| u.image_input_tokens > 0 && u.image_output_tokens > 0));
    assert!(billed(&|u| u.images > 0));
    assert!(billed(&|u| u.seconds > 0));
    let any = |check: &dyn Fn(&Fixture) -> bool| fixtures.iter().any(check);
    assert!(any(&|f| f.expected.usage.is_some_and(|u| u.cached_input_tokens > 0 && u.reasoning_tokens > 0)));
    assert!(any(&|f| f
        .expected
        .usage
        .is_some_and(|u| u.cache_write_input_tokens > 0 && u.cached_input_tokens > 0)));
    assert!(any(&|f| f.event_stream && f.expected.usage.is_none() && f.expected.output_chars > 0));
    assert!(any(&|f| f.body.windows(19).any(|w| w == b"response.incomplete")));
    // Gemini: thoughts and tool-use prompts, a cut stream, Azure's content-filter chunks.
    assert!(any(&|f| f.surface == Surface::GenerateContent && f.expected.partial));
    assert!(any(&|f| f.body.windows(23).any(|w| w == b"toolUsePromptTokenCount")));
    assert!(any(&|f| f.body.windows(21).any(|w| w == b"prompt_filter_results")));
}

/// A stream whose client did not ask for usage: the filter removes exactly the usage chunk, and the
/// client then sees the same text and no usage.
#[test]
fn filtering_openai_streams_removes_only_the_usage_chunk() {
    for fixture in load_fixtures() {
        let openai_stream = fixture.event_stream
            && matches!(fixture.surface, Surface::ChatCompletions | Surface::Completions);
        if !openai_stream {
            continue;
        }
        for (how, pieces) in chunkings(&fixture.body) {
            let mut filter = UsageChunkFilter::new();
            let mut out = Vec::new();
            for piece in &pieces {
                out.extend_from_slice(&filter.push(bytes::Bytes::copy_from_slice(piece)));
            }
            out.extend_from_slice(&filter.finish());
            let removed = fixture.body.len() - out.len();
            let expected_removed =
                if fixture.expected.usage.is_some() { usage_event_len(&fixture.body) } else { 0 };
            assert_eq!(removed, expected_removed, "{} ({how})", fixture.name);
            let seen = tap(fixture.surface, true, &[&out]);
            let expected = Tapped { usage: None, ..fixture.expected.clone() };
            assert_eq!(seen, expected, "{} ({how})", fixture.name);
        }
    }
}

/// The length of the fixture's usage-only event, blank line included.
fn usage_event_len(body: &[u8]) -> usize {
    let text = std::str::from_utf8(body).expect("utf-8");
    let event = text
        .split_inclusive("\n\n")
        .find(|e| e.contains("\"choices\":[],") && e.contains("\"usage\":{"))
        .expect("usage event");
    event.len()
}
