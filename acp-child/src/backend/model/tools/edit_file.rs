//! `edit_file`: replace one exact, unique piece of text in a file, after the user approved the
//! diff.

use agent_client_protocol::v1::schema::{Diff, ToolKind};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::files::write_with_permission;
use super::{CANCELLED, Call, Context, Outcome, Tool, parse_into, path_parameter};
use crate::backend::TurnError;
use crate::backend::permission::PermissionKind;
use crate::workspace::edit;
use protocol::report::describe;

pub(super) struct EditFile;

#[derive(Deserialize)]
struct Args {
    path: String,
    old_text: String,
    new_text: String,
}

impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
    }

    fn description(&self) -> &'static str {
        "Replace one exact occurrence of old_text with new_text in a file. old_text must match exactly once, whitespace included. The user approves each edit."
    }

    fn parameters(&self) -> (Value, &'static [&'static str]) {
        (
            json!({
                "path": path_parameter(),
                "old_text": {"type": "string", "description": "the exact text to replace; include enough lines to be unique"},
                "new_text": {"type": "string", "description": "the replacement"},
            }),
            &["path", "old_text", "new_text"],
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
        format!("Edit {}", self.path)
    }

    fn path(&self) -> Option<&str> {
        Some(&self.path)
    }

    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>> {
        Box::pin(async move {
            let path = self.path.as_str();
            let current = match cx.files().read(path).await {
                Ok(Some(text)) => text,
                Ok(None) => return Ok(Outcome::failed(CANCELLED)),
                Err(reason) => return Ok(Outcome::failed(reason)),
            };
            let edited = match edit::replace_exactly(&current, path, &self.old_text, &self.new_text)
            {
                Ok(edited) => edited,
                Err(error) => return Ok(Outcome::failed(describe(&error))),
            };
            let target = match cx.turn.workspace().resolve_existing(path) {
                Ok(target) => target,
                Err(error) => return Ok(Outcome::failed(describe(&error))),
            };
            let diff = Diff::new(&target, edited.as_str()).old_text(current);
            let done = format!("edited {path}: replaced 1 occurrence");
            write_with_permission(cx, path, &edited, diff, done).await
        })
    }
}
