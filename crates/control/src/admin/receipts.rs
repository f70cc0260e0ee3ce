//! `GET /orgs/{org}/receipts` (JSON pages or CSV) and the spend summary by day, key and model, or
//! by day and the value of a tag.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::receipt::{ProviderKey, Receipt};
use recovea_core::tags;
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;
use recovea_store::ReceiptQuery;
use serde_json::{Value, json};

use crate::admin::query::Params;
use crate::admin::{Reply, ReplyBody, ok};
use crate::{ApiError, Control};

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// A CSV export is one answer: bounded so that it cannot exhaust the control plane's memory.
const MAX_CSV_ROWS: u32 = 100_000;

const CSV_COLUMNS: [&str; 29] = [
    "id",
    "request_id",
    "org_id",
    "key_id",
    "provider",
    "model",
    "endpoint",
    "status",
    "stream",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "reasoning_tokens",
    "cost_usd",
    "usage_source",
    "priced",
    "price_revision",
    "started_at",
    "finished_at",
    "node_id",
    "priced_as",
    "tags",
    "audio_input_tokens",
    "cached_audio_input_tokens",
    "audio_output_tokens",
    "job_id",
    "held_usd",
    "provider_key",
];

impl Control {
    pub(crate) async fn list_receipts(&self, org_id: OrgId, query: &str) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let params = Params::parse(query)?;
        let csv = match params.get("format") {
            None | Some("json") => false,
            Some("csv") => true,
            Some(_) => return Err(ApiError::bad_field("format", "expected json or csv")),
        };
        let limit = if csv {
            parse_limit(&params, MAX_CSV_ROWS, MAX_CSV_ROWS)?
        } else {
            parse_limit(&params, DEFAULT_LIMIT, MAX_LIMIT)?
        };
        let query = ReceiptQuery {
            org_id,
            from: params.time("from")?,
            to: params.time("to")?,
            key_id: key_filter(&params)?,
            model: params.get("model").filter(|m| !m.is_empty()).map(str::to_owned),
            status: params
                .get("status")
                .map(|s| {
                    s.parse::<u16>()
                        .ok()
                        .filter(|n| (100..=599).contains(n))
                        .ok_or_else(|| ApiError::bad_field("status", "expected an HTTP status, 100 to 599"))
                })
                .transpose()?,
            usage_source: params
                .get("usage_source")
                .map(|s| {
                    UsageSource::parse(s).ok_or_else(|| {
                        ApiError::bad_field("usage_source", "expected provider, estimated or unmetered")
                    })
                })
                .transpose()?,
            provider_key: params
                .get("provider_key")
                .map(|s| {
                    ProviderKey::parse(s)
                        .ok_or_else(|| ApiError::bad_field("provider_key", "expected managed or client"))
                })
                .transpose()?,
            // One more than asked tells whether another page follows.
            limit: limit + 1,
            after: params.get("cursor").map(parse_cursor).transpose()?,
            tag: params
                .get("tag")
                .map(|text| tags::parse_filter(text).map_err(|e| ApiError::bad_field("tag", e)))
                .transpose()?,
        };
        let mut receipts = self.ledger(move |l| l.receipts(&query)).await?;
        let more = receipts.len() > limit as usize;
        receipts.truncate(limit as usize);
        if csv {
            return Ok(Reply { status: http::StatusCode::OK, body: ReplyBody::Csv(to_csv(&receipts)) });
        }
        let next_cursor = receipts.last().filter(|_| more).map(|r| format!("{}.{}", r.started_at.0, r.id));
        ok(json!({ "receipts": receipts, "next_cursor": next_cursor }))
    }

    /// One receipt of the organization, by id: what the console's receipt page shows.
    pub(crate) async fn get_receipt(&self, org_id: OrgId, id: &str) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let missing = format!("No receipt {id} in organization {org_id}.");
        let id = id.to_owned();
        let receipt = self.ledger(move |l| l.receipt(&org_id, &id)).await?;
        ok(json!(receipt.ok_or(ApiError::NotFound(missing))?))
    }

    pub(crate) async fn spend_summary(&self, org_id: OrgId, query: &str) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let params = Params::parse(query)?;
        let (from, to, key_id) = (params.time("from")?, params.time("to")?, key_filter(&params)?);
        if let Some(group) = params.get("group_by") {
            let key = group
                .strip_prefix("tag:")
                .filter(|key| {
                    !key.is_empty() && key.len() <= tags::MAX_KEY_LEN && key.bytes().all(tags::is_key_char)
                })
                .ok_or_else(|| ApiError::bad_field("group_by", "expected tag:KEY, a tag key"))?
                .to_owned();
            let rows = self.ledger(move |l| l.spend_by_tag(&org_id, key_id.as_ref(), from, to, &key)).await?;
            let rows: Vec<Value> = rows
                .iter()
                .map(|r| {
                    json!({
                        "day": r.day,
                        "tag_value": r.value,
                        "requests": r.requests,
                        "input_tokens": r.input_tokens,
                        "output_tokens": r.output_tokens,
                        "cost_usd": r.cost,
                    })
                })
                .collect();
            return ok(json!({ "group_by": group, "rows": rows }));
        }
        let rows = self.ledger(move |l| l.spend_summary(&org_id, key_id.as_ref(), from, to)).await?;
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "day": r.day,
                    "key_id": r.key_id,
                    "model": r.model,
                    "requests": r.requests,
                    "input_tokens": r.input_tokens,
                    "output_tokens": r.output_tokens,
                    "cost_usd": r.cost,
                })
            })
            .collect();
        ok(json!({ "rows": rows }))
    }
}

/// The `limit` parameter: `default` when absent, else 1 to `max`.
pub(crate) fn parse_limit(params: &Params, default: u32, max: u32) -> Result<u32, ApiError> {
    let Some(text) = params.get("limit") else { return Ok(default) };
    text.parse::<u32>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ApiError::bad_field("limit", format_args!("expected 1 to {max}")))
}

/// The `key_id` parameter, when given.
fn key_filter(params: &Params) -> Result<Option<KeyId>, ApiError> {
    params
        .get("key_id")
        .map(|k| KeyId::parse(k).ok_or_else(|| ApiError::bad_field("key_id", "not a key id")))
        .transpose()
}

/// A cursor (`MILLISECONDS.ID`) as the receipts hand them out.
fn parse_cursor(cursor: &str) -> Result<(Timestamp, String), ApiError> {
    let bad = || ApiError::bad_field("cursor", "not a cursor this API gave");
    let (time, id) = cursor.split_once('.').ok_or_else(bad)?;
    Ok((Timestamp(time.parse().map_err(|_| bad())?), id.to_owned()))
}

fn to_csv(receipts: &[Receipt]) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for r in receipts {
        let fields = [
            r.id.clone(),
            r.request_id.clone(),
            r.org_id.clone(),
            r.key_id.clone(),
            r.provider.clone(),
            r.model.clone().unwrap_or_default(),
            r.endpoint.clone(),
            r.status.to_string(),
            r.stream.to_string(),
            r.input_tokens.to_string(),
            r.output_tokens.to_string(),
            r.cached_input_tokens.to_string(),
            r.cache_write_input_tokens.to_string(),
            r.reasoning_tokens.to_string(),
            r.cost_usd.to_usd_string(),
            r.usage_source.as_str().to_owned(),
            r.priced.to_string(),
            r.price_revision.to_string(),
            r.started_at.to_rfc3339(),
            r.finished_at.to_rfc3339(),
            r.node_id.clone(),
            r.priced_as.clone().unwrap_or_default(),
            tags::to_text(&r.tags),
            r.audio_input_tokens.to_string(),
            r.cached_audio_input_tokens.to_string(),
            r.audio_output_tokens.to_string(),
            r.job_id.clone().unwrap_or_default(),
            r.held_usd.map(|held| held.to_usd_string()).unwrap_or_default(),
            r.provider_key.map(ProviderKey::as_str).unwrap_or_default().to_owned(),
        ];
        let escaped: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        out.push_str(&escaped.join(","));
        out.push('\n');
    }
    out
}

/// Quotes a field when it needs it (RFC 4180), and defuses spreadsheet formulas: a field a
/// spreadsheet could read as one (its first character `=`, `+`, `-`, `@`, a tab or a carriage
/// return, and not a number) is prefixed with `'`.
fn csv_field(field: &str) -> String {
    let field = if field.starts_with(['=', '+', '-', '@', '\t', '\r']) && field.parse::<f64>().is_err() {
        format!("'{field}")
    } else {
        field.to_owned()
    };
    if field.contains([',', '"', '\n', '\r']) { format!("\"{}\"", field.replace('"', "\"\"")) } else { field }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_the_largest_allowed() {
        let limit = |query: &str, default, max| match parse_limit(
            &Params::parse(query).expect("query"),
            default,
            max,
        ) {
            Ok(n) => Ok(n),
            Err(ApiError::BadRequest { message, .. }) => Err(message),
            Err(other) => panic!("{other:?}"),
        };
        assert_eq!(limit("", DEFAULT_LIMIT, MAX_LIMIT), Ok(100));
        assert_eq!(limit("limit=1000", DEFAULT_LIMIT, MAX_LIMIT), Ok(1000));
        assert_eq!(limit("limit=1001", DEFAULT_LIMIT, MAX_LIMIT), Err("limit: expected 1 to 1000".into()));
        assert_eq!(limit("limit=100000", MAX_CSV_ROWS, MAX_CSV_ROWS), Ok(100_000));
        assert_eq!(limit("limit=0", MAX_CSV_ROWS, MAX_CSV_ROWS), Err("limit: expected 1 to 100000".into()));
    }

    #[test]
    fn csv_fields_are_quoted_and_defused() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=cmd()"), "'=cmd()");
        assert_eq!(csv_field("-1.5"), "-1.5");
        assert_eq!(csv_field("\t=cmd()"), "'\t=cmd()");
        assert_eq!(csv_field("\r=cmd()"), "\"'\r=cmd()\"");
    }
}
