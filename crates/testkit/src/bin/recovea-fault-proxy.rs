//! The fault proxy as a process, for benchmarks that break a node's link to its shared store:
//! `recovea-fault-proxy --upstream HOST:PORT [--listen ADDR]` prints `listening on HOST:PORT`, then
//! reads one fault a line from its standard input and applies it at once to every connection:
//! `pass`, `delay MS` (each way), `cut`, `refuse`. It answers each line with `ok` or `error: ...`
//! and stops at the end of its input.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use recovea_testkit::faults::{Fault, FaultProxy};

#[derive(Parser)]
#[command(name = "recovea-fault-proxy", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where connections go (a Redis, say).
    #[arg(long)]
    upstream: SocketAddr,
}

/// A fault as one line of input names it.
fn parse(line: &str) -> Result<Fault, String> {
    let mut words = line.split_whitespace();
    let fault = match (words.next(), words.next()) {
        (Some("pass"), None) => Fault::Pass,
        (Some("cut"), None) => Fault::Cut,
        (Some("refuse"), None) => Fault::Refuse,
        (Some("delay"), Some(ms)) => {
            Fault::Delay(Duration::from_millis(ms.parse().map_err(|_| format!("not milliseconds: {ms}"))?))
        }
        _ => return Err(format!("expected pass, delay MS, cut or refuse: {line:?}")),
    };
    match words.next() {
        None => Ok(fault),
        Some(extra) => Err(format!("unexpected {extra:?}")),
    }
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let proxy = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        Ok::<_, std::io::Error>(FaultProxy::start_on(listener, args.upstream))
    })?;
    println!("listening on {}", proxy.addr());
    // The proxy runs on the runtime's worker; this thread reads the faults.
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let answer = match parse(&line) {
            Ok(fault) => {
                proxy.set(fault);
                "ok".to_owned()
            }
            Err(e) => format!("error: {e}"),
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_read_from_their_lines() {
        assert_eq!(parse("pass"), Ok(Fault::Pass));
        assert_eq!(parse(" delay 75 "), Ok(Fault::Delay(Duration::from_millis(75))));
        assert_eq!(parse("cut"), Ok(Fault::Cut));
        assert_eq!(parse("refuse"), Ok(Fault::Refuse));
        for bad in ["", "delay", "delay x", "cut now", "drop"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
