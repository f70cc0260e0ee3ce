//! Fuzzes the request head and its framing: any bytes, cut anywhere, never panic and read as they
//! do whole (the same head, the same facts or refusal, the same body and end).
#![no_main]

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use recovea_fuzz::pieces;
use recovea_http1::{ChunkError, Decoder, Error, RequestError, RequestFacts, parse_request};

const MAX_HEAD_BYTES: usize = 2048;
const LINES: usize = 16;

#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// The head never completed.
    Incomplete,
    Malformed(Error),
    Head {
        /// The head's parts, and what the `http` types made of them.
        text: String,
        facts: Result<RequestFacts, RequestError>,
        body: Vec<u8>,
        /// Where the body stood once the input ran out, or how its framing broke.
        end: Result<Decoder, ChunkError>,
        rest: Vec<u8>,
    },
}

fn read(pieces: &[&[u8]]) -> Read {
    let mut buf = BytesMut::new();
    let mut pieces = pieces.iter();
    let (text, facts, length) = loop {
        let mut lines = [const { MaybeUninit::uninit() }; LINES];
        match parse_request(&buf, &mut lines, MAX_HEAD_BYTES) {
            Ok(Some(head)) => {
                assert!(head.length <= MAX_HEAD_BYTES && head.length <= buf.len());
                let layout = head.layout();
                let bytes = Bytes::copy_from_slice(&buf[..head.length]);
                let target = layout.target(&bytes).map(|uri| uri.to_string());
                let headers = layout.headers(&bytes).map(|headers| {
                    assert_eq!(headers.len(), head.lines.len());
                    format!("{headers:?}")
                });
                let text = format!(
                    "{} {} {:?} {:?} {target:?} {headers:?}",
                    head.method, head.target, head.version, head.lines
                );
                break (text, head.facts(), head.length);
            }
            Ok(None) => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return Read::Incomplete,
            },
            Err(e) => return Read::Malformed(e),
        }
    };
    let _ = buf.split_to(length);
    let Ok(framing) = facts.map(|facts| facts.framing) else {
        return Read::Head { text, facts, body: Vec::new(), end: Ok(Decoder::Done), rest: Vec::new() };
    };
    let mut decoder = Decoder::new(framing);
    let mut body = Vec::new();
    let end = loop {
        if let Err(e) = drain(&mut decoder, &mut buf, &mut body) {
            break Err(e);
        }
        if decoder.is_done() {
            break Ok(decoder);
        }
        match pieces.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None => break Ok(decoder),
        }
    };
    let mut rest = buf.to_vec();
    for piece in pieces {
        rest.extend_from_slice(piece);
    }
    Read::Head { text, facts, body, end, rest }
}

/// Takes every framing byte and every byte of data `buf` holds.
fn drain(decoder: &mut Decoder, buf: &mut BytesMut, body: &mut Vec<u8>) -> Result<(), ChunkError> {
    loop {
        decoder.skip_framing(buf)?;
        match decoder.take_data(buf) {
            Some(data) => body.extend_from_slice(&data),
            None => return Ok(()),
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let whole = read(&[input]);
    assert_eq!(read(&pieces(input)), whole);
    if input.len() <= 512 {
        assert_eq!(read(&input.chunks(1).collect::<Vec<_>>()), whole);
    }
});
