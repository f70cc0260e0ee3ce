//! Stores that fail as real ones do, for tests of what sits on top of them (a node's counters, its
//! rate limits): one that cannot be reached, and one that applies a push and loses the answer.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;

use recovea_core::caps::LineAnswer;
use recovea_core::ids::KeyId;
use recovea_core::timestamp::Timestamp;

use crate::rate_share::{RateShare, RateTotals, RateUsage};
use crate::shared::{CounterError, LineAsk, SharedCounters, SyncPush, SyncRead};

/// A store that cannot be reached: every call fails at once, before anything reaches it.
pub struct Unreachable;

fn refused<T: Send + 'static>() -> Pin<Box<dyn Future<Output = Result<T, CounterError>> + Send + 'static>> {
    Box::pin(std::future::ready(Err(CounterError::Unavailable("connection refused".to_owned()))))
}

impl SharedCounters for Unreachable {
    fn sync<'a>(
        &'a self,
        _: &'a str,
        _: &'a SyncPush,
        _: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<SyncRead, CounterError>> + Send + 'a>> {
        refused()
    }

    fn reserve_at_line<'a>(
        &'a self,
        _: &'a str,
        _: &'a LineAsk,
        _: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<LineAnswer, CounterError>> + Send + 'a>> {
        refused()
    }
}

impl RateShare for Unreachable {
    fn exchange<'a>(
        &'a self,
        _: &'a [(KeyId, RateUsage)],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<RateTotals>, CounterError>> + Send + 'a>> {
        refused()
    }
}

/// The store behind it applies each push (or reservation), then the answer is lost: the worst
/// ambiguous failure, since a retry cannot know it was applied. Panics if the store itself fails.
pub struct AnswerLost<S>(pub S);

impl<S> SharedCounters for AnswerLost<S>
where
    S: Deref + Send + Sync + 'static,
    S::Target: SharedCounters,
{
    fn sync<'a>(
        &'a self,
        node_id: &'a str,
        push: &'a SyncPush,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<SyncRead, CounterError>> + Send + 'a>> {
        Box::pin(async move {
            self.0.sync(node_id, push, now).await.expect("the store applies the push");
            Err(CounterError::Timeout)
        })
    }

    fn reserve_at_line<'a>(
        &'a self,
        node_id: &'a str,
        ask: &'a LineAsk,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<LineAnswer, CounterError>> + Send + 'a>> {
        Box::pin(async move {
            self.0.reserve_at_line(node_id, ask, now).await.expect("the store answers");
            Err(CounterError::Timeout)
        })
    }
}
