//! What the black-box tests share: temporary data dirs, a running `recovea serve` read from its
//! banner, and plain HTTP calls. Included by each test file with `#[path]`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_recovea");

/// A fresh directory for one test, named after it and this process.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recovea-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A running `recovea serve`, killed (SIGKILL) when dropped.
pub struct Serve {
    child: Child,
    /// The banner, up to and including its last line.
    pub stdout: Vec<String>,
    pub gateway: String,
    pub admin: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `serve` on ports the system picks, sending both providers to `mock_url`, and reads the
    /// addresses it bound from its banner, whose last line (the admin URL) means ready.
    pub fn start(data_dir: &Path, mock_url: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(["--openai-base-url", mock_url, "--anthropic-base-url", mock_url])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env_remove("RECOVEA_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("recovea starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stdout = Vec::new();
        while let Some(Ok(line)) = lines.next() {
            let done = line.starts_with("recovea admin:");
            stdout.push(line);
            if done {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let url_after = |label: &str| {
            stdout
                .iter()
                .find_map(|l| l.strip_prefix(label))
                .map(|rest| rest.trim().trim_end_matches("/admin/v1").to_owned())
                .unwrap_or_else(|| panic!("serve did not print {label:?}: {stdout:?}"))
        };
        let (gateway, admin) = (url_after("recovea gateway:"), url_after("recovea admin:"));
        Self { child, stdout, gateway, admin }
    }

    /// SIGKILL: no drain, no flush, no goodbye.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// One request on a fresh connection, its answer read to the end.
pub async fn call(method: Method, url: &str, headers: &[(&str, &str)], body: Option<Value>) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let response = client.request(request.body(Full::new(body)).expect("request")).await.expect("answer");
    let (status, headers) = (response.status(), response.headers().clone());
    Answer { status, headers, body: response.into_body().collect().await.expect("body").to_bytes() }
}
