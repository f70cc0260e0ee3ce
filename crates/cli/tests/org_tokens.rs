//! Black-box tests of organization tokens through the `recovea` binary: issued (API and CLI),
//! shown once, lapsing at their expiry or revocation like a wrong token; every operation the admin
//! API documents (`openapi.json`, read from the running control plane, so that no route can be
//! left out) called by the operator, an organization's admin, its viewer and another
//! organization's admin, each status checked and each refusal's bytes; and the audit log naming
//! who made each change, an organization reading its own trail.

use std::path::Path;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use recovea_core::timestamp::Timestamp;
use recovea_testkit::MockProvider;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{Serve, temp_dir};

const TOKEN: &str = "org-tokens-test-token-0123456789abcdef01";

/// The 403 of what is the operator's alone, to every organization token.
const OPERATOR_ONLY: &str = r#"{
  "error": {
    "message": "Only the operator may do this.",
    "type": "permission_error",
    "param": null,
    "code": "permission_denied"
  }
}"#;

/// The 403 of a viewer's change.
const READ_ONLY: &str = r#"{
  "error": {
    "message": "This token's role (viewer) may only read.",
    "type": "permission_error",
    "param": null,
    "code": "permission_denied"
  }
}"#;

fn start(data_dir: &Path, mock_url: &str, log: &Path) -> Serve {
    let log = std::fs::File::create(log).expect("log file");
    Serve::start_logging(data_dir, mock_url, &["--admin-token", TOKEN], &[], log)
}

/// One admin API call with `token` (none: no `authorization`): its status and bytes.
async fn call(
    serve: &Serve,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Bytes) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let answer = harness::call(method, &format!("{}/admin/v1{path}", serve.admin), &headers, body).await;
    (answer.status.as_u16(), answer.body)
}

/// A call that must succeed; its JSON.
async fn ok(serve: &Serve, token: &str, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, bytes) = call(serve, Some(token), method, path, body).await;
    assert!((200..300).contains(&status), "{path}: {status} {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("JSON")
}

/// The operator's call that must succeed.
async fn operator(serve: &Serve, method: Method, path: &str, body: Option<Value>) -> Value {
    ok(serve, TOKEN, method, path, body).await
}

/// A refusal's status and error message.
async fn refused(
    serve: &Serve,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let (status, bytes) = call(serve, Some(token), method, path, body).await;
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, answer["error"]["message"].as_str().unwrap_or("").to_owned())
}

fn id(value: &Value) -> String {
    value["id"].as_str().unwrap_or_else(|| panic!("no id in {value}")).to_owned()
}

async fn new_org(serve: &Serve, name: &str) -> String {
    id(&operator(serve, Method::POST, "/orgs", Some(json!({ "name": name }))).await)
}

/// A token of `org` issued by the operator: its answer (with `secret`).
async fn new_token(serve: &Serve, org: &str, name: &str, role: &str) -> Value {
    let body = json!({ "name": name, "role": role });
    operator(serve, Method::POST, &format!("/orgs/{org}/tokens"), Some(body)).await
}

fn secret(token: &Value) -> String {
    token["secret"].as_str().expect("a secret").to_owned()
}

/// The callers every operation is walked with, in the order of [`EXPECTED`]'s statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Operator,
    AdminOfA,
    ViewerOfA,
    AdminOfB,
}

const CALLERS: [Caller; 4] = [Caller::Operator, Caller::AdminOfA, Caller::ViewerOfA, Caller::AdminOfB];

/// Every operation of the admin API, as `openapi.json` names it, and the status each caller gets
/// for it when its path names organization A's objects. A documented operation without a row
/// fails the walk: a new route cannot be forgotten.
const EXPECTED: &[(&str, &str, [u16; 4])] = &[
    // operator, admin of A, viewer of A, admin of B
    ("post", "/orgs", [201, 403, 403, 403]),
    ("get", "/orgs", [200, 200, 200, 200]),
    ("get", "/orgs/{org}", [200, 200, 200, 404]),
    ("patch", "/orgs/{org}", [200, 200, 403, 404]),
    ("post", "/orgs/{org}/keys", [201, 201, 403, 404]),
    ("get", "/orgs/{org}/keys", [200, 200, 200, 404]),
    ("post", "/keys/{key}/revoke", [200, 200, 403, 404]),
    ("get", "/keys/{key}", [200, 200, 200, 404]),
    ("patch", "/keys/{key}", [200, 200, 403, 404]),
    ("get", "/orgs/{org}/providers", [200, 200, 200, 404]),
    ("put", "/orgs/{org}/providers/{name}", [200, 200, 403, 404]),
    ("post", "/orgs/{org}/caps", [201, 201, 403, 404]),
    ("get", "/orgs/{org}/caps", [200, 200, 200, 404]),
    ("get", "/caps/{cap}", [200, 200, 200, 404]),
    ("patch", "/caps/{cap}", [200, 200, 403, 404]),
    ("delete", "/caps/{cap}", [200, 200, 403, 404]),
    ("get", "/orgs/{org}/spend", [200, 200, 200, 404]),
    ("get", "/orgs/{org}/alerts", [200, 200, 200, 404]),
    ("get", "/orgs/{org}/receipts", [200, 200, 200, 404]),
    ("get", "/orgs/{org}/receipts/summary", [200, 200, 200, 404]),
    ("get", "/orgs/{org}/receipts/{receipt}", [200, 200, 200, 404]),
    ("get", "/orgs/{org}/audit", [200, 200, 200, 404]),
    ("get", "/audit", [200, 403, 403, 403]),
    ("post", "/orgs/{org}/tokens", [201, 201, 403, 404]),
    ("get", "/orgs/{org}/tokens", [200, 200, 200, 404]),
    ("post", "/tokens/{token}/revoke", [200, 200, 403, 404]),
    ("get", "/prices", [200, 403, 403, 403]),
    ("get", "/prices/{model}", [200, 403, 403, 403]),
    ("put", "/prices/{model}", [200, 403, 403, 403]),
    ("delete", "/prices/{model}", [200, 403, 403, 403]),
    ("post", "/price-imports", [200, 403, 403, 403]),
    ("put", "/fallback-prices/{kind}", [200, 403, 403, 403]),
    ("delete", "/fallback-prices/{kind}", [200, 403, 403, 403]),
    ("get", "/nodes", [200, 403, 403, 403]),
    ("post", "/node-credentials", [201, 403, 403, 403]),
    ("get", "/node-credentials", [200, 403, 403, 403]),
    ("delete", "/node-credentials/{credential}", [200, 403, 403, 403]),
    // Served before any token is read.
    ("get", "/openapi.json", [200, 200, 200, 200]),
];

/// Ids that name nothing, one of each kind a path may name.
const UNKNOWN: [&str; 4] = [
    "org_Unknown0000000000000",
    "key_Unknown0000000000000",
    "cap_Unknown0000000000000",
    "tok_Unknown0000000000000",
];

/// Organization A with one of everything, organization B, and the tokens of the walk.
struct World {
    org_a: String,
    key_a: String,
    cap_a: String,
    receipt_a: String,
    admin_a: String,
    viewer_a: String,
    admin_b: String,
}

impl World {
    async fn build(serve: &Serve) -> Self {
        let org_a = new_org(serve, "acme").await;
        new_org(serve, "globex").await;
        let org_b = new_org(serve, "initech").await;
        let key =
            operator(serve, Method::POST, &format!("/orgs/{org_a}/keys"), Some(json!({"name": "k"}))).await;
        let provider = json!({"kind": "openai", "api_key": "sk-managed-0123456789"});
        operator(serve, Method::PUT, &format!("/orgs/{org_a}/providers/openai"), Some(provider)).await;
        let cap = json!({"scope": "organization", "window": "month", "limit_usd": "100", "hard_stop": false});
        let cap = operator(serve, Method::POST, &format!("/orgs/{org_a}/caps"), Some(cap)).await;
        // A receipt of A's, from a request through the gateway.
        let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
        let bearer = format!("Bearer {}", secret(&key));
        let url = format!("{}/v1/chat/completions", serve.gateway);
        let answer = harness::call(Method::POST, &url, &[("authorization", &bearer)], Some(chat)).await;
        assert_eq!(answer.status, StatusCode::OK);
        let receipts = format!("/orgs/{org_a}/receipts");
        let receipt_a = harness::eventually(Duration::from_secs(10), "the request's receipt", || async {
            let page = operator(serve, Method::GET, &receipts, None).await;
            page["receipts"][0]["id"].as_str().map(str::to_owned)
        })
        .await;
        Self {
            key_a: id(&key),
            cap_a: id(&cap),
            receipt_a,
            admin_a: secret(&new_token(serve, &org_a, "deployer", "admin").await),
            viewer_a: secret(&new_token(serve, &org_a, "dashboard", "viewer").await),
            admin_b: secret(&new_token(serve, &org_b, "b-admin", "admin").await),
            org_a,
        }
    }

    fn token(&self, caller: Caller) -> &str {
        match caller {
            Caller::Operator => TOKEN,
            Caller::AdminOfA => &self.admin_a,
            Caller::ViewerOfA => &self.viewer_a,
            Caller::AdminOfB => &self.admin_b,
        }
    }

    /// The path of `template` for one call, naming A's objects; an operation that removes what it
    /// names gets a fresh one of A's for each call, so that every caller finds it there.
    async fn path(&self, serve: &Serve, method: &str, template: &str) -> String {
        let fresh = |what: &str| format!("fresh {what}");
        let mut path = template.replace("{org}", &self.org_a).replace("{receipt}", &self.receipt_a);
        path = path.replace("{name}", "openai");
        if template.contains("{key}") {
            let key = if method == "post" {
                let body = json!({ "name": fresh("key") });
                id(&operator(serve, Method::POST, &format!("/orgs/{}/keys", self.org_a), Some(body)).await)
            } else {
                self.key_a.clone()
            };
            path = path.replace("{key}", &key);
        }
        if template.contains("{cap}") {
            let cap = if method == "delete" {
                let body =
                    json!({"scope": "organization", "window": "day", "limit_usd": "1", "hard_stop": false});
                id(&operator(serve, Method::POST, &format!("/orgs/{}/caps", self.org_a), Some(body)).await)
            } else {
                self.cap_a.clone()
            };
            path = path.replace("{cap}", &cap);
        }
        if template.contains("{token}") {
            path =
                path.replace("{token}", &id(&new_token(serve, &self.org_a, &fresh("token"), "viewer").await));
        }
        if template.contains("{model}") {
            if method == "delete" {
                let price = json!({"input_per_mtok_usd": "1", "output_per_mtok_usd": "2"});
                operator(serve, Method::PUT, "/prices/walked-model", Some(price)).await;
            }
            path = path.replace("{model}", "walked-model");
        }
        if template.contains("{kind}") {
            if method == "delete" {
                let price = json!({"input_per_mtok_usd": "20", "output_per_mtok_usd": "80"});
                operator(serve, Method::PUT, "/fallback-prices/openai", Some(price)).await;
            }
            path = path.replace("{kind}", "openai");
        }
        if template.contains("{credential}") {
            let body = json!({ "name": fresh("node") });
            let credential = id(&operator(serve, Method::POST, "/node-credentials", Some(body)).await);
            path = path.replace("{credential}", &credential);
        }
        assert!(!path.contains('{'), "{template}: a parameter the walk does not fill");
        path
    }
}

/// A body each operation accepts.
fn body(method: &str, template: &str) -> Option<Value> {
    let price = json!({"input_per_mtok_usd": "1", "output_per_mtok_usd": "2"});
    match (method, template) {
        ("post", "/orgs") => Some(json!({"name": "walked"})),
        ("patch", "/orgs/{org}") => Some(json!({"allowed_endpoints": null})),
        ("post", "/orgs/{org}/keys") => Some(json!({"name": "walked"})),
        ("patch", "/keys/{key}") => Some(json!({"requests_per_minute": null})),
        ("put", "/orgs/{org}/providers/{name}") => {
            Some(json!({"kind": "openai", "api_key": "sk-walked-0123456789"}))
        }
        ("post", "/orgs/{org}/caps") => {
            Some(json!({"scope": "organization", "window": "month", "limit_usd": "100", "hard_stop": false}))
        }
        ("patch", "/caps/{cap}") => Some(json!({"limit_usd": "200"})),
        ("post", "/orgs/{org}/tokens") => Some(json!({"name": "walked", "role": "viewer"})),
        ("put", "/prices/{model}") => Some(price),
        ("post", "/price-imports") => Some(json!({"models": {"walked-import": {
            "input_per_mtok_usd": "1", "output_per_mtok_usd": "2", "kind": "openai"}}})),
        ("put", "/fallback-prices/{kind}") => {
            Some(json!({"input_per_mtok_usd": "20", "output_per_mtok_usd": "80"}))
        }
        ("post", "/node-credentials") => Some(json!({"name": "walked"})),
        _ => None,
    }
}

/// `path` with each id it names replaced by one of the same kind that names nothing, and the
/// pairs (nothing, id) to swap back.
fn unknown(path: &str) -> (String, Vec<(String, String)>) {
    let mut swapped = Vec::new();
    let segments: Vec<&str> = path
        .split('/')
        .map(|segment| match UNKNOWN.iter().find(|nothing| segment.starts_with(&nothing[..4])) {
            Some(nothing) => {
                swapped.push(((*nothing).to_owned(), segment.to_owned()));
                *nothing
            }
            None => segment,
        })
        .collect();
    (segments.join("/"), swapped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_each_caller_within_its_reach() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("org-tokens-walk");
    let serve = start(&dir.join("data"), &mock.url(), &dir.join("serve.log"));
    let world = World::build(&serve).await;

    // The operations the running control plane documents, each with exactly one row.
    let (status, document) = call(&serve, None, Method::GET, "/openapi.json", None).await;
    assert_eq!(status, 200);
    let document: Value = serde_json::from_slice(&document).expect("JSON");
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options", "trace"]
                .contains(&method.as_str())
            {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    for (method, path) in &documented {
        let rows = EXPECTED.iter().filter(|(m, p, _)| m == method && p == path).count();
        assert_eq!(
            rows,
            1,
            "{} {path}: the walk needs exactly one row for each documented operation",
            method.to_uppercase()
        );
    }
    for (method, path, _) in EXPECTED {
        assert!(
            documented.contains(&((*method).to_owned(), (*path).to_owned())),
            "{} {path} is walked but not documented",
            method.to_uppercase()
        );
    }

    for (method, template, statuses) in EXPECTED {
        let verb = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        for (caller, expected) in CALLERS.into_iter().zip(statuses) {
            let path = world.path(&serve, method, template).await;
            let (status, answer) =
                call(&serve, Some(world.token(caller)), verb.clone(), &path, body(method, template)).await;
            let shown = String::from_utf8_lossy(&answer);
            assert_eq!(status, *expected, "{caller:?} {} {path}: {shown}", method.to_uppercase());
            match status {
                403 => {
                    // The operator's alone, or a viewer's change: decided before any id is read.
                    let why = if statuses[1] == 403 { OPERATOR_ONLY } else { READ_ONLY };
                    assert_eq!(shown, why, "{caller:?} {} {path}", method.to_uppercase());
                }
                404 => {
                    // Exactly what an id that names nothing gets, from this caller and from the
                    // operator (the handler's own answer): no existence oracle.
                    let (nowhere, swapped) = unknown(&path);
                    assert!(!swapped.is_empty(), "{path}: a 404 names an id");
                    for asker in [caller, Caller::Operator] {
                        let (status, there) = call(
                            &serve,
                            Some(world.token(asker)),
                            verb.clone(),
                            &nowhere,
                            body(method, template),
                        )
                        .await;
                        let mut there = String::from_utf8_lossy(&there).into_owned();
                        for (nothing, real) in &swapped {
                            there = there.replace(nothing, real);
                        }
                        assert_eq!(
                            (status, there.as_str()),
                            (404, &*shown),
                            "{asker:?} {} {nowhere}",
                            method.to_uppercase()
                        );
                    }
                }
                _ => {}
            }
        }
    }

    // GET /orgs: everything to the operator, its own organization alone to a token.
    let names = |orgs: Value| -> Vec<String> {
        orgs["orgs"]
            .as_array()
            .expect("orgs")
            .iter()
            .map(|o| o["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let all = names(operator(&serve, Method::GET, "/orgs", None).await);
    assert!(all.starts_with(&["acme".to_owned(), "globex".to_owned(), "initech".to_owned()]), "{all:?}");
    for (caller, own) in
        [(Caller::AdminOfA, "acme"), (Caller::ViewerOfA, "acme"), (Caller::AdminOfB, "initech")]
    {
        assert_eq!(
            names(ok(&serve, world.token(caller), Method::GET, "/orgs", None).await),
            [own],
            "{caller:?}"
        );
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_shown_once_and_refused_like_a_wrong_one_once_expired_or_revoked() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("org-tokens-life");
    let (data, log) = (dir.join("data"), dir.join("serve.log"));
    let serve = start(&data, &mock.url(), &log);
    let cli = |token: &str, args: &[&str]| -> Value {
        serde_json::from_str(&serve.admin_cli(token, args)).expect("JSON")
    };
    let org = id(&cli(TOKEN, &["orgs", "create", "--name", "acme"]));
    id(&cli(TOKEN, &["orgs", "create", "--name", "globex"]));

    // Issued by the operator through the CLI: the secret once, then never again.
    let issued = cli(TOKEN, &["org-tokens", "create", "--org", &org, "--name", "ci", "--role", "admin"]);
    let token = secret(&issued);
    assert!(
        token.len() == 47
            && token.starts_with("rot_")
            && token[4..].bytes().all(|b| b.is_ascii_alphanumeric()),
        "{token}"
    );
    assert!(issued["id"].as_str().is_some_and(|id| id.starts_with("tok_")), "{issued}");
    assert_eq!(
        (&issued["org_id"], &issued["name"], &issued["role"], &issued["prefix"]),
        (&json!(org), &json!("ci"), &json!("admin"), &json!(token[..10]))
    );
    assert_eq!((&issued["expires_at"], &issued["revoked_at"]), (&Value::Null, &Value::Null));
    let mut shown = issued.clone();
    shown.as_object_mut().expect("an object").remove("secret");
    assert_eq!(cli(TOKEN, &["org-tokens", "list", "--org", &org]), json!({ "tokens": [shown] }));

    // The token is the CLI's --admin-token for its organization: it sees it alone, issues tokens.
    assert_eq!(cli(&token, &["orgs", "list"])["orgs"].as_array().map(Vec::len), Some(1));
    cli(&token, &["keys", "create", "--org", &org, "--name", "k"]);
    let expires_at = Timestamp::from_system_time(SystemTime::now() + Duration::from_secs(2)).to_rfc3339();
    let brief = cli(
        &token,
        &[
            "org-tokens",
            "create",
            "--org",
            &org,
            "--name",
            "brief",
            "--role",
            "viewer",
            "--expires-at",
            &expires_at,
        ],
    );
    assert_eq!(brief["expires_at"], json!(expires_at));
    let (status, message) = refused(
        &serve,
        &token,
        Method::POST,
        &format!("/orgs/{org}/tokens"),
        Some(json!({"name": "x", "role": "operator"})),
    )
    .await;
    assert_eq!((status, message.as_str()), (400, "role: expected \"admin\" or \"viewer\""));
    let past = json!({"name": "x", "role": "viewer", "expires_at": "2020-01-01T00:00:00Z"});
    let (status, message) =
        refused(&serve, &token, Method::POST, &format!("/orgs/{org}/tokens"), Some(past)).await;
    assert_eq!((status, message.as_str()), (400, "expires_at: must be in the future"));

    // A wrong token's answer: the bytes every token that does not open the API gets.
    let never_issued = format!("rot_{}", "A".repeat(43));
    let (status, wrong) = call(&serve, Some(&never_issued), Method::GET, "/orgs", None).await;
    assert_eq!(status, 401);
    assert_eq!(
        call(&serve, Some("not-even-a-token"), Method::GET, "/orgs", None).await,
        (401, wrong.clone())
    );

    // Expired: refused from its expiry on, as a wrong token.
    let brief_secret = secret(&brief);
    let lapsed = harness::eventually(Duration::from_secs(10), "the token's expiry", || async {
        let answer = call(&serve, Some(&brief_secret), Method::GET, "/orgs", None).await;
        (answer.0 != 200).then_some(answer)
    })
    .await;
    assert_eq!(lapsed, (401, wrong.clone()));

    // Revoked (by the organization's own admin, through the CLI): refused at once, as a wrong token.
    let second =
        secret(&cli(TOKEN, &["org-tokens", "create", "--org", &org, "--name", "second", "--role", "viewer"]));
    assert_eq!(call(&serve, Some(&second), Method::GET, &format!("/orgs/{org}"), None).await.0, 200);
    let second_id = id(&cli(TOKEN, &["org-tokens", "list", "--org", &org])["tokens"][2]);
    let revoked = cli(&token, &["org-tokens", "revoke", &second_id]);
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    assert_eq!(
        call(&serve, Some(&second), Method::GET, &format!("/orgs/{org}"), None).await,
        (401, wrong.clone())
    );
    let again = cli(&token, &["org-tokens", "revoke", &second_id]);
    assert_eq!(again["revoked_at"], revoked["revoked_at"], "the first revocation time is kept");

    // Wrong organization tokens count against the address as wrong admin tokens do, and the right
    // tokens still pass once it is held back.
    let mut held_back = false;
    for _ in 0..20 {
        let (status, _) = call(&serve, Some(&never_issued), Method::GET, "/orgs", None).await;
        if status == 429 {
            held_back = true;
            break;
        }
        assert_eq!(status, 401);
    }
    assert!(held_back, "a guesser of organization tokens is held back");
    assert_eq!(call(&serve, Some(&token), Method::GET, "/orgs", None).await.0, 200, "the right token passes");
    assert_eq!(call(&serve, Some(TOKEN), Method::GET, "/orgs", None).await.0, 200, "and the operator's");

    // The secrets are nowhere: not in the database's files, not in the log.
    drop(serve);
    let log = std::fs::read_to_string(&log).expect("log");
    assert!(log.contains("a wrong admin token was refused"), "{log}");
    for secret in [&token, &brief_secret, &second, &never_issued] {
        assert!(!log.contains(secret.as_str()), "a token in the log");
        for file in std::fs::read_dir(&data).expect("data dir").flatten() {
            let bytes = std::fs::read(file.path()).unwrap_or_default();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds a token",
                file.path().display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_organizations_changes_name_their_token_and_its_trail_is_its_own() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("org-tokens-audit");
    let serve = start(&dir.join("data"), &mock.url(), &dir.join("serve.log"));
    let (org_a, org_b) = (new_org(&serve, "acme").await, new_org(&serve, "initech").await);
    let provider = json!({"kind": "openai", "api_key": "sk-managed-0123456789", "base_url": "https://llm.example.com",
                          "price_namespace": "groq"});
    operator(&serve, Method::PUT, &format!("/orgs/{org_a}/providers/openai"), Some(provider)).await;
    let deployer = new_token(&serve, &org_a, "deployer", "admin").await;
    let (admin_a, admin_a_id) = (secret(&deployer), id(&deployer));
    let viewer_a = secret(&new_token(&serve, &org_a, "dashboard", "viewer").await);
    let admin_b = secret(&new_token(&serve, &org_b, "b-admin", "admin").await);

    // What an organization's admin may change, and what stays the operator's.
    let key =
        ok(&serve, &admin_a, Method::POST, &format!("/orgs/{org_a}/keys"), Some(json!({"name": "k"}))).await;
    let credential = format!("/orgs/{org_a}/providers/openai");
    let rotated = ok(
        &serve,
        &admin_a,
        Method::PUT,
        &credential,
        Some(json!({"kind": "openai", "api_key": "sk-rotated-9876"})),
    )
    .await;
    assert_eq!(
        (&rotated["key_hint"], &rotated["base_url"], &rotated["price_namespace"]),
        (&json!("...9876"), &json!("https://llm.example.com"), &json!("groq")),
        "the key replaced, the operator's settings kept"
    );
    let repeated =
        json!({"kind": "openai", "api_key": "sk-rotated-5432", "base_url": "https://llm.example.com"});
    ok(&serve, &admin_a, Method::PUT, &credential, Some(repeated)).await;
    for (body, member) in [
        (
            json!({"kind": "openai", "api_key": "sk-x", "base_url": "https://elsewhere.example.com"}),
            "base_url: ",
        ),
        (json!({"kind": "anthropic", "api_key": "sk-x"}), "kind: "),
        (json!({"kind": "openai", "api_key": "sk-x", "price_namespace": "openai"}), "price_namespace: "),
        (
            json!({"kind": "openai", "api_key": "sk-x", "fallback_input_per_mtok_usd": "0", "fallback_output_per_mtok_usd": "0"}),
            "fallback_input_per_mtok_usd: ",
        ),
    ] {
        let (status, message) = refused(&serve, &admin_a, Method::PUT, &credential, Some(body)).await;
        assert!(status == 403 && message.starts_with(member), "{status} {message}");
    }
    let (status, message) = refused(
        &serve,
        &admin_a,
        Method::PUT,
        &format!("/orgs/{org_a}/providers/groq"),
        Some(json!({"kind": "openai", "api_key": "sk-x"})),
    )
    .await;
    assert!(status == 403 && message.starts_with("name: only the operator adds a credential"), "{message}");
    let org_path = format!("/orgs/{org_a}");
    let (status, message) =
        refused(&serve, &admin_a, Method::PATCH, &org_path, Some(json!({"max_concurrent_requests": 5})))
            .await;
    assert!(status == 403 && message.starts_with("max_concurrent_requests: "), "{message}");
    let allowed =
        ok(&serve, &admin_a, Method::PATCH, &org_path, Some(json!({"allowed_models": ["gpt-4o*"]}))).await;
    assert_eq!(allowed["allowed_models"], json!(["gpt-4o*"]));
    let cap = json!({"scope": "organization", "window": "month", "limit_usd": "25", "hard_stop": true});
    operator(&serve, Method::POST, &format!("/orgs/{org_a}/caps"), Some(cap)).await;
    ok(&serve, &admin_b, Method::POST, &format!("/orgs/{org_b}/keys"), Some(json!({"name": "b"}))).await;

    // A's trail, as its tokens read it: its changes alone, each naming its actor.
    let trail = ok(&serve, &viewer_a, Method::GET, &format!("/orgs/{org_a}/audit"), None).await;
    assert_eq!(ok(&serve, &admin_a, Method::GET, &format!("/orgs/{org_a}/audit"), None).await, trail);
    let entries = trail["entries"].as_array().expect("entries");
    let who: Vec<(String, String, Value, String)> = entries
        .iter()
        .map(|e| {
            assert_eq!(e["org_id"], json!(org_a), "{e}");
            (
                e["action"].as_str().expect("action").to_owned(),
                e["object_kind"].as_str().expect("kind").to_owned(),
                e["actor"].clone(),
                e["auth"].as_str().expect("auth").to_owned(),
            )
        })
        .collect();
    let the_operator = json!({"type": "operator"});
    let the_deployer = json!({"type": "org_token", "id": admin_a_id, "name": "deployer"});
    let row = |action: &str, kind: &str, actor: &Value, auth: &str| {
        (action.to_owned(), kind.to_owned(), actor.clone(), auth.to_owned())
    };
    assert_eq!(
        who,
        [
            row("create", "org", &the_operator, "admin_token"),
            row("set", "provider", &the_operator, "admin_token"),
            row("create", "org_token", &the_operator, "admin_token"),
            row("create", "org_token", &the_operator, "admin_token"),
            row("create", "key", &the_deployer, "org_token"),
            row("set", "provider", &the_deployer, "org_token"),
            row("set", "provider", &the_deployer, "org_token"),
            row("update", "org", &the_deployer, "org_token"),
            row("create", "cap", &the_operator, "admin_token"),
        ],
        "refused changes left no row; every row names its actor"
    );
    assert_eq!(entries[4]["object_id"], key["id"]);
    // The operator reads the same trail through the whole log's filter.
    let filtered = operator(&serve, Method::GET, &format!("/audit?org_id={org_a}"), None).await;
    assert_eq!(filtered, trail);
    // Another organization's trail is an unknown id's; the whole log is the operator's.
    let (status, _) = call(&serve, Some(&admin_b), Method::GET, &format!("/orgs/{org_a}/audit"), None).await;
    assert_eq!(status, 404);
    let own = ok(&serve, &admin_b, Method::GET, &format!("/orgs/{org_b}/audit"), None).await;
    assert!(own["entries"].as_array().expect("entries").iter().all(|e| e["org_id"] == json!(org_b)), "{own}");
    assert_eq!(call(&serve, Some(&admin_a), Method::GET, "/audit", None).await.0, 403);

    // The CLI reads an organization's own trail with its token, naming each actor.
    let table = serve.admin_cli(&admin_a, &["audit", "--org", &org_a, "--object-kind", "provider"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].contains("ACTOR") && lines[0].contains("AUTH"), "{table}");
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[1].contains(" operator ") && lines[1].contains("admin_token"), "{table}");
    assert!(
        lines[2].contains(&format!("org_token:{admin_a_id}(deployer)")) && lines[2].contains(" org_token "),
        "{table}"
    );
    drop(serve);
    let log = std::fs::read_to_string(dir.join("serve.log")).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains("admin change") && l.contains("auth=org_token") && l.contains(&admin_a_id)),
        "the log line of a change names its actor"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
