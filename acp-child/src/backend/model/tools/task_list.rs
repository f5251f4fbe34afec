//! `task_list`: the session's background tasks, one line each (id, status, subagent, child id,
//! label), and how many finished ones were dropped once their result was delivered.

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Subagents;
use crate::backend::children::table::describe_tasks;

/// The tool's name.
pub(crate) const NAME: &str = "task_list";

pub(super) struct TaskList {
    pub(super) subagents: Arc<Subagents>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {}

impl Tool for TaskList {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "List this session's background subagent tasks and their status."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (json!({}), &[])
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Think
    }

    fn definition(&self, cwd: &Path) -> Option<Value> {
        super::background_offered(&self.subagents, cwd).then(|| self.offer())
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        super::parse_into::<Args>(arguments)
    }
}

impl Call for Args {
    fn title(&self) -> String {
        "List background tasks".to_owned()
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let (tasks, dropped) = cx.turn.memory().tasks().list();
            Ok(Outcome::ok(describe_tasks(&tasks, dropped)))
        })
    }
}
