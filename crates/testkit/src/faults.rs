//! A TCP proxy that breaks the link to a shared store the way networks do: it passes bytes, adds
//! latency, cuts the link (packets dropped: connections stay open, nothing arrives, and what was
//! sent arrives once the link is back, as TCP retransmits it), or refuses (connections closed at
//! once, new ones too). The fault can change at any time and applies to the connections already
//! open. Fault-injection tests put it between a node and Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the link does to the bytes crossing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Bytes pass as they come.
    #[default]
    Pass,
    /// Each byte arrives this much later, in each direction (a round trip pays it twice).
    Delay(Duration),
    /// Packets dropped: connections stay open and nothing arrives either way; what was sent is
    /// held and arrives, in order, once the fault changes (TCP retransmits what was lost).
    Cut,
    /// Every open connection is closed and new ones are closed as they come.
    Refuse,
}

/// A running fault proxy on 127.0.0.1 in front of `upstream`; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<watch::Sender<Fault>>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy passing everything to `upstream` until told otherwise.
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.expect("binding an ephemeral port on 127.0.0.1");
        Self::start_on(listener, upstream)
    }

    /// A proxy accepting on `listener`, passing everything to `upstream` until told otherwise.
    ///
    /// # Panics
    ///
    /// If the listener has no local address.
    pub fn start_on(listener: TcpListener, upstream: SocketAddr) -> Self {
        let addr = listener.local_addr().expect("a bound listener's address");
        let fault = Arc::new(watch::Sender::new(Fault::Pass));
        let faults = Arc::clone(&fault);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *faults.borrow() == Fault::Refuse {
                    drop(client);
                    continue;
                }
                let faults = faults.subscribe();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        link(client, server, faults).await;
                    }
                });
            }
        });
        Self { addr, fault, accept }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The fault from now on, for open connections and new ones.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// A handle that sets the fault from elsewhere (another task), while the proxy runs.
    pub fn switch(&self) -> FaultSwitch {
        FaultSwitch(Arc::clone(&self.fault))
    }
}

/// Sets a [`FaultProxy`]'s fault; see [`FaultProxy::switch`].
#[derive(Clone)]
pub struct FaultSwitch(Arc<watch::Sender<Fault>>);

impl FaultSwitch {
    pub fn set(&self, fault: Fault) {
        self.0.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.set(Fault::Refuse);
    }
}

/// Both directions of one connection, until either side closes or the link refuses.
async fn link(client: TcpStream, server: TcpStream, faults: watch::Receiver<Fault>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = direction(client_read, server_write, faults.clone()) => {}
        () = direction(server_read, client_write, faults) => {}
    }
}

/// One direction: a reader stamps each chunk with when it arrived and what the fault was then; a
/// writer delivers it that much later, so that a delay is latency, not a cap on throughput.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut faults: watch::Receiver<Fault>) {
    let mut restored = faults.clone();
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async {
        let mut buffer = vec![0_u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                read = from.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                changed = faults.changed() => {
                    if changed.is_err() || *faults.borrow() == Fault::Refuse {
                        return;
                    }
                    continue;
                }
            };
            let at = match *faults.borrow() {
                Fault::Pass | Fault::Cut => Instant::now(),
                Fault::Delay(delay) => Instant::now() + delay,
                Fault::Refuse => return,
            };
            if chunks.send((at, buffer[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write = async {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if restored.wait_for(|fault| *fault != Fault::Cut).await.is_err() {
                return;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // Either half ending ends the direction; the connection closes with it.
    tokio::select! {
        () = read => {}
        () = write => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on 127.0.0.1.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer).await {
                        if n == 0 || stream.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> Option<Duration> {
        let started = Instant::now();
        stream.write_all(b"ping").await.ok()?;
        let mut answer = [0_u8; 4];
        match tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut answer)).await {
            Ok(Ok(_)) if &answer == b"ping" => Some(started.elapsed()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn each_fault_does_what_it_says_to_open_and_new_connections() {
        let proxy = FaultProxy::start(echo().await).await;
        let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        let quick = round_trip(&mut stream).await.expect("passes");
        assert!(quick < Duration::from_millis(100), "{quick:?}");

        proxy.set(Fault::Delay(Duration::from_millis(150)));
        let slow = round_trip(&mut stream).await.expect("passes, late");
        assert!(slow >= Duration::from_millis(300), "both directions delayed: {slow:?}");

        proxy.set(Fault::Cut);
        assert_eq!(round_trip(&mut stream).await, None, "nothing arrives on the open connection");
        let mut new = TcpStream::connect(proxy.addr()).await.expect("accepted, then silent");
        assert_eq!(round_trip(&mut new).await, None, "nor on a new one");
        proxy.set(Fault::Pass);
        let mut held = [0_u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut held)).await;
        assert!(matches!(read, Ok(Ok(_))) && &held == b"ping", "what was sent arrives once restored");
        let mut held = [0_u8; 4];
        new.read_exact(&mut held).await.expect("the new connection's too");

        proxy.set(Fault::Refuse);
        let mut closed = [0_u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut closed)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "an open connection is closed: {read:?}");
        let mut refused = TcpStream::connect(proxy.addr()).await.expect("the listener accepts");
        let read = tokio::time::timeout(Duration::from_secs(2), refused.read(&mut closed)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "and closes a new one: {read:?}");

        proxy.set(Fault::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert!(round_trip(&mut again).await.is_some(), "passes again");
    }
}
