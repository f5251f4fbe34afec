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
//! [`ChildState::wire_stop_reason`]; acp-host reads snapshots back with [`ChildState::from_wire`].
//! Both directions are these functions, so they cannot drift apart.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::result::Status;

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
            Status::Timeout | Status::Error | Status::SchemaMismatch => ChildState::Failed,
        }
    }

    /// The `stopReason` of the `idle` snapshot that reports this state: the child's own stop
    /// reason when it completed (`end_turn`, `max_tokens`, ...), else `cancelled` or `error`.
    /// `None` for the states that are not reported as `idle`.
    #[must_use]
    pub fn wire_stop_reason(self, child_stop_reason: Option<&str>) -> Option<String> {
        match self {
            ChildState::Completed => Some(child_stop_reason.unwrap_or("end_turn").to_owned()),
            ChildState::Cancelled => Some("cancelled".to_owned()),
            ChildState::Failed => Some("error".to_owned()),
            ChildState::Running | ChildState::Disconnected => None,
        }
    }

    /// What a `state` snapshot of a `subagent_update` says, with its stop reason; `None` when it
    /// says nothing this host knows (`null`, a future state): the state is then unchanged.
    #[must_use]
    pub fn from_wire(state: &Value) -> Option<(ChildState, Option<String>)> {
        let stop_reason = state
            .get("stopReason")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let child = match state.get("state").and_then(Value::as_str)? {
            "running" | "requires_action" => ChildState::Running,
            "unknown" => ChildState::Disconnected,
            "idle" => match stop_reason.as_deref() {
                Some("cancelled") => ChildState::Cancelled,
                Some("error") => ChildState::Failed,
                _ => ChildState::Completed,
            },
            _ => return None,
        };
        Some((child, stop_reason))
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

/// One child session the agent announced during a run, as the result lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_status_round_trips_through_the_wire_snapshot() {
        for status in Status::ALL {
            let state = ChildState::of_status(status);
            let reason = state.wire_stop_reason(status.stop_reason());
            let wire = json!({"state": "idle", "stopReason": reason});
            assert_eq!(
                ChildState::from_wire(&wire),
                Some((state, reason)),
                "{status}"
            );
            assert!(state.is_final());
        }
        assert_eq!(
            ChildState::of_status(Status::MaxTokens).wire_stop_reason(Some("max_tokens")),
            Some("max_tokens".into())
        );
        assert_eq!(ChildState::of_status(Status::Timeout), ChildState::Failed);
        assert_eq!(
            ChildState::of_status(Status::Aborted),
            ChildState::Cancelled
        );
    }

    #[test]
    fn snapshots_that_are_not_outcomes() {
        let read = |value: Value| ChildState::from_wire(&value).map(|(state, _)| state);
        assert_eq!(read(json!({"state": "running"})), Some(ChildState::Running));
        assert_eq!(
            read(json!({"state": "requires_action"})),
            Some(ChildState::Running)
        );
        assert_eq!(
            read(json!({"state": "unknown"})),
            Some(ChildState::Disconnected)
        );
        assert_eq!(read(json!({"state": "idle"})), Some(ChildState::Completed));
        assert_eq!(read(json!({"state": "_custom"})), None);
        assert_eq!(read(Value::Null), None);
        assert!(!ChildState::Running.is_final());
        assert_eq!(ChildState::Disconnected.wire_stop_reason(None), None);
    }
}
