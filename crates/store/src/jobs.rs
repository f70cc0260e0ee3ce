//! The control plane's deferred jobs as the store keeps them, and the trait that keeps them.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;

use crate::Result;
use crate::ledger::UncountedSpend;

/// A deferred job (a batch, a background response) as the control plane keeps it: pending until
/// it is settled, once, from the provider's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub org_id: OrgId,
    /// The credential it went through, whose provider account runs it.
    pub provider: String,
    /// The provider's id (`batch_...`, `msgbatch_...`, `resp_...`, `batches/...`).
    pub job_id: String,
    pub key_id: KeyId,
    pub kind: recovea_core::channel::JobKind,
    /// The path it was created at, such as `/v1/batches`: its settlement receipts' endpoint.
    pub endpoint: String,
    /// The model its creating request named, if it named one.
    pub model: Option<String>,
    /// The request that created it (its receipt id follows from it).
    pub request_id: String,
    /// When that request started: the windows its hold and its cost count in.
    pub started_at: Timestamp,
    /// The estimate held on every cap covering it while it is pending.
    pub held: Nanos,
    /// Set once, when it is settled; its cost with it.
    pub settled_at: Option<Timestamp>,
    pub cost: Option<Nanos>,
    /// How many times it was polled, and when it is next due.
    pub polls: u32,
    pub next_poll_at: Timestamp,
    /// Why the last poll failed, for operators (never a secret: the poller writes it).
    pub last_error: Option<String>,
}

/// A batch input file uploaded through a node, and the estimate of its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub org_id: OrgId,
    pub provider: String,
    pub file_id: String,
    pub created_at: Timestamp,
    pub input: recovea_core::jobs::BatchInput,
}

/// What the control plane's book of jobs is built from, read in one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BookRows {
    /// Pending jobs, and jobs settled at or after the `settled_since` asked for.
    pub jobs: Vec<JobRecord>,
    /// Files created at or after the `files_since` asked for.
    pub files: Vec<FileRecord>,
    /// Settled jobs' cost by organization, key and UTC day (days since 1970-01-01) of their
    /// creation, from the `first_day` asked for on; days without any left out.
    pub spend: Vec<(OrgId, KeyId, i64, Nanos)>,
}

/// The control plane's jobs: recorded from the receipts of the requests that created them,
/// polled, and settled once. Every change bumps [`JobStore::jobs_version`].
pub trait JobStore: Send + Sync + 'static {
    /// Records these jobs and files, each once: a job or file already recorded (same
    /// organization, credential and id) keeps its first record. Whether any was new.
    fn record_jobs(&self, jobs: &[JobRecord], files: &[FileRecord]) -> Result<bool>;
    /// Grows with every change to jobs or files: cheap enough to poll.
    fn jobs_version(&self) -> Result<u64>;
    /// The book's rows (see [`BookRows`]).
    fn job_book(&self, settled_since: Timestamp, files_since: Timestamp, first_day: i64) -> Result<BookRows>;
    /// Records what a poll of a pending job learned without settling it: how many polls it has
    /// had, when it is next due, and why the last one failed (`None`: it did not, the job is still
    /// running). For operators and for a poller that takes over: the poller schedules in memory
    /// and writes this only when a poll failed or recovers. No version bump (the book does not
    /// show polls). `NotFound` for an unknown job.
    fn job_polled(&self, poll: &JobPoll<'_>) -> Result<()>;
    /// Takes or renews the lease of the job poller for `holder` until `until`: granted when no
    /// other holder's lease runs past `now`. Only the holder polls, so that each credential is
    /// polled at the poller's rate however many control planes share the store.
    fn poller_lease(&self, holder: &str, now: Timestamp, until: Timestamp) -> Result<bool>;
    /// Settles a pending job at `cost`, inserting its settlement `receipts` into the ledger in the
    /// same transaction (idempotently, as `insert_receipts` does). `false`, and nothing written,
    /// when the job is already settled; `NotFound` when there is no such job.
    fn settle_job(
        &self,
        org: &OrgId,
        provider: &str,
        job_id: &str,
        cost: Nanos,
        at: Timestamp,
        receipts: &[SerializedReceipt],
    ) -> Result<bool>;
    /// One job, if recorded.
    fn job(&self, org: &OrgId, provider: &str, job_id: &str) -> Result<Option<JobRecord>>;
    /// An organization's jobs, newest first (by `started_at`, then id), at most `limit`.
    fn jobs(&self, org: &OrgId, limit: u32) -> Result<Vec<JobRecord>>;
    /// The spend in `[from, to)` of an organization (or one of its keys) that the spend counters
    /// hold and their writers do not: every receipt's cost but jobs' settlements (which the book
    /// of jobs holds) and each `counted` node's receipts that started at or after its time (which
    /// its writers hold), read in one transaction with the jobs. What a counter window is rebuilt
    /// from.
    fn counted_spend(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend>;
}

/// A poll of one pending job, as [`JobStore::job_polled`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPoll<'a> {
    pub org_id: &'a OrgId,
    pub provider: &'a str,
    pub job_id: &'a str,
    pub polls: u32,
    pub next_poll_at: Timestamp,
    pub error: Option<&'a str>,
}
