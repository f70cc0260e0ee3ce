//! The control store on SQLite: the zero-setup default of `recovea serve`.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::KeyHash;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use rusqlite::{Connection, OptionalExtension, Row, params};

use recovea_core::money::Nanos;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::usage::UsageSource;

use crate::{
    ActiveKey, AlertRecord, CapRecord, ControlStore, KeyRecord, NodeRecord, OrgIds, OrgRecord, PriceChange,
    PriceOverride, ProviderRecord, ReceiptLedger, ReceiptQuery, Result, SpendRow, State, StoreError,
    price_override, price_rows,
};

/// Each entry migrates the schema from its index to the next; `PRAGMA user_version` records how far.
const MIGRATIONS: &[&str] = &[
    r"
    CREATE TABLE orgs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE keys (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash BLOB NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        revoked_at INTEGER
    );
    CREATE INDEX keys_by_org ON keys(org_id);
    CREATE TABLE providers (
        org_id TEXT NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        base_url TEXT,
        sealed_key BLOB NOT NULL,
        key_hint TEXT NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (org_id, name)
    );
    CREATE TABLE state_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
    INSERT INTO state_version VALUES (1, 0);
",
    r"
    CREATE TABLE price_revisions (
        revision INTEGER PRIMARY KEY AUTOINCREMENT,
        model TEXT NOT NULL,
        price TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE receipts (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanos INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id);
",
    r"
    CREATE TABLE caps (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        scope TEXT NOT NULL,
        key_id TEXT REFERENCES keys(id),
        window TEXT NOT NULL,
        limit_nanos INTEGER NOT NULL,
        hard_stop INTEGER NOT NULL,
        alert_at TEXT NOT NULL,
        alert_webhook TEXT,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX caps_by_org ON caps(org_id);
    CREATE TABLE alerts (
        id TEXT PRIMARY KEY,
        cap_id TEXT NOT NULL,
        org_id TEXT NOT NULL,
        window_start INTEGER NOT NULL,
        threshold_permille INTEGER NOT NULL,
        spend_nanos INTEGER NOT NULL,
        limit_nanos INTEGER NOT NULL,
        raised_at INTEGER NOT NULL,
        delivered_at INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        UNIQUE (cap_id, window_start, threshold_permille)
    );
    CREATE INDEX alerts_by_org ON alerts(org_id, raised_at);
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at);
",
    r"
    ALTER TABLE keys ADD COLUMN requests_per_minute INTEGER;
    ALTER TABLE keys ADD COLUMN tokens_per_minute INTEGER;
",
    r"
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        feed_version INTEGER,
        snapshot_age_ms INTEGER,
        counters_confirmed_at INTEGER,
        fail_open_total INTEGER NOT NULL,
        seen_at INTEGER NOT NULL
    );
",
    // Spend sums (cap alerts, rebuilds, reconciliation) read the indexes alone, not every
    // receipt's row: a window of millions of receipts was summed from the table.
    r"
    DROP INDEX receipts_by_org_time;
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id, key_id, cost_nanos);
    DROP INDEX receipts_by_key_time;
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at, org_id, cost_nanos);
",
    // A receipt is its columns, no longer its JSON text beside a few of them: rows of about 200
    // bytes instead of 660, and those bytes (written to the WAL, then again by its checkpoint) were
    // most of what a ledger insert cost.
    r"
    CREATE TABLE receipts_by_column (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanos INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        provider TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        status INTEGER NOT NULL,
        stream INTEGER NOT NULL,
        cached_input_tokens INTEGER NOT NULL,
        cache_write_input_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        usage_source TEXT NOT NULL,
        priced INTEGER NOT NULL,
        price_revision INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        node_id TEXT NOT NULL
    );
    INSERT INTO receipts_by_column
        SELECT id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos,
            body ->> '$.request_id', body ->> '$.provider', body ->> '$.endpoint', body ->> '$.status',
            body ->> '$.stream', body ->> '$.cached_input_tokens',
            body ->> '$.cache_write_input_tokens', body ->> '$.reasoning_tokens',
            body ->> '$.usage_source', body ->> '$.priced', body ->> '$.price_revision',
            CAST(round(unixepoch(body ->> '$.finished_at', 'subsec') * 1000) AS INTEGER),
            body ->> '$.node_id'
        FROM receipts ORDER BY rowid;
    DROP TABLE receipts;
    ALTER TABLE receipts_by_column RENAME TO receipts;
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id, key_id, cost_nanos);
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at, org_id, cost_nanos);
",
    // A revision may change many prices (an import), remove one (back to the built-in price), or
    // set a provider kind's fallback price; a receipt says which price it was costed at. Rows of
    // removed prices stay, with no price: the log says what each revision held.
    r"
    CREATE TABLE price_log (
        revision INTEGER NOT NULL,
        target TEXT NOT NULL,
        name TEXT NOT NULL,
        kind TEXT,
        price TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (target, name, revision)
    );
    INSERT INTO price_log SELECT revision, 'model', model, NULL, price, created_at FROM price_revisions;
    DROP TABLE price_revisions;
    ALTER TABLE receipts ADD COLUMN priced_as TEXT;
",
];

/// A receipt's columns, in the order [`receipt_row`] reads them.
const RECEIPT_COLUMNS: &str = "id, request_id, org_id, key_id, provider, model, endpoint, status, stream,
    input_tokens, output_tokens, cached_input_tokens, cache_write_input_tokens, reasoning_tokens,
    cost_nanos, usage_source, priced, price_revision, started_at, finished_at, node_id, priced_as";

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
        migrate(&mut conn)?;
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

/// Applies each missing migration in a write transaction that reads the version itself, so that
/// several processes opening one fresh file at once apply each migration exactly once.
fn migrate(conn: &mut Connection) -> Result<()> {
    loop {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(backend)?;
        let current: usize = tx.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(backend)?;
        let Some(sql) = MIGRATIONS.get(current) else { return Ok(()) };
        tx.execute_batch(sql).map_err(backend)?;
        tx.pragma_update(None, "user_version", current + 1).map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn org_id(s: String) -> rusqlite::Result<OrgId> {
    OrgId::parse(&s).ok_or_else(|| corrupt(format!("bad org id {s:?}")))
}

fn corrupt(message: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, message.into())
}

fn org_row(row: &Row<'_>) -> rusqlite::Result<OrgRecord> {
    Ok(OrgRecord { id: org_id(row.get(0)?)?, name: row.get(1)?, created_at: Timestamp(row.get(2)?) })
}

const KEY_COLUMNS: &str =
    "id, org_id, name, prefix, created_at, expires_at, revoked_at, requests_per_minute, tokens_per_minute";

/// What [`State::active_keys`] reads of a key.
const ACTIVE_KEY_COLUMNS: &str = "id, org_id, expires_at, requests_per_minute, tokens_per_minute, hash";

fn key_row(row: &Row<'_>) -> rusqlite::Result<KeyRecord> {
    let id: String = row.get(0)?;
    Ok(KeyRecord {
        id: KeyId::parse(&id).ok_or_else(|| corrupt(format!("bad key id {id:?}")))?,
        org_id: org_id(row.get(1)?)?,
        name: row.get(2)?,
        prefix: row.get(3)?,
        created_at: Timestamp(row.get(4)?),
        expires_at: row.get::<_, Option<i64>>(5)?.map(Timestamp),
        revoked_at: row.get::<_, Option<i64>>(6)?.map(Timestamp),
        limits: KeyLimits { requests_per_minute: row.get(7)?, tokens_per_minute: row.get(8)? },
    })
}

const PROVIDER_COLUMNS: &str = "org_id, name, kind, base_url, sealed_key, key_hint, updated_at";

fn provider_row(row: &Row<'_>) -> rusqlite::Result<ProviderRecord> {
    let kind: String = row.get(2)?;
    Ok(ProviderRecord {
        org_id: org_id(row.get(0)?)?,
        name: row.get(1)?,
        kind: ProviderKind::parse(&kind).ok_or_else(|| corrupt(format!("bad provider kind {kind:?}")))?,
        base_url: row.get(3)?,
        sealed_key: row.get(4)?,
        key_hint: row.get(5)?,
        updated_at: Timestamp(row.get(6)?),
    })
}

fn org_exists(tx: &rusqlite::Transaction<'_>, id: &OrgId) -> Result<bool> {
    tx.query_row("SELECT 1 FROM orgs WHERE id = ?1", [id.as_str()], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
        .map_err(backend)
}

impl ControlStore for SqliteStore {
    fn create_org(&self, org: &OrgRecord) -> Result<()> {
        self.change(|tx| {
            tx.execute(
                "INSERT INTO orgs (id, name, created_at) VALUES (?1, ?2, ?3)",
                params![org.id.as_str(), org.name, org.created_at.0],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_orgs(&self) -> Result<Vec<OrgRecord>> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT id, name, created_at FROM orgs ORDER BY created_at, id").map_err(backend)?;
        stmt.query_map([], org_row).map_err(backend)?.collect::<rusqlite::Result<_>>().map_err(backend)
    }

    fn org(&self, id: &OrgId) -> Result<Option<OrgRecord>> {
        self.conn()
            .query_row("SELECT id, name, created_at FROM orgs WHERE id = ?1", [id.as_str()], org_row)
            .optional()
            .map_err(backend)
    }

    fn create_key(&self, key: &KeyRecord, hash: KeyHash) -> Result<()> {
        self.change(|tx| {
            if !org_exists(tx, &key.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!(
                    "INSERT INTO keys ({KEY_COLUMNS}, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                ),
                params![
                    key.id.as_str(),
                    key.org_id.as_str(),
                    key.name,
                    key.prefix,
                    key.created_at.0,
                    key.expires_at.map(|t| t.0),
                    key.revoked_at.map(|t| t.0),
                    key.limits.requests_per_minute,
                    key.limits.tokens_per_minute,
                    &hash.0[..],
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_keys(&self, org: &OrgId) -> Result<Vec<KeyRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!("SELECT {KEY_COLUMNS} FROM keys WHERE org_id = ?1 ORDER BY created_at, id"))
            .map_err(backend)?;
        stmt.query_map([org.as_str()], key_row)
            .map_err(backend)?
            .collect::<rusqlite::Result<_>>()
            .map_err(backend)
    }

    fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        self.conn()
            .query_row(&format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"), [id.as_str()], key_row)
            .optional()
            .map_err(backend)
    }

    fn set_key_limits(&self, id: &KeyId, limits: KeyLimits) -> Result<Option<KeyRecord>> {
        self.change(|tx| {
            tx.execute(
                "UPDATE keys SET requests_per_minute = ?2, tokens_per_minute = ?3 WHERE id = ?1",
                params![id.as_str(), limits.requests_per_minute, limits.tokens_per_minute],
            )
            .map_err(backend)?;
            tx.query_row(&format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"), [id.as_str()], key_row)
                .optional()
                .map_err(backend)
        })
    }

    fn revoke_key(&self, id: &KeyId, at: Timestamp) -> Result<Option<KeyRecord>> {
        self.change(|tx| {
            tx.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
                params![id.as_str(), at.0],
            )
            .map_err(backend)?;
            tx.query_row(&format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"), [id.as_str()], key_row)
                .optional()
                .map_err(backend)
        })
    }

    fn put_provider(&self, p: &ProviderRecord) -> Result<()> {
        self.change(|tx| {
            if !org_exists(tx, &p.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!(
                    "INSERT INTO providers ({PROVIDER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (org_id, name) DO UPDATE SET kind = excluded.kind, base_url = excluded.base_url,
                     sealed_key = excluded.sealed_key, key_hint = excluded.key_hint, updated_at = excluded.updated_at"
                ),
                params![
                    p.org_id.as_str(),
                    p.name,
                    p.kind.as_str(),
                    p.base_url,
                    p.sealed_key,
                    p.key_hint,
                    p.updated_at.0
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn list_providers(&self, org: &OrgId) -> Result<Vec<ProviderRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!("SELECT {PROVIDER_COLUMNS} FROM providers WHERE org_id = ?1 ORDER BY name"))
            .map_err(backend)?;
        stmt.query_map([org.as_str()], provider_row)
            .map_err(backend)?
            .collect::<rusqlite::Result<_>>()
            .map_err(backend)
    }

    fn create_cap(&self, cap: &CapRecord) -> Result<()> {
        self.change(|tx| {
            if !org_exists(tx, &cap.cap.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!("INSERT INTO caps ({CAP_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                rusqlite::params_from_iter(cap_params(cap)),
            )
            .map_err(backend)?;
            Ok(())
        })
    }

    fn caps(&self, org: &OrgId) -> Result<Vec<CapRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!("SELECT {CAP_COLUMNS} FROM caps WHERE org_id = ?1 ORDER BY created_at, id"))
            .map_err(backend)?;
        stmt.query_map([org.as_str()], cap_row)
            .map_err(backend)?
            .collect::<rusqlite::Result<_>>()
            .map_err(backend)
    }

    fn cap(&self, id: &CapId) -> Result<Option<CapRecord>> {
        self.conn()
            .query_row(&format!("SELECT {CAP_COLUMNS} FROM caps WHERE id = ?1"), [id.as_str()], cap_row)
            .optional()
            .map_err(backend)
    }

    fn update_cap(&self, cap: &CapRecord) -> Result<()> {
        self.change(|tx| {
            let changed = tx
                .execute(
                    "UPDATE caps SET limit_nanos = ?2, hard_stop = ?3, alert_at = ?4, alert_webhook = ?5 WHERE id = ?1",
                    params![
                        cap.cap.id.as_str(),
                        cap.cap.limit.0,
                        cap.cap.hard_stop,
                        alert_at_text(&cap.cap.alert_at_permille),
                        cap.cap.alert_webhook
                    ],
                )
                .map_err(backend)?;
            if changed == 0 { Err(StoreError::NotFound) } else { Ok(()) }
        })
    }

    fn delete_cap(&self, id: &CapId) -> Result<bool> {
        self.change(
            |tx| Ok(tx.execute("DELETE FROM caps WHERE id = ?1", [id.as_str()]).map_err(backend)? > 0),
        )
    }

    fn raise_alert(&self, alert: &AlertRecord) -> Result<bool> {
        let inserted = self
            .conn()
            .execute(
                "INSERT OR IGNORE INTO alerts (id, cap_id, org_id, window_start, threshold_permille, spend_nanos,
                 limit_nanos, raised_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    alert.id,
                    alert.cap_id.as_str(),
                    alert.org_id.as_str(),
                    alert.window_start.0,
                    alert.threshold_permille,
                    alert.spend.0,
                    alert.limit.0,
                    alert.raised_at.0
                ],
            )
            .map_err(backend)?;
        Ok(inserted > 0)
    }

    fn alerts(&self, org: &OrgId) -> Result<Vec<AlertRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, cap_id, org_id, window_start, threshold_permille, spend_nanos, limit_nanos, raised_at,
                 delivered_at, attempts FROM alerts WHERE org_id = ?1 ORDER BY raised_at, threshold_permille, id",
            )
            .map_err(backend)?;
        stmt.query_map([org.as_str()], |row| {
            let cap: String = row.get(1)?;
            Ok(AlertRecord {
                id: row.get(0)?,
                cap_id: CapId::parse(&cap).ok_or_else(|| corrupt(format!("bad cap id {cap:?}")))?,
                org_id: org_id(row.get(2)?)?,
                window_start: Timestamp(row.get(3)?),
                threshold_permille: row.get(4)?,
                spend: Nanos(row.get(5)?),
                limit: Nanos(row.get(6)?),
                raised_at: Timestamp(row.get(7)?),
                delivered_at: row.get::<_, Option<i64>>(8)?.map(Timestamp),
                attempts: row.get(9)?,
            })
        })
        .map_err(backend)?
        .collect::<rusqlite::Result<_>>()
        .map_err(backend)
    }

    fn alert_delivery(&self, id: &str, delivered_at: Option<Timestamp>) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE alerts SET attempts = attempts + 1, delivered_at = COALESCE(?2, delivered_at) WHERE id = ?1",
                params![id, delivered_at.map(|t| t.0)],
            )
            .map_err(backend)?;
        Ok(())
    }

    fn version(&self) -> Result<u64> {
        let version: i64 =
            self.conn().query_row("SELECT version FROM state_version", [], |r| r.get(0)).map_err(backend)?;
        Ok(u64::try_from(version).unwrap_or(0))
    }

    fn record_node(&self, node: &NodeRecord) -> Result<()> {
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.conn()
            .execute(
                "INSERT INTO nodes (id, feed_version, snapshot_age_ms, counters_confirmed_at, fail_open_total, seen_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (id) DO UPDATE SET feed_version = excluded.feed_version,
                   snapshot_age_ms = excluded.snapshot_age_ms, counters_confirmed_at = excluded.counters_confirmed_at,
                   fail_open_total = excluded.fail_open_total, seen_at = excluded.seen_at",
                params![
                    node.id,
                    node.feed_version.map(as_i64),
                    node.snapshot_age_ms.map(as_i64),
                    node.counters_confirmed_at.map(|t| t.0),
                    as_i64(node.fail_open_total),
                    node.seen_at.0
                ],
            )
            .map_err(backend)?;
        Ok(())
    }

    fn nodes(&self, since: Timestamp) -> Result<Vec<NodeRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, feed_version, snapshot_age_ms, counters_confirmed_at, fail_open_total, seen_at
                 FROM nodes WHERE seen_at >= ?1 ORDER BY id",
            )
            .map_err(backend)?;
        let as_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
        stmt.query_map([since.0], |row| {
            Ok(NodeRecord {
                id: row.get(0)?,
                feed_version: row.get::<_, Option<i64>>(1)?.map(as_u64),
                snapshot_age_ms: row.get::<_, Option<i64>>(2)?.map(as_u64),
                counters_confirmed_at: row.get::<_, Option<i64>>(3)?.map(Timestamp),
                fail_open_total: as_u64(row.get(4)?),
                seen_at: Timestamp(row.get(5)?),
            })
        })
        .map_err(backend)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(backend)
    }

    fn state(&self) -> Result<State> {
        let mut conn = self.conn();
        // One read transaction, so the version matches the rows read with it.
        let tx = conn.transaction().map_err(backend)?;
        let version: i64 =
            tx.query_row("SELECT version FROM state_version", [], |r| r.get(0)).map_err(backend)?;
        let orgs = {
            let mut stmt = tx.prepare("SELECT id, name, created_at FROM orgs").map_err(backend)?;
            stmt.query_map([], org_row)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?
        };
        let active_keys = {
            let org_ids = OrgIds::of(&orgs);
            let mut stmt = tx
                .prepare(&format!("SELECT {ACTIVE_KEY_COLUMNS} FROM keys WHERE revoked_at IS NULL"))
                .map_err(backend)?;
            stmt.query_map([], |row| {
                // Borrowed text: the ids are parsed once, into the only allocation a key makes.
                let id = row.get_ref(0)?.as_str()?;
                let org = row.get_ref(1)?.as_str()?;
                let hash: [u8; 32] = row
                    .get_ref(5)?
                    .as_blob()?
                    .try_into()
                    .map_err(|_| corrupt("key hash is not 32 bytes".into()))?;
                Ok(ActiveKey {
                    id: KeyId::parse(id).ok_or_else(|| corrupt(format!("bad key id {id:?}")))?,
                    org_id: org_ids.get(org).ok_or_else(|| corrupt(format!("bad org id {org:?}")))?,
                    hash: KeyHash(hash),
                    expires_at: row.get::<_, Option<i64>>(2)?.map(Timestamp),
                    limits: KeyLimits { requests_per_minute: row.get(3)?, tokens_per_minute: row.get(4)? },
                })
            })
            .map_err(backend)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(backend)?
        };
        let providers = {
            let mut stmt =
                tx.prepare(&format!("SELECT {PROVIDER_COLUMNS} FROM providers")).map_err(backend)?;
            stmt.query_map([], provider_row)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?
        };
        let price_revision: i64 = tx
            .query_row("SELECT COALESCE(MAX(revision), 0) FROM price_log", [], |r| r.get(0))
            .map_err(backend)?;
        let price_overrides = prices_in_force(&tx)?;
        let caps = {
            let mut stmt = tx.prepare(&format!("SELECT {CAP_COLUMNS} FROM caps")).map_err(backend)?;
            stmt.query_map([], cap_row)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?
        };
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
            let revision: i64 = tx
                .query_row("SELECT COALESCE(MAX(revision), 0) + 1 FROM price_log", [], |r| r.get(0))
                .map_err(backend)?;
            let mut insert = tx
                .prepare(
                    "INSERT INTO price_log (revision, target, name, kind, price, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(backend)?;
            for (target, name, kind, price) in &rows {
                insert.execute(params![revision, target, name, kind, price, at.0]).map_err(backend)?;
            }
            Ok(u64::try_from(revision).unwrap_or(0))
        })
    }
}

/// The operators' prices in force: the latest row of each target, unless it removed the price.
fn prices_in_force(tx: &rusqlite::Transaction<'_>) -> Result<Vec<PriceOverride>> {
    let mut stmt = tx
        .prepare(
            "SELECT target, name, kind, price, revision, created_at FROM price_log p
             WHERE price IS NOT NULL AND revision =
                 (SELECT MAX(revision) FROM price_log q WHERE q.target = p.target AND q.name = p.name)
             ORDER BY target, name",
        )
        .map_err(backend)?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
            ))
        })
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    rows.into_iter()
        .map(|(target, name, kind, price, revision, at)| {
            price_override(&target, name, kind, &price, revision, at)
        })
        .collect()
}

const CAP_COLUMNS: &str =
    "id, org_id, scope, key_id, window, limit_nanos, hard_stop, alert_at, alert_webhook, created_at";

fn alert_at_text(permille: &[u32]) -> String {
    permille.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn cap_params(record: &CapRecord) -> Vec<Box<dyn rusqlite::ToSql>> {
    let cap = &record.cap;
    vec![
        Box::new(cap.id.as_str().to_owned()),
        Box::new(cap.org_id.as_str().to_owned()),
        Box::new(cap.scope.as_str()),
        Box::new(cap.key_id.as_ref().map(|k| k.as_str().to_owned())),
        Box::new(cap.window.as_str()),
        Box::new(cap.limit.0),
        Box::new(cap.hard_stop),
        Box::new(alert_at_text(&cap.alert_at_permille)),
        Box::new(cap.alert_webhook.clone()),
        Box::new(record.created_at.0),
    ]
}

fn cap_row(row: &Row<'_>) -> rusqlite::Result<CapRecord> {
    let (id, scope, window, alert_at): (String, String, String, String) =
        (row.get(0)?, row.get(2)?, row.get(4)?, row.get(7)?);
    let key_id = row
        .get::<_, Option<String>>(3)?
        .map(|k| KeyId::parse(&k).ok_or_else(|| corrupt(format!("bad key id {k:?}"))))
        .transpose()?;
    let alert_at_permille = alert_at
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| corrupt(format!("bad alert_at {alert_at:?}"))))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(CapRecord {
        cap: Cap {
            id: CapId::parse(&id).ok_or_else(|| corrupt(format!("bad cap id {id:?}")))?,
            org_id: org_id(row.get(1)?)?,
            scope: Scope::parse(&scope).ok_or_else(|| corrupt(format!("bad scope {scope:?}")))?,
            key_id,
            window: Window::parse(&window).ok_or_else(|| corrupt(format!("bad window {window:?}")))?,
            limit: Nanos(row.get(5)?),
            hard_stop: row.get(6)?,
            alert_at_permille,
            alert_webhook: row.get(8)?,
        },
        created_at: Timestamp(row.get(9)?),
    })
}

/// Counts past `i64::MAX` (SQLite's largest integer) are stored as that: no real count comes near.
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field set to something other than `Receipt::example`'s, so that a field lost or
    /// swapped on the way shows.
    fn unusual(id: &str, started_at: i64) -> Receipt {
        Receipt {
            provider: "groq".into(),
            model: None,
            endpoint: "/v1/messages".into(),
            status: 499,
            stream: true,
            input_tokens: 1_000_001,
            output_tokens: 2,
            cached_input_tokens: 3,
            cache_write_input_tokens: 4,
            reasoning_tokens: 5,
            cost_usd: Nanos(123_456_789),
            usage_source: UsageSource::Estimated,
            priced: false,
            price_revision: 7,
            priced_as: Some("fallback:anthropic".into()),
            started_at: Timestamp(started_at),
            finished_at: Timestamp(started_at + 1_234),
            node_id: "node_x".into(),
            ..Receipt::example(id)
        }
    }

    fn all_of_org_a(store: &SqliteStore) -> Vec<Receipt> {
        let query = ReceiptQuery {
            org_id: OrgId::parse("org_a").expect("org id"),
            from: None,
            to: None,
            key_id: None,
            limit: 100,
            after: None,
        };
        store.receipts(&query).expect("receipts")
    }

    #[test]
    fn receipts_stored_as_json_text_become_columns() {
        // The schema before migration 7 (at index 6) made receipts columns.
        let conn = Connection::open_in_memory().expect("open");
        for sql in &MIGRATIONS[..6] {
            conn.execute_batch(sql).expect("an earlier migration");
        }
        conn.pragma_update(None, "user_version", 6).expect("version");
        // Receipts of that time had no `priced_as`.
        let old = [
            Receipt { priced_as: None, ..unusual("rcpt_old1", 1_764_591_691_722) },
            Receipt {
                started_at: Timestamp(5),
                finished_at: Timestamp(9),
                priced_as: None,
                ..Receipt::example("rcpt_old2")
            },
        ];
        for r in &old {
            conn.execute(
                "INSERT INTO receipts
                 (id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    r.id,
                    r.org_id,
                    r.key_id,
                    r.started_at.0,
                    r.model,
                    to_i64(r.input_tokens),
                    to_i64(r.output_tokens),
                    r.cost_usd.0,
                    r.to_json()
                ],
            )
            .expect("a receipt as stored before");
        }
        let store = SqliteStore::with_connection(conn).expect("migrated");
        assert_eq!(all_of_org_a(&store), [old[1].clone(), old[0].clone()]);
        let org = OrgId::parse("org_a").expect("org id");
        assert_eq!(
            store.spend(&org, None, Timestamp(0), Timestamp(i64::MAX)).expect("spend"),
            Nanos(123_456_789)
        );
        let new = unusual("rcpt_new", 6);
        store.insert_receipts(&[SerializedReceipt::new(new.clone())]).expect("insert");
        assert_eq!(all_of_org_a(&store), [old[1].clone(), new, old[0].clone()]);
    }

    #[test]
    fn price_revisions_become_the_price_log() {
        let conn = Connection::open_in_memory().expect("open");
        for sql in &MIGRATIONS[..7] {
            conn.execute_batch(sql).expect("an earlier migration");
        }
        conn.pragma_update(None, "user_version", 7).expect("version");
        for (model, input, at) in [("m", "1", 1), ("m", "2", 2), ("n", "3", 3)] {
            let price = format!(r#"{{"input_per_mtok_usd":"{input}","output_per_mtok_usd":"1"}}"#);
            conn.execute(
                "INSERT INTO price_revisions (model, price, created_at) VALUES (?1, ?2, ?3)",
                params![model, price, at],
            )
            .expect("a price as stored before");
        }
        let store = SqliteStore::with_connection(conn).expect("migrated");
        let state = store.state().expect("state");
        assert_eq!(state.price_revision, 3);
        let kept: Vec<(String, String, u64)> = state
            .price_overrides
            .iter()
            .map(|o| (format!("{:?}", o.target), o.price.input_per_mtok_usd.clone(), o.revision))
            .collect();
        assert_eq!(kept, [(r#"Model("m")"#.into(), "2".into(), 2), (r#"Model("n")"#.into(), "3".into(), 3)]);
        assert_eq!(store.put_price("n", &state.price_overrides[0].price, Timestamp(4)).expect("put"), 4);
    }

    #[test]
    fn a_receipt_reads_back_field_for_field() {
        let store = SqliteStore::in_memory().expect("open");
        let receipt = unusual("rcpt_a", 1_764_591_691_722);
        store.insert_receipts(&[SerializedReceipt::new(receipt.clone())]).expect("insert");
        assert_eq!(all_of_org_a(&store), [receipt]);
    }
}
