//! TLS to PostgreSQL with rustls, as libpq means its settings: `sslmode` (`disable`, `prefer`,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert` and `sslkey`, from the
//! connection string (URL query or `key=value`) or else the `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT` and `PGSSLKEY` environment variables.
//!
//! The `postgres` client knows `disable`, `prefer` and `require` only, and refuses the other
//! settings: [`split`] takes them out of the string, and the verification they ask for is
//! rustls's here. As in libpq: `require` verifies nothing unless a root certificate is there (given,
//! or `~/.postgresql/root.crt`), in which case it is `verify-ca`; `verify-ca` checks the chain and
//! not the name; `verify-full` both; `sslrootcert=system` trusts the public web's roots.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// How much TLS a connection asks for, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    /// TLS when the server offers it, the certificate unchecked.
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode: {other:?} is none of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// What the `postgres` client is told: whether to ask for TLS, and whether to insist.
    fn for_client(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require | Self::VerifyCa | Self::VerifyFull => "require",
        }
    }
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file, or `system` for the public web's roots.
    pub root_cert: Option<String>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

const SETTINGS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Takes the TLS settings out of a connection string (a `postgres://` URL, or `key=value` pairs),
/// with `env` for those it does not give; the string the `postgres` client is given instead (its
/// `sslmode` the one it knows), and the settings.
pub fn split(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<(String, TlsSettings), String> {
    let (rest, mut found) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)
    } else {
        split_pairs(url)?
    };
    for (name, variable) in SETTINGS.iter().zip(["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"]) {
        if !found.iter().any(|(n, _)| n == name)
            && let Some(value) = env(variable).filter(|v| !v.is_empty())
        {
            found.push(((*name).to_owned(), value));
        }
    }
    let mut settings = TlsSettings::default();
    for (name, value) in found {
        match name.as_str() {
            "sslmode" => settings.mode = SslMode::parse(&value)?,
            "sslrootcert" => settings.root_cert = Some(value),
            "sslcert" => settings.cert = Some(PathBuf::from(value)),
            _ => settings.key = Some(PathBuf::from(value)),
        }
    }
    if settings.cert.is_some() != settings.key.is_some() {
        return Err("sslcert and sslkey: give both, or neither".to_owned());
    }
    let mode = settings.mode.for_client();
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        format!("{rest}{}sslmode={mode}", if rest.contains('?') { "&" } else { "?" })
    } else {
        format!("{rest} sslmode={mode}")
    };
    Ok((rest, settings))
}

/// The URL without the TLS settings in its query; those settings, percent-decoded.
fn split_url(url: &str) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else { return (url.to_owned(), Vec::new()) };
    let (mut kept, mut found) = (Vec::new(), Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if SETTINGS.contains(&name) {
            found.push((name.to_owned(), percent_decoded(value)));
        } else {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    (rest, found)
}

fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (byte, ..) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `key=value` pairs (values bare, or quoted with `'` and `\` escapes) without the TLS settings.
fn split_pairs(text: &str) -> Result<(String, Vec<(String, String)>), String> {
    let (mut kept, mut found) = (Vec::new(), Vec::new());
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let name: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(format!("the connection string: {name:?} has no value"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("the connection string: {name}'s value is not closed")),
                }
            }
        } else {
            value.extend(std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())));
        }
        if SETTINGS.contains(&name.as_str()) {
            found.push((name, value));
        } else {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{name}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), found))
}

/// Makes the TLS connections of a pool, as its [`TlsSettings`] say.
#[derive(Clone)]
pub struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl MakeRustls {
    /// The TLS of `settings`, reading its files; `None` for `disable`. `home` is where libpq looks
    /// for `.postgresql/root.crt` when no `sslrootcert` is given.
    pub fn new(settings: &TlsSettings, home: Option<&Path>) -> Result<Option<Self>, String> {
        if settings.mode == SslMode::Disable {
            return Ok(None);
        }
        let default_root = home.map(|h| h.join(".postgresql/root.crt")).filter(|p| p.exists());
        let roots = match (settings.root_cert.as_deref(), default_root) {
            (Some("system"), _) => {
                Some(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
            }
            (Some(path), _) => Some(roots_from(Path::new(path))?),
            (None, Some(path)) => Some(roots_from(&path)?),
            (None, None) => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let check: Arc<dyn ServerCertVerifier> = match (settings.mode, roots) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(format!(
                    "sslmode={}: needs sslrootcert (a PEM file, or system), or ~/.postgresql/root.crt",
                    if settings.mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
                ));
            }
            (SslMode::Disable | SslMode::Prefer | SslMode::Require, None) => {
                Arc::new(AnyCertificate(Arc::clone(&provider)))
            }
            (mode, Some(roots)) => {
                let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| format!("sslrootcert: {e}"))?;
                if mode == SslMode::VerifyFull { chain } else { Arc::new(ChainOnly(chain)) }
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(check);
        let config = match (&settings.cert, &settings.key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("sslcert: {}: {e}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("sslkey: {}: {e}", key.display()))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| format!("sslcert and sslkey: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(Self { config: Arc::new(config) }))
    }
}

fn roots_from(path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in
        CertificateDer::pem_file_iter(path).map_err(|e| format!("sslrootcert: {}: {e}", path.display()))?
    {
        let certificate = certificate.map_err(|e| format!("sslrootcert: {}: {e}", path.display()))?;
        roots.add(certificate).map_err(|e| format!("sslrootcert: {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert: {}: no certificate", path.display()));
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root certificate: encrypted, whoever the server is (the
/// handshake's signatures are still checked against the certificate it sent).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl MakeTlsConnect<postgres::Socket> for MakeRustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        let name = ServerName::try_from(domain.trim_start_matches('[').trim_end_matches(']'))?.to_owned();
        Ok(RustlsConnect { config: Arc::clone(&self.config), name })
    }
}

/// One connection's TLS, to the server called `name`.
pub struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl TlsConnect<postgres::Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: postgres::Socket) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move { connector.connect(self.name, stream).await.map(RustlsStream) })
    }
}

/// A TLS connection to PostgreSQL. No channel binding: SCRAM authenticates without it.
pub struct RustlsStream(tokio_rustls::client::TlsStream<postgres::Socket>);

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl tokio::io::AsyncRead for RustlsStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_settings_leave_a_url_and_the_client_gets_a_mode_it_knows() {
        let (rest, settings) = split(
            "postgres://u:p@db:5432/x?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=a",
            none,
        )
        .expect("valid");
        assert_eq!(rest, "postgres://u:p@db:5432/x?application_name=a&sslmode=require");
        assert_eq!(settings.mode, SslMode::VerifyFull);
        assert_eq!(settings.root_cert.as_deref(), Some("/etc/ca.pem"));
        let (rest, settings) = split("postgres://db/x", none).expect("valid");
        assert_eq!((rest.as_str(), settings.mode), ("postgres://db/x?sslmode=prefer", SslMode::Prefer));
    }

    #[test]
    fn the_settings_leave_key_value_pairs_with_their_quotes() {
        let (rest, settings) = split(
            r"host=db  dbname='my db' password='it\'s' sslmode=verify-ca sslcert=/c.pem sslkey='/k ey.pem'",
            none,
        )
        .expect("valid");
        assert_eq!(rest, r"host='db' dbname='my db' password='it\'s' sslmode=require");
        assert_eq!(settings.mode, SslMode::VerifyCa);
        assert_eq!(settings.key, Some(PathBuf::from("/k ey.pem")));
        assert!(split("host=db dbname='open", none).is_err());
    }

    #[test]
    fn the_environment_gives_what_the_string_does_not() {
        let env = |name: &str| match name {
            "PGSSLMODE" => Some("verify-full".to_owned()),
            "PGSSLROOTCERT" => Some("/env/ca.pem".to_owned()),
            _ => None,
        };
        let (_, settings) = split("postgres://db/x?sslmode=require", env).expect("valid");
        assert_eq!(settings.mode, SslMode::Require, "the string wins");
        assert_eq!(settings.root_cert.as_deref(), Some("/env/ca.pem"));
        assert!(split("postgres://db/x?sslmode=sometimes", none).is_err());
        assert!(split("postgres://db/x?sslcert=/c.pem", none).is_err(), "a certificate without its key");
    }

    #[test]
    fn verifying_modes_need_a_root_and_disable_needs_no_tls() {
        let settings = |mode| TlsSettings { mode, ..TlsSettings::default() };
        assert!(MakeRustls::new(&settings(SslMode::Disable), None).expect("valid").is_none());
        assert!(MakeRustls::new(&settings(SslMode::Require), None).expect("valid").is_some());
        let refused = MakeRustls::new(&settings(SslMode::VerifyFull), None).err().expect("refused");
        assert!(refused.contains("needs sslrootcert"), "{refused}");
        let system = TlsSettings { root_cert: Some("system".into()), ..settings(SslMode::VerifyFull) };
        assert!(MakeRustls::new(&system, None).expect("valid").is_some());
    }
}
