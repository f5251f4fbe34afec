//! `list_agents`: this session's children (direct only: a child's own children are its
//! business), with id, subagent, status, last activity and why one cannot be continued.

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Offering, Outcome, Tool};
use crate::backend::TurnError;

pub(super) struct ListAgents;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {}

impl Tool for ListAgents {
    fn name(&self) -> &'static str {
        "list_agents"
    }

    fn description(&self) -> &'static str {
        "List the subagent children this session started: child id, subagent, status (running, idle, \
         ended, failed) and last activity. send_message continues one."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (json!({}), &[])
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Think
    }

    fn definition(&self, offering: &Offering) -> Option<Value> {
        super::offered(offering.children, |offered| offered.delegation).then(|| self.offer())
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        super::parse_into::<Args>(arguments)
    }
}

impl Call for Args {
    fn title(&self) -> String {
        "List child agents".to_owned()
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let children = match cx.children() {
                Ok(children) => children,
                Err(refused) => return Ok(refused),
            };
            Ok(Outcome::ok(children.list_children(cx.turn)))
        })
    }
}
