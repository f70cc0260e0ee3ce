//! A control store that stops answering on demand, as a frozen database does (its processes
//! stopped, or packets dropped): every call made while it is frozen waits until it thaws. Tests of
//! the bounded path put it under the callers that must not wait on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::timestamp::Timestamp;
use recovea_store::{
    AccessRules, AlertRecord, AuditContext, AuditEntry, AuditQuery, CapRecord, ControlStore, KeyRecord,
    NodeCredentialRecord, NodeRecord, OrgRecord, OrgTokenRecord, PriceChange, ProviderRecord, Result, State,
};

pub(crate) struct FrozenStore {
    inner: Arc<dyn ControlStore>,
    frozen: Mutex<bool>,
    thawed: Condvar,
    /// Calls that found the store frozen and waited.
    held: AtomicUsize,
}

impl FrozenStore {
    pub(crate) fn new(inner: Arc<dyn ControlStore>) -> Arc<Self> {
        Arc::new(Self { inner, frozen: Mutex::new(false), thawed: Condvar::new(), held: AtomicUsize::new(0) })
    }

    /// Freezes the store until the guard is dropped: a test that fails still thaws it, so that the
    /// calls it holds end and the runtime can shut down.
    pub(crate) fn freeze(self: &Arc<Self>) -> Thaw {
        *self.frozen.lock().unwrap_or_else(PoisonError::into_inner) = true;
        Thaw(Arc::clone(self))
    }

    /// How many calls found the store frozen.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    fn gate(&self) {
        let mut frozen = self.frozen.lock().unwrap_or_else(PoisonError::into_inner);
        if *frozen {
            self.held.fetch_add(1, Ordering::AcqRel);
        }
        while *frozen {
            frozen = self.thawed.wait(frozen).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Thaws the store when dropped.
pub(crate) struct Thaw(Arc<FrozenStore>);

impl Drop for Thaw {
    fn drop(&mut self) {
        *self.0.frozen.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.0.thawed.notify_all();
    }
}

impl ControlStore for FrozenStore {
    fn create_org(&self, org: &OrgRecord, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.create_org(org, audit)
    }

    fn list_orgs(&self) -> Result<Vec<OrgRecord>> {
        self.gate();
        self.inner.list_orgs()
    }

    fn org(&self, id: &OrgId) -> Result<Option<OrgRecord>> {
        self.gate();
        self.inner.org(id)
    }

    fn set_org_rules(
        &self,
        id: &OrgId,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<OrgRecord>> {
        self.gate();
        self.inner.set_org_rules(id, rules, audit)
    }

    fn create_key(&self, key: &KeyRecord, hash: KeyHash, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.create_key(key, hash, audit)
    }

    fn list_keys(&self, org: &OrgId) -> Result<Vec<KeyRecord>> {
        self.gate();
        self.inner.list_keys(org)
    }

    fn key(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        self.gate();
        self.inner.key(id)
    }

    fn update_key(
        &self,
        id: &KeyId,
        limits: KeyLimits,
        rules: &AccessRules,
        audit: &AuditContext,
    ) -> Result<Option<KeyRecord>> {
        self.gate();
        self.inner.update_key(id, limits, rules, audit)
    }

    fn revoke_key(&self, id: &KeyId, at: Timestamp, audit: &AuditContext) -> Result<Option<KeyRecord>> {
        self.gate();
        self.inner.revoke_key(id, at, audit)
    }

    fn put_provider(&self, provider: &ProviderRecord, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.put_provider(provider, audit)
    }

    fn list_providers(&self, org: &OrgId) -> Result<Vec<ProviderRecord>> {
        self.gate();
        self.inner.list_providers(org)
    }

    fn state(&self) -> Result<State> {
        self.gate();
        self.inner.state()
    }

    fn change_prices(&self, changes: &[PriceChange], at: Timestamp, audit: &AuditContext) -> Result<u64> {
        self.gate();
        self.inner.change_prices(changes, at, audit)
    }

    fn create_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.create_cap(cap, audit)
    }

    fn caps(&self, org: &OrgId) -> Result<Vec<CapRecord>> {
        self.gate();
        self.inner.caps(org)
    }

    fn cap(&self, id: &CapId) -> Result<Option<CapRecord>> {
        self.gate();
        self.inner.cap(id)
    }

    fn update_cap(&self, cap: &CapRecord, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.update_cap(cap, audit)
    }

    fn delete_cap(&self, id: &CapId, audit: &AuditContext) -> Result<bool> {
        self.gate();
        self.inner.delete_cap(id, audit)
    }

    fn raise_alert(&self, alert: &AlertRecord) -> Result<bool> {
        self.gate();
        self.inner.raise_alert(alert)
    }

    fn alerts(&self, org: &OrgId) -> Result<Vec<AlertRecord>> {
        self.gate();
        self.inner.alerts(org)
    }

    fn alert_delivery(&self, id: &str, delivered_at: Option<Timestamp>) -> Result<()> {
        self.gate();
        self.inner.alert_delivery(id, delivered_at)
    }

    fn version(&self) -> Result<u64> {
        self.gate();
        self.inner.version()
    }

    fn record_node(&self, node: &NodeRecord) -> Result<()> {
        self.gate();
        self.inner.record_node(node)
    }

    fn nodes(&self, since: Timestamp) -> Result<Vec<NodeRecord>> {
        self.gate();
        self.inner.nodes(since)
    }

    fn create_node_credential(
        &self,
        credential: &NodeCredentialRecord,
        hash: KeyHash,
        audit: &AuditContext,
    ) -> Result<()> {
        self.gate();
        self.inner.create_node_credential(credential, hash, audit)
    }

    fn node_credentials(&self) -> Result<Vec<NodeCredentialRecord>> {
        self.gate();
        self.inner.node_credentials()
    }

    fn revoke_node_credential(
        &self,
        id: &NodeCredentialId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<NodeCredentialRecord>> {
        self.gate();
        self.inner.revoke_node_credential(id, at, audit)
    }

    fn node_credential_by_hash(&self, hash: KeyHash) -> Result<Option<NodeCredentialRecord>> {
        self.gate();
        self.inner.node_credential_by_hash(hash)
    }

    fn create_org_token(&self, token: &OrgTokenRecord, hash: KeyHash, audit: &AuditContext) -> Result<()> {
        self.gate();
        self.inner.create_org_token(token, hash, audit)
    }

    fn org_tokens(&self, org: &OrgId) -> Result<Vec<OrgTokenRecord>> {
        self.gate();
        self.inner.org_tokens(org)
    }

    fn org_token(&self, id: &OrgTokenId) -> Result<Option<OrgTokenRecord>> {
        self.gate();
        self.inner.org_token(id)
    }

    fn revoke_org_token(
        &self,
        id: &OrgTokenId,
        at: Timestamp,
        audit: &AuditContext,
    ) -> Result<Option<OrgTokenRecord>> {
        self.gate();
        self.inner.revoke_org_token(id, at, audit)
    }

    fn org_token_by_hash(&self, hash: KeyHash) -> Result<Option<OrgTokenRecord>> {
        self.gate();
        self.inner.org_token_by_hash(hash)
    }

    fn key_owners(&self, ids: &[KeyId]) -> Result<Vec<(KeyId, OrgId)>> {
        self.gate();
        self.inner.key_owners(ids)
    }

    fn audit_log(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>> {
        self.gate();
        self.inner.audit_log(query)
    }
}
