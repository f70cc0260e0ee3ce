//! The receipt ledger on SQLite: a receipt is a row of columns.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;
use rusqlite::{Row, params};

use super::{SqliteStore, backend, corrupt, to_i64};
use crate::{ReceiptLedger, ReceiptQuery, Result, SpendRow};

/// A receipt's columns, in the order [`receipt_row`] reads them.
const RECEIPT_COLUMNS: &str = "id, request_id, org_id, key_id, provider, model, endpoint, status, stream,
    input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens, reasoning_tokens,
    cost_nanos, usage_source, priced, price_revision, started_at, finished_at, node_id, priced_as";

fn receipt_row(row: &Row<'_>) -> rusqlite::Result<Receipt> {
    let count = |i: usize| -> rusqlite::Result<u64> {
        let n: i64 = row.get(i)?;
        u64::try_from(n).map_err(|_| corrupt(format!("a negative count {n} in a receipt")))
    };
    let usage_source: String = row.get(15)?;
    Ok(Receipt {
        id: row.get(0)?,
        request_id: row.get(1)?,
        org_id: row.get(2)?,
        key_id: row.get(3)?,
        provider: row.get(4)?,
        model: row.get(5)?,
        endpoint: row.get(6)?,
        status: row.get(7)?,
        stream: row.get(8)?,
        input_tokens: count(9)?,
        output_tokens: count(10)?,
        cached_input_tokens: count(11)?,
        cache_write_input_tokens: count(12)?,
        reasoning_tokens: count(13)?,
        cost_usd: Nanos(row.get(14)?),
        usage_source: UsageSource::parse(&usage_source)
            .ok_or_else(|| corrupt(format!("bad usage source {usage_source:?}")))?,
        priced: row.get(16)?,
        price_revision: count(17)?,
        started_at: Timestamp(row.get(18)?),
        finished_at: Timestamp(row.get(19)?),
        node_id: row.get(20)?,
        priced_as: row.get(21)?,
    })
}

impl ReceiptLedger for SqliteStore {
    fn insert_receipts(&self, receipts: &[SerializedReceipt]) -> Result<usize> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let mut inserted = 0;
        {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "INSERT OR IGNORE INTO receipts ({RECEIPT_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                             ?18, ?19, ?20, ?21, ?22)"
                ))
                .map_err(backend)?;
            for written in receipts {
                let r = written.receipt();
                inserted += stmt
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
                        to_i64(r.input_tokens),
                        to_i64(r.output_tokens),
                        to_i64(r.cached_input_tokens),
                        to_i64(r.cache_write_input_tokens),
                        to_i64(r.reasoning_tokens),
                        r.cost_usd.0,
                        r.usage_source.as_str(),
                        r.priced,
                        to_i64(r.price_revision),
                        r.started_at.0,
                        r.finished_at.0,
                        r.node_id,
                        r.priced_as,
                    ])
                    .map_err(backend)?;
            }
        }
        tx.commit().map_err(backend)?;
        Ok(inserted)
    }

    fn receipts(&self, q: &ReceiptQuery) -> Result<Vec<Receipt>> {
        let conn = self.conn();
        let (after_time, after_id) = q.after.as_ref().map_or((i64::MIN, ""), |(t, id)| (t.0, id.as_str()));
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE org_id = ?1
                 AND started_at >= ?2 AND started_at < ?3
                 AND (?4 IS NULL OR key_id = ?4)
                 AND (started_at > ?5 OR (started_at = ?5 AND id > ?6))
                 ORDER BY started_at, id LIMIT ?7"
            ))
            .map_err(backend)?;
        let rows = stmt
            .query_map(
                params![
                    q.org_id.as_str(),
                    q.from.map_or(i64::MIN, |t| t.0),
                    q.to.map_or(i64::MAX, |t| t.0),
                    q.key_id.as_ref().map(KeyId::as_str),
                    after_time,
                    after_id,
                    q.limit
                ],
                receipt_row,
            )
            .map_err(backend)?;
        rows.collect::<rusqlite::Result<_>>().map_err(backend)
    }

    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = ?1
                 AND (?2 IS NULL OR key_id = ?2) AND started_at >= ?3 AND started_at < ?4",
            )
            .map_err(backend)?;
        let total: i64 = stmt
            .query_row(params![org.as_str(), key.map(KeyId::as_str), from.0, to.0], |r| r.get(0))
            .map_err(backend)?;
        Ok(Nanos(total))
    }

    fn spend_summary(
        &self,
        org: &OrgId,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> Result<Vec<SpendRow>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT date(started_at / 1000, 'unixepoch') AS day, key_id, model, COUNT(*),
                        SUM(input_tokens), SUM(output_tokens), SUM(cost_nanos)
                 FROM receipts WHERE org_id = ?1 AND started_at >= ?2 AND started_at < ?3
                 GROUP BY day, key_id, model ORDER BY day, key_id, model",
            )
            .map_err(backend)?;
        stmt.query_map(
            params![org.as_str(), from.map_or(i64::MIN, |t| t.0), to.map_or(i64::MAX, |t| t.0)],
            |row| {
                Ok(SpendRow {
                    day: row.get(0)?,
                    key_id: row.get(1)?,
                    model: row.get(2)?,
                    requests: u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
                    input_tokens: u64::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
                    output_tokens: u64::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
                    cost: Nanos(row.get(6)?),
                })
            },
        )
        .map_err(backend)?
        .collect::<rusqlite::Result<_>>()
        .map_err(backend)
    }
}
