//! `list_agents`: this session's children (direct only: a child's own children are its
//! business), with id, subagent, status, last activity and why one cannot be continued.

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::children::Subagents;
use crate::backend::children::table as tasks;

pub(super) struct ListAgents {
    pub(super) subagents: Arc<Subagents>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(skip)]
    subagents: Option<Arc<Subagents>>,
}

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

    fn definition(&self, cwd: &Path) -> Option<Value> {
        super::delegation_offered(&self.subagents, cwd).then(|| self.offer())
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        let mut args: Args = serde_json::from_value(arguments)?;
        args.subagents = Some(Arc::clone(&self.subagents));
        Ok(Box::new(args))
    }
}

impl Call for Args {
    fn title(&self) -> String {
        "List child agents".to_owned()
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let (children, unusable) = cx.turn.memory().tasks().children();
            let catalog = self
                .subagents
                .as_ref()
                .map(|subagents| subagents.catalog(cx.turn.workspace().root()));
            let available = |name: &str| {
                catalog
                    .as_ref()
                    .is_some_and(|catalog| catalog.targets.iter().any(|t| t.name == name))
            };
            Ok(Outcome::ok(tasks::describe_children(
                &children, &unusable, available,
            )))
        })
    }
}
