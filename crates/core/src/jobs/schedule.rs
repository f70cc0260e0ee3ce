//! When each pending job is polled: every job once per interval at most, each credential once per
//! [`PollSchedule::spacing`] at most, however many jobs it has, and the most overdue job of a
//! credential first. A credential with more jobs than it can poll in an interval stretches the
//! time between two polls of each, never the rate at which its provider account is asked; other
//! credentials are not held up by it.
//!
//! Times are milliseconds on whatever clock the caller keeps (the poller's monotonic one): the
//! schedule reads no clock of its own.

use std::collections::{BTreeSet, HashMap, HashSet};

/// The pending jobs, by credential, each credential's in the order they are due.
#[derive(Debug)]
pub struct PollSchedule<J> {
    spacing_ms: u64,
    jobs: HashMap<String, Scheduled<J>>,
    credentials: HashMap<String, Credential>,
}

#[derive(Debug)]
struct Scheduled<J> {
    job: J,
    credential: String,
    /// When it is due; `None` while a poll of it runs.
    due_ms: Option<u64>,
    /// Failed polls in a row, for the back-off.
    failures: u32,
    /// Polls taken from this schedule.
    polls: u32,
}

#[derive(Debug, Default)]
struct Credential {
    /// Its jobs not being polled, by when they are due.
    queue: BTreeSet<(u64, String)>,
    /// The earliest its next poll may start.
    next_ms: u64,
    /// Its jobs in the schedule, polled now or not.
    jobs: usize,
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
    pub key: String,
    pub job: J,
    /// Failed polls in a row before this one.
    pub failures: u32,
    /// Polls of it this schedule has taken, this one included.
    pub polls: u32,
}

/// The longest a failing job waits for its next poll.
pub const MAX_BACKOFF_MS: u64 = 15 * 60 * 1000;

impl<J: Clone> PollSchedule<J> {
    /// A schedule that starts one credential's polls at least `spacing_ms` apart.
    pub fn new(spacing_ms: u64) -> Self {
        Self { spacing_ms: spacing_ms.max(1), jobs: HashMap::new(), credentials: HashMap::new() }
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

    /// Makes the pending jobs these: `(key, credential, due_ms, job)`. A job new to the schedule
    /// is due at `due_ms`; one it holds keeps its place (its own polls know better than the
    /// store's record); one no longer pending leaves, even while a poll of it runs (its outcome is
    /// then ignored).
    pub fn sync(&mut self, pending: impl IntoIterator<Item = (String, String, u64, J)>) {
        let mut seen = HashSet::new();
        for (key, credential, due_ms, job) in pending {
            seen.insert(key.clone());
            if self.jobs.contains_key(&key) {
                continue;
            }
            let queue = self.credentials.entry(credential.clone()).or_default();
            queue.queue.insert((due_ms, key.clone()));
            queue.jobs += 1;
            self.jobs.insert(key, Scheduled { job, credential, due_ms: Some(due_ms), failures: 0, polls: 0 });
        }
        let gone: Vec<String> = self.jobs.keys().filter(|key| !seen.contains(*key)).cloned().collect();
        for key in gone {
            self.remove(&key);
        }
    }

    /// The jobs to poll at `now_ms`, at most `limit`: of each credential whose spacing has
    /// passed, its most overdue job, if one is due. Those taken are out of their queues until
    /// [`Self::polled`] puts them back.
    pub fn take_due(&mut self, now_ms: u64, limit: usize) -> Vec<Due<J>> {
        let mut ready: Vec<(u64, &String)> = self
            .credentials
            .iter()
            .filter(|(_, credential)| credential.next_ms <= now_ms)
            .filter_map(|(name, credential)| credential.queue.first().map(|(due, _)| (*due, name)))
            .filter(|(due, _)| *due <= now_ms)
            .collect();
        // The most overdue first, when the limit leaves some for the next round.
        ready.sort_unstable();
        let names: Vec<String> = ready.into_iter().take(limit).map(|(_, name)| name.clone()).collect();
        let mut taken = Vec::with_capacity(names.len());
        for name in names {
            let Some(credential) = self.credentials.get_mut(&name) else { continue };
            let Some((_, key)) = credential.queue.pop_first() else { continue };
            credential.next_ms = now_ms.saturating_add(self.spacing_ms);
            if let Some(scheduled) = self.jobs.get_mut(&key) {
                scheduled.due_ms = None;
                scheduled.polls = scheduled.polls.saturating_add(1);
                let (failures, polls) = (scheduled.failures, scheduled.polls);
                taken.push(Due { key, job: scheduled.job.clone(), failures, polls });
            }
        }
        taken
    }

    /// A poll taken from the schedule came back at `now_ms`: the job is due again after
    /// `interval_ms` (running), after its back-off (failed), or leaves (ended). When it is due
    /// next, or `None` when it left (or had left).
    pub fn polled(&mut self, key: &str, polled: Polled, now_ms: u64, interval_ms: u64) -> Option<u64> {
        let scheduled = self.jobs.get_mut(key)?;
        let wait = match polled {
            Polled::Ended => {
                self.remove(key);
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
        if let Some(credential) = self.credentials.get_mut(&scheduled.credential) {
            credential.queue.insert((due, key.to_owned()));
        }
        Some(due)
    }

    fn remove(&mut self, key: &str) {
        let Some(scheduled) = self.jobs.remove(key) else { return };
        if let Some(credential) = self.credentials.get_mut(&scheduled.credential) {
            if let Some(due) = scheduled.due_ms {
                credential.queue.remove(&(due, key.to_owned()));
            }
            credential.jobs = credential.jobs.saturating_sub(1);
            if credential.jobs == 0 {
                self.credentials.remove(&scheduled.credential);
            }
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

    fn schedule(jobs: &[(&str, &str, u64)]) -> PollSchedule<()> {
        let mut schedule = PollSchedule::new(200);
        schedule
            .sync(jobs.iter().map(|(key, credential, due)| ((*key).into(), (*credential).into(), *due, ())));
        schedule
    }

    fn keys(due: &[Due<()>]) -> Vec<&str> {
        due.iter().map(|d| d.key.as_str()).collect()
    }

    #[test]
    fn one_credential_is_polled_once_per_spacing_most_overdue_first() {
        let mut s = schedule(&[("a2", "a", 50), ("a1", "a", 10), ("a3", "a", 900), ("b1", "b", 0)]);
        assert_eq!(keys(&s.take_due(100, 10)), ["b1", "a1"], "one of each credential, the most overdue");
        assert!(s.take_due(299, 10).is_empty(), "a's spacing has not passed; b has nothing due");
        assert_eq!(keys(&s.take_due(300, 10)), ["a2"]);
        assert!(s.take_due(500, 10).is_empty(), "a3 is not due yet");
        assert_eq!(keys(&s.take_due(900, 10)), ["a3"]);
    }

    #[test]
    fn a_poll_puts_its_job_back_after_the_interval_or_the_backoff() {
        let mut s = schedule(&[("a1", "a", 0), ("a2", "a", 0)]);
        assert_eq!(keys(&s.take_due(0, 10)), ["a1"]);
        assert_eq!(s.polled("a1", Polled::Running, 100, 30_000), Some(30_100));
        assert_eq!(keys(&s.take_due(200, 10)), ["a2"]);
        assert_eq!(s.polled("a2", Polled::Failed, 300, 30_000), Some(2_300));
        let retry = s.take_due(2_300, 10);
        assert_eq!((keys(&retry), retry[0].failures, retry[0].polls), (vec!["a2"], 1, 2));
        assert_eq!(s.polled("a2", Polled::Failed, 2_400, 30_000), Some(6_400), "doubled");
        assert_eq!(keys(&s.take_due(6_400, 10)), ["a2"]);
        assert_eq!(s.polled("a2", Polled::Running, 6_500, 30_000), Some(36_500), "back to the interval");
        assert_eq!(s.polled("a2", Polled::Ended, 6_600, 30_000), None);
        assert_eq!(s.len(), 1);
        assert_eq!(backoff_ms(40), MAX_BACKOFF_MS);
    }

    #[test]
    fn a_job_gone_from_the_store_leaves_even_while_polled() {
        let mut s = schedule(&[("a1", "a", 0), ("b1", "b", 0)]);
        assert_eq!(s.take_due(0, 1).len(), 1, "the limit holds");
        let taken = s.take_due(0, 10);
        assert_eq!(taken.len(), 1);
        s.sync([("b1".to_owned(), "b".to_owned(), 0, ())].into_iter().filter(|_| taken[0].key != "b1"));
        s.sync(std::iter::empty());
        assert!(s.is_empty());
        assert_eq!(s.polled(&taken[0].key, Polled::Running, 10, 100), None, "its outcome is ignored");
        assert!(s.take_due(u64::MAX, 10).is_empty());
    }

    #[test]
    fn a_job_it_holds_keeps_its_place_when_synced_again() {
        let mut s = schedule(&[("a1", "a", 0)]);
        s.take_due(0, 10);
        s.polled("a1", Polled::Running, 0, 30_000);
        s.sync([("a1".to_owned(), "a".to_owned(), 0, ())]);
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
            s.sync(jobs.iter().enumerate().map(|(i, (credential, due))| {
                (format!("j{i}"), format!("c{credential}"), *due, *credential)
            }));
            let mut last_start: HashMap<u8, u64> = HashMap::new();
            let mut in_flight: HashSet<String> = HashSet::new();
            let mut outcomes = outcomes.into_iter().cycle();
            // When each due job was first seen waiting, and how many jobs its credential had then.
            let mut waiting_since: HashMap<String, (u64, u64)> = HashMap::new();
            for now in (0..60_000).step_by(50) {
                for due in s.take_due(now, usize::MAX) {
                    if let Some(last) = last_start.insert(due.job, now) {
                        prop_assert!(now - last >= spacing, "credential {} at {last} then {now}", due.job);
                    }
                    prop_assert!(in_flight.insert(due.key.clone()), "{} taken twice", due.key);
                    waiting_since.remove(&due.key);
                    // Each poll comes back at once.
                    let polled = match outcomes.next() { Some(0) => Polled::Running, Some(1) => Polled::Failed, _ => Polled::Ended };
                    in_flight.remove(&due.key);
                    s.polled(&due.key, polled, now, 1_000);
                }
                // A due job of a credential with n jobs is taken within n spacings (plus the one
                // its credential may be waiting out): only jobs due before it go first, once each.
                for (key, scheduled) in &s.jobs {
                    if let Some(due) = scheduled.due_ms && due <= now {
                        let share = s.jobs.values().filter(|j| j.credential == scheduled.credential).count() as u64;
                        let (since, share) = *waiting_since.entry(key.clone()).or_insert((now, share));
                        prop_assert!(now - since <= (share + 1) * spacing, "{key} waited from {since} to {now}");
                    }
                }
            }
        }
    }
}
