//! Gemini's batches: `POST /v1beta/models/{model}:batchGenerateContent` and `/v1beta/batches...`,
//! long-running operations whose `metadata` is the batch.

use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    Data, EndStatus, Ids, Job, JobKind, JobRequest, LineApi, Outputs, Phase, State, answer_line, next, ok,
};
use crate::clock;
use crate::request::Answer;

const BATCH_TYPE: &str = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch";
const OUTPUT_TYPE: &str =
    "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput";

/// A Gemini batch's own data.
pub(super) struct Batch {
    /// As named in the create URL, without `models/`.
    model: String,
    display_name: Option<String>,
    pub(super) requests: Vec<Request>,
    /// The inlined responses of the requests that ran, once it has ended.
    output: Option<Vec<Value>>,
    succeeded: usize,
    failed: usize,
}

pub(super) struct Request {
    request: Bytes,
    metadata: Value,
}

// The API takes proto field names in snake_case or lowerCamelCase alike.
#[derive(Deserialize)]
struct Create {
    batch: CreateBatch,
}

#[derive(Deserialize)]
struct CreateBatch {
    #[serde(default, alias = "displayName")]
    display_name: Option<String>,
    #[serde(alias = "inputConfig")]
    input_config: InputConfig,
}

#[derive(Deserialize)]
struct InputConfig {
    #[serde(default)]
    requests: Option<Inlined>,
    #[serde(default, alias = "fileName")]
    file_name: Option<String>,
}

#[derive(Deserialize)]
struct Inlined {
    requests: Vec<InlinedRequest>,
}

#[derive(Deserialize)]
struct InlinedRequest {
    request: Value,
    #[serde(default)]
    metadata: Value,
}

pub(super) fn state(phase: Phase) -> &'static str {
    match phase {
        Phase::Waiting => "BATCH_STATE_PENDING",
        Phase::Running | Phase::Cancelling => "BATCH_STATE_RUNNING",
        Phase::Ended(EndStatus::Completed) => "BATCH_STATE_SUCCEEDED",
        Phase::Ended(EndStatus::Failed) => "BATCH_STATE_FAILED",
        Phase::Ended(EndStatus::Expired) => "BATCH_STATE_EXPIRED",
        Phase::Ended(EndStatus::Cancelled) => "BATCH_STATE_CANCELLED",
    }
}

/// `POST /v1beta/models/{model}:batchGenerateContent`.
pub(super) fn create(state: &mut State, model: &str, body: &[u8]) -> Answer {
    let create: Create = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) => return invalid(&format!("Invalid JSON payload received. {e}")),
    };
    let input = create.batch.input_config;
    if input.file_name.is_some() {
        return invalid("The mock runs inlined requests only (input_config.requests), not input files.");
    }
    let Some(inlined) = input.requests.filter(|r| !r.requests.is_empty()) else {
        return invalid("input_config.requests.requests must hold at least one request.");
    };
    let mut requests = Vec::with_capacity(inlined.requests.len());
    for (i, r) in inlined.requests.into_iter().enumerate() {
        if !r.request.is_object() {
            return invalid(&format!("input_config.requests.requests[{i}].request must be an object."));
        }
        requests.push(Request { request: Bytes::from(r.request.to_string()), metadata: r.metadata });
    }
    let batch = Batch {
        model: model.strip_prefix("models/").unwrap_or(model).to_owned(),
        display_name: create.batch.display_name,
        requests,
        output: None,
        succeeded: 0,
        failed: 0,
    };
    let id = format!("batches/{}", next(&mut state.ids.gemini_batch));
    let index = state.push(Data::GeminiBatch(batch), id);
    operation(&state.jobs[index]).map_or_else(|| invalid("batch"), |v| ok(&v))
}

/// `/v1beta/batches...`.
pub(super) fn route(state: &mut State, req: &JobRequest) -> Answer {
    let rest = req.path.strip_prefix("/v1beta/batches").unwrap_or_default();
    let Some(name) = rest.strip_prefix('/') else {
        return if req.method.as_str() == "GET" {
            let operations: Vec<Value> = state.jobs.iter().rev().filter_map(operation).collect();
            ok(&json!({"operations": operations}))
        } else {
            not_found(&format!("Invalid URL ({} {})", req.method, req.path))
        };
    };
    let (number, cancel) = match name.split_once(':') {
        Some((number, "cancel")) => (number, true),
        Some(_) => return not_found(&format!("Invalid URL ({} {})", req.method, req.path)),
        None => (name, false),
    };
    let id = format!("batches/{number}");
    let Some(index) = state.find(&id, JobKind::GeminiBatch) else {
        return not_found(&format!("Batch {id} not found."));
    };
    match (req.method.as_str(), cancel) {
        ("GET", false) => {
            state.retrieve(index);
            operation(&state.jobs[index]).map_or_else(|| not_found(&id), |v| ok(&v))
        }
        // Both answer the empty message.
        ("POST", true) => {
            state.cancel(index);
            ok(&json!({}))
        }
        ("DELETE", false) => {
            state.jobs.remove(index);
            ok(&json!({}))
        }
        _ => not_found(&format!("Invalid URL ({} {})", req.method, req.path)),
    }
}

/// The operation of `job`, or `None` if it is no Gemini batch. Proto3 JSON leaves zero counts and
/// `done: false` out; int64 counts are strings.
fn operation(job: &Job) -> Option<Value> {
    let Data::GeminiBatch(batch) = &job.data else { return None };
    let total = batch.requests.len();
    let mut stats = Map::new();
    stats.insert("requestCount".into(), json!(total.to_string()));
    let pending = if job.ended() { 0 } else { total };
    for (name, count) in [
        ("successfulRequestCount", batch.succeeded),
        ("failedRequestCount", batch.failed),
        ("pendingRequestCount", pending),
    ] {
        if count > 0 {
            stats.insert(name.into(), json!(count.to_string()));
        }
    }
    let updated = [job.ended_at, job.cancelling_at, job.in_progress_at].into_iter().flatten().max();
    let mut metadata = json!({
        "@type": BATCH_TYPE,
        "model": format!("models/{}", batch.model),
        "name": job.id,
        "createTime": clock::rfc3339(job.created),
        "updateTime": clock::rfc3339(updated.unwrap_or(job.created)),
        "batchStats": stats,
        "state": state(job.phase),
    });
    if let Some(name) = &batch.display_name {
        metadata["displayName"] = json!(name);
    }
    let mut op = json!({"name": job.id});
    if let (Phase::Ended(status), Some(output)) = (job.phase, &batch.output) {
        let output = json!({"inlinedResponses": {"inlinedResponses": output}});
        metadata["endTime"] = json!(job.ended_at.map(clock::rfc3339));
        metadata["output"] = output.clone();
        op["done"] = json!(true);
        if status == EndStatus::Failed {
            op["error"] =
                json!({"code": 13, "message": "The batch failed (ended so by the mock's control)."});
        } else {
            let mut response = output;
            response["@type"] = json!(OUTPUT_TYPE);
            op["response"] = response;
        }
    }
    op["metadata"] = metadata;
    Some(op)
}

impl Batch {
    /// The inlined responses of the requests that ran, each with its request's metadata.
    pub(super) fn finish(&mut self, out: &Outputs, ids: &mut Ids) {
        let mut output = Vec::with_capacity(out.ran);
        let (mut succeeded, mut failed) = (0, 0);
        for request in &self.requests[..out.ran] {
            let n = next(&mut ids.line);
            let answer =
                answer_line(LineApi::Gemini, &request.request, n, Some(&self.model), out.settings.usage);
            let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let mut item = if answer.status == StatusCode::OK {
                succeeded += 1;
                json!({"response": body})
            } else {
                failed += 1;
                json!({"error": body["error"]})
            };
            if !request.metadata.is_null() {
                item["metadata"] = request.metadata.clone();
            }
            output.push(item);
        }
        if matches!(out.status, EndStatus::Failed | EndStatus::Expired) {
            failed += self.requests.len() - out.ran;
        }
        self.output = Some(output);
        (self.succeeded, self.failed) = (succeeded, failed);
    }
}

fn invalid(message: &str) -> Answer {
    Answer::Json(StatusCode::BAD_REQUEST, crate::gemini::error_body(StatusCode::BAD_REQUEST, message))
}

fn not_found(message: &str) -> Answer {
    Answer::Json(StatusCode::NOT_FOUND, crate::gemini::error_body(StatusCode::NOT_FOUND, message))
}
