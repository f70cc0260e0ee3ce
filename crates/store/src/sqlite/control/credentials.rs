//! The credentials that reach the control plane besides the operator's: each node's own, and the
//! organization tokens.

use recovea_core::ids::{NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::timestamp::Timestamp;
use rusqlite::{Connection, params};

use super::org_exists;
use crate::audit::{self, AuditContext};
use crate::rows::{self, NODE_CREDENTIAL_COLUMNS, ORG_TOKEN_COLUMNS};
use crate::sqlite::{SqliteStore, backend, select, select_optional};
use crate::{NodeCredentialRecord, OrgTokenRecord, Result, StoreError};

pub(super) fn create_node_credential(
    store: &SqliteStore,
    credential: &NodeCredentialRecord,
    hash: KeyHash,
    audit: &AuditContext,
) -> Result<()> {
    store.change(audit, |tx| {
        tx.execute(
            &format!(
                "INSERT INTO node_credentials ({NODE_CREDENTIAL_COLUMNS}, hash) VALUES (?1, ?2, ?3, ?4, ?5)"
            ),
            params![
                credential.id.as_str(),
                credential.name,
                credential.created_at.0,
                credential.revoked_at.map(|t| t.0),
                &hash.0[..]
            ],
        )
        .map_err(backend)?;
        Ok(((), Some(audit::node_credential_change("create", None, credential))))
    })
}

pub(super) fn node_credentials(store: &SqliteStore) -> Result<Vec<NodeCredentialRecord>> {
    let sql = format!("SELECT {NODE_CREDENTIAL_COLUMNS} FROM node_credentials ORDER BY created_at, id");
    select(&store.conn(), &sql, [], rows::node_credential)
}

pub(super) fn revoke_node_credential(
    store: &SqliteStore,
    id: &NodeCredentialId,
    at: Timestamp,
    audit: &AuditContext,
) -> Result<Option<NodeCredentialRecord>> {
    store.change(audit, |tx| {
        let by_id = format!("SELECT {NODE_CREDENTIAL_COLUMNS} FROM node_credentials WHERE id = ?1");
        let before = select_optional(tx, &by_id, [id.as_str()], rows::node_credential)?;
        tx.execute(
            "UPDATE node_credentials SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
            params![id.as_str(), at.0],
        )
        .map_err(backend)?;
        let after = select_optional(tx, &by_id, [id.as_str()], rows::node_credential)?;
        let row = after.as_ref().map(|after| audit::node_credential_change("revoke", before.as_ref(), after));
        Ok((after, row))
    })
}

pub(super) fn node_credential_by_hash(
    store: &SqliteStore,
    hash: KeyHash,
) -> Result<Option<NodeCredentialRecord>> {
    let sql = format!("SELECT {NODE_CREDENTIAL_COLUMNS} FROM node_credentials WHERE hash = ?1");
    select_optional(&store.conn(), &sql, [&hash.0[..]], rows::node_credential)
}

pub(super) fn create_org_token(
    store: &SqliteStore,
    token: &OrgTokenRecord,
    hash: KeyHash,
    audit: &AuditContext,
) -> Result<()> {
    store.change(audit, |tx| {
        if !org_exists(tx, &token.org_id)? {
            return Err(StoreError::NotFound);
        }
        tx.execute(
            &format!(
                "INSERT INTO org_tokens ({ORG_TOKEN_COLUMNS}, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            params![
                token.id.as_str(),
                token.org_id.as_str(),
                token.name,
                token.role.as_str(),
                token.prefix,
                token.created_at.0,
                token.expires_at.map(|t| t.0),
                token.revoked_at.map(|t| t.0),
                &hash.0[..]
            ],
        )
        .map_err(backend)?;
        Ok(((), Some(audit::org_token_change("create", None, token))))
    })
}

pub(super) fn org_tokens(store: &SqliteStore, org: &OrgId) -> Result<Vec<OrgTokenRecord>> {
    let sql = format!("SELECT {ORG_TOKEN_COLUMNS} FROM org_tokens WHERE org_id = ?1 ORDER BY created_at, id");
    select(&store.conn(), &sql, [org.as_str()], rows::org_token)
}

pub(super) fn org_token(store: &SqliteStore, id: &OrgTokenId) -> Result<Option<OrgTokenRecord>> {
    org_token_by_id(&store.conn(), id)
}

pub(super) fn revoke_org_token(
    store: &SqliteStore,
    id: &OrgTokenId,
    at: Timestamp,
    audit: &AuditContext,
) -> Result<Option<OrgTokenRecord>> {
    store.change(audit, |tx| {
        let before = org_token_by_id(tx, id)?;
        tx.execute(
            "UPDATE org_tokens SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
            params![id.as_str(), at.0],
        )
        .map_err(backend)?;
        let after = org_token_by_id(tx, id)?;
        let row = after.as_ref().map(|after| audit::org_token_change("revoke", before.as_ref(), after));
        Ok((after, row))
    })
}

pub(super) fn org_token_by_hash(store: &SqliteStore, hash: KeyHash) -> Result<Option<OrgTokenRecord>> {
    let sql = format!("SELECT {ORG_TOKEN_COLUMNS} FROM org_tokens WHERE hash = ?1");
    select_optional(&store.conn(), &sql, [&hash.0[..]], rows::org_token)
}

fn org_token_by_id(conn: &Connection, id: &OrgTokenId) -> Result<Option<OrgTokenRecord>> {
    let sql = format!("SELECT {ORG_TOKEN_COLUMNS} FROM org_tokens WHERE id = ?1");
    select_optional(conn, &sql, [id.as_str()], rows::org_token)
}
