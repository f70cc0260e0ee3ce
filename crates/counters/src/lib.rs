//! Spend counters behind spend caps: a node's view, the shared store it confirms against, the sync loop.
//!
//! [`Counters`] is what the request path reads (it implements [`SpendView`]) and writes (reserve,
//! settle, add); it never does I/O. [`sync_loop`] confirms it against a [`SharedCounters`] store:
//! [`InProcess`] for `recovea serve`, [`Redis`] for nodes that share spend. Deciding admission is
//! core's job (`recovea_core::caps`), not this crate's.
//!
//! [`SpendView`]: recovea_core::caps::SpendView

mod counters;
#[cfg(any(test, feature = "test-util"))]
pub mod fakes;
mod in_process;
mod rate_share;
mod rebuild;
mod redis_store;
mod redis_target;
mod shared;
mod sync_loop;

pub use counters::{
    AT_THE_LINE, CapWindow, Counters, Covered, MOST_AT_THE_LINE, Reservation, SOON, STORE_REFILL,
    SyncOutcome, line_deadline,
};
pub use in_process::InProcess;
pub use rate_share::{InProcessRateShare, RATE_KEY_TTL, RateShare, RateTotals, RateUsage, RedisRateShare};
pub use rebuild::{Rebuilt, SpendSource, WindowSpendFuture, rebuild_missing};
pub use redis_store::Redis;
pub use redis_target::RedisTls;
pub use shared::{
    Counted, CounterError, FRESH, LineAsk, LineWindow, Seed, SharedCounters, StoreOptions, SyncPush,
    SyncRead, Unseeded, WindowPush, WindowRead,
};
pub use sync_loop::{sync_loop, sync_loop_with_clock};
