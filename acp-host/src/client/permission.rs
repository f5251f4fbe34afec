//! The agent's `session/request_permission`, ours or a child session's: read leniently, decided
//! by the run's [`PermissionHandler`], recorded, and answered.
//!
//! Invariants:
//! - a request is read leniently from its JSON (unknown option kinds, numeric ids, missing
//!   names), so it always reaches the handler and the record; the chosen id is echoed back
//!   exactly as the agent sent it;
//! - a request is decided only after the observers saw the updates sent before it (so whoever is
//!   asked sees the tool call first), and off the dispatch loop (a question must not stall
//!   updates);
//! - a child session's request goes to the same handler as ours, and its record says whose it is;
//! - once cancellation began, every request (pending or new) is answered `cancelled`.

use std::sync::Arc;

use agent_client_protocol::v1::schema::ToolCallUpdateFields;
use protocol::permission::{
    self, Answer, DecidedBy, OfferedKind, OfferedOption, Outcome, PermissionDecision,
    PermissionRequest,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::DriveEvents;
use super::shared::Shared;
use crate::permission::{Decision, PermissionHandler};

/// `session/request_permission` with its params as sent: the SDK's typed request refuses (-32602)
/// options of a kind newer than it, a numeric `optionId` or a missing `name`, and such a request
/// must still reach the policy and the record.
#[derive(
    Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcRequest,
)]
#[request(method = "session/request_permission", response = serde_json::Value)]
#[serde(transparent)]
pub(super) struct RawPermissionRequest(pub(super) serde_json::Value);

/// Decides one permission request, records the decision, and builds the answer sent back.
/// `ids` maps each offered id's text to the JSON value the agent sent, which is echoed back as is
/// (an agent that numbered its options gets its number back).
pub(super) async fn answer_permission(
    request: PermissionRequest,
    ids: Vec<(String, serde_json::Value)>,
    handler: Arc<dyn PermissionHandler>,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    cancel: CancellationToken,
) -> serde_json::Value {
    let asked = std::time::Instant::now();
    events.permission_asked(request.session_id.as_deref(), &request.tool_call_id);
    tokio::select! {
        () = events.delivered() => {}
        () = cancel.cancelled() => {}
    }
    let decision = decide_permission(handler, request.clone(), &shared, &cancel).await;
    let outcome = permission::choose_answer(decision.answer, &request.offered);
    let response = match &outcome {
        Outcome::Selected { option_id, .. } => {
            let raw = ids
                .into_iter()
                .find_map(|(text, raw)| (text == *option_id).then_some(raw))
                .unwrap_or_else(|| serde_json::Value::String(option_id.clone()));
            json!({"outcome": {"outcome": "selected", "optionId": raw}})
        }
        Outcome::Cancelled => json!({"outcome": {"outcome": "cancelled"}}),
    };
    shared
        .record(
            PermissionDecision {
                session_id: request.session_id,
                tool_call_id: request.tool_call_id,
                title: request.title,
                tool_kind: request.tool_kind,
                offered: request.offered,
                verdict: decision.answer.verdict(),
                decided_by: decision.decided_by,
                outcome,
            },
            asked.elapsed(),
            events.as_ref(),
        )
        .await;
    response
}

/// The handler's decision, unless the turn is (or becomes) cancelled first.
async fn decide_permission(
    handler: Arc<dyn PermissionHandler>,
    request: PermissionRequest,
    shared: &Shared,
    cancel: &CancellationToken,
) -> Decision {
    let cancelled = Decision {
        answer: Answer::Cancelled,
        decided_by: DecidedBy::Cancel,
    };
    if shared.is_cancelling() || cancel.is_cancelled() {
        return cancelled;
    }
    tokio::select! {
        () = cancel.cancelled() => cancelled,
        decision = handler.decide(request) => decision,
    }
}

/// What the request is about, read leniently from its params: its own fields, completed from
/// earlier tool call updates; every option with an id is kept (unknown kinds included, to be
/// recorded), with the raw id for the answer.
pub(super) fn permission_request(
    params: &serde_json::Value,
    shared: &Shared,
) -> (PermissionRequest, Vec<(String, serde_json::Value)>) {
    let tool_call = params.get("toolCall").unwrap_or(&serde_json::Value::Null);
    let tool_call_id = tool_call
        .get("toolCallId")
        .and_then(id_text)
        .unwrap_or_default();
    let text = |value: &serde_json::Value, key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let session = params
        .get("sessionId")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let known = shared.tool_call(session, &tool_call_id);
    // A child's request is answered like ours, and says whose it is.
    let session_id = shared.child(session).map(|child| child.session_id);
    let mut ids = Vec::new();
    let offered = params
        .get("options")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|option| {
            let raw = option.get("optionId").filter(|id| !id.is_null())?;
            let option_id = id_text(raw)?;
            ids.push((option_id.clone(), raw.clone()));
            let kind = match option.get("kind") {
                Some(serde_json::Value::String(kind)) => OfferedKind::from_wire(kind),
                Some(other) => OfferedKind::Unknown(other.to_string()),
                None => OfferedKind::Unknown(String::new()),
            };
            Some(OfferedOption { option_id, kind })
        })
        .collect();
    let fields = serde_json::from_value::<ToolCallUpdateFields>(tool_call.clone())
        .ok()
        .map(Box::new);
    let request = PermissionRequest {
        session_id,
        title: text(tool_call, "title").or(known.title),
        tool_kind: text(tool_call, "kind").or(known.kind),
        tool_call_id,
        offered,
        tool_call: fields,
    };
    (request, ids)
}

/// An id's text: a string as is, a number (or any other non-null value) as its JSON text.
fn id_text(id: &serde_json::Value) -> Option<String> {
    match id {
        serde_json::Value::Null => None,
        serde_json::Value::String(id) => Some(id.clone()),
        other => Some(other.to_string()),
    }
}
