//! The control store and receipt ledger on SQLite: the zero-setup default of `recovea serve`.
//!
//! One connection behind a lock, opened here; the schema is in `migrate`, the two traits in
//! `control` and `ledger`, as on the PostgreSQL side.

mod control;
mod ledger;
mod migrate;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

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

    /// Runs `change` in a transaction that also bumps the state version.
    fn change<T>(&self, change: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(backend)?;
        let out = change(&tx)?;
        tx.execute("UPDATE state_version SET version = version + 1", []).map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(out)
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn corrupt(message: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, message.into())
}

/// Counts past `i64::MAX` (SQLite's largest integer) are stored as that: no real count comes near.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
