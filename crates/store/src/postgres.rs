//! The control store, receipt ledger and book of jobs on PostgreSQL: one database shared by
//! several control replicas.
//!
//! The pool and its bounds are here; the schema is in `migrate`, the three traits in `control`,
//! `ledger` and `jobs`, as on the SQLite side.
//!
//! Same tables, same meanings as [`SqliteStore`](crate::SqliteStore): money and counts are `BIGINT`,
//! times `BIGINT` unix milliseconds. Every change bumps the state version in its own transaction, so a
//! replica that polls [`ControlStore::version`] sees the changes any other replica made.
//!
//! **TLS** with rustls, as libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` (in the URL or
//! the `PGSSL*` variables) say: see [`tls`].
//!
//! **Blocking.** Like the trait, every call blocks (the `postgres` client runs its own small runtime
//! per connection): call [`PostgresStore::connect`] and the methods from a blocking thread
//! (`spawn_blocking`), never from inside an async task.

mod control;
mod jobs;
mod ledger;
mod migrate;
pub mod tls;

use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, GenericClient, NoTls, Row, Transaction};

use crate::audit::{self, AuditContext};
use crate::rows::Columns;
use crate::{Result, StoreError};

/// Connections a store keeps open at most, unless told otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;

/// How long a store call may take, unless told otherwise: statements past it are cancelled by
/// the server, and a call waits at most this long for a free connection.
pub const DEFAULT_BOUNDS: Bounds = Bounds {
    max_connections: DEFAULT_MAX_CONNECTIONS,
    pool_wait: Duration::from_secs(2),
    statement_timeout: Duration::from_secs(5),
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle connection is closed after this long: a database restarted meanwhile is met afresh.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How much a store may hold and wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at most (at least 1).
    pub max_connections: usize,
    /// How long a call waits for a connection: a free one, or a new one being opened.
    pub pool_wait: Duration,
    /// The server cancels a statement that runs longer (`statement_timeout`).
    pub statement_timeout: Duration,
}

type Pool = r2d2::Pool<Connector>;

/// Opens the pool's connections and tells the broken ones.
struct Connector {
    config: postgres::Config,
    /// `None`: `sslmode=disable`.
    tls: Option<tls::MakeRustls>,
}

/// Why a connection could not be opened: the whole chain of causes (the server's message among
/// them), which the pool keeps as text for the call that finds no connection.
#[derive(Debug)]
struct ConnectError(String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

impl r2d2::ManageConnection for Connector {
    type Connection = Client;
    type Error = ConnectError;

    fn connect(&self) -> std::result::Result<Client, ConnectError> {
        match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(NoTls),
        }
        .map_err(|e| ConnectError(chain(&e)))
    }

    fn is_valid(&self, client: &mut Client) -> std::result::Result<(), ConnectError> {
        client.simple_query("").map(drop).map_err(|e| ConnectError(chain(&e)))
    }

    fn has_broken(&self, client: &mut Client) -> bool {
        client.is_closed()
    }
}

pub struct PostgresStore {
    /// Always `Some` but in `drop`, which closes the connections off the caller's thread.
    pool: Option<Pool>,
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:5432/dbname`, or the `host=... dbname=...`
    /// form), brings the schema up to date, and keeps connections within [`DEFAULT_BOUNDS`].
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_bounded(url, DEFAULT_BOUNDS)
    }

    /// As [`connect`](Self::connect), within `bounds`.
    pub fn connect_bounded(url: &str, bounds: Bounds) -> Result<Self> {
        let (url, settings) =
            tls::split(url, |name| std::env::var(name).ok()).map_err(StoreError::Backend)?;
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let tls = tls::MakeRustls::new(&settings, home.as_deref()).map_err(StoreError::Backend)?;
        let mut config: postgres::Config = url.parse().map_err(backend)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT.min(bounds.pool_wait.max(Duration::from_secs(1))));
        }
        if config.get_application_name().is_none() {
            config.application_name("recovea");
        }
        let timeout = format!("-c statement_timeout={}", bounds.statement_timeout.as_millis().max(1));
        let options = match config.get_options() {
            Some(given) => format!("{given} {timeout}"),
            None => timeout,
        };
        config.options(&options);
        let pool = r2d2::Pool::builder()
            .max_size(u32::try_from(bounds.max_connections.max(1)).unwrap_or(u32::MAX))
            // Opened on demand: a store made while the database is down still starts, and fails
            // its calls until the database is back.
            .min_idle(Some(0))
            .connection_timeout(bounds.pool_wait)
            // A broken connection is known without a round trip (`is_closed`) and dropped; a round
            // trip before every call would double the latency of most of them.
            .test_on_check_out(false)
            .idle_timeout(Some(IDLE_TIMEOUT))
            .error_handler(Box::new(LogErrors))
            .build_unchecked(Connector { config, tls });
        let store = Self { pool: Some(pool) };
        migrate::migrate(&mut *store.client()?)?;
        Ok(store)
    }

    fn pool(&self) -> &Pool {
        self.pool.as_ref().unwrap_or_else(|| unreachable!("the pool is only taken on drop"))
    }

    /// A connection, within the pool wait.
    fn client(&self) -> Result<r2d2::PooledConnection<Connector>> {
        self.pool().get().map_err(|e| StoreError::Unavailable(format!("no database connection: {e}")))
    }

    /// Runs `change` in a transaction that also bumps the state version and writes the audit row
    /// `change` gives (none when it changed nothing), then logs that row once it is committed.
    ///
    /// The version row is locked first: changes from every replica take turns, so versions and price
    /// revisions are handed out in commit order.
    fn change<T>(
        &self,
        audit: &AuditContext,
        change: impl FnOnce(&mut Transaction<'_>) -> Result<(T, Option<audit::Change>)>,
    ) -> Result<T> {
        let mut client = self.client()?;
        let mut tx = client.transaction().map_err(backend)?;
        let version = tx
            .query_one("UPDATE state_version SET version = version + 1 RETURNING version", &[])
            .map_err(backend)?
            .count(0)?;
        let (out, row) = change(&mut tx)?;
        let entry = row.map(|row| row.entry(audit, version));
        if let Some(entry) = &entry {
            control::insert_audit(&mut tx, entry)?;
        }
        tx.commit().map_err(backend)?;
        if let Some(entry) = &entry {
            audit::log(entry);
        }
        Ok(out)
    }
}

/// A read-only transaction on one snapshot, for reads that must agree with each other.
fn snapshot(client: &mut postgres::Client) -> Result<postgres::Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(backend)
}

/// The error with its causes: `postgres` keeps the server's message in the source chain.
/// A failed call: `Unavailable` when the database could not be reached or did not answer in
/// time (the call may be retried as it is), `Backend` otherwise.
fn backend(e: postgres::Error) -> StoreError {
    use postgres::error::SqlState;

    let message = chain(&e);
    let mut source = std::error::Error::source(&e);
    let mut io = false;
    while let Some(cause) = source {
        io |= cause.is::<std::io::Error>();
        source = cause.source();
    }
    let unreachable = [SqlState::QUERY_CANCELED, SqlState::ADMIN_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW];
    if io || e.is_closed() || e.code().is_some_and(|code| unreachable.contains(code)) {
        StoreError::Unavailable(message)
    } else {
        StoreError::Backend(message)
    }
}

/// An error and its causes, `: `-separated.
fn chain(e: &postgres::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Errors of the pool's own connection attempts go to the log (a call that finds no connection
/// reports its own error).
#[derive(Debug)]
struct LogErrors;

impl r2d2::HandleError<ConnectError> for LogErrors {
    fn handle_error(&self, error: ConnectError) {
        tracing::warn!(error = %error, "opening a database connection failed");
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Closing a `postgres::Client` runs its own runtime, which panics on a thread that is
        // already inside one; the last handle to a store may well be dropped on an async worker.
        let Some(pool) = self.pool.take() else { return };
        if let Ok(closing) =
            std::thread::Builder::new().name("recovea-pg-close".into()).spawn(move || drop(pool))
        {
            let _ = closing.join();
        }
    }
}

/// Every row `sql` selects, each made a record by `record`.
fn select<T>(
    client: &mut impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    record: impl Fn(&dyn Columns) -> Result<T>,
) -> Result<Vec<T>> {
    client.query(sql, params).map_err(backend)?.iter().map(|row| record(row)).collect()
}

/// The row `sql` selects, if any, made a record by `record`.
fn select_optional<T>(
    client: &mut impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    record: impl Fn(&dyn Columns) -> Result<T>,
) -> Result<Option<T>> {
    client.query_opt(sql, params).map_err(backend)?.as_ref().map(|row| record(row)).transpose()
}

impl Columns for Row {
    fn text(&self, index: usize) -> Result<&str> {
        self.try_get(index).map_err(backend)
    }

    fn optional_text(&self, index: usize) -> Result<Option<&str>> {
        self.try_get(index).map_err(backend)
    }

    fn bytes(&self, index: usize) -> Result<&[u8]> {
        self.try_get(index).map_err(backend)
    }

    fn integer(&self, index: usize) -> Result<i64> {
        self.try_get(index).map_err(backend)
    }

    fn optional_integer(&self, index: usize) -> Result<Option<i64>> {
        self.try_get(index).map_err(backend)
    }

    fn flag(&self, index: usize) -> Result<bool> {
        self.try_get(index).map_err(backend)
    }
}
