//! The start request: everything one run needs, already validated by the caller's edge.
//!
//! Invariants: `cwd` is absolute (the edge resolves and checks it once, before spawning); the agent
//! command is already resolved from a registry name or a command line; durations are explicit, and
//! [`Timeouts::default`] is the one home of their defaults (the CLI's flag defaults and `--help`
//! are derived from it).

use std::path::PathBuf;
use std::time::Duration;

use crate::capabilities::Wants;
use crate::env_scrub::EnvForward;
use crate::permission::PermissionPolicy;

/// The program to spawn and how the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// How the user named the agent (`acp-child`, `codex`, or the command line), for messages.
    pub display: String,
    /// How to install the program, when it is known (registry agents): shown if it is missing.
    pub install_hint: Option<String>,
}

impl AgentCommand {
    /// The whole command line that runs, quoted as a shell would read it back: what a person
    /// approving it is shown.
    #[must_use]
    pub fn command_line(&self) -> String {
        shell_words::join(
            std::iter::once(self.program.to_string_lossy().into_owned())
                .chain(self.args.iter().cloned()),
        )
    }
}

/// Deadlines and graces of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole run (`--timeout`); `None` waits as long as the agent works.
    pub overall: Option<Duration>,
    /// initialize + session/new must answer within this; a silent agent is an error, not a hang.
    pub handshake: Duration,
    /// After session/cancel, how long to wait for the agent's `cancelled` before tearing down.
    pub cancel_grace: Duration,
    /// Teardown: after closing stdin, how long the agent may take to exit on its own.
    pub eof_grace: Duration,
    /// Teardown: after SIGTERM to the group, how long before SIGKILL.
    pub term_grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            overall: None,
            handshake: Duration::from_mins(1),
            cancel_grace: Duration::from_secs(3),
            // Short on purpose: popular agents ignore stdin EOF (the host keeps draining their
            // stdout meanwhile, so one that does flush on EOF is not cut off), and every run of
            // those pays EOF grace + TERM grace.
            eof_grace: Duration::from_secs(1),
            term_grace: Duration::from_secs(2),
        }
    }
}

/// One run of one agent on one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    pub agent: AgentCommand,
    pub prompt: String,
    /// Absolute and checked; the process cwd and the session/new cwd.
    pub cwd: PathBuf,
    /// `--env` forwards, merged over the scrubbed ambient environment.
    pub env: Vec<EnvForward>,
    pub permission: PermissionPolicy,
    pub timeouts: Timeouts,
    /// The delegation depth cap asked for (`--max-depth`, a definition's `maxDepth`); it can only
    /// lower the inherited one (`crate::depth`).
    pub max_depth: Option<u32>,
    /// Persona, model, tool filter: honoured by the agent or refused before the prompt
    /// (`crate::capabilities`).
    pub wants: Wants,
    /// Continue this saved session of the agent (`session/load`, then the prompt) instead of
    /// starting one with `session/new`; the agent must advertise `loadSession`.
    pub resume: Option<String>,
    /// Start as a fork of this session of the agent (`session/fork`, then the prompt in the new
    /// session): it knows the source's completed turns, and the source is left untouched. The
    /// agent must advertise `sessionCapabilities.fork`. Not together with `resume` (refused by
    /// `acp-host::run::prepare`).
    pub fork: Option<String>,
    /// What the run may spend (`--token-budget`, `--cost-budget`): passing it cancels the turn
    /// (status `over-budget`). Held only against what the agent reports (`crate::usage`).
    pub budget: crate::usage::Budget,
    /// What a budgeted run does when its agent reported no usage by the end of its first reply
    /// (`--on-unreported`): cancelled as an error (the default), or let run with a warning.
    pub on_unreported: crate::usage::Unreported,
    /// The sandbox the agent runs in (`crate::sandbox`): files, network. It can only tighten the
    /// one the caller itself runs in (`crate::env_vars::ACP_HOST_SANDBOX`).
    pub sandbox: crate::sandbox::Policy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_quoted_as_a_shell_reads_it_back() {
        let command = AgentCommand {
            program: PathBuf::from("/opt/my agents/run"),
            args: vec!["--acp".into(), "it's".into(), String::new()],
            display: "run".into(),
            install_hint: None,
        };
        let line = command.command_line();
        assert_eq!(line, r"'/opt/my agents/run' --acp 'it'\''s' ''");
        assert_eq!(
            shell_words::split(&line).unwrap(),
            ["/opt/my agents/run", "--acp", "it's", ""]
        );
    }

    #[test]
    fn the_default_timeouts_are_the_documented_ones() {
        assert_eq!(
            Timeouts::default(),
            Timeouts {
                overall: None,
                handshake: Duration::from_mins(1),
                cancel_grace: Duration::from_secs(3),
                eof_grace: Duration::from_secs(1),
                term_grace: Duration::from_secs(2),
            }
        );
    }
}
