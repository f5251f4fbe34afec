//! The result record of one run, which the library returns and the CLI prints: its status (from
//! [`crate::status`]), output, usage, permission decisions, children and worktree.

use serde::{Deserialize, Serialize};

use crate::capabilities::PersonaDelivery;
use crate::child_session::ChildSession;
use crate::permission::PermissionDecision;
use crate::status::Status;
use crate::structured::StructuredVia;
use crate::usage::Usage;

/// The most permission decisions a result records; later ones are counted, not kept, so memory
/// stays flat however many requests an agent sends.
pub const MAX_PERMISSION_RECORDS: usize = 1000;

/// The default of `--max-output`: the most bytes of output a result keeps (the tail).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 8 * 1024 * 1024;

/// What kind of failure a run's `error` describes, for machines (the `error` text is for people).
/// Serialized in kebab-case as the result's `errorKind`; set exactly when `error` is.
///
/// Usage errors (bad flags, cwd, `--env`, an agent that does not speak ACP) have no kind here:
/// they are refused before a run exists, so no result is produced (the CLI exits 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The agent could not be started: not found, not executable, or the spawn failed.
    Spawn,
    /// initialize, session/new or (resuming) session/load failed: no answer within the handshake
    /// timeout, an error answer (authentication required, an unknown session included), or no
    /// session id.
    Handshake,
    /// The agent broke the protocol after the handshake: an error or malformed answer to
    /// session/prompt, an unknown stop reason, an oversized frame, a failed connection.
    Protocol,
    /// The agent exited (or closed its output) before answering, at any stage.
    Crash,
    /// `--timeout` (the overall deadline) elapsed.
    Timeout,
    /// Starting the agent would exceed the delegation depth limit (`ACP_HOST_MAX_DEPTH`, the
    /// definition's `maxDepth`, `--max-depth`); nothing was spawned.
    DepthLimit,
    /// The agent cannot honour a start-time capability the run asked for (a persona mode, a
    /// model, a tool filter, an explicit depth limit; resuming, loading a saved session from an
    /// agent that does not advertise `loadSession`); the prompt was not sent.
    Capability,
    /// The answer did not match the output schema after every follow-up; `error` lists the last
    /// violations.
    SchemaMismatch,
    /// The usage the agent reported passed the run's token or cost budget; `error` names the
    /// figure and the limit.
    Budget,
    /// The sandbox the run asked for cannot be enforced on this machine (`--sandbox-best-effort`
    /// runs anyway), could not be prepared, or the kernel refused it; nothing of the agent ran.
    Sandbox,
    /// The git worktree the run asked for (`--worktree`) could not be made: not inside a git
    /// repository, an unborn `HEAD`, submodules, a bad name or base, or git failed (`error`
    /// carries its stderr); nothing of the agent ran.
    Worktree,
}

impl ErrorKind {
    /// Every kind, in documentation order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Spawn,
        ErrorKind::Handshake,
        ErrorKind::Protocol,
        ErrorKind::Crash,
        ErrorKind::Timeout,
        ErrorKind::DepthLimit,
        ErrorKind::Capability,
        ErrorKind::SchemaMismatch,
        ErrorKind::Budget,
        ErrorKind::Sandbox,
        ErrorKind::Worktree,
    ];

    /// The kebab-case name, as serialized.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Spawn => "spawn",
            ErrorKind::Handshake => "handshake",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Crash => "crash",
            ErrorKind::Timeout => "timeout",
            ErrorKind::DepthLimit => "depth-limit",
            ErrorKind::Capability => "capability",
            ErrorKind::SchemaMismatch => "schema-mismatch",
            ErrorKind::Budget => "budget",
            ErrorKind::Sandbox => "sandbox",
            ErrorKind::Worktree => "worktree",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the agent process ended, as observed by the host after teardown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentExit {
    /// Exit code, when it exited on its own.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// What ended it (the teardown rung), that nothing was spawned, or, for a kept session's
    /// turn, that it is still running.
    pub ended_by: EndedBy,
}

/// What ended the agent process (a result's `agentExit.endedBy`). Serialized in kebab-case
/// (`not-spawned`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum EndedBy {
    /// It had already exited when teardown began.
    Exited,
    /// It exited after its stdin was closed.
    Eof,
    /// SIGTERM to its process group ended it.
    Term,
    /// SIGKILL was needed.
    Kill,
    /// Nothing was spawned: the run was refused or cancelled first, or the spawn failed.
    #[default]
    NotSpawned,
    /// A kept session's turn: the agent is still running, and answers the next prompt.
    Alive,
}

impl EndedBy {
    /// The kebab-case name, as serialized.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Exited => "exited",
            EndedBy::Eof => "eof",
            EndedBy::Term => "term",
            EndedBy::Kill => "kill",
            EndedBy::NotSpawned => "not-spawned",
            EndedBy::Alive => "alive",
        }
    }
}

impl std::fmt::Display for EndedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with the serialized name, as a reader of the JSON would.
impl PartialEq<&str> for EndedBy {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// The result of one run. Serialized as the last NDJSON record (`"type":"result"`) under `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Minted by the host, unique per run; never the agent's session id.
    pub run_id: String,
    pub status: Status,
    /// The agent's stop reason on the wire, when it answered the prompt.
    pub stop_reason: Option<String>,
    /// Every `agent_message_chunk` text, concatenated; kept on every path (partial on cancel/error).
    /// At most `--max-output` bytes: the tail, when more was sent (see `outputTruncatedBytes`).
    pub output: String,
    /// How many bytes were dropped from the start of `output` to keep it within `--max-output`;
    /// absent when nothing was dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_truncated_bytes: Option<u64>,
    /// What went wrong, for statuses other than the stop-reason ones.
    pub error: Option<String>,
    /// The kind of `error`, for machines; present exactly when `error` is.
    pub error_kind: Option<ErrorKind>,
    /// Names (never values) of the variables withheld from the agent's environment.
    pub scrubbed_env: Vec<String>,
    pub agent_exit: AgentExit,
    /// The last bytes the agent wrote to stderr (bounded), for diagnosis.
    pub stderr_tail: String,
    pub duration_ms: u64,
    /// Every permission request and how it was answered, in order: the first 1,000 at most (see
    /// `permissionsDropped`).
    pub permissions: Vec<PermissionDecision>,
    /// How many later permission decisions were not recorded in `permissions`; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions_dropped: Option<u64>,
    /// The agent's ACP session id, when a session was created (useful to correlate agent logs).
    pub session_id: Option<String>,
    /// The session this run's session was forked from (`acp-host run --fork`, ACP `session/fork`):
    /// `sessionId` is then the new session, and the source is left as it was; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    /// The children the agent exposed as sessions of their own (ACP subagent sessions), in the
    /// order they were announced, with how each ended; absent when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildSession>,
    /// How the run's persona reached the agent; absent when the run had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona_delivery: Option<PersonaDelivery>,
    /// The answer as a JSON value matching the output schema; absent without one, or when no
    /// answer matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
    /// How `structured` was obtained (or was expected, when it did not match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_via: Option<StructuredVia>,
    /// Whether the agent advertises `loadSession`, so its session can be continued later
    /// (`--resume`; a delegating agent's cold resume); absent when it never answered `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumable: Option<bool>,
    /// What the run spent, tree-wide, as the agent reported it (its subagents included when it
    /// counts them, as acp-child does); `null` when it reported nothing (never estimated).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// What the run could not do as asked and why (a budget an agent reporting no usage cannot
    /// be held to); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The sandbox the agent ran in and what of it the kernel enforced (`--sandbox`,
    /// `--network`); absent when the run asked for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<crate::sandbox::Report>,
    /// The git worktree the agent worked in (`--worktree`) and what became of it; absent when
    /// the run asked for none or none could be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::WorktreeRecord>,
}

impl RunResult {
    /// The result of run `run_id` before anything happened: status `error` until it is settled,
    /// nothing spawned, nothing recorded; `scrubbed_env` names what the scrub withheld.
    #[must_use]
    pub fn unsettled(run_id: String, scrubbed_env: Vec<String>) -> Self {
        Self {
            run_id,
            status: Status::Error,
            stop_reason: None,
            output: String::new(),
            output_truncated_bytes: None,
            error: None,
            error_kind: None,
            scrubbed_env,
            agent_exit: AgentExit {
                ended_by: EndedBy::NotSpawned,
                ..AgentExit::default()
            },
            stderr_tail: String::new(),
            duration_ms: 0,
            permissions: Vec::new(),
            permissions_dropped: None,
            session_id: None,
            forked_from: None,
            children: Vec::new(),
            persona_delivery: None,
            structured: None,
            structured_via: None,
            resumable: None,
            usage: None,
            warnings: Vec::new(),
            sandbox: None,
            worktree: None,
        }
    }

    #[must_use]
    pub fn exit_code(&self) -> u8 {
        self.status.exit_code()
    }

    /// Records what went wrong: `error` and its kind together (one is set exactly when the other
    /// is).
    pub fn set_error(&mut self, kind: ErrorKind, error: String) {
        self.error = Some(error);
        self.error_kind = Some(kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_serialize_kebab_case() {
        for kind in ErrorKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().to_owned())
            );
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(ErrorKind::DepthLimit.to_string(), "depth-limit");
        let mut result = RunResult::unsettled("r".into(), Vec::new());
        result.set_error(ErrorKind::Sandbox, "no landlock".into());
        assert_eq!(
            (result.error.as_deref(), result.error_kind),
            (Some("no landlock"), Some(ErrorKind::Sandbox))
        );
    }

    #[test]
    fn ended_by_serializes_to_the_names_results_have_always_had() {
        for (ended_by, name) in [
            (EndedBy::Exited, "exited"),
            (EndedBy::Eof, "eof"),
            (EndedBy::Term, "term"),
            (EndedBy::Kill, "kill"),
            (EndedBy::NotSpawned, "not-spawned"),
            (EndedBy::Alive, "alive"),
        ] {
            let wire = serde_json::Value::String(name.to_owned());
            assert_eq!(serde_json::to_value(ended_by).unwrap(), wire);
            assert_eq!(serde_json::from_value::<EndedBy>(wire).unwrap(), ended_by);
            assert_eq!(ended_by.as_str(), name);
            assert_eq!(ended_by.to_string(), name);
            assert!(ended_by == name, "{ended_by:?} reads as {name}");
        }
        assert!(EndedBy::Kill != "term");
    }

    #[test]
    fn a_results_exit_code_is_its_status_code() {
        let result = |status| RunResult {
            status,
            ..RunResult::unsettled("r".into(), Vec::new())
        };
        assert_eq!(result(Status::Completed).exit_code(), 0);
        assert_eq!(result(Status::Timeout).exit_code(), 124);
        assert_eq!(result(Status::Aborted).exit_code(), 130);
    }
}
