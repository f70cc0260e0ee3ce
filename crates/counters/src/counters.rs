//! A node's view of spend per (cap, window start): read and written by the request path, which
//! waits on the shared store only to ask it at an armed cap's line.
//!
//! Each window the node tracks is an *entry*: the total last confirmed by the shared store, the
//! cumulative of every increment this node added (and how much of it the store acknowledged),
//! this node's live reservations, and the other nodes' reservations as last read. The request path
//! takes a read lock on the map and one entry's mutex, briefly; only the first sight of a window
//! and the sync's housekeeping take the write lock.
//!
//! When other nodes share the counters ([`Counters::shared`]), an armed cap's line holds across
//! all of them: far from the line the store grants each node *spare* room in its reservation
//! (at most up to [`spare_ceiling`]), and a request that the spare covers is decided in memory;
//! a request it does not cover asks the store, which checks and reserves in one atomic step
//! ([`Counters::ask_at_line`]). Every request admitted anywhere is therefore in the store's
//! reservations before it reaches the provider, and the store refuses at the line.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use foldhash::HashMap;
use recovea_core::caps::{
    CapSpend, Counting, LineAnswer, LineCheck, SpendView, line_check, spare_ceiling, spare_wanted,
};
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use tokio::sync::{Notify, watch};

use crate::rebuild::Rebuilt;
use crate::shared::{
    CounterError, LineAsk, LineWindow, Seed, SharedCounters, SyncPush, Unseeded, WindowPush,
};

mod entry;
mod line;
mod sync;

use entry::{Entry, State};
pub use line::Reservation;

/// Past this many entries the least recently used ones holding nothing unconfirmed are forgotten.
const MAX_WINDOWS: usize = 100_000;
/// An entry whose window ended this long ago is forgotten even with unconfirmed increments (the
/// store's keys for it are expiring too).
const ABANDON_AFTER_END_MS: i64 = 24 * 60 * 60 * 1000;
const NEVER: i64 = i64::MIN;
/// The least time between two syncs asked for early (a new window, a cap near its line).
pub const SOON: Duration = Duration::from_millis(20);
/// The least a request waits for the store's answer at the line; past its deadline the request's
/// spend cannot be confirmed (`503`, retry in a moment), since what the other nodes admitted
/// meanwhile is unknown.
pub const AT_THE_LINE: Duration = Duration::from_millis(100);
/// The most a request waits for the store's answer at the line, however slow the store has been.
pub const MOST_AT_THE_LINE: Duration = Duration::from_secs(1);
/// A line ask's deadline is this many times the store's recent round trip, so that a store slow
/// but answering is waited for rather than taken for absent.
const DEADLINE_PER_ROUND_TRIP: u32 = 4;
/// Unanswered asks at the line, and windows the store lost, are logged at most this often (with
/// their count since).
const WARNING_EVERY: Duration = Duration::from_secs(10);
/// How long (at least) a request found contended at the line (other nodes hold spare room there)
/// keeps asking, while the holders' syncs give their spare back, before its spend counts as
/// unconfirmed.
const CONTENDED_WAIT: Duration = Duration::from_millis(300);
/// How long (at least) a request at an armed cap's window the store holds no ledger-rebuilt total
/// for (a new cap or window, a flushed store) keeps asking, while the node rebuilds the window from
/// the ledger and seeds it, before its spend counts as unconfirmed. A sync, a read of the ledger
/// and another sync: tens of milliseconds, once per window.
const UNSEEDED_WAIT: Duration = Duration::from_millis(500);
/// How long after this node saw the store lose its data (a restart without it, a flush) no window
/// is rebuilt: a window the store does not hold may be one it lost, and until every node has
/// pushed its count again the store's total lacks theirs (the ledger lags their spools). Every
/// node pushes every window it tracks at least once a second (its sync interval), so twice that.
pub const STORE_REFILL: Duration = Duration::from_secs(2);
/// The pause between two asks of a request found contended or unseeded.
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(10);
/// How stale other nodes' spend on an armed cap may be while this node spends on it, and how long
/// this node's reservation on it may outlive the request in their view.
const ARMED_SYNC_GAP: Duration = Duration::from_millis(100);

/// How long a request keeps asking the store at the line after this answer (zero: it acts on it),
/// the store's `deadline` for one ask being what it lately takes: a slow store takes longer to
/// hand spare back or to have a window seeded (a sync, a read of the ledger, another sync).
fn asked_again_for(answer: LineAnswer, deadline: Duration) -> Duration {
    match answer {
        LineAnswer::Contended => CONTENDED_WAIT.max(deadline),
        LineAnswer::Unseeded => UNSEEDED_WAIT.max(deadline.saturating_mul(2)),
        LineAnswer::Reserved | LineAnswer::AtLine(_) => Duration::ZERO,
    }
}

/// One cap's window, as the gateway names it for a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CapWindow {
    /// The cap's organization: a shared store keeps an organization's windows together, so that
    /// one request's caps are checked in one step.
    pub org: OrgId,
    pub cap: CapId,
    pub start: Timestamp,
    pub end: Timestamp,
}

impl CapWindow {
    /// When the window starts and ends.
    pub fn span(&self) -> (Timestamp, Timestamp) {
        (self.start, self.end)
    }
}

/// What one successful sync did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncOutcome {
    /// How many windows were pushed and read.
    pub windows: usize,
    /// Windows the store holds no ledger-rebuilt total for (new, flushed or evicted): rebuild each
    /// from the ledger and [`Counters::seed`] it.
    pub missing: Vec<Unseeded>,
    /// Other nodes spent or hold reservations on one of these windows since the last sync: they
    /// are racing at it too, so the next sync should not wait a whole tick.
    pub others_active: bool,
}

/// A node's view of spend: implements [`SpendView`]; cheap, lock-light, never does I/O itself.
pub struct Counters {
    /// `{node_id}.{random}`: this process's writer prefix in the shared store.
    instance: String,
    /// The node's id, as its receipts name it.
    node_id: String,
    windows: RwLock<HashMap<(CapId, Timestamp), Arc<Entry>>>,
    next_entry: AtomicU64,
    seq: AtomicU64,
    /// Sync attempts so far: the clock of idleness.
    syncs: AtomicU64,
    confirmed_at: AtomicI64,
    /// The number (in `syncs`) of the last sync that succeeded.
    confirmed_sync: AtomicU64,
    /// The number of the first sync to start after the last [`Counters::track`] of an armed window.
    tracked_sync: AtomicU64,
    sync_lock: tokio::sync::Mutex<()>,
    wake: Notify,
    /// The shortest gap asked for since the loop last woke (`u64::MAX`: none).
    asked_gap_ms: AtomicU64,
    missing: watch::Sender<Vec<Unseeded>>,
    /// The store other nodes share these counters through, which decides at armed caps' lines;
    /// `None` when no other node spends on them (the view is then exact).
    line: Option<Arc<dyn SharedCounters>>,
    /// Numbers the requests this node asks at the line (see [`LineAsk::record`]).
    next_record: AtomicU64,
    /// The store's recent round trip (syncs and line asks), in microseconds: a moving average
    /// that sizes the line's deadline ([`line_deadline`]).
    round_trip_us: AtomicU64,
    /// Asks at the line left unanswered since the last warning, and when that was.
    unanswered: AtomicU64,
    warned_at: Mutex<Option<std::time::Instant>>,
    /// When the store's data began, as the last sync read it ([`SyncRead::store_began`]), and
    /// until when no window is rebuilt since this node saw it begin anew ([`STORE_REFILL`]), on
    /// the store's clock.
    store_began_us: AtomicI64,
    refill_until_ms: AtomicI64,
    /// Windows the store lost after they were seeded, rebuilt since the last warning; when that was.
    lost: Mutex<(u64, Option<std::time::Instant>)>,
    /// Windows the store lost, rebuilt: how many, and the spend the ledger gave back to them.
    lost_rebuilt: AtomicU64,
    lost_rebuilt_nanos: AtomicU64,
    /// The store's clock less this node's, in milliseconds, as the last sync measured it
    /// ([`NOT_MEASURED`] until one did, and on counters without a store of their own clock).
    clock_offset_ms: AtomicI64,
}

/// [`Counters::clock_offset`] before any measure.
const NOT_MEASURED: i64 = i64::MIN;

/// How long a request waits at the line for a store whose recent round trip is `round_trip`:
/// [`DEADLINE_PER_ROUND_TRIP`] of them, at least [`AT_THE_LINE`] and at most [`MOST_AT_THE_LINE`].
pub fn line_deadline(round_trip: Duration) -> Duration {
    round_trip.saturating_mul(DEADLINE_PER_ROUND_TRIP).clamp(AT_THE_LINE, MOST_AT_THE_LINE)
}

/// A window a request counts against, and its cap's limit while the cap is armed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Covered {
    pub window: CapWindow,
    /// `Some(limit)` when the cap refuses at its line.
    pub line: Option<Nanos>,
}

impl Counters {
    /// Counters that no other node spends on (`recovea serve` with in-process counters): every
    /// check is made in memory, on a view that is exact.
    pub fn new(node_id: &str) -> Arc<Self> {
        Self::build(node_id, None)
    }

    /// Counters shared with other nodes through `store`, which decides at armed caps' lines.
    pub fn shared(node_id: &str, store: Arc<dyn SharedCounters>) -> Arc<Self> {
        Self::build(node_id, Some(store))
    }

    fn build(node_id: &str, line: Option<Arc<dyn SharedCounters>>) -> Arc<Self> {
        let token: String = std::iter::repeat_with(fastrand::alphanumeric).take(12).collect();
        Arc::new(Self {
            instance: format!("{node_id}.{token}"),
            node_id: node_id.to_owned(),
            windows: RwLock::new(HashMap::default()),
            next_entry: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            confirmed_at: AtomicI64::new(NEVER),
            confirmed_sync: AtomicU64::new(0),
            tracked_sync: AtomicU64::new(0),
            sync_lock: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            asked_gap_ms: AtomicU64::new(u64::MAX),
            missing: watch::Sender::new(Vec::new()),
            line,
            next_record: AtomicU64::new(0),
            round_trip_us: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            warned_at: Mutex::new(None),
            store_began_us: AtomicI64::new(NEVER),
            refill_until_ms: AtomicI64::new(NEVER),
            lost: Mutex::new((0, None)),
            lost_rebuilt: AtomicU64::new(0),
            lost_rebuilt_nanos: AtomicU64::new(0),
            clock_offset_ms: AtomicI64::new(NOT_MEASURED),
        })
    }

    /// The shared store's clock less this node's, in milliseconds, as last measured (at each sync,
    /// from the store's time and the round trip); `None` before the first measure or without a
    /// store that has a clock of its own.
    pub fn clock_offset_ms(&self) -> Option<i64> {
        Some(self.clock_offset_ms.load(Ordering::Relaxed)).filter(|ms| *ms != NOT_MEASURED)
    }

    /// `system` (this node's clock) on the store's clock: the one clock every node decides which
    /// window a request falls in by, so that nodes whose clocks disagree share each window.
    pub fn on_store_clock(&self, system: Timestamp) -> Timestamp {
        Timestamp(system.0.saturating_add(self.clock_offset_ms().unwrap_or(0)))
    }

    /// The shared store's recent round trip: a moving average of syncs and line asks (zero before
    /// the first, and on counters no other node shares).
    pub fn store_round_trip(&self) -> Duration {
        Duration::from_micros(self.round_trip_us.load(Ordering::Relaxed))
    }

    /// Adds one round trip to the moving average (an eighth of the new one).
    fn observe_round_trip(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let _ = self.round_trip_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |average| {
            Some(if average == 0 { took } else { average - average / 8 + took / 8 })
        });
    }

    /// Counts an ask the store left unanswered, and warns at most every
    /// [`UNANSWERED_WARNING_EVERY`] with the count since the last warning.
    fn unanswered(&self, deadline: Duration, error: Option<&CounterError>) {
        let count = self.unanswered.fetch_add(1, Ordering::Relaxed) + 1;
        let mut warned_at = self.warned_at.lock().unwrap_or_else(PoisonError::into_inner);
        let due = warned_at.is_none_or(|at| at.elapsed() >= WARNING_EVERY);
        if due {
            *warned_at = Some(std::time::Instant::now());
            self.unanswered.store(0, Ordering::Relaxed);
            let round_trip_ms = self.store_round_trip().as_millis();
            let deadline_ms = deadline.as_millis();
            let error = error.map(ToString::to_string).unwrap_or_else(|| "no answer in time".to_owned());
            tracing::warn!(
                count,
                deadline_ms,
                round_trip_ms,
                %error,
                "the counter store left asks at an armed cap's line unanswered: their spend cannot be confirmed (503 budget_unverifiable)"
            );
        }
    }

    /// How these counters know other nodes' spend (see [`Counting`]).
    pub fn counting(&self) -> Counting {
        if self.line.is_some() { Counting::Shared } else { Counting::Exact }
    }

    /// This process's id in the shared store: the node id and a random suffix, new at each start.
    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// Starts confirming these windows before any request reads them: a window first seen by a
    /// request reads as zero until the sync it triggers, which lets that request past a line
    /// other nodes already reached. An armed window also starts holding spare room, so that the
    /// first request after a quiet spell is decided in memory.
    pub fn track(&self, covered: &[Covered]) {
        let mut lines = covered.iter().map(|c| c.line);
        self.touch(covered.iter().map(|c| &c.window), |s| s.line = lines.next().flatten());
        if covered.iter().any(|c| c.line.is_some()) {
            self.tracked_sync.fetch_max(self.syncs.load(Ordering::Acquire) + 1, Ordering::AcqRel);
            self.sync_soon();
        }
    }

    /// Whether a sync that started after the last [`Self::track`] of an armed window succeeded:
    /// until then, a request at an armed cap could find its window unconfirmed (and answer 503).
    pub fn tracked_confirmed(&self) -> bool {
        self.confirmed_sync.load(Ordering::Acquire) >= self.tracked_sync.load(Ordering::Acquire)
    }

    /// Adds a cost directly (no reservation), e.g. a receipt of a request that had none, which
    /// started at `started_at`.
    pub fn add(&self, windows: &[CapWindow], cost: Nanos, started_at: Timestamp) {
        self.touch(windows.iter(), |s| {
            s.counts_from(started_at);
            s.cumulative = s.cumulative.saturating_add(cost);
        });
    }

    /// Sets the spend the store does not hold but every line counts, per window: what the
    /// control plane's book of deferred jobs holds and settled there. Windows left out hold none.
    pub fn set_external(&self, totals: &[(CapWindow, Nanos)]) {
        let listed: std::collections::HashSet<(&CapId, Timestamp)> =
            totals.iter().map(|(w, _)| (&w.cap, w.start)).collect();
        let stale: Vec<Arc<Entry>> = self
            .read_map()
            .values()
            .filter(|e| !listed.contains(&(&e.cap, e.start)) && e.state().external != Nanos::ZERO)
            .cloned()
            .collect();
        for entry in stale {
            entry.state().external = Nanos::ZERO;
        }
        let mut amounts = totals.iter().map(|(_, amount)| *amount);
        self.touch(totals.iter().map(|(w, _)| w), |s| s.external = amounts.next().unwrap_or(Nanos::ZERO));
    }

    /// When the counters were last confirmed against the shared store (`None`: never).
    pub fn confirmed_at(&self) -> Option<Timestamp> {
        match self.confirmed_at.load(Ordering::Acquire) {
            NEVER => None,
            ms => Some(Timestamp(ms)),
        }
    }

    /// Runs `f` on the state of each window's entry, in order, creating the missing entries; each
    /// entry with what `f` answered for it.
    fn touch<'w, T>(
        &self,
        windows: impl ExactSizeIterator<Item = &'w CapWindow> + Clone,
        mut f: impl FnMut(&mut State) -> T,
    ) -> Vec<(Arc<Entry>, T)> {
        let syncs = self.syncs.load(Ordering::Relaxed);
        let mut touched = Vec::with_capacity(windows.len());
        let mut apply = |entry: &Arc<Entry>, window: &CapWindow| {
            entry.last_used.store(syncs, Ordering::Relaxed);
            let mut s = entry.state();
            s.end.get_or_insert(window.end);
            touched.push((Arc::clone(entry), f(&mut s)));
        };
        {
            // The map lock is held while the states change, so that `forget` (which takes the
            // write lock) cannot drop an entry between its lookup and its update. Looking each
            // window up twice costs less than a list of what the first look found.
            let map = self.read_map();
            if windows.clone().all(|w| map.contains_key(&(w.cap.clone(), w.start))) {
                for w in windows {
                    apply(&map[&(w.cap.clone(), w.start)], w);
                }
                return touched;
            }
        }
        let mut map = self.write_map();
        let mut created = false;
        for w in windows {
            let entry = map.entry((w.cap.clone(), w.start)).or_insert_with(|| {
                created = true;
                self.new_entry(&w.org, &w.cap, w.start)
            });
            apply(entry, w);
        }
        drop(map);
        if created {
            self.sync_soon();
        }
        touched
    }

    fn new_entry(&self, org: &OrgId, cap: &CapId, start: Timestamp) -> Arc<Entry> {
        Arc::new(Entry {
            id: self.next_entry.fetch_add(1, Ordering::Relaxed),
            org: org.clone(),
            cap: cap.clone(),
            start,
            last_used: AtomicU64::new(self.syncs.load(Ordering::Relaxed)),
            state: Mutex::new(State::default()),
        })
    }

    /// Forgets windows that ended or sat idle with nothing unconfirmed, and keeps the map bounded.
    fn forget(&self, now: Timestamp) {
        let mut map = self.write_map();
        map.retain(|_, entry| !entry.forgettable(now));
        if map.len() > MAX_WINDOWS {
            let mut clean: Vec<(u64, (CapId, Timestamp))> = map
                .iter()
                .filter(|(_, e)| e.state().is_clean())
                .map(|(key, e)| (e.last_used.load(Ordering::Relaxed), key.clone()))
                .collect();
            clean.sort_unstable_by_key(|(last_used, _)| *last_used);
            let excess = map.len() - MAX_WINDOWS;
            for (_, key) in clean.into_iter().take(excess) {
                map.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.read_map().len()
    }

    fn read_map(&self) -> RwLockReadGuard<'_, HashMap<(CapId, Timestamp), Arc<Entry>>> {
        self.windows.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_map(&self) -> RwLockWriteGuard<'_, HashMap<(CapId, Timestamp), Arc<Entry>>> {
        self.windows.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SpendView for Counters {
    /// `spent`: the confirmed total plus this node's unconfirmed spend; `reserved`: this node's
    /// live reservations plus the other nodes' as last read; `confirmed_at`: the last successful
    /// sync. A window seen for the first time reads as zero until the next sync, which it
    /// triggers at once.
    fn spend(&self, org: &OrgId, cap: &CapId, window_start: Timestamp) -> CapSpend {
        let confirmed_at = self.confirmed_at();
        let key = (cap.clone(), window_start);
        let entry = self.read_map().get(&key).cloned();
        let entry = match entry {
            Some(entry) => entry,
            None => {
                let mut map = self.write_map();
                let entry =
                    Arc::clone(map.entry(key).or_insert_with(|| self.new_entry(org, cap, window_start)));
                drop(map);
                self.sync_soon();
                entry
            }
        };
        entry.last_used.store(self.syncs.load(Ordering::Relaxed), Ordering::Relaxed);
        let s = entry.state();
        CapSpend {
            spent: s
                .confirmed
                .saturating_add(Nanos(s.cumulative.0.saturating_sub(s.acked.0)))
                .saturating_add(s.external),
            reserved: s.own_reserved.saturating_add(s.others_reserved).saturating_add(s.pending),
            confirmed_at,
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("instance", &self.instance)
            .field("windows", &self.read_map().len())
            .field("confirmed_at", &self.confirmed_at())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fakes::{AnswerLost, Unreachable};
    use crate::in_process::InProcess;
    use crate::shared::{Counted, StoreOptions};
    use crate::sync_loop::sync_loop_with_clock;

    const NOW: Timestamp = Timestamp(1_000_000);

    fn cap(name: &str) -> CapId {
        CapId::parse(&format!("cap_{name}")).expect("cap id")
    }

    fn org() -> OrgId {
        OrgId::parse("org_counted").expect("org id")
    }

    fn window(name: &str) -> CapWindow {
        CapWindow { org: org(), cap: cap(name), start: Timestamp(0), end: Timestamp(10_000_000) }
    }

    /// Seeds a window no writer counted in yet.
    fn fresh_seed(counters: &Counters, w: &CapWindow, total: Nanos) {
        counters.seed(&Unseeded::fresh(w.clone()), Rebuilt { total, last_start: None });
    }

    /// Windows of caps that do not refuse.
    fn soft(windows: &[CapWindow]) -> Vec<Covered> {
        windows.iter().map(|window| Covered { window: window.clone(), line: None }).collect()
    }

    /// Windows of armed caps of this limit.
    fn armed_at(windows: &[CapWindow], limit: Nanos) -> Vec<Covered> {
        windows.iter().map(|window| Covered { window: window.clone(), line: Some(limit) }).collect()
    }

    fn spend(counters: &Counters, w: &CapWindow) -> CapSpend {
        counters.spend(&w.org, &w.cap, w.start)
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp(NOW.0 + ms)
    }

    #[test]
    fn own_spend_counts_at_once_before_any_sync() {
        let counters = Counters::new("n1");
        let w = window("a");
        counters.add(std::slice::from_ref(&w), Nanos(5), NOW);
        counters.add(std::slice::from_ref(&w), Nanos(7), NOW);
        assert_eq!(
            spend(&counters, &w),
            CapSpend { spent: Nanos(12), reserved: Nanos::ZERO, confirmed_at: None }
        );
        assert_eq!(counters.confirmed_at(), None);
    }

    #[test]
    fn a_settled_reservation_becomes_spend_and_a_dropped_one_is_released() {
        let counters = Counters::new("n1");
        let (a, b) = (window("a"), window("b"));
        let settled = counters.reserve(&soft(&[a.clone(), b.clone()]), Nanos(10), NOW);
        let dropped = counters.reserve(&soft(std::slice::from_ref(&a)), Nanos(4), NOW);
        assert_eq!(spend(&counters, &a).reserved, Nanos(14));
        assert_eq!(spend(&counters, &b).reserved, Nanos(10));

        settled.settle(Nanos(7));
        assert_eq!((spend(&counters, &a).spent, spend(&counters, &a).reserved), (Nanos(7), Nanos(4)));
        assert_eq!((spend(&counters, &b).spent, spend(&counters, &b).reserved), (Nanos(7), Nanos::ZERO));

        drop(dropped);
        assert_eq!((spend(&counters, &a).spent, spend(&counters, &a).reserved), (Nanos(7), Nanos::ZERO));
    }

    #[tokio::test]
    async fn others_reservations_come_from_the_store_own_ones_are_live() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        let held = a.reserve(&soft(std::slice::from_ref(&w)), Nanos(10), NOW);
        a.sync_with(&store, NOW).await.expect("sync a");
        assert_eq!(spend(&b, &w).reserved, Nanos::ZERO, "b has not read the window yet");
        b.sync_with(&store, NOW).await.expect("sync b");
        assert_eq!(spend(&b, &w).reserved, Nanos(10), "b sees a's reservation");
        a.sync_with(&store, at(1)).await.expect("sync a");
        assert_eq!(spend(&a, &w).reserved, Nanos(10), "a's own reservation is not counted twice");

        held.settle(Nanos(3));
        assert_eq!((spend(&a, &w).spent, spend(&a, &w).reserved), (Nanos(3), Nanos::ZERO), "at once on a");
        assert_eq!(spend(&b, &w).reserved, Nanos(10), "b knows only after the syncs");
        a.sync_with(&store, at(2)).await.expect("sync a");
        b.sync_with(&store, at(2)).await.expect("sync b");
        assert_eq!((spend(&b, &w).spent, spend(&b, &w).reserved), (Nanos(3), Nanos::ZERO));
    }

    #[tokio::test]
    async fn a_sync_says_when_other_nodes_spend_on_a_window_held_here() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        fresh_seed(&a, &w, Nanos(0));
        a.sync_with(&store, NOW).await.expect("sync a");
        b.track(&soft(std::slice::from_ref(&w)));
        assert!(!b.sync_with(&store, NOW).await.expect("sync b").others_active, "nothing spent yet");
        b.add(std::slice::from_ref(&w), Nanos(3), NOW);
        assert!(!b.sync_with(&store, at(1)).await.expect("sync b").others_active, "b's own spend only");
        a.add(std::slice::from_ref(&w), Nanos(5), NOW);
        a.sync_with(&store, at(2)).await.expect("sync a");
        assert!(b.sync_with(&store, at(3)).await.expect("sync b").others_active, "a spent");
        let held = a.reserve(&soft(std::slice::from_ref(&w)), Nanos(7), NOW);
        a.sync_with(&store, at(4)).await.expect("sync a");
        assert!(b.sync_with(&store, at(5)).await.expect("sync b").others_active, "a holds a reservation");
        held.settle(Nanos::ZERO);
        a.sync_with(&store, at(6)).await.expect("sync a");
        b.sync_with(&store, at(7)).await.expect("sync b");
        assert!(!b.sync_with(&store, at(8)).await.expect("sync b").others_active, "quiet again");
    }

    #[tokio::test]
    async fn a_tracked_window_reads_other_nodes_spend_before_its_first_request() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        fresh_seed(&a, &w, Nanos(0));
        a.add(std::slice::from_ref(&w), Nanos(40), NOW);
        a.sync_with(&store, NOW).await.expect("sync a");
        b.track(&soft(std::slice::from_ref(&w)));
        b.sync_with(&store, NOW).await.expect("sync b");
        assert_eq!(spend(&b, &w).spent, Nanos(40), "read before any request touched the window on b");
        let untracked = window("y");
        fresh_seed(&a, &untracked, Nanos(0));
        a.add(std::slice::from_ref(&untracked), Nanos(40), NOW);
        a.sync_with(&store, at(1)).await.expect("sync a");
        b.sync_with(&store, at(1)).await.expect("sync b");
        assert_eq!(spend(&b, &untracked).spent, Nanos::ZERO, "an untracked window reads zero at first");
    }

    #[tokio::test]
    async fn a_seed_counts_at_once_and_becomes_the_store_total() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        fresh_seed(&a, &w, Nanos(100));
        assert_eq!(spend(&a, &w).spent, Nanos(100));
        let outcome = a.sync_with(&store, NOW).await.expect("sync");
        assert!(outcome.missing.is_empty());
        a.add(std::slice::from_ref(&w), Nanos(5), NOW);
        assert_eq!(spend(&a, &w).spent, Nanos(105));
        a.sync_with(&store, NOW).await.expect("sync");
        b.sync_with(&store, NOW).await.expect("first sync of b learns the window");
        spend(&b, &w);
        b.sync_with(&store, NOW).await.expect("sync b");
        assert_eq!(spend(&b, &w).spent, Nanos(105));

        fresh_seed(&b, &w, Nanos(999));
        b.sync_with(&store, at(1)).await.expect("a second seed");
        assert_eq!(spend(&b, &w).spent, Nanos(105), "the first seed wins");
    }

    #[tokio::test]
    async fn a_window_without_a_seeded_total_is_reported_until_seeded() {
        let store = InProcess::default();
        let counters = Counters::new("a");
        let mut missing = counters.subscribe_missing();
        let w = window("x");
        counters.add(std::slice::from_ref(&w), Nanos(5), NOW);
        let outcome = counters.sync_with(&store, NOW).await.expect("sync");
        let unseeded = Unseeded {
            window: w.clone(),
            counted: vec![Counted { node_id: "a".to_owned(), since: NOW }],
            incarnation: outcome.missing[0].incarnation,
        };
        assert_eq!(outcome.missing, vec![unseeded.clone()], "what the ledger must leave out: a's receipts");
        assert!(missing.has_changed().expect("sender alive"));
        assert_eq!(*missing.borrow_and_update(), vec![unseeded.clone()]);
        assert_eq!(spend(&counters, &w).spent, Nanos(5));

        counters.seed(&unseeded, Rebuilt { total: Nanos(50), last_start: None });
        assert!(counters.missing().is_empty(), "a seed waiting to be pushed is not missing");
        assert_eq!(spend(&counters, &w).spent, Nanos(55), "counted at once");
        let outcome = counters.sync_with(&store, at(1)).await.expect("sync");
        assert!(outcome.missing.is_empty());
        assert_eq!(spend(&counters, &w).spent, Nanos(55), "the ledger's part adds to the writers'");
    }

    #[tokio::test]
    async fn confirmed_at_advances_only_with_successful_syncs() {
        let store = InProcess::default();
        let counters = Counters::new("a");
        let w = window("x");
        counters.add(std::slice::from_ref(&w), Nanos(5), NOW);
        assert!(counters.sync_with(&Unreachable, NOW).await.is_err());
        assert_eq!(counters.confirmed_at(), None);
        counters.sync_with(&store, at(1_000)).await.expect("sync");
        assert_eq!(counters.confirmed_at(), Some(at(1_000)));
        assert_eq!(spend(&counters, &w).confirmed_at, Some(at(1_000)));
        counters.add(std::slice::from_ref(&w), Nanos(3), NOW);
        assert!(counters.sync_with(&Unreachable, at(2_000)).await.is_err());
        assert_eq!(counters.confirmed_at(), Some(at(1_000)));
        assert_eq!(spend(&counters, &w).spent, Nanos(8), "pending spend still counts on this node");
    }

    #[tokio::test]
    async fn increments_survive_failed_syncs_and_count_once() {
        let store: &'static InProcess = Box::leak(Box::new(InProcess::default()));
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        a.add(std::slice::from_ref(&w), Nanos(5), NOW);
        assert!(a.sync_with(&Unreachable, NOW).await.is_err());
        assert!(a.sync_with(&AnswerLost(store), at(1)).await.is_err(), "applied, answer lost");
        a.add(std::slice::from_ref(&w), Nanos(3), NOW);
        assert!(a.sync_with(&AnswerLost(store), at(2)).await.is_err(), "applied again, answer lost");
        assert_eq!(spend(&a, &w).spent, Nanos(8));
        a.sync_with(store, at(3)).await.expect("sync");
        a.sync_with(store, at(4)).await.expect("sync");
        assert_eq!(spend(&a, &w).spent, Nanos(8));
        b.add(std::slice::from_ref(&w), Nanos(0), NOW);
        b.sync_with(store, at(5)).await.expect("sync b");
        assert_eq!(spend(&b, &w).spent, Nanos(8), "counted exactly once in the store");
    }

    #[tokio::test]
    async fn a_flushed_store_never_lowers_the_view_below_what_was_known() {
        let before = InProcess::default();
        let counters = Counters::new("a");
        let w = window("x");
        fresh_seed(&counters, &w, Nanos(100));
        counters.sync_with(&before, NOW).await.expect("sync");
        counters.add(std::slice::from_ref(&w), Nanos(5), NOW);
        counters.sync_with(&before, NOW).await.expect("sync");
        let flushed = InProcess::default();
        counters.add(std::slice::from_ref(&w), Nanos(3), NOW);
        let outcome = counters.sync_with(&flushed, at(1)).await.expect("sync");
        let [unseeded] = &outcome.missing[..] else { panic!("one window missing: {:?}", outcome.missing) };
        assert_eq!(spend(&counters, &w).spent, Nanos(108), "the store holds 8 alone, the view knew more");
        // The ledger: the 100 seeded at first, this node's receipts left out.
        counters.seed(unseeded, Rebuilt { total: Nanos(100), last_start: None });
        counters.sync_with(&flushed, at(2)).await.expect("sync");
        assert_eq!(spend(&counters, &w).spent, Nanos(108));
        assert!(counters.missing().is_empty());
        assert_eq!(
            counters.lost_windows_rebuilt(),
            (1, Nanos(100)),
            "a window lost, and what the ledger gave back"
        );
    }

    #[tokio::test]
    async fn ended_windows_are_forgotten_and_a_late_receipt_counts_once() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = CapWindow { org: org(), cap: cap("x"), start: Timestamp(0), end: at(100) };
        a.add(std::slice::from_ref(&w), Nanos(5), NOW);
        a.sync_with(&store, NOW).await.expect("sync");
        a.sync_with(&store, at(100)).await.expect("sync after the end");
        assert_eq!(a.tracked(), 0, "ended and confirmed: forgotten");
        a.add(std::slice::from_ref(&w), Nanos(2), NOW);
        a.sync_with(&store, at(200)).await.expect("late receipt");
        spend(&b, &w);
        b.sync_with(&store, at(50)).await.expect("sync b");
        assert_eq!(spend(&b, &w).spent, Nanos(7));
    }

    #[tokio::test]
    async fn unconfirmed_windows_are_kept_until_acknowledged() {
        let counters = Counters::new("a");
        let w = CapWindow { org: org(), cap: cap("x"), start: Timestamp(0), end: at(100) };
        counters.add(std::slice::from_ref(&w), Nanos(5), NOW);
        assert!(counters.sync_with(&Unreachable, at(500)).await.is_err());
        assert_eq!(counters.tracked(), 1);
        let held = counters.reserve(&soft(&[window("y")]), Nanos(1), NOW);
        for _ in 0..=3600 {
            assert!(counters.sync_with(&Unreachable, at(600)).await.is_err());
        }
        assert_eq!(counters.tracked(), 2, "a live reservation keeps an idle window");
        drop(held);
        assert!(counters.sync_with(&Unreachable, at(700)).await.is_err());
        assert_eq!(counters.tracked(), 2, "idle and clean, but not ended: kept, or it would read as zero");
        assert!(counters.sync_with(&Unreachable, Timestamp(10_000_000)).await.is_err());
        assert_eq!(counters.tracked(), 1, "clean and ended: forgotten");
        assert!(counters.sync_with(&Unreachable, at(ABANDON_AFTER_END_MS + 100)).await.is_err());
        assert_eq!(counters.tracked(), 0, "abandoned a day after its end");
    }

    #[tokio::test]
    async fn a_window_only_read_is_synced_but_not_written() {
        let store = InProcess::default();
        let (a, b) = (Counters::new("a"), Counters::new("b"));
        let w = window("x");
        a.add(std::slice::from_ref(&w), Nanos(9), NOW);
        a.sync_with(&store, NOW).await.expect("sync a");
        assert_eq!(spend(&b, &w), CapSpend { spent: Nanos::ZERO, reserved: Nanos::ZERO, confirmed_at: None });
        let outcome = b.sync_with(&store, NOW).await.expect("sync b");
        assert!(outcome.missing.is_empty(), "a window known only by reading is never reported");
        assert_eq!(spend(&b, &w).spent, Nanos(9));
        let unknown = window("never");
        spend(&b, &unknown);
        b.sync_with(&store, NOW).await.expect("sync b");
        assert!(!store.contains(&unknown.cap, unknown.start, NOW), "reading creates nothing");
    }

    /// A window whose store total is seeded at zero, as a node's first sync and the ledger's
    /// rebuild leave it.
    async fn seeded(store: &InProcess, w: &CapWindow) {
        let seeder = Counters::new("seeder");
        fresh_seed(&seeder, w, Nanos::ZERO);
        seeder.sync_with(store, NOW).await.expect("seed");
    }

    #[tokio::test]
    async fn far_from_the_line_a_node_holds_spare_and_decides_in_memory() {
        let store = Arc::new(InProcess::default());
        let a = Counters::shared("a", Arc::clone(&store) as Arc<dyn SharedCounters>);
        let w = window("x");
        seeded(&store, &w).await;
        let covered = armed_at(std::slice::from_ref(&w), Nanos(1_600));
        a.track(&covered);
        a.sync_with(store.as_ref(), NOW).await.expect("sync");
        // A sixteenth of the room: 100.
        let first = a.reserve(&covered, Nanos(60), NOW);
        assert!(!first.is_pending(), "the spare covers the first request");
        let second = a.reserve(&covered, Nanos(60), NOW);
        assert!(second.is_pending(), "40 left: the next one asks the store");
        // Asking gave the 40 up: were it still used in memory, the store (which counts it until
        // the next push) could not know whether the ask or those admissions came first.
        let third = a.reserve(&covered, Nanos(10), NOW);
        assert!(third.is_pending(), "no spare left while an ask is out");
        drop((second, third));
        first.settle(Nanos(60));
        // Twice what was admitted since the last push (60, 60 and 10), within a quarter.
        a.sync_with(store.as_ref(), at(1)).await.expect("sync");
        let b = Counters::new("b");
        b.track(&soft(std::slice::from_ref(&w)));
        b.sync_with(store.as_ref(), at(2)).await.expect("sync b");
        assert_eq!(
            spend(&b, &w),
            CapSpend { spent: Nanos(60), reserved: Nanos(260), confirmed_at: Some(at(2)) }
        );
    }

    #[tokio::test]
    async fn spare_is_never_granted_past_the_ceiling_nor_held_near_the_line() {
        let store = Arc::new(InProcess::default());
        let a = Counters::shared("a", Arc::clone(&store) as Arc<dyn SharedCounters>);
        let w = window("x");
        seeded(&store, &w).await;
        let covered = armed_at(std::slice::from_ref(&w), Nanos(1_000));
        let spender = Counters::new("spender");
        spender.add(std::slice::from_ref(&w), Nanos(790), NOW);
        spender.sync_with(store.as_ref(), NOW).await.expect("spend");
        a.track(&covered);
        // a knows no spend yet and asks for a sixteenth of 1000; the store grants up to its
        // ceiling (800) only.
        a.sync_with(store.as_ref(), at(1)).await.expect("sync");
        let covered_by_spare = a.reserve(&covered, Nanos(10), NOW);
        assert!(!covered_by_spare.is_pending(), "granted up to the ceiling");
        assert!(a.reserve(&covered, Nanos(1), NOW).is_pending(), "and no further");
        drop(covered_by_spare);
        spender.add(std::slice::from_ref(&w), Nanos(20), NOW);
        spender.sync_with(store.as_ref(), at(3)).await.expect("spend");
        a.sync_with(store.as_ref(), at(4)).await.expect("sync: reads the spend, within a fifth");
        a.sync_with(store.as_ref(), at(5)).await.expect("sync: gives the spare back");
        assert!(a.reserve(&covered, Nanos(1), NOW).is_pending());
        let b = Counters::new("b");
        b.track(&soft(std::slice::from_ref(&w)));
        b.sync_with(store.as_ref(), at(6)).await.expect("sync b");
        assert_eq!(spend(&b, &w).reserved, Nanos::ZERO, "no spare left in the store");
    }

    #[tokio::test]
    async fn at_the_line_the_store_checks_and_reserves_in_one_step() {
        let store = Arc::new(InProcess::default());
        let (a, b) = (
            Counters::shared("a", Arc::clone(&store) as Arc<dyn SharedCounters>),
            Counters::shared("b", Arc::clone(&store) as Arc<dyn SharedCounters>),
        );
        let w = window("x");
        seeded(&store, &w).await;
        let covered = armed_at(std::slice::from_ref(&w), Nanos(100));
        let mut first = a.reserve(&covered, Nanos(60), NOW);
        assert!(first.is_pending());
        assert_eq!(a.ask_at_line(&mut first, NOW).await, Some(LineAnswer::Reserved));
        first.hold_at_line();
        // b has not synced: only the store knows of a's reservation.
        let mut second = b.reserve(&covered, Nanos(60), NOW);
        assert_eq!(b.ask_at_line(&mut second, NOW).await, Some(LineAnswer::Reserved), "60 < 100");
        second.hold_at_line();
        let mut third = b.reserve(&covered, Nanos(60), NOW);
        assert_eq!(b.ask_at_line(&mut third, NOW).await, Some(LineAnswer::AtLine(0)), "120 >= 100");
        drop(third);
        // a's push folds its record into its own reservation: counted once, as before.
        a.sync_with(store.as_ref(), at(1)).await.expect("sync a");
        b.sync_with(store.as_ref(), at(1)).await.expect("sync b");
        assert_eq!(spend(&b, &w).reserved, Nanos(120));
        // Settled below the line, traffic is admitted again.
        first.settle(Nanos(10));
        second.settle(Nanos(10));
        a.sync_with(store.as_ref(), at(2)).await.expect("sync a");
        b.sync_with(store.as_ref(), at(2)).await.expect("sync b");
        let mut fourth = a.reserve(&covered, Nanos(60), NOW);
        assert_eq!(a.ask_at_line(&mut fourth, at(2)).await, Some(LineAnswer::Reserved), "20 spent, 60 asked");
    }

    #[tokio::test(start_paused = true)]
    async fn spare_held_by_another_node_contends_until_it_is_given_back() {
        let store = Arc::new(InProcess::default());
        let (a, b) = (
            Counters::shared("a", Arc::clone(&store) as Arc<dyn SharedCounters>),
            Counters::shared("b", Arc::clone(&store) as Arc<dyn SharedCounters>),
        );
        let w = window("x");
        seeded(&store, &w).await;
        let covered = armed_at(std::slice::from_ref(&w), Nanos(1_600));
        a.track(&covered);
        a.sync_with(store.as_ref(), NOW).await.expect("a holds a sixteenth: 100");
        // b's requests at the line fill the room up to where a's spare starts.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut request = b.reserve(&covered, Nanos(500), NOW);
            assert_eq!(b.ask_at_line(&mut request, NOW).await, Some(LineAnswer::Reserved));
            request.hold_at_line();
            held.push(request);
        }
        let mut contended = b.reserve(&covered, Nanos(1), NOW);
        let started = tokio::time::Instant::now();
        assert_eq!(b.ask_at_line(&mut contended, NOW).await, Some(LineAnswer::Contended));
        assert!(started.elapsed() >= CONTENDED_WAIT, "asked again while it waited");
        drop(contended);
        // a learns the window is near its line, then gives its spare back.
        a.sync_with(store.as_ref(), at(1)).await.expect("sync a");
        a.sync_with(store.as_ref(), at(2)).await.expect("sync a");
        let mut admitted = b.reserve(&covered, Nanos(1), NOW);
        assert_eq!(b.ask_at_line(&mut admitted, at(2)).await, Some(LineAnswer::Reserved));
    }

    #[tokio::test]
    async fn a_store_that_does_not_answer_leaves_the_decision_to_the_view_and_its_record_is_removed() {
        let store: &'static InProcess = Box::leak(Box::new(InProcess::default()));
        let lossy: Arc<dyn SharedCounters> = Arc::new(AnswerLost(store));
        let a = Counters::shared("a", lossy);
        let w = window("x");
        seeded(store, &w).await;
        let covered = armed_at(std::slice::from_ref(&w), Nanos(100));
        let mut request = a.reserve(&covered, Nanos(60), NOW);
        assert_eq!(a.ask_at_line(&mut request, NOW).await, None, "applied, but the answer was lost");
        request.hold_at_line();
        request.settle(Nanos(60));
        a.sync_with(store, at(1)).await.expect("sync a");
        let b = Counters::new("b");
        b.track(&soft(std::slice::from_ref(&w)));
        b.sync_with(store, at(2)).await.expect("sync b");
        // 40 left of 100 is not within a fifth: a holds a quarter of it as spare, and nothing else.
        assert_eq!(
            (spend(&b, &w).spent, spend(&b, &w).reserved),
            (Nanos(60), Nanos(10)),
            "the record the store kept was removed with the cost's push"
        );
    }

    /// Nodes admitting, settling and syncing in a random order against one store: the spend an
    /// armed cap admits stays within one request's estimate of its limit (costs equal estimates
    /// here), and a refusal at the line always has the line truly reached by other requests.
    #[tokio::test(start_paused = true)]
    async fn the_line_holds_across_nodes_in_any_order() {
        for seed in 0..40_u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let store = Arc::new(InProcess::default());
            let nodes: Vec<Arc<Counters>> = (0..rng.usize(2..5))
                .map(|i| Counters::shared(&format!("n{i}"), Arc::clone(&store) as Arc<dyn SharedCounters>))
                .collect();
            let w = window("x");
            seeded(&store, &w).await;
            let limit = Nanos(rng.i64(500..5_000));
            let covered = armed_at(std::slice::from_ref(&w), limit);
            for node in &nodes {
                node.track(&covered);
            }
            let (mut live, mut spent, mut clock) = (Vec::new(), 0_i64, 0_i64);
            for _ in 0..400 {
                clock += 1;
                let node = &nodes[rng.usize(..nodes.len())];
                match rng.u8(..10) {
                    0..=4 => {
                        let estimate = Nanos(rng.i64(1..200));
                        let mut request = node.reserve(&covered, estimate, NOW);
                        let admitted = if request.is_pending() {
                            match node.ask_at_line(&mut request, at(clock)).await {
                                Some(LineAnswer::Reserved) => true,
                                Some(LineAnswer::AtLine(_)) => {
                                    let others: i64 = live.iter().map(|(e, _): &(i64, Reservation)| *e).sum();
                                    assert!(
                                        spent + others >= limit.0,
                                        "seed {seed}: refused with {spent} spent and {others} reserved of {limit:?}"
                                    );
                                    false
                                }
                                _ => false,
                            }
                        } else {
                            true
                        };
                        if admitted {
                            request.hold_at_line();
                            live.push((estimate.0, request));
                        }
                    }
                    5..=7 if !live.is_empty() => {
                        let (estimate, request) = live.swap_remove(rng.usize(..live.len()));
                        request.settle(Nanos(estimate));
                        spent += estimate;
                    }
                    _ => {
                        node.sync_with(store.as_ref(), at(clock)).await.expect("sync");
                    }
                }
                let committed = spent + live.iter().map(|(e, _)| *e).sum::<i64>();
                assert!(
                    committed < limit.0 + 200,
                    "seed {seed}: {committed} admitted against a limit of {limit:?}"
                );
            }
        }
    }

    /// The sync loop on `store`, every second, reading `clock`; [`Loop::stop`] ends it after its
    /// last sync.
    struct Loop {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Loop {
        fn start(
            counters: &Arc<Counters>,
            store: Arc<dyn SharedCounters>,
            clock: impl Fn() -> Timestamp + Send + 'static,
        ) -> Self {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            let task = tokio::spawn(sync_loop_with_clock(
                Arc::clone(counters),
                store,
                Duration::from_secs(1),
                shutdown,
                clock,
            ));
            Self { stop, task }
        }

        async fn stop(self) {
            self.stop.send(()).expect("loop running");
            self.task.await.expect("loop ends");
        }
    }

    /// The (paused) runtime's clock, starting at [`NOW`].
    fn runtime_clock() -> impl Fn() -> Timestamp + Copy + Send + 'static {
        let started = tokio::time::Instant::now();
        move || Timestamp(NOW.0 + i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX))
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_confirms_every_interval_and_pushes_once_more_at_shutdown() {
        let store = Arc::new(InProcess::new(StoreOptions::default()));
        let counters = Counters::new("a");
        let sync_loop =
            Loop::start(&counters, Arc::clone(&store) as Arc<dyn SharedCounters>, runtime_clock());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while counters.confirmed_at().is_none_or(|at| at.0 < NOW.0 + 3_000) {
            assert!(tokio::time::Instant::now() < deadline, "the loop never confirmed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let w = window("x");
        counters.add(std::slice::from_ref(&w), Nanos(4), NOW);
        sync_loop.stop().await;
        let other = Counters::new("b");
        spend(&other, &w);
        other.sync_with(store.as_ref(), clock_after(&counters)).await.expect("sync");
        assert_eq!(spend(&other, &w).spent, Nanos(4), "the last sync pushed the last increment");
    }

    #[tokio::test(start_paused = true)]
    async fn asks_wake_the_loop_once_between_two_syncs_unless_shorter() {
        let counters = Counters::new("a");
        let asked = |counters: &Arc<Counters>| {
            let counters = Arc::clone(counters);
            async move { tokio::time::timeout(Duration::from_secs(1), counters.sync_asked()).await.ok() }
        };
        counters.sync_within(ARMED_SYNC_GAP);
        assert_eq!(asked(&counters).await, Some(ARMED_SYNC_GAP));
        counters.sync_within(ARMED_SYNC_GAP);
        assert_eq!(asked(&counters).await, None, "the loop already knows of this ask");
        counters.sync_within(SOON);
        assert_eq!(asked(&counters).await, Some(SOON), "a shorter ask wakes it");
        counters.sync_with(&InProcess::default(), NOW).await.expect("sync");
        counters.sync_within(ARMED_SYNC_GAP);
        assert_eq!(asked(&counters).await, Some(ARMED_SYNC_GAP), "the sync answered the earlier asks");
    }

    #[tokio::test(start_paused = true)]
    async fn an_armed_reservation_reaches_other_nodes_within_the_gap_of_its_end() {
        let store = Arc::new(InProcess::new(StoreOptions::default()));
        let clock = runtime_clock();
        let other = Counters::new("other");
        for armed in [true, false] {
            let counters = Counters::new("a");
            let w = window(if armed { "armed" } else { "soft" });
            let sync_loop = Loop::start(&counters, Arc::clone(&store) as Arc<dyn SharedCounters>, clock);
            let covered = if armed {
                armed_at(std::slice::from_ref(&w), Nanos(1_000_000))
            } else {
                soft(std::slice::from_ref(&w))
            };
            let held = counters.reserve(&covered, Nanos(10), NOW);
            // Past the syncs the reservation asked for: the next regular one is most of a tick away.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let seen = |other: &Counters| spend(other, &w);
            seen(&other);
            other.sync_with(store.as_ref(), clock()).await.expect("sync");
            assert_eq!(seen(&other).reserved, Nanos(10), "armed {armed}: the reservation is pushed");
            held.settle(Nanos(3));
            tokio::time::sleep(ARMED_SYNC_GAP + SOON).await;
            other.sync_with(store.as_ref(), clock()).await.expect("sync");
            let expected = if armed { (Nanos(3), Nanos::ZERO) } else { (Nanos::ZERO, Nanos(10)) };
            assert_eq!((seen(&other).spent, seen(&other).reserved), expected, "armed {armed}");
            sync_loop.stop().await;
        }
    }

    /// A receipt as the ledger and a node's spool hold it.
    #[derive(Clone)]
    struct Receipt {
        node: String,
        started_at: Timestamp,
        cost: i64,
    }

    /// The ledger's seed for an unseeded window: its receipts less the counted nodes' from their
    /// `since`.
    fn ledger_seed(ledger: &[Receipt], unseeded: &Unseeded) -> Rebuilt {
        let held_by_writers =
            |r: &Receipt| unseeded.counted.iter().any(|c| c.node_id == r.node && r.started_at >= c.since);
        let total = ledger.iter().filter(|r| !held_by_writers(r)).map(|r| r.cost).sum();
        Rebuilt { total: Nanos(total), last_start: ledger.iter().map(|r| r.started_at).max() }
    }

    /// A node as the model below runs it: its counters, its spool, and since when it runs.
    struct Node {
        counters: Arc<Counters>,
        spool: Vec<Receipt>,
        up_since: i64,
    }

    impl Node {
        fn start(i: usize, now: i64) -> Self {
            Self { counters: Counters::new(&format!("n{i}")), spool: Vec::new(), up_since: now }
        }

        /// The spool's first `count` receipts reach the ledger.
        fn deliver(&mut self, count: usize, ledger: &mut Vec<Receipt>) {
            ledger.extend(self.spool.drain(..count));
        }
    }

    /// Nodes spend, their spools reach the ledger late and in pieces, nodes restart (a graceful
    /// stop pushes once more and delivers its spool) and the store is wiped at any moment: once
    /// every receipt is delivered and every window rebuilt, the store's total is exactly the sum
    /// of the receipts, none lost and none counted twice.
    #[tokio::test]
    async fn a_wiped_store_is_rebuilt_from_the_ledger_and_the_writers_without_a_gap_or_an_overlap() {
        const STEP: i64 = 1_000;
        let w = window("x");
        let rebuild = |nodes: &[Node], ledger: &[Receipt]| {
            for node in nodes {
                for unseeded in node.counters.missing() {
                    node.counters.seed(&unseeded, ledger_seed(ledger, &unseeded));
                }
            }
        };
        for seed in 0..300_u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut store = InProcess::default();
            let mut nodes: Vec<Node> = (0..3).map(|i| Node::start(i, NOW.0)).collect();
            let (mut ledger, mut truth, mut clock, mut wipes) = (Vec::<Receipt>::new(), 0_i64, NOW.0, 0);
            for _ in 0..60 {
                clock += STEP;
                let i = rng.usize(..nodes.len());
                let node = &mut nodes[i];
                match rng.u8(..10) {
                    0..=3 => {
                        // A request ends: counted at once, its receipt spooled. It started after
                        // the node did.
                        let cost = rng.i64(1..100);
                        let started_at = Timestamp((clock - rng.i64(0..5 * STEP)).max(node.up_since));
                        node.counters.add(std::slice::from_ref(&w), Nanos(cost), started_at);
                        node.spool.push(Receipt { node: format!("n{i}"), started_at, cost });
                        truth += cost;
                    }
                    4 => {
                        let count = rng.usize(..=node.spool.len());
                        node.deliver(count, &mut ledger);
                    }
                    5..=6 => {
                        let _ = node.counters.sync_with(&store, Timestamp(clock)).await;
                    }
                    7 => rebuild(&nodes, &ledger),
                    8 => {
                        store = InProcess::default();
                        wipes += 1;
                    }
                    _ => {
                        let _ = node.counters.sync_with(&store, Timestamp(clock)).await;
                        let count = node.spool.len();
                        node.deliver(count, &mut ledger);
                        *node = Node::start(i, clock);
                    }
                }
            }
            for node in &mut nodes {
                let count = node.spool.len();
                node.deliver(count, &mut ledger);
            }
            for _ in 0..4 {
                clock += STEP;
                for node in &nodes {
                    node.counters.sync_with(&store, Timestamp(clock)).await.expect("sync");
                }
                rebuild(&nodes, &ledger);
            }
            let reader = Counters::new("reader");
            spend(&reader, &w);
            reader.sync_with(&store, Timestamp(clock)).await.expect("read");
            assert!(
                nodes.iter().all(|n| n.counters.missing().is_empty()),
                "seed {seed}: every window rebuilt"
            );
            // A window no node counted in since the last wipe is not in the store: nothing to read.
            let counted =
                nodes.iter().any(|n| n.counters.read_map().values().any(|e| e.state().since.is_some()));
            if counted {
                assert_eq!(spend(&reader, &w).spent, Nanos(truth), "seed {seed}: {wipes} wipes");
            }
        }
    }

    fn clock_after(counters: &Counters) -> Timestamp {
        Timestamp(counters.confirmed_at().map_or(NOW.0, |at| at.0 + 1))
    }
}
