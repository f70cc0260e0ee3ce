//! The receipt ledger on PostgreSQL: a receipt is a few columns to select and sum by, beside its
//! JSON text as it came.

use postgres::GenericClient;
use recovea_core::ids::{KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;

use super::{PostgresStore, backend, select, select_optional};
use crate::rows::{self, Columns, saturating_i64};
use crate::{ReceiptLedger, ReceiptQuery, Result, SpendRow, StoreError, TagSpendRow, UncountedSpend};

/// Inserts the receipts not already present, on `client` (a settlement's transaction, for its
/// receipts to go in with the job they settle); how many were new.
pub(super) fn insert_receipts(
    client: &mut impl GenericClient,
    written: &[SerializedReceipt],
) -> Result<usize> {
    if written.is_empty() {
        return Ok(0);
    }
    let receipts: Vec<&Receipt> = written.iter().map(SerializedReceipt::receipt).collect();
    let bodies: Vec<&str> = written.iter().map(SerializedReceipt::json).collect();
    let column = |f: fn(&Receipt) -> &str| receipts.iter().map(|r| f(r)).collect::<Vec<_>>();
    let number = |f: fn(&Receipt) -> i64| receipts.iter().map(|r| f(r)).collect::<Vec<_>>();
    // One statement for the batch; a receipt already present (or twice in the batch) is skipped.
    // The table's trigger adds the receipts it inserted to the daily spend (migration 7).
    let inserted = client
        .execute(
            "INSERT INTO receipts
             (id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos, body, tags)
             SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::BIGINT[],
                                  $7::BIGINT[], $8::BIGINT[], $9::TEXT[], $10::TEXT[])
             ON CONFLICT DO NOTHING",
            &[
                &column(|r| &r.id),
                &column(|r| &r.org_id),
                &column(|r| &r.key_id),
                &number(|r| r.started_at.0),
                &receipts.iter().map(|r| r.model.as_deref()).collect::<Vec<_>>(),
                &number(|r| saturating_i64(r.input_tokens)),
                &number(|r| saturating_i64(r.output_tokens)),
                &number(|r| r.cost_usd.0),
                &bodies,
                &receipts.iter().map(|r| rows::tags_text(&r.tags)).collect::<Vec<_>>(),
            ],
        )
        .map_err(backend)?;
    Ok(usize::try_from(inserted).unwrap_or(usize::MAX))
}

impl ReceiptLedger for PostgresStore {
    fn insert_receipts(&self, written: &[SerializedReceipt]) -> Result<usize> {
        if written.is_empty() {
            return Ok(0);
        }
        insert_receipts(&mut *self.client()?, written)
    }

    fn receipts(&self, q: &ReceiptQuery) -> Result<Vec<Receipt>> {
        let (after_time, after_id) = q.after.as_ref().map_or((i64::MIN, ""), |(t, id)| (t.0, id.as_str()));
        // Two statements, not `($4 IS NULL OR key_id = $4)`: a generic plan of that form does not
        // read one key's receipts by the (org, key, time) index.
        let key_condition = if q.key_id.is_some() { "key_id = $4" } else { "$4::TEXT IS NULL" };
        // Nor a cursor condition on a first page: `(started_at, id) > (i64::MIN, '')` became the
        // index scan's start, before `from`, and one key's last day read all its receipts (208 ms
        // against 0.25 ms at 1M receipts).
        let cursor_condition = if q.after.is_some() {
            "(started_at, id) > ($5, $6)"
        } else {
            "$5::BIGINT IS NOT NULL AND $6::TEXT IS NOT NULL"
        };
        select(
            &mut *self.client()?,
            &format!(
                "SELECT body FROM receipts WHERE org_id = $1
                 AND started_at >= $2 AND started_at < $3
                 AND {key_condition}
                 AND {cursor_condition}
                 AND ($8::TEXT IS NULL OR strpos(',' || tags || ',', $8) > 0)
                 AND ($9::TEXT IS NULL OR model = $9)
                 AND ($10::INT IS NULL OR (body::jsonb ->> 'status')::INT = $10)
                 AND ($11::TEXT IS NULL OR body::jsonb ->> 'usage_source' = $11)
                 AND ($12::TEXT IS NULL OR body::jsonb ->> 'provider_key' = $12)
                 ORDER BY started_at, id LIMIT $7"
            ),
            &[
                &q.org_id.as_str(),
                &q.from.map_or(i64::MIN, |t| t.0),
                &q.to.map_or(i64::MAX, |t| t.0),
                &q.key_id.as_ref().map(KeyId::as_str),
                &after_time,
                &after_id,
                &i64::from(q.limit),
                &rows::tag_needle(&q.tag),
                &q.model.as_deref(),
                // Status, usage source and provider key are not columns here: read from the receipt's JSON, row
                // by row in the (org, time) order of the index, until the page is full.
                &q.status.map(i32::from),
                &q.usage_source.map(UsageSource::as_str),
                &q.provider_key.map(recovea_core::receipt::ProviderKey::as_str),
            ],
            |row| {
                serde_json::from_str(row.text(0)?)
                    .map_err(|e| StoreError::Backend(format!("a stored receipt does not parse: {e}")))
            },
        )
    }

    fn receipt(&self, org: &OrgId, id: &str) -> Result<Option<Receipt>> {
        select_optional(
            &mut *self.client()?,
            "SELECT body FROM receipts WHERE id = $1 AND org_id = $2",
            &[&id, &org.as_str()],
            |row| {
                serde_json::from_str(row.text(0)?)
                    .map_err(|e| StoreError::Backend(format!("a stored receipt does not parse: {e}")))
            },
        )
    }

    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos> {
        spend(&mut *self.client()?, org, key, from, to)
    }

    fn spend_uncounted(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend> {
        let mut client = self.client()?;
        let mut tx = super::snapshot(&mut client)?;
        let read = uncounted(&mut tx, org, key, from, to, counted)?;
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
        if let Some((first_day, last_day)) = rows::summary_days(from.map(|t| t.0), to.map(|t| t.0)) {
            return select(
                &mut *self.client()?,
                "SELECT to_char(to_timestamp(day * 86400) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), key_id,
                        CASE WHEN model_key = '' THEN NULL ELSE substr(model_key, 2) END,
                        requests, input_tokens, output_tokens, cost_nanos
                 FROM spend_daily WHERE org_id = $1 AND day >= $2 AND day < $3
                 AND ($4::TEXT IS NULL OR key_id = $4)
                 ORDER BY day, key_id, model_key",
                &[&org.as_str(), &first_day, &last_day, &key.map(KeyId::as_str)],
                rows::spend_row,
            );
        }
        // The day of `started_at / 1000` whole seconds (truncated toward zero), in UTC: as SQLite's
        // `date(started_at / 1000, 'unixepoch')`; a missing model sorts first, as NULLs do in SQLite.
        select(
            &mut *self.client()?,
            "SELECT to_char(to_timestamp(started_at / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, key_id, model,
                    COUNT(*), SUM(input_tokens)::BIGINT, SUM(output_tokens)::BIGINT, SUM(cost_nanos)::BIGINT
             FROM receipts WHERE org_id = $1 AND started_at >= $2 AND started_at < $3
             AND ($4::TEXT IS NULL OR key_id = $4)
             GROUP BY day, key_id, model ORDER BY day, key_id, model NULLS FIRST",
            &[
                &org.as_str(),
                &from.map_or(i64::MIN, |t| t.0),
                &to.map_or(i64::MAX, |t| t.0),
                &key.map(KeyId::as_str),
            ],
            rows::spend_row,
        )
    }

    fn spend_by_tag(
        &self,
        org: &OrgId,
        key_id: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
        key: &str,
    ) -> Result<Vec<TagSpendRow>> {
        let sums = select(
            &mut *self.client()?,
            "SELECT to_char(to_timestamp(started_at / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, tags,
                    COUNT(*), SUM(input_tokens)::BIGINT, SUM(output_tokens)::BIGINT, SUM(cost_nanos)::BIGINT
             FROM receipts WHERE org_id = $1 AND started_at >= $2 AND started_at < $3
             AND ($4::TEXT IS NULL OR key_id = $4)
             GROUP BY day, tags",
            &[
                &org.as_str(),
                &from.map_or(i64::MIN, |t| t.0),
                &to.map_or(i64::MAX, |t| t.0),
                &key_id.map(KeyId::as_str),
            ],
            rows::tag_sum_row,
        )?;
        Ok(rows::by_tag(sums, key))
    }
}

/// [`spend`] less what the spend counters' writers hold ([`counted_by_nodes`]), and the window's
/// latest start, read on `client` (a snapshot of the caller's).
pub(super) fn uncounted(
    client: &mut impl GenericClient,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
    counted: &[(&str, Timestamp)],
) -> Result<UncountedSpend> {
    let spent = spend(client, org, key, from, to)?;
    let held = counted_by_nodes(client, org, key, from, to, counted)?;
    Ok(UncountedSpend {
        spend: Nanos(spent.0.saturating_sub(held.0)),
        last_start: last_start(client, org, key, from, to)?,
    })
}

/// The part of [`spend`] that the spend counters' writers hold: each `counted` node's receipts
/// that started at or after its time. The node is read from the receipt itself, on the few
/// minutes to days since a writer began counting, and only when a window is rebuilt.
fn counted_by_nodes(
    client: &mut impl GenericClient,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
    counted: &[(&str, Timestamp)],
) -> Result<Nanos> {
    let mut held = Nanos::ZERO;
    for (node, since) in counted {
        let from = from.max(*since);
        if from >= to {
            continue;
        }
        let row = client
            .query_one(
                "SELECT COALESCE(SUM(cost_nanos), 0)::BIGINT FROM receipts WHERE org_id = $1
                 AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $3 AND started_at < $4
                 AND body::json->>'node_id' = $5",
                &[&org.as_str(), &key.map(KeyId::as_str), &from.0, &to.0, node],
            )
            .map_err(backend)?;
        held = held.saturating_add(Nanos(row.integer(0)?));
    }
    Ok(held)
}

/// The latest start of a receipt in `[from, to)`, read on `client` (see [`UncountedSpend`]).
fn last_start(
    client: &mut impl GenericClient,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Option<Timestamp>> {
    let row = client
        .query_one(
            "SELECT MAX(started_at) FROM receipts WHERE org_id = $1
             AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $3 AND started_at < $4",
            &[&org.as_str(), &key.map(KeyId::as_str), &from.0, &to.0],
        )
        .map_err(backend)?;
    Ok(row.get::<_, Option<i64>>(0).map(Timestamp))
}

/// The sum of the receipts' costs in `[from, to)`, read on `client` (a transaction of the
/// caller's, for a sum that must agree with other reads).
pub(super) fn spend(
    client: &mut impl GenericClient,
    org: &OrgId,
    key: Option<&KeyId>,
    from: Timestamp,
    to: Timestamp,
) -> Result<Nanos> {
    // Whole days from the daily spend, the partial days at either end from the receipts.
    let split = rows::spend_split(from.0, to.0);
    let row = client
        .query_one(
            "SELECT ((SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = $1
                      AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $3 AND started_at < $4)
                   + (SELECT COALESCE(SUM(cost_nanos), 0) FROM spend_daily WHERE org_id = $1
                      AND ($2::TEXT IS NULL OR key_id = $2) AND day >= $5 AND day < $6)
                   + (SELECT COALESCE(SUM(cost_nanos), 0) FROM receipts WHERE org_id = $1
                      AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $7 AND started_at < $8)
                   )::BIGINT",
            &[
                &org.as_str(),
                &key.map(KeyId::as_str),
                &from.0,
                &split.head_end,
                &split.first_day,
                &split.last_day,
                &split.tail_start,
                &to.0,
            ],
        )
        .map_err(backend)?;
    Ok(Nanos(row.integer(0)?))
}
