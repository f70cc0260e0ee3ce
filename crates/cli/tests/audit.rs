//! Black-box tests of the audit log through the `recovea` binary: every kind of admin change leaves
//! its row (`GET /admin/v1/audit`, `recovea admin audit`) and a log line, and no secret reaches
//! either; and the admin CLI's smaller commands (`caps get`, clearing a limit or a webhook, the
//! hard stop's two spellings).

use std::path::Path;

use http::{Method, StatusCode};
use recovea_testkit::MockProvider;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Serve, temp_dir};

const TOKEN: &str = "audit-test-token-0123456789abcdef0123456";
const PROVIDER_KEY: &str = "sk-managed-audit-0123456789abcdef";

fn start(data_dir: &Path, mock_url: &str, log: &Path) -> Serve {
    let log = std::fs::File::create(log).expect("log file");
    Serve::start_logging(data_dir, mock_url, &["--admin-token", TOKEN], &[], log)
}

async fn admin(serve: &Serve, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, answer) = serve.admin_call(TOKEN, method, path, body).await;
    assert!(status.is_success(), "{path}: {status} {answer}");
    answer
}

/// The latest row of the audit log, checked to be the admin's, from this machine.
async fn latest(serve: &Serve) -> Value {
    let page = admin(serve, Method::GET, "/audit?limit=1000", None).await;
    let entry = page["entries"].as_array().and_then(|e| e.last()).cloned().expect("an entry");
    assert!(entry["id"].as_str().is_some_and(|id| id.starts_with("aud_") && id.len() == 24), "{entry}");
    assert!(entry["at"].as_str().is_some_and(|at| at.ends_with('Z')), "{entry}");
    assert_eq!(entry["auth"], "admin_token");
    assert!(entry["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{entry}");
    entry
}

/// An entry's what: action, kind, object id, org id, before and after.
fn what(entry: &Value) -> Value {
    json!([
        entry["action"],
        entry["object_kind"],
        entry["object_id"],
        entry["org_id"],
        entry["before"],
        entry["after"]
    ])
}

fn without_secret(mut key: Value) -> Value {
    key.as_object_mut().expect("an object").remove("secret");
    key
}

fn admin_cli(serve: &Serve, args: &[&str]) -> String {
    serve.admin_cli(TOKEN, args)
}

fn admin_cli_json(serve: &Serve, args: &[&str]) -> Value {
    serde_json::from_str(&admin_cli(serve, args)).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_change_leaves_its_row_and_no_secret() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("audit-rows");
    let log = dir.join("serve.log");
    let serve = start(&dir.join("data"), &mock.url(), &log);
    let mut changes = 0;

    let org = admin(&serve, Method::POST, "/orgs", Some(json!({"name": "acme"}))).await;
    let org_id = org["id"].as_str().expect("id").to_owned();
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["create", "org", org_id, org_id, null, org]));

    let key = admin(
        &serve,
        Method::POST,
        &format!("/orgs/{org_id}/keys"),
        Some(json!({"name": "k", "requests_per_minute": 10})),
    )
    .await;
    let (key_id, secret) =
        (key["id"].as_str().expect("id").to_owned(), key["secret"].as_str().expect("secret").to_owned());
    let key = without_secret(key);
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["create", "key", key_id, org_id, null, key]));

    let limited = admin(
        &serve,
        Method::PATCH,
        &format!("/keys/{key_id}"),
        Some(json!({"requests_per_minute": null, "tokens_per_minute": 500})),
    )
    .await;
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["update", "key", key_id, org_id, key, limited]));

    let revoked = admin(&serve, Method::POST, &format!("/keys/{key_id}/revoke"), None).await;
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["revoke", "key", key_id, org_id, limited, revoked]));

    let provider = json!({"kind": "openai", "api_key": PROVIDER_KEY});
    let set = admin(&serve, Method::PUT, &format!("/orgs/{org_id}/providers/openai"), Some(provider)).await;
    changes += 1;
    let entry = latest(&serve).await;
    assert_eq!(what(&entry), json!(["set", "provider", "openai", org_id, null, set]));
    // Byte-exact where stable: the credential is its hint, never the key.
    assert_eq!(
        entry["after"].to_string(),
        r#"{"base_url":null,"fallback_input_per_mtok_usd":null,"fallback_output_per_mtok_usd":null,"key_hint":"...cdef","kind":"openai","name":"openai","price_namespace":null}"#
    );
    // A password in a base URL is a secret like the key: the answer and the audit log show neither.
    let replacement = json!({"kind": "openai", "api_key": "sk-replaced-9876543210",
                             "base_url": "https://proxy-user:hunter2@llm.example.com"});
    let replaced =
        admin(&serve, Method::PUT, &format!("/orgs/{org_id}/providers/openai"), Some(replacement)).await;
    changes += 1;
    assert_eq!(replaced["base_url"], "https://***@llm.example.com");
    let entry = latest(&serve).await;
    assert_eq!(what(&entry), json!(["set", "provider", "openai", org_id, set, replaced]));
    let listed = admin(&serve, Method::GET, &format!("/orgs/{org_id}/providers"), None).await;
    assert!(!format!("{entry}{listed}").contains("hunter2"), "{entry} {listed}");

    let cap = admin(
        &serve,
        Method::POST,
        &format!("/orgs/{org_id}/caps"),
        Some(json!({"scope": "organization", "window": "month", "limit_usd": "25", "hard_stop": true})),
    )
    .await;
    let cap_id = cap["id"].as_str().expect("id").to_owned();
    changes += 1;
    let entry = latest(&serve).await;
    assert_eq!(what(&entry), json!(["create", "cap", cap_id, org_id, null, cap]));
    assert_eq!(
        entry["after"].to_string(),
        format!(
            r#"{{"alert_at":[0.5,0.8,1.0],"alert_webhook":null,"created_at":{},"hard_stop":true,"id":"{cap_id}","key_id":null,"limit_usd":"25.00","org_id":"{org_id}","scope":"organization","window":"month"}}"#,
            cap["created_at"]
        )
    );
    let patched = admin(
        &serve,
        Method::PATCH,
        &format!("/caps/{cap_id}"),
        Some(json!({"limit_usd": "30", "hard_stop": false})),
    )
    .await;
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["update", "cap", cap_id, org_id, cap, patched]));
    admin(&serve, Method::DELETE, &format!("/caps/{cap_id}"), None).await;
    changes += 1;
    assert_eq!(what(&latest(&serve).await), json!(["delete", "cap", cap_id, org_id, patched, null]));

    let price = json!({"input_per_mtok_usd": "1.5", "output_per_mtok_usd": "2", "kind": "openai"});
    let put = admin(&serve, Method::PUT, "/prices/house-model", Some(price)).await;
    let revision = put["revision"].as_u64().expect("revision");
    changes += 1;
    let house = json!({"input_per_mtok_usd": "1.5", "output_per_mtok_usd": "2", "kind": "openai", "revision": revision});
    assert_eq!(what(&latest(&serve).await), json!(["set", "price", "house-model", null, null, house]));
    let fallback = json!({"input_per_mtok_usd": "20", "output_per_mtok_usd": "80"});
    admin(&serve, Method::PUT, "/fallback-prices/anthropic", Some(fallback)).await;
    changes += 1;
    let anthropic = json!({"input_per_mtok_usd": "20", "output_per_mtok_usd": "80", "kind": null, "revision": revision + 1});
    assert_eq!(
        what(&latest(&serve).await),
        json!(["set", "fallback_price", "anthropic", null, null, anthropic])
    );
    let file = json!({"models": {
        "house-model": {"input_per_mtok_usd": "3", "output_per_mtok_usd": "4", "kind": "openai"},
        "other-model": {"input_per_mtok_usd": "5", "output_per_mtok_usd": "6", "kind": "anthropic"}}});
    let auth = format!("Bearer {TOKEN}");
    let imported = harness::call(
        Method::POST,
        &format!("{}/admin/v1/price-imports", serve.admin),
        &[("authorization", &auth)],
        Some(file),
    )
    .await;
    assert_eq!(imported.status, StatusCode::OK, "{}", String::from_utf8_lossy(&imported.body));
    changes += 1;
    let r = revision + 2;
    assert_eq!(
        what(&latest(&serve).await),
        json!(["import", "prices", "import", null,
            {"model:house-model": house, "model:other-model": null},
            {"model:house-model": {"input_per_mtok_usd": "3", "output_per_mtok_usd": "4", "kind": "openai", "revision": r},
             "model:other-model": {"input_per_mtok_usd": "5", "output_per_mtok_usd": "6", "kind": "anthropic", "revision": r}}])
    );
    admin(&serve, Method::DELETE, "/fallback-prices/anthropic", None).await;
    changes += 1;
    assert_eq!(
        what(&latest(&serve).await),
        json!(["delete", "fallback_price", "anthropic", null, anthropic, null])
    );
    admin(&serve, Method::DELETE, "/prices/other-model", None).await;
    changes += 1;
    let other =
        json!({"input_per_mtok_usd": "5", "output_per_mtok_usd": "6", "kind": "anthropic", "revision": r});
    assert_eq!(what(&latest(&serve).await), json!(["delete", "price", "other-model", null, other, null]));

    // A refused change leaves no row; reads leave none.
    let (status, _) = serve.admin_call(TOKEN, Method::DELETE, &format!("/caps/{cap_id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let page = admin(&serve, Method::GET, "/audit?limit=1000", None).await;
    let entries = page["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), changes);
    let versions: Vec<u64> = entries.iter().filter_map(|e| e["version"].as_u64()).collect();
    assert_eq!(versions.len(), changes);
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "in the order of the changes: {versions:?}");

    // Filters and pages.
    let keys = admin(&serve, Method::GET, &format!("/audit?org_id={org_id}&object_kind=key"), None).await;
    let actions: Vec<&str> =
        keys["entries"].as_array().expect("entries").iter().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(actions, ["create", "update", "revoke"]);
    let revoke = admin(&serve, Method::GET, "/audit?action=revoke", None).await;
    assert_eq!(revoke["entries"][0]["object_id"], key_id.as_str());
    let first = admin(&serve, Method::GET, "/audit?limit=2", None).await;
    let cursor = first["next_cursor"].as_str().expect("a next page");
    assert_eq!(cursor, versions[1].to_string(), "the cursor is the last entry's version");
    let second = admin(&serve, Method::GET, &format!("/audit?limit=2&cursor={cursor}"), None).await;
    assert_eq!(second["entries"][0]["id"], entries[2]["id"]);
    let from = entries[0]["at"].as_str().expect("at");
    let timed =
        admin(&serve, Method::GET, &format!("/audit?from={}&to={}", encode(from), encode(from)), None).await;
    assert_eq!(timed["entries"], json!([]), "from is inclusive, to exclusive: an empty range");
    let (status, bad) = serve.admin_call(TOKEN, Method::GET, "/audit?limit=1001", None).await;
    assert_eq!(
        (status, bad["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("limit: expected 1 to 1000"))
    );
    let (status, bad) = serve.admin_call(TOKEN, Method::GET, "/audit?object_kind=Key%21", None).await;
    assert_eq!(
        (status, bad["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("object_kind: expected a word such as key"))
    );
    let (status, _) = serve.admin_call(TOKEN, Method::POST, "/audit", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    // No secret anywhere: not the key's secret, not the provider keys, in no row and no log line.
    let whole = serde_json::to_string(&page).expect("JSON");
    let log = std::fs::read_to_string(&log).expect("log");
    for secret in [secret.as_str(), PROVIDER_KEY, "sk-replaced-9876543210", TOKEN] {
        assert!(!whole.contains(secret), "a secret in the audit log");
        assert!(!log.contains(secret), "a secret in the log");
    }
    // Each change is one line at info, naming what and who.
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("admin change")).collect();
    assert_eq!(lines.len(), changes, "{log}");
    assert!(lines.iter().all(|l| l.contains(" INFO ") && l.contains("auth=admin_token")), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("action=revoke") && l.contains("object_kind=key") && l.contains(&key_id)),
        "{lines:?}"
    );

    // The CLI: a table by default, the API's answer with --json, the same filters.
    let table = admin_cli(&serve, &["audit", "--org", &org_id, "--object-kind", "key"]);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 4, "{table}");
    assert!(rows[0].starts_with("AT") && rows[0].contains("ACTION") && rows[0].contains("CLIENT"), "{table}");
    assert!(
        rows[3].contains("revoke") && rows[3].contains(&key_id) && rows[3].contains("admin_token"),
        "{table}"
    );
    let paged = admin_cli(&serve, &["audit", "--limit", "1"]);
    assert!(paged.lines().last().is_some_and(|l| l.starts_with("more: --cursor ")), "{paged}");
    let json = admin_cli_json(&serve, &["audit", "--json", "--action", "revoke"]);
    assert_eq!(json["entries"], revoke["entries"]);
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value.replace(':', "%3A").replace('+', "%2B")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_gets_caps_and_clears_limits_and_webhooks() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("audit-cli");
    let serve = start(&dir.join("data"), &mock.url(), &dir.join("serve.log"));
    let org = admin_cli_json(&serve, &["orgs", "create", "--name", "acme"]);
    let org_id = org["id"].as_str().expect("id");

    let key = admin_cli_json(
        &serve,
        &[
            "keys",
            "create",
            "--org",
            org_id,
            "--name",
            "k",
            "--requests-per-minute",
            "5",
            "--tokens-per-minute",
            "900",
        ],
    );
    let key_id = key["id"].as_str().expect("id");
    let cleared = admin_cli_json(&serve, &["keys", "update", key_id, "--requests-per-minute", "none"]);
    assert_eq!(
        (cleared["requests_per_minute"].clone(), cleared["tokens_per_minute"].clone()),
        (Value::Null, json!(900))
    );
    let set = admin_cli_json(&serve, &["keys", "update", key_id, "--tokens-per-minute", "1000"]);
    assert_eq!(set["tokens_per_minute"], 1000);

    // The hard stop: a switch on create, or a value; the same on update.
    let create = [
        "caps",
        "create",
        "--org",
        org_id,
        "--window",
        "day",
        "--limit",
        "5",
        "--alert-webhook",
        "https://hooks.example.com/a",
    ];
    let switched = admin_cli_json(&serve, &[&create[..], &["--hard-stop"]].concat());
    assert_eq!(switched["hard_stop"], true);
    let off = admin_cli_json(&serve, &create);
    assert_eq!(off["hard_stop"], false);
    let valued = admin_cli_json(&serve, &[&create[..], &["--hard-stop", "false"]].concat());
    assert_eq!(valued["hard_stop"], false);
    let cap_id = switched["id"].as_str().expect("id");
    let updated = admin_cli_json(&serve, &["caps", "update", cap_id, "--hard-stop", "false"]);
    assert_eq!(updated["hard_stop"], false);
    let updated = admin_cli_json(&serve, &["caps", "update", cap_id, "--hard-stop"]);
    assert_eq!(updated["hard_stop"], true);

    let unhooked = admin_cli_json(&serve, &["caps", "update", cap_id, "--alert-webhook", "none"]);
    assert_eq!(unhooked["alert_webhook"], Value::Null);
    let got = admin_cli_json(&serve, &["caps", "get", cap_id]);
    assert_eq!(got, unhooked);
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
