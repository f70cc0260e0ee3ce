//! The members of request bodies, checked: names, expiries, allowlists and limits. Each refusal
//! names its member.

use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::models::{ModelAllowlist, PatternError};
use recovea_core::timestamp::Timestamp;
use recovea_store::AccessRules;
use serde_json::Value;

use crate::ApiError;
use crate::admin::requests::Change;

/// A name (an organization's, a key's, a token's): 1 to 200 characters, trimmed.
pub(crate) fn name_field(field: &str, value: String) -> Result<String, ApiError> {
    let value = value.trim().to_owned();
    if value.is_empty() || value.chars().count() > 200 {
        return Err(ApiError::bad_field(field, "expected 1 to 200 characters"));
    }
    Ok(value)
}

/// An optional expiry given on creation (a key's, a token's): an RFC 3339 time after `created_at`.
pub(crate) fn expiry(text: Option<&str>, created_at: Timestamp) -> Result<Option<Timestamp>, ApiError> {
    let Some(text) = text else { return Ok(None) };
    let at = Timestamp::parse_rfc3339(text).ok_or_else(|| {
        ApiError::bad_field("expires_at", "expected an RFC 3339 time such as 2027-01-01T00:00:00Z")
    })?;
    if at <= created_at {
        return Err(ApiError::bad_field("expires_at", "must be in the future"));
    }
    Ok(Some(at))
}

/// A model allowlist given on creation: absent (every model) or a list of names and `prefix*`s.
pub(crate) fn allowed_models(value: Option<Vec<String>>) -> Result<Option<ModelAllowlist>, ApiError> {
    allowlist("allowed_models", value, ModelAllowlist::parse)
}

/// An endpoint allowlist given on creation: absent (every endpoint) or a list of paths and
/// `/prefix*`s.
pub(crate) fn allowed_endpoints(value: Option<Vec<String>>) -> Result<Option<EndpointAllowlist>, ApiError> {
    allowlist("allowed_endpoints", value, EndpointAllowlist::parse)
}

/// A list given on creation, validated by `parse`; its errors name `member`.
fn allowlist<T>(
    member: &str,
    value: Option<Vec<String>>,
    parse: fn(Vec<String>) -> Result<T, PatternError>,
) -> Result<Option<T>, ApiError> {
    value.map(parse).transpose().map_err(|e| ApiError::bad_field(member, e))
}

/// A list in a patch: `null` removes it (everything), a list of strings sets it; `entries` says
/// what a list holds, for the message of anything else.
fn allowlist_patch<T>(
    member: &str,
    change: Change<Value>,
    entries: &str,
    parse: fn(Vec<String>) -> Result<T, PatternError>,
) -> Result<Option<T>, ApiError> {
    let Change::Set(value) = change else { return Ok(None) };
    let list = serde_json::from_value::<Vec<String>>(value)
        .map_err(|_| ApiError::bad_field(member, format_args!("expected a list of {entries}, or null")))?;
    allowlist(member, Some(list), parse)
}

/// A key's or an organization's rules after a patch: each member left out keeps its value in
/// `current`, `null` removes the rule.
pub(crate) fn rules_patch(
    current: AccessRules,
    models: Option<Change<Value>>,
    endpoints: Option<Change<Value>>,
    max_concurrent: Option<Change<Value>>,
) -> Result<AccessRules, ApiError> {
    Ok(AccessRules {
        allowed_models: match models {
            Some(change) => allowlist_patch(
                "allowed_models",
                change,
                "model names (or \"prefix*\")",
                ModelAllowlist::parse,
            )?,
            None => current.allowed_models,
        },
        allowed_endpoints: match endpoints {
            Some(change) => allowlist_patch(
                "allowed_endpoints",
                change,
                "paths (or \"/prefix*\")",
                EndpointAllowlist::parse,
            )?,
            None => current.allowed_endpoints,
        },
        max_concurrent_requests: limit_patch(
            "max_concurrent_requests",
            max_concurrent,
            current.max_concurrent_requests,
        )?,
    })
}

/// A rate limit given on creation: absent or a positive number.
pub(crate) fn positive(field: &str, value: Option<u32>) -> Result<Option<u32>, ApiError> {
    match value {
        Some(0) => Err(ApiError::bad_field(field, "expected a positive number or no limit")),
        other => Ok(other),
    }
}

/// A rate limit in a patch: left out keeps `current`, `null` removes it, a positive number sets it.
pub(crate) fn limit_patch(
    field: &str,
    change: Option<Change<Value>>,
    current: Option<u32>,
) -> Result<Option<u32>, ApiError> {
    match change {
        None => Ok(current),
        Some(Change::Remove) => Ok(None),
        Some(Change::Set(v)) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| ApiError::bad_field(field, "expected a positive number or null")),
    }
}
