//! What every phase of the request path shares: its boxed error, and the body of an answer. A
//! leaf: it imports nothing of the crate, so that the phases import it rather than one another.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// An answer's body as the client's connection takes it: a provider's (metered or not), or one
/// the gateway wrote.
pub(crate) type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;
