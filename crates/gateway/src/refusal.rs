//! Every way the gateway itself answers a proxied request instead of the provider, and the one
//! place each becomes an outcome label, an answer, and a decision on the connection: a refusal is
//! answered as [`Refused`], which carries whether the connection ends with it.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use recovea_core::Answer;
use recovea_core::answer::WireShape;
use recovea_core::caps::CapRefusal;
use recovea_http1::{FramingError, RequestError};
use recovea_providers::request_body::Ambiguity;
use recovea_upstream::{BoxError, ResponseBody};

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

/// What a refused request left of its body on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLeft {
    /// Nothing: the body was read to its end, or there was none.
    Nothing,
    /// Some of it, unread: what comes next on the connection is not the next request's head.
    Unread,
}

impl BodyLeft {
    /// What a request left that said it had a body (`has_body`), once it was `read_to_end` or not.
    pub(crate) fn of(has_body: bool, read_to_end: bool) -> Self {
        if has_body && !read_to_end { Self::Unread } else { Self::Nothing }
    }
}

/// A refusal as it is answered (as linkerd's `SyntheticHttpResponse`): the refusal, and whether the
/// connection ends with its answer. It does when the next request cannot be found on the
/// connection: after a head that broke the rules (where its body ends cannot be trusted), or
/// after a body left unread.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) refusal: Refusal,
    pub(crate) close_connection: bool,
}

impl Refused {
    /// `refusal` of a request that left `body` on its connection.
    pub(crate) fn new(refusal: Refusal, body: BodyLeft) -> Self {
        let close_connection = matches!(refusal, Refusal::Head(_)) || body == BodyLeft::Unread;
        Self { refusal, close_connection }
    }

    /// The answer, in `shape` (its request's dialect). On HTTP/1 (`http1`) one that ends the
    /// connection says `connection: close`, so that the client sends its next request on another;
    /// on HTTP/2 the answer ends the request's stream alone.
    pub(crate) fn response(&self, shape: WireShape, http1: bool) -> Response<ResponseBody> {
        let mut response = answer_response(self.refusal.answer().shaped(shape));
        if http1 && self.close_connection {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<Refusal> for Refused {
    /// A refusal once the request's body is read: the connection carries the next request.
    fn from(refusal: Refusal) -> Self {
        Self::new(refusal, BodyLeft::Nothing)
    }
}

/// Turns one of the gateway's own answers into a response.
pub(crate) fn answer_response(answer: Answer) -> Response<ResponseBody> {
    let mut response =
        Response::new(Full::new(Bytes::from(answer.body)).map_err(BoxError::from).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The answer to a request whose HTTP/1 head breaks the rules, in `shape`: it ends the connection,
/// since what follows such a head cannot be trusted to be the next request.
pub(crate) fn head_refusal(error: RequestError, shape: WireShape) -> Response<ResponseBody> {
    Refused::new(Refusal::Head(error), BodyLeft::Unread).response(shape, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::concurrency::Holder;
    use recovea_http1::HostError;

    /// One refusal of each kind a request can meet, from its head to the provider.
    fn every_refusal() -> Vec<Refusal> {
        vec![
            Refusal::UnknownRoute,
            Refusal::Admission(Answer::invalid_api_key()),
            Refusal::ProviderNotConfigured("openai".into()),
            Refusal::BodyTooLarge(10),
            Refusal::BodyTimeout,
            Refusal::BodyUnreadable,
            Refusal::BodyMemoryBusy,
            Refusal::UpstreamUnreachable,
            Refusal::UpstreamTimeout,
            Refusal::Budget(CapRefusal::Exceeded {
                scope: recovea_core::caps::Scope::Key,
                window: recovea_core::window::Window::Day,
            }),
            Refusal::RateLimited(1_500),
            Refusal::ModelNotAllowed("gpt-4o".into()),
            Refusal::EndpointNotAllowed("embeddings".into()),
            Refusal::ConcurrencyLimited(crate::inflight::Full { holder: Holder::Key, limit: 2 }),
            Refusal::ModelName,
            Refusal::InvalidTags("too many".into()),
            Refusal::AmbiguousBody(Ambiguity::ByteOrderMark),
        ]
    }

    fn heads() -> [Refusal; 2] {
        [
            Refusal::Head(RequestError::Host(HostError::Missing)),
            Refusal::Head(RequestError::Framing(FramingError::CodingUnsupported)),
        ]
    }

    #[test]
    fn a_refusal_ends_its_connection_when_its_body_is_left_unread_or_its_head_broke_the_rules() {
        for refusal in every_refusal() {
            let name = format!("{refusal:?}");
            assert!(!Refused::new(refusal, BodyLeft::Nothing).close_connection, "{name}");
        }
        for refusal in every_refusal() {
            let name = format!("{refusal:?}");
            assert!(Refused::new(refusal, BodyLeft::Unread).close_connection, "{name}");
        }
        for refusal in heads() {
            let name = format!("{refusal:?}");
            assert!(Refused::new(refusal, BodyLeft::Nothing).close_connection, "{name}");
        }
        for refusal in every_refusal() {
            let name = format!("{refusal:?}");
            assert!(!Refused::from(refusal).close_connection, "after the body, {name}");
        }
    }

    #[test]
    fn only_a_body_said_and_not_read_to_its_end_is_left() {
        assert_eq!(BodyLeft::of(true, false), BodyLeft::Unread);
        assert_eq!(BodyLeft::of(true, true), BodyLeft::Nothing);
        assert_eq!(BodyLeft::of(false, false), BodyLeft::Nothing);
        assert_eq!(BodyLeft::of(false, true), BodyLeft::Nothing);
    }

    #[test]
    fn an_answer_that_ends_the_connection_says_so_on_http1_only() {
        let connection =
            |response: &Response<ResponseBody>| response.headers().get(header::CONNECTION).cloned();
        let closing = Refused::new(Refusal::BodyTooLarge(10), BodyLeft::Unread);
        let response = closing.response(WireShape::OpenAi, true);
        assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(connection(&response), Some(HeaderValue::from_static("close")));
        // HTTP/2 has no `connection` header: the answer ends the request's stream alone.
        assert_eq!(connection(&closing.response(WireShape::OpenAi, false)), None);
        let keeping = Refused::new(Refusal::RateLimited(1_500), BodyLeft::Nothing);
        let response = keeping.response(WireShape::Anthropic, true);
        assert_eq!(connection(&response), None);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(response.headers()["retry-after"], "2", "the answer's own headers go too");
        let head = head_refusal(RequestError::Host(HostError::Missing), WireShape::OpenAi);
        assert_eq!(
            (head.status(), connection(&head)),
            (StatusCode::BAD_REQUEST, Some(HeaderValue::from_static("close")))
        );
    }
}
