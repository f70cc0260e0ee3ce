//! The node's side of the book of deferred jobs: follow the control plane's book (the whole book,
//! then changes), install each sequence, and keep the last one on disk so that a node restarted
//! while the control plane is away still counts every job's hold at the line.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use recovea_core::jobs::{BookMessage, BookPoll, JobBook};
use tokio::sync::watch;

use crate::control_link::ControlLink;
use crate::node::Gateway;

/// The file a node keeps its last book in, inside its data dir. Plain JSON: the book holds ids
/// and amounts, no secret.
pub const SAVED_BOOK_FILE: &str = "jobs.book";
/// How long a poll of the book may wait for a change.
const POLL_WAIT: Duration = Duration::from_secs(1);
const POLL_SLACK: Duration = Duration::from_secs(60);
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// The least time between two saves of the book: under a burst of jobs it changes many times a
/// second, and only the newest is written.
const SAVE_EVERY: Duration = Duration::from_millis(200);

impl Gateway {
    /// Loads the book saved in `data_dir`, if any, and counts it until the feed brings a newer one.
    pub fn boot_book_from_saved(&self, data_dir: &Path) {
        let path = data_dir.join(SAVED_BOOK_FILE);
        let Ok(bytes) = std::fs::read(&path) else { return };
        match serde_json::from_slice::<JobBook>(&bytes) {
            Ok(book) => {
                tracing::info!(
                    jobs = book.jobs.len(),
                    "counting the saved book of jobs until the feed answers"
                );
                self.install_book(book);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "the saved book of jobs does not read; ignored")
            }
        }
    }
}

/// Follows the control plane's book until `shutdown`: polls, applies, installs, saves.
pub async fn follow_book(
    gateway: Gateway,
    link: Arc<ControlLink>,
    data_dir: PathBuf,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (to_save, saving) = watch::channel(None);
    let saver = tokio::spawn(save_books(saving, data_dir.join(SAVED_BOOK_FILE)));
    let booted = gateway.book();
    let mut held: Option<JobBook> = (booted.seq > 0).then(|| (*booted).clone());
    let mut retry = RETRY_FIRST;
    loop {
        let poll = BookPoll {
            epoch: held.as_ref().map_or(0, |book| book.epoch),
            seq: held.as_ref().map(|book| book.seq),
            wait_ms: u64::try_from(POLL_WAIT.as_millis()).unwrap_or(u64::MAX),
        };
        let answer = tokio::select! {
            answer = link.post("/feed/v1/jobs", &poll, POLL_WAIT + POLL_SLACK) => answer,
            () = &mut shutdown => break,
        };
        let outcome = match answer {
            Ok((StatusCode::NO_CONTENT, _)) => Ok(false),
            Ok((StatusCode::OK, body)) => match serde_json::from_slice::<BookMessage>(&body) {
                Ok(message) => apply(&mut held, message),
                Err(e) => Err(format!("the book of jobs came unreadable: {e}")),
            },
            Ok((status, body)) => {
                Err(format!("the book of jobs answered {status}: {}", crate::control_link::one_line(&body)))
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(changed) => {
                retry = RETRY_FIRST;
                if changed && let Some(book) = &held {
                    gateway.install_book(book.clone());
                    to_save.send_replace(Some(book.clone()));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the book of jobs is unavailable; counting the last one");
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = &mut shutdown => break,
                }
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
    drop(to_save);
    let _ = saver.await;
}

/// Applies one message to the held book; whether it changed.
fn apply(held: &mut Option<JobBook>, message: BookMessage) -> Result<bool, String> {
    match message {
        BookMessage::Book(book) => {
            *held = Some(book);
            Ok(true)
        }
        BookMessage::Changes(changes) => {
            let Some(book) = held.as_mut() else { return Err("changes came for no book".into()) };
            if let Err(e) = book.apply(changes) {
                // Forget it, so that the next poll asks for the whole book.
                *held = None;
                return Err(format!("changes for sequence {} do not apply to {}", e.from, e.held));
            }
            Ok(true)
        }
    }
}

/// Writes the newest book to `path` at most every [`SAVE_EVERY`], replacing the file atomically;
/// the last one too when the follower stops.
async fn save_books(mut books: watch::Receiver<Option<JobBook>>, path: PathBuf) {
    let mut written = None;
    loop {
        let following = books.changed().await.is_ok();
        let Some(book) = books.borrow_and_update().clone() else {
            if following {
                continue;
            }
            return;
        };
        if written != Some((book.epoch, book.seq)) {
            written = Some((book.epoch, book.seq));
            save(&path, book).await;
        }
        if !following {
            return;
        }
        tokio::time::sleep(SAVE_EVERY).await;
    }
}

async fn save(path: &Path, book: JobBook) {
    let target = path.to_path_buf();
    let saved = tokio::task::spawn_blocking(move || {
        let bytes = serde_json::to_vec(&book).map_err(std::io::Error::other)?;
        super::write_atomically(&target, &bytes)
    })
    .await;
    if !matches!(saved, Ok(Ok(()))) {
        tracing::warn!(path = %path.display(), "the book of jobs could not be saved");
    }
}
