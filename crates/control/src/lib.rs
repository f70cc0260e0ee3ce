//! The control plane: the admin API over the control store, and the snapshots it publishes to the
//! serving node(s) after every change.
//!
//! **Invariant:** the control plane is never on the request path. Nodes decide from the snapshot it
//! publishes; if it stops, they keep serving what they last received.

mod admin;
pub mod alerts;
mod attempts;
mod bounded;
pub mod client;
mod console;
mod error;
mod feed;
pub mod ingest;
pub mod jobs;
mod node_api;
pub mod oidc;
pub mod principal;
pub mod random;
pub mod rebuild;
mod server;
mod snapshot;

use std::sync::Arc;

use recovea_core::crypto::MasterKey;
use recovea_core::feed::FeedState;
use recovea_core::receipt::ReceiptSink;
use recovea_core::snapshot::Prices;
use recovea_store::{ControlStore, ReceiptLedger};

pub use admin::requests;
pub use bounded::DEFAULT_STORE_LIMIT;
pub use error::ApiError;
pub use server::serve;
pub use snapshot::feed_state;

/// Receives every new state besides the feed, and word that the published one is still current; in
/// `recovea serve` it installs the state straight into the gateway in the same process.
pub type Publish = Arc<dyn Fn(Publication) + Send + Sync>;

pub enum Publication {
    State(Arc<FeedState>),
    /// The store was read and holds nothing newer than the state last published.
    Current,
}

#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ControlStore>,
    ledger: Arc<dyn ReceiptLedger>,
    /// The serving node's counters, when they are in this process: the spend report compares them
    /// with the ledger.
    counters: std::sync::OnceLock<Arc<recovea_counters::Counters>>,
    /// The prices of the last published snapshot and the revision of each operator's price, for
    /// `GET /prices`.
    prices: std::sync::Mutex<(Prices, std::collections::HashMap<recovea_store::PriceTarget, u64>)>,
    master_key: MasterKey,
    /// Compared as hashes, so the comparison takes the same time whatever the presented token.
    admin_token_hash: recovea_core::keys::KeyHash,
    publish: Publish,
    feed: feed::Feed,
    metrics: Metrics,
    /// When each node's report was last stored, the version it reported then and the credential it
    /// presented.
    node_reports: std::sync::Mutex<std::collections::HashMap<String, NodeReported>>,
    /// A state was published at least once: the control plane is ready while its store answers.
    loaded: std::sync::atomic::AtomicBool,
    /// The store answered the last look at it (`keep_published`'s, or a call's): cleared by a call
    /// that found it unavailable, set again by the next look that succeeds.
    store_answers: std::sync::atomic::AtomicBool,
    /// How long a store call may take before it is answered `503` (see [`bounded`]).
    store_limit: std::sync::OnceLock<std::time::Duration>,
    /// Set when nodes are served: the feed and receipt ingest then answer those who present it.
    nodes: std::sync::OnceLock<NodeAccess>,
    /// The version last published; the lock serialises rebuilds so that an older state is never
    /// published after a newer one.
    published: tokio::sync::Mutex<Option<u64>>,
    /// The signed-in sessions of the web console.
    console_sessions: console::Sessions,
    /// Wrong admin tokens by client address, from the API and the console's sign-in.
    wrong_tokens: attempts::Attempts,
    /// Logins started through single sign-on, by client address.
    sign_on_starts: attempts::Attempts,
    /// Deferred jobs: their book and its store, when this control plane keeps them.
    jobs: std::sync::OnceLock<Arc<jobs::Jobs>>,
    /// The organization of keys whose receipts were ingested (see [`node_api::KeyOwners`]).
    key_owners: node_api::KeyOwners,
    /// Single sign-on through an OpenID Connect provider, when one is configured.
    sign_on: std::sync::OnceLock<Arc<oidc::SignOn>>,
}

/// When a node's report was last stored, its version then and the credential it presented.
type NodeReported = (std::time::Instant, Option<u64>, recovea_store::PresentedCredential);

/// What `/metrics` counts besides the feed's version.
#[derive(Default)]
struct Metrics {
    polls: std::sync::atomic::AtomicU64,
    receipts: std::sync::atomic::AtomicU64,
    /// Polls of deferred jobs made, those that failed, and the jobs settled.
    job_polls: std::sync::atomic::AtomicU64,
    job_poll_errors: std::sync::atomic::AtomicU64,
    jobs_settled: std::sync::atomic::AtomicU64,
}

/// How nodes are let in and where their receipts go.
struct NodeAccess {
    /// The shared node token's hash, if one is set; compared as hashes, like the admin token.
    /// Node credentials are looked up in the store.
    shared_token_hash: Option<recovea_core::keys::KeyHash>,
    sink: Arc<dyn ReceiptSink>,
}

impl Control {
    pub fn new(
        store: Arc<dyn ControlStore>,
        ledger: Arc<dyn ReceiptLedger>,
        master_key: MasterKey,
        admin_token: &str,
        publish: Publish,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                ledger,
                counters: std::sync::OnceLock::new(),
                prices: std::sync::Mutex::new((Prices::default(), std::collections::HashMap::new())),
                master_key,
                admin_token_hash: recovea_core::keys::hash_secret(admin_token),
                publish,
                feed: feed::Feed::new(),
                metrics: Metrics::default(),
                loaded: std::sync::atomic::AtomicBool::new(false),
                store_answers: std::sync::atomic::AtomicBool::new(true),
                store_limit: std::sync::OnceLock::new(),
                node_reports: std::sync::Mutex::new(std::collections::HashMap::new()),
                nodes: std::sync::OnceLock::new(),
                published: tokio::sync::Mutex::new(None),
                console_sessions: console::Sessions::default(),
                wrong_tokens: attempts::Attempts::per_minute(attempts::WRONG_TOKENS_PER_MINUTE),
                sign_on_starts: attempts::Attempts::per_minute(attempts::SIGN_ON_STARTS_PER_MINUTE),
                jobs: std::sync::OnceLock::new(),
                key_owners: node_api::KeyOwners::default(),
                sign_on: std::sync::OnceLock::new(),
            }),
        }
    }

    /// A store call that takes longer than `limit` is answered `503` at once (the database is
    /// frozen or unreachable); [`DEFAULT_STORE_LIMIT`] unless set.
    pub fn with_store_limit(self, limit: std::time::Duration) -> Self {
        let _ = self.inner.store_limit.set(limit);
        self
    }

    fn store_limit(&self) -> std::time::Duration {
        self.inner.store_limit.get().copied().unwrap_or(DEFAULT_STORE_LIMIT)
    }

    /// Runs a store call off the async workers, within the store limit; a call that finds the
    /// store unavailable marks the control plane not ready until the store answers again.
    pub(crate) async fn off_thread<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> recovea_store::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let answer = bounded::off_thread(self.store_limit(), work).await;
        if let Err(recovea_store::StoreError::Unavailable(_)) = &answer {
            self.inner.store_answers.store(false, std::sync::atomic::Ordering::Release);
        }
        Ok(answer?)
    }

    /// Whether the control plane can do its work: a state is published and its store answers.
    pub fn is_ready(&self) -> bool {
        self.inner.loaded.load(std::sync::atomic::Ordering::Acquire)
            && self.inner.store_answers.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The counters of the node in this process: a new cap's window is seeded from the ledger
    /// before the cap is published, and the spend report reconciles them with the ledger.
    pub fn reconcile_with(&self, counters: Arc<recovea_counters::Counters>) {
        let _ = self.inner.counters.set(counters);
    }

    /// Keeps deferred jobs in `jobs`: its book is followed by nodes and shows in the spend report.
    pub fn with_jobs(self, jobs: Arc<jobs::Jobs>) -> Self {
        let _ = self.inner.jobs.set(jobs);
        self
    }

    /// Signs people in to the console through `sign_on`'s provider.
    pub fn with_sign_on(self, sign_on: Arc<oidc::SignOn>) -> Self {
        let _ = self.inner.sign_on.set(sign_on);
        self
    }

    /// Single sign-on, when it is configured.
    pub fn sign_on(&self) -> Option<&Arc<oidc::SignOn>> {
        self.inner.sign_on.get()
    }

    /// Where counter windows are rebuilt from.
    pub fn spend_sources(&self) -> rebuild::SpendSources {
        rebuild::SpendSources {
            store: Arc::clone(&self.inner.store),
            ledger: Arc::clone(&self.inner.ledger),
            jobs: self.inner.jobs.get().map(|jobs| Arc::clone(jobs.store())),
        }
    }

    /// Serves nodes: the feed, and receipt ingest into `sink`, to those presenting a node
    /// credential's token, or the shared `node_token` when one is given.
    pub fn serve_nodes(&self, node_token: Option<&str>, sink: Arc<dyn ReceiptSink>) {
        let access = NodeAccess { shared_token_hash: node_token.map(recovea_core::keys::hash_secret), sink };
        let _ = self.inner.nodes.set(access);
    }

    /// Rebuilds the feed state from the store and publishes it, unless it is already out.
    pub async fn publish_latest(&self) -> Result<(), ApiError> {
        let mut published = self.inner.published.lock().await;
        let store = Arc::clone(&self.inner.store);
        let held = *published;
        // Reading a store of a million keys and building a state (and, in `serve`, the snapshot)
        // from it takes seconds of CPU: off the async workers, which serve requests in `serve`.
        // One thread does all of it, so that the snapshot is allocated where the rows it was built
        // from were just freed, rather than beside another thread's garbage.
        let control = self.clone();
        let version = self
            .off_thread(move || -> recovea_store::Result<Option<u64>> {
                let state = store.state()?;
                if held.is_some_and(|version| state.version <= version) {
                    return Ok(None);
                }
                let version = state.version;
                let feed = Arc::new(feed_state(&state));
                let revisions =
                    state.price_overrides.iter().map(|set| (set.target.clone(), set.revision)).collect();
                drop(state);
                match feed.prices.to_prices() {
                    Ok(prices) => {
                        *control.inner.prices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                            (prices, revisions);
                    }
                    Err(e) => tracing::error!(error = %e, "the published prices do not parse"),
                }
                // The feed keeps the state (and its recent changes) only when nodes follow it: in
                // `serve` the node in this process gets it in memory and nothing else holds it.
                if control.inner.nodes.get().is_some() {
                    control.inner.feed.publish(Arc::clone(&feed));
                }
                (control.inner.publish)(Publication::State(feed));
                Ok(Some(version))
            })
            .await?;
        let Some(version) = version else { return Ok(()) };
        self.inner.loaded.store(true, std::sync::atomic::Ordering::Release);
        *published = Some(version);
        Ok(())
    }

    /// Republishes whenever the store's version moves past the published one, until `shutdown`.
    /// Admin changes publish at once; this catches what they could not (a failed rebuild) and
    /// changes made by anyone else sharing the store.
    pub async fn keep_published(
        self,
        interval: std::time::Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut shutdown => return,
            }
            let store = Arc::clone(&self.inner.store);
            let current = match self.off_thread(move || store.version()).await {
                Ok(version) => version,
                Err(e) => {
                    tracing::warn!(error = ?e, "reading the store's version failed");
                    continue;
                }
            };
            if !self.inner.store_answers.swap(true, std::sync::atomic::Ordering::AcqRel) {
                tracing::info!("the store answers again: the control plane is ready");
            }
            let published = *self.inner.published.lock().await;
            if published.is_none_or(|version| current > version) {
                if let Err(e) = self.publish_latest().await {
                    tracing::warn!(error = ?e, "publishing the latest state failed; retrying");
                }
            } else {
                (self.inner.publish)(Publication::Current);
            }
        }
    }
}
