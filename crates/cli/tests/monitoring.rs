//! Black-box tests of what an operator watches: the access log (one line per request, in text and
//! JSON, with no secret and no prompt), `/metrics` as valid Prometheus text after real traffic
//! through the mock provider, and the alerting rules and dashboard shipped in `deploy/`, which must
//! load in promtool and query only metrics the binary exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::{Behaviour, MockProvider};
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Serve, Tenant, call, temp_dir};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456";
const PROVIDER_KEY: &str = "sk-managed-monitoring-0123456789";
/// Text of the prompt that must never reach the log.
const PROMPT: &str = "the-secret-plan-of-the-customer";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An organization with an openai credential and a key on `serve`: its id, the key's id and secret.
async fn tenant(serve: &Serve) -> Tenant {
    serve.organization(TOKEN, &[("openai", PROVIDER_KEY)]).await
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}]})
}

/// One chat request with `secret`: its status and `x-request-id`.
async fn ask(serve: &Serve, secret: &str, body: Value) -> (StatusCode, String) {
    let auth = format!("Bearer {secret}");
    let answer = call(
        Method::POST,
        &format!("{}/v1/chat/completions", serve.gateway),
        &[("authorization", &auth)],
        Some(body),
    )
    .await;
    let id = answer.headers.get("x-request-id").expect("x-request-id").to_str().expect("ascii").to_owned();
    (answer.status, id)
}

/// The receipt of `request_id`, once the ledger has it.
async fn receipt_of(serve: &Serve, org_id: &str, request_id: &str) -> Value {
    harness::eventually(harness::DEADLINE, &format!("the receipt of {request_id}"), || async {
        let (_, receipts) =
            serve.admin_call(TOKEN, Method::GET, &format!("/orgs/{org_id}/receipts?limit=100"), None).await;
        receipts["receipts"]
            .as_array()
            .and_then(|all| all.iter().find(|r| r["request_id"] == request_id).cloned())
    })
    .await
}

/// Arms a monthly cap of a millionth of a dollar on the organization and asks until it refuses:
/// the request id of its first 402.
async fn arm_a_spent_cap(serve: &Serve, org_id: &str, secret: &str) -> String {
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "0.000001", "hard_stop": true});
    let (status, _) = serve.admin_call(TOKEN, Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await;
    assert_eq!(status, StatusCode::CREATED);
    harness::eventually(harness::DEADLINE, "the armed cap refusing", || async {
        let (status, request_id) = ask(serve, secret, chat("gpt-4o-mini", false)).await;
        (status == StatusCode::PAYMENT_REQUIRED).then_some(request_id)
    })
    .await
}

/// `serve` with its log going to a file in `dir`.
fn serve_logging(dir: &Path, mock: &str, extra: &[&str]) -> (Serve, PathBuf) {
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut flags = vec!["--admin-token", TOKEN];
    flags.extend(extra);
    (Serve::start_logging(dir, mock, &flags, &[], log), log_path)
}

/// The log's lines that mention `request_id` (or any text), once there are `count` of them (the log
/// is written by a thread of its own, a moment after the answer).
async fn lines_naming(log: &Path, request_id: &str, count: usize) -> Vec<String> {
    harness::eventually(
        harness::DEADLINE,
        &format!("{count} line(s) naming {request_id} in {log:?}"),
        || async {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<String> =
                text.lines().filter(|l| l.contains(request_id)).map(str::to_owned).collect();
            (lines.len() >= count).then_some(lines)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_writes_one_json_access_line_with_plain_strings_and_no_secret() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("access-json");
    let (serve, log) = serve_logging(&dir, &mock.url(), &["--log-format", "json"]);
    let Tenant { org_id, key_id, secret } = tenant(&serve).await;

    let (status, admitted) = ask(&serve, &secret, chat("gpt-4o-mini", false)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, streamed) = ask(&serve, &secret, chat("gpt-4o-mini", true)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused) = ask(&serve, "rk_not_a_key_at_all", chat("gpt-4o-mini", false)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    for (request_id, stream) in [(&admitted, false), (&streamed, true)] {
        let lines = lines_naming(&log, request_id, 1).await;
        assert_eq!(lines.len(), 1, "one line per request: {lines:?}");
        let line: Value = serde_json::from_str(&lines[0]).expect("a JSON line");
        assert_eq!(line["target"], "recovea::access", "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["request_id"], request_id.as_str(), "a plain string: {line}");
        assert_eq!(line["org_id"], org_id.as_str(), "{line}");
        assert_eq!(line["key_id"], key_id.as_str(), "{line}");
        assert_eq!(line["route"], "openai", "{line}");
        assert_eq!(line["provider"], "openai", "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["outcome"], "forwarded", "{line}");
        assert!(line["model"].as_str().is_some_and(|m| m.starts_with("gpt-4o-mini")), "{line}");
        assert!(line["input_tokens"].as_u64().is_some_and(|n| n > 0), "{line}");
        assert!(line["output_tokens"].as_u64().is_some_and(|n| n > 0), "{line}");
        assert!(line["cached_input_tokens"].is_u64(), "{line}");
        let cost = line["cost_usd"].as_str().expect("the cost as the receipt's decimal string");
        assert!(cost.parse::<f64>().is_ok_and(|c| c > 0.0) && !cost.contains('"'), "{line}");
        assert!(line["ttfb_ms"].as_f64().is_some_and(|t| t >= 0.0), "{line}");
        let (ttfb, total) =
            (line["ttfb_ms"].as_f64().expect("ttfb"), line["total_ms"].as_f64().expect("total"));
        assert!(total >= ttfb, "{line}");
        // The receipt says the same.
        let receipt = receipt_of(&serve, &org_id, request_id).await;
        for field in ["cost_usd", "input_tokens", "output_tokens", "cached_input_tokens", "model", "status"] {
            assert_eq!(receipt[field], line[field], "{field}, stream {stream}: {line} {receipt}");
        }
    }

    let lines = lines_naming(&log, &refused, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line: Value = serde_json::from_str(&lines[0]).expect("a JSON line");
    assert_eq!(
        (line["status"].as_u64(), line["outcome"].as_str()),
        (Some(401), Some("invalid_key")),
        "{line}"
    );
    assert!(line.get("org_id").is_none() && line.get("cost_usd").is_none(), "{line}");
    assert!(line["total_ms"].is_f64(), "{line}");

    // Refused by an armed cap once the body was read: the line names the model it asked for.
    let capped = arm_a_spent_cap(&serve, &org_id, &secret).await;
    let lines = lines_naming(&log, &capped, 1).await;
    let line: Value = serde_json::from_str(&lines[0]).expect("a JSON line");
    assert_eq!(
        (line["status"].as_u64(), line["outcome"].as_str()),
        (Some(402), Some("budget_exceeded")),
        "{line}"
    );
    assert_eq!(
        (line["model"].as_str(), line["org_id"].as_str()),
        (Some("gpt-4o-mini"), Some(org_id.as_str())),
        "{line}"
    );
    assert!(line.get("cost_usd").is_none(), "no receipt, no cost: {line}");

    let text = std::fs::read_to_string(&log).expect("log");
    for secret_text in [secret.as_str(), PROVIDER_KEY, PROMPT, TOKEN, "rk_not_a_key_at_all"] {
        assert!(!text.contains(secret_text), "the log shows {secret_text:?}:\n{text}");
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/metrics` shows every organization's totals: with `--metrics-token`, only a scrape presenting
/// it gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_metrics_token_only_a_scrape_presenting_it_reads_the_metrics() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("metrics-token");
    let token = "scrape-0123456789abcdef0123456789abcdef";
    let (serve, _log) = serve_logging(&dir, &mock.url(), &["--metrics-token", token]);
    let url = format!("{}/metrics", serve.gateway);
    for presented in [None, Some("Bearer wrong"), Some("Basic c2NyYXBl")] {
        let headers: Vec<(&str, &str)> = presented.map(|p| ("authorization", p)).into_iter().collect();
        let answer = call(Method::GET, &url, &headers, None).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{presented:?}");
        assert_eq!(answer.headers["www-authenticate"], "Bearer");
        assert!(!String::from_utf8_lossy(&answer.body).contains("recovea_"), "nothing of the metrics");
    }
    let bearer = format!("Bearer {token}");
    let answer = call(Method::GET, &url, &[("authorization", &bearer)], None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&answer.body).contains("recovea_requests_total"));
    // The node's other endpoints are not behind it.
    assert_eq!(
        call(Method::GET, &format!("{}/healthz", serve.gateway), &[], None).await.status,
        StatusCode::OK
    );
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--metrics-listen`, `/metrics` is served on that address alone: the gateway's port, the
/// one customers reach, no longer answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_moved_to_an_address_of_their_own_leave_the_gateways_port() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("metrics-listen");
    let (serve, _log) = serve_logging(&dir, &mock.url(), &["--metrics-listen", "127.0.0.1:0"]);
    let banner = serve.stdout.iter().find_map(|l| l.strip_prefix("recovea metrics: ")).expect("its banner");
    let moved = call(Method::GET, banner, &[], None).await;
    assert_eq!(moved.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&moved.body).contains("recovea_requests_total"));
    let other = banner.replace("/metrics", "/v1/chat/completions");
    assert_eq!(
        call(Method::GET, &other, &[], None).await.status,
        StatusCode::NOT_FOUND,
        "only /metrics there"
    );
    let gateway = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await;
    assert_eq!(gateway.status, StatusCode::NOT_FOUND);
    assert!(!String::from_utf8_lossy(&gateway.body).contains("recovea_"), "nothing of the metrics");
    assert_eq!(
        call(Method::GET, &format!("{}/healthz", serve.gateway), &[], None).await.status,
        StatusCode::OK
    );
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every refused admin call is logged at `warn` with the caller's address, never with what it
/// presented; past ten wrong tokens an address gets `429`, and the right token from it is still let
/// in (behind a proxy, every client shares one address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_admin_tokens_are_logged_and_limited_per_address_and_the_right_one_always_passes() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("admin-refused");
    let (serve, log) = serve_logging(&dir, &mock.url(), &[]);
    let wrong = "not-the-admin-token-but-a-guess-1234";
    for attempt in 0..10 {
        let (status, _) = serve.admin_call(wrong, Method::GET, "/orgs", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "wrong token {attempt}");
    }
    let answer = call(
        Method::GET,
        &format!("{}/admin/v1/orgs", serve.admin),
        &[("authorization", &format!("Bearer {wrong}"))],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    // Ten a minute: the next in six seconds from the first, less what the ten took.
    let seconds = answer.headers["retry-after"].to_str().expect("ascii");
    assert!(["5", "6"].contains(&seconds), "retry-after: {seconds}");
    assert_eq!(
        String::from_utf8_lossy(&answer.body),
        "{\n  \"error\": {\n    \"message\": \"Too many wrong admin tokens from this address. Retry in "
            .to_owned()
            + seconds
            + " s.\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"too_many_wrong_tokens\"\n  }\n}"
    );
    let (status, _) = serve.admin_call(TOKEN, Method::GET, "/orgs", None).await;
    assert_eq!(status, StatusCode::OK, "the right token is never refused");
    let lines = lines_naming(&log, "a wrong admin token was refused", 11).await;
    for line in &lines {
        assert!(line.contains(" WARN ") && line.contains("client=127.0.0.1"), "{line}");
    }
    assert!(lines[10].contains("too many from this address"), "{}", lines[10]);
    assert!(!std::fs::read_to_string(&log).expect("log").contains(wrong), "the token is never logged");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model name is the client's text: one that reads as several fields is quoted on the access
/// line, and one that would break the line or colour a terminal is refused before any line names
/// it. No line of the log is one the client wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_forge_a_field_or_a_line_of_the_text_log() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("access-forged");
    let (serve, log) = serve_logging(&dir, &mock.url(), &[]);
    let Tenant { secret, .. } = tenant(&serve).await;
    let forged_field = "gpt-4o-mini org_id=org_VICTIM cost_usd=1234.00";
    let (status, id) = ask(&serve, &secret, chat(forged_field, false)).await;
    assert_eq!(status, StatusCode::OK);
    let line = lines_naming(&log, &id, 1).await.remove(0);
    assert!(line.contains(r#" model="gpt-4o-mini org_id=org_VICTIM cost_usd=1234.00" "#), "{line}");
    // Read as logfmt, outside the quoted value: one org_id field and one cost, the gateway's.
    let outside = line.replace(r#""gpt-4o-mini org_id=org_VICTIM cost_usd=1234.00""#, "");
    assert_eq!(outside.matches(" org_id=").count(), 1, "{line}");
    assert_eq!(outside.matches(" cost_usd=").count(), 1, "{line}");

    let forged_line = "gpt-4o-mini\n2026-12-06T00:00:00.000000Z  INFO recovea::access: request org_id=org_VICTIM cost_usd=1234.00";
    let (status, id) = ask(&serve, &secret, chat(forged_line, false)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, id_ansi) = ask(&serve, &secret, chat("gpt-4o-mini\u{1b}[2J", false)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    lines_naming(&log, &id, 1).await;
    lines_naming(&log, &id_ansi, 1).await;
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(!text.contains('\u{1b}'), "no escape sequence reaches the log");
    assert!(
        text.lines().all(|l| !l.starts_with("2026-12-06T00:00:00.000000Z")),
        "no line the client wrote:\n{text}"
    );
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_access_line_has_no_colour_codes_and_the_switch_turns_it_off() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("access-text");
    let (serve, log) = serve_logging(&dir, &mock.url(), &[]);
    let Tenant { secret, .. } = tenant(&serve).await;
    let (status, id) = ask(&serve, &secret, chat("gpt-4o-mini", false)).await;
    assert_eq!(status, StatusCode::OK);
    let lines = lines_naming(&log, &id, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(!line.contains('\u{1b}'), "colour codes in a file: {line:?}");
    assert!(line.contains(" INFO recovea::access: request "), "{line}");
    for field in [
        format!("request_id={id} "),
        "status=200".into(),
        "outcome=forwarded ".into(),
        "route=openai ".into(),
    ] {
        assert!(line.contains(&field), "{field} in {line}");
    }
    assert!(!line.contains("request_id=\""), "{line}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);

    let dir = temp_dir("access-off");
    let (serve, log) = serve_logging(&dir, &mock.url(), &["--access-log", "false"]);
    let Tenant { secret, .. } = tenant(&serve).await;
    let (status, id) = ask(&serve, &secret, chat("gpt-4o-mini", false)).await;
    assert_eq!(status, StatusCode::OK);
    // The request is still counted: once its duration is in the metrics, its line would have been
    // written before (both happen in the same call), so its absence from the flushed log is final.
    let scraped = scrape(&serve).await;
    assert!(
        scraped.contains(
            "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"forwarded\"} 1\n"
        ),
        "{scraped}"
    );
    // Stopped in order, so that the log is written out before it is read.
    let mut serve = serve;
    assert!(serve.process.terminate(Duration::from_secs(20)).is_some(), "serve did not stop");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("recovea::access"), "{text}");
    assert!(!text.contains(&id), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

async fn scrape(serve: &Serve) -> String {
    let answer = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await;
    assert_eq!(answer.status, StatusCode::OK);
    String::from_utf8(answer.body.to_vec()).expect("utf-8")
}

/// Parses the text exposition format strictly enough to fail on what Prometheus would refuse:
/// every sample of a family declared once by `# TYPE` before it, a valid name, well-formed labels,
/// a number for a value; a histogram's buckets cumulative and ending in `+Inf` equal to `_count`.
/// Returns every sample name.
fn parse_exposition(text: &str) -> BTreeSet<String> {
    let mut types: std::collections::HashMap<String, String> = Default::default();
    let mut names = BTreeSet::new();
    let mut last_bucket: Option<(String, f64)> = None;
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for line in text.lines() {
        assert!(!line.is_empty(), "an empty line in:\n{text}");
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(valid_name(name), "{line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(types.insert(name.to_owned(), kind.to_owned()).is_none(), "declared twice: {line}");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.starts_with('#'), "{line}");
        let (series, value) = line.rsplit_once(' ').expect("a sample: name value");
        assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "not a number: {line}");
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').expect("labels closed")),
            None => (series, ""),
        };
        assert!(valid_name(name), "{line}");
        let mut rest = labels;
        let mut le = None;
        while !rest.is_empty() {
            let (label, after) = rest.split_once("=\"").expect("label=\"value\"");
            assert!(valid_name(label), "{line}");
            let end = after.find('"').expect("a closed value");
            if label == "le" {
                le = Some(after[..end].to_owned());
            }
            rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        assert!(types.contains_key(family), "a sample before its # TYPE: {line}");
        if name.ends_with("_bucket") {
            let series_key = series.split(",le=").next().expect("series").to_owned();
            let count: f64 = value.parse().expect("a count");
            if let Some((previous, n)) = &last_bucket
                && *previous == series_key
            {
                assert!(count >= *n, "buckets not cumulative: {line}");
            }
            last_bucket = if le.as_deref() == Some("+Inf") { None } else { Some((series_key, count)) };
        }
        names.insert(name.to_owned());
    }
    for (family, kind) in &types {
        if kind == "histogram" {
            names.extend(["_bucket", "_sum", "_count"].map(|s| format!("{family}{s}")));
        } else {
            names.insert(family.clone());
        }
    }
    names
}

/// Every `recovea_…` metric name in `text` (a query, a rules file, a dashboard).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("recovea_") {
        let before = rest[..at].chars().last();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        // Not inside another word, a path or a label value.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || "_-/.\"".contains(c)) {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The queries of the rules file (every `expr:`) and of the dashboard (every target's `expr`).
fn queries() -> Vec<(String, String)> {
    let root = repo_root();
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/recovea-rules.yml")).expect("rules");
    let mut queries = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(expr) = line.trim_start().strip_prefix("expr:") else { continue };
        let mut expr = expr.trim().to_owned();
        if expr == "|" {
            expr.clear();
            while let Some(next) = lines.peek().filter(|l| l.starts_with("            ")) {
                expr.push_str(next.trim());
                expr.push(' ');
                lines.next();
            }
        }
        queries.push(("rules".to_owned(), expr));
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/recovea-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let title = panel["title"].as_str().expect("title");
            queries.push((
                format!("dashboard panel {title:?}"),
                target["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().expect("variables") {
        if let Some(query) = variable["query"].as_str() {
            queries.push(("dashboard variable".to_owned(), query.to_owned()));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_every_metric_the_rules_and_dashboard_query_is_exported() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("monitoring-metrics");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let Tenant { org_id, secret, .. } = tenant(&serve).await;
    // Traffic of every kind the dashboard shows: admitted (a priced model and one the price table
    // does not know), streamed, refused for its key, refused by an armed cap.
    for body in [chat("gpt-4o-mini", false), chat("gpt-4o-mini", true), chat("a-model-without-price", false)]
    {
        assert_eq!(ask(&serve, &secret, body).await.0, StatusCode::OK);
    }
    assert_eq!(ask(&serve, "rk_unknown", chat("gpt-4o-mini", false)).await.0, StatusCode::UNAUTHORIZED);
    // The provider's own error, forwarded as it came.
    mock.script(Behaviour::error(503));
    assert_eq!(ask(&serve, &secret, chat("gpt-4o-mini", false)).await.0, StatusCode::SERVICE_UNAVAILABLE);
    arm_a_spent_cap(&serve, &org_id, &secret).await;

    let text = scrape(&serve).await;
    let exported = parse_exposition(&text);
    // Prometheus's own parser and linter agree.
    let mut check = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), text.as_bytes()).expect("write");
    let checked = check.wait_with_output().expect("promtool");
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    for line in [
        "recovea_cap_refusals_total{code=\"budget_exceeded\",scope=\"organization\",window=\"month\"} 1\n",
        "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"invalid_key\"} 1\n",
        "recovea_request_duration_seconds_count{provider=\"openai\",outcome=\"budget_exceeded\"} 1\n",
        "recovea_upstream_ttfb_seconds_count{provider=\"openai\",outcome=\"forwarded\"} ",
        "recovea_upstream_responses_total{provider=\"openai\",class=\"5xx\"} 1\n",
        "recovea_upstream_responses_total{provider=\"openai\",class=\"2xx\"} ",
        "recovea_upstream_responses_total{provider=\"anthropic\",class=\"5xx\"} 0\n",
        "recovea_tokens_total{provider=\"openai\",model=\"gpt-4o-mini\",kind=\"input\"} ",
        "recovea_cost_nanodollars_total{provider=\"openai\",model=\"other\"} ",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    // No label carries an organization or a key, nor a model outside the price table.
    for private in [org_id.as_str(), "a-model-without-price", "key_id", "org_id"] {
        assert!(!text.contains(private), "{private} in:\n{text}");
    }
    let mut unknown = Vec::new();
    let queries = queries();
    assert!(queries.len() > 20, "{queries:?}");
    for (place, query) in &queries {
        for name in metric_names(query) {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name} in {query}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "not exported by the binary:\n{}\n\nexported: {exported:?}",
        unknown.join("\n")
    );
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_metric_names_of_a_query_are_found() {
    let names = metric_names(
        "sum by (x) (rate(recovea_a_total{y=\"recovea_not\"}[5m])) / recovea_b_bucket + other_recovea_c",
    );
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["recovea_a_total", "recovea_b_bucket"]);
}

/// `promtool`, installed by `scripts/install-promtool` when missing; never skipped.
fn promtool() -> Command {
    let found =
        Command::new("promtool").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !found.is_ok_and(|s| s.success()) {
        let script = repo_root().join("scripts/install-promtool");
        let status = Command::new(&script).status().expect("scripts/install-promtool runs");
        assert!(status.success(), "promtool is missing and {} could not install it", script.display());
    }
    Command::new("promtool")
}

#[test]
fn the_alerting_rules_load_in_promtool_and_pass_their_unit_tests() {
    let dir = repo_root().join("deploy/prometheus");
    for args in [["check", "rules", "recovea-rules.yml"], ["test", "rules", "recovea-rules.test.yml"]] {
        let run = promtool().args(args).current_dir(&dir).output().expect("promtool");
        let said =
            format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(run.status.success(), "promtool {args:?}: {said}");
    }
}

/// A request whose body names no model (and whose answer names none either) has no price an
/// operator could set: its receipt says so, and the log raises no alarm about a model without a
/// price (a request naming an unknown model does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_no_model_raises_no_price_alarm() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("no-model-alarm");
    let (serve, log) = serve_logging(&dir, &mock.url(), &[]);
    let Tenant { org_id, secret, .. } = tenant(&serve).await;
    let usage = json!({"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7});
    let answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": usage});
    mock.script(Behaviour::default().body(answer));
    let (status, id) = ask(&serve, &secret, json!({"messages": [{"role": "user", "content": PROMPT}]})).await;
    assert_eq!(status, StatusCode::OK);
    let receipt = receipt_of(&serve, &org_id, &id).await;
    assert_eq!(receipt["model"], Value::Null, "{receipt}");
    lines_naming(&log, &id, 1).await;
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(!text.contains("ALARM"), "no alarm for a request without a model ({receipt}): {text}");
    let (status, id) = ask(&serve, &secret, chat("a-model-nobody-priced", false)).await;
    assert_eq!(status, StatusCode::OK);
    lines_naming(&log, &id, 1).await;
    lines_naming(&log, "ALARM: a model has no price", 1).await;
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
