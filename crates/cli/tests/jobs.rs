//! Deferred jobs through the `recovea` binary: batches and background responses are estimated and
//! held when created, polled by the gateway itself with the organization's credential, and
//! settled once from the provider's own usage, with no retrieval by the client; the caps count
//! the hold and then the cost. The mock provider keeps jobs as the providers do: each retrieval
//! moves one on, and the second finds it ended.

use std::path::Path;
use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::{JobUsage, MockProvider};
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Answer, Serve, call, temp_dir};

const TOKEN: &str = "jobs-test-token-0123456789abcdef01234567";

fn start(data_dir: &Path, mock_url: &str, poll_interval: &str) -> Serve {
    Serve::start(
        data_dir,
        mock_url,
        &["--admin-token", TOKEN, "--job-poll-interval", poll_interval, "--gemini-base-url", mock_url],
    )
}

impl Serve {
    async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.admin_call(TOKEN, method, path, body).await;
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }

    /// An org with managed openai, anthropic and gemini credentials and a key, and an armed daily
    /// cap of `limit` on the organization: (org id, key secret).
    async fn tenant(&self, limit: &str) -> (String, String) {
        self.tenant_capped(limit, true).await
    }

    /// As [`Self::tenant`], its cap armed or not.
    async fn tenant_capped(&self, limit: &str, hard_stop: bool) -> (String, String) {
        let credentials = [
            ("openai", "sk-openai-managed-0123456789"),
            ("anthropic", "sk-anthropic-managed-0123456789"),
            ("gemini", "sk-gemini-managed-0123456789"),
        ];
        let tenant = self.organization(TOKEN, &credentials).await;
        self.org_cap(TOKEN, &tenant.org_id, "day", limit, hard_stop).await;
        (tenant.org_id, tenant.secret)
    }

    async fn spend(&self, org_id: &str) -> Value {
        self.ok(Method::GET, &format!("/orgs/{org_id}/spend"), None).await["spend"][0].clone()
    }

    async fn receipts(&self, org_id: &str) -> Vec<Value> {
        let receipts = self.ok(Method::GET, &format!("/orgs/{org_id}/receipts?limit=1000"), None).await;
        receipts["receipts"].as_array().expect("receipts").clone()
    }

    /// Waits (with a deadline) until a receipt settles job `job_id`, and returns it.
    async fn settlement(&self, org_id: &str, job_id: &str) -> Value {
        harness::eventually(Duration::from_secs(20), "the job's settlement", || async {
            self.receipts(org_id).await.into_iter().find(|r| r["job_id"] == job_id && r["held_usd"].is_null())
        })
        .await
    }

    async fn post(&self, secret: &str, path: &str, body: Value) -> Answer {
        let auth = format!("Bearer {secret}");
        call(Method::POST, &format!("{}{path}", self.gateway), &[("authorization", &auth)], Some(body)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_responses_are_settled_without_any_retrieval_and_the_cap_then_refuses() {
    let mock = MockProvider::start().await;
    // o3-pro, 1,000 tokens in and 20,000 out: $1.62 at $20 / $80 per million.
    mock.set_job_usage(Some(JobUsage::new(1_000, 20_000)));
    let dir = temp_dir("background");
    let serve = start(&dir, &mock.url(), "100ms");
    let (org_id, secret) = serve.tenant("1.00").await;
    let request =
        json!({"model": "o3-pro", "input": "Think hard.", "background": true, "max_output_tokens": 2000});
    let created = serve.post(&secret, "/v1/responses", request.clone()).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    assert_eq!(created.json()["status"], "queued");
    let job_id = created.json()["id"].as_str().expect("id").to_owned();

    let settled = serve.settlement(&org_id, &job_id).await;
    assert_eq!(settled["cost_usd"], "1.62");
    assert_eq!(
        (settled["input_tokens"].as_u64(), settled["output_tokens"].as_u64()),
        (Some(1_000), Some(20_000))
    );
    assert_eq!(settled["endpoint"], "/v1/responses");
    assert_eq!(settled["usage_source"], "provider");
    let creation: Vec<Value> =
        serve.receipts(&org_id).await.into_iter().filter(|r| !r["held_usd"].is_null()).collect();
    assert_eq!(creation.len(), 1, "the creating request has one receipt, holding the job");
    assert_eq!(
        (creation[0]["job_id"].as_str(), creation[0]["cost_usd"].as_str()),
        (Some(job_id.as_str()), Some("0.00"))
    );
    // The gateway polled it with the organization's key; the client never retrieved it.
    let polls: Vec<_> = mock.requests().into_iter().filter(|r| r.method == "GET").collect();
    assert!(!polls.is_empty());
    for poll in &polls {
        assert_eq!(poll.path, format!("/v1/responses/{job_id}"));
        assert!(
            poll.headers.iter().any(
                |(name, value)| name == "authorization" && value == "Bearer sk-openai-managed-0123456789"
            )
        );
    }

    let spend = serve.spend(&org_id).await;
    assert_eq!((spend["spend_usd"].as_str(), spend["held_usd"].as_str()), (Some("1.62"), Some("0.00")));
    let refused = serve.post(&secret, "/v1/responses", request).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(refused.json()["error"]["code"], "budget_exceeded");
    // Retrieving and cancelling stay free at the line.
    let auth = format!("Bearer {secret}");
    let read = call(
        Method::GET,
        &format!("{}/v1/responses/{job_id}", serve.gateway),
        &[("authorization", &auth)],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let settlements = serve
        .receipts(&org_id)
        .await
        .into_iter()
        .filter(|r| r["job_id"] == job_id.as_str() && r["held_usd"].is_null())
        .count();
    assert_eq!(settlements, 1, "settled once");
}

/// A form as the openai SDK uploads a batch's input.
fn batch_file(lines: usize, model: &str, max_tokens: Option<u64>) -> (String, Vec<u8>) {
    let mut jsonl = String::new();
    for n in 0..lines {
        let mut body =
            json!({"model": model, "messages": [{"role": "user", "content": "Say hello to the batch"}]});
        if let Some(max) = max_tokens {
            body["max_tokens"] = json!(max);
        }
        let line = json!({"custom_id": format!("r{n}"), "method": "POST", "url": "/v1/chat/completions", "body": body});
        jsonl.push_str(&line.to_string());
        jsonl.push('\n');
    }
    let body = format!(
        "--bound\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--bound\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{jsonl}\r\n--bound--\r\n"
    );
    ("multipart/form-data; boundary=bound".to_owned(), body.into_bytes())
}

async fn upload(serve: &Serve, secret: &str, lines: usize, model: &str, max_tokens: Option<u64>) -> String {
    let (content_type, body) = batch_file(lines, model, max_tokens);
    let auth = format!("Bearer {secret}");
    let answer = harness::call_bytes(
        Method::POST,
        &format!("{}/v1/files", serve.gateway),
        &[("authorization", &auth), ("content-type", &content_type)],
        body,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    answer.json()["id"].as_str().expect("file id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_held_at_its_estimate_and_settled_from_its_output_file_at_the_batch_price() {
    let mock = MockProvider::start().await;
    mock.set_job_usage(Some(JobUsage::new(1_000, 500)));
    let dir = temp_dir("batch");
    // Polled once a minute at first: the hold is there to be seen before the job ends.
    let serve = start(&dir, &mock.url(), "2s");
    let (org_id, secret) = serve.tenant("10.00").await;
    let file_id = upload(&serve, &secret, 100, "gpt-4o", Some(100)).await;
    let created = serve
        .post(
            &secret,
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let batch_id = created.json()["id"].as_str().expect("id").to_owned();
    // Held: 100 requests of gpt-4o, their estimated input and 100 output tokens each, at the
    // batch price ($1.25 / $5 per million).
    let held = harness::eventually(Duration::from_secs(10), "the hold", || async {
        let held = serve.spend(&org_id).await["held_usd"].as_str().map(str::to_owned)?;
        (held != "0.00").then_some(held)
    })
    .await;
    let held = recovea_core::money::Nanos::parse_usd(&held).expect("amount");
    assert!(held >= recovea_core::money::Nanos(100 * 100 * 5_000), "{held:?}");

    let settled = serve.settlement(&org_id, &batch_id).await;
    // 100 lines of 1,000 in and 500 out at $1.25 / $5: $0.125 + $0.25.
    assert_eq!(settled["cost_usd"], "0.375");
    assert_eq!(settled["endpoint"], "/v1/batches");
    let spend = serve.spend(&org_id).await;
    assert_eq!((spend["spend_usd"].as_str(), spend["held_usd"].as_str()), (Some("0.375"), Some("0.00")));
    let fetched: Vec<String> =
        mock.requests().into_iter().filter(|r| r.method == "GET").map(|r| r.path).collect();
    assert!(fetched.iter().any(|p| p.starts_with("/v1/files/") && p.ends_with("/content")), "{fetched:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_does_not_fit_or_cannot_be_estimated_is_refused_before_the_provider_sees_it() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("batch-refused");
    let serve = start(&dir, &mock.url(), "1s");
    let (_, secret) = serve.tenant("0.05").await;
    // 1,000 gpt-4o requests writing up to 1,000 tokens each: $5 of output at the batch price.
    let file_id = upload(&serve, &secret, 1_000, "gpt-4o", Some(1_000)).await;
    let refused = serve
        .post(
            &secret,
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "budget_exceeded");
    let message = error["message"].as_str().expect("message");
    assert!(
        message.starts_with("This batch's estimated cost ($5.")
            && message.ends_with("exceeds what the daily spend cap has left ($0.05)."),
        "{message}"
    );
    assert_eq!(
        refused.headers.get("x-recovea-budget-window").map(|v| v.to_str().expect("text")),
        Some("day")
    );

    // A file the gateway never saw cannot be estimated.
    let unseen = serve.post(&secret, "/v1/batches", json!({"input_file_id": "file-elsewhere", "endpoint": "/v1/chat/completions", "completion_window": "24h"})).await;
    assert_eq!(unseen.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(unseen.json()["error"]["code"], "budget_unmeterable");
    assert!(mock.requests().iter().all(|r| r.path != "/v1/batches"), "the provider never saw a batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_gemini_inline_batches_are_held_and_settled() {
    let mock = MockProvider::start().await;
    mock.set_job_usage(Some(JobUsage::new(200, 100)));
    let dir = temp_dir("inline");
    let serve = start(&dir, &mock.url(), "100ms");
    let (org_id, secret) = serve.tenant("50.00").await;
    let message = json!({"model": "claude-sonnet-4-5", "max_tokens": 300, "messages": [{"role": "user", "content": "Hi"}]});
    let requests: Vec<Value> =
        (0..4).map(|n| json!({"custom_id": format!("c{n}"), "params": message})).collect();
    let auth = format!("Bearer {secret}");
    let anthropic = call(
        Method::POST,
        &format!("{}/v1/messages/batches", serve.gateway),
        &[("authorization", &auth), ("anthropic-version", "2023-06-01")],
        Some(json!({"requests": requests})),
    )
    .await;
    assert_eq!(anthropic.status, StatusCode::OK, "{:?}", anthropic.body);
    let msgbatch = anthropic.json()["id"].as_str().expect("id").to_owned();
    let inline: Vec<Value> = (0..3)
        .map(|n| json!({"request": {"contents": [{"parts": [{"text": "Hi"}]}]}, "metadata": {"key": format!("g{n}")}}))
        .collect();
    let gemini = serve
        .post(
            &secret,
            "/v1beta/models/gemini-2.5-flash:batchGenerateContent",
            json!({"batch": {"display_name": "b", "input_config": {"requests": {"requests": inline}}}}),
        )
        .await;
    assert_eq!(gemini.status, StatusCode::OK, "{:?}", gemini.body);
    let gemini_batch = gemini.json()["name"].as_str().expect("name").to_owned();

    // sonnet-4.5 at its batch price ($1.50 / $7.50): 4 x (200 in, 100 out) = $0.0012 + $0.003.
    let settled = serve.settlement(&org_id, &msgbatch).await;
    assert_eq!(settled["cost_usd"], "0.0042");
    let settled = serve.settlement(&org_id, &gemini_batch).await;
    assert_eq!(settled["input_tokens"].as_u64(), Some(600));
    assert_eq!(settled["output_tokens"].as_u64(), Some(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_survives_a_restart_and_its_job_is_settled_once() {
    let mock = MockProvider::start().await;
    mock.set_job_usage(Some(JobUsage::new(1_000, 20_000)));
    let dir = temp_dir("restart");
    // A poll interval long enough that the job is still pending when serve is killed.
    let serve = start(&dir, &mock.url(), "1h");
    let (org_id, secret) = serve.tenant("100.00").await;
    let created = serve
        .post(
            &secret,
            "/v1/responses",
            json!({"model": "o3-pro", "input": "x", "background": true, "max_output_tokens": 1000}),
        )
        .await;
    let job_id = created.json()["id"].as_str().expect("id").to_owned();
    let held = harness::eventually(Duration::from_secs(10), "the hold", || async {
        let held = serve.spend(&org_id).await["held_usd"].as_str().map(str::to_owned)?;
        (held != "0.00").then_some(held)
    })
    .await;
    serve.kill();

    let serve = start(&dir, &mock.url(), "100ms");
    let spend = serve.spend(&org_id).await;
    assert!(
        spend["held_usd"] == held.as_str() || spend["spend_usd"] == "1.62",
        "the hold came back: {spend}"
    );
    let settled = serve.settlement(&org_id, &job_id).await;
    assert_eq!(settled["cost_usd"], "1.62");
    // A job created now, in an organization of its own, is settled two polls later at the
    // earliest: a second settlement of the first, from a poll before those or from the restart,
    // would have been spooled before its settlement, and so be in the ledger by then.
    let (later_org, later_secret) = serve.tenant("100.00").await;
    let later = serve
        .post(&later_secret, "/v1/responses", json!({"model": "o3-pro", "input": "x", "background": true}))
        .await;
    let later_job = later.json()["id"].as_str().expect("id").to_owned();
    serve.settlement(&later_org, &later_job).await;
    let settlements = serve
        .receipts(&org_id)
        .await
        .into_iter()
        .filter(|r| r["job_id"] == job_id.as_str() && r["held_usd"].is_null())
        .count();
    assert_eq!(settlements, 1);
    assert_eq!(serve.spend(&org_id).await["spend_usd"], "1.62");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_failed_part_way_settles_at_what_ran() {
    let mock = MockProvider::start().await;
    mock.set_job_usage(Some(JobUsage::new(1_000, 1_000)));
    // The job never finishes by itself: the test ends it.
    mock.set_retrievals_to_finish(u32::MAX);
    let dir = temp_dir("batch-failed");
    let serve = start(&dir, &mock.url(), "100ms");
    let (org_id, secret) = serve.tenant("10.00").await;
    let file_id = upload(&serve, &secret, 10, "gpt-4o", Some(2_000)).await;
    let created = serve
        .post(
            &secret,
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    let batch_id = created.json()["id"].as_str().expect("id").to_owned();
    harness::eventually(Duration::from_secs(10), "a poll", || async {
        mock.jobs().into_iter().find(|job| job.id == batch_id && job.retrievals > 0)
    })
    .await;
    mock.end_job(&batch_id, recovea_testkit::JobEnd::new(recovea_testkit::EndStatus::Failed).ran(3))
        .expect("ended");
    let settled = serve.settlement(&org_id, &batch_id).await;
    // 3 lines of 1,000 in and 1,000 out at gpt-4o's batch price, $1.25 / $5 per million.
    assert_eq!(settled["cost_usd"], "0.01875");
    assert_eq!(
        (settled["input_tokens"].as_u64(), settled["output_tokens"].as_u64()),
        (Some(3_000), Some(3_000))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sent_with_the_clients_own_key_cannot_be_polled_and_is_refused_under_an_armed_cap() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("own-key");
    let serve = start(&dir, &mock.url(), "1s");
    let (_, secret) = serve.tenant("100.00").await;
    let own = call(
        Method::POST,
        &format!("{}/v1/responses", serve.gateway),
        &[("x-recovea-key", &secret), ("authorization", "Bearer sk-client-own-0123456789")],
        Some(json!({"model": "o3-pro", "input": "x", "background": true})),
    )
    .await;
    assert_eq!(own.status, StatusCode::PAYMENT_REQUIRED);
    let error = &own.json()["error"];
    assert_eq!(error["code"], "budget_unmeterable");
    assert_eq!(
        error["message"],
        "POST /v1/responses is billed where this gateway cannot see it; refused while a daily spend cap with a hard stop covers this key."
    );
    assert!(mock.requests().iter().all(|r| r.path != "/v1/responses"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_armed_cap_a_batch_from_a_file_never_seen_is_forwarded_and_still_settled() {
    let mock = MockProvider::start().await;
    mock.set_job_usage(Some(JobUsage::new(1_000, 500)));
    let dir = temp_dir("unseen-file");
    let serve = start(&dir, &mock.url(), "100ms");
    let (org_id, secret) = serve.tenant_capped("10.00", false).await;
    // Uploaded around the gateway, straight to the provider.
    let (content_type, body) = batch_file(10, "gpt-4o", Some(100));
    let uploaded = harness::call_bytes(
        Method::POST,
        &format!("{}/v1/files", mock.url()),
        &[("authorization", "Bearer sk-openai-managed-0123456789"), ("content-type", &content_type)],
        body,
    )
    .await;
    let file_id = uploaded.json()["id"].as_str().expect("file id").to_owned();
    let created = serve
        .post(
            &secret,
            "/v1/batches",
            json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.body);
    let batch_id = created.json()["id"].as_str().expect("id").to_owned();
    let creation = harness::eventually(Duration::from_secs(10), "the creating receipt", || async {
        serve.receipts(&org_id).await.into_iter().find(|r| r["held_usd"].is_string())
    })
    .await;
    // Nothing could be held, but the job is known and the gateway polls it.
    assert_eq!(
        (creation["job_id"].as_str(), creation["held_usd"].as_str()),
        (Some(batch_id.as_str()), Some("0.00"))
    );
    let settled = serve.settlement(&org_id, &batch_id).await;
    // 10 lines of 1,000 in and 500 out at $1.25 / $5 per million.
    assert_eq!(settled["cost_usd"], "0.0375");
    assert_eq!(serve.spend(&org_id).await["spend_usd"], "0.0375");
}
