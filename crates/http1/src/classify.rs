//! What to do with the request at the start of a buffer: serve it as it stands, wait for more of
//! it, refuse it, or hand its connection to a fuller server, decided on the bytes alone.

use std::mem::MaybeUninit;
use std::ops::Range;

use http::{Method, Version};

use crate::error::{Error, RequestError};
use crate::framing::Framing;
use crate::request::{HeadLayout, parse_request};

/// How an HTTP/2 connection with prior knowledge opens: not a request line `httparse` reads.
pub const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// The caller's bounds on what it serves itself; what lies beyond them is handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A head longer than this is [`HandOver::HeadTooLong`] however its bytes arrived.
    pub head_bytes: usize,
    /// A declared body longer than this is [`HandOver::BodyTooLarge`]: the caller refuses it unread.
    pub body: u64,
    /// A declared body longer than this (and within `body`) is [`HandOver::LargeBody`]: the caller
    /// reads it later, elsewhere.
    pub unadmitted_body: u64,
}

/// What the bytes at the start of a buffer are, as far as serving them goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// A whole HTTP/1.1 request, head and body, of a kind the caller serves itself.
    Request(WholeRequest),
    /// The head is not whole yet.
    Partial,
    /// The head is whole and within every limit, its body not yet.
    AwaitingBody,
    /// A head that breaks the rules requests are held to ([`crate::request_facts`]): answered, never
    /// served nor handed over.
    Refuse(Refusal),
    /// Something to leave to a fuller server, with every byte read so far.
    HandOver(HandOver),
}

/// A whole HTTP/1.1 request at the start of the buffer: the head is `..head`, the body `body`
/// (which starts at `head`), and what follows `body.end` is the next request's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholeRequest {
    /// Never `HEAD` nor `CONNECT`.
    pub method: Method,
    /// Where the target and the header lines lie in the head.
    pub layout: HeadLayout,
    /// The head's length, its empty line included.
    pub head: usize,
    /// Where the body lies in the buffer: exactly its declared length, empty without one.
    pub body: Range<usize>,
    /// The connection ends after the answer ([`crate::RequestFacts::close`]).
    pub close: bool,
}

/// A head refused, with what the caller needs to shape its answer: the target and the header
/// lines, found in the buffer through `layout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: RequestError,
    pub layout: HeadLayout,
}

/// Why a connection is left to a fuller server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// `Transfer-Encoding: chunked`.
    ChunkedBody,
    /// A declared length over [`Limits::body`].
    BodyTooLarge,
    /// A declared length over [`Limits::unadmitted_body`].
    LargeBody,
    /// An `Expect` line.
    Expect,
    /// An `Upgrade` line, or `upgrade` in `Connection`.
    Upgrade,
    /// An HTTP/1.0 request.
    Http10,
    /// `HEAD` (whose answer has no body) or `CONNECT` (a tunnel).
    HeadOrConnect,
    /// The HTTP/2 preface ([`HTTP2_PREFACE`]).
    Http2,
    /// A head longer than [`Limits::head_bytes`].
    HeadTooLong,
    /// A head with more than `LINES` header lines.
    TooManyLines,
    /// A head that does not parse.
    Unparsable,
}

/// What the request at the start of `buf` is, reading at most `LINES` header lines and
/// [`Limits::head_bytes`] of its head. No I/O and nothing taken off `buf`; the only allocation is a
/// whole or refused head's [`HeadLayout`]. A decision other than `Partial` or `AwaitingBody` is
/// the same for every longer `buf` that starts with the same bytes, so that reads may cut the
/// input anywhere.
pub fn classify<const LINES: usize>(buf: &[u8], limits: Limits) -> Classified {
    if buf.is_empty() {
        return Classified::Partial;
    }
    let mut lines = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; LINES];
    let head = match parse_request(buf, &mut lines, limits.head_bytes) {
        Ok(Some(head)) => head,
        Ok(None) => return Classified::Partial,
        Err(Error::HeadTooLong) => return Classified::HandOver(HandOver::HeadTooLong),
        Err(Error::Malformed(httparse::Error::TooManyHeaders)) => {
            return Classified::HandOver(HandOver::TooManyLines);
        }
        Err(_) if buf.starts_with(HTTP2_PREFACE) => return Classified::HandOver(HandOver::Http2),
        // `PRI * HTTP/2` fails to parse before the preface is whole: what it is, its rest says.
        Err(_) if HTTP2_PREFACE.starts_with(buf) => return Classified::Partial,
        Err(_) => return Classified::HandOver(HandOver::Unparsable),
    };
    if head.version != Version::HTTP_11 {
        return Classified::HandOver(HandOver::Http10);
    }
    let Ok(method) = Method::from_bytes(head.method.as_bytes()) else {
        return Classified::HandOver(HandOver::Unparsable);
    };
    if method == Method::HEAD || method == Method::CONNECT {
        return Classified::HandOver(HandOver::HeadOrConnect);
    }
    let facts = match head.facts() {
        Ok(facts) => facts,
        Err(error) => return Classified::Refuse(Refusal { error, layout: head.layout() }),
    };
    let declared = match facts.framing {
        Framing::Length(length) => length,
        Framing::None | Framing::UntilClose => 0,
        Framing::Chunked => return Classified::HandOver(HandOver::ChunkedBody),
    };
    if facts.expect {
        return Classified::HandOver(HandOver::Expect);
    }
    if facts.upgrade {
        return Classified::HandOver(HandOver::Upgrade);
    }
    if declared > limits.body {
        return Classified::HandOver(HandOver::BodyTooLarge);
    }
    if declared > limits.unadmitted_body {
        return Classified::HandOver(HandOver::LargeBody);
    }
    let arrived = buf.len() - head.length;
    // `declared` fits once it is at most `arrived`, a length in memory.
    let body = match usize::try_from(declared) {
        Ok(declared) if declared <= arrived => head.length..head.length + declared,
        _ => return Classified::AwaitingBody,
    };
    Classified::Request(WholeRequest {
        method,
        layout: head.layout(),
        head: head.length,
        body,
        close: facts.close,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::error::{FramingError, HostError};

    const LINES: usize = 8;
    const LIMITS: Limits = Limits { head_bytes: 256, body: 1024, unadmitted_body: 64 };

    fn classified(wire: &[u8]) -> Classified {
        classify::<LINES>(wire, LIMITS)
    }

    fn whole(wire: &[u8]) -> WholeRequest {
        match classified(wire) {
            Classified::Request(request) => request,
            other => panic!("not a whole request: {other:?}"),
        }
    }

    /// The request line's target and the header lines, as the gateway builds them from a whole
    /// request.
    fn built(wire: &[u8], request: &WholeRequest) -> (String, Vec<(String, String)>) {
        let head = Bytes::copy_from_slice(&wire[..request.head]);
        let target = request.layout.target(&head).expect("uri").to_string();
        let headers = request.layout.headers(&head).expect("headers");
        let lines = headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().expect("text").to_owned()))
            .collect();
        (target, lines)
    }

    #[test]
    fn a_whole_request_is_its_head_and_exactly_its_declared_body() {
        let wire = b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello";
        let request = whole(wire);
        let head = wire.len() - 5;
        assert_eq!(
            (&request.method, request.head, request.body.clone()),
            (&Method::POST, head, head..wire.len())
        );
        assert!(!request.close);
        assert_eq!(&wire[request.body.clone()], b"hello");
        let (target, lines) = built(wire, &request);
        assert_eq!(target, "/v1/chat?x=1");
        assert_eq!(lines, [("host".into(), "a".into()), ("content-length".into(), "5".into())]);

        let bodiless = whole(b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n");
        assert_eq!(bodiless.body, bodiless.head..bodiless.head, "no length, no body");
        assert!(bodiless.close);
        let both_ways =
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(classified(both_ways), Classified::HandOver(HandOver::ChunkedBody), "chunked wins");
    }

    #[test]
    fn a_pipelined_next_request_is_left_where_it_is() {
        let first = &b"POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\n\r\nabc"[..];
        let second = &b"GET /b HTTP/1.1\r\nhost: h\r\n\r\n"[..];
        let wire = [first, second].concat();
        let request = whole(&wire);
        assert_eq!(request.body.end, first.len(), "the first ends where the second starts");
        assert_eq!(request, whole(first), "what follows does not change the first");
        let next = whole(&wire[request.body.end..]);
        assert_eq!((&next.method, built(second, &next).0), (&Method::GET, "/b".into()));
        // Part of a next request's head, or all of it, is the same.
        assert_eq!(whole(&wire[..first.len() + 5]), request);
    }

    #[test]
    fn a_body_split_over_reads_is_awaited_until_its_last_byte() {
        let wire = b"POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 11\r\n\r\nhello world";
        let head = wire.len() - 11;
        for cut in 0..wire.len() {
            let expected = if cut < head { Classified::Partial } else { Classified::AwaitingBody };
            assert_eq!(classified(&wire[..cut]), expected, "cut at {cut}");
        }
        assert_eq!(whole(wire).body, head..wire.len());
    }

    #[test]
    fn each_reason_to_hand_over_is_named() {
        let long = format!("GET / HTTP/1.1\r\nhost: h\r\nx: {}\r\n\r\n", "a".repeat(LIMITS.head_bytes));
        let many = format!("GET / HTTP/1.1\r\nhost: h\r\n{}\r\n", "x: b\r\n".repeat(LINES));
        let cases: [(&[u8], HandOver); 13] = [
            (b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n", HandOver::ChunkedBody),
            (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1025\r\n\r\n", HandOver::BodyTooLarge),
            (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 65\r\n\r\n", HandOver::LargeBody),
            (
                b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n",
                HandOver::Expect,
            ),
            (
                b"GET / HTTP/1.1\r\nhost: h\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
                HandOver::Upgrade,
            ),
            (b"GET / HTTP/1.0\r\n\r\n", HandOver::Http10),
            // The rules are not checked on HTTP/1.0: the fuller server holds its own.
            (b"GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n", HandOver::Http10),
            (b"HEAD / HTTP/1.1\r\n\r\n", HandOver::HeadOrConnect),
            (b"CONNECT example.com:443 HTTP/1.1\r\nhost: h\r\n\r\n", HandOver::HeadOrConnect),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HandOver::Http2),
            (long.as_bytes(), HandOver::HeadTooLong),
            (many.as_bytes(), HandOver::TooManyLines),
            (b"GET /a b HTTP/1.1\r\nhost: h\r\n\r\n", HandOver::Unparsable),
        ];
        for (wire, reason) in cases {
            assert_eq!(classified(wire), Classified::HandOver(reason), "{}", String::from_utf8_lossy(wire));
        }
        // The limits are inclusive, and a body over both is too large rather than large.
        let sized = |length: u64| format!("POST / HTTP/1.1\r\nhost: h\r\ncontent-length: {length}\r\n\r\n");
        assert_eq!(classified(sized(64).as_bytes()), Classified::AwaitingBody);
        let limits = Limits { body: 32, ..LIMITS };
        assert_eq!(
            classify::<LINES>(sized(100).as_bytes(), limits),
            Classified::HandOver(HandOver::BodyTooLarge)
        );
        let exact = format!("GET / HTTP/1.1\r\nhost: h\r\nx: {}\r\n\r\n", "a".repeat(LIMITS.head_bytes - 32));
        assert_eq!(exact.len(), LIMITS.head_bytes);
        assert!(matches!(classified(exact.as_bytes()), Classified::Request(_)));
        let most = format!("GET / HTTP/1.1\r\nhost: h\r\n{}\r\n", "x: b\r\n".repeat(LINES - 1));
        assert!(matches!(classified(most.as_bytes()), Classified::Request(_)));
    }

    /// `httparse` refuses `PRI * HTTP/2` before the preface is whole: a cut preface is not yet
    /// anything, and the reason is the same however it was cut.
    #[test]
    fn the_http2_preface_is_waited_for_whole() {
        for cut in 0..HTTP2_PREFACE.len() {
            assert_eq!(classified(&HTTP2_PREFACE[..cut]), Classified::Partial, "cut at {cut}");
        }
        assert_eq!(classified(HTTP2_PREFACE), Classified::HandOver(HandOver::Http2));
        assert_eq!(classified(b"PRI * HTTP/2.1\r\n"), Classified::HandOver(HandOver::Unparsable));
        let pri = whole(b"PRI * HTTP/1.1\r\nhost: h\r\n\r\n");
        assert_eq!(pri.method.as_str(), "PRI", "an HTTP/1.1 request like any other");
    }

    #[test]
    fn a_head_that_breaks_the_rules_is_refused_with_its_target_and_lines() {
        let cases: [(&[u8], RequestError); 4] = [
            (b"GET /v1/messages HTTP/1.1\r\nanthropic-version: 1\r\n\r\n", HostError::Missing.into()),
            (b"GET / HTTP/1.1\r\nhost: a b\r\n\r\n", HostError::Invalid.into()),
            (b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 1, 1\r\n\r\na", FramingError::LengthRepeated.into()),
            // Refused before the expectation or the length is looked at.
            (
                b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: gzip, chunked\r\nexpect: 100-continue\r\n\r\n",
                FramingError::CodingUnsupported.into(),
            ),
        ];
        for (wire, error) in cases {
            let Classified::Refuse(refusal) = classified(wire) else {
                panic!("not refused: {}", String::from_utf8_lossy(wire));
            };
            assert_eq!(refusal.error, error);
        }
        let wire = b"GET http://h/v1/messages?x HTTP/1.1\r\nAnthropic-Version: 1\r\nx-a: b\r\n\r\n";
        let Classified::Refuse(refusal) = classified(wire) else { panic!("not refused") };
        assert_eq!(refusal.layout.raw_target(wire), b"http://h/v1/messages?x");
        assert_eq!(refusal.layout.names(wire).collect::<Vec<_>>(), [&b"Anthropic-Version"[..], b"x-a"]);
    }

    /// Any bytes, or a request made of likely parts.
    fn wire() -> impl Strategy<Value = Vec<u8>> {
        let line = (
            prop_oneof![
                Just("host"),
                Just("content-length"),
                Just("transfer-encoding"),
                Just("connection"),
                Just("expect"),
                Just("x-a"),
            ],
            prop_oneof![
                Just("h".to_owned()),
                Just("close".to_owned()),
                (0u32..100).prop_map(|n| n.to_string()),
                "[ -~]{0,12}"
            ],
        );
        let request = (
            prop_oneof![Just("GET"), Just("POST"), Just("HEAD"), Just("PRI")],
            prop_oneof![Just("/"), Just("*"), Just("/v1/x?y")],
            prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0"), Just("HTTP/2.0")],
            proptest::collection::vec(line, 0..10),
            proptest::collection::vec(any::<u8>(), 0..120),
        )
            .prop_map(|(method, target, version, lines, tail)| {
                let mut wire = format!("{method} {target} {version}\r\n").into_bytes();
                for (name, value) in lines {
                    wire.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                wire.extend_from_slice(b"\r\n");
                wire.extend_from_slice(&tail);
                wire
            });
        prop_oneof![request, proptest::collection::vec(any::<u8>(), 0..300)]
    }

    proptest! {
        /// However reads cut a request, what its first part is classified as is either "not yet"
        /// or what the whole is: a decision once made does not change as bytes arrive. And a
        /// whole request lies inside the buffer.
        #[test]
        fn a_decision_once_made_holds_however_the_bytes_were_cut(wire in wire()) {
            let all = classified(&wire);
            for cut in 0..=wire.len() {
                let part = classified(&wire[..cut]);
                prop_assert!(
                    matches!(part, Classified::Partial | Classified::AwaitingBody) || part == all,
                    "cut at {}: {:?}, whole: {:?}", cut, part, all
                );
            }
            if let Classified::Request(request) = &all {
                prop_assert!(request.head == request.body.start && request.body.end <= wire.len());
            }
        }
    }
}
