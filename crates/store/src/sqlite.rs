//! The control store on SQLite: the zero-setup default of `recovea serve`.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys::KeyHash;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::{ControlStore, KeyRecord, OrgRecord, ProviderRecord, Result, State, StoreError};

/// Each entry migrates the schema from its index to the next; `PRAGMA user_version` records how far.
const MIGRATIONS: &[&str] = &[r"
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
"];

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
        conn.pragma_update(None, "journal_mode", "WAL").map_err(backend)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(backend)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(backend)?;
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

fn migrate(conn: &mut Connection) -> Result<()> {
    let current: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(backend)?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction().map_err(backend)?;
        tx.execute_batch(sql).map_err(backend)?;
        tx.pragma_update(None, "user_version", index + 1).map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
    Ok(())
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

const KEY_COLUMNS: &str = "id, org_id, name, prefix, created_at, expires_at, revoked_at";

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
                &format!("INSERT INTO keys ({KEY_COLUMNS}, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    key.id.as_str(),
                    key.org_id.as_str(),
                    key.name,
                    key.prefix,
                    key.created_at.0,
                    key.expires_at.map(|t| t.0),
                    key.revoked_at.map(|t| t.0),
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

    fn version(&self) -> Result<u64> {
        let version: i64 =
            self.conn().query_row("SELECT version FROM state_version", [], |r| r.get(0)).map_err(backend)?;
        Ok(u64::try_from(version).unwrap_or(0))
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
            let mut stmt = tx
                .prepare(&format!("SELECT {KEY_COLUMNS}, hash FROM keys WHERE revoked_at IS NULL"))
                .map_err(backend)?;
            stmt.query_map([], |row| {
                let hash: Vec<u8> = row.get(7)?;
                let hash: [u8; 32] =
                    hash.try_into().map_err(|_| corrupt("key hash is not 32 bytes".into()))?;
                Ok((key_row(row)?, KeyHash(hash)))
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
        tx.commit().map_err(backend)?;
        Ok(State { version: u64::try_from(version).unwrap_or(0), orgs, active_keys, providers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::keys::hash_secret;

    fn org(id: &str) -> OrgRecord {
        OrgRecord { id: OrgId::parse(id).expect("id"), name: format!("{id} name"), created_at: Timestamp(1) }
    }

    fn key(id: &str, org: &str) -> KeyRecord {
        KeyRecord {
            id: KeyId::parse(id).expect("id"),
            org_id: OrgId::parse(org).expect("id"),
            name: "k".into(),
            prefix: "rk_abc".into(),
            created_at: Timestamp(2),
            expires_at: None,
            revoked_at: None,
        }
    }

    #[test]
    fn keys_revoke_once_and_leave_the_active_state() {
        let store = SqliteStore::in_memory().expect("open");
        store.create_org(&org("org_a")).expect("org");
        store.create_key(&key("key_a", "org_a"), hash_secret("rk_a")).expect("key");
        store.create_key(&key("key_b", "org_a"), hash_secret("rk_b")).expect("key");
        let before = store.state().expect("state");
        assert_eq!(before.active_keys.len(), 2);

        let revoked = store.revoke_key(&KeyId::parse("key_a").expect("id"), Timestamp(10)).expect("revoke");
        assert_eq!(revoked.expect("known").revoked_at, Some(Timestamp(10)));
        let again = store.revoke_key(&KeyId::parse("key_a").expect("id"), Timestamp(20)).expect("revoke");
        assert_eq!(again.expect("known").revoked_at, Some(Timestamp(10)));
        assert_eq!(store.revoke_key(&KeyId::parse("key_zz").expect("id"), Timestamp(20)).expect("ok"), None);

        let after = store.state().expect("state");
        assert!(after.version > before.version);
        assert_eq!(store.version().expect("version"), after.version);
        assert_eq!(after.active_keys.len(), 1);
        assert_eq!(after.active_keys[0].1, hash_secret("rk_b"));
    }

    #[test]
    fn children_of_unknown_orgs_are_refused() {
        let store = SqliteStore::in_memory().expect("open");
        assert!(matches!(
            store.create_key(&key("key_a", "org_x"), hash_secret("x")),
            Err(StoreError::NotFound)
        ));
        let provider = ProviderRecord {
            org_id: OrgId::parse("org_x").expect("id"),
            name: "openai".into(),
            kind: ProviderKind::OpenAi,
            base_url: None,
            sealed_key: vec![1, 2, 3],
            key_hint: "...".into(),
            updated_at: Timestamp(3),
        };
        assert!(matches!(store.put_provider(&provider), Err(StoreError::NotFound)));
        store.create_org(&org("org_x")).expect("org");
        store.put_provider(&provider).expect("put");
        let replaced = ProviderRecord { kind: ProviderKind::Anthropic, ..provider.clone() };
        store.put_provider(&replaced).expect("put again");
        assert_eq!(store.list_providers(&provider.org_id).expect("list"), vec![replaced]);
    }

    #[test]
    fn state_survives_reopening() {
        let dir = std::env::temp_dir().join(format!("recovea-store-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("control.db");
        let _ = std::fs::remove_file(&path);
        {
            let store = SqliteStore::open(&path).expect("open");
            store.create_org(&org("org_a")).expect("org");
        }
        let store = SqliteStore::open(&path).expect("reopen");
        assert_eq!(store.list_orgs().expect("list"), vec![org("org_a")]);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
