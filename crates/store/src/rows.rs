//! Records as columns and back, once for both backends: SQLite and PostgreSQL keep the same
//! columns, and what makes a stored value valid does not depend on the database. A backend only
//! reads a column into a plain value ([`Columns`]); what the value means is decided here.

use std::collections::HashMap;

use recovea_core::caps::{Cap, Scope};
use recovea_core::channel::JobKind;
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::jobs::BatchInput;
use recovea_core::keys::KeyHash;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::org_tokens::OrgRole;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::tags::{self, Tags};
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;

use crate::{
    ActiveKey, AlertRecord, CapRecord, FileRecord, JobRecord, KeyRecord, NodeCredentialRecord, NodeRecord,
    OrgRecord, OrgTokenRecord, PresentedCredential, PriceChange, PriceOverride, PriceTarget, ProviderRecord,
    Result, SpendRow, StoreError, TagSpendRow,
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

pub(crate) const JOB_COLUMNS: &str = "org_id, provider, job_id, key_id, kind, endpoint, model, request_id, \
     started_at, held_nanos, settled_at, cost_nanos, polls, next_poll_at, last_error";

/// A job, from its [`JOB_COLUMNS`].
pub(crate) fn job(row: &dyn Columns) -> Result<JobRecord> {
    let kind = row.text(4)?;
    let polls = row.count(12)?;
    Ok(JobRecord {
        org_id: org_id(row.text(0)?)?,
        provider: row.string(1)?,
        job_id: row.string(2)?,
        key_id: key_id(row.text(3)?)?,
        kind: JobKind::parse(kind).ok_or_else(|| corrupt(format!("bad job kind {kind:?}")))?,
        endpoint: row.string(5)?,
        model: row.optional_string(6)?,
        request_id: row.string(7)?,
        started_at: row.timestamp(8)?,
        held: Nanos(row.integer(9)?),
        settled_at: row.optional_timestamp(10)?,
        cost: row.optional_integer(11)?.map(Nanos),
        // Only counted up by one per poll: a count past `u32` is years of polls of one job, and
        // stays the largest rather than making the whole book unreadable.
        polls: u32::try_from(polls).unwrap_or(u32::MAX),
        next_poll_at: row.timestamp(13)?,
        last_error: row.optional_string(14)?,
    })
}

/// A job's key (organization, credential, id), ordered by bytes as both databases order those
/// columns.
pub(crate) fn job_key(job: &JobRecord) -> (&str, &str, &str) {
    (job.org_id.as_str(), &job.provider, &job.job_id)
}

pub(crate) fn sort_jobs(jobs: &mut [JobRecord]) {
    jobs.sort_unstable_by(|a, b| job_key(a).cmp(&job_key(b)));
}

pub(crate) const FILE_COLUMNS: &str = "org_id, provider, file_id, created_at, input";

/// A file's key, as [`job_key`].
pub(crate) fn file_key(file: &FileRecord) -> (&str, &str, &str) {
    (file.org_id.as_str(), &file.provider, &file.file_id)
}

pub(crate) fn sort_files(files: &mut [FileRecord]) {
    files.sort_unstable_by(|a, b| file_key(a).cmp(&file_key(b)));
}

/// A batch input file, from its [`FILE_COLUMNS`] (its estimate as JSON).
pub(crate) fn file(row: &dyn Columns) -> Result<FileRecord> {
    Ok(FileRecord {
        org_id: org_id(row.text(0)?)?,
        provider: row.string(1)?,
        file_id: row.string(2)?,
        created_at: row.timestamp(3)?,
        input: serde_json::from_str(row.text(4)?).map_err(|e| corrupt(format!("bad batch input: {e}")))?,
    })
}

/// The stored text of a batch input file's estimate.
pub(crate) fn batch_input_text(input: &BatchInput) -> Result<String> {
    serde_json::to_string(input).map_err(|e| StoreError::Backend(format!("batch input: {e}")))
}

/// A day of settled job spend: org_id, key_id, day and the sum of cost_nanos, in that order.
pub(crate) fn job_spend(row: &dyn Columns) -> Result<(OrgId, KeyId, i64, Nanos)> {
    Ok((org_id(row.text(0)?)?, key_id(row.text(1)?)?, row.integer(2)?, Nanos(row.integer(3)?)))
}

/// The first millisecond of a UTC day, for a `started_at >=` bound an index can seek: a day past
/// either end of `i64` milliseconds saturates (the day itself is then compared as well).
pub(crate) fn day_start(day: i64) -> i64 {
    day.saturating_mul(MS_PER_DAY)
}

/// A receipt's tags from their stored text; `NULL` or empty: none.
pub(crate) fn tags(row: &dyn Columns, index: usize) -> Result<Tags> {
    match row.optional_text(index)? {
        None => Ok(Tags::new()),
        Some(text) => tags::parse([text.as_bytes()]).map_err(|e| corrupt(format!("bad tags {text:?}: {e}"))),
    }
}

/// The stored text of a receipt's tags: `NULL` for none.
pub(crate) fn tags_text(tags: &Tags) -> Option<String> {
    (!tags.is_empty()).then(|| tags::to_text(tags))
}

/// What a tags filter looks for in `',' || tags || ','`: the pair whole, between commas.
pub(crate) fn tag_needle(tag: &Option<(String, String)>) -> Option<String> {
    tag.as_ref().map(|(key, value)| format!(",{key}={value},"))
}

/// Sums per (day, tags text) rows, in (day, tags) order, into rows per (day, value of `key`), in
/// (day, value) order with the receipts without `key` first.
pub(crate) fn by_tag(rows: Vec<(String, Option<String>, SpendRow)>, key: &str) -> Vec<TagSpendRow> {
    let mut sums: std::collections::BTreeMap<(String, Option<String>), TagSpendRow> = Default::default();
    for (day, text, row) in rows {
        let value = text.as_deref().and_then(|text| tags::text_value(text, key)).map(str::to_owned);
        let sum = sums.entry((day.clone(), value.clone())).or_insert_with(|| TagSpendRow {
            day,
            value,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost: Nanos(0),
        });
        sum.requests += row.requests;
        sum.input_tokens = sum.input_tokens.saturating_add(row.input_tokens);
        sum.output_tokens = sum.output_tokens.saturating_add(row.output_tokens);
        sum.cost = Nanos(sum.cost.0.saturating_add(row.cost.0));
    }
    sums.into_values().collect()
}

/// A (day, tags text) row of the summary by tag: `day, tags, count, input, output, cost`.
pub(crate) fn tag_sum_row(row: &dyn Columns) -> Result<(String, Option<String>, SpendRow)> {
    Ok((
        row.string(0)?,
        row.optional_string(1)?,
        SpendRow {
            day: String::new(),
            key_id: String::new(),
            model: None,
            requests: row.count(2)?,
            input_tokens: row.count(3)?,
            output_tokens: row.count(4)?,
            cost: Nanos(row.integer(5)?),
        },
    ))
}

/// A row of the spend summary, from its day, key_id, model, request count and the sums of
/// input_tokens, output_tokens and cost_nanos, in that order: each backend computes the day its
/// own way.
pub(crate) fn spend_row(row: &dyn Columns) -> Result<SpendRow> {
    Ok(SpendRow {
        day: row.string(0)?,
        key_id: row.string(1)?,
        model: row.optional_string(2)?,
        requests: row.count(3)?,
        input_tokens: row.count(4)?,
        output_tokens: row.count(5)?,
        cost: Nanos(row.integer(6)?),
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

/// Milliseconds in a UTC day: `spend_daily` keys its rows by `started_at` floored to these.
pub(crate) const MS_PER_DAY: i64 = 86_400_000;

/// The day of `spend_daily` a receipt started on: days since 1970-01-01 UTC, floored.
pub(crate) fn day_of(started_at: i64) -> i64 {
    started_at.div_euclid(MS_PER_DAY)
}

/// The days `[first, last)` of `spend_daily` a spend summary's range covers, when it is whole
/// days (a missing bound is no bound); `None`: a bound falls inside a day, so the receipts are read.
pub(crate) fn summary_days(from: Option<i64>, to: Option<i64>) -> Option<(i64, i64)> {
    let whole = |bound: Option<i64>, open: i64| match bound {
        None => Some(open),
        Some(ms) => (ms.rem_euclid(MS_PER_DAY) == 0).then(|| day_of(ms)),
    };
    Some((whole(from, i64::MIN)?, whole(to, i64::MAX)?))
}

/// `[from, to)` cut into the receipts of its first partial day `[from, head_end)`, the whole days
/// `[first_day, last_day)` that `spend_daily` sums, and the receipts of its last partial day
/// `[tail_start, to)`. Without a whole day inside, the receipts of all of it, and no day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpendSplit {
    pub head_end: i64,
    pub first_day: i64,
    pub last_day: i64,
    pub tail_start: i64,
}

pub(crate) fn spend_split(from: i64, to: i64) -> SpendSplit {
    let first_day = day_of(from) + i64::from(from.rem_euclid(MS_PER_DAY) != 0);
    let last_day = day_of(to);
    let bounds = first_day.checked_mul(MS_PER_DAY).zip(last_day.checked_mul(MS_PER_DAY));
    match bounds {
        Some((head_end, tail_start)) if first_day < last_day => {
            SpendSplit { head_end, first_day, last_day, tail_start }
        }
        _ => SpendSplit { head_end: to, first_day: 0, last_day: 0, tail_start: to },
    }
}

/// One receipt's part of a `spend_daily` row: the row's key, and what it adds.
pub(crate) type DailyKey<'a> = (&'a str, i64, &'a str, Option<&'a str>);

/// What the receipts of one `spend_daily` row add to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DailySums {
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_nanos: i64,
}

impl DailySums {
    pub(crate) fn add(&mut self, receipt: &recovea_core::receipt::Receipt) {
        self.requests = self.requests.saturating_add(1);
        self.input_tokens = self.input_tokens.saturating_add(saturating_i64(receipt.input_tokens));
        self.output_tokens = self.output_tokens.saturating_add(saturating_i64(receipt.output_tokens));
        self.cost_nanos = self.cost_nanos.saturating_add(receipt.cost_usd.0);
    }
}

#[cfg(test)]
mod day_tests {
    use super::*;

    #[test]
    fn a_range_splits_into_partial_days_and_whole_days() {
        let d = MS_PER_DAY;
        assert_eq!(
            spend_split(5, 3 * d + 7),
            SpendSplit { head_end: d, first_day: 1, last_day: 3, tail_start: 3 * d }
        );
        assert_eq!(
            spend_split(d, 3 * d),
            SpendSplit { head_end: d, first_day: 1, last_day: 3, tail_start: 3 * d }
        );
        let raw = |to| SpendSplit { head_end: to, first_day: 0, last_day: 0, tail_start: to };
        assert_eq!(spend_split(5, d + 7), raw(d + 7), "no whole day inside");
        assert_eq!(spend_split(5, 100), raw(100));
        assert_eq!(spend_split(i64::MAX - 5, i64::MAX), raw(i64::MAX), "no day past i64 ms");
        let all = spend_split(i64::MIN, i64::MAX);
        assert!(all.head_end - i64::MIN < d && i64::MAX - all.tail_start < d, "{all:?}");
        assert_eq!(spend_split(-d - 1, d).first_day, -1, "days before 1970 floor");
    }

    #[test]
    fn only_whole_day_ranges_are_summed_by_day() {
        let d = MS_PER_DAY;
        assert_eq!(summary_days(None, None), Some((i64::MIN, i64::MAX)));
        assert_eq!(summary_days(Some(2 * d), Some(5 * d)), Some((2, 5)));
        assert_eq!(summary_days(Some(-d), None), Some((-1, i64::MAX)));
        assert_eq!(summary_days(Some(2 * d + 1), None), None);
        assert_eq!(summary_days(None, Some(5 * d - 1)), None);
        assert_eq!(day_of(-1), -1);
    }
}

/// The quantities of a receipt a SQLite row keeps in one JSON column (`quantities`): those most
/// receipts do not have (hour-long cache writes, image tokens, characters, seconds, images, tool
/// calls, a tier), as the receipt's own JSON writes them. `None` when the receipt has none.
pub(crate) fn quantities_text(receipt: &recovea_core::receipt::Receipt) -> Option<String> {
    let quantities = Quantities {
        cache_write_1h_input_tokens: receipt.cache_write_1h_input_tokens,
        image_input_tokens: receipt.image_input_tokens,
        cached_image_input_tokens: receipt.cached_image_input_tokens,
        image_output_tokens: receipt.image_output_tokens,
        characters: receipt.characters,
        seconds: receipt.seconds,
        images: receipt.images,
        tool_calls: receipt.tool_calls,
        service_tier: (!receipt.service_tier.is_standard()).then(|| receipt.service_tier.as_str().to_owned()),
    };
    (quantities != Quantities::default()).then(|| serde_json::to_string(&quantities).unwrap_or_default())
}

/// Sets the quantities a `quantities` column holds on `receipt`.
pub(crate) fn read_quantities(text: &str, receipt: &mut recovea_core::receipt::Receipt) -> Result<()> {
    let q: Quantities =
        serde_json::from_str(text).map_err(|e| corrupt(format!("bad receipt quantities: {e}")))?;
    receipt.cache_write_1h_input_tokens = q.cache_write_1h_input_tokens;
    receipt.image_input_tokens = q.image_input_tokens;
    receipt.cached_image_input_tokens = q.cached_image_input_tokens;
    receipt.image_output_tokens = q.image_output_tokens;
    receipt.characters = q.characters;
    receipt.seconds = q.seconds;
    receipt.images = q.images;
    receipt.tool_calls = q.tool_calls;
    receipt.service_tier = q
        .service_tier
        .as_deref()
        .map_or(recovea_core::pricing::ServiceTier::Standard, recovea_core::pricing::ServiceTier::parse);
    Ok(())
}

#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Quantities {
    #[serde(default, skip_serializing_if = "is_zero")]
    cache_write_1h_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    cached_image_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    image_output_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    characters: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    seconds: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    images: u64,
    #[serde(default, skip_serializing_if = "recovea_core::receipt::ToolCalls::is_empty")]
    tool_calls: recovea_core::receipt::ToolCalls,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service_tier: Option<String>,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}
