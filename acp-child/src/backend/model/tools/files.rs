//! Where tool calls read and write files: through the client when it offers `fs`, else the
//! local file system; always confined by the [`Workspace`] first.

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{Diff, ToolCallContent, ToolCallUpdateFields};

use super::{CANCELLED, Context, Outcome};
use crate::backend::{Turn, TurnError};
use crate::workspace::{MAX_READ_BYTES, ToolError, Workspace};
use protocol::report::describe;

pub(crate) struct Files<'a> {
    pub(super) turn: &'a Turn,
}

impl<'a> Files<'a> {
    /// The files of `turn`'s session (also the offline `/read` and `/write`).
    pub(crate) fn new(turn: &'a Turn) -> Self {
        Self { turn }
    }
}

impl Files<'_> {
    /// Reads a file inside the workspace. `Ok(None)`: the turn was cancelled.
    pub(crate) async fn read(&self, requested: &str) -> Result<Option<String>, String> {
        let workspace = self.turn.workspace();
        if !self.turn.client_fs().read {
            return workspace
                .read_text(requested)
                .map(Some)
                .map_err(|error| describe(&error));
        }
        let path = workspace
            .resolve_existing(requested)
            .map_err(|error| describe(&error))?;
        match self.turn.client_read(&path).await {
            None => Ok(None),
            Some(Ok(text)) if text.len() as u64 > MAX_READ_BYTES => {
                Err(describe(&ToolError::TooLarge {
                    requested: requested.to_owned(),
                    size: text.len() as u64,
                }))
            }
            Some(Ok(text)) => Ok(Some(text)),
            Some(Err(error)) => Err(format!(
                "the client could not read {requested}: {}",
                describe(&error)
            )),
        }
    }

    /// The current text of a file about to be written, for the diff; `None` for a new file.
    pub(crate) async fn old_text(&self, target: &Path) -> Option<String> {
        if self.turn.client_fs().read && target.exists() {
            self.turn.client_read(target).await.and_then(Result::ok)
        } else {
            Workspace::existing_text(target)
        }
    }

    /// Writes a file inside the workspace. `Ok(None)`: the turn was cancelled.
    pub(crate) async fn write(
        &self,
        requested: &str,
        content: &str,
    ) -> Result<Option<PathBuf>, String> {
        let workspace = self.turn.workspace();
        if !self.turn.client_fs().write {
            return workspace
                .write_text(requested, content)
                .map(|written| Some(written.path))
                .map_err(|error| describe(&error));
        }
        // Resolve again: the file system may have changed while the user was deciding.
        let path = workspace
            .resolve_for_write(requested)
            .map_err(|error| describe(&error))?;
        match self.turn.client_write(&path, content).await {
            None => Ok(None),
            Some(Ok(())) => Ok(Some(path)),
            Some(Err(error)) => Err(format!(
                "the client could not write {requested}: {}",
                describe(&error)
            )),
        }
    }
}

/// The shared tail of `write_file` and `edit_file`: ask with the diff shown, then write `content`
/// to `path`; `done` is the model's result on success, the client sees the diff.
pub(super) async fn write_with_permission(
    cx: &Context<'_>,
    path: &str,
    content: &str,
    diff: Diff,
    done: String,
) -> Result<Outcome, TurnError> {
    let preview = ToolCallUpdateFields::new().content(vec![ToolCallContent::from(diff.clone())]);
    if let Err(refused) = cx.permit(preview).await? {
        return Ok(refused);
    }
    Ok(match cx.files().write(path, content).await {
        Ok(Some(_)) => Outcome::ok_showing(done, vec![ToolCallContent::from(diff)]),
        Ok(None) => Outcome::failed(CANCELLED),
        Err(reason) => Outcome::failed(reason),
    })
}
