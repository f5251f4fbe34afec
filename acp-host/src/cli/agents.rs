//! `acp-host agents` (being built under the sync issue).

use std::process::ExitCode;

/// List the agents the registry knows, whether each is installed, and where sync writes for it.
#[derive(Debug, clap::Args)]
pub struct AgentsArgs {}

pub fn execute(_args: &AgentsArgs) -> ExitCode {
    eprintln!("acp-host agents: not available in this build yet");
    ExitCode::from(2)
}
