//! Byte searches over streamed answers, eight bytes at a time: the SSE reader and the usage-chunk
//! filter look at every byte of every event, and a byte-by-byte loop was a visible share of a
//! stream's cost.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// A high bit in each byte of `word` that is zero. A flagged byte above a true zero may be a false
/// alarm (the subtraction's borrow), never one below it: the lowest flag is always exact.
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

fn each_byte(byte: u8) -> u64 {
    ONES * u64::from(byte)
}

fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..)?.first_chunk::<8>().map(|word| u64::from_le_bytes(*word))
}

/// The first `\n` or `\r`.
pub(crate) fn find_line_end(bytes: &[u8]) -> Option<usize> {
    let (lf, cr) = (each_byte(b'\n'), each_byte(b'\r'));
    let mut at = 0;
    while let Some(word) = word_at(bytes, at) {
        let found = zero_bytes(word ^ lf) | zero_bytes(word ^ cr);
        if found != 0 {
            return Some(at + found.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    bytes[at..].iter().position(|&b| b == b'\n' || b == b'\r').map(|p| at + p)
}

/// The first occurrence of `needle` (at least two bytes); `anchor` is the index of a byte of the
/// needle other than the first that is rare in the haystack, so that few places need comparing.
pub(crate) fn find(haystack: &[u8], needle: &[u8], anchor: usize) -> Option<usize> {
    debug_assert!(0 < anchor && anchor < needle.len());
    let last_start = haystack.len().checked_sub(needle.len())?;
    let (first, other) = (each_byte(needle[0]), each_byte(needle[anchor]));
    let mut at = 0;
    // Eight starts at a time, while the eight bytes at `at + anchor` are in the haystack too.
    while at + 7 <= last_start
        && let (Some(starts), Some(anchors)) = (word_at(haystack, at), word_at(haystack, at + anchor))
    {
        let mut candidates = zero_bytes(starts ^ first) & zero_bytes(anchors ^ other);
        while candidates != 0 {
            let start = at + candidates.trailing_zeros() as usize / 8;
            if haystack[start..].starts_with(needle) {
                return Some(start);
            }
            candidates &= candidates - 1;
        }
        at += 8;
    }
    haystack.get(at..)?.windows(needle.len()).position(|w| w == needle).map(|p| at + p)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn naive(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn finds_at_every_offset_and_across_words() {
        for len in 0..40 {
            for at in 0..len {
                let mut bytes = vec![b'x'; len];
                bytes[at] = b'\r';
                assert_eq!(find_line_end(&bytes), Some(at));
                if at + 7 <= len {
                    bytes[at..at + 7].copy_from_slice(b"\"usage\"");
                    assert_eq!(find(&bytes, b"\"usage\"", 4), Some(at), "{len} {at}");
                }
            }
            assert_eq!(find_line_end(&vec![b'x'; len]), None);
            assert_eq!(find(&vec![b'"'; len], b"\"usage\"", 4), None);
        }
        // A zero byte's borrow must not hide or invent a match.
        assert_eq!(find_line_end(b"\x00\x01\x0b\x0c\x0e\n"), Some(5));
        assert_eq!(find(b"\x00\"u\x00\"usage\"", b"\"usage\"", 4), Some(4));
    }

    proptest! {
        #[test]
        fn searches_agree_with_the_obvious_ones(
            pieces in prop::collection::vec(
                prop::sample::select(vec![
                    &b"\"usage\""[..], b"\"usag", b"usage\"", b"\"", b"g", b"\n", b"\r", b"\x00", b"\x01", b"xyz",
                ]),
                0..24,
            ),
        ) {
            let bytes = pieces.concat();
            prop_assert_eq!(find_line_end(&bytes), bytes.iter().position(|&b| b == b'\n' || b == b'\r'));
            prop_assert_eq!(find(&bytes, b"\"usage\"", 4), naive(&bytes, b"\"usage\""));
            prop_assert_eq!(find(&bytes, b"us", 1), naive(&bytes, b"us"));
        }
    }
}
