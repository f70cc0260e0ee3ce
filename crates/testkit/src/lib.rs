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
//! | `POST /v1/responses` | `response`, or the typed `response.*` SSE events; with `"background": true` a queued background response (see [Deferred jobs](#deferred-jobs)) |
//! | `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` | a background response, advanced or cancelled; the last 1,024 foreground responses can be retrieved too (as completed), not cancelled (400) |
//! | `POST /v1/embeddings` | `list` of `embedding`s, `float` or `base64` (little-endian f32) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | OpenAI-shaped model list / model |
//! | `POST /v1/images/generations`, `/v1/images/edits` (JSON or a multipart form) | `n` images: DALL-E's as URLs without usage, gpt-image's as `b64_json` with token usage (the prompt's words + 1 in, 4,160 output tokens an image) |
//! | `POST /v1/audio/speech` | raw audio (`audio/mpeg`); with `stream_format: "sse"`, a `speech.audio.delta` then `speech.audio.done` with usage (the input's words in, 5 audio tokens a word out) |
//! | `POST /v1/audio/transcriptions`, `/v1/audio/translations` (a multipart form) | `{"text","usage"}`: whisper-1 `{"type":"duration","seconds"}` (one second per 16,000 bytes of `file`, at least one), other models `{"type":"tokens",...}` (ten audio tokens a second); `verbose_json` a `duration` instead; `text`, `srt`, `vtt` plain text without usage |
//! | `POST /v1/messages` | Anthropic `message`, or its SSE event sequence |
//! | `POST /v1/messages/count_tokens` | `{"input_tokens": N}` |
//! | `POST /openai/deployments/{deployment}/...?api-version=V`, `/openai/v1/...`, `/v1beta/openai/...` | as the `/v1/...` path after them (Azure OpenAI, Gemini's OpenAI-compatible endpoint); a deployment without `api-version` is a 404; a body without `model` is answered with the deployment's name |
//! | `POST /v1beta/models/{model}:generateContent` (or `/v1/models/...`) | a Gemini `GenerateContentResponse` naming `{model}` in `modelVersion` |
//! | `POST /v1beta/models/{model}:streamGenerateContent` | one response per piece: `data:` events ending in CRLF CRLF with `alt=sse`, else one JSON array |
//! | `POST /v1/files` (`multipart/form-data` with `purpose` and `file`) | the `file` object: `id` (`file-N`), `object: "file"`, `bytes`, `created_at`, `expires_at` (30 days on for `batch` and `batch_output` files, else null), `filename`, `purpose`, `status: "processed"`; 400 without a boundary, `purpose` or `file` |
//! | `GET /v1/files`, `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}` | `{"object":"list","data":[...],"has_more":false}`; the file object; its bytes (`application/octet-stream`); `{"id","object":"file","deleted":true}`; 404 for an unknown id |
//! | `POST /v1/batches`, `GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel` | an OpenAI `batch` object; the list (newest first, `first_id`, `last_id`, `has_more: false`); see [Deferred jobs](#deferred-jobs) |
//! | `/openai/files...?api-version=V`, `/openai/batches...?api-version=V` | as `/v1/files...`, `/v1/batches...` (Azure's legacy paths; 404 without `api-version`); `/openai/v1/files...` and `/openai/v1/batches...` need none |
//! | `POST /v1/messages/batches`, `GET /v1/messages/batches`, `GET /v1/messages/batches/{id}`, `POST .../{id}/cancel`, `GET .../{id}/results`, `DELETE .../{id}` | an Anthropic `message_batch`; the list (`data`, `has_more`, `first_id`, `last_id`); its results as JSONL (`application/x-jsonl`, 404 before it ended); `{"id","type":"message_batch_deleted"}` (400 while processing) |
//! | `POST /v1beta/models/{model}:batchGenerateContent`, `GET /v1beta/batches`, `GET /v1beta/batches/{n}`, `POST /v1beta/batches/{n}:cancel`, `DELETE /v1beta/batches/{n}` | a Gemini batch operation; `{"operations":[...]}`; the operation; `{}`; `{}` |
//! | `GET /v1/realtime?model=M`, `/openai/v1/realtime?model=M`, `/openai/realtime?api-version=V&deployment=D`, with a WebSocket upgrade | a Realtime session (see [Realtime](#realtime)) |
//! | `GET /__mock/requests` | the log: `[{"method","path","headers":[[name,value],...],"body":"<lossy UTF-8>","at_ms"}]` (`at_ms`: when the head was read, milliseconds since the Unix epoch) |
//! | `POST /__mock/script` | queue a [`Behaviour`] given as JSON; 204 |
//! | `POST /__mock/reset` | clear the log, the script, the jobs, files and job settings, and the queued Realtime usages; restart request and job numbering; 204 (open Realtime sessions stay open) |
//! | `GET /__mock/jobs` | every job, oldest first: `[{"id","kind","status","retrievals"}]` ([`JobInfo`]) |
//! | `POST /__mock/jobs/{id}` `{"status":"completed"\|"failed"\|"expired"\|"cancelled","ran":N}` (`ran` optional) | ends the job now ([`JobEnd`]); 200 with it as listed; 404 unknown, 409 already ended, 400 for a bad body, `ran` over the batch's lines or an expired response |
//! | `GET /__mock/jobs/settings`, `POST /__mock/jobs/settings` | the [`JobSettings`] in force: `{"retrievals_to_finish","usage","cancel_ran","partial_usage"}`; a POST replaces the fields it names (`null`: back to the default) and answers the result |
//! | `POST /__mock/jobs/usage` `{"input_tokens":I,"output_tokens":O}` or `null` | sets (or clears) the job usage override; 204 |
//! | `GET /__mock/realtime` | `{"open_sessions":N,"queued_usages":M}` |
//! | `POST /__mock/realtime/usage` `[usage, ...]` | appends usage objects to the Realtime queue; 204 |
//! | `POST /__mock/realtime/close` `{"code":C,"reason":"..."}` (`reason` optional) | closes every open session with that close frame; `{"closed":N}`; 400 for a code or reason no close frame can carry |
//! | anything else | 404 with a provider-shaped error |
//!
//! Paths starting with `/v1/messages` are "Anthropic paths": their errors use Anthropic's shape
//! and their answers carry `request-id: mock-req-<n>`. All other answers use OpenAI's error shape
//! and carry `x-request-id: mock-req-<n>`. `n` counts provider requests from 1 (control calls
//! are not counted) and restarts at 1 on reset. Errors on `/v1beta/` paths (other than
//! `/v1beta/openai/`) use Gemini's shape. The script applies to job and Realtime handshake
//! requests like any other (a scripted status answers instead of the job or the upgrade), not to
//! WebSocket frames.
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
//! Chat and Responses answers report the `service_tier` the request asked for when it is `flex` or
//! `priority` (`fast` as `priority`), else `default`. A scripted [`Behaviour::web_search_calls`]
//! lists that many `web_search_call` items before a Responses answer's message.
//!
//! A scripted [`Behaviour::usage`] replaces the usage object verbatim: in the JSON answer, in the
//! final usage chunk of chat/legacy streams (only sent when `stream_options.include_usage` is
//! true), in `response.completed`, in both `message_start` and `message_delta`, and in Gemini's
//! `usageMetadata` (the last event of a stream).
//!
//! # Deferred jobs
//!
//! The mock keeps jobs the way the providers do, so that tests can watch the gateway hold and
//! settle them. In-process: [`MockProvider::jobs`], [`MockProvider::end_job`],
//! [`MockProvider::set_retrievals_to_finish`], [`MockProvider::set_job_usage`],
//! [`MockProvider::set_cancel_ran`], [`MockProvider::set_partial_usage`],
//! [`MockProvider::set_job_settings`].
//!
//! * **Ids** count up per mock and kind from 1, and restart on reset: `file-N` (uploads and
//!   output files alike), `batch_N`, `msgbatch_N`, `batches/N`; a background response is
//!   `resp_mock<n>`, `n` the number of the request that created it.
//! * **Advancing.** Each retrieval of a job's object by anyone (`GET /v1/batches/{id}`,
//!   `GET /v1/responses/{id}`, `GET /v1/messages/batches/{id}`, `GET /v1beta/batches/{n}`; not
//!   lists, results or file reads) counts one, and the retrieval numbered
//!   `retrievals_to_finish` (default 2, taken when the job is created) answers it completed; those
//!   before answer it running. 0: it never ends by being retrieved. So by default:
//!
//!   | Kind | Created | 1st retrieval | 2nd retrieval | Cancel | Next retrieval |
//!   |---|---|---|---|---|---|
//!   | OpenAI batch | `validating` | `in_progress` | `completed` | `cancelling` | `cancelled` |
//!   | Background response | `queued` | `in_progress` | `completed` | `cancelled` at once | |
//!   | Anthropic batch | `in_progress` | `in_progress` | `ended` | `canceling` | `ended` |
//!   | Gemini batch | `BATCH_STATE_PENDING` | `BATCH_STATE_RUNNING` | `BATCH_STATE_SUCCEEDED` | `BATCH_STATE_CANCELLED` at once (answer `{}`) | |
//!
//!   Cancelling an ended job leaves it as it is and answers it. A test ends a job at once with
//!   `POST /__mock/jobs/{id}`: `completed`, `failed`, `expired` (batches only; an OpenAI batch
//!   `expired`, an Anthropic one `ended`, a Gemini one `BATCH_STATE_EXPIRED`) or `cancelled`.
//! * **Lines that ran.** A batch cut short runs its first `ran` lines: the `ran` of the end call,
//!   else the `cancel_ran` setting, else half its lines rounded down (a completed batch runs them
//!   all). For a background response, `ran` is the output tokens it had produced.
//! * **Usage of each line or response.** Computed when the job ends, from the settings then in
//!   force. With the `usage` override `{"input_tokens":I,"output_tokens":O}` set, every line and
//!   background response reports exactly I in and O out, in its endpoint's usage shape (chat's
//!   `prompt_tokens`/`completion_tokens`, responses' and Anthropic's `input_tokens`/`output_tokens`,
//!   Gemini's `promptTokenCount`/`candidatesTokenCount`, embeddings' `prompt_tokens` only);
//!   its text stays [`REPLY_TEXT`]. Without it, the usual rules: input tokens from the line's body
//!   (or the response's request body) by [`input_tokens`], output tokens = the pieces, 5 (a
//!   background response keeps a scripted `usage` or `pieces` of the request that created it).
//!   A background response cut short (`cancelled`, `failed`) has no output and reports `ran`
//!   output tokens if given, else the `partial_usage` setting, else its input tokens (I under the
//!   override) and 0 out.
//! * **OpenAI batches.** `POST /v1/batches` takes `input_file_id`, `endpoint`
//!   (`/v1/chat/completions`, `/v1/completions`, `/v1/responses` or `/v1/embeddings`; Azure's
//!   spelling without `/v1` too), `completion_window` (`24h`) and optional `metadata`; an unknown
//!   file, another endpoint or window, or a line that is not `{custom_id, method: "POST", url
//!   (the endpoint), body}` with a unique `custom_id` and a non-streaming object body is a 400.
//!   The object has `model` (the first line's), `request_counts` `{total, completed, failed}`,
//!   the Unix times `created_at`, `in_progress_at`, `expires_at` (+24 h), `finalizing_at` and
//!   `completed_at`, `failed_at`, `expired_at`, `cancelling_at`, `cancelled_at`, `errors` (one
//!   `batch_failed` entry when failed), and, once ended, `output_file_id` (`purpose:
//!   "batch_output"`, always created, maybe empty), `error_file_id` (only when there are error
//!   lines) and `usage` (the sum over the lines that succeeded, in the Responses shape). Output
//!   lines: `{"id":"batch_req_N","custom_id","response":{"status_code":200,"request_id",
//!   "body":<the endpoint's JSON answer>},"error":null}`, input order; a line answered with
//!   another status goes to the error file. An expired batch's unrun lines go to the error file
//!   as `{"response":null,"error":{"code":"batch_expired",...}}`. `request_counts.completed` is
//!   the lines that succeeded; `failed` counts error lines and, for failed and expired batches,
//!   the unrun ones (a cancelled batch does not count them).
//! * **Background responses** have `background: true`, `output: []` and `usage: null` until
//!   completed, then the normal `response` with `completed_at`; a failed one has `error`
//!   `{"code":"server_error",...}`. A `stream` flag on a background request is ignored.
//! * **Anthropic batches** take `{"requests":[{"custom_id","params"}]}` (unique ids, non-streaming
//!   object params). The object has `request_counts` `{processing, succeeded, errored, canceled,
//!   expired}` (processing = all until it ends), RFC 3339 `created_at`, `expires_at` (+24 h),
//!   `ended_at`, `cancel_initiated_at`, `archived_at: null`, and `results_url` once ended: the
//!   mock's own URL (`http://127.0.0.1:PORT/v1/messages/batches/{id}/results`; from the `Host`
//!   header when the mock listens on an unspecified address). Results, one line per request in
//!   input order: `{"custom_id","result":{"type":"succeeded","message":<a message>}}` for those
//!   that ran, then `{"type":"canceled"}`, `{"type":"expired"}` or, for a failed end,
//!   `{"type":"errored","error":{"type":"error","error":{"type":"api_error",...}}}`.
//! * **Gemini batches** take inlined requests only (`{"batch":{"display_name","input_config":
//!   {"requests":{"requests":[{"request","metadata"}]}}}}`, camelCase accepted; a file input is a
//!   400). The operation: `name` `batches/N`, `metadata` (`@type` `...v1beta.GenerateContentBatch`,
//!   `model: "models/{model}"`, `displayName`, `name`, RFC 3339 `createTime`, `updateTime`,
//!   `endTime`, `batchStats` with int64-as-string counts, zero counts left out, `state`), and once
//!   ended `done: true`, `metadata.output` and `response` (`@type`
//!   `...GenerateContentBatchOutput`, `inlinedResponses.inlinedResponses`: `{"response":
//!   <a GenerateContentResponse>,"metadata"}` for each request that ran); a failed batch has
//!   `error` `{"code":13,...}` instead of `response`.
//!
//! # Realtime
//!
//! `GET` on a Realtime path with `Upgrade: websocket`, `Connection: Upgrade`,
//! `Sec-WebSocket-Version: 13` and a `Sec-WebSocket-Key` is answered `101 Switching Protocols`
//! (HTTP/1.1 only) when it carries `Authorization: Bearer <token>` or `api-key: <key>`; without
//! either, 401 with OpenAI's `invalid_api_key` error; without the upgrade headers, 400. The
//! session's model is the `model` (or Azure's `deployment`) query parameter, else
//! `gpt-realtime`. Events use the GA names, or the beta ones (`response.text.delta`,
//! `response.audio.delta`, `conversation.item.created`, `modalities`) when the handshake carries
//! `OpenAI-Beta: realtime=v1`.
//!
//! * On connect: `session.created` (output modalities `["text"]`: the mock's default, the
//!   real one is audio). Every server event has an `event_id`.
//! * `session.update`: its `session.output_modalities` (beta: `modalities`), if any, become the
//!   session's; answered `session.updated`.
//! * `conversation.item.create`: `conversation.item.added` then `conversation.item.done`, the
//!   item with an `id` (kept if given) and `status: "completed"`.
//! * `input_audio_buffer.commit` / `.clear`: `input_audio_buffer.committed` / `.cleared`.
//!   `input_audio_buffer.append`, `output_audio_buffer.clear`, `conversation.item.retrieve`,
//!   `.truncate`, `.delete` and `response.cancel` are taken silently; other types, a missing
//!   `type` or text that is not JSON get an `error` event (`invalid_request_error`).
//! * `response.create`: `response.created` (`in_progress`, `usage: null`),
//!   `response.output_item.added`, `response.content_part.added`, then per piece of
//!   [`REPLY_PIECES`] a `response.output_text.delta` or, when the response's
//!   `output_modalities` (else the session's) hold `audio`, a `response.output_audio.delta` (480
//!   bytes of silence, base64) and a `response.output_audio_transcript.delta`; then the matching
//!   `.done` events, `response.content_part.done`, `response.output_item.done` and
//!   `response.done`, whose `response.usage` is the next queued usage object, verbatim
//!   ([`MockProvider::queue_realtime_usage`], `POST /__mock/realtime/usage`; one per response,
//!   across sessions, in order), else [`DEFAULT_REALTIME_USAGE`] (10 text tokens in, 5 out).
//!   [`RealtimeUsage`] builds the GA shape: `{total_tokens, input_tokens, output_tokens,
//!   input_token_details: {text_tokens, audio_tokens, image_tokens, cached_tokens,
//!   cached_tokens_details: {text_tokens, audio_tokens, image_tokens}}, output_token_details:
//!   {text_tokens, audio_tokens}}`. The string [`UNFINISHED_RESPONSE`] (`"unfinished"`) queued in
//!   place of a usage makes that response stop after its deltas: it never ends.
//! * Pings are answered with pongs at once, a client's close frame with a close frame.
//! * The log records the handshake as a request like any other, then every text (and binary)
//!   frame the client sends as an entry with method `WS`, the handshake's path and query, and the
//!   frame's text as body, so a test can tell which client events reached the provider.
//! * [`MockProvider::realtime_sessions`] (`GET /__mock/realtime`) counts open sessions;
//!   [`MockProvider::close_realtime_sessions`] (`POST /__mock/realtime/close`) sends every open
//!   session a close frame with the given code and reason, waits up to a second for the client's,
//!   and ends it. Sessions opened later are not concerned; reset leaves sessions open.
//!
//! # Embeddings
//!
//! Each input (a string, each string of an array, a token array, or each token array of an array)
//! gets one vector of `dimensions` values (default [`DEFAULT_EMBEDDING_DIMENSIONS`], 8). Values are a
//! deterministic function of the input and are multiples of 1/1024 in [-1, 1], so the `float`
//! and `base64` encodings decode to exactly the same numbers.

mod anthropic;
mod body;
mod clock;
pub mod faults;
mod gemini;
pub mod jobs;
mod media;
mod multipart;
mod openai;
pub mod otlp;
pub mod pki;
pub mod proxy;
pub mod realtime;
pub mod redis_topologies;
mod request;
mod script;
mod server;
mod sse;
pub mod tls;
mod usage;
pub mod wait;

pub use jobs::{EndStatus, JobEnd, JobError, JobInfo, JobKind, JobSettings, JobUsage};
pub use realtime::{DEFAULT_REALTIME_USAGE, RealtimeUsage, UNFINISHED_RESPONSE};
pub use script::{Behaviour, InvalidBehaviour, RecordedRequest};
pub use server::{MockProvider, Transport};
pub use usage::{
    DEFAULT_EMBEDDING_DIMENSIONS, INPUT_TOKEN_OVERHEAD, MAX_PIECES, OUTPUT_TOKENS, REPLY_PIECES, REPLY_TEXT,
    input_tokens, reply_piece, reply_text,
};
pub use wait::eventually;
