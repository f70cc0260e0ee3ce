//! The control store on SQLite: organizations, keys, providers, prices, caps, alerts and nodes,
//! and the state nodes are built from.

use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::KeyHash;
use recovea_core::money::Nanos;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use rusqlite::{OptionalExtension, Row, params};

use super::{SqliteStore, backend, corrupt};
use crate::{
    ActiveKey, AlertRecord, CapRecord, ControlStore, KeyRecord, NodeRecord, OrgIds, OrgRecord, PriceChange,
    PriceOverride, ProviderRecord, Result, State, StoreError, price_override, price_rows,
};

fn org_id(s: String) -> rusqlite::Result<OrgId> {
    OrgId::parse(&s).ok_or_else(|| corrupt(format!("bad org id {s:?}")))
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
