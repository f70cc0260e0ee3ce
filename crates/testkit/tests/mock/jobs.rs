//! Deferred jobs over real HTTP: each kind's life from creation through retrievals to its end, its
//! output, cancellation, ends forced by a test, and the job settings.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use recovea_testkit::{EndStatus, JobEnd, JobKind, JobUsage, MockProvider, OUTPUT_TOKENS, REPLY_TEXT};
use serde_json::{Value, json};

use super::{Reply, call, client, post};

const BOUNDARY: &str = "mock-boundary-7MA4YWxk";

/// `POST` of a `multipart/form-data` upload with `purpose` and a `file` holding `content`.
async fn upload(mock: &MockProvider, path: &str, purpose: &str, content: &str) -> Reply {
    let body = format!(
        concat!(
            "--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n",
            "--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"input.jsonl\"\r\n",
            "Content-Type: application/jsonl\r\n\r\n{content}\r\n--{b}--\r\n"
        ),
        b = BOUNDARY,
        purpose = purpose,
        content = content
    );
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{}{path}", mock.url()))
        .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
        .header("authorization", "Bearer sk-test")
        .body(Full::new(Bytes::from(body)))
        .expect("valid request");
    let response = client().request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("complete body").to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

async fn get(mock: &MockProvider, path: &str) -> Reply {
    call(mock, Method::GET, path, None).await
}

/// A chat line whose prompt is `words` words long: `words + 1` input tokens by the rules.
fn chat_line(custom_id: &str, words: usize) -> String {
    let text = vec!["word"; words].join(" ");
    json!({
        "custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]},
    })
    .to_string()
}

/// An input file of `lines` chat lines, line `i` (from 0) with `i + 1` words.
fn chat_file(lines: usize) -> String {
    (0..lines).map(|i| chat_line(&format!("req-{i}"), i + 1)).collect::<Vec<_>>().join("\n")
}

fn jsonl(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .expect("UTF-8")
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON value per line"))
        .collect()
}

async fn create_batch(mock: &MockProvider, lines: usize) -> Value {
    let file = upload(mock, "/v1/files", "batch", &chat_file(lines)).await.json();
    let body =
        json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let batch = post(mock, "/v1/batches", body).await;
    assert_eq!(batch.status, StatusCode::OK, "{:?}", batch.body);
    batch.json()
}

async fn file_lines(mock: &MockProvider, id: &Value) -> Vec<Value> {
    let content = get(mock, &format!("/v1/files/{}/content", id.as_str().expect("a file id"))).await;
    assert_eq!(content.status, StatusCode::OK);
    jsonl(&content.body)
}

#[tokio::test]
async fn openai_files_upload_read_and_delete() {
    let mock = MockProvider::start().await;
    let content = format!("{}\n{}", chat_line("a", 1), chat_line("b", 2));
    let reply = upload(&mock, "/v1/files", "batch", &content).await;
    assert_eq!(reply.status, StatusCode::OK);
    let file = reply.json();
    assert_eq!(file["id"], "file-1");
    assert_eq!(file["object"], "file");
    assert_eq!(file["bytes"], content.len());
    assert_eq!(file["filename"], "input.jsonl");
    assert_eq!(file["purpose"], "batch");
    assert_eq!(file["status"], "processed");
    assert!(file["created_at"].as_u64().expect("created_at") > 1_600_000_000);

    assert_eq!(get(&mock, "/v1/files/file-1").await.json(), file);
    let bytes = get(&mock, "/v1/files/file-1/content").await;
    assert_eq!(bytes.header("content-type"), Some("application/octet-stream"));
    assert_eq!(bytes.body, content.as_bytes());
    assert_eq!(get(&mock, "/v1/files").await.json()["data"], json!([file]));

    let deleted = call(&mock, Method::DELETE, "/v1/files/file-1", None).await.json();
    assert_eq!(deleted, json!({"id": "file-1", "object": "file", "deleted": true}));
    let gone = get(&mock, "/v1/files/file-1").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.json()["error"]["type"], "invalid_request_error");

    let not_multipart = post(&mock, "/v1/files", json!({"purpose": "batch"})).await;
    assert_eq!(not_multipart.status, StatusCode::BAD_REQUEST);
    let no_purpose = upload(&mock, "/v1/files", "", "x").await;
    assert_eq!(no_purpose.status, StatusCode::BAD_REQUEST);
    assert!(no_purpose.json()["error"]["message"].as_str().expect("message").contains("purpose"));
}

#[tokio::test]
async fn openai_batch_validates_runs_and_completes_with_one_output_line_per_input_line() {
    let mock = MockProvider::start().await;
    let unknown = post(
        &mock,
        "/v1/batches",
        json!({"input_file_id": "file-404", "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown.json()["error"]["type"], "invalid_request_error");

    let batch = create_batch(&mock, 3).await;
    assert_eq!(batch["id"], "batch_1");
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["model"], "gpt-4o-mini");
    assert_eq!(batch["endpoint"], "/v1/chat/completions");
    assert_eq!(batch["input_file_id"], "file-1");
    assert_eq!(batch["request_counts"], json!({"total": 3, "completed": 0, "failed": 0}));
    assert!(batch["output_file_id"].is_null() && batch["usage"].is_null());
    let created = batch["created_at"].as_u64().expect("created_at");
    assert_eq!(batch["expires_at"], created + 24 * 3600);

    let running = get(&mock, "/v1/batches/batch_1").await.json();
    assert_eq!(running["status"], "in_progress");
    assert!(running["in_progress_at"].is_u64());
    let job = &mock.jobs()[0];
    assert_eq!(
        (job.id.as_str(), job.kind, job.status.as_str(), job.retrievals),
        ("batch_1", JobKind::OpenAiBatch, "in_progress", 1)
    );

    let done = get(&mock, "/v1/batches/batch_1").await.json();
    assert_eq!(done["status"], "completed");
    assert!(done["completed_at"].is_u64());
    assert_eq!(done["request_counts"], json!({"total": 3, "completed": 3, "failed": 0}));
    assert!(done["error_file_id"].is_null());
    // Inputs of 2, 3 and 4 tokens; 5 output tokens each.
    assert_eq!(done["usage"]["input_tokens"], 9);
    assert_eq!(done["usage"]["output_tokens"], 3 * OUTPUT_TOKENS);
    let output_file =
        get(&mock, &format!("/v1/files/{}", done["output_file_id"].as_str().expect("id"))).await.json();
    assert_eq!(output_file["purpose"], "batch_output");

    let lines = file_lines(&mock, &done["output_file_id"]).await;
    assert_eq!(lines.len(), 3);
    for (i, line) in lines.iter().enumerate() {
        assert!(line["id"].as_str().expect("id").starts_with("batch_req_"));
        assert_eq!(line["custom_id"], format!("req-{i}"));
        assert!(line["error"].is_null());
        let response = &line["response"];
        assert_eq!(response["status_code"], 200);
        assert!(response["request_id"].is_string());
        let body = &response["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["choices"][0]["message"]["content"], REPLY_TEXT);
        let input = i as u64 + 2;
        assert_eq!(body["usage"]["prompt_tokens"], input);
        assert_eq!(body["usage"]["completion_tokens"], OUTPUT_TOKENS);
        assert_eq!(body["usage"]["total_tokens"], input + OUTPUT_TOKENS);
    }

    // Later retrievals are counted, the batch stays as it ended.
    assert_eq!(get(&mock, "/v1/batches/batch_1").await.json()["status"], "completed");
    assert_eq!(mock.jobs()[0].retrievals, 3);
    let list = get(&mock, "/v1/batches").await.json();
    assert_eq!((list["object"].as_str(), list["has_more"].as_bool()), (Some("list"), Some(false)));
    assert_eq!(list["data"][0]["id"], "batch_1");
}

#[tokio::test]
async fn openai_batch_cancel_keeps_the_lines_that_ran() {
    let mock = MockProvider::start().await;
    create_batch(&mock, 5).await;
    let cancelling = post(&mock, "/v1/batches/batch_1/cancel", json!({})).await.json();
    assert_eq!(cancelling["status"], "cancelling");
    assert!(cancelling["cancelling_at"].is_u64());
    let cancelled = get(&mock, "/v1/batches/batch_1").await.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["cancelled_at"].is_u64());
    // The first half, rounded down, ran.
    assert_eq!(cancelled["request_counts"], json!({"total": 5, "completed": 2, "failed": 0}));
    let lines = file_lines(&mock, &cancelled["output_file_id"]).await;
    let ids: Vec<&str> = lines.iter().map(|l| l["custom_id"].as_str().expect("custom_id")).collect();
    assert_eq!(ids, ["req-0", "req-1"]);

    // A configured count instead of the half.
    mock.set_cancel_ran(Some(4));
    create_batch(&mock, 5).await;
    post(&mock, "/v1/batches/batch_2/cancel", json!({})).await;
    let cancelled = get(&mock, "/v1/batches/batch_2").await.json();
    assert_eq!(cancelled["request_counts"]["completed"], 4);
    assert_eq!(file_lines(&mock, &cancelled["output_file_id"]).await.len(), 4);
}

#[tokio::test]
async fn openai_batch_failed_or_expired_by_the_control_endpoint() {
    let mock = MockProvider::start().await;
    create_batch(&mock, 3).await;
    let ended = post(&mock, "/__mock/jobs/batch_1", json!({"status": "failed", "ran": 1})).await;
    assert_eq!(ended.status, StatusCode::OK);
    assert_eq!(
        ended.json(),
        json!({"id": "batch_1", "kind": "openai.batch", "status": "failed", "retrievals": 0})
    );
    let failed = get(&mock, "/v1/batches/batch_1").await.json();
    assert_eq!(failed["status"], "failed");
    assert!(failed["failed_at"].is_u64());
    assert_eq!(failed["errors"]["data"][0]["code"], "batch_failed");
    assert_eq!(failed["request_counts"], json!({"total": 3, "completed": 1, "failed": 2}));
    assert_eq!(file_lines(&mock, &failed["output_file_id"]).await.len(), 1);
    let again = post(&mock, "/__mock/jobs/batch_1", json!({"status": "completed"})).await;
    assert_eq!(again.status, StatusCode::CONFLICT);

    create_batch(&mock, 3).await;
    mock.end_job("batch_2", JobEnd::new(EndStatus::Expired).ran(2)).expect("batch_2 exists");
    let expired = get(&mock, "/v1/batches/batch_2").await.json();
    assert_eq!(expired["status"], "expired");
    assert!(expired["expired_at"].is_u64());
    assert_eq!(expired["request_counts"], json!({"total": 3, "completed": 2, "failed": 1}));
    assert_eq!(file_lines(&mock, &expired["output_file_id"]).await.len(), 2);
    let errors = file_lines(&mock, &expired["error_file_id"]).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["custom_id"], "req-2");
    assert!(errors[0]["response"].is_null());
    assert_eq!(errors[0]["error"]["code"], "batch_expired");

    let unknown = post(&mock, "/__mock/jobs/batch_9", json!({"status": "failed"})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let too_many = post(&mock, "/__mock/jobs/batch_2", json!({"status": "failed", "ran": 9})).await;
    assert_eq!(too_many.status, StatusCode::CONFLICT, "already ended comes first");
    create_batch(&mock, 1).await;
    let too_many = post(&mock, "/__mock/jobs/batch_3", json!({"status": "failed", "ran": 9})).await;
    assert_eq!(too_many.status, StatusCode::BAD_REQUEST);
    let listed = get(&mock, "/__mock/jobs").await.json();
    assert_eq!(listed.as_array().map(Vec::len), Some(3));
    assert_eq!(
        listed[2],
        json!({"id": "batch_3", "kind": "openai.batch", "status": "validating", "retrievals": 0})
    );
}

#[tokio::test]
async fn azure_files_and_batches_answer_as_their_v1_twins() {
    let mock = MockProvider::start().await;
    let version = "api-version=2024-10-21";
    let no_version = upload(&mock, "/openai/files", "batch", &chat_file(1)).await;
    assert_eq!(no_version.status, StatusCode::NOT_FOUND);
    let line = json!({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "my-global-batch", "messages": [{"role": "user", "content": "hi"}]}});
    let file = upload(&mock, &format!("/openai/files?{version}"), "batch", &line.to_string()).await.json();
    assert_eq!(file["id"], "file-1");
    // Azure names the endpoint without `/v1`.
    let body =
        json!({"input_file_id": "file-1", "endpoint": "/chat/completions", "completion_window": "24h"});
    let batch = post(&mock, &format!("/openai/batches?{version}"), body).await.json();
    assert_eq!(
        (batch["endpoint"].as_str(), batch["model"].as_str()),
        (Some("/chat/completions"), Some("my-global-batch"))
    );
    get(&mock, &format!("/openai/batches/batch_1?{version}")).await;
    let done = get(&mock, "/openai/v1/batches/batch_1").await.json();
    assert_eq!(done["status"], "completed");
    let output = get(
        &mock,
        &format!("/openai/files/{}/content?{version}", done["output_file_id"].as_str().expect("id")),
    )
    .await;
    assert_eq!(jsonl(&output.body)[0]["response"]["body"]["model"], "my-global-batch");
}

fn background_body() -> Value {
    json!({"model": "o3-pro", "input": "Think about this hard", "background": true})
}

/// Input tokens of [`background_body`]: 4 words and the overhead.
const BACKGROUND_INPUT: u64 = 5;

#[tokio::test]
async fn background_response_is_queued_then_in_progress_then_completed() {
    let mock = MockProvider::start().await;
    let created = post(&mock, "/v1/responses", background_body()).await.json();
    let id = created["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("resp_"));
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "queued");
    assert_eq!(created["background"], true);
    assert_eq!(created["model"], "o3-pro");
    assert_eq!(created["output"], json!([]));
    assert!(created["usage"].is_null());

    let running = get(&mock, &format!("/v1/responses/{id}")).await.json();
    assert_eq!(running["status"], "in_progress");
    assert!(running["usage"].is_null());
    let done = get(&mock, &format!("/v1/responses/{id}")).await.json();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["background"], true);
    assert!(done["completed_at"].is_u64());
    assert_eq!(done["output"][0]["content"][0]["text"], REPLY_TEXT);
    assert_eq!(done["usage"]["input_tokens"], BACKGROUND_INPUT);
    assert_eq!(done["usage"]["output_tokens"], OUTPUT_TOKENS);
    assert_eq!(done["usage"]["total_tokens"], BACKGROUND_INPUT + OUTPUT_TOKENS);
    let job = &mock.jobs()[0];
    assert_eq!(
        (job.kind, job.status.as_str(), job.retrievals),
        (JobKind::BackgroundResponse, "completed", 2)
    );

    // A foreground response can be retrieved, not cancelled.
    let foreground = post(&mock, "/v1/responses", json!({"model": "gpt-4o", "input": "hi"})).await.json();
    let path = format!("/v1/responses/{}", foreground["id"].as_str().expect("id"));
    assert_eq!(get(&mock, &path).await.json(), foreground);
    let refused = post(&mock, &format!("{path}/cancel"), json!({})).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(get(&mock, "/v1/responses/resp_nope").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn background_response_cancelled_or_failed_reports_what_ran() {
    let mock = MockProvider::start().await;
    let id = post(&mock, "/v1/responses", background_body()).await.json()["id"].clone();
    let path = format!("/v1/responses/{}", id.as_str().expect("id"));
    get(&mock, &path).await;
    let cancelled = post(&mock, &format!("{path}/cancel"), json!({})).await.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["output"], json!([]));
    assert_eq!(cancelled["usage"]["input_tokens"], BACKGROUND_INPUT);
    assert_eq!(cancelled["usage"]["output_tokens"], 0);
    // Cancelling again answers the same final object.
    assert_eq!(post(&mock, &format!("{path}/cancel"), json!({})).await.json(), cancelled);
    assert_eq!(get(&mock, &path).await.json(), cancelled);

    let id = post(&mock, "/v1/responses", background_body()).await.json()["id"].clone();
    let id = id.as_str().expect("id");
    mock.end_job(id, JobEnd::new(EndStatus::Failed).ran(3)).expect("the response exists");
    let failed = get(&mock, &format!("/v1/responses/{id}")).await.json();
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
    assert_eq!(
        (failed["usage"]["input_tokens"].as_u64(), failed["usage"]["output_tokens"].as_u64()),
        (Some(BACKGROUND_INPUT), Some(3))
    );
    let id = post(&mock, "/v1/responses", background_body()).await.json()["id"].clone();
    let expired =
        post(&mock, &format!("/__mock/jobs/{}", id.as_str().expect("id")), json!({"status": "expired"}))
            .await;
    assert_eq!(expired.status, StatusCode::BAD_REQUEST);

    // A configured partial usage.
    mock.set_partial_usage(Some(JobUsage::new(7, 2)));
    let id = post(&mock, "/v1/responses", background_body()).await.json()["id"].clone();
    let cancelled =
        post(&mock, &format!("/v1/responses/{}/cancel", id.as_str().expect("id")), json!({})).await.json();
    assert_eq!(
        (cancelled["usage"]["input_tokens"].as_u64(), cancelled["usage"]["output_tokens"].as_u64()),
        (Some(7), Some(2))
    );
}

#[tokio::test]
async fn job_usage_override_applies_to_every_line_and_background_response() {
    let mock = MockProvider::start().await;
    let set = post(&mock, "/__mock/jobs/usage", json!({"input_tokens": 1000, "output_tokens": 20000})).await;
    assert_eq!(set.status, StatusCode::NO_CONTENT);
    let id = post(&mock, "/v1/responses", background_body()).await.json()["id"].clone();
    let path = format!("/v1/responses/{}", id.as_str().expect("id"));
    get(&mock, &path).await;
    let done = get(&mock, &path).await.json();
    assert_eq!(
        done["usage"],
        json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 20000,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 21000})
    );

    create_batch(&mock, 2).await;
    mock.end_job("batch_1", JobEnd::new(EndStatus::Completed)).expect("batch_1 exists");
    let done = get(&mock, "/v1/batches/batch_1").await.json();
    for line in file_lines(&mock, &done["output_file_id"]).await {
        let usage = &line["response"]["body"]["usage"];
        assert_eq!(
            (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()),
            (Some(1000), Some(20000))
        );
    }
    assert_eq!(
        (done["usage"]["input_tokens"].as_u64(), done["usage"]["output_tokens"].as_u64()),
        (Some(2000), Some(40000))
    );

    assert_eq!(post(&mock, "/__mock/jobs/usage", Value::Null).await.status, StatusCode::NO_CONTENT);
    assert_eq!(mock.job_settings().usage, None);
    mock.set_job_usage(Some(JobUsage::new(3, 4)));
    assert_eq!(
        get(&mock, "/__mock/jobs/settings").await.json()["usage"],
        json!({"input_tokens": 3, "output_tokens": 4})
    );
}

fn message_batch_body(requests: usize) -> Value {
    let requests: Vec<Value> = (0..requests)
        .map(|i| {
            json!({"custom_id": format!("msg-{i}"), "params": {
                "model": "claude-sonnet-4-5", "max_tokens": 64,
                "messages": [{"role": "user", "content": "Hello there"}],
            }})
        })
        .collect();
    json!({"requests": requests})
}

fn is_rfc3339(value: &Value) -> bool {
    value.as_str().is_some_and(|t| t.len() == 27 && t.ends_with('Z') && t.as_bytes()[10] == b'T')
}

#[tokio::test]
async fn anthropic_message_batch_ends_with_results_at_its_own_url() {
    let mock = MockProvider::start().await;
    let created = post(&mock, "/v1/messages/batches", message_batch_body(2)).await;
    assert!(created.header("request-id").is_some());
    let batch = created.json();
    assert_eq!(batch["id"], "msgbatch_1");
    assert_eq!(batch["type"], "message_batch");
    assert_eq!(batch["processing_status"], "in_progress");
    assert_eq!(
        batch["request_counts"],
        json!({"processing": 2, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    );
    assert!(batch["results_url"].is_null() && batch["ended_at"].is_null());
    assert!(is_rfc3339(&batch["created_at"]) && is_rfc3339(&batch["expires_at"]), "{batch}");

    assert_eq!(
        get(&mock, "/v1/messages/batches/msgbatch_1").await.json()["processing_status"],
        "in_progress"
    );
    let not_yet = get(&mock, "/v1/messages/batches/msgbatch_1/results").await;
    assert_eq!(not_yet.status, StatusCode::NOT_FOUND);
    assert_eq!(not_yet.json()["type"], "error");
    let ended = get(&mock, "/v1/messages/batches/msgbatch_1").await.json();
    assert_eq!(ended["processing_status"], "ended");
    assert!(is_rfc3339(&ended["ended_at"]));
    assert_eq!(
        ended["request_counts"],
        json!({"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0, "expired": 0})
    );
    let url = format!("{}/v1/messages/batches/msgbatch_1/results", mock.url());
    assert_eq!(ended["results_url"], url.as_str());

    let results = get(&mock, "/v1/messages/batches/msgbatch_1/results").await;
    let results = jsonl(&results.body);
    assert_eq!(results.len(), 2);
    for (i, line) in results.iter().enumerate() {
        assert_eq!(line["custom_id"], format!("msg-{i}"));
        assert_eq!(line["result"]["type"], "succeeded");
        let message = &line["result"]["message"];
        assert_eq!(
            (message["type"].as_str(), message["model"].as_str()),
            (Some("message"), Some("claude-sonnet-4-5"))
        );
        assert_eq!(message["content"][0]["text"], REPLY_TEXT);
        assert_eq!(message["usage"]["input_tokens"], 3);
        assert_eq!(message["usage"]["output_tokens"], OUTPUT_TOKENS);
    }
    assert_eq!(get(&mock, "/v1/messages/batches").await.json()["data"][0]["id"], "msgbatch_1");
    let deleted = call(&mock, Method::DELETE, "/v1/messages/batches/msgbatch_1", None).await.json();
    assert_eq!(deleted, json!({"id": "msgbatch_1", "type": "message_batch_deleted"}));
}

#[tokio::test]
async fn anthropic_message_batch_canceled_or_expired() {
    let mock = MockProvider::start().await;
    post(&mock, "/v1/messages/batches", message_batch_body(4)).await;
    let canceling = post(&mock, "/v1/messages/batches/msgbatch_1/cancel", json!({})).await.json();
    assert_eq!(canceling["processing_status"], "canceling");
    assert!(is_rfc3339(&canceling["cancel_initiated_at"]));
    let ended = get(&mock, "/v1/messages/batches/msgbatch_1").await.json();
    assert_eq!(ended["processing_status"], "ended");
    assert_eq!(
        ended["request_counts"],
        json!({"processing": 0, "succeeded": 2, "errored": 0, "canceled": 2, "expired": 0})
    );
    let results = jsonl(&get(&mock, "/v1/messages/batches/msgbatch_1/results").await.body);
    let kinds: Vec<&str> = results.iter().map(|r| r["result"]["type"].as_str().expect("type")).collect();
    assert_eq!(kinds, ["succeeded", "succeeded", "canceled", "canceled"]);
    assert_eq!(results[3]["result"], json!({"type": "canceled"}));

    post(&mock, "/v1/messages/batches", message_batch_body(3)).await;
    post(&mock, "/__mock/jobs/msgbatch_2", json!({"status": "expired", "ran": 1})).await;
    let results = jsonl(&get(&mock, "/v1/messages/batches/msgbatch_2/results").await.body);
    let kinds: Vec<&str> = results.iter().map(|r| r["result"]["type"].as_str().expect("type")).collect();
    assert_eq!(kinds, ["succeeded", "expired", "expired"]);

    post(&mock, "/v1/messages/batches", message_batch_body(2)).await;
    post(&mock, "/__mock/jobs/msgbatch_3", json!({"status": "failed", "ran": 0})).await;
    let results = jsonl(&get(&mock, "/v1/messages/batches/msgbatch_3/results").await.body);
    assert_eq!(results[0]["result"]["type"], "errored");
    assert_eq!(results[0]["result"]["error"]["error"]["type"], "api_error");
    let counts = get(&mock, "/v1/messages/batches/msgbatch_3").await.json()["request_counts"].clone();
    assert_eq!(counts["errored"], 2);
}

fn gemini_batch_body(requests: usize) -> Value {
    let requests: Vec<Value> = (0..requests)
        .map(|i| json!({"request": {"contents": [{"parts": [{"text": "Why is the sky blue"}]}]}, "metadata": {"key": format!("request-{i}")}}))
        .collect();
    json!({"batch": {"display_name": "nightly", "input_config": {"requests": {"requests": requests}}}})
}

#[tokio::test]
async fn gemini_batch_runs_to_succeeded_with_inlined_responses() {
    let mock = MockProvider::start().await;
    let created =
        post(&mock, "/v1beta/models/gemini-2.5-flash:batchGenerateContent", gemini_batch_body(2)).await;
    assert_eq!(created.status, StatusCode::OK);
    let op = created.json();
    assert_eq!(op["name"], "batches/1");
    assert!(op.get("done").is_none());
    let meta = &op["metadata"];
    assert_eq!(meta["@type"], "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch");
    assert_eq!(meta["model"], "models/gemini-2.5-flash");
    assert_eq!(meta["displayName"], "nightly");
    assert_eq!(meta["state"], "BATCH_STATE_PENDING");
    assert_eq!(meta["batchStats"], json!({"requestCount": "2", "pendingRequestCount": "2"}));

    assert_eq!(get(&mock, "/v1beta/batches/1").await.json()["metadata"]["state"], "BATCH_STATE_RUNNING");
    let done = get(&mock, "/v1beta/batches/1").await.json();
    assert_eq!(done["done"], true);
    assert_eq!(done["metadata"]["state"], "BATCH_STATE_SUCCEEDED");
    assert_eq!(done["metadata"]["batchStats"], json!({"requestCount": "2", "successfulRequestCount": "2"}));
    assert_eq!(
        done["response"]["@type"],
        "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput"
    );
    let inlined =
        done["response"]["inlinedResponses"]["inlinedResponses"].as_array().expect("inlined responses");
    assert_eq!(inlined.len(), 2);
    assert_eq!(inlined[1]["metadata"], json!({"key": "request-1"}));
    let response = &inlined[0]["response"];
    assert_eq!(response["candidates"][0]["content"]["parts"][0]["text"], REPLY_TEXT);
    assert_eq!(response["modelVersion"], "gemini-2.5-flash");
    assert_eq!(response["usageMetadata"]["promptTokenCount"], 6);
    assert_eq!(response["usageMetadata"]["candidatesTokenCount"], OUTPUT_TOKENS);
    assert_eq!(done["metadata"]["output"]["inlinedResponses"], done["response"]["inlinedResponses"]);
    assert_eq!(get(&mock, "/v1beta/batches").await.json()["operations"][0]["name"], "batches/1");
}

#[tokio::test]
async fn gemini_batch_cancelled_or_failed_keeps_the_lines_that_ran() {
    let mock = MockProvider::start().await;
    let path = "/v1beta/models/gemini-2.5-flash:batchGenerateContent";
    post(&mock, path, gemini_batch_body(4)).await;
    let cancel = post(&mock, "/v1beta/batches/1:cancel", json!({})).await;
    assert_eq!((cancel.status, cancel.json()), (StatusCode::OK, json!({})));
    let cancelled = get(&mock, "/v1beta/batches/1").await.json();
    assert_eq!(cancelled["metadata"]["state"], "BATCH_STATE_CANCELLED");
    assert_eq!(cancelled["done"], true);
    let inlined = &cancelled["response"]["inlinedResponses"]["inlinedResponses"];
    assert_eq!(inlined.as_array().map(Vec::len), Some(2));

    post(&mock, path, gemini_batch_body(3)).await;
    mock.end_job("batches/2", JobEnd::new(EndStatus::Failed).ran(1)).expect("batches/2 exists");
    let failed = get(&mock, "/v1beta/batches/2").await.json();
    assert_eq!(failed["metadata"]["state"], "BATCH_STATE_FAILED");
    assert!(failed["error"]["message"].is_string());
    assert!(failed.get("response").is_none());
    assert_eq!(
        failed["metadata"]["output"]["inlinedResponses"]["inlinedResponses"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(failed["metadata"]["batchStats"]["failedRequestCount"], "2");

    let missing = get(&mock, "/v1beta/batches/9").await;
    assert_eq!(
        (missing.status, missing.json()["error"]["status"].as_str()),
        (StatusCode::NOT_FOUND, Some("NOT_FOUND"))
    );
}

#[tokio::test]
async fn retrievals_to_finish_is_per_mock_and_reset_restores_everything() {
    let mock = MockProvider::start().await;
    let settings = post(&mock, "/__mock/jobs/settings", json!({"retrievals_to_finish": 3})).await.json();
    assert_eq!(settings["retrievals_to_finish"], 3);
    post(&mock, "/v1/messages/batches", message_batch_body(1)).await;
    for expected in ["in_progress", "in_progress", "ended"] {
        let batch = get(&mock, "/v1/messages/batches/msgbatch_1").await.json();
        assert_eq!(batch["processing_status"], expected);
    }

    // 0: never by retrieval; a test ends it.
    mock.set_retrievals_to_finish(0);
    post(&mock, "/v1/messages/batches", message_batch_body(1)).await;
    for _ in 0..5 {
        get(&mock, "/v1/messages/batches/msgbatch_2").await;
    }
    assert_eq!(mock.jobs()[1].status, "in_progress");
    mock.end_job("msgbatch_2", JobEnd::new(EndStatus::Completed)).expect("msgbatch_2 exists");
    assert_eq!(mock.jobs()[1].status, "ended");

    mock.set_retrievals_to_finish(1);
    post(&mock, "/v1/responses", background_body()).await;
    let id = mock.jobs()[2].id.clone();
    assert_eq!(get(&mock, &format!("/v1/responses/{id}")).await.json()["status"], "completed");

    mock.reset();
    assert!(mock.jobs().is_empty());
    assert_eq!(mock.job_settings(), recovea_testkit::JobSettings::default());
    post(&mock, "/v1/messages/batches", message_batch_body(1)).await;
    assert_eq!(mock.jobs()[0].id, "msgbatch_1", "ids restart");
}
