//! The receipt ledger on SQLite: a receipt is a row of columns.

use std::collections::BTreeMap;

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{ProviderKey, Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;
use rusqlite::{Connection, Transaction, params};

use super::{SqliteStore, backend, records};
use crate::rows::{self, Columns, DailyKey, DailySums, corrupt, saturating_i64};
use crate::{ReceiptLedger, ReceiptQuery, Result, SpendRow, TagSpendRow, UncountedSpend};

/// A receipt's columns, in the order [`receipt_row`] reads them.
const RECEIPT_COLUMNS: &str = "id, request_id, org_id, key_id, provider, model, endpoint, status, stream,
    input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens, reasoning_tokens,
    cost_nanos, usage_source, priced, price_revision, started_at, finished_at, node_id, priced_as, tags,
    job_id, held_nanos, batch_input, audio_input_tokens, cached_audio_input_tokens, audio_output_tokens,
    quantities, provider_key";

fn receipt_row(row: &dyn Columns) -> Result<Receipt> {
    let status = row.integer(7)?;
    let usage_source = row.text(15)?;
    let mut receipt = Receipt {
        id: row.string(0)?,
        request_id: row.string(1)?,
        org_id: row.string(2)?,
        key_id: row.string(3)?,
        provider: row.string(4)?,
        model: row.optional_string(5)?,
        endpoint: row.string(6)?,
        status: u16::try_from(status).map_err(|_| corrupt(format!("bad status {status} in a receipt")))?,
        stream: row.flag(8)?,
        input_tokens: row.count(9)?,
        output_tokens: row.count(10)?,
        cached_input_tokens: row.count(11)?,
        cache_write_input_tokens: row.count(12)?,
        reasoning_tokens: row.count(13)?,
        cost_usd: Nanos(row.integer(14)?),
        usage_source: UsageSource::parse(usage_source)
            .ok_or_else(|| corrupt(format!("bad usage source {usage_source:?}")))?,
        priced: row.flag(16)?,
        price_revision: row.count(17)?,
        started_at: row.timestamp(18)?,
        finished_at: row.timestamp(19)?,
        node_id: row.string(20)?,
        priced_as: row.optional_string(21)?,
        tags: rows::tags(row, 22)?,
        job_id: row.optional_string(23)?,
        held_usd: row.optional_integer(24)?.map(Nanos),
        batch_input: row
            .optional_string(25)?
            .map(|text| serde_json::from_str(&text).map_err(|e| corrupt(format!("bad batch input: {e}"))))
            .transpose()?,
        audio_input_tokens: row.count(26)?,
        cached_audio_input_tokens: row.count(27)?,
        audio_output_tokens: row.count(28)?,
        provider_key: row
            .optional_string(30)?
            .map(|text| {
                ProviderKey::parse(&text).ok_or_else(|| corrupt(format!("bad provider key {text:?}")))
            })
            .transpose()?,
        ..Receipt::default()
    };
    if let Some(text) = row.optional_string(29)? {
        rows::read_quantities(&text, &mut receipt)?;
    }
    Ok(receipt)
}

/// Inserts the receipts not already present, and adds those it inserted to the daily spend, in
/// the caller's transaction (a settlement's receipts go in with the job they settle); how many
/// were new.
pub(super) fn insert_receipts(tx: &Transaction<'_>, receipts: &[SerializedReceipt]) -> Result<usize> {
    let mut inserted = 0;
    // Only the receipts actually inserted feed the daily spend: a replayed one counts once.
    let mut daily: BTreeMap<DailyKey<'_>, DailySums> = BTreeMap::new();
    let mut stmt = tx
        .prepare_cached(&format!(
            "INSERT OR IGNORE INTO receipts ({RECEIPT_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                     ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31)"
        ))
        .map_err(backend)?;
    for written in receipts {
        let r = written.receipt();
        let added = stmt
            .execute(params![
                r.id,
                r.request_id,
                r.org_id,
                r.key_id,
                r.provider,
                r.model,
                r.endpoint,
                r.status,
                r.stream,
                saturating_i64(r.input_tokens),
                saturating_i64(r.output_tokens),
                saturating_i64(r.cached_input_tokens),
                saturating_i64(r.cache_write_input_tokens),
                saturating_i64(r.reasoning_tokens),
                r.cost_usd.0,
                r.usage_source.as_str(),
                r.priced,
                saturating_i64(r.price_revision),
                r.started_at.0,
                r.finished_at.0,
                r.node_id,
                r.priced_as,
                rows::tags_text(&r.tags),
                r.job_id,
                r.held_usd.map(|held| held.0),
                r.batch_input.as_ref().and_then(|batch| serde_json::to_string(batch).ok()),
                saturating_i64(r.audio_input_tokens),
                saturating_i64(r.cached_audio_input_tokens),
                saturating_i64(r.audio_output_tokens),
                rows::quantities_text(r),
                r.provider_key.map(ProviderKey::as_str),
            ])
            .map_err(backend)?;
        if added > 0 {
            let key =
                (r.org_id.as_str(), rows::day_of(r.started_at.0), r.key_id.as_str(), r.model.as_deref());
            daily.entry(key).or_default().add(r);
        }
        inserted += added;
    }
    let mut add_daily = tx
        .prepare_cached(
            "INSERT INTO spend_daily
             (org_id, day, key_id, model_key, requests, input_tokens, output_tokens, cost_nanos)
             VALUES (?1, ?2, ?3, COALESCE('+' || ?4, ''), ?5, ?6, ?7, ?8)
             ON CONFLICT (org_id, day, key_id, model_key) DO UPDATE SET
                requests = requests + excluded.requests,
                input_tokens = input_tokens + excluded.input_tokens,
                output_tokens = output_tokens + excluded.output_tokens,
                cost_nanos = cost_nanos + excluded.cost_nanos",
        )
        .map_err(backend)?;
    for ((org, day, key, model), sums) in &daily {
        add_daily
            .execute(params![
                org,
                day,
                key,
                model,
                sums.requests,
                sums.input_tokens,
                sums.output_tokens,
                sums.cost_nanos
            ])
            .map_err(backend)?;
    }
    Ok(inserted)
}

impl ReceiptLedger for SqliteStore {
    fn insert_receipts(&self, receipts: &[SerializedReceipt]) -> Result<usize> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let inserted = insert_receipts(&tx, receipts)?;
        tx.commit().map_err(backend)?;
        Ok(inserted)
    }

    fn receipts(&self, q: &ReceiptQuery) -> Result<Vec<Receipt>> {
        let conn = self.conn();
        let (after_time, after_id) = q.after.as_ref().map_or((i64::MIN, ""), |(t, id)| (t.0, id.as_str()));
        // Two statements, not `(?4 IS NULL OR key_id = ?4)`: with that form the planner cannot
        // read one key's receipts by the (org, key, time) index.
        let key_condition = if q.key_id.is_some() { "key_id = ?4" } else { "?4 IS NULL" };
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE org_id = ?1
                 AND started_at >= ?2 AND started_at < ?3
                 AND {key_condition}
                 AND (started_at > ?5 OR (started_at = ?5 AND id > ?6))
                 AND (?8 IS NULL OR instr(',' || tags || ',', ?8) > 0)
                 AND (?9 IS NULL OR model = ?9)
                 AND (?10 IS NULL OR status = ?10)
                 AND (?11 IS NULL OR usage_source = ?11)
                 AND (?12 IS NULL OR provider_key = ?12)
                 ORDER BY started_at, id LIMIT ?7"
            ))
            .map_err(backend)?;
        let found = stmt
            .query(params![
                q.org_id.as_str(),
                q.from.map_or(i64::MIN, |t| t.0),
                q.to.map_or(i64::MAX, |t| t.0),
                q.key_id.as_ref().map(KeyId::as_str),
                after_time,
                after_id,
                q.limit,
                rows::tag_needle(&q.tag),
                q.model.as_deref(),
                q.status,
                q.usage_source.map(UsageSource::as_str),
                q.provider_key.map(ProviderKey::as_str)
            ])
            .map_err(backend)?;
        records(found, receipt_row)
    }

    fn receipt(&self, org: &OrgId, id: &str) -> Result<Option<Receipt>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE id = ?1 AND org_id = ?2"))
            .map_err(backend)?;
        let found = stmt.query(params![id, org.as_str()]).map_err(backend)?;
        Ok(records(found, receipt_row)?.pop())
    }

    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos> {
        spend(&self.conn(), org, key, from, to)
    }

    fn spend_uncounted(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let read = uncounted(&tx, org, key, from, to, counted)?;
        tx.commit().map_err(backend)?;
        Ok(read)
    }

    fn spend_summary(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> Result<Vec<SpendRow>> {
        let conn = self.conn();
        if let Some((first_day, last_day)) = rows::summary_days(from.map(|t| t.0), to.map(|t| t.0)) {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT date(day * 86400, 'unixepoch'), key_id,
                            CASE WHEN model_key = '' THEN NULL ELSE substr(model_key, 2) END,
                            requests, input_tokens, output_tokens, cost_nanos
                     FROM spend_daily WHERE org_id = ?1 AND day >= ?2 AND day < ?3
                     AND (?4 IS NULL OR key_id = ?4)
                     ORDER BY day, key_id, model_key",
                )
                .map_err(backend)?;
            let found = stmt
                .query(params![org.as_str(), first_day, last_day, key.map(KeyId::as_str)])
                .map_err(backend)?;
            return records(found, rows::spend_row);
        }
        let mut stmt = conn
            .prepare_cached(
                "SELECT date(started_at / 1000, 'unixepoch') AS day, key_id, model, COUNT(*),
                        SUM(input_tokens), SUM(output_tokens), SUM(cost_nanos)
                 FROM receipts WHERE org_id = ?1 AND started_at >= ?2 AND started_at < ?3
                 AND (?4 IS NULL OR key_id = ?4)
                 GROUP BY day, key_id, model ORDER BY day, key_id, model",
            )
            .map_err(backend)?;
        let found = stmt
            .query(params![
                org.as_str(),
                from.map_or(i64::MIN, |t| t.0),
                to.map_or(i64::MAX, |t| t.0),
                key.map(KeyId::as_str)
            ])
            .map_err(backend)?;
        records(found, rows::spend_row)
    }

    fn spend_by_tag(
        &self,
        org: &OrgId,
        key_id: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
        key: &str,
    ) -> Result<Vec<TagSpendRow>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT date(started_at / 1000, 'unixepoch') AS day, tags, COUNT(*),
                        SUM(input_tokens), SUM(output_tokens), SUM(cost_nanos)
                 FROM receipts WHERE org_id = ?1 AND started_at >= ?2 AND started_at < ?3
                 AND (?4 IS NULL OR key_id = ?4)
                 GROUP BY day, tags",
            )
            .map_err(backend)?;
        let found = stmt
            .query(params![
                org.as_str(),
                from.map_or(i64::MIN, |t| t.0),
                to.map_or(i64::MAX, |t| t.0),
                key_id.map(KeyId::as_str)
            ])
            .map_err(backend)?;
        Ok(rows::by_tag(records(found, rows::tag_sum_row)?, key))
    }
}

/// [`spend`] less what the spend counters' writers hold ([`counted_by_nodes`]), and the window's
/// latest start, read on `conn` (a transaction of the caller's).
pub(super) fn uncounted(
    conn: &Connection,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
    counted: &[(&str, Timestamp)],
) -> Result<UncountedSpend> {
    let spent = spend(conn, org, key, from, to)?;
    let held = counted_by_nodes(conn, org, key, from, to, counted)?;
    Ok(UncountedSpend {
        spend: Nanos(spent.0.saturating_sub(held.0)),
        last_start: last_start(conn, org, key, from, to)?,
    })
}

/// The part of [`spend`] that the spend counters' writers hold: each `counted` node's receipts
/// that started at or after its time.
fn counted_by_nodes(
    conn: &Connection,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
    counted: &[(&str, Timestamp)],
) -> Result<Nanos> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = ?1
             AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?3 AND started_at < ?4 AND node_id = ?5",
        )
        .map_err(backend)?;
    let mut held = Nanos::ZERO;
    for (node, since) in counted {
        let from = from.max(*since);
        if from < to {
            let sum: i64 = stmt
                .query_row(params![org.as_str(), key.map(KeyId::as_str), from.0, to.0, node], |r| r.get(0))
                .map_err(backend)?;
            held = held.saturating_add(Nanos(sum));
        }
    }
    Ok(held)
}

/// The latest start of a receipt in `[from, to)`, read on `conn` (see [`UncountedSpend`]).
fn last_start(
    conn: &Connection,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Option<Timestamp>> {
    let latest: Option<i64> = conn
        .prepare_cached(
            "SELECT MAX(started_at) FROM receipts WHERE org_id = ?1
             AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?3 AND started_at < ?4",
        )
        .map_err(backend)?
        .query_row(params![org.as_str(), key.map(KeyId::as_str), from.0, to.0], |r| r.get(0))
        .map_err(backend)?;
    Ok(latest.map(Timestamp))
}

/// The sum of the receipts' costs in `[from, to)`, read on `conn` (a transaction of the caller's,
/// for a sum that must agree with other reads).
pub(super) fn spend(
    conn: &Connection,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Nanos> {
    // Whole days from the daily spend, the partial days at either end from the receipts.
    let split = rows::spend_split(from.0, to.0);
    let mut stmt = conn
        .prepare_cached(
            "SELECT
               (SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = ?1
                AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?3 AND started_at < ?4)
             + (SELECT COALESCE(SUM(cost_nanos), 0) FROM spend_daily WHERE org_id = ?1
                AND (?2 IS NULL OR key_id = ?2) AND day >= ?5 AND day < ?6)
             + (SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = ?1
                AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?7 AND started_at < ?8)",
        )
        .map_err(backend)?;
    let total: i64 = stmt
        .query_row(
            params![
                org.as_str(),
                key.map(KeyId::as_str),
                from.0,
                split.head_end,
                split.first_day,
                split.last_day,
                split.tail_start,
                to.0
            ],
            |r| r.get(0),
        )
        .map_err(backend)?;
    Ok(Nanos(total))
}
