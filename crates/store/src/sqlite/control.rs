//! The control store on SQLite: organizations, keys, providers, prices, caps, alerts and nodes,
//! and the state nodes are built from.

mod credentials;
mod state;

use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::timestamp::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

use super::{SqliteStore, backend, select, select_optional};
use crate::audit::{self, AUDIT_COLUMNS, AuditContext, AuditEntry, AuditQuery};
use crate::rows::{
    self, ALERT_COLUMNS, KEY_COLUMNS, NODE_COLUMNS, ORG_COLUMNS, PROVIDER_COLUMNS, alert_at_text,
    allowed_endpoints_text, allowed_models_text, presented_columns, saturating_i64,
};
use crate::{
    AccessRules, AlertRecord, CapRecord, ControlStore, KeyRecord, NodeCredentialRecord, NodeRecord,
    OrgRecord, OrgTokenRecord, PriceChange, ProviderRecord, Result, State, StoreError,
};

/// A cap's columns, in the order [`rows::cap`] reads them.
const CAP_COLUMNS: &str =
    "id, org_id, scope, key_id, window, limit_nanos, hard_stop, alert_at, alert_webhook, created_at";

fn org_exists(tx: &rusqlite::Transaction<'_>, id: &OrgId) -> Result<bool> {
    tx.query_row("SELECT 1 FROM orgs WHERE id = ?1", [id.as_str()], |_| Ok(()))
        .optional()
        .map(|found| found.is_some())
        .map_err(backend)
}

impl ControlStore for SqliteStore {
    fn create_org(&self, org: &OrgRecord, audit: &AuditContext) -> Result<()> {
        self.change(audit, |tx| {
            tx.execute(
                &format!("INSERT INTO orgs ({ORG_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                params![
                    org.id.as_str(),
                    org.name,
                    org.created_at.0,
                    allowed_models_text(org.allowed_models.as_ref()),
                    allowed_endpoints_text(org.allowed_endpoints.as_ref()),
                    org.max_concurrent_requests,
                ],
            )
            .map_err(backend)?;
            Ok(((), Some(audit::org_created(org))))
        })
    }

    fn list_orgs(&self) -> Result<Vec<OrgRecord>> {
        let sql = format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at, id");
        select(&self.conn(), &sql, [], rows::org)
    }

    fn org(&self, id: &OrgId) -> Result<Option<OrgRecord>> {
        let sql = format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = ?1");
        select_optional(&self.conn(), &sql, [id.as_str()], rows::org)
    }

    fn set_org_rules(
        &self,
        id: &OrgId,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<OrgRecord>> {
        self.change(audit, |tx| {
            let before = select_optional(
                tx,
                &format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = ?1"),
                [id.as_str()],
                rows::org,
            )?;
            tx.execute(
                "UPDATE orgs SET allowed_models = ?2, allowed_endpoints = ?3, max_concurrent_requests = ?4 \
                 WHERE id = ?1",
                params![
                    id.as_str(),
                    allowed_models_text(rules.allowed_models.as_ref()),
                    allowed_endpoints_text(rules.allowed_endpoints.as_ref()),
                    rules.max_concurrent_requests,
                ],
            )
            .map_err(backend)?;
            let after = select_optional(
                tx,
                &format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = ?1"),
                [id.as_str()],
                rows::org,
            )?;
            let row = match (&before, &after) {
                (Some(before), Some(after)) => Some(audit::org_updated(before, after)),
                _ => None,
            };
            Ok((after, row))
        })
    }

    fn create_key(&self, key: &KeyRecord, hash: KeyHash, audit: &AuditContext) -> Result<()> {
        self.change(audit, |tx| {
            if !org_exists(tx, &key.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!(
                    "INSERT INTO keys ({KEY_COLUMNS}, hash) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
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
                    allowed_models_text(key.allowed_models.as_ref()),
                    allowed_endpoints_text(key.allowed_endpoints.as_ref()),
                    key.max_concurrent_requests,
                    &hash.0[..],
                ],
            )
            .map_err(backend)?;
            Ok(((), Some(audit::key_change("create", None, key))))
        })
    }

    fn list_keys(&self, org: &OrgId) -> Result<Vec<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM keys WHERE org_id = ?1 ORDER BY created_at, id");
        select(&self.conn(), &sql, [org.as_str()], rows::key)
    }

    fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        key_by_id(&self.conn(), id)
    }

    fn update_key(
        &self,
        id: &KeyId,
        limits: KeyLimits,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<KeyRecord>> {
        self.change(audit, |tx| {
            let before = key_by_id(tx, id)?;
            tx.execute(
                "UPDATE keys SET requests_per_minute = ?2, tokens_per_minute = ?3, allowed_models = ?4, \
                 allowed_endpoints = ?5, max_concurrent_requests = ?6 WHERE id = ?1",
                params![
                    id.as_str(),
                    limits.requests_per_minute,
                    limits.tokens_per_minute,
                    allowed_models_text(rules.allowed_models.as_ref()),
                    allowed_endpoints_text(rules.allowed_endpoints.as_ref()),
                    rules.max_concurrent_requests,
                ],
            )
            .map_err(backend)?;
            let after = key_by_id(tx, id)?;
            let row = after.as_ref().map(|after| audit::key_change("update", before.as_ref(), after));
            Ok((after, row))
        })
    }

    fn revoke_key(&self, id: &KeyId, at: Timestamp, audit: &AuditContext) -> Result<Option<KeyRecord>> {
        self.change(audit, |tx| {
            let before = key_by_id(tx, id)?;
            tx.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
                params![id.as_str(), at.0],
            )
            .map_err(backend)?;
            let after = key_by_id(tx, id)?;
            let row = after.as_ref().map(|after| audit::key_change("revoke", before.as_ref(), after));
            Ok((after, row))
        })
    }

    fn put_provider(&self, p: &ProviderRecord, audit: &AuditContext) -> Result<()> {
        self.change(audit, |tx| {
            if !org_exists(tx, &p.org_id)? {
                return Err(StoreError::NotFound);
            }
            let before = select_optional(
                tx,
                &format!("SELECT {PROVIDER_COLUMNS} FROM providers WHERE org_id = ?1 AND name = ?2"),
                params![p.org_id.as_str(), p.name],
                rows::provider,
            )?;
            tx.execute(
                &format!(
                    "INSERT INTO providers ({PROVIDER_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                     ON CONFLICT (org_id, name) DO UPDATE SET kind = excluded.kind, base_url = excluded.base_url,
                     sealed_key = excluded.sealed_key, key_hint = excluded.key_hint, updated_at = excluded.updated_at,
                     price_namespace = excluded.price_namespace,
                     fallback_input_nanos = excluded.fallback_input_nanos,
                     fallback_output_nanos = excluded.fallback_output_nanos"
                ),
                params![
                    p.org_id.as_str(),
                    p.name,
                    p.kind.as_str(),
                    p.base_url,
                    p.sealed_key,
                    p.key_hint,
                    p.updated_at.0,
                    p.price_namespace,
                    p.fallback_price.map(|(input, _)| input.0),
                    p.fallback_price.map(|(_, output)| output.0)
                ],
            )
            .map_err(backend)?;
            Ok(((), Some(audit::provider_set(before.as_ref(), p))))
        })
    }

    fn list_providers(&self, org: &OrgId) -> Result<Vec<ProviderRecord>> {
        let sql = format!("SELECT {PROVIDER_COLUMNS} FROM providers WHERE org_id = ?1 ORDER BY name");
        select(&self.conn(), &sql, [org.as_str()], rows::provider)
    }

    fn create_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()> {
        self.change(audit, |tx| {
            if !org_exists(tx, &cap.cap.org_id)? {
                return Err(StoreError::NotFound);
            }
            tx.execute(
                &format!("INSERT INTO caps ({CAP_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                rusqlite::params_from_iter(cap_params(cap)),
            )
            .map_err(backend)?;
            Ok(((), audit::cap_change(None, Some(cap))))
        })
    }

    fn caps(&self, org: &OrgId) -> Result<Vec<CapRecord>> {
        let sql = format!("SELECT {CAP_COLUMNS} FROM caps WHERE org_id = ?1 ORDER BY created_at, id");
        select(&self.conn(), &sql, [org.as_str()], rows::cap)
    }

    fn cap(&self, id: &CapId) -> Result<Option<CapRecord>> {
        cap_by_id(&self.conn(), id)
    }

    fn update_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()> {
        self.change(audit, |tx| {
            let before = cap_by_id(tx, &cap.cap.id)?;
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
            if changed == 0 {
                return Err(StoreError::NotFound);
            }
            let after = cap_by_id(tx, &cap.cap.id)?;
            Ok(((), audit::cap_change(before.as_ref(), after.as_ref())))
        })
    }

    fn delete_cap(&self, id: &CapId, audit: &AuditContext) -> Result<bool> {
        self.change(audit, |tx| {
            let before = cap_by_id(tx, id)?;
            let deleted = tx.execute("DELETE FROM caps WHERE id = ?1", [id.as_str()]).map_err(backend)? > 0;
            Ok((deleted, audit::cap_change(before.as_ref(), None)))
        })
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
        let sql = format!(
            "SELECT {ALERT_COLUMNS} FROM alerts WHERE org_id = ?1 ORDER BY raised_at, threshold_permille, id"
        );
        select(&self.conn(), &sql, [org.as_str()], rows::alert)
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
        let (credential_id, credential_name) = presented_columns(node.credential.as_ref());
        self.conn()
            .execute(
                &format!(
                    "INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                     ON CONFLICT (id) DO UPDATE SET feed_version = excluded.feed_version,
                       snapshot_age_ms = excluded.snapshot_age_ms, counters_confirmed_at = excluded.counters_confirmed_at,
                       fail_open_total = excluded.fail_open_total, seen_at = excluded.seen_at,
                       clock_offset_ms = excluded.clock_offset_ms, credential_id = excluded.credential_id,
                       credential_name = excluded.credential_name"
                ),
                params![
                    node.id,
                    node.feed_version.map(saturating_i64),
                    node.snapshot_age_ms.map(saturating_i64),
                    node.counters_confirmed_at.map(|t| t.0),
                    saturating_i64(node.fail_open_total),
                    node.seen_at.0,
                    node.clock_offset_ms,
                    credential_id,
                    credential_name
                ],
            )
            .map_err(backend)?;
        Ok(())
    }

    fn create_node_credential(
        &self,
        credential: &NodeCredentialRecord,
        hash: KeyHash,
        audit: &AuditContext,
    ) -> Result<()> {
        credentials::create_node_credential(self, credential, hash, audit)
    }

    fn node_credentials(&self) -> Result<Vec<NodeCredentialRecord>> {
        credentials::node_credentials(self)
    }

    fn revoke_node_credential(
        &self,
        id: &NodeCredentialId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<NodeCredentialRecord>> {
        credentials::revoke_node_credential(self, id, at, audit)
    }

    fn node_credential_by_hash(&self, hash: KeyHash) -> Result<Option<NodeCredentialRecord>> {
        credentials::node_credential_by_hash(self, hash)
    }

    fn create_org_token(&self, token: &OrgTokenRecord, hash: KeyHash, audit: &AuditContext) -> Result<()> {
        credentials::create_org_token(self, token, hash, audit)
    }

    fn org_tokens(&self, org: &OrgId) -> Result<Vec<OrgTokenRecord>> {
        credentials::org_tokens(self, org)
    }

    fn org_token(&self, id: &OrgTokenId) -> Result<Option<OrgTokenRecord>> {
        credentials::org_token(self, id)
    }

    fn revoke_org_token(
        &self,
        id: &OrgTokenId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<OrgTokenRecord>> {
        credentials::revoke_org_token(self, id, at, audit)
    }

    fn org_token_by_hash(&self, hash: KeyHash) -> Result<Option<OrgTokenRecord>> {
        credentials::org_token_by_hash(self, hash)
    }

    fn key_owners(&self, ids: &[KeyId]) -> Result<Vec<(KeyId, OrgId)>> {
        let conn = self.conn();
        let mut statement =
            conn.prepare_cached("SELECT id, org_id FROM keys WHERE id = ?1").map_err(backend)?;
        let mut owners = Vec::with_capacity(ids.len());
        for id in ids {
            let mut rows = statement.query([id.as_str()]).map_err(backend)?;
            if let Some(row) = rows.next().map_err(backend)? {
                owners.push(rows::key_owner(row)?);
            }
        }
        Ok(owners)
    }

    fn nodes(&self, since: Timestamp) -> Result<Vec<NodeRecord>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE seen_at >= ?1 ORDER BY id");
        select(&self.conn(), &sql, [since.0], rows::node)
    }

    fn state(&self) -> Result<State> {
        state::state(self)
    }

    fn change_prices(&self, changes: &[PriceChange], at: Timestamp, audit: &AuditContext) -> Result<u64> {
        state::change_prices(self, changes, at, audit)
    }

    fn audit_log(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>> {
        let sql = format!(
            "SELECT {AUDIT_COLUMNS} FROM audit_log WHERE at >= ?1 AND at < ?2
             AND (?3 IS NULL OR org_id = ?3) AND (?4 IS NULL OR object_kind = ?4) AND (?5 IS NULL OR action = ?5)
             AND version > ?6 ORDER BY version LIMIT ?7"
        );
        select(
            &self.conn(),
            &sql,
            params![
                q.from.map_or(i64::MIN, |t| t.0),
                q.to.map_or(i64::MAX, |t| t.0),
                q.org_id.as_ref().map(OrgId::as_str),
                q.object_kind,
                q.action,
                q.after_version.map_or(-1, saturating_i64),
                q.limit
            ],
            audit::entry,
        )
    }
}

/// Writes a change's audit row, in the change's transaction.
pub(super) fn insert_audit(tx: &rusqlite::Transaction<'_>, entry: &AuditEntry) -> Result<()> {
    tx.execute(
        &format!(
            "INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
        ),
        params![
            entry.id,
            saturating_i64(entry.version),
            entry.at.0,
            entry.auth.as_str(),
            entry.client,
            entry.action,
            entry.object_kind,
            entry.object_id,
            entry.org_id.as_ref().map(OrgId::as_str),
            entry.before,
            entry.after,
            entry.actor.to_text()
        ],
    )
    .map_err(backend)?;
    Ok(())
}

fn cap_by_id(conn: &Connection, id: &CapId) -> Result<Option<CapRecord>> {
    select_optional(conn, &format!("SELECT {CAP_COLUMNS} FROM caps WHERE id = ?1"), [id.as_str()], rows::cap)
}

fn key_by_id(conn: &Connection, id: &KeyId) -> Result<Option<KeyRecord>> {
    select_optional(conn, &format!("SELECT {KEY_COLUMNS} FROM keys WHERE id = ?1"), [id.as_str()], rows::key)
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
