//! What the client and every phase of the gateway's request path share: the boxed error, the body
//! of an answer, and a body that says when it is over. A leaf: it imports nothing of the crate.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

/// Any error, boxed: what a body or an exchange fails with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// An answer's body as the client's connection takes it: a provider's (metered or not), or one
/// the gateway wrote.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// An answer's body passed through unchanged that calls `on_end` once, when the body ends (`true`),
/// fails (`false`) or is dropped (`true` only if it had ended): a request's last phase, for
/// answers nothing else meters. On drop the inner body goes first, so that whatever it settles
/// when dropped (a receipt) is settled before `on_end` runs.
pub fn on_end<F>(body: ResponseBody, on_end: F) -> ResponseBody
where
    F: FnOnce(bool) + Send + Unpin + 'static,
{
    OnEnd { body: Some(body), on_end: Some(on_end) }.boxed_unsync()
}

struct OnEnd<F: FnOnce(bool)> {
    body: Option<ResponseBody>,
    on_end: Option<F>,
}

impl<F: FnOnce(bool)> OnEnd<F> {
    fn end(&mut self, completed: bool) {
        if let Some(on_end) = self.on_end.take() {
            on_end(completed);
        }
    }
}

impl<F: FnOnce(bool) + Unpin> Body for OnEnd<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.end(true),
            Poll::Ready(Some(Err(_))) => this.end(false),
            // The server may not poll again once the body says it has ended.
            Poll::Ready(Some(Ok(_))) if this.body.as_ref().is_some_and(Body::is_end_stream) => this.end(true),
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body.as_ref().map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<F: FnOnce(bool)> Drop for OnEnd<F> {
    fn drop(&mut self) {
        let completed = self.body.as_ref().is_some_and(Body::is_end_stream);
        drop(self.body.take());
        self.end(completed);
    }
}
