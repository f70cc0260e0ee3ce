//! Building a snapshot whole, from organizations, their credentials and caps, and keys.

use std::collections::HashMap;

use super::{KeyParts, Org, Prices, ProviderCredential, Snapshot};
use crate::caps::Cap;
use crate::endpoints::EndpointAllowlist;
use crate::ids::{KeyId, OrgId};
use crate::keys::KeyHash;
use crate::models::ModelAllowlist;
use crate::ratelimit::KeyLimits;
use crate::timestamp::Timestamp;

/// Builds a snapshot: organizations with their credentials first, then the keys that point at them.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    version: u64,
    orgs: HashMap<OrgId, (Vec<ProviderCredential>, Vec<Cap>)>,
    keys: Vec<(KeyHash, KeyId, OrgId, Option<Timestamp>, KeyLimits)>,
    key_rules: HashMap<KeyHash, Rules>,
    org_rules: HashMap<OrgId, Rules>,
    prices: Option<Prices>,
}

/// What a key or an organization may do beyond its caps and rate limits, as the builder gathers it.
#[derive(Debug, Default)]
struct Rules {
    models: Option<ModelAllowlist>,
    endpoints: Option<EndpointAllowlist>,
    max_concurrent_requests: Option<u32>,
}

impl SnapshotBuilder {
    pub fn new(version: u64) -> Self {
        Self { version, ..Self::default() }
    }

    pub fn org(&mut self, id: OrgId) -> &mut Self {
        self.orgs.entry(id).or_default();
        self
    }

    pub fn provider(&mut self, org: &OrgId, credential: ProviderCredential) -> &mut Self {
        if let Some((providers, _)) = self.orgs.get_mut(org) {
            match providers.iter_mut().find(|held| held.name == credential.name) {
                Some(held) => *held = credential,
                None => providers.push(credential),
            }
        }
        self
    }

    /// Caps of organizations the builder does not hold are dropped.
    pub fn cap(&mut self, cap: Cap) -> &mut Self {
        if let Some((_, caps)) = self.orgs.get_mut(&cap.org_id) {
            caps.push(cap);
        }
        self
    }

    pub fn key(&mut self, hash: KeyHash, id: KeyId, org: OrgId, expires_at: Option<Timestamp>) -> &mut Self {
        self.key_with_limits(hash, id, org, expires_at, KeyLimits::default())
    }

    pub fn key_with_limits(
        &mut self,
        hash: KeyHash,
        id: KeyId,
        org: OrgId,
        expires_at: Option<Timestamp>,
        limits: KeyLimits,
    ) -> &mut Self {
        self.keys.push((hash, id, org, expires_at, limits));
        self
    }

    /// The models the key of `hash` may use.
    pub fn key_allowed_models(&mut self, hash: KeyHash, list: ModelAllowlist) -> &mut Self {
        self.key_rules.entry(hash).or_default().models = Some(list);
        self
    }

    /// The models the keys of `org` may use.
    pub fn org_allowed_models(&mut self, org: OrgId, list: ModelAllowlist) -> &mut Self {
        self.org_rules.entry(org).or_default().models = Some(list);
        self
    }

    /// The endpoints the key of `hash` may call.
    pub fn key_allowed_endpoints(&mut self, hash: KeyHash, list: EndpointAllowlist) -> &mut Self {
        self.key_rules.entry(hash).or_default().endpoints = Some(list);
        self
    }

    /// The endpoints the keys of `org` may call.
    pub fn org_allowed_endpoints(&mut self, org: OrgId, list: EndpointAllowlist) -> &mut Self {
        self.org_rules.entry(org).or_default().endpoints = Some(list);
        self
    }

    /// The most requests of the key of `hash` in flight at once.
    pub fn key_max_concurrent_requests(&mut self, hash: KeyHash, limit: u32) -> &mut Self {
        self.key_rules.entry(hash).or_default().max_concurrent_requests = Some(limit);
        self
    }

    /// The most requests of the keys of `org` in flight at once.
    pub fn org_max_concurrent_requests(&mut self, org: OrgId, limit: u32) -> &mut Self {
        self.org_rules.entry(org).or_default().max_concurrent_requests = Some(limit);
        self
    }

    /// Without this, the built-in table at revision 0.
    pub fn prices(&mut self, prices: Prices) -> &mut Self {
        self.prices = Some(prices);
        self
    }

    /// Keys of organizations the builder does not hold are dropped: they could not be served.
    pub fn build(self) -> Snapshot {
        let key_rules = &self.key_rules;
        let none = Rules::default();
        let keys = self.keys.iter().map(|(hash, id, org, expires_at, limits)| {
            let rules = key_rules.get(hash).unwrap_or(&none);
            let parts = KeyParts {
                id,
                org,
                expires_at: *expires_at,
                limits: *limits,
                allowed_models: rules.models.as_ref(),
                allowed_endpoints: rules.endpoints.as_ref(),
                max_concurrent_requests: rules.max_concurrent_requests,
            };
            (*hash, Some(parts))
        });
        let mut org_rules = self.org_rules;
        let orgs = self.orgs.into_iter().map(|(id, (providers, caps))| {
            let rules = org_rules.remove(&id).unwrap_or_default();
            let org = Org {
                id: id.clone(),
                providers: providers.into(),
                caps: caps.into(),
                allowed_models: rules.models,
                allowed_endpoints: rules.endpoints,
                max_concurrent_requests: rules.max_concurrent_requests,
            };
            (id, Some(org))
        });
        Snapshot::default().with_changes(self.version, orgs, keys, Some(self.prices.unwrap_or_default()))
    }
}
