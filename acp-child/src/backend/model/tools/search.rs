//! `search`: a regular expression (or plain text) across the workspace's text files.

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool, parse_into};
use crate::backend::TurnError;
use crate::workspace::listing;
use protocol::report::describe;

pub(super) struct Search;

#[derive(Deserialize)]
struct Args {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

impl Tool for Search {
    fn name(&self) -> &'static str {
        "search"
    }

    fn description(&self) -> &'static str {
        "Search text files for a regular expression (or plain text), honouring .gitignore. Returns path:line: text lines, at most 200."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({
                "pattern": {"type": "string", "description": "a regular expression (Rust syntax) or plain text"},
                "path": {"type": "string", "description": "a directory to search in; default: the working directory"},
            }),
            &["pattern"],
        )
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Search
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        parse_into::<Args>(arguments)
    }
}

impl Call for Args {
    fn title(&self) -> String {
        match &self.path {
            Some(path) if !path.is_empty() => format!("Search {:?} in {path}", self.pattern),
            _ => format!("Search {:?}", self.pattern),
        }
    }

    fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let found = listing::search(cx.turn.workspace(), &self.pattern, self.path.as_deref());
            Ok(match found {
                Ok(text) => Outcome::ok(text),
                Err(error) => Outcome::failed(describe(&error)),
            })
        })
    }
}
