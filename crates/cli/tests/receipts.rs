//! Black-box tests of metering through the `recovea` binary: receipts survive SIGKILL exactly once,
//! and the admin CLI reads them and sets prices.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use recovea_testkit::MockProvider;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, Tenant, temp_dir};

const TOKEN: &str = "receipts-test-token-0123456789abcdef0123";

async fn call(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Bytes) {
    let answer = harness::call(method, url, headers, body).await;
    (answer.status, answer.body)
}

fn start(data_dir: &Path, mock_url: &str) -> Serve {
    Serve::start(data_dir, mock_url, &["--admin-token", TOKEN])
}

async fn admin(serve: &Serve, method: Method, path: &str, body: Option<Value>) -> Value {
    let auth = format!("Bearer {TOKEN}");
    let (status, bytes) =
        call(method, &format!("{}/admin/v1{path}", serve.admin), &[("authorization", &auth)], body).await;
    assert!(status.is_success(), "{path}: {status} {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("JSON")
}

/// Every receipt of the org, all pages.
async fn all_receipts(serve: &Serve, org_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = cursor.as_ref().map_or("?limit=1000".to_owned(), |c| format!("?limit=1000&cursor={c}"));
        let page = admin(serve, Method::GET, &format!("/orgs/{org_id}/receipts{query}"), None).await;
        out.extend(page["receipts"].as_array().expect("receipts").iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_every_completed_response_has_exactly_one_receipt() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("sigkill");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    let bearer = Arc::new(format!("Bearer {secret}"));
    let url = Arc::new(format!("{}/v1/chat/completions", serve.gateway));

    // Sixteen clients send requests back to back until the process dies under them.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for client_index in 0..16 {
        let (stop, bearer, url) = (Arc::clone(&stop), Arc::clone(&bearer), Arc::clone(&url));
        clients.push(tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let (mut completed, mut sent) = (Vec::new(), 0u32);
            let body = json!({"model": "gpt-4o-mini", "stream": client_index % 2 == 0, "messages": [{"role": "user", "content": "Hi"}]});
            while !stop.load(Ordering::Relaxed) && sent < 5_000 {
                sent += 1;
                let request = Request::post(url.as_str())
                    .header("authorization", bearer.as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
                    .expect("request");
                let Ok(response) = client.request(request).await else { break };
                let id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
                let ok = response.status() == StatusCode::OK;
                // Completed means the whole body arrived.
                if response.into_body().collect().await.is_ok() && ok {
                    completed.extend(id);
                }
            }
            (completed, sent)
        }));
    }
    // Kill once a good number of responses completed (or 20 s went by), with requests still in
    // flight.
    let _ = tokio::time::timeout(Duration::from_secs(20), mock.until_received(400)).await;
    serve.kill();
    stop.store(true, Ordering::Relaxed);
    let mut completed = Vec::new();
    let mut sent = 0;
    for client in clients {
        let (ids, n) = client.await.expect("client task");
        completed.extend(ids);
        sent += n;
    }
    assert!(completed.len() >= 100, "too few completed responses to say anything: {}", completed.len());

    let serve = start(&dir, &mock.url());
    let what = "every completed response's receipt after restart";
    let receipts = harness::eventually(Duration::from_secs(15), what, || async {
        let receipts = all_receipts(&serve, &org_id).await;
        let ids: std::collections::HashSet<&str> =
            receipts.iter().filter_map(|r| r["request_id"].as_str()).collect();
        completed.iter().all(|id| ids.contains(id.as_str())).then_some(receipts)
    })
    .await;
    let mut ids: Vec<&str> = receipts.iter().filter_map(|r| r["request_id"].as_str()).collect();
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "a request has two receipts");
    assert!(total as u32 <= sent, "more receipts ({total}) than requests sent ({sent})");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

fn admin_cli(serve: &Serve, args: &[&str]) -> String {
    serve.admin_cli(TOKEN, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_sets_prices_and_reads_receipts() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("cli");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    let bearer = format!("Bearer {secret}");
    let chat = json!({"model": "house-model", "messages": [{"role": "user", "content": "Say hello"}]});
    let url = format!("{}/v1/chat/completions", serve.gateway);

    // Unpriced at first (the openai kind's fallback price), then priced by an override: a new revision.
    let (status, _) = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let set: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["prices", "set", "house-model", "--input", "1.5", "--output", "2", "--cached-input", "0.5"],
    ))
    .expect("JSON");
    assert_eq!(set["model"], "house-model");
    let revision = set["revision"].as_u64().expect("revision");
    let listed: Value = serde_json::from_str(&admin_cli(&serve, &["prices", "list"])).expect("JSON");
    assert_eq!(listed["revision"], revision);
    assert_eq!(listed["prices"]["house-model"]["input_per_mtok_usd"], "1.50");
    assert!(listed["prices"]["gpt-4o-mini"].is_object(), "the built-in table is listed too");
    let (status, _) = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat)).await;
    assert_eq!(status, StatusCode::OK);

    let page: Value = harness::eventually(harness::DEADLINE, "both receipts", || async {
        let page: Value =
            serde_json::from_str(&admin_cli(&serve, &["receipts", "list", "--org", &org_id])).expect("JSON");
        page["receipts"].as_array().is_some_and(|r| r.len() == 2).then_some(page)
    })
    .await;
    let (before, after) = (&page["receipts"][0], &page["receipts"][1]);
    // 3 input x $150 + 5 output x $600 per million tokens: the built-in table's dearest openai prices.
    assert_eq!((before["priced"].as_bool(), before["cost_usd"].as_str()), (Some(false), Some("0.00345")));
    assert_eq!(before["priced_as"], "fallback:openai");
    assert_eq!(after["priced_as"], "house-model");
    assert_eq!(before["price_revision"], 0);
    // 3 input x $1.50 + 5 output x $2 per million tokens.
    assert_eq!((after["priced"].as_bool(), after["cost_usd"].as_str()), (Some(true), Some("0.0000145")));
    assert_eq!(after["price_revision"], revision);

    let csv = admin_cli(&serve, &["receipts", "export", "--org", &org_id]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(lines[0].starts_with("id,request_id,org_id,key_id,provider,model,endpoint,status,stream,"));
    assert!(lines[2].contains(",0.0000145,provider,true,"), "{csv}");

    let page: Value =
        serde_json::from_str(&admin_cli(&serve, &["receipts", "list", "--org", &org_id, "--limit", "1"]))
            .expect("JSON");
    let cursor = page["next_cursor"].as_str().expect("a next page");
    let next: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "list", "--org", &org_id, "--limit", "1", "--cursor", cursor],
    ))
    .expect("JSON");
    assert_eq!(next["receipts"][0]["id"], after["id"]);
    assert_eq!(next["next_cursor"], Value::Null);

    let summary: Value =
        serde_json::from_str(&admin_cli(&serve, &["receipts", "summary", "--org", &org_id])).expect("JSON");
    assert_eq!(summary["rows"][0]["requests"], 2);
    assert_eq!(summary["rows"][0]["cost_usd"], "0.0034645");
    // --key-id filters the summary: the key's rows, none of another key's.
    let key_id = after["key_id"].as_str().expect("key id");
    let by_key: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "summary", "--org", &org_id, "--key-id", key_id],
    ))
    .expect("JSON");
    assert_eq!(by_key["rows"], summary["rows"]);
    let other =
        admin(&serve, Method::POST, &format!("/orgs/{org_id}/keys"), Some(json!({"name": "idle"}))).await;
    let other_id = other["id"].as_str().expect("id");
    let idle: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "summary", "--org", &org_id, "--key-id", other_id],
    ))
    .expect("JSON");
    assert_eq!(idle["rows"], json!([]), "a key without receipts has no rows");
    // A limit past what the format allows names that format's largest.
    for (query, largest) in [("limit=1001", "1000"), ("format=csv&limit=100001", "100000")] {
        let auth = format!("Bearer {TOKEN}");
        let url = format!("{}/admin/v1/orgs/{org_id}/receipts?{query}", serve.admin);
        let (status, body) = call(Method::GET, &url, &[("authorization", &auth)], None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let body: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["error"]["message"], format!("limit: expected 1 to {largest}"));
    }

    // Where a price comes from, an override removed, a file imported and a fallback set.
    let got: Value =
        serde_json::from_str(&admin_cli(&serve, &["prices", "get", "house-model-latest"])).expect("JSON");
    assert_eq!((got["source"].as_str(), got["entry"]["source"].as_str()), (Some("alias"), Some("override")));
    let deleted: Value =
        serde_json::from_str(&admin_cli(&serve, &["prices", "delete", "house-model"])).expect("JSON");
    assert!(deleted["revision"].as_u64() > Some(revision));
    let got: Value =
        serde_json::from_str(&admin_cli(&serve, &["prices", "get", "house-model"])).expect("JSON");
    assert_eq!(got["source"], "fallback");
    let file = dir.join("litellm.json");
    std::fs::write(
        &file,
        r#"{"house-model": {"litellm_provider": "openai", "mode": "chat", "input_cost_per_token": 1.5e-06, "output_cost_per_token": 2e-06},
            "other/model": {"litellm_provider": "groq", "mode": "chat", "input_cost_per_token": 1e-07, "output_cost_per_token": 1e-07}}"#,
    )
    .expect("write");
    let imported: Value =
        serde_json::from_str(&admin_cli(&serve, &["prices", "import", file.to_str().expect("path")]))
            .expect("JSON");
    assert_eq!(imported["imported"], 1, "{imported}");
    let listed: Value = serde_json::from_str(&admin_cli(&serve, &["prices", "list"])).expect("JSON");
    assert_eq!(listed["prices"]["house-model"]["input_per_mtok_usd"], "1.50");
    assert_eq!(listed["prices"]["house-model"]["source"], "override");
    assert_eq!(listed["prices"]["house-model"]["kind"], "openai");
    assert_eq!(listed["prices"]["gpt-4o"]["source"], "builtin");
    assert_eq!(listed["fallback"]["openai"]["input_per_mtok_usd"], "150.00");
    admin_cli(&serve, &["prices", "set-fallback", "anthropic", "--input", "20", "--output", "80"]);
    let listed: Value = serde_json::from_str(&admin_cli(&serve, &["prices", "list"])).expect("JSON");
    assert_eq!(listed["fallback"]["anthropic"]["source"], "override");
    admin_cli(&serve, &["prices", "delete-fallback", "anthropic"]);
    let listed: Value = serde_json::from_str(&admin_cli(&serve, &["prices", "list"])).expect("JSON");
    assert_eq!(listed["fallback"]["anthropic"]["source"], "computed");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_says_whether_the_organizations_key_or_the_clients_own_paid_the_provider() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("provider-key");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("{}/v1/chat/completions", serve.gateway);
    // The organization's managed key, then the client's own beside its Recovea key.
    let bearer = format!("Bearer {secret}");
    let (status, _) = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let own = [("x-recovea-key", secret.as_str()), ("authorization", "Bearer sk-client-own-0123456789")];
    let (status, _) = call(Method::POST, &url, &own, Some(chat)).await;
    assert_eq!(status, StatusCode::OK);
    let sent: Vec<_> = mock.requests().iter().map(|r| r.header("authorization").map(str::to_owned)).collect();
    assert_eq!(
        sent,
        [Some("Bearer sk-managed-0123456789".to_owned()), Some("Bearer sk-client-own-0123456789".to_owned())]
    );

    let receipts = harness::eventually(harness::DEADLINE, "both receipts", || async {
        let receipts = all_receipts(&serve, &org_id).await;
        (receipts.len() == 2).then_some(receipts)
    })
    .await;
    let paid: Vec<&str> =
        receipts.iter().map(|r| r["provider_key"].as_str().expect("provider_key")).collect();
    assert_eq!(paid, ["managed", "client"]);
    // A filter, through the API and the CLI, and the CSV export's last column.
    let only = |value: &str| {
        let path = format!("/orgs/{org_id}/receipts?provider_key={value}");
        let serve = &serve;
        async move { admin(serve, Method::GET, &path, None).await }
    };
    assert_eq!(only("client").await["receipts"][0]["id"], receipts[1]["id"]);
    assert_eq!(only("client").await["receipts"].as_array().map(Vec::len), Some(1));
    let managed: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "list", "--org", &org_id, "--provider-key", "managed"],
    ))
    .expect("JSON");
    assert_eq!(managed["receipts"].as_array().map(Vec::len), Some(1));
    assert_eq!(managed["receipts"][0]["id"], receipts[0]["id"]);
    let csv = admin_cli(&serve, &["receipts", "export", "--org", &org_id]);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].ends_with(",job_id,held_usd,provider_key"), "{csv}");
    assert!(lines[1].ends_with(",managed") && lines[2].ends_with(",client"), "{csv}");
    let auth = format!("Bearer {TOKEN}");
    let bad = format!("{}/admin/v1/orgs/{org_id}/receipts?provider_key=own", serve.admin);
    let (status, body) = call(Method::GET, &bad, &[("authorization", &auth)], None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(body["error"]["message"], "provider_key: expected managed or client");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tagged_receipts_are_filtered_exported_and_summed_by_tag() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("tags");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    let bearer = format!("Bearer {secret}");
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("{}/v1/chat/completions", serve.gateway);
    for tags in ["team=search,feature=autocomplete", "team=search", "team=ads"] {
        let headers = [("authorization", bearer.as_str()), ("x-recovea-tags", tags)];
        let (status, body) = call(Method::POST, &url, &headers, Some(chat.clone())).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let (status, body) = call(
        Method::POST,
        &url,
        &[("authorization", &bearer), ("x-recovea-tags", "team")],
        Some(chat.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(error["error"]["code"], "invalid_tags");
    assert_eq!(error["error"]["message"], "Invalid x-recovea-tags: 'team' is not key=value.");
    assert!(
        mock.requests().iter().all(|r| r.header("x-recovea-tags").is_none()),
        "tags reached the provider"
    );
    // An untagged request after the refused one: its receipt is spooled after any the refused one
    // could have had, so once it is in the ledger, a receipt too many would be there too.
    let last = harness::call(Method::POST, &url, &[("authorization", &bearer)], Some(chat)).await;
    assert_eq!(last.status, StatusCode::OK);
    let last_id = last.headers["x-request-id"].to_str().expect("text").to_owned();
    let receipts = harness::eventually(harness::DEADLINE, "the last request's receipt", || async {
        let receipts = all_receipts(&serve, &org_id).await;
        receipts.iter().any(|r| r["request_id"] == last_id.as_str()).then_some(receipts)
    })
    .await;
    assert_eq!(receipts.len(), 4, "the refused request has no receipt");
    let listed: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "list", "--org", &org_id, "--tag", "team:search"],
    ))
    .expect("JSON");
    let tags: Vec<&Value> =
        listed["receipts"].as_array().expect("receipts").iter().map(|r| &r["tags"]).collect();
    assert_eq!(tags, [&json!({"feature": "autocomplete", "team": "search"}), &json!({"team": "search"})]);
    let csv = admin_cli(&serve, &["receipts", "export", "--org", &org_id, "--tag", "team:ads"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    assert!(
        lines[0].ends_with(
            ",priced_as,tags,audio_input_tokens,cached_audio_input_tokens,audio_output_tokens,job_id,held_usd,provider_key"
        ),
        "{csv}"
    );
    // No audio, no job: zeros, and two empty fields; then who paid.
    assert!(lines[1].ends_with(",team=ads,0,0,0,,,managed"), "{csv}");
    let summary: Value = serde_json::from_str(&admin_cli(
        &serve,
        &["receipts", "summary", "--org", &org_id, "--group-by", "tag:team"],
    ))
    .expect("JSON");
    let rows: Vec<(Value, u64)> = summary["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["tag_value"].clone(), r["requests"].as_u64().expect("count")))
        .collect();
    assert_eq!(rows, [(Value::Null, 1), (json!("ads"), 1), (json!("search"), 2)]);
    // One receipt by id, as the listing has it; not through another organization.
    let first = &all_receipts(&serve, &org_id).await[0];
    let id = first["id"].as_str().expect("id");
    assert_eq!(&admin(&serve, Method::GET, &format!("/orgs/{org_id}/receipts/{id}"), None).await, first);
    let other = admin(&serve, Method::POST, "/orgs", Some(json!({"name": "other"}))).await;
    let auth = format!("Bearer {TOKEN}");
    for path in [
        format!("/orgs/{}/receipts/{id}", other["id"].as_str().expect("id")),
        format!("/orgs/{org_id}/receipts/rcpt_none"),
    ] {
        let url = format!("{}/admin/v1{path}", serve.admin);
        assert_eq!(
            call(Method::GET, &url, &[("authorization", &auth)], None).await.0,
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let bad = format!("{}/admin/v1/orgs/{org_id}/receipts?tag=team", serve.admin);
    assert_eq!(call(Method::GET, &bad, &[("authorization", &auth)], None).await.0, StatusCode::BAD_REQUEST);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
