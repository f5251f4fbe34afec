//! The offline backend: no model, just honest replies and the offline commands.
//!
//! Plain text gets a fixed reply ([`NO_MODEL_REPLY`]) saying no model is configured. The commands
//! (see [`commands`]) are real tool calls:
//! - `/read PATH`: a `read` tool call, then the file's text as the reply;
//! - `/write PATH TEXT`: an `edit` tool call that asks permission (allow once or reject once,
//!   through [`super::permission`]) and writes only when allowed;
//! - both go through the client's `fs/read_text_file` / `fs/write_text_file` when it offers them
//!   (an editor's unsaved buffers), else the disk, as the model's tools do (`Files`), confined
//!   to the session directory either way;
//! - `/sleep SECONDS`: waits, and stops promptly on `session/cancel`;
//! - `/delegate NAME PROMPT`: runs subagent NAME in its own process ([`delegate`]), as a
//!   tool call showing its text while it runs, and replies with its result. One-shot: the child
//!   gets no child id and is never kept alive (the offline backend has no `send_message`), so its
//!   process is gone when the reply comes.
//!
//! Every reply is deterministic, so clients and tests can match it exactly. Refusals and I/O
//! errors are replies (the turn still ends with `end_turn`), never protocol errors.

pub(crate) mod commands;

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    Diff, StopReason, ToolCall, ToolCallContent, ToolCallId, ToolCallStatus, ToolCallUpdateFields,
    ToolKind,
};
use futures::future::BoxFuture;

use self::commands::{COMMANDS_HELP, Command, Parsed};
use super::children::{self, Children, Mode, Subagents, Task};
use super::model::tools::files::Files;
use super::permission::{self, Offer, PermissionKind, Verdict};
use super::{Backend, CommandHelp, Offers, Turn, TurnError, locations};
use protocol::report::describe;

/// The reply to a plain-text prompt, streamed one line per chunk.
pub const NO_MODEL_REPLY: [&str; 3] = [
    "No model is configured: acp-child is running its offline backend and cannot answer free-form prompts.\n",
    "To use a model, start it with --model NAME and a key in ACP_CHILD_API_KEY (or DEEPSEEK_API_KEY / OPENAI_API_KEY), or --base-url for a local server.\n",
    // Kept in step with `COMMANDS_SUMMARY` by the unit test below.
    "Offline commands that work now: /read PATH, /write PATH TEXT, /sleep SECONDS, /delegate NAME PROMPT.\n",
];

/// The backend used when no model is configured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Offline {
    pub(crate) subagents: Option<Arc<Subagents>>,
}

impl Backend for Offline {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>> {
        Box::pin(run(turn, self.subagents.as_ref()))
    }

    fn title(&self) -> String {
        "acp-child (offline)".to_owned()
    }

    fn available_commands(&self) -> &'static [CommandHelp] {
        COMMANDS_HELP
    }

    /// A system prompt is taken (and checked) so a persona never turns into a preamble that would
    /// hide a slash command; with no model, it has nothing to instruct.
    fn offers(&self) -> Offers {
        Offers {
            system_prompt: true,
            ..Offers::default()
        }
    }
}

async fn run(turn: &mut Turn, subagents: Option<&Arc<Subagents>>) -> Result<StopReason, TurnError> {
    if turn.is_cancelled() {
        return Ok(StopReason::Cancelled);
    }
    match commands::parse(&turn.prompt_text()) {
        Ok(Parsed::Text(_)) => {
            for line in NO_MODEL_REPLY {
                turn.say(line)?;
            }
            Ok(StopReason::EndTurn)
        }
        Ok(Parsed::Command(Command::Read { path })) => read(turn, &path).await,
        Ok(Parsed::Command(Command::Write { path, text })) => write(turn, &path, &text).await,
        Ok(Parsed::Command(Command::Sleep { secs })) => sleep(turn, secs).await,
        Ok(Parsed::Command(Command::Delegate { name, prompt })) => {
            delegate(turn, subagents, &name, &prompt).await
        }
        Err(error) => {
            turn.say(error.to_string())?;
            Ok(StopReason::EndTurn)
        }
    }
}

async fn read(turn: &mut Turn, path: &str) -> Result<StopReason, TurnError> {
    let call = ToolCall::new("", format!("Read {path}"))
        .kind(ToolKind::Read)
        .status(ToolCallStatus::InProgress)
        .locations(locations(turn.workspace(), path));
    let id = turn.announce_tool_call(call, "")?;
    match Files::new(turn).read(path).await {
        Ok(Some(text)) => {
            turn.update_tool_call(
                &id,
                ToolCallUpdateFields::new()
                    .status(ToolCallStatus::Completed)
                    .content(vec![ToolCallContent::from(text.clone())]),
            )?;
            turn.say(text)?;
        }
        Ok(None) => {
            fail(turn, &id, "cancelled: did not read")?;
            return Ok(StopReason::Cancelled);
        }
        Err(reason) => {
            fail(turn, &id, &reason)?;
            turn.say(reason)?;
        }
    }
    Ok(StopReason::EndTurn)
}

async fn write(turn: &mut Turn, path: &str, text: &str) -> Result<StopReason, TurnError> {
    let call = ToolCall::new("", format!("Write {path}"))
        .kind(ToolKind::Edit)
        .status(ToolCallStatus::Pending)
        .locations(locations(turn.workspace(), path));
    let id = turn.announce_tool_call(call, "")?;
    // Refuse before asking: never ask a user to approve a write that would be refused anyway.
    let target = match turn.workspace().resolve_for_write(path) {
        Ok(target) => target,
        Err(error) => {
            fail_with(turn, &id, &error)?;
            return Ok(StopReason::EndTurn);
        }
    };
    // The text the write replaces: the editor's buffer when the client serves reads.
    let old_text = Files::new(turn).old_text(&target).await;
    let preview = Diff::new(&target, text).old_text(old_text.clone());
    let preview = ToolCallUpdateFields::new().content(vec![ToolCallContent::from(preview)]);
    let verdict = permission::ask(turn, &id, PermissionKind::Edit, Offer::Once, preview).await?;
    match verdict {
        Verdict::Allowed => {
            // The write resolves the path again: the file system may have changed while the
            // user was deciding.
            match Files::new(turn).write(path, text).await {
                Ok(Some(written)) => {
                    let diff = Diff::new(written, text).old_text(old_text);
                    turn.update_tool_call(
                        &id,
                        ToolCallUpdateFields::new()
                            .status(ToolCallStatus::Completed)
                            .content(vec![ToolCallContent::from(diff)]),
                    )?;
                    turn.say(format!("wrote {} bytes to {path}", text.len()))?;
                }
                Ok(None) => {
                    fail(turn, &id, "cancelled: did not write")?;
                    return Ok(StopReason::Cancelled);
                }
                Err(reason) => {
                    fail(turn, &id, &reason)?;
                    turn.say(reason)?;
                }
            }
        }
        Verdict::Rejected => {
            fail(turn, &id, "permission denied")?;
            turn.say(format!("permission denied: did not write {path}"))?;
        }
        Verdict::ClientError(reason) => {
            fail(turn, &id, &reason)?;
            turn.say(format!("did not write {path}: {reason}"))?;
        }
        Verdict::Cancelled => {
            fail(turn, &id, "cancelled: did not write")?;
            return Ok(StopReason::Cancelled);
        }
    }
    Ok(StopReason::EndTurn)
}

async fn sleep(turn: &mut Turn, secs: u64) -> Result<StopReason, TurnError> {
    let call = ToolCall::new("", format!("Sleep {secs} s"))
        .kind(ToolKind::Other)
        .status(ToolCallStatus::InProgress);
    let id = turn.announce_tool_call(call, "")?;
    let cancelled = tokio::select! {
        biased;
        () = turn.cancelled() => true,
        () = tokio::time::sleep(Duration::from_secs(secs)) => false,
    };
    if cancelled {
        fail(turn, &id, "cancelled")?;
        return Ok(StopReason::Cancelled);
    }
    turn.update_tool_call(
        &id,
        ToolCallUpdateFields::new().status(ToolCallStatus::Completed),
    )?;
    turn.say(format!("slept {secs} s"))?;
    Ok(StopReason::EndTurn)
}

async fn delegate(
    turn: &mut Turn,
    subagents: Option<&Arc<Subagents>>,
    name: &str,
    prompt: &str,
) -> Result<StopReason, TurnError> {
    let Some(subagents) = subagents else {
        turn.say(format!(
            "/delegate: no subagents are enabled; start acp-child with --subagent-agents {name}"
        ))?;
        return Ok(StopReason::EndTurn);
    };
    let call = ToolCall::new("", children::title(name, None, prompt))
        .kind(children::KIND)
        .status(ToolCallStatus::InProgress)
        .raw_input(serde_json::json!({"agent": name, "prompt": prompt}));
    let id = turn.announce_tool_call(call, "")?;
    let task = Task {
        name,
        prompt,
        description: None,
        output_schema: None,
        context: None,
        isolation: None,
    };
    // One-shot: no table of children here to keep it in, so its process ends with the call.
    let result = Children::new(subagents, turn)
        .start(turn, &id, task, Mode::OneShot)
        .await;
    if result.failed {
        fail(turn, &id, &result.text)?;
    } else {
        turn.update_tool_call(
            &id,
            ToolCallUpdateFields::new()
                .status(ToolCallStatus::Completed)
                .content(vec![ToolCallContent::from(result.text.clone())]),
        )?;
    }
    if turn.is_cancelled() {
        return Ok(StopReason::Cancelled);
    }
    turn.say(result.text)?;
    Ok(StopReason::EndTurn)
}

/// Marks a tool call failed, with the reason as its content.
fn fail(turn: &Turn, id: &ToolCallId, reason: &str) -> Result<(), TurnError> {
    turn.update_tool_call(
        id,
        ToolCallUpdateFields::new()
            .status(ToolCallStatus::Failed)
            .content(vec![ToolCallContent::from(reason.to_owned())]),
    )
}

/// Marks a tool call failed because of `error`, and replies with the same explanation.
fn fail_with(turn: &Turn, id: &ToolCallId, error: &dyn std::error::Error) -> Result<(), TurnError> {
    let reason = describe(error);
    fail(turn, id, &reason)?;
    turn.say(reason)
}

#[cfg(test)]
mod tests {
    use super::commands::COMMANDS_SUMMARY;
    use super::*;

    #[test]
    fn no_model_reply_names_the_offline_commands() {
        assert_eq!(NO_MODEL_REPLY.len(), 3, "the reply stays 2-4 lines");
        assert!(NO_MODEL_REPLY[2].contains(COMMANDS_SUMMARY));
        assert!(NO_MODEL_REPLY.iter().all(|line| line.ends_with('\n')));
    }
}
