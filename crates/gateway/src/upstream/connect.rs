//! Opening a connection to a provider: DNS, TCP and, for `https`, TLS whose ALPN picks HTTP/2 or
//! HTTP/1.1, all within one time limit.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body_util::Full;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::h1;
use crate::proxy::BoxError;

/// TCP keep-alive probes start after this long without traffic, so that a provider (or a middlebox)
/// that vanished without a word is noticed on an idle pooled connection.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// How long an address is tried before the next of the host's addresses is.
const NEXT_ADDRESS_AFTER: Duration = Duration::from_secs(2);

/// A new connection, ready for its first request.
pub(super) enum Connected {
    Http1(h1::Connection),
    /// Multiplexed: one connection carries every request to its origin.
    Http2(http2::SendRequest<Full<Bytes>>),
}

#[derive(Clone)]
pub(super) struct Connector {
    tls: tokio_rustls::TlsConnector,
    limit: Duration,
}

#[derive(Debug)]
struct ConnectTimeout;

impl std::fmt::Display for ConnectTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connecting to the provider timed out")
    }
}

impl std::error::Error for ConnectTimeout {}

impl Connector {
    /// Checks certificates against `roots`; the whole set-up of a connection is bounded by `limit`:
    /// a provider that accepts but never completes a handshake is as unreachable as one that refuses.
    pub(super) fn new(limit: Duration, roots: rustls::RootCertStore) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self { tls: tokio_rustls::TlsConnector::from(Arc::new(config)), limit }
    }

    /// The public web's roots.
    pub(super) fn web_roots() -> rustls::RootCertStore {
        rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() }
    }

    pub(super) async fn connect(
        &self,
        scheme: &Scheme,
        authority: &Authority,
    ) -> Result<Connected, BoxError> {
        match tokio::time::timeout(self.limit, self.open(scheme, authority)).await {
            Ok(connected) => connected,
            Err(_) => Err(Box::new(ConnectTimeout)),
        }
    }

    async fn open(&self, scheme: &Scheme, authority: &Authority) -> Result<Connected, BoxError> {
        let tls = match scheme.as_str() {
            "http" => false,
            "https" => true,
            other => return Err(format!("unsupported scheme {other}").into()),
        };
        // An IPv6 literal comes in brackets, which neither DNS nor a server name takes.
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tcp = tcp(host, port).await?;
        if !tls {
            return Ok(Connected::Http1(h1::Connection::new(Io::Plain(tcp))));
        }
        let name = ServerName::try_from(host.to_owned())?;
        let stream = self.tls.connect(name, tcp).await?;
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            Ok(Connected::Http2(sender))
        } else {
            Ok(Connected::Http1(h1::Connection::new(Io::Tls(Box::new(stream)))))
        }
    }
}

/// A TCP connection to the first of `host`'s addresses that accepts one. Each address but the
/// last gets [`NEXT_ADDRESS_AFTER`]: an address whose route drops packets (often IPv6) must not use
/// the whole connect limit while the next one would answer at once.
async fn tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let mut failed = None;
    let mut addresses = tokio::net::lookup_host((host, port)).await?.peekable();
    while let Some(address) = addresses.next() {
        let connecting = TcpStream::connect(address);
        let connected = if addresses.peek().is_some() {
            tokio::time::timeout(NEXT_ADDRESS_AFTER, connecting).await.unwrap_or_else(|_| {
                Err(io::Error::new(io::ErrorKind::TimedOut, "the address did not answer"))
            })
        } else {
            connecting.await
        };
        match connected {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
                socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
                return Ok(stream);
            }
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host has no address")))
}

/// The bytes an HTTP/1.1 connection travels on.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
