//! OpenAI's wire formats: chat, legacy completions, responses, embeddings, models and errors.

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;

use crate::request::{Answer, Ctx, json_string};
use crate::sse;
use crate::usage::{DEFAULT_EMBEDDING_DIMENSIONS, REPLY_PIECES, reply_piece, shapes};

/// Embedding vectors longer than this are refused, so a typo cannot make the mock allocate wildly.
const MAX_DIMENSIONS: usize = 4096;

/// `POST /v1/chat/completions`.
pub(crate) fn chat(ctx: &Ctx) -> Answer {
    let (n, created, model) = (ctx.n, ctx.created, &ctx.model);
    if !ctx.fields.stream() {
        return Answer::ok(format!(
            concat!(
                r#"{{"id":"chatcmpl-mock{}","object":"chat.completion","created":{},"model":{},"#,
                r#""choices":[{{"index":0,"message":{{"role":"assistant","content":"{}","#,
                r#""refusal":null,"annotations":[]}},"logprobs":null,"finish_reason":"stop"}}],"#,
                r#""usage":{},"service_tier":"{}","system_fingerprint":"fp_mock"}}"#
            ),
            n,
            created,
            model,
            ctx.reply_text(),
            ctx.usage_or(|input| shapes::chat(input, ctx.output_tokens())),
            ctx.fields.service_tier()
        ));
    }
    let head = format!(
        concat!(
            r#"{{"id":"chatcmpl-mock{}","object":"chat.completion.chunk","created":{},"model":{},"#,
            r#""service_tier":"{}","system_fingerprint":"fp_mock","choices":["#
        ),
        n,
        created,
        model,
        ctx.fields.service_tier()
    );
    // The real API adds `"usage":null` to every chunk only when the final usage chunk is coming.
    let tail = if ctx.fields.include_usage() { r#"],"usage":null}"# } else { "]}" };
    let chunk = |choice: &str| sse::data(&format!("{head}{choice}{tail}"));
    let mut events = Vec::with_capacity(ctx.pieces + 4);
    events.push(chunk(concat!(
        r#"{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"#,
        r#""logprobs":null,"finish_reason":null}"#
    )));
    // A long answer repeats the same few events: built once, shared.
    let deltas: Vec<Bytes> = REPLY_PIECES
        .iter()
        .map(|piece| {
            chunk(&format!(
                r#"{{"index":0,"delta":{{"content":"{piece}"}},"logprobs":null,"finish_reason":null}}"#
            ))
        })
        .collect();
    events.extend((0..ctx.pieces).map(|i| deltas[i % deltas.len()].clone()));
    events.push(chunk(r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}"#));
    if ctx.fields.include_usage() {
        let usage = ctx.usage_or(|input| shapes::chat(input, ctx.output_tokens()));
        events.push(sse::data(&format!(r#"{head}],"usage":{usage}}}"#)));
    }
    events.push(Bytes::from_static(sse::DONE.as_bytes()));
    Answer::Events(events)
}

/// `POST /v1/completions` (the legacy text completions).
pub(crate) fn completions(ctx: &Ctx) -> Answer {
    let head = format!(
        r#"{{"id":"cmpl-mock{}","object":"text_completion","created":{},"model":{},"system_fingerprint":"fp_mock","choices":["#,
        ctx.n, ctx.created, ctx.model
    );
    let usage = || ctx.usage_or(|input| shapes::legacy(input, ctx.output_tokens()));
    if !ctx.fields.stream() {
        return Answer::ok(format!(
            r#"{head}{{"text":"{}","index":0,"logprobs":null,"finish_reason":"stop"}}],"usage":{}}}"#,
            ctx.reply_text(),
            usage()
        ));
    }
    let tail = if ctx.fields.include_usage() { r#"],"usage":null}"# } else { "]}" };
    let chunk = |text: &str, finish: &str| {
        sse::data(&format!(
            r#"{head}{{"text":"{text}","index":0,"logprobs":null,"finish_reason":{finish}}}{tail}"#
        ))
    };
    let deltas: Vec<Bytes> = REPLY_PIECES.iter().map(|p| chunk(p, "null")).collect();
    let mut events: Vec<Bytes> = (0..ctx.pieces).map(|i| deltas[i % deltas.len()].clone()).collect();
    events.push(chunk("", r#""stop""#));
    if ctx.fields.include_usage() {
        events.push(sse::data(&format!(r#"{head}],"usage":{}}}"#, usage())));
    }
    events.push(Bytes::from_static(sse::DONE.as_bytes()));
    Answer::Events(events)
}

/// `POST /v1/responses`.
pub(crate) fn responses(ctx: &Ctx) -> Answer {
    let item_id = format!("msg_mock{}", ctx.n);
    let text = ctx.reply_text();
    let part = format!(r#"{{"type":"output_text","annotations":[],"logprobs":[],"text":"{text}"}}"#);
    let item = format!(
        r#"{{"id":"{item_id}","type":"message","status":"completed","content":[{part}],"role":"assistant"}}"#
    );
    let usage = ctx.usage_or(|input| shapes::responses(input, ctx.output_tokens()));
    let searches: String = (0..ctx.web_search_calls)
        .map(|i| {
            format!(
                r#"{{"id":"ws_mock{}_{i}","type":"web_search_call","status":"completed","action":{{"type":"search","query":"mock"}}}},"#,
                ctx.n
            )
        })
        .collect();
    let done = response_object(ctx, "completed", &format!("[{searches}{item}]"), &usage);
    if !ctx.fields.stream() {
        return Answer::ok(done);
    }
    let in_progress = response_object(ctx, "in_progress", "[]", "null");
    let at = r#""output_index":0,"content_index":0"#;
    let mut events = Vec::with_capacity(ctx.pieces + 8);
    let mut push = |kind: &str, rest: &str| {
        let json = format!(r#"{{"type":"{kind}","sequence_number":{},{rest}}}"#, events.len());
        events.push(sse::event(kind, &json));
    };
    push("response.created", &format!(r#""response":{in_progress}"#));
    push("response.in_progress", &format!(r#""response":{in_progress}"#));
    push(
        "response.output_item.added",
        &format!(
            r#""output_index":0,"item":{{"id":"{item_id}","type":"message","status":"in_progress","content":[],"role":"assistant"}}"#
        ),
    );
    push(
        "response.content_part.added",
        &format!(
            r#""item_id":"{item_id}",{at},"part":{{"type":"output_text","annotations":[],"logprobs":[],"text":""}}"#
        ),
    );
    for piece in (0..ctx.pieces).map(reply_piece) {
        push(
            "response.output_text.delta",
            &format!(r#""item_id":"{item_id}",{at},"delta":"{piece}","logprobs":[]"#),
        );
    }
    push(
        "response.output_text.done",
        &format!(r#""item_id":"{item_id}",{at},"text":"{text}","logprobs":[]"#),
    );
    push("response.content_part.done", &format!(r#""item_id":"{item_id}",{at},"part":{part}"#));
    push("response.output_item.done", &format!(r#""output_index":0,"item":{item}"#));
    push("response.completed", &format!(r#""response":{done}"#));
    Answer::Events(events)
}

/// The Responses API's `response` object.
fn response_object(ctx: &Ctx, status: &str, output: &str, usage: &str) -> String {
    format!(
        concat!(
            r#"{{"id":"resp_mock{}","object":"response","created_at":{},"status":"{}","#,
            r#""background":false,"error":null,"incomplete_details":null,"instructions":null,"#,
            r#""max_output_tokens":null,"model":{},"output":{},"parallel_tool_calls":true,"#,
            r#""previous_response_id":null,"reasoning":{{"effort":null,"summary":null}},"#,
            r#""service_tier":"{}","store":true,"temperature":1.0,"#,
            r#""text":{{"format":{{"type":"text"}}}},"tool_choice":"auto","tools":[],"top_p":1.0,"#,
            r#""truncation":"disabled","usage":{},"user":null,"metadata":{{}}}}"#
        ),
        ctx.n,
        ctx.created,
        status,
        ctx.model,
        output,
        ctx.fields.service_tier(),
        usage
    )
}

/// The forms `input` takes in an embeddings request.
#[derive(Deserialize)]
#[serde(untagged)]
enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Deserialize)]
struct EmbeddingRequest {
    input: EmbeddingInput,
}

/// `POST /v1/embeddings`.
pub(crate) fn embeddings(ctx: &Ctx, body: &[u8]) -> Answer {
    let Ok(request) = serde_json::from_slice::<EmbeddingRequest>(body) else {
        return invalid("'input' must be a string, an array of strings, or token arrays");
    };
    let seeds: Vec<u64> = match &request.input {
        EmbeddingInput::Text(t) => vec![fnv(t.as_bytes())],
        EmbeddingInput::Texts(ts) => ts.iter().map(|t| fnv(t.as_bytes())).collect(),
        EmbeddingInput::Tokens(ts) => vec![fnv_tokens(ts)],
        EmbeddingInput::TokenLists(ls) => ls.iter().map(|ts| fnv_tokens(ts)).collect(),
    };
    if seeds.is_empty() {
        return invalid("'input' must not be empty");
    }
    let dims = ctx.fields.dimensions.unwrap_or(DEFAULT_EMBEDDING_DIMENSIONS);
    if dims == 0 || dims > MAX_DIMENSIONS {
        return invalid("'dimensions' is out of range");
    }
    let base64 = match ctx.fields.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => return invalid("'encoding_format' must be 'float' or 'base64'"),
    };
    let mut data = String::new();
    for (index, seed) in seeds.iter().enumerate() {
        let values = (0..dims as u64).map(|j| embedding_value(*seed, j));
        let embedding = if base64 {
            let bytes: Vec<u8> = values.flat_map(f32::to_le_bytes).collect();
            format!("\"{}\"", base64_encode(&bytes))
        } else {
            // Printed as f64, whose shortest form of a multiple of 1/1024 is exact, so clients
            // read back precisely the f32 that the base64 form carries.
            let floats: Vec<String> = values.map(|v| f64::from(v).to_string()).collect();
            format!("[{}]", floats.join(","))
        };
        if index > 0 {
            data.push(',');
        }
        data.push_str(&format!(r#"{{"object":"embedding","index":{index},"embedding":{embedding}}}"#));
    }
    Answer::ok(format!(
        r#"{{"object":"list","data":[{data}],"model":{},"usage":{}}}"#,
        ctx.model,
        ctx.usage_or(shapes::embeddings)
    ))
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

fn fnv_tokens(tokens: &[i64]) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    fnv(&bytes)
}

/// Component `j` of the vector for `seed`: a multiple of 1/1024 in [-1, 1] (splitmix64 mixing).
fn embedding_value(seed: u64, j: u64) -> f32 {
    let mut z = seed.wrapping_add(j.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let step = i16::try_from(z % 2049).expect("below 2049") - 1024;
    f32::from(step) / 1024.0
}

/// Standard base64 with padding, as OpenAI encodes embeddings.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> shift & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The models `GET /v1/models` lists.
const MODELS: [&str; 4] = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small", "claude-sonnet-4-6"];

/// `GET /v1/models`.
pub(crate) fn models() -> Bytes {
    let data: Vec<String> = MODELS.iter().map(|m| model_object(m)).collect();
    format!(r#"{{"object":"list","data":[{}]}}"#, data.join(",")).into()
}

/// `GET /v1/models/{id}`: any id exists.
pub(crate) fn model(id: &str) -> Answer {
    Answer::ok(model_object(id))
}

fn model_object(id: &str) -> String {
    format!(r#"{{"id":{},"object":"model","created":1700000000,"owned_by":"recovea-mock"}}"#, json_string(id))
}

fn invalid(message: &str) -> Answer {
    Answer::Json(StatusCode::BAD_REQUEST, error_body(StatusCode::BAD_REQUEST, message))
}

/// OpenAI's error body for `status`, with the `type` and `code` the real API uses for it.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Bytes {
    let (kind, code) = match status.as_u16() {
        401 => ("invalid_request_error", "invalid_api_key"),
        403 => ("invalid_request_error", "permission_denied"),
        404 => ("invalid_request_error", "not_found"),
        409 => ("invalid_request_error", "conflict"),
        429 => ("requests", "rate_limit_exceeded"),
        500..=599 => ("server_error", "server_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    format!(
        r#"{{"error":{{"message":{},"type":"{kind}","param":null,"code":"{code}"}}}}"#,
        json_string(message)
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(&[0xff, 0xfe, 0xfd, 0x00]), "//79AA==");
    }

    #[test]
    fn embedding_values_are_exact_multiples_in_range() {
        for j in 0..64 {
            let v = embedding_value(fnv(b"hello"), j);
            assert!((-1.0..=1.0).contains(&v));
            assert_eq!((v * 1024.0).fract(), 0.0);
        }
        assert_ne!(embedding_value(fnv(b"a"), 0), embedding_value(fnv(b"b"), 0));
    }
}
