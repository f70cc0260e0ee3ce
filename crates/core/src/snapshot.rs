//! The state a node decides from: keys by hash, organizations and their provider credentials.
//!
//! A snapshot is immutable once built; a new one replaces it whole (the gateway swaps an `Arc`), so
//! readers never lock and never see half an update.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::caps::Cap;
use crate::ids::{KeyId, OrgId};
use crate::keys::KeyHash;
use crate::pricing::PriceTable;
use crate::ratelimit::KeyLimits;
use crate::timestamp::Timestamp;

/// The wire dialect a credential speaks, which decides its auth header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "openai" => Some(Self::OpenAi),
            "anthropic" => Some(Self::Anthropic),
            _ => None,
        }
    }
}

/// A provider key Recovea holds for an organization, opened and ready to inject.
#[derive(Clone)]
pub struct ProviderCredential {
    pub name: String,
    pub kind: ProviderKind,
    /// `None`: the node's default base URL for this kind.
    pub base_url: Option<String>,
    pub api_key: String,
}

impl std::fmt::Debug for ProviderCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderCredential")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct Org {
    pub id: OrgId,
    pub providers: HashMap<String, ProviderCredential>,
    /// Every cap of the organization, organization- and key-scoped.
    pub caps: Vec<Cap>,
}

impl Org {
    pub fn provider(&self, name: &str) -> Option<&ProviderCredential> {
        self.providers.get(name)
    }
}

/// What admission needs to know of a key. Revoked keys are not in a snapshot at all.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub id: KeyId,
    pub org: Arc<Org>,
    pub expires_at: Option<Timestamp>,
    pub limits: KeyLimits,
}

/// Key hashes are already uniformly random: their first eight bytes are a perfect hash, so SipHash
/// over all 32 would be work for nothing on every request.
#[derive(Default)]
pub struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 ^= u64::from(*b) << (i * 8);
        }
    }
}

type KeyTable = HashMap<KeyHash, KeyEntry, BuildHasherDefault<KeyHashHasher>>;

#[derive(Debug, Default)]
pub struct Snapshot {
    pub version: u64,
    keys: KeyTable,
    orgs: HashMap<OrgId, Arc<Org>>,
    prices: Prices,
}

/// The effective price table (built-in with the operators' overrides on top) and its revision,
/// which every receipt records.
#[derive(Debug, Clone)]
pub struct Prices {
    pub revision: u64,
    pub table: Arc<PriceTable>,
}

impl Default for Prices {
    fn default() -> Self {
        Self { revision: 0, table: Arc::new(PriceTable::builtin().clone()) }
    }
}

impl Snapshot {
    pub fn key(&self, hash: &KeyHash) -> Option<&KeyEntry> {
        self.keys.get(hash)
    }

    pub fn org(&self, id: &OrgId) -> Option<&Arc<Org>> {
        self.orgs.get(id)
    }

    pub fn orgs(&self) -> impl Iterator<Item = &Arc<Org>> {
        self.orgs.values()
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    pub fn prices(&self) -> &Prices {
        &self.prices
    }
}

/// A key as a change carries it: the organization is named, and found in the snapshot.
#[derive(Debug, Clone)]
pub struct KeyParts {
    pub id: KeyId,
    pub org: OrgId,
    pub expires_at: Option<Timestamp>,
    pub limits: KeyLimits,
}

impl Snapshot {
    /// The snapshot after these changes: organizations replaced whole (`None`: removed), keys
    /// replaced or removed, and the prices when they changed. Everything else is shared, which is
    /// far cheaper than building the table again when one key of a million is revoked.
    pub fn with_changes(
        &self,
        version: u64,
        changed_orgs: impl IntoIterator<Item = (OrgId, Option<Org>)>,
        changed_keys: impl IntoIterator<Item = (KeyHash, Option<KeyParts>)>,
        prices: Option<Prices>,
    ) -> Snapshot {
        let mut orgs = self.orgs.clone();
        let mut replaced: HashMap<OrgId, Option<Arc<Org>>> = HashMap::new();
        for (id, org) in changed_orgs {
            let org = org.map(Arc::new);
            match &org {
                Some(org) => orgs.insert(id.clone(), Arc::clone(org)),
                None => orgs.remove(&id),
            };
            replaced.insert(id, org);
        }
        let mut keys = self.keys.clone();
        if !replaced.is_empty() && !keys.is_empty() {
            // Keys point at their organization: those of a replaced one move to the new value,
            // those of a removed one go (they could not be served).
            keys.retain(|_, entry| match replaced.get(&entry.org.id) {
                Some(Some(org)) => {
                    entry.org = Arc::clone(org);
                    true
                }
                Some(None) => false,
                None => true,
            });
        }
        let changed_keys = changed_keys.into_iter();
        keys.reserve(changed_keys.size_hint().0);
        for (hash, key) in changed_keys {
            let entry = key.and_then(|key| {
                let org = Arc::clone(orgs.get(&key.org)?);
                Some(KeyEntry { id: key.id, org, expires_at: key.expires_at, limits: key.limits })
            });
            match entry {
                Some(entry) => keys.insert(hash, entry),
                None => keys.remove(&hash),
            };
        }
        Snapshot { version, keys, orgs, prices: prices.unwrap_or_else(|| self.prices.clone()) }
    }
}

/// Builds a snapshot: organizations with their credentials first, then the keys that point at them.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    version: u64,
    orgs: HashMap<OrgId, Org>,
    keys: Vec<(KeyHash, KeyId, OrgId, Option<Timestamp>, KeyLimits)>,
    prices: Option<Prices>,
}

impl SnapshotBuilder {
    pub fn new(version: u64) -> Self {
        Self { version, ..Self::default() }
    }

    pub fn org(&mut self, id: OrgId) -> &mut Self {
        self.orgs.entry(id.clone()).or_insert_with(|| Org {
            id,
            providers: HashMap::new(),
            caps: Vec::new(),
        });
        self
    }

    pub fn provider(&mut self, org: &OrgId, credential: ProviderCredential) -> &mut Self {
        if let Some(entry) = self.orgs.get_mut(org) {
            entry.providers.insert(credential.name.clone(), credential);
        }
        self
    }

    /// Caps of organizations the builder does not hold are dropped.
    pub fn cap(&mut self, cap: Cap) -> &mut Self {
        if let Some(entry) = self.orgs.get_mut(&cap.org_id) {
            entry.caps.push(cap);
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

    /// Without this, the built-in table at revision 0.
    pub fn prices(&mut self, prices: Prices) -> &mut Self {
        self.prices = Some(prices);
        self
    }

    /// Keys of organizations the builder does not hold are dropped: they could not be served.
    pub fn build(self) -> Snapshot {
        let orgs: HashMap<OrgId, Arc<Org>> =
            self.orgs.into_iter().map(|(id, org)| (id, Arc::new(org))).collect();
        let mut keys = KeyTable::with_capacity_and_hasher(self.keys.len(), BuildHasherDefault::default());
        for (hash, id, org_id, expires_at, limits) in self.keys {
            if let Some(org) = orgs.get(&org_id) {
                keys.insert(hash, KeyEntry { id, org: Arc::clone(org), expires_at, limits });
            }
        }
        Snapshot { version: self.version, keys, orgs, prices: self.prices.unwrap_or_default() }
    }
}
