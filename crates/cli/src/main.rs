//! The `recovea` binary: parses flags, builds the parts, starts them. No rule lives here.

mod admin;
mod allocator;
mod args;
mod control;
mod data_dir;
mod node;
mod serve;
mod size;
mod wiring;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Serve(args::ServeArgs),
    /// The control plane alone: the admin API, the feed nodes follow, receipt ingest, alerts.
    Control(args::ControlArgs),
    /// A gateway node alone, fed by a control plane.
    Node(args::NodeArgs),
    /// A client of the admin API; prints JSON.
    Admin(admin::AdminArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _failpoints = recovea_gateway::failpoints_from_env();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(args)),
        Command::Control(args) => runtime.block_on(control::run(args)),
        Command::Node(args) => runtime.block_on(node::run(args)),
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
