//! `task_kill`: stops a background task of this session (a subagent: session/cancel to its
//! child, then the teardown ladder; a command: its process group killed) and reports how it
//! ended. Offered whenever either kind of background task is ([`Offering::tasks`]).

use std::time::Duration;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::subagent::outcome;
use super::{Call, Context, Offering, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Children;

pub(super) struct TaskKill {
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
        "Stop a background task of this session (a subagent, or a shell command: all its processes are killed)."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({"task_id": {"type": "string", "description": "the task id, e.g. subagent-1 or command-1"}}),
            &["task_id"],
        )
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Think
    }

    fn definition(&self, offering: &Offering) -> Option<Value> {
        offering.tasks().then(|| self.offer())
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
            Ok(outcome(
                Children::kill(cx.turn, &self.task_id, self.timeout).await,
            ))
        })
    }
}
