//! The answers the gateway gives itself (refusals and upstream failures): status, headers, body bytes.
//!
//! Bodies follow the contract's one shape, `{"error": {"message", "type", "param", "code"}}`, printed
//! with two-space indentation exactly as the product page shows them.

use serde::Serialize;

/// A complete answer, ready to be written by whichever HTTP layer carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

#[derive(Serialize)]
struct Envelope<'a> {
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
        let envelope = Envelope { error: ErrorBody { message, kind, param: None, code } };
        let body = serde_json::to_vec_pretty(&envelope).expect("a struct of strings always serialises");
        Self { status, headers: Vec::new(), body }
    }

    fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
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

    pub fn unknown_route() -> Self {
        Self::error(
            404,
            "invalid_request_error",
            "unknown_route",
            "Unknown path: the gateway serves /v1/... and /{provider}/v1/....",
        )
    }

    /// Adds a header; used by callers that extend an answer (for instance with a retry hint).
    pub fn header(self, name: &'static str, value: impl Into<String>) -> Self {
        self.with_header(name, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
