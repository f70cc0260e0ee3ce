//! `/orgs/{org}/keys` and `/keys/{key}`: Recovea keys, their limits, allowlists, expiry and
//! revocation. The secret is shown once, in the creation's answer; the store keeps its hash.

use recovea_core::ids::{KeyId, OrgId};
use recovea_core::keys;
use recovea_core::ratelimit::KeyLimits;
use recovea_store::KeyRecord;
use recovea_store::audit::key_json;
use serde_json::{Value, json};

use crate::admin::members::{
    allowed_endpoints, allowed_models, expiry, limit_patch, name_field, positive, rules_patch,
};
use crate::admin::requests::{KeyPatch, NewKey};
use crate::admin::{Caller, Reply, created, new_id, no_key, now, ok};
use crate::{ApiError, Control, random};

impl Control {
    pub(crate) async fn create_key(
        &self,
        caller: Caller,
        org_id: OrgId,
        body: NewKey,
    ) -> Result<Reply, ApiError> {
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

    pub(crate) async fn list_keys(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let keys = self.store(move |s| s.list_keys(&org_id)).await?;
        ok(json!({ "keys": keys.iter().map(key_json).collect::<Vec<_>>() }))
    }

    pub(crate) async fn update_key(
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

    pub(crate) async fn get_key(&self, id: KeyId) -> Result<Reply, ApiError> {
        let missing = no_key(&id);
        let key = self.store(move |s| s.key(&id)).await?.ok_or(missing)?;
        ok(key_json(&key))
    }

    pub(crate) async fn revoke_key(&self, caller: Caller, id: KeyId) -> Result<Reply, ApiError> {
        let missing = no_key(&id);
        let audit = caller.audit()?;
        let key = self.store(move |s| s.revoke_key(&id, audit.at, &audit)).await?.ok_or(missing)?;
        ok(key_json(&key))
    }
}
