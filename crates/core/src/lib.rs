//! The gateway's business rules as pure functions and plain data: no I/O, no tasks, no clock.
//!
//! Everything that decides (admission, refusals, key formats, secrets sealing) lives here so that it
//! can be unit- and property-tested without a server. Callers pass the current time and any
//! randomness in.

pub mod admission;
pub mod answer;
pub mod caps;
pub mod channel;
pub mod concurrency;
pub mod config_error;
pub mod credential;
pub mod crypto;
pub mod endpoints;
pub mod estimate;
pub mod feed;
pub mod hex;
pub mod ids;
pub mod jobs;
pub mod keys;
pub mod media;
pub mod models;
pub mod money;
pub mod node_access;
pub mod org_tokens;
pub mod pricing;
pub mod projection;
pub mod provider_kind;
pub mod ratelimit;
pub mod receipt;
pub mod snapshot;
pub mod tags;
pub mod timestamp;
pub mod usage;
pub mod window;

pub use admission::{Admitted, Decision, FailOpenReason, admit};
pub use answer::Answer;
pub use config_error::ConfigError;
pub use credential::{Credential, CredentialHeader};
pub use snapshot::Snapshot;
pub use timestamp::Timestamp;
