//! Black-box: one tenant sending many large bodies slowly cannot take a shared node's memory.
//! `recovea serve` with its default limits (32 MiB bodies, 256 MiB for all bodies being read) holds
//! 200 bodies of 32 MiB, each sent but for its last byte, under its budget, while another
//! organization's requests, small and large, are answered as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::json;
use tokio::io::AsyncWriteExt;

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, call, call_bytes, temp_dir};

const TOKEN: &str = "test-admin-token-of-32-characters";
const SLOW_BODIES: usize = 200;
const BODY: u64 = 32 << 20;
/// `--body-memory`'s default.
const BUDGET: u64 = 256 << 20;

/// The process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
fn resident(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the node's status");
    let field = |name: &str| {
        let line = status.lines().find(|line| line.starts_with(name)).expect("a field of status");
        let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("kB");
        kib * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A chat body of exactly `bytes` bytes.
fn chat_of(bytes: usize) -> Vec<u8> {
    let head = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    format!("{head}{}{tail}", "x".repeat(bytes - head.len() - tail.len())).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_slow_large_bodies_leave_a_node_under_its_body_budget_and_others_served() {
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().times(1000));
    let dir = temp_dir("memory-slow-bodies");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN, "--max-connections", "1000"]);
    let pid = serve.process.pid();
    let greedy = serve.organization(TOKEN, OPENAI).await.bearer();
    let other = serve.organization(TOKEN, OPENAI).await.bearer();
    let url = format!("{}/v1/chat/completions", serve.gateway);
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let served = |bearer: String| {
        let (url, chat) = (url.clone(), chat.clone());
        async move {
            let small_started = Instant::now();
            let small = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat)).await;
            let small_took = small_started.elapsed();
            let large_started = Instant::now();
            let large = call_bytes(Method::POST, &url, &[("authorization", &bearer)], chat_of(1 << 20)).await;
            assert_eq!((small.status, large.status), (StatusCode::OK, StatusCode::OK));
            (small_took, large_started.elapsed())
        }
    };
    // Settled before the storm: the first requests warm the node's connections to the provider.
    for _ in 0..3 {
        served(other.clone()).await;
    }
    let before = served(other.clone()).await;
    let (resident_before, _) = resident(pid);

    // The storm: each body all but its last byte, as fast as the node takes it, then held.
    let address = serve.gateway.trim_start_matches("http://").to_owned();
    let sent = Arc::new(AtomicU64::new(0));
    let mut storm = tokio::task::JoinSet::new();
    for _ in 0..SLOW_BODIES {
        let (address, greedy, sent) = (address.clone(), greedy.clone(), Arc::clone(&sent));
        storm.spawn(async move {
            let mut connection = tokio::net::TcpStream::connect(&address).await.expect("connect");
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\nauthorization: {greedy}\r\n\
                 content-type: application/json\r\ncontent-length: {BODY}\r\n\r\n"
            );
            connection.write_all(head.as_bytes()).await.expect("head");
            let chunk = vec![b' '; 256 << 10];
            let mut left = BODY - 1;
            while left > 0 {
                let piece = &chunk[..chunk.len().min(left as usize)];
                if connection.write_all(piece).await.is_err() {
                    return;
                }
                left -= piece.len() as u64;
                sent.fetch_add(piece.len() as u64, Ordering::Relaxed);
            }
            std::future::pending::<()>().await;
        });
    }
    // The node reads as many as its budget has room for, then reads no more of the rest.
    let started = Instant::now();
    let mut peak = 0;
    let mut last = (0, Instant::now());
    while started.elapsed() < Duration::from_secs(20) {
        peak = peak.max(resident(pid).0);
        let now = sent.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) && now >= 3 * BODY {
            break;
        }
        // The resident memory sampled through the storm: the measure under test, not a wait.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let storm_sent = sent.load(Ordering::Relaxed);
    // Meanwhile another organization is served as before: each of its answers in seconds, not
    // after the storm's bodies time out (--request-body-timeout, 60 s).
    let mut during = Vec::new();
    for _ in 0..10 {
        let took = served(other.clone()).await;
        peak = peak.max(resident(pid).0);
        assert!(took.0 < Duration::from_secs(5) && took.1 < Duration::from_secs(5), "{took:?}");
        during.push(took);
    }
    let (resident_after, high_water) = resident(pid);
    let peak = peak.max(high_water);
    eprintln!(
        "slow bodies: {SLOW_BODIES} of {} MiB, {} MiB of them sent; resident {} MiB before, {} MiB after, \
         {} MiB at most (budget {} MiB); another organization's small and 1 MiB requests: {:?} before, \
         {:?} at most during",
        BODY >> 20,
        storm_sent >> 20,
        resident_before >> 20,
        resident_after >> 20,
        peak >> 20,
        BUDGET >> 20,
        before,
        during
            .iter()
            .fold((Duration::ZERO, Duration::ZERO), |most, took| (most.0.max(took.0), most.1.max(took.1))),
    );
    assert!(peak < BUDGET, "the node's resident memory reached {} MiB", peak >> 20);
    storm.abort_all();
}
