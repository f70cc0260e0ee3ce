//! The state nodes are built from, read in one transaction, and the operators' prices in it.

use postgres::GenericClient;
use recovea_core::timestamp::Timestamp;

use super::CAP_COLUMNS;
use crate::audit::{self, AuditContext};
use crate::postgres::{PostgresStore, backend, select};
use crate::rows::{
    self, ACTIVE_KEY_COLUMNS, Columns, ORG_COLUMNS, OrgIds, PRICE_COLUMNS, PROVIDER_COLUMNS, corrupt,
};
use crate::{PriceChange, PriceOverride, Result, State, StoreError};

pub(super) fn state(store: &PostgresStore) -> Result<State> {
    let mut client = store.client()?;
    // One snapshot for every read, so the version matches the rows read with it.
    let mut tx = crate::postgres::snapshot(&mut client)?;
    let version = tx.query_one("SELECT version FROM state_version", &[]).map_err(backend)?.count(0)?;
    let orgs =
        select(&mut tx, &format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at, id"), &[], rows::org)?;
    let org_ids = OrgIds::of(&orgs);
    let active_keys = select(
        &mut tx,
        &format!("SELECT {ACTIVE_KEY_COLUMNS} FROM keys WHERE revoked_at IS NULL ORDER BY created_at, id"),
        &[],
        |row| rows::active_key(row, &org_ids),
    )?;
    let providers = select(
        &mut tx,
        &format!("SELECT {PROVIDER_COLUMNS} FROM providers ORDER BY org_id, name"),
        &[],
        rows::provider,
    )?;
    let price_revision = tx
        .query_one("SELECT COALESCE(MAX(revision), 0)::BIGINT FROM price_log", &[])
        .map_err(backend)?
        .count(0)?;
    let price_overrides = prices_in_force(&mut tx)?;
    let caps =
        select(&mut tx, &format!("SELECT {CAP_COLUMNS} FROM caps ORDER BY created_at, id"), &[], rows::cap)?;
    tx.commit().map_err(backend)?;
    Ok(State { version, orgs, active_keys, providers, price_revision, price_overrides, caps })
}

pub(super) fn change_prices(
    store: &PostgresStore,
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
        let revision = tx
            .query_one("SELECT COALESCE(MAX(revision), 0)::BIGINT + 1 FROM price_log", &[])
            .map_err(backend)?
            .integer(0)?;
        let insert = tx
            .prepare(
                "INSERT INTO price_log (revision, target, name, kind, price, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .map_err(backend)?;
        for (target, name, kind, price) in &log_rows {
            tx.execute(&insert, &[&revision, target, name, kind, price, &at.0]).map_err(backend)?;
        }
        let revision = u64::try_from(revision).map_err(|_| corrupt(format!("bad revision {revision}")))?;
        Ok((revision, Some(audit::price_change(changes, &in_force, revision))))
    })
}

/// The operators' prices in force: the latest row of each target, unless it removed the price.
fn prices_in_force(client: &mut impl GenericClient) -> Result<Vec<PriceOverride>> {
    let sql = format!(
        "SELECT {PRICE_COLUMNS} FROM (
             SELECT DISTINCT ON (target, name) {PRICE_COLUMNS}
             FROM price_log ORDER BY target, name, revision DESC
         ) latest WHERE price IS NOT NULL ORDER BY target, name"
    );
    select(client, &sql, &[], rows::price_override)
}
