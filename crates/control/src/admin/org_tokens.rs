//! `/orgs/{org}/tokens` and `/tokens/{token}/revoke`: organization tokens, issued and revoked by
//! the operator or by an admin of the organization. The secret is shown once, in the creation's
//! answer; the store keeps its hash.

use recovea_core::ids::{OrgId, OrgTokenId};
use recovea_core::keys;
use recovea_core::org_tokens::{self, OrgRole, TOKEN_PREFIX, TOKEN_RANDOM_LEN};
use recovea_store::OrgTokenRecord;
use recovea_store::audit::org_token_json;
use serde_json::{Value, json};

use crate::admin::members::{expiry, name_field};
use crate::admin::requests::NewOrgToken;
use crate::admin::{Caller, Reply, created, new_id, no_org_token, now, ok};
use crate::{ApiError, Control, random};

impl Control {
    pub(crate) async fn create_org_token(
        &self,
        caller: Caller,
        org_id: OrgId,
        body: NewOrgToken,
    ) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let role = OrgRole::parse(&body.role)
            .ok_or_else(|| ApiError::bad_field("role", "expected \"admin\" or \"viewer\""))?;
        let created_at = now();
        let secret = random::token(TOKEN_PREFIX, TOKEN_RANDOM_LEN).map_err(ApiError::internal)?;
        let token = OrgTokenRecord {
            id: new_id(OrgTokenId::PREFIX, OrgTokenId::parse)?,
            org_id,
            name: name_field("name", body.name)?,
            role,
            prefix: org_tokens::shown_prefix(&secret).to_owned(),
            created_at,
            expires_at: expiry(body.expires_at.as_deref(), created_at)?,
            revoked_at: None,
        };
        let (row, hash, audit) = (token.clone(), keys::hash_secret(&secret), caller.audit()?);
        self.store(move |s| s.create_org_token(&row, hash, &audit)).await?;
        let mut body = org_token_json(&token);
        body["secret"] = Value::String(secret);
        created(body)
    }

    pub(crate) async fn list_org_tokens(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let tokens = self.store(move |s| s.org_tokens(&org_id)).await?;
        ok(json!({ "tokens": tokens.iter().map(org_token_json).collect::<Vec<_>>() }))
    }

    /// Revokes a token: every replica refuses it from the next call on (nothing caches tokens).
    pub(crate) async fn revoke_org_token(&self, caller: Caller, id: &str) -> Result<Reply, ApiError> {
        let token = OrgTokenId::parse(id).ok_or_else(|| no_org_token(id))?;
        let audit = caller.audit()?;
        let token = self
            .store(move |s| s.revoke_org_token(&token, audit.at, &audit))
            .await?
            .ok_or_else(|| no_org_token(id))?;
        ok(org_token_json(&token))
    }
}
