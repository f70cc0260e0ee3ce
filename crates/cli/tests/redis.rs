//! The spec's failure case for caps, with real parts: `recovea serve` on a Redis the test owns.
//! Killing Redis turns an armed cap's requests into 503 once its counters are older than the max
//! age, leaves a soft cap's traffic flowing, and restarting Redis clears the 503 by itself.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use recovea_testkit::MockProvider;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, temp_dir};
#[path = "support/own_redis.rs"]
mod own_redis;
use own_redis::OwnRedis;

const TOKEN: &str = "redis-test-token-0123456789abcdef0123456";

fn start(data_dir: &Path, mock_url: &str, redis_port: u16) -> Serve {
    let redis_url = format!("redis://127.0.0.1:{redis_port}/");
    Serve::start(
        data_dir,
        mock_url,
        &["--admin-token", TOKEN, "--redis-url", &redis_url, "--counter-max-age", "2s"],
    )
}

impl Serve {
    /// An org with a key, an openai credential and one cap; returns the key's secret.
    async fn tenant(&self, hard_stop: bool) -> String {
        let tenant = self.organization(TOKEN, OPENAI).await;
        self.org_cap(TOKEN, &tenant.org_id, "month", "100", hard_stop).await;
        tenant.secret
    }

    async fn chat(&self, secret: &str) -> (StatusCode, Bytes, http::HeaderMap) {
        let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
        call(
            Method::POST,
            &format!("{}/v1/chat/completions", self.gateway),
            &format!("Bearer {secret}"),
            Some(body),
        )
        .await
    }

    /// Polls until the request answers `want`, or fails after `within`.
    async fn until(&self, secret: &str, want: StatusCode, within: Duration) -> (Bytes, http::HeaderMap) {
        harness::eventually(within, &format!("the answer {want}"), || async {
            let (status, body, headers) = self.chat(secret).await;
            (status == want).then_some((body, headers))
        })
        .await
    }
}

async fn call(
    method: Method,
    url: &str,
    authorization: &str,
    body: Option<Value>,
) -> (StatusCode, Bytes, http::HeaderMap) {
    let answer = harness::call(method, url, &[("authorization", authorization)], body).await;
    (answer.status, answer.body, answer.headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gone_means_503_for_armed_caps_only_and_it_clears_when_redis_is_back() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("kill");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let mut redis = OwnRedis::start(port, &dir);
    let serve = start(&dir, &mock.url(), redis.port);
    let armed = serve.tenant(true).await;
    let soft = serve.tenant(false).await;
    serve.until(&armed, StatusCode::OK, Duration::from_secs(5)).await;
    serve.until(&soft, StatusCode::OK, Duration::from_secs(5)).await;

    redis.kill();
    // Past the max age (2 s here) the armed cap will not enforce a figure it cannot trust.
    let (body, headers) = serve.until(&armed, StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(10)).await;
    let expected = recovea_core::Answer::budget_unverifiable("organization", "month", "Monthly");
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        std::str::from_utf8(&expected.body).expect("utf-8")
    );
    assert_eq!(headers.get("retry-after").expect("retry hint"), "1");
    assert_eq!(headers.get("x-recovea-budget-scope").expect("scope"), "organization");
    assert_eq!(headers.get("x-recovea-budget-window").expect("window"), "month");
    let (status, _, _) = serve.chat(&soft).await;
    assert_eq!(status, StatusCode::OK, "a soft cap keeps flowing while spend cannot be confirmed");

    let _redis = OwnRedis::start(port, &dir);
    serve.until(&armed, StatusCode::OK, Duration::from_secs(15)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Redis URL holds its ACL password: a node that cannot reach that Redis over TLS logs why, and
/// never the URL or the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_password_is_never_logged() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("redis-password");
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
    let url = format!("rediss://recovea:s3cret-redis-password@127.0.0.1:{port}/0");
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).expect("a log file");
    let serve = Serve::start_logging(
        &dir,
        &mock.url(),
        &["--admin-token", TOKEN, "--redis-url", &url, "--log", "debug"],
        &[],
        log,
    );
    let logged = harness::eventually(harness::DEADLINE, "the failure logged", || async {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        text.contains("counter store unavailable").then_some(text)
    })
    .await;
    assert!(!logged.contains("s3cret-redis-password"), "{logged}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
