//! How providers are reached: the certificates trusted, the egress proxy, where connections may
//! go, and how many HTTP/2 connections may be opened to one provider.

use std::fmt;

use crate::destination::{Destinations, PrivateNetworks};
use crate::{DEFAULT_HTTP2_CONNECTIONS, Egress};

use recovea_core::ConfigError;

/// How providers are reached: the certificates trusted, the egress proxy, and how many HTTP/2
/// connections may be opened to one provider.
#[derive(Clone)]
pub struct ProviderNetwork {
    roots: rustls::RootCertStore,
    egress: Egress,
    pub(crate) http2_connections: usize,
    destinations: Destinations,
}

impl Default for ProviderNetwork {
    /// The public web's roots, no proxy, [`DEFAULT_HTTP2_CONNECTIONS`].
    fn default() -> Self {
        Self {
            roots: web_roots(),
            egress: Egress::default(),
            http2_connections: DEFAULT_HTTP2_CONNECTIONS,
            destinations: Destinations::default(),
        }
    }
}

impl fmt::Debug for ProviderNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderNetwork")
            .field("roots", &self.roots.len())
            .field("egress", &self.egress)
            .field("http2_connections", &self.http2_connections)
            .field("destinations", &self.destinations)
            .finish()
    }
}

impl ProviderNetwork {
    /// Trusts the certificates of `ca_pem` (PEM) beside the public web's roots, or, `ca_only`,
    /// instead of them; goes out through `egress`; opens at most `http2_connections` HTTP/2
    /// connections to one provider. Errors name the flag at fault.
    pub fn new(
        ca_pem: Option<&[u8]>,
        ca_only: bool,
        egress: Egress,
        http2_connections: usize,
    ) -> Result<Self, ConfigError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;

        if http2_connections == 0 {
            return Err(ConfigError::zero("upstream-http2-connections"));
        }
        let mut roots = if ca_only { rustls::RootCertStore::empty() } else { web_roots() };
        match ca_pem {
            None if ca_only => return Err(ConfigError::flag("upstream-ca-only", "needs --upstream-ca-file")),
            None => {}
            Some(pem) => {
                let mut added = 0;
                for certificate in CertificateDer::pem_slice_iter(pem) {
                    let refused = |why: String| ConfigError::flag("upstream-ca-file", why);
                    let certificate =
                        certificate.map_err(|e| refused(format!("not a PEM certificate ({e})")))?;
                    roots
                        .add(certificate)
                        .map_err(|e| refused(format!("a certificate cannot be trusted ({e})")))?;
                    added += 1;
                }
                if added == 0 {
                    return Err(ConfigError::flag("upstream-ca-file", "the file holds no PEM certificate"));
                }
            }
        }
        Ok(Self { roots, egress, http2_connections, destinations: Destinations::default() })
    }

    /// What a connector is made of: the trust, the way out, where it may go.
    pub(crate) fn connector_parts(&self) -> (rustls::RootCertStore, Egress, Destinations) {
        (self.roots.clone(), self.egress.clone(), self.destinations)
    }

    /// Whether connections may go to private networks (`--upstream-private-networks`).
    pub fn with_private_networks(mut self, private: PrivateNetworks) -> Self {
        self.destinations.private = private;
        self
    }
}

/// The public web's roots.
fn web_roots() -> rustls::RootCertStore {
    rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() }
}
