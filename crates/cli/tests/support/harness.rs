//! What the black-box tests share: temporary data dirs, a running `recovea serve` read from its
//! banner, a PostgreSQL database of a test's own, and plain HTTP calls. Included by each test file
//! with `#[path]`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// The one bounded poll of these tests, and how long they wait for what comes by itself.
#[allow(unused_imports)]
pub use recovea_testkit::wait::{DEADLINE, eventually};

pub const BIN: &str = env!("CARGO_BIN_EXE_recovea");

/// A fresh directory for one test, named after it and this process.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recovea-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A running `recovea` process, killed (SIGKILL) when dropped.
pub struct Process {
    child: Child,
    /// The banner, up to and including its ready line.
    pub stdout: Vec<String>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// Runs `recovea ARGS` with `envs` and reads its banner up to the line starting with `ready`.
    pub fn start(args: &[&str], envs: &[(&str, &str)], ready: &str) -> Self {
        Self::start_logging(args, envs, ready, Stdio::null())
    }

    /// As [`Self::start`], its log (stderr) going to `log`.
    pub fn start_logging(args: &[&str], envs: &[(&str, &str)], ready: &str, log: impl Into<Stdio>) -> Self {
        let mut command = Command::new(BIN);
        command.args(args);
        Self::spawn(command, args, envs, ready, log)
    }

    /// As [`Self::start`], the process allowed `descriptors` open files (`ulimit -n`).
    pub fn start_with_descriptors(args: &[&str], descriptors: u32, ready: &str) -> Self {
        let mut command = Command::new("sh");
        command.args(["-c", &format!("ulimit -n {descriptors} && exec \"$0\" \"$@\""), BIN]).args(args);
        Self::spawn(command, args, &[], ready, Stdio::null())
    }

    fn spawn(
        mut command: Command,
        args: &[&str],
        envs: &[(&str, &str)],
        ready: &str,
        log: impl Into<Stdio>,
    ) -> Self {
        command.env_remove("RECOVEA_ADMIN_TOKEN").stdout(Stdio::piped()).stderr(log);
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("recovea starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stdout = Vec::new();
        while let Some(Ok(line)) = lines.next() {
            let done = line.starts_with(ready);
            stdout.push(line);
            if done {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        assert!(
            stdout.last().is_some_and(|l| l.starts_with(ready)),
            "recovea {args:?} exited before printing {ready:?}: {stdout:?}"
        );
        Self { child, stdout }
    }

    /// The URL printed after `label` in the banner (an admin URL without its `/admin/v1`).
    pub fn url_after(&self, label: &str) -> String {
        self.stdout
            .iter()
            .find_map(|l| l.strip_prefix(label))
            .map(|rest| {
                let rest = rest.trim();
                rest.split_once(": ").map_or(rest, |(_, url)| url).trim_end_matches("/admin/v1").to_owned()
            })
            .unwrap_or_else(|| panic!("no {label:?} in the banner: {:?}", self.stdout))
    }

    /// The process's id, to read what the kernel says of it under `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no drain, no flush, no goodbye.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `within` for the exit; its status, or `None` if it did not exit.
    pub fn terminate(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM failed");
        // No event tells a process's exit without waiting on it for good: asked every 20 ms.
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

/// A running `recovea serve`.
pub struct Serve {
    pub process: Process,
    pub stdout: Vec<String>,
    pub gateway: String,
    pub admin: String,
}

impl Serve {
    /// Starts `serve` on ports the system picks, sending both providers to `mock_url`, and reads the
    /// addresses it bound from its banner, whose last line (the admin URL) means ready.
    pub fn start(data_dir: &Path, mock_url: &str, extra: &[&str]) -> Self {
        Self::start_logging(data_dir, mock_url, extra, &[], Stdio::null())
    }

    /// As [`Self::start`], with `envs`, its log (stderr) going to `log`.
    pub fn start_logging(
        data_dir: &Path,
        mock_url: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
        log: impl Into<Stdio>,
    ) -> Self {
        let data_dir = data_dir.to_str().expect("a UTF-8 path");
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
        args.extend([
            "--openai-base-url",
            mock_url,
            "--anthropic-base-url",
            mock_url,
            "--data-dir",
            data_dir,
        ]);
        args.extend(extra);
        let process = Process::start_logging(&args, envs, "recovea admin:", log);
        let (gateway, admin) = (process.url_after("recovea gateway:"), process.url_after("recovea admin:"));
        Self { stdout: process.stdout.clone(), process, gateway, admin }
    }

    /// SIGKILL: no drain, no flush, no goodbye.
    pub fn kill(self) {
        self.process.kill();
    }

    /// Runs `recovea admin ARGS` against this serve with `token`; what it printed, once it succeeded.
    pub fn admin_cli(&self, token: &str, args: &[&str]) -> String {
        let output = Command::new(BIN)
            .args(["admin", "--admin-url", &self.admin, "--admin-token", token])
            .args(args)
            .output()
            .expect("admin runs");
        assert!(output.status.success(), "admin {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("utf-8")
    }

    /// One admin API call with `token`: its status and JSON answer (`Null` when not JSON).
    pub async fn admin_call(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let auth = format!("Bearer {token}");
        let answer =
            call(method, &format!("{}/admin/v1{path}", self.admin), &[("authorization", &auth)], body).await;
        (answer.status, answer.json())
    }
}

/// The managed OpenAI key most tests give their organization.
pub const MANAGED_OPENAI: &str = "sk-managed-0123456789";
/// The credentials most tests give their organization: OpenAI's, managed.
pub const OPENAI: &[(&str, &str)] = &[("openai", MANAGED_OPENAI)];

/// An organization set up through the admin API ([`Serve::organization`]): its id, and its key's.
pub struct Tenant {
    pub org_id: String,
    pub key_id: String,
    pub secret: String,
}

impl Tenant {
    /// `Bearer <secret>`: the key as a client sends it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.secret)
    }
}

impl Serve {
    /// One admin API call with `token` that must succeed: its JSON answer.
    pub async fn admin_ok(&self, token: &str, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.admin_call(token, method, path, body).await;
        assert!(status.is_success(), "{path}: {status} {value}");
        value
    }

    /// The set-up the tests share: an organization with a key and, for each `(kind, api_key)` of
    /// `credentials`, a managed provider credential, made with `token`.
    pub async fn organization(&self, token: &str, credentials: &[(&str, &str)]) -> Tenant {
        let org =
            self.admin_ok(token, Method::POST, "/orgs", Some(serde_json::json!({"name": "acme"}))).await;
        let org_id = org["id"].as_str().expect("id").to_owned();
        let keys = format!("/orgs/{org_id}/keys");
        let key = self.admin_ok(token, Method::POST, &keys, Some(serde_json::json!({"name": "k"}))).await;
        for (kind, api_key) in credentials {
            let credential = serde_json::json!({"kind": kind, "api_key": api_key});
            self.admin_ok(token, Method::PUT, &format!("/orgs/{org_id}/providers/{kind}"), Some(credential))
                .await;
        }
        let (key_id, secret) = (key["id"].as_str().expect("id"), key["secret"].as_str().expect("secret"));
        Tenant { org_id, key_id: key_id.to_owned(), secret: secret.to_owned() }
    }

    /// A cap on the whole of organization `org_id` for `window` (`day`, `month`...) at `limit_usd`,
    /// armed (`hard_stop`) or not: the cap as created.
    pub async fn org_cap(
        &self,
        token: &str,
        org_id: &str,
        window: &str,
        limit_usd: &str,
        hard_stop: bool,
    ) -> Value {
        let cap = serde_json::json!({
            "scope": "organization", "window": window, "limit_usd": limit_usd, "hard_stop": hard_stop
        });
        self.admin_ok(token, Method::POST, &format!("/orgs/{org_id}/caps"), Some(cap)).await
    }
}

/// An HTTP answer, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A PostgreSQL database of the test's own, dropped at the end. Panics when PostgreSQL is absent.
pub struct Database {
    server: String,
    name: String,
}

impl Database {
    pub fn create() -> Self {
        let server = std::env::var("RECOVEA_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let name = format!("recovea_test_{:016x}", fastrand::u64(..));
        // The blocking client runs its own runtime: keep it off the test's.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut admin = postgres::Client::connect(&format!("{server}/postgres"), postgres::NoTls)
                    .unwrap_or_else(|e| panic!("these tests need PostgreSQL at {server}: {e}"));
                admin.batch_execute(&format!("CREATE DATABASE {name}")).expect("CREATE DATABASE");
            });
        });
        Self { server, name }
    }

    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    /// The database's URL with its server reached at `addr` instead (a relay in front of it).
    pub fn url_via(&self, addr: std::net::SocketAddr) -> String {
        format!("postgres://postgres@{addr}/{}", self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        std::thread::scope(|s| {
            s.spawn(|| {
                let url = format!("{}/postgres", self.server);
                if let Ok(mut admin) = postgres::Client::connect(&url, postgres::NoTls) {
                    let _ =
                        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
                }
            });
        });
    }
}

/// A client that keeps its connections open between requests (one per request in flight).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One request with a raw body on a fresh connection, its answer read to the end.
pub async fn call_bytes(method: Method, url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = http_client()
        .request(request.body(Full::new(Bytes::from(body))).expect("request"))
        .await
        .expect("answer");
    let (status, headers) = (response.status(), response.headers().clone());
    Answer { status, headers, body: response.into_body().collect().await.expect("body").to_bytes() }
}

/// One request on a fresh connection, its answer read to the end.
pub async fn call(method: Method, url: &str, headers: &[(&str, &str)], body: Option<Value>) -> Answer {
    call_on(&http_client(), method, url, headers, body).await
}

/// One request through `client` (on a connection it keeps), its answer read to the end.
pub async fn call_on(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let response = client.request(request.body(Full::new(body)).expect("request")).await.expect("answer");
    let (status, headers) = (response.status(), response.headers().clone());
    Answer { status, headers, body: response.into_body().collect().await.expect("body").to_bytes() }
}
