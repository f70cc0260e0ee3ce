//! Where the gateway's own connections (to providers, through the egress proxy, to webhooks) may
//! go: never to a cloud metadata service (link-local addresses and their names), never to a
//! listener of this very process (a base URL naming the gateway itself would loop), and, when the
//! operator says so (`--upstream-private-networks deny`), to no private, loopback or shared
//! address either. Checked on the addresses a name resolves to, at connect time, so that no name
//! leads around the rule.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

use tokio::net::TcpStream;

/// Whether connections may go to private networks: self-hosted models (vLLM, Ollama, TGI) live
/// there, so they may by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrivateNetworks {
    #[default]
    Allow,
    /// No connection to a private (RFC 1918, RFC 4193), loopback, shared (RFC 6598) or unspecified
    /// address: for a deployment whose providers are all on the public internet.
    Deny,
}

/// What a connection may reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Destinations {
    pub private: PrivateNetworks,
}

/// The ports this process listens on (the gateway's, its metrics', the admin API's).
static OWN_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// Records that this process listens on `address` for as long as the guard lives: no connection
/// of its own goes there meanwhile.
#[must_use = "the port counts as this process's only while the guard lives"]
pub fn listening_on(address: SocketAddr) -> Listening {
    own_ports().push(address.port());
    Listening(address.port())
}

/// A port this process listens on, until dropped.
pub struct Listening(u16);

impl Drop for Listening {
    fn drop(&mut self) {
        let mut ports = own_ports();
        if let Some(at) = ports.iter().position(|port| *port == self.0) {
            ports.swap_remove(at);
        }
    }
}

fn own_ports() -> std::sync::MutexGuard<'static, Vec<u16>> {
    OWN_PORTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Refuses a connection that reached this process itself: one whose two ends share an address
/// (a connection within this host) at a port the process listens on.
pub(crate) fn not_to_itself(stream: &TcpStream) -> io::Result<()> {
    let (local, peer) = (stream.local_addr()?, stream.peer_addr()?);
    if local.ip() == peer.ip() && own_ports().contains(&peer.port()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{peer} is a listener of this process: a connection there would loop"),
        ));
    }
    Ok(())
}

impl Destinations {
    /// Refuses a host named (or written as an address) where no connection may go.
    pub(crate) fn check_host(self, host: &str) -> io::Result<()> {
        if is_metadata_host(host) {
            return Err(refused(format!("{host} is a cloud metadata service: never connected to")));
        }
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>();
        if self.private == PrivateNetworks::Deny && literal.is_ok_and(is_private) {
            return Err(refused(format!("{host} is a private address (--upstream-private-networks deny)")));
        }
        Ok(())
    }

    /// Those of `host`'s `resolved` addresses a connection may go to; an error when there were
    /// some and none may be reached.
    pub(crate) fn reachable(self, host: &str, resolved: Vec<SocketAddr>) -> io::Result<Vec<SocketAddr>> {
        if resolved.is_empty() {
            return Ok(resolved);
        }
        let deny_private = self.private == PrivateNetworks::Deny;
        let refuses = |ip: IpAddr| is_metadata_service(ip) || (deny_private && is_private(ip));
        let (refused_addresses, reachable): (Vec<_>, Vec<_>) =
            resolved.into_iter().partition(|a| refuses(a.ip()));
        match refused_addresses.first() {
            Some(first) if reachable.is_empty() && is_metadata_service(first.ip()) => Err(refused(format!(
                "{host} resolves to a link-local address (a cloud metadata service): never connected to"
            ))),
            Some(_) if reachable.is_empty() => Err(refused(format!(
                "{host} resolves to a private address only (--upstream-private-networks deny)"
            ))),
            _ => Ok(reachable),
        }
    }
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// Whether `ip` is on a network of its own rather than the internet: private (10/8, 172.16/12,
/// 192.168/16, fc00::/7), shared (100.64/10), loopback or unspecified.
fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private_v4(v4),
            None => v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xfe00) == 0xfc00,
        },
    }
}

fn is_private_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    v4.is_private() || v4.is_loopback() || v4.is_unspecified() || (a == 100 && (64..128).contains(&b))
}

/// Names that lead to a cloud metadata service (Google's; the others are reached by address).
const METADATA_HOSTS: [&str; 3] = ["metadata.google.internal", "metadata.goog", "metadata"];

/// Whether a URL's host names a cloud metadata service: one of its names, or an address
/// [`is_metadata_service`] refuses (a host name resolving there is refused when connecting).
pub fn is_metadata_host(host: &str) -> bool {
    let host = host.trim_end_matches('.').trim_start_matches('[').trim_end_matches(']');
    METADATA_HOSTS.iter().any(|name| host.eq_ignore_ascii_case(name))
        || host.parse::<IpAddr>().is_ok_and(is_metadata_service)
}

/// Whether an address is where cloud metadata services answer (link-local: 169.254.0.0/16, with
/// 169.254.169.254; fe80::/10; and AWS's fd00:ec2::254): they hand out the machine's own cloud
/// credentials, so no provider, proxy or webhook connection goes there, whatever a base URL says
/// (checked on the resolved address, so no host name leads there either).
pub fn is_metadata_service(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_services_addresses_are_known_whatever_their_spelling() {
        for ip in ["169.254.169.254", "169.254.0.1", "fe80::1", "fd00:ec2::254", "::ffff:169.254.169.254"] {
            assert!(is_metadata_service(ip.parse::<IpAddr>().expect("an address")), "{ip}");
        }
        for ip in ["127.0.0.1", "10.0.0.8", "192.168.1.2", "8.8.8.8", "::1", "fd00::1", "2001:db8::1"] {
            assert!(!is_metadata_service(ip.parse::<IpAddr>().expect("an address")), "{ip}");
        }
    }

    #[test]
    fn metadata_services_names_are_known() {
        for host in [
            "metadata.google.internal",
            "METADATA.google.internal.",
            "metadata",
            "169.254.169.254",
            "[fe80::1]",
        ] {
            assert!(is_metadata_host(host), "{host}");
        }
        for host in ["api.openai.com", "llm.internal", "10.0.0.8", "[::1]", "metadata.example.com"] {
            assert!(!is_metadata_host(host), "{host}");
        }
    }

    #[test]
    fn private_addresses_are_known_whatever_their_spelling() {
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "100.64.0.1",
            "127.0.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fc00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(ip.parse::<IpAddr>().expect("an address")), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2001:db8::1", "::ffff:8.8.8.8", "169.254.169.254"]
        {
            assert!(!is_private(ip.parse::<IpAddr>().expect("an address")), "{ip}");
        }
    }

    #[test]
    fn denied_private_networks_refuse_literals_and_keep_public_addresses_of_a_name() {
        let deny = Destinations { private: PrivateNetworks::Deny };
        assert!(deny.check_host("10.0.0.8").is_err() && deny.check_host("[::1]").is_err());
        assert!(Destinations::default().check_host("10.0.0.8").is_ok());
        let public: SocketAddr = "8.8.8.8:443".parse().expect("address");
        let private: SocketAddr = "10.0.0.8:443".parse().expect("address");
        assert_eq!(deny.reachable("mixed", vec![private, public]).expect("one public"), vec![public]);
        assert!(deny.reachable("inside", vec![private]).is_err());
        assert_eq!(
            Destinations::default().reachable("inside", vec![private]).expect("allowed"),
            vec![private]
        );
    }
}
