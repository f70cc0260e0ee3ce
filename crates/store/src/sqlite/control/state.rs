//! The state nodes are built from, read in one transaction, and the operators' prices in it.

use recovea_core::timestamp::Timestamp;
use rusqlite::{Connection, params};

use super::CAP_COLUMNS;
use crate::audit::{self, AuditContext};
use crate::rows::{self, ACTIVE_KEY_COLUMNS, ORG_COLUMNS, OrgIds, PRICE_COLUMNS, PROVIDER_COLUMNS};
use crate::sqlite::{SqliteStore, backend, select};
use crate::{PriceChange, PriceOverride, Result, State, StoreError};

pub(super) fn state(store: &SqliteStore) -> Result<State> {
    let mut conn = store.conn();
    // One read transaction, so the version matches the rows read with it.
    let tx = conn.transaction().map_err(backend)?;
    let version: i64 =
        tx.query_row("SELECT version FROM state_version", [], |r| r.get(0)).map_err(backend)?;
    let orgs = select(&tx, &format!("SELECT {ORG_COLUMNS} FROM orgs"), [], rows::org)?;
    let org_ids = OrgIds::of(&orgs);
    let active_keys =
        select(&tx, &format!("SELECT {ACTIVE_KEY_COLUMNS} FROM keys WHERE revoked_at IS NULL"), [], |row| {
            rows::active_key(row, &org_ids)
        })?;
    let providers = select(&tx, &format!("SELECT {PROVIDER_COLUMNS} FROM providers"), [], rows::provider)?;
    let price_revision: i64 = tx
        .query_row("SELECT COALESCE(MAX(revision), 0) FROM price_log", [], |r| r.get(0))
        .map_err(backend)?;
    let price_overrides = prices_in_force(&tx)?;
    let caps = select(&tx, &format!("SELECT {CAP_COLUMNS} FROM caps"), [], rows::cap)?;
    tx.commit().map_err(backend)?;
    Ok(State {
        caps,
        version: u64::try_from(version).unwrap_or(0),
        orgs,
        active_keys,
        providers,
        price_revision: u64::try_from(price_revision).unwrap_or(0),
        price_overrides,
    })
}

pub(super) fn change_prices(
    store: &SqliteStore,
    changes: &[PriceChange],
    at: Timestamp,
    audit: &AuditContext,
) -> Result<u64> {
    let log_rows = rows::price_rows(changes)?;
    store.change(audit, |tx| {
        let in_force = prices_in_force(tx)?;
        if !rows::removes_only_prices_in_force(&log_rows, &in_force) {
            return Err(StoreError::NotFound);
        }
        let revision: i64 = tx
            .query_row("SELECT COALESCE(MAX(revision), 0) + 1 FROM price_log", [], |r| r.get(0))
            .map_err(backend)?;
        let mut insert = tx
            .prepare(
                "INSERT INTO price_log (revision, target, name, kind, price, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(backend)?;
        for (target, name, kind, price) in &log_rows {
            insert.execute(params![revision, target, name, kind, price, at.0]).map_err(backend)?;
        }
        let revision = u64::try_from(revision).unwrap_or(0);
        Ok((revision, Some(audit::price_change(changes, &in_force, revision))))
    })
}

/// The operators' prices in force: the latest row of each target, unless it removed the price.
fn prices_in_force(conn: &Connection) -> Result<Vec<PriceOverride>> {
    let sql = format!(
        "SELECT {PRICE_COLUMNS} FROM price_log p
         WHERE price IS NOT NULL AND revision =
             (SELECT MAX(revision) FROM price_log q WHERE q.target = p.target AND q.name = p.name)
         ORDER BY target, name"
    );
    select(conn, &sql, [], rows::price_override)
}
