//! The answers the gateway gives itself (refusals and upstream failures): status, headers, body bytes.
//!
//! Bodies follow the contract's one shape, `{"error": {"message", "type", "param", "code"}}`, printed
//! with two-space indentation exactly as the product page shows them. On Anthropic routes the body
//! also carries Anthropic's top-level `"type": "error"` (first, as Anthropic writes it), the
//! `error` object unchanged: Anthropic's SDKs and the Vercel AI SDK read that envelope, OpenAI's
//! SDKs read `error` alone, so every one of them shows the message. On Gemini's native routes the
//! body is Google's error envelope instead (`error.code` the HTTP status, `error.status` Google's
//! name for it), the contract's `type` and `code` in its `ErrorInfo` detail: Google's SDKs read
//! `code`, `status` and `message` from it, and a number where the contract has a word.

use serde::Serialize;

/// A complete answer, ready to be written by whichever HTTP layer carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// What the body says, kept so that [`Answer::shaped`] can write it in another envelope (boxed:
    /// answers travel in every layer's error type, which must stay small).
    error: Box<ErrorFields>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ErrorFields {
    kind: String,
    code: String,
    message: String,
    /// The one request member or parameter the error is about (the body's `param`), if any.
    param: Option<String>,
}

/// The wire dialect a request speaks, which decides the envelope of the gateway's own answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireShape {
    #[default]
    OpenAi,
    Anthropic,
    /// Gemini's own API (`generateContent` and the rest), not its OpenAI-compatible endpoint.
    Gemini,
}

/// Gemini's methods on a model (`models/{model}:{method}`), which no OpenAI or Anthropic path has.
pub const GEMINI_MODEL_METHODS: [&str; 6] = [
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "embedContent",
    "batchEmbedContents",
    "batchGenerateContent",
];

/// `models/{model}:{method}` (what follows an API version) with one of Gemini's methods. (An OpenAI
/// fine-tuned model's id has colons too, never one of these methods after its last.)
pub fn is_gemini_model_call(after_version: &str) -> bool {
    after_version
        .strip_prefix("models/")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(model, method)| !model.is_empty() && GEMINI_MODEL_METHODS.contains(&method))
}

impl WireShape {
    /// The shape of a request: Anthropic's when it carries `anthropic-version` (every Anthropic
    /// SDK sends it, on every path) or when its path, below an optional `/{credential}` segment,
    /// is `/v1/messages...`; Gemini's when that path is Gemini's own API, `/v1beta/...` (but
    /// `/v1beta/openai/...`, its OpenAI-compatible endpoint) or `/v1/models/{model}:{method}`
    /// with one of Gemini's methods; OpenAI's otherwise.
    pub fn of_request(path: &str, carries_anthropic_version: bool) -> Self {
        if carries_anthropic_version {
            return Self::Anthropic;
        }
        let path = path.split_once('?').map_or(path, |(path, _)| path);
        // `/{version}/...`, or `/{credential}/{version}/...`.
        let below = |version: &str| {
            path.strip_prefix(version).or_else(|| {
                let (_, rest) = path.strip_prefix('/')?.split_once('/')?;
                rest.strip_prefix(&version[1..])
            })
        };
        let beta = below("/v1beta/").filter(|rest| !rest.is_empty());
        if beta.is_some_and(|rest| rest != "openai" && !rest.starts_with("openai/")) {
            return Self::Gemini;
        }
        let versioned = below("/v1/");
        if versioned.is_some_and(is_gemini_model_call) {
            return Self::Gemini;
        }
        let messages = versioned
            .and_then(|rest| rest.strip_prefix("messages"))
            .is_some_and(|tail| tail.is_empty() || tail.starts_with('/'));
        if messages { Self::Anthropic } else { Self::OpenAi }
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    /// Anthropic's `"type": "error"`; absent in OpenAI's shape.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

impl Answer {
    /// An answer in the contract's error shape.
    pub fn error(status: u16, kind: &str, code: &str, message: &str) -> Self {
        let error = Box::new(ErrorFields {
            kind: kind.to_owned(),
            code: code.to_owned(),
            message: message.to_owned(),
            param: None,
        });
        Self { status, headers: Vec::new(), body: render(&error, status, WireShape::OpenAi), error }
    }

    /// The same answer with its body's `param` naming the one request member or parameter it is
    /// about (the admin API's 400s; the gateway's refusals are about no one member and keep `null`).
    pub fn with_param(mut self, param: &str) -> Self {
        self.error.param = Some(param.to_owned());
        self.body = render(&self.error, self.status, WireShape::OpenAi);
        self
    }

    /// The same answer in the envelope of `shape`: status, headers and the `error` object are kept.
    pub fn shaped(mut self, shape: WireShape) -> Self {
        if shape != WireShape::OpenAi {
            self.body = render(&self.error, self.status, shape);
        }
        self
    }

    /// 400: an `x-recovea-tags` header that breaks the tag rules (`core::tags`); `reason` says how.
    pub fn invalid_tags(reason: &str) -> Self {
        let message = format!("Invalid x-recovea-tags: {reason}.");
        Self::error(400, "invalid_request_error", "invalid_tags", &message)
    }

    /// 403: the key's or its organization's `allowed_models` does not list the model. Names the
    /// model (cut to a readable length: it is the client's own text).
    pub fn model_not_allowed(model: &str) -> Self {
        let shown = shown(model, MODEL_SHOWN_CHARS);
        let message = format!("Model '{shown}' is not allowed for this key.");
        Self::error(403, "permission_error", "model_not_allowed", &message)
    }

    /// 403: the key's or its organization's `allowed_endpoints` does not list the endpoint (the
    /// provider's path, without its query). Names it, cut to a readable length.
    pub fn endpoint_not_allowed(endpoint: &str) -> Self {
        let shown = shown(endpoint, REQUEST_SHOWN_CHARS);
        let message = format!("Endpoint '{shown}' is not allowed for this key.");
        Self::error(403, "permission_error", "endpoint_not_allowed", &message)
    }

    /// 429: the key (`"key"`) or its organization (`"organization"`) has `limit` requests in
    /// flight on this node, its `max_concurrent_requests`. One ends soon: `retry-after: 1`.
    pub fn concurrency_limit_exceeded(holder: &str, limit: u32) -> Self {
        let message = format!(
            "Too many requests in flight for this {holder}: at most {limit} at once. Retry when one ends."
        );
        Self::error(429, "rate_limit_error", "concurrency_limit_exceeded", &message)
            .with_header("retry-after", "1")
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// Unknown, revoked, expired, malformed or missing key: one answer, the same bytes in every case,
    /// so that a caller cannot tell which.
    pub fn invalid_api_key() -> Self {
        Self::error(401, "invalid_request_error", "invalid_api_key", "Invalid API key.")
    }

    /// The route needs a provider credential the organization does not have, and the client brought none.
    pub fn provider_not_configured(provider: &str) -> Self {
        let message =
            format!("No provider credential named '{provider}' is configured for this organization.");
        Self::error(400, "invalid_request_error", "provider_not_configured", &message)
    }

    pub fn upstream_unreachable() -> Self {
        Self::error(502, "api_error", "upstream_unreachable", "Upstream provider unreachable.")
    }

    pub fn upstream_timeout() -> Self {
        Self::error(504, "api_error", "upstream_timeout", "Upstream provider did not answer in time.")
    }

    pub fn request_too_large(limit_bytes: u64) -> Self {
        let message = format!("Request body is larger than the limit of {limit_bytes} bytes.");
        Self::error(413, "invalid_request_error", "request_too_large", &message)
    }

    /// The client's request body could not be read to its end (it hung up or sent a broken body).
    pub fn request_body_unreadable() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "request_body_unreadable",
            "Request body could not be read.",
        )
    }

    /// The client did not finish sending its body in time.
    pub fn request_body_timeout() -> Self {
        Self::error(408, "invalid_request_error", "request_timeout", "Request body was not received in time.")
    }

    /// 503: the node's memory for request bodies (`--body-memory`) had no room for this one within
    /// the time a body has to be read. Nothing was sent to the provider.
    pub fn body_memory_busy() -> Self {
        Self::error(
            503,
            "api_error",
            "body_memory_busy",
            "The gateway is holding too many request bodies to read this one now. Retry in a moment.",
        )
        .with_header("retry-after", "1")
    }

    pub fn unknown_route() -> Self {
        Self::error(
            404,
            "invalid_request_error",
            "unknown_route",
            "Unknown path: the gateway serves /v1/... and /{provider}/v1/....",
        )
    }

    /// 400: an HTTP/1.1 request without exactly one `Host`, or with one that is not `host[:port]`
    /// (RFC 9112, section 3.2). Sent with `connection: close`.
    pub fn invalid_host() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "invalid_request",
            "An HTTP/1.1 request must carry exactly one Host header, of the form host[:port].",
        )
    }

    /// 400: a `Content-Length` that is not one decimal number on one line (`5, 5` included). Sent
    /// with `connection: close`.
    pub fn invalid_content_length() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "invalid_request",
            "Content-Length must be a single decimal number, on a single line.",
        )
    }

    /// 400: a `Transfer-Encoding` whose last coding is not `chunked`, or that applies it twice: the
    /// body's end cannot be found (RFC 9112, section 6.3). Sent with `connection: close`.
    pub fn invalid_transfer_encoding() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "invalid_request",
            "Transfer-Encoding must end with chunked, applied once.",
        )
    }

    /// 400: a request body that names a member twice in an object the gateway reads: providers
    /// read the last, the gateway cannot be sure to read what they run. `path` (`stream`,
    /// `tools[2].type`) is the client's text: cut to a readable length and shown as a JSON string
    /// of printable ASCII, so that no quote, control or invisible character in it can confuse
    /// the message.
    pub fn repeated_member(path: &str) -> Self {
        let shown = quoted(&shown(path, MEMBER_SHOWN_CHARS));
        let message =
            format!("The request body names the member {shown} more than once; send each member once.");
        Self::error(400, "invalid_request_error", "invalid_request", &message)
    }

    /// 400: a model name longer than [`MAX_MODEL_NAME_BYTES`] or holding a control character, in the
    /// body, the path or the query: it would reach a receipt and a log line. Not repeated in the
    /// answer, as it is the client's own.
    ///
    /// [`MAX_MODEL_NAME_BYTES`]: crate::models::MAX_MODEL_NAME_BYTES
    pub fn invalid_model_name() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "invalid_request",
            "The model name is longer than 256 bytes or holds a control character.",
        )
    }

    /// 400: a request body that starts with a byte-order mark: a provider may drop it and read the
    /// JSON after it, where the gateway reads no JSON.
    pub fn byte_order_mark() -> Self {
        Self::error(
            400,
            "invalid_request_error",
            "invalid_request",
            "The request body starts with a byte-order mark; send JSON without one.",
        )
    }

    /// 501: a body in a transfer coding other than `chunked` (`gzip, chunked`): the gateway decodes
    /// none, and would otherwise pass the coded bytes on as plain ones. Sent with `connection: close`.
    pub fn unsupported_transfer_coding() -> Self {
        Self::error(
            501,
            "invalid_request_error",
            "unsupported_transfer_coding",
            "The only transfer coding accepted is chunked.",
        )
    }

    /// Adds a header; used by callers that extend an answer (for instance with a retry hint).
    pub fn header(self, name: &'static str, value: impl Into<String>) -> Self {
        self.with_header(name, value)
    }

    /// 402: an armed cap is at or over its limit. A sure answer, so no retry hint: the window resets
    /// or the cap is raised. `window_adjective` opens the message (`Monthly`, `Weekly`, `Daily`).
    pub fn budget_exceeded(scope: &str, window: &str, window_adjective: &str) -> Self {
        let message = format!("{window_adjective} spend cap reached.");
        Self::error(402, "insufficient_quota", "budget_exceeded", &message)
            .with_header("x-recovea-budget-scope", scope)
            .with_header("x-recovea-budget-window", window)
            .with_header("x-should-retry", "false")
    }

    /// 503: an armed cap cannot confirm its spend. It clears on its own once the node's counters are
    /// confirmed again, hence `retry-after: 1`; the message never says a budget was reached.
    pub fn budget_unverifiable(scope: &str, window: &str, window_adjective: &str) -> Self {
        let message = format!("{window_adjective} spend cannot be confirmed right now. Retry in a moment.");
        Self::error(503, "insufficient_quota", "budget_unverifiable", &message)
            .with_header("retry-after", "1")
            .with_header("x-recovea-budget-scope", scope)
            .with_header("x-recovea-budget-window", window)
    }

    /// The answer as a Realtime `error` event, sent to a client whose session an armed cap cuts:
    /// `{"type":"error","error":{"type","code","message","param"}}`.
    pub fn error_event(&self) -> String {
        #[derive(Serialize)]
        struct Event<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            error: EventError<'a>,
        }
        #[derive(Serialize)]
        struct EventError<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            code: &'a str,
            message: &'a str,
            param: Option<&'a str>,
        }
        let error = EventError {
            kind: &self.error.kind,
            code: &self.error.code,
            message: &self.error.message,
            param: None,
        };
        serde_json::to_string(&Event { kind: "error", error }).expect("a struct of strings always serialises")
    }

    /// 402: a request billed where the gateway cannot see it (or a deferred job it cannot estimate
    /// or poll) while an armed cap covers the key. A sure answer like `budget_exceeded`, so no
    /// retry hint. `request` is the method and endpoint, `POST /v1/fine_tuning/jobs`.
    pub fn budget_unmeterable(scope: &str, window: &str, window_adjective: &str, request: &str) -> Self {
        let request = shown(request, REQUEST_SHOWN_CHARS);
        let window_adjective = window_adjective.to_ascii_lowercase();
        let message = format!(
            "{request} is billed where this gateway cannot see it; refused while a {window_adjective} spend cap with a hard stop covers this key."
        );
        Self::error(402, "insufficient_quota", "budget_unmeterable", &message)
            .with_header("x-recovea-budget-scope", scope)
            .with_header("x-recovea-budget-window", window)
            .with_header("x-should-retry", "false")
    }

    /// 402: a batch whose estimated cost does not fit in what an armed cap has left. Answered as
    /// `budget_exceeded` is, with the two figures in its message.
    pub fn batch_exceeds(
        scope: &str,
        window: &str,
        window_adjective: &str,
        estimate: crate::money::Nanos,
        room: crate::money::Nanos,
    ) -> Self {
        let window_adjective = window_adjective.to_ascii_lowercase();
        let message = format!(
            "This batch's estimated cost (${}) exceeds what the {window_adjective} spend cap has left (${}).",
            estimate.to_usd_string(),
            room.max(crate::money::Nanos::ZERO).to_usd_string(),
        );
        Self::error(402, "insufficient_quota", "budget_exceeded", &message)
            .with_header("x-recovea-budget-scope", scope)
            .with_header("x-recovea-budget-window", window)
            .with_header("x-should-retry", "false")
    }

    /// 429: the key's rate limit. `retry-after` in whole seconds (rounded up) and `retry-after-ms`.
    pub fn rate_limited(retry_after_ms: u64) -> Self {
        let seconds = retry_after_ms.div_ceil(1000).max(1);
        let message = format!("Rate limit reached for this key. Retry in {retry_after_ms} ms.");
        Self::error(429, "rate_limit_error", "rate_limit_exceeded", &message)
            .with_header("retry-after", seconds.to_string())
            .with_header("retry-after-ms", retry_after_ms.to_string())
    }
}

/// How much of a refused model's name its message shows.
const MODEL_SHOWN_CHARS: usize = 200;
/// How much of a refused request's method and path its message shows.
const REQUEST_SHOWN_CHARS: usize = 200;

/// How much of a repeated member's path its message shows.
const MEMBER_SHOWN_CHARS: usize = 200;

/// The client's own text, cut to a readable length.
fn shown(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// `text` as a JSON string of printable ASCII: `"` and `\` escaped, and every other character
/// outside `' '..='~'` (controls, DEL, bidirectional marks, any non-ASCII) as `\uXXXX`, a pair of
/// them beyond the Basic Multilingual Plane.
fn quoted(text: &str) -> String {
    use std::fmt::Write as _;
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            ' '..='~' => quoted.push(c),
            _ => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let _ = write!(quoted, "\\u{unit:04x}");
                }
            }
        }
    }
    quoted.push('"');
    quoted
}

fn render(error: &ErrorFields, status: u16, shape: WireShape) -> Vec<u8> {
    let param = error.param.as_deref();
    let body = ErrorBody { message: &error.message, kind: &error.kind, param, code: &error.code };
    let rendered = match shape {
        WireShape::OpenAi => serde_json::to_vec_pretty(&Envelope { kind: None, error: body }),
        WireShape::Anthropic => serde_json::to_vec_pretty(&Envelope { kind: Some("error"), error: body }),
        WireShape::Gemini => serde_json::to_vec_pretty(&GoogleEnvelope {
            error: GoogleError {
                code: status,
                message: &error.message,
                status: google_status(status),
                details: [ErrorInfo {
                    kind: "type.googleapis.com/google.rpc.ErrorInfo",
                    reason: error.code.to_ascii_uppercase(),
                    domain: ERROR_DOMAIN,
                    metadata: ErrorMetadata { kind: &error.kind, code: &error.code },
                }],
            },
        }),
    };
    rendered.expect("a struct of strings and numbers always serialises")
}

/// Google's `ErrorInfo.domain` of the gateway's own answers: who gave the `reason`.
const ERROR_DOMAIN: &str = "recovea";

/// Google's error envelope (`google.rpc.Status` as its JSON APIs write it).
#[derive(Serialize)]
struct GoogleEnvelope<'a> {
    error: GoogleError<'a>,
}

#[derive(Serialize)]
struct GoogleError<'a> {
    /// The HTTP status.
    code: u16,
    message: &'a str,
    /// Google's canonical name for the status.
    status: &'static str,
    details: [ErrorInfo<'a>; 1],
}

/// `google.rpc.ErrorInfo`: the contract's `code` as its `reason` (upper case, as Google writes
/// reasons), and the contract's `type` and `code` as they are in its `metadata`.
#[derive(Serialize)]
struct ErrorInfo<'a> {
    #[serde(rename = "@type")]
    kind: &'static str,
    reason: String,
    domain: &'static str,
    metadata: ErrorMetadata<'a>,
}

#[derive(Serialize)]
struct ErrorMetadata<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    code: &'a str,
}

/// Google's canonical status (`google.rpc.Code`) for an HTTP status the gateway answers with, as
/// Google's APIs pair them; the nearest one for those Google's APIs never give (`402`: a budget
/// is a quota; `413`: an argument too large).
fn google_status(status: u16) -> &'static str {
    match status {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        402 | 429 => "RESOURCE_EXHAUSTED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        500..=599 => "INTERNAL",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_param_is_named_in_every_envelope_that_has_one() {
        let answer = Answer::error(400, "invalid_request_error", "invalid_request", "limit_usd: no")
            .with_param("limit_usd");
        assert_eq!(
            String::from_utf8(answer.body.clone()).expect("UTF-8"),
            "{\n  \"error\": {\n    \"message\": \"limit_usd: no\",\n    \"type\": \"invalid_request_error\",\n    \"param\": \"limit_usd\",\n    \"code\": \"invalid_request\"\n  }\n}"
        );
        let anthropic = String::from_utf8(answer.shaped(WireShape::Anthropic).body).expect("UTF-8");
        assert!(anthropic.contains("\"param\": \"limit_usd\""), "{anthropic}");
    }

    #[test]
    fn invalid_api_key_bytes_are_exact() {
        let answer = Answer::invalid_api_key();
        assert_eq!(answer.status, 401);
        assert!(answer.headers.is_empty());
        assert_eq!(
            String::from_utf8(answer.body).expect("utf-8"),
            "{\n  \"error\": {\n    \"message\": \"Invalid API key.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_api_key\"\n  }\n}"
        );
    }

    #[test]
    fn upstream_unreachable_bytes_are_exact() {
        let answer = Answer::upstream_unreachable();
        assert_eq!(answer.status, 502);
        assert_eq!(
            String::from_utf8(answer.body).expect("utf-8"),
            "{\n  \"error\": {\n    \"message\": \"Upstream provider unreachable.\",\n    \"type\": \"api_error\",\n    \"param\": null,\n    \"code\": \"upstream_unreachable\"\n  }\n}"
        );
    }

    #[test]
    fn refused_heads_bytes_are_exact() {
        let cases = [
            (
                Answer::invalid_host(),
                400,
                "An HTTP/1.1 request must carry exactly one Host header, of the form host[:port].",
                "invalid_request",
            ),
            (
                Answer::invalid_content_length(),
                400,
                "Content-Length must be a single decimal number, on a single line.",
                "invalid_request",
            ),
            (
                Answer::invalid_transfer_encoding(),
                400,
                "Transfer-Encoding must end with chunked, applied once.",
                "invalid_request",
            ),
            (
                Answer::unsupported_transfer_coding(),
                501,
                "The only transfer coding accepted is chunked.",
                "unsupported_transfer_coding",
            ),
        ];
        for (answer, status, message, code) in cases {
            assert_eq!(answer.status, status);
            assert!(answer.headers.is_empty());
            assert_eq!(
                String::from_utf8(answer.body).expect("utf-8"),
                format!(
                    "{{\n  \"error\": {{\n    \"message\": \"{message}\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"{code}\"\n  }}\n}}"
                )
            );
        }
    }

    #[test]
    fn endpoint_not_allowed_names_the_endpoint() {
        let answer = Answer::endpoint_not_allowed("/v1/files");
        assert_eq!(answer.status, 403);
        assert!(answer.headers.is_empty());
        assert_eq!(
            String::from_utf8(answer.body).expect("utf-8"),
            "{\n  \"error\": {\n    \"message\": \"Endpoint '/v1/files' is not allowed for this key.\",\n    \"type\": \"permission_error\",\n    \"param\": null,\n    \"code\": \"endpoint_not_allowed\"\n  }\n}"
        );
        let long = format!("/v1/{}", "f".repeat(500));
        let answer = Answer::endpoint_not_allowed(&long);
        assert!(answer.body.len() < 500, "the client's path is cut");
    }

    #[test]
    fn concurrency_limit_exceeded_says_retry_in_a_second() {
        let answer = Answer::concurrency_limit_exceeded("key", 2);
        assert_eq!(answer.status, 429);
        assert_eq!(answer.headers, vec![("retry-after", "1".to_owned())]);
        assert_eq!(
            String::from_utf8(answer.body).expect("utf-8"),
            "{\n  \"error\": {\n    \"message\": \"Too many requests in flight for this key: at most 2 at once. Retry when one ends.\",\n    \"type\": \"rate_limit_error\",\n    \"param\": null,\n    \"code\": \"concurrency_limit_exceeded\"\n  }\n}"
        );
    }

    #[test]
    fn rate_limited_says_when_to_retry() {
        let answer = Answer::rate_limited(1500);
        assert_eq!(answer.status, 429);
        assert_eq!(
            answer.headers,
            vec![("retry-after", "2".to_owned()), ("retry-after-ms", "1500".to_owned())]
        );
        assert_eq!(
            String::from_utf8(answer.body).expect("utf-8"),
            "{\n  \"error\": {\n    \"message\": \"Rate limit reached for this key. Retry in 1500 ms.\",\n    \"type\": \"rate_limit_error\",\n    \"param\": null,\n    \"code\": \"rate_limit_exceeded\"\n  }\n}"
        );
    }

    #[test]
    fn messages_are_escaped() {
        let answer = Answer::provider_not_configured("we\"ird");
        let value: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(
            value["error"]["message"],
            "No provider credential named 'we\"ird' is configured for this organization."
        );
        assert_eq!(value["error"]["code"], "provider_not_configured");
        assert_eq!(value["error"]["param"], serde_json::Value::Null);
    }

    fn text(answer: &Answer) -> &str {
        std::str::from_utf8(&answer.body).expect("utf-8")
    }

    fn headers(answer: &Answer) -> Vec<(&str, &str)> {
        answer.headers.iter().map(|(name, value)| (*name, value.as_str())).collect()
    }

    /// The 503 of the product page "Fail-open and fail-closed", byte for byte.
    #[test]
    fn budget_unverifiable_matches_the_product_page() {
        let answer = Answer::budget_unverifiable("organization", "month", "Monthly");
        assert_eq!(answer.status, 503);
        assert_eq!(
            headers(&answer),
            [
                ("retry-after", "1"),
                ("x-recovea-budget-scope", "organization"),
                ("x-recovea-budget-window", "month")
            ]
        );
        let page = r#"{
  "error": {
    "message": "Monthly spend cannot be confirmed right now. Retry in a moment.",
    "type": "insufficient_quota",
    "param": null,
    "code": "budget_unverifiable"
  }
}"#;
        assert_eq!(text(&answer), page);
    }

    #[test]
    fn budget_unverifiable_bytes_for_every_window() {
        for (window, adjective) in [("day", "Daily"), ("week", "Weekly"), ("month", "Monthly")] {
            let answer = Answer::budget_unverifiable("key", window, adjective);
            assert_eq!(answer.status, 503);
            assert_eq!(
                headers(&answer),
                [
                    ("retry-after", "1"),
                    ("x-recovea-budget-scope", "key"),
                    ("x-recovea-budget-window", window)
                ]
            );
            assert_eq!(
                text(&answer),
                format!(
                    "{{\n  \"error\": {{\n    \"message\": \"{adjective} spend cannot be confirmed right now. Retry in a moment.\",\n    \"type\": \"insufficient_quota\",\n    \"param\": null,\n    \"code\": \"budget_unverifiable\"\n  }}\n}}"
                )
            );
        }
    }

    #[test]
    fn budget_exceeded_bytes_for_every_window() {
        for (window, adjective) in [("day", "Daily"), ("week", "Weekly"), ("month", "Monthly")] {
            for scope in ["organization", "key"] {
                let answer = Answer::budget_exceeded(scope, window, adjective);
                assert_eq!(answer.status, 402);
                assert_eq!(
                    headers(&answer),
                    [
                        ("x-recovea-budget-scope", scope),
                        ("x-recovea-budget-window", window),
                        ("x-should-retry", "false")
                    ]
                );
                assert!(!answer.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("retry-after")));
                assert_eq!(
                    text(&answer),
                    format!(
                        "{{\n  \"error\": {{\n    \"message\": \"{adjective} spend cap reached.\",\n    \"type\": \"insufficient_quota\",\n    \"param\": null,\n    \"code\": \"budget_exceeded\"\n  }}\n}}"
                    )
                );
            }
        }
    }

    #[test]
    fn budget_unmeterable_bytes_for_every_window() {
        for (window, adjective) in [("day", "daily"), ("week", "weekly"), ("month", "monthly")] {
            let capitalised = format!("{}{}", adjective[..1].to_ascii_uppercase(), &adjective[1..]);
            let answer = Answer::budget_unmeterable("key", window, &capitalised, "POST /v1/fine_tuning/jobs");
            assert_eq!(answer.status, 402);
            assert_eq!(
                headers(&answer),
                [
                    ("x-recovea-budget-scope", "key"),
                    ("x-recovea-budget-window", window),
                    ("x-should-retry", "false")
                ]
            );
            assert_eq!(
                text(&answer),
                format!(
                    "{{\n  \"error\": {{\n    \"message\": \"POST /v1/fine_tuning/jobs is billed where this gateway cannot see it; refused while a {adjective} spend cap with a hard stop covers this key.\",\n    \"type\": \"insufficient_quota\",\n    \"param\": null,\n    \"code\": \"budget_unmeterable\"\n  }}\n}}"
                )
            );
        }
        // The path is the client's: a long one is cut, and quotes in it are escaped.
        let long = format!("POST /v1/\"{}", "a".repeat(1000));
        let answer = Answer::budget_unmeterable("organization", "month", "Monthly", &long);
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.starts_with("POST /v1/\"aaa"), "{message}");
        assert!(message.len() < 400, "{message}");
    }

    #[test]
    fn a_refusal_as_a_realtime_error_event_is_the_contracts() {
        let event = Answer::budget_exceeded("organization", "month", "Monthly").error_event();
        assert_eq!(
            event,
            r#"{"type":"error","error":{"type":"insufficient_quota","code":"budget_exceeded","message":"Monthly spend cap reached.","param":null}}"#
        );
    }

    #[test]
    fn batch_exceeds_bytes_are_exact() {
        use crate::money::Nanos;
        let answer = Answer::batch_exceeds(
            "organization",
            "month",
            "Monthly",
            Nanos(6_250_000_000),
            Nanos(1_000_450_000),
        );
        assert_eq!(answer.status, 402);
        assert_eq!(
            headers(&answer),
            [
                ("x-recovea-budget-scope", "organization"),
                ("x-recovea-budget-window", "month"),
                ("x-should-retry", "false")
            ]
        );
        assert_eq!(
            text(&answer),
            "{\n  \"error\": {\n    \"message\": \"This batch's estimated cost ($6.25) exceeds what the monthly spend cap has left ($1.00045).\",\n    \"type\": \"insufficient_quota\",\n    \"param\": null,\n    \"code\": \"budget_exceeded\"\n  }\n}"
        );
        // Room is never shown below zero, however far past its line the cap already is.
        let over = Answer::batch_exceeds("key", "day", "Daily", Nanos(10), Nanos(-5));
        assert!(text(&over).contains("the daily spend cap has left ($0.00)"), "{}", text(&over));
    }

    #[test]
    fn model_not_allowed_bytes_are_exact() {
        let answer = Answer::model_not_allowed("gpt-4o");
        assert_eq!(answer.status, 403);
        assert!(answer.headers.is_empty());
        assert_eq!(
            text(&answer),
            "{\n  \"error\": {\n    \"message\": \"Model 'gpt-4o' is not allowed for this key.\",\n    \"type\": \"permission_error\",\n    \"param\": null,\n    \"code\": \"model_not_allowed\"\n  }\n}"
        );
        let long = Answer::model_not_allowed(&"m".repeat(5000));
        let value: serde_json::Value = serde_json::from_slice(&long.body).expect("json");
        assert_eq!(
            value["error"]["message"],
            format!("Model '{}' is not allowed for this key.", "m".repeat(200))
        );
    }

    #[test]
    fn repeated_member_bytes_are_exact() {
        let answer = Answer::repeated_member("stream");
        assert_eq!(answer.status, 400);
        assert!(answer.headers.is_empty());
        assert_eq!(
            text(&answer),
            "{\n  \"error\": {\n    \"message\": \"The request body names the member \\\"stream\\\" more than once; send each member once.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_request\"\n  }\n}"
        );
        let nested = Answer::repeated_member("tools[2].function.name");
        assert!(
            text(&nested).contains(r#"the member \"tools[2].function.name\" more than once"#),
            "{}",
            text(&nested)
        );
    }

    /// The path is the client's text: its quotes, backslashes, controls and invisible or
    /// non-ASCII characters are shown escaped, as JSON would spell them, and a long one is cut.
    #[test]
    fn a_hostile_member_name_is_escaped_and_cut() {
        let hostile = "tools[0].a\"b\\c\u{1}\n\u{7f}\u{202e}é😀";
        let answer = Answer::repeated_member(hostile);
        assert_eq!(
            text(&answer),
            r#"{
  "error": {
    "message": "The request body names the member \"tools[0].a\\\"b\\\\c\\u0001\\u000a\\u007f\\u202e\\u00e9\\ud83d\\ude00\" more than once; send each member once.",
    "type": "invalid_request_error",
    "param": null,
    "code": "invalid_request"
  }
}"#
        );
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(
            body["error"]["message"],
            r#"The request body names the member "tools[0].a\"b\\c\u0001\u000a\u007f\u202e\u00e9\ud83d\ude00" more than once; send each member once."#
        );
        let long = Answer::repeated_member(&format!("\"{}", "m".repeat(10_000)));
        let body: serde_json::Value = serde_json::from_slice(&long.body).expect("json");
        assert_eq!(
            body["error"]["message"],
            format!(
                "The request body names the member \"\\\"{}\" more than once; send each member once.",
                "m".repeat(199)
            )
        );
        for c in text(&long).chars() {
            assert!(c == '\n' || (' '..='~').contains(&c), "{c:?}");
        }
    }

    #[test]
    fn byte_order_mark_bytes_are_exact() {
        let answer = Answer::byte_order_mark();
        assert_eq!(answer.status, 400);
        assert!(answer.headers.is_empty());
        assert_eq!(
            text(&answer),
            "{\n  \"error\": {\n    \"message\": \"The request body starts with a byte-order mark; send JSON without one.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_request\"\n  }\n}"
        );
    }

    #[test]
    fn invalid_tags_bytes_are_exact() {
        let answer =
            Answer::invalid_tags("the key 'Team' must be 1 to 32 characters of a-z, 0-9, '_', '-' and '.'");
        assert_eq!(answer.status, 400);
        assert!(answer.headers.is_empty());
        assert_eq!(
            text(&answer),
            "{\n  \"error\": {\n    \"message\": \"Invalid x-recovea-tags: the key 'Team' must be 1 to 32 characters of a-z, 0-9, '_', '-' and '.'.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_tags\"\n  }\n}"
        );
    }

    #[test]
    fn the_shape_of_a_request() {
        use WireShape::*;
        for (path, version, shape) in [
            ("/v1/messages", false, Anthropic),
            ("/v1/messages?beta=true", false, Anthropic),
            ("/v1/messages/count_tokens", false, Anthropic),
            ("/v1/messages/batches/x", false, Anthropic),
            ("/claude/v1/messages", false, Anthropic),
            ("/v1/models", true, Anthropic),
            ("/v1/chat/completions", true, Anthropic),
            ("/nowhere", true, Anthropic),
            ("/v1/models", false, OpenAi),
            ("/v1/messagesx", false, OpenAi),
            ("/v1/chat/completions", false, OpenAi),
            ("/groq/v1/chat/completions", false, OpenAi),
            ("/a/b/v1/messages", false, OpenAi),
            ("/v2/messages", false, OpenAi),
            ("/", false, OpenAi),
            ("/v1beta/models/gemini-2.5-flash:generateContent", false, Gemini),
            ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", false, Gemini),
            ("/v1beta/models", false, Gemini),
            ("/v1beta/files/abc", false, Gemini),
            ("/gemini/v1beta/models/m:countTokens", false, Gemini),
            ("/v1/models/gemini-2.5-flash:generateContent", false, Gemini),
            ("/v1/models/m:streamGenerateContent?alt=sse", false, Gemini),
            ("/vertex/v1/models/m:embedContent", false, Gemini),
            ("/v1beta/models/m:generateContent", true, Anthropic),
            ("/v1beta/openai/chat/completions", false, OpenAi),
            ("/v1beta/openai", false, OpenAi),
            ("/gemini/v1beta/openai/models", false, OpenAi),
            ("/v1beta/", false, OpenAi),
            ("/v1/models/ft:gpt-4o:acme:abc", false, OpenAi),
            ("/v1/models/:generateContent", false, OpenAi),
            ("/v1/models/m:generateContentx", false, OpenAi),
            ("/a/b/v1beta/models/m:generateContent", false, OpenAi),
        ] {
            assert_eq!(WireShape::of_request(path, version), shape, "{path} {version}");
        }
    }

    /// Every answer on an Anthropic route: Anthropic's `"type": "error"` first, then the very
    /// `error` object of the OpenAI shape; status and headers unchanged.
    #[test]
    fn anthropic_shape_bytes_for_every_answer() {
        let every = [
            Answer::invalid_api_key(),
            Answer::provider_not_configured("anthropic"),
            Answer::upstream_unreachable(),
            Answer::upstream_timeout(),
            Answer::request_too_large(64),
            Answer::request_body_unreadable(),
            Answer::request_body_timeout(),
            Answer::body_memory_busy(),
            Answer::unknown_route(),
            Answer::invalid_host(),
            Answer::invalid_content_length(),
            Answer::invalid_transfer_encoding(),
            Answer::unsupported_transfer_coding(),
            Answer::budget_exceeded("organization", "month", "Monthly"),
            Answer::budget_unverifiable("key", "day", "Daily"),
            Answer::rate_limited(1500),
            Answer::model_not_allowed("claude-opus-4"),
            Answer::invalid_tags("at most 10 tags"),
            Answer::repeated_member("stream"),
            Answer::byte_order_mark(),
        ];
        for openai in every {
            let anthropic = openai.clone().shaped(WireShape::Anthropic);
            assert_eq!((anthropic.status, &anthropic.headers), (openai.status, &openai.headers));
            let inner = text(&openai).strip_prefix("{\n").expect("an object");
            assert_eq!(text(&anthropic), format!("{{\n  \"type\": \"error\",\n{inner}"));
            assert_eq!(openai.clone().shaped(WireShape::OpenAi), openai, "the OpenAI shape is the default");
        }
    }

    #[test]
    fn anthropic_shape_bytes_are_exact() {
        let answer = Answer::budget_exceeded("organization", "month", "Monthly").shaped(WireShape::Anthropic);
        assert_eq!(answer.status, 402);
        let expected = r#"{
  "type": "error",
  "error": {
    "message": "Monthly spend cap reached.",
    "type": "insufficient_quota",
    "param": null,
    "code": "budget_exceeded"
  }
}"#;
        assert_eq!(text(&answer), expected);
        let answer = Answer::invalid_api_key().shaped(WireShape::Anthropic);
        let expected = r#"{
  "type": "error",
  "error": {
    "message": "Invalid API key.",
    "type": "invalid_request_error",
    "param": null,
    "code": "invalid_api_key"
  }
}"#;
        assert_eq!(text(&answer), expected);
        let answer = Answer::model_not_allowed("claude-opus-4").shaped(WireShape::Anthropic);
        let expected = r#"{
  "type": "error",
  "error": {
    "message": "Model 'claude-opus-4' is not allowed for this key.",
    "type": "permission_error",
    "param": null,
    "code": "model_not_allowed"
  }
}"#;
        assert_eq!(text(&answer), expected);
    }

    /// The budget refusal on a Gemini route, byte for byte (docs/behaviour.md shows it).
    #[test]
    fn gemini_shape_bytes_are_exact() {
        let answer = Answer::budget_exceeded("organization", "month", "Monthly").shaped(WireShape::Gemini);
        assert_eq!(answer.status, 402);
        let expected = r#"{
  "error": {
    "code": 402,
    "message": "Monthly spend cap reached.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "BUDGET_EXCEEDED",
        "domain": "recovea",
        "metadata": {
          "type": "insufficient_quota",
          "code": "budget_exceeded"
        }
      }
    ]
  }
}"#;
        assert_eq!(text(&answer), expected);
    }

    /// Every answer on a Gemini route: Google's envelope, its `code` the HTTP status, the
    /// contract's message, type and code all there; status and headers unchanged.
    #[test]
    fn gemini_shape_for_every_answer() {
        let every = [
            (Answer::invalid_api_key(), "UNAUTHENTICATED"),
            (Answer::provider_not_configured("gemini"), "INVALID_ARGUMENT"),
            (Answer::upstream_unreachable(), "UNAVAILABLE"),
            (Answer::upstream_timeout(), "DEADLINE_EXCEEDED"),
            (Answer::request_too_large(64), "INVALID_ARGUMENT"),
            (Answer::request_body_unreadable(), "INVALID_ARGUMENT"),
            (Answer::request_body_timeout(), "DEADLINE_EXCEEDED"),
            (Answer::body_memory_busy(), "UNAVAILABLE"),
            (Answer::unknown_route(), "NOT_FOUND"),
            (Answer::invalid_host(), "INVALID_ARGUMENT"),
            (Answer::invalid_content_length(), "INVALID_ARGUMENT"),
            (Answer::invalid_transfer_encoding(), "INVALID_ARGUMENT"),
            (Answer::unsupported_transfer_coding(), "UNIMPLEMENTED"),
            (Answer::budget_exceeded("organization", "month", "Monthly"), "RESOURCE_EXHAUSTED"),
            (Answer::budget_unverifiable("key", "day", "Daily"), "UNAVAILABLE"),
            (Answer::rate_limited(1500), "RESOURCE_EXHAUSTED"),
            (Answer::model_not_allowed("gemini-2.5-pro"), "PERMISSION_DENIED"),
            (Answer::invalid_tags("at most 10 tags"), "INVALID_ARGUMENT"),
            (Answer::repeated_member("generationConfig.maxOutputTokens"), "INVALID_ARGUMENT"),
            (Answer::byte_order_mark(), "INVALID_ARGUMENT"),
        ];
        for (openai, google) in every {
            let gemini = openai.clone().shaped(WireShape::Gemini);
            assert_eq!((gemini.status, &gemini.headers), (openai.status, &openai.headers));
            let contract: serde_json::Value = serde_json::from_slice(&openai.body).expect("json");
            let (message, kind, code) =
                (&contract["error"]["message"], &contract["error"]["type"], &contract["error"]["code"]);
            let code_text = code.as_str().expect("a code");
            let expected = serde_json::json!({"error": {
                "code": openai.status,
                "message": message,
                "status": google,
                "details": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": code_text.to_ascii_uppercase(),
                    "domain": "recovea",
                    "metadata": {"type": kind, "code": code},
                }],
            }});
            let body: serde_json::Value = serde_json::from_slice(&gemini.body).expect("json");
            assert_eq!(body, expected, "{code_text}");
        }
    }

    #[test]
    fn google_statuses() {
        for (status, google) in [
            (400, "INVALID_ARGUMENT"),
            (401, "UNAUTHENTICATED"),
            (402, "RESOURCE_EXHAUSTED"),
            (403, "PERMISSION_DENIED"),
            (404, "NOT_FOUND"),
            (408, "DEADLINE_EXCEEDED"),
            (409, "ABORTED"),
            (413, "INVALID_ARGUMENT"),
            (429, "RESOURCE_EXHAUSTED"),
            (500, "INTERNAL"),
            (501, "UNIMPLEMENTED"),
            (502, "UNAVAILABLE"),
            (503, "UNAVAILABLE"),
            (504, "DEADLINE_EXCEEDED"),
            (599, "INTERNAL"),
            (418, "UNKNOWN"),
        ] {
            assert_eq!(google_status(status), google, "{status}");
        }
    }
}
