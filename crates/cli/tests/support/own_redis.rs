//! A `redis-server` of a test's own, on a port of its own, with nothing kept on disk: for tests that
//! kill or flush it (the shared one at 6379 serves every other test). Included with `#[path]`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct OwnRedis {
    child: Child,
    pub port: u16,
}

impl OwnRedis {
    /// Starts it on a free port.
    pub fn start_anywhere(dir: &Path) -> Self {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        Self::start(port, dir)
    }

    pub fn start(port: u16, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("redis dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not come up on {port}");
            // A plain blocking fn, so no eventually(): the port asked every 20 ms.
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Sends one command and reads its answer: a simple or integer reply's line, or a bulk string.
    pub fn command(&self, words: &[&str]) -> String {
        use std::io::{BufRead, BufReader, Write};
        let mut stream = std::net::TcpStream::connect(self.addr()).expect("connect to redis");
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut request = format!("*{}\r\n", words.len());
        for word in words {
            request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
        }
        stream.write_all(request.as_bytes()).expect("send");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("answer");
        if line.starts_with('$') && !line.starts_with("$-1") {
            let mut value = String::new();
            reader.read_line(&mut value).expect("bulk value");
            return value.trim_end().to_owned();
        }
        line.trim_end().to_owned()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
