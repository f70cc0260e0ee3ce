//! How to reach Redis: its URL (`redis://`, or `rediss://` for TLS; an ACL user and password in
//! it, `rediss://user:password@host:6380/0`) and, for TLS, the certificates an operator gives: a CA
//! of their own (else the public web's roots), and a client certificate when the server asks for
//! one. The URL is never shown: it may carry the password.

use redis::Client;

use crate::shared::CounterError;

/// The certificates of a `rediss://` connection, PEM.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// Trusted instead of the public web's roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key, for a server that asks for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisTls {
    fn is_default(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }
}

/// A client for the Redis at `url`, not yet connected.
pub(crate) fn client(url: &str, tls: &RedisTls) -> Result<Client, CounterError> {
    let refused = |e: redis::RedisError| CounterError::Config(format!("the Redis URL: {e}"));
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    if scheme.ends_with("+cluster") || scheme.ends_with("+sentinel") {
        return Err(CounterError::Config(format!(
            "{scheme}:// is not supported yet: give the primary's redis:// or rediss:// URL"
        )));
    }
    if tls.is_default() {
        if url.starts_with("rediss://") {
            use_ring();
        }
        return Client::open(url).map_err(refused);
    }
    if !url.starts_with("rediss://") {
        return Err(CounterError::Config(
            "a Redis CA or client certificate is for a rediss:// URL only".to_owned(),
        ));
    }
    use_ring();
    let certificates = redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
        root_cert: tls.ca.clone(),
    };
    Client::build_with_tls(url, certificates)
        .map_err(|e| CounterError::Config(format!("the Redis TLS settings: {e}")))
}

/// redis builds its TLS on the process's default rustls provider: ring, the tree's one (a no-op
/// once one is installed).
fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_url_is_never_shown() {
        for url in ["http://user:s3cret-pw@host:6379/0", "redis://user:s3cret-pw@host:port/0"] {
            let refused = client(url, &RedisTls::default()).expect_err("refused").to_string();
            assert!(!refused.contains("s3cret-pw"), "{refused}");
        }
        let cluster = client("redis+cluster://user:s3cret-pw@a:7000,b:7001", &RedisTls::default());
        let refused = cluster.expect_err("refused").to_string();
        assert!(
            refused.contains("redis+cluster:// is not supported yet") && !refused.contains("s3cret-pw"),
            "{refused}"
        );
        let tls = RedisTls { ca: Some(b"pem".to_vec()), client: None };
        let refused = client("redis://user:s3cret-pw@host:6379/0", &tls).expect_err("refused").to_string();
        assert!(refused.contains("rediss:// URL only") && !refused.contains("s3cret-pw"), "{refused}");
    }
}
