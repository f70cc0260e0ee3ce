//! TLS for test providers: a private certificate authority of the tests' own, and a server
//! certificate for `127.0.0.1` that it signed (both valid until 2126), as a corporate network or a
//! self-hosted model behind TLS would have. A gateway that trusts only the public web's roots
//! refuses them; one given [`CA_PEM`] (`--upstream-ca-file crates/testkit/testdata/ca.pem`)
//! accepts them.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The tests' certificate authority, PEM.
pub const CA_PEM: &[u8] = include_bytes!("../testdata/ca.pem");
/// The certificate of `127.0.0.1` (an IP address SAN), signed by [`CA_PEM`].
pub const CERT_PEM: &[u8] = include_bytes!("../testdata/provider.pem");
/// The private key of [`CERT_PEM`].
pub const KEY_PEM: &[u8] = include_bytes!("../testdata/provider.key");

/// Where [`CA_PEM`] lies, for a process that takes a file.
pub fn ca_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/ca.pem")
}

/// A server configuration presenting [`CERT_PEM`] and offering `protocols` by ALPN, in order.
///
/// # Panics
///
/// Never with the certificates built in: they parse, and ring supports the default versions.
pub fn server_config(protocols: &[&[u8]]) -> Arc<ServerConfig> {
    let chain = vec![CertificateDer::from_pem_slice(CERT_PEM).expect("the built-in certificate parses")];
    let key = PrivateKeyDer::from_pem_slice(KEY_PEM).expect("the built-in key parses");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("the built-in certificate and key match");
    config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// The roots of a client that trusts [`CA_PEM`] only.
///
/// # Panics
///
/// Never with the certificate built in.
pub fn client_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(CA_PEM).expect("the built-in CA parses")).expect("a valid root");
    roots
}

/// TLS in front of a plain TCP service (a control plane behind a load balancer that terminates
/// TLS with a private CA's certificate): each connection to [`Self::url`] is decrypted with
/// [`CERT_PEM`] and relayed to the service, until dropped.
pub struct Terminator {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Terminator {
    /// Terminates TLS for the service at `backend`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(backend: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&[b"http/1.1"]));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let (Ok(mut tls), Ok(mut service)) =
                        (acceptor.accept(client).await, tokio::net::TcpStream::connect(backend).await)
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut service).await;
                });
            }
        });
        Self { addr, task }
    }

    /// `https://127.0.0.1:PORT`: the name [`CERT_PEM`] is for.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        self.task.abort();
    }
}
