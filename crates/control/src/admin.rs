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
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use recovea_store::audit::{key_json, org_json, provider_json};

use crate::Control;
use crate::error::ApiError;
use crate::random;
use recovea_core::crypto::provider_key_context;

pub(crate) const OPENAPI: &str = include_str!("openapi.json");

mod audit;
pub(crate) mod caps;
mod node_credentials;
mod prices;
pub(crate) mod query;
pub(crate) mod receipts;

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

/// Who is calling: how they authenticated and where from, recorded with each change they make.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
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
        // One admin identity so far: the operator's.
        Ok(AuditContext {
            id,
            at,
            auth: self.auth,
            actor: recovea_store::AuditActor::Operator,
            client: self.client.map(|addr| addr.to_string()),
        })
    }
}

impl Control {
    pub(crate) fn authorized(&self, authorization: Option<&str>) -> bool {
        let presented = authorization.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).unwrap_or("");
        // Comparing digests keeps the comparison's timing independent of the token's characters.
        !presented.is_empty() && keys::hash_secret(presented) == self.inner.admin_token_hash
    }

    /// Checks an admin bearer from `client` (on `path`): `Ok` for the right token, always;
    /// otherwise the attempt is logged (the address, never the token) and counted against the
    /// address, and `Err(Some(wait))` once the address has used its allowance (`429`), else
    /// `Err(None)` (`401`).
    pub(crate) fn check_admin_token(
        &self,
        authorization: Option<&str>,
        client: Option<std::net::SocketAddr>,
        path: &str,
        now: std::time::Instant,
    ) -> Result<(), Option<std::time::Duration>> {
        if self.authorized(authorization) {
            return Ok(());
        }
        let address = client.map(|c| c.ip());
        let shown = address.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let wrong_tokens = &self.inner.wrong_tokens;
        match wrong_tokens.may_try(address, now) {
            Ok(()) => {
                wrong_tokens.failed(address, now);
                tracing::warn!(client = shown, path = %path.escape_debug(), "a wrong admin token was refused");
                Err(None)
            }
            Err(wait) => {
                tracing::warn!(
                    client = shown,
                    path = %path.escape_debug(),
                    "a wrong admin token was refused: too many from this address"
                );
                Err(Some(wait))
            }
        }
    }

    /// Routes one authorized admin request (`segments` follow `/admin/v1/`).
    pub(crate) async fn route(
        &self,
        caller: Caller,
        method: &Method,
        segments: &[&str],
        query: &str,
        body: Bytes,
    ) -> Result<Reply, ApiError> {
        let reply = match (segments, method) {
            (["audit"], &Method::GET) => self.list_audit(query).await,
            (["orgs", org, "receipts"], &Method::GET) => self.list_receipts(org_id(org)?, query).await,
            (["orgs", org, "receipts", "summary"], &Method::GET) => {
                self.spend_summary(org_id(org)?, query).await
            }
            (["orgs", org, "receipts", receipt], &Method::GET) => {
                self.get_receipt(org_id(org)?, receipt).await
            }
            (["prices"], &Method::GET) => self.list_prices(),
            (["nodes"], &Method::GET) => self.list_nodes().await,
            (["node-credentials"], &Method::POST) => self.create_node_credential(caller, parse(&body)?).await,
            (["node-credentials"], &Method::GET) => self.list_node_credentials().await,
            (["node-credentials", id], &Method::DELETE) => self.revoke_node_credential(caller, id).await,
            (["orgs", org, "caps"], &Method::POST) => {
                self.create_cap(caller, org_id(org)?, parse(&body)?).await
            }
            (["orgs", org, "caps"], &Method::GET) => self.list_caps(org_id(org)?).await,
            (["caps", cap], &Method::GET) => self.get_cap(cap_id(cap)?).await,
            (["caps", cap], &Method::PATCH) => self.update_cap(caller, cap_id(cap)?, parse(&body)?).await,
            (["caps", cap], &Method::DELETE) => self.delete_cap(caller, cap_id(cap)?).await,
            (["orgs", org, "spend"], &Method::GET) => self.spend(org_id(org)?).await,
            (["orgs", org, "alerts"], &Method::GET) => self.list_alerts(org_id(org)?).await,
            (["prices", model @ ..], &Method::PUT) if !model.is_empty() => {
                self.put_price(caller, &model.join("/"), parse(&body)?).await
            }
            (["prices", model @ ..], &Method::GET) if !model.is_empty() => {
                self.get_price(&model.join("/"), query).await
            }
            (["prices", model @ ..], &Method::DELETE) if !model.is_empty() => {
                self.delete_price(caller, &model.join("/")).await
            }
            (["price-imports"], &Method::POST) => self.import_prices(caller, &body).await,
            (["fallback-prices", kind], &Method::PUT) => {
                self.put_fallback_price(caller, kind, parse(&body)?).await
            }
            (["fallback-prices", kind], &Method::DELETE) => self.delete_fallback_price(caller, kind).await,
            (["orgs"], &Method::POST) => self.create_org(caller, parse(&body)?).await,
            (["orgs"], &Method::GET) => self.list_orgs().await,
            (["orgs", org], &Method::GET) => self.get_org(org_id(org)?).await,
            (["orgs", org], &Method::PATCH) => self.update_org(caller, org_id(org)?, parse(&body)?).await,
            (["orgs", org, "keys"], &Method::POST) => {
                self.create_key(caller, org_id(org)?, parse(&body)?).await
            }
            (["orgs", org, "keys"], &Method::GET) => self.list_keys(org_id(org)?).await,
            (["keys", key, "revoke"], &Method::POST) => self.revoke_key(caller, key_id(key)?).await,
            (["keys", key], &Method::GET) => self.get_key(key_id(key)?).await,
            (["keys", key], &Method::PATCH) => self.update_key(caller, key_id(key)?, parse(&body)?).await,
            (["orgs", org, "providers"], &Method::GET) => self.list_providers(org_id(org)?).await,
            (["orgs", org, "providers", name], &Method::PUT) => {
                self.put_provider(caller, org_id(org)?, name, parse(&body)?).await
            }
            (["orgs"] | ["orgs", _] | ["orgs", _, "keys"] | ["keys", _, "revoke"] | ["keys", _], _)
            | (["orgs", _, "providers"] | ["orgs", _, "providers", _], _)
            | (["orgs", _, "receipts"] | ["orgs", _, "receipts", "summary"] | ["prices", ..], _)
            | (["orgs", _, "caps"] | ["caps", _] | ["orgs", _, "spend"] | ["orgs", _, "alerts"], _)
            | (["nodes"] | ["price-imports"] | ["fallback-prices", _] | ["audit"], _)
            | (["node-credentials"] | ["node-credentials", _], _) => Err(ApiError::MethodNotAllowed),
            _ => Err(ApiError::NotFound("Unknown admin path.".into())),
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
        let missing = format!("No organization {id}.");
        self.store(move |s| s.org(&id)).await?.ok_or(ApiError::NotFound(missing))
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

    async fn list_orgs(&self) -> Result<Reply, ApiError> {
        let orgs = self.store(|s| s.list_orgs()).await?;
        ok(json!({ "orgs": orgs.iter().map(org_json).collect::<Vec<_>>() }))
    }

    async fn get_org(&self, id: OrgId) -> Result<Reply, ApiError> {
        ok(org_json(&self.require_org(&id).await?))
    }

    async fn update_org(&self, caller: Caller, id: OrgId, patch: OrgPatch) -> Result<Reply, ApiError> {
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
        let missing = format!("No organization {id}.");
        let audit = caller.audit()?;
        let org = self
            .store(move |s| s.set_org_rules(&id, &rules, &audit))
            .await?
            .ok_or(ApiError::NotFound(missing))?;
        ok(org_json(&org))
    }

    async fn create_key(&self, caller: Caller, org_id: OrgId, body: NewKey) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let created_at = now();
        let expires_at = match body.expires_at {
            None => None,
            Some(text) => {
                let at = Timestamp::parse_rfc3339(&text).ok_or_else(|| {
                    ApiError::BadRequest(
                        "expires_at: expected an RFC 3339 time such as 2027-01-01T00:00:00Z".into(),
                    )
                })?;
                if at <= created_at {
                    return Err(ApiError::BadRequest("expires_at: must be in the future".into()));
                }
                Some(at)
            }
        };
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

    async fn update_key(&self, caller: Caller, id: KeyId, patch: KeyPatch) -> Result<Reply, ApiError> {
        let missing = format!("No key {id}.");
        let (lookup, owner) = (id.clone(), id.clone());
        let current =
            self.store(move |s| s.key(&lookup)).await?.ok_or_else(|| ApiError::NotFound(missing.clone()))?;
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
            .ok_or(ApiError::NotFound(missing))?;
        ok(key_json(&key))
    }

    async fn get_key(&self, id: KeyId) -> Result<Reply, ApiError> {
        let missing = format!("No key {id}.");
        let key = self.store(move |s| s.key(&id)).await?.ok_or(ApiError::NotFound(missing))?;
        ok(key_json(&key))
    }

    async fn revoke_key(&self, caller: Caller, id: KeyId) -> Result<Reply, ApiError> {
        let missing = format!("No key {id}.");
        let audit = caller.audit()?;
        let key = self
            .store(move |s| s.revoke_key(&id, audit.at, &audit))
            .await?
            .ok_or(ApiError::NotFound(missing))?;
        ok(key_json(&key))
    }

    async fn list_providers(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let providers = self.store(move |s| s.list_providers(&org_id)).await?;
        ok(json!({ "providers": providers.iter().map(provider_json).collect::<Vec<_>>() }))
    }

    async fn put_provider(
        &self,
        caller: Caller,
        org_id: OrgId,
        name: &str,
        body: ProviderBody,
    ) -> Result<Reply, ApiError> {
        if !recovea_providers::is_credential_name(name) {
            return Err(ApiError::BadRequest(
                "name: a provider name is 1 to 64 characters of a-z, 0-9, '-' and '_'".into(),
            ));
        }
        let kind = ProviderKind::parse(&body.kind).ok_or_else(|| {
            ApiError::BadRequest(
                "kind: expected \"openai\", \"anthropic\", \"azure_openai\" or \"gemini\"".into(),
            )
        })?;
        let base_url = body
            .base_url
            .map(|url| crate::admin::outbound_url(&url))
            .transpose()
            .map_err(|why| ApiError::BadRequest(format!("base_url: {why}")))?;
        if kind == ProviderKind::AzureOpenAi && base_url.is_none() {
            // Each Azure resource has its own endpoint: there is no default to fall back on.
            return Err(ApiError::BadRequest(
                "base_url: an azure_openai credential needs its resource endpoint, such as https://NAME.openai.azure.com".into(),
            ));
        }
        let api_key = body.api_key.trim();
        if api_key.is_empty() || !api_key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ApiError::BadRequest(
                "api_key: expected a non-empty key of printable characters".into(),
            ));
        }
        let price_namespace = body
            .price_namespace
            .map(|namespace| {
                let namespace = namespace.trim().to_owned();
                let plain = namespace
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
                if namespace.is_empty() || namespace.len() > 64 || !plain {
                    return Err(ApiError::BadRequest(
                        "price_namespace: 1 to 64 characters of a-z, 0-9, '-', '_' and '.'".into(),
                    ));
                }
                Ok(namespace)
            })
            .transpose()?;
        let amount = |field: &str, usd: &str| {
            recovea_core::money::Nanos::parse_usd(usd)
                .ok()
                .filter(|amount| *amount >= recovea_core::money::Nanos::ZERO)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!("{field}: expected dollars per million tokens, 0 or more"))
                })
        };
        let fallback_price = match (&body.fallback_input_per_mtok_usd, &body.fallback_output_per_mtok_usd) {
            (None, None) => None,
            (Some(input), Some(output)) => Some((
                amount("fallback_input_per_mtok_usd", input)?,
                amount("fallback_output_per_mtok_usd", output)?,
            )),
            _ => {
                return Err(ApiError::BadRequest(
                    "fallback_input_per_mtok_usd and fallback_output_per_mtok_usd: give both, or neither"
                        .into(),
                ));
            }
        };
        self.require_org(&org_id).await?;
        let record = ProviderRecord {
            sealed_key: seal(
                &self.inner.master_key,
                &provider_key_context(org_id.as_str(), name),
                api_key.as_bytes(),
            )?,
            key_hint: crypto::key_hint(api_key),
            org_id,
            name: name.to_owned(),
            kind,
            base_url,
            updated_at: now(),
            price_namespace,
            fallback_price,
        };
        let (row, audit) = (record.clone(), caller.audit()?);
        self.store(move |s| s.put_provider(&row, &audit)).await?;
        ok(provider_json(&record))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOrg {
    name: String,
    allowed_models: Option<Vec<String>>,
    allowed_endpoints: Option<Vec<String>>,
    max_concurrent_requests: Option<u32>,
}

/// `PATCH /orgs/{org}`: a member left out keeps its value; `null` removes the list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrgPatch {
    #[serde(default, deserialize_with = "present")]
    allowed_models: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    allowed_endpoints: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    max_concurrent_requests: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    name: String,
    expires_at: Option<String>,
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    allowed_models: Option<Vec<String>>,
    allowed_endpoints: Option<Vec<String>>,
    max_concurrent_requests: Option<u32>,
}

/// `PATCH /keys/{key}`: a member left out keeps its value; `null` removes the limit (or the list).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyPatch {
    #[serde(default, deserialize_with = "present")]
    requests_per_minute: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    tokens_per_minute: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    allowed_models: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    allowed_endpoints: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    max_concurrent_requests: Option<Value>,
}

/// For patch members: `Some(Value::Null)` for an explicit `null`, where a plain `Option` would
/// read it as left out.
pub(crate) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderBody {
    kind: String,
    base_url: Option<String>,
    api_key: String,
    /// The price namespace its models resolve in first (`groq`); left out: its name's.
    #[serde(default)]
    price_namespace: Option<String>,
    /// Its own fallback price for models no entry prices: both, or neither.
    #[serde(default)]
    fallback_input_per_mtok_usd: Option<String>,
    #[serde(default)]
    fallback_output_per_mtok_usd: Option<String>,
}

/// Parses a JSON body; the error names the offending field, never echoes a value.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            "body: expected a JSON object".to_owned()
        } else if path == "." {
            format!("body: {}", strip_position(&inner.to_string()))
        } else {
            format!("{path}: {}", strip_position(&inner.to_string()))
        };
        ApiError::BadRequest(message)
    })
}

/// serde_json appends " at line L column C", which helps nobody reading an API error.
fn strip_position(message: &str) -> &str {
    message.find(" at line ").map_or(message, |i| &message[..i])
}

fn name_field(field: &str, value: String) -> Result<String, ApiError> {
    let value = value.trim().to_owned();
    if value.is_empty() || value.chars().count() > 200 {
        return Err(ApiError::BadRequest(format!("{field}: expected 1 to 200 characters")));
    }
    Ok(value)
}

pub(crate) fn org_id(s: &str) -> Result<OrgId, ApiError> {
    OrgId::parse(s).ok_or_else(|| ApiError::NotFound(format!("No organization {s}.")))
}

fn cap_id(s: &str) -> Result<CapId, ApiError> {
    CapId::parse(s).ok_or_else(|| ApiError::NotFound(format!("No cap {s}.")))
}

fn key_id(s: &str) -> Result<KeyId, ApiError> {
    KeyId::parse(s).ok_or_else(|| ApiError::NotFound(format!("No key {s}.")))
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
    value.map(parse).transpose().map_err(|e| ApiError::BadRequest(format!("{member}: {e}")))
}

/// A list in a patch: `null` removes it (everything), a list of strings sets it; `entries` says
/// what a list holds, for the message of anything else.
fn allowlist_patch<T>(
    member: &str,
    value: Value,
    entries: &str,
    parse: fn(Vec<String>) -> Result<T, PatternError>,
) -> Result<Option<T>, ApiError> {
    if value.is_null() {
        return Ok(None);
    }
    let list = serde_json::from_value::<Vec<String>>(value)
        .map_err(|_| ApiError::BadRequest(format!("{member}: expected a list of {entries}, or null")))?;
    allowlist(member, Some(list), parse)
}

/// A key's or an organization's rules after a patch: each member left out keeps its value in
/// `current`, `null` removes the rule.
fn rules_patch(
    current: AccessRules,
    models: Option<Value>,
    endpoints: Option<Value>,
    max_concurrent: Option<Value>,
) -> Result<AccessRules, ApiError> {
    Ok(AccessRules {
        allowed_models: match models {
            Some(value) => allowlist_patch(
                "allowed_models",
                value,
                "model names (or \"prefix*\")",
                ModelAllowlist::parse,
            )?,
            None => current.allowed_models,
        },
        allowed_endpoints: match endpoints {
            Some(value) => allowlist_patch(
                "allowed_endpoints",
                value,
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
        Some(0) => Err(ApiError::BadRequest(format!("{field}: expected a positive number or no limit"))),
        other => Ok(other),
    }
}

/// A rate limit in a patch: left out keeps `current`, `null` removes it, a positive number sets it.
fn limit_patch(field: &str, value: Option<Value>, current: Option<u32>) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(current),
        Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| ApiError::BadRequest(format!("{field}: expected a positive number or null"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_errors_name_the_field() {
        let message = |body: &str| match parse::<ProviderBody>(body.as_bytes()) {
            Err(ApiError::BadRequest(m)) => m,
            _ => panic!("expected a bad request"),
        };
        assert_eq!(message(r#"{"kind":"openai"}"#), "body: missing field `api_key`");
        assert_eq!(
            message(r#"{"kind":1,"api_key":"x"}"#),
            "kind: invalid type: integer `1`, expected a string"
        );
        assert!(
            message(r#"{"kind":"openai","api_key":"x","extra":1}"#)
                .starts_with("extra: unknown field `extra`")
        );
        assert_eq!(message("not json"), "body: expected a JSON object");
    }
}

#[cfg(test)]
mod openapi_tests {
    use super::OPENAPI;
    use serde_json::Value;

    /// Every (path, method) that `Control::route` answers, as the OpenAPI document spells it.
    /// This table mirrors the match in `Control::route`: a route added, removed or changed there
    /// must change here too, and in `openapi.json`.
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
