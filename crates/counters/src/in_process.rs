//! The shared store of a single process (`recovea serve`): the same semantics as Redis, in memory.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use recovea_core::ids::CapId;
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;

use crate::shared::{
    CounterError, SharedCounters, StoreOptions, SyncPush, SyncRead, WindowPush, WindowRead, expire_at,
    reserved_until,
};

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
    seeded: bool,
    /// Per writer: the last sequence and cumulative applied.
    applied: HashMap<String, (u64, Nanos)>,
    /// Per writer: the reservation and its deadline.
    reservations: HashMap<String, (Nanos, Timestamp)>,
    expire_at: Timestamp,
}

impl InProcess {
    pub fn new(options: StoreOptions) -> Self {
        Self { options, windows: Mutex::new(HashMap::new()) }
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
                        stored.apply(&writer, push.seq, p, now, &self.options);
                        stored.expire_at = expire_at(end, &self.options);
                        stored.read(&writer, now)
                    }
                    None => windows.get(&key).map(|w| w.read(&writer, now)).unwrap_or_default(),
                }
            })
            .collect();
        SyncRead { windows: read }
    }
}

impl Stored {
    fn empty(expire_at: Timestamp) -> Self {
        Self {
            total: Nanos::ZERO,
            seeded: false,
            applied: HashMap::new(),
            reservations: HashMap::new(),
            expire_at,
        }
    }

    fn apply(&mut self, writer: &str, seq: u64, p: &WindowPush, now: Timestamp, options: &StoreOptions) {
        if let Some(seed) = p.seed
            && !self.seeded
        {
            // Increments pushed before the seed are spend too, and the ledger may not have their
            // receipts yet: both are lower bounds of the truth, so the larger one stands.
            self.total = self.total.max(seed);
            self.seeded = true;
        }
        let applied = self.applied.get(writer).copied();
        if applied.is_none_or(|(applied_seq, _)| applied_seq < seq) {
            let base = applied.map_or(p.acked, |(_, cumulative)| cumulative);
            self.total = Nanos(self.total.0.saturating_add(p.cumulative.0.saturating_sub(base.0)));
            self.applied.insert(writer.to_owned(), (seq, p.cumulative));
        }
        if p.reserved == Nanos::ZERO {
            self.reservations.remove(writer);
        } else {
            self.reservations.insert(writer.to_owned(), (p.reserved, reserved_until(now, options)));
        }
        self.reservations.retain(|_, (_, until)| *until > now);
    }

    fn read(&self, writer: &str, now: Timestamp) -> WindowRead {
        let others_reserved = self
            .reservations
            .iter()
            .filter(|(w, (_, until))| w.as_str() != writer && *until > now)
            .fold(Nanos::ZERO, |sum, (_, (amount, _))| sum.saturating_add(*amount));
        WindowRead { total: self.total, others_reserved, seeded: self.seeded }
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
}
