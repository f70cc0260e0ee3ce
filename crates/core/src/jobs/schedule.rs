//! When each pending job is polled: every job once per interval at most, each credential once per
//! [`PollSchedule::spacing`] at most, however many jobs it has, and the most overdue job of a
//! credential first. A credential with more jobs than it can poll in an interval stretches the
//! time between two polls of each, never the rate at which its provider account is asked; other
//! credentials are not held up by it.
//!
//! Times are milliseconds on whatever clock the caller keeps (the poller's monotonic one): the
//! schedule reads no clock of its own.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use foldhash::HashMap;

/// A job's place in the schedule, as [`Due`] names it and [`PollSchedule::polled`] takes it back:
/// never reused, so that the outcome of a poll of a job that has left is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobSlot(u64);

/// The pending jobs, by credential, each credential's in the order they are due, and the
/// credentials in the order they may poll next.
#[derive(Debug)]
pub struct PollSchedule<J> {
    spacing_ms: u64,
    jobs: HashMap<JobSlot, Scheduled<J>>,
    /// Each job's slot, by its key.
    slots: HashMap<String, JobSlot>,
    next_slot: u64,
    credentials: Vec<Credential>,
    /// Each credential's place in `credentials`, by its name.
    credential_ids: HashMap<String, usize>,
    /// When each credential may poll next (the later of its spacing and its first job's due
    /// time), earliest first. Entries go stale as queues change; a new one is pushed with each
    /// change, and a stale one is dropped when it comes up.
    ready: BinaryHeap<Reverse<(u64, usize)>>,
    /// Marks the jobs each [`Self::sync`] found, so that the others leave.
    generation: u64,
}

#[derive(Debug)]
struct Scheduled<J> {
    key: String,
    job: J,
    credential: usize,
    /// When it is due; `None` while a poll of it runs.
    due_ms: Option<u64>,
    /// Failed polls in a row, for the back-off.
    failures: u32,
    /// Polls taken from this schedule.
    polls: u32,
    /// The last sync that found it pending.
    generation: u64,
}

#[derive(Debug, Default)]
struct Credential {
    /// Its jobs not being polled, by when they are due.
    queue: BTreeSet<(u64, JobSlot)>,
    /// The earliest its next poll may start.
    next_ms: u64,
}

impl Credential {
    /// When it may poll next, if it has a job waiting.
    fn ready_at(&self) -> Option<u64> {
        self.queue.first().map(|(due, _)| (*due).max(self.next_ms))
    }
}

/// How a poll of one job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// The job still runs: due again after the interval.
    Running,
    /// The poll failed: due again after a back-off that doubles with each failure in a row.
    Failed,
    /// The job ended and is settled: it leaves the schedule.
    Ended,
}

/// A job taken to be polled now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due<J> {
    pub slot: JobSlot,
    pub job: J,
    /// Failed polls in a row before this one.
    pub failures: u32,
    /// Polls of it this schedule has taken, this one included.
    pub polls: u32,
}

/// A job new to the schedule: the credential it is polled through, when it is due, and what a
/// poll of it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob<J> {
    pub credential: String,
    pub due_ms: u64,
    pub job: J,
}

/// The longest a failing job waits for its next poll.
pub const MAX_BACKOFF_MS: u64 = 15 * 60 * 1000;

impl<J: Clone> PollSchedule<J> {
    /// A schedule that starts one credential's polls at least `spacing_ms` apart.
    pub fn new(spacing_ms: u64) -> Self {
        Self {
            spacing_ms: spacing_ms.max(1),
            jobs: HashMap::default(),
            slots: HashMap::default(),
            next_slot: 0,
            credentials: Vec::new(),
            credential_ids: HashMap::default(),
            ready: BinaryHeap::new(),
            generation: 0,
        }
    }

    pub fn spacing(&self) -> u64 {
        self.spacing_ms
    }

    /// How many jobs it holds, polled now or not.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The key of the job in `slot`, while it is held.
    pub fn key(&self, slot: JobSlot) -> Option<&str> {
        self.jobs.get(&slot).map(|job| job.key.as_str())
    }

    /// Makes the pending jobs these. `key` writes a job's key into the buffer it is given (so
    /// that the jobs the schedule holds cost no allocation); `new` describes a job the schedule
    /// does not hold yet. A job it holds keeps its place (its own polls know better than the
    /// store's record); one no longer pending leaves, even while a poll of it runs (its outcome
    /// is then ignored).
    pub fn sync<'p, P: 'p>(
        &mut self,
        pending: impl IntoIterator<Item = &'p P>,
        mut key: impl FnMut(&P, &mut String),
        mut new: impl FnMut(&P) -> NewJob<J>,
    ) {
        self.generation += 1;
        let generation = self.generation;
        let mut buffer = String::new();
        for job in pending {
            buffer.clear();
            key(job, &mut buffer);
            if let Some(slot) = self.slots.get(buffer.as_str()) {
                if let Some(held) = self.jobs.get_mut(slot) {
                    held.generation = generation;
                }
                continue;
            }
            let NewJob { credential, due_ms, job } = new(job);
            let credential = match self.credential_ids.get(&credential) {
                Some(id) => *id,
                None => {
                    self.credentials.push(Credential::default());
                    self.credential_ids.insert(credential, self.credentials.len() - 1);
                    self.credentials.len() - 1
                }
            };
            let slot = JobSlot(self.next_slot);
            self.next_slot += 1;
            self.credentials[credential].queue.insert((due_ms, slot));
            let scheduled = Scheduled {
                key: buffer.clone(),
                job,
                credential,
                due_ms: Some(due_ms),
                failures: 0,
                polls: 0,
                generation,
            };
            self.jobs.insert(slot, scheduled);
            self.slots.insert(buffer.clone(), slot);
            self.reschedule(credential);
        }
        let gone: Vec<JobSlot> =
            self.jobs.iter().filter(|(_, job)| job.generation != generation).map(|(slot, _)| *slot).collect();
        for slot in gone {
            self.remove(slot);
        }
    }

    /// The jobs to poll at `now_ms`, at most `limit`: of each credential whose spacing has
    /// passed, its most overdue job, if one is due; the credentials that waited longest first.
    /// Those taken are out of their queues until [`Self::polled`] puts them back.
    pub fn take_due(&mut self, now_ms: u64, limit: usize) -> Vec<Due<J>> {
        let mut taken = Vec::new();
        while taken.len() < limit {
            let Some(Reverse((at, id))) = self.ready.peek().copied() else { break };
            if at > now_ms {
                break;
            }
            self.ready.pop();
            let credential = &mut self.credentials[id];
            if credential.ready_at() != Some(at) {
                continue; // stale: a later entry says when it is ready
            }
            let Some((_, slot)) = credential.queue.pop_first() else { continue };
            credential.next_ms = now_ms.saturating_add(self.spacing_ms);
            self.reschedule(id);
            if let Some(scheduled) = self.jobs.get_mut(&slot) {
                scheduled.due_ms = None;
                scheduled.polls = scheduled.polls.saturating_add(1);
                let (failures, polls) = (scheduled.failures, scheduled.polls);
                taken.push(Due { slot, job: scheduled.job.clone(), failures, polls });
            }
        }
        taken
    }

    /// A poll taken from the schedule came back at `now_ms`: the job is due again after
    /// `interval_ms` (running), after its back-off (failed), or leaves (ended). When it is due
    /// next, or `None` when it left (or had left).
    pub fn polled(&mut self, slot: JobSlot, polled: Polled, now_ms: u64, interval_ms: u64) -> Option<u64> {
        let scheduled = self.jobs.get_mut(&slot)?;
        let wait = match polled {
            Polled::Ended => {
                self.remove(slot);
                return None;
            }
            Polled::Running => {
                scheduled.failures = 0;
                interval_ms
            }
            Polled::Failed => {
                scheduled.failures = scheduled.failures.saturating_add(1);
                backoff_ms(scheduled.failures)
            }
        };
        let due = now_ms.saturating_add(wait);
        scheduled.due_ms = Some(due);
        let credential = scheduled.credential;
        self.credentials[credential].queue.insert((due, slot));
        self.reschedule(credential);
        Some(due)
    }

    /// Says when credential `id` may poll next, after its queue or spacing changed.
    fn reschedule(&mut self, id: usize) {
        if let Some(at) = self.credentials[id].ready_at() {
            self.ready.push(Reverse((at, id)));
        }
    }

    fn remove(&mut self, slot: JobSlot) {
        let Some(scheduled) = self.jobs.remove(&slot) else { return };
        self.slots.remove(&scheduled.key);
        if let Some(due) = scheduled.due_ms {
            self.credentials[scheduled.credential].queue.remove(&(due, slot));
            self.reschedule(scheduled.credential);
        }
    }
}

/// The wait after `failures` failed polls in a row: 2, 4, 8... seconds, at most
/// [`MAX_BACKOFF_MS`].
pub fn backoff_ms(failures: u32) -> u64 {
    2_u64.saturating_pow(failures.min(20)).saturating_mul(1000).min(MAX_BACKOFF_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    type Pending<'a> = (&'a str, &'a str, u64);

    fn sync(schedule: &mut PollSchedule<()>, jobs: &[Pending<'_>]) {
        schedule.sync(
            jobs,
            |(key, _, _), buffer| buffer.push_str(key),
            |(_, credential, due)| NewJob { credential: (*credential).into(), due_ms: *due, job: () },
        );
    }

    fn schedule(jobs: &[Pending<'_>]) -> PollSchedule<()> {
        let mut schedule = PollSchedule::new(200);
        sync(&mut schedule, jobs);
        schedule
    }

    /// The keys of the jobs taken at `now`.
    fn take(s: &mut PollSchedule<()>, now: u64, limit: usize) -> Vec<String> {
        let taken = s.take_due(now, limit);
        taken.iter().map(|due| s.key(due.slot).expect("held").to_owned()).collect()
    }

    fn polled(s: &mut PollSchedule<()>, key: &str, polled: Polled, now: u64, interval: u64) -> Option<u64> {
        let slot = *s.slots.get(key).expect("held");
        s.polled(slot, polled, now, interval)
    }

    #[test]
    fn one_credential_is_polled_once_per_spacing_most_overdue_first() {
        let mut s = schedule(&[("a2", "a", 50), ("a1", "a", 10), ("a3", "a", 900), ("b1", "b", 0)]);
        assert_eq!(take(&mut s, 100, 10), ["b1", "a1"], "one of each credential, the most overdue");
        assert!(take(&mut s, 299, 10).is_empty(), "a's spacing has not passed; b has nothing due");
        assert_eq!(take(&mut s, 300, 10), ["a2"]);
        assert!(take(&mut s, 500, 10).is_empty(), "a3 is not due yet");
        assert_eq!(take(&mut s, 900, 10), ["a3"]);
    }

    #[test]
    fn a_poll_puts_its_job_back_after_the_interval_or_the_backoff() {
        let mut s = schedule(&[("a1", "a", 0), ("a2", "a", 0)]);
        assert_eq!(take(&mut s, 0, 10), ["a1"]);
        assert_eq!(polled(&mut s, "a1", Polled::Running, 100, 30_000), Some(30_100));
        assert_eq!(take(&mut s, 200, 10), ["a2"]);
        assert_eq!(polled(&mut s, "a2", Polled::Failed, 300, 30_000), Some(2_300));
        let retry = s.take_due(2_300, 10);
        assert_eq!((s.key(retry[0].slot), retry[0].failures, retry[0].polls), (Some("a2"), 1, 2));
        assert_eq!(polled(&mut s, "a2", Polled::Failed, 2_400, 30_000), Some(6_400), "doubled");
        assert_eq!(take(&mut s, 6_400, 10), ["a2"]);
        assert_eq!(
            polled(&mut s, "a2", Polled::Running, 6_500, 30_000),
            Some(36_500),
            "back to the interval"
        );
        assert_eq!(polled(&mut s, "a2", Polled::Ended, 6_600, 30_000), None);
        assert_eq!(s.len(), 1);
        assert_eq!(backoff_ms(40), MAX_BACKOFF_MS);
    }

    #[test]
    fn a_job_gone_from_the_store_leaves_even_while_polled() {
        let mut s = schedule(&[("a1", "a", 0), ("b1", "b", 0)]);
        assert_eq!(s.take_due(0, 1).len(), 1, "the limit holds");
        let taken = s.take_due(0, 10);
        assert_eq!(taken.len(), 1);
        let key = s.key(taken[0].slot).expect("held").to_owned();
        let still: Vec<Pending<'_>> = [("b1", "b", 0)].into_iter().filter(|_| key != "b1").collect();
        sync(&mut s, &still);
        sync(&mut s, &[]);
        assert!(s.is_empty());
        assert_eq!(s.polled(taken[0].slot, Polled::Running, 10, 100), None, "its outcome is ignored");
        assert!(s.take_due(u64::MAX, 10).is_empty());
        // Its key, pending again, is a new job: the old poll's outcome still does not touch it.
        sync(&mut s, &[(key.as_str(), "a", 0)]);
        assert_eq!(s.polled(taken[0].slot, Polled::Ended, 10, 100), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_job_it_holds_keeps_its_place_when_synced_again() {
        let mut s = schedule(&[("a1", "a", 0)]);
        s.take_due(0, 10);
        polled(&mut s, "a1", Polled::Running, 0, 30_000);
        sync(&mut s, &[("a1", "a", 0)]);
        assert!(s.take_due(29_999, 10).is_empty(), "not due again because the store's record is older");
    }

    proptest! {
        /// Whatever the jobs and however the polls go, no credential is polled twice within its
        /// spacing, no job is taken twice at once, and every job due is taken within (its
        /// credential's jobs) x spacing: nobody waits on another credential.
        #[test]
        fn spacing_holds_and_every_due_job_comes_in_turn(
            jobs in proptest::collection::vec((0_u8..4, 0_u64..5_000), 1..40),
            outcomes in proptest::collection::vec(0_u8..3, 200),
        ) {
            let spacing = 200;
            let mut s = PollSchedule::new(spacing);
            let pending: Vec<(usize, u8, u64)> =
                jobs.iter().enumerate().map(|(i, (credential, due))| (i, *credential, *due)).collect();
            s.sync(
                &pending,
                |(i, _, _), buffer| buffer.push_str(&format!("j{i}")),
                |(_, credential, due)| NewJob { credential: format!("c{credential}"), due_ms: *due, job: *credential },
            );
            let mut last_start: HashMap<u8, u64> = HashMap::default();
            let mut in_flight: HashSet<String> = HashSet::new();
            let mut outcomes = outcomes.into_iter().cycle();
            // When each due job was first seen waiting, and how many jobs its credential had then.
            let mut waiting_since: HashMap<String, (u64, u64)> = HashMap::default();
            for now in (0..60_000).step_by(50) {
                for due in s.take_due(now, usize::MAX) {
                    if let Some(last) = last_start.insert(due.job, now) {
                        prop_assert!(now - last >= spacing, "credential {} at {last} then {now}", due.job);
                    }
                    let key = s.key(due.slot).expect("held").to_owned();
                    prop_assert!(in_flight.insert(key.clone()), "{key} taken twice");
                    waiting_since.remove(&key);
                    // Each poll comes back at once.
                    let polled = match outcomes.next() { Some(0) => Polled::Running, Some(1) => Polled::Failed, _ => Polled::Ended };
                    in_flight.remove(&key);
                    s.polled(due.slot, polled, now, 1_000);
                }
                // A due job of a credential with n jobs is taken within n spacings (plus the one
                // its credential may be waiting out): only jobs due before it go first, once each.
                for scheduled in s.jobs.values() {
                    if let Some(due) = scheduled.due_ms && due <= now {
                        let key = &scheduled.key;
                        let share = s.jobs.values().filter(|j| j.credential == scheduled.credential).count() as u64;
                        let (since, share) = *waiting_since.entry(key.clone()).or_insert((now, share));
                        prop_assert!(now - since <= (share + 1) * spacing, "{key} waited from {since} to {now}");
                    }
                }
            }
        }
    }
}
