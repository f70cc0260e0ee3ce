//! The receipt of a request in flight: held while the provider is asked, then carried by the
//! answer's body, which the usage tap reads as it passes. Whichever holds it writes it exactly
//! once: at the body's end, on an error, or when dropped by a client that went away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use recovea_providers::rewrite::UsageChunkFilter;
use recovea_providers::usage::{Tapped, UsageTap};
use recovea_upstream::BoxError;

use crate::metering::{CLIENT_CLOSED, Metered};
use crate::node::Shared;
use crate::spool::Written;

/// The receipt of a request from the moment it is sent to the provider until its answer's body
/// takes over: dropped unanswered (the client went away mid-flight), it writes the receipt itself.
pub(crate) struct PendingReceipt {
    shared: Arc<Shared>,
    metered: Option<Metered>,
}

impl PendingReceipt {
    /// `metered`'s request is about to be sent to the provider.
    pub(crate) fn new(shared: Arc<Shared>, mut metered: Metered) -> Self {
        metered.timing.sent_at = Some(Instant::now());
        Self { shared, metered: Some(metered) }
    }

    /// Hands the request over to whoever writes its receipt now.
    pub(crate) fn take(mut self) -> Metered {
        self.metered.take().expect("a pending receipt is taken once: take consumes it")
    }
}

impl Drop for PendingReceipt {
    fn drop(&mut self) {
        if let Some(metered) = self.metered.take() {
            self.shared.meter.record(&self.shared.metrics, metered, CLIENT_CLOSED, Tapped::default());
        }
    }
}

/// Everything needed to write the receipt when the body is over.
struct Pending {
    shared: Arc<Shared>,
    request: Metered,
    status: u16,
}

/// A provider's response body on its way to the client: passed through frame by frame, read by
/// the usage tap, and (when the client did not ask for it) without the usage-only chunk the
/// gateway asked for. Its receipt is written exactly once: at the end, on an error, or on drop.
pub(crate) struct MeteredBody<B> {
    inner: B,
    tap: Option<UsageTap>,
    filter: Option<UsageChunkFilter>,
    pending: Option<Pending>,
    /// The receipt's line on its way to the spool, and the last bytes that wait for it.
    written: Option<Written>,
    last: Option<Bytes>,
    done: bool,
}

impl<B> MeteredBody<B> {
    pub(crate) fn new(
        inner: B,
        shared: Arc<Shared>,
        mut request: Metered,
        status: u16,
        event_stream: bool,
        strip_usage_chunk: bool,
    ) -> Self {
        // Made as the provider's answer's head arrives.
        let timing = &mut request.timing;
        timing.first_byte = Some(timing.sent_at.unwrap_or(timing.received_at).elapsed());
        Self {
            inner,
            tap: Some(match &request.creating {
                Some(creating) => {
                    UsageTap::new(request.surface, event_stream).naming(creating.creation(), event_stream)
                }
                None => UsageTap::new(request.surface, event_stream),
            }),
            filter: (strip_usage_chunk && event_stream).then(UsageChunkFilter::new),
            pending: Some(Pending { shared, request, status }),
            written: None,
            last: None,
            done: false,
        }
    }

    fn finish(&mut self) {
        if let (Some(pending), Some(tap)) = (self.pending.take(), self.tap.take()) {
            let shared = &pending.shared;
            shared.meter.record(&shared.metrics, pending.request, pending.status, tap.finish());
        }
    }

    /// The body's end: the receipt is spooled before the last bytes go, so that no crash can leave
    /// a completed response without one. Its line is written with those of the responses that end
    /// alongside it (`spool::Written`).
    fn end(&mut self, last: Bytes, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        if let (Some(pending), Some(tap)) = (self.pending.take(), self.tap.take()) {
            let shared = &pending.shared;
            self.written = Some(shared.meter.record_grouped(
                &shared.metrics,
                pending.request,
                pending.status,
                tap.finish(),
            ));
        }
        self.last = (!last.is_empty()).then_some(last);
        self.poll_last(cx)
    }

    /// The last bytes, once the receipt's line is written.
    fn poll_last(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(written) = self.written.as_mut() {
            std::task::ready!(Pin::new(written).poll(cx));
            self.written = None;
        }
        Poll::Ready(self.last.take().map(|data| Ok(Frame::data(data))))
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return this.poll_last(cx);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    };
                    if let Some(tap) = this.tap.as_mut() {
                        tap.observe(&data);
                    }
                    let mut out = match this.filter.as_mut() {
                        Some(filter) => filter.push(data),
                        None => data,
                    };
                    if this.inner.is_end_stream() {
                        if let Some(rest) =
                            this.filter.as_mut().map(UsageChunkFilter::finish).filter(|r| !r.is_empty())
                        {
                            let mut joined = bytes::BytesMut::from(&out[..]);
                            joined.extend_from_slice(&rest);
                            out = joined.freeze();
                        }
                        return this.end(out, cx);
                    }
                    if out.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    this.finish();
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => {
                    let rest = this.filter.as_mut().map(UsageChunkFilter::finish).unwrap_or_default();
                    return this.end(rest, cx);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.written.is_none() && self.last.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // The filter may remove bytes, so an exact length would be a lie.
        match self.filter {
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

impl<B> Drop for MeteredBody<B> {
    /// A client that went away drops the body mid-stream: the upstream request is cancelled with
    /// it, and the receipt is written from what was seen.
    fn drop(&mut self) {
        self.finish();
    }
}
