//! The response body: a whole buffer, or SSE events paced and possibly cut by the script.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

/// What the mock sends after the response head.
pub(crate) enum MockBody {
    /// One buffer. `sized` answers get a `content-length`; unsized ones (SSE) go out chunked,
    /// as the providers' streams do.
    Once { data: Option<Bytes>, sized: bool },
    /// Events sent one by one.
    Paced(Box<Paced>),
}

/// Events sent with a pause between them, and optionally an abort or a stall after some of them.
pub(crate) struct Paced {
    events: Vec<Bytes>,
    next: usize,
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    cut_after: Option<usize>,
    stall_after: Option<usize>,
    /// Whether hyper has had a chance to flush what was sent before the cut.
    flushed: bool,
}

impl MockBody {
    pub(crate) fn json(data: Bytes) -> Self {
        Self::Once { data: Some(data), sized: true }
    }

    pub(crate) fn empty() -> Self {
        Self::Once { data: None, sized: true }
    }

    /// An SSE body; sent as one chunk unless the script paces, cuts or stalls it.
    pub(crate) fn events(
        events: Vec<Bytes>,
        gap: Duration,
        cut_after: Option<usize>,
        stall_after: Option<usize>,
    ) -> Self {
        if gap.is_zero() && cut_after.is_none() && stall_after.is_none() {
            return Self::Once { data: Some(events.concat().into()), sized: false };
        }
        Self::Paced(Box::new(Paced {
            events,
            next: 0,
            gap,
            sleep: None,
            cut_after,
            stall_after,
            flushed: false,
        }))
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            Self::Once { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Paced(paced) => paced.poll_event(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Once { data: None, .. })
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Once { data: Some(d), sized: true } => SizeHint::with_exact(d.len() as u64),
            Self::Once { data: None, .. } => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Paced {
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let exhausted = self.next >= self.events.len();
        if self.stall_after.is_some_and(|limit| self.next >= limit || exhausted) {
            // Nothing more, ever: hyper flushes what was sent and the connection stays open.
            return Poll::Pending;
        }
        if let Some(limit) = self.cut_after
            && (self.next >= limit || exhausted)
        {
            // hyper drops its unflushed write buffer when a body fails, so yield once first to
            // make sure the events before the cut reach the client.
            if !self.flushed {
                self.flushed = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err(io::Error::other("stream cut by the mock's script"))));
        }
        if exhausted {
            return Poll::Ready(None);
        }
        if self.next > 0 && !self.gap.is_zero() {
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(self.gap)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let event = self.events[self.next].clone();
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(event))))
    }
}
