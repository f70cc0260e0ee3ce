//! The console's one way to the data: [`Control::route`], exactly as an admin API request takes it.

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::admin::{Caller, ReplyBody};
use crate::{ApiError, Control};

/// The API's refusal, as the console shows it: beside `param`'s field when it names one.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) param: Option<String>,
}

/// A request body, written from one of the API's own request types (`admin::requests`).
pub(crate) struct Body(Bytes);

impl Body {
    pub(crate) fn of(request: &impl serde::Serialize) -> Self {
        // The request types are strings, numbers and lists: they always serialise.
        Self(serde_json::to_vec(request).map(Bytes::from).unwrap_or_default())
    }
}

/// What the API answered: JSON, or the CSV of a receipts export.
pub(crate) enum Answered {
    Json(Value),
    Csv(String),
}

/// The admin API as one console visitor calls it: each change they make is audited as theirs.
pub(crate) struct ConsoleApi<'a> {
    pub(crate) control: &'a Control,
    pub(crate) caller: Caller,
}

impl ConsoleApi<'_> {
    /// Calls the admin API at `segments` (the path after `/admin/v1/`, each segment decoded) with a
    /// percent-encoded `query` and an optional JSON body.
    pub(crate) async fn api(
        &self,
        method: Method,
        segments: &[&str],
        query: &str,
        body: Option<Body>,
    ) -> Result<Answered, Refusal> {
        let body = body.map_or_else(Bytes::new, |Body(bytes)| bytes);
        let segments: Vec<String> = segments.iter().map(|s| (*s).to_owned()).collect();
        let query = query.to_owned();
        let (control, caller) = (self.control.clone(), self.caller.clone());
        // As in the API's server: a change and its publication run to the end even if the browser
        // goes away.
        let work = tokio::spawn(async move {
            let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
            control.route(caller, &method, &segments, &query, body).await
        });
        match work.await.unwrap_or_else(|e| Err(ApiError::internal(e))) {
            Ok(reply) => match reply.body {
                ReplyBody::Json(value) => Ok(Answered::Json(value)),
                ReplyBody::Raw(bytes) => serde_json::from_slice(&bytes)
                    .map(Answered::Json)
                    .map_err(|e| refusal(&ApiError::internal(e))),
                ReplyBody::Csv(text) => Ok(Answered::Csv(text)),
            },
            Err(error) => Err(refusal(&error)),
        }
    }

    /// [`Self::api`] for an answer that is JSON.
    pub(crate) async fn api_json(
        &self,
        method: Method,
        segments: &[&str],
        query: &str,
        body: Option<Body>,
    ) -> Result<Value, Refusal> {
        match self.api(method, segments, query, body).await? {
            Answered::Json(value) => Ok(value),
            Answered::Csv(_) => Err(refusal(&ApiError::internal("a CSV answer where JSON was expected"))),
        }
    }
}

/// The refusal as the API answers it: its status and message, beside the field the error names
/// (the body's `param`).
fn refusal(error: &ApiError) -> Refusal {
    let answer = error.answer();
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    let message = body["error"]["message"].as_str().unwrap_or("The request was refused.").to_owned();
    Refusal {
        status: StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_REQUEST),
        message,
        param: error.field().map(str::to_owned),
    }
}

/// A query string from pairs, percent-encoded as the API's parser expects; empty values left out.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, value) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&encode(name));
        out.push('=');
        out.push_str(&encode(value));
    }
    out
}

pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::query::Params;

    #[test]
    fn a_refusal_names_the_field_the_error_names() {
        let r = refusal(&ApiError::bad_field("limit_usd", "not a decimal amount"));
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.param.as_deref(), Some("limit_usd"));
        assert_eq!(r.message, "limit_usd: not a decimal amount");
        assert_eq!(refusal(&ApiError::NotFound("No key key_x.".into())).param, None);
        assert_eq!(refusal(&ApiError::bad_request("body: expected a JSON object")).param, None);
    }

    #[test]
    fn queries_round_trip_through_the_apis_parser() {
        let text = query(&[("from", "2026-12-01T00:00:00+01:00"), ("key_id", ""), ("model", "a b/c&d")]);
        let params = Params::parse(&text).expect("parses");
        assert_eq!(params.get("from"), Some("2026-12-01T00:00:00+01:00"));
        assert_eq!(params.get("key_id"), None, "empty values are left out");
        assert_eq!(params.get("model"), Some("a b/c&d"));
    }
}
