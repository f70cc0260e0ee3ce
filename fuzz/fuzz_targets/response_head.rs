//! Fuzzes the response head and chunked decoding: any bytes, cut anywhere, never panic and read as
//! they do whole (the same head, the same body and end), and a final head is seen in a buffer
//! exactly when reading it gives something.
#![no_main]

use bytes::BytesMut;
use http::Method;
use libfuzzer_sys::fuzz_target;
use recovea_fuzz::pieces;
use recovea_http1::{ChunkError, Decoder, Error, final_head_in, parse_response};

const MAX_HEAD_BYTES: usize = 2048;
const LINES: usize = 16;

#[derive(Debug, PartialEq, Eq)]
enum Read {
    Incomplete,
    Refused(Error),
    Answer { head: String, body: Vec<u8>, end: Result<Decoder, ChunkError>, rest: Vec<u8> },
}

fn read(method: &Method, pieces: &[&[u8]]) -> Read {
    let mut buf = BytesMut::new();
    let mut pieces = pieces.iter();
    let head = loop {
        let seen = final_head_in::<LINES>(&buf, MAX_HEAD_BYTES);
        let parsed = parse_response::<LINES>(&mut buf, method, MAX_HEAD_BYTES);
        assert_eq!(seen, !matches!(parsed, Ok(None)), "{parsed:?}");
        match parsed {
            Ok(Some(head)) => break head,
            Ok(None) => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return Read::Incomplete,
            },
            Err(e) => return Read::Refused(e),
        }
    };
    let text =
        format!("{:?} {:?} {:?} {}", head.parts, head.framing, head.keep_alive, head.parts.headers.len());
    let mut decoder = Decoder::new(head.framing);
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
    Read::Answer { head: text, body, end, rest }
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
    let pieces = pieces(input);
    for method in [Method::POST, Method::HEAD] {
        let whole = read(&method, &[input]);
        assert_eq!(read(&method, &pieces), whole);
        if input.len() <= 512 {
            assert_eq!(read(&method, &input.chunks(1).collect::<Vec<_>>()), whole);
        }
    }
    // The chunked decoder alone, on any bytes.
    let decode = |pieces: &[&[u8]]| {
        let mut decoder = Decoder::new(recovea_http1::Framing::Chunked);
        let (mut buf, mut body) = (BytesMut::new(), Vec::new());
        for piece in pieces {
            buf.extend_from_slice(piece);
            if let Err(e) = drain(&mut decoder, &mut buf, &mut body) {
                return (body, Err(e));
            }
            if decoder.is_done() {
                break;
            }
        }
        (body, Ok(decoder))
    };
    assert_eq!(decode(&pieces), decode(&[input]));
});
