//! The records of the control store: what each admin change writes and each read gives back.

use recovea_core::caps::Cap;
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::org_tokens::OrgRole;
use recovea_core::pricing::PriceWire;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;

/// What an operator's price applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PriceTarget {
    /// A model, by the name requests give.
    Model(String),
    /// The price of the models of a provider kind that no entry prices.
    Fallback(ProviderKind),
}

impl PriceTarget {
    /// The two columns a price row is keyed by: `model` or `fallback`, and the name or kind. Kept
    /// apart so that no model name (which may hold any character) can be taken for a fallback.
    pub(crate) fn columns(&self) -> (&'static str, &str) {
        match self {
            Self::Model(model) => ("model", model),
            Self::Fallback(kind) => ("fallback", kind.as_str()),
        }
    }

    pub(crate) fn from_columns(target: &str, name: String) -> Option<PriceTarget> {
        match target {
            "model" => Some(Self::Model(name)),
            "fallback" => ProviderKind::parse(&name).map(Self::Fallback),
            _ => None,
        }
    }
}

/// An operator's price in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceOverride {
    pub target: PriceTarget,
    /// The provider kind given with a model's price, if one was.
    pub kind: Option<ProviderKind>,
    pub price: PriceWire,
    /// The price table revision that set it.
    pub revision: u64,
    pub set_at: Timestamp,
}

/// One change of a price table revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceChange {
    pub target: PriceTarget,
    pub kind: Option<ProviderKind>,
    /// `None` removes the operator's price: the built-in price (or the computed fallback) is back.
    pub price: Option<PriceWire>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgRecord {
    pub id: OrgId,
    pub name: String,
    pub created_at: Timestamp,
    /// The models the organization's keys may use; `None`: every model.
    pub allowed_models: Option<ModelAllowlist>,
    /// The endpoints the organization's keys may call; `None`: every endpoint.
    pub allowed_endpoints: Option<EndpointAllowlist>,
    /// The most requests of its keys in flight at once on a node; `None`: no limit.
    pub max_concurrent_requests: Option<u32>,
}

impl OrgRecord {
    pub fn rules(&self) -> AccessRules {
        AccessRules {
            allowed_models: self.allowed_models.clone(),
            allowed_endpoints: self.allowed_endpoints.clone(),
            max_concurrent_requests: self.max_concurrent_requests,
        }
    }
}

/// What a key or an organization may do beyond its caps and rate limits (each `None`: no rule),
/// set together by one admin change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AccessRules {
    pub allowed_models: Option<ModelAllowlist>,
    pub allowed_endpoints: Option<EndpointAllowlist>,
    pub max_concurrent_requests: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: KeyId,
    pub org_id: OrgId,
    pub name: String,
    pub prefix: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
    pub limits: KeyLimits,
    /// The models the key may use; `None`: every model its organization allows.
    pub allowed_models: Option<ModelAllowlist>,
    /// The endpoints the key may call; `None`: every endpoint its organization allows.
    pub allowed_endpoints: Option<EndpointAllowlist>,
    /// The most requests of the key in flight at once on a node; `None`: no limit of its own.
    pub max_concurrent_requests: Option<u32>,
}

impl KeyRecord {
    pub fn rules(&self) -> AccessRules {
        AccessRules {
            allowed_models: self.allowed_models.clone(),
            allowed_endpoints: self.allowed_endpoints.clone(),
            max_concurrent_requests: self.max_concurrent_requests,
        }
    }
}

/// A key that is not revoked, as nodes serve it. Nothing of it is only the admin API's (name,
/// prefix, creation time): a state holds millions of these, read whole on every change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveKey {
    pub id: KeyId,
    /// Shared with the organization's id in [`State::orgs`], not one copy per key.
    pub org_id: OrgId,
    pub hash: KeyHash,
    pub expires_at: Option<Timestamp>,
    pub limits: KeyLimits,
    pub allowed_models: Option<ModelAllowlist>,
    pub allowed_endpoints: Option<EndpointAllowlist>,
    pub max_concurrent_requests: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderRecord {
    pub org_id: OrgId,
    pub name: String,
    pub kind: ProviderKind,
    /// `None`: the node's default for the kind.
    pub base_url: Option<String>,
    /// The provider key sealed under the master key.
    pub sealed_key: Vec<u8>,
    pub key_hint: String,
    pub updated_at: Timestamp,
    /// The price namespace its models resolve in first; `None`: its name's, if the table has one.
    pub price_namespace: Option<String>,
    /// Its own fallback price per million input and output tokens, for models no entry prices
    /// (both or neither).
    pub fallback_price: Option<(Nanos, Nanos)>,
}

impl ProviderRecord {
    /// Its own fallback price, if it carries one.
    pub fn fallback(&self) -> Option<recovea_core::pricing::Price> {
        self.fallback_price.map(|(input, output)| recovea_core::pricing::Price::per_mtok(input, output))
    }

    /// Where its requests are priced.
    pub fn scope(&self) -> recovea_core::pricing::PriceScope {
        recovea_core::pricing::PriceScope::of_credential(
            self.kind,
            &self.name,
            self.price_namespace.as_deref(),
            self.fallback(),
        )
    }
}

/// Everything a snapshot is built from, read in one consistent transaction.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Grows with every change, so that readers can tell whether they hold the latest state.
    pub version: u64,
    pub orgs: Vec<OrgRecord>,
    /// Keys that are not revoked, with the hash admission looks them up by.
    pub active_keys: Vec<ActiveKey>,
    pub providers: Vec<ProviderRecord>,
    /// The latest price table revision (0: no override was ever made).
    pub price_revision: u64,
    /// The operators' prices in force: for each model and fallback they priced and did not remove
    /// since, the latest revision. Fallbacks first, then models, each by name.
    pub price_overrides: Vec<PriceOverride>,
    pub caps: Vec<CapRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapRecord {
    pub cap: Cap,
    pub created_at: Timestamp,
}

/// A threshold of a cap crossed in one window: raised once per (cap, window, threshold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRecord {
    pub id: String,
    pub cap_id: CapId,
    pub org_id: OrgId,
    pub window_start: Timestamp,
    pub threshold_permille: u32,
    pub spend: Nanos,
    pub limit: Nanos,
    pub raised_at: Timestamp,
    pub delivered_at: Option<Timestamp>,
    pub attempts: u32,
}

/// What a node last reported to a control plane, kept in the store so that every replica lists
/// every node, whichever replica it polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: String,
    /// The state version the node serves; `None` before it has any.
    pub feed_version: Option<u64>,
    /// The age of its state when it reported, in milliseconds.
    pub snapshot_age_ms: Option<u64>,
    pub counters_confirmed_at: Option<Timestamp>,
    pub fail_open_total: u64,
    pub seen_at: Timestamp,
    /// The shared counter store's clock less the node's, in milliseconds, as the node measured it.
    pub clock_offset_ms: Option<i64>,
    /// What the node presented with its report: `None` when it reported before credentials were
    /// recorded.
    pub credential: Option<PresentedCredential>,
}

/// What a node presented to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresentedCredential {
    /// The shared `--node-token`.
    Shared,
    /// Its own node credential, by id, and its name when presented.
    Own { id: NodeCredentialId, name: String },
}

/// A credential one node presents to the control plane instead of the shared node token. Its
/// token is never stored, only its hash; revoked, it is refused at once by every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCredentialRecord {
    pub id: NodeCredentialId,
    pub name: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

/// An organization token: a bearer of the admin API that reaches its organization alone, with
/// its role. Its secret is never stored, only its hash; revoked, it is refused at once by every
/// replica (nothing caches it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgTokenRecord {
    pub id: OrgTokenId,
    pub org_id: OrgId,
    pub name: String,
    pub role: OrgRole,
    /// The secret's first characters, so that people can tell their tokens apart.
    pub prefix: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}
