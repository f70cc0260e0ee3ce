//! The `recovea` binary: parses flags, builds the parts, starts them. No rule lives here.

mod admin;
mod data_dir;
mod serve;
mod size;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "recovea",
    version,
    about = "Recovea: an LLM API gateway that enforces spend caps and meters every request"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// All in one: the admin API and one gateway node, embedded SQLite, in-process counters.
    Serve(ServeArgs),
    /// A client of the admin API; prints JSON.
    Admin(admin::AdminArgs),
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Gateway address.
    #[arg(long, env = "RECOVEA_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Admin API address.
    #[arg(long, env = "RECOVEA_ADMIN_LISTEN", default_value = "127.0.0.1:8081")]
    admin_listen: SocketAddr,
    /// Holds the SQLite file and the generated secrets.
    #[arg(long, env = "RECOVEA_DATA_DIR", default_value = "./recovea-data")]
    data_dir: PathBuf,
    /// `sqlite://PATH`; defaults to a SQLite file in the data dir.
    #[arg(long, env = "RECOVEA_DATABASE_URL")]
    database_url: Option<String>,
    /// Bearer token of the admin API; generated on first start and saved in the data dir when not given.
    #[arg(long, env = "RECOVEA_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// 64 hex characters that seal provider keys at rest; generated into the data dir when not given.
    #[arg(long, env = "RECOVEA_MASTER_KEY", hide_env_values = true)]
    master_key: Option<String>,
    /// Default base URL of openai-kind credentials, and where a fail-open pass goes.
    #[arg(long, env = "RECOVEA_OPENAI_BASE_URL", default_value = "https://api.openai.com")]
    openai_base_url: String,
    /// Default base URL of anthropic-kind credentials, and where a fail-open pass goes.
    #[arg(long, env = "RECOVEA_ANTHROPIC_BASE_URL", default_value = "https://api.anthropic.com")]
    anthropic_base_url: String,
    /// Largest request body accepted (bytes, or with a KiB/MiB/GiB suffix); larger ones get 413.
    #[arg(long, env = "RECOVEA_MAX_BODY_SIZE", default_value = "32MiB", value_parser = size::parse_bytes)]
    max_body_size: u64,
    /// How long to wait for a provider's response headers before answering 504.
    #[arg(long, env = "RECOVEA_UPSTREAM_TIMEOUT", default_value = "600s", value_parser = humantime::parse_duration)]
    upstream_timeout: Duration,
    /// How long to wait for a connection to a provider before answering 502.
    #[arg(long, env = "RECOVEA_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// How long a client may take to send its request body before it gets 408.
    #[arg(long, env = "RECOVEA_REQUEST_BODY_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    request_body_timeout: Duration,
    /// Key of the HMAC-SHA256 signature on alert webhooks; generated into the data dir when not given.
    #[arg(long, env = "RECOVEA_ALERT_SIGNING_SECRET", hide_env_values = true)]
    alert_signing_secret: Option<String>,
    /// Shared spend counters (`redis://HOST:PORT/DB`); without it, counters live in this process.
    #[arg(long, env = "RECOVEA_REDIS_URL")]
    redis_url: Option<String>,
    /// An armed cap whose counters were not confirmed for longer than this answers 503.
    #[arg(long, env = "RECOVEA_COUNTER_MAX_AGE", default_value = "60s", value_parser = humantime::parse_duration)]
    counter_max_age: Duration,
    /// Log filter, in `RUST_LOG` syntax.
    #[arg(long, env = "RECOVEA_LOG", default_value = "info")]
    log: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(args)),
        Command::Admin(args) => runtime.block_on(admin::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
