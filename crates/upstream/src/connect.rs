//! Opening a connection to a provider: DNS, TCP (to the provider, or to the egress proxy, which
//! opens a tunnel for `https`) and, for `https`, TLS whose ALPN picks HTTP/2 or HTTP/1.1, all within
//! one time limit.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use recovea_http1::push_header;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::BoxError;
#[cfg(test)]
use crate::destination::PrivateNetworks;
use crate::destination::{self, Destinations};
use crate::egress::{Egress, Proxy};
use crate::h1::Io;
use crate::{h1, h2};

/// TCP keep-alive probes start after this long without traffic, so that a provider (or a middlebox)
/// that vanished without a word is noticed on an idle pooled connection.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// How long an address is tried before the next of the host's addresses is.
const NEXT_ADDRESS_AFTER: Duration = Duration::from_secs(2);

/// The longest answer head an egress proxy may give to `CONNECT`.
const MAX_TUNNEL_HEAD: usize = 8 << 10;

/// A new connection, ready for its first request.
pub(super) enum Connected {
    Http1(h1::Connection),
    /// Multiplexed: one connection carries many requests to its origin at once.
    Http2(h2::Multiplexed),
}

#[derive(Clone)]
pub(super) struct Connector {
    tls: tokio_rustls::TlsConnector,
    /// The same trust, offering HTTP/1.1 alone: for a connection that upgrades to another
    /// protocol, which HTTP/2 would need an extended `CONNECT` for.
    tls_http1: tokio_rustls::TlsConnector,
    limit: Duration,
    egress: Egress,
    destinations: Destinations,
}

/// A connection opened for HTTP/1.1 alone, and whether it goes to an egress proxy in plain HTTP
/// (its requests then name their target whole, with this `Proxy-Authorization`).
pub(super) struct Http1Stream {
    pub(super) io: Io,
    pub(super) via_proxy: Option<Option<http::HeaderValue>>,
}

#[derive(Debug)]
struct ConnectTimeout;

impl std::fmt::Display for ConnectTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connecting timed out")
    }
}

impl std::error::Error for ConnectTimeout {}

impl Connector {
    /// Checks certificates against `roots`; the whole set-up of a connection is bounded by `limit`:
    /// a provider that accepts but never completes a handshake is as unreachable as one that refuses.
    pub(super) fn new(limit: Duration, network: &crate::ProviderNetwork) -> Self {
        let (roots, egress, destinations) = network.connector_parts();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http1 = config.clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            tls_http1: tokio_rustls::TlsConnector::from(Arc::new(http1)),
            limit,
            egress,
            destinations,
        }
    }

    /// A new connection that speaks HTTP/1.1 whatever the provider offers, within the limit.
    pub(super) async fn connect_http1(
        &self,
        scheme: &Scheme,
        authority: &Authority,
    ) -> Result<Http1Stream, BoxError> {
        match tokio::time::timeout(self.limit, self.open_stream(scheme, authority, &self.tls_http1)).await {
            Ok(opened) => opened,
            Err(_) => Err(Box::new(ConnectTimeout)),
        }
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
        let stream = self.open_stream(scheme, authority, &self.tls).await?;
        match stream.io {
            Io::Tls(tls) if tls.get_ref().1.alpn_protocol() == Some(b"h2") => {
                Ok(Connected::Http2(h2::handshake(*tls).await?))
            }
            io => {
                let connection = h1::Connection::new(io);
                Ok(Connected::Http1(match stream.via_proxy {
                    Some(authorization) => connection.through_proxy(authorization),
                    None => connection,
                }))
            }
        }
    }

    /// TCP to the provider (or through the egress proxy) and, for `https`, TLS by `tls`.
    async fn open_stream(
        &self,
        scheme: &Scheme,
        authority: &Authority,
        tls_connector: &tokio_rustls::TlsConnector,
    ) -> Result<Http1Stream, BoxError> {
        let tls = match scheme.as_str() {
            "http" => false,
            "https" => true,
            other => return Err(format!("unsupported scheme {other}").into()),
        };
        // An IPv6 literal comes in brackets, which neither DNS nor a server name takes.
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let proxy = self.egress.proxy_for(scheme, host);
        let tcp = match proxy {
            None => tcp(host, port, self.destinations).await?,
            // The proxy is the operator's, often on a private network: only its target is the
            // client's to name, and the proxy resolves it. A target written as an address is
            // checked here.
            Some(proxy) => {
                self.destinations.check_host(host)?;
                tcp(&proxy.host, proxy.port, Destinations::default()).await.map_err(|e| {
                    format!("connecting to the egress proxy {}:{}: {e}", proxy.host, proxy.port)
                })?
            }
        };
        if !tls {
            let via_proxy = proxy.map(|proxy| proxy.authorization.clone());
            return Ok(Http1Stream { io: Io::Plain(tcp), via_proxy });
        }
        let tcp = match proxy {
            Some(proxy) => tunnel(tcp, host, port, proxy).await?,
            None => tcp,
        };
        let name = ServerName::try_from(host.to_owned())?;
        let stream = tls_connector.connect(name, tcp).await?;
        Ok(Http1Stream { io: Io::Tls(Box::new(stream)), via_proxy: None })
    }
}

/// Asks the egress `proxy`, connected on `stream`, for a tunnel to `host:port` (RFC 9110 §9.3.6).
async fn tunnel(mut stream: TcpStream, host: &str, port: u16, proxy: &Proxy) -> Result<TcpStream, BoxError> {
    let target = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let mut ask = format!("CONNECT {target} HTTP/1.1\r\n").into_bytes();
    push_header(&mut ask, "host", target.as_bytes());
    if let Some(authorization) = &proxy.authorization {
        push_header(&mut ask, "proxy-authorization", authorization.as_bytes());
    }
    ask.extend_from_slice(b"\r\n");
    stream.write_all(&ask).await?;
    // Nothing follows the proxy's answer until the TLS handshake starts, which this side begins:
    // a read cannot take bytes of the tunnel.
    let mut head = Vec::with_capacity(512);
    loop {
        let mut lines = [httparse::EMPTY_HEADER; 32];
        let mut answer = httparse::Response::new(&mut lines);
        if let httparse::Status::Complete(length) = answer.parse(&head)? {
            let code = answer.code.unwrap_or_default();
            if length != head.len() {
                return Err("the egress proxy sent bytes after its answer to CONNECT".into());
            }
            return match code {
                200..=299 => Ok(stream),
                407 => {
                    Err("the egress proxy asks for credentials (407 Proxy Authentication Required)".into())
                }
                _ => Err(format!("the egress proxy refused a tunnel to {target}: {code}").into()),
            };
        }
        if head.len() >= MAX_TUNNEL_HEAD {
            return Err("the egress proxy's answer to CONNECT is too long".into());
        }
        if stream.read_buf(&mut head).await? == 0 {
            return Err("the egress proxy closed the connection instead of opening a tunnel".into());
        }
    }
}

/// A TCP connection to the first of `host`'s addresses that accepts one, among those `allowed`
/// lets the gateway reach ([`crate::destination`]). Each address but the last gets
/// [`NEXT_ADDRESS_AFTER`]: an address whose route drops packets (often IPv6) must not use the
/// whole connect limit while the next one would answer at once.
async fn tcp(host: &str, port: u16, allowed: Destinations) -> io::Result<TcpStream> {
    let mut failed = None;
    allowed.check_host(host)?;
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    let mut addresses = allowed.reachable(host, resolved)?.into_iter().peekable();
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
                destination::not_to_itself(&stream)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_connection_goes_to_a_metadata_service() {
        for allowed in [Destinations::default(), Destinations { private: PrivateNetworks::Deny }] {
            let refused =
                tcp("metadata.google.internal", 80, allowed).await.expect_err("refused before resolving");
            assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
            let refused = tcp("169.254.169.254", 80, allowed).await.expect_err("refused before connecting");
            assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
            assert!(refused.to_string().contains("metadata service"), "{refused}");
            let refused = tcp("fe80::1", 443, allowed).await.expect_err("refused");
            assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        }
    }

    #[tokio::test]
    async fn private_networks_are_reached_unless_denied() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tcp("127.0.0.1", port, Destinations::default()).await.expect("loopback is allowed by default");
        let refused = tcp("localhost", port, Destinations { private: PrivateNetworks::Deny })
            .await
            .expect_err("denied");
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains("private"), "{refused}");
    }

    #[tokio::test]
    async fn no_connection_goes_to_one_of_this_process_listeners() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr");
        tcp("127.0.0.1", address.port(), Destinations::default()).await.expect("not yet one of ours");
        let listening = crate::listening_on(address);
        let refused = tcp("127.0.0.1", address.port(), Destinations::default()).await.expect_err("a loop");
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains("this process"), "{refused}");
        drop(listening);
        tcp("127.0.0.1", address.port(), Destinations::default()).await.expect("no longer one of ours");
    }
}
