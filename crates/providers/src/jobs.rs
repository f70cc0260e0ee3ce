//! Deferred jobs on each provider's wire: what a batch holds when it is created (its input file
//! or inline requests), the id its creation answers with, where the gateway polls it, whether it
//! has ended, and the usage of each request it ran. Pure: the gateway and the control plane feed
//! it bytes.

use recovea_core::channel::JobKind;
use recovea_core::jobs::{BatchInput, valid_id};
use recovea_core::snapshot::ProviderKind;
use recovea_core::usage::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::multipart;
use crate::request_body;
use crate::usage::{Surface, Tapped, read_json};

/// The estimate of a batch input file uploaded to `POST /v1/files`: `None` unless the form's
/// `purpose` is `batch` and its `file` part is JSONL of requests (`{"custom_id", "method", "url",
/// "body"}`); a line that is no such request counts as a request of no known model.
pub fn uploaded_batch(content_type: &str, body: &[u8]) -> Option<BatchInput> {
    let parts = multipart::parts(body, multipart::boundary(content_type)?)?;
    let purpose = parts.iter().find(|part| part.name == Some("purpose"))?;
    if purpose.body.trim_ascii() != b"batch" {
        return None;
    }
    let file = parts.iter().find(|part| part.name == Some("file"))?;
    let mut input = BatchInput::default();
    for line in file.body.split(|&b| b == b'\n').map(<[u8]>::trim_ascii).filter(|line| !line.is_empty()) {
        #[derive(Deserialize)]
        struct Line<'a> {
            #[serde(borrow)]
            body: Option<&'a RawValue>,
        }
        match crate::from_json::<Line<'_>>(line).ok().and_then(|line| line.body) {
            Some(request) => add_request(&mut input, request.get().as_bytes(), None),
            None => input.add(None, 0, None),
        }
    }
    Some(input)
}

/// The input file a `POST /v1/batches` names (`input_file_id`), when it is a plain id.
pub fn batch_input_file(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Create {
        input_file_id: String,
    }
    crate::from_json::<Create>(body).ok().map(|c| c.input_file_id).filter(|id| valid_id(id))
}

/// The estimate of a batch whose requests come inline: Anthropic's `{"requests": [{"custom_id",
/// "params"}]}`, or Gemini's `{"batch": {"input_config": {"requests": {"requests": [{"request"}]}}}}`
/// (camelCase too) for `model`. `None` when the body holds none that way (Gemini's batch from a
/// file the gateway never saw).
pub fn inline_batch(kind: JobKind, body: &[u8], path_model: Option<&str>) -> Option<BatchInput> {
    let mut input = BatchInput::default();
    match kind {
        JobKind::AnthropicBatch => {
            #[derive(Deserialize)]
            struct Batch<'a> {
                #[serde(borrow)]
                requests: Vec<Request<'a>>,
            }
            #[derive(Deserialize)]
            struct Request<'a> {
                #[serde(borrow)]
                params: &'a RawValue,
            }
            for request in crate::from_json::<Batch<'_>>(body).ok()?.requests {
                add_request(&mut input, request.params.get().as_bytes(), None);
            }
        }
        JobKind::GeminiBatch => {
            let batch: serde_json::Value = crate::from_json(body).ok()?;
            let config = batch.get("batch")?;
            let config = config.get("input_config").or_else(|| config.get("inputConfig"))?;
            let requests = config.get("requests")?.get("requests")?.as_array()?;
            for request in requests {
                let request = request.get("request")?;
                let text = serde_json::to_vec(request).ok()?;
                add_request(&mut input, &text, path_model);
            }
        }
        JobKind::OpenAiBatch | JobKind::BackgroundResponse => return None,
    }
    Some(input)
}

/// Counts one request body of a batch: its model (the body's, else the path's), estimated input
/// and output limit.
fn add_request(input: &mut BatchInput, request: &[u8], path_model: Option<&str>) {
    let inspected = request_body::read(request);
    let model = inspected.facts.model.as_deref().or(path_model);
    input.add(model, inspected.input_tokens, inspected.facts.max_output_tokens);
}

/// The id of what a creation answer created: a file (`id`), or a job of `kind` (OpenAI's and
/// Anthropic's `id`, Gemini's operation `name`). `None` for an answer that names none, or names
/// one the gateway cannot keep.
pub fn created_id(kind: Option<JobKind>, answer: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Created {
        id: Option<String>,
        name: Option<String>,
    }
    let created: Created = crate::from_json(answer).ok()?;
    let id = match kind {
        Some(JobKind::GeminiBatch) => created.name?,
        _ => created.id?,
    };
    valid_id(&id).then_some(id)
}

/// How a background response's creation answered: still to run (a job to poll), or already done
/// with its usage (the answer is metered as any other, as when it streams).
pub fn background_pending(answer: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Status<'a> {
        #[serde(borrow)]
        status: Option<&'a str>,
    }
    crate::from_json::<Status<'_>>(answer)
        .ok()
        .and_then(|s| s.status)
        .is_some_and(|status| matches!(status, "queued" | "in_progress"))
}

/// Where the gateway polls a job of `kind` with the provider's id `id`, below the credential's base
/// URL. Azure OpenAI's resource answers at its own root with an API version.
pub fn poll_path(kind: JobKind, provider: ProviderKind, id: &str) -> String {
    match (kind, provider) {
        (JobKind::OpenAiBatch, ProviderKind::AzureOpenAi) => {
            format!("/openai/batches/{id}?api-version={AZURE_API_VERSION}")
        }
        (JobKind::BackgroundResponse, ProviderKind::AzureOpenAi) => format!("/openai/v1/responses/{id}"),
        (JobKind::OpenAiBatch, _) => format!("/v1/batches/{id}"),
        (JobKind::BackgroundResponse, _) => format!("/v1/responses/{id}"),
        (JobKind::AnthropicBatch, _) => format!("/v1/messages/batches/{id}"),
        (JobKind::GeminiBatch, _) => format!("/v1beta/{id}"),
    }
}

/// The Azure OpenAI data-plane version the poller speaks (batches went GA in it).
const AZURE_API_VERSION: &str = "2024-10-21";

/// Where a job ended, as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Queued, validating, running, finalizing, cancelling: poll again.
    Running,
    /// It ended (`how`, the provider's word for it): its results are read from `results`.
    Ended { how: String, results: Results },
}

/// Where an ended job's usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Results {
    /// In the answer itself: a background response's usage, a Gemini batch's inlined responses.
    Inline(Vec<LineUsage>),
    /// Line by line from a file the provider serves at this path (OpenAI's output file, Gemini's
    /// responses file) or URL (Anthropic's `results_url`); `None` when nothing ran.
    Lines(Option<String>),
}

/// One request's usage in a job's results: the model that ran it and its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineUsage {
    pub model: Option<String>,
    pub usage: Usage,
}

/// Reads a poll's answer for a job of `kind`. `None` for an answer that is not the job (an error,
/// a body that does not parse): the poll failed.
pub fn job_state(kind: JobKind, answer: &[u8]) -> Option<JobState> {
    match kind {
        JobKind::OpenAiBatch => {
            #[derive(Deserialize)]
            struct Batch {
                status: String,
                output_file_id: Option<String>,
            }
            let batch: Batch = crate::from_json(answer).ok()?;
            let status = batch.status.to_ascii_lowercase();
            let ended = ["completed", "failed", "expired", "cancelled"].contains(&status.as_str());
            Some(if ended {
                let file = batch
                    .output_file_id
                    .filter(|id| valid_id(id))
                    .map(|id| format!("/v1/files/{id}/content"));
                JobState::Ended { how: status, results: Results::Lines(file) }
            } else {
                JobState::Running
            })
        }
        JobKind::BackgroundResponse => {
            #[derive(Deserialize)]
            struct Response<'a> {
                #[serde(borrow)]
                status: &'a str,
            }
            let status = crate::from_json::<Response<'_>>(answer).ok()?.status;
            if matches!(status, "queued" | "in_progress") {
                return Some(JobState::Running);
            }
            let tapped = read_json(Surface::Responses, answer);
            let lines = line_of(tapped).into_iter().collect();
            Some(JobState::Ended { how: status.to_owned(), results: Results::Inline(lines) })
        }
        JobKind::AnthropicBatch => {
            #[derive(Deserialize)]
            struct Batch {
                processing_status: String,
                results_url: Option<String>,
            }
            let batch: Batch = crate::from_json(answer).ok()?;
            Some(if batch.processing_status == "ended" {
                // A location the poller could not fetch safely is no answer it can act on.
                let results = match batch.results_url {
                    Some(url) => Some(results_location(url)?),
                    None => None,
                };
                JobState::Ended { how: batch.processing_status, results: Results::Lines(results) }
            } else {
                JobState::Running
            })
        }
        JobKind::GeminiBatch => gemini_state(answer),
    }
}

/// A results location a provider named: an absolute `http(s)` URL (the poller fetches it only on
/// the credential's own origin), or a path below the base URL without `..`.
fn results_location(url: String) -> Option<String> {
    let absolute = ["https://", "http://"]
        .iter()
        .any(|scheme| url.strip_prefix(scheme).is_some_and(|rest| !rest.is_empty()));
    let path = url.starts_with('/') && !url.starts_with("//");
    let plain =
        url.len() <= 2048 && !url.contains("..") && !url.bytes().any(|b| b.is_ascii_control() || b == b' ');
    ((absolute || path) && plain).then_some(url)
}

/// A Gemini batch operation: its state (in `metadata.state`, or the batch's own `state`), and,
/// once done, its inlined responses or responses file.
fn gemini_state(answer: &[u8]) -> Option<JobState> {
    let operation: serde_json::Value = crate::from_json(answer).ok()?;
    let metadata = operation.get("metadata").unwrap_or(&operation);
    let state = metadata.get("state").and_then(serde_json::Value::as_str).unwrap_or_default();
    let state = state.trim_start_matches("BATCH_STATE_").trim_start_matches("JOB_STATE_");
    let done = operation.get("done").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let ended = done || ["SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"].contains(&state);
    if !ended {
        return Some(JobState::Running);
    }
    let output = operation
        .get("response")
        .or_else(|| metadata.get("output"))
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let inlined = output
        .get("inlinedResponses")
        .and_then(|i| i.get("inlinedResponses"))
        .and_then(serde_json::Value::as_array);
    let how = if state.is_empty() { "SUCCEEDED".to_owned() } else { state.to_owned() };
    let results = match (inlined, output.get("responsesFile").and_then(serde_json::Value::as_str)) {
        (Some(responses), _) => Results::Inline(
            responses
                .iter()
                .filter_map(|r| r.get("response"))
                .filter_map(|r| serde_json::to_vec(r).ok())
                .filter_map(|r| line_of(read_json(Surface::GenerateContent, &r)))
                .collect(),
        ),
        (None, Some(file)) if valid_id(file) => {
            Results::Lines(Some(format!("/download/v1beta/{file}:download?alt=media")))
        }
        (None, _) => Results::Lines(None),
    };
    Some(JobState::Ended { how, results })
}

/// The usage of one line of a job's results file; `None` for a line that holds none (a request
/// that failed, was cancelled or expired costs nothing).
pub fn result_line(kind: JobKind, line: &[u8]) -> Option<LineUsage> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return None;
    }
    match kind {
        JobKind::OpenAiBatch => {
            #[derive(Deserialize)]
            struct Line<'a> {
                #[serde(borrow)]
                response: Option<Response<'a>>,
            }
            #[derive(Deserialize)]
            struct Response<'a> {
                #[serde(borrow)]
                body: Option<&'a RawValue>,
            }
            let body = crate::from_json::<Line<'_>>(line).ok()?.response?.body?;
            let body = body.get().as_bytes();
            line_of(read_json(openai_surface(body), body))
        }
        JobKind::AnthropicBatch => {
            #[derive(Deserialize)]
            struct Line<'a> {
                #[serde(borrow)]
                result: Option<Result<'a>>,
            }
            #[derive(Deserialize)]
            struct Result<'a> {
                #[serde(borrow)]
                message: Option<&'a RawValue>,
            }
            let message = crate::from_json::<Line<'_>>(line).ok()?.result?.message?;
            line_of(read_json(Surface::Messages, message.get().as_bytes()))
        }
        JobKind::GeminiBatch => {
            let line: serde_json::Value = crate::from_json(line).ok()?;
            let response = serde_json::to_vec(line.get("response")?).ok()?;
            line_of(read_json(Surface::GenerateContent, &response))
        }
        JobKind::BackgroundResponse => None,
    }
}

/// Which of OpenAI's answers a batch line's body is, by its `object`.
fn openai_surface(body: &[u8]) -> Surface {
    #[derive(Deserialize)]
    struct Object<'a> {
        #[serde(borrow)]
        object: Option<&'a str>,
    }
    match crate::from_json::<Object<'_>>(body).ok().and_then(|o| o.object) {
        Some("response") => Surface::Responses,
        Some("list") => Surface::Embeddings,
        Some("text_completion") => Surface::Completions,
        _ => Surface::ChatCompletions,
    }
}

fn line_of(tapped: Tapped) -> Option<LineUsage> {
    tapped.usage.map(|usage| LineUsage { model: tapped.model, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(purpose: &str, lines: &str) -> (String, Vec<u8>) {
        let body = format!(
            "--xyz\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n--xyz\r\n\
             Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n{lines}\r\n--xyz--\r\n"
        );
        ("multipart/form-data; boundary=xyz".to_owned(), body.into_bytes())
    }

    #[test]
    fn a_batch_file_is_estimated_line_by_line() {
        let lines = concat!(
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}}"#,
            "\n",
            r#"{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}}"#,
            "\n\nnot json\n"
        );
        let (content_type, body) = form("batch", lines);
        let input = uploaded_batch(&content_type, &body).expect("a batch file");
        assert_eq!(input.requests(), 3);
        let gpt = input.models["gpt-4o"];
        assert_eq!((gpt.requests, gpt.output_tokens, gpt.uncapped), (2, 50, 1));
        assert!(gpt.input_tokens > 0);
        assert_eq!(input.models[recovea_core::jobs::OTHER_MODELS].requests, 1, "the line that is no request");
        let (content_type, body) = form("fine-tune", lines);
        assert_eq!(uploaded_batch(&content_type, &body), None, "only batch input is estimated");
        assert_eq!(uploaded_batch("application/json", b"{}"), None);
    }

    #[test]
    fn inline_batches_are_estimated_per_request() {
        let anthropic = br#"{"requests":[{"custom_id":"1","params":{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"Hi"}]}},{"custom_id":"2","params":{"model":"claude-haiku-4-5","max_tokens":10,"messages":[]}}]}"#;
        let input = inline_batch(JobKind::AnthropicBatch, anthropic, None).expect("inline");
        assert_eq!(input.models["claude-sonnet-4-5"].output_tokens, 1024);
        assert_eq!(input.models["claude-haiku-4-5"].output_tokens, 10);
        let gemini = br#"{"batch":{"display_name":"b","input_config":{"requests":{"requests":[{"request":{"contents":[{"parts":[{"text":"Hi there"}]}],"generationConfig":{"maxOutputTokens":99}},"metadata":{"key":"1"}}]}}}}"#;
        let input = inline_batch(JobKind::GeminiBatch, gemini, Some("gemini-2.5-flash")).expect("inline");
        assert_eq!(input.models["gemini-2.5-flash"].output_tokens, 99);
        let camel = br#"{"batch":{"inputConfig":{"requests":{"requests":[{"request":{"contents":[]}}]}}}}"#;
        assert_eq!(
            inline_batch(JobKind::GeminiBatch, camel, Some("m")).expect("inline").models["m"].uncapped,
            1
        );
        let from_file = br#"{"batch":{"input_config":{"file_name":"files/abc"}}}"#;
        assert_eq!(inline_batch(JobKind::GeminiBatch, from_file, Some("m")), None);
        assert_eq!(inline_batch(JobKind::OpenAiBatch, anthropic, None), None);
    }

    #[test]
    fn creation_answers_name_their_job() {
        assert_eq!(
            batch_input_file(br#"{"input_file_id":"file-abc","endpoint":"/v1/chat/completions"}"#).as_deref(),
            Some("file-abc")
        );
        assert_eq!(batch_input_file(br#"{"input_file_id":"../x"}"#), None);
        assert_eq!(
            created_id(Some(JobKind::OpenAiBatch), br#"{"id":"batch_1","object":"batch"}"#).as_deref(),
            Some("batch_1")
        );
        assert_eq!(
            created_id(Some(JobKind::GeminiBatch), br#"{"name":"batches/abc"}"#).as_deref(),
            Some("batches/abc")
        );
        assert_eq!(created_id(None, br#"{"id":"file-1","object":"file"}"#).as_deref(), Some("file-1"));
        assert_eq!(created_id(None, br#"{"error":{"message":"no"}}"#), None);
        assert_eq!(created_id(None, br#"{"id":"a b"}"#), None);
        assert!(background_pending(br#"{"id":"resp_1","status":"queued","usage":null}"#));
        assert!(!background_pending(br#"{"id":"resp_1","status":"completed","usage":{"input_tokens":1}}"#));
    }

    #[test]
    fn polls_go_where_each_provider_serves_its_job() {
        assert_eq!(poll_path(JobKind::OpenAiBatch, ProviderKind::OpenAi, "batch_1"), "/v1/batches/batch_1");
        assert_eq!(
            poll_path(JobKind::OpenAiBatch, ProviderKind::AzureOpenAi, "batch_1"),
            "/openai/batches/batch_1?api-version=2024-10-21"
        );
        assert_eq!(
            poll_path(JobKind::AnthropicBatch, ProviderKind::Anthropic, "msgbatch_1"),
            "/v1/messages/batches/msgbatch_1"
        );
        assert_eq!(poll_path(JobKind::GeminiBatch, ProviderKind::Gemini, "batches/x"), "/v1beta/batches/x");
        assert_eq!(
            poll_path(JobKind::BackgroundResponse, ProviderKind::OpenAi, "resp_1"),
            "/v1/responses/resp_1"
        );
    }

    #[test]
    fn job_states_are_read_from_each_providers_answer() {
        use JobKind::*;
        assert_eq!(job_state(OpenAiBatch, br#"{"id":"b","status":"in_progress"}"#), Some(JobState::Running));
        assert_eq!(
            job_state(OpenAiBatch, br#"{"id":"b","status":"completed","output_file_id":"file-9"}"#),
            Some(JobState::Ended {
                how: "completed".into(),
                results: Results::Lines(Some("/v1/files/file-9/content".into()))
            })
        );
        assert_eq!(
            job_state(OpenAiBatch, br#"{"id":"b","status":"Expired","output_file_id":null}"#),
            Some(JobState::Ended { how: "expired".into(), results: Results::Lines(None) })
        );
        assert_eq!(job_state(OpenAiBatch, br#"{"error":{}}"#), None);
        let done = br#"{"id":"resp_1","object":"response","status":"completed","model":"o3-pro","usage":{"input_tokens":1000,"input_tokens_details":{"cached_tokens":0},"output_tokens":20000,"output_tokens_details":{"reasoning_tokens":19000},"total_tokens":21000}}"#;
        let Some(JobState::Ended { results: Results::Inline(lines), .. }) =
            job_state(BackgroundResponse, done)
        else {
            panic!("ended")
        };
        assert_eq!(lines[0].usage.output_tokens, 20000);
        assert_eq!(lines[0].model.as_deref(), Some("o3-pro"));
        assert_eq!(
            job_state(BackgroundResponse, br#"{"status":"queued","usage":null}"#),
            Some(JobState::Running)
        );
        assert_eq!(
            job_state(AnthropicBatch, br#"{"processing_status":"ended","results_url":"https://x/results"}"#),
            Some(JobState::Ended {
                how: "ended".into(),
                results: Results::Lines(Some("https://x/results".into()))
            })
        );
        // A location the poller could not fetch safely fails the poll rather than settle at nothing.
        for garbled in ["http/batches/b/results", "//evil.example/r", "/v1/../../r", "https://", "ftp://x/r"]
        {
            let answer = format!(r#"{{"processing_status":"ended","results_url":"{garbled}"}}"#);
            assert_eq!(job_state(AnthropicBatch, answer.as_bytes()), None, "{garbled}");
        }
        assert!(matches!(
            job_state(
                AnthropicBatch,
                br#"{"processing_status":"ended","results_url":"/v1/messages/batches/b/results"}"#
            ),
            Some(JobState::Ended { results: Results::Lines(Some(_)), .. })
        ));
        let gemini = br#"{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true,"response":{"inlinedResponses":{"inlinedResponses":[{"response":{"modelVersion":"gemini-2.5-flash","usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":15}}}]}}}"#;
        let Some(JobState::Ended { results: Results::Inline(lines), how }) = job_state(GeminiBatch, gemini)
        else {
            panic!("ended")
        };
        assert_eq!(
            (how.as_str(), lines[0].usage.input_tokens, lines[0].usage.output_tokens),
            ("SUCCEEDED", 10, 5)
        );
        assert_eq!(
            job_state(GeminiBatch, br#"{"name":"batches/x","metadata":{"state":"JOB_STATE_RUNNING"}}"#),
            Some(JobState::Running)
        );
    }

    #[test]
    fn result_lines_give_each_requests_usage() {
        let openai = br#"{"id":"r1","custom_id":"a","response":{"status_code":200,"body":{"object":"chat.completion","model":"gpt-4o-2024-08-06","usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}}},"error":null}"#;
        let line = result_line(JobKind::OpenAiBatch, openai).expect("usage");
        assert_eq!(
            (line.model.as_deref(), line.usage.input_tokens, line.usage.output_tokens),
            (Some("gpt-4o-2024-08-06"), 100, 20)
        );
        let failed = br#"{"id":"r2","custom_id":"b","response":null,"error":{"code":"batch_expired"}}"#;
        assert_eq!(result_line(JobKind::OpenAiBatch, failed), None);
        let anthropic = br#"{"custom_id":"1","result":{"type":"succeeded","message":{"model":"claude-sonnet-4-5","content":[],"usage":{"input_tokens":30,"output_tokens":7}}}}"#;
        assert_eq!(result_line(JobKind::AnthropicBatch, anthropic).expect("usage").usage.input_tokens, 30);
        assert_eq!(
            result_line(JobKind::AnthropicBatch, br#"{"custom_id":"2","result":{"type":"canceled"}}"#),
            None
        );
        assert_eq!(result_line(JobKind::OpenAiBatch, b"  "), None);
    }
}
