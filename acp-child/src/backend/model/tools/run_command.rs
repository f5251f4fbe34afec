//! `run_command`: a shell command in the session directory, after the user approved it, killed
//! after the configured timeout or on cancellation, in the command sandbox (see
//! [`crate::workspace::shell`]). `outside_sandbox: true` asks to run it without that sandbox:
//! the permission request (the same one every command goes through) says so in its title, so the
//! person decides; this agent's own sandbox, if it runs in one, still holds.
//!
//! `run_in_background: true` (offered unless `--no-background`, or when the session's tool
//! filter leaves out the tools that collect and stop a task) asks the same permission, then
//! starts the command as a task of the session's table (`command-N`) and returns its id at once:
//! `task_output` reads its output (so far, while it runs), `task_kill` kills its process group,
//! and closing the session kills it too. It keeps the sandbox (its confinement lives as long as
//! it runs) and has no timeout: it runs until it exits or is stopped. A call sending it where it
//! is not offered is refused before anything is asked or started.

use std::time::Duration;

use agent_client_protocol::v1::schema::{ToolCallStatus, ToolCallUpdateFields, ToolKind};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use std::sync::Arc;

use acp_host::run::Cancel;
use tokio_util::sync::CancellationToken;

use super::{Call, Context, Offering, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Delegated;
use crate::backend::permission::PermissionKind;
use crate::workspace::shell;
use protocol::report::describe;

/// The tool's name.
pub(crate) const NAME: &str = "run_command";

/// The result of a `run_in_background` call where background commands are not offered.
const BACKGROUND_REFUSED: &str = "background commands are not available in this session \
     (--no-background, or its tool filter leaves out task_output or task_kill); call run_command \
     without run_in_background";

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
    #[serde(default)]
    run_in_background: bool,
}

/// A parsed call, with the tool's timeout and the sandbox it runs in.
struct RunCall {
    command: String,
    timeout: Duration,
    sandbox: protocol::sandbox::Policy,
    /// Asked to run outside the command sandbox (the person is asked as for every command).
    outside: bool,
    /// Asked to run as a background task.
    background: bool,
}

impl Tool for RunCommand {
    fn name(&self) -> &'static str {
        NAME
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

    fn definition(&self, offering: &Offering) -> Option<Value> {
        let mut offer = self.offer();
        if offering.background_commands {
            offer["function"]["description"] = format!(
                "{} run_in_background: true starts it as a background task and returns its id \
                 at once (no timeout): task_output reads its output, task_kill stops it, and you \
                 are told when it ends.",
                self.description()
            )
            .into();
            offer["function"]["parameters"]["properties"]["run_in_background"] = json!({
                "type": "boolean",
                "description": "run it as a background task (for a long-running command: a server, a watcher, a long build)"
            });
        }
        Some(offer)
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
            run_in_background,
        } = serde_json::from_value(arguments)?;
        Ok(Box::new(RunCall {
            command,
            timeout: self.timeout,
            sandbox: self.sandbox.clone(),
            outside: outside_sandbox && self.sandbox.is_active(),
            background: run_in_background,
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
        if self.background {
            title.push_str(" (in the background)");
        }
        title
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            if self.background && !cx.background_commands {
                return Ok(Outcome::failed(BACKGROUND_REFUSED));
            }
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
            let budget = cx.turn.memory().settings().depth();
            let sandbox = if self.outside {
                &protocol::sandbox::UNRESTRICTED
            } else {
                &self.sandbox
            };
            if self.background {
                return Ok(self.start(cx, budget, sandbox.clone()));
            }
            let ran = shell::run(
                &self.command,
                root,
                self.timeout,
                cx.turn.cancellation(),
                budget,
                sandbox,
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

impl RunCall {
    /// Starts the command as a background task of the session's table: its id, or why not.
    fn start(
        &self,
        cx: &Context<'_>,
        budget: Option<protocol::depth::DepthBudget>,
        sandbox: protocol::sandbox::Policy,
    ) -> Outcome {
        let table = Arc::clone(cx.turn.memory().tasks());
        let streams = Arc::new(shell::Streams::default());
        let cancel = Cancel::new();
        let run = {
            let command = self.command.clone();
            let root = cx.turn.workspace().root().to_path_buf();
            let cancel = cancel.clone();
            let streams = Arc::clone(&streams);
            async move {
                // The shell kills its group when this fires: on task_kill, or when the session
                // is cancelled or closed; never with the turn that started it.
                let stop = CancellationToken::new();
                let ran = shell::run_into(&command, &root, None, &stop, budget, &sandbox, &streams);
                tokio::pin!(ran);
                let ran = tokio::select! {
                    biased;
                    ran = &mut ran => ran,
                    () = cancel.cancelled() => {
                        stop.cancel();
                        ran.await
                    }
                };
                match ran {
                    Ok(mut output) => {
                        if output.ended == shell::Ended::Cancelled {
                            output.ended = shell::Ended::Stopped;
                        }
                        Delegated {
                            text: output.render(),
                            failed: !output.succeeded(),
                            session: None,
                            resumable: None,
                            usage: None,
                        }
                    }
                    Err(error) => Delegated::failed(describe(&error)),
                }
            }
        };
        let label = cut(self.command.lines().next().unwrap_or_default(), TITLE_CHARS);
        match table.spawn_command(&label, cancel, streams, run) {
            Ok(id) => Outcome::ok(format!(
                "started background task {id}: command {label:?}. It runs on its own, with no \
                 timeout: task_output {id} returns its output so far, or its result once it \
                 ended (wait: true blocks until then), task_kill {id} stops it, and you are told \
                 when it ends."
            )),
            Err(error) => Outcome::failed(error.to_string()),
        }
    }
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}
