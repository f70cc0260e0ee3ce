//! Fuzzes the decision of what to do with a client's request (`classify`): any bytes never panic;
//! a decision other than "not yet" made on the first part of the input is the one made on all of
//! it; a whole request lies inside the buffer; and a connection reading the input in pieces,
//! request after request, decides as it does reading it whole.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use recovea_fuzz::pieces;
use recovea_http1::{Classified, Limits, classify};

const LINES: usize = 16;
/// Small, so that the limits' edges are within the fuzzer's reach.
const LIMITS: Limits = Limits { head_bytes: 2048, body: 1024, unadmitted_body: 256 };

fn classified(buf: &[u8]) -> Classified {
    let decision = classify::<LINES>(buf, LIMITS);
    match &decision {
        Classified::Request(request) => {
            assert!(request.head <= LIMITS.head_bytes);
            assert_eq!(request.body.start, request.head);
            assert!(request.body.end <= buf.len());
            assert!(request.body.len() as u64 <= LIMITS.unadmitted_body);
            // As the gateway builds it: the layout's offsets lie inside the head.
            let head = Bytes::copy_from_slice(&buf[..request.head]);
            let _ = request.layout.target(&head);
            let _ = request.layout.headers(&head);
        }
        Classified::Refuse(refusal) => {
            let _ = refusal.layout.raw_target(buf);
            let _ = refusal.layout.names(buf).count();
        }
        Classified::Partial | Classified::AwaitingBody | Classified::HandOver(_) => {}
    }
    decision
}

/// What a connection decides reading `pieces`: each whole request taken off the buffer in turn,
/// then the decision that ends it (or "not yet" once the input runs out).
fn served(pieces: &[&[u8]]) -> Vec<Classified> {
    let mut buf = Vec::new();
    let mut pieces = pieces.iter();
    let mut decisions = Vec::new();
    loop {
        match classified(&buf) {
            Classified::Request(request) => {
                buf.drain(..request.body.end);
                decisions.push(Classified::Request(request));
            }
            not_yet @ (Classified::Partial | Classified::AwaitingBody) => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => {
                    decisions.push(not_yet);
                    return decisions;
                }
            },
            end => {
                decisions.push(end);
                return decisions;
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let whole = classified(input);
    let cuts: Vec<usize> = if input.len() <= 512 {
        (0..input.len()).collect()
    } else {
        pieces(input).iter().scan(0, |at, piece| Some(std::mem::replace(at, *at + piece.len()))).collect()
    };
    for cut in cuts {
        let part = classified(&input[..cut]);
        assert!(
            matches!(part, Classified::Partial | Classified::AwaitingBody) || part == whole,
            "cut at {cut}: {part:?}, whole: {whole:?}"
        );
    }
    assert_eq!(served(&pieces(input)), served(&[input]));
});
