//! acp-child: an ACP agent server (protocol v1) speaking JSON-RPC on stdio.
//!
//! Layout: `server` wires the official SDK (`agent-client-protocol`) to the session table
//! (`session`) and a prompt backend (`backend`: `offline` with its slash commands, `model` with
//! its tools, one module each, and persona); `backend::permission` is the one flow asking the user
//! before a change; `workspace` confines file access (and the commands run) to a session's
//! directory; `store` saves sessions as JSONL.
//!
//! The public surface is what the binary and the test suites need: the configuration, serving on
//! stdio, and the texts `--help` shows. Everything else is crate-private.
//!
//! Invariants: stdout carries only protocol frames (logs go to stderr through `tracing`); bad
//! input from a client becomes a JSON-RPC error or an explanatory reply, never a panic.

mod backend;
mod outbox;
mod persona;
mod server;
mod session;
mod stdio;
mod store;
mod workspace;

use std::time::Duration;

pub use backend::CommandHelp;
pub use backend::children::{
    DEFAULT_MAX_PARALLEL_SUBAGENTS, SubagentError, SubagentOptions, Subagents, inherited_standing,
};
pub use backend::model::config::{
    ApiKey, DEEPSEEK_BASE_URL, DEFAULT_COMMAND_TIMEOUT_SECS, DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TURN_REQUESTS, DEFAULT_RETRY_BASE_MS, KEY_VARIABLES, OPENAI_BASE_URL, STATE_SUBDIR,
};
pub use backend::model::{
    ClientBuildError, ConfigError, DiscoveryError, ModelConfig, ModelOptions,
};
pub use backend::offline::NO_MODEL_REPLY;
pub use backend::offline::commands::COMMANDS_HELP;
pub use persona::PersonaError;
/// An error and its chain of causes on one line, as shown in replies and JSON-RPC errors.
pub use protocol::report::describe;
pub use server::{AgentConfig, ServeError, serve_stdio};

/// The agent's name in `initialize` and in `--version`.
pub const AGENT_NAME: &str = "acp-child";
pub(crate) const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The names of the model's tools, in the order it is offered them.
#[must_use]
pub fn tool_names() -> Vec<&'static str> {
    backend::model::tools::Toolbox::standard(
        Duration::ZERO,
        &protocol::sandbox::Policy::default(),
        false,
        false,
    )
    .names()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_joins_the_cause_chain() {
        let error = workspace::ToolError::Io {
            action: "read",
            requested: "a.txt".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(describe(&error), "cannot read a.txt: no such file");
    }
}
