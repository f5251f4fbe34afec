//! `task_kill`: stops a background task of this session (session/cancel to its child, then the
//! teardown ladder) and reports how it ended.

use std::time::Duration;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::subagent::outcome;
use super::{Call, Context, Outcome, Tool};
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

    fn definition(&self, children: Option<&Children>) -> Option<Value> {
        super::offered(children, |offered| offered.background).then(|| self.offer())
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
            let children = match cx.children() {
                Ok(children) => children,
                Err(refused) => return Ok(refused),
            };
            Ok(outcome(
                children.kill(cx.turn, &self.task_id, self.timeout).await,
            ))
        })
    }
}
