//! Silence limits: an answer whose provider stops sending, or whose client stops reading, is cut
//! after `--stream-idle-timeout`, so that what the request holds (its cap reservation, its provider
//! connection) is given back rather than kept for as long as the stall lasts.
//!
//! While bytes move, a limit costs no timer operation: its timer is made at the first wait, and a
//! wait that follows movement moves the deadline later, which tokio does in place (one atomic
//! compare-and-swap) while the timer is pending. With the heartbeat of the gateway's connection
//! threads a second away, a deadline minutes away never costs a system call to set.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::task::AbortHandle;
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, ResponseBody};

pin_project! {
    /// Ready once nothing has moved for its limit while something was awaited.
    pub struct Stall {
        #[pin]
        sleep: Option<Sleep>,
        limit: Duration,
        // Whether something moved since the deadline was last set: the next wait sets it anew.
        moved: bool,
    }
}

impl Stall {
    pub fn new(limit: Duration) -> Self {
        Self { sleep: None, limit, moved: true }
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Bytes moved: the silence, if one follows, is timed from the next wait.
    pub fn moved(self: Pin<&mut Self>) {
        *self.project().moved = true;
    }

    /// Called on each wait: ready once the waits since the last movement have lasted the limit.
    pub fn poll_stalled(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if std::mem::take(this.moved) {
            let deadline = Instant::now() + *this.limit;
            match this.sleep.as_mut().as_pin_mut() {
                Some(sleep) => sleep.reset(deadline),
                None => this.sleep.set(Some(tokio::time::sleep_until(deadline))),
            }
        }
        match this.sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx),
            // Not reached: `moved` starts true, so the first wait makes the timer.
            None => Poll::Pending,
        }
    }
}

/// Why an answer was cut: nothing moved for the limit.
#[derive(Debug)]
pub(crate) struct Stalled {
    pub(crate) what: &'static str,
    pub(crate) limit: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} for {:?}: the answer is cut", self.what, self.limit)
    }
}

impl std::error::Error for Stalled {}

/// An HTTP/2 answer, cut once its client gives it no room for `limit`.
///
/// HTTP/2 holds a stream's body back while the client grants its stream no flow-control window:
/// hyper then does not poll the body at all, so nothing in the body can notice. A watchdog task
/// does: once the body has waited that long for the client (a body waiting for the provider has
/// its own limit), it drops the body, which writes the receipt, settles the reservation and
/// closes the provider's connection. The stream itself ends when the client next reads it (it
/// is reset) or closes the connection. Only answers that hyper serves over HTTP/2 pay for this (a
/// task and a lock per answer); HTTP/1.1 is bounded by its connection's writes (see
/// the gateway's `server::h1`).
pub fn watch_unread(response: Response<ResponseBody>, limit: Duration) -> Response<ResponseBody> {
    if response.body().is_end_stream() {
        return response;
    }
    response.map(|body| {
        let shared = Arc::new(Mutex::new(Watched { body: Some(body), ready_at: Some(Instant::now()) }));
        let watchdog = tokio::spawn(watchdog(Arc::downgrade(&shared), limit)).abort_handle();
        Unread { shared, watchdog, limit }.boxed_unsync()
    })
}

struct Watched {
    /// `None` once the watchdog cut it.
    body: Option<ResponseBody>,
    /// When the body last gave a frame; `None` while it waits for the provider.
    ready_at: Option<Instant>,
}

struct Unread {
    shared: Arc<Mutex<Watched>>,
    watchdog: AbortHandle,
    limit: Duration,
}

impl Body for Unread {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut watched = lock(&self.shared);
        let Some(body) = watched.body.as_mut() else {
            let cut = Stalled { what: "the client read nothing", limit: self.limit };
            return Poll::Ready(Some(Err(cut.into())));
        };
        let polled = Pin::new(body).poll_frame(cx);
        watched.ready_at = polled.is_ready().then(Instant::now);
        polled
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.shared).body.as_ref().is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        lock(&self.shared).body.as_ref().map_or_else(SizeHint::default, Body::size_hint)
    }
}

impl Drop for Unread {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

async fn watchdog(watched: Weak<Mutex<Watched>>, limit: Duration) {
    let mut deadline = Instant::now() + limit;
    loop {
        tokio::time::sleep_until(deadline).await;
        let Some(watched) = watched.upgrade() else { return };
        let cut = {
            let mut watched = lock(&watched);
            match watched.ready_at {
                Some(at) if at + limit <= Instant::now() => watched.body.take(),
                Some(at) => {
                    deadline = at + limit;
                    continue;
                }
                None => {
                    deadline = Instant::now() + limit;
                    continue;
                }
            }
        };
        tracing::debug!(limit = ?limit, "an HTTP/2 client read nothing of its answer: the answer is cut");
        // Dropped outside the lock: the receipt is written here.
        drop(cut);
        return;
    }
}

fn lock(watched: &Mutex<Watched>) -> MutexGuard<'_, Watched> {
    // Nothing can be left half-updated: each update is one field.
    watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_timed_from_the_last_movement() {
        let limit = Duration::from_secs(10);
        let stall = Stall::new(limit);
        tokio::pin!(stall);
        let start = Instant::now();
        let pending = poll_fn(|cx| Poll::Ready(stall.as_mut().poll_stalled(cx))).await;
        assert!(pending.is_pending());
        tokio::time::sleep(Duration::from_secs(7)).await;
        stall.as_mut().moved();
        // Moved at 7 s: the limit now runs to 17 s, not 10 s.
        poll_fn(|cx| stall.as_mut().poll_stalled(cx)).await;
        let waited = Instant::now() - start;
        assert!(waited >= Duration::from_secs(17) && waited < Duration::from_secs(18), "{waited:?}");
    }
}
