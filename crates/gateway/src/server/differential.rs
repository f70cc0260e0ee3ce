//! The gateway's HTTP/1.1 (its own, and hyper behind it) against a plain hyper server: one corpus of
//! raw requests sent to both over in-memory wires on paused time (so that a pause between two
//! writes is a pause however busy the machine), the same handler behind both, the answers compared
//! byte for byte with the `date` value masked. Where the gateway answers otherwise on purpose (a
//! `Host` or a framing that the rules refuse), the corpus says what it answers instead.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use recovea_core::Answer;
use recovea_core::answer::WireShape;
use recovea_http1::{Decoder, RequestError, parse_response};
use recovea_upstream::{BoxError, ResponseBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

use super::{Answerer, Limits, hyper_builder, serve_connection};
use crate::metrics::HandOver;
use crate::refusal::head_refusal;

const LIMITS: Limits = Limits { max_body: 1024, idle: Duration::from_secs(5) };
/// How long a connection must stay silent after its last expected answer to count as open.
const QUIET: Duration = Duration::from_millis(200);
/// Between the writes of a case given in parts: longer than the gateway waits for a body.
const PAUSE: Duration = Duration::from_millis(50);
/// How much a wire holds in each direction: as much as a socket's buffers, so that a case's
/// client writes all of it before it reads, as it could over a socket.
const WIRE_BYTES: usize = 1 << 20;

/// Tells what a request was: method, target, version, `Host` lines and body. `/stream` answers in
/// pieces of no declared length, `/empty` with a 204.
#[derive(Clone, Default)]
struct Echo {
    handed_over: Arc<Mutex<Vec<HandOver>>>,
}

impl Answerer for Echo {
    async fn answer<B>(&self, request: Request<B>) -> Response<ResponseBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = request.into_parts();
        let body = match body.collect().await {
            Ok(body) => body.to_bytes(),
            Err(_) => Bytes::from_static(b"<unreadable>"),
        };
        let hosts: Vec<_> = parts
            .headers
            .get_all(http::header::HOST)
            .iter()
            .map(|h| String::from_utf8_lossy(h.as_bytes()))
            .collect();
        let text = format!(
            "{} {} {:?} host={hosts:?} body={}",
            parts.method,
            parts.uri,
            parts.version,
            String::from_utf8_lossy(&body)
        );
        match parts.uri.path() {
            "/stream" => {
                let pieces =
                    ["hello", "", " streaming on", " and on"].map(|p| Ok(Frame::data(Bytes::from(p))));
                Response::new(StreamBody::new(futures_util::stream::iter(pieces)).boxed_unsync())
            }
            "/empty" => {
                let mut response = Response::new(full(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            _ => {
                let mut response = Response::new(full(Bytes::from(text)));
                response
                    .headers_mut()
                    .insert(http::header::CONTENT_TYPE, "text/plain".parse().expect("value"));
                response
            }
        }
    }

    fn refuse(&self, error: RequestError, shape: WireShape) -> Response<ResponseBody> {
        head_refusal(error, shape)
    }

    fn handed_over(&self, reason: HandOver) {
        self.handed_over.lock().expect("lock").push(reason);
    }
}

fn full(bytes: Bytes) -> ResponseBody {
    Full::new(bytes).map_err(BoxError::from).boxed_unsync()
}

/// The server a case is sent to.
#[derive(Clone, Copy)]
enum Server {
    /// The gateway's way: [`serve_connection`].
    Gateway,
    /// hyper's way: the same builder, serving the whole connection.
    HyperAlone,
}

/// A client connection to a new connection of `server`, with `echo` behind it.
fn connect(server: Server, echo: &Echo) -> DuplexStream {
    let (client, stream) = tokio::io::duplex(WIRE_BYTES);
    let echo = echo.clone();
    tokio::spawn(async move {
        let builder = hyper_builder();
        match server {
            Server::Gateway => {
                let (_drain, draining) = watch::channel(false);
                serve_connection(stream, draining, &builder, LIMITS, echo).await;
            }
            Server::HyperAlone => {
                let service = service_fn(move |request| {
                    let echo = echo.clone();
                    async move { Ok::<_, Infallible>(echo.answer(request).await) }
                });
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            }
        }
    });
    client
}

/// What a server sent back: its answers (each with the interim heads before it), any bytes after
/// them, and whether it closed the connection.
#[derive(Debug, PartialEq, Eq)]
struct Exchange {
    answers: Vec<String>,
    rest: String,
    closed: bool,
}

/// Sends `parts` (pausing between them), then reads `answers` answers to `method` requests, then
/// whatever comes until the server closes or stays quiet.
async fn exchange(mut io: DuplexStream, parts: &[&[u8]], method: &Method, answers: usize) -> Exchange {
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(PAUSE).await;
        }
        // A server that closed early may refuse what follows: its answer says so.
        if io.write_all(part).await.is_err() {
            break;
        }
    }
    let mut read = Vec::new();
    let mut closed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while split(&read, method).0.len() < answers {
        match tokio::time::timeout_at(deadline, io.read_buf(&mut read)).await.expect("the answers in time") {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(_) => {}
        }
    }
    while !closed {
        match tokio::time::timeout(QUIET, io.read_buf(&mut read)).await {
            Err(_) => break,
            Ok(Ok(0) | Err(_)) => closed = true,
            Ok(Ok(_)) => {}
        }
    }
    let (answers, rest) = split(&read, method);
    Exchange { answers, rest: masked(&rest), closed }
}

/// The whole answers at the start of `read` (each with its interim heads), as text with the `date`
/// value masked, and what follows them.
fn split(read: &[u8], method: &Method) -> (Vec<String>, Vec<u8>) {
    let mut buf = BytesMut::from(read);
    let mut answers = Vec::new();
    loop {
        let before = buf.len();
        let Ok(Some(head)) = parse_response::<128>(&mut buf, method, 64 << 10) else { break };
        let mut decoder = Decoder::new(head.framing);
        loop {
            if decoder.skip_framing(&mut buf).is_err() || decoder.take_data(&mut buf).is_none() {
                break;
            }
        }
        if !decoder.is_done() {
            break;
        }
        let used = before - buf.len();
        let start = read.len() - before;
        answers.push(masked(&read[start..start + used]));
    }
    let rest = read[read.len() - buf.len()..].to_vec();
    (answers, rest)
}

/// `bytes` as text, the value of every `date` line masked.
fn masked(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut rest = &text[..];
    while let Some(at) = rest.find("\r\ndate: ") {
        out.push_str(&rest[..at]);
        out.push_str("\r\ndate: <date>");
        rest = &rest[at + 8..];
        rest = &rest[rest.find("\r\n").unwrap_or(rest.len())..];
    }
    out.push_str(rest);
    out
}

/// What the gateway answers to a case.
enum Expected {
    /// What hyper alone answers, byte for byte.
    Same,
    /// Hyper's first `before` answers, then the gateway's refusal (`version` on its status line)
    /// and the connection closed; hyper alone answers the refused request with `hyper` (a status
    /// line).
    Refused { before: usize, answer: Answer, version: &'static str, hyper: &'static str },
}

struct Case {
    name: &'static str,
    parts: Vec<Vec<u8>>,
    /// The method of every request of the case, for reading their answers.
    method: Method,
    /// How many answers hyper alone gives.
    answers: usize,
    expected: Expected,
}

fn case(name: &'static str, parts: &[&[u8]], answers: usize, expected: Expected) -> Case {
    Case { name, parts: parts.iter().map(|p| p.to_vec()).collect(), method: Method::GET, answers, expected }
}

fn refused(before: usize, answer: Answer, hyper: &'static str) -> Expected {
    Expected::Refused { before, answer, version: "HTTP/1.1", hyper }
}

fn anthropic(answer: Answer) -> Answer {
    answer.shaped(WireShape::Anthropic)
}

/// The refusal as both of the gateway's paths write it.
fn refusal_text(answer: &Answer, version: &str) -> String {
    let status = StatusCode::from_u16(answer.status).expect("status");
    format!(
        "{version} {} {}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\ndate: <date>\r\n\r\n{}",
        status.as_str(),
        status.canonical_reason().expect("reason"),
        answer.body.len(),
        String::from_utf8_lossy(&answer.body)
    )
}

fn corpus() -> Vec<Case> {
    const CHUNKED: &[u8] =
        b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let long_head = format!("GET /long HTTP/1.1\r\nhost: x\r\nx-long: {}\r\n\r\n", "a".repeat(20 << 10));
    let many_lines = format!("GET /many HTTP/1.1\r\nhost: x\r\n{}\r\n", "x-a: b\r\n".repeat(70));
    let big_body =
        format!("POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: 2000\r\n\r\n{}", "b".repeat(2000));
    let mut cases = vec![
        case("a GET", &[b"GET /a?b=1 HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("a POST with a length", &[b"POST /p HTTP/1.1\r\nHost: x:80\r\ncontent-length: 5\r\n\r\nhello"], 1, Expected::Same),
        case(
            "pipelined",
            &[b"POST /1 HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\naGET /2 HTTP/1.1\r\nhost: x\r\n\r\nGET /3 HTTP/1.1\r\nhost: [::1]:9\r\n\r\n"],
            3,
            Expected::Same,
        ),
        case("the client asks to close", &[b"GET / HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\n"], 1, Expected::Same),
        case(
            "kept alive, then closed",
            &[b"GET /1 HTTP/1.1\r\nhost: x\r\n\r\n", b"GET /2 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"],
            2,
            Expected::Same,
        ),
        case("a length of 0", &[b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"], 1, Expected::Same),
        case("an absolute target", &[b"GET http://x/abs?q HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("a method of lower case", &[b"get / HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("empty lines first", &[b"\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("an empty host", &[b"GET / HTTP/1.1\r\nhost:\r\n\r\n"], 1, Expected::Same),
        case("a head in pieces", &[b"GET /pie", b"ces HTTP/1.1\r\nho", b"st: x\r\n\r\n"], 1, Expected::Same),
        case("a body that trails its head", &[b"POST /t HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhe", b"llo"], 1, Expected::Same),
        case("an answer in chunks", &[b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nGET /after HTTP/1.1\r\nhost: x\r\n\r\n"], 2, Expected::Same),
        case("a 204", &[b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("HTTP/1.0", &[b"GET / HTTP/1.0\r\n\r\n"], 1, Expected::Same),
        case(
            "HTTP/1.0 kept alive, then HTTP/1.1",
            &[b"GET /1 HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /2 HTTP/1.1\r\nhost: x\r\n\r\n"],
            2,
            Expected::Same,
        ),
        case("a chunked body", &[CHUNKED], 1, Expected::Same),
        case(
            "a chunked body with trailers and extensions",
            &[b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: Chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nx-t: 1\r\n\r\n"],
            1,
            Expected::Same,
        ),
        case(
            "chunks and a length",
            &[b"POST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
            1,
            Expected::Same,
        ),
        case(
            "expect 100-continue",
            &[b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n", b"hello"],
            1,
            Expected::Same,
        ),
        case("an upgrade asked", &[b"GET /u HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"], 1, Expected::Same),
        case("a body over the limit", &[big_body.as_bytes()], 1, Expected::Same),
        case("a long head", &[long_head.as_bytes()], 1, Expected::Same),
        case("many lines", &[many_lines.as_bytes()], 1, Expected::Same),
        case("a target with a space", &[b"GET /a b HTTP/1.1\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        case("a folded line", &[b"GET / HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n 2\r\n\r\n"], 1, Expected::Same),
        case("a version unknown", &[b"GET / HTTP/1.2\r\nhost: x\r\n\r\n"], 1, Expected::Same),
        // The gateway's rules: hyper takes these (or refuses them its own way).
        case("no host", &[b"GET / HTTP/1.1\r\n\r\n"], 1, refused(0, Answer::invalid_host(), "HTTP/1.1 200 OK")),
        case("two hosts", &[b"GET / HTTP/1.1\r\nhost: x\r\nHost: x\r\n\r\n"], 1, refused(0, Answer::invalid_host(), "HTTP/1.1 200 OK")),
        case("a host not host[:port]", &[b"GET / HTTP/1.1\r\nhost: x y\r\n\r\n"], 1, refused(0, Answer::invalid_host(), "HTTP/1.1 200 OK")),
        case(
            "a length on two lines",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\na"],
            1,
            refused(0, Answer::invalid_content_length(), "HTTP/1.1 200 OK"),
        ),
        case(
            "a length listed twice",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1, 1\r\n\r\na"],
            1,
            refused(0, Answer::invalid_content_length(), "HTTP/1.1 400 Bad Request"),
        ),
        case(
            "two different lengths",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab"],
            1,
            refused(0, Answer::invalid_content_length(), "HTTP/1.1 400 Bad Request"),
        ),
        case(
            "a length with a sign",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: +1\r\n\r\na"],
            1,
            refused(0, Answer::invalid_content_length(), "HTTP/1.1 400 Bad Request"),
        ),
        case(
            "gzip, chunked",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
            1,
            refused(0, Answer::unsupported_transfer_coding(), "HTTP/1.1 200 OK"),
        ),
        case(
            "identity, chunked",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: identity, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
            1,
            refused(0, Answer::unsupported_transfer_coding(), "HTTP/1.1 200 OK"),
        ),
        case(
            "chunked twice",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
            1,
            refused(0, Answer::invalid_transfer_encoding(), "HTTP/1.1 200 OK"),
        ),
        case(
            "chunked, then gzip",
            &[b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, gzip\r\n\r\n"],
            1,
            refused(0, Answer::invalid_transfer_encoding(), "HTTP/1.1 400 Bad Request"),
        ),
        case(
            "a good request, then one without host",
            &[b"GET /1 HTTP/1.1\r\nhost: x\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"],
            2,
            refused(1, Answer::invalid_host(), "HTTP/1.1 200 OK"),
        ),
        // Refused in the dialect the path and `anthropic-version` name, as every answer is.
        case("no host on messages", &[b"GET /v1/messages HTTP/1.1\r\n\r\n"], 1, refused(0, anthropic(Answer::invalid_host()), "HTTP/1.1 200 OK")),
        case(
            "no host on messages, the target in absolute form",
            &[b"GET http://x/v1/messages?beta=true HTTP/1.1\r\n\r\n"],
            1,
            refused(0, anthropic(Answer::invalid_host()), "HTTP/1.1 200 OK"),
        ),
        case(
            "two hosts with anthropic-version",
            &[b"GET /v1/models HTTP/1.1\r\nhost: a\r\nanthropic-version: 2023-06-01\r\nhost: b\r\n\r\n"],
            1,
            refused(0, anthropic(Answer::invalid_host()), "HTTP/1.1 200 OK"),
        ),
    ];
    // The same rules on a connection hyper already serves for the gateway.
    for (name, then, answer) in [
        ("a chunked body, then two hosts", &b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"[..], Answer::invalid_host()),
        ("a chunked body, then no host", b"GET / HTTP/1.1\r\n\r\n", Answer::invalid_host()),
        ("a chunked body, then no host on messages", b"GET /v1/messages HTTP/1.1\r\n\r\n", anthropic(Answer::invalid_host())),
        (
            "a chunked body, then gzip, chunked with anthropic-version",
            b"POST /v1/models HTTP/1.1\r\nhost: x\r\nAnthropic-Version: 2023-06-01\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            anthropic(Answer::unsupported_transfer_coding()),
        ),
        (
            "a chunked body, then gzip, chunked",
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Answer::unsupported_transfer_coding(),
        ),
        (
            "a chunked body, then chunked twice",
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Answer::invalid_transfer_encoding(),
        ),
    ] {
        cases.push(case(name, &[&[CHUNKED, then].concat()], 2, refused(1, answer, "HTTP/1.1 200 OK")));
    }
    cases.push(case(
        "HTTP/1.0 with two hosts",
        &[b"GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n"],
        1,
        Expected::Refused {
            before: 0,
            answer: Answer::invalid_host(),
            version: "HTTP/1.0",
            hyper: "HTTP/1.0 200 OK",
        },
    ));
    let mut head = case(
        "HEAD",
        &[b"HEAD /h HTTP/1.1\r\nhost: x\r\n\r\nHEAD /h2 HTTP/1.1\r\nhost: x\r\n\r\n"],
        2,
        Expected::Same,
    );
    head.method = Method::HEAD;
    cases.push(head);
    let mut head_refused = case("HEAD without host", &[b"HEAD /h HTTP/1.1\r\n\r\n"], 1, Expected::Same);
    head_refused.method = Method::HEAD;
    head_refused.expected = Expected::Refused {
        before: 0,
        answer: Answer::invalid_host(),
        version: "HTTP/1.1",
        hyper: "HTTP/1.1 200 OK",
    };
    cases.push(head_refused);
    cases
}

#[tokio::test(start_paused = true)]
async fn the_gateways_http1_answers_as_hyper_does_but_where_its_rules_say_otherwise() {
    let echo = Echo::default();
    let corpus = corpus();
    let exchanges = futures_util::future::join_all(corpus.iter().map(|case| {
        let parts: Vec<&[u8]> = case.parts.iter().map(Vec::as_slice).collect();
        let (ours, theirs) = (connect(Server::Gateway, &echo), connect(Server::HyperAlone, &echo));
        async move {
            let ours = exchange(ours, &parts, &case.method, case.answers).await;
            let theirs = exchange(theirs, &parts, &case.method, case.answers).await;
            (ours, theirs)
        }
    }))
    .await;
    for (case, (ours, theirs)) in corpus.iter().zip(exchanges) {
        let name = case.name;
        assert_eq!(theirs.answers.len(), case.answers, "{name}: hyper's answers {theirs:?}");
        match &case.expected {
            Expected::Same => assert_eq!(ours, theirs, "{name}"),
            Expected::Refused { before, answer, version, hyper } => {
                let mut expected = theirs.answers[..*before].to_vec();
                let mut refusal = refusal_text(answer, version);
                if case.method == Method::HEAD {
                    refusal.truncate(refusal.find("\r\n\r\n").expect("a head") + 4);
                }
                expected.push(refusal);
                assert_eq!(ours.answers, expected, "{name}");
                assert!(ours.rest.is_empty() && ours.closed, "{name}: closed after the refusal: {ours:?}");
                let theirs_then = &theirs.answers[*before];
                assert!(
                    theirs_then.starts_with(&format!("{hyper}\r\n")),
                    "{name}: hyper answered {theirs_then:?}"
                );
            }
        }
    }
    // Each of the gateway's connections went to hyper at most once, and these for these reasons.
    let handed = echo.handed_over.lock().expect("lock").clone();
    for reason in [
        HandOver::TrailingBody,
        HandOver::ChunkedBody,
        HandOver::BodyTooLarge,
        HandOver::Expect,
        HandOver::Upgrade,
        HandOver::Http10,
        HandOver::HeadOrConnect,
        HandOver::HeadTooLong,
        HandOver::TooManyLines,
        HandOver::Unparsable,
    ] {
        assert!(handed.contains(&reason), "{reason:?} in {handed:?}");
    }
}
