//! The `recovea` binary: parses flags, builds the parts, starts them. No rule lives here.

mod admin;
mod allocator;
mod args;
mod control;
mod data_dir;
mod failure;
mod lifecycle;
mod log_fields;
mod node;
mod serve;
mod size;
mod wiring;

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use recovea_core::ConfigError;

use crate::failure::Failure;

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
    allocator::without_huge_pages();
    data_dir::private_files();
    let matches = Cli::command().try_get_matches().unwrap_or_else(|error| {
        if let Some(variable) = variable_of_bad_value(&error) {
            eprintln!("error: the environment variable {variable} holds a value that cannot be used");
        }
        error.exit()
    });
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
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
        Command::Admin(args) => runtime.block_on(admin::run(args)).map_err(Failure::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(problems)) => {
            // One line a problem: a configuration names every wrong setting at once.
            for problem in problems {
                for line in naming_the_variable(&problem, &matches).lines() {
                    eprintln!("error: {line}");
                }
            }
            ExitCode::FAILURE
        }
    }
}

/// The environment variable of a long flag of any subcommand, e.g. `RECOVEA_LISTEN` for `listen`.
fn variable_of(flag: &str) -> Option<String> {
    fn search(command: &clap::Command, flag: &str) -> Option<String> {
        let own = command.get_arguments().find(|arg| arg.get_long() == Some(flag));
        own.and_then(|arg| arg.get_env().map(|env| env.to_string_lossy().into_owned()))
            .or_else(|| command.get_subcommands().find_map(|sub| search(sub, flag)))
    }
    search(&Cli::command(), flag)
}

/// The variable a value that clap refused came from, when it came from the environment: clap's
/// own message names only the flag.
fn variable_of_bad_value(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(error.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else { return None };
    let flag = arg.split_whitespace().next()?.strip_prefix("--")?;
    let given = std::env::args().any(|a| a == format!("--{flag}") || a.starts_with(&format!("--{flag}=")));
    let variable = variable_of(flag)?;
    (!given && std::env::var_os(&variable).is_some()).then_some(variable)
}

/// A problem with `--flag` whose value came from its environment variable names the variable
/// first: that is where the operator must look.
fn naming_the_variable(problem: &ConfigError, matches: &ArgMatches) -> String {
    let Some(flag) = problem.flag else { return problem.to_string() };
    let Some((_, given)) = matches.subcommand() else { return problem.to_string() };
    let from_environment = given.value_source(&flag.replace('-', "_")) == Some(ValueSource::EnvVariable);
    match variable_of(flag) {
        Some(variable) if from_environment => {
            format!("{variable} (the environment variable of --{flag}): {}", problem.why)
        }
        _ => problem.to_string(),
    }
}
