//! An egress proxy as corporate networks have one: `CONNECT host:port` opens a tunnel (how `https`
//! goes through it), and a request in absolute form (`POST http://host:port/path HTTP/1.1`, how
//! plain `http` goes through it) is passed on to that host. It records what each connection asked
//! for and the credentials it showed; with credentials set, a connection showing others gets `407`.
//!
//! A connection carries one destination: the first request chooses it and the rest of the
//! connection is passed through as it is, which is all a client that pools its connections by
//! origin (as the gateway does) needs.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What one connection to the proxy asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The request line, e.g. `CONNECT 127.0.0.1:443 HTTP/1.1`.
    pub request_line: String,
    /// The value of its `Proxy-Authorization` header, if any.
    pub authorization: Option<String>,
}

/// A running proxy on 127.0.0.1; it stops when dropped.
pub struct ConnectProxy {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<Asked>>>,
    accept: JoinHandle<()>,
}

impl ConnectProxy {
    /// A proxy that lets every connection through, or, with `authorization` (the whole header
    /// value, e.g. `Basic dXNlcjpwYXNz`), only those that show it.
    ///
    /// # Panics
    ///
    /// If no local port can be bound.
    pub async fn start(authorization: Option<&str>) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.expect("binding an ephemeral port on 127.0.0.1");
        let addr = listener.local_addr().expect("a bound listener's address");
        let asked = Arc::new(Mutex::new(Vec::new()));
        let required = authorization.map(str::to_owned);
        let log = Arc::clone(&asked);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(pass(client, Arc::clone(&log), required.clone()));
            }
        });
        Self { addr, asked, accept }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What every connection asked for so far, oldest first.
    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 << 10;

async fn pass(mut client: TcpStream, log: Arc<Mutex<Vec<Asked>>>, required: Option<String>) {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) if buf.len() + n <= MAX_HEAD => buf.extend_from_slice(&chunk[..n]),
            Ok(_) => return,
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let authorization = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, value)| value.trim().to_owned());
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Asked { request_line: request_line.clone(), authorization: authorization.clone() });
    if required.is_some() && authorization != required {
        let refusal = "HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"test\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let _ = client.write_all(refusal.as_bytes()).await;
        return;
    }
    let mut words = request_line.split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let (destination, tunnel) = if method == "CONNECT" {
        (target.to_owned(), true)
    } else if let Some(rest) = target.strip_prefix("http://") {
        (rest.split('/').next().unwrap_or_default().to_owned(), false)
    } else {
        let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
        return;
    };
    let Ok(mut upstream) = TcpStream::connect(&destination).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n").await;
        return;
    };
    let forwarded = if tunnel {
        if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
            return;
        }
        &buf[end..]
    } else {
        &buf[..]
    };
    if upstream.write_all(forwarded).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
