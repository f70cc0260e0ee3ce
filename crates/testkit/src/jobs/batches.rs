//! OpenAI's files (`/v1/files`) and batches (`/v1/batches`); Azure's paths arrive mapped to these.

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
use crate::multipart;
use crate::request::Answer;
use crate::usage::shapes;

/// How long a batch may run, in seconds: `completion_window` is always `24h`.
const WINDOW: u64 = 24 * 3600;
/// Batch input and output files expire 30 days after their creation by default.
const BATCH_FILE_LIFETIME: u64 = 30 * 24 * 3600;

/// Uploaded and generated files, in creation order.
#[derive(Default)]
pub(super) struct Files {
    list: Vec<File>,
}

struct File {
    id: String,
    bytes: Bytes,
    filename: String,
    purpose: String,
    /// Unix seconds.
    created_at: u64,
}

impl File {
    fn object(&self) -> Value {
        let batchy = self.purpose == "batch" || self.purpose == "batch_output";
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes.len(),
            "created_at": self.created_at,
            "expires_at": batchy.then_some(self.created_at + BATCH_FILE_LIFETIME),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

impl Files {
    fn add(&mut self, ids: &mut Ids, filename: String, purpose: &str, bytes: Bytes) -> String {
        let id = format!("file-{}", next(&mut ids.file));
        let created_at = clock::seconds(clock::now_micros());
        self.list.push(File { id: id.clone(), bytes, filename, purpose: purpose.to_owned(), created_at });
        id
    }

    fn get(&self, id: &str) -> Option<&File> {
        self.list.iter().find(|f| f.id == id)
    }
}

/// `/v1/files...`.
pub(super) fn files(state: &mut State, req: &JobRequest) -> Answer {
    let rest = req.path.strip_prefix("/v1/files").unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let missing = |id: &str| error(StatusCode::NOT_FOUND, &format!("No such File object: {id}"));
    match (req.method.as_str(), segments.as_slice()) {
        ("POST", []) => upload(state, req),
        ("GET", []) => {
            let data: Vec<Value> = state.files.list.iter().map(File::object).collect();
            ok(&json!({"object": "list", "data": data, "has_more": false}))
        }
        ("GET", [id]) => state.files.get(id).map_or_else(|| missing(id), |f| ok(&f.object())),
        ("GET", [id, "content"]) => state
            .files
            .get(id)
            .map_or_else(|| missing(id), |f| Answer::Raw("application/octet-stream", f.bytes.clone())),
        ("DELETE", [id]) => match state.files.list.iter().position(|f| f.id == *id) {
            Some(i) => {
                state.files.list.remove(i);
                ok(&json!({"id": id, "object": "file", "deleted": true}))
            }
            None => missing(id),
        },
        _ => invalid_url(req),
    }
}

/// `POST /v1/files`: a `multipart/form-data` upload with `purpose` and `file`.
fn upload(state: &mut State, req: &JobRequest) -> Answer {
    let Some(boundary) = req.content_type.and_then(multipart::boundary) else {
        return invalid("Invalid Content-Type header: expected multipart/form-data with a boundary.");
    };
    let Some(parts) = multipart::parse(req.body, &boundary) else {
        return invalid("The multipart/form-data body could not be parsed.");
    };
    let purpose = parts
        .iter()
        .find(|p| p.name == "purpose")
        .map(|p| String::from_utf8_lossy(p.data).trim().to_owned())
        .filter(|p| !p.is_empty());
    let Some(purpose) = purpose else {
        return invalid("Missing required parameter: 'purpose'.");
    };
    let Some(file) = parts.iter().find(|p| p.name == "file") else {
        return invalid("Missing required parameter: 'file'.");
    };
    let filename = file.filename.clone().unwrap_or_else(|| "file".to_owned());
    let id = state.files.add(&mut state.ids, filename, &purpose, Bytes::copy_from_slice(file.data));
    state.files.get(&id).map_or_else(|| invalid_url(req), |f| ok(&f.object()))
}

/// A batch's own data.
pub(super) struct Batch {
    /// As the create request spelled it (Azure's omit `/v1`).
    endpoint: String,
    api: LineApi,
    input_file_id: String,
    completion_window: String,
    metadata: Value,
    model: Option<String>,
    pub(super) lines: Vec<Line>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    completed: usize,
    failed: usize,
    /// Input and output tokens of the lines that succeeded, once it has ended.
    usage: Option<(u64, u64)>,
}

pub(super) struct Line {
    custom_id: String,
    body: Bytes,
}

#[derive(Deserialize)]
struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Value,
}

#[derive(Deserialize)]
struct InputLine {
    custom_id: String,
    method: String,
    url: String,
    body: Value,
}

/// `/v1/batches...`.
pub(super) fn batches(state: &mut State, req: &JobRequest) -> Answer {
    let rest = req.path.strip_prefix("/v1/batches").unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    match (req.method.as_str(), segments.as_slice()) {
        ("POST", []) => create(state, req.body),
        ("GET", []) => {
            let data: Vec<Value> = state.jobs.iter().rev().filter_map(object).collect();
            let id = |v: Option<&Value>| v.map_or(Value::Null, |v| v["id"].clone());
            ok(&json!({
                "object": "list", "data": data, "first_id": id(data.first()), "last_id": id(data.last()),
                "has_more": false,
            }))
        }
        ("GET", [id]) => with_batch(state, id, State::retrieve),
        ("POST", [id, "cancel"]) => with_batch(state, id, State::cancel),
        _ => invalid_url(req),
    }
}

/// Applies `step` to batch `id` and answers its object.
fn with_batch(state: &mut State, id: &str, step: fn(&mut State, usize)) -> Answer {
    let Some(index) = state.find(id, JobKind::OpenAiBatch) else {
        return error(StatusCode::NOT_FOUND, &format!("No batch found with id '{id}'."));
    };
    step(state, index);
    object(&state.jobs[index]).map_or_else(|| invalid(id), |v| ok(&v))
}

/// The endpoints whose lines the mock can run, by their `/v1` path.
fn line_api(url: &str) -> Option<LineApi> {
    match url {
        "/v1/chat/completions" => Some(LineApi::Chat),
        "/v1/completions" => Some(LineApi::Completions),
        "/v1/responses" => Some(LineApi::Responses),
        "/v1/embeddings" => Some(LineApi::Embeddings),
        _ => None,
    }
}

/// `/chat/completions` (Azure's spelling) as `/v1/chat/completions`.
fn with_v1(url: &str) -> String {
    if url.starts_with("/v1/") { url.to_owned() } else { format!("/v1{url}") }
}

/// `POST /v1/batches`.
fn create(state: &mut State, body: &[u8]) -> Answer {
    let request: CreateBatch = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return invalid(&format!("Invalid batch request: {e}")),
    };
    let url = with_v1(&request.endpoint);
    let Some(api) = line_api(&url) else {
        return invalid(&format!(
            "Invalid value for 'endpoint': {:?}; the mock runs /v1/chat/completions, /v1/completions, \
             /v1/responses and /v1/embeddings.",
            request.endpoint
        ));
    };
    if request.completion_window != "24h" {
        return invalid("Invalid value for 'completion_window': only '24h' is supported.");
    }
    let Some(file) = state.files.get(&request.input_file_id) else {
        return invalid(&format!("Invalid 'input_file_id': no file {:?}.", request.input_file_id));
    };
    let lines = match read_lines(&file.bytes, &url) {
        Ok(lines) => lines,
        Err(message) => return invalid(&message),
    };
    let model = lines
        .first()
        .and_then(|l| serde_json::from_slice::<Value>(&l.body).ok())
        .and_then(|b| b["model"].as_str().map(str::to_owned));
    let batch = Batch {
        endpoint: request.endpoint,
        api,
        input_file_id: request.input_file_id,
        completion_window: request.completion_window,
        metadata: request.metadata,
        model,
        lines,
        output_file_id: None,
        error_file_id: None,
        completed: 0,
        failed: 0,
        usage: None,
    };
    let id = format!("batch_{}", next(&mut state.ids.batch));
    let index = state.push(Data::OpenAiBatch(batch), id);
    object(&state.jobs[index]).map_or_else(|| invalid("batch"), |v| ok(&v))
}

/// The requests of an input file, each checked the way the real validation step checks them.
fn read_lines(file: &[u8], url: &str) -> Result<Vec<Line>, String> {
    let text = std::str::from_utf8(file).map_err(|_| "The input file is not UTF-8.".to_owned())?;
    let mut seen = HashSet::new();
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() {
            continue;
        }
        let input: InputLine =
            serde_json::from_str(line).map_err(|e| format!("Line {number} of the input file: {e}"))?;
        if input.method != "POST" {
            return Err(format!("Line {number}: 'method' must be POST."));
        }
        if with_v1(&input.url) != url {
            return Err(format!("Line {number}: 'url' {:?} does not match the batch's endpoint.", input.url));
        }
        if let Some(problem) = line_body_problem(&input.body) {
            return Err(format!("Line {number}: {problem}."));
        }
        if !seen.insert(input.custom_id.clone()) {
            return Err(format!("Line {number}: duplicate custom_id {:?}.", input.custom_id));
        }
        lines.push(Line { custom_id: input.custom_id, body: Bytes::from(input.body.to_string()) });
    }
    if lines.is_empty() {
        return Err("The input file has no requests.".to_owned());
    }
    Ok(lines)
}

pub(super) fn status(phase: Phase) -> &'static str {
    match phase {
        Phase::Waiting => "validating",
        Phase::Running => "in_progress",
        Phase::Cancelling => "cancelling",
        Phase::Ended(EndStatus::Completed) => "completed",
        Phase::Ended(EndStatus::Failed) => "failed",
        Phase::Ended(EndStatus::Expired) => "expired",
        Phase::Ended(EndStatus::Cancelled) => "cancelled",
    }
}

/// The batch object of `job`, or `None` if it is no OpenAI batch.
fn object(job: &Job) -> Option<Value> {
    let Data::OpenAiBatch(batch) = &job.data else { return None };
    let created = clock::seconds(job.created);
    let at = |t: Option<u64>| t.map(clock::seconds);
    let ended_as = |status: EndStatus| at(job.ended_at).filter(|_| job.phase == Phase::Ended(status));
    let errors = (job.phase == Phase::Ended(EndStatus::Failed)).then(|| {
        json!({"object": "list", "data": [{
            "code": "batch_failed", "message": "The batch failed (ended so by the mock's control).",
            "param": null, "line": null,
        }]})
    });
    let usage = batch.usage.and_then(|(i, o)| serde_json::from_str::<Value>(&shapes::responses(i, o)).ok());
    Some(json!({
        "id": job.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": status(job.phase),
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": created,
        "in_progress_at": at(job.in_progress_at),
        "expires_at": created + WINDOW,
        "finalizing_at": ended_as(EndStatus::Completed),
        "completed_at": ended_as(EndStatus::Completed),
        "failed_at": ended_as(EndStatus::Failed),
        "expired_at": ended_as(EndStatus::Expired),
        "cancelling_at": at(job.cancelling_at),
        "cancelled_at": ended_as(EndStatus::Cancelled),
        "request_counts": {"total": batch.lines.len(), "completed": batch.completed, "failed": batch.failed},
        "usage": usage,
        "metadata": batch.metadata,
    }))
}

impl Batch {
    /// Runs the lines that ran into an output file (status 200) and an error file (other
    /// statuses, and for an expired batch the lines it never ran, as `batch_expired`).
    pub(super) fn finish(&mut self, id: &str, out: &Outputs, files: &mut Files, ids: &mut Ids) {
        let (mut output, mut errors) = (String::new(), String::new());
        let (mut input_tokens, mut output_tokens) = (0, 0);
        let (mut completed, mut failed) = (0, 0);
        for line in &self.lines[..out.ran] {
            let n = next(&mut ids.line);
            let answer = answer_line(self.api, &line.body, n, None, out.settings.usage);
            let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let record = json!({
                "id": format!("batch_req_{n}"),
                "custom_id": line.custom_id,
                "response": {"status_code": answer.status.as_u16(), "request_id": format!("req_mock_{n}"), "body": body},
                "error": null,
            });
            if answer.status == StatusCode::OK {
                completed += 1;
                input_tokens += answer.input_tokens;
                output_tokens += answer.output_tokens;
                push_line(&mut output, &record);
            } else {
                failed += 1;
                push_line(&mut errors, &record);
            }
        }
        let unrun = &self.lines[out.ran..];
        match out.status {
            EndStatus::Expired => {
                for line in unrun {
                    let record = json!({
                        "id": format!("batch_req_{}", next(&mut ids.line)),
                        "custom_id": line.custom_id,
                        "response": null,
                        "error": {
                            "code": "batch_expired",
                            "message": "This request could not be executed before the completion window expired.",
                        },
                    });
                    push_line(&mut errors, &record);
                }
                failed += unrun.len();
            }
            EndStatus::Failed => failed += unrun.len(),
            EndStatus::Completed | EndStatus::Cancelled => {}
        }
        self.output_file_id =
            Some(files.add(ids, format!("{id}_output.jsonl"), "batch_output", output.into()));
        if !errors.is_empty() {
            self.error_file_id =
                Some(files.add(ids, format!("{id}_error.jsonl"), "batch_output", errors.into()));
        }
        (self.completed, self.failed) = (completed, failed);
        self.usage = Some((input_tokens, output_tokens));
    }
}

fn push_line(file: &mut String, record: &Value) {
    file.push_str(&record.to_string());
    file.push('\n');
}

fn error(status: StatusCode, message: &str) -> Answer {
    Answer::Json(status, crate::openai::error_body(status, message))
}

fn invalid(message: &str) -> Answer {
    error(StatusCode::BAD_REQUEST, message)
}

fn invalid_url(req: &JobRequest) -> Answer {
    error(StatusCode::NOT_FOUND, &format!("Invalid URL ({} {})", req.method, req.path))
}
