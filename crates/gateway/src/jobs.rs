//! The node's part of deferred jobs: the control plane's book it follows (whose holds and settled
//! spend every armed line counts), the reservations of jobs it created that the book does not
//! hold yet, and the batch files it saw uploaded.
//!
//! A job's hold passes from the node to the book without a gap: the reservation the creating
//! request made stays in the node's counters (and so in the shared store, for every node) until
//! the node installs a book that holds the job, whatever the delay of the receipt's delivery.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use recovea_core::Snapshot;
use recovea_core::jobs::{BatchInput, JobBook};
use recovea_counters::{CapWindow, Counters, Reservation};
use tokio::sync::watch;

/// The most jobs a node holds for the book (the control plane away long enough to fill it): past
/// it the oldest hold goes, and its job counts again only once the book has it.
const MAX_HOLDS: usize = 100_000;
/// How long a hold waits for the book at most: a receipt undelivered that long lost its place.
const HOLD_FOR_AT_MOST: Duration = Duration::from_secs(24 * 60 * 60);
/// The most batch files a node remembers before the book has them, and for how long.
const MAX_FILES: usize = 10_000;
const FILE_FOR_AT_MOST: Duration = Duration::from_secs(60 * 60);

/// Deferred jobs as one node knows them.
pub(crate) struct NodeJobs {
    book: ArcSwap<JobBook>,
    /// The book's sequence, for a request waiting for a batch file the book does not have yet.
    installed: watch::Sender<u64>,
    holds: Mutex<HashMap<String, (Reservation, Instant)>>,
    files: Mutex<HashMap<String, (BatchInput, Instant)>>,
}

impl Default for NodeJobs {
    fn default() -> Self {
        Self {
            book: ArcSwap::from_pointee(JobBook::default()),
            installed: watch::Sender::new(0),
            holds: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
        }
    }
}

impl NodeJobs {
    pub(crate) fn book(&self) -> Arc<JobBook> {
        self.book.load_full()
    }

    /// Keeps a created job's reservation until the book holds the job.
    pub(crate) fn hold(&self, key: String, reservation: Reservation) {
        if self.book.load().jobs.contains_key(&key) {
            reservation.settle(recovea_core::money::Nanos::ZERO);
            return;
        }
        let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        if holds.len() >= MAX_HOLDS
            && let Some(oldest) = holds.iter().min_by_key(|(_, (_, at))| *at).map(|(key, _)| key.clone())
        {
            holds.remove(&oldest);
        }
        holds.insert(key, (reservation, Instant::now()));
    }

    /// How many created jobs wait for the book.
    #[cfg(test)]
    pub(crate) fn holds(&self) -> usize {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Remembers a batch file uploaded through this node until the book has it.
    pub(crate) fn remember_file(&self, key: String, input: BatchInput) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.retain(|_, (_, at)| at.elapsed() < FILE_FOR_AT_MOST);
        if files.len() >= MAX_FILES {
            return;
        }
        files.insert(key, (input, Instant::now()));
    }

    /// The estimate of a batch file, from this node's memory or the book; waits up to `wait` for
    /// a book that has it (uploaded through another node a moment ago).
    pub(crate) async fn batch_file(&self, key: &str, wait: Duration) -> Option<BatchInput> {
        let find = || {
            let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            files
                .get(key)
                .map(|(input, _)| input.clone())
                .or_else(|| self.book.load().files.get(key).map(|f| f.input.clone()))
        };
        if let Some(found) = find() {
            return Some(found);
        }
        let mut installed = self.installed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if tokio::time::timeout_at(deadline, installed.changed()).await.is_err() {
                return None;
            }
            if let Some(found) = find() {
                return Some(found);
            }
        }
    }

    /// Makes `book` the one every line counts: its totals go into the counters' windows, the holds
    /// of jobs it has are released (the book holds them now), the files it has are forgotten.
    pub(crate) fn install(&self, book: JobBook, snapshot: Option<&Snapshot>, counters: &Counters) {
        {
            let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
            let taken: Vec<String> = holds
                .iter()
                .filter(|(key, (_, at))| book.jobs.contains_key(*key) || at.elapsed() > HOLD_FOR_AT_MOST)
                .map(|(key, _)| key.clone())
                .collect();
            for key in taken {
                if let Some((reservation, _)) = holds.remove(&key) {
                    // Ended into the book, not refunded: settled at nothing, its spare not given back.
                    reservation.settle(recovea_core::money::Nanos::ZERO);
                }
            }
        }
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| !book.files.contains_key(key));
        let seq = book.seq;
        self.book.store(Arc::new(book));
        self.count(snapshot, counters);
        self.installed.send_replace(seq);
    }

    /// Puts the book's spend on the windows of every cap of `snapshot` (after either changed).
    pub(crate) fn count(&self, snapshot: Option<&Snapshot>, counters: &Counters) {
        let Some(snapshot) = snapshot else { return };
        let book = self.book.load();
        let totals: Vec<(CapWindow, recovea_core::money::Nanos)> = snapshot
            .orgs()
            .flat_map(|org| {
                book.window_totals(org.caps.iter()).into_iter().map(|t| {
                    (CapWindow { org: org.id.clone(), cap: t.cap, start: t.start, end: t.end }, t.total)
                })
            })
            .collect();
        counters.set_external(&totals);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::caps::{Cap, Scope, SpendView};
    use recovea_core::ids::{CapId, KeyId, OrgId};
    use recovea_core::jobs::{JobWire, book_key};
    use recovea_core::money::Nanos;
    use recovea_core::snapshot::SnapshotBuilder;
    use recovea_core::window::Window;
    use recovea_counters::Covered;

    fn setup() -> (Snapshot, Cap, Arc<Counters>) {
        let org = OrgId::parse("org_a").expect("id");
        let cap = Cap {
            id: CapId::parse("cap_m").expect("id"),
            org_id: org.clone(),
            scope: Scope::Organization,
            key_id: None,
            window: Window::Month,
            limit: Nanos(1_000),
            hard_stop: true,
            alert_at_permille: Vec::new(),
            alert_webhook: None,
        };
        let mut b = SnapshotBuilder::new(1);
        b.org(org);
        b.cap(cap.clone());
        (b.build(), cap, Counters::new("node"))
    }

    #[tokio::test]
    async fn a_created_jobs_reservation_holds_until_the_book_has_the_job() {
        let (snapshot, cap, counters) = setup();
        let jobs = NodeJobs::default();
        let now = recovea_core::Timestamp::from_system_time(std::time::SystemTime::now());
        let window = crate::node::cap_window(&cap, now);
        let spend = || SpendView::spend(counters.as_ref(), &cap.org_id, &cap.id, window.start);
        let reservation =
            counters.reserve(&[Covered { window: window.clone(), line: Some(cap.limit) }], Nanos(300), now);
        let key = book_key(cap.org_id.as_str(), "openai", "batch_1");
        jobs.hold(key.clone(), reservation);
        assert_eq!((spend().spent, spend().reserved), (Nanos::ZERO, Nanos(300)), "held by the node");
        assert_eq!(jobs.holds(), 1);
        // A book without the job changes nothing; one with it takes the hold over.
        jobs.install(JobBook { seq: 1, ..JobBook::default() }, Some(&snapshot), &counters);
        assert_eq!(spend().reserved, Nanos(300));
        let mut book = JobBook { seq: 2, ..JobBook::default() };
        let job = JobWire {
            org_id: cap.org_id.clone(),
            key_id: KeyId::parse("key_a").expect("id"),
            started_at_ms: now.0,
            held_nanos: 300,
            settled: false,
        };
        book.hold(key.clone(), job);
        jobs.install(book, Some(&snapshot), &counters);
        assert_eq!((spend().spent, spend().reserved), (Nanos(300), Nanos::ZERO), "held by the book, once");
        assert_eq!(jobs.holds(), 0);
        // Settled for less: the book's figure is the cost.
        let mut settled = (*jobs.book()).clone();
        settled.seq = 3;
        assert!(settled.settle(&key, Nanos(120)));
        jobs.install(settled, Some(&snapshot), &counters);
        assert_eq!(spend().spent, Nanos(120));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_file_is_found_here_or_in_a_book_that_comes_within_the_wait() {
        let (snapshot, _, counters) = setup();
        let jobs = Arc::new(NodeJobs::default());
        let mut input = BatchInput::default();
        input.add(Some("gpt-4o"), 10, None);
        jobs.remember_file("org_a/openai/file-1".into(), input.clone());
        assert_eq!(jobs.batch_file("org_a/openai/file-1", Duration::ZERO).await, Some(input.clone()));
        assert_eq!(jobs.batch_file("org_a/openai/file-2", Duration::from_secs(1)).await, None);
        let later = Arc::clone(&jobs);
        let arriving = input.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut book = JobBook { seq: 1, ..JobBook::default() };
            let file = recovea_core::jobs::FileWire {
                org_id: OrgId::parse("org_a").expect("id"),
                created_at_ms: 0,
                input: arriving,
            };
            book.files.insert("org_a/openai/file-2".into(), file);
            later.install(book, Some(&snapshot), &counters);
        });
        assert_eq!(jobs.batch_file("org_a/openai/file-2", Duration::from_secs(2)).await, Some(input));
    }
}
