//! A small blocking connection pool: up to `max` connections, reused most-recent first, checked
//! before reuse when they sat idle, dropped when they broke.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Result, StoreError};

/// Opens and checks the pool's connections.
pub(crate) trait Manage: Send + Sync + 'static {
    type Conn: Send + 'static;
    fn connect(&self) -> Result<Self::Conn>;
    /// Whether a connection that sat idle still works (may ask the server).
    fn is_valid(&self, conn: &mut Self::Conn) -> bool;
    /// Whether a connection is already known to be dead (asks nobody).
    fn is_closed(&self, conn: &Self::Conn) -> bool;
}

pub(crate) struct Pool<M: Manage> {
    manager: M,
    max: usize,
    /// A connection idle for longer than this is checked before it is handed out.
    check_after: Duration,
    /// How long a caller waits for a free connection when all `max` are in use.
    wait: Duration,
    slots: Mutex<Slots<M::Conn>>,
    freed: Condvar,
}

struct Slots<C> {
    idle: Vec<(C, Instant)>,
    /// Connections open: idle or handed out.
    open: usize,
}

/// A connection on loan: it goes back to the pool when dropped, unless it broke.
pub(crate) struct Pooled<'a, M: Manage> {
    pool: &'a Pool<M>,
    conn: Option<M::Conn>,
}

impl<M: Manage> Pool<M> {
    pub(crate) fn new(manager: M, max: usize, check_after: Duration, wait: Duration) -> Self {
        Self {
            manager,
            max: max.max(1),
            check_after,
            wait,
            slots: Mutex::new(Slots { idle: Vec::new(), open: 0 }),
            freed: Condvar::new(),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots<M::Conn>> {
        // The slots are a list and a count, updated in single steps: a panic elsewhere cannot leave
        // them half-changed, so the poison flag carries no information.
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A connection: an idle one, a new one while fewer than `max` are open, or the first one
    /// returned within the wait.
    pub(crate) fn get(&self) -> Result<Pooled<'_, M>> {
        let deadline = Instant::now() + self.wait;
        let mut slots = self.slots();
        loop {
            if let Some((mut conn, since)) = slots.idle.pop() {
                if since.elapsed() < self.check_after {
                    return Ok(self.lend(conn));
                }
                drop(slots);
                if self.manager.is_valid(&mut conn) {
                    return Ok(self.lend(conn));
                }
                drop(conn);
                slots = self.slots();
                slots.open -= 1;
                continue;
            }
            if slots.open < self.max {
                slots.open += 1;
                drop(slots);
                return match self.manager.connect() {
                    Ok(conn) => Ok(self.lend(conn)),
                    Err(e) => {
                        self.slots().open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Backend(format!(
                    "all {} database connections stayed busy for {:?}",
                    self.max, self.wait
                )));
            }
            slots = self.freed.wait_timeout(slots, deadline - now).map_or_else(|p| p.into_inner().0, |r| r.0);
        }
    }

    fn lend(&self, conn: M::Conn) -> Pooled<'_, M> {
        Pooled { pool: self, conn: Some(conn) }
    }

    fn give_back(&self, conn: M::Conn) {
        if self.manager.is_closed(&conn) {
            drop(conn);
            self.slots().open -= 1;
        } else {
            self.slots().idle.push((conn, Instant::now()));
        }
        self.freed.notify_one();
    }
}

impl<M: Manage> Drop for Pool<M> {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.slots().idle);
        if idle.is_empty() {
            return;
        }
        // Closing a `postgres::Client` runs its own runtime, which panics on a thread that is already
        // inside one; the last handle to a store may well be dropped on an async worker at shutdown.
        let closing = std::thread::Builder::new().name("recovea-pg-close".into()).spawn(move || drop(idle));
        if let Ok(closing) = closing {
            let _ = closing.join();
        }
    }
}

impl<M: Manage> Deref for Pooled<'_, M> {
    type Target = M::Conn;

    fn deref(&self) -> &M::Conn {
        self.conn.as_ref().unwrap_or_else(|| unreachable!("a pooled connection is only taken on drop"))
    }
}

impl<M: Manage> DerefMut for Pooled<'_, M> {
    fn deref_mut(&mut self) -> &mut M::Conn {
        self.conn.as_mut().unwrap_or_else(|| unreachable!("a pooled connection is only taken on drop"))
    }
}

impl<M: Manage> Drop for Pooled<'_, M> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.give_back(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Connections are numbers; `closed` and `valid` say what the checks answer.
    #[derive(Default)]
    struct Fake {
        opened: AtomicUsize,
        refuse: AtomicBool,
        closed: AtomicBool,
        invalid: AtomicBool,
    }

    impl Manage for std::sync::Arc<Fake> {
        type Conn = usize;

        fn connect(&self) -> Result<usize> {
            if self.refuse.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("refused".into()));
            }
            Ok(self.opened.fetch_add(1, Ordering::SeqCst))
        }

        fn is_valid(&self, _: &mut usize) -> bool {
            !self.invalid.load(Ordering::SeqCst)
        }

        fn is_closed(&self, _: &usize) -> bool {
            self.closed.load(Ordering::SeqCst)
        }
    }

    fn pool(max: usize, check_after: Duration) -> (std::sync::Arc<Fake>, Pool<std::sync::Arc<Fake>>) {
        let fake = std::sync::Arc::new(Fake::default());
        (fake.clone(), Pool::new(fake, max, check_after, Duration::from_millis(50)))
    }

    #[test]
    fn loans_at_once_get_their_own_connections_and_returned_ones_are_reused() {
        let (fake, pool) = pool(2, Duration::from_secs(60));
        let a = pool.get().expect("a");
        let b = pool.get().expect("b");
        assert_ne!(*a, *b);
        let first = *a;
        drop(a);
        assert_eq!(*pool.get().expect("again"), first);
        assert_eq!(fake.opened.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_full_pool_waits_for_a_return_then_gives_up() {
        let (_, pool) = pool(1, Duration::from_secs(60));
        let held = pool.get().expect("held");
        assert!(matches!(pool.get(), Err(StoreError::Backend(_))), "times out while held");
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                drop(held);
            });
            pool.get().expect("handed over once returned");
        });
    }

    #[test]
    fn broken_connections_and_failed_connects_free_their_slot() {
        let (fake, pool) = pool(1, Duration::ZERO);
        fake.closed.store(true, Ordering::SeqCst);
        drop(pool.get().expect("first"));
        fake.closed.store(false, Ordering::SeqCst);
        assert_eq!(*pool.get().expect("a new one"), 1, "the closed one was not kept");

        fake.invalid.store(true, Ordering::SeqCst);
        assert_eq!(*pool.get().expect("replaced"), 2, "an idle one that fails its check is replaced");

        let (fake, pool) = self::pool(1, Duration::ZERO);
        fake.refuse.store(true, Ordering::SeqCst);
        assert!(pool.get().is_err());
        fake.refuse.store(false, Ordering::SeqCst);
        pool.get().expect("the failed connect gave its slot back");
    }
}
