//! Black-box test of a full disk: `recovea serve` with its data dir (spool and SQLite ledger) on a
//! small tmpfs (these tests run as root) keeps every receipt while the disk is full, and has a
//! receipt for every completed response once space returns.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use http::{Method, StatusCode};
use recovea_testkit::MockProvider;
use serde_json::json;

#[path = "support/harness.rs"]
mod harness;

use harness::{OPENAI, Serve, call, temp_dir};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456";

/// A tmpfs mounted at a fresh directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Self {
        let dir = temp_dir(name);
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mounting a tmpfs needs root: these tests run as root");
        Self(dir)
    }

    fn filler(&self) -> PathBuf {
        self.0.join("filler")
    }

    /// Fills the disk to its last block.
    fn fill(&self) {
        let mut filler = File::create(self.filler()).expect("filler");
        let block = vec![0u8; 4096];
        while filler.write_all(&block).is_ok() {}
        let _ = filler.sync_all();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn metric(serve: &Serve, name: &str) -> u64 {
    let text = call(Method::GET, &format!("{}/metrics", serve.gateway), &[], None).await.body;
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).expect("the log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_no_receipt_and_every_response_has_one_once_space_returns() {
    const REQUESTS: usize = 300;
    let mock = MockProvider::start().await;
    let disk = Tmpfs::mount("disk-full", "4m");
    let logs = temp_dir("disk-full-log");
    let log = File::create(logs.join("serve.log")).expect("log file");
    let serve = Serve::start_logging(&disk.0, &mock.url(), &["--admin-token", TOKEN], &[], log);
    let tenant = serve.organization(TOKEN, OPENAI).await;
    let (org_id, bearer) = (tenant.org_id.clone(), tenant.bearer());

    disk.fill();
    let chat = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]});
    let url = format!("{}/v1/chat/completions", serve.gateway);
    for _ in 0..REQUESTS {
        let answer = call(Method::POST, &url, &[("authorization", &bearer)], Some(chat.clone())).await;
        assert_eq!(answer.status, StatusCode::OK, "the disk costs no response");
    }
    assert_eq!(metric(&serve, "recovea_receipts_dropped_total").await, 0);
    assert!(
        log_of(&logs).contains("the disk refused a receipt: receipts are held in memory"),
        "the log says the disk refused receipts: {}",
        log_of(&logs)
    );

    std::fs::remove_file(disk.filler()).expect("space freed");
    let what = format!("{REQUESTS} receipts, none held or pending (the node's log is in {logs:?})");
    harness::eventually(Duration::from_secs(30), &what, || async {
        let (_, page) =
            serve.admin_call(TOKEN, Method::GET, &format!("/orgs/{org_id}/receipts?limit=1000"), None).await;
        let receipts = page["receipts"].as_array().map_or(0, Vec::len);
        let (held, pending) =
            (metric(&serve, "recovea_receipts_held").await, metric(&serve, "recovea_receipts_pending").await);
        (receipts == REQUESTS && held == 0 && pending == 0).then_some(())
    })
    .await;
    assert_eq!(metric(&serve, "recovea_receipts_dropped_total").await, 0);
    assert!(!log_of(&logs).contains("receipts lost"), "{}", log_of(&logs));
    drop(serve);
    let _ = std::fs::remove_dir_all(&logs);
}
