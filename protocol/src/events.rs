//! Lifecycle events of a run and the NDJSON records of `acp-host run --json`.
//!
//! Invariants: `start` and `end` of one run carry the same host-minted run id; `end` always carries the
//! status and, when a result was produced, the final output (`lastAssistantMessage`). Every record
//! serializes with a `type` field so consumers can dispatch on one key. An update is the schema's
//! typed `SessionUpdate` (the type the SDK re-exports as `agent_client_protocol::v1::schema`), never
//! JSON: it becomes JSON only where `--json` writes it.

use std::sync::Arc;

use agent_client_protocol_schema::v1::SessionUpdate;
use serde::{Deserialize, Serialize};

use crate::permission::PermissionDecision;
use crate::result::RunResult;
use crate::status::Status;

/// `subagent/start`: the child is ready (session/new answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartEvent {
    pub run_id: String,
    /// How the user named the agent.
    pub agent: String,
    /// The agent's name as a subagent provider: the registry name (or the definition's name, or
    /// the command line) it was started as; the same on `end`.
    pub provider: String,
    pub cwd: String,
    pub pid: Option<u32>,
    pub session_id: String,
    pub scrubbed_env: Vec<String>,
}

/// `subagent/end`: the result settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub run_id: String,
    pub provider: String,
    pub status: Status,
    /// The agent's stop reason on the wire, when it answered the prompt.
    pub stop_reason: Option<String>,
    /// The final output; `None` when the run produced no result (nothing was spawned).
    // Shared with the run's result while the event is delivered: megabytes of output are not
    // copied for it.
    pub last_assistant_message: Option<Arc<String>>,
}

/// One event of a run, as observers see it and as `--json` streams it (one per line).
///
/// `Start` is the ACP subagent lifecycle's `subagent/start`, `End` its `subagent/end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
#[expect(
    clippy::large_enum_variant,
    reason = "updates are nearly every event of a run: boxing one would cost each an allocation \
              to save memory on the few others"
)]
pub enum Event {
    /// The child is ready (session/new answered).
    Start(StartEvent),
    /// One `session/update` from the agent, as decoded (the `update` object of the notification;
    /// serialized, the same object).
    Update {
        #[serde(rename = "runId")]
        run_id: String,
        /// The child session it belongs to, when it is not the run's own session (a child the
        /// agent exposed, announced by a `subagent_update`); absent for the run's own session.
        #[serde(rename = "sessionId", default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
        /// That child's name (the title it was announced with), when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subagent: Option<String>,
        update: SessionUpdate,
    },
    /// One answered permission request.
    Permission {
        #[serde(rename = "runId")]
        run_id: String,
        #[serde(flatten)]
        decision: PermissionDecision,
    },
    /// One line the agent wrote to its stderr (without the line ending; a line longer than 4 KiB
    /// is cut and marked). Delivered to library observers; `acp-host run` prints it on stderr
    /// under `--verbose` and does not stream it under `--json` (the result's `stderrTail` keeps
    /// the last lines).
    Stderr {
        #[serde(rename = "runId")]
        run_id: String,
        line: String,
    },
    /// The result settled.
    End(EndEvent),
}

/// The last line of `--json`: `{"type":"result", ...RunResult}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ResultRecord {
    Result(RunResult),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::AgentExit;

    #[test]
    fn result_record_has_type_and_camel_case_fields() {
        let record = ResultRecord::Result(RunResult {
            status: Status::Completed,
            stop_reason: Some("end_turn".into()),
            output: "hi".into(),
            agent_exit: AgentExit::default(),
            duration_ms: 5,
            ..RunResult::unsettled("r".into(), vec!["OPENAI_API_KEY".into()])
        });
        let value = serde_json::to_value(&record).unwrap();
        let schema = crate::schema::output("run-result.json").unwrap();
        crate::schema::check_keys(&schema, &value).unwrap();
        assert_eq!(
            value["usage"],
            serde_json::Value::Null,
            "no usage reported: null"
        );
        for key in ["errorKind", "stderrTail", "scrubbedEnv"] {
            assert!(value.get(key).is_some(), "camelCase {key}: {value}");
        }
        assert_eq!(value["type"], "result");
        assert_eq!(value["status"], "completed");
    }

    #[test]
    fn an_end_event_is_typed_and_keeps_an_empty_message() {
        let end = Event::End(EndEvent {
            run_id: "r".into(),
            provider: "acp-child".into(),
            status: Status::Aborted,
            stop_reason: Some("cancelled".into()),
            last_assistant_message: Some(Arc::new(String::new())),
        });
        let value = serde_json::to_value(&end).unwrap();
        assert_eq!(value["type"], "end");
        assert_eq!(value["lastAssistantMessage"], "");
    }
}
