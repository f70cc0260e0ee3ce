//! A batch's lines answered as their endpoints answer lone requests, and what makes a line's body
//! impossible to run.

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;

use super::JobUsage;
use crate::clock;
use crate::request::{Answer, Ctx, Fields, json_string};
use crate::usage::{INPUT_TOKEN_OVERHEAD, REPLY_PIECES, input_tokens, shapes};

/// The API a batch line is answered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LineApi {
    Chat,
    Completions,
    Responses,
    Embeddings,
    Messages,
    Gemini,
}

/// A batch line answered as its endpoint answers a lone request.
pub(super) struct LineAnswer {
    pub(super) status: StatusCode,
    pub(super) body: Bytes,
    pub(super) input_tokens: u64,
    pub(super) output_tokens: u64,
}

/// Answers one line's `body` as `api` would, numbered `n`, with the job-level usage override if
/// any. `model` names the model when the body does not (Gemini's is in the URL).
pub(super) fn answer_line(
    api: LineApi,
    body: &[u8],
    n: u64,
    model: Option<&str>,
    usage: Option<JobUsage>,
) -> LineAnswer {
    // Lines were checked when the job was created; a default stands in for the impossible.
    let fields: Fields = serde_json::from_slice(body).unwrap_or_default();
    let pieces = REPLY_PIECES.len();
    let (input, output) = match usage {
        Some(u) => (u.input_tokens, u.output_tokens),
        None => (input_tokens(body).unwrap_or(INPUT_TOKEN_OVERHEAD), pieces as u64),
    };
    let output = if api == LineApi::Embeddings { 0 } else { output };
    let shape = match api {
        LineApi::Chat => shapes::chat(input, output),
        LineApi::Completions => shapes::legacy(input, output),
        LineApi::Responses => shapes::responses(input, output),
        LineApi::Embeddings => shapes::embeddings(input),
        LineApi::Messages => shapes::anthropic(input, output),
        LineApi::Gemini => shapes::gemini(input, output),
    };
    let ctx = Ctx {
        n,
        created: clock::seconds(clock::now_micros()),
        model: json_string(model.unwrap_or_else(|| fields.model())),
        fields: &fields,
        input_tokens: input,
        usage: Some(&shape),
        pieces,
        web_search_calls: 0,
    };
    let answer = match api {
        LineApi::Chat => crate::openai::chat(&ctx),
        LineApi::Completions => crate::openai::completions(&ctx),
        LineApi::Responses => crate::openai::responses(&ctx),
        LineApi::Embeddings => crate::openai::embeddings(&ctx, body),
        LineApi::Messages => crate::anthropic::messages(&ctx),
        LineApi::Gemini => crate::gemini::generate_content(&ctx, false, false),
    };
    let (status, body) = match answer {
        Answer::Json(status, body) => (status, body),
        // Streaming lines are refused at creation, so every answer is JSON.
        Answer::Events(_) | Answer::Raw(..) => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()),
    };
    let ok = status == StatusCode::OK;
    LineAnswer {
        status,
        body,
        input_tokens: if ok { input } else { 0 },
        output_tokens: if ok { output } else { 0 },
    }
}

/// Why a line's body cannot be run: not a JSON object, or asking to stream.
pub(super) fn line_body_problem(body: &Value) -> Option<&'static str> {
    if !body.is_object() {
        return Some("the request body must be a JSON object");
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return Some("streaming is not supported in batches");
    }
    None
}
