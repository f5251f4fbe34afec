//! `list_dir`: a folder's entries, from the local file system.

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Call, Context, Outcome, Tool, parse_into, path_parameter};
use crate::backend::TurnError;
use crate::workspace::listing;
use protocol::report::describe;

pub(super) struct ListDir;

#[derive(Deserialize)]
struct Args {
    #[serde(default)]
    path: String,
}

impl Tool for ListDir {
    fn name(&self) -> &'static str {
        "list_dir"
    }

    fn description(&self) -> &'static str {
        "List a directory's entries (directories end with /). Use \".\" for the working directory."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (json!({"path": path_parameter()}), &["path"])
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Read
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        parse_into::<Args>(arguments)
    }
}

impl Call for Args {
    fn title(&self) -> String {
        format!(
            "List {}",
            if self.path.is_empty() {
                "."
            } else {
                &self.path
            }
        )
    }

    fn path(&self) -> Option<&str> {
        Some(&self.path)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            Ok(match listing::list_dir(cx.turn.workspace(), &self.path) {
                Ok(text) => Outcome::ok(text),
                Err(error) => Outcome::failed(describe(&error)),
            })
        })
    }
}
