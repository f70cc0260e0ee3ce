//! The admin API under `/admin/v1`: routing, request bodies, and the JSON of its answers.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, StatusCode};
use recovea_core::crypto::{self, MasterKey};
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys;
use recovea_core::models::{ModelAllowlist, PatternError};
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_store::{
    AccessRules, AuditAuth, AuditContext, ControlStore, KeyRecord, OrgRecord, ProviderRecord, ReceiptLedger,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use recovea_store::audit::{key_json, org_json, provider_json};

use crate::Control;
use crate::error::ApiError;
use crate::principal::Principal;
use crate::random;
use access::{Access, Scope};
use recovea_core::crypto::provider_key_context;
use requests::{Change, KeyPatch, NewKey, NewOrg, OrgPatch, ProviderBody};
use routes::Route;

pub(crate) const OPENAPI: &str = include_str!("openapi.json");

pub(crate) mod access;
mod audit;
pub(crate) mod caps;
mod node_credentials;
mod org_tokens;
mod prices;
pub(crate) mod query;
pub(crate) mod receipts;
pub mod requests;
pub(crate) mod routes;

/// A successful admin answer: its status and body.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) body: ReplyBody,
}

pub(crate) enum ReplyBody {
    Json(Value),
    /// JSON serialized already (the feed's states, serialized once for every node).
    Raw(Bytes),
    Csv(String),
}

fn ok(body: Value) -> Result<Reply, ApiError> {
    Ok(Reply { status: StatusCode::OK, body: ReplyBody::Json(body) })
}

fn created(body: Value) -> Result<Reply, ApiError> {
    Ok(Reply { status: StatusCode::CREATED, body: ReplyBody::Json(body) })
}

/// Who is calling, how they authenticated and where from: what they may reach is decided from the
/// principal, and each change they make is recorded with all three.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) principal: Principal,
    pub(crate) auth: AuditAuth,
    pub(crate) client: Option<std::net::SocketAddr>,
}

impl Caller {
    /// The audit context of one change by this caller: a new row id, and now.
    pub(crate) fn audit(&self) -> Result<AuditContext, ApiError> {
        let at = now();
        let mut id = String::from("aud_");
        let mut random = random::bytes::<64>().map_err(ApiError::internal)?.into_iter().cycle();
        recovea_core::ids::push_time_ordered(&mut id, u64::try_from(at.0).unwrap_or(0), 12, || {
            random.next().unwrap_or(0)
        });
        Ok(AuditContext {
            id,
            at,
            auth: self.auth,
            actor: self.principal.actor(),
            client: self.client.map(|addr| addr.to_string()),
        })
    }
}

impl Control {
    /// Runs one authenticated admin request (`segments` follow `/admin/v1/`): the operation is read
    /// from the path, the caller held to what it may reach (`access`), then the operation runs.
    pub(crate) async fn route(
        &self,
        caller: Caller,
        method: &Method,
        segments: &[&str],
        query: &str,
        body: Bytes,
    ) -> Result<Reply, ApiError> {
        let route = Route::parse(method, segments)?;
        let scope = access::decide(&caller.principal.reach(), route.access())?;
        if let Access::Of { target, .. } = route.access() {
            self.check_target(&scope, target).await?;
        }
        let reply = match route {
            Route::Audit => self.list_audit(None, query).await,
            Route::OrgAudit { org } => self.list_audit(Some(org_id(org)?), query).await,
            Route::ListReceipts { org } => self.list_receipts(org_id(org)?, query).await,
            Route::ReceiptSummary { org } => self.spend_summary(org_id(org)?, query).await,
            Route::GetReceipt { org, receipt } => self.get_receipt(org_id(org)?, receipt).await,
            Route::ListPrices => self.list_prices(),
            Route::ListNodes => self.list_nodes().await,
            Route::CreateNodeCredential => self.create_node_credential(caller, parse(&body)?).await,
            Route::ListNodeCredentials => self.list_node_credentials().await,
            Route::RevokeNodeCredential { credential } => {
                self.revoke_node_credential(caller, credential).await
            }
            Route::CreateCap { org } => self.create_cap(caller, org_id(org)?, parse(&body)?).await,
            Route::ListCaps { org } => self.list_caps(org_id(org)?).await,
            Route::GetCap { cap } => self.get_cap(cap_id(cap)?).await,
            Route::UpdateCap { cap } => self.update_cap(caller, cap_id(cap)?, parse(&body)?).await,
            Route::DeleteCap { cap } => self.delete_cap(caller, cap_id(cap)?).await,
            Route::Spend { org } => self.spend(org_id(org)?).await,
            Route::ListAlerts { org } => self.list_alerts(org_id(org)?).await,
            Route::PutPrice { model } => self.put_price(caller, &model, parse(&body)?).await,
            Route::GetPrice { model } => self.get_price(&model, query).await,
            Route::DeletePrice { model } => self.delete_price(caller, &model).await,
            Route::ImportPrices => self.import_prices(caller, &body).await,
            Route::PutFallbackPrice { kind } => self.put_fallback_price(caller, kind, parse(&body)?).await,
            Route::DeleteFallbackPrice { kind } => self.delete_fallback_price(caller, kind).await,
            Route::CreateOrg => self.create_org(caller, parse(&body)?).await,
            Route::ListOrgs => self.list_orgs(&scope).await,
            Route::GetOrg { org } => self.get_org(org_id(org)?).await,
            Route::UpdateOrg { org } => self.update_org(caller, &scope, org_id(org)?, parse(&body)?).await,
            Route::CreateKey { org } => self.create_key(caller, org_id(org)?, parse(&body)?).await,
            Route::ListKeys { org } => self.list_keys(org_id(org)?).await,
            Route::RevokeKey { key } => self.revoke_key(caller, key_id(key)?).await,
            Route::GetKey { key } => self.get_key(key_id(key)?).await,
            Route::UpdateKey { key } => self.update_key(caller, key_id(key)?, parse(&body)?).await,
            Route::ListProviders { org } => self.list_providers(org_id(org)?).await,
            Route::PutProvider { org, name } => {
                self.put_provider(caller, &scope, org_id(org)?, name, parse(&body)?).await
            }
            Route::CreateOrgToken { org } => self.create_org_token(caller, org_id(org)?, parse(&body)?).await,
            Route::ListOrgTokens { org } => self.list_org_tokens(org_id(org)?).await,
            Route::RevokeOrgToken { token } => self.revoke_org_token(caller, token).await,
        }?;
        if method != Method::GET
            && let Err(e) = self.publish_latest().await
        {
            // The change is saved; `keep_published` retries the publication.
            tracing::error!(error = ?e, "a saved change could not be published yet");
        }
        Ok(reply)
    }

    pub(crate) async fn ledger<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn ReceiptLedger) -> recovea_store::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let ledger = Arc::clone(&self.inner.ledger);
        self.off_thread(move || work(ledger.as_ref())).await
    }

    pub(crate) async fn store<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn ControlStore) -> recovea_store::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = Arc::clone(&self.inner.store);
        self.off_thread(move || work(store.as_ref())).await
    }

    pub(crate) async fn require_org(&self, id: &OrgId) -> Result<OrgRecord, ApiError> {
        let id = id.clone();
        let missing = no_org(&id);
        self.store(move |s| s.org(&id)).await?.ok_or(missing)
    }

    async fn create_org(&self, caller: Caller, body: NewOrg) -> Result<Reply, ApiError> {
        let org = OrgRecord {
            id: new_id(OrgId::PREFIX, OrgId::parse)?,
            name: name_field("name", body.name)?,
            created_at: now(),
            allowed_models: allowed_models(body.allowed_models)?,
            allowed_endpoints: allowed_endpoints(body.allowed_endpoints)?,
            max_concurrent_requests: positive("max_concurrent_requests", body.max_concurrent_requests)?,
        };
        let (row, audit) = (org.clone(), caller.audit()?);
        self.store(move |s| s.create_org(&row, &audit)).await?;
        created(org_json(&org))
    }

    /// The organizations `scope` reaches: every one, or its own alone.
    async fn list_orgs(&self, scope: &Scope) -> Result<Reply, ApiError> {
        let orgs = match scope {
            Scope::Everything => self.store(|s| s.list_orgs()).await?,
            Scope::Org(id) => {
                let id = id.clone();
                self.store(move |s| s.org(&id)).await?.into_iter().collect()
            }
        };
        ok(json!({ "orgs": orgs.iter().map(org_json).collect::<Vec<_>>() }))
    }

    async fn get_org(&self, id: OrgId) -> Result<Reply, ApiError> {
        ok(org_json(&self.require_org(&id).await?))
    }

    async fn update_org(
        &self,
        caller: Caller,
        scope: &Scope,
        id: OrgId,
        patch: OrgPatch<Value, Value>,
    ) -> Result<Reply, ApiError> {
        access::org_patch(scope, patch.max_concurrent_requests.is_some())?;
        let current = self.require_org(&id).await?;
        if patch.allowed_models.is_none()
            && patch.allowed_endpoints.is_none()
            && patch.max_concurrent_requests.is_none()
        {
            return ok(org_json(&current));
        }
        // Validated before anything is saved, so that a bad member changes nothing.
        let rules = rules_patch(
            current.rules(),
            patch.allowed_models,
            patch.allowed_endpoints,
            patch.max_concurrent_requests,
        )?;
        let missing = no_org(&id);
        let audit = caller.audit()?;
        let org = self.store(move |s| s.set_org_rules(&id, &rules, &audit)).await?.ok_or(missing)?;
        ok(org_json(&org))
    }

    async fn create_key(&self, caller: Caller, org_id: OrgId, body: NewKey) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let created_at = now();
        let expires_at = expiry(body.expires_at.as_deref(), created_at)?;
        let secret =
            random::token(keys::SECRET_PREFIX, keys::SECRET_RANDOM_LEN).map_err(ApiError::internal)?;
        let key = KeyRecord {
            id: new_id(KeyId::PREFIX, KeyId::parse)?,
            org_id,
            name: name_field("name", body.name)?,
            prefix: keys::shown_prefix(&secret).to_owned(),
            created_at,
            expires_at,
            revoked_at: None,
            limits: KeyLimits {
                requests_per_minute: positive("requests_per_minute", body.requests_per_minute)?,
                tokens_per_minute: positive("tokens_per_minute", body.tokens_per_minute)?,
            },
            allowed_models: allowed_models(body.allowed_models)?,
            allowed_endpoints: allowed_endpoints(body.allowed_endpoints)?,
            max_concurrent_requests: positive("max_concurrent_requests", body.max_concurrent_requests)?,
        };
        let (row, hash, audit) = (key.clone(), keys::hash_secret(&secret), caller.audit()?);
        self.store(move |s| s.create_key(&row, hash, &audit)).await?;
        let mut body = key_json(&key);
        body["secret"] = Value::String(secret);
        created(body)
    }

    async fn list_keys(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let keys = self.store(move |s| s.list_keys(&org_id)).await?;
        ok(json!({ "keys": keys.iter().map(key_json).collect::<Vec<_>>() }))
    }

    async fn update_key(
        &self,
        caller: Caller,
        id: KeyId,
        patch: KeyPatch<Value, Value>,
    ) -> Result<Reply, ApiError> {
        let (lookup, owner) = (id.clone(), id.clone());
        let current = self.store(move |s| s.key(&lookup)).await?.ok_or_else(|| no_key(&id))?;
        // Validated before anything is saved, so that a bad member changes nothing.
        let rules = rules_patch(
            current.rules(),
            patch.allowed_models,
            patch.allowed_endpoints,
            patch.max_concurrent_requests,
        )?;
        let limits = KeyLimits {
            requests_per_minute: limit_patch(
                "requests_per_minute",
                patch.requests_per_minute,
                current.limits.requests_per_minute,
            )?,
            tokens_per_minute: limit_patch(
                "tokens_per_minute",
                patch.tokens_per_minute,
                current.limits.tokens_per_minute,
            )?,
        };
        let audit = caller.audit()?;
        let key = self
            .store(move |s| s.update_key(&owner, limits, &rules, &audit))
            .await?
            .ok_or_else(|| no_key(&id))?;
        ok(key_json(&key))
    }

    async fn get_key(&self, id: KeyId) -> Result<Reply, ApiError> {
        let missing = no_key(&id);
        let key = self.store(move |s| s.key(&id)).await?.ok_or(missing)?;
        ok(key_json(&key))
    }

    async fn revoke_key(&self, caller: Caller, id: KeyId) -> Result<Reply, ApiError> {
        let missing = no_key(&id);
        let audit = caller.audit()?;
        let key = self.store(move |s| s.revoke_key(&id, audit.at, &audit)).await?.ok_or(missing)?;
        ok(key_json(&key))
    }

    async fn list_providers(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let providers = self.store(move |s| s.list_providers(&org_id)).await?;
        ok(json!({ "providers": providers.iter().map(provider_json).collect::<Vec<_>>() }))
    }

    /// Creates or replaces a credential: whole by the operator; within an organization, only its
    /// API key (`access::credential_settings`).
    async fn put_provider(
        &self,
        caller: Caller,
        scope: &Scope,
        org_id: OrgId,
        name: &str,
        body: ProviderBody,
    ) -> Result<Reply, ApiError> {
        if !recovea_providers::is_credential_name(name) {
            return Err(ApiError::bad_field(
                "name",
                "a provider name is 1 to 64 characters of a-z, 0-9, '-' and '_'",
            ));
        }
        let kind = ProviderKind::parse(&body.kind).ok_or_else(|| {
            ApiError::bad_field("kind", "expected \"openai\", \"anthropic\", \"azure_openai\" or \"gemini\"")
        })?;
        let base_url = body
            .base_url
            .map(|url| crate::admin::outbound_url(&url))
            .transpose()
            .map_err(|why| ApiError::bad_field("base_url", why))?;
        let api_key = body.api_key.trim();
        if api_key.is_empty() || !api_key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ApiError::bad_field("api_key", "expected a non-empty key of printable characters"));
        }
        let price_namespace = body
            .price_namespace
            .map(|namespace| {
                let namespace = namespace.trim().to_owned();
                let plain = namespace
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
                if namespace.is_empty() || namespace.len() > 64 || !plain {
                    return Err(ApiError::bad_field(
                        "price_namespace",
                        "1 to 64 characters of a-z, 0-9, '-', '_' and '.'",
                    ));
                }
                Ok(namespace)
            })
            .transpose()?;
        let amount = |field: &str, usd: &str| {
            recovea_core::money::Nanos::parse_usd(usd)
                .ok()
                .filter(|amount| *amount >= recovea_core::money::Nanos::ZERO)
                .ok_or_else(|| ApiError::bad_field(field, "expected dollars per million tokens, 0 or more"))
        };
        let fallback_price = match (&body.fallback_input_per_mtok_usd, &body.fallback_output_per_mtok_usd) {
            (None, None) => None,
            (Some(input), Some(output)) => Some((
                amount("fallback_input_per_mtok_usd", input)?,
                amount("fallback_output_per_mtok_usd", output)?,
            )),
            _ => {
                return Err(ApiError::bad_request(
                    "fallback_input_per_mtok_usd and fallback_output_per_mtok_usd: give both, or neither",
                ));
            }
        };
        self.require_org(&org_id).await?;
        let asked = access::CredentialSettings { kind, base_url, price_namespace, fallback_price };
        let current = match scope {
            Scope::Everything => None,
            Scope::Org(_) => {
                let (org, name) = (org_id.clone(), name.to_owned());
                let providers = self.store(move |s| s.list_providers(&org)).await?;
                providers.into_iter().find(|p| p.name == name).map(|p| access::CredentialSettings {
                    kind: p.kind,
                    base_url: p.base_url,
                    price_namespace: p.price_namespace,
                    fallback_price: p.fallback_price,
                })
            }
        };
        let settings = access::credential_settings(scope, current, asked)?;
        if settings.kind == ProviderKind::AzureOpenAi && settings.base_url.is_none() {
            // Each Azure resource has its own endpoint: there is no default to fall back on.
            return Err(ApiError::bad_field(
                "base_url",
                "an azure_openai credential needs its resource endpoint, such as https://NAME.openai.azure.com",
            ));
        }
        let record = ProviderRecord {
            sealed_key: seal(
                &self.inner.master_key,
                &provider_key_context(org_id.as_str(), name),
                api_key.as_bytes(),
            )?,
            key_hint: crypto::key_hint(api_key),
            org_id,
            name: name.to_owned(),
            kind: settings.kind,
            base_url: settings.base_url,
            updated_at: now(),
            price_namespace: settings.price_namespace,
            fallback_price: settings.fallback_price,
        };
        let (row, audit) = (record.clone(), caller.audit()?);
        self.store(move |s| s.put_provider(&row, &audit)).await?;
        ok(provider_json(&record))
    }
}

/// Parses a JSON body; the error names the offending field, never echoes a value.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request("body: expected a JSON object")
        } else if path == "." {
            ApiError::bad_request(format!("body: {}", strip_position(&inner.to_string())))
        } else {
            ApiError::bad_field(path, strip_position(&inner.to_string()))
        }
    })
}

/// serde_json appends " at line L column C", which helps nobody reading an API error.
fn strip_position(message: &str) -> &str {
    message.find(" at line ").map_or(message, |i| &message[..i])
}

fn name_field(field: &str, value: String) -> Result<String, ApiError> {
    let value = value.trim().to_owned();
    if value.is_empty() || value.chars().count() > 200 {
        return Err(ApiError::bad_field(field, "expected 1 to 200 characters"));
    }
    Ok(value)
}

/// The answer for an organization id that names none (or none the caller reaches: the same
/// bytes, so that no caller learns whether another organization's id exists).
pub(crate) fn no_org(id: impl std::fmt::Display) -> ApiError {
    ApiError::NotFound(format!("No organization {id}."))
}

/// As [`no_org`], for a key.
pub(crate) fn no_key(id: impl std::fmt::Display) -> ApiError {
    ApiError::NotFound(format!("No key {id}."))
}

/// As [`no_org`], for a cap.
pub(crate) fn no_cap(id: impl std::fmt::Display) -> ApiError {
    ApiError::NotFound(format!("No cap {id}."))
}

/// As [`no_org`], for an organization token.
pub(crate) fn no_org_token(id: impl std::fmt::Display) -> ApiError {
    ApiError::NotFound(format!("No token {id}."))
}

pub(crate) fn org_id(s: &str) -> Result<OrgId, ApiError> {
    OrgId::parse(s).ok_or_else(|| no_org(s))
}

fn cap_id(s: &str) -> Result<CapId, ApiError> {
    CapId::parse(s).ok_or_else(|| no_cap(s))
}

fn key_id(s: &str) -> Result<KeyId, ApiError> {
    KeyId::parse(s).ok_or_else(|| no_key(s))
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

pub(crate) fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

pub(crate) fn new_id<T>(prefix: &str, parse: fn(&str) -> Option<T>) -> Result<T, ApiError> {
    let token = random::token(prefix, OrgId::RANDOM_LEN).map_err(ApiError::internal)?;
    parse(&token).ok_or_else(|| ApiError::internal("a minted id did not parse"))
}

fn seal(master_key: &MasterKey, context: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, ApiError> {
    let nonce = random::bytes::<12>().map_err(ApiError::internal)?;
    Ok(master_key.seal(nonce, context, plaintext))
}

/// A model allowlist given on creation: absent (every model) or a list of names and `prefix*`s.
fn allowed_models(value: Option<Vec<String>>) -> Result<Option<ModelAllowlist>, ApiError> {
    allowlist("allowed_models", value, ModelAllowlist::parse)
}

/// An endpoint allowlist given on creation: absent (every endpoint) or a list of paths and
/// `/prefix*`s.
fn allowed_endpoints(value: Option<Vec<String>>) -> Result<Option<EndpointAllowlist>, ApiError> {
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
fn rules_patch(
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
fn positive(field: &str, value: Option<u32>) -> Result<Option<u32>, ApiError> {
    match value {
        Some(0) => Err(ApiError::bad_field(field, "expected a positive number or no limit")),
        other => Ok(other),
    }
}

/// A rate limit in a patch: left out keeps `current`, `null` removes it, a positive number sets it.
fn limit_patch(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_errors_name_the_field() {
        let refused = |body: &str| match parse::<ProviderBody>(body.as_bytes()) {
            Err(ApiError::BadRequest { field, message }) => (field, message),
            _ => panic!("expected a bad request"),
        };
        assert_eq!(refused(r#"{"kind":"openai"}"#), (None, "body: missing field `api_key`".into()));
        assert_eq!(
            refused(r#"{"kind":1,"api_key":"x"}"#),
            (Some("kind".into()), "kind: invalid type: integer `1`, expected a string".into())
        );
        let (field, message) = refused(r#"{"kind":"openai","api_key":"x","extra":1}"#);
        assert_eq!(field.as_deref(), Some("extra"));
        assert!(message.starts_with("extra: unknown field `extra`"));
        assert_eq!(refused("not json"), (None, "body: expected a JSON object".into()));
    }
}

#[cfg(test)]
mod openapi_tests {
    use super::OPENAPI;
    use serde_json::Value;

    /// Every (path, method) that `Control::route` answers, as the OpenAPI document spells it.
    /// This table mirrors `Route::parse`: a route added, removed or changed there must change here
    /// too, and in `openapi.json`.
    const ROUTES: &[(&str, &str)] = &[
        ("/audit", "get"),
        ("/orgs/{org}/receipts", "get"),
        ("/orgs/{org}/receipts/summary", "get"),
        ("/orgs/{org}/receipts/{receipt}", "get"),
        ("/prices", "get"),
        ("/nodes", "get"),
        ("/orgs/{org}/caps", "post"),
        ("/orgs/{org}/caps", "get"),
        ("/caps/{cap}", "get"),
        ("/caps/{cap}", "patch"),
        ("/caps/{cap}", "delete"),
        ("/orgs/{org}/spend", "get"),
        ("/orgs/{org}/alerts", "get"),
        ("/prices/{model}", "put"),
        ("/prices/{model}", "get"),
        ("/prices/{model}", "delete"),
        ("/price-imports", "post"),
        ("/fallback-prices/{kind}", "put"),
        ("/fallback-prices/{kind}", "delete"),
        ("/orgs", "post"),
        ("/orgs", "get"),
        ("/orgs/{org}", "get"),
        ("/orgs/{org}/keys", "post"),
        ("/orgs/{org}/keys", "get"),
        ("/keys/{key}/revoke", "post"),
        ("/keys/{key}", "get"),
        ("/keys/{key}", "patch"),
        ("/orgs/{org}", "patch"),
        ("/orgs/{org}/providers", "get"),
        ("/orgs/{org}/providers/{name}", "put"),
        ("/node-credentials", "post"),
        ("/node-credentials", "get"),
        ("/node-credentials/{credential}", "delete"),
        ("/orgs/{org}/audit", "get"),
        ("/orgs/{org}/tokens", "post"),
        ("/orgs/{org}/tokens", "get"),
        ("/tokens/{token}/revoke", "post"),
    ];

    /// Served by the server itself, before authorization and `Control::route`.
    const UNROUTED: &[(&str, &str)] = &[("/openapi.json", "get")];

    const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

    fn document() -> Value {
        serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
    }

    #[test]
    fn every_route_is_documented() {
        let doc = document();
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "an OpenAPI 3 document");
        for (path, method) in ROUTES.iter().chain(UNROUTED) {
            assert!(
                doc["paths"][path][method].is_object(),
                "openapi.json lacks {} {path}",
                method.to_uppercase()
            );
        }
    }

    #[test]
    fn every_documented_operation_is_routed() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for method in item.as_object().expect("a path item").keys() {
                if !METHODS.contains(&method.as_str()) {
                    continue;
                }
                let pair = (path.as_str(), method.as_str());
                assert!(
                    ROUTES.contains(&pair) || UNROUTED.contains(&pair),
                    "openapi.json documents {} {path}, which nothing answers",
                    method.to_uppercase()
                );
            }
        }
    }

    #[test]
    fn every_operation_lists_the_answers_any_call_may_get() {
        let doc = document();
        for (path, method) in ROUTES {
            for (status, answer) in [("405", "MethodNotAllowed"), ("500", "Internal"), ("503", "Unavailable")]
            {
                let listed = &doc["paths"][path][method]["responses"][status];
                assert_eq!(
                    listed["$ref"].as_str(),
                    Some(format!("#/components/responses/{answer}").as_str()),
                    "{} {path} lacks its {status} answer",
                    method.to_uppercase()
                );
            }
            assert!(
                doc["paths"][path][method]["responses"]["401"].is_object(),
                "{} {path} lacks its 401 answer",
                method.to_uppercase()
            );
        }
        let retry = &doc["components"]["responses"]["Unavailable"]["headers"]["retry-after"];
        assert!(retry.is_object(), "the 503 answer names its retry-after header");
    }

    /// Each documented route as `Route::parse` reads it, its parameters given sample ids.
    fn parsed(path: &str, method: &str) -> super::Route<'static> {
        let segments: Vec<&'static str> = path
            .trim_start_matches('/')
            .split('/')
            .map(|segment| match segment {
                "{org}" => "org_a",
                "{key}" => "key_a",
                "{cap}" => "cap_a",
                "{token}" => "tok_a",
                "{receipt}" => "rcpt_a",
                "{credential}" => "ncr_a",
                "{model}" | "{kind}" | "{name}" => "openai",
                literal => literal.to_owned().leak(),
            })
            .collect();
        let method = http::Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        super::Route::parse(&method, segments.leak())
            .unwrap_or_else(|_| panic!("{method} {path} is not routed"))
    }

    #[test]
    fn every_operation_lists_the_refusals_an_organizations_caller_may_get() {
        use super::access::{Access, Target};
        let doc = document();
        for (path, method) in ROUTES {
            let responses = &doc["paths"][path][method]["responses"];
            let (forbidden, not_found) = match parsed(path, method).access() {
                Access::Operator => (true, false),
                Access::Of { target, write } => (write, target != Target::Orgs),
            };
            let listed = |status: &str| responses[status].is_object();
            let shown = method.to_uppercase();
            if forbidden {
                assert_eq!(
                    responses["403"]["$ref"].as_str(),
                    Some("#/components/responses/Forbidden"),
                    "{shown} {path} lacks its 403"
                );
            } else {
                assert!(!listed("403"), "{shown} {path} lists a 403 it never answers");
            }
            if not_found {
                assert!(listed("404"), "{shown} {path} lacks its 404");
            }
        }
    }

    #[test]
    fn every_path_parameter_is_declared() {
        let doc = document();
        let resolve = |p: &Value| match p["$ref"].as_str() {
            Some(r) => doc.pointer(r.trim_start_matches('#')).cloned().unwrap_or(Value::Null),
            None => p.clone(),
        };
        for (path, method) in ROUTES.iter().chain(UNROUTED) {
            let mut declared: Vec<String> = doc["paths"][path][method]["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(resolve)
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            let mut templated: Vec<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(str::to_owned)
                .collect();
            declared.sort();
            templated.sort();
            assert_eq!(declared, templated, "path parameters of {} {path}", method.to_uppercase());
        }
    }

    #[test]
    fn every_ref_resolves() {
        fn walk(value: &Value, at: &str, refs: &mut Vec<(String, String)>) {
            match value {
                Value::Object(map) => {
                    for (name, child) in map {
                        if name == "$ref" {
                            refs.push((at.to_owned(), child.as_str().unwrap_or("").to_owned()));
                        } else {
                            walk(child, &format!("{at}/{name}"), refs);
                        }
                    }
                }
                Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        walk(child, &format!("{at}/{i}"), refs);
                    }
                }
                _ => {}
            }
        }
        let doc = document();
        let mut refs = Vec::new();
        walk(&doc, "", &mut refs);
        assert!(!refs.is_empty());
        for (at, target) in refs {
            assert!(target.starts_with("#/components/"), "{at}: $ref {target:?} is not a local component");
            assert!(
                doc.pointer(target.trim_start_matches('#')).is_some_and(|v| !v.is_null()),
                "{at}: $ref {target:?} resolves to nothing"
            );
        }
    }
}

/// A URL the gateway will connect to (a credential's base URL, an alert webhook), normalized: never
/// a cloud metadata service's (its names, or a link-local address), which would hand out the
/// machine's own cloud credentials. A host name resolving there is refused when connecting.
pub(crate) fn outbound_url(url: &str) -> Result<String, String> {
    let normalized = recovea_providers::normalize_base_url(url)?;
    let host =
        normalized.parse::<http::Uri>().ok().and_then(|u| u.host().map(str::to_owned)).unwrap_or_default();
    if recovea_upstream::is_metadata_host(&host) {
        return Err(format!("{url:?} points at a cloud metadata service"));
    }
    Ok(normalized)
}
