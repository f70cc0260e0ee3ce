//! The state a node decides from: keys by hash, organizations and their provider credentials.
//!
//! A snapshot is immutable once built; a new one replaces it whole (the gateway swaps an `Arc`), so
//! readers never lock and never see half an update.
//!
//! Memory is what a snapshot of millions of keys is about: a key is one 80-byte row (its hash, its
//! id packed in place, its organization's index, expiry and limits) in a dense table sorted by
//! hash, plus about 4 bytes of directory; organizations are shared by index rather than by a
//! pointer per key.

use std::collections::HashMap;
use std::sync::Arc;

use crate::caps::Cap;
use crate::endpoints::EndpointAllowlist;
use crate::ids::{KeyId, OrgId};
use crate::keys::KeyHash;
use crate::models::ModelAllowlist;
use crate::pricing::PriceTable;
use crate::ratelimit::KeyLimits;
use crate::timestamp::Timestamp;

mod builder;
mod key_table;

pub use builder::SnapshotBuilder;
use key_table::{
    ALLOWED_ENDPOINTS, ALLOWED_MODELS, EXPIRES, KeyTable, LONG_ID, MAX_CONCURRENT, PackedId,
    REQUESTS_PER_MINUTE, Row, TOKENS_PER_MINUTE,
};

pub use crate::provider_kind::ProviderKind;

/// A provider key Recovea holds for an organization, opened and ready to inject.
#[derive(Clone)]
pub struct ProviderCredential {
    pub name: String,
    pub kind: ProviderKind,
    /// `None`: the node's default base URL for this kind.
    pub base_url: Option<String>,
    pub api_key: String,
    /// Where its requests are priced: its price namespace (by default its name) and its fallback.
    pub scope: crate::pricing::PriceScope,
}

impl ProviderCredential {
    /// A credential priced in its name's namespace (when the table has one) at the kind's fallback.
    pub fn new(name: String, kind: ProviderKind, base_url: Option<String>, api_key: String) -> Self {
        let scope = crate::pricing::PriceScope::of_credential(kind, &name, None, None);
        Self { name, kind, base_url, api_key, scope }
    }

    /// The same, priced in `namespace` (none: its name's) and at `fallback` for unpriced models.
    pub fn with_pricing(mut self, namespace: Option<&str>, fallback: Option<crate::pricing::Price>) -> Self {
        self.scope = crate::pricing::PriceScope::of_credential(self.kind, &self.name, namespace, fallback);
        self
    }
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
    /// By name, each name once; an organization has a few, so a list is smaller than a map and as
    /// quick to search.
    pub providers: Box<[ProviderCredential]>,
    /// Every cap of the organization, organization- and key-scoped.
    pub caps: Box<[Cap]>,
    /// The models its keys may use; `None`: every model.
    pub allowed_models: Option<ModelAllowlist>,
    /// The endpoints its keys may call; `None`: every endpoint.
    pub allowed_endpoints: Option<EndpointAllowlist>,
    /// The most requests of its keys in flight at once on a node; `None`: no limit.
    pub max_concurrent_requests: Option<u32>,
}

impl Org {
    pub fn provider(&self, name: &str) -> Option<&ProviderCredential> {
        self.providers.iter().find(|credential| credential.name == name)
    }
}

/// What admission needs to know of a key, read out of the snapshot's table. Revoked keys are not in
/// a snapshot at all.
#[derive(Debug, Clone, Copy)]
pub struct KeyEntry<'a> {
    pub org: &'a Arc<Org>,
    pub expires_at: Option<Timestamp>,
    pub limits: KeyLimits,
    /// The models this key may use; `None`: every model its organization allows.
    pub allowed_models: Option<&'a Arc<ModelAllowlist>>,
    /// The endpoints this key may call; `None`: every endpoint its organization allows.
    pub allowed_endpoints: Option<&'a Arc<EndpointAllowlist>>,
    /// The most requests of this key in flight at once on a node; `None`: no limit of its own.
    pub max_concurrent_requests: Option<u32>,
    id: StoredId<'a>,
}

impl KeyEntry<'_> {
    /// The key's public id. Ids are stored packed in the row, so this builds one (a small
    /// allocation) where a shared one would cost a reference count on a cache line of its own.
    pub fn id(&self) -> KeyId {
        match self.id {
            StoredId::Packed(packed) => packed.key_id(),
            StoredId::Long(id) => id.clone(),
        }
    }
}

#[derive(Clone, Copy)]
enum StoredId<'a> {
    Packed(&'a PackedId),
    Long(&'a KeyId),
}

impl std::fmt::Debug for StoredId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Packed(packed) => std::fmt::Debug::fmt(&packed.key_id(), f),
            Self::Long(id) => std::fmt::Debug::fmt(id, f),
        }
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    pub version: u64,
    keys: KeyTable,
    /// Organizations by the index keys hold; `None`: a removed one, whose index is free again.
    orgs: Vec<Option<Arc<Org>>>,
    org_index: foldhash::HashMap<OrgId, u32>,
    free_orgs: Vec<u32>,
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
        Self { revision: 0, table: Arc::clone(PriceTable::builtin_shared()) }
    }
}

impl Snapshot {
    pub fn key(&self, hash: &KeyHash) -> Option<KeyEntry<'_>> {
        self.entry(self.keys.get(hash)?)
    }

    fn entry<'a>(&'a self, row: &'a Row) -> Option<KeyEntry<'a>> {
        let org = self.orgs.get(row.org as usize)?.as_ref()?;
        let id = if row.flags & LONG_ID == 0 {
            StoredId::Packed(&row.id)
        } else {
            StoredId::Long(self.keys.long_ids.get(&row.hash)?)
        };
        Some(KeyEntry {
            org,
            expires_at: (row.flags & EXPIRES != 0).then_some(Timestamp(row.expires_at)),
            limits: KeyLimits {
                requests_per_minute: (row.flags & REQUESTS_PER_MINUTE != 0)
                    .then_some(row.requests_per_minute),
                tokens_per_minute: (row.flags & TOKENS_PER_MINUTE != 0).then_some(row.tokens_per_minute),
            },
            allowed_models: if row.flags & ALLOWED_MODELS == 0 {
                None
            } else {
                self.keys.beside.models.get(&row.hash)
            },
            allowed_endpoints: if row.flags & ALLOWED_ENDPOINTS == 0 {
                None
            } else {
                self.keys.beside.endpoints.get(&row.hash)
            },
            max_concurrent_requests: if row.flags & MAX_CONCURRENT == 0 {
                None
            } else {
                self.keys.beside.concurrency.get(&row.hash).copied()
            },
            id,
        })
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = (KeyHash, KeyEntry<'_>)> {
        self.keys.rows.iter().filter_map(|row| Some((row.hash, self.entry(row)?)))
    }

    pub fn org(&self, id: &OrgId) -> Option<&Arc<Org>> {
        self.orgs.get(*self.org_index.get(id)? as usize)?.as_ref()
    }

    pub fn orgs(&self) -> impl Iterator<Item = &Arc<Org>> {
        self.orgs.iter().flatten()
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    pub fn prices(&self) -> &Prices {
        &self.prices
    }
}

/// A key as a change carries it: the organization is named, and found in the snapshot.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    pub id: &'a KeyId,
    pub org: &'a OrgId,
    pub expires_at: Option<Timestamp>,
    pub limits: KeyLimits,
    pub allowed_models: Option<&'a ModelAllowlist>,
    pub allowed_endpoints: Option<&'a EndpointAllowlist>,
    pub max_concurrent_requests: Option<u32>,
}

impl Snapshot {
    /// The snapshot after these changes: organizations replaced whole (`None`: removed), keys
    /// replaced or removed, and the prices when they changed. Everything else is copied as it is
    /// (keys name their organization by index, so replacing one touches none of its keys), which
    /// is far cheaper than building the table again when one key of a million is revoked.
    pub fn with_changes<'k>(
        &self,
        version: u64,
        changed_orgs: impl IntoIterator<Item = (OrgId, Option<Org>)>,
        changed_keys: impl IntoIterator<Item = (KeyHash, Option<KeyParts<'k>>)>,
        prices: Option<Prices>,
    ) -> Snapshot {
        let mut orgs = self.orgs.clone();
        let mut org_index = self.org_index.clone();
        let mut free_orgs = self.free_orgs.clone();
        // The last change of an organization wins.
        let changed_orgs: HashMap<OrgId, Option<Org>> = changed_orgs.into_iter().collect();
        let mut removed = Vec::new();
        let mut added = Vec::new();
        for (id, org) in changed_orgs {
            match (org_index.get(&id).copied(), org) {
                (Some(at), Some(org)) => orgs[at as usize] = Some(shared(org)),
                (Some(at), None) => {
                    orgs[at as usize] = None;
                    org_index.remove(&id);
                    removed.push(at);
                }
                (None, Some(org)) => added.push((id, org)),
                (None, None) => {}
            }
        }
        // New organizations take indexes freed before this change, never one freed by it: the
        // removed one's keys are still in the table until the retain below.
        for (id, org) in added {
            let at = match free_orgs.pop() {
                Some(at) => {
                    orgs[at as usize] = Some(shared(org));
                    at
                }
                None => {
                    orgs.push(Some(shared(org)));
                    (orgs.len() - 1) as u32
                }
            };
            org_index.insert(id, at);
        }
        let changed_keys = changed_keys.into_iter();
        let mut changes = Vec::with_capacity(changed_keys.size_hint().0);
        let mut long_ids = self.keys.long_ids.clone();
        let mut beside = self.keys.beside.clone();
        for (hash, key) in changed_keys {
            match key.and_then(|key| Some((key, *org_index.get(key.org)?))) {
                Some((key, org)) => {
                    let (row, long) = Row::new(hash, &key, org);
                    if long {
                        long_ids.insert(hash, key.id.clone());
                    } else if !long_ids.is_empty() {
                        long_ids.remove(&hash);
                    }
                    beside.put(hash, &key);
                    changes.push(row);
                }
                None => {
                    if !long_ids.is_empty() {
                        long_ids.remove(&hash);
                    }
                    beside.remove(&hash);
                    changes.push(Row::removal(hash));
                }
            }
        }
        // The keys of a removed organization go: they could not be served.
        let mut gone = vec![false; if removed.is_empty() { 0 } else { orgs.len() }];
        for at in &removed {
            gone[*at as usize] = true;
        }
        let keys = self
            .keys
            .changed(changes, long_ids, beside, |row| !gone.get(row.org as usize).copied().unwrap_or(false));
        free_orgs.extend(removed);
        Snapshot {
            version,
            keys,
            orgs,
            org_index,
            free_orgs,
            prices: prices.unwrap_or_else(|| self.prices.clone()),
        }
    }
}

/// An organization as the snapshot holds it. Its caps name it by the very id it holds, so that
/// checking whether a cap covers a request compares pointers rather than reading two strings.
/// (With lists as boxed slices, the organization and its reference counts fill one cache line:
/// an admission reads it once.)
fn shared(mut org: Org) -> Arc<Org> {
    for cap in &mut org.caps {
        if cap.org_id == org.id {
            cap.org_id = org.id.clone();
        }
    }
    Arc::new(org)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn org_id(s: &str) -> OrgId {
        OrgId::parse(s).expect("a valid org id")
    }

    pub(super) fn key_id(s: &str) -> KeyId {
        KeyId::parse(s).expect("a valid key id")
    }

    fn org(id: &str, caps: usize) -> Org {
        let cap = |n: usize| Cap {
            id: crate::ids::CapId::parse(&format!("cap_{n}")).expect("a valid cap id"),
            org_id: org_id(id),
            scope: crate::caps::Scope::Organization,
            key_id: None,
            window: crate::window::Window::Day,
            limit: crate::money::Nanos(1),
            hard_stop: true,
            alert_at_permille: Vec::new(),
            alert_webhook: None,
        };
        Org {
            id: org_id(id),
            providers: Box::default(),
            caps: (0..caps).map(cap).collect(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        }
    }

    /// A hash whose first four bytes (and so its bucket) are `tag`: keys that share buckets on
    /// purpose.
    fn hash(tag: u32, n: u8) -> KeyHash {
        let mut bytes = [n; 32];
        bytes[..4].copy_from_slice(&tag.to_be_bytes());
        KeyHash(bytes)
    }

    #[test]
    fn every_field_of_a_key_reads_back() {
        let long = format!("key_{}", "Z".repeat(40));
        let mut b = SnapshotBuilder::new(1);
        b.org(org_id("org_a"));
        let limits = KeyLimits { requests_per_minute: Some(0), tokens_per_minute: None };
        b.key_with_limits(hash(1, 1), key_id("key_1"), org_id("org_a"), Some(Timestamp(-5)), limits);
        b.key(hash(1, 2), key_id(&long), org_id("org_a"), None);
        b.key(hash(1, 3), key_id("key_3"), org_id("org_elsewhere"), None);
        let snapshot = b.build();
        assert_eq!(snapshot.key_count(), 2, "a key of an unknown organization is left out");
        let one = snapshot.key(&hash(1, 1)).expect("served");
        assert_eq!((one.id().as_str(), one.expires_at, one.limits), ("key_1", Some(Timestamp(-5)), limits));
        assert_eq!(one.org.id.as_str(), "org_a");
        let two = snapshot.key(&hash(1, 2)).expect("served");
        assert_eq!(
            (two.id().as_str(), two.expires_at, two.limits),
            (long.as_str(), None, KeyLimits::default())
        );
        assert!(snapshot.key(&hash(1, 3)).is_none());
        assert_eq!(format!("{:?}", one.id), "key_1");
    }

    #[test]
    fn allowlists_of_keys_and_organizations_read_back_and_follow_changes() {
        let models =
            |p: &[&str]| ModelAllowlist::parse(p.iter().map(|m| (*m).to_owned()).collect()).expect("valid");
        let mut b = SnapshotBuilder::new(1);
        b.org(org_id("org_a")).org_allowed_models(org_id("org_a"), models(&["gpt-*"]));
        b.key(hash(3, 1), key_id("key_1"), org_id("org_a"), None);
        b.key_allowed_models(hash(3, 1), models(&["gpt-4o-mini"]));
        b.key(hash(3, 2), key_id("key_2"), org_id("org_a"), None);
        let first = b.build();
        let one = first.key(&hash(3, 1)).expect("served");
        assert_eq!(one.allowed_models.map(|l| l.patterns().to_vec()), Some(vec!["gpt-4o-mini".to_owned()]));
        assert!(first.key(&hash(3, 2)).expect("served").allowed_models.is_none());
        assert_eq!(one.org.allowed_models, Some(models(&["gpt-*"])));
        // The list goes when the key is changed without one, and when the key goes.
        let (id, org) = (key_id("key_1"), org_id("org_a"));
        let plain = KeyParts {
            id: &id,
            org: &org,
            expires_at: None,
            limits: KeyLimits::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        };
        let second = first.with_changes(2, std::iter::empty(), [(hash(3, 1), Some(plain))], None);
        assert!(second.key(&hash(3, 1)).expect("served").allowed_models.is_none());
        assert!(second.keys.beside.is_empty());
        let third = first.with_changes(3, std::iter::empty(), [(hash(3, 1), None)], None);
        assert!(third.keys.beside.is_empty());
        assert!(first.key(&hash(3, 1)).expect("the old one is untouched").allowed_models.is_some());
    }

    #[test]
    fn endpoint_lists_and_concurrency_limits_read_back_and_follow_changes() {
        let endpoints = |p: &[&str]| {
            EndpointAllowlist::parse(p.iter().map(|m| (*m).to_owned()).collect()).expect("valid")
        };
        let mut b = SnapshotBuilder::new(1);
        b.org(org_id("org_a"))
            .org_allowed_endpoints(org_id("org_a"), endpoints(&["/v1/*"]))
            .org_max_concurrent_requests(org_id("org_a"), 10);
        b.key(hash(4, 1), key_id("key_1"), org_id("org_a"), None);
        b.key_allowed_endpoints(hash(4, 1), endpoints(&["/v1/chat/completions"]));
        b.key_max_concurrent_requests(hash(4, 1), 2);
        b.key(hash(4, 2), key_id("key_2"), org_id("org_a"), None);
        b.key_max_concurrent_requests(hash(4, 2), 0);
        let first = b.build();
        let one = first.key(&hash(4, 1)).expect("served");
        assert_eq!(
            one.allowed_endpoints.map(|l| l.patterns().to_vec()),
            Some(vec!["/v1/chat/completions".into()])
        );
        assert_eq!(one.max_concurrent_requests, Some(2));
        assert!(one.allowed_models.is_none());
        let two = first.key(&hash(4, 2)).expect("served");
        assert!(two.allowed_endpoints.is_none());
        assert_eq!(two.max_concurrent_requests, Some(0), "zero is a limit, not its absence");
        assert_eq!(one.org.allowed_endpoints, Some(endpoints(&["/v1/*"])));
        assert_eq!(one.org.max_concurrent_requests, Some(10));
        let (id, org) = (key_id("key_1"), org_id("org_a"));
        let plain = KeyParts {
            id: &id,
            org: &org,
            expires_at: None,
            limits: KeyLimits::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        };
        let second = first.with_changes(2, std::iter::empty(), [(hash(4, 1), Some(plain))], None);
        let one = second.key(&hash(4, 1)).expect("served");
        assert!(one.allowed_endpoints.is_none() && one.max_concurrent_requests.is_none());
        let third = second.with_changes(3, std::iter::empty(), [(hash(4, 2), None)], None);
        assert!(third.keys.beside.is_empty());
        assert_eq!(
            first.key(&hash(4, 1)).expect("the old one is untouched").max_concurrent_requests,
            Some(2)
        );
    }

    #[test]
    fn replacing_an_organization_moves_its_keys_and_removing_it_drops_them() {
        let mut b = SnapshotBuilder::new(1);
        b.org(org_id("org_a")).org(org_id("org_b"));
        b.key(hash(7, 1), key_id("key_a"), org_id("org_a"), None);
        b.key(hash(7, 2), key_id("key_b"), org_id("org_b"), None);
        let first = b.build();
        let second = first.with_changes(
            2,
            [(org_id("org_a"), Some(org("org_a", 2))), (org_id("org_b"), None)],
            std::iter::empty(),
            None,
        );
        assert_eq!(second.key(&hash(7, 1)).expect("kept").org.caps.len(), 2);
        assert!(second.key(&hash(7, 2)).is_none());
        assert!(second.org(&org_id("org_b")).is_none());
        assert_eq!(first.key(&hash(7, 2)).expect("the old one is untouched").org.id.as_str(), "org_b");
        // A new organization takes the freed index; the removed one's keys do not come back.
        let third =
            second.with_changes(3, [(org_id("org_c"), Some(org("org_c", 0)))], std::iter::empty(), None);
        assert_eq!(third.orgs().count(), 2);
        assert!(third.key(&hash(7, 2)).is_none());
        let c = org_id("org_c");
        let id = key_id("key_c");
        let parts = KeyParts {
            id: &id,
            org: &c,
            expires_at: None,
            limits: KeyLimits::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        };
        let fourth = third.with_changes(4, std::iter::empty(), [(hash(7, 3), Some(parts))], None);
        assert_eq!(fourth.key(&hash(7, 3)).expect("served").org.id.as_str(), "org_c");
        assert_eq!(fourth.key_count(), 2);
    }

    #[test]
    fn thousands_of_keys_are_found_after_changes_and_unknown_ones_are_not() {
        let org = org_id("org_a");
        let ids: Vec<KeyId> = (0..6000).map(|i| key_id(&format!("key_{i}"))).collect();
        let hashes: Vec<KeyHash> = (0..6000).map(|i| crate::keys::hash_secret(&format!("rk_{i}"))).collect();
        let parts = |i: usize| KeyParts {
            id: &ids[i],
            org: &org,
            expires_at: None,
            limits: KeyLimits::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        };
        let mut b = SnapshotBuilder::new(1);
        b.org(org.clone());
        let first = b.build().with_changes(
            1,
            std::iter::empty(),
            (0..4000).map(|i| (hashes[i], Some(parts(i)))),
            None,
        );
        // A third removed, a thousand added, one replaced: as a node applies a change.
        let changes = (0..4000)
            .filter(|i| i % 3 == 0)
            .map(|i| (hashes[i], None))
            .chain((4000..5000).map(|i| (hashes[i], Some(parts(i)))))
            .chain([(hashes[1], Some(parts(5999)))]);
        let second = first.with_changes(2, std::iter::empty(), changes, None);
        assert_eq!(first.key_count(), 4000);
        for (i, hash) in hashes.iter().enumerate() {
            let expected = match i {
                1 => Some("key_5999".to_owned()),
                _ if i < 4000 && i % 3 != 0 => Some(format!("key_{i}")),
                4000..5000 => Some(format!("key_{i}")),
                _ => None,
            };
            assert_eq!(second.key(hash).map(|e| e.id().as_str().to_owned()), expected, "key {i}");
            assert_eq!(first.key(hash).is_some(), i < 4000, "the old snapshot is unchanged: {i}");
        }
        assert_eq!(second.key_count(), 4000 - 1334 + 1000);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u32, u8, bool),
        Remove(u32, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few tags, so that keys share buckets; the first and the last bucket among them.
        let tag = prop::sample::select(vec![0u32, 1, 2, 15, 31, 16, 1 << 20, u32::MAX]);
        prop_oneof![
            (tag.clone(), 0u8..6, any::<bool>()).prop_map(|(t, n, long)| Op::Put(t, n, long)),
            (tag, 0u8..6).prop_map(|(t, n)| Op::Remove(t, n)),
        ]
    }

    proptest! {
        #[test]
        fn any_base62_suffix_round_trips(suffix in "[0-9A-Za-z]{1,32}") {
            let packed = PackedId::pack(&suffix).expect("fits");
            let id = packed.key_id();
            prop_assert_eq!(id.suffix(), suffix.as_str());
        }

        #[test]
        fn the_table_holds_what_a_map_holds(ops in prop::collection::vec(op(), 0..200)) {
            let org = org_id("org_a");
            let mut b = SnapshotBuilder::new(0);
            b.org(org.clone());
            let mut snapshot = b.build();
            let mut model: HashMap<KeyHash, String> = HashMap::new();
            for (step, op) in ops.into_iter().enumerate() {
                let (hash, id) = match op {
                    Op::Put(tag, n, long) => {
                        let id = if long { format!("key_{step}{}", "x".repeat(40)) } else { format!("key_{step}") };
                        (self::hash(tag, n), Some(id))
                    }
                    Op::Remove(tag, n) => (self::hash(tag, n), None),
                };
                let parsed = id.as_deref().map(key_id);
                let parts = parsed.as_ref().map(|id| KeyParts { id, org: &org, expires_at: None, limits: KeyLimits::default(), allowed_models: None, allowed_endpoints: None, max_concurrent_requests: None });
                snapshot = snapshot.with_changes(step as u64, std::iter::empty(), [(hash, parts)], None);
                match id {
                    Some(id) => model.insert(hash, id),
                    None => model.remove(&hash),
                };
                prop_assert_eq!(snapshot.key_count(), model.len());
                for (hash, id) in &model {
                    let entry = snapshot.key(hash);
                    prop_assert_eq!(entry.map(|e| e.id().as_str().to_owned()), Some(id.clone()));
                }
                prop_assert_eq!(snapshot.keys().count(), model.len());
                for t in [0u32, 1, 2, 15, 31, 16, 1 << 20, u32::MAX] {
                    for n in 0..6 {
                        let h = self::hash(t, n);
                        prop_assert_eq!(snapshot.key(&h).is_some(), model.contains_key(&h));
                    }
                }
                prop_assert!(snapshot.keys.long_ids.len() <= model.len());
            }
        }
    }
}
