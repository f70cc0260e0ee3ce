//! Anthropic's wire formats: messages (JSON and SSE), token counting and errors.

use bytes::Bytes;
use http::StatusCode;

use crate::request::{Answer, Ctx, json_string};
use crate::sse;
use crate::usage::{REPLY_PIECES, shapes};

/// `POST /v1/messages`.
pub(crate) fn messages(ctx: &Ctx) -> Answer {
    let head =
        format!(r#"{{"id":"msg_mock{}","type":"message","role":"assistant","model":{},"#, ctx.n, ctx.model);
    let output = ctx.output_tokens();
    if !ctx.fields.stream() {
        return Answer::ok(format!(
            r#"{head}"content":[{{"type":"text","text":"{}"}}],"stop_reason":"end_turn","stop_sequence":null,"usage":{}}}"#,
            ctx.reply_text(),
            ctx.usage_or(|input| shapes::anthropic(input, output))
        ));
    }
    // The real stream reports one output token at the start and the final count at the end.
    let start_usage = ctx.usage_or(|input| shapes::anthropic(input, 1));
    let end_usage = ctx.usage_or(|_| format!(r#"{{"output_tokens":{output}}}"#));
    let mut events = Vec::with_capacity(ctx.pieces + 6);
    events.push(sse::event(
        "message_start",
        &format!(
            r#"{{"type":"message_start","message":{head}"content":[],"stop_reason":null,"stop_sequence":null,"usage":{start_usage}}}}}"#
        ),
    ));
    events.push(sse::event(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    ));
    events.push(sse::event("ping", r#"{"type": "ping"}"#));
    // A long answer repeats the same few events: built once, shared.
    let deltas: Vec<Bytes> = REPLY_PIECES
        .iter()
        .map(|piece| {
            sse::event(
                "content_block_delta",
                &format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{piece}"}}}}"#
                ),
            )
        })
        .collect();
    events.extend((0..ctx.pieces).map(|i| deltas[i % deltas.len()].clone()));
    events.push(sse::event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#));
    events.push(sse::event(
        "message_delta",
        &format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{end_usage}}}"#
        ),
    ));
    events.push(sse::event("message_stop", r#"{"type":"message_stop"}"#));
    Answer::Events(events)
}

/// `POST /v1/messages/count_tokens`.
pub(crate) fn count_tokens(ctx: &Ctx) -> Answer {
    Answer::ok(format!(r#"{{"input_tokens":{}}}"#, ctx.input_tokens))
}

/// Anthropic's error body for `status`, with the `type` the real API uses for it.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Bytes {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    format!(r#"{{"type":"error","error":{{"type":"{kind}","message":{}}}}}"#, json_string(message)).into()
}
