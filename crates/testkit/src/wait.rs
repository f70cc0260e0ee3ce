//! Waiting in tests for what happens elsewhere (another task, another process): at most
//! [`DEADLINE`], so that a test that waits for nothing fails instead of hanging.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a test waits for an event before it says the event never came: far longer than any
/// event takes on a loaded machine, short enough to fail a run soon.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(20);

/// Asks `find` until it finds something, and returns it; panics with `what` after `within`.
///
/// For a wait with no event to await (another process's state, a store's keys expiring): `find`
/// asks the system a question, every 20 ms.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(found) = find().await {
            return found;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(POLL).await;
    }
}
