//! What can be wrong with a message: one enum per question, each a `std::error::Error`, so that a
//! caller matches on what went wrong rather than on text.

use std::fmt;

/// A head or body the codec cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Not an HTTP/1.x head (or more header lines than the caller allows, which `httparse` reports as
    /// `TooManyHeaders`).
    Malformed(httparse::Error),
    /// The head is longer than the caller allows.
    HeadTooLong,
    /// A request target that is not a URI.
    Target,
    /// A header name or value that the `http` crate refuses.
    Header,
    /// A response status outside 100 to 999.
    Status,
    /// A `101 Switching Protocols` answer, which no request of the gateway asks for.
    SwitchingProtocols,
    Framing(FramingError),
    Chunk(ChunkError),
}

/// A request head that breaks the rules the gateway holds requests to: it is answered, never
/// forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    Host(HostError),
    Framing(FramingError),
}

/// RFC 9112, section 3.2: an HTTP/1.1 request has exactly one `Host`, and its value is a host and
/// an optional port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// An HTTP/1.1 request without one.
    Missing,
    /// More than one `Host` line (any version).
    Repeated,
    /// A value that is not `host[:port]`.
    Invalid,
}

/// Why the length of a body cannot be told from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingError {
    /// A `Content-Length` that is not a decimal number that fits in 64 bits.
    LengthInvalid,
    /// `Content-Length` on more than one line, or a list (`5, 5`): RFC 9110 (section 8.6) lets a
    /// recipient take identical values as one or refuse them. Both sides refuse them, so that no
    /// two readers of one message can disagree on where it ends.
    LengthRepeated,
    /// A transfer coding other than `chunked` (`gzip, chunked`): the gateway decodes none, and
    /// passing coded bytes on without their coding would label them as what they are not.
    CodingUnsupported,
    /// `chunked` is not the last coding (or there is none): the body's end cannot be found
    /// (RFC 9112, section 6.3).
    ChunkedNotLast,
    /// `chunked` more than once (RFC 9112, section 7: a sender must not).
    ChunkedRepeated,
}

/// A chunked body whose framing is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// A chunk-size line that is not hexadecimal digits, blanks and an extension, or that overflows.
    SizeMalformed,
    /// A chunk-size or trailer line longer than [`crate::MAX_CHUNK_LINE_BYTES`].
    LineTooLong,
    /// A chunk's data not followed by CRLF.
    DataUnterminated,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "malformed head: {e}"),
            Self::HeadTooLong => f.write_str("head too long"),
            Self::Target => f.write_str("request target is not a URI"),
            Self::Header => f.write_str("header name or value refused"),
            Self::Status => f.write_str("status code out of range"),
            Self::SwitchingProtocols => f.write_str("switched protocols, which no request asked for"),
            Self::Framing(e) => e.fmt(f),
            Self::Chunk(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host(e) => e.fmt(f),
            Self::Framing(e) => e.fmt(f),
        }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Missing => "HTTP/1.1 request without Host",
            Self::Repeated => "more than one Host",
            Self::Invalid => "Host is not host[:port]",
        })
    }
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LengthInvalid => "content-length is not a number",
            Self::LengthRepeated => "more than one content-length",
            Self::CodingUnsupported => "transfer coding other than chunked",
            Self::ChunkedNotLast => "chunked is not the last transfer coding",
            Self::ChunkedRepeated => "chunked applied more than once",
        })
    }
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SizeMalformed => "chunk size malformed",
            Self::LineTooLong => "chunk line too long",
            Self::DataUnterminated => "chunk data not followed by CRLF",
        })
    }
}

// Each message already names the inner error: no `source`, so that a chain prints it once.
impl std::error::Error for Error {}
impl std::error::Error for RequestError {}
impl std::error::Error for HostError {}
impl std::error::Error for FramingError {}
impl std::error::Error for ChunkError {}

impl From<FramingError> for Error {
    fn from(e: FramingError) -> Self {
        Self::Framing(e)
    }
}

impl From<ChunkError> for Error {
    fn from(e: ChunkError) -> Self {
        Self::Chunk(e)
    }
}

impl From<HostError> for RequestError {
    fn from(e: HostError) -> Self {
        Self::Host(e)
    }
}

impl From<FramingError> for RequestError {
    fn from(e: FramingError) -> Self {
        Self::Framing(e)
    }
}
