//! The control plane's part of deferred jobs: the jobs and batch files that receipts announce,
//! recorded in the store; the book built from the store, which nodes follow (and `serve`'s node
//! gets in memory); and the poller that settles each job from the provider's own usage
//! (`jobs/poller.rs`).
//!
//! The store is the one truth: every change lands there first, and the book is read back from it
//! (at once by the replica that made the change, within [`REFRESH_EVERY`] by the others), then
//! sent to nodes as the changes since the sequence each holds.

mod poller;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use recovea_core::caps::Cap;
use recovea_core::channel::{self, Channel, JobKind, RequestLine};
use recovea_core::jobs::{BookLog, BookMessage, FileWire, JobBook, JobWire, book_key, spend_key};
use recovea_core::money::Nanos;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use recovea_store::{BookRows, FileRecord, JobRecord, JobStore};
use tokio::sync::watch;

pub use poller::{PollerSettings, ProviderDefaults};

/// How often a replica reads the store's jobs version, to follow what other replicas change.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// How long a settled job stays in the book by itself (its cost stays in the day's spend): long
/// enough for every node that held it to see it there.
const SETTLED_KEPT: Duration = Duration::from_secs(60 * 60);
/// How long a batch input file can be named by a batch after its upload.
const FILES_KEPT: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Installs a new book in the node of this process (`serve`).
pub type InstallBook = Arc<dyn Fn(JobBook) + Send + Sync>;

/// The book and what keeps it.
pub struct Jobs {
    store: Arc<dyn JobStore>,
    log: Mutex<BookLog>,
    /// The book's sequence, for nodes waiting on a change.
    seq: watch::Sender<u64>,
    /// The store's jobs version the book was last read at (`u64::MAX`: never).
    read_at: AtomicU64,
    install: Mutex<Option<InstallBook>>,
    limit: Duration,
    /// The pending jobs' records as the book was last read, under the book's sequence: what the
    /// poller schedules.
    pending: Mutex<(u64, Arc<Vec<JobRecord>>)>,
}

impl Jobs {
    /// The jobs kept in `store`, each store call within `limit`.
    pub fn new(store: Arc<dyn JobStore>, limit: Duration) -> Arc<Self> {
        // Tells this process's book from any other's: a node moving between replicas gets the
        // whole book rather than changes numbered another way.
        let epoch = crate::random::bytes::<8>().map_or_else(|_| now().0.unsigned_abs(), u64::from_le_bytes);
        Arc::new(Self {
            store,
            log: Mutex::new(BookLog::new(epoch)),
            seq: watch::Sender::new(0),
            read_at: AtomicU64::new(u64::MAX),
            install: Mutex::new(None),
            limit,
            pending: Mutex::new((0, Arc::new(Vec::new()))),
        })
    }

    /// Every new book also goes to `install` (the node of this process).
    pub fn install_into(&self, install: InstallBook) {
        install(self.book());
        *self.install.lock().unwrap_or_else(PoisonError::into_inner) = Some(install);
    }

    /// The book as it is now.
    pub fn book(&self) -> JobBook {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).book().clone()
    }

    /// How many jobs hold their estimate.
    pub fn pending(&self) -> usize {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .book()
            .jobs
            .values()
            .filter(|job| !job.settled)
            .count()
    }

    pub(crate) fn store(&self) -> &Arc<dyn JobStore> {
        &self.store
    }

    /// The pending jobs as the book was last read, and the book's sequence then (it moves with
    /// every change to the set).
    pub(crate) fn pending_jobs(&self) -> (u64, Arc<Vec<JobRecord>>) {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        (pending.0, Arc::clone(&pending.1))
    }

    /// What the book holds on `cap`'s window containing `at`: the estimates of its pending jobs.
    pub fn held(&self, cap: &Cap, at: Timestamp) -> Nanos {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).book().held(cap, at)
    }

    /// Records the jobs and files that `batch`'s receipts announce (a receipt naming a job and
    /// what it holds: its request created it; one naming a batch file: its request uploaded
    /// it), idempotently. Blocks: call it off the async workers. Whether any was new.
    pub fn record(&self, batch: &[SerializedReceipt], poll_after: Duration) -> recovea_store::Result<bool> {
        let mut jobs = Vec::new();
        let mut files = Vec::new();
        for receipt in batch.iter().map(SerializedReceipt::receipt) {
            let (Some(org_id), Some(key_id)) = (
                recovea_core::ids::OrgId::parse(&receipt.org_id),
                recovea_core::ids::KeyId::parse(&receipt.key_id),
            ) else {
                continue;
            };
            if let (Some(job_id), Some(held)) = (&receipt.job_id, receipt.held_usd)
                && let Some(kind) = job_kind(&receipt.endpoint)
            {
                jobs.push(JobRecord {
                    org_id: org_id.clone(),
                    provider: receipt.provider.clone(),
                    job_id: job_id.clone(),
                    key_id: key_id.clone(),
                    kind,
                    endpoint: receipt.endpoint.clone(),
                    model: receipt.model.clone(),
                    request_id: receipt.request_id.clone(),
                    started_at: receipt.started_at,
                    held,
                    settled_at: None,
                    cost: None,
                    polls: 0,
                    next_poll_at: Timestamp(receipt.finished_at.0.saturating_add(millis(poll_after))),
                    last_error: None,
                });
            }
            if let Some(batch_file) = &receipt.batch_input {
                files.push(FileRecord {
                    org_id,
                    provider: receipt.provider.clone(),
                    file_id: batch_file.file_id.clone(),
                    created_at: receipt.started_at,
                    input: batch_file.input.clone(),
                });
            }
        }
        if jobs.is_empty() && files.is_empty() {
            return Ok(false);
        }
        self.store.record_jobs(&jobs, &files)
    }

    /// Reads the book back from the store and, when it changed, publishes it.
    pub async fn refresh(&self) -> recovea_store::Result<()> {
        let store = Arc::clone(&self.store);
        let read = crate::bounded::off_thread(self.limit, move || {
            let version = store.jobs_version()?;
            let now = now();
            let settled_since = Timestamp(now.0.saturating_sub(millis(SETTLED_KEPT)));
            let files_since = Timestamp(now.0.saturating_sub(millis(FILES_KEPT)));
            // The month before this one: a week window reaches at most six days into it.
            let first_day =
                recovea_core::jobs::day_of(Window::Month.start(Timestamp(Window::Month.start(now).0 - 1)));
            Ok((version, store.job_book(settled_since, files_since, first_day)?))
        })
        .await?;
        let (version, rows) = read;
        let pending: Vec<JobRecord> =
            rows.jobs.iter().filter(|job| job.settled_at.is_none()).cloned().collect();
        let published = {
            let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
            log.replace(book_of(rows)).then(|| log.book().clone())
        };
        self.read_at.store(version, Ordering::Release);
        if let Some(book) = published {
            let seq = book.seq;
            *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = (seq, Arc::new(pending));
            let install = self.install.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(install) = install {
                install(book);
            }
            self.seq.send_replace(seq);
        }
        Ok(())
    }

    /// Follows the store until `shutdown`: reads the book again whenever its jobs version moves
    /// (another replica's change), and at least once a minute (settled jobs and old files leave
    /// the book with time).
    pub async fn keep_fresh(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(REFRESH_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut since_full = 0_u32;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut shutdown => return,
            }
            since_full += 1;
            let store = Arc::clone(&self.store);
            let version = crate::bounded::off_thread(self.limit, move || store.jobs_version()).await;
            let moved = version.is_ok_and(|v| v != self.read_at.load(Ordering::Acquire));
            if moved || since_full >= 60 {
                since_full = 0;
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "reading the book of jobs failed; retrying");
                }
            }
        }
    }

    /// Answers a node holding the book `epoch` at `seq`: the changes since (or the whole book),
    /// or `None` when nothing changed within `wait`.
    pub(crate) async fn poll(&self, epoch: u64, held: Option<u64>, wait: Duration) -> Option<Bytes> {
        let mut seq = self.seq.subscribe();
        let behind = |current: &u64| held.is_none_or(|held| held != *current);
        let current_epoch = self.log.lock().unwrap_or_else(PoisonError::into_inner).book().epoch;
        if epoch == current_epoch && !behind(&seq.borrow_and_update()) {
            let _ = tokio::time::timeout(wait, seq.wait_for(behind)).await;
            if !behind(&seq.borrow()) {
                return None;
            }
        }
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let message = match held.and_then(|held| log.changes_since(epoch, held)) {
            Some(changes) => BookMessage::Changes(changes),
            None => BookMessage::Book(log.book().clone()),
        };
        Some(Bytes::from(serde_json::to_vec(&message).unwrap_or_default()))
    }
}

/// The kind of job created at `endpoint` (a receipt's), if it is one.
fn job_kind(endpoint: &str) -> Option<JobKind> {
    let line = RequestLine {
        method: &http::Method::POST,
        upstream_path: endpoint,
        websocket: false,
        background: true,
    };
    match channel::classify(line) {
        Channel::Deferred(kind) => Some(kind),
        _ => None,
    }
}

/// The book nodes follow, from the store's rows.
fn book_of(rows: BookRows) -> JobBook {
    let mut book = JobBook::default();
    for job in rows.jobs {
        let key = book_key(job.org_id.as_str(), &job.provider, &job.job_id);
        let wire = JobWire {
            org_id: job.org_id,
            key_id: job.key_id,
            started_at_ms: job.started_at.0,
            held_nanos: job.held.0,
            settled: job.settled_at.is_some(),
        };
        book.jobs.insert(key, wire);
    }
    for file in rows.files {
        let key = book_key(file.org_id.as_str(), &file.provider, &file.file_id);
        book.files.insert(
            key,
            FileWire { org_id: file.org_id, created_at_ms: file.created_at.0, input: file.input },
        );
    }
    for (org, key, day, nanos) in rows.spend {
        book.spend.insert(spend_key(&org, &key, day), nanos.0);
    }
    book
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_endpoints_name_their_jobs_kind() {
        assert_eq!(job_kind("/v1/batches"), Some(JobKind::OpenAiBatch));
        assert_eq!(job_kind("/openai/batches"), Some(JobKind::OpenAiBatch));
        assert_eq!(job_kind("/v1/messages/batches"), Some(JobKind::AnthropicBatch));
        assert_eq!(
            job_kind("/v1beta/models/gemini-2.5-flash:batchGenerateContent"),
            Some(JobKind::GeminiBatch)
        );
        assert_eq!(job_kind("/v1/responses"), Some(JobKind::BackgroundResponse));
        assert_eq!(job_kind("/v1/chat/completions"), None);
    }
}
