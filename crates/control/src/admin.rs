//! The admin API under `/admin/v1`: routing, and what its handlers share (the reply, the caller,
//! the store, ids). Each resource's handlers are a module below; its request bodies are in
//! `requests`, read by `body::parse`, their members checked in `members`.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, StatusCode};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::timestamp::Timestamp;
use recovea_store::{AuditAuth, AuditContext, ControlStore, OrgRecord, ReceiptLedger};
use serde_json::Value;

use crate::Control;
use crate::error::ApiError;
use crate::principal::Principal;
use crate::random;
use access::Access;
use body::parse;
pub(crate) use openapi::OPENAPI;
use routes::Route;

pub(crate) mod access;
mod audit;
mod body;
pub(crate) mod caps;
mod keys;
mod members;
mod node_credentials;
mod openapi;
mod org_tokens;
mod orgs;
mod prices;
mod providers;
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

pub(crate) fn ok(body: Value) -> Result<Reply, ApiError> {
    Ok(Reply { status: StatusCode::OK, body: ReplyBody::Json(body) })
}

pub(crate) fn created(body: Value) -> Result<Reply, ApiError> {
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

pub(crate) fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

pub(crate) fn new_id<T>(prefix: &str, parse: fn(&str) -> Option<T>) -> Result<T, ApiError> {
    let token = random::token(prefix, OrgId::RANDOM_LEN).map_err(ApiError::internal)?;
    parse(&token).ok_or_else(|| ApiError::internal("a minted id did not parse"))
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
