//! `read_file`: a UTF-8 text file, through the client's buffers when it offers them.

use agent_client_protocol::v1::schema::ToolKind;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{CANCELLED, Call, Context, Outcome, Tool, parse_into, path_parameter};
use crate::backend::TurnError;

pub(super) struct ReadFile;

#[derive(Deserialize)]
struct Args {
    path: String,
}

impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read a UTF-8 text file (at most 1 MiB)."
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
        format!("Read {}", self.path)
    }

    fn path(&self) -> Option<&str> {
        Some(&self.path)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            Ok(match cx.files().read(&self.path).await {
                Ok(Some(text)) => Outcome::ok(text),
                Ok(None) => Outcome::failed(CANCELLED),
                Err(reason) => Outcome::failed(reason),
            })
        })
    }
}
