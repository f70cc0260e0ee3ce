//! Black-box tests of traces: `recovea serve --otlp-endpoint` sends, for each request through the
//! mock provider, a `request` span with a child per phase to a local OTLP receiver.

use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::json;
use tokio::io::AsyncWriteExt;

#[path = "support/harness.rs"]
mod harness;

use harness::{Serve, Tenant, call, temp_dir};

const TOKEN: &str = "traces-test-token-0123456789abcdef012345";
const MANAGED_KEY: &str = "sk-managed-traces-0123456789";
const PROMPT: &str = "a prompt that must never reach a span";
const WITHIN: Duration = Duration::from_secs(10);

/// An org with a key and an openai credential: (org id, key id, key secret).
async fn tenant(serve: &Serve) -> Tenant {
    serve.organization(TOKEN, &[("openai", MANAGED_KEY)]).await
}

/// The children's names, sorted.
fn names(children: &[ReceivedSpan]) -> Vec<String> {
    let mut names: Vec<String> = children.iter().map(|s| s.name().to_owned()).collect();
    names.sort();
    names
}

/// No attribute of `spans` carries a secret or the prompt.
fn nothing_secret(spans: &[&ReceivedSpan], secret: &str) {
    for span in spans {
        for (key, value) in span.attribute_texts() {
            for forbidden in [secret, MANAGED_KEY, PROMPT, TOKEN] {
                assert!(!value.contains(forbidden), "{} carries {key}={value}", span.name());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_a_span_with_a_child_per_phase() {
    let receiver = OtlpReceiver::start().await;
    let mock = MockProvider::start().await;
    let dir = temp_dir("traces");
    let endpoint = receiver.url();
    let serve = Serve::start(
        &dir,
        &mock.url(),
        &["--admin-token", TOKEN, "--otlp-endpoint", &endpoint, "--otlp-service-name", "recovea-test"],
    );
    let Tenant { org_id, key_id, secret } = tenant(&serve).await;
    let bearer = format!("Bearer {secret}");
    let url = format!("{}/v1/chat/completions", serve.gateway);
    let chat = |stream: bool| json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": PROMPT}]});

    // Admitted, under the client's own trace.
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = call(
        Method::POST,
        &url,
        &[("authorization", &bearer), ("traceparent", traceparent)],
        Some(chat(false)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let request_id = answer.headers["x-request-id"].to_str().expect("ascii").to_owned();
    let (root, children) =
        receiver.trace_where("request", ("recovea.request_id", &request_id), 4, WITHIN).await;
    assert_eq!(names(&children), ["admit", "caps", "stream", "upstream"]);
    assert_eq!(root.service_name.as_deref(), Some("recovea-test"));
    assert_eq!(hex(&root.span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736", "the client's trace");
    assert_eq!(hex(&root.span.parent_span_id), "00f067aa0ba902b7", "the client's span is the parent");
    for (attribute, value) in [
        ("recovea.org_id", org_id.as_str()),
        ("recovea.key_id", key_id.as_str()),
        ("recovea.route", "/v1/chat/completions"),
        ("recovea.provider", "openai"),
        ("gen_ai.request.model", "gpt-4o-mini"),
        ("http.response.status_code", "200"),
        ("recovea.outcome", "forwarded"),
    ] {
        assert_eq!(root.attribute(attribute).as_deref(), Some(value), "{attribute}");
    }
    // The receipt's usage and its exact cost, as a decimal string.
    assert!(root.attribute("gen_ai.usage.input_tokens").is_some_and(|n| n != "0"));
    assert!(root.attribute("gen_ai.usage.output_tokens").is_some_and(|n| n != "0"));
    let cost = root.attribute("recovea.cost_usd").expect("a cost");
    assert!(recovea_core::money::Nanos::parse_usd(&cost).is_ok_and(|c| c.0 > 0), "cost {cost}");
    for child in &children {
        assert!(child.span.start_time_unix_nano >= root.span.start_time_unix_nano, "{}", child.name());
        assert!(child.span.end_time_unix_nano <= root.span.end_time_unix_nano, "{}", child.name());
    }
    nothing_secret(&[&root], &secret);
    // The gateway sends its own trace context to no one: the provider sees the client's header only.
    let recorded = mock.requests();
    let headers = &recorded.last().expect("a provider request").headers;
    let sent: Vec<&str> =
        headers.iter().filter(|(name, _)| name == "traceparent").map(|(_, value)| value.as_str()).collect();
    assert_eq!(sent, [traceparent]);

    // Refused at admission: a root with only the admit child, which failed.
    let answer =
        call(Method::POST, &url, &[("authorization", "Bearer rk_not_a_key")], Some(chat(false))).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    let request_id = answer.headers["x-request-id"].to_str().expect("ascii").to_owned();
    let (root, children) =
        receiver.trace_where("request", ("recovea.request_id", &request_id), 1, WITHIN).await;
    assert_eq!(names(&children), ["admit"]);
    assert_eq!(root.attribute("http.response.status_code").as_deref(), Some("401"));
    assert_eq!(root.attribute("recovea.outcome").as_deref(), Some("invalid_key"));
    assert_eq!(root.attribute("recovea.org_id"), None);
    assert_eq!(children[0].span.status.as_ref().map(|s| s.code), Some(2), "admit ends in error");
    assert_eq!(hex(&root.span.parent_span_id), "", "no traceparent: a root");
    nothing_secret(&[&root], "rk_not_a_key");

    // Streamed: the stream phase lasts until the body's end, and the usage is the stream's.
    let answer = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat(true))).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&answer.body).contains("[DONE]"));
    let request_id = answer.headers["x-request-id"].to_str().expect("ascii").to_owned();
    let (root, children) =
        receiver.trace_where("request", ("recovea.request_id", &request_id), 4, WITHIN).await;
    assert_eq!(names(&children), ["admit", "caps", "stream", "upstream"]);
    assert!(root.attribute("gen_ai.usage.output_tokens").is_some_and(|n| n != "0"));
    assert!(root.attribute("recovea.cost_usd").is_some());
    let stream = children.iter().find(|s| s.name() == "stream").expect("stream");
    let upstream = children.iter().find(|s| s.name() == "upstream").expect("upstream");
    assert!(stream.span.start_time_unix_nano >= upstream.span.end_time_unix_nano);
    assert_eq!(stream.span.status.as_ref().map(|s| s.code).unwrap_or(0), 0, "the stream completed");
    nothing_secret(&[&root], &secret);

    // Nothing was dropped, and /metrics says so.
    let metrics = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(text.contains("recovea_trace_spans_dropped_total 0\n"), "{text}");
    // Every span came from the service named on the command line.
    assert!(receiver.spans().iter().all(|s| s.service_name.as_deref() == Some("recovea-test")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_the_answer_still_ends_its_trace_as_client_closed() {
    let receiver = OtlpReceiver::start().await;
    let mock = MockProvider::start().await;
    let dir = temp_dir("traces-abandoned");
    let endpoint = receiver.url();
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN, "--otlp-endpoint", &endpoint]);
    let Tenant { org_id, secret, .. } = tenant(&serve).await;
    // The provider takes its time; the client does not wait for it.
    mock.script(Behaviour::default().delay_ms(5_000));
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": PROMPT}]}).to_string();
    let address = serve.gateway.trim_start_matches("http://").to_owned();
    let mut client = tokio::net::TcpStream::connect(&address).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {secret}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(format!("{head}{body}").as_bytes()).await.expect("send");
    mock.received(1).await;
    drop(client);

    let (root, children) =
        receiver.trace_where("request", ("recovea.outcome", "client_closed"), 3, WITHIN).await;
    assert_eq!(names(&children), ["admit", "caps", "upstream"]);
    assert_eq!(root.attribute("http.response.status_code").as_deref(), Some("499"));
    assert_eq!(root.attribute("recovea.org_id").as_deref(), Some(org_id.as_str()));
    let upstream = children.iter().find(|s| s.name() == "upstream").expect("upstream");
    assert_eq!(upstream.span.status.as_ref().map(|s| s.code), Some(2), "the provider never answered");
    // The receipt of a client gone before the head (input estimated) is the span's too.
    assert!(root.attribute("gen_ai.usage.input_tokens").is_some_and(|n| n != "0"), "{root:?}");
    nothing_secret(&[&root], &secret);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_there_is_no_trace_metric() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("no-traces");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let metrics = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await;
    assert!(!String::from_utf8_lossy(&metrics.body).contains("recovea_trace_"));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
