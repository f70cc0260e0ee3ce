//! The shared store of a single process (`recovea serve`): the same semantics as Redis, in memory.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use recovea_core::ids::CapId;
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;

use recovea_core::caps::LineAnswer;

use crate::shared::{
    Counted, CounterError, FRESH, LineAsk, Seed, SharedCounters, StoreOptions, SyncPush, SyncRead,
    WindowPush, WindowRead, counted_per_node, expire_at, line_member, line_members, reserved_until,
};

/// Numbers every window's life in every in-process store (see [`Unseeded::incarnation`]), from
/// after [`FRESH`].
///
/// [`Unseeded::incarnation`]: crate::Unseeded::incarnation
static INCARNATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(FRESH + 1);

/// One process's store: never unavailable, so a node syncing against it is always confirmed.
/// Its data ends with the process; windows are then rebuilt from the ledger (see
/// [`WindowRead::seeded`]).
#[derive(Debug, Default)]
pub struct InProcess {
    options: StoreOptions,
    windows: Mutex<HashMap<(CapId, Timestamp), Stored>>,
}

#[derive(Debug)]
struct Stored {
    total: Nanos,
    /// The seed added to `total`, and what it left out (see [`Seed`]).
    seed: Option<Seed>,
    /// Per writer: what it counts (see [`Counted`]).
    counted: HashMap<String, Counted>,
    /// Which life of the window this is (see [`Unseeded::incarnation`]).
    ///
    /// [`Unseeded::incarnation`]: crate::Unseeded::incarnation
    incarnation: u64,
    /// Per writer: the last sequence and cumulative applied.
    applied: HashMap<String, (u64, Nanos)>,
    /// Per writer, and per request reserved at the line: the reservation and its deadline.
    reservations: HashMap<String, (Nanos, Timestamp)>,
    /// Per writer: the spare part of its reservation.
    spare: HashMap<String, Nanos>,
    expire_at: Timestamp,
}

impl InProcess {
    pub fn new(options: StoreOptions) -> Self {
        Self { options, windows: Mutex::new(HashMap::new()) }
    }

    /// Loses every window, as a restarted store does: what tests and fault experiments stand a
    /// flush with.
    pub fn clear(&self) {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Whether the store holds the window at `now` (it expires `key_margin` after its end).
    pub fn contains(&self, cap: &CapId, start: Timestamp, now: Timestamp) -> bool {
        let windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.get(&(cap.clone(), start)).is_some_and(|w| w.expire_at > now)
    }

    fn sync_now(&self, node_id: &str, push: &SyncPush, now: Timestamp) -> SyncRead {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.retain(|_, w| w.expire_at > now);
        let read = push
            .windows
            .iter()
            .map(|p| {
                let writer = format!("{node_id}/{}", p.entry);
                let key = (p.cap.clone(), p.start);
                match p.end {
                    Some(end) => {
                        let stored = windows
                            .entry(key)
                            .or_insert_with(|| Stored::empty(expire_at(end, &self.options)));
                        let granted = stored.apply(node_id, &writer, push, p, now, &self.options);
                        stored.expire_at = expire_at(end, &self.options);
                        WindowRead { granted, ..stored.read(&writer, now) }
                    }
                    None => windows.get(&key).map(|w| w.read(&writer, now)).unwrap_or_default(),
                }
            })
            .collect();
        SyncRead { windows: read, store_time: None, store_began: None }
    }

    fn reserve_at_line_now(&self, node_id: &str, ask: &LineAsk, now: Timestamp) -> LineAnswer {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut contended = false;
        for (i, w) in ask.windows.iter().enumerate() {
            let Some(stored) =
                windows.get_mut(&(w.cap.clone(), w.start)).filter(|s| s.seed.is_some() && s.expire_at > now)
            else {
                return LineAnswer::Unseeded;
            };
            stored.drop_dead(now);
            let live =
                stored.reservations.values().fold(0_i128, |sum, (amount, _)| sum + i128::from(amount.0));
            let used = i128::from(stored.total.0) + live;
            // A request may pass the line by itself; a batch must fit below it.
            let over = |used: i128| {
                if ask.fit {
                    used + i128::from(ask.estimate.0) > i128::from(w.limit.0)
                } else {
                    used >= i128::from(w.limit.0)
                }
            };
            if over(used) {
                let spare = stored.spare.values().fold(0_i128, |sum, spare| sum + i128::from(spare.0));
                if over(used - spare) {
                    return LineAnswer::AtLine(i);
                }
                contended = true;
            }
        }
        if contended {
            return LineAnswer::Contended;
        }
        let member = line_member(node_id, ask.record);
        for w in &ask.windows {
            if let Some(stored) = windows.get_mut(&(w.cap.clone(), w.start)) {
                stored
                    .reservations
                    .insert(member.clone(), (ask.estimate, reserved_until(now, &self.options)));
                stored.expire_at = stored.expire_at.max(expire_at(w.end, &self.options));
            }
        }
        LineAnswer::Reserved
    }
}

impl Stored {
    fn empty(expire_at: Timestamp) -> Self {
        Self {
            total: Nanos::ZERO,
            seed: None,
            counted: HashMap::new(),
            incarnation: INCARNATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            applied: HashMap::new(),
            reservations: HashMap::new(),
            spare: HashMap::new(),
            expire_at,
        }
    }

    /// Applies a writer's push; returns the spare granted.
    fn apply(
        &mut self,
        node_id: &str,
        writer: &str,
        push: &SyncPush,
        p: &WindowPush,
        now: Timestamp,
        options: &StoreOptions,
    ) -> Nanos {
        if let Some(since) = p.since {
            let counts = Counted { node_id: push.node_id.clone(), since };
            if self.counted.get(writer) != Some(&counts) {
                self.counted.insert(writer.to_owned(), counts);
                if let Some(seed) = &self.seed
                    && !seed.keeps_with(&push.node_id, since)
                {
                    self.total = Nanos(self.total.0.saturating_sub(seed.total.0));
                    self.seed = None;
                }
            }
        }
        if let Some(seed) = &p.seed
            && self.seed.is_none()
            && (seed.incarnation == self.incarnation || seed.incarnation == FRESH && self.counted.is_empty())
            && seed.counted == counted_per_node(self.counted.values().cloned())
        {
            // The seed holds none of what the writers count: the two add up.
            self.total = self.total.saturating_add(seed.total);
            self.seed = Some(seed.clone());
        }
        let applied = self.applied.get(writer).copied();
        if applied.is_none_or(|(applied_seq, _)| applied_seq < push.seq) {
            let base = applied.map_or(Nanos::ZERO, |(_, cumulative)| cumulative);
            self.total = Nanos(self.total.0.saturating_add(p.cumulative.0.saturating_sub(base.0)));
            self.applied.insert(writer.to_owned(), (push.seq, p.cumulative));
        }
        let members = line_members(node_id);
        for record in &p.fold {
            self.reservations.remove(&format!("{members}{record}"));
        }
        self.drop_dead(now);
        let mut granted = Nanos::ZERO;
        if let (true, Some(ceiling), true) = (p.grow > Nanos::ZERO, p.ceiling, self.seed.is_some()) {
            let others = self
                .reservations
                .iter()
                .filter(|(member, _)| member.as_str() != writer)
                .fold(0_i128, |sum, (_, (amount, _))| sum + i128::from(amount.0));
            let held = i128::from(self.total.0) + others + i128::from(p.reserved.0);
            let room = i128::from(ceiling.0) - held;
            if room > 0 {
                granted = Nanos(i64::try_from(room.min(i128::from(p.grow.0))).unwrap_or(i64::MAX));
            }
        }
        let holds = p.reserved.saturating_add(granted);
        if holds == Nanos::ZERO {
            self.reservations.remove(writer);
            self.spare.remove(writer);
        } else {
            self.reservations.insert(writer.to_owned(), (holds, reserved_until(now, options)));
            self.spare.insert(writer.to_owned(), p.spare.saturating_add(granted));
        }
        granted
    }

    /// Drops the reservations whose deadline has passed, with their spare.
    fn drop_dead(&mut self, now: Timestamp) {
        self.reservations.retain(|_, (_, until)| *until > now);
        let reservations = &self.reservations;
        self.spare.retain(|holder, _| reservations.contains_key(holder));
    }

    fn read(&self, writer: &str, now: Timestamp) -> WindowRead {
        let others_reserved = self
            .reservations
            .iter()
            .filter(|(w, (_, until))| w.as_str() != writer && *until > now)
            .fold(Nanos::ZERO, |sum, (_, (amount, _))| sum.saturating_add(*amount));
        let seeded = self.seed.is_some();
        WindowRead {
            total: self.total,
            others_reserved,
            seeded,
            granted: Nanos::ZERO,
            counted: if seeded { Vec::new() } else { counted_per_node(self.counted.values().cloned()) },
            incarnation: self.incarnation,
        }
    }
}

impl SharedCounters for InProcess {
    fn sync<'a>(
        &'a self,
        node_id: &'a str,
        push: &'a SyncPush,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<SyncRead, CounterError>> + Send + 'a>> {
        let read = self.sync_now(node_id, push, now);
        Box::pin(std::future::ready(Ok(read)))
    }

    fn reserve_at_line<'a>(
        &'a self,
        node_id: &'a str,
        ask: &'a LineAsk,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<LineAnswer, CounterError>> + Send + 'a>> {
        Box::pin(std::future::ready(Ok(self.reserve_at_line_now(node_id, ask, now))))
    }
}
