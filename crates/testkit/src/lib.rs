//! A scriptable mock of the OpenAI, Anthropic, Azure OpenAI and Gemini HTTP APIs for recovea's tests and benchmarks.
//!
//! [`MockProvider`] serves, on one port, faithful copies of the providers' wire formats (JSON and
//! SSE), records every request it receives, and applies scripted [`Behaviour`]s (errors, delays,
//! cut streams, dropped connections, usage overrides) to the next requests, in FIFO order.
//!
//! The `recovea-mock-provider` binary serves the same thing for black-box tests and benchmarks:
//! `recovea-mock-provider [--listen ADDR] [--max-recorded N] [--tls [--h2-max-streams N]]`
//! (default `127.0.0.1:0`, log unbounded, plain HTTP) prints exactly one line,
//! `listening on http://HOST:PORT` (`https://` with `--tls`), once it accepts connections, then
//! serves until killed. Benchmarks should pass `--max-recorded 0`. Over TLS it presents the tests'
//! certificate for `127.0.0.1` ([`tls`]) and offers HTTP/2, whose connections allow
//! `--h2-max-streams` concurrent streams (100 by default), then HTTP/1.1.
//!
//! # Endpoints
//!
//! | Method and path | Answer |
//! |---|---|
//! | `POST /v1/chat/completions` | `chat.completion`, or `chat.completion.chunk` SSE ending in `data: [DONE]` |
//! | `POST /v1/completions` | `text_completion`, or its SSE chunks ending in `data: [DONE]` |
//! | `POST /v1/responses` | `response`, or the typed `response.*` SSE events |
//! | `POST /v1/embeddings` | `list` of `embedding`s, `float` or `base64` (little-endian f32) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | OpenAI-shaped model list / model |
//! | `POST /v1/messages` | Anthropic `message`, or its SSE event sequence |
//! | `POST /v1/messages/count_tokens` | `{"input_tokens": N}` |
//! | `POST /openai/deployments/{deployment}/...?api-version=V`, `/openai/v1/...`, `/v1beta/openai/...` | as the `/v1/...` path after them (Azure OpenAI, Gemini's OpenAI-compatible endpoint); a deployment without `api-version` is a 404; a body without `model` is answered with the deployment's name |
//! | `POST /v1beta/models/{model}:generateContent` (or `/v1/models/...`) | a Gemini `GenerateContentResponse` naming `{model}` in `modelVersion` |
//! | `POST /v1beta/models/{model}:streamGenerateContent` | one response per piece: `data:` events ending in CRLF CRLF with `alt=sse`, else one JSON array |
//! | `GET /__mock/requests` | the log: `[{"method","path","headers":[[name,value],...],"body":"<lossy UTF-8>"}]` |
//! | `POST /__mock/script` | queue a [`Behaviour`] given as JSON; 204 |
//! | `POST /__mock/reset` | clear the log and the script, restart request numbering; 204 |
//! | anything else | 404 with a provider-shaped error |
//!
//! Paths starting with `/v1/messages` are "Anthropic paths": their errors use Anthropic's shape
//! and their answers carry `request-id: mock-req-<n>`. All other answers use OpenAI's error shape
//! and carry `x-request-id: mock-req-<n>`. `n` counts provider requests from 1 (control calls
//! are not counted) and restarts at 1 on reset.
//!
//! # The answer and its usage figures
//!
//! Every generated answer is the text [`REPLY_TEXT`] (`"This is a mock response."`), streamed as
//! the [`REPLY_PIECES`] `["This", " is", " a", " mock", " response."]`, one delta per piece.
//! A scripted [`Behaviour::pieces`] (`{"pieces": 600}`) makes it that many pieces long instead:
//! [`REPLY_PIECES`] repeated in turn ([`reply_text`]), one delta each, so that a stream paced by
//! `chunk_delay_ms` lasts as long as a model's (600 pieces at 33 ms: 20 s).
//!
//! * **Input tokens** = [`INPUT_TOKEN_OVERHEAD`] (1) + the number of whitespace-separated words
//!   (Rust's `str::split_whitespace`, like Python's `str.split()`) in every JSON string found,
//!   at any depth, as the value of a key named `content`, `text`, `input`, `prompt`, `system` or
//!   `instructions` (directly, or inside arrays under such a key), + 1 for every integer in such a
//!   place (token arrays). Keys of nested objects are judged on their own: in
//!   `{"content":[{"type":"text","text":"hi there"}]}` only `"hi there"` counts, so that message
//!   costs 2 words. [`input_tokens`] computes it from a request body.
//!   Example: `{"messages":[{"role":"user","content":"Say hello"}]}` has 2 + 1 = 3 input tokens.
//! * **Output tokens** = the number of pieces sent = [`OUTPUT_TOKENS`] (5), or the scripted
//!   [`Behaviour::pieces`].
//! * Cached, cache-creation, reasoning, audio and prediction token counts are 0.
//! * Totals are input + output.
//!
//! Usage objects per endpoint (`P` = input tokens; the 5 output tokens are the pieces sent):
//!
//! * chat: `{"prompt_tokens":P,"completion_tokens":5,"total_tokens":P+5,
//!   "prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},
//!   "completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,
//!   "accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`
//! * legacy completions: `{"prompt_tokens":P,"completion_tokens":5,"total_tokens":P+5}`
//! * responses: `{"input_tokens":P,"input_tokens_details":{"cached_tokens":0},"output_tokens":5,
//!   "output_tokens_details":{"reasoning_tokens":0},"total_tokens":P+5}`
//! * embeddings: `{"prompt_tokens":P,"total_tokens":P}`
//! * Gemini: `{"promptTokenCount":P,"candidatesTokenCount":5,"totalTokenCount":P+5,
//!   "promptTokensDetails":[{"modality":"TEXT","tokenCount":P}]}`; in a stream, every event but the
//!   last carries `{"promptTokenCount":P,"totalTokenCount":P}`, the last the whole count and
//!   `finishReason: "STOP"`. Errors on Gemini's paths: `{"error":{"code","message","status"}}`.
//! * messages: `{"input_tokens":P,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,
//!   "output_tokens":5}`; when streaming, `message_start` carries it with `output_tokens: 1` and
//!   `message_delta` carries `{"output_tokens":5}`.
//!
//! A scripted [`Behaviour::usage`] replaces the usage object verbatim: in the JSON answer, in the
//! final usage chunk of chat/legacy streams (only sent when `stream_options.include_usage` is
//! true), in `response.completed`, in both `message_start` and `message_delta`, and in Gemini's
//! `usageMetadata` (the last event of a stream).
//!
//! # Embeddings
//!
//! Each input (a string, each string of an array, a token array, or each token array of an array)
//! gets one vector of `dimensions` values (default [`DEFAULT_EMBEDDING_DIMENSIONS`], 8). Values are a
//! deterministic function of the input and are multiples of 1/1024 in [-1, 1], so the `float`
//! and `base64` encodings decode to exactly the same numbers.

mod anthropic;
mod body;
mod gemini;
mod openai;
pub mod otlp;
pub mod proxy;
mod request;
mod script;
mod server;
mod sse;
pub mod tls;
mod usage;

pub use script::{Behaviour, InvalidBehaviour, RecordedRequest};
pub use server::{MockProvider, Transport};
pub use usage::{
    DEFAULT_EMBEDDING_DIMENSIONS, INPUT_TOKEN_OVERHEAD, MAX_PIECES, OUTPUT_TOKENS, REPLY_PIECES, REPLY_TEXT,
    input_tokens, reply_piece, reply_text,
};
