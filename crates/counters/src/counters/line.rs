//! A request's reservation, and asking the shared store at an armed cap's line: one atomic check
//! and reservation, asked again while the store's answer may still change (contended, unseeded).

use super::*;

impl Counters {
    /// Reserves `estimate` on each window for a request being admitted; the returned guard
    /// releases it on drop unless settled. On shared counters, an armed cap's window whose spare
    /// does not cover the estimate is left *pending*: [`ask_at_line`](Self::ask_at_line) asks the
    /// store, and the request is admitted only if the caller then
    /// [`holds`](Reservation::hold_at_line) it. When a window is armed, a sync follows within
    /// [`ARMED_SYNC_GAP`] of the reservation and again of its end: other nodes near the line must
    /// not decide on a view a whole tick old, and until this node pushes they count the
    /// reservation of a request that has ended rather than its cost. `started_at` is the request's
    /// start, as its receipt will record it: the window's count holds this node's receipts from
    /// the earliest such start on ([`WindowPush::since`]).
    pub fn reserve(
        self: &Arc<Self>,
        covered: &[Covered],
        estimate: Nanos,
        started_at: Timestamp,
    ) -> Reservation {
        self.reserve_as(covered, estimate, false, started_at)
    }

    /// [`reserve`](Self::reserve) for a batch, whose estimate must fit below each armed line
    /// rather than only find the line not yet reached: asked at the line, the store refuses it
    /// unless spend, reservations and the estimate all stay at or below the limit.
    pub fn reserve_to_fit(
        self: &Arc<Self>,
        covered: &[Covered],
        estimate: Nanos,
        started_at: Timestamp,
    ) -> Reservation {
        self.reserve_as(covered, estimate, true, started_at)
    }

    fn reserve_as(
        self: &Arc<Self>,
        covered: &[Covered],
        estimate: Nanos,
        fit: bool,
        started_at: Timestamp,
    ) -> Reservation {
        let shared = self.line.is_some();
        let mut lines = covered.iter().map(|c| c.line);
        let entries = self.touch(covered.iter().map(|c| &c.window), |s| {
            s.counts_from(started_at);
            let line = lines.next().flatten();
            s.line = line;
            s.admitted = s.admitted.saturating_add(estimate);
            let in_memory = !shared || line.is_none() || line_check(s.spare, estimate) == LineCheck::InMemory;
            if in_memory {
                if line.is_some() && shared {
                    s.spare = Nanos(s.spare.0.saturating_sub(estimate.0));
                }
                s.own_reserved = s.own_reserved.saturating_add(estimate);
                s.live = s.live.saturating_add(1);
                Slot::Held { from_spare: line.is_some() && shared }
            } else {
                // Spare too small for this request is given up: the next push hands it back.
                // Until then the store counts it, and answers `Contended` to a request that only
                // spare keeps from the line. (Were the store told how much of it is unused, the
                // in-memory admissions racing that ask would go uncounted.)
                s.spare = Nanos::ZERO;
                s.pending = s.pending.saturating_add(estimate);
                Slot::Pending
            }
        });
        let armed = covered.iter().any(|c| c.line.is_some());
        let push_on_close = armed.then(|| {
            self.sync_within(ARMED_SYNC_GAP);
            Arc::clone(self)
        });
        Reservation { entries, estimate, fit, open: true, record: None, push_on_close }
    }

    /// Asks the store at the line for the reservation's pending windows (see
    /// [`Counters::reserve`]): one atomic check and reservation, which the request waits for up to
    /// [`line_deadline`] of the store's recent round trip per ask. A contended answer is asked
    /// again for up to [`CONTENDED_WAIT`], an unseeded one for up to [`UNSEEDED_WAIT`] (the sync
    /// each asks for finds the window missing, and the ledger's total is seeded). `None` when the
    /// store did not answer in time or failed (counted, and warned about now and then); the caller
    /// decides with `recovea_core::caps::decide_at_line`. The answer's window indexes follow
    /// [`Reservation::pending`]'s order.
    pub async fn ask_at_line(&self, reservation: &mut Reservation, now: Timestamp) -> Option<LineAnswer> {
        let store = self.line.as_ref()?;
        let windows: Vec<LineWindow> = reservation
            .entries
            .iter()
            .filter(|(_, slot)| *slot == Slot::Pending)
            .map(|(entry, _)| {
                let s = entry.state();
                LineWindow {
                    org: entry.org.clone(),
                    cap: entry.cap.clone(),
                    start: entry.start,
                    end: s.end.unwrap_or(entry.start),
                    limit: Nanos(s.line.unwrap_or(Nanos::ZERO).0.saturating_sub(s.external.0)),
                }
            })
            .collect();
        if windows.is_empty() {
            return Some(LineAnswer::Reserved);
        }
        let record = self.next_record.fetch_add(1, Ordering::Relaxed);
        let ask = LineAsk { record, estimate: reservation.estimate, fit: reservation.fit, windows };
        let started = tokio::time::Instant::now();
        loop {
            // Until an answer says nothing was written, the record may be in the store.
            reservation.record = Some(record);
            let deadline = line_deadline(self.store_round_trip());
            let asked_at = tokio::time::Instant::now();
            let answer =
                tokio::time::timeout(deadline, store.reserve_at_line(&self.instance, &ask, now)).await;
            match &answer {
                Ok(Ok(_)) => self.observe_round_trip(asked_at.elapsed()),
                // A late answer tells the store is slow: the next asks wait longer.
                Err(_) => {
                    self.observe_round_trip(deadline);
                    self.unanswered(deadline, None);
                }
                Ok(Err(error)) => self.unanswered(deadline, Some(error)),
            }
            match answer {
                // The holders of spare give it back at their next sync; the ledger's total of an
                // unseeded window is seeded after the sync that finds it missing. This node's own
                // view follows either way.
                Ok(Ok(answer)) if started.elapsed() < asked_again_for(answer, deadline) => {
                    reservation.record = None;
                    self.sync_soon();
                    tokio::time::sleep(ASK_AGAIN_AFTER).await;
                }
                Ok(Ok(LineAnswer::Reserved)) => return Some(LineAnswer::Reserved),
                Ok(Ok(answer)) => {
                    reservation.record = None;
                    return Some(answer);
                }
                Ok(Err(_)) | Err(_) => return None,
            }
        }
    }
}

/// How a request holds its estimate on one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// In this node's own reservations; `from_spare` when the estimate came out of the spare.
    Held { from_spare: bool },
    /// Waiting for the store's answer at the line.
    Pending,
}

/// A request's reservation on its windows. [`settle`](Self::settle) it with the cost; dropping it
/// unsettled releases it.
pub struct Reservation {
    entries: Vec<(Arc<Entry>, Slot)>,
    estimate: Nanos,
    /// The estimate must fit below the line (see [`Counters::reserve_to_fit`]).
    fit: bool,
    open: bool,
    /// The request's record at the line, while it may be in the store.
    record: Option<u64>,
    /// The counters to ask for a sync when the reservation ends (an armed one).
    push_on_close: Option<Arc<Counters>>,
}

impl Reservation {
    /// Whether windows wait for the store's answer at the line.
    pub fn is_pending(&self) -> bool {
        self.entries.iter().any(|(_, slot)| *slot == Slot::Pending)
    }

    /// The windows waiting for the store's answer, in the order of its window indexes.
    pub fn pending(&self) -> Vec<(CapId, Timestamp)> {
        self.entries
            .iter()
            .filter(|(_, slot)| *slot == Slot::Pending)
            .map(|(entry, _)| (entry.cap.clone(), entry.start))
            .collect()
    }

    /// The request was admitted at the line: its pending windows hold its estimate from now on,
    /// and the record the store may hold for it is removed at the next push.
    pub fn hold_at_line(&mut self) {
        let record = self.record.take();
        for (entry, slot) in &mut self.entries {
            if *slot != Slot::Pending {
                continue;
            }
            let mut s = entry.state();
            s.pending = Nanos(s.pending.0.saturating_sub(self.estimate.0));
            s.own_reserved = s.own_reserved.saturating_add(self.estimate);
            s.live = s.live.saturating_add(1);
            s.fold.extend(record);
            *slot = Slot::Held { from_spare: false };
        }
    }

    /// The reservation goes and `cost` counts at once in `spent` (before it is confirmed).
    pub fn settle(mut self, cost: Nanos) {
        self.close(Some(cost));
    }

    /// `cost`: the request ran and cost this; `None`: it was not admitted after all, so what it
    /// took from the spare goes back there (the store still holds it).
    fn close(&mut self, cost: Option<Nanos>) {
        if !std::mem::replace(&mut self.open, false) {
            return;
        }
        let record = self.record.take();
        for (entry, slot) in &self.entries {
            let mut s = entry.state();
            match slot {
                Slot::Held { from_spare } => {
                    s.own_reserved = Nanos(s.own_reserved.0.saturating_sub(self.estimate.0));
                    s.live = s.live.saturating_sub(1);
                    if cost.is_none() && *from_spare {
                        s.spare = s.spare.saturating_add(self.estimate);
                    }
                }
                Slot::Pending => {
                    s.pending = Nanos(s.pending.0.saturating_sub(self.estimate.0));
                    s.fold.extend(record);
                }
            }
            if let Some(cost) = cost {
                s.cumulative = s.cumulative.saturating_add(cost);
            }
        }
        if let Some(counters) = &self.push_on_close {
            counters.sync_within(ARMED_SYNC_GAP);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.close(None);
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field(
                "windows",
                &self.entries.iter().map(|(e, _)| (e.cap.as_str(), e.start.0)).collect::<Vec<_>>(),
            )
            .field("estimate", &self.estimate)
            .finish()
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::*;

    #[test]
    fn the_line_waits_for_a_slow_store_within_bounds() {
        assert_eq!(line_deadline(Duration::ZERO), AT_THE_LINE, "never less than the floor");
        assert_eq!(line_deadline(Duration::from_millis(1)), AT_THE_LINE);
        assert_eq!(line_deadline(Duration::from_millis(150)), Duration::from_millis(600));
        assert_eq!(
            line_deadline(Duration::from_millis(400)),
            MOST_AT_THE_LINE,
            "never more than the ceiling"
        );
        assert_eq!(line_deadline(Duration::MAX), MOST_AT_THE_LINE);
    }

    #[test]
    fn the_round_trip_follows_the_store() {
        let counters = Counters::new("node_test");
        assert_eq!(counters.store_round_trip(), Duration::ZERO);
        counters.observe_round_trip(Duration::from_millis(8));
        assert_eq!(counters.store_round_trip(), Duration::from_millis(8), "the first sample is taken whole");
        for _ in 0..64 {
            counters.observe_round_trip(Duration::from_millis(400));
        }
        let slow = counters.store_round_trip();
        assert!(slow > Duration::from_millis(390) && slow <= Duration::from_millis(400), "{slow:?}");
    }
}
