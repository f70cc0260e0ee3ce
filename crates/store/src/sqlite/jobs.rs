//! The book of deferred jobs on SQLite: jobs, batch input files and their version.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{SqliteStore, backend, ledger, select, select_optional};
use crate::rows::{self, FILE_COLUMNS, JOB_COLUMNS};
use crate::{BookRows, FileRecord, JobPoll, JobRecord, JobStore, Result, StoreError, UncountedSpend};

impl JobStore for SqliteStore {
    fn record_jobs(&self, jobs: &[JobRecord], files: &[FileRecord]) -> Result<bool> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let mut inserted = 0;
        {
            let mut insert_job = tx
                .prepare_cached(&format!(
                    "INSERT INTO jobs ({JOB_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
                     ON CONFLICT DO NOTHING"
                ))
                .map_err(backend)?;
            for job in jobs {
                inserted += insert_job
                    .execute(params![
                        job.org_id.as_str(),
                        job.provider,
                        job.job_id,
                        job.key_id.as_str(),
                        job.kind.as_str(),
                        job.endpoint,
                        job.model,
                        job.request_id,
                        job.started_at.0,
                        job.held.0,
                        job.settled_at.map(|t| t.0),
                        job.cost.map(|cost| cost.0),
                        job.polls,
                        job.next_poll_at.0,
                        job.last_error,
                    ])
                    .map_err(backend)?;
            }
            let mut insert_file = tx
                .prepare_cached(&format!(
                    "INSERT INTO batch_files ({FILE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING"
                ))
                .map_err(backend)?;
            for file in files {
                inserted += insert_file
                    .execute(params![
                        file.org_id.as_str(),
                        file.provider,
                        file.file_id,
                        file.created_at.0,
                        rows::batch_input_text(&file.input)?,
                    ])
                    .map_err(backend)?;
            }
        }
        if inserted > 0 {
            bump_version(&tx)?;
        }
        tx.commit().map_err(backend)?;
        Ok(inserted > 0)
    }

    fn jobs_version(&self) -> Result<u64> {
        let version: i64 =
            self.conn().query_row("SELECT version FROM jobs_version", [], |r| r.get(0)).map_err(backend)?;
        Ok(u64::try_from(version).unwrap_or(0))
    }

    fn job_book(&self, settled_since: Timestamp, files_since: Timestamp, first_day: i64) -> Result<BookRows> {
        let mut conn = self.conn();
        // One read transaction: the spend by day agrees with the settled jobs read with it.
        let tx = conn.transaction().map_err(backend)?;
        // Two selects rather than one with `OR`, each by its own partial index. Jobs and files are
        // sorted here: asked for the order of their key, SQLite scans the whole table in that
        // order to spare a sort rather than read the few rows an index finds.
        let mut jobs = select(
            &tx,
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE settled_at IS NULL
                 UNION ALL
                 SELECT {JOB_COLUMNS} FROM jobs WHERE settled_at >= ?1"
            ),
            [settled_since.0],
            rows::job,
        )?;
        rows::sort_jobs(&mut jobs);
        let mut files = select(
            &tx,
            &format!("SELECT {FILE_COLUMNS} FROM batch_files WHERE created_at >= ?1"),
            [files_since.0],
            rows::file,
        )?;
        rows::sort_files(&mut files);
        // The day as `spend_daily` keys it: floored, in UTC.
        let spend = select(
            &tx,
            "SELECT org_id, key_id,
                    (started_at - ((started_at % 86400000) + 86400000) % 86400000) / 86400000 AS day,
                    SUM(cost_nanos)
             FROM jobs WHERE started_at >= ?1 AND day >= ?2 AND settled_at IS NOT NULL
             GROUP BY org_id, key_id, day HAVING SUM(cost_nanos) <> 0
             ORDER BY org_id, key_id, day",
            params![rows::day_start(first_day), first_day],
            rows::job_spend,
        )?;
        tx.commit().map_err(backend)?;
        Ok(BookRows { jobs, files, spend })
    }

    fn job_polled(&self, poll: &JobPoll<'_>) -> Result<()> {
        let changed = self
            .conn()
            .execute(
                "UPDATE jobs SET polls = ?4, next_poll_at = ?5, last_error = ?6
                 WHERE org_id = ?1 AND provider = ?2 AND job_id = ?3",
                params![
                    poll.org_id.as_str(),
                    poll.provider,
                    poll.job_id,
                    poll.polls,
                    poll.next_poll_at.0,
                    poll.error
                ],
            )
            .map_err(backend)?;
        if changed == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    fn poller_lease(&self, holder: &str, now: Timestamp, until: Timestamp) -> Result<bool> {
        let granted = self
            .conn()
            .execute(
                "INSERT INTO job_poller (id, holder, lease_until) VALUES (1, ?1, ?3)
                 ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
                 WHERE job_poller.holder = excluded.holder OR job_poller.lease_until <= ?2",
                params![holder, now.0, until.0],
            )
            .map_err(backend)?;
        Ok(granted > 0)
    }

    fn settle_job(
        &self,
        org: &OrgId,
        provider: &str,
        job_id: &str,
        cost: Nanos,
        at: Timestamp,
        receipts: &[SerializedReceipt],
    ) -> Result<bool> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        // The update is the claim: of two settlements of one job, the second finds it settled and
        // inserts nothing, so a settlement's receipts never land without the job turning settled.
        let settled = tx
            .execute(
                "UPDATE jobs SET settled_at = ?4, cost_nanos = ?5
                 WHERE org_id = ?1 AND provider = ?2 AND job_id = ?3 AND settled_at IS NULL",
                params![org.as_str(), provider, job_id, at.0, cost.0],
            )
            .map_err(backend)?;
        if settled == 0 {
            // Dropping the transaction rolls it back: it wrote nothing.
            return if job_exists(&tx, org, provider, job_id)? {
                Ok(false)
            } else {
                Err(StoreError::NotFound)
            };
        }
        ledger::insert_receipts(&tx, receipts)?;
        bump_version(&tx)?;
        tx.commit().map_err(backend)?;
        Ok(true)
    }

    fn job(&self, org: &OrgId, provider: &str, job_id: &str) -> Result<Option<JobRecord>> {
        select_optional(
            &self.conn(),
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE org_id = ?1 AND provider = ?2 AND job_id = ?3"),
            params![org.as_str(), provider, job_id],
            rows::job,
        )
    }

    fn jobs(&self, org: &OrgId, limit: u32) -> Result<Vec<JobRecord>> {
        select(
            &self.conn(),
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE org_id = ?1
                 ORDER BY started_at DESC, job_id DESC, provider DESC LIMIT ?2"
            ),
            params![org.as_str(), limit],
            rows::job,
        )
    }

    fn counted_spend(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend> {
        let mut conn = self.conn();
        // One read transaction: a settlement committed between the two reads would otherwise be
        // subtracted without its receipts, or the other way round.
        let tx = conn.transaction().map_err(backend)?;
        let read = ledger::uncounted(&tx, org, key, from, to, counted)?;
        let settled: i64 = tx
            .prepare_cached(
                "SELECT COALESCE(SUM(cost_nanos), 0) FROM jobs WHERE org_id = ?1
                 AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?3 AND started_at < ?4
                 AND settled_at IS NOT NULL",
            )
            .map_err(backend)?
            .query_row(params![org.as_str(), key.map(KeyId::as_str), from.0, to.0], |r| r.get(0))
            .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(UncountedSpend { spend: Nanos(read.spend.0.saturating_sub(settled)), ..read })
    }
}

fn bump_version(tx: &Transaction<'_>) -> Result<()> {
    tx.execute("UPDATE jobs_version SET version = version + 1", []).map_err(backend)?;
    Ok(())
}

fn job_exists(conn: &Connection, org: &OrgId, provider: &str, job_id: &str) -> Result<bool> {
    conn.query_row(
        "SELECT 1 FROM jobs WHERE org_id = ?1 AND provider = ?2 AND job_id = ?3",
        params![org.as_str(), provider, job_id],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
    .map_err(backend)
}
