//! Deferred jobs and the batch files they read, as columns and back.

use recovea_core::channel::JobKind;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::jobs::BatchInput;
use recovea_core::money::Nanos;

use super::{Columns, corrupt, key_id, org_id};
use crate::{FileRecord, JobRecord, Result, StoreError};

pub(crate) const JOB_COLUMNS: &str = "org_id, provider, job_id, key_id, kind, endpoint, model, request_id, \
     started_at, held_nanos, settled_at, cost_nanos, polls, next_poll_at, last_error";

/// A job, from its [`JOB_COLUMNS`].
pub(crate) fn job(row: &dyn Columns) -> Result<JobRecord> {
    let kind = row.text(4)?;
    let polls = row.count(12)?;
    Ok(JobRecord {
        org_id: org_id(row.text(0)?)?,
        provider: row.string(1)?,
        job_id: row.string(2)?,
        key_id: key_id(row.text(3)?)?,
        kind: JobKind::parse(kind).ok_or_else(|| corrupt(format!("bad job kind {kind:?}")))?,
        endpoint: row.string(5)?,
        model: row.optional_string(6)?,
        request_id: row.string(7)?,
        started_at: row.timestamp(8)?,
        held: Nanos(row.integer(9)?),
        settled_at: row.optional_timestamp(10)?,
        cost: row.optional_integer(11)?.map(Nanos),
        // Only counted up by one per poll: a count past `u32` is years of polls of one job, and
        // stays the largest rather than making the whole book unreadable.
        polls: u32::try_from(polls).unwrap_or(u32::MAX),
        next_poll_at: row.timestamp(13)?,
        last_error: row.optional_string(14)?,
    })
}

/// A job's key (organization, credential, id), ordered by bytes as both databases order those
/// columns.
pub(crate) fn job_key(job: &JobRecord) -> (&str, &str, &str) {
    (job.org_id.as_str(), &job.provider, &job.job_id)
}

pub(crate) fn sort_jobs(jobs: &mut [JobRecord]) {
    jobs.sort_unstable_by(|a, b| job_key(a).cmp(&job_key(b)));
}

pub(crate) const FILE_COLUMNS: &str = "org_id, provider, file_id, created_at, input";

/// A file's key, as [`job_key`].
pub(crate) fn file_key(file: &FileRecord) -> (&str, &str, &str) {
    (file.org_id.as_str(), &file.provider, &file.file_id)
}

pub(crate) fn sort_files(files: &mut [FileRecord]) {
    files.sort_unstable_by(|a, b| file_key(a).cmp(&file_key(b)));
}

/// A batch input file, from its [`FILE_COLUMNS`] (its estimate as JSON).
pub(crate) fn file(row: &dyn Columns) -> Result<FileRecord> {
    Ok(FileRecord {
        org_id: org_id(row.text(0)?)?,
        provider: row.string(1)?,
        file_id: row.string(2)?,
        created_at: row.timestamp(3)?,
        input: serde_json::from_str(row.text(4)?).map_err(|e| corrupt(format!("bad batch input: {e}")))?,
    })
}

/// The stored text of a batch input file's estimate.
pub(crate) fn batch_input_text(input: &BatchInput) -> Result<String> {
    serde_json::to_string(input).map_err(|e| StoreError::Backend(format!("batch input: {e}")))
}

/// A day of settled job spend: org_id, key_id, day and the sum of cost_nanos, in that order.
pub(crate) fn job_spend(row: &dyn Columns) -> Result<(OrgId, KeyId, i64, Nanos)> {
    Ok((org_id(row.text(0)?)?, key_id(row.text(1)?)?, row.integer(2)?, Nanos(row.integer(3)?)))
}
