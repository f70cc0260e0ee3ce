//! Fuzzes the usage tap and the usage-chunk filter: any body, any surface, JSON or stream, cut anywhere, never panics.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use recovea_fuzz::pieces;
use recovea_providers::rewrite::UsageChunkFilter;
use recovea_providers::usage::{Surface, UsageTap, estimate_output_tokens};

const SURFACES: [Surface; 10] = [
    Surface::ChatCompletions,
    Surface::Completions,
    Surface::Responses,
    Surface::Embeddings,
    Surface::Messages,
    Surface::GenerateContent,
    Surface::Images,
    Surface::Speech,
    Surface::Transcription,
    Surface::Other,
];

fuzz_target!(|body: &[u8]| {
    let pieces: Vec<Bytes> = pieces(body).into_iter().map(Bytes::copy_from_slice).collect();
    let whole_body = Bytes::copy_from_slice(body);

    for surface in SURFACES {
        for event_stream in [false, true] {
            let mut whole = UsageTap::new(surface, event_stream);
            whole.observe(&whole_body);
            let mut split = UsageTap::new(surface, event_stream);
            for piece in &pieces {
                split.observe(piece);
            }
            let tapped = whole.finish();
            // Where the body is cut never changes what is read.
            assert_eq!(split.finish(), tapped);
            let _ = estimate_output_tokens(tapped.output_chars);
        }
    }

    let mut filter = UsageChunkFilter::new();
    let mut out = Vec::new();
    for piece in &pieces {
        out.extend_from_slice(&filter.push(piece.clone()));
    }
    out.extend_from_slice(&filter.finish());
    assert!(out.len() <= body.len());
    if !body.windows(7).any(|w| w == b"\"usage\"") {
        assert_eq!(out, body);
    }
});
