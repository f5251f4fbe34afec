//! `acp-host sync` (being built under the sync issue).

use std::process::ExitCode;

/// Write canonical subagent definitions into every installed agent's own format.
#[derive(Debug, clap::Args)]
pub struct SyncArgs {}

pub fn execute(_args: SyncArgs) -> ExitCode {
    eprintln!("acp-host sync: not available in this build yet");
    ExitCode::from(2)
}
