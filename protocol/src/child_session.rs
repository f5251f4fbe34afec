//! Children exposed as sessions of their own (ACP "subagent sessions", the draft behind the SDK's
//! `unstable_subagents` feature): the vocabulary both sides share, and the one mapping between a
//! child's outcome and the wire's `state` snapshot of a `subagent_update`.
//!
//! The wire carries a current-work snapshot (`running`, `idle` with a stop reason, `requires_action`,
//! `unknown`), not an outcome. A child session acp-child announces is one turn of a delegated
//! child (a later turn is announced as a session of its own), so its last snapshot is its outcome:
//! - `idle` with stop reason `cancelled` is [`ChildState::Cancelled`], with `error`
//!   [`ChildState::Failed`], with any other reason (or none) [`ChildState::Completed`];
//! - `unknown` is [`ChildState::Disconnected`]: nobody can tell any more how the child's work ended
//!   (a grandchild whose parent died before reporting it);
//! - `running` and `requires_action` are [`ChildState::Running`]; a child still running when the
//!   run settles is listed `disconnected`, as a client must show a child whose parent's prompt
//!   returned without its final snapshot.
//!
//! Invariant: acp-child reports a child's end with [`ChildState::of_status`] and
//! [`ChildState::idle_stop_reason`]; acp-host reads snapshots back with
//! [`ChildState::from_update`]. Both directions are these functions, on the schema's typed
//! snapshot ([`StateUpdate`]), so they cannot drift apart. A failed child's snapshot carries why
//! in its error (`message`) and the end of the child's stderr in the error's `data`
//! (`{"stderrTail": ...}`, [`failure_data`]): the schema's error has a free `data` and no field
//! for it; [`Failure::of`] reads both back, bounded.

use std::collections::BTreeMap;

use agent_client_protocol_schema::v1::{
    ErrorStopReason, IdleStopReason, OtherStopReason, StateUpdate,
};
use serde::{Deserialize, Serialize};

use crate::status::Status;

/// Where a child stands, as the result lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ChildState {
    /// Announced, no final snapshot yet.
    Running,
    Completed,
    Failed,
    Cancelled,
    /// The outcome is unknown: reported so by the agent, or the run ended first.
    Disconnected,
}

impl ChildState {
    /// A finished child run's state, from its status.
    #[must_use]
    pub fn of_status(status: Status) -> ChildState {
        match status {
            Status::Completed | Status::MaxTokens | Status::MaxTurnRequests | Status::Refusal => {
                ChildState::Completed
            }
            Status::Aborted => ChildState::Cancelled,
            Status::Timeout | Status::Error | Status::SchemaMismatch | Status::OverBudget => {
                ChildState::Failed
            }
        }
    }

    /// The stop reason of the `idle` snapshot that reports this state: the child's own stop
    /// reason when it completed (`end_turn`, `max_tokens`, ...), else `cancelled` or `error`
    /// (without its details: the caller adds the failure). `None` for the states that are not
    /// reported as `idle`.
    #[must_use]
    pub fn idle_stop_reason(self, child_stop_reason: Option<&str>) -> Option<IdleStopReason> {
        match self {
            ChildState::Completed => Some(stop_reason_of(child_stop_reason.unwrap_or("end_turn"))),
            ChildState::Cancelled => Some(IdleStopReason::Cancelled),
            ChildState::Failed => Some(IdleStopReason::Error(ErrorStopReason::new())),
            ChildState::Running | ChildState::Disconnected => None,
        }
    }

    /// What a `state` snapshot of a `subagent_update` says, with its stop reason; `None` when it
    /// says nothing this host knows (a custom or future state): the state is then unchanged.
    #[must_use]
    pub fn from_update(state: &StateUpdate) -> Option<(ChildState, Option<String>)> {
        match state {
            StateUpdate::Running(_) | StateUpdate::RequiresAction(_) => {
                Some((ChildState::Running, None))
            }
            StateUpdate::Unknown(_) => Some((ChildState::Disconnected, None)),
            StateUpdate::Idle(idle) => {
                let child = match &idle.stop_reason {
                    Some(IdleStopReason::Cancelled) => ChildState::Cancelled,
                    Some(IdleStopReason::Error(_)) => ChildState::Failed,
                    _ => ChildState::Completed,
                };
                Some((child, idle.stop_reason.as_ref().map(stop_reason_name)))
            }
            _ => None,
        }
    }

    /// Whether no further snapshot is expected.
    #[must_use]
    pub fn is_final(self) -> bool {
        self != ChildState::Running
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ChildState::Running => "running",
            ChildState::Completed => "completed",
            ChildState::Failed => "failed",
            ChildState::Cancelled => "cancelled",
            ChildState::Disconnected => "disconnected",
        }
    }
}

impl std::fmt::Display for ChildState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stop reason from its wire name: a known one as its variant, any other kept as is (what serde
/// makes of the same `stopReason`).
fn stop_reason_of(name: &str) -> IdleStopReason {
    match name {
        "end_turn" => IdleStopReason::EndTurn,
        "max_tokens" => IdleStopReason::MaxTokens,
        "max_turn_requests" => IdleStopReason::MaxTurnRequests,
        "refusal" => IdleStopReason::Refusal,
        "cancelled" => IdleStopReason::Cancelled,
        "error" => IdleStopReason::Error(ErrorStopReason::new()),
        other => IdleStopReason::Other(OtherStopReason::new(other, BTreeMap::new())),
    }
}

/// The wire name of a stop reason (`end_turn`, `error`, a custom one as sent): its serialized
/// `stopReason` tag, as serde writes it, so a variant of a later schema is named too.
fn stop_reason_name(reason: &IdleStopReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|value| Some(value.get("stopReason")?.as_str()?.to_owned()))
        .unwrap_or_default()
}

/// The key of a failed child's stderr tail in its final snapshot's error `data`.
pub const STDERR_TAIL_KEY: &str = "stderrTail";

/// The most of a child's stderr a snapshot carries, and a host keeps of one: its end.
pub const MAX_STDERR_TAIL_BYTES: usize = 2048;

/// The end of `stderr`: at most `max` bytes, in whole lines unless one line is longer, without
/// the trailing line break (empty when it holds only white space).
#[must_use]
pub fn stderr_end(stderr: &str, max: usize) -> &str {
    let stderr = stderr.trim_end();
    let cut = stderr.ceil_char_boundary(stderr.len().saturating_sub(max));
    let shown = &stderr[cut..];
    match shown.find('\n') {
        Some(newline) if cut > 0 && newline + 1 < shown.len() => &shown[newline + 1..],
        _ => shown,
    }
}

/// The error `data` of a failed child's final snapshot: the end of its stderr.
#[must_use]
pub fn failure_data(stderr: &str) -> Option<serde_json::Value> {
    let tail = stderr_end(stderr, MAX_STDERR_TAIL_BYTES);
    (!tail.is_empty()).then(|| serde_json::json!({ STDERR_TAIL_KEY: tail }))
}

/// What a failed child's final snapshot says of its failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failure {
    pub error: Option<String>,
    pub stderr_tail: Option<String>,
}

impl Failure {
    /// The failure an `idle` snapshot with stop reason `error` reports; `None` for any other.
    /// What an agent sent is bounded here ([`MAX_STDERR_TAIL_BYTES`], the message likewise).
    #[must_use]
    pub fn of(state: &StateUpdate) -> Option<Failure> {
        let StateUpdate::Idle(idle) = state else {
            return None;
        };
        let Some(IdleStopReason::Error(failure)) = &idle.stop_reason else {
            return None;
        };
        let error = failure.error.as_deref();
        let bounded = |text: &str| stderr_end(text, MAX_STDERR_TAIL_BYTES).to_owned();
        Some(Failure {
            error: error.map(|error| bounded(&error.message)),
            stderr_tail: error
                .and_then(|error| error.data.as_ref()?.get(STDERR_TAIL_KEY)?.as_str())
                .map(bounded)
                .filter(|tail| !tail.is_empty()),
        })
    }
}

/// One child session the agent announced during a run, as the result lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildSession {
    /// The child's session id, as the agent exposed it.
    pub session_id: String,
    /// The session it was announced on: the run's own, or another child's (nesting).
    pub parent_session_id: String,
    /// The agent's display title for the child (the subagent's name), when it gave one.
    pub name: Option<String>,
    /// What the child was asked to do, when the agent said.
    pub task: Option<String>,
    pub state: ChildState,
    /// The stop reason of the child's last `idle` snapshot, when it had one.
    pub stop_reason: Option<String>,
    /// Why it failed, as the agent reported it (a failed child only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The end of the child's stderr, when the agent reported it with a failure (acp-child does:
    /// an agent that fails says why there, a missing login, a refusal to run as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// What the child reported spending (the `usage` of its final `idle` snapshot, else the
    /// cumulative counts of its last `usage_update`); absent when it reported nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::Usage>,
}

#[cfg(test)]
mod tests {
    use agent_client_protocol_schema::v1::{
        IdleStateUpdate, RequiresActionStateUpdate, RunningStateUpdate, UnknownStateUpdate,
    };
    use serde_json::json;

    use super::*;

    fn idle(reason: Option<IdleStopReason>) -> StateUpdate {
        StateUpdate::Idle(IdleStateUpdate::new().stop_reason(reason))
    }

    #[test]
    fn every_status_round_trips_through_the_snapshot() {
        for status in Status::ALL {
            let state = ChildState::of_status(status);
            let reason = state.idle_stop_reason(status.stop_reason());
            let name = reason.as_ref().map(stop_reason_name);
            assert_eq!(
                ChildState::from_update(&idle(reason)),
                Some((state, name)),
                "{status}"
            );
            assert!(state.is_final());
        }
        assert_eq!(
            ChildState::of_status(Status::MaxTokens).idle_stop_reason(Some("max_tokens")),
            Some(IdleStopReason::MaxTokens)
        );
        assert_eq!(ChildState::of_status(Status::Timeout), ChildState::Failed);
        assert_eq!(
            ChildState::of_status(Status::Aborted),
            ChildState::Cancelled
        );
    }

    #[test]
    fn stop_reasons_are_what_serde_makes_of_their_names() {
        for name in [
            "end_turn",
            "max_tokens",
            "max_turn_requests",
            "refusal",
            "cancelled",
            "error",
            "_custom",
        ] {
            let wire: StateUpdate =
                serde_json::from_value(json!({"state": "idle", "stopReason": name})).unwrap();
            assert_eq!(wire, idle(Some(stop_reason_of(name))), "{name}");
            assert_eq!(stop_reason_name(&stop_reason_of(name)), name);
        }
    }

    #[test]
    fn snapshots_that_are_not_outcomes() {
        let read = |state: StateUpdate| ChildState::from_update(&state).map(|(state, _)| state);
        assert_eq!(
            read(StateUpdate::Running(RunningStateUpdate::new())),
            Some(ChildState::Running)
        );
        assert_eq!(
            read(StateUpdate::RequiresAction(RequiresActionStateUpdate::new())),
            Some(ChildState::Running)
        );
        assert_eq!(
            read(StateUpdate::Unknown(UnknownStateUpdate::new())),
            Some(ChildState::Disconnected)
        );
        assert_eq!(read(idle(None)), Some(ChildState::Completed));
        let custom: StateUpdate = serde_json::from_value(json!({"state": "_custom"})).unwrap();
        assert_eq!(read(custom), None);
        assert!(!ChildState::Running.is_final());
        assert_eq!(ChildState::Disconnected.idle_stop_reason(None), None);
        assert_eq!(
            Failure::of(&StateUpdate::Running(RunningStateUpdate::new())),
            None,
            "only an idle snapshot reports a failure"
        );
    }

    #[test]
    fn a_states_name_is_its_serialized_name() {
        for (state, name) in [
            (ChildState::Running, "running"),
            (ChildState::Completed, "completed"),
            (ChildState::Failed, "failed"),
            (ChildState::Cancelled, "cancelled"),
            (ChildState::Disconnected, "disconnected"),
        ] {
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
            assert_eq!(serde_json::to_value(state).unwrap(), json!(name));
        }
    }

    #[test]
    fn the_stderr_end_is_whole_lines_unless_one_is_longer() {
        assert_eq!(stderr_end("a\nb\n\n", 100), "a\nb");
        assert_eq!(stderr_end("first line\nsecond\n", 8), "second");
        assert_eq!(stderr_end("one long line", 4), "line");
        assert_eq!(stderr_end("  \n", 4), "");
        let tail = stderr_end("ééééé", 3);
        assert_eq!(tail, "é", "cut at a character boundary");
    }

    #[test]
    fn a_failure_reads_back_its_message_and_bounded_stderr() {
        let mut failure = ErrorStopReason::new();
        let mut error = agent_client_protocol_schema::v1::Error::new(-32603, "ended error");
        error.data = failure_data(&format!("{}\ncannot run as root\n", "x".repeat(5000)));
        failure.error = Some(Box::new(error));
        let state = idle(Some(IdleStopReason::Error(failure)));
        assert_eq!(
            Failure::of(&state),
            Some(Failure {
                error: Some("ended error".into()),
                stderr_tail: Some("cannot run as root".into()),
            })
        );
        assert_eq!(failure_data(" \n"), None, "no tail, no data");
        assert_eq!(Failure::of(&idle(Some(IdleStopReason::EndTurn))), None);
        let bare = idle(Some(IdleStopReason::Error(ErrorStopReason::new())));
        assert_eq!(Failure::of(&bare), Some(Failure::default()));
        let huge = json!({STDERR_TAIL_KEY: "y".repeat(10 * MAX_STDERR_TAIL_BYTES)});
        let mut error = agent_client_protocol_schema::v1::Error::new(-32603, "x");
        error.data = Some(huge);
        let mut failure = ErrorStopReason::new();
        failure.error = Some(Box::new(error));
        let read = Failure::of(&idle(Some(IdleStopReason::Error(failure)))).unwrap();
        assert_eq!(read.stderr_tail.unwrap().len(), MAX_STDERR_TAIL_BYTES);
    }
}
