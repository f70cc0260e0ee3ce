//! Black-box test of a node that guards its descriptors: `recovea serve` under `ulimit -n 256`
//! serves normal clients throughout a storm of idle connections.

use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::json;

#[path = "support/harness.rs"]
mod harness;

use harness::{Process, call, temp_dir};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456";
/// What the node's default bound makes of 256 descriptors: (256 - 64) / 2.
const BOUND: u64 = 96;

async fn metric(gateway: &str, name: &str) -> u64 {
    let text = call(Method::GET, &format!("{gateway}/metrics"), &[], None).await.body;
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// As [`metric`], `None` when the node closed the connection (it held its bound).
async fn try_metric(gateway: &str, name: &str) -> Option<u64> {
    use http_body_util::BodyExt;
    let request = http::Request::get(format!("{gateway}/metrics"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let response = harness::http_client().request(request).await.ok()?;
    let text = response.into_body().collect().await.ok()?.to_bytes();
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_its_descriptor_limit_serves_normal_clients_through_a_storm_of_idle_connections() {
    const REQUESTS: usize = 60;
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().times(REQUESTS as u32 + 10));
    let dir = temp_dir("connections-storm");
    let data_dir = dir.to_str().expect("utf-8");
    let url = mock.url();
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--openai-base-url",
        &url,
        "--data-dir",
        data_dir,
        "--admin-token",
        TOKEN,
    ];
    let serve = Process::start_with_descriptors(&args, 256, "recovea admin:");
    let (gateway, admin) = (serve.url_after("recovea gateway:"), serve.url_after("recovea admin:"));
    let auth = format!("Bearer {TOKEN}");
    let admin_call = |method: Method, path: String, body: serde_json::Value| {
        let (auth, admin) = (auth.clone(), admin.clone());
        async move {
            call(method, &format!("{admin}/admin/v1{path}"), &[("authorization", &auth)], Some(body))
                .await
                .json()
        }
    };
    let org = admin_call(Method::POST, "/orgs".into(), json!({"name": "storm"})).await;
    let org_id = org["id"].as_str().expect("id").to_owned();
    let provider = json!({"kind": "openai", "api_key": "sk-managed-0123456789"});
    admin_call(Method::PUT, format!("/orgs/{org_id}/providers/openai"), provider).await;
    let key = admin_call(Method::POST, format!("/orgs/{org_id}/keys"), json!({"name": "k"})).await;
    let bearer = format!("Bearer {}", key["secret"].as_str().expect("secret"));

    // The storm: a burst of idle connections ten times the node's bound (most closed at once),
    // then two tasks opening more, each one every 10 ms, all held without sending a byte.
    let address = gateway.trim_start_matches("http://").to_owned();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut burst = Vec::new();
    for _ in 0..10 * BOUND {
        if let Ok(connection) = tokio::net::TcpStream::connect(&address).await {
            burst.push(connection);
        }
    }
    let mut storm = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (address, opened, stopped) = (address.clone(), opened.clone(), stopped.clone());
        storm.spawn(async move {
            let mut held = Vec::new();
            while !*stopped.borrow() {
                if let Ok(connection) = tokio::net::TcpStream::connect(&address).await {
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    held.push(connection);
                }
                // The behaviour under test: a storm that keeps coming, one connection a task
                // every 10 ms.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    // The burst filled the room with connections too new to shed; once they have waited a while,
    // the storm's next ones (refused at the bound) wake them and they go. Normal clients come once
    // most have gone: the first shed says the others are going, not that they have closed, and on
    // a busy machine their threads take a while to close them.
    harness::eventually(harness::DEADLINE, "the burst's idle connections shed", || async {
        let shed = try_metric(&gateway, "recovea_client_connections_shed_total").await.unwrap_or(0);
        let open = try_metric(&gateway, "recovea_client_connections").await.unwrap_or(BOUND);
        (shed > 0 && open <= BOUND / 2).then_some(())
    })
    .await;

    // Normal clients, one request per connection, until the storm has opened ten times the bound
    // more.
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("{gateway}/v1/chat/completions");
    let (mut most_open, mut served) = (0, 0);
    let storm_size = || opened.load(std::sync::atomic::Ordering::Relaxed);
    while served < REQUESTS || storm_size() < 10 * BOUND {
        assert!(served < 100 * REQUESTS, "the storm opened only {} connections", storm_size());
        let answer = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat.clone())).await;
        assert_eq!(answer.status, StatusCode::OK, "a normal client is served during the storm");
        served += 1;
        most_open = most_open.max(metric(&gateway, "recovea_client_connections").await);
    }
    stop.send_replace(true);
    while storm.join_next().await.is_some() {}
    assert!(most_open <= BOUND, "{most_open} client connections open, past the bound of {BOUND}");
    assert!(
        metric(&gateway, "recovea_client_connections_shed_total").await > 0,
        "idle ones were closed first"
    );
    assert!(
        metric(&gateway, "recovea_client_connections_refused_total").await > 0,
        "the burst met the bound"
    );
    drop(burst);
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
