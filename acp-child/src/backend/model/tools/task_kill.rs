//! `task_kill`: stops a background task of this session (session/cancel to its child, then the
//! teardown ladder) and reports how it ended.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{CANCELLED, Call, Context, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Subagents;

pub(super) struct TaskKill {
    pub(super) subagents: Arc<Subagents>,
    /// The longest a call waits for the task to end.
    pub(super) timeout: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    task_id: String,
    #[serde(skip)]
    timeout: Duration,
}

impl Tool for TaskKill {
    fn name(&self) -> &'static str {
        "task_kill"
    }

    fn description(&self) -> &'static str {
        "Stop a background subagent task of this session."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({"task_id": {"type": "string", "description": "the task id, e.g. subagent-1"}}),
            &["task_id"],
        )
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Think
    }

    fn definition(&self, cwd: &Path) -> Option<Value> {
        super::background_offered(&self.subagents, cwd).then(|| self.offer())
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        let mut args: Args = serde_json::from_value(arguments)?;
        args.timeout = self.timeout;
        Ok(Box::new(args))
    }
}

impl Call for Args {
    fn title(&self) -> String {
        format!("Stop {}", self.task_id)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let tasks = Arc::clone(cx.turn.memory().tasks());
            let (before, _) = match tasks.get(&self.task_id) {
                Ok(found) => found,
                Err(error) => return Ok(Outcome::failed(error.to_string())),
            };
            if before.result.is_some() {
                return Ok(Outcome::ok(format!(
                    "{} had already finished: {}",
                    self.task_id,
                    before.line()
                )));
            }
            let done = match tasks.kill(&self.task_id) {
                Ok(done) => done,
                Err(error) => return Ok(Outcome::failed(error.to_string())),
            };
            tokio::select! {
                biased;
                () = cx.turn.cancelled() => return Ok(Outcome::failed(CANCELLED)),
                () = done.cancelled() => {}
                () = tokio::time::sleep(self.timeout) => {
                    return Ok(Outcome::failed(format!("{} is still stopping", self.task_id)));
                }
            }
            Ok(match tasks.get(&self.task_id) {
                Ok((view, _)) => Outcome::ok(format!("killed {}", view.line())),
                Err(error) => Outcome::failed(error.to_string()),
            })
        })
    }
}
