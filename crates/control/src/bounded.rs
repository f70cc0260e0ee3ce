//! Store calls off the async workers, each within a time limit: a database that stops answering
//! (frozen, or a network that drops packets) costs a caller the limit, never a hang. The blocking
//! call itself goes on until the database answers or its own bounds (pool wait, statement
//! timeout) end it; the caller has its answer already.

use std::time::Duration;

use recovea_store::{Result, StoreError};

#[cfg(test)]
pub(crate) mod frozen;

/// How long a store call may take before its caller is answered, unless the control plane is told
/// otherwise: past the store's own default bounds (a 2 s pool wait, a 5 s statement timeout), so
/// that a slow statement is cancelled by the server first, and a frozen server is noticed all the
/// same.
pub const DEFAULT_STORE_LIMIT: Duration = Duration::from_secs(8);

/// Runs `work` on a blocking thread; `Unavailable` if it has not answered within `limit`.
pub(crate) async fn off_thread<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::time::timeout(limit, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(panicked)) => Err(StoreError::Backend(format!("a store call failed: {panicked}"))),
        Err(_) => Err(StoreError::Unavailable(format!("the database did not answer within {limit:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_its_limit_is_unavailable_and_one_within_it_answers() {
        // Held until the caller has given up on it: past its limit whatever the machine's speed.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let slow = off_thread(Duration::from_millis(50), move || {
            let _ = held.recv();
            Ok(1)
        });
        assert!(matches!(slow.await, Err(StoreError::Unavailable(_))));
        let _ = release.send(());
        assert_eq!(off_thread(Duration::from_secs(60), || Ok(2)).await.expect("answers"), 2);
        let failed = off_thread(Duration::from_secs(60), || -> Result<()> { Err(StoreError::NotFound) });
        assert!(matches!(failed.await, Err(StoreError::NotFound)));
    }
}
