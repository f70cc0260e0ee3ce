//! The snapshot's wire form: the state the control plane feeds its nodes (in full, then as
//! changes) and the state a node saves to disk. Provider keys stay sealed in it: only a holder of
//! the master key opens them, when it turns the state into a [`Snapshot`].
//!
//! Unknown fields are ignored rather than refused, so that a node and a control plane one release
//! apart still understand each other during a rolling upgrade.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::caps::{Cap, Scope};
use crate::crypto::{MasterKey, NONCE_LEN, provider_key_context};
use crate::endpoints::EndpointAllowlist;
use crate::ids::{CapId, KeyId, OrgId};
use crate::keys::KeyHash;
use crate::models::ModelAllowlist;
use crate::money::Nanos;
use crate::pricing::{Price, PriceTable, PriceWire};
use crate::ratelimit::KeyLimits;
use crate::snapshot::{KeyParts, Org, Prices, ProviderCredential, ProviderKind, Snapshot};
use crate::timestamp::Timestamp;
use crate::window::Window;

/// Everything a node decides from, at one version of the control store.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FeedState {
    pub version: u64,
    /// By organization id.
    pub orgs: BTreeMap<OrgId, OrgWire>,
    /// The keys that are not revoked, by the hash of their secret. Every key's organization is in
    /// `orgs` (a key of another is never served).
    pub keys: HashMap<KeyHash, KeyWire>,
    pub prices: PricesWire,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OrgWire {
    /// By credential name.
    pub providers: BTreeMap<String, ProviderWire>,
    pub caps: Vec<CapWire>,
    /// The models the organization's keys may use; left out: every model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<ModelAllowlist>,
    /// The endpoints the organization's keys may call; left out: every endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<EndpointAllowlist>,
    /// The most requests of its keys in flight at once on a node; left out: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderWire {
    /// `openai` or `anthropic`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The provider key sealed under the master key (bound to organization and name), in hex.
    pub sealed_key: String,
    /// Where its models are priced: a namespace other than its name's, and its own fallback price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_price: Option<PriceWire>,
}

/// A cap as nodes need it: no webhook (nodes do not alert; the control plane does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapWire {
    pub id: String,
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    pub window: String,
    pub limit_nanos: i64,
    pub hard_stop: bool,
    #[serde(default)]
    pub alert_at_permille: Vec<u32>,
}

/// Ids are parsed as the message is read (an id that does not parse refuses the message), so that
/// building a snapshot from a million keys copies no text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyWire {
    pub id: KeyId,
    pub org_id: OrgId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// The models the key may use; left out: every model its organization allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<ModelAllowlist>,
    /// The endpoints the key may call; left out: every endpoint its organization allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<EndpointAllowlist>,
    /// The most requests of the key in flight at once on a node; left out: no limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
}

/// The operators' price overrides; the built-in table is compiled into every node.
///
/// The fields after `overrides` came later: left out when empty, so that a node built before them
/// reads a state that does not use them, and defaulted, so that a node reads an older state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PricesWire {
    pub revision: u64,
    pub overrides: BTreeMap<String, PriceWire>,
    /// The provider kind (`openai`, `anthropic`) of the overrides that were given one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, String>,
    /// The operators' fallback price by provider kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallback: BTreeMap<String, PriceWire>,
}

/// What changed between two versions: entries replaced whole, `None` for removed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FeedChanges {
    /// The version these changes apply to.
    pub from: u64,
    /// The version they lead to.
    pub version: u64,
    #[serde(default)]
    pub orgs: BTreeMap<OrgId, Option<OrgWire>>,
    #[serde(default)]
    pub keys: HashMap<KeyHash, Option<KeyWire>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<PricesWire>,
}

/// One answer of the feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FeedMessage {
    /// The whole state: the first answer, and whenever the node is too far behind for changes.
    State(FeedState),
    Changes(FeedChanges),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedError {
    /// Changes for another version than the one held: the node asks for the whole state.
    VersionMismatch { held: u64, from: u64 },
    /// A field that does not parse; the state is refused whole rather than served in part.
    Invalid(String),
}

impl std::fmt::Display for FeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::VersionMismatch { held, from } => {
                write!(f, "changes from version {from} do not apply to version {held}")
            }
            Self::Invalid(what) => write!(f, "invalid feed state: {what}"),
        }
    }
}

impl std::error::Error for FeedError {}

/// A snapshot opened from a feed state, and the credentials that could not be opened (left out, so
/// that their routes answer `provider_not_configured`, and reported for the operators' logs).
#[derive(Debug)]
pub struct Opened {
    pub snapshot: Snapshot,
    pub unopened: Vec<(OrgId, String)>,
}

impl FeedState {
    /// What turns `older` into `self`.
    pub fn changes_since(&self, older: &FeedState) -> FeedChanges {
        let mut orgs = BTreeMap::new();
        for (id, org) in &self.orgs {
            if older.orgs.get(id) != Some(org) {
                orgs.insert(id.clone(), Some(org.clone()));
            }
        }
        for id in older.orgs.keys().filter(|id| !self.orgs.contains_key(*id)) {
            orgs.insert(id.clone(), None);
        }
        let mut keys = HashMap::new();
        for (hash, key) in &self.keys {
            if older.keys.get(hash) != Some(key) {
                keys.insert(*hash, Some(key.clone()));
            }
        }
        for hash in older.keys.keys().filter(|hash| !self.keys.contains_key(*hash)) {
            keys.insert(*hash, None);
        }
        FeedChanges {
            from: older.version,
            version: self.version,
            orgs,
            keys,
            prices: (self.prices != older.prices).then(|| self.prices.clone()),
        }
    }

    /// Applies changes made for exactly this version.
    pub fn apply(&mut self, changes: FeedChanges) -> Result<(), FeedError> {
        if changes.from != self.version {
            return Err(FeedError::VersionMismatch { held: self.version, from: changes.from });
        }
        for (id, org) in changes.orgs {
            match org {
                Some(org) => self.orgs.insert(id, org),
                None => self.orgs.remove(&id),
            };
        }
        for (hash, key) in changes.keys {
            match key {
                Some(key) => self.keys.insert(hash, key),
                None => self.keys.remove(&hash),
            };
        }
        if let Some(prices) = changes.prices {
            self.prices = prices;
        }
        self.version = changes.version;
        Ok(())
    }

    /// The bytes of `FeedMessage::State` for this state, without copying it first.
    pub fn message_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Borrowed<'a> {
            State(&'a FeedState),
        }
        serde_json::to_vec(&Borrowed::State(self)).unwrap_or_default()
    }

    /// Opens the provider keys and builds the snapshot a node serves.
    pub fn open(&self, master_key: &MasterKey) -> Result<Opened, FeedError> {
        let orgs = self.orgs.iter().map(|(id, org)| (id, Some(org)));
        let keys = self.keys.iter().map(|(hash, key)| (hash, Some(key)));
        open_onto(&Snapshot::default(), self.version, orgs, keys, Some(&self.prices), master_key)
    }
}

impl FeedChanges {
    /// Opens what changed and applies it to `snapshot` (which must be the snapshot of the version
    /// these changes start from), sharing everything else.
    pub fn open_onto(&self, snapshot: &Snapshot, master_key: &MasterKey) -> Result<Opened, FeedError> {
        let orgs = self.orgs.iter().map(|(id, org)| (id, org.as_ref()));
        let keys = self.keys.iter().map(|(hash, key)| (hash, key.as_ref()));
        open_onto(snapshot, self.version, orgs, keys, self.prices.as_ref(), master_key)
    }

    /// These changes followed by `next` (made for the version these lead to), as one set: entries
    /// are replaced whole, so the later entry wins.
    pub fn then(mut self, next: FeedChanges) -> FeedChanges {
        self.orgs.extend(next.orgs);
        self.keys.extend(next.keys);
        if next.prices.is_some() {
            self.prices = next.prices;
        }
        self.version = next.version;
        self
    }
}

/// Opens organizations and keys (`None`: removed) and applies them to `snapshot`. A field that does
/// not parse refuses the whole change; a provider key that does not open is left out and reported.
fn open_onto<'a>(
    snapshot: &Snapshot,
    version: u64,
    orgs: impl Iterator<Item = (&'a OrgId, Option<&'a OrgWire>)>,
    keys: impl Iterator<Item = (&'a KeyHash, Option<&'a KeyWire>)>,
    prices: Option<&PricesWire>,
    master_key: &MasterKey,
) -> Result<Opened, FeedError> {
    let mut unopened = Vec::new();
    let orgs = orgs
        .map(|(id, org)| {
            Ok((id.clone(), org.map(|org| org.open(id, master_key, &mut unopened)).transpose()?))
        })
        .collect::<Result<Vec<_>, FeedError>>()?;
    let prices = prices.map(PricesWire::to_prices).transpose()?;
    // Ids were parsed with the message: the keys go into the table as they are, borrowed.
    let keys = keys.map(|(hash, key)| (*hash, key.map(KeyWire::parts)));
    let snapshot = snapshot.with_changes(version, orgs, keys, prices);
    Ok(Opened { snapshot, unopened })
}

impl OrgWire {
    fn open(
        &self,
        org_id: &OrgId,
        master_key: &MasterKey,
        unopened: &mut Vec<(OrgId, String)>,
    ) -> Result<Org, FeedError> {
        let mut providers = Vec::with_capacity(self.providers.len());
        for (name, provider) in &self.providers {
            let kind = ProviderKind::parse(&provider.kind).ok_or_else(|| invalid("kind", &provider.kind))?;
            let context = provider_key_context(org_id.as_str(), name);
            let opened = crate::hex::decode(&provider.sealed_key)
                .and_then(|sealed| master_key.open(&context, &sealed).ok())
                .and_then(|plain| String::from_utf8(plain).ok());
            match opened {
                Some(api_key) => {
                    let fallback = provider
                        .fallback_price
                        .as_ref()
                        .map(|wire| {
                            Price::try_from(wire).map_err(|e| invalid("fallback_price", &e.to_string()))
                        })
                        .transpose()?;
                    let credential =
                        ProviderCredential::new(name.clone(), kind, provider.base_url.clone(), api_key)
                            .with_pricing(provider.price_namespace.as_deref(), fallback);
                    providers.push(credential);
                }
                None => unopened.push((org_id.clone(), name.clone())),
            }
        }
        let caps = self.caps.iter().map(|cap| cap.to_cap(org_id)).collect::<Result<_, _>>()?;
        Ok(Org {
            id: org_id.clone(),
            providers: providers.into(),
            caps,
            allowed_models: self.allowed_models.clone(),
            allowed_endpoints: self.allowed_endpoints.clone(),
            max_concurrent_requests: self.max_concurrent_requests,
        })
    }
}

impl KeyWire {
    fn parts(&self) -> KeyParts<'_> {
        KeyParts {
            id: &self.id,
            org: &self.org_id,
            expires_at: self.expires_at_ms.map(Timestamp),
            limits: KeyLimits {
                requests_per_minute: self.requests_per_minute,
                tokens_per_minute: self.tokens_per_minute,
            },
            allowed_models: self.allowed_models.as_ref(),
            allowed_endpoints: self.allowed_endpoints.as_ref(),
            max_concurrent_requests: self.max_concurrent_requests,
        }
    }
}

fn invalid(what: &str, value: &str) -> FeedError {
    FeedError::Invalid(format!("{what} {value:?}"))
}

impl CapWire {
    pub fn from_cap(cap: &Cap) -> Self {
        Self {
            id: cap.id.as_str().to_owned(),
            scope: cap.scope.as_str().to_owned(),
            key_id: cap.key_id.as_ref().map(|k| k.as_str().to_owned()),
            window: cap.window.as_str().to_owned(),
            limit_nanos: cap.limit.0,
            hard_stop: cap.hard_stop,
            alert_at_permille: cap.alert_at_permille.clone(),
        }
    }

    fn to_cap(&self, org_id: &OrgId) -> Result<Cap, FeedError> {
        let key_id = match &self.key_id {
            Some(id) => Some(KeyId::parse(id).ok_or_else(|| invalid("key id", id))?),
            None => None,
        };
        Ok(Cap {
            id: CapId::parse(&self.id).ok_or_else(|| invalid("cap id", &self.id))?,
            org_id: org_id.clone(),
            scope: Scope::parse(&self.scope).ok_or_else(|| invalid("scope", &self.scope))?,
            key_id,
            window: Window::parse(&self.window).ok_or_else(|| invalid("window", &self.window))?,
            limit: Nanos(self.limit_nanos),
            hard_stop: self.hard_stop,
            alert_at_permille: self.alert_at_permille.clone(),
            alert_webhook: None,
        })
    }
}

impl PricesWire {
    /// The built-in table with the overrides on top. An override that does not parse refuses the
    /// state: the control plane validated it when it was set, so it is a fault, not a price. A kind
    /// this node does not know (a newer control plane's) is passed over.
    pub fn to_prices(&self) -> Result<Prices, FeedError> {
        let overrides = self
            .overrides
            .iter()
            .map(|(model, wire)| {
                let kind = self.kinds.get(model).and_then(|kind| ProviderKind::parse(kind));
                Price::try_from(wire)
                    .map(|price| (model.clone(), kind, price))
                    .map_err(|e| FeedError::Invalid(format!("price of {model:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fallback = self
            .fallback
            .iter()
            .filter_map(|(kind, wire)| Some((ProviderKind::parse(kind)?, wire)))
            .map(|(kind, wire)| {
                Price::try_from(wire)
                    .map(|price| (kind, price))
                    .map_err(|e| FeedError::Invalid(format!("fallback price of {kind:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let table = PriceTable::builtin_with(&PriceTable::from_kinded(overrides), fallback);
        Ok(Prices { revision: self.revision, table })
    }
}

/// What a node says of itself with each poll of the feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: String,
    /// The version the node serves; `None` before it has any.
    pub version: Option<u64>,
    /// Milliseconds since the control plane last confirmed the node's state as current.
    #[serde(default)]
    pub snapshot_age_ms: Option<u64>,
    #[serde(default)]
    pub counters_confirmed_at_ms: Option<i64>,
    #[serde(default)]
    pub fail_open_total: u64,
    /// The shared counter store's clock less the node's, in milliseconds, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<i64>,
    /// How long the node is willing to wait for a change, in milliseconds.
    #[serde(default)]
    pub wait_ms: u64,
}

/// A cap's window whose spend a node asks the ledger for (its counters lost it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSpend {
    pub cap_id: String,
    pub start_ms: i64,
    pub end_ms: i64,
    /// In the answer: the window's spend in the ledger; `None` when the cap no longer exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_nanos: Option<i64>,
    /// In the answer: the latest start of a receipt the ledger held in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_start_ms: Option<i64>,
    /// The nodes whose writers in the counter store hold their receipts from a time on: those
    /// receipts are left out of the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counted: Vec<CountedSince>,
}

/// A node whose receipts that started at or after `since_ms` the counter store already holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountedSince {
    pub node_id: String,
    pub since_ms: i64,
}

/// A node's last state as it keeps it on disk, sealed under the master key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedState {
    /// When the control plane last confirmed this state as current: a node booting from it reports
    /// its age from here.
    pub confirmed_at_ms: i64,
    pub state: FeedState,
}

const SAVED_STATE_CONTEXT: &[u8] = b"recovea/saved-state/v1";

impl SavedState {
    /// The file's bytes for `state`, confirmed current at `confirmed_at`. The nonce must never
    /// repeat under one master key: pass random bytes.
    pub fn seal(
        state: &FeedState,
        confirmed_at: Timestamp,
        master_key: &MasterKey,
        nonce: [u8; NONCE_LEN],
    ) -> Vec<u8> {
        #[derive(Serialize)]
        struct Saving<'a> {
            confirmed_at_ms: i64,
            state: &'a FeedState,
        }
        let plain =
            serde_json::to_vec(&Saving { confirmed_at_ms: confirmed_at.0, state }).unwrap_or_default();
        master_key.seal(nonce, SAVED_STATE_CONTEXT, &plain)
    }

    /// `None` when the bytes do not open under this master key or do not hold a state.
    pub fn open(master_key: &MasterKey, sealed: &[u8]) -> Option<Self> {
        let plain = master_key.open(SAVED_STATE_CONTEXT, sealed).ok()?;
        serde_json::from_slice(&plain).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn master_key() -> MasterKey {
        MasterKey::from_bytes([7; 32])
    }

    fn provider(org: &str, name: &str, api_key: &str) -> ProviderWire {
        let sealed = master_key().seal([1; NONCE_LEN], &provider_key_context(org, name), api_key.as_bytes());
        ProviderWire {
            kind: "openai".into(),
            base_url: None,
            sealed_key: crate::hex::encode(&sealed),
            price_namespace: None,
            fallback_price: None,
        }
    }

    fn org_id(id: &str) -> OrgId {
        OrgId::parse(id).expect("a valid organization id")
    }

    fn key(id: &str, org: &str) -> KeyWire {
        KeyWire {
            id: KeyId::parse(id).expect("a valid key id"),
            org_id: org_id(org),
            expires_at_ms: None,
            requests_per_minute: None,
            tokens_per_minute: None,
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        }
    }

    fn models(patterns: &[&str]) -> ModelAllowlist {
        ModelAllowlist::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).expect("valid")
    }

    fn state() -> FeedState {
        let mut org = OrgWire::default();
        org.providers.insert("openai".into(), provider("org_a", "openai", "sk-secret-a"));
        org.caps.push(CapWire {
            id: "cap_1".into(),
            scope: "organization".into(),
            key_id: None,
            window: "month".into(),
            limit_nanos: 5_000_000_000,
            hard_stop: true,
            alert_at_permille: vec![500],
        });
        let mut state = FeedState { version: 3, ..FeedState::default() };
        state.orgs.insert(org_id("org_a"), org);
        state.keys.insert(crate::keys::hash_secret("rk_one"), key("key_1", "org_a"));
        state
    }

    #[test]
    fn opens_into_a_snapshot_with_the_provider_key_in_clear() {
        let opened = state().open(&master_key()).expect("opens");
        assert!(opened.unopened.is_empty());
        let entry = opened.snapshot.key(&crate::keys::hash_secret("rk_one")).expect("the key is served");
        assert_eq!(entry.id().as_str(), "key_1");
        assert_eq!(entry.org.provider("openai").map(|p| p.api_key.as_str()), Some("sk-secret-a"));
        assert_eq!(entry.org.caps.len(), 1);
        assert_eq!(opened.snapshot.version, 3);
    }

    #[test]
    fn a_key_sealed_for_another_place_is_left_out_not_served() {
        let mut state = state();
        let moved = provider("org_b", "openai", "sk-other");
        state.orgs.get_mut(&org_id("org_a")).expect("org").providers.insert("openai".into(), moved);
        let opened = state.open(&master_key()).expect("opens");
        assert_eq!(opened.unopened, vec![(org_id("org_a"), "openai".to_owned())]);
        let entry = opened.snapshot.key(&crate::keys::hash_secret("rk_one")).expect("the key is served");
        assert!(entry.org.provider("openai").is_none());
        assert!(state.open(&MasterKey::from_bytes([8; 32])).expect("opens").unopened.len() == 1);
    }

    #[test]
    fn a_malformed_field_refuses_the_whole_state() {
        let mut state = state();
        state.orgs.get_mut(&org_id("org_a")).expect("org").caps[0].window = "fortnight".into();
        assert!(matches!(state.open(&master_key()), Err(FeedError::Invalid(_))));
    }

    #[test]
    fn changes_apply_only_to_their_version() {
        let old = state();
        let mut new = old.clone();
        new.version = 4;
        new.keys.clear();
        let changes = new.changes_since(&old);
        let mut stale = old.clone();
        stale.version = 2;
        assert_eq!(stale.apply(changes.clone()), Err(FeedError::VersionMismatch { held: 2, from: 3 }));
        let mut current = old;
        current.apply(changes).expect("applies");
        assert_eq!(current, new);
    }

    #[test]
    fn the_wire_form_round_trips_through_json() {
        let message = FeedMessage::State(state());
        let text = serde_json::to_string(&message).expect("serializes");
        assert!(text.starts_with(r#"{"kind":"state""#), "{text}");
        assert!(!text.contains("sk-secret-a"), "provider keys travel sealed");
        assert_eq!(serde_json::from_str::<FeedMessage>(&text).expect("parses"), message);
        assert_eq!(state().message_json(), text.as_bytes(), "the borrowed form is the same message");
    }

    #[test]
    fn the_wire_form_is_the_one_nodes_and_control_planes_of_this_version_speak() {
        let mut state = state();
        state.orgs.get_mut(&org_id("org_a")).expect("org").providers.clear();
        state.keys.values_mut().for_each(|key| key.expires_at_ms = Some(7));
        state.orgs.insert(org_id("org_B"), OrgWire::default());
        let text = String::from_utf8(state.message_json()).expect("utf-8");
        assert_eq!(
            text,
            concat!(
                r#"{"kind":"state","version":3,"orgs":{"org_B":{"providers":{},"caps":[]},"org_a":{"providers":{},"#,
                r#""caps":[{"id":"cap_1","scope":"organization","window":"month","limit_nanos":5000000000,"#,
                r#""hard_stop":true,"alert_at_permille":[500]}]}},"keys":{"#,
                r#""74c61eca06c039ca7b2e15b22aea5ea5bbad5b7553d5ac9bd987364f095cecde":"#,
                r#"{"id":"key_1","org_id":"org_a","expires_at_ms":7}},"prices":{"revision":0,"overrides":{}}}"#
            )
        );
    }

    #[test]
    fn an_id_that_does_not_parse_refuses_the_whole_message() {
        let text = serde_json::to_string(&FeedMessage::State(state())).expect("serializes");
        assert!(serde_json::from_str::<FeedMessage>(&text).is_ok());
        for (good, bad) in
            [(r#""key_1""#, r#""kex_1""#), (r#""org_a""#, r#""org_""#), (r#""org_a""#, r#""org_a/""#)]
        {
            let changed = text.replacen(good, bad, 1);
            assert_ne!(changed, text);
            assert!(serde_json::from_str::<FeedMessage>(&changed).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_saved_state_opens_only_under_its_master_key() {
        let saved = SavedState { confirmed_at_ms: 1_700_000_000_000, state: state() };
        let bytes =
            SavedState::seal(&saved.state, Timestamp(saved.confirmed_at_ms), &master_key(), [3; NONCE_LEN]);
        assert_eq!(SavedState::open(&master_key(), &bytes), Some(saved));
        assert_eq!(SavedState::open(&MasterKey::from_bytes([8; 32]), &bytes), None);
        assert_eq!(SavedState::open(&master_key(), &bytes[..bytes.len() - 1]), None);
    }

    /// What a snapshot serves, in a comparable form.
    fn describe(snapshot: &Snapshot) -> String {
        let mut orgs: Vec<String> = snapshot
            .orgs()
            .map(|org| {
                let caps: Vec<String> =
                    org.caps.iter().map(|c| format!("{}:{}:{}", c.id, c.limit.0, c.hard_stop)).collect();
                let mut providers: Vec<&String> = org.providers.iter().map(|p| &p.name).collect();
                providers.sort();
                format!(
                    "{} {caps:?} {providers:?} {:?} {:?} {:?}",
                    org.id, org.allowed_models, org.allowed_endpoints, org.max_concurrent_requests
                )
            })
            .collect();
        orgs.sort();
        let mut keys: Vec<String> = (0u8..12)
            .filter_map(|n| {
                let entry = snapshot.key(&KeyHash([n; 32]))?;
                let caps: Vec<i64> = entry.org.caps.iter().map(|c| c.limit.0).collect();
                Some(format!(
                    "{n} {} {} {:?} {caps:?} {:?} {:?} {:?}",
                    entry.id(),
                    entry.org.id,
                    entry.limits,
                    entry.allowed_models,
                    entry.allowed_endpoints,
                    entry.max_concurrent_requests
                ))
            })
            .collect();
        keys.sort();
        format!(
            "v{} p{} orgs {orgs:?} keys {keys:?} count {}",
            snapshot.version,
            snapshot.prices().revision,
            snapshot.key_count()
        )
    }

    fn arbitrary_state() -> impl Strategy<Value = FeedState> {
        let org_ids = prop::sample::select(vec!["org_a", "org_b", "org_c"]);
        let keys = prop::collection::hash_map(
            prop::sample::select((0u8..12).collect::<Vec<_>>()),
            (org_ids.clone(), prop::option::of(1u32..100), prop::option::of(0usize..3)),
            0..8,
        );
        let orgs = prop::collection::btree_map(
            org_ids,
            (0i64..10, any::<bool>(), prop::option::of(0usize..3)),
            0..3,
        );
        let lists = [models(&[]), models(&["gpt-*"]), models(&["gpt-4o", "claude-*"])];
        let path = |p: &[&str]| {
            EndpointAllowlist::parse(p.iter().map(|m| (*m).to_owned()).collect()).expect("valid")
        };
        let paths = [path(&[]), path(&["/v1/*"]), path(&["/v1/chat/completions", "/openai/*"])];
        (1u64..50, orgs, keys, 0u64..3).prop_map(move |(version, orgs, keys, revision)| FeedState {
            version,
            // The control plane never feeds a key of an organization it does not feed.
            keys: keys
                .into_iter()
                .filter(|(_, (org, _, _))| orgs.contains_key(*org))
                .map(|(n, (org, rpm, list))| {
                    let mut wire = key(&format!("key_{n}"), org);
                    wire.requests_per_minute = rpm;
                    wire.allowed_models = list.map(|i| lists[i].clone());
                    wire.allowed_endpoints = list.map(|i| paths[i].clone());
                    wire.max_concurrent_requests = rpm.map(|n| n % 4);
                    (KeyHash([n; 32]), wire)
                })
                .collect(),
            orgs: orgs
                .into_iter()
                .map(|(id, (limit, hard_stop, list))| {
                    let cap = CapWire {
                        id: "cap_x".into(),
                        scope: "organization".into(),
                        key_id: None,
                        window: "day".into(),
                        limit_nanos: limit,
                        hard_stop,
                        alert_at_permille: Vec::new(),
                    };
                    let org = OrgWire {
                        providers: BTreeMap::new(),
                        caps: vec![cap],
                        allowed_models: list.map(|i| lists[i].clone()),
                        allowed_endpoints: list.map(|i| paths[(i + 1) % 3].clone()),
                        max_concurrent_requests: hard_stop.then_some(limit as u32),
                    };
                    (org_id(id), org)
                })
                .collect(),
            prices: PricesWire { revision, ..PricesWire::default() },
        })
    }

    proptest! {
        #[test]
        fn applying_the_changes_between_two_states_yields_the_newer(
            old in arbitrary_state(),
            new in arbitrary_state(),
        ) {
            let changes = new.changes_since(&old);
            let mut applied = old.clone();
            applied.apply(changes.clone()).expect("changes made for this version apply");
            prop_assert_eq!(&applied, &new);
            let text = serde_json::to_string(&FeedMessage::Changes(changes.clone())).expect("serializes");
            prop_assert_eq!(
                serde_json::from_str::<FeedMessage>(&text).expect("parses"),
                FeedMessage::Changes(changes.clone())
            );
        }

        #[test]
        fn changes_opened_onto_the_old_snapshot_equal_the_new_state_opened_whole(
            old in arbitrary_state(),
            new in arbitrary_state(),
        ) {
            let changes = new.changes_since(&old);
            let before = old.open(&master_key()).expect("opens").snapshot;
            let incremental = changes.open_onto(&before, &master_key()).expect("opens").snapshot;
            let whole = new.open(&master_key()).expect("opens").snapshot;
            prop_assert_eq!(describe(&incremental), describe(&whole));
        }

        #[test]
        fn merged_changes_equal_their_steps(a in arbitrary_state(), b in arbitrary_state(), c in arbitrary_state()) {
            let mut b = b;
            b.version = a.version + 1;
            let mut c = c;
            c.version = b.version + 1;
            let merged = b.changes_since(&a).then(c.changes_since(&b));
            let mut applied = a.clone();
            applied.apply(merged).expect("merged changes apply to the first version");
            prop_assert_eq!(applied, c);
        }
    }
}
