//! Black-box tests of the way to providers as production has it: TLS and HTTP/2 to a provider
//! that allows 100 concurrent streams a connection, a private certificate authority, and an egress
//! proxy. The provider is the mock over TLS (`recovea_testkit::tls`); the proxy is testkit's.

use std::fs::File;
use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use recovea_testkit::proxy::{Asked, ConnectProxy};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, call, http_client, temp_dir};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456";

/// An organization with an openai credential and a key on `serve`: its id and the key's secret.
async fn tenant(serve: &Serve) -> (String, String) {
    let tenant = serve.organization(TOKEN, OPENAI).await;
    (tenant.org_id, tenant.secret)
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": "Hi"}]})
}

fn ca_file() -> String {
    recovea_testkit::tls::ca_file().to_str().expect("a UTF-8 path").to_owned()
}

/// The value of the metric line starting with `prefix` on `serve`'s `/metrics`.
async fn metric(serve: &Serve, prefix: &str) -> u64 {
    let text = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await.body;
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_slow_streams_over_http2_to_a_provider_allowing_a_hundred_all_start_before_any_ends() {
    const STREAMS: usize = 500;
    let mock = MockProvider::start_tls(100).await;
    let dir = temp_dir("egress-streams");
    let ca = ca_file();
    let flags = ["--admin-token", TOKEN, "--upstream-ca-file", &ca, "--upstream-ca-only"];
    let serve = Serve::start(&dir, &mock.url(), &flags);
    let (org_id, secret) = tenant(&serve).await;
    // About 10 s a stream: its first event at once, then one a second.
    mock.script(Behaviour {
        chunk_delay_ms: Some(1000),
        times: Some(STREAMS as u32),
        ..Behaviour::default()
    });

    let client = http_client();
    let url = format!("{}/v1/chat/completions", serve.gateway);
    let started = Instant::now();
    let mut streams = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let request = Request::post(&url)
            .header("authorization", format!("Bearer {secret}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat(true).to_string())))
            .expect("request");
        let client = client.clone();
        streams.spawn(async move {
            let response = client.request(request).await.expect("an answer");
            assert_eq!(response.status(), StatusCode::OK);
            let mut body = response.into_body();
            let mut first_byte = None;
            let mut text = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.expect("the stream holds").into_data() {
                    first_byte.get_or_insert_with(|| started.elapsed());
                    text.extend_from_slice(&data);
                }
            }
            assert!(text.ends_with(b"data: [DONE]\n\n"), "{}", String::from_utf8_lossy(&text));
            (first_byte.expect("bytes"), started.elapsed())
        });
    }
    let mut timings = Vec::new();
    while let Some(timing) = streams.join_next().await {
        timings.push(timing.expect("a stream"));
    }
    let last_start = timings.iter().map(|(first, _)| *first).max().expect("streams");
    let first_end = timings.iter().map(|(_, end)| *end).min().expect("streams");
    assert!(
        last_start < first_end,
        "a stream waited for another to end: the last first byte came at {last_start:?}, the first end at {first_end:?}"
    );
    // Over HTTP/2 only, on as many connections as the provider's limit needs: five, or one more
    // where the two connection workers each opened a part-filled one.
    let opened = metric(&serve, "recovea_upstream_connections_opened_total{protocol=\"http2\"}").await;
    assert!((5..=7).contains(&opened), "{opened} HTTP/2 connections for {STREAMS} streams");
    assert_eq!(metric(&serve, "recovea_upstream_connections_opened_total{protocol=\"http1\"}").await, 0);
    // Every stream has its receipt.
    harness::eventually(harness::DEADLINE, "a receipt per stream", || async {
        let (_, receipts) =
            serve.admin_call(TOKEN, Method::GET, &format!("/orgs/{org_id}/receipts?limit=1000"), None).await;
        (receipts["receipts"].as_array().map_or(0, Vec::len) == STREAMS).then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat through `serve` with `secret`: its status and error code, if any.
async fn chat_status(serve: &Serve, secret: &str) -> (StatusCode, Value) {
    let answer = call(
        Method::POST,
        &format!("{}/v1/chat/completions", serve.gateway),
        &[("authorization", &format!("Bearer {secret}"))],
        Some(chat(false)),
    )
    .await;
    (answer.status, answer.json()["error"]["code"].clone())
}

/// `serve` sending providers to the TLS mock at `mock_url`, with `flags` and `envs`, logging at
/// debug into `dir/serve.log`.
fn serve_logged(dir: &Path, mock_url: &str, flags: &[&str], envs: &[(&str, &str)]) -> Serve {
    let mut args = vec!["--admin-token", TOKEN, "--log", "debug"];
    args.extend(flags);
    let log = File::create(dir.join("serve.log")).expect("log file");
    Serve::start_logging(dir, mock_url, &args, envs, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_behind_a_private_ca_is_reached_through_an_egress_proxy_whose_password_is_never_shown() {
    let mock = MockProvider::start_tls(100).await;
    // "corp:s3cret-pw"
    let proxy = ConnectProxy::start(Some("Basic Y29ycDpzM2NyZXQtcHc=")).await;
    let proxy_url = format!("http://corp:s3cret-pw@{}", proxy.addr());
    let ca = ca_file();
    let authority = mock.url().trim_start_matches("https://").to_owned();

    // Without the CA, the provider's certificate is not trusted: 502.
    let dir = temp_dir("egress-untrusted");
    let serve = serve_logged(&dir, &mock.url(), &[], &[]);
    let (_, secret) = tenant(&serve).await;
    assert_eq!(chat_status(&serve, &secret).await, (StatusCode::BAD_GATEWAY, json!("upstream_unreachable")));
    drop(serve);

    // With it, and HTTPS_PROXY: through a CONNECT tunnel, showing the proxy its credentials.
    let dir = temp_dir("egress-proxied");
    let mut serve =
        serve_logged(&dir, &mock.url(), &["--upstream-ca-file", &ca], &[("HTTPS_PROXY", &proxy_url)]);
    let (_, secret) = tenant(&serve).await;
    assert_eq!(chat_status(&serve, &secret).await, (StatusCode::OK, Value::Null));
    let tunnel = Asked {
        request_line: format!("CONNECT {authority} HTTP/1.1"),
        authorization: Some("Basic Y29ycDpzM2NyZXQtcHc=".into()),
    };
    assert_eq!(proxy.asked(), vec![tunnel.clone()]);
    assert_eq!(mock.requests().len(), 1);
    // Stopped, not killed: the log's queue is written out before the file is read.
    assert!(serve.process.terminate(std::time::Duration::from_secs(10)).is_some(), "serve stops on SIGTERM");
    drop(serve);
    let log = std::fs::read_to_string(dir.join("serve.log")).expect("log");
    assert!(log.contains("DEBUG"), "the log is at debug: {log}");
    assert!(!log.contains("s3cret-pw") && !log.contains("Y29ycDpzM2NyZXQtcHc"), "{log}");
    assert!(!log.contains('\u{1b}'), "no colour codes in a log written to a file: {log}");

    // The flag with wrong credentials: the proxy refuses, the gateway answers 502.
    let dir = temp_dir("egress-refused");
    let wrong = format!("http://corp:wrong@{}", proxy.addr());
    let serve =
        serve_logged(&dir, &mock.url(), &["--upstream-ca-file", &ca, "--upstream-proxy", &wrong], &[]);
    let (_, secret) = tenant(&serve).await;
    assert_eq!(chat_status(&serve, &secret).await, (StatusCode::BAD_GATEWAY, json!("upstream_unreachable")));
    assert_eq!(proxy.asked().len(), 2);
    drop(serve);

    // A provider NO_PROXY names is reached directly.
    let dir = temp_dir("egress-bypassed");
    let envs = [("HTTPS_PROXY", proxy_url.as_str()), ("NO_PROXY", "localhost,127.0.0.1")];
    let serve = serve_logged(&dir, &mock.url(), &["--upstream-ca-file", &ca], &envs);
    let (_, secret) = tenant(&serve).await;
    assert_eq!(chat_status(&serve, &secret).await, (StatusCode::OK, Value::Null));
    assert_eq!(proxy.asked().len(), 2, "the proxy was passed by");
    assert_eq!(mock.requests().len(), 2);
    for dir in ["egress-untrusted", "egress-proxied", "egress-refused", "egress-bypassed"] {
        let _ = std::fs::remove_dir_all(temp_dir(dir));
    }
}

#[test]
fn a_bad_proxy_or_ca_setting_stops_start_up_naming_it_and_never_its_password() {
    let dir = temp_dir("egress-bad-settings");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").expect("write");
    let empty = empty.to_str().expect("a UTF-8 path");
    /// Flags, environment, and the error start-up gives.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&["--upstream-ca-file", empty], &[], "--upstream-ca-file: the file holds no PEM certificate"),
        (&["--upstream-ca-only"], &[], "--upstream-ca-only: needs --upstream-ca-file"),
        (
            &[],
            &[("HTTPS_PROXY", "socks5://u:hunter2@proxy:1080")],
            "HTTPS_PROXY: a socks5:// proxy is not supported",
        ),
        (&["--upstream-proxy", "http://u:hunter2@[bad"], &[], "--upstream-proxy: not a proxy URL"),
    ];
    for (flags, envs, expected) in cases {
        let output = std::process::Command::new(harness::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir)
            .args(flags)
            .envs(envs.iter().copied())
            .output()
            .expect("recovea runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} {envs:?} started");
        assert!(stderr.contains(expected), "{flags:?} {envs:?}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A credential whose base URL names the gateway itself (or its admin API) is refused at connect
/// time, never a loop; with `--upstream-private-networks deny`, so is one on a private network,
/// which is reached by default (self-hosted models live there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_provider_connection_goes_to_the_gateway_itself_nor_to_private_networks_when_denied() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().times(10));
    let dir = temp_dir("egress-destinations");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let (org_id, secret) = tenant(&serve).await;
    let point_at = |base_url: String| {
        let (serve, org_id) = (&serve, org_id.clone());
        async move {
            let provider =
                json!({"kind": "openai", "api_key": "sk-managed-0123456789", "base_url": base_url});
            let path = format!("/orgs/{org_id}/providers/openai");
            let (status, body) = serve.admin_call(TOKEN, Method::PUT, &path, Some(provider)).await;
            assert!(status.is_success(), "{status} {body}");
        }
    };
    for itself in [serve.gateway.clone(), serve.admin.clone()] {
        point_at(itself.clone()).await;
        let (status, code) = chat_status(&serve, &secret).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::BAD_GATEWAY, Some("upstream_unreachable")),
            "{itself}"
        );
    }
    assert!(mock.requests().is_empty());
    point_at(mock.url()).await;
    assert_eq!(chat_status(&serve, &secret).await.0, StatusCode::OK, "loopback is allowed by default");
    drop(serve);

    let denying =
        Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN, "--upstream-private-networks", "deny"]);
    let (_, secret) = tenant(&denying).await;
    let (status, code) = chat_status(&denying, &secret).await;
    assert_eq!((status, code.as_str()), (StatusCode::BAD_GATEWAY, Some("upstream_unreachable")));
    assert_eq!(mock.requests().len(), 1, "only the request sent while private networks were allowed");
    drop(denying);
    let _ = std::fs::remove_dir_all(&dir);
}
