//! The control store on PostgreSQL: organizations, keys, providers, prices, caps, alerts and nodes,
//! and the state nodes are built from.

use postgres::{GenericClient, IsolationLevel, Row, Transaction};
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::KeyHash;
use recovea_core::money::Nanos;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;

use super::{PostgresStore, backend, corrupt, count, get, rows, to_i64};
use crate::{
    ActiveKey, AlertRecord, CapRecord, ControlStore, KeyRecord, NodeRecord, OrgIds, OrgRecord, PriceChange,
    PriceOverride, ProviderRecord, Result, State, StoreError, price_override, price_rows,
};

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
