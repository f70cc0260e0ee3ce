//! `/node-credentials`: a token of its own for each node, issued and revoked by the operator. The
//! token is shown once, in the creation's answer; the store keeps its hash.

use recovea_core::ids::NodeCredentialId;
use recovea_core::keys;
use recovea_core::node_access::{TOKEN_PREFIX, TOKEN_RANDOM_LEN};
use recovea_store::NodeCredentialRecord;
use recovea_store::audit::node_credential_json;
use serde_json::{Value, json};

use crate::admin::members::name_field;
use crate::admin::requests::NewNodeCredential;
use crate::admin::{Caller, Reply, created, new_id, now, ok};
use crate::{ApiError, Control, random};

impl Control {
    pub(crate) async fn create_node_credential(
        &self,
        caller: Caller,
        body: NewNodeCredential,
    ) -> Result<Reply, ApiError> {
        let token = random::token(TOKEN_PREFIX, TOKEN_RANDOM_LEN).map_err(ApiError::internal)?;
        let credential = NodeCredentialRecord {
            id: new_id(NodeCredentialId::PREFIX, NodeCredentialId::parse)?,
            name: name_field("name", body.name)?,
            created_at: now(),
            revoked_at: None,
        };
        let (row, hash, audit) = (credential.clone(), keys::hash_secret(&token), caller.audit()?);
        self.store(move |s| s.create_node_credential(&row, hash, &audit)).await?;
        let mut body = node_credential_json(&credential);
        body["token"] = Value::String(token);
        created(body)
    }

    pub(crate) async fn list_node_credentials(&self) -> Result<Reply, ApiError> {
        let credentials = self.store(|s| s.node_credentials()).await?;
        ok(json!({ "node_credentials": credentials.iter().map(node_credential_json).collect::<Vec<_>>() }))
    }

    /// Revokes a credential: every replica refuses its token from the next call on.
    pub(crate) async fn revoke_node_credential(&self, caller: Caller, id: &str) -> Result<Reply, ApiError> {
        let missing = || ApiError::NotFound(format!("No node credential {id}."));
        let id = NodeCredentialId::parse(id).ok_or_else(missing)?;
        let audit = caller.audit()?;
        let credential = self
            .store(move |s| s.revoke_node_credential(&id, audit.at, &audit))
            .await?
            .ok_or_else(missing)?;
        ok(node_credential_json(&credential))
    }
}
