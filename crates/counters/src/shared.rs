//! The shared store all nodes confirm their spend against: the trait, what a node pushes, what it reads.
//!
//! A push is idempotent. For each window a node's *entry* (its writer) sends the cumulative total of
//! every increment it ever added there, tagged with a sequence number that grows with every sync
//! attempt; the store keeps, per writer, the last sequence and cumulative it applied, and adds only
//! the difference. A retry after an ambiguous failure (the store may or may not have applied the
//! push) therefore counts nothing twice, and a push that arrives late (a lower sequence) is ignored.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use recovea_core::caps::LineAnswer;
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;

/// What a node sends in one sync: one [`WindowPush`] per window it tracks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPush {
    /// Grows with every sync attempt of a node (never reused, even after a failure).
    pub seq: u64,
    /// The node's id, as its receipts name it.
    pub node_id: String,
    pub windows: Vec<WindowPush>,
}

/// One window of a [`SyncPush`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowPush {
    /// The cap's organization (see [`crate::CapWindow::org`]).
    pub org: OrgId,
    pub cap: CapId,
    pub start: Timestamp,
    /// `None`: the node has only read this window and knows no end yet; the store writes nothing
    /// for it (no increment, no reservation, no seed) and only reads.
    pub end: Option<Timestamp>,
    /// The node's entry for this window; the store's writer is `{node_id}/{entry}`. A node that
    /// forgets a window and meets it again uses a new entry, so its cumulative starts afresh.
    pub entry: u64,
    /// Every increment this entry ever added to the window, confirmed or not. A store that holds
    /// no record of this writer (its first push, or the store lost its data) adds all of it.
    pub cumulative: Nanos,
    /// The earliest start of a request this entry counted or reserved for: every receipt of this
    /// node in the window that started at or after it is in `cumulative` (or will be, once its
    /// request ends), so a total rebuilt from the ledger leaves those receipts out
    /// ([`Counted`]). `None` while the entry has counted nothing.
    pub since: Option<Timestamp>,
    /// This entry's live reservations in the window: replaces the writer's previous figure and
    /// lives `reservation_ttl` unless refreshed, on the store's clock (Redis's own; the in-process
    /// store's is the node's).
    pub reserved: Nanos,
    /// A total rebuilt from the ledger, added to the store's total if the window is not seeded and
    /// its writers are still those the seed left out; ignored otherwise.
    pub seed: Option<Seed>,
    /// Of `reserved`, the room held for this entry's next requests (its spare), which the store
    /// tells apart from its requests' reservations (see [`LineAnswer::Contended`]).
    ///
    /// [`LineAnswer::Contended`]: recovea_core::caps::LineAnswer::Contended
    pub spare: Nanos,
    /// More spare asked for: the store adds to `reserved` and `spare` as much of it as keeps the
    /// window's total and every live reservation at or below `ceiling`, on a seeded window only.
    pub grow: Nanos,
    /// `Some` for an armed cap: the most spare may bring the window to
    /// ([`spare_ceiling`](recovea_core::caps::spare_ceiling) of the limit).
    pub ceiling: Option<Nanos>,
    /// The records of this node's requests reserved at the line (see [`LineAsk::record`]) that
    /// `reserved` now holds, or that ended: the store removes them in the same step.
    pub fold: Vec<u64>,
}

/// The spend of a window that the ledger holds and the store's writers do not: every receipt in the
/// window but those of each [`Counted`] node that started at or after its `since`.
///
/// The store adds a seed to its writers' total only while they count exactly what the seed left
/// out, and only in the incarnation of the window it was read for (a wipe in between may have
/// lost writers whose earlier receipts reached the ledger after it was read). A writer counted
/// later keeps the seed only if the two cannot overlap: its node was left out from its `since` on,
/// or none of the seed's receipts started that late. Otherwise the store takes the seed back, and
/// the window is read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub total: Nanos,
    /// The writers' [`Unseeded::counted`] the seed was read for, and the window's
    /// [`Unseeded::incarnation`].
    pub counted: Vec<Counted>,
    pub incarnation: u64,
    /// No receipt that started at or after this is in the seed ([`Rebuilt::last_start`], plus
    /// one).
    ///
    /// [`Rebuilt::last_start`]: crate::Rebuilt::last_start
    pub covers_before: Timestamp,
}

impl Seed {
    /// Whether a writer that counts `node`'s receipts from `since` on may join the store's total
    /// beside this seed.
    pub fn keeps_with(&self, node: &str, since: Timestamp) -> bool {
        since >= self.covers_before || self.counted.iter().any(|c| c.node_id == node && c.since <= since)
    }
}

/// A node whose writers hold, in the store's total, every receipt of that node in a window that
/// started at or after `since`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Counted {
    pub node_id: String,
    pub since: Timestamp,
}

/// A window the store holds no ledger-rebuilt total for (new, flushed or evicted), as a sync read
/// it: rebuild the seed from the ledger, leaving out what `counted` holds, and
/// [`seed`](crate::Counters::seed) it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unseeded {
    pub window: crate::CapWindow,
    /// Per node, the earliest `since` of its writers in the store, in the order of node ids.
    pub counted: Vec<Counted>,
    /// Which life of the window in the store this is: a window wiped and written again is a new
    /// one.
    pub incarnation: u64,
}

impl Unseeded {
    /// A window no writer has counted in yet (a new cap's, or every window of a store that starts
    /// empty), seeded before any request: the store takes the seed in the window's first
    /// incarnation if no writer counted meanwhile; otherwise the window is rebuilt once a sync
    /// reports it.
    pub fn fresh(window: crate::CapWindow) -> Self {
        Self { window, counted: Vec::new(), incarnation: FRESH }
    }
}

/// What the store answered to a [`SyncPush`]: one [`WindowRead`] per pushed window, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRead {
    pub windows: Vec<WindowRead>,
    /// The store's clock when it answered, for a store that has its own (Redis's `TIME`): the one
    /// clock every node's reservations are dated on, which each node measures its own against.
    pub store_time: Option<Timestamp>,
    /// When the store's data began, on its clock in unix microseconds (no two lives of the data
    /// share it): the first sync after it started without its data, restarted or was flushed.
    /// Until every node has pushed again, a window it does not hold may be one it lost whose other
    /// writers are not back yet.
    pub store_began: Option<i64>,
}

/// One window of a [`SyncRead`], read after the push was applied, in the same atomic step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WindowRead {
    /// The window's total over all nodes (zero for a window the store does not hold).
    pub total: Nanos,
    /// The live reservations of every writer other than the pushing one.
    pub others_reserved: Nanos,
    /// Whether the store's total was rebuilt from the ledger. `false` for a window the store did
    /// not hold (created by this push, or lost in a flush or an eviction): its total counts only
    /// increments pushed since, and the caller should rebuild it from the ledger and
    /// [`seed`](crate::Counters::seed) it.
    pub seeded: bool,
    /// How much of the spare asked for ([`WindowPush::grow`]) the store granted.
    pub granted: Nanos,
    /// For a window not seeded: what its writers count, per node, and its incarnation (see
    /// [`Unseeded`]).
    pub counted: Vec<Counted>,
    pub incarnation: u64,
}

/// The incarnation of a window the store does not hold yet: a seed for it is taken by the first.
pub const FRESH: u64 = 0;

/// A request's ask at armed caps' lines: check every window and reserve the estimate in all of
/// them, or in none, in one atomic step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineAsk {
    /// The request's number on this node: its reservation is the member `{node_id}#{record}` of
    /// each window, until the node's sync folds it into its own reservation
    /// ([`WindowPush::fold`]) or its deadline passes.
    pub record: u64,
    pub estimate: Nanos,
    /// The estimate itself must fit below each limit (a batch), rather than only the spend and
    /// reservations already there (a request, which may pass the line by itself).
    pub fit: bool,
    pub windows: Vec<LineWindow>,
}

/// One window of a [`LineAsk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineWindow {
    /// The cap's organization (see [`crate::CapWindow::org`]).
    pub org: OrgId,
    pub cap: CapId,
    pub start: Timestamp,
    pub end: Timestamp,
    /// The cap's limit, less what the line counts that the store does not hold (deferred jobs'
    /// holds and settled spend, from the control plane's book).
    pub limit: Nanos,
}

/// Why a sync failed. The node keeps its increments and retries them; they are never lost nor
/// counted twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterError {
    /// The store could not be reached or failed the request.
    Unavailable(String),
    /// The store did not answer in time (the push may or may not have been applied).
    Timeout,
    /// The store answered something this crate cannot read.
    Protocol(String),
    /// The store's configuration is unusable (e.g. a malformed URL).
    Config(String),
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(why) => write!(f, "counter store unavailable: {why}"),
            Self::Timeout => f.write_str("counter store did not answer in time"),
            Self::Protocol(why) => write!(f, "unexpected answer from the counter store: {why}"),
            Self::Config(why) => write!(f, "counter store misconfigured: {why}"),
        }
    }
}

impl std::error::Error for CounterError {}

/// How a store keeps what nodes push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// A writer's reservations expire this long after its last sync, so a crashed node's
    /// reservations stop counting.
    pub reservation_ttl: Duration,
    /// A window's keys expire this long after the window ends (late receipts still land).
    pub key_margin: Duration,
    /// Redis only: every key starts with this (no `{` or `}`).
    pub prefix: String,
    /// Redis only: the bound on connecting and on one sync round trip.
    pub timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            reservation_ttl: Duration::from_secs(15),
            key_margin: Duration::from_secs(24 * 60 * 60),
            prefix: "recovea:counters".to_owned(),
            timeout: Duration::from_secs(2),
        }
    }
}

/// The shared store all nodes confirm against.
pub trait SharedCounters: Send + Sync + 'static {
    /// Applies, for each window atomically, the seed, the writer's increments and reservation (a
    /// writer is `{node_id}/{entry}`), drops reservations whose deadline is at or before `now`,
    /// and reads the total and the other writers' live reservations. On `Err` nothing may be
    /// assumed about what was applied.
    fn sync<'a>(
        &'a self,
        node_id: &'a str,
        push: &'a SyncPush,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<SyncRead, CounterError>> + Send + 'a>>;

    /// Checks and reserves a request at armed caps' lines in one atomic step (see
    /// [`LineAnswer`]). On `Err` the reservation may or may not have been made: the node removes its
    /// record at its next sync either way.
    fn reserve_at_line<'a>(
        &'a self,
        node_id: &'a str,
        ask: &'a LineAsk,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<LineAnswer, CounterError>> + Send + 'a>>;
}

/// Per node, the earliest `since` of its writers, in the order of node ids: a node's writers
/// together hold its receipts from the earliest (an entry it forgot left its total in the store).
pub(crate) fn counted_per_node(writers: impl Iterator<Item = Counted>) -> Vec<Counted> {
    let mut earliest: std::collections::BTreeMap<String, Timestamp> = std::collections::BTreeMap::new();
    for Counted { node_id, since } in writers {
        let at = earliest.entry(node_id).or_insert(since);
        *at = (*at).min(since);
    }
    earliest.into_iter().map(|(node_id, since)| Counted { node_id, since }).collect()
}

/// The member a request reserved at the line holds in a window: `{node_id}#{record}`.
pub(crate) fn line_member(node_id: &str, record: u64) -> String {
    format!("{}{record}", line_members(node_id))
}

/// What the members of a node's requests reserved at the line start with.
pub(crate) fn line_members(node_id: &str) -> String {
    format!("{node_id}#")
}

/// Milliseconds in a duration, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The instant a window's keys expire.
pub(crate) fn expire_at(end: Timestamp, options: &StoreOptions) -> Timestamp {
    Timestamp(end.0.saturating_add(millis(options.key_margin)))
}

/// The deadline of a reservation pushed at `now`.
pub(crate) fn reserved_until(now: Timestamp, options: &StoreOptions) -> Timestamp {
    Timestamp(now.0.saturating_add(millis(options.reservation_ttl)))
}
