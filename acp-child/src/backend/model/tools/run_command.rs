//! `run_command`: a shell command in the session directory, after the user approved it, killed
//! after the configured timeout or on cancellation, in the command sandbox (see
//! [`crate::workspace::shell`]). `outside_sandbox: true` asks to run it without that sandbox:
//! the permission request (the same one every command goes through) says so in its title, so the
//! person decides; this agent's own sandbox, if it runs in one, still holds.

use std::time::Duration;

use agent_client_protocol::v1::schema::{ToolCallStatus, ToolCallUpdateFields, ToolKind};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::permission::PermissionKind;
use crate::workspace::shell;
use protocol::report::describe;

/// The longest part of a command line shown in a title.
const TITLE_CHARS: usize = 80;

pub(super) struct RunCommand {
    pub(super) timeout: Duration,
    /// `--command-sandbox`, `--command-network`.
    pub(super) sandbox: protocol::sandbox::Policy,
}

#[derive(Deserialize)]
struct Args {
    command: String,
    #[serde(default)]
    outside_sandbox: bool,
}

/// A parsed call, with the tool's timeout and the sandbox it runs in.
struct RunCall {
    command: String,
    timeout: Duration,
    sandbox: protocol::sandbox::Policy,
    /// Asked to run outside the command sandbox (the person is asked as for every command).
    outside: bool,
}

impl Tool for RunCommand {
    fn name(&self) -> &'static str {
        "run_command"
    }

    fn description(&self) -> &'static str {
        "Run a shell command (sh -c) in the working directory, with a timeout, in a sandbox (by default it may write only the working directory, not .git, and has no network). Returns the exit code and output (capped). The user approves each command; outside_sandbox: true asks the user to run it without the sandbox, for a command the sandbox refused."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({
                "command": {"type": "string", "description": "the command line"},
                "outside_sandbox": {"type": "boolean", "description": "run without the command sandbox (the user is asked); only after a sandboxed run was refused"}
            }),
            &["command"],
        )
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Execute
    }

    fn permission(&self) -> Option<PermissionKind> {
        Some(PermissionKind::Execute)
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        let Args {
            command,
            outside_sandbox,
        } = serde_json::from_value(arguments)?;
        Ok(Box::new(RunCall {
            command,
            timeout: self.timeout,
            sandbox: self.sandbox.clone(),
            outside: outside_sandbox && self.sandbox.is_active(),
        }))
    }
}

impl Call for RunCall {
    fn title(&self) -> String {
        let first = self.command.lines().next().unwrap_or_default();
        let mut title = format!("Run {}", cut(first, TITLE_CHARS));
        if self.command.lines().nth(1).is_some() {
            title.push_str(" …");
        }
        if self.outside {
            title.push_str(" (outside the sandbox)");
        }
        title
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let preview =
                ToolCallUpdateFields::new().content(vec![format!("$ {}", self.command).into()]);
            if let Err(refused) = cx.permit(preview).await? {
                return Ok(refused);
            }
            cx.turn.update_tool_call(
                cx.id,
                ToolCallUpdateFields::new().status(ToolCallStatus::InProgress),
            )?;
            let root = cx.turn.workspace().root();
            let budget = cx.turn.memory().settings().budget();
            let ran = shell::run(
                &self.command,
                root,
                self.timeout,
                cx.turn.cancellation(),
                budget,
                if self.outside {
                    &protocol::sandbox::UNRESTRICTED
                } else {
                    &self.sandbox
                },
            )
            .await;
            Ok(match ran {
                Ok(output) if output.succeeded() => Outcome::ok(output.render()),
                Ok(output) => Outcome::failed(output.render()),
                Err(error) => Outcome::failed(describe(&error)),
            })
        })
    }
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}
