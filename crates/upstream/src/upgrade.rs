//! A request that upgrades its connection to another protocol (a WebSocket, for Realtime): sent on
//! a connection opened for it alone, in HTTP/1.1 whatever the provider offers; on `101 Switching
//! Protocols` the connection is the caller's, any other answer is read whole.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use recovea_http1::{Decoder, ThroughProxy, parse_response, request_head};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::body::BoxError;
use crate::h1::Io;
use crate::{Upstream, UpstreamError};

/// The longest answer head read, and the most header lines.
const MAX_HEAD_BYTES: usize = 64 << 10;
const MAX_HEADERS: usize = 128;
/// The longest body of an answer that refused the upgrade (an error) read.
const MAX_REFUSAL_BYTES: usize = 1 << 20;

/// What the provider did with an upgrade.
pub enum Switched {
    /// `101`: its head, the connection now speaking the new protocol, and the bytes the provider
    /// sent after its head (the new protocol's first).
    Upgraded { head: http::response::Parts, io: UpgradedIo, read: Bytes },
    /// Any other answer, read whole.
    Answered(Response<Bytes>),
}

/// The provider's end of an upgraded connection.
pub struct UpgradedIo(Io);

impl Upstream {
    /// Sends `request` (an absolute URI, its `Connection: upgrade` and `Upgrade` headers set) on a
    /// new connection, and waits at most `timeout` for the answer.
    pub async fn upgrade(
        &self,
        request: Request<Bytes>,
        timeout: Duration,
    ) -> Result<Switched, UpstreamError> {
        match tokio::time::timeout(timeout, Box::pin(self.switch(request))).await {
            Ok(Ok(switched)) => Ok(switched),
            Ok(Err(e)) => Err(UpstreamError::Unreachable(e)),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn switch(&self, request: Request<Bytes>) -> Result<Switched, BoxError> {
        let (scheme, authority) = match (request.uri().scheme(), request.uri().authority()) {
            (Some(scheme), Some(authority)) => (scheme.clone(), authority.clone()),
            _ => return Err(format!("not an absolute URI: {}", request.uri()).into()),
        };
        let host = HeaderValue::from_str(authority.as_str())?;
        let stream = self.connector.connect_http1(&scheme, &authority).await?;
        let through_proxy = stream
            .via_proxy
            .as_ref()
            .map(|authorization| ThroughProxy { authorization: authorization.as_ref() });
        let head = request_head(&request, &host, through_proxy);
        let mut io = stream.io;
        io.write_all(&head).await?;
        io.write_all(request.body()).await?;
        io.flush().await?;
        let mut buf = BytesMut::with_capacity(8 << 10);
        loop {
            if let Some(switched) = switched_head(&mut buf)? {
                let read = buf.split().freeze();
                return Ok(Switched::Upgraded { head: switched, io: UpgradedIo(io), read });
            }
            if let Some(answer) = parse_response::<MAX_HEADERS>(&mut buf, &Method::GET, MAX_HEAD_BYTES)? {
                return Ok(Switched::Answered(read_refusal(io, buf, answer).await?));
            }
            if io.read_buf(&mut buf).await? == 0 {
                return Err("the provider closed the connection without answering".into());
            }
        }
    }
}

/// A `101` head at the start of `buf`, taken off it; `None` for any other (or none yet).
fn switched_head(buf: &mut BytesMut) -> Result<Option<http::response::Parts>, BoxError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut lines);
    let length = match parsed.parse(&buf[..buf.len().min(MAX_HEAD_BYTES)])? {
        httparse::Status::Complete(length) if parsed.code == Some(101) => length,
        _ => return Ok(None),
    };
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    for line in parsed.headers.iter() {
        headers.append(HeaderName::from_bytes(line.name.as_bytes())?, HeaderValue::from_bytes(line.value)?);
    }
    let _ = buf.split_to(length);
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = headers;
    Ok(Some(response.into_parts().0))
}

/// An answer that refused the upgrade, its body read whole (at most [`MAX_REFUSAL_BYTES`]).
async fn read_refusal(
    mut io: Io,
    mut buf: BytesMut,
    head: recovea_http1::ResponseHead,
) -> Result<Response<Bytes>, BoxError> {
    let mut body = Vec::new();
    let mut decoder = Decoder::new(head.framing);
    while !decoder.is_done() && body.len() <= MAX_REFUSAL_BYTES {
        decoder.skip_framing(&mut buf)?;
        while let Some(data) = decoder.take_data(&mut buf) {
            body.extend_from_slice(&data);
            decoder.skip_framing(&mut buf)?;
        }
        if decoder.is_done() || io.read_buf(&mut buf).await? == 0 {
            break;
        }
    }
    body.truncate(MAX_REFUSAL_BYTES);
    let mut parts = head.parts;
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(Response::from_parts(parts, Bytes::from(body)))
}

impl AsyncRead for UpgradedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for UpgradedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
