//! The state a node decides from: keys by hash, organizations and their provider credentials.
//!
//! A snapshot is immutable once built; a new one replaces it whole (the gateway swaps an `Arc`), so
//! readers never lock and never see half an update.
//!
//! Memory is what a snapshot of millions of keys is about: a key is one 80-byte row (its hash, its
//! id packed in place, its organization's index, expiry and limits) in a dense table sorted by
//! hash, plus about 4 bytes of directory; organizations are shared by index rather than by a
//! pointer per key.

use std::borrow::Cow;
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

/// The most characters after `key_` a key id may have to be stored in its row; longer ids (none
/// that Recovea mints) are kept beside the table.
const PACKED_ID_CHARS: usize = 32;

/// A key id's base62 characters after its prefix, six bits each: 32 of them in 24 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PackedId {
    bits: [u8; PACKED_ID_CHARS * 6 / 8],
    len: u8,
}

impl PackedId {
    /// Stands in the row of a key whose id is too long to pack.
    const LONG: Self = Self { bits: [0; PACKED_ID_CHARS * 6 / 8], len: 0 };

    fn pack(suffix: &str) -> Option<Self> {
        let chars = suffix.as_bytes();
        if chars.len() > PACKED_ID_CHARS {
            return None;
        }
        let mut bits = [0u8; PACKED_ID_CHARS * 6 / 8];
        // Eight characters (48 bits) per six bytes.
        for (group, chunk) in chars.chunks(8).enumerate() {
            let mut word = 0u64;
            for (i, &c) in chunk.iter().enumerate() {
                word |= u64::from(crate::ids::base62_value(c)?) << (6 * i);
            }
            bits[group * 6..group * 6 + 6].copy_from_slice(&word.to_le_bytes()[..6]);
        }
        Some(Self { bits, len: u8::try_from(chars.len()).ok()? })
    }

    /// Writes the characters into `out` and returns how many there are.
    fn unpack(&self, out: &mut [u8; PACKED_ID_CHARS]) -> usize {
        let len = usize::from(self.len).min(PACKED_ID_CHARS);
        for (group, chunk) in out[..len].chunks_mut(8).enumerate() {
            let mut word = [0u8; 8];
            word[..6].copy_from_slice(&self.bits[group * 6..group * 6 + 6]);
            let word = u64::from_le_bytes(word);
            for (i, c) in chunk.iter_mut().enumerate() {
                *c = crate::ids::BASE62[((word >> (6 * i)) & 63) as usize % 62];
            }
        }
        len
    }

    fn key_id(&self) -> KeyId {
        let mut text = [0u8; KeyId::PREFIX.len() + PACKED_ID_CHARS];
        text[..KeyId::PREFIX.len()].copy_from_slice(KeyId::PREFIX.as_bytes());
        let mut chars = [0u8; PACKED_ID_CHARS];
        let len = self.unpack(&mut chars);
        text[KeyId::PREFIX.len()..KeyId::PREFIX.len() + len].copy_from_slice(&chars[..len]);
        std::str::from_utf8(&text[..KeyId::PREFIX.len() + len])
            .ok()
            .and_then(KeyId::parse)
            .expect("a packed id was packed from a valid id")
    }
}

const EXPIRES: u8 = 1;
const REQUESTS_PER_MINUTE: u8 = 2;
const TOKENS_PER_MINUTE: u8 = 4;
const LONG_ID: u8 = 8;
/// Only in a change: the key goes.
const REMOVED: u8 = 16;
/// The key lists its models (kept beside the table: few keys do).
const ALLOWED_MODELS: u8 = 32;
/// The key lists its endpoints (kept beside the table).
const ALLOWED_ENDPOINTS: u8 = 64;
/// The key limits its requests in flight (kept beside the table). The last bit of `flags`: a
/// further rule kept beside the table shares a map rather than take a bit.
const MAX_CONCURRENT: u8 = 128;

/// A key in the table: 80 bytes, no pointer to follow. `org` indexes the snapshot's organizations.
#[derive(Clone, Copy)]
struct Row {
    hash: KeyHash,
    id: PackedId,
    flags: u8,
    org: u32,
    expires_at: i64,
    requests_per_minute: u32,
    tokens_per_minute: u32,
}

impl Row {
    /// The row of `key`, and whether its id is too long to pack.
    fn new(hash: KeyHash, key: &KeyParts<'_>, org: u32) -> (Row, bool) {
        let packed = PackedId::pack(key.id.suffix());
        let limits = key.limits;
        let flags = key.expires_at.map_or(0, |_| EXPIRES)
            | limits.requests_per_minute.map_or(0, |_| REQUESTS_PER_MINUTE)
            | limits.tokens_per_minute.map_or(0, |_| TOKENS_PER_MINUTE)
            | packed.map_or(LONG_ID, |_| 0)
            | key.allowed_models.map_or(0, |_| ALLOWED_MODELS)
            | key.allowed_endpoints.map_or(0, |_| ALLOWED_ENDPOINTS)
            | key.max_concurrent_requests.map_or(0, |_| MAX_CONCURRENT);
        let row = Row {
            hash,
            id: packed.unwrap_or(PackedId::LONG),
            flags,
            org,
            expires_at: key.expires_at.map_or(0, |t| t.0),
            requests_per_minute: limits.requests_per_minute.unwrap_or(0),
            tokens_per_minute: limits.tokens_per_minute.unwrap_or(0),
        };
        (row, packed.is_none())
    }

    /// A change that removes the key of `hash`.
    fn removal(hash: KeyHash) -> Row {
        Row {
            hash,
            id: PackedId::LONG,
            flags: REMOVED,
            org: 0,
            expires_at: 0,
            requests_per_minute: 0,
            tokens_per_minute: 0,
        }
    }
}

/// The first eight bytes of a hash, in the order hashes sort in.
fn prefix(hash: &KeyHash) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.0[..8]);
    u64::from_be_bytes(first)
}

/// How many leading bits of the hash choose a key's bucket: about one key per bucket.
fn bucket_bits(keys: usize) -> u32 {
    (usize::BITS - keys.leading_zeros()).clamp(1, 32)
}

/// The keys: rows sorted by hash in a dense vector, and a directory of where each bucket (the
/// hashes sharing their first `bits` bits) starts. SHA-256 spreads the hashes uniformly, so a
/// bucket holds about one key: a lookup reads one directory entry (4 bytes a key, small enough to
/// stay cached) and then the row, where a hash table would read its index and then the row.
#[derive(Clone, Default)]
struct KeyTable {
    rows: Vec<Row>,
    /// `dir[b]`: the first row of bucket `b` and later ones; `2^bits + 1` long (empty: no rows).
    dir: Vec<u32>,
    bits: u32,
    /// The ids too long to pack, by key.
    long_ids: HashMap<KeyHash, KeyId>,
    /// The rules of the keys that have them, kept beside the table: few keys do.
    beside: Beside,
}

/// What only some keys have, by key: their model and endpoint allowlists and their limit of
/// requests in flight.
#[derive(Clone, Default)]
struct Beside {
    models: HashMap<KeyHash, Arc<ModelAllowlist>>,
    endpoints: HashMap<KeyHash, Arc<EndpointAllowlist>>,
    concurrency: HashMap<KeyHash, u32>,
}

impl Beside {
    /// Sets (or clears) what the key of `hash` has beside the table.
    fn put(&mut self, hash: KeyHash, key: &KeyParts<'_>) {
        fn set<V>(map: &mut HashMap<KeyHash, V>, hash: KeyHash, value: Option<V>) {
            match value {
                Some(value) => {
                    map.insert(hash, value);
                }
                None if !map.is_empty() => {
                    map.remove(&hash);
                }
                None => {}
            }
        }
        set(&mut self.models, hash, key.allowed_models.map(|list| Arc::new(list.clone())));
        set(&mut self.endpoints, hash, key.allowed_endpoints.map(|list| Arc::new(list.clone())));
        set(&mut self.concurrency, hash, key.max_concurrent_requests);
    }

    fn remove(&mut self, hash: &KeyHash) {
        if !self.models.is_empty() {
            self.models.remove(hash);
        }
        if !self.endpoints.is_empty() {
            self.endpoints.remove(hash);
        }
        if !self.concurrency.is_empty() {
            self.concurrency.remove(hash);
        }
    }

    /// Only the entries of keys `kept` holds.
    fn retain(&mut self, kept: impl Fn(&KeyHash) -> bool) {
        self.models.retain(|hash, _| kept(hash));
        self.endpoints.retain(|hash, _| kept(hash));
        self.concurrency.retain(|hash, _| kept(hash));
    }

    fn is_empty(&self) -> bool {
        self.models.is_empty() && self.endpoints.is_empty() && self.concurrency.is_empty()
    }
}

impl KeyTable {
    /// `rows` sorted by hash, each hash once.
    fn from_sorted(rows: Vec<Row>, long_ids: HashMap<KeyHash, KeyId>, beside: Beside) -> KeyTable {
        let bits = bucket_bits(rows.len());
        let buckets = 1usize << bits;
        let shift = 64 - bits;
        let mut dir = Vec::with_capacity(buckets + 1);
        let mut at = 0;
        for bucket in 0..=buckets as u64 {
            while rows.get(at).is_some_and(|row| prefix(&row.hash) >> shift < bucket) {
                at += 1;
            }
            dir.push(at as u32);
        }
        KeyTable { rows, dir, bits, long_ids, beside }
    }

    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, hash: &KeyHash) -> Option<&Row> {
        let bucket = (prefix(hash) >> (64 - self.bits)) as usize;
        let (&start, &end) = (self.dir.get(bucket)?, self.dir.get(bucket + 1)?);
        self.rows.get(start as usize..end as usize)?.iter().find(|row| row.hash == *hash)
    }

    /// The table after `changes` (rows, or removals, in any order; the last change of a key wins),
    /// keeping only the rows of `self` that `keep` says to keep.
    fn changed(
        &self,
        mut changes: Vec<Row>,
        long_ids: HashMap<KeyHash, KeyId>,
        beside: Beside,
        keep: impl Fn(&Row) -> bool,
    ) -> KeyTable {
        // Stable, so that the last change of a key is the last of its run.
        changes.sort_by_key(|row| row.hash);
        changes.dedup_by(|later, earlier| {
            if later.hash == earlier.hash {
                *earlier = *later;
                true
            } else {
                false
            }
        });
        let kept: Cow<'_, [Row]> = if self.rows.iter().all(&keep) {
            Cow::Borrowed(&self.rows)
        } else {
            Cow::Owned(self.rows.iter().filter(|row| keep(row)).copied().collect())
        };
        let rows = if kept.is_empty() {
            changes.retain(|row| row.flags & REMOVED == 0);
            changes
        } else {
            // Runs of unchanged rows are copied whole between the changes.
            let added = changes.iter().filter(|row| row.flags & REMOVED == 0).count();
            let mut rows = Vec::with_capacity(kept.len() + added);
            let mut from = 0;
            for change in changes {
                let at = from + kept[from..].partition_point(|row| row.hash < change.hash);
                rows.extend_from_slice(&kept[from..at]);
                from = at;
                if kept.get(at).is_some_and(|row| row.hash == change.hash) {
                    from += 1;
                }
                if change.flags & REMOVED == 0 {
                    rows.push(change);
                }
            }
            rows.extend_from_slice(&kept[from..]);
            rows
        };
        let mut table = KeyTable::from_sorted(rows, long_ids, beside);
        if !table.long_ids.is_empty() && matches!(kept, Cow::Owned(_)) {
            let long_ids = std::mem::take(&mut table.long_ids);
            table.long_ids = long_ids.into_iter().filter(|(hash, _)| table.get(hash).is_some()).collect();
        }
        if !table.beside.is_empty() && matches!(kept, Cow::Owned(_)) {
            let mut beside = std::mem::take(&mut table.beside);
            beside.retain(|hash| table.get(hash).is_some());
            table.beside = beside;
        }
        table
    }
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable").field("keys", &self.rows.len()).field("bucket_bits", &self.bits).finish()
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn org_id(s: &str) -> OrgId {
        OrgId::parse(s).expect("a valid org id")
    }

    fn key_id(s: &str) -> KeyId {
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
    fn a_row_is_eighty_bytes() {
        assert_eq!(std::mem::size_of::<Row>(), 80);
    }

    #[test]
    fn minted_ids_pack_and_long_ids_do_not() {
        let minted = crate::ids::mint(KeyId::PREFIX, KeyId::RANDOM_LEN, || 201);
        let id = key_id(&minted);
        let packed = PackedId::pack(id.suffix()).expect("a minted id packs");
        assert_eq!(packed.key_id(), id);
        assert!(PackedId::pack(&"a".repeat(PACKED_ID_CHARS + 1)).is_none());
        assert!(PackedId::pack("a-b").is_none());
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
