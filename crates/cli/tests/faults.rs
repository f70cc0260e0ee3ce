//! An armed cap's line when the shared store misbehaves, black-box: two `recovea node` processes
//! sharing Redis, one or both through a fault proxy that delays or cuts their link, fed by
//! `recovea control` on a PostgreSQL database of the test's own, many clients on each node racing
//! at a cap, and the ledger as the judge. Whatever the store does, the spend an armed cap admits
//! exceeds its limit by at most one request's reservation; a request the node cannot decide is
//! answered `503 budget_unverifiable` with `retry-after: 1`; no admitted request loses its receipt.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use recovea_testkit::faults::{Fault, FaultProxy};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::json;

#[path = "support/deployment.rs"]
mod deployment;
#[path = "support/harness.rs"]
mod harness;

use deployment::{
    Control, Node, REDIS, chat_at, dollar_a_request, require_redis, spend_once_delivered, tenant_with_cap,
    within,
};
use harness::{Database, http_client, temp_dir};
#[path = "support/own_redis.rs"]
mod own_redis;
use own_redis::OwnRedis;

/// One dollar a request, exactly its reservation: `max_tokens: 1` at a dollar an output token.
const REQUEST_NANOS: i128 = 1_000_000_000;
/// The cap's limit, in requests.
const LIMIT_REQUESTS: i128 = 40;
const CLIENTS_PER_NODE: usize = 12;
/// A client stops after this many `402`s in a row.
const REFUSALS_IN_A_ROW: usize = 4;

/// What one node's clients were answered in a race.
#[derive(Debug, Default, Clone, Copy)]
struct Answers {
    admitted: usize,
    refused: usize,
    unverifiable: usize,
}

/// The deployment: control, the mock pricing every request at a dollar, and its nodes.
struct Deployment {
    control: Control,
    nodes: Vec<Node>,
    _mock: MockProvider,
    _database: Database,
}

/// How one node of a [`Deployment`] starts: the address its counters go through (Redis, or a
/// fault proxy in front of it), its extra flags and environment.
struct NodeSpec<'a> {
    redis: SocketAddr,
    extra: &'a [&'a str],
    envs: &'a [(&'a str, &'a str)],
}

/// A node per entry of `redis`, each with the same `extra` flags.
async fn deploy(name: &str, redis: &[SocketAddr], extra: &[&str]) -> Deployment {
    let specs: Vec<NodeSpec<'_>> = redis.iter().map(|&redis| NodeSpec { redis, extra, envs: &[] }).collect();
    deploy_nodes(name, &specs).await
}

async fn deploy_nodes(name: &str, specs: &[NodeSpec<'_>]) -> Deployment {
    require_redis();
    let dir = temp_dir(name);
    let database = Database::create();
    let (mock, control) = dollar_a_request(&database, &dir).await;
    let nodes: Vec<Node> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let dir = dir.join(format!("node-{i}"));
            let redis = spec.redis.to_string();
            Node::start_with_redis(&dir, &control.admin, &mock.url(), &redis, spec.extra, spec.envs)
        })
        .collect();
    for node in &nodes {
        node.ready().await;
    }
    Deployment { control, nodes, _mock: mock, _database: database }
}

fn redis() -> SocketAddr {
    REDIS.parse().expect("an address")
}

/// Every client on every node at the cap until refused `REFUSALS_IN_A_ROW` times in a row, or
/// `for_at_most` has passed: what each node answered. A `503` must be `budget_unverifiable` with
/// `retry-after: 1`; its client retries a moment later.
async fn race(nodes: &[Node], secret: &str, for_at_most: Duration) -> Vec<Answers> {
    let until = Instant::now() + for_at_most;
    let start = Arc::new(tokio::sync::Barrier::new(nodes.len() * CLIENTS_PER_NODE));
    let mut clients = tokio::task::JoinSet::new();
    for (index, node) in nodes.iter().enumerate() {
        for _ in 0..CLIENTS_PER_NODE {
            let (url, secret, start) = (node.url.clone(), secret.to_owned(), Arc::clone(&start));
            clients.spawn(async move {
                let client = http_client();
                start.wait().await;
                let mut answers = Answers::default();
                let mut refused_in_a_row = 0;
                while refused_in_a_row < REFUSALS_IN_A_ROW && Instant::now() < until {
                    let answer = chat_at(&client, &url, &secret).await;
                    match answer.status {
                        StatusCode::OK => (answers.admitted, refused_in_a_row) = (answers.admitted + 1, 0),
                        StatusCode::PAYMENT_REQUIRED => {
                            answers.refused += 1;
                            refused_in_a_row += 1;
                        }
                        StatusCode::SERVICE_UNAVAILABLE => {
                            assert_eq!(
                                answer.json()["error"]["code"],
                                "budget_unverifiable",
                                "{:?}",
                                answer.body
                            );
                            assert_eq!(answer.headers["retry-after"], "1");
                            answers.unverifiable += 1;
                            // A client as the answer asks: it retries a moment later.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => panic!("a request at the line was answered {other}: {:?}", answer.body),
                    }
                }
                (index, answers)
            });
        }
    }
    let mut by_node = vec![Answers::default(); nodes.len()];
    while let Some(joined) = clients.join_next().await {
        let (index, answers) = joined.expect("a client task");
        let node = &mut by_node[index];
        node.admitted += answers.admitted;
        node.refused += answers.refused;
        node.unverifiable += answers.unverifiable;
    }
    by_node
}

/// The ledger's spend once every admitted request's receipt is in it, checked against the bound:
/// at most one request past the limit, and no race ended refused with a whole request's room left.
async fn judge(control: &Control, org_id: &str, what: &str, answers: &[Answers]) -> i128 {
    let admitted: usize = answers.iter().map(|a| a.admitted).sum();
    let spend = spend_once_delivered(control, org_id, admitted).await;
    assert_eq!(spend, admitted as i128 * REQUEST_NANOS, "a dollar a request");
    let over = (spend - LIMIT_REQUESTS * REQUEST_NANOS) / REQUEST_NANOS;
    eprintln!("{what}: {over:+} requests past the limit of {LIMIT_REQUESTS}; answers by node {answers:?}");
    assert!(over <= 1, "{what}: the line gave way, {over:+} requests past it: {answers:?}");
    over
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_is_waited_for_and_the_line_holds() {
    let proxy = FaultProxy::start(redis()).await;
    let d = deploy("faults-slow", &[proxy.addr(), proxy.addr()], &[]).await;
    // +150 ms and +400 ms a round trip: both beyond the 100 ms a line ask used to wait.
    for one_way in [Duration::from_millis(75), Duration::from_millis(200)] {
        for number in 1..=2 {
            proxy.set(Fault::Pass);
            let (org_id, _, secret) =
                tenant_with_cap(&d.control, &format!("{LIMIT_REQUESTS}.00"), d.nodes.len()).await;
            proxy.set(Fault::Delay(one_way));
            let answers = race(&d.nodes, &secret, Duration::from_secs(40)).await;
            proxy.set(Fault::Pass);
            let what = format!("round trip +{:?}, race {number}", one_way * 2);
            let over = judge(&d.control, &org_id, &what, &answers).await;
            assert!(over >= 0, "{what}: the race ended refused below the line: {answers:?}");
        }
    }
    let unanswered = d.nodes[0].metric("recovea_cap_line_asks_total{answer=\"unanswered\"} ").await;
    eprintln!("asks unanswered on the first node: {unanswered:?}");
    let deadline = d.nodes[0].metric("recovea_cap_line_deadline_seconds ").await.expect("the deadline");
    assert!((0.1..=1.0).contains(&deadline), "the line's deadline stays within its bounds: {deadline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_store_cannot_spend_past_the_line() {
    let proxy = FaultProxy::start(redis()).await;
    // The cut node's counters go stale after 3 s: cuts shorter and longer than that, and a store
    // that refuses the node's connections outright.
    let d = deploy("faults-cut", &[proxy.addr(), redis()], &["--counter-max-age", "3s"]).await;
    for (fault, lasting) in [
        (Fault::Cut, Duration::from_secs(2)),
        (Fault::Cut, Duration::from_secs(5)),
        (Fault::Refuse, Duration::from_secs(3)),
    ] {
        proxy.set(Fault::Pass);
        let (org_id, _, secret) =
            tenant_with_cap(&d.control, &format!("{LIMIT_REQUESTS}.00"), d.nodes.len()).await;
        // Each node admits a request alone, far from the line, before the fault.
        for node in &d.nodes {
            assert_eq!(node.chat(&secret).await.status, StatusCode::OK);
        }
        proxy.set(fault);
        let switch = proxy.switch();
        let restore = tokio::spawn(async move {
            // The behaviour under test: a fault that lasts this long.
            tokio::time::sleep(lasting).await;
            switch.set(Fault::Pass);
        });
        let mut answers = race(&d.nodes, &secret, lasting + Duration::from_secs(10)).await;
        restore.await.expect("restored");
        answers[0].admitted += 1;
        answers[1].admitted += 1;
        let what = format!("first node's link to the store {fault:?} for {lasting:?}");
        judge(&d.control, &org_id, &what, &answers).await;
    }
}

/// The window totals of `cap_id` in `redis`, in nano-dollars.
fn store_total(redis: &OwnRedis, cap_id: &str) -> i128 {
    let sum = "local s = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
               s = s + tonumber(redis.call('HGET', k, 'total') or '0') end return tostring(s)";
    let total = redis.command(&["EVAL", sum, "0", &format!("*{{{cap_id}:*}}:t")]);
    total.parse::<f64>().map(|t| t as i128).unwrap_or_else(|_| panic!("a total: {total}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_wiped_near_the_line_is_rebuilt_and_the_line_holds() {
    let dir = temp_dir("faults-wiped-store");
    let redis = OwnRedis::start_anywhere(&dir.join("redis"));
    let d = deploy("faults-wiped", &[redis.addr(), redis.addr()], &[]).await;
    let redis = Arc::new(redis);
    let at_85_percent = LIMIT_REQUESTS * REQUEST_NANOS * 85 / 100;
    for number in 1..=20 {
        let (org_id, cap_id, secret) =
            tenant_with_cap(&d.control, &format!("{LIMIT_REQUESTS}.00"), d.nodes.len()).await;
        // Receipts are still in the nodes' spools when Redis loses everything: the rebuild must
        // count them once, from the ledger or from the nodes, never twice and never not at all.
        let wiper = {
            let redis = Arc::clone(&redis);
            tokio::task::spawn_blocking(move || {
                let until = Instant::now() + Duration::from_secs(30);
                while store_total(&redis, &cap_id) < at_85_percent {
                    assert!(Instant::now() < until, "the race never reached 85% of the room");
                    // Asked every millisecond, so that the wipe comes near 85%, not well past it.
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(redis.command(&["FLUSHALL"]), "+OK");
            })
        };
        let answers = race(&d.nodes, &secret, Duration::from_secs(40)).await;
        wiper.await.expect("the store was wiped");
        let what = format!("store wiped at 85% of the room, race {number}");
        let over = judge(&d.control, &org_id, &what, &answers).await;
        assert!(over >= 0, "{what}: the race ended refused below the line: {answers:?}");
    }
    let mut lost = 0.0;
    for node in &d.nodes {
        lost += node.metric("recovea_spend_windows_lost_total ").await.expect("the lost windows metric");
    }
    assert!(lost >= 20.0, "every wipe is counted where it was seen: {lost}");
}

/// libfaketime, which starts a node with its clock set off; installed when missing, never skipped.
fn libfaketime() -> String {
    const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    if !std::path::Path::new(LIBRARY).exists() {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/install-package");
        let status = std::process::Command::new(script).args([LIBRARY, "libfaketime"]).status();
        assert!(status.is_ok_and(|s| s.success()), "scripts/install-package {LIBRARY} libfaketime failed");
    }
    LIBRARY.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_clocks_disagree_by_30_s_keep_the_line_and_say_so() {
    let library = libfaketime();
    // Alarms go to a second mock, which answers each with a 200.
    let alarms = MockProvider::start().await;
    alarms.script(Behaviour::default().body(json!({"ok": true})).times(1000));
    let webhook = format!("{}/alarm", alarms.url());
    // The first node's clock runs 30 s ahead (its monotonic clock, which timers use, is left alone).
    let skewed =
        [("LD_PRELOAD", library.as_str()), ("FAKETIME", "+30s"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    let alarmed = ["--alarm-webhook", webhook.as_str()];
    let d = deploy_nodes(
        "faults-clock",
        &[
            NodeSpec { redis: redis(), extra: &alarmed, envs: &skewed },
            NodeSpec { redis: redis(), extra: &[], envs: &[] },
        ],
    )
    .await;
    let (control, nodes) = (&d.control, &d.nodes);
    for number in 1..=3 {
        let (org_id, _, secret) =
            tenant_with_cap(control, &format!("{LIMIT_REQUESTS}.00"), nodes.len()).await;
        let answers = race(nodes, &secret, Duration::from_secs(40)).await;
        let what = format!("clocks 30 s apart, race {number}");
        let over = judge(control, &org_id, &what, &answers).await;
        assert!(over >= 0, "{what}: the race ended refused below the line: {answers:?}");
    }
    // The node measured its clock against the store's, alarmed, and says so.
    let offset = nodes[0].metric("recovea_clock_offset_seconds ").await.expect("the offset");
    assert!((-31.0..=-29.0).contains(&offset), "the store's clock less the node's: {offset}");
    let on_time = nodes[1].metric("recovea_clock_offset_seconds ").await.expect("the offset");
    assert!(on_time.abs() < 1.0, "{on_time}");
    within(Duration::from_secs(30), "GET /nodes says which node's clock is off", || async {
        let listed = control.admin(Method::GET, "/nodes", None).await;
        let drifted: Vec<bool> = listed["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|node| node["clock_drifted"].as_bool())
            .collect();
        let mut sorted = drifted.clone();
        sorted.sort_unstable();
        sorted == [false, true]
    })
    .await;
    let alarm = alarms
        .requests()
        .into_iter()
        .find_map(|request| serde_json::from_slice::<serde_json::Value>(&request.body).ok())
        .expect("the clock's alarm reached the webhook");
    assert_eq!(alarm["alarm"], "clock_offset", "{alarm}");
    let offset_ms = alarm["offset_ms"].as_i64().expect("offset_ms");
    assert!((-31_000..=-29_000).contains(&offset_ms), "{alarm}");
}
