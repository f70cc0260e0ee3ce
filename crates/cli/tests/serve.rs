//! Black-box tests of the `recovea` binary: start-up, flags, the admin CLI, and the serving path.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use recovea_testkit::MockProvider;
use serde_json::{Value, json};

#[path = "support/harness.rs"]
mod harness;

use harness::{BIN, OPENAI, Serve, temp_dir};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456";

/// Every file below `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() { files.extend(files_under(&path)) } else { files.push(path) }
    }
    files
}

async fn call(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Value) {
    let answer = harness::call(method, url, headers, body).await;
    (answer.status, answer.json())
}

/// Sends `body` to the gateway's `path` with `bearer` until it answers 401; fails after `within`.
async fn unauthorized_within(
    serve: &Serve,
    path: &str,
    bearer: &str,
    body: &Value,
    within: Duration,
    what: &str,
) {
    harness::eventually(within, what, || async {
        let gateway = format!("{}{path}", serve.gateway);
        let (status, _) =
            call(Method::POST, &gateway, &[("authorization", bearer)], Some(body.clone())).await;
        (status == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
}

fn admin_cli(serve: &Serve, data_dir: &Path, args: &[&str]) -> Value {
    let output = Command::new(BIN)
        .args(["admin", "--admin-url", &serve.admin, "--data-dir"])
        .arg(data_dir)
        .args(args)
        .env_remove("RECOVEA_ADMIN_TOKEN")
        .output()
        .expect("admin runs");
    assert!(output.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("admin prints JSON")
}

fn chat() -> (String, Value) {
    (
        "/v1/chat/completions".into(),
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_setup_start_generates_secrets_once_and_serves_through_the_admin_cli() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("zero-setup");
    let serve = Serve::start(&dir, &mock.url(), &[]);
    let token_lines: Vec<&String> = serve.stdout.iter().filter(|l| l.starts_with("admin token:")).collect();
    assert_eq!(token_lines.len(), 1, "{:?}", serve.stdout);
    let saved_token =
        std::fs::read_to_string(dir.join("admin-token")).expect("token saved").trim().to_owned();
    assert!(token_lines[0].contains(&saved_token));
    #[cfg(unix)]
    for secret_file in ["admin-token", "master.key"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(secret_file)).expect("exists").permissions().mode();
        assert_eq!(mode & 0o077, 0, "{secret_file} must be private");
    }

    // The admin CLI finds the saved token in the data dir.
    let org = admin_cli(&serve, &dir, &["orgs", "create", "--name", "acme"]);
    let org_id = org["id"].as_str().expect("id").to_owned();
    assert!(org_id.starts_with("org_"));
    assert_eq!(admin_cli(&serve, &dir, &["orgs", "list"])["orgs"][0]["id"], org["id"]);
    assert_eq!(admin_cli(&serve, &dir, &["orgs", "get", &org_id])["name"], "acme");

    let key = admin_cli(&serve, &dir, &["keys", "create", "--org", &org_id, "--name", "prod"]);
    let secret = key["secret"].as_str().expect("secret").to_owned();
    assert!(
        secret.starts_with("rk_")
            && secret.len() >= 43
            && secret[3..].bytes().all(|b| b.is_ascii_alphanumeric())
    );
    assert_eq!(key["prefix"].as_str().expect("prefix"), &secret[..9]);
    let listed = admin_cli(&serve, &dir, &["keys", "list", "--org", &org_id]);
    assert_eq!(listed["keys"][0]["id"], key["id"]);
    assert!(listed["keys"][0].get("secret").is_none(), "the secret is shown only once");
    let got = admin_cli(&serve, &dir, &["keys", "get", key["id"].as_str().expect("id")]);
    assert_eq!((&got["id"], &got["name"], got.get("secret")), (&key["id"], &json!("prod"), None));

    let provider_key = "sk-managed-zero-setup-0123456789";
    let provider = admin_cli(
        &serve,
        &dir,
        &[
            "providers",
            "set",
            "--org",
            &org_id,
            "--name",
            "openai",
            "--kind",
            "openai",
            "--api-key",
            provider_key,
        ],
    );
    assert_eq!(
        provider,
        json!({
            "name": "openai",
            "kind": "openai",
            "base_url": null,
            "key_hint": "...6789",
            "price_namespace": null,
            "fallback_input_per_mtok_usd": null,
            "fallback_output_per_mtok_usd": null
        })
    );
    let listed = admin_cli(&serve, &dir, &["providers", "list", "--org", &org_id]);
    assert!(!listed.to_string().contains(provider_key));

    let (path, body) = chat();
    let bearer = format!("Bearer {secret}");
    let (status, answer) = call(
        Method::POST,
        &format!("{}{path}", serve.gateway),
        &[("authorization", &bearer)],
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(mock.requests()[0].header("authorization"), Some(format!("Bearer {provider_key}").as_str()));

    // Revocation reaches the serving snapshot within a second.
    let revoked = admin_cli(&serve, &dir, &["keys", "revoke", key["id"].as_str().expect("id")]);
    assert!(revoked["revoked_at"].is_string());
    assert!(admin_cli(&serve, &dir, &["nodes"])["nodes"].is_array(), "the nodes that reported");
    let what = "the revocation at the gateway";
    unauthorized_within(&serve, &path, &bearer, &body, Duration::from_secs(1), what).await;

    // The data directory and everything in it (database, spool, saved state) are the owner's
    // alone: they hold sealed provider keys, key hashes and every receipt.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).expect("exists").permissions().mode();
        assert_eq!(mode(&dir) & 0o777, 0o700, "the data directory");
        let files = files_under(&dir);
        assert!(files.iter().any(|f| f.ends_with("recovea.db")), "{files:?}");
        assert!(files.iter().any(|f| f.starts_with(dir.join("spool"))), "{files:?}");
        for file in &files {
            assert_eq!(mode(file) & 0o077, 0, "{} must be private", file.display());
        }
    }

    // Secrets at rest: neither the key secret nor the provider key appears in any file of the data dir.
    for path in files_under(&dir) {
        let bytes = std::fs::read(&path).expect("readable");
        for needle in [secret.as_bytes(), provider_key.as_bytes()] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{} holds a secret in clear",
                path.display()
            );
        }
    }
    drop(serve);

    // A second start reuses the saved secrets, keeps the state, and prints no token.
    let again = Serve::start(&dir, &mock.url(), &[]);
    assert!(again.stdout.iter().all(|l| !l.starts_with("admin token:")), "{:?}", again.stdout);
    assert_eq!(admin_cli(&again, &dir, &["orgs", "get", &org_id])["name"], "acme");
    let (status, _) =
        call(Method::POST, &format!("{}{path}", again.gateway), &[("authorization", &bearer)], Some(body))
            .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked key stays revoked across restarts");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_errors_use_the_error_shape() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("admin-errors");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let auth = format!("Bearer {TOKEN}");
    let url = |path: &str| format!("{}/admin/v1{path}", serve.admin);

    let (status, body) = call(Method::GET, &url("/orgs"), &[("authorization", "Bearer wrong")], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_admin_token");
    let (status, _) = call(Method::GET, &url("/orgs"), &[], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, body) =
        call(Method::POST, &url("/orgs"), &[("authorization", &auth)], Some(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["message"], "body: missing field `name`");
    assert_eq!(body["error"]["param"], Value::Null);

    let (_, org) =
        call(Method::POST, &url("/orgs"), &[("authorization", &auth)], Some(json!({"name": "a"}))).await;
    let org_id = org["id"].as_str().expect("id");
    let bad_kind = json!({"kind": "cohere", "api_key": "x"});
    let (status, body) = call(
        Method::PUT,
        &url(&format!("/orgs/{org_id}/providers/openai")),
        &[("authorization", &auth)],
        Some(bad_kind),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().expect("message").starts_with("kind:"), "{body}");
    let bad_url = json!({"kind": "openai", "api_key": "sk-1", "base_url": "ftp://x"});
    let (status, body) = call(
        Method::PUT,
        &url(&format!("/orgs/{org_id}/providers/openai")),
        &[("authorization", &auth)],
        Some(bad_url),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().expect("message").starts_with("base_url:"), "{body}");
    // A cloud metadata service hands out the machine's own credentials: never a base URL nor a
    // webhook, by name or by address.
    for metadata in ["http://169.254.169.254", "http://metadata.google.internal", "http://[fe80::1]:8080"] {
        let credential = json!({"kind": "openai", "api_key": "sk-1", "base_url": metadata});
        let path = url(&format!("/orgs/{org_id}/providers/openai"));
        let (status, body) = call(Method::PUT, &path, &[("authorization", &auth)], Some(credential)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{metadata}");
        assert!(body["error"]["message"].as_str().expect("message").contains("metadata service"), "{body}");
        let cap = json!({"scope": "organization", "window": "month", "limit_usd": "1", "hard_stop": true,
                         "alert_webhook": metadata});
        let (status, body) =
            call(Method::POST, &url(&format!("/orgs/{org_id}/caps")), &[("authorization", &auth)], Some(cap))
                .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{metadata}");
        assert!(body["error"]["message"].as_str().expect("message").starts_with("alert_webhook:"), "{body}");
    }
    let (status, body) = call(
        Method::POST,
        &url(&format!("/orgs/{org_id}/keys")),
        &[("authorization", &auth)],
        Some(json!({"name": "k", "expires_at": "tomorrow"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().expect("message").starts_with("expires_at:"), "{body}");

    for (method, path) in [
        (Method::GET, "/orgs/org_doesnotexist".to_owned()),
        (Method::POST, "/keys/key_doesnotexist/revoke".to_owned()),
        (Method::GET, "/orgs/org_nope/keys".to_owned()),
        (Method::GET, "/nothing/here".to_owned()),
    ] {
        let (status, body) = call(method, &url(&path), &[("authorization", &auth)], None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["error"]["code"], "not_found", "{path}");
    }

    let (status, doc) = call(Method::GET, &url("/openapi.json"), &[], None).await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/orgs",
        "/orgs/{org}",
        "/orgs/{org}/keys",
        "/keys/{key}/revoke",
        "/orgs/{org}/providers/{name}",
        "/orgs/{org}/receipts",
        "/prices",
        "/prices/{model}",
        "/price-imports",
        "/fallback-prices/{kind}",
    ] {
        assert!(doc["paths"].get(path).is_some(), "openapi.json lacks {path}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_works_on_every_subcommand() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["admin", "--help"],
        &["admin", "orgs", "--help"],
        &["admin", "orgs", "create", "--help"],
        &["admin", "keys", "create", "--help"],
        &["admin", "keys", "revoke", "--help"],
        &["admin", "providers", "set", "--help"],
    ] {
        let output = Command::new(BIN).args(args).output().expect("runs");
        assert!(output.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stdout).contains("Usage:"), "{args:?}");
    }
}

/// `serve` with `args` and `env` fails, its errors one a line, each of `named` (a line's start) once
/// and nothing else.
fn each_named_once(data_dir: &Path, args: &[&str], env: &[(&str, &str)], named: &[&str]) {
    let output = Command::new(BIN)
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|line| line.starts_with("error: ")).collect();
    for named in named {
        assert!(errors.iter().any(|line| line.starts_with(named)), "{named} in:\n{stderr}");
    }
    assert_eq!(errors.len(), named.len(), "each once:\n{stderr}");
}

#[test]
fn bad_flags_and_environment_stop_start_up_naming_the_setting() {
    let dir = temp_dir("bad-flags");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    std::fs::write(dir.join("admin-token"), "\n").expect("an empty token file");
    // Single sign-on: a setting that cannot work stops the start, never printing the secret.
    let oidc =
        |issuer: &'static str, redirect: &'static str, claim: &'static str| -> &'static [&'static str] {
            vec![
                "--admin-token",
                TOKEN,
                "--oidc-issuer",
                issuer,
                "--oidc-client-id",
                "recovea",
                "--oidc-client-secret",
                "oidc-secret-never-printed",
                "--oidc-redirect-url",
                redirect,
                claim,
                "org",
            ]
            .leak()
        };
    let callback = "https://recovea.example.com/console/oidc/callback";
    let cases: [Case<'_>; 19] = [
        (
            oidc("http://login.example.com", callback, "--oidc-org-claim"),
            &[],
            "--oidc-issuer: \"http://login.example.com\" must be https",
        ),
        (
            oidc("https://login.example.com", "https://recovea.example.com/callback", "--oidc-org-claim"),
            &[],
            "--oidc-redirect-url: must be the console's address followed by /console/oidc/callback",
        ),
        (
            oidc("https://login.example.com", callback, "--oidc-groups-claim"),
            &[],
            "single sign-on needs --oidc-org-claim or --oidc-operator-group",
        ),
        (&[], &[], "admin-token is empty"),
        // Bearer tokens an operator sets are long enough that guessing is out of reach.
        (&["--admin-token", "guessable-token"], &[], "--admin-token: must be at least 32 characters, not 15"),
        (
            &[],
            &[("RECOVEA_ADMIN_TOKEN", "x".repeat(31).leak())],
            "RECOVEA_ADMIN_TOKEN (the environment variable of --admin-token): must be at least 32 characters, not 31",
        ),
        (&["--metrics-token", "scrape"], &[], "--metrics-token: must be at least 32 characters, not 6"),
        // Redis's TLS settings, named as the contract names them.
        (
            &[
                "--admin-token",
                TOKEN,
                "--redis-url",
                "rediss://127.0.0.1:1/0",
                "--redis-ca-file",
                "/no/such/ca.pem",
            ],
            &[],
            "--redis-ca-file: cannot read /no/such/ca.pem",
        ),
        (
            &["--redis-url", "rediss://127.0.0.1:1/0", "--redis-cert-file", "/no/such/cert.pem"],
            &[],
            "--redis-key-file",
        ),
        (&["--master-key", "zz"], &[], "--master-key"),
        (&["--openai-base-url", "ftp://x"], &[], "--openai-base-url"),
        (&["--listen", "not-an-address"], &[], "--listen"),
        (&["--max-body-size", "12parsecs"], &[], "--max-body-size"),
        (&[], &[("RECOVEA_UPSTREAM_TIMEOUT", "soon")], "--upstream-timeout"),
        (&["--stream-idle-timeout", "0s"], &[], "--stream-idle-timeout"),
        (&[], &[("RECOVEA_ANTHROPIC_BASE_URL", "nowhere")], "--anthropic-base-url"),
        (&["--database-url", "mysql://x"], &[], "--database-url"),
        // A bad value from the environment is reported under the variable's name.
        (&[], &[("RECOVEA_UPSTREAM_TIMEOUT", "soon")], "the environment variable RECOVEA_UPSTREAM_TIMEOUT"),
        (
            &[],
            &[("RECOVEA_ANTHROPIC_BASE_URL", "nowhere")],
            "RECOVEA_ANTHROPIC_BASE_URL (the environment variable of --anthropic-base-url): ",
        ),
    ];
    for (args, env, named) in cases {
        let output = Command::new(BIN)
            .arg("serve")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("runs");
        assert!(!output.status.success(), "{args:?} {env:?} should fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{args:?} {env:?}: {stderr}");
        assert!(!stderr.contains("oidc-secret-never-printed"), "{stderr}");
    }
    // Every wrong setting of the node's configuration is named at once, one a line, the one from
    // the environment under its variable's name.
    let node_settings = [
        "--upstream-timeout",
        "0s",
        "--stream-idle-timeout",
        "0s",
        "--alarm-interval",
        "0s",
        "--max-connections",
        "0",
        "--alarm-webhook",
        "ftp://x",
    ];
    let environment = [("RECOVEA_ANTHROPIC_BASE_URL", "nowhere")];
    each_named_once(
        &dir,
        &node_settings,
        &environment,
        &[
            "error: --upstream-timeout: must be greater than zero",
            "error: RECOVEA_ANTHROPIC_BASE_URL (the environment variable of --anthropic-base-url): ",
            "error: --alarm-interval: must be greater than zero",
            "error: --stream-idle-timeout: must be greater than zero",
            "error: --max-connections: must be greater than zero",
            "error: --alarm-webhook: ",
        ],
    );
    // The admin API's settings are checked with the node's, before anything starts: no data dir
    // is made for a start-up whose settings are wrong.
    let fresh = dir.join("never-made");
    let admin_settings =
        ["--admin-token", "guessable-token", "--database-timeout", "0s", "--master-key", "zz"];
    let more = ["--alert-signing-secret", " ", "--upstream-timeout", "0s"];
    each_named_once(
        &fresh,
        &[&admin_settings[..], &more[..]].concat(),
        &[],
        &[
            "error: --upstream-timeout: must be greater than zero",
            "error: --database-timeout: must be greater than zero",
            "error: --admin-token: must be at least 32 characters, not 15",
            "error: --alert-signing-secret: must not be empty",
            "error: --master-key: ",
        ],
    );
    assert!(!fresh.exists(), "a start-up whose settings are wrong makes nothing");

    // The node token, on both of its ends.
    let short = "node-token-too-short";
    for args in [
        &["control", "--admin-token", TOKEN, "--master-key", &"11".repeat(32), "--node-token", short][..],
        &[
            "node",
            "--control-url",
            "http://127.0.0.1:9",
            "--master-key",
            &"11".repeat(32),
            "--node-token",
            short,
        ],
    ] {
        let output = Command::new(BIN).args(args).arg("--data-dir").arg(&dir).output().expect("runs");
        assert!(!output.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--node-token: must be at least 32 characters, not 20"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains(short), "the token itself is never printed: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_flag_of_every_subcommand_names_its_environment_variable() {
    let subcommands: [&[&str]; 32] = [
        &["admin", "orgs", "update"],
        &["control"],
        &["node"],
        &["admin", "keys", "update"],
        &["admin", "caps", "create"],
        &["admin", "caps", "list"],
        &["admin", "caps", "update"],
        &["admin", "caps", "delete"],
        &["admin", "spend"],
        &["admin", "alerts"],
        &["admin", "receipts", "list"],
        &["admin", "receipts", "export"],
        &["admin", "receipts", "summary"],
        &["admin", "prices", "list"],
        &["admin", "prices", "set"],
        &["serve"],
        &["admin", "prices", "get"],
        &["admin", "prices", "delete"],
        &["admin", "prices", "import"],
        &["admin", "prices", "set-fallback"],
        &["admin", "prices", "delete-fallback"],
        &["admin"],
        &["admin", "orgs", "create"],
        &["admin", "orgs", "get"],
        &["admin", "keys", "create"],
        &["admin", "keys", "list"],
        &["admin", "keys", "revoke"],
        &["admin", "providers", "set"],
        &["admin", "providers", "list"],
        &["admin", "orgs", "list"],
        &["admin", "keys", "get"],
        &["admin", "nodes"],
    ];
    for args in subcommands {
        let output = Command::new(BIN).args(args).arg("--help").output().expect("runs");
        let help = String::from_utf8_lossy(&output.stdout).into_owned();
        // Each option's block runs from its `--flag` line to the next option or the end.
        let mut blocks: Vec<String> = Vec::new();
        for line in help.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("--") || (trimmed.starts_with('-') && trimmed.contains(", --")) {
                blocks.push(trimmed.to_owned());
            } else if let Some(block) = blocks.last_mut() {
                block.push(' ');
                block.push_str(trimmed);
            }
        }
        let flags: Vec<&String> =
            blocks.iter().filter(|b| !b.contains("--help") && !b.contains("--version")).collect();
        if args == ["serve"] {
            assert_eq!(flags.len(), 52, "{help}");
        }
        for block in flags {
            assert!(block.contains("[env: RECOVEA_"), "{args:?}: {block}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reads_its_settings_from_the_environment() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("env");
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("RECOVEA_LISTEN", "127.0.0.1:0")
        .env("RECOVEA_ADMIN_LISTEN", "127.0.0.1:0")
        .env("RECOVEA_DATA_DIR", &dir)
        .env("RECOVEA_ADMIN_TOKEN", TOKEN)
        .env("RECOVEA_MASTER_KEY", "11".repeat(32))
        .env("RECOVEA_OPENAI_BASE_URL", mock.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut urls = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        if let Some(url) = line.split_whitespace().last().filter(|u| u.starts_with("http://")) {
            urls.push(url.trim_end_matches("/admin/v1").to_owned());
        }
        if line.starts_with("recovea admin:") {
            break;
        }
    }
    let [gateway, admin] = <[String; 2]>::try_from(urls).expect("two URLs in the banner");
    let auth = format!("Bearer {TOKEN}");
    let (status, _) =
        call(Method::GET, &format!("{admin}/admin/v1/orgs"), &[("authorization", &auth)], None).await;
    assert_eq!(status, StatusCode::OK, "RECOVEA_ADMIN_TOKEN was used");
    let (status, body) = call(
        Method::POST,
        &format!("{gateway}/v1/chat/completions"),
        &[("authorization", "Bearer rk_0000000000000000000000000000000000000000000")],
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "RECOVEA_LISTEN was used: {body}");
    assert!(dir.join("recovea.db").exists(), "RECOVEA_DATA_DIR was used");
    assert!(!dir.join("master.key").exists(), "RECOVEA_MASTER_KEY was used, none generated");
    assert!(!dir.join("admin-token").exists(), "RECOVEA_ADMIN_TOKEN was used, none generated");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_whose_client_hangs_up_still_reaches_the_gateway() {
    use std::io::Write;
    let mock = MockProvider::start().await;
    let dir = temp_dir("hang-up");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let auth = format!("Bearer {TOKEN}");
    let url = |path: &str| format!("{}/admin/v1{path}", serve.admin);
    let tenant = serve.organization(TOKEN, OPENAI).await;
    let (org_id, bearer) = (tenant.org_id.as_str(), tenant.bearer());
    let (path, body) = chat();
    let (status, _) = call(
        Method::POST,
        &format!("{}{path}", serve.gateway),
        &[("authorization", &bearer)],
        Some(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // Send the revocation and hang up without reading the answer. A server may drop a request whose
    // client is gone before it reads it; what must hold is that a revocation once saved is served.
    let admin_addr = serve.admin.trim_start_matches("http://").to_owned();
    let key_id = tenant.key_id.as_str();
    let keys_url = url(&format!("/orgs/{org_id}/keys"));
    let saved_at = loop {
        let mut stream = std::net::TcpStream::connect(&admin_addr).expect("connect");
        write!(
            stream,
            "POST /admin/v1/keys/{key_id}/revoke HTTP/1.1\r\nhost: {admin_addr}\r\nauthorization: {auth}\r\ncontent-length: 0\r\n\r\n"
        )
        .expect("send");
        drop(stream);
        // Saved within 2 s, or sent again.
        let saved = harness::eventually(Duration::from_secs(3), "the revocation saved", || async {
            let (_, keys) = call(Method::GET, &keys_url, &[("authorization", &auth)], None).await;
            keys["keys"][0]["revoked_at"].is_string().then(Instant::now)
        });
        if let Ok(at) = tokio::time::timeout(Duration::from_secs(2), saved).await {
            break at;
        }
    };

    let within = Duration::from_secs(1).saturating_sub(saved_at.elapsed());
    let what = "the saved revocation at the gateway, a second after it was saved";
    unauthorized_within(&serve, &path, &bearer, &body, within, what).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rate_limits_are_set_changed_and_enforced() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("rate-limits");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let auth = format!("Bearer {TOKEN}");
    let url = |path: &str| format!("{}/admin/v1{path}", serve.admin);
    let (_, org) =
        call(Method::POST, &url("/orgs"), &[("authorization", &auth)], Some(json!({"name": "a"}))).await;
    let org_id = org["id"].as_str().expect("id");
    let provider = json!({"kind": "openai", "api_key": "sk-managed-0123456789"});
    call(
        Method::PUT,
        &url(&format!("/orgs/{org_id}/providers/openai")),
        &[("authorization", &auth)],
        Some(provider),
    )
    .await;
    let (status, key) = call(
        Method::POST,
        &url(&format!("/orgs/{org_id}/keys")),
        &[("authorization", &auth)],
        Some(json!({"name": "k", "requests_per_minute": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!((key["requests_per_minute"].as_u64(), key["tokens_per_minute"].as_u64()), (Some(1), None));
    let key_path = url(&format!("/keys/{}", key["id"].as_str().expect("id")));
    let (status, body) =
        call(Method::PATCH, &key_path, &[("authorization", &auth)], Some(json!({"tokens_per_minute": 0})))
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"].as_str().expect("message").starts_with("tokens_per_minute:"), "{body}");

    let bearer = format!("Bearer {}", key["secret"].as_str().expect("secret"));
    let (path, chat) = chat();
    let gateway = format!("{}{path}", serve.gateway);
    let (status, _) = call(Method::POST, &gateway, &[("authorization", &bearer)], Some(chat.clone())).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) =
        call(Method::POST, &gateway, &[("authorization", &bearer)], Some(chat.clone())).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");

    // Lifting the limit reaches the gateway within a second.
    let (status, key) = call(
        Method::PATCH,
        &key_path,
        &[("authorization", &auth)],
        Some(json!({"requests_per_minute": null})),
    )
    .await;
    assert_eq!((status, key["requests_per_minute"].is_null()), (StatusCode::OK, true));
    let deadline = Instant::now() + Duration::from_secs(1);
    while call(Method::POST, &gateway, &[("authorization", &bearer)], Some(chat.clone())).await.0
        != StatusCode::OK
    {
        assert!(Instant::now() < deadline, "the lifted limit still refused after a second");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A deployment may stop a process it just started: a SIGTERM right after the banner drains and exits
/// as a later one does, rather than kill the process by the signal's default action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_right_after_start_up_is_a_graceful_shutdown() {
    let mock = MockProvider::start().await;
    for round in 0..5 {
        let dir = temp_dir(&format!("early-sigterm-{round}"));
        let mut serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
        let status = serve.process.terminate(Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "round {round}: {status:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Huge pages zeroed at first touch stalled the connection threads with thousands of streams open
/// (see `allocator.rs`): the kernel must report them off for the running gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_without_transparent_huge_pages() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("no-huge-pages");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", serve.process.pid())).expect("/proc status");
    let thp = status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(str::trim);
    assert_eq!(thp, Some("0"), "THP_enabled of the running gateway, in:\n{status}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_age_of_serve_stays_near_zero_without_changes() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("snapshot-age");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    // The state is in the same process and checked every 250 ms: with no change for two seconds,
    // its age must still read as fresh, not as the time since the last change. The two seconds
    // are the behaviour under test, sampled every 100 ms.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        let answer = harness::call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await;
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("recovea_snapshot_age_seconds "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no snapshot age: {text}"));
        assert!(age < 1.0, "age {age} s with the control plane in the process");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_allowlists_are_set_through_the_cli_and_refuse_other_models_with_403() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("allowlists");
    let serve = Serve::start(&dir, &mock.url(), &[]);
    let org = admin_cli(
        &serve,
        &dir,
        &["orgs", "create", "--name", "a", "--allowed-models", "gpt-4o-mini, gpt-4.1*"],
    );
    assert_eq!(org["allowed_models"], json!(["gpt-4o-mini", "gpt-4.1*"]));
    let org_id = org["id"].as_str().expect("id").to_owned();
    let provider = ["providers", "set", "--org", &org_id, "--name", "openai", "--kind", "openai"];
    admin_cli(&serve, &dir, &[&provider[..], &["--api-key", "sk-managed-0123456789"]].concat());
    let key = admin_cli(
        &serve,
        &dir,
        &["keys", "create", "--org", &org_id, "--name", "k", "--allowed-models", "gpt-4.1-mini"],
    );
    assert_eq!(key["allowed_models"], json!(["gpt-4.1-mini"]));
    let key_id = key["id"].as_str().expect("id").to_owned();
    let bearer = format!("Bearer {}", key["secret"].as_str().expect("secret"));
    let gateway = format!("{}/v1/chat/completions", serve.gateway);
    let ask = |model: &'static str| {
        let (gateway, bearer) = (gateway.clone(), bearer.clone());
        async move {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]});
            call(Method::POST, &gateway, &[("authorization", &bearer)], Some(body)).await
        }
    };
    // Polls until a change has reached the gateway.
    let until = |model: &'static str, wanted: StatusCode| {
        let ask = &ask;
        async move {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let (status, body) = ask(model).await;
                if status == wanted {
                    return body;
                }
                assert!(Instant::now() < deadline, "{model}: still {status} {body}");
            }
        }
    };
    let refused = until("gpt-4o-mini", StatusCode::FORBIDDEN).await;
    assert_eq!(
        refused,
        json!({"error": {
            "message": "Model 'gpt-4o-mini' is not allowed for this key.",
            "type": "permission_error",
            "param": null,
            "code": "model_not_allowed"
        }})
    );
    assert!(mock.requests().is_empty(), "refused before the provider");
    until("gpt-4.1-mini", StatusCode::OK).await;

    // The key's list removed: the organization's list alone decides.
    let cleared = admin_cli(&serve, &dir, &["keys", "update", &key_id, "--allow-all-models"]);
    assert_eq!(cleared["allowed_models"], Value::Null);
    until("gpt-4o-mini", StatusCode::OK).await;
    assert_eq!(ask("gpt-4o").await.0, StatusCode::FORBIDDEN);
    let opened = admin_cli(&serve, &dir, &["orgs", "update", &org_id, "--allow-all-models"]);
    assert_eq!(opened["allowed_models"], Value::Null);
    until("gpt-4o", StatusCode::OK).await;
    let closed = admin_cli(&serve, &dir, &["orgs", "update", &org_id, "--allowed-models", ""]);
    assert_eq!(closed["allowed_models"], json!([]));
    until("gpt-4o", StatusCode::FORBIDDEN).await;

    // A bad pattern is a 400 naming the field, and changes nothing.
    let token = std::fs::read_to_string(dir.join("admin-token")).expect("token").trim().to_owned();
    let auth = format!("Bearer {token}");
    let key_url = format!("{}/admin/v1/keys/{key_id}", serve.admin);
    for bad in [json!(["gpt*4"]), json!("gpt-4o"), json!([""])] {
        let (status, body) =
            call(Method::PATCH, &key_url, &[("authorization", &auth)], Some(json!({"allowed_models": bad})))
                .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"]["message"].as_str().expect("message").starts_with("allowed_models:"), "{body}");
    }
    let (_, unchanged) = call(Method::GET, &key_url, &[("authorization", &auth)], None).await;
    assert_eq!(unchanged["allowed_models"], Value::Null);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// A name a tenant gave is shown by the console as written, except what would hide or reorder
/// text: a right-to-left override or a terminal escape is shown as its escape, never as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_bidirectional_and_control_characters_as_their_escapes() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("console-bidi");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let (status, org) =
        serve.admin_call(TOKEN, Method::POST, "/orgs", Some(json!({"name": "invoice\u{202e}fdp.exe"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{org}");
    let org_id = org["id"].as_str().expect("id");
    let path = format!("/orgs/{org_id}/keys");
    let (status, key) =
        serve.admin_call(TOKEN, Method::POST, &path, Some(json!({"name": "ci\u{1b}[31mred"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{key}");

    let cookie = console_session(&serve).await;
    for page in ["/".to_owned(), format!("/orgs/{org_id}"), format!("/orgs/{org_id}/receipts")] {
        let shown =
            harness::call(Method::GET, &format!("{}{page}", serve.admin), &[("cookie", &cookie)], None).await;
        assert_eq!(shown.status, StatusCode::OK, "{page}");
        let html = String::from_utf8(shown.body.to_vec()).expect("utf-8");
        if page != format!("/orgs/{org_id}/receipts") {
            assert!(html.contains(r"invoice\u{202e}fdp.exe"), "{page}: the override shown as its escape");
        }
        for raw in ['\u{202e}', '\u{1b}'] {
            let at = html.find(raw).map(|i| &html[i.saturating_sub(120)..(i + 40).min(html.len())]);
            assert_eq!(at, None, "{page}: never as itself");
        }
        if page != "/" {
            assert!(html.contains(r"ci\u{1b}[31mred"), "{page}: the escape sequence shown as its escape");
        }
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_allowlists_and_concurrency_limits_are_set_through_the_cli() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("endpoints");
    let serve = Serve::start(&dir, &mock.url(), &[]);
    let create_org =
        ["orgs", "create", "--name", "a", "--allowed-endpoints", "/v1/chat/completions, /v1/models*"];
    let org = admin_cli(&serve, &dir, &[&create_org[..], &["--max-concurrent-requests", "8"]].concat());
    assert_eq!(org["allowed_endpoints"], json!(["/v1/chat/completions", "/v1/models*"]));
    assert_eq!(org["max_concurrent_requests"], 8);
    let org_id = org["id"].as_str().expect("id").to_owned();
    let provider = ["providers", "set", "--org", &org_id, "--name", "openai", "--kind", "openai"];
    admin_cli(&serve, &dir, &[&provider[..], &["--api-key", "sk-managed-0123456789"]].concat());
    let create_key = ["keys", "create", "--org", &org_id, "--name", "k", "--allowed-endpoints", "/v1/chat/*"];
    let key = admin_cli(&serve, &dir, &[&create_key[..], &["--max-concurrent-requests", "1"]].concat());
    assert_eq!(key["allowed_endpoints"], json!(["/v1/chat/*"]));
    assert_eq!(key["max_concurrent_requests"], 1);
    let key_id = key["id"].as_str().expect("id").to_owned();
    let bearer = format!("Bearer {}", key["secret"].as_str().expect("secret"));
    let models = format!("{}/v1/models", serve.gateway);
    // Polls until a change has reached the gateway.
    let until = |wanted: StatusCode| {
        let (models, bearer) = (models.clone(), bearer.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let (status, body) = call(Method::GET, &models, &[("authorization", &bearer)], None).await;
                if status == wanted {
                    return body;
                }
                assert!(Instant::now() < deadline, "still {status} {body}");
            }
        }
    };
    // The organization lists `/v1/models*`, the key only `/v1/chat/*`: refused.
    let refused = until(StatusCode::FORBIDDEN).await;
    assert_eq!(
        refused,
        json!({"error": {
            "message": "Endpoint '/v1/models' is not allowed for this key.",
            "type": "permission_error",
            "param": null,
            "code": "endpoint_not_allowed"
        }})
    );
    assert!(mock.requests().is_empty(), "refused before the provider");
    let widened = admin_cli(&serve, &dir, &["keys", "update", &key_id, "--allowed-endpoints", "/v1/*"]);
    assert_eq!(widened["allowed_endpoints"], json!(["/v1/*"]));
    assert_eq!(widened["max_concurrent_requests"], 1, "a member left out keeps its value");
    until(StatusCode::OK).await;
    let closed = admin_cli(&serve, &dir, &["orgs", "update", &org_id, "--allowed-endpoints", ""]);
    assert_eq!(
        (closed["allowed_endpoints"].clone(), closed["max_concurrent_requests"].clone()),
        (json!([]), json!(8))
    );
    until(StatusCode::FORBIDDEN).await;
    let opened = admin_cli(&serve, &dir, &["orgs", "update", &org_id, "--allow-all-endpoints"]);
    assert_eq!(opened["allowed_endpoints"], Value::Null);
    let key_open = ["keys", "update", &key_id, "--allow-all-endpoints", "--max-concurrent-requests", "none"];
    let unlimited = admin_cli(&serve, &dir, &key_open);
    assert_eq!(
        (unlimited["allowed_endpoints"].clone(), unlimited["max_concurrent_requests"].clone()),
        (Value::Null, Value::Null)
    );
    until(StatusCode::OK).await;

    // A bad pattern or limit is a 400 naming the field, and changes nothing.
    let token = std::fs::read_to_string(dir.join("admin-token")).expect("token").trim().to_owned();
    let auth = format!("Bearer {token}");
    let key_url = format!("{}/admin/v1/keys/{key_id}", serve.admin);
    for (member, bad) in [
        ("allowed_endpoints", json!(["v1/files"])),
        ("allowed_endpoints", json!(["/v1/*/x"])),
        ("allowed_endpoints", json!("/v1/files")),
        ("max_concurrent_requests", json!(0)),
        ("max_concurrent_requests", json!(-1)),
    ] {
        let (status, body) =
            call(Method::PATCH, &key_url, &[("authorization", &auth)], Some(json!({ member: bad }))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.starts_with(&format!("{member}:")), "{body}");
    }
    let (_, unchanged) = call(Method::GET, &key_url, &[("authorization", &auth)], None).await;
    assert_eq!(
        (unchanged["allowed_endpoints"].clone(), unchanged["max_concurrent_requests"].clone()),
        (Value::Null, Value::Null)
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `recovea admin` pointed at nothing says which URL it tried, and what to check.
#[test]
fn an_admin_call_that_reaches_nothing_names_the_url_it_tried() {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
    let url = format!("http://127.0.0.1:{port}");
    let output = Command::new(BIN)
        .args(["admin", "--admin-url", &url, "--admin-token", TOKEN, "orgs", "list"])
        .env_remove("RECOVEA_ADMIN_TOKEN")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("the admin API at {url}/admin/v1/orgs could not be reached")),
        "{stderr}"
    );
    assert!(stderr.contains("Connection refused") && stderr.contains("--admin-url"), "{stderr}");
    assert!(!stderr.contains(TOKEN), "{stderr}");
}

/// Signed in to `serve`'s console as a browser is: the form, then the session cookie (`name=value`).
async fn console_session(serve: &Serve) -> String {
    let signed_in = harness::call_bytes(
        Method::POST,
        &format!("{}/sign-in", serve.admin),
        &[("content-type", "application/x-www-form-urlencoded")],
        format!("token={TOKEN}").into_bytes(),
    )
    .await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    signed_in.headers["set-cookie"].to_str().expect("ascii").split(';').next().expect("a pair").to_owned()
}

/// The prices page lists hundreds of models: a search keeps those whose name holds the words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prices_page_searches_models_by_name() {
    let mock = MockProvider::start().await;
    let dir = temp_dir("console-prices-search");
    let serve = Serve::start(&dir, &mock.url(), &["--admin-token", TOKEN]);
    let cookie = console_session(&serve).await;
    let page = |query: &'static str| {
        let (serve, cookie) = (&serve, cookie.clone());
        async move {
            let url = format!("{}/prices{query}", serve.admin);
            let answer = harness::call(Method::GET, &url, &[("cookie", &cookie)], None).await;
            assert_eq!(answer.status, StatusCode::OK, "{query}");
            String::from_utf8(answer.body.to_vec()).expect("utf-8")
        }
    };
    let rows = |html: &str| html.matches("<tr data-model=").count();
    let all = page("").await;
    let searched = page("?q=GPT-4o-MINI").await;
    assert!(rows(&all) > 100, "the whole table: {} rows", rows(&all));
    assert!((1..rows(&all)).contains(&rows(&searched)), "{} of {}", rows(&searched), rows(&all));
    for row in searched.split("<tr data-model=\"").skip(1) {
        let model = row.split('"').next().unwrap_or_default();
        assert!(model.to_lowercase().contains("gpt-4o-mini"), "{model}");
    }
    assert!(searched.contains(&format!("{} of {} models", rows(&searched), rows(&all))));
    let none = page("?q=no-such-model-anywhere").await;
    assert_eq!(rows(&none), 0);
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
