//! acp-child: an ACP agent server (protocol v1) speaking JSON-RPC on stdio.
//!
//! Layout: [`server`] wires the official SDK (`agent-client-protocol`) to the session table
//! ([`session`]) and a prompt backend ([`backend`]); [`command`] parses the offline slash
//! commands; [`tools`] confines file access to a session's directory.
//!
//! Invariants: stdout carries only protocol frames (logs go to stderr through `tracing`); bad
//! input from a client becomes a JSON-RPC error or an explanatory reply, never a panic.

pub mod backend;
pub mod command;
pub mod persona;
pub mod server;
pub mod session;
pub mod store;
pub mod tools;

pub use server::{AgentConfig, ServeError, serve, serve_stdio};

/// The agent's name in `initialize` and in `--version`.
pub const AGENT_NAME: &str = "acp-child";
/// The agent's version, from the crate.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// An error and its chain of causes on one line, as shown in replies and JSON-RPC errors.
pub use protocol::report::describe;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_joins_the_cause_chain() {
        let error = tools::ToolError::Io {
            action: "read",
            requested: "a.txt".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(describe(&error), "cannot read a.txt: no such file");
    }
}
