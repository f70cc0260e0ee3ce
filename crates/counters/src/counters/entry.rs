//! One window the node tracks: the store's total and this node's increments, reservations and
//! spare room in it, what the next sync pushes of it, and when it may be forgotten.

use super::*;

pub(super) struct Entry {
    pub(super) id: u64,
    pub(super) org: OrgId,
    pub(super) cap: CapId,
    pub(super) start: Timestamp,
    pub(super) last_used: AtomicU64,
    pub(super) state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Unknown for a window that was only read.
    pub(super) end: Option<Timestamp>,
    /// The store's total as last read (or seeded); it includes `acked`.
    pub(super) confirmed: Nanos,
    /// The store's total as last read, seeded or not.
    pub(super) store_total: Nanos,
    /// The last total read while the store held a seeded total, plus what this node pushed since:
    /// while the store's total is not seeded (lost in a flush) the view never drops below it.
    pub(super) floor: Nanos,
    /// Every increment this entry added.
    pub(super) cumulative: Nanos,
    /// The part of `cumulative` the store acknowledged.
    pub(super) acked: Nanos,
    pub(super) own_reserved: Nanos,
    /// Live reservations (an estimate may be zero).
    pub(super) live: u32,
    pub(super) others_reserved: Nanos,
    /// A ledger-rebuilt total waiting to be pushed.
    pub(super) seed: Option<Seed>,
    /// The earliest start of a request counted or reserved for here (see [`WindowPush::since`]).
    pub(super) since: Option<Timestamp>,
    /// The store has held this window seeded: found unseeded again, the store lost it.
    pub(super) was_seeded: bool,
    /// The store reported the window unseeded and no seed is waiting.
    pub(super) missing: bool,
    /// The limit of the window's cap while it is armed.
    pub(super) line: Option<Nanos>,
    /// Room the store holds in this entry's reservation for requests not received yet (shared
    /// counters only); a request it covers takes its estimate from it.
    pub(super) spare: Nanos,
    /// Estimates admitted since the last push: what sizes the next spare.
    pub(super) admitted: Nanos,
    /// Estimates of requests waiting for the store's answer at the line.
    pub(super) pending: Nanos,
    /// Requests reserved at the line whose records the next push removes (their estimates are in
    /// `own_reserved` by then, or they ended).
    pub(super) fold: Vec<u64>,
    /// Spend the line counts that the store does not hold: deferred jobs' holds and settled
    /// costs, from the control plane's book ([`Counters::set_external`]).
    pub(super) external: Nanos,
}

impl Entry {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the next sync pushes for this window. On shared counters an armed window's spare is
    /// resized here: what it gives back is taken from the view before the push (no request may
    /// use room the push returns), and what it asks for more is added when granted.
    pub(super) fn push(&self, shared_line: bool) -> WindowPush {
        let mut s = self.state();
        let (grow, ceiling) = match s.line {
            Some(limit) if shared_line && s.end.is_some() => {
                let room = s.room(limit);
                let wanted = spare_wanted(limit, room, std::mem::take(&mut s.admitted));
                s.spare = s.spare.min(wanted);
                let ceiling = Nanos(spare_ceiling(limit).0.saturating_sub(s.external.0).max(0));
                (Nanos(wanted.0 - s.spare.0), Some(ceiling))
            }
            _ => {
                s.admitted = Nanos::ZERO;
                s.spare = Nanos::ZERO;
                (Nanos::ZERO, None)
            }
        };
        WindowPush {
            org: self.org.clone(),
            cap: self.cap.clone(),
            start: self.start,
            end: s.end,
            entry: self.id,
            cumulative: s.cumulative,
            since: s.since,
            reserved: s.own_reserved.saturating_add(s.spare),
            seed: s.seed.clone(),
            spare: s.spare,
            grow,
            ceiling,
            fold: std::mem::take(&mut s.fold),
        }
    }

    /// A push that failed: its records are removed at the next one, and the spare is given up
    /// until a sync confirms it again (the store may expire this node's reservation meanwhile).
    pub(super) fn unpushed(&self, pushed: &WindowPush) {
        let mut s = self.state();
        s.fold.extend_from_slice(&pushed.fold);
        s.spare = Nanos::ZERO;
    }

    pub(super) fn forgettable(&self, now: Timestamp) -> bool {
        let s = self.state();
        // A window that has not ended is kept however idle (the LRU bound of `forget` aside):
        // forgotten, its next read would count from zero and let a cap's line be crossed.
        match s.end {
            Some(end) if end.0.saturating_add(ABANDON_AFTER_END_MS) <= now.0 => true,
            Some(end) => s.is_clean() && end <= now,
            None => false,
        }
    }
}

impl State {
    /// A request that started at `started_at` counts here.
    pub(super) fn counts_from(&mut self, started_at: Timestamp) {
        self.since = Some(self.since.map_or(started_at, |since| since.min(started_at)));
    }

    /// The room left below `limit` by the spend and reservations this node knows of, its own
    /// spare aside.
    pub(super) fn room(&self, limit: Nanos) -> Nanos {
        let committed = i128::from(self.confirmed.0)
            + i128::from(self.cumulative.0.saturating_sub(self.acked.0))
            + i128::from(self.others_reserved.0)
            + i128::from(self.own_reserved.0)
            + i128::from(self.pending.0)
            + i128::from(self.external.0);
        let room = i128::from(limit.0) - committed;
        Nanos(i64::try_from(room).unwrap_or(if room < 0 { i64::MIN } else { i64::MAX }))
    }

    /// Whether no spare may be held: within a fifth of the line.
    pub(super) fn near_the_line(&self, limit: Nanos) -> bool {
        spare_wanted(limit, self.room(limit), Nanos(i64::MAX)) == Nanos::ZERO
    }

    /// Nothing here that the store has not acknowledged, and no live reservation or spare.
    pub(super) fn is_clean(&self) -> bool {
        self.live == 0
            && self.cumulative == self.acked
            && self.seed.is_none()
            && self.spare == Nanos::ZERO
            && self.pending == Nanos::ZERO
            && self.fold.is_empty()
    }
}
