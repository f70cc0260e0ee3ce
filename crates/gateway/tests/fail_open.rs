//! Fail-open passes in-process, over real sockets, in front of the mock provider: a node with no
//! snapshot, and each fault injected into the admission phase through its failpoint (the
//! `failpoints` feature, enabled for this crate's tests by its dev-dependency on itself).
//!
//! Failpoints are process-wide: every test here that sends traffic holds a `FailScenario`, whose
//! lock runs them one at a time, so that no test sees another's faults.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fail::FailScenario;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use recovea_core::Timestamp;
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::window::Window;
use recovea_gateway::{ConfigError, GatewayConfig, GatewaySettings};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

mod support;

use support::Harness;

/// A key of org_capped, whose armed cap can never be confirmed here: admitted, it is refused 503.
const KEY: &str = "rk_live0000000000000000000000000000000000000001";
/// A key of org_open, which has no cap: its one admitted request proves where receipts go.
const SENTINEL_KEY: &str = "rk_sentinel000000000000000000000000000000000002";
const MANAGED: &str = "sk-managed-openai-0123456789";
const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}"#;

impl Harness {
    /// A node with no snapshot yet, in front of the mock, alarming to `webhook`.
    async fn start(webhook: &str, alarm_interval: Duration) -> Self {
        let mock = MockProvider::start().await;
        let settings = GatewaySettings {
            upstream_timeout: Duration::from_secs(5),
            alarm_webhook: Some(webhook.to_owned()),
            alarm_interval,
            ..support::settings(&mock.url())
        };
        let config = GatewayConfig::new(settings).expect("valid config");
        Self::serve(mock, config, None).await
    }

    fn install_snapshot(&self) {
        let capped = OrgId::parse("org_capped").expect("id");
        let open = OrgId::parse("org_open").expect("id");
        let mut b = SnapshotBuilder::new(1);
        b.org(capped.clone()).org(open.clone());
        for org in [&capped, &open] {
            let credential =
                ProviderCredential::new("openai".into(), ProviderKind::OpenAi, None, MANAGED.into());
            b.provider(org, credential);
        }
        let month = support::cap("cap_month", Scope::Organization, Window::Month, "100", true);
        b.cap(Cap { org_id: capped.clone(), ..month });
        b.key(hash_secret(KEY), KeyId::parse("key_live").expect("id"), capped, None);
        b.key(hash_secret(SENTINEL_KEY), KeyId::parse("key_sentinel").expect("id"), open, None);
        self.gateway.install_snapshot(Arc::new(b.build()));
    }

    async fn chat(&self, headers: &[(&str, &str)]) -> Response<hyper::body::Incoming> {
        let mut request = self.post("/v1/chat/completions");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request, CHAT).await
    }
}

async fn body_of(response: Response<hyper::body::Incoming>) -> Bytes {
    response.into_body().collect().await.expect("complete body").to_bytes()
}

fn fail_open_count(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("recovea_fail_open_total{{reason=\"{reason}\"}} ");
    let line = metrics.lines().find_map(|line| line.strip_prefix(&prefix));
    line.unwrap_or_else(|| panic!("no {reason} line in:\n{metrics}")).parse().expect("a count")
}

/// A webhook receiver: a second mock, answering 200 to every alarm.
async fn webhook() -> MockProvider {
    let webhook = MockProvider::start().await;
    webhook.script(Behaviour::default().body(json!({ "ok": true })).times(1000));
    webhook
}

/// The alarms `webhook` received, once at least `count` have arrived.
async fn alarms(webhook: &MockProvider, count: usize) -> Vec<Value> {
    let received = webhook.received(count).await;
    received
        .iter()
        .map(|alarm| {
            assert_eq!((alarm.method.as_str(), alarm.path.as_str()), ("POST", "/alarm"));
            assert_eq!(alarm.header("content-type"), Some("application/json"));
            alarm.body_json().expect("a JSON alarm")
        })
        .collect()
}

/// Three passes, with every property of a fail-open pass checked on what the mock received.
async fn passes_through(node: &Harness, reason: &str) {
    node.mock.reset();
    // What a real provider says to a request that carries no key of its own.
    let refusal = json!({ "error": { "message": "Missing API key.", "type": "invalid_request_error" } });
    node.mock.script(Behaviour::error(401).body(refusal.clone()));
    let bearer = format!("Bearer {KEY}");
    let before = fail_open_count(&node.metrics().await, reason);

    let response = node.chat(&[("authorization", &bearer)]).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{reason}");
    assert_eq!(body_of(response).await, Bytes::from(refusal.to_string()), "{reason}: unchanged");
    let response = node.chat(&[("x-recovea-key", KEY), ("authorization", "Bearer sk-own")]).await;
    assert_eq!(response.status(), StatusCode::OK, "{reason}: the client's own key passes");
    let body: Value = serde_json::from_slice(&body_of(response).await).expect("json");
    assert_eq!(body["object"], "chat.completion", "{reason}");
    // An armed cap that cannot be confirmed would refuse this key 503: no cap was looked up.
    let response = node.chat(&[("authorization", &bearer)]).await;
    assert_eq!(response.status(), StatusCode::OK, "{reason}");
    body_of(response).await;

    let seen = node.mock.requests();
    assert_eq!(seen.len(), 3, "{reason}");
    for (i, request) in seen.iter().enumerate() {
        let auth: Vec<&str> =
            request.headers.iter().filter(|(n, _)| n == "authorization").map(|(_, v)| v.as_str()).collect();
        let expected: &[&str] = if i == 1 { &["Bearer sk-own"] } else { &[] };
        assert_eq!(auth, expected, "{reason}, request {i}: no managed key, no Recovea key");
        assert_eq!(request.header("x-recovea-key"), None, "{reason}, request {i}");
        assert_eq!(request.header("x-api-key"), None, "{reason}, request {i}");
        for (name, value) in &request.headers {
            assert!(!value.contains("rk_") && !value.contains(MANAGED), "{reason}: header {name}");
        }
    }
    let metrics = node.metrics().await;
    assert_eq!(fail_open_count(&metrics, reason), before + 3, "{reason}");
}

#[tokio::test]
async fn every_fail_open_pass_strips_the_key_writes_no_receipt_and_alarms_once_per_reason() {
    let scenario = FailScenario::setup();
    let webhook = webhook().await;
    let node = Harness::start(&format!("{}/alarm", webhook.url()), Duration::from_secs(3600)).await;
    let metrics = node.metrics().await;
    for reason in ["no_snapshot", "snapshot_error", "rate_limiter_error", "admission_panic"] {
        assert_eq!(fail_open_count(&metrics, reason), 0, "every label from the start");
    }

    passes_through(&node, "no_snapshot").await;

    node.install_snapshot();
    let response = node.chat(&[("authorization", &format!("Bearer {KEY}"))]).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "admitted, the key meets its cap");
    let body: Value = serde_json::from_slice(&body_of(response).await).expect("json");
    assert_eq!(body["error"]["code"], "budget_unverifiable");

    for (point, action, reason) in [
        ("admission.snapshot", "return", "snapshot_error"),
        ("admission.rate_limiter", "return", "rate_limiter_error"),
        ("admission.panic", "panic", "admission_panic"),
        // A panic with the key already found: what admission learned must be forgotten.
        ("admission.rate_limiter", "panic", "admission_panic"),
    ] {
        fail::cfg(point, action).expect("failpoint");
        passes_through(&node, reason).await;
        fail::remove(point);
    }
    let metrics = node.metrics().await;
    assert_eq!(fail_open_count(&metrics, "admission_panic"), 6, "both panics counted");
    assert!(metrics.contains("recovea_requests_total{outcome=\"fail_open\"} 15\n"), "{metrics}");

    // The one admitted request's receipt is spooled after every pass: a pass's receipt, had one
    // been written, would have been delivered first.
    node.mock.reset();
    let response = node.chat(&[("authorization", &format!("Bearer {SENTINEL_KEY}"))]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let sentinel = response.headers().get("x-request-id").expect("id").to_str().expect("text").to_owned();
    body_of(response).await;
    assert_eq!(node.mock.requests()[0].header("authorization"), Some(format!("Bearer {MANAGED}").as_str()));
    let receipts = node.receipts_through(&sentinel).await;
    let ids: Vec<&str> = receipts.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, [sentinel.as_str()], "no receipt for a fail-open pass");

    // Fifteen passes of four reasons within one interval: four alarms, in the order raised. An
    // alarm too many, raised by a pass before the last reason's first, would be delivered before
    // the last reason's alarm (one queue, one alarm at a time): it would stand in these four.
    let received = alarms(&webhook, 4).await;
    let reasons: Vec<&str> = received.iter().map(|a| a["reason"].as_str().expect("reason")).collect();
    assert_eq!(reasons, ["no_snapshot", "snapshot_error", "rate_limiter_error", "admission_panic"]);
    for alarm in &received {
        assert_eq!(alarm["alarm"], "fail_open");
        assert_eq!(alarm["count"], 1, "the first pass of each reason alarms at once");
        assert_eq!(alarm["node_id"], "node_test");
        let at = alarm["at"].as_str().expect("at");
        assert!(Timestamp::parse_rfc3339(at).is_some(), "{at}");
    }
    // The rule itself (once per interval per reason, however many passes) is `alarm::tests`'s,
    // which needs no waiting to show that no fifth alarm comes.

    // Each pass was timed, its provider's first byte too; the one 503 is counted by its cap.
    let metrics = node.metrics().await;
    for line in [
        "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"fail_open\"} 15\n",
        "recovea_upstream_ttfb_seconds_count{provider=\"openai\",outcome=\"fail_open\"} 15\n",
        "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"budget_unverifiable\"} 1\n",
        "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"forwarded\"} 1\n",
        "recovea_cap_refusals_total{code=\"budget_unverifiable\",scope=\"organization\",window=\"month\"} 1\n",
        "recovea_cap_refusals_total{code=\"budget_exceeded\",scope=\"organization\",window=\"month\"} 0\n",
    ] {
        assert!(metrics.contains(line), "{line}{metrics}");
    }
    scenario.teardown();
}

#[tokio::test]
async fn a_stream_passed_through_fail_open_goes_and_comes_back_as_sent() {
    let webhook = webhook().await;
    let node = Harness::start(&format!("{}/alarm", webhook.url()), Duration::from_secs(3600)).await;
    // No state yet: a pass. The client asked for no usage: the gateway, which meters nothing on a
    // pass, must neither ask the provider for it nor leave a usage chunk the client never asked for.
    let stream =
        r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;
    let request = Request::post(format!("{}/v1/chat/completions", node.url))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Full::new(Bytes::from_static(stream.as_bytes())))
        .expect("request");
    let response = node.client.request(request).await.expect("gateway answers");
    assert_eq!(response.status(), StatusCode::OK);
    let events = String::from_utf8(body_of(response).await.to_vec()).expect("utf-8");
    assert_eq!(node.mock.requests()[0].body, stream, "the body went as the client sent it");
    assert!(!events.contains("\"usage\""), "no usage chunk the client did not ask for: {events}");
    assert!(events.ends_with("data: [DONE]\n\n"), "{events}");
}

#[tokio::test]
async fn the_next_alarm_after_the_interval_counts_the_passes_kept_quiet() {
    let scenario = FailScenario::setup();
    let webhook = webhook().await;
    let interval = Duration::from_secs(1);
    let node = Harness::start(&format!("{}/alarm", webhook.url()), interval).await;
    for _ in 0..3 {
        let response = node.chat(&[("x-recovea-key", KEY), ("authorization", "Bearer sk-own")]).await;
        assert_eq!(response.status(), StatusCode::OK);
        body_of(response).await;
    }
    alarms(&webhook, 1).await;
    // The behaviour under test: the interval passes (the alarm's clock is the system's, not
    // tokio's, so the time cannot be advanced).
    tokio::time::sleep(interval + Duration::from_millis(100)).await;
    let response = node.chat(&[("x-recovea-key", KEY), ("authorization", "Bearer sk-own")]).await;
    body_of(response).await;
    // The fourth pass alarms whatever came before; its alarm is the last to be delivered.
    let mut count = 1;
    let counts = loop {
        let received = alarms(&webhook, count).await;
        assert!(received.iter().all(|a| a["reason"] == "no_snapshot"), "{received:?}");
        let counts: Vec<u64> = received.iter().map(|a| a["count"].as_u64().expect("count")).collect();
        if counts.iter().sum::<u64>() >= 4 {
            break counts;
        }
        count = received.len() + 1;
    };
    // How many alarms the first three passes make depends on how long they took (the rule itself,
    // with an interval no machine is slow enough to pass, is `alarm::tests`'s): the first pass
    // alarms alone, the fourth counts those kept quiet before it, and none is lost or counted twice.
    assert_eq!(counts.first(), Some(&1), "the first pass alarms at once: {counts:?}");
    assert!(counts.len() >= 2, "the pass after the interval alarms: {counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), 4, "every pass is in exactly one alarm: {counts:?}");
    scenario.teardown();
}

#[tokio::test]
async fn a_dead_webhook_never_reaches_traffic() {
    let scenario = FailScenario::setup();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let node = Harness::start(&format!("http://{closed}/alarm"), Duration::from_millis(1)).await;
    for _ in 0..5 {
        let response = node.chat(&[("x-recovea-key", KEY), ("authorization", "Bearer sk-own")]).await;
        assert_eq!(response.status(), StatusCode::OK);
        body_of(response).await;
        // Past the 1 ms interval: each pass raises an alarm of its own, for the dead webhook.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(fail_open_count(&node.metrics().await, "no_snapshot"), 5);
    scenario.teardown();
}

#[test]
fn alarm_settings_are_checked() {
    let config = |alarm_webhook: Option<&str>, alarm_interval: Duration| {
        GatewayConfig::new(GatewaySettings {
            alarm_webhook: alarm_webhook.map(str::to_owned),
            alarm_interval,
            ..support::settings("http://127.0.0.1:9")
        })
    };
    let second = Duration::from_secs(1);
    assert!(config(None, second).is_ok());
    assert!(config(Some("https://hooks.example.com/recovea?token=t"), second).is_ok());
    let error = config(Some("hooks.example.com"), second).expect_err("no scheme");
    assert!(matches!(&error[..], [e] if e.flag == Some("alarm-webhook")), "{error:?}");
    let error = config(None, Duration::ZERO).expect_err("zero interval");
    assert_eq!(error, [ConfigError::zero("alarm-interval")]);
    // Both wrong: both named, the interval's problem first.
    let error = config(Some("hooks.example.com"), Duration::ZERO).expect_err("both");
    let flags: Vec<_> = error.iter().map(|e| e.flag).collect();
    assert_eq!(flags, [Some("alarm-interval"), Some("alarm-webhook")]);
}
