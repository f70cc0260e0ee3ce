//! The split deployment with real parts: `recovea control` on a PostgreSQL database of the test's
//! own, two `recovea node` processes sharing Redis, and the mock provider, all on loopback.

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

#[path = "support/deployment.rs"]
mod deployment;
#[path = "support/harness.rs"]
mod harness;

use deployment::{ADMIN_TOKEN, Control, MASTER_KEY, MODEL, NODE_TOKEN, Node, free_port, within};
use harness::{Answer, Database, call, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_fed_by_two_control_replicas_share_caps_and_revocations() {
    let dir = temp_dir("split-two-nodes");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let first = Control::start(&database, free_port(), &dir.join("control-1"));
    let second = Control::start(&database, free_port(), &dir.join("control-2"));
    // Node A follows the first replica, node B the second: every change below is made through the
    // first, so B sees it only through the shared database.
    let a = Node::start(&dir.join("node-a"), &first.admin, &mock.url(), &[]);
    let b = Node::start(&dir.join("node-b"), &second.admin, &mock.url(), &[]);
    for node in [&a, &b] {
        node.ready().await;
    }

    let (org_id, key_id, secret) = first.tenant().await;
    let price = json!({"input_per_mtok_usd": "0", "output_per_mtok_usd": "1000000"});
    first.admin(Method::PUT, &format!("/prices/{MODEL}"), Some(price)).await;
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "6.00", "hard_stop": true});
    first.admin(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
    // Each answer reports the one output token its `max_tokens` allows: one dollar a request, and
    // its reservation is that dollar too. (A reservation larger than the headroom left would make
    // the other node refuse, rightly, while the request is in flight.)
    let usage = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
    mock.script(Behaviour::default().usage(usage).times(100));
    for node in [&a, &b] {
        within(Duration::from_secs(2), "a new key is served by every node", || async {
            node.chat(&secret).await.status == StatusCode::OK
        })
        .await;
    }
    let managed = mock.requests();
    assert!(managed.iter().all(|r| r.header("authorization") == Some("Bearer sk-managed-0123456789")));

    // Two dollars are spent; node A spends the rest up to the line and is refused at it.
    let mut admitted_by_a = 0;
    loop {
        let answer = a.chat(&secret).await;
        if answer.status == StatusCode::PAYMENT_REQUIRED {
            break;
        }
        assert_eq!(answer.status, StatusCode::OK);
        admitted_by_a += 1;
        assert!(admitted_by_a <= 6, "node A kept admitting past the cap");
    }
    // Node B learns A's spend through Redis: it refuses within a sync, having admitted at most one
    // request past the line meanwhile (the overshoot bound: one request per node).
    let mut admitted_by_b = 0;
    let mut refusal = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let answer = b.chat(&secret).await;
        if answer.status == StatusCode::PAYMENT_REQUIRED {
            refusal = Some(answer);
            break;
        }
        admitted_by_b += 1;
        // Paced as a client is, not polled: every request admitted counts against the bound.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refusal = refusal.expect("node B refuses once A reached the cap");
    assert!(admitted_by_b <= 1, "node B admitted {admitted_by_b} past the line");
    assert_eq!(refusal.headers["x-recovea-budget-scope"], "organization");
    assert_eq!(refusal.headers["x-recovea-budget-window"], "month");
    assert_eq!(refusal.headers["x-should-retry"], "false");
    assert!(refusal.headers.get("retry-after").is_none());
    assert_eq!(
        String::from_utf8_lossy(&refusal.body),
        "{\n  \"error\": {\n    \"message\": \"Monthly spend cap reached.\",\n    \"type\": \"insufficient_quota\",\n    \"param\": null,\n    \"code\": \"budget_exceeded\"\n  }\n}"
    );

    // Every admitted request's receipt reaches the ledger through the control plane, once.
    let admitted = 2 + admitted_by_a + admitted_by_b;
    within(Duration::from_secs(10), "every receipt reaches the ledger", || async {
        first.receipts(&org_id).await.len() == admitted
    })
    .await;
    let receipts = first.receipts(&org_id).await;
    let nodes: std::collections::BTreeSet<&str> =
        receipts.iter().filter_map(|r| r["node_id"].as_str()).collect();
    assert_eq!(nodes.len(), 2, "both nodes delivered receipts: {nodes:?}");

    // Each replica lists both nodes, whichever replica each polls.
    for replica in [&first, &second] {
        let listed = replica.admin(Method::GET, "/nodes", None).await;
        let nodes = listed["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 2, "{listed}");
        for node in nodes {
            assert_eq!(node["feed_version"], listed["feed_version"], "{listed}");
            assert!(node["snapshot_age_seconds"].as_u64().is_some_and(|age| age <= 2), "{listed}");
            assert!(node["counters_confirmed_at"].is_string(), "{listed}");
            assert_eq!(node["fail_open_total"], 0);
        }
    }

    // A revocation made through the first replica reaches both nodes within a second.
    first.admin(Method::POST, &format!("/keys/{key_id}/revoke"), None).await;
    let took = within(Duration::from_secs(1), "the revocation reaches both nodes", || async {
        a.chat(&secret).await.status == StatusCode::UNAUTHORIZED
            && b.chat(&secret).await.status == StatusCode::UNAUTHORIZED
    })
    .await;
    eprintln!("revocation reached both nodes in {took:?}");
    drop((a, b, first, second));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_outage_changes_nothing_for_traffic_and_loses_no_receipt() {
    let dir = temp_dir("split-outage");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let port = free_port();
    let control = Control::start(&database, port, &dir.join("control"));
    let a = Node::start(&dir.join("node-a"), &control.admin, &mock.url(), &[]);
    let b = Node::start(&dir.join("node-b"), &control.admin, &mock.url(), &[]);
    let (org_id, _key_id, secret) = control.tenant().await;
    for node in [&a, &b] {
        node.ready().await;
        within(Duration::from_secs(2), "the key is served by every node", || async {
            node.chat(&secret).await.status == StatusCode::OK
        })
        .await;
    }
    let mut sent = 2;
    // Both nodes saved the state they serve before the outage.
    for node_dir in ["node-a", "node-b"] {
        let saved = dir.join(node_dir).join("snapshot.sealed");
        within(Duration::from_secs(2), "the node saves its state", || async { saved.exists() }).await;
        let bytes = std::fs::read(&saved).expect("saved state");
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
        assert!(!bytes.windows(10).any(|w| w == b"sk-managed"), "the saved state is sealed");
    }

    let admin_url = control.admin.clone();
    control.process.kill();
    for _ in 0..5 {
        for node in [&a, &b] {
            let answer = node.chat(&secret).await;
            assert_eq!(answer.status, StatusCode::OK, "traffic flows without the control plane");
            sent += 1;
        }
    }
    for node in [&a, &b] {
        assert_eq!(
            call(Method::GET, &format!("{}/readyz", node.url), &[], None).await.status,
            StatusCode::OK
        );
    }
    within(Duration::from_secs(5), "the snapshot's age grows while the feed is away", || async {
        a.metric("recovea_snapshot_age_seconds ").await.is_some_and(|age| age >= 1.5)
    })
    .await;

    // A node restarted during the outage serves from its saved state.
    b.process.kill();
    let b = Node::start(&dir.join("node-b"), &admin_url, &mock.url(), &[]);
    let answer = b.chat(&secret).await;
    assert_eq!(answer.status, StatusCode::OK, "a restarted node serves its saved state");
    sent += 1;
    let last = mock.requests().pop().expect("the mock saw it");
    assert_eq!(last.header("authorization"), Some("Bearer sk-managed-0123456789"), "with the managed key");
    assert!(b.metric("recovea_snapshot_age_seconds ").await.is_some_and(|age| age >= 1.0));

    // The control plane returns on the same address: every receipt made meanwhile arrives, once.
    let control = Control::start(&database, port, &dir.join("control"));
    within(Duration::from_secs(15), "the spools deliver everything", || async {
        control.receipts(&org_id).await.len() >= sent
    })
    .await;
    let receipts = control.receipts(&org_id).await;
    assert_eq!(receipts.len(), sent, "no receipt duplicated or lost");
    let ids: std::collections::BTreeSet<&str> =
        receipts.iter().filter_map(|r| r["request_id"].as_str()).collect();
    assert_eq!(ids.len(), sent);
    within(Duration::from_secs(3), "the nodes are fed again", || async {
        a.metric("recovea_snapshot_age_seconds ").await.is_some_and(|age| age < 1.5)
    })
    .await;
    drop((a, b, control));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Prometheus value of `name{labels}` on a node, 0 when absent.
async fn fail_open_count(node: &Node, reason: &str) -> f64 {
    node.metric(&format!("recovea_fail_open_total{{reason=\"{reason}\"}} ")).await.unwrap_or(0.0)
}

/// The two ways a fail-open pass may be met: a Recovea key alone reaches the provider with no
/// credential at all (its answer comes back unchanged), and a client that brought its own provider
/// key with `x-recovea-key` reaches it with exactly that key.
async fn assert_passes_through_stripped(node: &Node, mock: &MockProvider, secret: &str, reason: &str) {
    let before = fail_open_count(node, reason).await;
    mock.reset();
    mock.script(
        Behaviour::error(401).body(json!({"error": {"message": "no key", "code": "provider_said_no"}})),
    );
    let answer = node.chat(secret).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{reason}: the provider's answer, unchanged");
    assert_eq!(answer.json()["error"]["code"], "provider_said_no", "{reason}");
    let own = call(
        Method::POST,
        &format!("{}/v1/chat/completions", node.url),
        &[("x-recovea-key", secret), ("authorization", "Bearer sk-own-key")],
        Some(json!({"model": MODEL, "messages": []})),
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{reason}: a client with its own key succeeds");
    let seen = mock.requests();
    assert_eq!(seen.len(), 2, "{reason}");
    assert_eq!(seen[0].header("authorization"), None, "{reason}: no Recovea key, no managed key");
    assert_eq!(seen[1].header("authorization"), Some("Bearer sk-own-key"), "{reason}");
    assert!(seen.iter().all(|r| r.header("x-recovea-key").is_none()), "{reason}");
    assert_eq!(fail_open_count(node, reason).await, before + 2.0, "{reason}: each pass is counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_passes_strip_the_key_and_write_no_receipt() {
    let dir = temp_dir("split-fail-open");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let (org_id, _key_id, secret) = control.tenant().await;
    let cap = json!({"scope": "organization", "window": "day", "limit_usd": "0.000001", "hard_stop": true});
    control.admin(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;

    // No snapshot at all: no control plane to feed the node, nothing saved.
    let dead_control = format!("http://127.0.0.1:{}", free_port());
    let mut blind = Node::start(&dir.join("blind"), &dead_control, &mock.url(), &[]);
    assert_eq!(
        call(Method::GET, &format!("{}/readyz", blind.url), &[], None).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_passes_through_stripped(&blind, &mock, &secret, "no_snapshot").await;
    assert_eq!(blind.process.terminate(Duration::from_secs(10)).map(|s| s.success()), Some(true));
    let spool = std::fs::read_dir(dir.join("blind").join("spool")).expect("spool dir");
    let spooled: u64 = spool.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();
    assert!(spooled < 64, "a fail-open pass writes no receipt ({spooled} bytes spooled)");

    // Each fault injected inside admission, on a node that does hold a snapshot.
    for (reason, failpoint) in [
        ("snapshot_error", "admission.snapshot=return"),
        ("rate_limiter_error", "admission.rate_limiter=return"),
        ("admission_panic", "admission.panic=panic"),
    ] {
        let node_dir = dir.join(reason);
        let mut node =
            Node::start_with_env(&node_dir, &control.admin, &mock.url(), &[], &[("FAILPOINTS", failpoint)]);
        node.ready().await;
        // The armed cap is never looked up: a pass is neither 402 nor 503.
        assert_passes_through_stripped(&node, &mock, &secret, reason).await;
        assert_eq!(node.process.terminate(Duration::from_secs(10)).map(|s| s.success()), Some(true));
    }
    assert!(control.receipts(&org_id).await.is_empty(), "no receipt for any fail-open pass");
    drop(control);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_flushes_the_spool() {
    let dir = temp_dir("split-drain");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let (org_id, _key_id, secret) = control.tenant().await;
    let mut node = Node::start(&dir.join("node"), &control.admin, &mock.url(), &[]);
    node.ready().await;
    within(Duration::from_secs(5), "the key is served", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;
    mock.script(Behaviour::default().delay_ms(1500));
    let slow = tokio::spawn({
        let (url, secret) = (node.url.clone(), secret.clone());
        async move {
            let auth = format!("Bearer {secret}");
            let body = json!({"model": MODEL, "messages": []});
            call(Method::POST, &format!("{url}/v1/chat/completions"), &[("authorization", &auth)], Some(body))
                .await
        }
    });
    within(Duration::from_secs(5), "the slow request reaches the provider", || async {
        mock.requests().len() == 2
    })
    .await;
    let address = node.url.trim_start_matches("http://").to_owned();
    let exit = tokio::task::spawn_blocking(move || {
        let exit = node.process.terminate(Duration::from_secs(15));
        (node, exit)
    });
    // While it drains, the node takes no new connection: polled until its listener is gone,
    // which must come while the in-flight request still holds the node open.
    let refused = harness::eventually(Duration::from_secs(5), "the listener gone after SIGTERM", || async {
        let gone = tokio::net::TcpStream::connect(&address).await.is_err();
        gone.then(|| !slow.is_finished())
    })
    .await;
    let answer = slow.await.expect("the request task");
    assert_eq!(answer.status, StatusCode::OK, "the in-flight request finishes");
    let (_node, exit) = exit.await.expect("terminate");
    assert_eq!(exit.map(|s| s.success()), Some(true), "the node exits cleanly after draining");
    assert!(refused, "no new connection is accepted while draining");
    // Both receipts were delivered before the node exited: the control plane has them now.
    assert_eq!(control.receipts(&org_id).await.len(), 2, "the spool was flushed at shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The exact 429: status, both retry headers, and the body that says when.
fn assert_rate_limited(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    let ms: u64 = answer.headers["retry-after-ms"].to_str().expect("ascii").parse().expect("milliseconds");
    assert!((1..=60_000).contains(&ms), "{ms}");
    assert_eq!(answer.headers["retry-after"], ms.div_ceil(1000).to_string().as_str());
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        String::from_utf8_lossy(&answer.body),
        format!(
            "{{\n  \"error\": {{\n    \"message\": \"Rate limit reached for this key. Retry in {ms} ms.\",\n    \"type\": \"rate_limit_error\",\n    \"param\": null,\n    \"code\": \"rate_limit_exceeded\"\n  }}\n}}"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rate_limit_is_shared_by_the_nodes_through_redis() {
    let dir = temp_dir("split-rate");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let a = Node::start(&dir.join("node-a"), &control.admin, &mock.url(), &[]);
    let b = Node::start(&dir.join("node-b"), &control.admin, &mock.url(), &[]);
    let (_org_id, key_id, secret) = control.tenant().await;
    control.admin(Method::PATCH, &format!("/keys/{key_id}"), Some(json!({"requests_per_minute": 4}))).await;
    a.ready().await;
    b.ready().await;
    // The limit reaches node A with the key's next state; until then the key passes unlimited.
    within(Duration::from_secs(2), "node A enforces the limit", || async {
        a.chat(&secret).await.status == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
    assert_rate_limited(&a.chat(&secret).await);
    // Node B learns A's use through Redis: after at most the one request it decides alone on a key
    // new to it, it refuses too.
    let mut admitted_by_b = 0;
    let started = Instant::now();
    let refusal = loop {
        let answer = b.chat(&secret).await;
        if answer.status != StatusCode::OK {
            break answer;
        }
        admitted_by_b += 1;
        assert!(started.elapsed() < Duration::from_secs(3), "node B never learned A's use");
        // Paced as a client is, not polled: every request admitted counts against the bound.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_rate_limited(&refusal);
    assert!(admitted_by_b <= 1, "node B admitted {admitted_by_b} over a limit A had used up");
    drop((a, b, control));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_and_ingest_answer_only_the_node_token() {
    let dir = temp_dir("split-token");
    let database = Database::create();
    let log_path = dir.join("control.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let control = Control::start_logging(&database.url(), free_port(), &dir.join("control"), &[], log);
    let poll = json!({"node_id": "node_intruder", "version": null, "wait_ms": 0});
    let admin_bearer = format!("Bearer {ADMIN_TOKEN}");
    for token in ["Bearer wrong-node-token-guessed-0123456789", "Bearer ", admin_bearer.as_str()] {
        for (path, body) in
            [("/feed/v1/poll", poll.clone()), ("/ingest/v1/receipts", json!({"receipts": []}))]
        {
            let answer = call(
                Method::POST,
                &format!("{}{path}", control.admin),
                &[("authorization", token)],
                Some(body),
            )
            .await;
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{path} with {token:?}");
            let error = &answer.json()["error"];
            assert_eq!(
                (error["code"].as_str(), error["message"].as_str()),
                (Some("invalid_node_token"), Some("Invalid node token.")),
                "{path} names the node token"
            );
        }
    }
    // Each refusal is logged at `warn` with the address it came from, never with the token.
    let refusals = |log: &str| log.lines().filter(|l| l.contains("a wrong node token was refused")).count();
    within(Duration::from_secs(5), "six refusals logged", || async {
        refusals(&std::fs::read_to_string(&log_path).expect("the log")) == 6
    })
    .await;
    let log = std::fs::read_to_string(&log_path).expect("the log");
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("a wrong node token was refused")).collect();
    assert!(refused.iter().all(|l| l.contains(" WARN ") && l.contains("client=127.0.0.1")), "{log}");
    assert!(!log.contains("wrong-node-token-guessed") && !log.contains(ADMIN_TOKEN), "{log}");
    let auth = format!("Bearer {NODE_TOKEN}");
    let state = call(
        Method::POST,
        &format!("{}/feed/v1/poll", control.admin),
        &[("authorization", &auth)],
        Some(poll),
    )
    .await;
    assert_eq!(state.status, StatusCode::OK);
    assert_eq!(state.json()["kind"], "state");
    within(Duration::from_secs(2), "the node with the token is listed", || async {
        let listed = control.admin(Method::GET, "/nodes", None).await;
        listed["nodes"].as_array().is_some_and(|n| {
            n.len() == 1
                && n[0]["id"] == "node_intruder"
                && n[0]["credential_id"] == "shared"
                && n[0]["credential_name"].is_null()
        })
    })
    .await;
    drop(control);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `recovea admin ARGS` against `control`: its JSON answer, or its error text.
fn admin_cli(control: &Control, args: &[&str]) -> Result<Value, String> {
    let output = std::process::Command::new(harness::BIN)
        .env_remove("RECOVEA_ADMIN_TOKEN")
        .args(["admin", "--admin-url", &control.admin, "--admin-token", ADMIN_TOKEN])
        .args(args)
        .output()
        .expect("recovea admin runs");
    if output.status.success() {
        serde_json::from_slice(&output.stdout).map_err(|e| format!("not JSON: {e}"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// A node call with `token`: the feed poll or receipt ingest.
async fn node_call(control: &Control, path: &str, token: &str, body: Value) -> Answer {
    let auth = format!("Bearer {token}");
    call(Method::POST, &format!("{}{path}", control.admin), &[("authorization", &auth)], Some(body)).await
}

fn assert_refused_as_a_wrong_node_token(answer: &Answer, what: &str) {
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{what}");
    let error = &answer.json()["error"];
    assert_eq!(
        (error["code"].as_str(), error["message"].as_str()),
        (Some("invalid_node_token"), Some("Invalid node token.")),
        "{what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_its_own_credential_serves_and_delivers_until_the_credential_is_revoked() {
    let dir = temp_dir("split-node-credential");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let log_path = dir.join("control.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    // No shared node token at all: node credentials alone let nodes in.
    let control = Control::start_with(&database.url(), free_port(), &dir.join("control"), &[], log, None);

    // Issued through the CLI: the token is in this answer only.
    let issued = admin_cli(&control, &["node-credentials", "create", "--name", "edge-1"]).expect("issued");
    let (id, token) = (issued["id"].as_str().expect("id"), issued["token"].as_str().expect("token"));
    assert!(id.starts_with("ncr_"), "{issued}");
    assert!(token.starts_with("rnt_") && token.len() == 47, "{issued}");
    assert_eq!((issued["name"].as_str(), issued["revoked_at"].is_null()), (Some("edge-1"), true));
    let listed = admin_cli(&control, &["node-credentials", "list"]).expect("listed");
    let text = listed.to_string();
    assert!(!text.contains(token) && !text.contains("hash") && !text.contains("token"), "{listed}");
    assert_eq!(listed["node_credentials"][0]["id"], id);

    let node = Node::start_presenting(&dir.join("node"), &control.admin, &mock.url(), token);
    node.ready().await;
    let (org_id, _key_id, secret) = control.tenant().await;
    let usage = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
    mock.script(Behaviour::default().usage(usage).times(10));
    within(Duration::from_secs(2), "the node serves the new key", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;
    within(Duration::from_secs(10), "its receipt reaches the ledger", || async {
        control.receipts(&org_id).await.len() == 1
    })
    .await;
    // The node list names the credential the node presented, never its token.
    within(Duration::from_secs(2), "the node is listed with its credential", || async {
        let listed = control.admin(Method::GET, "/nodes", None).await;
        listed["nodes"].as_array().is_some_and(|n| {
            n.len() == 1 && n[0]["credential_id"] == id && n[0]["credential_name"] == "edge-1"
        })
    })
    .await;
    // The shared token is no way in where none is set.
    let poll = json!({"node_id": "node_probe", "version": null, "wait_ms": 0});
    let shared = node_call(&control, "/feed/v1/poll", NODE_TOKEN, poll.clone()).await;
    assert_refused_as_a_wrong_node_token(&shared, "the shared token, none being set");

    // Revoked through the API: its very next poll and delivery are refused.
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("{}/admin/v1/node-credentials/{id}", control.admin);
    let revoked = call(Method::DELETE, &url, &[("authorization", &auth)], None).await;
    assert_eq!(revoked.status, StatusCode::OK);
    assert!(revoked.json()["revoked_at"].is_string(), "{:?}", revoked.json());
    assert!(revoked.json().get("token").is_none());
    let polled = node_call(&control, "/feed/v1/poll", token, poll).await;
    assert_refused_as_a_wrong_node_token(&polled, "a revoked credential's poll");
    let delivered = node_call(&control, "/ingest/v1/receipts", token, json!({"receipts": []})).await;
    assert_refused_as_a_wrong_node_token(&delivered, "a revoked credential's receipts");
    let again = admin_cli(&control, &["node-credentials", "revoke", id]).expect("revoked again");
    assert_eq!(again["revoked_at"], revoked.json()["revoked_at"], "revoked once");
    let unknown = format!("{}/admin/v1/node-credentials/ncr_unknown", control.admin);
    assert_eq!(
        call(Method::DELETE, &unknown, &[("authorization", &auth)], None).await.status,
        StatusCode::NOT_FOUND
    );

    // Both changes are in the audit log, without the token.
    let audit = control.admin(Method::GET, "/audit?object_kind=node_credential", None).await;
    let entries = audit["entries"].as_array().expect("entries");
    let actions: Vec<&str> = entries.iter().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(actions, ["create", "revoke", "revoke"], "{audit}");
    assert!(entries.iter().all(|e| e["object_id"] == id));
    assert!(!audit.to_string().contains(token));
    // The refusals are logged as any wrong node token is, with the address and without the token.
    let log = std::fs::read_to_string(&log_path).expect("the log");
    assert!(
        log.lines().any(|l| l.contains("a wrong node token was refused") && l.contains("client=127.0.0.1"))
    );
    assert!(!log.contains(token), "no token in the log");
    drop((node, control));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receipt as a node writes it, of `cost_usd`, made now.
fn receipt_json(id: &str, org_id: &str, key_id: &str, cost_usd: &str) -> Value {
    let now = recovea_core::timestamp::Timestamp::from_system_time(std::time::SystemTime::now());
    let receipt = recovea_core::receipt::Receipt {
        id: id.into(),
        request_id: id.replace("rcpt_", "req_"),
        org_id: org_id.into(),
        key_id: key_id.into(),
        provider: "openai".into(),
        model: Some(MODEL.into()),
        endpoint: "/v1/chat/completions".into(),
        status: 200,
        cost_usd: recovea_core::money::Nanos::parse_usd(cost_usd).expect("dollars"),
        priced: true,
        started_at: now,
        finished_at: now,
        node_id: "node_forger".into(),
        ..recovea_core::receipt::Receipt::default()
    };
    serde_json::from_str(&receipt.to_json()).expect("a receipt's JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_naming_another_organization_than_its_keys_is_refused_and_moves_no_spend() {
    let dir = temp_dir("split-forged-receipt");
    let database = Database::create();
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let (org_a, key_a, _) = control.tenant().await;
    let (org_b, _key_b, _) = control.tenant().await;
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "10.00", "hard_stop": true});
    control.admin(Method::POST, &format!("/orgs/{org_b}/caps"), Some(cap)).await;
    let spend_of_b = || async {
        let spend = control.admin(Method::GET, &format!("/orgs/{org_b}/spend"), None).await;
        spend["spend"][0]["spend_usd"].as_str().expect("spend_usd").to_owned()
    };
    assert_eq!(nanos_of(&spend_of_b().await), 0);

    // A's key, B's organization, a huge cost: refused as invalid, alone or in a batch.
    let forged = receipt_json("rcpt_forged", &org_b, &key_a, "99999.00");
    let valid = receipt_json("rcpt_valid", &org_a, &key_a, "1.00");
    let unknown_key = receipt_json("rcpt_unknown", &org_b, "key_nobody", "5.00");
    for (batch, what) in [
        (vec![forged.clone()], "a forged receipt"),
        (vec![valid.clone(), forged.clone()], "a batch holding a forged receipt"),
        (vec![unknown_key], "a receipt of no known key"),
    ] {
        let answer = node_call(&control, "/ingest/v1/receipts", NODE_TOKEN, json!({"receipts": batch})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{what}: {:?}", answer.json());
        let message = answer.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(message.starts_with("body: receipts["), "{what}: {message}");
        assert!(!message.contains(&org_a), "the key's own organization is not told: {message}");
    }
    assert_eq!(nanos_of(&spend_of_b().await), 0, "B's spend did not move");
    assert!(control.receipts(&org_b).await.is_empty(), "B has no receipt");
    assert!(control.receipts(&org_a).await.is_empty(), "a refused batch writes nothing");

    // The same shape with the key's own organization is taken, and so is a receipt of a key
    // revoked since (made before its revocation reached the node).
    let answer = node_call(&control, "/ingest/v1/receipts", NODE_TOKEN, json!({"receipts": [valid]})).await;
    assert_eq!((answer.status, answer.json()["accepted"].as_u64()), (StatusCode::OK, Some(1)));
    let old = control.admin(Method::POST, &format!("/orgs/{org_a}/keys"), Some(json!({"name": "old"}))).await;
    let old_key = old["id"].as_str().expect("id");
    control.admin(Method::POST, &format!("/keys/{old_key}/revoke"), None).await;
    let late = receipt_json("rcpt_late", &org_a, old_key, "2.00");
    let answer = node_call(&control, "/ingest/v1/receipts", NODE_TOKEN, json!({"receipts": [late]})).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
    let ids: std::collections::BTreeSet<String> =
        control.receipts(&org_a).await.iter().filter_map(|r| r["id"].as_str().map(str::to_owned)).collect();
    assert_eq!(ids, ["rcpt_late".to_owned(), "rcpt_valid".to_owned()].into());
    assert_eq!(nanos_of(&spend_of_b().await), 0, "B's spend still did not move");
    drop(control);
    let _ = std::fs::remove_dir_all(&dir);
}

fn nanos_of(usd: &str) -> i128 {
    deployment::nanos(usd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let dir = temp_dir("split-json-logs");
    let mut child = std::process::Command::new(harness::BIN)
        .args(["node", "--listen", "127.0.0.1:0", "--log-format", "json", "--log", "info"])
        .args(["--control-url", &format!("http://127.0.0.1:{}", free_port()), "--node-token", NODE_TOKEN])
        .args(["--master-key", MASTER_KEY, "--data-dir", dir.to_str().expect("utf-8")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("recovea starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut banner = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut banner).expect("banner");
    assert!(banner.starts_with("recovea node"), "{banner}");
    // With no control plane to feed it, the node logs (its feed's failure); once it has, SIGTERM
    // makes it log its drain.
    let mut log = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut stderr = String::new();
    std::io::BufRead::read_line(&mut log, &mut stderr).expect("a first log line");
    let term = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(term.is_ok_and(|s| s.success()));
    std::io::Read::read_to_string(&mut log, &mut stderr).expect("the rest of the log");
    child.wait().expect("exits");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 2, "{stderr}");
    for line in &lines {
        let entry: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            entry["level"].is_string() && entry["message"].is_string() && entry["timestamp"].is_string(),
            "{line}"
        );
    }
    assert!(lines.iter().any(|l| l.contains("shutting down")), "{stderr}");
    assert!(!stderr.contains(NODE_TOKEN) && !stderr.contains(MASTER_KEY), "no secret in the log");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_ready_only_once_it_can_decide_and_then_answers_no_503() {
    const RESTARTS: usize = 5;
    const BURST: usize = 40;
    deployment::require_redis();
    let dir = temp_dir("split-restart");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let (org_id, _, secret) = control.tenant().await;
    let price = json!({"input_per_mtok_usd": "0", "output_per_mtok_usd": "1"});
    control.admin(Method::PUT, &format!("/prices/{MODEL}"), Some(price)).await;
    // Armed, far from its line: every request is decided by its counters, none refused.
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "1000.00", "hard_stop": true});
    control.admin(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
    mock.script(Behaviour::default().times((RESTARTS * BURST) as u32 + 10));
    let node_dir = dir.join("node");
    let node = Node::start(&node_dir, &control.admin, &mock.url(), &[]);
    node.ready().await;
    drop(node);
    for restart in 0..RESTARTS {
        // Killed and started again from its saved state, as after a crash; a load balancer sends it
        // traffic the moment /readyz says so, and a burst follows at once.
        let node = Node::start(&node_dir, &control.admin, &mock.url(), &[]);
        node.ready().await;
        let client = harness::http_client();
        let answers =
            futures_util::future::join_all((0..BURST).map(|_| node.chat_on(&client, &secret))).await;
        let statuses: Vec<StatusCode> = answers.iter().map(|a| a.status).collect();
        assert!(
            statuses.iter().all(|s| *s == StatusCode::OK),
            "restart {restart}: {statuses:?} {:?}",
            answers.iter().find(|a| a.status != StatusCode::OK).map(Answer::json)
        );
        node.process.kill();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP relay to PostgreSQL that can be frozen: connections stay open and nothing moves, as with a
/// database whose processes are stopped.
struct FreezableRelay {
    addr: std::net::SocketAddr,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl FreezableRelay {
    async fn start(to: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let frozen = tokio::sync::watch::Sender::new(false);
        let (to, watch) = (to.to_owned(), frozen.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&to).await else { continue };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(Self::pass(client_read, server_write, watch.subscribe()));
                tokio::spawn(Self::pass(server_read, client_write, watch.subscribe()));
            }
        });
        Self { addr, frozen }
    }

    /// Copies `from` to `to`, holding every read while frozen.
    async fn pass(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let Ok(n) = from.read(&mut buf).await else { return };
            if n == 0 || frozen.wait_for(|frozen| !frozen).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_is_an_answer_not_a_hang_and_nodes_serve_on() {
    let dir = temp_dir("split-frozen-db");
    let database = Database::create();
    let relay = FreezableRelay::start("127.0.0.1:5432").await;
    let mock = MockProvider::start().await;
    let bounds = ["--database-timeout", "1s", "--database-pool-wait", "500ms"];
    let control =
        Control::start_at(&database.url_via(relay.addr), free_port(), &dir.join("control"), &bounds);
    let node = Node::start(&dir.join("node"), &control.admin, &mock.url(), &[]);
    node.ready().await;
    let (org_id, _, secret) = control.tenant().await;
    let price = json!({"input_per_mtok_usd": "0", "output_per_mtok_usd": "1"});
    control.admin(Method::PUT, &format!("/prices/{MODEL}"), Some(price)).await;
    mock.script(Behaviour::default().times(100));
    within(Duration::from_secs(5), "the node serves the new key", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;

    relay.freeze(true);
    let auth = format!("Bearer {}", deployment::ADMIN_TOKEN);
    let orgs = format!("{}/admin/v1/orgs", control.admin);
    let asked = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(15),
        call(Method::GET, &orgs, &[("authorization", &auth)], None),
    )
    .await
    .expect("the admin API answers while the database is frozen");
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "after {:?}", asked.elapsed());
    assert_eq!(answer.headers["retry-after"], "1");
    let expected = "{\n  \"error\": {\n    \"message\": \"The database did not answer in time. Retry in a moment.\",\n    \"type\": \"api_error\",\n    \"param\": null,\n    \"code\": \"store_unavailable\"\n  }\n}";
    assert_eq!(String::from_utf8_lossy(&answer.body), expected);
    let readyz = format!("{}/readyz", control.admin);
    within(Duration::from_secs(15), "the control plane says it is not ready", || async {
        call(Method::GET, &readyz, &[], None).await.status == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    // Traffic is unaffected: the node decides from its state, its receipts wait in its spool.
    let mut served = 1;
    for _ in 0..5 {
        assert_eq!(node.chat(&secret).await.status, StatusCode::OK);
        served += 1;
    }

    relay.freeze(false);
    within(Duration::from_secs(15), "the control plane is ready again by itself", || async {
        call(Method::GET, &readyz, &[], None).await.status == StatusCode::OK
    })
    .await;
    within(Duration::from_secs(15), "every receipt reaches the ledger", || async {
        control.receipts(&org_id).await.len() == served
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlists_reach_a_node_through_the_feed_and_tags_reach_the_ledger_through_ingest() {
    let dir = temp_dir("split-allowlists-tags");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let node = Node::start(&dir.join("node"), &control.admin, &mock.url(), &[]);
    node.ready().await;
    let (org_id, key_id, secret) = control.tenant().await;
    within(Duration::from_secs(2), "the key is served", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;

    // The organization's list, set on the control plane, refuses the model on the node.
    let listed = json!({"allowed_models": ["other-*"]});
    control.admin(Method::PATCH, &format!("/orgs/{org_id}"), Some(listed)).await;
    within(Duration::from_secs(2), "the list reaches the node", || async {
        node.chat(&secret).await.status == StatusCode::FORBIDDEN
    })
    .await;
    let refused = node.chat(&secret).await;
    assert_eq!(refused.json()["error"]["code"], "model_not_allowed");
    let forwarded = mock.requests().len();
    // With the organization's list removed, the key's own list (which names the model) decides.
    let key_list = json!({"allowed_models": [MODEL]});
    control.admin(Method::PATCH, &format!("/keys/{key_id}"), Some(key_list)).await;
    control.admin(Method::PATCH, &format!("/orgs/{org_id}"), Some(json!({"allowed_models": null}))).await;
    within(Duration::from_secs(2), "the cleared list reaches the node", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;
    assert!(mock.requests().len() > forwarded);

    // A tagged request's receipt goes from the node's spool to the ledger with its tags.
    let auth = format!("Bearer {secret}");
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let tagged = call(
        Method::POST,
        &format!("{}/v1/chat/completions", node.url),
        &[("authorization", &auth), ("x-recovea-tags", "team=search")],
        Some(body),
    )
    .await;
    assert_eq!(tagged.status, StatusCode::OK);
    let request_id = tagged.headers["x-request-id"].to_str().expect("text").to_owned();
    assert!(mock.requests().iter().all(|r| r.header("x-recovea-tags").is_none()));
    within(Duration::from_secs(10), "the tagged receipt reaches the ledger", || async {
        let found =
            control.admin(Method::GET, &format!("/orgs/{org_id}/receipts?tag=team:search"), None).await;
        found["receipts"].as_array().is_some_and(|r| r.len() == 1)
    })
    .await;
    let found = control.admin(Method::GET, &format!("/orgs/{org_id}/receipts?tag=team:search"), None).await;
    assert_eq!(found["receipts"][0]["request_id"], request_id.as_str());
    assert_eq!(found["receipts"][0]["tags"], json!({"team": "search"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_hold_counts_on_every_node_survives_restarts_and_is_settled_once() {
    deployment::require_redis();
    let dir = temp_dir("split-jobs");
    let database = Database::create();
    let mock = MockProvider::start().await;
    // o3-pro, 1,000 in and 20,000 out: $1.62 at $20 / $80 per million.
    mock.set_job_usage(Some(recovea_testkit::JobUsage::new(1_000, 20_000)));
    let port = free_port();
    // Polled once an hour at first: the job stays pending through the restarts below.
    let mock_url = mock.url();
    // The poller reaches a credential without a base URL as nodes do: at the kind's default.
    let control_flags =
        |interval: &'static str| ["--job-poll-interval", interval, "--openai-base-url", &mock_url];
    let control = Control::start_at(&database.url(), port, &dir.join("control"), &control_flags("1h"));
    let a = Node::start(&dir.join("node-a"), &control.admin, &mock.url(), &[]);
    let b = Node::start(&dir.join("node-b"), &control.admin, &mock.url(), &[]);
    for node in [&a, &b] {
        node.ready().await;
    }
    let (org_id, _, secret) = control.tenant().await;
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "2.00", "hard_stop": true});
    control.admin(Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
    let auth = format!("Bearer {secret}");
    // A background response that may write 25,000 tokens holds $2.00 and more: the line.
    let background =
        json!({"model": "o3-pro", "input": "x", "background": true, "max_output_tokens": 25_000});
    let created = within(Duration::from_secs(3), "the cap is served", || async {
        call(
            Method::POST,
            &format!("{}/v1/responses", a.url),
            &[("authorization", &auth)],
            Some(background.clone()),
        )
        .await
        .status
            == StatusCode::OK
    })
    .await;
    let _ = created;
    // Node B counts node A's hold (first as A's reservation through Redis, then from the book):
    // the line is reached there too.
    within(Duration::from_secs(5), "node B refuses at the held line", || async {
        b.chat(&secret).await.status == StatusCode::PAYMENT_REQUIRED
    })
    .await;
    let held = within(Duration::from_secs(5), "the book holds the job", || async {
        let spend = control.admin(Method::GET, &format!("/orgs/{org_id}/spend"), None).await;
        spend["spend"][0]["held_usd"].as_str().is_some_and(|held| held != "0.00")
    })
    .await;
    let _ = held;

    // Node B restarts while the control plane is down: it boots from the book it saved.
    let b_dir = dir.join("node-b");
    within(Duration::from_secs(5), "node B saved the book with the job", || async {
        std::fs::read_to_string(b_dir.join("jobs.book")).is_ok_and(|book| book.contains("\"held_nanos\""))
    })
    .await;
    b.process.kill();
    let mut control = control;
    control.process.terminate(Duration::from_secs(5));
    let b = Node::start(&b_dir, &format!("http://127.0.0.1:{port}"), &mock.url(), &[]);
    within(Duration::from_secs(5), "the restarted node counts the saved hold", || async {
        b.chat(&secret).await.status == StatusCode::PAYMENT_REQUIRED
    })
    .await;

    // The control plane comes back polling often: the job settles, once, at its cost.
    let control = Control::start_at(&database.url(), port, &dir.join("control"), &control_flags("100ms"));
    let settled = harness::eventually(Duration::from_secs(20), "the settlement", || async {
        let receipts = control.receipts(&org_id).await;
        let settlements: Vec<Value> =
            receipts.into_iter().filter(|r| r["job_id"].is_string() && r["held_usd"].is_null()).collect();
        (!settlements.is_empty()).then_some(settlements)
    })
    .await;
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0]["cost_usd"], "1.62");
    // The book lets the hold go as it reads the settlement back; the chats node B admitted
    // before the hold reached it cost a little too.
    let spend = harness::eventually(Duration::from_secs(5), "the hold released", || async {
        let spend = control.admin(Method::GET, &format!("/orgs/{org_id}/spend"), None).await;
        (spend["spend"][0]["held_usd"] == "0.00").then_some(spend)
    })
    .await;
    let all: i64 = control
        .receipts(&org_id)
        .await
        .iter()
        .map(|r| {
            recovea_core::money::Nanos::parse_usd(r["cost_usd"].as_str().expect("cost")).expect("amount").0
        })
        .sum();
    assert_eq!(
        spend["spend"][0]["spend_usd"].as_str(),
        Some(recovea_core::money::Nanos(all).to_usd_string().as_str())
    );
    assert_eq!(spend["spend"][0]["held_usd"].as_str(), Some("0.00"));
    // About $1.63 of $2.00: both nodes admit again, the hold gone and the cost counted once.
    for node in [&a, &b] {
        within(Duration::from_secs(5), "the node admits below the line", || async {
            node.chat(&secret).await.status == StatusCode::OK
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_poll_one_credential_at_one_rate_and_one_takes_over_from_the_other() {
    deployment::require_redis();
    let dir = temp_dir("split-poller");
    let database = Database::create();
    let mock = MockProvider::start().await;
    // The jobs keep running: every poll finds them in progress.
    mock.set_retrievals_to_finish(0);
    let mock_url = mock.url();
    let flags = ["--job-poll-interval", "100ms", "--openai-base-url", mock_url.as_str()];
    let mut first = Control::start_at(&database.url(), free_port(), &dir.join("control-a"), &flags);
    let second = Control::start_at(&database.url(), free_port(), &dir.join("control-b"), &flags);
    let node = Node::start(&dir.join("node"), &first.admin, &mock.url(), &[]);
    node.ready().await;
    let (org_id, _, secret) = first.tenant().await;
    let auth = format!("Bearer {secret}");
    let background = json!({"model": "gpt-4o", "input": "x", "background": true, "max_output_tokens": 100});
    for _ in 0..10 {
        let created = within(Duration::from_secs(3), "the credential is served", || async {
            let answer = call(
                Method::POST,
                &format!("{}/v1/responses", node.url),
                &[("authorization", &auth)],
                Some(background.clone()),
            )
            .await;
            answer.status == StatusCode::OK
        })
        .await;
        let _ = created;
    }
    let polls_at = || -> Vec<u64> {
        let mut at: Vec<u64> = mock
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path.starts_with("/v1/responses/"))
            .map(|r| r.at_ms)
            .collect();
        at.sort_unstable();
        at
    };
    within(Duration::from_secs(10), "20 polls", || async { polls_at().len() >= 20 }).await;
    // Ten jobs due every 100 ms, two control planes: still one poll of the credential at a time,
    // at most five a second (a few milliseconds of jitter between two requests' ways in).
    let at = polls_at();
    let closest = at.windows(2).map(|pair| pair[1] - pair[0]).min().expect("two polls");
    assert!(closest >= 180, "two polls {closest} ms apart: {at:?}");
    let jobs: Vec<Value> =
        first.receipts(&org_id).await.into_iter().filter(|r| r["job_id"].is_string()).collect();
    assert_eq!(jobs.len(), 10);

    // Whichever polled, the other carries on once it stops.
    first.process.terminate(Duration::from_secs(10));
    let stopped = polls_at().len();
    within(Duration::from_secs(20), "the other control plane polls", || async {
        polls_at().len() >= stopped + 10
    })
    .await;
    let at = polls_at();
    let closest = at[stopped..].windows(2).map(|pair| pair[1] - pair[0]).min().expect("two polls");
    assert!(closest >= 180, "two polls {closest} ms apart: {at:?}");
    drop(second);
}

/// A node given several control-plane replicas moves past one that cannot be reached, and reaches
/// one behind TLS with a private CA's certificate when given that CA (`--control-ca-file`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_moves_past_a_control_replica_that_is_down_and_trusts_a_private_ca() {
    let dir = temp_dir("split-control-link");
    let database = Database::create();
    let mock = MockProvider::start().await;
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let backend = control.admin.trim_start_matches("http://").parse().expect("an address");
    let tls = recovea_testkit::tls::Terminator::start(backend).await;
    let down = format!("http://127.0.0.1:{}", free_port());
    let replicas = format!("{down},{}", tls.url());
    let ca = recovea_testkit::tls::ca_file();
    let ca = ca.to_str().expect("a UTF-8 path");

    // Without the CA, the replica behind TLS is as unreachable as the one that is down: once the
    // node has tried both and said why, it is still not fed.
    let log_path = dir.join("node-untrusting.log");
    let log = std::fs::File::create(&log_path).expect("a log file");
    let redis = deployment::REDIS;
    let untrusting =
        Node::start_logging(&dir.join("node-untrusting"), &replicas, &mock.url(), redis, &[], &[], log);
    within(Duration::from_secs(10), "the node says why the TLS replica failed", || async {
        std::fs::read_to_string(&log_path).unwrap_or_default().contains("UnknownIssuer")
    })
    .await;
    let status = call(Method::GET, &format!("{}/readyz", untrusting.url), &[], None).await.status;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "never fed");
    drop(untrusting);

    let node = Node::start(&dir.join("node"), &replicas, &mock.url(), &["--control-ca-file", ca]);
    node.ready().await;
    let (org_id, _, secret) = control.tenant().await;
    within(Duration::from_secs(5), "the new key is served", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;
    within(Duration::from_secs(10), "its receipt is delivered through TLS", || async {
        control.receipts(&org_id).await.len() == 1
    })
    .await;
    drop((node, tls, control));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receipt in a node's spool that the control plane refuses as invalid (here one naming another
/// organization than its key's) is set aside in the spool's dead-letter file, counted and alarmed,
/// and never holds up the others: every other receipt, before and after it and made after it,
/// reaches the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_receipt_in_a_nodes_spool_is_set_aside_and_every_other_is_delivered() {
    let dir = temp_dir("split-poison");
    let database = Database::create();
    let mock = MockProvider::start().await;
    mock.script(Behaviour::default().times(10));
    let control = Control::start(&database, free_port(), &dir.join("control"));
    let (org_a, key_a, secret) = control.tenant().await;
    let (org_b, _, _) = control.tenant().await;
    // Written before the node starts, as a spool left by a node that stopped: a valid receipt, the
    // poison, another valid one.
    let spool = dir.join("node").join("spool");
    std::fs::create_dir_all(&spool).expect("a spool directory");
    let lines: Vec<String> = [
        receipt_json("rcpt_before", &org_a, &key_a, "1.00"),
        receipt_json("rcpt_poison", &org_b, &key_a, "99999.00"),
        receipt_json("rcpt_after", &org_a, &key_a, "1.00"),
    ]
    .iter()
    .map(|receipt| format!("{receipt}\n"))
    .collect();
    std::fs::write(spool.join("seg-000000000001.jsonl"), lines.concat()).expect("a segment");

    let node = Node::start(&dir.join("node"), &control.admin, &mock.url(), &[]);
    node.ready().await;
    within(Duration::from_secs(5), "a request through the node", || async {
        node.chat(&secret).await.status == StatusCode::OK
    })
    .await;
    within(Duration::from_secs(15), "every other receipt delivered", || async {
        control.receipts(&org_a).await.len() == 3
    })
    .await;
    let ids: std::collections::BTreeSet<String> =
        control.receipts(&org_a).await.iter().filter_map(|r| r["id"].as_str().map(str::to_owned)).collect();
    assert!(ids.contains("rcpt_before") && ids.contains("rcpt_after"), "{ids:?}");
    assert!(control.receipts(&org_b).await.is_empty(), "the poison reached no ledger");
    let dead = std::fs::read_to_string(spool.join("dead-letter")).expect("the dead-letter file");
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("rcpt_poison"), "{dead}");
    assert_eq!(node.metric("recovea_receipts_dead_lettered_total ").await, Some(1.0));
    drop((node, control));
    let _ = std::fs::remove_dir_all(&dir);
}
