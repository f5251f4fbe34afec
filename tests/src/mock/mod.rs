//! The scripted mock ACP agent behind the `mock-agent` binary: a deliberately raw NDJSON
//! JSON-RPC speaker (not the SDK), so it can misbehave on purpose: garbage lines, a missing
//! session id, unknown stop reasons, huge frames, crashes, ignored EOF and SIGTERM.
//!
//! Layout: `cli` parses argv into a [`cli::Scenario`]; `wire` builds and classifies frames;
//! `inbox` reads stdin and keeps the `--log` trail; `files` writes the files tests watch;
//! `signals` traps SIGTERM; `agent` runs the main loop; `script` plays each prompt turn.

#![expect(
    clippy::print_stderr,
    reason = "the mock agent's stderr is part of its scripted behaviour"
)]

mod agent;
pub mod cli;
mod files;
mod inbox;
mod script;
mod signals;
pub mod wire;

pub use agent::{SETUP_FAILURE_EXIT, run};
