//! The keys of a snapshot: one 80-byte row a key, sorted by hash, found through a directory of
//! buckets, and what only some keys have kept beside the rows.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::KeyParts;
use crate::endpoints::EndpointAllowlist;
use crate::ids::KeyId;
use crate::keys::KeyHash;
use crate::models::ModelAllowlist;

/// The most characters after `key_` a key id may have to be stored in its row; longer ids (none
/// that Recovea mints) are kept beside the table.
const PACKED_ID_CHARS: usize = 32;

/// A key id's base62 characters after its prefix, six bits each: 32 of them in 24 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct PackedId {
    bits: [u8; PACKED_ID_CHARS * 6 / 8],
    len: u8,
}

impl PackedId {
    /// Stands in the row of a key whose id is too long to pack.
    const LONG: Self = Self { bits: [0; PACKED_ID_CHARS * 6 / 8], len: 0 };

    pub(super) fn pack(suffix: &str) -> Option<Self> {
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

    pub(super) fn key_id(&self) -> KeyId {
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

pub(super) const EXPIRES: u8 = 1;
pub(super) const REQUESTS_PER_MINUTE: u8 = 2;
pub(super) const TOKENS_PER_MINUTE: u8 = 4;
pub(super) const LONG_ID: u8 = 8;
/// Only in a change: the key goes.
const REMOVED: u8 = 16;
/// The key lists its models (kept beside the table: few keys do).
pub(super) const ALLOWED_MODELS: u8 = 32;
/// The key lists its endpoints (kept beside the table).
pub(super) const ALLOWED_ENDPOINTS: u8 = 64;
/// The key limits its requests in flight (kept beside the table). The last bit of `flags`: a
/// further rule kept beside the table shares a map rather than take a bit.
pub(super) const MAX_CONCURRENT: u8 = 128;

/// A key in the table: 80 bytes, no pointer to follow. `org` indexes the snapshot's organizations.
#[derive(Clone, Copy)]
pub(super) struct Row {
    pub(super) hash: KeyHash,
    pub(super) id: PackedId,
    pub(super) flags: u8,
    pub(super) org: u32,
    pub(super) expires_at: i64,
    pub(super) requests_per_minute: u32,
    pub(super) tokens_per_minute: u32,
}

impl Row {
    /// The row of `key`, and whether its id is too long to pack.
    pub(super) fn new(hash: KeyHash, key: &KeyParts<'_>, org: u32) -> (Row, bool) {
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
    pub(super) fn removal(hash: KeyHash) -> Row {
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
pub(super) struct KeyTable {
    pub(super) rows: Vec<Row>,
    /// `dir[b]`: the first row of bucket `b` and later ones; `2^bits + 1` long (empty: no rows).
    pub(super) dir: Vec<u32>,
    pub(super) bits: u32,
    /// The ids too long to pack, by key.
    pub(super) long_ids: HashMap<KeyHash, KeyId>,
    /// The rules of the keys that have them, kept beside the table: few keys do.
    pub(super) beside: Beside,
}

/// What only some keys have, by key: their model and endpoint allowlists and their limit of
/// requests in flight.
#[derive(Clone, Default)]
pub(super) struct Beside {
    pub(super) models: HashMap<KeyHash, Arc<ModelAllowlist>>,
    pub(super) endpoints: HashMap<KeyHash, Arc<EndpointAllowlist>>,
    pub(super) concurrency: HashMap<KeyHash, u32>,
}

impl Beside {
    /// Sets (or clears) what the key of `hash` has beside the table.
    pub(super) fn put(&mut self, hash: KeyHash, key: &KeyParts<'_>) {
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

    pub(super) fn remove(&mut self, hash: &KeyHash) {
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

    pub(super) fn is_empty(&self) -> bool {
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

    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    pub(super) fn get(&self, hash: &KeyHash) -> Option<&Row> {
        let bucket = (prefix(hash) >> (64 - self.bits)) as usize;
        let (&start, &end) = (self.dir.get(bucket)?, self.dir.get(bucket + 1)?);
        self.rows.get(start as usize..end as usize)?.iter().find(|row| row.hash == *hash)
    }

    /// The table after `changes` (rows, or removals, in any order; the last change of a key wins),
    /// keeping only the rows of `self` that `keep` says to keep.
    pub(super) fn changed(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::key_id;

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
}
