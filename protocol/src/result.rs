//! The outcome of one run: statuses, the stop-reason -> status -> exit-code table, and the result
//! record that the library returns and the CLI prints.
//!
//! Invariant: this file is the only place that maps a stop reason to a status or a status to an exit
//! code. The CLI's exit codes, its `--help` table and the manual's (`docs/`) are all derived from [`Status`].

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::capabilities::PersonaDelivery;
use crate::child_session::ChildSession;
use crate::permission::PermissionDecision;
use crate::structured::StructuredVia;
use crate::usage::Usage;

/// How a run ended. Serialized in kebab-case (`max-tokens`), which is also how it is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The agent ended its turn normally (`end_turn`).
    Completed,
    /// The agent hit its token limit (`max_tokens`).
    MaxTokens,
    /// The agent hit its limit of model requests in one turn (`max_turn_requests`).
    MaxTurnRequests,
    /// The agent refused (`refusal`).
    Refusal,
    /// The run was cancelled (Ctrl-C, SIGTERM, or the library's cancel) or the agent said `cancelled`.
    Aborted,
    /// `--timeout` elapsed.
    Timeout,
    /// The answer did not match `--output-schema`, after every follow-up (`--schema-retries`).
    SchemaMismatch,
    /// The usage the agent reported passed `--token-budget` or `--cost-budget`.
    OverBudget,
    /// Anything else: spawn failure, crash, protocol error, unknown stop reason.
    Error,
}

/// The most permission decisions a result records; later ones are counted, not kept, so memory
/// stays flat however many requests an agent sends.
pub const MAX_PERMISSION_RECORDS: usize = 1000;

/// The default of `--max-output`: the most bytes of output a result keeps (the tail).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 8 * 1024 * 1024;

/// Usage errors (bad flags, bad cwd, bad `--env`) exit with this code; no child is spawned.
pub const EXIT_USAGE: u8 = 2;

impl Status {
    /// Every status, in the order the exit-code table is documented.
    pub const ALL: [Status; 9] = [
        Status::Completed,
        Status::MaxTokens,
        Status::MaxTurnRequests,
        Status::Refusal,
        Status::SchemaMismatch,
        Status::OverBudget,
        Status::Aborted,
        Status::Timeout,
        Status::Error,
    ];

    /// Maps an ACP stop reason (its wire name) to a status. Unknown reasons are errors, never a
    /// silent success: a newer agent may add reasons, and treating one as success would hide it.
    #[must_use]
    pub fn from_stop_reason(reason: &str) -> Status {
        match reason {
            "end_turn" => Status::Completed,
            "max_tokens" => Status::MaxTokens,
            "max_turn_requests" => Status::MaxTurnRequests,
            "refusal" => Status::Refusal,
            "cancelled" => Status::Aborted,
            _ => Status::Error,
        }
    }

    /// The process exit code of `acp-host run` for this status.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Completed => 0,
            Status::Error => 1,
            Status::MaxTokens => 3,
            Status::MaxTurnRequests => 4,
            Status::Refusal => 5,
            Status::SchemaMismatch => 6,
            Status::OverBudget => 7,
            Status::Timeout => 124,
            Status::Aborted => 130,
        }
    }

    /// The stop reason that produces this status, if one does (for documentation tables).
    #[must_use]
    pub fn stop_reason(self) -> Option<&'static str> {
        match self {
            Status::Completed => Some("end_turn"),
            Status::MaxTokens => Some("max_tokens"),
            Status::MaxTurnRequests => Some("max_turn_requests"),
            Status::Refusal => Some("refusal"),
            Status::Aborted => Some("cancelled"),
            Status::Timeout | Status::Error | Status::SchemaMismatch | Status::OverBudget => None,
        }
    }

    /// The kebab-case name, as serialized and printed.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::MaxTokens => "max-tokens",
            Status::MaxTurnRequests => "max-turn-requests",
            Status::Refusal => "refusal",
            Status::Aborted => "aborted",
            Status::Timeout => "timeout",
            Status::SchemaMismatch => "schema-mismatch",
            Status::OverBudget => "over-budget",
            Status::Error => "error",
        }
    }

    /// When a run ends with this status, in the words of the exit-code table.
    #[must_use]
    pub fn when(self) -> &'static str {
        match self {
            Status::Completed => "stop reason end_turn",
            Status::MaxTokens => "stop reason max_tokens",
            Status::MaxTurnRequests => "stop reason max_turn_requests",
            Status::Refusal => "stop reason refusal",
            Status::SchemaMismatch => {
                "no answer matched --output-schema within --schema-retries follow-ups"
            }
            Status::OverBudget => {
                "the usage the agent reported passed --token-budget or --cost-budget"
            }
            Status::Aborted => "Ctrl-C / SIGTERM, or stop reason cancelled",
            Status::Timeout => "--timeout elapsed",
            Status::Error => {
                "spawn, connection or protocol failure, crash, depth limit, capability"
            }
        }
    }

    /// The exit-code table of `acp-host run` as text, for its `--help`.
    #[must_use]
    pub fn exit_code_table() -> String {
        Documented::Run.exit_table()
    }
}

/// A subcommand whose exit codes are documented as a table, in its `--help` and in the manual (`docs/`)
/// (a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Documented {
    Run,
    Batch,
    Serve,
    Agents,
    Trust,
}

/// One row of an exit-code table: the code, a short name, and when it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRow {
    pub code: u8,
    pub name: &'static str,
    pub when: &'static str,
}

/// The usage row every table ends with: what was wrong depends on the subcommand.
const fn usage(when: &'static str) -> ExitRow {
    ExitRow {
        code: EXIT_USAGE,
        name: "usage",
        when,
    }
}

/// The exit code of a subcommand that could not do its work ([`Status::Error`]'s).
const EXIT_FAILED: u8 = 1;

impl Documented {
    /// Every documented subcommand.
    pub const ALL: [Documented; 5] = [
        Documented::Run,
        Documented::Batch,
        Documented::Serve,
        Documented::Agents,
        Documented::Trust,
    ];

    /// The subcommand's name (`acp-host NAME`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Documented::Run => "run",
            Documented::Batch => "batch",
            Documented::Serve => "serve",
            Documented::Agents => "agents",
            Documented::Trust => "trust",
        }
    }

    /// The subcommand's exit codes, in the order they are documented.
    #[must_use]
    pub fn exit_rows(self) -> Vec<ExitRow> {
        let failed = |when| ExitRow {
            code: EXIT_FAILED,
            name: "failed",
            when,
        };
        let done = |name, when| ExitRow {
            code: Status::Completed.exit_code(),
            name,
            when,
        };
        match self {
            Documented::Run => Status::ALL
                .iter()
                .map(|status| ExitRow {
                    code: status.exit_code(),
                    name: status.as_str(),
                    when: status.when(),
                })
                .chain([usage(
                    "bad flags, cwd or --env, or an agent not found; nothing was spawned",
                )])
                .collect(),
            Documented::Batch => crate::batch::exit_rows(),
            Documented::Serve => vec![
                done(
                    "stopped",
                    "SIGINT / SIGTERM, once every agent was torn down",
                ),
                failed("it could not listen on --listen, or the sandbox cannot be held here"),
                usage("bad flags or token file, or an agent not found; nothing listened"),
            ],
            Documented::Agents => vec![
                done("listed", "the listing was printed"),
                failed("the ACP Registry could not be fetched, read or cached"),
                usage("bad flags"),
            ],
            Documented::Trust => vec![
                done("done", "listed, approved or revoked"),
                failed("the approvals, or the current directory, could not be read or written"),
                usage("a path that is neither a folder nor a definition file, or bad flags"),
            ],
        }
    }

    /// The exit-code table as `--help` prints it.
    #[must_use]
    pub fn exit_table(self) -> String {
        self.exit_rows()
            .iter()
            .fold(String::from("Exit codes:\n"), |mut out, row| {
                let _ = writeln!(out, "  {:>3}  {:<17}  {}", row.code, row.name, row.when);
                out
            })
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
    fn stop_reason_table() {
        assert_eq!(Status::from_stop_reason("end_turn"), Status::Completed);
        assert_eq!(Status::from_stop_reason("max_tokens"), Status::MaxTokens);
        assert_eq!(
            Status::from_stop_reason("max_turn_requests"),
            Status::MaxTurnRequests
        );
        assert_eq!(Status::from_stop_reason("refusal"), Status::Refusal);
        assert_eq!(Status::from_stop_reason("cancelled"), Status::Aborted);
        assert_eq!(Status::from_stop_reason("something_new"), Status::Error);
        assert_eq!(Status::from_stop_reason(""), Status::Error);
    }

    #[test]
    fn exit_codes_are_distinct_and_documented() {
        let codes: std::collections::HashSet<u8> =
            Status::ALL.iter().map(|s| s.exit_code()).collect();
        assert_eq!(codes.len(), Status::ALL.len());
        assert!(!codes.contains(&EXIT_USAGE));
        let table = Status::exit_code_table();
        for status in Status::ALL {
            assert!(table.contains(status.as_str()));
        }
    }

    #[test]
    fn every_documented_table_has_distinct_codes_and_a_usage_row() {
        for command in Documented::ALL {
            let rows = command.exit_rows();
            let codes: std::collections::HashSet<u8> = rows.iter().map(|row| row.code).collect();
            assert_eq!(codes.len(), rows.len(), "{}", command.name());
            assert!(
                rows.iter()
                    .any(|row| row.code == EXIT_USAGE && row.name == "usage")
            );
            let table = command.exit_table();
            assert!(table.starts_with("Exit codes:\n"), "{table}");
            assert_eq!(table.lines().count(), rows.len() + 1, "{table}");
            // Each row fits a 100-column help text on one line (clap wraps longer ones).
            assert!(table.lines().all(|line| line.len() <= 100), "{table}");
        }
        assert_eq!(
            Documented::ALL.map(Documented::name),
            ["run", "batch", "serve", "agents", "trust"]
        );
        assert!(
            Documented::Serve
                .exit_table()
                .contains("    0  stopped            SIGINT / SIGTERM")
        );
        assert!(Documented::Agents.exit_table().contains("    1  failed "));
        assert!(Documented::Trust.exit_table().contains("    0  done "));
    }

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
    fn status_serializes_kebab_case() {
        for status in Status::ALL {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::String(status.as_str().to_owned())
            );
            assert_eq!(status.to_string(), status.as_str());
            assert_eq!(
                Status::from_stop_reason(status.stop_reason().unwrap_or("x")),
                if status.stop_reason().is_some() {
                    status
                } else {
                    Status::Error
                }
            );
        }
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
