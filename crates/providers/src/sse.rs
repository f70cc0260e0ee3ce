//! Incremental Server-Sent Events parsing: bytes in whatever chunks they arrive, events out.

use std::borrow::Cow;

/// The largest event [`SseReader::new`] keeps; a bigger one is dropped whole rather than grown
/// without bound.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 << 20;

/// After an unusually large event, the buffers give their memory back rather than keep it for the
/// whole stream.
const RETAINED_CAPACITY: usize = 64 << 10;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event, borrowed from the reader until the callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field; `None` when absent or empty (the spec's default type, `message`).
    pub event: Option<&'a str>,
    /// The `data:` lines joined with `\n`.
    pub data: &'a str,
}

/// An incremental parser following the WHATWG event-stream rules: `\n`, `\r\n` and `\r` line ends,
/// comments, one optional space after the colon, a leading BOM, events without data not dispatched.
/// `id` and `retry` are ignored: a proxy has no reconnection to manage.
#[derive(Debug)]
pub struct SseReader {
    /// The current line, when a chunk ended in the middle of it.
    line: Vec<u8>,
    data: Vec<u8>,
    event: Vec<u8>,
    has_data: bool,
    /// The previous chunk ended with `\r`: a `\n` opening the next one belongs to that line end.
    after_cr: bool,
    at_stream_start: bool,
    /// The current event outgrew the cap: its bytes are dropped up to the blank line that ends it.
    skipping: bool,
    /// While skipping: the current (dropped) line is not empty, so its end is not the event's end.
    skipped_line_has_bytes: bool,
    max_event_bytes: usize,
}

impl Default for SseReader {
    fn default() -> Self {
        Self::new()
    }
}

impl SseReader {
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A reader that drops any event whose fields exceed `max_event_bytes` in total.
    pub fn with_max_event_bytes(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            event: Vec::new(),
            has_data: false,
            after_cr: false,
            at_stream_start: true,
            skipping: false,
            skipped_line_has_bytes: false,
            max_event_bytes,
        }
    }

    /// Feeds the next bytes of the stream; `on_event` sees each event they complete, in order.
    pub fn push(&mut self, chunk: &[u8], mut on_event: impl FnMut(&SseEvent<'_>)) {
        let mut rest = chunk;
        if rest.is_empty() {
            return;
        }
        if std::mem::take(&mut self.after_cr) && rest[0] == b'\n' {
            rest = &rest[1..];
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', rest) {
            let (line, tail) = rest.split_at(end);
            let mut next = &tail[1..];
            if tail[0] == b'\r' {
                match next.first() {
                    Some(b'\n') => next = &next[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            self.end_line(line, &mut on_event);
            rest = next;
        }
        self.hold_partial_line(rest);
    }

    /// Ends the stream: an event whose blank line never came is dispatched if it has data. The spec
    /// drops it, but a provider's final usage event cut just before its blank line is still whole
    /// JSON, and a truncated one simply fails to parse.
    pub fn finish(&mut self, mut on_event: impl FnMut(&SseEvent<'_>)) {
        if !self.line.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.line);
            self.field(&line, &mut on_event);
        }
        if !self.skipping {
            self.dispatch(&mut on_event);
        }
        *self = Self::with_max_event_bytes(self.max_event_bytes);
    }

    fn hold_partial_line(&mut self, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        if self.skipping {
            self.skipped_line_has_bytes = true;
            return;
        }
        if self.event_bytes() + self.line.len() + part.len() > self.max_event_bytes {
            self.start_skipping();
            self.skipped_line_has_bytes = true;
            return;
        }
        self.line.extend_from_slice(part);
    }

    fn end_line(&mut self, tail: &[u8], on_event: &mut impl FnMut(&SseEvent<'_>)) {
        if self.skipping {
            let blank = tail.is_empty() && !self.skipped_line_has_bytes;
            self.skipped_line_has_bytes = false;
            if blank {
                self.skipping = false;
            }
            return;
        }
        // The same test as for a partial line, on the whole line, so that where chunks split the
        // stream never changes which events are dropped.
        if self.event_bytes() + self.line.len() + tail.len() > self.max_event_bytes {
            self.start_skipping();
        } else if self.line.is_empty() {
            self.field(tail, on_event);
        } else {
            let mut line = std::mem::take(&mut self.line);
            line.extend_from_slice(tail);
            self.field(&line, on_event);
            line.clear();
            self.line = line;
        }
    }

    /// Interprets one complete line.
    fn field(&mut self, line: &[u8], on_event: &mut impl FnMut(&SseEvent<'_>)) {
        let line = if std::mem::take(&mut self.at_stream_start) {
            line.strip_prefix(BOM).unwrap_or(line)
        } else {
            line
        };
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match name {
            // No size check here: the line as a whole passed one, and a field stores less than its line.
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&SseEvent<'_>)) {
        if self.has_data {
            let (data, event) = (utf8(&self.data), utf8(&self.event));
            on_event(&SseEvent { event: (!event.is_empty()).then_some(&*event), data: &data });
        }
        self.reset_event();
    }

    fn event_bytes(&self) -> usize {
        self.data.len() + self.event.len()
    }

    fn start_skipping(&mut self) {
        self.reset_event();
        self.line.clear();
        self.line.shrink_to(RETAINED_CAPACITY);
        self.skipping = true;
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.data.shrink_to(RETAINED_CAPACITY);
        self.event.clear();
        self.event.shrink_to(RETAINED_CAPACITY);
        self.has_data = false;
    }
}

/// `String::from_utf8_lossy`, which checks byte by byte; `str::from_utf8` skips ASCII a word at a
/// time, so valid text (nearly every event) is checked that way first.
fn utf8(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(reader: &mut SseReader, chunks: &[&[u8]]) -> Vec<(Option<String>, String)> {
        let mut out = Vec::new();
        for chunk in chunks {
            reader.push(chunk, |e| out.push((e.event.map(str::to_owned), e.data.to_owned())));
        }
        out
    }

    fn all(stream: &[u8]) -> Vec<(Option<String>, String)> {
        events(&mut SseReader::new(), &[stream])
    }

    fn ev(event: Option<&str>, data: &str) -> (Option<String>, String) {
        (event.map(str::to_owned), data.to_owned())
    }

    #[test]
    fn parses_fields_comments_and_multiline_data() {
        let stream = b": keep-alive\nevent: message_start\ndata: {\"a\":1}\n\ndata:first\ndata:  second\nid: 7\nretry: 10\n\n";
        assert_eq!(all(stream), vec![ev(Some("message_start"), "{\"a\":1}"), ev(None, "first\n second")]);
    }

    #[test]
    fn events_without_data_are_not_dispatched_and_empty_data_is() {
        assert_eq!(all(b"event: ping\n\ndata\n\ndata:\ndata:\n\n"), vec![ev(None, ""), ev(None, "\n")]);
    }

    #[test]
    fn event_type_resets_after_each_event() {
        assert_eq!(all(b"event: a\ndata: 1\n\ndata: 2\n\n"), vec![ev(Some("a"), "1"), ev(None, "2")]);
    }

    #[test]
    fn incomplete_event_waits_for_its_blank_line() {
        let mut reader = SseReader::new();
        assert!(events(&mut reader, &[b"data: 1\n"]).is_empty());
        assert_eq!(events(&mut reader, &[b"\n"]), vec![ev(None, "1")]);
    }

    #[test]
    fn cr_split_from_its_lf_is_one_line_end() {
        let mut reader = SseReader::new();
        assert_eq!(
            events(&mut reader, &[b"data: 1\r", b"\n\r", b"\ndata: 2\r", b"\r"]),
            vec![ev(None, "1"), ev(None, "2")]
        );
    }

    #[test]
    fn leading_bom_is_stripped_once() {
        assert_eq!(all(b"\xEF\xBB\xBFdata: 1\n\n\xEF\xBB\xBFdata: 2\n\n"), vec![ev(None, "1")]);
    }

    #[test]
    fn utf8_split_inside_a_character_is_rejoined() {
        let stream = "data: héllo ✓\n\n".as_bytes();
        let mut reader = SseReader::new();
        let pieces: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events(&mut reader, &pieces), vec![ev(None, "héllo ✓")]);
    }

    #[test]
    fn oversized_event_is_dropped_and_the_next_one_kept() {
        let mut reader = SseReader::with_max_event_bytes(16);
        let big = b"data: 0123456789abcdefghij\ndata: more\n\ndata: ok\n\n";
        let pieces: Vec<&[u8]> = big.chunks(3).collect();
        assert_eq!(events(&mut reader, &pieces), vec![ev(None, "ok")]);
        assert_eq!(events(&mut SseReader::with_max_event_bytes(16), &[big]), vec![ev(None, "ok")]);
        let many_lines = b"data: 0123\ndata: 4567\ndata: 89ab\ndata: cdef\n\ndata: ok\n\n";
        assert_eq!(events(&mut SseReader::with_max_event_bytes(16), &[many_lines]), vec![ev(None, "ok")]);
    }

    #[test]
    fn finish_dispatches_a_trailing_event_with_data() {
        let mut reader = SseReader::new();
        let mut out = Vec::new();
        reader.push(b"data: 1\n\ndata: {\"usage\":1}", |e| out.push(e.data.to_owned()));
        reader.finish(|e| out.push(e.data.to_owned()));
        assert_eq!(out, ["1", "{\"usage\":1}"]);
        let mut nothing = Vec::new();
        reader.finish(|e| nothing.push(e.data.to_owned()));
        assert!(nothing.is_empty());
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(all(b"data: a\xFFb\n\n"), vec![ev(None, "a\u{FFFD}b")]);
    }
}
