//! Server-sent-event framing as the providers write it.

use bytes::Bytes;

/// The terminator of OpenAI's chat and legacy completion streams.
pub(crate) const DONE: &str = "data: [DONE]\n\n";

/// An unnamed event, as OpenAI's chat and legacy completion streams send them.
pub(crate) fn data(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// A named event, as the Responses API and Anthropic send them.
pub(crate) fn event(name: &str, json: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}
