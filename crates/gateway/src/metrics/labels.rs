//! The labels of the node's metrics: how a request ended, why a connection went to hyper, why a
//! request passed unadmitted, and the slot each label's count is kept in.

use recovea_core::FailOpenReason;
use recovea_core::caps::{CapRefusal, Scope};
use recovea_core::snapshot::ProviderKind;
use recovea_core::window::Window;

/// How a request through the proxy ended; each is a label of `recovea_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and answered by the provider (whatever its status).
    Forwarded,
    FailOpen,
    InvalidKey,
    ProviderNotConfigured,
    BodyTooLarge,
    BodyUnreadable,
    /// No room in the node's memory for request bodies (`--body-memory`) in time.
    BodyMemoryBusy,
    UnknownRoute,
    UpstreamUnreachable,
    UpstreamTimeout,
    BudgetExceeded,
    BudgetUnverifiable,
    /// Billed where the gateway cannot see it, while an armed cap covers the key.
    BudgetUnmeterable,
    RateLimited,
    /// An HTTP/1 head without exactly one valid `Host`, or whose body's length cannot be told; a
    /// body that names a member twice where the gateway reads, or starts with a byte-order mark.
    InvalidRequest,
    /// An HTTP/1 body in a transfer coding other than `chunked`.
    UnsupportedTransferCoding,
    /// The key's or its organization's model allowlist does not list the model.
    ModelNotAllowed,
    /// The key's or its organization's endpoint allowlist does not list the endpoint.
    EndpointNotAllowed,
    /// The key or its organization has its most requests in flight on this node.
    ConcurrencyLimited,
    /// `x-recovea-tags` breaks the tag rules.
    InvalidTags,
    /// Admitted and sent, but its client went away before the provider's answer came (its
    /// receipt says status 499).
    ClientClosed,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 21] = [
        Self::RateLimited,
        Self::BudgetExceeded,
        Self::BudgetUnverifiable,
        Self::BudgetUnmeterable,
        Self::Forwarded,
        Self::FailOpen,
        Self::InvalidKey,
        Self::ProviderNotConfigured,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::BodyMemoryBusy,
        Self::UnknownRoute,
        Self::UpstreamUnreachable,
        Self::UpstreamTimeout,
        Self::InvalidRequest,
        Self::UnsupportedTransferCoding,
        Self::ModelNotAllowed,
        Self::EndpointNotAllowed,
        Self::ConcurrencyLimited,
        Self::InvalidTags,
        Self::ClientClosed,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::FailOpen => "fail_open",
            Self::InvalidKey => "invalid_key",
            Self::ProviderNotConfigured => "provider_not_configured",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::BodyMemoryBusy => "body_memory_busy",
            Self::UnknownRoute => "unknown_route",
            Self::UpstreamUnreachable => "upstream_unreachable",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::BudgetExceeded => "budget_exceeded",
            Self::BudgetUnverifiable => "budget_unverifiable",
            Self::BudgetUnmeterable => "budget_unmeterable",
            Self::RateLimited => "rate_limited",
            Self::InvalidRequest => "invalid_request",
            Self::UnsupportedTransferCoding => "unsupported_transfer_coding",
            Self::ModelNotAllowed => "model_not_allowed",
            Self::EndpointNotAllowed => "endpoint_not_allowed",
            Self::ConcurrencyLimited => "concurrency_limited",
            Self::InvalidTags => "invalid_tags",
            Self::ClientClosed => "client_closed",
        }
    }
}

/// Why a client connection went to hyper's server, from the request that asked for what the
/// gateway's own HTTP/1.1 does not serve; each is a label of `recovea_http1_handed_over_total`.
/// Each of `recovea_http1::classify`'s reasons, and one of time that only the connection sees
/// (`TrailingBody`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The body did not follow its head within a moment.
    TrailingBody,
    ChunkedBody,
    /// A declared length over `--max-body-size`: the proxy refuses it unread.
    BodyTooLarge,
    /// A declared length over what the gateway reads before admission: the proxy reads it in
    /// room from the node's body budget.
    LargeBody,
    Expect,
    Upgrade,
    Http10,
    HeadOrConnect,
    /// The HTTP/2 preface (prior knowledge).
    Http2,
    HeadTooLong,
    TooManyLines,
    /// A head that does not parse (hyper answers `400`).
    Unparsable,
}

impl HandOver {
    pub(crate) const ALL: [HandOver; 12] = [
        Self::TrailingBody,
        Self::ChunkedBody,
        Self::BodyTooLarge,
        Self::LargeBody,
        Self::Expect,
        Self::Upgrade,
        Self::Http10,
        Self::HeadOrConnect,
        Self::Http2,
        Self::HeadTooLong,
        Self::TooManyLines,
        Self::Unparsable,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::TrailingBody => "trailing_body",
            Self::ChunkedBody => "chunked_body",
            Self::BodyTooLarge => "body_too_large",
            Self::LargeBody => "large_body",
            Self::Expect => "expect",
            Self::Upgrade => "upgrade",
            Self::Http10 => "http10",
            Self::HeadOrConnect => "head_or_connect",
            Self::Http2 => "http2",
            Self::HeadTooLong => "head_too_long",
            Self::TooManyLines => "too_many_lines",
            Self::Unparsable => "unparsable",
        }
    }
}

// Exhaustive, so that a reason the codec adds cannot be counted under another's label.
impl From<recovea_http1::HandOver> for HandOver {
    fn from(reason: recovea_http1::HandOver) -> Self {
        use recovea_http1::HandOver as Codec;
        match reason {
            Codec::ChunkedBody => Self::ChunkedBody,
            Codec::BodyTooLarge => Self::BodyTooLarge,
            Codec::LargeBody => Self::LargeBody,
            Codec::Expect => Self::Expect,
            Codec::Upgrade => Self::Upgrade,
            Codec::Http10 => Self::Http10,
            Codec::HeadOrConnect => Self::HeadOrConnect,
            Codec::Http2 => Self::Http2,
            Codec::HeadTooLong => Self::HeadTooLong,
            Codec::TooManyLines => Self::TooManyLines,
            Codec::Unparsable => Self::Unparsable,
        }
    }
}

/// Every reason, in the order [`reason_index`] numbers them.
pub(crate) const FAIL_OPEN_REASONS: [FailOpenReason; 4] = [
    FailOpenReason::NoSnapshot,
    FailOpenReason::SnapshotError,
    FailOpenReason::RateLimiterError,
    FailOpenReason::AdmissionPanic,
];

/// A reason's slot in [`FAIL_OPEN_REASONS`]; exhaustive, so that a new reason cannot be counted
/// under another's label.
pub(crate) fn reason_index(reason: FailOpenReason) -> usize {
    match reason {
        FailOpenReason::NoSnapshot => 0,
        FailOpenReason::SnapshotError => 1,
        FailOpenReason::RateLimiterError => 2,
        FailOpenReason::AdmissionPanic => 3,
    }
}

/// The labels of `recovea_cap_line_asks_total`: admitted, refused at the line, then the answers
/// after which the request's spend could not be confirmed (`503`, unless spend made reached the
/// limit): contended to the end, a window still unseeded to the end, no answer in time.
pub(super) const LINE_ANSWERS: [&str; 5] = ["reserved", "at_line", "contended", "unseeded", "unanswered"];

/// The `provider` label of the latency histograms: the kind of provider a request went to (or
/// would have), `none` when it was refused before one was known.
pub(super) const PROVIDERS: [&str; ProviderKind::ALL.len() + 1] =
    ["openai", "anthropic", "azure_openai", "gemini", "none"];

/// The labels of `recovea_upstream_responses_total`'s `class`: a status's hundreds.
pub(super) const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

pub(super) fn provider_index(kind: Option<ProviderKind>) -> usize {
    kind.map_or(ProviderKind::ALL.len(), ProviderKind::index)
}

/// The labels of `recovea_cap_refusals_total`, by [`cap_refusal_index`].
pub(super) const CAP_CODES: [&str; 3] = ["budget_exceeded", "budget_unverifiable", "budget_unmeterable"];
pub(super) const CAP_SCOPES: [Scope; 2] = [Scope::Organization, Scope::Key];
pub(super) const CAP_WINDOWS: [Window; 3] = [Window::Day, Window::Week, Window::Month];

/// A refusal's slot: code, scope, window.
pub(super) fn cap_refusal_index(refusal: &CapRefusal) -> (usize, usize, usize) {
    let (code, scope, window) = match refusal {
        CapRefusal::Exceeded { scope, window } | CapRefusal::BatchExceeds { scope, window, .. } => {
            (0, *scope, *window)
        }
        CapRefusal::Unverifiable { scope, window } => (1, *scope, *window),
        CapRefusal::Unmeterable { scope, window, .. } => (2, *scope, *window),
    };
    let scope = match scope {
        Scope::Organization => 0,
        Scope::Key => 1,
    };
    let window = match window {
        Window::Day => 0,
        Window::Week => 1,
        Window::Month => 2,
    };
    (code, scope, window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_slot() {
        for (i, reason) in FAIL_OPEN_REASONS.iter().enumerate() {
            assert_eq!(reason_index(*reason), i, "{reason:?}");
        }
    }
}
