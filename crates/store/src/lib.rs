//! The control store: organizations, keys (as hashes) and sealed provider credentials, behind one
//! trait so that SQLite and PostgreSQL serve the same control plane.
//!
//! **Invariant:** the store never sees a key secret or an opened provider key; it holds hashes and
//! sealed bytes only. It knows nothing of HTTP.

pub mod audit;
mod jobs;
mod ledger;
pub mod postgres;
mod records;
mod rows;
pub mod sqlite;

use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::pricing::PriceWire;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::timestamp::Timestamp;

pub use audit::{AuditActor, AuditAuth, AuditContext, AuditEntry, AuditQuery};
pub use jobs::{BookRows, FileRecord, JobPoll, JobRecord, JobStore};
pub use ledger::{ReceiptLedger, ReceiptQuery, SpendRow, TagSpendRow, UncountedSpend};
pub use postgres::PostgresStore;
pub use records::{
    AccessRules, ActiveKey, AlertRecord, CapRecord, KeyRecord, NodeCredentialRecord, NodeRecord, OrgRecord,
    OrgTokenRecord, PresentedCredential, PriceChange, PriceOverride, PriceTarget, ProviderRecord, State,
};
pub use sqlite::SqliteStore;

#[derive(Debug)]
pub enum StoreError {
    /// The row the change refers to does not exist.
    NotFound,
    /// The database failed; the text is for operators' logs, never for API clients.
    Backend(String),
    /// The database could not be reached or did not answer within its bounds: the same call may
    /// succeed later. The text is for operators' logs.
    Unavailable(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => f.write_str("not found"),
            Self::Backend(message) => write!(f, "store backend: {message}"),
            Self::Unavailable(message) => write!(f, "store unavailable: {message}"),
        }
    }
}

impl std::error::Error for StoreError {}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The control plane's durable state. Calls block: the control plane runs them off its async
/// threads, and nothing on the request path ever calls them.
///
/// Every change takes an [`AuditContext`] and writes its row of the audit log in the change's own
/// transaction: a change never lands without its row, and a change refused (`NotFound`, or no
/// such key or cap) writes none.
pub trait ControlStore: Send + Sync + 'static {
    fn create_org(&self, org: &OrgRecord, audit: &AuditContext) -> Result<()>;
    fn list_orgs(&self) -> Result<Vec<OrgRecord>>;
    fn org(&self, id: &OrgId) -> Result<Option<OrgRecord>>;
    /// Sets an organization's model and endpoint allowlists and its limit of requests in flight
    /// (each `None`: cleared) in one change, and returns it; `None` for an unknown id.
    fn set_org_rules(
        &self,
        id: &OrgId,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<OrgRecord>>;

    /// Fails with `NotFound` when the organization does not exist.
    fn create_key(&self, key: &KeyRecord, hash: KeyHash, audit: &AuditContext) -> Result<()>;
    fn list_keys(&self, org: &OrgId) -> Result<Vec<KeyRecord>>;
    fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>>;
    /// Sets a key's rate limits and its rules (allowlists, limit of requests in flight; each
    /// `None`: no rule) in one change, and returns it; `None` for an unknown id.
    fn update_key(
        &self,
        id: &KeyId,
        limits: KeyLimits,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<KeyRecord>>;
    /// Revokes the key (keeping the first revocation time) and returns it; `None` for an unknown id.
    fn revoke_key(&self, id: &KeyId, at: Timestamp, audit: &AuditContext) -> Result<Option<KeyRecord>>;

    /// Creates or replaces the credential of that name; `NotFound` when the organization does not exist.
    fn put_provider(&self, provider: &ProviderRecord, audit: &AuditContext) -> Result<()>;
    fn list_providers(&self, org: &OrgId) -> Result<Vec<ProviderRecord>>;

    fn state(&self) -> Result<State>;
    /// Applies `changes` together as one new revision of the price table, and returns that
    /// revision. `NotFound`, changing nothing, when a removal names no price in force. Of two
    /// changes to one target, the later wins.
    fn change_prices(&self, changes: &[PriceChange], at: Timestamp, audit: &AuditContext) -> Result<u64>;
    /// Sets a model's price as a new revision of the price table, and returns that revision.
    fn put_price(&self, model: &str, price: &PriceWire, at: Timestamp, audit: &AuditContext) -> Result<u64> {
        let change = PriceChange {
            target: PriceTarget::Model(model.to_owned()),
            kind: None,
            price: Some(price.clone()),
        };
        self.change_prices(&[change], at, audit)
    }
    /// `NotFound` when the organization does not exist.
    fn create_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()>;
    fn caps(&self, org: &OrgId) -> Result<Vec<CapRecord>>;
    fn cap(&self, id: &CapId) -> Result<Option<CapRecord>>;
    /// Replaces the limit, hard stop and alert settings; `NotFound` for an unknown cap.
    fn update_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()>;
    /// Whether there was such a cap.
    fn delete_cap(&self, id: &CapId, audit: &AuditContext) -> Result<bool>;
    /// Stores an alert unless one was already raised for its cap, window and threshold; whether it is new.
    fn raise_alert(&self, alert: &AlertRecord) -> Result<bool>;
    fn alerts(&self, org: &OrgId) -> Result<Vec<AlertRecord>>;
    /// Counts a delivery attempt of an alert's webhook, and when it succeeded.
    fn alert_delivery(&self, id: &str, delivered_at: Option<Timestamp>) -> Result<()>;

    /// The state's version alone: cheap enough to poll.
    fn version(&self) -> Result<u64>;

    /// Records a node's report, replacing its previous one. Not part of the state.
    fn record_node(&self, node: &NodeRecord) -> Result<()>;
    /// The nodes seen at or after `since`, by id.
    fn nodes(&self, since: Timestamp) -> Result<Vec<NodeRecord>>;

    /// Creates a node credential, stored with the hash of its token (never the token).
    fn create_node_credential(
        &self,
        credential: &NodeCredentialRecord,
        hash: KeyHash,
        audit: &AuditContext,
    ) -> Result<()>;
    /// Every node credential, revoked ones included, oldest first.
    fn node_credentials(&self) -> Result<Vec<NodeCredentialRecord>>;
    /// Revokes a node credential (keeping the first revocation time) and returns it; `None` for an
    /// unknown id.
    fn revoke_node_credential(
        &self,
        id: &NodeCredentialId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<NodeCredentialRecord>>;
    /// The node credential whose token hashes to `hash`, revoked or not. Read from the database at
    /// each call, so that a revocation made through any replica is seen by all at once.
    fn node_credential_by_hash(&self, hash: KeyHash) -> Result<Option<NodeCredentialRecord>>;
    /// Creates an organization token, stored with the hash of its secret (never the secret);
    /// `NotFound` when the organization does not exist.
    fn create_org_token(&self, token: &OrgTokenRecord, hash: KeyHash, audit: &AuditContext) -> Result<()>;
    /// An organization's tokens, revoked ones included, oldest first.
    fn org_tokens(&self, org: &OrgId) -> Result<Vec<OrgTokenRecord>>;
    fn org_token(&self, id: &OrgTokenId) -> Result<Option<OrgTokenRecord>>;
    /// Revokes an organization token (keeping the first revocation time) and returns it; `None`
    /// for an unknown id.
    fn revoke_org_token(
        &self,
        id: &OrgTokenId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<OrgTokenRecord>>;
    /// The organization token whose secret hashes to `hash`, revoked or expired or not. Read from
    /// the database at each call, so that a revocation made through any replica is seen by all at
    /// once.
    fn org_token_by_hash(&self, hash: KeyHash) -> Result<Option<OrgTokenRecord>>;
    /// The organization each of these keys belongs to, for those that exist (revoked or not), in
    /// no particular order. A key's organization never changes.
    fn key_owners(&self, ids: &[KeyId]) -> Result<Vec<(KeyId, OrgId)>>;

    /// The rows of the audit log that `query` selects, oldest first.
    fn audit_log(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>>;
}
