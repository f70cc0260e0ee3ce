//! Black-box tests of caps through the `recovea` binary: the admin API, spend, and alerts with
//! signed webhooks.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, Tenant, temp_dir};

const TOKEN: &str = "caps-test-token-0123456789abcdef01234567";
const SIGNING_SECRET: &str = "whsec_test_secret";

fn start(data_dir: &Path, mock_url: &str) -> Serve {
    Serve::start(data_dir, mock_url, &["--admin-token", TOKEN, "--alert-signing-secret", SIGNING_SECRET])
}

impl Serve {
    async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let auth = format!("Bearer {TOKEN}");
        let (status, bytes) =
            call(method, &format!("{}/admin/v1{path}", self.admin), &[("authorization", &auth)], body).await;
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.admin(method, path, body).await;
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }
}

async fn call(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Bytes) {
    let answer = harness::call(method, url, headers, body).await;
    (answer.status, answer.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_are_created_validated_changed_and_deleted() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("crud");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, key_id, .. } = serve.organization(TOKEN, OPENAI).await;
    let caps = format!("/orgs/{org_id}/caps");

    for (body, field) in [
        (json!({"scope": "planet", "window": "month", "limit_usd": "1", "hard_stop": true}), "scope:"),
        (json!({"scope": "organization", "window": "year", "limit_usd": "1", "hard_stop": true}), "window:"),
        (
            json!({"scope": "organization", "window": "month", "limit_usd": "-1", "hard_stop": true}),
            "limit_usd:",
        ),
        (
            json!({"scope": "organization", "window": "month", "limit_usd": "1.0000000001", "hard_stop": true}),
            "limit_usd:",
        ),
        (json!({"scope": "key", "window": "month", "limit_usd": "1", "hard_stop": true}), "key_id:"),
        (
            json!({"scope": "key", "key_id": "key_nope", "window": "month", "limit_usd": "1", "hard_stop": true}),
            "key_id:",
        ),
        (
            json!({"scope": "organization", "window": "month", "limit_usd": "1", "hard_stop": true, "alert_at": [0]}),
            "alert_at:",
        ),
        (
            json!({"scope": "organization", "window": "month", "limit_usd": "1", "hard_stop": true, "alert_webhook": "ftp://x"}),
            "alert_webhook:",
        ),
        (
            json!({"scope": "organization", "window": "month", "limit_usd": "1"}),
            "body: missing field `hard_stop`",
        ),
    ] {
        let (status, answer) = serve.admin(Method::POST, &caps, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(field), "{body}: {message}");
        // `param` names the field; a refusal of the body as a whole (`body: ...`) names none.
        assert_eq!(answer["error"]["param"].as_str(), field.strip_suffix(':'), "{body}");
    }
    let year = json!({"scope": "organization", "window": "year", "limit_usd": "1", "hard_stop": true});
    let auth = format!("Bearer {TOKEN}");
    let (status, bytes) = call(
        Method::POST,
        &format!("{}/admin/v1{caps}", serve.admin),
        &[("authorization", &auth)],
        Some(year),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        r#"{
  "error": {
    "message": "window: expected \"day\", \"week\" or \"month\"",
    "type": "invalid_request_error",
    "param": "window",
    "code": "invalid_request"
  }
}"#
    );

    let org_cap = serve
        .ok(
            Method::POST,
            &caps,
            Some(
                json!({"scope": "organization", "window": "month", "limit_usd": "25.00", "hard_stop": true}),
            ),
        )
        .await;
    assert_eq!(org_cap["limit_usd"], "25.00");
    assert_eq!(org_cap["alert_at"], json!([0.5, 0.8, 1.0]));
    let key_cap = serve
        .ok(
            Method::POST,
            &caps,
            Some(json!({"scope": "key", "key_id": key_id, "window": "day", "limit_usd": "0.5", "hard_stop": false, "alert_at": [0.9]})),
        )
        .await;
    assert_eq!((key_cap["scope"].as_str(), key_cap["key_id"].as_str()), (Some("key"), Some(key_id.as_str())));
    let listed = serve.ok(Method::GET, &caps, None).await;
    assert_eq!(listed["caps"].as_array().expect("caps").len(), 2);

    let key_cap_path = format!("/caps/{}", key_cap["id"].as_str().expect("id"));
    let hooked = serve
        .ok(Method::PATCH, &key_cap_path, Some(json!({"alert_webhook": "https://hooks.example.com/x"})))
        .await;
    assert_eq!(hooked["alert_webhook"], "https://hooks.example.com/x");
    let cleared = serve.ok(Method::PATCH, &key_cap_path, Some(json!({"alert_webhook": null}))).await;
    assert_eq!(cleared["alert_webhook"], Value::Null, "null removes the webhook");
    let cap_path = format!("/caps/{}", org_cap["id"].as_str().expect("id"));
    let patched =
        serve.ok(Method::PATCH, &cap_path, Some(json!({"limit_usd": "30", "hard_stop": false}))).await;
    assert_eq!((patched["limit_usd"].as_str(), patched["hard_stop"].as_bool()), (Some("30.00"), Some(false)));
    let spend = serve.ok(Method::GET, &format!("/orgs/{org_id}/spend"), None).await;
    let rows = spend["spend"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter().all(|r| r["spend_usd"] == "0.00"
            && r["window_start"].is_string()
            && r["window_end"].is_string())
    );

    assert_eq!(serve.ok(Method::DELETE, &cap_path, None).await["deleted"], true);
    let (status, _) = serve.admin(Method::GET, &cap_path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = serve.admin(Method::DELETE, &cap_path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A webhook receiver on loopback that records what it is sent, and fails the first `fail` times.
async fn webhook_receiver(fail: usize) -> (String, Arc<Mutex<Vec<(String, Bytes)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let received: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
    let seen = Arc::clone(&received);
    let failures = Arc::new(Mutex::new(fail));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (seen, failures) = (Arc::clone(&seen), Arc::clone(&failures));
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let (seen, failures) = (Arc::clone(&seen), Arc::clone(&failures));
                    async move {
                        let signature = request
                            .headers()
                            .get("x-recovea-signature")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let body =
                            request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let mut left = failures.lock().expect("lock");
                        let status = if *left > 0 {
                            *left -= 1;
                            StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            seen.lock().expect("lock").push((signature, body));
                            StatusCode::OK
                        };
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, received)
}

fn verify(signature: &str, body: &[u8]) -> bool {
    let Some((t, v1)) = signature.strip_prefix("t=").and_then(|rest| rest.split_once(",v1=")) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SIGNING_SECRET.as_bytes());
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(body);
    let expected: String =
        ring::hmac::sign(&key, &message).as_ref().iter().map(|b| format!("{b:02x}")).collect();
    expected == v1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_thresholds_raises_each_alert_once_and_posts_it_signed_with_retries() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("alerts");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    let (hook, received) = webhook_receiver(1).await;
    // Each request: 1000 input + 1000 output tokens of gpt-4o-mini = $0.00015 + $0.0006 = $0.00075.
    let usage = json!({"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000});
    mock.script(Behaviour::default().usage(usage).times(4));
    let cap = serve
        .ok(
            Method::POST,
            &format!("/orgs/{org_id}/caps"),
            Some(json!({"scope": "organization", "window": "day", "limit_usd": "0.002", "hard_stop": false,
                        "alert_at": [0.5, 1.0], "alert_webhook": hook})),
        )
        .await;
    let bearer = format!("Bearer {secret}");
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    for _ in 0..4 {
        let (status, _) = call(
            Method::POST,
            &format!("{}/v1/chat/completions", serve.gateway),
            &[("authorization", &bearer)],
            Some(chat.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "a soft cap never refuses");
    }
    // $0.003 spent over a $0.002 limit: both thresholds crossed, each raised once.
    let alerts = harness::eventually(harness::DEADLINE, "both alerts listed and delivered", || async {
        let alerts = serve.ok(Method::GET, &format!("/orgs/{org_id}/alerts"), None).await;
        let delivered = received.lock().expect("lock").len();
        (alerts["alerts"].as_array().is_some_and(|a| a.len() == 2) && delivered == 2).then_some(alerts)
    })
    .await;
    let thresholds: Vec<&Value> =
        alerts["alerts"].as_array().expect("alerts").iter().map(|a| &a["threshold"]).collect();
    assert_eq!(thresholds, [&json!(0.5), &json!(1.0)]);
    assert!(alerts["alerts"].as_array().expect("alerts").iter().all(|a| a["cap_id"] == cap["id"]));
    for (signature, body) in received.lock().expect("lock").iter() {
        assert!(verify(signature, body), "bad signature {signature}");
        let payload: Value = serde_json::from_slice(body).expect("JSON");
        assert_eq!(payload["type"], "cap.alert");
        assert_eq!(payload["cap"]["id"], cap["id"]);
    }
    // The second receipt crosses the last threshold: the third may reach the ledger after both
    // alerts are out.
    let spend = harness::eventually(harness::DEADLINE, "the third receipt in the ledger", || async {
        let spend = serve.ok(Method::GET, &format!("/orgs/{org_id}/spend"), None).await;
        (spend["spend"][0]["spend_usd"] == "0.003").then_some(spend)
    })
    .await;
    // Reconciliation: the counters agree with the ledger once every receipt is in.
    assert_eq!(spend["spend"][0]["counter_usd"], "0.003");
    assert_eq!(spend["spend"][0]["drift_usd"], "0.00");

    // Arming the cap reaches the serving gateway within a second: it is already over its line.
    let cap_path = format!("/caps/{}", cap["id"].as_str().expect("id"));
    serve.ok(Method::PATCH, &cap_path, Some(json!({"hard_stop": true}))).await;
    let armed_at = Instant::now();
    loop {
        let (status, body) = call(
            Method::POST,
            &format!("{}/v1/chat/completions", serve.gateway),
            &[("authorization", &bearer)],
            Some(chat.clone()),
        )
        .await;
        if status == StatusCode::PAYMENT_REQUIRED {
            let expected = recovea_core::Answer::budget_exceeded("organization", "day", "Daily");
            assert_eq!(body, Bytes::from(expected.body));
            break;
        }
        assert!(
            armed_at.elapsed() < Duration::from_secs(1),
            "the armed cap did not reach the gateway within a second"
        );
    }
    // Deleting it lets traffic through again, as fast.
    serve.ok(Method::DELETE, &cap_path, None).await;
    let deleted_at = Instant::now();
    loop {
        let (status, _) = call(
            Method::POST,
            &format!("{}/v1/chat/completions", serve.gateway),
            &[("authorization", &bearer)],
            Some(chat.clone()),
        )
        .await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            deleted_at.elapsed() < Duration::from_secs(1),
            "the deleted cap still refused after a second"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpriced_model_is_costed_at_the_fallback_and_stopped_at_the_line() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("unpriced");
    let serve = start(&dir, &mock.url());
    let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
    // The model nothing in the table resolves to: the openai kind's fallback prices it.
    let resolved = serve.ok(Method::GET, "/prices/mystery-model-7", None).await;
    assert_eq!(resolved["source"], "fallback", "{resolved}");
    let fallback = &resolved["fallback"]["openai"];
    assert_eq!(fallback["source"], "computed", "{resolved}");
    // A round fallback keeps the arithmetic readable: 2 input x $100 + 5 output x $200 per Mtok
    // is $0.0012 a request (the mock reports 2 input and 5 output tokens for this body).
    let set = json!({"input_per_mtok_usd": "100", "output_per_mtok_usd": "200"});
    serve.ok(Method::PUT, "/fallback-prices/openai", Some(set)).await;
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "0.005", "hard_stop": true});
    serve.ok(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;

    let bearer = format!("Bearer {secret}");
    let body =
        json!({"model": "mystery-model-7", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("{}/v1/chat/completions", serve.gateway);
    let mut admitted = 0;
    let refused = loop {
        let (status, bytes) =
            call(Method::POST, &url, &[("authorization", &bearer)], Some(body.clone())).await;
        if status == StatusCode::PAYMENT_REQUIRED {
            break serde_json::from_slice::<Value>(&bytes).expect("JSON");
        }
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
        admitted += 1;
        // Four requests spend $0.0048, five $0.006: the fifth is the last one under the line.
        assert!(admitted <= 5, "an unpriced model ran past its cap: $0.0012 x {admitted}");
    };
    assert_eq!(refused["error"]["code"], "budget_exceeded");
    assert!(admitted >= 4, "refused after {admitted} requests, before the line");

    let receipts = harness::eventually(harness::DEADLINE, "a receipt per admitted request", || async {
        let page = serve.ok(Method::GET, &format!("/orgs/{org_id}/receipts"), None).await;
        let receipts = page["receipts"].as_array().cloned().unwrap_or_default();
        (receipts.len() == admitted).then_some(receipts)
    })
    .await;
    for receipt in &receipts {
        assert_eq!(receipt["priced"], false, "{receipt}");
        assert_eq!(receipt["priced_as"], "fallback:openai", "{receipt}");
        assert_eq!(receipt["cost_usd"], "0.0012", "{receipt}");
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request without an output limit under an armed cap holds the model's most output while it is
/// in flight, in `serve` on its own counters as on Redis's: a cap that one such worst case passes
/// refuses the next request until the first has settled at its real cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_request_holds_its_worst_case_at_the_line_in_memory_and_on_redis() {
    for redis in [None, Some("redis://127.0.0.1:6379/")] {
        let mock = MockProvider::start().await;
        let dir = temp_dir("worst-case");
        let serve = match redis {
            None => start(&dir, &mock.url()),
            Some(url) => Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN, "--redis-url", url]),
        };
        let Tenant { org_id, secret, .. } = serve.organization(TOKEN, OPENAI).await;
        // gpt-4o-mini, its tier left to the provider: at worst 16,384 output tokens at priority's
        // $1 per Mtok, $0.0164; typically 1,024 at $0.60, $0.0006. The mock answers 5.
        let cap =
            json!({"scope": "organization", "window": "month", "limit_usd": "0.015", "hard_stop": true});
        serve.ok(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
        mock.script(Behaviour::default().delay_ms(1_500).times(1));
        let (url, bearer) = (format!("{}/v1/chat/completions", serve.gateway), format!("Bearer {secret}"));
        let uncapped = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
        // The cap reaches the gateway: a first request is admitted, and settles at a few tokens.
        let admits = || async {
            let (status, _) =
                call(Method::POST, &url, &[("authorization", &bearer)], Some(uncapped.clone())).await;
            (status == StatusCode::OK).then_some(())
        };
        harness::eventually(harness::DEADLINE, "the armed cap's counters admitting a request", admits).await;
        mock.script(Behaviour::default().delay_ms(1_500).times(1));
        let first = {
            let (url, bearer, body) = (url.clone(), bearer.clone(), uncapped.clone());
            tokio::spawn(
                async move { call(Method::POST, &url, &[("authorization", &bearer)], Some(body)).await },
            )
        };
        mock.received(2).await;
        let (status, _) =
            call(Method::POST, &url, &[("authorization", &bearer)], Some(uncapped.clone())).await;
        assert_eq!(
            status,
            StatusCode::PAYMENT_REQUIRED,
            "redis {redis:?}: the first one's worst case holds the room"
        );
        assert_eq!(first.await.expect("task").0, StatusCode::OK);
        // Settled at its real cost, the room is back.
        let what = format!("redis {redis:?}: the room back once the request settled");
        harness::eventually(harness::DEADLINE, &what, admits).await;
        serve.kill();
    }
}
