//! Records as columns and back, once for both backends: SQLite and PostgreSQL keep the same
//! columns, and what makes a stored value valid does not depend on the database. A backend only
//! reads a column into a plain value ([`Columns`]); what the value means is decided here.

mod jobs;
mod receipts;
mod spend;

use std::collections::HashMap;

use recovea_core::caps::{Cap, Scope};
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::org_tokens::OrgRole;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;

use crate::{
    ActiveKey, AlertRecord, CapRecord, KeyRecord, NodeCredentialRecord, NodeRecord, OrgRecord,
    OrgTokenRecord, PresentedCredential, PriceChange, PriceOverride, PriceTarget, ProviderRecord, Result,
    StoreError,
};

pub(crate) use jobs::{
    FILE_COLUMNS, JOB_COLUMNS, batch_input_text, file, file_key, job, job_key, job_spend, sort_files,
    sort_jobs,
};
pub(crate) use receipts::{quantities_text, read_quantities, tag_needle, tags, tags_text};
pub(crate) use spend::{
    DailyKey, DailySums, by_tag, day_of, day_start, spend_row, spend_split, summary_days, tag_sum_row,
};

/// A row as its driver reads it, one column at a time. Text and bytes are borrowed from the row:
/// the state reads every active key, whose text is parsed, never kept.
pub(crate) trait Columns {
    fn text(&self, index: usize) -> Result<&str>;
    fn optional_text(&self, index: usize) -> Result<Option<&str>>;
    fn bytes(&self, index: usize) -> Result<&[u8]>;
    fn integer(&self, index: usize) -> Result<i64>;
    fn optional_integer(&self, index: usize) -> Result<Option<i64>>;
    fn flag(&self, index: usize) -> Result<bool>;

    fn string(&self, index: usize) -> Result<String> {
        self.text(index).map(str::to_owned)
    }

    fn optional_string(&self, index: usize) -> Result<Option<String>> {
        Ok(self.optional_text(index)?.map(str::to_owned))
    }

    fn timestamp(&self, index: usize) -> Result<Timestamp> {
        self.integer(index).map(Timestamp)
    }

    fn optional_timestamp(&self, index: usize) -> Result<Option<Timestamp>> {
        Ok(self.optional_integer(index)?.map(Timestamp))
    }

    /// Counts are written from `u64` (see [`saturating_i64`]): a negative one is a corrupt row.
    fn count(&self, index: usize) -> Result<u64> {
        let n = self.integer(index)?;
        u64::try_from(n).map_err(|_| corrupt(format!("negative count {n}")))
    }
}

/// A stored value no record can hold. The text is for operators' logs.
pub(crate) fn corrupt(message: String) -> StoreError {
    StoreError::Backend(message)
}

/// Counts past `i64::MAX` (the largest integer either database stores) are stored as that: no
/// real count comes near.
pub(crate) fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn org_id(text: &str) -> Result<OrgId> {
    OrgId::parse(text).ok_or_else(|| corrupt(format!("bad org id {text:?}")))
}

fn key_id(text: &str) -> Result<KeyId> {
    KeyId::parse(text).ok_or_else(|| corrupt(format!("bad key id {text:?}")))
}

fn cap_id(text: &str) -> Result<CapId> {
    CapId::parse(text).ok_or_else(|| corrupt(format!("bad cap id {text:?}")))
}

fn provider_kind(text: &str) -> Result<ProviderKind> {
    ProviderKind::parse(text).ok_or_else(|| corrupt(format!("bad provider kind {text:?}")))
}

/// Rate limits are `u32`; the column is wider in PostgreSQL.
fn rate_limit(row: &dyn Columns, index: usize) -> Result<Option<u32>> {
    row.optional_integer(index)?
        .map(|n| u32::try_from(n).map_err(|_| corrupt(format!("rate limit out of range: {n}"))))
        .transpose()
}

/// A model allowlist is stored as its JSON array of patterns; `NULL`: no list.
fn allowed_models(row: &dyn Columns, index: usize) -> Result<Option<ModelAllowlist>> {
    row.optional_text(index)?
        .map(|text| {
            serde_json::from_str(text).map_err(|e| corrupt(format!("bad allowed_models {text:?}: {e}")))
        })
        .transpose()
}

/// The text of a model allowlist's column.
pub(crate) fn allowed_models_text(models: Option<&ModelAllowlist>) -> Option<String> {
    models.map(|list| serde_json::to_string(list.patterns()).unwrap_or_else(|_| "[]".into()))
}

/// An endpoint allowlist, stored as a model allowlist is.
fn allowed_endpoints(row: &dyn Columns, index: usize) -> Result<Option<EndpointAllowlist>> {
    row.optional_text(index)?
        .map(|text| {
            serde_json::from_str(text).map_err(|e| corrupt(format!("bad allowed_endpoints {text:?}: {e}")))
        })
        .transpose()
}

/// The text of an endpoint allowlist's column.
pub(crate) fn allowed_endpoints_text(endpoints: Option<&EndpointAllowlist>) -> Option<String> {
    endpoints.map(|list| serde_json::to_string(list.patterns()).unwrap_or_else(|_| "[]".into()))
}

/// A limit of requests in flight is a `u32`; the column is wider in PostgreSQL.
fn max_concurrent(row: &dyn Columns, index: usize) -> Result<Option<u32>> {
    row.optional_integer(index)?
        .map(|n| u32::try_from(n).map_err(|_| corrupt(format!("max_concurrent_requests out of range: {n}"))))
        .transpose()
}

pub(crate) const ORG_COLUMNS: &str =
    "id, name, created_at, allowed_models, allowed_endpoints, max_concurrent_requests";

/// An organization, from its [`ORG_COLUMNS`].
pub(crate) fn org(row: &dyn Columns) -> Result<OrgRecord> {
    Ok(OrgRecord {
        id: org_id(row.text(0)?)?,
        name: row.string(1)?,
        created_at: row.timestamp(2)?,
        allowed_models: allowed_models(row, 3)?,
        allowed_endpoints: allowed_endpoints(row, 4)?,
        max_concurrent_requests: max_concurrent(row, 5)?,
    })
}

pub(crate) const KEY_COLUMNS: &str = "id, org_id, name, prefix, created_at, expires_at, revoked_at, \
     requests_per_minute, tokens_per_minute, allowed_models, allowed_endpoints, max_concurrent_requests";

/// A key, from its [`KEY_COLUMNS`].
pub(crate) fn key(row: &dyn Columns) -> Result<KeyRecord> {
    Ok(KeyRecord {
        id: key_id(row.text(0)?)?,
        org_id: org_id(row.text(1)?)?,
        name: row.string(2)?,
        prefix: row.string(3)?,
        created_at: row.timestamp(4)?,
        expires_at: row.optional_timestamp(5)?,
        revoked_at: row.optional_timestamp(6)?,
        limits: KeyLimits {
            requests_per_minute: rate_limit(row, 7)?,
            tokens_per_minute: rate_limit(row, 8)?,
        },
        allowed_models: allowed_models(row, 9)?,
        allowed_endpoints: allowed_endpoints(row, 10)?,
        max_concurrent_requests: max_concurrent(row, 11)?,
    })
}

/// What [`State::active_keys`](crate::State::active_keys) reads of a key.
pub(crate) const ACTIVE_KEY_COLUMNS: &str = "id, org_id, expires_at, requests_per_minute, tokens_per_minute, hash, allowed_models, \
     allowed_endpoints, max_concurrent_requests";

/// The organizations' ids by their text, so that the keys read after them share them.
pub(crate) struct OrgIds<'a>(HashMap<&'a str, &'a OrgId>);

impl<'a> OrgIds<'a> {
    pub(crate) fn of(orgs: &'a [OrgRecord]) -> Self {
        Self(orgs.iter().map(|org| (org.id.as_str(), &org.id)).collect())
    }

    /// The shared id for `text`, or a new one when no organization read has it (`None`: not an
    /// organization id).
    pub(crate) fn get(&self, text: &str) -> Option<OrgId> {
        self.0.get(text).map(|&id| id.clone()).or_else(|| OrgId::parse(text))
    }
}

/// A key that is not revoked, from its [`ACTIVE_KEY_COLUMNS`], sharing its organization's id.
pub(crate) fn active_key(row: &dyn Columns, org_ids: &OrgIds<'_>) -> Result<ActiveKey> {
    let org = row.text(1)?;
    let hash = row.bytes(5)?.try_into().map_err(|_| corrupt("key hash is not 32 bytes".into()))?;
    Ok(ActiveKey {
        id: key_id(row.text(0)?)?,
        org_id: org_ids.get(org).ok_or_else(|| corrupt(format!("bad org id {org:?}")))?,
        hash: KeyHash(hash),
        expires_at: row.optional_timestamp(2)?,
        limits: KeyLimits {
            requests_per_minute: rate_limit(row, 3)?,
            tokens_per_minute: rate_limit(row, 4)?,
        },
        allowed_models: allowed_models(row, 6)?,
        allowed_endpoints: allowed_endpoints(row, 7)?,
        max_concurrent_requests: max_concurrent(row, 8)?,
    })
}

pub(crate) const PROVIDER_COLUMNS: &str = "org_id, name, kind, base_url, sealed_key, key_hint, updated_at,
    price_namespace, fallback_input_nanos, fallback_output_nanos";

/// A provider credential, from its [`PROVIDER_COLUMNS`].
pub(crate) fn provider(row: &dyn Columns) -> Result<ProviderRecord> {
    Ok(ProviderRecord {
        org_id: org_id(row.text(0)?)?,
        name: row.string(1)?,
        kind: provider_kind(row.text(2)?)?,
        base_url: row.optional_string(3)?,
        sealed_key: row.bytes(4)?.to_vec(),
        key_hint: row.string(5)?,
        updated_at: row.timestamp(6)?,
        price_namespace: row.optional_string(7)?,
        fallback_price: match (row.optional_integer(8)?, row.optional_integer(9)?) {
            (Some(input), Some(output)) => Some((Nanos(input), Nanos(output))),
            _ => None,
        },
    })
}

/// A cap's alert thresholds as their column holds them: permille, comma-separated.
pub(crate) fn alert_at_text(permille: &[u32]) -> String {
    permille.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn alert_at_permille(text: &str) -> Result<Vec<u32>> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| corrupt(format!("bad alert_at {text:?}"))))
        .collect()
}

/// A cap, from its id, org_id, scope, key_id, window, limit_nanos, hard_stop, alert_at,
/// alert_webhook and created_at, in that order: each backend names its window column its own way.
pub(crate) fn cap(row: &dyn Columns) -> Result<CapRecord> {
    let (scope, window) = (row.text(2)?, row.text(4)?);
    Ok(CapRecord {
        cap: Cap {
            id: cap_id(row.text(0)?)?,
            org_id: org_id(row.text(1)?)?,
            scope: Scope::parse(scope).ok_or_else(|| corrupt(format!("bad scope {scope:?}")))?,
            key_id: row.optional_text(3)?.map(key_id).transpose()?,
            window: Window::parse(window).ok_or_else(|| corrupt(format!("bad window {window:?}")))?,
            limit: Nanos(row.integer(5)?),
            hard_stop: row.flag(6)?,
            alert_at_permille: alert_at_permille(row.text(7)?)?,
            alert_webhook: row.optional_string(8)?,
        },
        created_at: row.timestamp(9)?,
    })
}

pub(crate) const ALERT_COLUMNS: &str = "id, cap_id, org_id, window_start, threshold_permille, spend_nanos, \
                                        limit_nanos, raised_at, delivered_at, attempts";

/// An alert, from its [`ALERT_COLUMNS`].
pub(crate) fn alert(row: &dyn Columns) -> Result<AlertRecord> {
    let small = |index| {
        let n = row.integer(index)?;
        u32::try_from(n).map_err(|_| corrupt(format!("alert column {index} out of range: {n}")))
    };
    Ok(AlertRecord {
        id: row.string(0)?,
        cap_id: cap_id(row.text(1)?)?,
        org_id: org_id(row.text(2)?)?,
        window_start: row.timestamp(3)?,
        threshold_permille: small(4)?,
        spend: Nanos(row.integer(5)?),
        limit: Nanos(row.integer(6)?),
        raised_at: row.timestamp(7)?,
        delivered_at: row.optional_timestamp(8)?,
        attempts: small(9)?,
    })
}

pub(crate) const NODE_COLUMNS: &str = "id, feed_version, snapshot_age_ms, counters_confirmed_at, fail_open_total, \
     seen_at, clock_offset_ms, credential_id, credential_name";

/// The columns `credential_id` and `credential_name` of a node's report: `shared` and no name for
/// the shared node token.
pub(crate) fn presented_columns(presented: Option<&PresentedCredential>) -> (Option<&str>, Option<&str>) {
    match presented {
        None => (None, None),
        Some(PresentedCredential::Shared) => (Some(SHARED_CREDENTIAL), None),
        Some(PresentedCredential::Own { id, name }) => (Some(id.as_str()), Some(name.as_str())),
    }
}

/// How a report made with the shared node token names it.
const SHARED_CREDENTIAL: &str = "shared";

pub(crate) const NODE_CREDENTIAL_COLUMNS: &str = "id, name, created_at, revoked_at";

/// A node credential, from its [`NODE_CREDENTIAL_COLUMNS`].
pub(crate) fn node_credential(row: &dyn Columns) -> Result<NodeCredentialRecord> {
    let id = row.text(0)?;
    Ok(NodeCredentialRecord {
        id: NodeCredentialId::parse(id).ok_or_else(|| corrupt(format!("bad node credential id {id:?}")))?,
        name: row.string(1)?,
        created_at: row.timestamp(2)?,
        revoked_at: row.optional_timestamp(3)?,
    })
}

pub(crate) const ORG_TOKEN_COLUMNS: &str =
    "id, org_id, name, role, prefix, created_at, expires_at, revoked_at";

/// An organization token, from its [`ORG_TOKEN_COLUMNS`].
pub(crate) fn org_token(row: &dyn Columns) -> Result<OrgTokenRecord> {
    let (id, role) = (row.text(0)?, row.text(3)?);
    Ok(OrgTokenRecord {
        id: OrgTokenId::parse(id).ok_or_else(|| corrupt(format!("bad organization token id {id:?}")))?,
        org_id: org_id(row.text(1)?)?,
        name: row.string(2)?,
        role: OrgRole::parse(role).ok_or_else(|| corrupt(format!("bad organization token role {role:?}")))?,
        prefix: row.string(4)?,
        created_at: row.timestamp(5)?,
        expires_at: row.optional_timestamp(6)?,
        revoked_at: row.optional_timestamp(7)?,
    })
}

/// A key's id and its organization's, from `id, org_id`.
pub(crate) fn key_owner(row: &dyn Columns) -> Result<(KeyId, OrgId)> {
    Ok((key_id(row.text(0)?)?, org_id(row.text(1)?)?))
}

/// A node's report, from its [`NODE_COLUMNS`].
pub(crate) fn node(row: &dyn Columns) -> Result<NodeRecord> {
    let as_u64 = |n: Option<i64>| n.map(|n| u64::try_from(n).unwrap_or(0));
    Ok(NodeRecord {
        id: row.string(0)?,
        feed_version: as_u64(row.optional_integer(1)?),
        snapshot_age_ms: as_u64(row.optional_integer(2)?),
        counters_confirmed_at: row.optional_timestamp(3)?,
        fail_open_total: row.count(4)?,
        seen_at: row.timestamp(5)?,
        clock_offset_ms: row.optional_integer(6)?,
        credential: match (row.optional_text(7)?, row.optional_string(8)?) {
            (None, _) => None,
            (Some(SHARED_CREDENTIAL), _) => Some(PresentedCredential::Shared),
            (Some(id), name) => Some(PresentedCredential::Own {
                id: NodeCredentialId::parse(id)
                    .ok_or_else(|| corrupt(format!("node report: bad credential id {id:?}")))?,
                name: name.unwrap_or_default(),
            }),
        },
    })
}

pub(crate) const PRICE_COLUMNS: &str = "target, name, kind, price, revision, created_at";

/// A price in force, from its [`PRICE_COLUMNS`] (the price as JSON).
pub(crate) fn price_override(row: &dyn Columns) -> Result<PriceOverride> {
    let bad = |what: String| corrupt(format!("price row: {what}"));
    let target = row.text(0)?;
    let target = PriceTarget::from_columns(target, row.string(1)?)
        .ok_or_else(|| bad(format!("bad target {target:?}")))?;
    let kind = row
        .optional_text(2)?
        .map(|kind| ProviderKind::parse(kind).ok_or_else(|| bad(format!("bad kind {kind:?}"))))
        .transpose()?;
    let price = serde_json::from_str(row.text(3)?).map_err(|e| bad(format!("bad price: {e}")))?;
    let revision = row.integer(4)?;
    let revision = u64::try_from(revision).map_err(|_| bad(format!("bad revision {revision}")))?;
    Ok(PriceOverride { target, kind, price, revision, set_at: row.timestamp(5)? })
}

/// A price row to insert: target, name, kind, and the price as JSON (`None`: removed).
pub(crate) type PriceRow<'a> = (&'static str, &'a str, Option<&'static str>, Option<String>);

/// The changes as rows to insert, the later of two changes to one target only.
pub(crate) fn price_rows(changes: &[PriceChange]) -> Result<Vec<PriceRow<'_>>> {
    let mut rows: Vec<PriceRow<'_>> = Vec::with_capacity(changes.len());
    for change in changes {
        let (target, name) = change.target.columns();
        let price = change
            .price
            .as_ref()
            .map(|price| serde_json::to_string(price).map_err(|e| StoreError::Backend(e.to_string())))
            .transpose()?;
        rows.retain(|row| (row.0, row.1) != (target, name));
        rows.push((target, name, change.kind.map(ProviderKind::as_str), price));
    }
    Ok(rows)
}

/// Whether every removal among `rows` names a price in force: a revision that removes nothing is
/// refused whole, changing nothing.
pub(crate) fn removes_only_prices_in_force(rows: &[PriceRow<'_>], in_force: &[PriceOverride]) -> bool {
    rows.iter().all(|(target, name, _, price)| {
        price.is_some() || in_force.iter().any(|set| set.target.columns() == (*target, *name))
    })
}
