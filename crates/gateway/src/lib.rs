//! The gateway node: an HTTP server that reads a request's Recovea key, admits it against the
//! in-memory snapshot, and streams it to the organization's provider with the managed key swapped in.
//!
//! **Invariant:** nothing here waits on a database or the control plane. The only inputs of a
//! decision are the snapshot installed in memory, the request and the clock.
//!
//! This file only declares the modules and what the crate exports: no module imports from it, and
//! the modules import one another top-down (`tests/module_graph.rs` holds the line).

mod access_log;
mod alarm;
mod body_budget;
mod config;
mod control_link;
pub mod feed;
mod inflight;
mod jobs;
mod line;
pub mod log_writer;
mod metered_body;
mod metering;
mod metrics;
mod node;
mod proxy;
mod ratelimit;
mod realtime;
mod refusal;
mod server;
pub mod spool;
mod throttled;
mod trace;

pub use config::{
    ConfigError, DEFAULT_ALARM_INTERVAL, DEFAULT_BODY_MEMORY, DEFAULT_GEMINI_BASE_URL, GatewayConfig,
    GatewaySettings, TraceTarget, default_max_connections,
};
pub use control_link::ControlLink;
pub use feed::book::follow_book;
pub use feed::follow_feed;
pub use metrics::Outcome;
pub use node::{Gateway, Readiness};
pub use recovea_upstream::{
    DEFAULT_HTTP2_CONNECTIONS, DEFAULT_STREAM_IDLE_TIMEOUT, Egress, PrivateNetworks, ProviderNetwork,
};
pub use server::{Server, serve};
pub use trace::DEFAULT_SERVICE_NAME;

/// Arms the failpoints named in the `FAILPOINTS` environment variable, for as long as the guard
/// lives (the whole process). Only builds with the `failpoints` feature (tests) have failpoints;
/// in every other build this does nothing and nothing can trigger one.
pub fn failpoints_from_env() -> FailpointsGuard {
    FailpointsGuard {
        #[cfg(feature = "failpoints")]
        _scenario: fail::FailScenario::setup(),
    }
}

/// Keeps the failpoints of [`failpoints_from_env`] armed while it lives.
pub struct FailpointsGuard {
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}
