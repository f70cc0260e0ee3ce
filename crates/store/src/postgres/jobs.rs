//! The book of deferred jobs on PostgreSQL: jobs, batch input files and their version.

use postgres::{GenericClient, Transaction};
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::timestamp::Timestamp;

use super::{PostgresStore, backend, ledger, select, select_optional};
use crate::rows::{self, Columns, FILE_COLUMNS, JOB_COLUMNS};
use crate::{BookRows, FileRecord, JobPoll, JobRecord, JobStore, Result, StoreError, UncountedSpend};

impl JobStore for PostgresStore {
    fn record_jobs(&self, jobs: &[JobRecord], files: &[FileRecord]) -> Result<bool> {
        if jobs.is_empty() && files.is_empty() {
            return Ok(false);
        }
        // In key order, so that two replicas recording overlapping batches wait on each other's
        // rows in one order rather than deadlock; stable, so that of one key twice in a batch the
        // first is the one kept.
        let mut jobs: Vec<&JobRecord> = jobs.iter().collect();
        jobs.sort_by_key(|job| rows::job_key(job));
        let mut files: Vec<&FileRecord> = files.iter().collect();
        files.sort_by_key(|file| rows::file_key(file));
        let inputs =
            files.iter().map(|file| rows::batch_input_text(&file.input)).collect::<Result<Vec<_>>>()?;

        let mut client = self.client()?;
        let mut tx = client.transaction().map_err(backend)?;
        let mut inserted = 0;
        if !jobs.is_empty() {
            let text = |f: fn(&JobRecord) -> &str| jobs.iter().map(|job| f(job)).collect::<Vec<_>>();
            let optional =
                |f: fn(&JobRecord) -> Option<&str>| jobs.iter().map(|job| f(job)).collect::<Vec<_>>();
            let number = |f: fn(&JobRecord) -> i64| jobs.iter().map(|job| f(job)).collect::<Vec<_>>();
            let optional_number =
                |f: fn(&JobRecord) -> Option<i64>| jobs.iter().map(|job| f(job)).collect::<Vec<_>>();
            inserted += tx
                .execute(
                    &format!(
                        "INSERT INTO jobs ({JOB_COLUMNS})
                         SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                                              $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::BIGINT[], $10::BIGINT[],
                                              $11::BIGINT[], $12::BIGINT[], $13::BIGINT[], $14::BIGINT[],
                                              $15::TEXT[])
                         ON CONFLICT DO NOTHING"
                    ),
                    &[
                        &text(|job| job.org_id.as_str()),
                        &text(|job| &job.provider),
                        &text(|job| &job.job_id),
                        &text(|job| job.key_id.as_str()),
                        &text(|job| job.kind.as_str()),
                        &text(|job| &job.endpoint),
                        &optional(|job| job.model.as_deref()),
                        &text(|job| &job.request_id),
                        &number(|job| job.started_at.0),
                        &number(|job| job.held.0),
                        &optional_number(|job| job.settled_at.map(|t| t.0)),
                        &optional_number(|job| job.cost.map(|cost| cost.0)),
                        &number(|job| i64::from(job.polls)),
                        &number(|job| job.next_poll_at.0),
                        &optional(|job| job.last_error.as_deref()),
                    ],
                )
                .map_err(backend)?;
        }
        if !files.is_empty() {
            let text = |f: fn(&FileRecord) -> &str| files.iter().map(|file| f(file)).collect::<Vec<_>>();
            inserted += tx
                .execute(
                    &format!(
                        "INSERT INTO batch_files ({FILE_COLUMNS})
                         SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[])
                         ON CONFLICT DO NOTHING"
                    ),
                    &[
                        &text(|file| file.org_id.as_str()),
                        &text(|file| &file.provider),
                        &text(|file| &file.file_id),
                        &files.iter().map(|file| file.created_at.0).collect::<Vec<_>>(),
                        &inputs,
                    ],
                )
                .map_err(backend)?;
        }
        if inserted > 0 {
            bump_version(&mut tx)?;
        }
        tx.commit().map_err(backend)?;
        Ok(inserted > 0)
    }

    fn jobs_version(&self) -> Result<u64> {
        self.client()?.query_one("SELECT version FROM jobs_version", &[]).map_err(backend)?.count(0)
    }

    fn job_book(&self, settled_since: Timestamp, files_since: Timestamp, first_day: i64) -> Result<BookRows> {
        let mut client = self.client()?;
        // One snapshot: the spend by day agrees with the settled jobs read with it.
        let mut tx = super::snapshot(&mut client)?;
        // Two selects rather than one with `OR`: each reads its own partial index.
        let jobs = select(
            &mut tx,
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE settled_at IS NULL
                 UNION ALL
                 SELECT {JOB_COLUMNS} FROM jobs WHERE settled_at >= $1
                 ORDER BY org_id, provider, job_id"
            ),
            &[&settled_since.0],
            rows::job,
        )?;
        let files = select(
            &mut tx,
            &format!(
                "SELECT {FILE_COLUMNS} FROM batch_files WHERE created_at >= $1 ORDER BY org_id, provider, file_id"
            ),
            &[&files_since.0],
            rows::file,
        )?;
        // The day as `spend_daily`'s trigger computes it: floored, in UTC.
        let spend = select(
            &mut tx,
            "SELECT org_id, key_id, floor(started_at / 86400000.0)::BIGINT AS day, SUM(cost_nanos)::BIGINT
             FROM jobs WHERE started_at >= $1 AND floor(started_at / 86400000.0)::BIGINT >= $2
             AND settled_at IS NOT NULL
             GROUP BY org_id, key_id, day HAVING SUM(cost_nanos) <> 0
             ORDER BY org_id, key_id, day",
            &[&rows::day_start(first_day), &first_day],
            rows::job_spend,
        )?;
        tx.commit().map_err(backend)?;
        Ok(BookRows { jobs, files, spend })
    }

    fn job_polled(&self, poll: &JobPoll<'_>) -> Result<()> {
        let changed = self
            .client()?
            .execute(
                "UPDATE jobs SET polls = $4, next_poll_at = $5, last_error = $6
                 WHERE org_id = $1 AND provider = $2 AND job_id = $3",
                &[
                    &poll.org_id.as_str(),
                    &poll.provider,
                    &poll.job_id,
                    &i64::from(poll.polls),
                    &poll.next_poll_at.0,
                    &poll.error,
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
            .client()?
            .execute(
                "INSERT INTO job_poller (id, holder, lease_until) VALUES (1, $1, $3)
                 ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
                 WHERE job_poller.holder = excluded.holder OR job_poller.lease_until <= $2",
                &[&holder, &now.0, &until.0],
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
        let mut client = self.client()?;
        let mut tx = client.transaction().map_err(backend)?;
        // The update is the claim: a concurrent settlement of the same job waits on its row, then
        // finds it settled and inserts nothing, so a settlement's receipts never land twice nor
        // without the job turning settled.
        let settled = tx
            .execute(
                "UPDATE jobs SET settled_at = $4, cost_nanos = $5
                 WHERE org_id = $1 AND provider = $2 AND job_id = $3 AND settled_at IS NULL",
                &[&org.as_str(), &provider, &job_id, &at.0, &cost.0],
            )
            .map_err(backend)?;
        if settled == 0 {
            // Dropping the transaction rolls it back: it wrote nothing.
            return if job_exists(&mut tx, org, provider, job_id)? {
                Ok(false)
            } else {
                Err(StoreError::NotFound)
            };
        }
        ledger::insert_receipts(&mut tx, receipts)?;
        bump_version(&mut tx)?;
        tx.commit().map_err(backend)?;
        Ok(true)
    }

    fn job(&self, org: &OrgId, provider: &str, job_id: &str) -> Result<Option<JobRecord>> {
        select_optional(
            &mut *self.client()?,
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE org_id = $1 AND provider = $2 AND job_id = $3"),
            &[&org.as_str(), &provider, &job_id],
            rows::job,
        )
    }

    fn jobs(&self, org: &OrgId, limit: u32) -> Result<Vec<JobRecord>> {
        select(
            &mut *self.client()?,
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE org_id = $1
                 ORDER BY started_at DESC, job_id DESC, provider DESC LIMIT $2"
            ),
            &[&org.as_str(), &i64::from(limit)],
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
        let mut client = self.client()?;
        // One snapshot: a settlement committed between the two reads would otherwise be
        // subtracted without its receipts, or the other way round.
        let mut tx = super::snapshot(&mut client)?;
        let read = ledger::uncounted(&mut tx, org, key, from, to, counted)?;
        let settled = tx
            .query_one(
                "SELECT COALESCE(SUM(cost_nanos), 0)::BIGINT FROM jobs WHERE org_id = $1
                 AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $3 AND started_at < $4
                 AND settled_at IS NOT NULL",
                &[&org.as_str(), &key.map(KeyId::as_str), &from.0, &to.0],
            )
            .map_err(backend)?
            .integer(0)?;
        tx.commit().map_err(backend)?;
        Ok(UncountedSpend { spend: Nanos(read.spend.0.saturating_sub(settled)), ..read })
    }
}

fn bump_version(tx: &mut Transaction<'_>) -> Result<()> {
    tx.execute("UPDATE jobs_version SET version = version + 1", &[]).map_err(backend)?;
    Ok(())
}

fn job_exists(client: &mut impl GenericClient, org: &OrgId, provider: &str, job_id: &str) -> Result<bool> {
    let found = client
        .query_opt(
            "SELECT 1 FROM jobs WHERE org_id = $1 AND provider = $2 AND job_id = $3",
            &[&org.as_str(), &provider, &job_id],
        )
        .map_err(backend)?;
    Ok(found.is_some())
}
