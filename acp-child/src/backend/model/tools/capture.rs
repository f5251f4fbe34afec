//! `submit_result`: the capture tool of a session asked for a structured answer (acp-host's start
//! extension, field `outputSchema`).
//!
//! Offered only in such a session, whatever its tool filter; its parameters are the schema itself
//! when the schema describes an object (function parameters must be one), else an object with the
//! value under `value`. A call is checked against the schema here: a value that matches is kept
//! for this turn ([`crate::session::Memory::capture`]) and returned in the prompt response's
//! `_meta`; one that does not is a failed call listing every violation, so the model can fix it
//! and call again. The host checks the value once more.
//!
//! A value that matches ends the turn: the calls after it in the same reply are not run (each is
//! refused with [`RECORDED`]), no further model request is made, and the first value is the
//! answer.

use agent_client_protocol::v1::schema::{ToolCall, ToolCallStatus, ToolCallUpdateFields, ToolKind};
use protocol::structured::{self, CAPTURE_TOOL, OutputSchema};
use serde_json::{Value, json};

use super::ToolResult;
use crate::backend::{Turn, TurnError};
use crate::store::RecordedCall;

/// Whether the value travels under `value` (a schema that does not describe an object).
fn wrapped(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) != Some("object")
}

/// The tool as an `OpenAI` function definition.
pub(super) fn definition(schema: &OutputSchema) -> Value {
    let parameters = if wrapped(schema.schema()) {
        json!({"type": "object", "properties": {"value": schema.schema()}, "required": ["value"]})
    } else {
        schema.schema().clone()
    };
    json!({
        "type": "function",
        "function": {
            "name": CAPTURE_TOOL,
            "description": "Submit your final answer as structured data matching the required \
                            schema (the parameters). Call it once you have the answer; a value \
                            that does not match is refused with the reasons: fix it and call again. \
                            A value that matches ends your turn.",
            "parameters": parameters,
        },
    })
}

/// What the model is told in the system prompt of such a session.
pub(crate) const INSTRUCTION: &str = "This session needs a structured answer: when you have it, \
     call the submit_result tool with it (its parameters are the required JSON Schema). A value \
     that matches ends your turn: tool calls after it are not run.";

/// The result of a call made after the turn's answer was captured (the call is not run).
pub(crate) const RECORDED: &str = "not run: the answer was already recorded through \
     submit_result, which ends the turn";

/// Runs one call: checks the value and keeps it, reporting the call like any other.
pub(super) fn run(
    turn: &Turn,
    recorded: &RecordedCall,
    schema: &OutputSchema,
) -> Result<ToolResult, TurnError> {
    let arguments: Option<Value> = serde_json::from_str(&recorded.arguments).ok();
    let id = turn.announce_tool_call(
        ToolCall::new(recorded.id.clone(), "Submit the result")
            .kind(ToolKind::Other)
            .raw_input(arguments.clone())
            .status(ToolCallStatus::InProgress),
        &recorded.id,
    )?;
    let value = match arguments {
        Some(Value::Object(mut fields)) if wrapped(schema.schema()) => fields.remove("value"),
        other => other,
    };
    let result = match schema.check(value.as_ref()) {
        Ok(value) => {
            turn.memory().capture(value);
            ToolResult {
                content: "result recorded; end your turn".to_owned(),
                failed: false,
            }
        }
        Err(violations) => ToolResult {
            content: format!(
                "the result does not match the required schema: {}; call {CAPTURE_TOOL} again \
                 with a corrected value",
                structured::describe(&violations)
            ),
            failed: true,
        },
    };
    turn.update_tool_call(
        &id,
        ToolCallUpdateFields::new()
            .status(result.status())
            .content(vec![result.content.clone().into()]),
    )?;
    Ok(result)
}
