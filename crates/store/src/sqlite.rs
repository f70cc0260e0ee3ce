//! The control store, receipt ledger and book of jobs on SQLite: the zero-setup default of
//! `recovea serve`.
//!
//! One connection behind a lock, opened here; the schema is in `migrate`, the three traits in
//! `control`, `ledger` and `jobs`, as on the PostgreSQL side.

mod control;
mod jobs;
mod ledger;
mod migrate;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::types::FromSqlError;
use rusqlite::{Connection, Params, Row, Rows};

use crate::audit::{self, AuditContext};
use crate::rows::Columns;
use crate::{Result, StoreError};

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<Self> {
        Self::with_connection(Connection::open(path).map_err(backend)?)
    }

    pub fn in_memory() -> Result<Self> {
        Self::with_connection(Connection::open_in_memory().map_err(backend)?)
    }

    fn with_connection(mut conn: Connection) -> Result<Self> {
        // First, so that the pragmas and migrations below wait for another opener rather than fail.
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(backend)?;
        // Switching to WAL takes the file's exclusive lock without waiting on the busy handler:
        // another process opening the same fresh file can hold it for a moment.
        let mut attempts = 0;
        while let Err(e) = conn.pragma_update(None, "journal_mode", "WAL") {
            attempts += 1;
            if attempts >= 100 || !e.to_string().contains("locked") {
                return Err(backend(e));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        conn.pragma_update(None, "foreign_keys", "ON").map_err(backend)?;
        migrate::migrate(&mut conn)?;
        Ok(Self { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite itself consistent (transactions roll back),
        // so the poison flag carries no information here.
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `change` in a transaction that also bumps the state version and writes the audit row
    /// `change` gives (none when it changed nothing), then logs that row once it is committed.
    fn change<T>(
        &self,
        audit: &AuditContext,
        change: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<(T, Option<audit::Change>)>,
    ) -> Result<T> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let (out, row) = change(&tx)?;
        let version: i64 = tx
            .query_row("UPDATE state_version SET version = version + 1 RETURNING version", [], |r| r.get(0))
            .map_err(backend)?;
        let entry = row.map(|row| row.entry(audit, u64::try_from(version).unwrap_or(0)));
        if let Some(entry) = &entry {
            control::insert_audit(&tx, entry)?;
        }
        tx.commit().map_err(backend)?;
        drop(conn);
        if let Some(entry) = &entry {
            audit::log(entry);
        }
        Ok(out)
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Every row `sql` selects, each made a record by `record`.
fn select<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    record: impl Fn(&dyn Columns) -> Result<T>,
) -> Result<Vec<T>> {
    let mut statement = conn.prepare(sql).map_err(backend)?;
    records(statement.query(params).map_err(backend)?, record)
}

/// The first row `sql` selects, if any, made a record by `record`.
fn select_optional<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    record: impl Fn(&dyn Columns) -> Result<T>,
) -> Result<Option<T>> {
    let mut statement = conn.prepare(sql).map_err(backend)?;
    let mut rows = statement.query(params).map_err(backend)?;
    rows.next().map_err(backend)?.map(|row| record(row)).transpose()
}

/// The records of `rows`, for statements prepared elsewhere (the ledger's are cached).
fn records<T>(mut rows: Rows<'_>, record: impl Fn(&dyn Columns) -> Result<T>) -> Result<Vec<T>> {
    let mut records = Vec::new();
    while let Some(row) = rows.next().map_err(backend)? {
        records.push(record(row)?);
    }
    Ok(records)
}

impl Columns for Row<'_> {
    fn text(&self, index: usize) -> Result<&str> {
        self.get_ref(index).map_err(backend)?.as_str().map_err(|e| column_type(index, e))
    }

    fn optional_text(&self, index: usize) -> Result<Option<&str>> {
        self.get_ref(index).map_err(backend)?.as_str_or_null().map_err(|e| column_type(index, e))
    }

    fn bytes(&self, index: usize) -> Result<&[u8]> {
        self.get_ref(index).map_err(backend)?.as_blob().map_err(|e| column_type(index, e))
    }

    fn integer(&self, index: usize) -> Result<i64> {
        self.get(index).map_err(backend)
    }

    fn optional_integer(&self, index: usize) -> Result<Option<i64>> {
        self.get(index).map_err(backend)
    }

    fn flag(&self, index: usize) -> Result<bool> {
        self.get(index).map_err(backend)
    }
}

/// A borrowed value of another type than asked: named by its column, as `get`'s errors are.
fn column_type(index: usize, e: FromSqlError) -> StoreError {
    StoreError::Backend(format!("column {index}: {e}"))
}
