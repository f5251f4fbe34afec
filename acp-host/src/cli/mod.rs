//! The command line: clap types, conversion into typed configs, rendering, exit codes.
//!
//! Invariants: clap lives only here; each subcommand converts its raw arguments once into the typed
//! config the library takes, then renders the library's result. `main` returns an exit code; a
//! broken stdout pipe is not an error.

mod agents;
mod run;
mod sync;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run ACP agents as out-of-process subagents, and keep subagent definitions in sync.
#[derive(Debug, Parser)]
#[command(name = "acp-host", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    // A flag given twice takes its last value, so wrappers can append overrides.
    #[command(args_override_self = true)]
    Run(run::RunArgs),
    Sync(sync::SyncArgs),
    Agents(agents::AgentsArgs),
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help/version to stdout and usage errors to stderr; map its codes onto ours.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(protocol::result::EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Run(args) => run::execute(&args),
        Command::Sync(args) => sync::execute(args),
        Command::Agents(args) => agents::execute(&args),
    }
}
