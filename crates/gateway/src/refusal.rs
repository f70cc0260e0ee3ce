//! Every way the gateway itself answers a proxied request instead of the provider, and the one
//! place each becomes an outcome label and an answer.

use recovea_core::Answer;
use recovea_core::caps::CapRefusal;
use recovea_http1::{FramingError, RequestError};
use recovea_providers::rewrite::Ambiguity;

use crate::metrics::Outcome;

#[derive(Debug)]
pub(crate) enum Refusal {
    UnknownRoute,
    /// Admission refused; core decided the answer (today always the one 401).
    Admission(Answer),
    /// The named credential is missing and the client brought no provider key of its own.
    ProviderNotConfigured(String),
    BodyTooLarge(u64),
    BodyTimeout,
    BodyUnreadable,
    /// No room in the node's memory for request bodies within the body's time to be read.
    BodyMemoryBusy,
    UpstreamUnreachable,
    UpstreamTimeout,
    /// An armed cap at its line (402), unable to confirm its spend (503), covering a request the
    /// gateway cannot meter (402), or without room for a batch's estimate (402).
    Budget(CapRefusal),
    /// The key's rate limit: retry after this many milliseconds.
    RateLimited(u64),
    /// The key's or its organization's `allowed_models` does not list this model.
    ModelNotAllowed(String),
    /// The key's or its organization's `allowed_endpoints` does not list this endpoint.
    EndpointNotAllowed(String),
    /// The key (or its organization) has its `max_concurrent_requests` in flight on this node.
    ConcurrencyLimited(crate::inflight::Full),
    /// A model name too long, or holding a control character (`core::models::is_well_formed_name`).
    ModelName,
    /// `x-recovea-tags` breaks the tag rules; why.
    InvalidTags(String),
    /// A body the provider could read otherwise than the gateway: a member named twice where the
    /// gateway reads, or a byte-order mark.
    AmbiguousBody(Ambiguity),
    /// An HTTP/1 head that breaks the rules the gateway holds requests to (RFC 9112): refused
    /// before anything else, whatever its path.
    Head(RequestError),
}

impl Refusal {
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Self::UnknownRoute => Outcome::UnknownRoute,
            Self::Admission(_) => Outcome::InvalidKey,
            Self::ProviderNotConfigured(_) => Outcome::ProviderNotConfigured,
            Self::BodyTooLarge(_) => Outcome::BodyTooLarge,
            Self::BodyTimeout | Self::BodyUnreadable => Outcome::BodyUnreadable,
            Self::BodyMemoryBusy => Outcome::BodyMemoryBusy,
            Self::UpstreamUnreachable => Outcome::UpstreamUnreachable,
            Self::UpstreamTimeout => Outcome::UpstreamTimeout,
            Self::Budget(CapRefusal::Exceeded { .. } | CapRefusal::BatchExceeds { .. }) => {
                Outcome::BudgetExceeded
            }
            Self::Budget(CapRefusal::Unverifiable { .. }) => Outcome::BudgetUnverifiable,
            Self::Budget(CapRefusal::Unmeterable { .. }) => Outcome::BudgetUnmeterable,
            Self::RateLimited(_) => Outcome::RateLimited,
            Self::ModelNotAllowed(_) => Outcome::ModelNotAllowed,
            Self::EndpointNotAllowed(_) => Outcome::EndpointNotAllowed,
            Self::ConcurrencyLimited(_) => Outcome::ConcurrencyLimited,
            Self::ModelName => Outcome::InvalidRequest,
            Self::InvalidTags(_) => Outcome::InvalidTags,
            Self::AmbiguousBody(_) => Outcome::InvalidRequest,
            Self::Head(RequestError::Framing(FramingError::CodingUnsupported)) => {
                Outcome::UnsupportedTransferCoding
            }
            Self::Head(
                RequestError::Host(_)
                | RequestError::Framing(
                    FramingError::LengthInvalid
                    | FramingError::LengthRepeated
                    | FramingError::ChunkedNotLast
                    | FramingError::ChunkedRepeated,
                ),
            ) => Outcome::InvalidRequest,
        }
    }

    pub(crate) fn answer(&self) -> Answer {
        match self {
            Self::UnknownRoute => Answer::unknown_route(),
            Self::Admission(answer) => answer.clone(),
            Self::ProviderNotConfigured(name) => Answer::provider_not_configured(name),
            Self::BodyTooLarge(limit) => Answer::request_too_large(*limit),
            Self::BodyTimeout => Answer::request_body_timeout(),
            Self::BodyMemoryBusy => Answer::body_memory_busy(),
            Self::BodyUnreadable => Answer::request_body_unreadable(),
            Self::UpstreamUnreachable => Answer::upstream_unreachable(),
            Self::UpstreamTimeout => Answer::upstream_timeout(),
            Self::Budget(refusal) => refusal.answer(),
            Self::RateLimited(ms) => Answer::rate_limited(*ms),
            Self::ModelNotAllowed(model) => Answer::model_not_allowed(model),
            Self::EndpointNotAllowed(endpoint) => Answer::endpoint_not_allowed(endpoint),
            Self::ConcurrencyLimited(full) => {
                let holder = match full.holder {
                    recovea_core::concurrency::Holder::Key => "key",
                    recovea_core::concurrency::Holder::Organization => "organization",
                };
                Answer::concurrency_limit_exceeded(holder, full.limit)
            }
            Self::ModelName => Answer::invalid_model_name(),
            Self::InvalidTags(reason) => Answer::invalid_tags(reason),
            Self::AmbiguousBody(Ambiguity::RepeatedMember(path)) => Answer::repeated_member(path),
            Self::AmbiguousBody(Ambiguity::ByteOrderMark) => Answer::byte_order_mark(),
            Self::Head(RequestError::Host(_)) => Answer::invalid_host(),
            Self::Head(RequestError::Framing(FramingError::LengthInvalid | FramingError::LengthRepeated)) => {
                Answer::invalid_content_length()
            }
            Self::Head(RequestError::Framing(
                FramingError::ChunkedNotLast | FramingError::ChunkedRepeated,
            )) => Answer::invalid_transfer_encoding(),
            Self::Head(RequestError::Framing(FramingError::CodingUnsupported)) => {
                Answer::unsupported_transfer_coding()
            }
        }
    }
}
