//! Group commit: the receipts a connection thread finishes in one turn of its runtime are appended
//! in one `write`, not one each.
//!
//! A receipt must be on disk before the last bytes of its response leave, so every response waits
//! for its line. Under load a connection thread finishes several responses per turn of its runtime
//! (the tasks woken by one poll of its sockets), and a `write` to the spool file costs more than
//! everything else the receipt takes. So the task that queues the first receipt of a group yields
//! once: woken at once, it runs again after every task already woken, whose receipts join the
//! group, and then appends the whole group in one `write` and wakes the others. Nothing waits on a
//! timer, and no task is spawned for it (a spawned task per group cost about 4k instructions).
//!
//! A first receipt's wait dropped before it wrote (its client gone, its runtime shutting down)
//! appends the group as it goes, and whoever holds the group last appends what is still queued:
//! no receipt waits for a task that will not run.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use recovea_core::receipt::SerializedReceipt;

use super::SpoolSender;

/// The receipts one thread has queued for one spool, and the tasks waiting for their lines.
struct Group {
    sender: SpoolSender,
    state: Mutex<Queued>,
}

#[derive(Default)]
struct Queued {
    receipts: Vec<SerializedReceipt>,
    waiting: Vec<Waker>,
    /// How many receipts were ever queued here, and how many of them are written (or held in
    /// memory, the disk refusing them): a receipt is written once `written` reaches its number.
    queued: u64,
    written: u64,
}

thread_local! {
    /// This thread's groups, one per spool; weak, so that a group lives only while a receipt of it
    /// is awaited and keeps no spool open.
    static GROUPS: RefCell<Vec<Weak<Group>>> = const { RefCell::new(Vec::new()) };
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends every queued receipt in one write and wakes the tasks that wait for theirs.
    fn append(&self) {
        let waiting = {
            let mut queued = self.lock();
            if queued.receipts.is_empty() {
                return;
            }
            self.sender.append(std::mem::take(&mut queued.receipts));
            queued.written = queued.queued;
            std::mem::take(&mut queued.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.append();
    }
}

/// Queues `receipt` in this thread's group for `sender`'s spool.
pub(super) fn queue(sender: &SpoolSender, receipt: SerializedReceipt) -> Written {
    let group = GROUPS.with_borrow_mut(|groups| {
        groups.retain(|group| group.strong_count() > 0);
        let found = groups
            .iter()
            .filter_map(Weak::upgrade)
            .find(|group| Arc::ptr_eq(&group.sender.appender, &sender.appender));
        found.unwrap_or_else(|| {
            let group = Arc::new(Group { sender: sender.clone(), state: Mutex::new(Queued::default()) });
            groups.push(Arc::downgrade(&group));
            group
        })
    });
    let (number, first) = {
        let mut queued = group.lock();
        queued.receipts.push(receipt);
        queued.queued += 1;
        (queued.queued, queued.receipts.len() == 1)
    };
    let appends = if first { Appends::AfterYield } else { Appends::No };
    Written { group, number, appends }
}

/// Ready once the receipt's line is written (or the receipt held in memory, the disk refusing it).
/// Dropped before that, the receipt is still written.
#[must_use = "the receipt is on disk only once this is ready"]
pub struct Written {
    group: Arc<Group>,
    number: u64,
    appends: Appends,
}

/// Whether this wait appends its group: the first receipt's does, once the tasks already woken
/// have run.
#[derive(PartialEq, Eq)]
enum Appends {
    No,
    AfterYield,
    Now,
}

impl Future for Written {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.appends {
            Appends::AfterYield => {
                self.appends = Appends::Now;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Appends::Now => {
                self.appends = Appends::No;
                self.group.append();
                return Poll::Ready(());
            }
            Appends::No => {}
        }
        let mut queued = self.group.lock();
        if queued.written >= self.number {
            return Poll::Ready(());
        }
        if !queued.waiting.iter().any(|waiting| waiting.will_wake(cx.waker())) {
            queued.waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        if self.appends != Appends::No {
            self.group.append();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::path::Path;
    use std::sync::atomic::Ordering::Relaxed;
    use std::task::Poll;

    use recovea_core::receipt::Receipt;

    use super::super::tests::TempDir;
    use super::super::{Spool, segments};

    /// The ids of the receipts whose lines are in the spool's files.
    fn spooled(dir: &Path) -> Vec<String> {
        let mut ids = Vec::new();
        for (_, path) in segments(dir).expect("segments") {
            for line in std::fs::read_to_string(path).expect("segment").lines() {
                ids.push(serde_json::from_str::<Receipt>(line).expect("a receipt").id);
            }
        }
        ids
    }

    fn receipt(n: usize) -> Receipt {
        Receipt::example(&format!("rcpt_{n}"))
    }

    #[tokio::test]
    async fn receipts_that_end_in_one_turn_share_one_write_and_each_is_on_disk_when_its_wait_ends() {
        let dir = TempDir::new("group-turn");
        let spool = Spool::open(&dir.0).expect("spool");
        let tasks: Vec<_> = (0..10)
            .map(|n| {
                let (sender, dir) = (spool.sender.clone(), dir.0.clone());
                tokio::spawn(async move {
                    let id = receipt(n).id;
                    sender.send_grouped(receipt(n)).await;
                    assert!(spooled(&dir).contains(&id), "{id} is on disk once its wait ends");
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(spooled(&dir.0).len(), 10);
        assert_eq!(spool.stats.writes.load(Relaxed), 1, "the ten receipts of one turn share one write");
        assert_eq!(spool.stats.pending.load(Relaxed), 10);
    }

    #[tokio::test]
    async fn a_group_longer_than_one_writev_counts_each_write() {
        let dir = TempDir::new("group-long");
        let spool = Spool::open(&dir.0).expect("spool");
        let tasks: Vec<_> = (0..100)
            .map(|n| {
                let sender = spool.sender.clone();
                tokio::spawn(async move { sender.send_grouped(receipt(n)).await })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(spooled(&dir.0).len(), 100);
        assert_eq!(spool.stats.writes.load(Relaxed), 2, "64 lines a writev: 100 take two");
    }

    #[tokio::test]
    async fn a_receipt_ending_in_a_later_turn_gets_a_write_of_its_own() {
        let dir = TempDir::new("group-later");
        let spool = Spool::open(&dir.0).expect("spool");
        spool.sender.send_grouped(receipt(1)).await;
        spool.sender.send_grouped(receipt(2)).await;
        assert_eq!(spooled(&dir.0), [receipt(1).id, receipt(2).id]);
        assert_eq!(spool.stats.writes.load(Relaxed), 2);
    }

    #[tokio::test]
    async fn a_receipt_whose_wait_is_dropped_is_still_written() {
        let dir = TempDir::new("group-dropped");
        let spool = Spool::open(&dir.0).expect("spool");
        drop(spool.sender.send_grouped(receipt(1)));
        tokio::task::yield_now().await;
        assert_eq!(spooled(&dir.0), [receipt(1).id]);
    }

    #[tokio::test]
    async fn a_first_wait_dropped_after_yielding_writes_its_group_and_wakes_the_others() {
        let dir = TempDir::new("group-first-dropped");
        let spool = Spool::open(&dir.0).expect("spool");
        let mut first = Box::pin(spool.sender.send_grouped(receipt(1)));
        std::future::poll_fn(|cx| {
            assert!(first.as_mut().poll(cx).is_pending(), "the first wait yields before it writes");
            Poll::Ready(())
        })
        .await;
        let sender = spool.sender.clone();
        let second = tokio::spawn(async move { sender.send_grouped(receipt(2)).await });
        tokio::task::yield_now().await;
        assert!(spooled(&dir.0).is_empty(), "nothing is written before the group's turn ends");
        drop(first);
        second.await.expect("the second wait ends");
        assert_eq!(spooled(&dir.0), [receipt(1).id, receipt(2).id]);
        assert_eq!(spool.stats.writes.load(Relaxed), 1);
    }

    #[test]
    fn a_runtime_shut_down_before_the_write_ran_loses_no_receipt() {
        let dir = TempDir::new("group-shutdown");
        let spool = Spool::open(&dir.0).expect("spool");
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let sender = spool.sender.clone();
        // The wait yields once, and its task then never polls it again: the runtime stops first.
        runtime.block_on(async {
            let (yielded, told) = tokio::sync::oneshot::channel();
            drop(tokio::spawn(async move {
                let mut wait = Box::pin(sender.send_grouped(receipt(1)));
                std::future::poll_fn(|cx| {
                    assert!(wait.as_mut().poll(cx).is_pending(), "the first wait yields before it writes");
                    Poll::Ready(())
                })
                .await;
                let _ = yielded.send(());
                let _held = wait;
                std::future::pending::<()>().await;
            }));
            told.await.expect("the wait yielded");
        });
        assert!(spooled(&dir.0).is_empty(), "the write waits for its turn");
        drop(runtime);
        assert_eq!(spooled(&dir.0), [receipt(1).id]);
    }

    #[test]
    fn outside_a_runtime_a_receipt_is_written_at_once() {
        let dir = TempDir::new("group-outside");
        let spool = Spool::open(&dir.0).expect("spool");
        drop(spool.sender.send_grouped(receipt(1)));
        assert_eq!(spooled(&dir.0), [receipt(1).id]);
    }
}
