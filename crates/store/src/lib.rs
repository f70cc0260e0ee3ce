//! The control store: organizations, keys (as hashes) and sealed provider credentials, behind one
//! trait so that SQLite and PostgreSQL serve the same control plane.
//!
//! **Invariant:** the store never sees a key secret or an opened provider key; it holds hashes and
//! sealed bytes only. It knows nothing of HTTP.

pub mod audit;
pub mod postgres;
mod rows;
pub mod sqlite;

use recovea_core::caps::Cap;
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::keys::KeyHash;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::org_tokens::OrgRole;
use recovea_core::pricing::PriceWire;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;

pub use audit::{AuditActor, AuditAuth, AuditContext, AuditEntry, AuditQuery};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

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
    fn columns(&self) -> (&'static str, &str) {
        match self {
            Self::Model(model) => ("model", model),
            Self::Fallback(kind) => ("fallback", kind.as_str()),
        }
    }

    fn from_columns(target: &str, name: String) -> Option<PriceTarget> {
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

/// A deferred job (a batch, a background response) as the control plane keeps it: pending until
/// it is settled, once, from the provider's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    pub org_id: OrgId,
    /// The credential it went through, whose provider account runs it.
    pub provider: String,
    /// The provider's id (`batch_...`, `msgbatch_...`, `resp_...`, `batches/...`).
    pub job_id: String,
    pub key_id: KeyId,
    pub kind: recovea_core::channel::JobKind,
    /// The path it was created at, such as `/v1/batches`: its settlement receipts' endpoint.
    pub endpoint: String,
    /// The model its creating request named, if it named one.
    pub model: Option<String>,
    /// The request that created it (its receipt id follows from it).
    pub request_id: String,
    /// When that request started: the windows its hold and its cost count in.
    pub started_at: Timestamp,
    /// The estimate held on every cap covering it while it is pending.
    pub held: Nanos,
    /// Set once, when it is settled; its cost with it.
    pub settled_at: Option<Timestamp>,
    pub cost: Option<Nanos>,
    /// How many times it was polled, and when it is next due.
    pub polls: u32,
    pub next_poll_at: Timestamp,
    /// Why the last poll failed, for operators (never a secret: the poller writes it).
    pub last_error: Option<String>,
}

/// A batch input file uploaded through a node, and the estimate of its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub org_id: OrgId,
    pub provider: String,
    pub file_id: String,
    pub created_at: Timestamp,
    pub input: recovea_core::jobs::BatchInput,
}

/// What the control plane's book of jobs is built from, read in one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BookRows {
    /// Pending jobs, and jobs settled at or after the `settled_since` asked for.
    pub jobs: Vec<JobRecord>,
    /// Files created at or after the `files_since` asked for.
    pub files: Vec<FileRecord>,
    /// Settled jobs' cost by organization, key and UTC day (days since 1970-01-01) of their
    /// creation, from the `first_day` asked for on; days without any left out.
    pub spend: Vec<(OrgId, KeyId, i64, Nanos)>,
}

/// The control plane's jobs: recorded from the receipts of the requests that created them,
/// polled, and settled once. Every change bumps [`JobStore::jobs_version`].
pub trait JobStore: Send + Sync + 'static {
    /// Records these jobs and files, each once: a job or file already recorded (same
    /// organization, credential and id) keeps its first record. Whether any was new.
    fn record_jobs(&self, jobs: &[JobRecord], files: &[FileRecord]) -> Result<bool>;
    /// Grows with every change to jobs or files: cheap enough to poll.
    fn jobs_version(&self) -> Result<u64>;
    /// The book's rows (see [`BookRows`]).
    fn job_book(&self, settled_since: Timestamp, files_since: Timestamp, first_day: i64) -> Result<BookRows>;
    /// Records what a poll of a pending job learned without settling it: how many polls it has
    /// had, when it is next due, and why the last one failed (`None`: it did not, the job is still
    /// running). For operators and for a poller that takes over: the poller schedules in memory
    /// and writes this only when a poll failed or recovers. No version bump (the book does not
    /// show polls). `NotFound` for an unknown job.
    fn job_polled(&self, poll: &JobPoll<'_>) -> Result<()>;
    /// Takes or renews the lease of the job poller for `holder` until `until`: granted when no
    /// other holder's lease runs past `now`. Only the holder polls, so that each credential is
    /// polled at the poller's rate however many control planes share the store.
    fn poller_lease(&self, holder: &str, now: Timestamp, until: Timestamp) -> Result<bool>;
    /// Settles a pending job at `cost`, inserting its settlement `receipts` into the ledger in the
    /// same transaction (idempotently, as `insert_receipts` does). `false`, and nothing written,
    /// when the job is already settled; `NotFound` when there is no such job.
    fn settle_job(
        &self,
        org: &OrgId,
        provider: &str,
        job_id: &str,
        cost: Nanos,
        at: Timestamp,
        receipts: &[SerializedReceipt],
    ) -> Result<bool>;
    /// One job, if recorded.
    fn job(&self, org: &OrgId, provider: &str, job_id: &str) -> Result<Option<JobRecord>>;
    /// An organization's jobs, newest first (by `started_at`, then id), at most `limit`.
    fn jobs(&self, org: &OrgId, limit: u32) -> Result<Vec<JobRecord>>;
    /// The spend in `[from, to)` of an organization (or one of its keys) that the spend counters
    /// hold and their writers do not: every receipt's cost but jobs' settlements (which the book
    /// of jobs holds) and each `counted` node's receipts that started at or after its time (which
    /// its writers hold), read in one transaction with the jobs. What a counter window is rebuilt
    /// from.
    fn counted_spend(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend>;
}

/// What [`JobStore::counted_spend`] and [`ReceiptLedger::spend_uncounted`] read, in one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UncountedSpend {
    pub spend: Nanos,
    /// The latest start of a receipt in `[from, to)`, counted or not: no receipt that started
    /// after it is in `spend`. `None`: the window has no receipt yet.
    pub last_start: Option<Timestamp>,
}

/// A poll of one pending job, as [`JobStore::job_polled`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobPoll<'a> {
    pub org_id: &'a OrgId,
    pub provider: &'a str,
    pub job_id: &'a str,
    pub polls: u32,
    pub next_poll_at: Timestamp,
    pub error: Option<&'a str>,
}

/// Which receipts to read, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptQuery {
    pub org_id: OrgId,
    /// `started_at` at or after this.
    pub from: Option<Timestamp>,
    /// `started_at` before this.
    pub to: Option<Timestamp>,
    pub key_id: Option<KeyId>,
    /// Only receipts of this model (`None` there: any).
    pub model: Option<String>,
    /// Only receipts with this HTTP status.
    pub status: Option<u16>,
    /// Only receipts whose usage came from here (`Estimated`: the provider reported none).
    pub usage_source: Option<recovea_core::usage::UsageSource>,
    /// Only receipts whose provider was paid with this key (`managed` or the `client`'s own).
    pub provider_key: Option<recovea_core::receipt::ProviderKey>,
    pub limit: u32,
    /// Continue after this receipt: its `started_at` and id.
    pub after: Option<(Timestamp, String)>,
    /// Only receipts tagged with this key and value.
    pub tag: Option<(String, String)>,
}

/// One row of the spend summary by tag: what the receipts with one value of a tag key (`None`:
/// without that key) spent on one (UTC) day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagSpendRow {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub value: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Nanos,
}

/// One row of the spend summary: what a key spent on a model on one (UTC) day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendRow {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub key_id: String,
    pub model: Option<String>,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: Nanos,
}

/// The receipt ledger: the source of truth for spend. Inserts are idempotent by receipt id.
pub trait ReceiptLedger: Send + Sync + 'static {
    /// Inserts the receipts not already present, each with its JSON text as it came; returns how
    /// many were new.
    fn insert_receipts(&self, receipts: &[SerializedReceipt]) -> Result<usize>;
    fn receipts(&self, query: &ReceiptQuery) -> Result<Vec<Receipt>>;
    /// The organization's receipt with this id, if any (another organization's is `None`).
    fn receipt(&self, org: &OrgId, id: &str) -> Result<Option<Receipt>>;
    /// Spend by day, key and model; only `key`'s rows when given.
    fn spend_summary(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
    ) -> Result<Vec<SpendRow>>;
    /// The spend summary by the values of the tag `key`, by day and value (untagged receipts under
    /// `None`, first), from `[from, to)`, of one key's receipts when `key_id` is given.
    fn spend_by_tag(
        &self,
        org: &OrgId,
        key_id: Option<&KeyId>,
        from: Option<Timestamp>,
        to: Option<Timestamp>,
        key: &str,
    ) -> Result<Vec<TagSpendRow>>;
    /// The spend of an organization (or one of its keys) in `[from, to)`: the sum of its receipts' costs.
    fn spend(&self, org: &OrgId, key: Option<&KeyId>, from: Timestamp, to: Timestamp) -> Result<Nanos>;
    /// [`spend`](Self::spend) less each `counted` node's receipts that started at or after its
    /// time, in one read (see [`JobStore::counted_spend`]).
    fn spend_uncounted(
        &self,
        org: &OrgId,
        key: Option<&KeyId>,
        from: Timestamp,
        to: Timestamp,
        counted: &[(&str, Timestamp)],
    ) -> Result<UncountedSpend>;
}
