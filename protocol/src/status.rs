//! How a run ended ([`Status`]), the stop-reason -> status -> exit-code table, and the exit codes
//! every subcommand shares (usage, failed).
//!
//! Invariant: this file is the only place that maps a stop reason to a status or a status to an exit
//! code. The CLI's exit codes, its `--help` tables ([`crate::exit_table`]) and the manual's (`docs/`) are all
//! derived from here.

use serde::{Deserialize, Serialize};

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
/// Usage errors (bad flags, bad cwd, bad `--env`) exit with this code; no child is spawned.
pub const EXIT_USAGE: u8 = 2;
/// The exit code of a subcommand that could not do its work ([`Status::Error`]'s).
pub const EXIT_FAILED: u8 = 1;

/// One row of an exit-code table: the code, a short name, and when it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRow {
    pub code: u8,
    pub name: &'static str,
    pub when: &'static str,
}

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
}
impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
    fn exit_codes_are_distinct_and_usage_is_none_of_them() {
        let codes: std::collections::HashSet<u8> =
            Status::ALL.iter().map(|s| s.exit_code()).collect();
        assert_eq!(codes.len(), Status::ALL.len());
        assert!(!codes.contains(&EXIT_USAGE));
        assert_eq!(EXIT_FAILED, Status::Error.exit_code());
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
}
