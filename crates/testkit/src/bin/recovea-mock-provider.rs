//! The mock provider as a process, for black-box tests and benchmarks of the gateway.

use std::io::Write;
use std::net::SocketAddr;

use clap::Parser;
use recovea_testkit::{MockProvider, Transport};

/// A mock OpenAI/Anthropic provider; see the recovea-testkit crate docs for its behaviour.
#[derive(Parser)]
#[command(name = "recovea-mock-provider", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Keep only the most recent N requests in the log served at /__mock/requests (0: none).
    /// Unbounded by default; set it for long benchmarks so the log cannot exhaust memory.
    #[arg(long, value_name = "N")]
    max_recorded: Option<usize>,
    /// Serve over TLS with the tests' certificate for 127.0.0.1 (its CA is
    /// `crates/testkit/testdata/ca.pem`), offering HTTP/2 and HTTP/1.1.
    #[arg(long)]
    tls: bool,
    /// Over TLS, the most concurrent streams one HTTP/2 connection allows.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "tls")]
    h2_max_streams: u32,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let transport =
        if args.tls { Transport::Tls { max_streams: args.h2_max_streams } } else { Transport::Plain };
    let mock = MockProvider::serve_over(tokio::net::TcpListener::bind(args.listen).await?, transport)?;
    if let Some(limit) = args.max_recorded {
        mock.set_record_limit(limit);
    }
    // Tests read the port from this line, so it must be the only one and reach them at once.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", mock.url())?;
    stdout.flush()?;
    drop(stdout);
    std::future::pending::<()>().await;
    Ok(())
}
