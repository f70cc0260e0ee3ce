//! The split deployment as the black-box tests run it: `recovea control` on a PostgreSQL database
//! of the test's own, `recovea node` processes sharing Redis, all on loopback. Included with
//! `#[path]` beside `harness.rs`.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{self, Answer, Database, HttpClient, Process, call, call_on};

pub const ADMIN_TOKEN: &str = "split-admin-token-0123456789abcdef012345";
pub const NODE_TOKEN: &str = "split-node-token-0123456789abcdef0123456";
pub const MASTER_KEY: &str = "6b1f3c5e7a9d0b2e4f6a8c0e2b4d6f8a1c3e5a7b9d1f3a5c7e9b1d3f5a7c9e1b";
pub const REDIS: &str = "127.0.0.1:6379";
/// The model every chat request names: the tests price it themselves.
pub const MODEL: &str = "split-model";

/// Fails loudly, before anything starts, when Redis does not answer.
pub fn require_redis() {
    use std::io::{Read, Write};
    let answer = std::net::TcpStream::connect(REDIS).and_then(|mut redis| {
        redis.set_read_timeout(Some(Duration::from_secs(2)))?;
        redis.write_all(b"PING\r\n")?;
        let mut pong = [0; 7];
        redis.read_exact(&mut pong)?;
        Ok(pong)
    });
    assert!(
        matches!(answer, Ok(ref pong) if pong == b"+PONG\r\n"),
        "these tests need Redis at {REDIS}: {answer:?}"
    );
}

/// A port nothing listens on right now, so that a control plane can come back on the same address.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Asks `check` (through [`harness::eventually`]) until it holds; panics with `what` after `within`.
/// Returns the time it took.
pub async fn within<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    harness::eventually(within, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
    started.elapsed()
}

pub struct Control {
    pub process: Process,
    pub admin: String,
}

impl Control {
    pub fn start(database: &Database, port: u16, data_dir: &Path) -> Self {
        Self::start_at(&database.url(), port, data_dir, &[])
    }

    /// A control plane on the database at `url`, with `extra` flags.
    pub fn start_at(url: &str, port: u16, data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_logging(url, port, data_dir, extra, std::process::Stdio::null())
    }

    /// As [`Self::start_at`], its log (stderr) going to `log`.
    pub fn start_logging(
        url: &str,
        port: u16,
        data_dir: &Path,
        extra: &[&str],
        log: impl Into<std::process::Stdio>,
    ) -> Self {
        Self::start_with(url, port, data_dir, extra, log, Some(NODE_TOKEN))
    }

    /// As [`Self::start_logging`], with `node_token` as the shared node token (`None`: none, only
    /// node credentials let nodes in).
    pub fn start_with(
        url: &str,
        port: u16,
        data_dir: &Path,
        extra: &[&str],
        log: impl Into<std::process::Stdio>,
        node_token: Option<&str>,
    ) -> Self {
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["control", "--admin-listen", &listen, "--database-url"];
        args.extend([url, "--data-dir", data_dir.to_str().expect("utf-8")]);
        args.extend(extra);
        args.extend(["--admin-token", ADMIN_TOKEN, "--master-key", MASTER_KEY]);
        if let Some(token) = node_token {
            args.extend(["--node-token", token]);
        }
        let process = Process::start_logging(&args, &[], "recovea admin:", log);
        let admin = process.url_after("recovea admin:");
        Self { process, admin }
    }

    pub async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let answer =
            call(method, &format!("{}/admin/v1{path}", self.admin), &[("authorization", &auth)], body).await;
        assert!(answer.status.is_success(), "{path}: {} {:?}", answer.status, answer.json());
        answer.json()
    }

    /// An org with a managed openai credential and a key: (org id, key id, secret).
    pub async fn tenant(&self) -> (String, String, String) {
        let org = self.admin(Method::POST, "/orgs", Some(json!({"name": "acme"}))).await;
        let org_id = org["id"].as_str().expect("id").to_owned();
        let provider = json!({"kind": "openai", "api_key": "sk-managed-0123456789"});
        self.admin(Method::PUT, &format!("/orgs/{org_id}/providers/openai"), Some(provider)).await;
        let key = self.admin(Method::POST, &format!("/orgs/{org_id}/keys"), Some(json!({"name": "k"}))).await;
        let (key_id, secret) = (key["id"].as_str().expect("id"), key["secret"].as_str().expect("secret"));
        (org_id, key_id.to_owned(), secret.to_owned())
    }

    pub async fn receipts(&self, org_id: &str) -> Vec<Value> {
        let page = self.admin(Method::GET, &format!("/orgs/{org_id}/receipts?limit=1000"), None).await;
        page["receipts"].as_array().expect("receipts").clone()
    }
}

pub struct Node {
    pub process: Process,
    pub url: String,
}

impl Node {
    pub fn start(data_dir: &Path, control_url: &str, mock_url: &str, extra: &[&str]) -> Self {
        Self::start_with_env(data_dir, control_url, mock_url, extra, &[])
    }

    pub fn start_with_env(
        data_dir: &Path,
        control_url: &str,
        mock_url: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        Self::start_with_redis(data_dir, control_url, mock_url, REDIS, extra, envs)
    }

    /// A node whose shared counters are the Redis at `redis` (`HOST:PORT`, a fault proxy's, or a
    /// whole URL: a cluster's).
    pub fn start_with_redis(
        data_dir: &Path,
        control_url: &str,
        mock_url: &str,
        redis: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        Self::start_logging(data_dir, control_url, mock_url, redis, extra, envs, std::process::Stdio::null())
    }

    /// As [`Self::start_with_redis`], its log (stderr) going to `log`.
    pub fn start_logging(
        data_dir: &Path,
        control_url: &str,
        mock_url: &str,
        redis: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
        log: impl Into<std::process::Stdio>,
    ) -> Self {
        Self::launch(data_dir, control_url, mock_url, (redis, NODE_TOKEN), extra, envs, log)
    }

    /// A node presenting `token` (a node credential's) rather than the shared node token.
    pub fn start_presenting(data_dir: &Path, control_url: &str, mock_url: &str, token: &str) -> Self {
        Self::launch(data_dir, control_url, mock_url, (REDIS, token), &[], &[], std::process::Stdio::null())
    }

    /// A node on the Redis at `redis`, presenting `token`.
    fn launch(
        data_dir: &Path,
        control_url: &str,
        mock_url: &str,
        (redis, token): (&str, &str),
        extra: &[&str],
        envs: &[(&str, &str)],
        log: impl Into<std::process::Stdio>,
    ) -> Self {
        let redis_url = if redis.contains("://") { redis.to_owned() } else { format!("redis://{redis}/") };
        let mut args = vec!["node", "--listen", "127.0.0.1:0", "--control-url", control_url];
        args.extend(["--node-token", token, "--master-key", MASTER_KEY, "--redis-url", &redis_url]);
        args.extend(["--openai-base-url", mock_url, "--anthropic-base-url", mock_url]);
        args.extend(["--data-dir", data_dir.to_str().expect("utf-8")]);
        args.extend(extra);
        let process = Process::start_logging(&args, envs, "recovea node", log);
        let url = process.url_after("recovea node");
        Self { process, url }
    }

    /// A chat request for one output token of [`MODEL`], on a fresh connection.
    pub async fn chat(&self, secret: &str) -> Answer {
        self.chat_on(&crate::harness::http_client(), secret).await
    }

    /// A chat request for one output token of [`MODEL`], through `client` (on a connection it keeps).
    pub async fn chat_on(&self, client: &HttpClient, secret: &str) -> Answer {
        chat_at(client, &self.url, secret).await
    }

    /// Waits until the node serves a state from the feed.
    pub async fn ready(&self) {
        within(Duration::from_secs(10), "the node is fed", || async {
            call(Method::GET, &format!("{}/readyz", self.url), &[], None).await.status == StatusCode::OK
        })
        .await;
    }

    pub async fn metric(&self, line_prefix: &str) -> Option<f64> {
        let text = call(Method::GET, &format!("{}/metrics", self.url), &[], None).await;
        String::from_utf8_lossy(&text.body)
            .lines()
            .find_map(|l| l.strip_prefix(line_prefix))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// A chat request for one output token of [`MODEL`] to the node at `node_url`, through `client`.
pub async fn chat_at(client: &HttpClient, node_url: &str, secret: &str) -> Answer {
    let auth = format!("Bearer {secret}");
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let url = format!("{node_url}/v1/chat/completions");
    call_on(client, Method::POST, &url, &[("authorization", &auth)], Some(body)).await
}

/// A decimal string of dollars (`"31.000000000"`, `"0.5"`) in nano-dollars, exactly.
pub fn nanos(usd: &str) -> i128 {
    let (whole, fraction) = usd.split_once('.').unwrap_or((usd, ""));
    assert!(fraction.len() <= 9, "more than nine decimals: {usd}");
    let whole: i128 = whole.parse().expect("dollars");
    let fraction: i128 = format!("{fraction:0<9}").parse().expect("nano-dollars");
    whole * 1_000_000_000 + fraction
}

/// A tenant (see [`Control::tenant`]) with an armed monthly cap of `limit_usd` that every one of
/// `nodes` has installed: (org id, cap id, secret).
pub async fn tenant_with_cap(control: &Control, limit_usd: &str, nodes: usize) -> (String, String, String) {
    let (org_id, _key_id, secret) = control.tenant().await;
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": limit_usd,
                     "hard_stop": true, "alert_at": []});
    let cap = control.admin(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
    let cap_id = cap["id"].as_str().expect("id").to_owned();
    within(Duration::from_secs(5), "every node installs the cap", || async {
        let listed = control.admin(Method::GET, "/nodes", None).await;
        let listed_nodes = listed["nodes"].as_array().expect("nodes");
        listed_nodes.len() == nodes
            && listed_nodes.iter().all(|n| n["feed_version"] == listed["feed_version"])
    })
    .await;
    (org_id, cap_id, secret)
}

/// The org's one cap's spend in the ledger, in nano-dollars, once `admitted` receipts are in it:
/// exactly one receipt per admitted request.
pub async fn spend_once_delivered(control: &Control, org_id: &str, admitted: usize) -> i128 {
    let receipts = || async {
        let summary = control.admin(Method::GET, &format!("/orgs/{org_id}/receipts/summary"), None).await;
        let rows = summary["rows"].as_array().expect("rows").clone();
        rows.iter().map(|r| r["requests"].as_u64().expect("requests")).sum::<u64>()
    };
    within(Duration::from_secs(20), "every admitted request's receipt reaches the ledger", || async {
        receipts().await >= admitted as u64
    })
    .await;
    assert_eq!(receipts().await, admitted as u64, "one receipt per admitted request");
    let spend = control.admin(Method::GET, &format!("/orgs/{org_id}/spend"), None).await;
    nanos(spend["spend"][0]["spend_usd"].as_str().expect("spend_usd"))
}

/// The mock and a control plane on `database` (its data in `dir/control`) for races at a cap:
/// every chat request of [`MODEL`] for one output token costs exactly one dollar, its reservation.
pub async fn dollar_a_request(
    database: &crate::harness::Database,
    dir: &Path,
) -> (recovea_testkit::MockProvider, Control) {
    let mock = recovea_testkit::MockProvider::start().await;
    let usage = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
    mock.script(recovea_testkit::Behaviour::default().usage(usage).times(1_000_000));
    let control = Control::start(database, free_port(), &dir.join("control"));
    let price = json!({"input_per_mtok_usd": "0", "output_per_mtok_usd": "1000000"});
    control.admin(Method::PUT, &format!("/prices/{MODEL}"), Some(price)).await;
    (mock, control)
}
