//! A hand-written walk of a JSON text for the few fields a reader needs, checking the rest as
//! serde_json checks what it skips, and giving up (`None`) wherever it would not read exactly as
//! serde does; the caller then asks serde. Serde's derived visitors spend most of their time on
//! what is skipped (about 4,800 instructions on a 230-byte stream chunk, where the walk needs
//! 2,700), and every chunk of a stream is read.

/// Nesting deeper than this is left to serde (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// The fields (at most eight) of one object read so far: serde refuses an object that repeats one.
#[derive(Default)]
pub(crate) struct Seen(u8);

impl Seen {
    pub(crate) fn first(&mut self, field: usize) -> Option<()> {
        let bit = 1 << field;
        (self.0 & bit == 0).then(|| self.0 |= bit)
    }
}

/// A position in a JSON text. Every method reads one value (or gives up) and leaves the position
/// after it.
pub(crate) struct Walk<'a> {
    text: &'a str,
    at: usize,
}

/// A string's text between its quotes, whether it holds escapes, and how many characters fewer it
/// decodes to than its text has (an escape of two, six or twelve bytes is one character).
pub(crate) struct Str<'a> {
    pub raw: &'a [u8],
    pub escaped: bool,
    shrink: u64,
}

impl<'a> Str<'a> {
    /// The characters the string stands for: its bytes that do not continue a UTF-8 character,
    /// less what its escapes shrink to. (A long text is counted in runs of 255 into a byte, which
    /// vectorizes.)
    pub(crate) fn chars(&self) -> u64 {
        let starts = |run: &[u8]| run.iter().fold(0u8, |n, &byte| n + u8::from((byte as i8) >= -0x40));
        let all = match self.raw.len() {
            ..255 => u64::from(starts(self.raw)),
            _ => self.raw.chunks(255).map(|run| u64::from(starts(run))).sum(),
        };
        all - self.shrink
    }

    /// The text, when it has no escapes (its raw text is then what it stands for).
    pub(crate) fn plain(&self) -> Option<&'a str> {
        std::str::from_utf8(self.raw).ok().filter(|_| !self.escaped)
    }
}

impl<'a> Walk<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, at: 0 }
    }

    /// Nothing but whitespace is left: serde refuses anything else after the value.
    pub(crate) fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// The next byte after whitespace, not taken.
    pub(crate) fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(&byte) = bytes.get(self.at) {
            if byte > b' ' || !matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    pub(crate) fn take(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    pub(crate) fn take_word(&mut self, word: &str) -> Option<()> {
        self.text.as_bytes()[self.at..].starts_with(word.as_bytes()).then(|| self.at += word.len())
    }

    /// An object: `member` reads the value of each key.
    pub(crate) fn object(
        &mut self,
        depth: u32,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.take(b'{')?;
        if self.take(b'}').is_some() {
            return Some(());
        }
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            // An escaped key is left to serde, which compares it decoded.
            let key = self.string()?;
            if key.escaped {
                return None;
            }
            self.take(b':')?;
            member(self, key.raw)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array: `element` reads each element.
    pub(crate) fn array(
        &mut self,
        depth: u32,
        mut element: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.take(b'[')?;
        if self.take(b']').is_some() {
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string, its opening quote next. Gives up at what serde refuses: a control character, an
    /// unknown escape, a `\u` escape of a lone surrogate, no closing quote.
    #[inline(always)]
    pub(crate) fn string(&mut self) -> Option<Str<'a>> {
        let bytes = self.text.as_bytes();
        let start = self.at + 1;
        let mut at = start;
        let mut shrink = 0u64;
        let mut escaped = false;
        loop {
            // Eight bytes at a time while none is special, then byte by byte.
            while let Some(word) = bytes.get(at..at + 8) {
                let special = special_bytes(u64::from_le_bytes(word.try_into().ok()?));
                if special != 0 {
                    at += special.trailing_zeros() as usize / 8;
                    break;
                }
                at += 8;
            }
            match *bytes.get(at)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    let length = escape(&bytes[at..])?;
                    shrink += length as u64 - 1;
                    at += length;
                }
                ..0x20 => return None,
                _ => at += 1,
            }
        }
        self.at = at + 1;
        Some(Str { raw: &bytes[start..at], escaped, shrink })
    }

    /// Any value, checked as serde checks what it ignores.
    pub(crate) fn skip(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(depth, |walk, _| walk.skip(depth + 1)),
            b'[' => self.array(depth, |walk| walk.skip(depth + 1)),
            b't' => self.take_word("true"),
            b'f' => self.take_word("false"),
            b'n' => self.take_word("null"),
            _ => self.number(),
        }
    }

    /// A number by JSON's grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let bytes = self.text.as_bytes();
        let mut at = self.at + usize::from(bytes.get(self.at) == Some(&b'-'));
        match bytes.get(at)? {
            b'0' => at += 1,
            b'1'..=b'9' => at = digits_end(bytes, at),
            _ => return None,
        }
        if bytes.get(at) == Some(&b'.') {
            at = some_digits_end(bytes, at + 1)?;
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1 + usize::from(matches!(bytes.get(at + 1), Some(b'+' | b'-')));
            at = some_digits_end(bytes, at)?;
        }
        self.at = at;
        Some(())
    }

    /// `Option<u64>`: `null`, or a whole number that fits (serde refuses a sign and anything
    /// larger; a fraction or an exponent after the digits is refused by the caller, which expects
    /// `,` or `}` there).
    pub(crate) fn count(&mut self) -> Option<Option<u64>> {
        if self.peek()? == b'n' {
            return self.take_word("null").map(|()| None);
        }
        let bytes = self.text.as_bytes();
        let end = digits_end(bytes, self.at);
        let digits = &bytes[self.at..end];
        if digits.is_empty() || digits.len() > 1 && digits[0] == b'0' {
            return None;
        }
        let mut value = 0u64;
        for digit in digits {
            value = value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        }
        self.at = end;
        Some(Some(value))
    }

    /// `TextChars`: the characters of every string in a value, object keys aside.
    pub(crate) fn text_chars(&mut self, depth: u32) -> Option<u64> {
        let mut total = 0u64;
        match self.peek()? {
            b'"' => return self.string().map(|text| text.chars()),
            b'{' => self.object(depth, |walk, _| {
                total = total.saturating_add(walk.text_chars(depth + 1)?);
                Some(())
            })?,
            b'[' => self.array(depth, |walk| {
                total = total.saturating_add(walk.text_chars(depth + 1)?);
                Some(())
            })?,
            b't' => self.take_word("true")?,
            b'f' => self.take_word("false")?,
            b'n' => self.take_word("null")?,
            // serde parses a number here, and refuses one out of range: left to it.
            _ => return None,
        }
        Some(total)
    }

    /// `Option<T>` of a struct: `null`, or what `read` reads.
    pub(crate) fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' { self.take_word("null").map(|()| None) } else { read(self).map(Some) }
    }

    /// `Option<SumOf<T>>`: `null`, or an array whose elements' characters `element` counts.
    pub(crate) fn sum_of(&mut self, depth: u32, element: fn(&mut Self, u32) -> Option<u64>) -> Option<u64> {
        let mut total = 0u64;
        self.nullable(|walk| {
            walk.array(depth, |walk| {
                total = total.saturating_add(element(walk, depth + 1)?);
                Some(())
            })
        })?;
        Some(total)
    }

    /// A struct whose `fields` count output characters: the sum of what `read` counts for each
    /// (given the field's index in `fields`), the other members skipped.
    pub(crate) fn chars_of_fields(
        &mut self,
        depth: u32,
        fields: &[&[u8]],
        mut read: impl FnMut(&mut Self, usize) -> Option<u64>,
    ) -> Option<u64> {
        let mut chars = 0u64;
        let mut seen = Seen::default();
        self.object(depth, |walk, key| {
            match fields.iter().position(|field| *field == key) {
                Some(field) => {
                    seen.first(field)?;
                    chars = chars.saturating_add(read(walk, field)?);
                }
                None => walk.skip(depth + 1)?,
            }
            Some(())
        })?;
        Some(chars)
    }
}

/// The length of the escape `text` starts with (at its backslash): two bytes, six for `\uXXXX`,
/// twelve for a surrogate pair; `None` where serde refuses it (an unknown letter, bad hex digits,
/// a lone surrogate).
fn escape(text: &[u8]) -> Option<usize> {
    match text.get(1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(2),
        b'u' => match hex4(text.get(2..6)?)? {
            0xD800..=0xDBFF => {
                let low =
                    text.get(6..8).filter(|next| *next == b"\\u").and_then(|_| hex4(text.get(8..12)?))?;
                (0xDC00..=0xDFFF).contains(&low).then_some(12)
            }
            0xDC00..=0xDFFF => None,
            _ => Some(6),
        },
        _ => None,
    }
}

/// Four hex digits' value.
fn hex4(digits: &[u8]) -> Option<u16> {
    digits.iter().try_fold(0u16, |value, digit| Some(value << 4 | (*digit as char).to_digit(16)? as u16))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that is `"`, `\` or a control character: the lowest one
/// set is the first such byte (a borrow may also set bits above it, never below).
fn special_bytes(word: u64) -> u64 {
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGH_BITS;
    zero_in(word ^ (ONES * u64::from(b'"')))
        | zero_in(word ^ (ONES * u64::from(b'\\')))
        | (word.wrapping_sub(ONES * 0x20) & !word & HIGH_BITS)
}

fn digits_end(bytes: &[u8], from: usize) -> usize {
    from + bytes[from.min(bytes.len())..].iter().take_while(|byte| byte.is_ascii_digit()).count()
}

/// The end of one or more digits from `from`.
fn some_digits_end(bytes: &[u8], from: usize) -> Option<usize> {
    let end = digits_end(bytes, from);
    (end > from).then_some(end)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::*;

    proptest! {
        /// Read eight bytes at a time or one by one, a string is as many characters as serde
        /// decodes it to, and the walk gives up only on what serde refuses.
        #[test]
        fn strings_are_counted_as_serde_decodes_them(
            pieces in proptest::collection::vec(
                select(vec![
                    "a", "b c", "\u{e9}", "\u{65e5}", "\u{1f600}", r"\n", r#"\""#, r"\\", r"\u00e9", r"\u00E9",
                    r"\ud83d\ude00", r"\ud83d", r"\ude00", r"\u12", r"\u00g0", "\t", r"\q",
                ]),
                0..40,
            ),
            after in select(vec!["", "\"", ",\"next\":1"]),
        ) {
            let text = format!("\"{}\"{after}", pieces.concat());
            let mut walk = Walk { text: &text, at: 0 };
            let by_serde = serde_json::Deserializer::from_str(&text).into_iter::<String>().next();
            match walk.string() {
                Some(read) => {
                    let decoded = by_serde.and_then(Result::ok).expect("serde reads what the walk reads");
                    prop_assert_eq!(read.chars(), decoded.chars().count() as u64);
                    prop_assert_eq!(walk.at, text.len() - after.len());
                }
                None => prop_assert!(by_serde.is_none_or(|read| read.is_err()), "serde reads {}", text),
            }
        }
    }
}
