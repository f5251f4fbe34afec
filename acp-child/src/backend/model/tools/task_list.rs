//! `task_list`: the session's background tasks, one line each (id, status, subagent and child
//! id, or command line; label), and how many finished ones were dropped once their result was
//! delivered.

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Offering, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Children;

/// The tool's name.
pub(crate) const NAME: &str = "task_list";

pub(super) struct TaskList;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {}

impl Tool for TaskList {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "List this session's background tasks (subagents and shell commands) and their status."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (json!({}), &[])
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Think
    }

    fn definition(&self, offering: &Offering) -> Option<Value> {
        offering.tasks().then(|| self.offer())
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
        Box::pin(async move { Ok(Outcome::ok(Children::list_tasks(cx.turn))) })
    }
}
