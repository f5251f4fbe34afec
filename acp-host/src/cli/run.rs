//! `acp-host run` (in progress).

use std::process::ExitCode;

/// Drive one ACP agent on one prompt.
#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub fn execute(_args: RunArgs) -> ExitCode {
    ExitCode::from(2)
}
