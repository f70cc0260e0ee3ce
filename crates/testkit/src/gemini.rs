//! Google Gemini's native wire formats: `generateContent` (JSON), `streamGenerateContent` (a JSON
//! array, or events with `alt=sse`) and errors.

use bytes::Bytes;
use http::StatusCode;

use crate::request::{Answer, Ctx, json_string};
use crate::usage::{REPLY_PIECES, shapes};

/// `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent`; `sse`: the query
/// asked for `alt=sse`.
pub(crate) fn generate_content(ctx: &Ctx, stream: bool, sse: bool) -> Answer {
    let output = ctx.output_tokens();
    let final_usage = ctx.usage_or(|input| shapes::gemini(input, output));
    if !stream {
        return Answer::ok(response(ctx, &ctx.reply_text(), Some("STOP"), &final_usage));
    }
    // Every chunk of a real stream reports usage: the prompt's so far, the whole count at the end.
    let partial_usage = shapes::gemini_prompt_only(ctx.input_tokens);
    let chunks: Vec<String> = (0..ctx.pieces)
        .map(|i| {
            let last = i + 1 == ctx.pieces;
            let usage = if last { final_usage.as_ref() } else { partial_usage.as_str() };
            response(ctx, REPLY_PIECES[i % REPLY_PIECES.len()], last.then_some("STOP"), usage)
        })
        .collect();
    if sse {
        // Gemini ends its events with CRLF CRLF.
        return Answer::Events(
            chunks.iter().map(|chunk| Bytes::from(format!("data: {chunk}\r\n\r\n"))).collect(),
        );
    }
    Answer::ok(format!("[{}]", chunks.join("\n,\r\n")))
}

fn response(ctx: &Ctx, text: &str, finish: Option<&str>, usage: &str) -> String {
    let finish = finish.map_or_else(String::new, |reason| format!(r#","finishReason":"{reason}""#));
    format!(
        concat!(
            r#"{{"candidates":[{{"content":{{"parts":[{{"text":{}}}],"role":"model"}}{},"index":0}}],"#,
            r#""usageMetadata":{},"modelVersion":{},"responseId":"mock-resp-{}"}}"#
        ),
        json_string(text),
        finish,
        usage,
        ctx.model,
        ctx.n
    )
}

/// Gemini's error body: `{"error": {"code", "message", "status"}}`.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Bytes {
    let name = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    };
    format!(
        r#"{{"error":{{"code":{},"message":{},"status":"{name}"}}}}"#,
        status.as_u16(),
        json_string(message)
    )
    .into()
}
