//! Fuzzes the event-stream reader: any bytes, cut anywhere, never panic and read as they do whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_fuzz::pieces;
use recovea_providers::sse::{SseEvent, SseReader};

type Event = (Option<String>, String);

fn read(max_event_bytes: usize, pieces: &[&[u8]]) -> Vec<Event> {
    let mut reader = SseReader::with_max_event_bytes(max_event_bytes);
    let mut events = Vec::new();
    let mut keep = |e: &SseEvent<'_>| events.push((e.event.map(str::to_owned), e.data.to_owned()));
    for piece in pieces {
        reader.push(piece, &mut keep);
    }
    reader.finish(&mut keep);
    events
}

fuzz_target!(|stream: &[u8]| {
    let pieces = pieces(stream);
    // A small cap too, so that dropping oversized events is exercised.
    for max_event_bytes in [64, 4 << 20] {
        assert_eq!(read(max_event_bytes, &pieces), read(max_event_bytes, &[stream]));
        assert_eq!(
            read(max_event_bytes, &stream.chunks(1).collect::<Vec<_>>()),
            read(max_event_bytes, &[stream])
        );
    }
});
