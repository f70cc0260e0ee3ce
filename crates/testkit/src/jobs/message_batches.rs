//! Anthropic's message batches (`/v1/messages/batches`).

use std::collections::HashSet;

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Data, EndStatus, Ids, Job, JobKind, JobRequest, LineApi, Outputs, Phase, State, answer_line,
    line_body_problem, next, ok,
};
use crate::clock;
use crate::request::Answer;

/// A batch expires 24 hours after its creation.
const WINDOW_MICROS: u64 = 24 * 3600 * 1_000_000;

/// A message batch's own data.
pub(super) struct Batch {
    pub(super) requests: Vec<Request>,
    /// JSONL, one result per request in input order, once it has ended.
    results: Option<Bytes>,
    counts: Counts,
}

pub(super) struct Request {
    custom_id: String,
    params: Bytes,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    succeeded: usize,
    errored: usize,
    canceled: usize,
    expired: usize,
}

#[derive(Deserialize)]
struct Create {
    requests: Vec<CreateRequest>,
}

#[derive(Deserialize)]
struct CreateRequest {
    custom_id: String,
    params: Value,
}

pub(super) fn status(phase: Phase) -> &'static str {
    match phase {
        Phase::Waiting | Phase::Running => "in_progress",
        Phase::Cancelling => "canceling",
        Phase::Ended(_) => "ended",
    }
}

/// `/v1/messages/batches...`.
pub(super) fn route(state: &mut State, req: &JobRequest) -> Answer {
    let rest = req.path.strip_prefix("/v1/messages/batches").unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let base = req.base_url;
    match (req.method.as_str(), segments.as_slice()) {
        ("POST", []) => create(state, req.body, base),
        ("GET", []) => {
            let data: Vec<Value> = state.jobs.iter().rev().filter_map(|j| object(j, base)).collect();
            let id = |v: Option<&Value>| v.map_or(Value::Null, |v| v["id"].clone());
            ok(
                &json!({"data": data, "has_more": false, "first_id": id(data.first()), "last_id": id(data.last())}),
            )
        }
        ("GET", [id]) => step(state, id, base, State::retrieve),
        ("POST", [id, "cancel"]) => step(state, id, base, State::cancel),
        ("GET", [id, "results"]) => {
            let results = state.find(id, JobKind::AnthropicBatch).and_then(|i| match &state.jobs[i].data {
                Data::AnthropicBatch(batch) => batch.results.clone(),
                _ => None,
            });
            results.map_or_else(
                || {
                    error(
                        StatusCode::NOT_FOUND,
                        &format!("No results for message batch {id}: it has not ended."),
                    )
                },
                |results| Answer::Raw("application/x-jsonl", results),
            )
        }
        ("DELETE", [id]) => match state.find(id, JobKind::AnthropicBatch) {
            None => unknown(id),
            Some(i) if !state.jobs[i].ended() => error(
                StatusCode::BAD_REQUEST,
                &format!("Message batch {id} is still processing: cancel it before deleting it."),
            ),
            Some(i) => {
                state.jobs.remove(i);
                ok(&json!({"id": id, "type": "message_batch_deleted"}))
            }
        },
        _ => error(StatusCode::NOT_FOUND, &format!("Invalid URL ({} {})", req.method, req.path)),
    }
}

fn step(state: &mut State, id: &str, base: &str, step: fn(&mut State, usize)) -> Answer {
    let Some(index) = state.find(id, JobKind::AnthropicBatch) else { return unknown(id) };
    step(state, index);
    object(&state.jobs[index], base).map_or_else(|| unknown(id), |v| ok(&v))
}

/// `POST /v1/messages/batches`.
fn create(state: &mut State, body: &[u8], base: &str) -> Answer {
    let create: Create = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) => return invalid(&format!("Invalid message batch request: {e}")),
    };
    if create.requests.is_empty() {
        return invalid("requests: at least one request is required");
    }
    let mut seen = HashSet::new();
    let mut requests = Vec::with_capacity(create.requests.len());
    for (i, request) in create.requests.into_iter().enumerate() {
        if let Some(problem) = line_body_problem(&request.params) {
            return invalid(&format!("requests.{i}.params: {problem}"));
        }
        if !seen.insert(request.custom_id.clone()) {
            return invalid(&format!("requests.{i}.custom_id: {:?} is not unique", request.custom_id));
        }
        requests
            .push(Request { custom_id: request.custom_id, params: Bytes::from(request.params.to_string()) });
    }
    let batch = Batch { requests, results: None, counts: Counts::default() };
    let id = format!("msgbatch_{}", next(&mut state.ids.message_batch));
    let index = state.push(Data::AnthropicBatch(batch), id);
    object(&state.jobs[index], base).map_or_else(|| invalid("batch"), |v| ok(&v))
}

/// The `message_batch` object of `job`, or `None` if it is no Anthropic batch.
fn object(job: &Job, base: &str) -> Option<Value> {
    let Data::AnthropicBatch(batch) = &job.data else { return None };
    let ended = job.ended();
    let processing = if ended { 0 } else { batch.requests.len() };
    let c = batch.counts;
    Some(json!({
        "id": job.id,
        "type": "message_batch",
        "processing_status": status(job.phase),
        "request_counts": {
            "processing": processing, "succeeded": c.succeeded, "errored": c.errored,
            "canceled": c.canceled, "expired": c.expired,
        },
        "ended_at": job.ended_at.map(clock::rfc3339),
        "created_at": clock::rfc3339(job.created),
        "expires_at": clock::rfc3339(job.created + WINDOW_MICROS),
        "cancel_initiated_at": job.cancelling_at.map(clock::rfc3339),
        "archived_at": null,
        "results_url": ended.then(|| format!("{base}/v1/messages/batches/{}/results", job.id)),
    }))
}

impl Batch {
    /// Results: the requests that ran succeeded; the others were canceled, expired or errored,
    /// as the batch ended.
    pub(super) fn finish(&mut self, out: &Outputs, ids: &mut Ids) {
        let mut results = String::new();
        let mut counts = Counts::default();
        for (i, request) in self.requests.iter().enumerate() {
            let result = if i < out.ran {
                let n = next(&mut ids.line);
                let answer = answer_line(LineApi::Messages, &request.params, n, None, out.settings.usage);
                let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                if answer.status == StatusCode::OK {
                    counts.succeeded += 1;
                    json!({"type": "succeeded", "message": body})
                } else {
                    counts.errored += 1;
                    json!({"type": "errored", "error": body})
                }
            } else {
                match out.status {
                    EndStatus::Cancelled => {
                        counts.canceled += 1;
                        json!({"type": "canceled"})
                    }
                    EndStatus::Expired => {
                        counts.expired += 1;
                        json!({"type": "expired"})
                    }
                    EndStatus::Failed | EndStatus::Completed => {
                        counts.errored += 1;
                        json!({"type": "errored", "error": {
                            "type": "error",
                            "error": {"type": "api_error", "message": "Internal server error (the mock's batch failed)."},
                        }})
                    }
                }
            };
            results.push_str(&json!({"custom_id": request.custom_id, "result": result}).to_string());
            results.push('\n');
        }
        self.results = Some(results.into());
        self.counts = counts;
    }
}

fn error(status: StatusCode, message: &str) -> Answer {
    Answer::Json(status, crate::anthropic::error_body(status, message))
}

fn invalid(message: &str) -> Answer {
    error(StatusCode::BAD_REQUEST, message)
}

fn unknown(id: &str) -> Answer {
    error(StatusCode::NOT_FOUND, &format!("No message batch with id {id}."))
}
