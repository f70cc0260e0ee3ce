//! One sync with the shared store: what the node pushes, what it reads back, the windows the store
//! lost (seeded again from the ledger), and when the next sync is asked for.

use super::*;

impl Counters {
    /// Seeds a window the store reported [`Unseeded`] with what the ledger holds that the store's
    /// writers do not (every receipt but those of the nodes it names from their `since`). The
    /// view counts it at once, beside what the writers hold; the next sync, asked for at once,
    /// adds it to the store's total, unless the writers changed or the store lost the window since
    /// the ledger was read (the store ignores it, and the window is reported and read again) or
    /// another node's seed came first.
    pub fn seed(&self, unseeded: &Unseeded, rebuilt: Rebuilt) {
        let Rebuilt { total, last_start } = rebuilt;
        let seed = Seed {
            total,
            counted: unseeded.counted.clone(),
            incarnation: unseeded.incarnation,
            covers_before: last_start.map_or(unseeded.window.start, |at| Timestamp(at.0.saturating_add(1))),
        };
        let window = &unseeded.window;
        let touched = self.touch(std::iter::once(window), |s| {
            let view = s.confirmed;
            // What the writers held and the ledger's other receipts: spend, whether or not the
            // store takes the seed.
            s.confirmed = s.confirmed.max(s.store_total.saturating_add(total));
            s.floor = s.floor.max(s.confirmed);
            s.seed = Some(seed.clone());
            s.missing = false;
            s.was_seeded.then_some((view, s.confirmed))
        });
        if let Some((_, Some((view, rebuilt)))) = touched.first() {
            self.lost_rebuilt.fetch_add(1, Ordering::Relaxed);
            self.lost_rebuilt_nanos.fetch_add(u64::try_from(total.0).unwrap_or(0), Ordering::Relaxed);
            self.warn_lost(window, *view, *rebuilt, total);
        } else {
            tracing::info!(cap_id = %window.cap, total = %total, "spend counter rebuilt from the ledger");
        }
        self.sync_soon();
        self.missing.send_if_modified(|missing| {
            let before = missing.len();
            missing.retain(|m| (&m.window.cap, m.window.start) != (&window.cap, window.start));
            missing.len() != before
        });
    }

    /// A window the store held seeded and lost was rebuilt: warned about at most every
    /// [`WARNING_EVERY`], with the number rebuilt since.
    fn warn_lost(&self, window: &CapWindow, view: Nanos, rebuilt: Nanos, from_ledger: Nanos) {
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        lost.0 += 1;
        if lost.1.is_none_or(|at| at.elapsed() >= WARNING_EVERY) {
            let count = std::mem::take(&mut lost.0);
            lost.1 = Some(std::time::Instant::now());
            let corrected = Nanos(rebuilt.0.saturating_sub(view.0));
            tracing::warn!(
                count,
                cap_id = %window.cap,
                window_start = window.start.0,
                %view,
                %rebuilt,
                %from_ledger,
                %corrected,
                "the counter store lost spend windows (flushed or restarted); each was rebuilt from the ledger and what the nodes hold"
            );
        }
    }

    /// Windows the store lost after they were seeded and that were rebuilt, and the spend the
    /// ledger gave back to them (the part no live node's writer held).
    pub fn lost_windows_rebuilt(&self) -> (u64, Nanos) {
        let nanos = self.lost_rebuilt_nanos.load(Ordering::Relaxed);
        (self.lost_rebuilt.load(Ordering::Relaxed), Nanos(i64::try_from(nanos).unwrap_or(i64::MAX)))
    }

    /// Windows the store reported without a ledger-rebuilt total and not seeded since.
    pub fn missing(&self) -> Vec<Unseeded> {
        self.missing.borrow().clone()
    }

    /// Follows [`missing`](Self::missing): changes after each sync that finds new missing windows.
    pub fn subscribe_missing(&self) -> watch::Receiver<Vec<Unseeded>> {
        self.missing.subscribe()
    }

    /// Pushes this node's increments and reservations to `shared` and reads the totals back. On
    /// success the counters are confirmed at `now`; on failure nothing changes and the increments
    /// wait for the next try. Concurrent calls run one after the other.
    pub async fn sync_with(
        &self,
        shared: &dyn SharedCounters,
        now: Timestamp,
    ) -> Result<SyncOutcome, CounterError> {
        let _one_at_a_time = self.sync_lock.lock().await;
        // This sync answers every ask made before it reads the windows: the next ask wakes the loop.
        self.asked_gap_ms.store(u64::MAX, Ordering::Release);
        let number = self.syncs.fetch_add(1, Ordering::AcqRel) + 1;
        self.forget(now);
        let entries: Vec<Arc<Entry>> = self.read_map().values().cloned().collect();
        let outcome = self.exchange(shared, &entries, now).await?;
        self.confirmed_at.store(now.0, Ordering::Release);
        self.confirmed_sync.fetch_max(number, Ordering::AcqRel);
        self.missing.send_if_modified(|current| {
            let changed = *current != outcome.missing;
            if changed {
                current.clone_from(&outcome.missing);
            }
            changed
        });
        Ok(outcome)
    }

    /// Pushes `entries` and folds what the store answers into their states.
    async fn exchange(
        &self,
        shared: &dyn SharedCounters,
        entries: &[Arc<Entry>],
        now: Timestamp,
    ) -> Result<SyncOutcome, CounterError> {
        let shared_line = self.line.is_some();
        let push = SyncPush {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            node_id: self.node_id.clone(),
            windows: entries.iter().map(|e| e.push(shared_line)).collect(),
        };
        let sent_at = tokio::time::Instant::now();
        let read = shared.sync(&self.instance, &push, now).await;
        if let Ok(read) = &read {
            let round_trip = sent_at.elapsed();
            self.observe_round_trip(round_trip);
            if let Some(store) = read.store_time {
                // The store read its clock about half a round trip after `now`.
                let half = i64::try_from(round_trip.as_millis() / 2).unwrap_or(i64::MAX);
                let offset = store.0.saturating_sub(now.0.saturating_add(half));
                self.clock_offset_ms.store(offset.max(NOT_MEASURED + 1), Ordering::Relaxed);
            }
        }
        let read = match read {
            Ok(read) if read.windows.len() == push.windows.len() => read,
            failed => {
                for (entry, pushed) in entries.iter().zip(&push.windows) {
                    entry.unpushed(pushed);
                }
                return Err(failed.err().unwrap_or_else(|| {
                    CounterError::Protocol("one read per pushed window expected".to_owned())
                }));
            }
        };
        // Just after the store lost its data, the windows it does not hold are not rebuilt yet:
        // requests near their lines wait, then cannot be confirmed.
        let refilling = self.store_began(&read);
        let mut missing = Vec::new();
        let mut others_active = false;
        let mut give_back = false;
        for ((entry, pushed), read) in entries.iter().zip(&push.windows).zip(read.windows) {
            let mut s = entry.state();
            let newly_acked = if pushed.end.is_some() {
                Nanos(
                    pushed.cumulative.0.saturating_sub(std::mem::replace(&mut s.acked, pushed.cumulative).0),
                )
            } else {
                Nanos::ZERO
            };
            if pushed.seed.is_some() && s.seed == pushed.seed {
                s.seed = None;
            }
            s.others_reserved = read.others_reserved;
            s.spare = s.spare.saturating_add(read.granted);
            // Spare held within a fifth of the line is room other nodes' requests find taken:
            // the next push gives it back, soon.
            give_back |= s.spare > Nanos::ZERO && s.line.is_some_and(|limit| s.near_the_line(limit));
            let others_spent = read.seeded
                && i128::from(read.total.0) > i128::from(s.confirmed.0) + i128::from(newly_acked.0);
            others_active |= read.others_reserved > Nanos::ZERO || others_spent;
            if read.seeded {
                s.was_seeded = true;
                s.confirmed = read.total;
                s.floor = read.total;
            } else {
                s.store_total = read.total;
                // The store lost the window (or never had it): keep what was known, plus what this
                // node has added since, until the ledger's total is seeded.
                s.floor = s.floor.saturating_add(newly_acked);
                s.confirmed = read.total.max(s.floor);
            }
            s.missing = !read.seeded && s.seed.is_none() && s.end.is_some();
            if let (true, Some(end), false) = (s.missing, s.end, refilling) {
                missing.push(Unseeded {
                    window: CapWindow {
                        org: entry.org.clone(),
                        cap: entry.cap.clone(),
                        start: entry.start,
                        end,
                    },
                    counted: read.counted,
                    incarnation: read.incarnation,
                });
            }
        }
        if give_back {
            self.sync_soon();
        }
        Ok(SyncOutcome { windows: push.windows.len(), missing, others_active })
    }

    /// Notes when the store's data began, and whether it began anew (the store lost its data)
    /// less than [`STORE_REFILL`] ago. A node that never saw it before (its first sync) cannot
    /// tell a loss from a first start: the nodes that saw the loss hold the rebuild back.
    fn store_began(&self, read: &crate::shared::SyncRead) -> bool {
        let (Some(began), Some(now)) = (read.store_began, read.store_time) else { return false };
        let before = self.store_began_us.swap(began, Ordering::AcqRel);
        if before != NEVER && before != began {
            let refill_ms = i64::try_from(STORE_REFILL.as_millis()).unwrap_or(i64::MAX);
            self.refill_until_ms.store(now.0.saturating_add(refill_ms), Ordering::Release);
            tracing::warn!(
                began_us = began,
                "the counter store lost its data (a restart or a flush): its windows are rebuilt from the ledger once every node has pushed its counts again"
            );
        }
        now.0 < self.refill_until_ms.load(Ordering::Acquire)
    }

    /// Resolves when a sync was asked for, with the shortest gap asked for since the last sync
    /// started: the sync loop then syncs that long after its last sync rather than at its next tick.
    pub(crate) async fn sync_asked(&self) -> Duration {
        self.wake.notified().await;
        Duration::from_millis(self.asked_gap_ms.load(Ordering::Acquire))
    }

    /// Asks the sync loop for a sync at most `gap` after its last one. A window seen for the first
    /// time asks with [`SOON`]; a request on an armed cap asks with a longer gap, and one near the
    /// line with [`SOON`]: a node spending on an armed cap learns other nodes' spend within about
    /// that gap, at the price of that many syncs a second while it spends.
    pub fn sync_within(&self, gap: Duration) {
        let ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX);
        // Only an ask shorter than those already waiting for the next sync wakes the loop: under
        // load that is once a sync, not once a request (each wake-up is a context switch).
        if ms < self.asked_gap_ms.fetch_min(ms, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// [`sync_within`](Self::sync_within) the shortest gap: a cap near its line wants other nodes'
    /// spend now.
    pub fn sync_soon(&self) {
        self.sync_within(SOON);
    }
}
