//! The channels of spend on the request path: free requests pass an armed cap's line and spend
//! that cannot be confirmed; requests billed where the gateway cannot see them are refused while
//! an armed cap covers the key, and forwarded unmetered otherwise.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use recovea_core::Answer;
use recovea_core::answer::WireShape;
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::hash_secret;
use recovea_core::money::Nanos;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, SnapshotBuilder};
use recovea_core::usage::UsageSource;
use recovea_core::window::Window;
use recovea_counters::InProcess;
use recovea_gateway::GatewayConfig;
use recovea_testkit::MockProvider;

mod support;

use support::Harness;

const KEY: &str = "rk_live0000000000000000000000000000000000000001";
const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hello"}]}"#;

fn cap(scope: Scope, window: Window, limit_usd: &str, hard_stop: bool) -> Cap {
    support::cap("cap_1", scope, window, limit_usd, hard_stop)
}

/// A node whose one organization has managed OpenAI, Anthropic and Gemini credentials and `caps`; its
/// counters confirmed when `confirmed`.
async fn node(caps: Vec<Cap>, confirmed: bool) -> Harness {
    let mock = MockProvider::start().await;
    let config = GatewayConfig::new(support::settings(&mock.url())).expect("config");
    let org = OrgId::parse("org_acme").expect("id");
    let mut b = SnapshotBuilder::new(1);
    b.org(org.clone());
    let kinds = [
        ("openai", ProviderKind::OpenAi),
        ("anthropic", ProviderKind::Anthropic),
        ("gemini", ProviderKind::Gemini),
    ];
    for (name, kind) in kinds {
        let base_url = Some(mock.url());
        let credential = ProviderCredential::new(name.into(), kind, base_url, format!("sk-{name}-managed"));
        b.provider(&org, credential);
    }
    for cap in caps {
        b.cap(cap);
    }
    b.key(hash_secret(KEY), KeyId::parse("key_live").expect("id"), org, None);
    let h = Harness::serve(mock, config, Some(b.build())).await;
    if confirmed {
        h.confirm(&InProcess::default()).await;
    }
    h
}

async fn call(h: &Harness, method: &Method, path: &str, body: &str) -> (StatusCode, http::HeaderMap, Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(format!("{}{path}", h.url))
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = h.client.request(request).await.expect("gateway answers");
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.expect("body").to_bytes())
}

/// Requests that cannot spend, with a body each would carry.
const FREE: [(&str, &str, &str); 9] = [
    ("GET", "/v1/models", ""),
    ("GET", "/v1/batches/batch_1", ""),
    ("DELETE", "/v1/files/file-1", ""),
    ("POST", "/v1/batches/batch_1/cancel", ""),
    ("POST", "/v1/responses/resp_1/cancel", ""),
    ("POST", "/v1/moderations", r#"{"input":"Is this fine?"}"#),
    ("POST", "/v1/messages/count_tokens", r#"{"model":"claude-sonnet-4-5","messages":[]}"#),
    ("POST", "/v1/responses/input_tokens", r#"{"model":"gpt-5","input":"hi"}"#),
    ("POST", "/v1beta/models/gemini-2.5-pro:countTokens", r#"{"contents":[]}"#),
];

#[tokio::test]
async fn free_requests_pass_a_reached_line_and_unconfirmed_spend_and_cost_nothing() {
    // An armed cap of $0 is at its line from the start.
    for confirmed in [true, false] {
        let h = node(vec![cap(Scope::Organization, Window::Month, "0", true)], confirmed).await;
        let (status, _, _) = call(&h, &Method::POST, "/v1/chat/completions", CHAT).await;
        let refused = if confirmed { StatusCode::PAYMENT_REQUIRED } else { StatusCode::SERVICE_UNAVAILABLE };
        assert_eq!(status, refused, "a chat request is refused at the line (confirmed: {confirmed})");
        for (method, path, body) in FREE {
            let method = Method::from_bytes(method.as_bytes()).expect("method");
            let (status, _, body) = call(&h, &method, path, body).await;
            assert!(
                status != StatusCode::PAYMENT_REQUIRED && status != StatusCode::SERVICE_UNAVAILABLE,
                "{method} {path} is free, yet answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        h.forwarded(FREE.len()).await;
        let receipts = h.receipts(FREE.len()).await;
        for receipt in &receipts {
            assert_eq!(receipt.cost_usd, Nanos::ZERO, "{receipt:?}");
            assert_eq!((receipt.input_tokens, receipt.output_tokens), (0, 0), "{receipt:?}");
        }
    }
}

/// Requests billed where the gateway cannot see them, one of each the contract lists.
const UNSEEN: [(&str, &str, &str); 17] = [
    ("POST", "/v1/realtime/client_secrets", "/v1/realtime/client_secrets"),
    ("POST", "/v1/realtime/sessions", "/v1/realtime/sessions"),
    ("POST", "/v1/realtime/transcription_sessions", "/v1/realtime/transcription_sessions"),
    ("POST", "/v1/realtime/calls", "/v1/realtime/calls"),
    ("POST", "/v1/fine_tuning/jobs", "/v1/fine_tuning/jobs"),
    ("POST", "/v1/vector_stores", "/v1/vector_stores"),
    ("POST", "/v1/vector_stores/vs_1/files", "/v1/vector_stores"),
    ("POST", "/v1/vector_stores/vs_1/file_batches", "/v1/vector_stores"),
    ("POST", "/v1/containers", "/v1/containers"),
    ("POST", "/v1/threads/runs", "/v1/threads/runs"),
    ("POST", "/v1/threads/thread_1/runs", "/v1/threads/runs"),
    ("POST", "/v1/videos", "/v1/videos"),
    ("POST", "/v1beta/cachedContents", "cachedContents"),
    ("PATCH", "/v1beta/cachedContents/c1", "cachedContents"),
    ("POST", "/v1beta/auth_tokens", "auth_tokens"),
    ("POST", "/v1/something/new", "other"),
    ("PUT", "/v1/something/new", "other"),
];

#[tokio::test]
async fn requests_outside_sight_are_refused_while_an_armed_cap_covers_the_key() {
    // Far from its line: the refusal does not depend on spend.
    for (scope, window) in [(Scope::Key, Window::Day), (Scope::Organization, Window::Month)] {
        let h = node(vec![cap(scope, window, "1000", true)], true).await;
        for (method, path, _) in UNSEEN {
            let method = Method::from_bytes(method.as_bytes()).expect("method");
            let (status, headers, body) = call(&h, &method, path, r#"{"model":"gpt-4o"}"#).await;
            let endpoint = path.split('?').next().expect("path");
            let expected = Answer::budget_unmeterable(
                scope.as_str(),
                window.as_str(),
                window.adjective(),
                &format!("{method} {endpoint}"),
            )
            .shaped(WireShape::of_request(path, false));
            assert_eq!(status.as_u16(), expected.status, "{method} {path}");
            assert_eq!(
                std::str::from_utf8(&body).expect("utf-8"),
                std::str::from_utf8(&expected.body).expect("utf-8")
            );
            for (name, value) in &expected.headers {
                assert_eq!(
                    headers.get(*name).map(|v| v.to_str().expect("text")),
                    Some(value.as_str()),
                    "{name}"
                );
            }
            assert_eq!(headers.get("retry-after"), None, "a sure answer has no retry hint");
        }
        assert!(h.mock.requests().is_empty(), "nothing reached the provider");
        let refused = format!(
            "recovea_cap_refusals_total{{code=\"budget_unmeterable\",scope=\"{}\",window=\"{}\"}}",
            scope.as_str(),
            window.as_str()
        );
        assert_eq!(h.metric(&refused).await, UNSEEN.len() as u64);
        assert_eq!(
            h.metric("recovea_requests_total{outcome=\"budget_unmeterable\"}").await,
            UNSEEN.len() as u64
        );
    }
    // The contract's example, byte for byte.
    let h = node(vec![cap(Scope::Organization, Window::Month, "25", true)], true).await;
    let (_, _, body) = call(&h, &Method::POST, "/v1/fine_tuning/jobs", "{}").await;
    let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        body["error"]["message"],
        "POST /v1/fine_tuning/jobs is billed where this gateway cannot see it; refused while a monthly spend cap with a hard stop covers this key."
    );
}

#[tokio::test]
async fn without_an_armed_cap_requests_outside_sight_are_forwarded_and_counted_unmetered() {
    // A soft cap counts and alerts, and never refuses: the request goes, its receipt says so.
    let h = node(vec![cap(Scope::Organization, Window::Month, "0", false)], true).await;
    for (method, path, _) in UNSEEN {
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let (status, _, _) = call(&h, &method, path, r#"{"model":"gpt-4o"}"#).await;
        assert_ne!(status, StatusCode::PAYMENT_REQUIRED, "{method} {path}");
    }
    h.forwarded(UNSEEN.len()).await;
    let receipts = h.receipts(UNSEEN.len()).await;
    for receipt in &receipts {
        assert_eq!(receipt.usage_source, UsageSource::Unmetered, "{receipt:?}");
        assert_eq!(receipt.cost_usd, Nanos::ZERO);
    }
    // Each under its fixed label, whatever the path held.
    for (_, _, label) in UNSEEN {
        let series = format!("recovea_unmetered_requests_total{{endpoint=\"{label}\"}}");
        let sent = UNSEEN.iter().filter(|(_, _, l)| *l == label).count() as u64;
        assert_eq!(h.metric(&series).await, sent, "{series}");
    }
    // Nothing is reserved or counted on the cap for them.
    let spend = recovea_core::caps::SpendView::spend(
        h.counters.as_ref(),
        &OrgId::parse("org_acme").expect("id"),
        &CapId::parse("cap_1").expect("id"),
        Window::Month.start(recovea_core::Timestamp::from_system_time(std::time::SystemTime::now())),
    );
    assert_eq!(spend.spent.saturating_add(spend.reserved), Nanos::ZERO);
}
