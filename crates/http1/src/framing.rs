//! How a body is delimited on the wire (RFC 9112, section 6): the one `Content-Length` rule, the one
//! transfer-coding rule, and the decoder that takes a body off a buffer as its bytes arrive.

use bytes::{Bytes, BytesMut};

use crate::elements;
use crate::error::{ChunkError, FramingError};

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all (a request without length, a `204`, an answer to `HEAD`).
    None,
    /// `Content-Length`: exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// A response body that ends when the connection does.
    UntilClose,
}

/// The `Content-Length` rule, over the values of every `Content-Length` line in order: one line
/// holding one decimal number (leading zeros allowed), or none. `5, 5` and two lines of `5` are
/// refused (see [`FramingError::LengthRepeated`]).
pub fn content_length<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Result<Option<u64>, FramingError> {
    let mut rule = LengthRule::default();
    for value in values {
        rule.line(value);
    }
    rule.finish()
}

/// [`content_length`], a line at a time, for a caller that reads every header line once.
#[derive(Debug, Default)]
pub(crate) struct LengthRule {
    lines: u32,
    value: Option<Result<u64, FramingError>>,
}

impl LengthRule {
    pub(crate) fn line(&mut self, value: &[u8]) {
        self.lines = self.lines.saturating_add(1);
        if self.lines == 1 {
            self.value = Some(decimal(value));
        }
    }

    pub(crate) fn is_present(&self) -> bool {
        self.lines > 0
    }

    pub(crate) fn finish(self) -> Result<Option<u64>, FramingError> {
        if self.lines > 1 {
            return Err(FramingError::LengthRepeated);
        }
        self.value.transpose()
    }
}

/// One `Content-Length` value: digits only (RFC 9110, section 8.6), no more than fit in 64 bits.
fn decimal(value: &[u8]) -> Result<u64, FramingError> {
    if value.contains(&b',') {
        return Err(FramingError::LengthRepeated);
    }
    if value.is_empty() {
        return Err(FramingError::LengthInvalid);
    }
    value.iter().try_fold(0u64, |n, &digit| {
        if !digit.is_ascii_digit() {
            return Err(FramingError::LengthInvalid);
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(digit - b'0')))
            .ok_or(FramingError::LengthInvalid)
    })
}

/// The transfer-coding rule, a `Transfer-Encoding` line at a time: the codings must be `chunked`
/// alone, once. A body whose end cannot be found (chunked not last, or twice) is a framing error
/// before it is an unsupported coding.
#[derive(Debug, Default)]
pub(crate) struct CodingRule {
    lines: u32,
    chunked: u32,
    chunked_last: bool,
    other: bool,
}

impl CodingRule {
    pub(crate) fn line(&mut self, value: &[u8]) {
        self.lines = self.lines.saturating_add(1);
        for coding in elements(value) {
            if coding.eq_ignore_ascii_case(b"chunked") {
                self.chunked = self.chunked.saturating_add(1);
                self.chunked_last = true;
            } else {
                self.other = true;
                self.chunked_last = false;
            }
        }
    }

    /// `Ok(true)` for a chunked body, `Ok(false)` without any `Transfer-Encoding` line.
    pub(crate) fn finish(&self) -> Result<bool, FramingError> {
        if self.lines == 0 {
            Ok(false)
        } else if !self.chunked_last {
            Err(FramingError::ChunkedNotLast)
        } else if self.chunked > 1 {
            Err(FramingError::ChunkedRepeated)
        } else if self.other {
            Err(FramingError::CodingUnsupported)
        } else {
            Ok(true)
        }
    }
}

/// A chunk-size or trailer line longer than this is refused.
pub const MAX_CHUNK_LINE_BYTES: usize = 4 << 10;

/// Where the reading of a body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// This many bytes of body are still to come.
    Length(u64),
    Chunked(ChunkState),
    /// The body ends when the connection does.
    UntilClose,
    Done,
}

/// Where the reading of a chunked body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// Trailer lines are next, up to an empty line.
    Trailers,
}

impl Decoder {
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::None | Framing::Length(0) => Self::Done,
            Framing::Length(length) => Self::Length(length),
            Framing::Chunked => Self::Chunked(ChunkState::Size),
            Framing::UntilClose => Self::UntilClose,
        }
    }

    pub fn is_done(&self) -> bool {
        *self == Self::Done
    }

    /// How many bytes of body are still to come, when that is known.
    pub fn exact_remaining(&self) -> Option<u64> {
        match self {
            Self::Length(remaining) => Some(*remaining),
            Self::Done => Some(0),
            Self::Chunked(_) | Self::UntilClose => None,
        }
    }

    /// Takes the framing bytes at the start of `buf` (chunk sizes, the CRLFs after chunks, trailers)
    /// as far as `buf` goes: it stops at data, at the end of the body, or where more bytes are
    /// needed. Malformed framing is an error, and the same error again at the next call: nothing of
    /// it is taken.
    pub fn skip_framing(&mut self, buf: &mut BytesMut) -> Result<(), ChunkError> {
        while let Self::Chunked(state) = self {
            match *state {
                ChunkState::Data(_) => return Ok(()),
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(());
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ChunkError::DataUnterminated);
                    }
                    let _ = buf.split_to(2);
                    *state = ChunkState::Size;
                }
                ChunkState::Size => {
                    let Some(length) = line_length(buf)? else { return Ok(()) };
                    let size = chunk_size(&buf[..length])?;
                    let _ = buf.split_to(length + 2);
                    *state = if size == 0 { ChunkState::Trailers } else { ChunkState::Data(size) };
                }
                ChunkState::Trailers => {
                    let Some(length) = line_length(buf)? else { return Ok(()) };
                    let _ = buf.split_to(length + 2);
                    if length == 0 {
                        *self = Self::Done;
                    }
                }
            }
        }
        Ok(())
    }

    /// The body data at the start of `buf`, as far as it goes, taken off it (sharing its bytes).
    pub fn take_data(&mut self, buf: &mut BytesMut) -> Option<Bytes> {
        if buf.is_empty() {
            return None;
        }
        let (remaining, then) = match self {
            Self::Length(remaining) => (remaining, Self::Done),
            Self::Chunked(ChunkState::Data(remaining)) => (remaining, Self::Chunked(ChunkState::DataEnd)),
            Self::UntilClose => return Some(buf.split().freeze()),
            Self::Chunked(_) | Self::Done => return None,
        };
        let n = usize::try_from(*remaining).unwrap_or(usize::MAX).min(buf.len());
        *remaining -= n as u64;
        if *remaining == 0 {
            *self = then;
        }
        Some(buf.split_to(n).freeze())
    }
}

/// The length of the CRLF-terminated line at the start of `buf`, without its CRLF; `None` while it
/// may still come. Only the first [`MAX_CHUNK_LINE_BYTES`] and its CRLF are looked at, so that a
/// line is too long however the bytes were cut (a CR read without its LF included).
fn line_length(buf: &[u8]) -> Result<Option<usize>, ChunkError> {
    let window = &buf[..buf.len().min(MAX_CHUNK_LINE_BYTES + 2)];
    match memchr::memmem::find(window, b"\r\n") {
        Some(length) => Ok(Some(length)),
        None if window.len() < MAX_CHUNK_LINE_BYTES + 2 => Ok(None),
        None => Err(ChunkError::LineTooLong),
    }
}

/// The hexadecimal size at the start of a chunk-size line: spaces or tabs may follow it, then an
/// extension (`;...`, ignored, without control characters) or nothing.
fn chunk_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let rest = &rest[rest.iter().take_while(|&&b| b == b' ' || b == b'\t').count()..];
    let extension_ok = match rest.split_first() {
        None => true,
        Some((b';', extension)) => !extension.iter().any(|&b| b.is_ascii_control() && b != b'\t'),
        Some(_) => false,
    };
    if digits == 0 || !extension_ok {
        return Err(ChunkError::SizeMalformed);
    }
    line[..digits].iter().try_fold(0u64, |size, &digit| {
        let value = u64::from((digit as char).to_digit(16).ok_or(ChunkError::SizeMalformed)?);
        size.checked_mul(16).and_then(|size| size.checked_add(value)).ok_or(ChunkError::SizeMalformed)
    })
}

/// A chunk's size line, written into `out`: its length in hexadecimal (upper case, as hyper writes
/// it) and CRLF.
pub fn chunk_size_line(out: &mut [u8; 18], len: usize) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut at = out.len() - 2;
    out[at..].copy_from_slice(b"\r\n");
    let mut n = len;
    loop {
        at -= 1;
        out[at] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            return &out[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The data a body gave, and what was left in the buffer after it.
    type ReadBack = (Vec<u8>, Vec<u8>);

    /// Feeds `wire` to `decoder` in pieces cut at `cuts`, as reads would; the data it gives, and
    /// what is left in the buffer once it is done (`None` if it is still waiting for more).
    fn read_body(mut decoder: Decoder, wire: &[u8], cuts: &[usize]) -> Result<Option<ReadBack>, ChunkError> {
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut fed = 0;
        for piece in crate::cut_at(wire, cuts.iter().copied()) {
            buf.extend_from_slice(piece);
            fed += piece.len();
            loop {
                decoder.skip_framing(&mut buf)?;
                match decoder.take_data(&mut buf) {
                    Some(piece) => data.extend_from_slice(&piece),
                    None => break,
                }
            }
            if decoder.is_done() {
                buf.extend_from_slice(&wire[fed..]);
                return Ok(Some((data, buf.to_vec())));
            }
        }
        Ok(None)
    }

    /// `body` in chunks of the given sizes (the rest in one more), with extensions and trailers.
    fn chunked(body: &[u8], sizes: &[usize], extension: bool, upper: bool, trailers: usize) -> Vec<u8> {
        let mut wire = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().copied().chain(std::iter::once(usize::MAX));
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(usize::MAX).clamp(1, rest.len());
            let size = if upper { format!("{n:X}") } else { format!("{n:x}") };
            wire.extend_from_slice(size.as_bytes());
            if extension {
                wire.extend_from_slice(b" ;name=\"value\"");
            }
            wire.extend_from_slice(b"\r\n");
            wire.extend_from_slice(&rest[..n]);
            wire.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        wire.extend_from_slice(b"0\r\n");
        for i in 0..trailers {
            wire.extend_from_slice(format!("x-trailer-{i}: {i}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        wire
    }

    proptest! {
        #[test]
        fn a_chunked_body_reads_back_whole_however_it_is_cut(
            body in proptest::collection::vec(any::<u8>(), 0..3000),
            sizes in proptest::collection::vec(1usize..700, 0..8),
            cuts in proptest::collection::vec(0usize..4000, 0..12),
            extension in any::<bool>(),
            upper in any::<bool>(),
            trailers in 0usize..3,
        ) {
            let mut wire = chunked(&body, &sizes, extension, upper, trailers);
            wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            let (data, left) = read_body(Decoder::new(Framing::Chunked), &wire, &cuts).expect("read").expect("done");
            prop_assert_eq!(data, body);
            prop_assert_eq!(left, b"HTTP/1.1 200 OK\r\n".to_vec());
        }

        #[test]
        fn a_body_of_known_length_reads_back_whole_and_nothing_past_it(
            body in proptest::collection::vec(any::<u8>(), 1..3000),
            cuts in proptest::collection::vec(0usize..4000, 0..12),
        ) {
            let mut wire = body.clone();
            wire.extend_from_slice(b"next");
            let (data, left) = read_body(Decoder::new(Framing::Length(body.len() as u64)), &wire, &cuts).expect("read").expect("done");
            prop_assert_eq!(data, body);
            prop_assert_eq!(left, b"next".to_vec());
        }

        /// Any bytes at all, valid framing or not: cut anywhere, the same data, then the same end
        /// (done, waiting, or the same error).
        #[test]
        fn any_chunked_bytes_read_alike_however_they_are_cut(
            wire in proptest::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'0'), Just(b'5'), Just(b'a'), Just(b';'), Just(b' '), any::<u8>()],
                0..200,
            ),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let whole = read_body(Decoder::new(Framing::Chunked), &wire, &[]);
            let cut = read_body(Decoder::new(Framing::Chunked), &wire, &cuts);
            prop_assert_eq!(cut, whole);
        }
    }

    #[test]
    fn malformed_chunk_framing_is_an_error_however_it_is_cut() {
        let long_line = format!("1;{}", "x".repeat(MAX_CHUNK_LINE_BYTES + 1));
        let cases: [(&[u8], ChunkError); 8] = [
            (b"zz\r\nhello\r\n0\r\n\r\n", ChunkError::SizeMalformed),
            (b"5\r\nhelloXX0\r\n\r\n", ChunkError::DataUnterminated),
            (b"10000000000000000\r\n", ChunkError::SizeMalformed),
            (b"5 junk\r\nhello\r\n0\r\n\r\n", ChunkError::SizeMalformed),
            (b"\r\nhello\r\n0\r\n\r\n", ChunkError::SizeMalformed),
            (b"5;a\nb\r\nhello\r\n0\r\n\r\n", ChunkError::SizeMalformed),
            (b"5;a\x0bb\r\nhello\r\n0\r\n\r\n", ChunkError::SizeMalformed),
            (long_line.as_bytes(), ChunkError::LineTooLong),
        ];
        for (wire, error) in cases {
            for cut in [0, 1, 3, wire.len()] {
                let read = read_body(Decoder::new(Framing::Chunked), wire, &[cut]);
                assert_eq!(read, Err(error), "{:?} cut at {cut}", String::from_utf8_lossy(wire));
            }
        }
    }

    /// A line of the longest length allowed, its CR read before its LF, is not too long.
    #[test]
    fn the_longest_chunk_line_allowed_reads_whole_or_cut_before_its_lf() {
        let mut wire =
            format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE_BYTES - 2)).into_bytes();
        let lf = MAX_CHUNK_LINE_BYTES + 1;
        assert_eq!(wire[lf], b'\n');
        for cuts in [&[][..], &[lf], &[lf - 1, lf]] {
            let read = read_body(Decoder::new(Framing::Chunked), &wire, cuts).expect("valid").expect("done");
            assert_eq!(read, (b"hello".to_vec(), Vec::new()), "{cuts:?}");
        }
        wire.insert(0, b'0');
        assert_eq!(read_body(Decoder::new(Framing::Chunked), &wire, &[lf]), Err(ChunkError::LineTooLong));
    }

    #[test]
    fn chunk_sizes_may_have_leading_zeros_and_trailing_blanks() {
        let wire = b"0005 \t;ext=\"v\"\r\nhello\r\n000000000000000006\t\r\n world\r\n0 \r\n\r\n";
        let read = read_body(Decoder::new(Framing::Chunked), wire, &[]).expect("valid").expect("done");
        assert_eq!(read, (b"hello world".to_vec(), Vec::new()));
    }

    #[test]
    fn malformed_framing_stays_an_error_at_the_next_call() {
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"2\r\nhiXX"[..]);
        decoder.skip_framing(&mut buf).expect("size line");
        assert_eq!(decoder.take_data(&mut buf).as_deref(), Some(&b"hi"[..]));
        assert_eq!(decoder.skip_framing(&mut buf), Err(ChunkError::DataUnterminated));
        assert_eq!(decoder.skip_framing(&mut buf), Err(ChunkError::DataUnterminated), "nothing was taken");
    }

    #[test]
    fn a_body_until_close_takes_everything_and_no_body_is_done_at_once() {
        let mut decoder = Decoder::new(Framing::UntilClose);
        let mut buf = BytesMut::from(&b"all of it"[..]);
        assert_eq!(decoder.take_data(&mut buf).as_deref(), Some(&b"all of it"[..]));
        assert_eq!(decoder.exact_remaining(), None);
        for framing in [Framing::None, Framing::Length(0)] {
            assert!(Decoder::new(framing).is_done(), "{framing:?}");
            assert_eq!(Decoder::new(framing).exact_remaining(), Some(0));
        }
        assert_eq!(Decoder::new(Framing::Length(7)).exact_remaining(), Some(7));
    }

    #[test]
    fn content_length_is_one_line_of_digits_that_fit() {
        let one = |value: &'static [u8]| content_length([value]);
        assert_eq!(content_length([]), Ok(None));
        assert_eq!(one(b"0"), Ok(Some(0)));
        assert_eq!(one(b"0012"), Ok(Some(12)));
        assert_eq!(one(b"18446744073709551615"), Ok(Some(u64::MAX)));
        for bad in [&b""[..], b"+1", b"-1", b" 1", b"1 ", b"0x10", b"18446744073709551616", b"1e3"] {
            assert_eq!(one(bad), Err(FramingError::LengthInvalid), "{:?}", String::from_utf8_lossy(bad));
        }
        for repeated in [&b"5, 5"[..], b"5,5", b"5,", b",5", b"5, 6"] {
            assert_eq!(
                one(repeated),
                Err(FramingError::LengthRepeated),
                "{:?}",
                String::from_utf8_lossy(repeated)
            );
        }
        assert_eq!(content_length([&b"5"[..], b"5"]), Err(FramingError::LengthRepeated));
        assert_eq!(content_length([&b"x"[..], b"5"]), Err(FramingError::LengthRepeated));
    }

    fn codings(lines: &[&str]) -> Result<bool, FramingError> {
        let mut rule = CodingRule::default();
        for line in lines {
            rule.line(line.as_bytes());
        }
        rule.finish()
    }

    #[test]
    fn chunked_is_the_only_transfer_coding() {
        assert_eq!(codings(&[]), Ok(false));
        for chunked in [&["chunked"][..], &["Chunked"], &[" chunked ,"], &["", "chunked"]] {
            assert_eq!(codings(chunked), Ok(true), "{chunked:?}");
        }
        for unsupported in
            [&["gzip, chunked"][..], &["identity, chunked"], &["gzip", "chunked"], &["x-custom,chunked"]]
        {
            assert_eq!(codings(unsupported), Err(FramingError::CodingUnsupported), "{unsupported:?}");
        }
        for not_last in [&["gzip"][..], &["chunked, gzip"], &["chunked", "gzip"], &[""], &["chunked;x=1"]] {
            assert_eq!(codings(not_last), Err(FramingError::ChunkedNotLast), "{not_last:?}");
        }
        for twice in [&["chunked, chunked"][..], &["chunked", "chunked"], &["gzip, chunked, chunked"]] {
            assert_eq!(codings(twice), Err(FramingError::ChunkedRepeated), "{twice:?}");
        }
    }

    #[test]
    fn chunk_size_lines_are_hexadecimal() {
        let mut out = [0; 18];
        assert_eq!(chunk_size_line(&mut out, 0), b"0\r\n");
        assert_eq!(chunk_size_line(&mut out, 255), b"FF\r\n");
        assert_eq!(chunk_size_line(&mut out, 4096), b"1000\r\n");
        assert_eq!(chunk_size_line(&mut out, usize::MAX), b"FFFFFFFFFFFFFFFF\r\n");
    }
}
