//! The line of an armed cap across nodes, black-box: two `recovea node` processes sharing Redis,
//! fed by `recovea control` on a PostgreSQL database of the test's own, many clients on each node
//! racing at a cap in several consecutive races, and the ledger as the judge.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::json;

#[path = "support/deployment.rs"]
mod deployment;
#[path = "support/harness.rs"]
mod harness;

use deployment::{Node, chat_at, dollar_a_request, require_redis, spend_once_delivered, tenant_with_cap};
use harness::{Database, http_client, temp_dir};

/// One dollar a request, exactly its reservation (see `line_holds_across_two_nodes_race_after_race`).
const REQUEST_NANOS: i128 = 1_000_000_000;
const RACES: usize = 5;
const CLIENTS_PER_NODE: usize = 24;
/// The cap's limit, in requests.
const LIMIT_REQUESTS: i128 = 30;
/// A client stops after this many refusals in a row.
const REFUSALS_IN_A_ROW: usize = 4;

/// Every client on every node at the cap until refused `REFUSALS_IN_A_ROW` times in a row:
/// the requests each node admitted.
async fn race(nodes: &[Node], secret: &str) -> (Vec<usize>, Vec<usize>) {
    // First one request on each node in turn, far from the line: each must be admitted. (Which
    // node admits how much of the race itself depends on who gets there first, which on a loaded
    // machine can be one node for all of it.)
    let mut admitted = vec![0; nodes.len()];
    let mut refused_first = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        match chat_at(&http_client(), &node.url, secret).await.status {
            StatusCode::OK => admitted[index] += 1,
            _ => refused_first.push(index),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut clients = tokio::task::JoinSet::new();
    // Every client starts at once, so that each node's first requests arrive far from the line
    // even on a loaded machine, where one node's clients could otherwise finish the race before
    // the other's begin.
    let start = Arc::new(tokio::sync::Barrier::new(nodes.len() * CLIENTS_PER_NODE));
    for (index, node) in nodes.iter().enumerate() {
        for _ in 0..CLIENTS_PER_NODE {
            let (url, secret, start) = (node.url.clone(), secret.to_owned(), Arc::clone(&start));
            clients.spawn(async move {
                let client = http_client();
                start.wait().await;
                let (mut admitted, mut refused_in_a_row) = (0, 0);
                while refused_in_a_row < REFUSALS_IN_A_ROW {
                    assert!(Instant::now() < deadline, "a race did not end within 20 s");
                    match chat_at(&client, &url, &secret).await.status {
                        StatusCode::OK => (admitted, refused_in_a_row) = (admitted + 1, 0),
                        StatusCode::PAYMENT_REQUIRED => refused_in_a_row += 1,
                        other => panic!("a request at the line was answered {other}"),
                    }
                }
                (index, admitted)
            });
        }
    }
    while let Some(joined) = clients.join_next().await {
        let (index, count) = joined.expect("a client task");
        admitted[index] += count;
    }
    (admitted, refused_first)
}

/// What one race showed.
struct Outcome {
    race: usize,
    admitted: Vec<usize>,
    /// Nodes that refused a request sent alone, far from the line.
    refused_first: Vec<usize>,
    /// Ledger spend minus the limit, in nano-dollars.
    over: i128,
    /// Nodes that did not admit a request within 5 s once the limit left room for one on each.
    stuck: Vec<usize>,
}

/// With any concurrency, the spend an armed cap admits exceeds its limit by at most one request's
/// cost (every request here costs exactly its reservation: `max_tokens: 1` at a dollar an output
/// token, input free). No phantom refusals: a race does not end refusing with room left for a
/// whole request; every node admits a request sent alone far from the line; and once the limit is raised
/// above the settled spend, every node admits again. Five races in a row, each at a new
/// organization's cap of 30 requests, 24 clients on each of two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_holds_across_two_nodes_race_after_race() {
    require_redis();
    line_holds_race_after_race("line-two-nodes", deployment::REDIS).await;
}

/// The same races with the counters on a Redis Cluster of three primaries: each race's
/// organization lands on one of its shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_holds_across_two_nodes_on_a_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(recovea_testkit::redis_topologies::Cluster::start)
        .await
        .expect("cluster");
    line_holds_race_after_race("line-cluster", &cluster.url()).await;
}

/// One set of races at a time: two at once on a small machine starve each other's asks at the
/// line, which are then answered `503` (as they should be when the store does not answer in time).
static RACING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Two nodes on the Redis at `redis` (see `Node::start_with_redis`), [`RACES`] races.
async fn line_holds_race_after_race(name: &str, redis: &str) {
    let _racing = RACING.lock().await;
    let dir = temp_dir(name);
    let database = Database::create();
    let (mock, control) = dollar_a_request(&database, &dir).await;
    let nodes: Vec<Node> = ["node-a", "node-b"]
        .iter()
        .map(|node| Node::start_with_redis(&dir.join(node), &control.admin, &mock.url(), redis, &[], &[]))
        .collect();
    let limit = LIMIT_REQUESTS * REQUEST_NANOS;

    let started = Instant::now();
    let mut outcomes = Vec::new();
    for number in 1..=RACES {
        let (org_id, cap_id, secret) =
            tenant_with_cap(&control, &format!("{LIMIT_REQUESTS}.00"), nodes.len()).await;
        let (admitted, refused_first) = race(&nodes, &secret).await;
        let spend = spend_once_delivered(&control, &org_id, admitted.iter().sum()).await;
        assert_eq!(spend, admitted.iter().sum::<usize>() as i128 * REQUEST_NANOS, "a dollar a request");

        // Room for one more request on each node: each admits again once the new limit reaches it.
        let raised = spend + REQUEST_NANOS * nodes.len() as i128;
        let raised_usd = format!("{}.{:09}", raised / 1_000_000_000, raised % 1_000_000_000);
        control
            .admin(Method::PATCH, &format!("/caps/{cap_id}"), Some(json!({"limit_usd": raised_usd})))
            .await;
        let mut stuck = Vec::new();
        for (index, node) in nodes.iter().enumerate() {
            let client = http_client();
            // Admitting within 5 s, or reported stuck below.
            let admits = harness::eventually(Duration::from_secs(6), "never: cut at 5 s", || async {
                (node.chat_on(&client, &secret).await.status == StatusCode::OK).then_some(())
            });
            if tokio::time::timeout(Duration::from_secs(5), admits).await.is_err() {
                stuck.push(index);
            }
        }
        eprintln!(
            "race {number}: admitted {admitted:?}, spend ${}, {:+} requests past the limit; nodes refusing after the raise: {stuck:?}",
            spend / REQUEST_NANOS,
            (spend - limit) / REQUEST_NANOS
        );
        outcomes.push(Outcome { race: number, admitted, refused_first, over: spend - limit, stuck });
    }
    eprintln!("{RACES} races in {:?}", started.elapsed());

    let broken: Vec<String> = outcomes
        .iter()
        .filter(|o| {
            o.over > REQUEST_NANOS
                || o.over <= -REQUEST_NANOS
                || !o.refused_first.is_empty()
                || !o.stuck.is_empty()
        })
        .map(|o| {
            let mut line = format!(
                "race {}: {:+} requests' cost past the limit of {LIMIT_REQUESTS} (admitted {:?} by node)",
                o.race,
                o.over / REQUEST_NANOS,
                o.admitted
            );
            if o.over > REQUEST_NANOS {
                line.push_str(": over the bound of +1");
            }
            if o.over <= -REQUEST_NANOS {
                line.push_str(": refused with room left for a whole request");
            }
            if !o.refused_first.is_empty() {
                line.push_str(&format!("; nodes {:?} refused a request far from the line", o.refused_first));
            }
            if !o.stuck.is_empty() {
                line.push_str(&format!("; nodes {:?} still refused 5 s after the limit left room", o.stuck));
            }
            line
        })
        .collect();
    assert!(
        broken.is_empty(),
        "{} of {RACES} races broke the line ({CLIENTS_PER_NODE} clients on each of 2 nodes):\n{}",
        broken.len(),
        broken.join("\n")
    );
    // The nodes' metrics saw the line: requests decided after asking Redis, and the cap's refusals.
    let (mut decided_at_line, mut refused) = (0, 0);
    for node in &nodes {
        let text = harness::call(Method::GET, &format!("{}/metrics", node.url), &[], None).await.body;
        let text = String::from_utf8_lossy(&text).into_owned();
        let value = |prefix: &str| -> u64 {
            let line = text.lines().find_map(|l| l.strip_prefix(prefix));
            line.unwrap_or_else(|| panic!("no {prefix} in:\n{text}")).trim().parse().expect("a count")
        };
        decided_at_line += value("recovea_cap_line_decisions_total{decision=\"admitted\"}")
            + value("recovea_cap_line_decisions_total{decision=\"refused\"}");
        refused += value(
            "recovea_cap_refusals_total{code=\"budget_exceeded\",scope=\"organization\",window=\"month\"}",
        );
    }
    assert!(decided_at_line > 0, "no request was decided at the line");
    // Each client of each race stops after as many 402s in a row.
    let least = RACES * nodes.len() * CLIENTS_PER_NODE * REFUSALS_IN_A_ROW;
    assert!(refused as usize >= least, "{refused} refusals counted, {least} at least were answered");
    drop((nodes, control));
    let _ = std::fs::remove_dir_all(&dir);
}
