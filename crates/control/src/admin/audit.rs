//! `GET /audit` and `GET /orgs/{org}/audit`: the audit log, or one organization's trail in it,
//! filtered and paged as the receipts are (the cursor is the last entry's state version).

use recovea_core::ids::OrgId;
use recovea_store::{AuditEntry, AuditQuery};
use serde_json::{Value, json};

use crate::admin::query::Params;
use crate::admin::receipts::parse_limit;
use crate::admin::{Reply, ok};
use crate::{ApiError, Control};

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;

impl Control {
    /// The whole log, or `org`'s trail alone (its path's organization: an `org_id` in the query
    /// is not read there).
    pub(crate) async fn list_audit(&self, org: Option<OrgId>, query: &str) -> Result<Reply, ApiError> {
        if let Some(org) = &org {
            // An organization's trail is its path's: an unknown one is a 404, as on every such path.
            self.require_org(org).await?;
        }
        let params = Params::parse(query)?;
        let limit = parse_limit(&params, DEFAULT_LIMIT, MAX_LIMIT)?;
        // Kinds and actions are lowercase words; anything else selects nothing and is a mistake.
        let word = |name: &str, example: &str| -> Result<Option<String>, ApiError> {
            match params.get(name) {
                None => Ok(None),
                Some(text)
                    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') =>
                {
                    Ok(Some(text.to_owned()))
                }
                Some(_) => Err(ApiError::bad_field(name, format_args!("expected a word such as {example}"))),
            }
        };
        let query = AuditQuery {
            from: params.time("from")?,
            to: params.time("to")?,
            org_id: match org {
                Some(org) => Some(org),
                None => params
                    .get("org_id")
                    .map(|id| OrgId::parse(id).ok_or_else(|| ApiError::bad_field("org_id", "not an org id")))
                    .transpose()?,
            },
            object_kind: word("object_kind", "key")?,
            action: word("action", "create")?,
            // One more than asked tells whether another page follows.
            limit: limit + 1,
            after_version: params
                .get("cursor")
                .map(|c| c.parse().map_err(|_| ApiError::bad_field("cursor", "not a cursor this API gave")))
                .transpose()?,
        };
        let mut entries = self.store(move |s| s.audit_log(&query)).await?;
        let more = entries.len() > limit as usize;
        entries.truncate(limit as usize);
        let next_cursor = entries.last().filter(|_| more).map(|e| e.version.to_string());
        let entries = entries.iter().map(entry_json).collect::<Result<Vec<_>, _>>()?;
        ok(json!({ "entries": entries, "next_cursor": next_cursor }))
    }
}

/// An entry as the API gives it; its before and after are the JSON the store kept.
fn entry_json(entry: &AuditEntry) -> Result<Value, ApiError> {
    let object = |text: &Option<String>| -> Result<Value, ApiError> {
        text.as_deref().map_or(Ok(Value::Null), |text| serde_json::from_str(text).map_err(ApiError::internal))
    };
    Ok(json!({
        "id": entry.id,
        "version": entry.version,
        "at": entry.at,
        "auth": entry.auth.as_str(),
        "actor": entry.actor.to_json(),
        "client": entry.client,
        "action": entry.action,
        "object_kind": entry.object_kind,
        "object_id": entry.object_id,
        "org_id": entry.org_id,
        "before": object(&entry.before)?,
        "after": object(&entry.after)?,
    }))
}
