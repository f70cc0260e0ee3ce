//! The control store and receipt ledger on PostgreSQL: one database shared by several control replicas.
//!
//! Same tables, same meanings as [`SqliteStore`](crate::SqliteStore): money and counts are `BIGINT`,
//! times `BIGINT` unix milliseconds. Every change bumps the state version in its own transaction, so a
//! replica that polls [`ControlStore::version`] sees the changes any other replica made.
//!
//! **No TLS.** Connections are plain TCP or a Unix socket: run PostgreSQL on loopback or a trusted
//! network (`sslmode=require` fails to connect).
//!
//! **Blocking.** Like the trait, every call blocks (the `postgres` client runs its own small runtime
//! per connection): call [`PostgresStore::connect`] and the methods from a blocking thread
//! (`spawn_blocking`), never from inside an async task.

mod migrate;

use std::time::Duration;

use postgres::types::FromSql;
use postgres::{Client, GenericClient, IsolationLevel, NoTls, Row, Transaction};
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::KeyHash;
use recovea_core::money::Nanos;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;

use crate::{
    ActiveKey, AlertRecord, CapRecord, ControlStore, KeyRecord, NodeRecord, OrgIds, OrgRecord, PriceChange,
    PriceOverride, ProviderRecord, ReceiptLedger, ReceiptQuery, Result, SpendRow, State, StoreError,
    price_override, price_rows,
};

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
        self.config.connect(NoTls).map_err(|e| ConnectError(chain(&e)))
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
            .build_unchecked(Connector { config });
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

    /// Runs `change` in a transaction that also bumps the state version.
    ///
    /// The version row is locked first: changes from every replica take turns, so versions and price
    /// revisions are handed out in commit order.
    fn change<T>(&self, change: impl FnOnce(&mut Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut client = self.client()?;
        let mut tx = client.transaction().map_err(backend)?;
        tx.execute("UPDATE state_version SET version = version + 1", &[]).map_err(backend)?;
        let out = change(&mut tx)?;
        tx.commit().map_err(backend)?;
        Ok(out)
    }
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

fn corrupt(message: String) -> StoreError {
    StoreError::Backend(message)
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T> {
    row.try_get(index).map_err(backend)
}

fn rows<T>(
    client: &mut impl GenericClient,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
    map: impl Fn(&Row) -> Result<T>,
) -> Result<Vec<T>> {
    client.query(sql, params).map_err(backend)?.iter().map(map).collect()
}

fn count(row: &Row, index: usize) -> Result<u64> {
    let n: i64 = get(row, index)?;
    u64::try_from(n).map_err(|_| corrupt(format!("negative count {n}")))
}

/// The operators' prices in force: the latest row of each target, unless it removed the price.
fn prices_in_force(client: &mut impl GenericClient) -> Result<Vec<PriceOverride>> {
    rows(
        client,
        "SELECT target, name, kind, price, revision, created_at FROM (
             SELECT DISTINCT ON (target, name) target, name, kind, price, revision, created_at
             FROM price_log ORDER BY target, name, revision DESC
         ) latest WHERE price IS NOT NULL ORDER BY target, name",
        &[],
        |row| {
            let price: &str = get(row, 3)?;
            price_override(get(row, 0)?, get(row, 1)?, get(row, 2)?, price, get(row, 4)?, get(row, 5)?)
        },
    )
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn org_id(s: &str) -> Result<OrgId> {
    OrgId::parse(s).ok_or_else(|| corrupt(format!("bad org id {s:?}")))
}

fn key_id(s: &str) -> Result<KeyId> {
    KeyId::parse(s).ok_or_else(|| corrupt(format!("bad key id {s:?}")))
}

fn cap_id(s: &str) -> Result<CapId> {
    CapId::parse(s).ok_or_else(|| corrupt(format!("bad cap id {s:?}")))
}

const ORG_COLUMNS: &str = "id, name, created_at";

fn org_row(row: &Row) -> Result<OrgRecord> {
    Ok(OrgRecord { id: org_id(get(row, 0)?)?, name: get(row, 1)?, created_at: Timestamp(get(row, 2)?) })
}

const KEY_COLUMNS: &str =
    "id, org_id, name, prefix, created_at, expires_at, revoked_at, requests_per_minute, tokens_per_minute";

/// What [`State::active_keys`] reads of a key.
const ACTIVE_KEY_COLUMNS: &str = "id, org_id, expires_at, requests_per_minute, tokens_per_minute, hash";

fn key_row(row: &Row) -> Result<KeyRecord> {
    Ok(KeyRecord {
        id: key_id(get(row, 0)?)?,
        org_id: org_id(get(row, 1)?)?,
        name: get(row, 2)?,
        prefix: get(row, 3)?,
        created_at: Timestamp(get(row, 4)?),
        expires_at: get::<Option<i64>>(row, 5)?.map(Timestamp),
        revoked_at: get::<Option<i64>>(row, 6)?.map(Timestamp),
        limits: KeyLimits { requests_per_minute: rate(row, 7)?, tokens_per_minute: rate(row, 8)? },
    })
}

fn rate(row: &Row, index: usize) -> Result<Option<u32>> {
    get::<Option<i64>>(row, index)?
        .map(|n| u32::try_from(n).map_err(|_| corrupt(format!("rate limit out of range: {n}"))))
        .transpose()
}

const PROVIDER_COLUMNS: &str = "org_id, name, kind, base_url, sealed_key, key_hint, updated_at";

fn provider_row(row: &Row) -> Result<ProviderRecord> {
    let kind: &str = get(row, 2)?;
    Ok(ProviderRecord {
        org_id: org_id(get(row, 0)?)?,
        name: get(row, 1)?,
        kind: ProviderKind::parse(kind).ok_or_else(|| corrupt(format!("bad provider kind {kind:?}")))?,
        base_url: get(row, 3)?,
        sealed_key: get(row, 4)?,
        key_hint: get(row, 5)?,
        updated_at: Timestamp(get(row, 6)?),
    })
}

const CAP_COLUMNS: &str =
    "id, org_id, scope, key_id, cap_window, limit_nanos, hard_stop, alert_at, alert_webhook, created_at";

fn alert_at_text(permille: &[u32]) -> String {
    permille.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn cap_row(row: &Row) -> Result<CapRecord> {
    let (scope, window, alert_at): (&str, &str, &str) = (get(row, 2)?, get(row, 4)?, get(row, 7)?);
    let alert_at_permille = alert_at
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| corrupt(format!("bad alert_at {alert_at:?}"))))
        .collect::<Result<Vec<_>>>()?;
    Ok(CapRecord {
        cap: Cap {
            id: cap_id(get(row, 0)?)?,
            org_id: org_id(get(row, 1)?)?,
            scope: Scope::parse(scope).ok_or_else(|| corrupt(format!("bad scope {scope:?}")))?,
            key_id: get::<Option<&str>>(row, 3)?.map(key_id).transpose()?,
            window: Window::parse(window).ok_or_else(|| corrupt(format!("bad window {window:?}")))?,
            limit: Nanos(get(row, 5)?),
            hard_stop: get(row, 6)?,
            alert_at_permille,
            alert_webhook: get(row, 8)?,
        },
        created_at: Timestamp(get(row, 9)?),
    })
}

const ALERT_COLUMNS: &str = "id, cap_id, org_id, window_start, threshold_permille, spend_nanos, limit_nanos, \
                             raised_at, delivered_at, attempts";

fn alert_row(row: &Row) -> Result<AlertRecord> {
    let small = |index| {
        let n: i64 = get(row, index)?;
        u32::try_from(n).map_err(|_| corrupt(format!("alert column {index} out of range: {n}")))
    };
    Ok(AlertRecord {
        id: get(row, 0)?,
        cap_id: cap_id(get(row, 1)?)?,
        org_id: org_id(get(row, 2)?)?,
        window_start: Timestamp(get(row, 3)?),
        threshold_permille: small(4)?,
        spend: Nanos(get(row, 5)?),
        limit: Nanos(get(row, 6)?),
        raised_at: Timestamp(get(row, 7)?),
        delivered_at: get::<Option<i64>>(row, 8)?.map(Timestamp),
        attempts: small(9)?,
    })
}

fn org_exists(tx: &mut Transaction<'_>, id: &OrgId) -> Result<bool> {
    Ok(tx.query_opt("SELECT 1 FROM orgs WHERE id = $1", &[&id.as_str()]).map_err(backend)?.is_some())
}

impl ControlStore for PostgresStore {
    fn create_org(&self, org: &OrgRecord) -> Result<()> {
        self.change(|tx| {
            tx.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES ($1, $2, $3)",
                &[&org.id.as_str(), &org.name, &org.created_at.0],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_orgs(&self) -> Result<Vec<OrgRecord>> {
        let sql = format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at, id");
        rows(&mut *self.client()?, &sql, &[], org_row)
    }

    fn org(&self, id: &OrgId) -> Result<Option<OrgRecord>> {
        let sql = format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = $1");
        self.client()?.query_opt(&sql, &[&id.as_str()]).map_err(backend)?.as_ref().map(org_row).transpose()
    }

    fn create_key(&self, key: &KeyRecord, hash: KeyHash) -> Result<()> {
        self.change(|tx| {
            if !org_exists(tx, &key.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!(
                    "INSERT INTO keys ({KEY_COLUMNS}, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
                ),
                &[
                    &key.id.as_str(),
                    &key.org_id.as_str(),
                    &key.name,
                    &key.prefix,
                    &key.created_at.0,
                    &key.expires_at.map(|t| t.0),
                    &key.revoked_at.map(|t| t.0),
                    &key.limits.requests_per_minute.map(i64::from),
                    &key.limits.tokens_per_minute.map(i64::from),
                    &&hash.0[..],
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_keys(&self, org: &OrgId) -> Result<Vec<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM keys WHERE org_id = $1 ORDER BY created_at, id");
        rows(&mut *self.client()?, &sql, &[&org.as_str()], key_row)
    }

    fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = $1");
        self.client()?.query_opt(&sql, &[&id.as_str()]).map_err(backend)?.as_ref().map(key_row).transpose()
    }

    fn set_key_limits(&self, id: &KeyId, limits: KeyLimits) -> Result<Option<KeyRecord>> {
        self.change(|tx| {
            tx.execute(
                "UPDATE keys SET requests_per_minute = $2, tokens_per_minute = $3 WHERE id = $1",
                &[
                    &id.as_str(),
                    &limits.requests_per_minute.map(i64::from),
                    &limits.tokens_per_minute.map(i64::from),
                ],
            )
            .map_err(backend)?;
            let sql = format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = $1");
            tx.query_opt(&sql, &[&id.as_str()]).map_err(backend)?.as_ref().map(key_row).transpose()
        })
    }

    fn revoke_key(&self, id: &KeyId, at: Timestamp) -> Result<Option<KeyRecord>> {
        self.change(|tx| {
            tx.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1",
                &[&id.as_str(), &at.0],
            )
            .map_err(backend)?;
            let sql = format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = $1");
            tx.query_opt(&sql, &[&id.as_str()]).map_err(backend)?.as_ref().map(key_row).transpose()
        })
    }

    fn put_provider(&self, p: &ProviderRecord) -> Result<()> {
        self.change(|tx| {
            if !org_exists(tx, &p.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!(
                    "INSERT INTO providers ({PROVIDER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (org_id, name) DO UPDATE SET kind = excluded.kind, base_url = excluded.base_url,
                     sealed_key = excluded.sealed_key, key_hint = excluded.key_hint, updated_at = excluded.updated_at"
                ),
                &[
                    &p.org_id.as_str(),
                    &p.name,
                    &p.kind.as_str(),
                    &p.base_url,
                    &p.sealed_key,
                    &p.key_hint,
                    &p.updated_at.0,
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_providers(&self, org: &OrgId) -> Result<Vec<ProviderRecord>> {
        let sql = format!("SELECT {PROVIDER_COLUMNS} FROM providers WHERE org_id = $1 ORDER BY name");
        rows(&mut *self.client()?, &sql, &[&org.as_str()], provider_row)
    }

    fn state(&self) -> Result<State> {
        let mut client = self.client()?;
        // One snapshot for every read, so the version matches the rows read with it.
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(backend)?;
        let version = count(&tx.query_one("SELECT version FROM state_version", &[]).map_err(backend)?, 0)?;
        let orgs =
            rows(&mut tx, &format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at, id"), &[], org_row)?;
        let org_ids = OrgIds::of(&orgs);
        let active_keys = rows(
            &mut tx,
            &format!(
                "SELECT {ACTIVE_KEY_COLUMNS} FROM keys WHERE revoked_at IS NULL ORDER BY created_at, id"
            ),
            &[],
            |row| {
                let hash: &[u8] = get(row, 5)?;
                let org: &str = get(row, 1)?;
                Ok(ActiveKey {
                    id: key_id(get(row, 0)?)?,
                    org_id: org_ids.get(org).ok_or_else(|| corrupt(format!("bad org id {org:?}")))?,
                    hash: KeyHash(hash.try_into().map_err(|_| corrupt("key hash is not 32 bytes".into()))?),
                    expires_at: get::<Option<i64>>(row, 2)?.map(Timestamp),
                    limits: KeyLimits {
                        requests_per_minute: rate(row, 3)?,
                        tokens_per_minute: rate(row, 4)?,
                    },
                })
            },
        )?;
        let providers = rows(
            &mut tx,
            &format!("SELECT {PROVIDER_COLUMNS} FROM providers ORDER BY org_id, name"),
            &[],
            provider_row,
        )?;
        let price_revision = count(
            &tx.query_one("SELECT COALESCE(MAX(revision), 0)::BIGINT FROM price_log", &[])
                .map_err(backend)?,
            0,
        )?;
        let price_overrides = prices_in_force(&mut tx)?;
        let caps =
            rows(&mut tx, &format!("SELECT {CAP_COLUMNS} FROM caps ORDER BY created_at, id"), &[], cap_row)?;
        tx.commit().map_err(backend)?;
        Ok(State { version, orgs, active_keys, providers, price_revision, price_overrides, caps })
    }

    fn change_prices(&self, changes: &[PriceChange], at: Timestamp) -> Result<u64> {
        let rows = price_rows(changes)?;
        self.change(|tx| {
            let in_force = prices_in_force(tx)?;
            for (target, name, _, price) in &rows {
                let removes_nothing =
                    price.is_none() && !in_force.iter().any(|row| row.target.columns() == (*target, *name));
                if removes_nothing {
                    return Err(StoreError::NotFound);
                }
            }
            let revision: i64 = get(
                &tx.query_one("SELECT COALESCE(MAX(revision), 0)::BIGINT + 1 FROM price_log", &[])
                    .map_err(backend)?,
                0,
            )?;
            let insert = tx
                .prepare(
                    "INSERT INTO price_log (revision, target, name, kind, price, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .map_err(backend)?;
            for (target, name, kind, price) in &rows {
                tx.execute(&insert, &[&revision, target, name, kind, price, &at.0]).map_err(backend)?;
            }
            u64::try_from(revision).map_err(|_| corrupt(format!("bad revision {revision}")))
        })
    }

    fn create_cap(&self, record: &CapRecord) -> Result<()> {
        let cap = &record.cap;
        self.change(|tx| {
            if !org_exists(tx, &cap.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!("INSERT INTO caps ({CAP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
                &[
                    &cap.id.as_str(),
                    &cap.org_id.as_str(),
                    &cap.scope.as_str(),
                    &cap.key_id.as_ref().map(KeyId::as_str),
                    &cap.window.as_str(),
                    &cap.limit.0,
                    &cap.hard_stop,
                    &alert_at_text(&cap.alert_at_permille),
                    &cap.alert_webhook,
                    &record.created_at.0,
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn caps(&self, org: &OrgId) -> Result<Vec<CapRecord>> {
        let sql = format!("SELECT {CAP_COLUMNS} FROM caps WHERE org_id = $1 ORDER BY created_at, id");
        rows(&mut *self.client()?, &sql, &[&org.as_str()], cap_row)
    }

    fn cap(&self, id: &CapId) -> Result<Option<CapRecord>> {
        let sql = format!("SELECT {CAP_COLUMNS} FROM caps WHERE id = $1");
        self.client()?.query_opt(&sql, &[&id.as_str()]).map_err(backend)?.as_ref().map(cap_row).transpose()
    }

    fn update_cap(&self, record: &CapRecord) -> Result<()> {
        let cap = &record.cap;
        self.change(|tx| {
            let changed = tx
                .execute(
                    "UPDATE caps SET limit_nanos = $2, hard_stop = $3, alert_at = $4, alert_webhook = $5 WHERE id = $1",
                    &[
                        &cap.id.as_str(),
                        &cap.limit.0,
                        &cap.hard_stop,
                        &alert_at_text(&cap.alert_at_permille),
                        &cap.alert_webhook,
                    ],
                )
                .map_err(backend)?;
            if changed == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    fn delete_cap(&self, id: &CapId) -> Result<bool> {
        self.change(|tx| {
            Ok(tx.execute("DELETE FROM caps WHERE id = $1", &[&id.as_str()]).map_err(backend)? > 0)
        })
    }

    fn raise_alert(&self, alert: &AlertRecord) -> Result<bool> {
        let inserted = self.client()?
            .execute(
                "INSERT INTO alerts (id, cap_id, org_id, window_start, threshold_permille, spend_nanos, limit_nanos,
                 raised_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                &[
                    &alert.id,
                    &alert.cap_id.as_str(),
                    &alert.org_id.as_str(),
                    &alert.window_start.0,
                    &i64::from(alert.threshold_permille),
                    &alert.spend.0,
                    &alert.limit.0,
                    &alert.raised_at.0,
                ],
            )
            .map_err(backend)?;
        Ok(inserted > 0)
    }

    fn alerts(&self, org: &OrgId) -> Result<Vec<AlertRecord>> {
        let sql = format!(
            "SELECT {ALERT_COLUMNS} FROM alerts WHERE org_id = $1 ORDER BY raised_at, threshold_permille, id"
        );
        rows(&mut *self.client()?, &sql, &[&org.as_str()], alert_row)
    }

    fn alert_delivery(&self, id: &str, delivered_at: Option<Timestamp>) -> Result<()> {
        self.client()?
            .execute(
                "UPDATE alerts SET attempts = attempts + 1, delivered_at = COALESCE($2::BIGINT, delivered_at)
                 WHERE id = $1",
                &[&id, &delivered_at.map(|t| t.0)],
            )
            .map_err(backend)?;
        Ok(())
    }

    fn version(&self) -> Result<u64> {
        count(&self.client()?.query_one("SELECT version FROM state_version", &[]).map_err(backend)?, 0)
    }

    fn record_node(&self, node: &NodeRecord) -> Result<()> {
        self.client()?
            .execute(
                "INSERT INTO nodes (id, feed_version, snapshot_age_ms, counters_confirmed_at, fail_open_total, seen_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (id) DO UPDATE SET feed_version = EXCLUDED.feed_version,
                   snapshot_age_ms = EXCLUDED.snapshot_age_ms, counters_confirmed_at = EXCLUDED.counters_confirmed_at,
                   fail_open_total = EXCLUDED.fail_open_total, seen_at = EXCLUDED.seen_at",
                &[
                    &node.id,
                    &node.feed_version.map(to_i64),
                    &node.snapshot_age_ms.map(to_i64),
                    &node.counters_confirmed_at.map(|t| t.0),
                    &to_i64(node.fail_open_total),
                    &node.seen_at.0,
                ],
            )
            .map_err(backend)?;
        Ok(())
    }

    fn nodes(&self, since: Timestamp) -> Result<Vec<NodeRecord>> {
        let as_u64 = |n: Option<i64>| n.map(|n| u64::try_from(n).unwrap_or(0));
        rows(
            &mut *self.client()?,
            "SELECT id, feed_version, snapshot_age_ms, counters_confirmed_at, fail_open_total, seen_at
             FROM nodes WHERE seen_at >= $1 ORDER BY id",
            &[&since.0],
            |row| {
                Ok(NodeRecord {
                    id: get(row, 0)?,
                    feed_version: as_u64(get(row, 1)?),
                    snapshot_age_ms: as_u64(get(row, 2)?),
                    counters_confirmed_at: get::<Option<i64>>(row, 3)?.map(Timestamp),
                    fail_open_total: count(row, 4)?,
                    seen_at: Timestamp(get(row, 5)?),
                })
            },
        )
    }
}

impl ReceiptLedger for PostgresStore {
    fn insert_receipts(&self, written: &[SerializedReceipt]) -> Result<usize> {
        if written.is_empty() {
            return Ok(0);
        }
        let receipts: Vec<&Receipt> = written.iter().map(SerializedReceipt::receipt).collect();
        let bodies: Vec<&str> = written.iter().map(SerializedReceipt::json).collect();
        let column = |f: fn(&Receipt) -> &str| receipts.iter().map(|r| f(r)).collect::<Vec<_>>();
        let number = |f: fn(&Receipt) -> i64| receipts.iter().map(|r| f(r)).collect::<Vec<_>>();
        // One statement for the batch; a receipt already present (or twice in the batch) is skipped.
        let inserted = self.client()?
            .execute(
                "INSERT INTO receipts
                 (id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos, body)
                 SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], $6::BIGINT[],
                                      $7::BIGINT[], $8::BIGINT[], $9::TEXT[])
                 ON CONFLICT DO NOTHING",
                &[
                    &column(|r| &r.id),
                    &column(|r| &r.org_id),
                    &column(|r| &r.key_id),
                    &number(|r| r.started_at.0),
                    &receipts.iter().map(|r| r.model.as_deref()).collect::<Vec<_>>(),
                    &number(|r| to_i64(r.input_tokens)),
                    &number(|r| to_i64(r.output_tokens)),
                    &number(|r| r.cost_usd.0),
                    &bodies,
                ],
            )
            .map_err(backend)?;
        Ok(usize::try_from(inserted).unwrap_or(usize::MAX))
    }

    fn receipts(&self, q: &ReceiptQuery) -> Result<Vec<Receipt>> {
        let (after_time, after_id) = q.after.as_ref().map_or((i64::MIN, ""), |(t, id)| (t.0, id.as_str()));
        rows(
            &mut *self.client()?,
            "SELECT body FROM receipts WHERE org_id = $1
             AND started_at >= $2 AND started_at < $3
             AND ($4::TEXT IS NULL OR key_id = $4)
             AND (started_at, id) > ($5, $6)
             ORDER BY started_at, id LIMIT $7",
            &[
                &q.org_id.as_str(),
                &q.from.map_or(i64::MIN, |t| t.0),
                &q.to.map_or(i64::MAX, |t| t.0),
                &q.key_id.as_ref().map(KeyId::as_str),
                &after_time,
                &after_id,
                &i64::from(q.limit),
            ],
            |row| {
                serde_json::from_str(get(row, 0)?)
                    .map_err(|e| StoreError::Backend(format!("a stored receipt does not parse: {e}")))
            },
        )
    }

    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos> {
        let row = self
            .client()?
            .query_one(
                "SELECT COALESCE(SUM(cost_nanos), 0)::BIGINT FROM receipts WHERE org_id = $1
                 AND ($2::TEXT IS NULL OR key_id = $2) AND started_at >= $3 AND started_at < $4",
                &[&org.as_str(), &key.map(KeyId::as_str), &from.0, &to.0],
            )
            .map_err(backend)?;
        Ok(Nanos(get(&row, 0)?))
    }

    fn spend_summary(
        &self,
        org: &OrgId,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> Result<Vec<SpendRow>> {
        // The day of `started_at / 1000` whole seconds (truncated toward zero), in UTC: as SQLite's
        // `date(started_at / 1000, 'unixepoch')`; a missing model sorts first, as NULLs do in SQLite.
        rows(
            &mut *self.client()?,
            "SELECT to_char(to_timestamp(started_at / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, key_id, model,
                    COUNT(*), SUM(input_tokens)::BIGINT, SUM(output_tokens)::BIGINT, SUM(cost_nanos)::BIGINT
             FROM receipts WHERE org_id = $1 AND started_at >= $2 AND started_at < $3
             GROUP BY day, key_id, model ORDER BY day, key_id, model NULLS FIRST",
            &[&org.as_str(), &from.map_or(i64::MIN, |t| t.0), &to.map_or(i64::MAX, |t| t.0)],
            |row| {
                Ok(SpendRow {
                    day: get(row, 0)?,
                    key_id: get(row, 1)?,
                    model: get(row, 2)?,
                    requests: count(row, 3)?,
                    input_tokens: count(row, 4)?,
                    output_tokens: count(row, 5)?,
                    cost: Nanos(get(row, 6)?),
                })
            },
        )
    }
}
