//! `subagent`: hands a task to another agent running as its own process ([`Subagents`]).
//!
//! Present only when subagents are enabled. Offered to the model (listed in its tools) only below
//! the depth cap; a call the model makes anyway at the cap is refused by the run library's depth
//! rule, as a tool result. The `agent` parameter is an enum of the enabled names, each described.

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool};
use crate::backend::TurnError;
use crate::backend::delegate::{self, Subagents};

/// The tool's name, which the model turn also uses to run consecutive calls together.
pub(crate) const NAME: &str = "subagent";

pub(super) struct Subagent {
    pub(super) subagents: Arc<Subagents>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    agent: String,
    prompt: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(skip)]
    subagents: Option<Arc<Subagents>>,
}

impl Tool for Subagent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Hand a self-contained task to a subagent: another agent that runs in its own process in \
         the same working directory, with its own tools, and returns its final answer. Give it \
         everything it needs in the prompt; it does not see this conversation. Several calls in \
         one reply run at the same time."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({
                "agent": {"type": "string", "description": "which subagent runs the task"},
                "prompt": {"type": "string", "description": "the task, complete and self-contained"},
                "description": {"type": "string", "description": "a short label (3-6 words) shown to the user"},
                "output_schema": {"type": "object", "description": "a JSON Schema the subagent's answer must match; the result is then that JSON value"},
            }),
            &["agent", "prompt"],
        )
    }

    fn kind(&self) -> ToolKind {
        delegate::KIND
    }

    /// The subagents available in `cwd` as an enum, each described; problems with definition
    /// files are noted, so the model can tell the user. Not offered at the depth limit or when
    /// nothing is available.
    fn definition(&self, cwd: &Path) -> Option<Value> {
        let catalog = self.subagents.catalog(cwd);
        if !self.subagents.offered(&catalog) {
            return None;
        }
        let (mut properties, required) = self.parameters();
        let described: Vec<String> = catalog
            .targets
            .iter()
            .map(|t| format!("{}: {}", t.name, t.description))
            .collect();
        properties["agent"] = json!({
            "type": "string",
            "enum": catalog.targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            "description": format!("which subagent runs the task. {}", described.join("; ")),
        });
        let mut description = self.description().to_owned();
        if !catalog.problems.is_empty() {
            description
                .push_str(" Some subagent definitions could not be loaded (tell the user): ");
            description.push_str(&catalog.problems.join("; "));
        }
        Some(super::function(NAME, &description, &properties, required))
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        let mut args: Args = serde_json::from_value(arguments)?;
        args.subagents = Some(Arc::clone(&self.subagents));
        Ok(Box::new(args))
    }
}

impl Call for Args {
    fn title(&self) -> String {
        delegate::title(&self.agent, self.description.as_deref(), &self.prompt)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let Some(subagents) = &self.subagents else {
                return Ok(Outcome::failed("subagents are not enabled"));
            };
            let result = subagents
                .run(
                    cx.turn,
                    cx.id,
                    &self.agent,
                    &self.prompt,
                    self.description.as_deref(),
                    self.output_schema.as_ref(),
                )
                .await;
            Ok(if result.failed {
                Outcome::failed(result.text)
            } else {
                Outcome::ok(result.text)
            })
        })
    }
}
