//! `write_file`: create or overwrite a file, after the user approved the diff.

use agent_client_protocol::v1::schema::{Diff, ToolKind};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::files::write_with_permission;
use super::{Call, Context, Outcome, Tool, parse_into, path_parameter};
use crate::backend::TurnError;
use crate::backend::permission::PermissionKind;
use protocol::report::describe;

pub(super) struct WriteFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    content: String,
}

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self) -> &'static str {
        "Create or overwrite a file with the given content. The parent directory must exist. The user approves each write."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({
                "path": path_parameter(),
                "content": {"type": "string", "description": "the whole new content"},
            }),
            &["path", "content"],
        )
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Edit
    }

    fn permission(&self) -> Option<PermissionKind> {
        Some(PermissionKind::Edit)
    }

    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error> {
        parse_into::<Args>(arguments)
    }
}

impl Call for Args {
    fn title(&self) -> String {
        format!("Write {}", self.path)
    }

    fn path(&self) -> Option<&str> {
        Some(&self.path)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            // Refuse before asking: never ask a user to approve a write that would be refused.
            let target = match cx.turn.workspace().resolve_for_write(&self.path) {
                Ok(target) => target,
                Err(error) => return Ok(Outcome::failed(describe(&error))),
            };
            let old = cx.files().old_text(&target).await;
            let diff = Diff::new(&target, self.content.as_str()).old_text(old);
            let done = format!("wrote {} bytes to {}", self.content.len(), self.path);
            write_with_permission(cx, &self.path, &self.content, diff, done).await
        })
    }
}
