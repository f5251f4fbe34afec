//! The model's tools: their `OpenAI` function definitions, argument parsing, how each is shown to
//! the client, and running them.
//!
//! Every call is reported: a `tool_call` (kind, title, locations, raw input) before it runs and a
//! `tool_call_update` (completed or failed, with content; edits carry a diff) after. `write_file`,
//! `edit_file` and `run_command` first ask `session/request_permission` with four options
//! ([`ALLOW_ONCE`], [`ALLOW_ALWAYS`], [`REJECT_ONCE`], [`REJECT_ALWAYS`]); an "always" answer is
//! remembered for the session and the tool kind (`edit` or `execute`). A rejection is not an error:
//! the model gets [`PERMISSION_DENIED`] as the result and the turn goes on.
//!
//! Files: paths are confined by [`Workspace`] first (refusals are tool errors). Reads and writes
//! then go through the client (`fs/read_text_file`, `fs/write_text_file`) when it offers them, so
//! an editor sees its unsaved buffers; otherwise the local file system. Listing and searching are
//! always local (ACP has no such client request).

use agent_client_protocol::v1::schema::{
    Diff, PermissionOption, PermissionOptionKind, ToolCall, ToolCallContent, ToolCallId,
    ToolCallStatus, ToolCallUpdateFields, ToolKind,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::backend::{PermissionAnswer, Turn, TurnError, locations};
use crate::describe;
use crate::store::RecordedCall;
use crate::tools::{MAX_READ_BYTES, ToolError, Workspace, edit, listing, shell};

/// Approve this call.
pub const ALLOW_ONCE: &str = "allow-once";
/// Approve this call and every later one of the same kind in the session.
pub const ALLOW_ALWAYS: &str = "allow-always";
/// Refuse this call.
pub const REJECT_ONCE: &str = "reject-once";
/// Refuse this call and every later one of the same kind in the session.
pub const REJECT_ALWAYS: &str = "reject-always";
/// The tool result when the user refuses a call.
pub const PERMISSION_DENIED: &str = "permission denied by the user";
/// The tool result when the turn is cancelled before or while a call runs.
pub const CANCELLED: &str = "cancelled by the user";

/// The tools' names, as the model sees them.
pub const TOOL_NAMES: [&str; 6] = [
    "read_file",
    "list_dir",
    "search",
    "write_file",
    "edit_file",
    "run_command",
];

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "tool", content = "arguments", rename_all = "snake_case")]
pub enum Call {
    ReadFile {
        path: String,
    },
    ListDir {
        #[serde(default)]
        path: String,
    },
    Search {
        pattern: String,
        #[serde(default)]
        path: Option<String>,
    },
    WriteFile {
        path: String,
        content: String,
    },
    EditFile {
        path: String,
        old_text: String,
        new_text: String,
    },
    RunCommand {
        command: String,
    },
}

/// The tools, as the `tools` field of a request.
#[must_use]
pub fn definitions() -> Value {
    let function = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                },
            },
        })
    };
    let path = json!({"type": "string", "description": "a path relative to the working directory"});
    json!([
        function(
            "read_file",
            "Read a UTF-8 text file (at most 1 MiB).",
            json!({"path": path}),
            &["path"],
        ),
        function(
            "list_dir",
            "List a directory's entries (directories end with /). Use \".\" for the working directory.",
            json!({"path": path}),
            &["path"],
        ),
        function(
            "search",
            "Search text files for a regular expression (or plain text), honouring .gitignore. Returns path:line: text lines, at most 200.",
            json!({
                "pattern": {"type": "string", "description": "a regular expression (Rust syntax) or plain text"},
                "path": {"type": "string", "description": "a directory to search in; default: the working directory"},
            }),
            &["pattern"],
        ),
        function(
            "write_file",
            "Create or overwrite a file with the given content. The parent directory must exist. The user approves each write.",
            json!({"path": path, "content": {"type": "string", "description": "the whole new content"}}),
            &["path", "content"],
        ),
        function(
            "edit_file",
            "Replace one exact occurrence of old_text with new_text in a file. old_text must match exactly once, whitespace included. The user approves each edit.",
            json!({
                "path": path,
                "old_text": {"type": "string", "description": "the exact text to replace; include enough lines to be unique"},
                "new_text": {"type": "string", "description": "the replacement"},
            }),
            &["path", "old_text", "new_text"],
        ),
        function(
            "run_command",
            "Run a shell command (sh -c) in the working directory, with a timeout. Returns the exit code and output (capped). The user approves each command.",
            json!({"command": {"type": "string", "description": "the command line"}}),
            &["command"],
        ),
    ])
}

impl Call {
    /// Parses a call from its name and JSON arguments; the error is the tool result explaining it.
    pub fn parse(name: &str, arguments: &str) -> Result<Self, String> {
        if !TOOL_NAMES.contains(&name) {
            return Err(format!(
                "unknown tool {name:?}; the tools are {}",
                TOOL_NAMES.join(", ")
            ));
        }
        let arguments: Value = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments).map_err(|error| {
                format!("the arguments of {name} are not valid JSON ({error}); send a JSON object")
            })?
        };
        serde_json::from_value(json!({"tool": name, "arguments": arguments}))
            .map_err(|error| format!("invalid arguments for {name}: {error}"))
    }

    /// How the client shows the call.
    #[must_use]
    pub fn kind(&self) -> ToolKind {
        match self {
            Self::ReadFile { .. } | Self::ListDir { .. } => ToolKind::Read,
            Self::Search { .. } => ToolKind::Search,
            Self::WriteFile { .. } | Self::EditFile { .. } => ToolKind::Edit,
            Self::RunCommand { .. } => ToolKind::Execute,
        }
    }

    /// The permission group a standing answer applies to; `None` for calls that need no
    /// permission.
    #[must_use]
    pub fn permission_group(&self) -> Option<&'static str> {
        match self {
            Self::WriteFile { .. } | Self::EditFile { .. } => Some("edit"),
            Self::RunCommand { .. } => Some("execute"),
            _ => None,
        }
    }

    /// A short human title.
    #[must_use]
    pub fn title(&self) -> String {
        match self {
            Self::ReadFile { path } => format!("Read {path}"),
            Self::ListDir { path } => format!("List {}", if path.is_empty() { "." } else { path }),
            Self::Search { pattern, path } => match path {
                Some(path) if !path.is_empty() => format!("Search {pattern:?} in {path}"),
                _ => format!("Search {pattern:?}"),
            },
            Self::WriteFile { path, .. } => format!("Write {path}"),
            Self::EditFile { path, .. } => format!("Edit {path}"),
            Self::RunCommand { command } => {
                let first = command.lines().next().unwrap_or_default();
                let mut title = format!("Run {}", cut(first, 80));
                if command.lines().nth(1).is_some() {
                    title.push_str(" …");
                }
                title
            }
        }
    }

    /// The file the call is about, if any.
    #[must_use]
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::ReadFile { path }
            | Self::ListDir { path }
            | Self::WriteFile { path, .. }
            | Self::EditFile { path, .. } => Some(path),
            Self::Search { path, .. } => path.as_deref(),
            Self::RunCommand { .. } => None,
        }
    }
}

/// The `tool_call` announcing `call` (also used to replay history).
#[must_use]
pub fn announcement(recorded: &RecordedCall, workspace: &Workspace) -> ToolCall {
    let raw_input = serde_json::from_str::<Value>(&recorded.arguments).ok();
    match Call::parse(&recorded.name, &recorded.arguments) {
        Ok(parsed) => ToolCall::new(recorded.id.clone(), parsed.title())
            .raw_input(raw_input)
            .kind(parsed.kind())
            .locations(
                parsed
                    .path()
                    .map(|path| locations(workspace, path))
                    .unwrap_or_default(),
            ),
        Err(_) => ToolCall::new(recorded.id.clone(), recorded.name.clone())
            .raw_input(raw_input)
            .kind(ToolKind::Other),
    }
}

/// What a call returned to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The text the model gets.
    pub content: String,
    /// Whether the call failed (or was refused).
    pub failed: bool,
}

impl ToolResult {
    fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            failed: false,
        }
    }

    fn failed(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            failed: true,
        }
    }
}

/// Where tool calls read and write files.
struct Files<'a> {
    turn: &'a Turn,
}

impl Files<'_> {
    /// Reads a file inside the workspace. `Ok(None)`: the turn was cancelled.
    async fn read(&self, requested: &str) -> Result<Option<String>, String> {
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
    async fn old_text(&self, target: &std::path::Path) -> Option<String> {
        if self.turn.client_fs().read && target.exists() {
            self.turn.client_read(target).await.and_then(Result::ok)
        } else {
            Workspace::existing_text(target)
        }
    }

    /// Writes a file inside the workspace. `Ok(None)`: the turn was cancelled.
    async fn write(
        &self,
        requested: &str,
        content: &str,
    ) -> Result<Option<std::path::PathBuf>, String> {
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

/// A tool's result for the model, and what the client shows for it.
type Outcome = (ToolResult, Vec<ToolCallContent>);

fn shown_ok(text: String) -> Outcome {
    (ToolResult::ok(text.clone()), vec![text.into()])
}

fn shown_failed(reason: impl Into<String>) -> Outcome {
    let reason = reason.into();
    (ToolResult::failed(reason.clone()), vec![reason.into()])
}

/// Runs one tool call to its end, reporting it to the client. Cancellation is observed: the
/// result is then [`CANCELLED`].
pub async fn run(
    turn: &Turn,
    recorded: &RecordedCall,
    command_timeout: std::time::Duration,
) -> Result<ToolResult, TurnError> {
    let announced = announcement(recorded, turn.workspace());
    let call = match Call::parse(&recorded.name, &recorded.arguments) {
        Ok(call) => call,
        Err(reason) => {
            turn.announce_tool_call(
                announced
                    .status(ToolCallStatus::Failed)
                    .content(vec![reason.clone().into()]),
            )?;
            return Ok(ToolResult::failed(reason));
        }
    };
    let status = if call.permission_group().is_some() {
        ToolCallStatus::Pending
    } else {
        ToolCallStatus::InProgress
    };
    turn.announce_tool_call(announced.status(status))?;
    let id = ToolCallId::new(recorded.id.clone());
    let files = Files { turn };
    let (result, content) = match &call {
        Call::ReadFile { path } => match files.read(path).await {
            Ok(Some(text)) => shown_ok(text),
            Ok(None) => shown_failed(CANCELLED),
            Err(reason) => shown_failed(reason),
        },
        Call::ListDir { path } => match listing::list_dir(turn.workspace(), path) {
            Ok(text) => shown_ok(text),
            Err(error) => shown_failed(describe(&error)),
        },
        Call::Search { pattern, path } => {
            match listing::search(turn.workspace(), pattern, path.as_deref()) {
                Ok(text) => shown_ok(text),
                Err(error) => shown_failed(describe(&error)),
            }
        }
        Call::WriteFile { path, content } => {
            write_file(turn, &call, &id, &files, path, content).await?
        }
        Call::EditFile {
            path,
            old_text,
            new_text,
        } => edit_file(turn, &call, &id, &files, path, (old_text, new_text)).await?,
        Call::RunCommand { command } => {
            run_command(turn, &call, &id, command, command_timeout).await?
        }
    };
    let status = if result.failed {
        ToolCallStatus::Failed
    } else {
        ToolCallStatus::Completed
    };
    turn.update_tool_call(
        &id,
        ToolCallUpdateFields::new().status(status).content(content),
    )?;
    Ok(result)
}

async fn write_file(
    turn: &Turn,
    call: &Call,
    id: &ToolCallId,
    files: &Files<'_>,
    path: &str,
    content: &str,
) -> Result<Outcome, TurnError> {
    // Refuse before asking: never ask a user to approve a write that would be refused anyway.
    let target = match turn.workspace().resolve_for_write(path) {
        Ok(target) => target,
        Err(error) => return Ok(shown_failed(describe(&error))),
    };
    let old = files.old_text(&target).await;
    let diff = Diff::new(&target, content).old_text(old);
    let done = format!("wrote {} bytes to {path}", content.len());
    write_after_permission(turn, call, id, files, path, content, diff, done).await
}

async fn edit_file(
    turn: &Turn,
    call: &Call,
    id: &ToolCallId,
    files: &Files<'_>,
    path: &str,
    (old_text, new_text): (&str, &str),
) -> Result<Outcome, TurnError> {
    let current = match files.read(path).await {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(shown_failed(CANCELLED)),
        Err(reason) => return Ok(shown_failed(reason)),
    };
    let edited = match edit::replace_exactly(&current, path, old_text, new_text) {
        Ok(edited) => edited,
        Err(error) => return Ok(shown_failed(describe(&error))),
    };
    let target = match turn.workspace().resolve_existing(path) {
        Ok(target) => target,
        Err(error) => return Ok(shown_failed(describe(&error))),
    };
    let diff = Diff::new(&target, edited.as_str()).old_text(current);
    let done = format!("edited {path}: replaced 1 occurrence");
    write_after_permission(turn, call, id, files, path, &edited, diff, done).await
}

#[expect(
    clippy::too_many_arguments,
    reason = "shared tail of write_file and edit_file; a struct would only rename the arguments"
)]
async fn write_after_permission(
    turn: &Turn,
    call: &Call,
    id: &ToolCallId,
    files: &Files<'_>,
    path: &str,
    content: &str,
    diff: Diff,
    done: String,
) -> Result<Outcome, TurnError> {
    let preview = ToolCallUpdateFields::new().content(vec![ToolCallContent::from(diff.clone())]);
    match permit(turn, call, id, preview).await? {
        Permit::Allowed => {}
        Permit::Denied => return Ok(shown_failed(PERMISSION_DENIED)),
        Permit::Cancelled => return Ok(shown_failed(CANCELLED)),
    }
    Ok(match files.write(path, content).await {
        Ok(Some(_)) => (ToolResult::ok(done), vec![ToolCallContent::from(diff)]),
        Ok(None) => shown_failed(CANCELLED),
        Err(reason) => shown_failed(reason),
    })
}

async fn run_command(
    turn: &Turn,
    call: &Call,
    id: &ToolCallId,
    command: &str,
    timeout: std::time::Duration,
) -> Result<Outcome, TurnError> {
    let preview = ToolCallUpdateFields::new().content(vec![format!("$ {command}").into()]);
    match permit(turn, call, id, preview).await? {
        Permit::Allowed => {}
        Permit::Denied => return Ok(shown_failed(PERMISSION_DENIED)),
        Permit::Cancelled => return Ok(shown_failed(CANCELLED)),
    }
    turn.update_tool_call(
        id,
        ToolCallUpdateFields::new().status(ToolCallStatus::InProgress),
    )?;
    let root = turn.workspace().root();
    Ok(
        match shell::run(command, root, timeout, turn.cancellation()).await {
            Ok(output) => {
                let text = output.render();
                if output.succeeded() {
                    shown_ok(text)
                } else {
                    shown_failed(text)
                }
            }
            Err(error) => shown_failed(describe(&error)),
        },
    )
}

/// The outcome of asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Permit {
    Allowed,
    Denied,
    Cancelled,
}

/// Asks permission for a call (or applies the session's standing answer for its kind).
async fn permit(
    turn: &Turn,
    call: &Call,
    id: &ToolCallId,
    preview: ToolCallUpdateFields,
) -> Result<Permit, TurnError> {
    let Some(group) = call.permission_group() else {
        return Ok(Permit::Allowed);
    };
    if let Some(allow) = turn.memory().standing(group) {
        return Ok(if allow {
            Permit::Allowed
        } else {
            Permit::Denied
        });
    }
    let answer = turn.request_permission(id, preview, options()).await?;
    if turn.is_cancelled() {
        return Ok(Permit::Cancelled);
    }
    Ok(match decide(&answer) {
        Decision::Once(allow) => {
            if allow {
                Permit::Allowed
            } else {
                Permit::Denied
            }
        }
        Decision::Always(allow) => {
            turn.memory().set_standing(group, allow);
            if allow {
                Permit::Allowed
            } else {
                Permit::Denied
            }
        }
        Decision::Cancelled => Permit::Cancelled,
    })
}

/// The four permission options, in the order clients show them.
#[must_use]
pub fn options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new(
            ALLOW_ALWAYS,
            "Allow always (this session)",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(REJECT_ONCE, "Reject once", PermissionOptionKind::RejectOnce),
        PermissionOption::new(
            REJECT_ALWAYS,
            "Reject always (this session)",
            PermissionOptionKind::RejectAlways,
        ),
    ]
}

/// What a permission answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// For this call only: allowed or not.
    Once(bool),
    /// For this call and the rest of the session: allowed or not.
    Always(bool),
    /// The turn was cancelled.
    Cancelled,
}

/// Maps an answer to a decision; anything unknown or dismissed is a one-time rejection.
#[must_use]
pub fn decide(answer: &PermissionAnswer) -> Decision {
    match answer {
        PermissionAnswer::Selected(option) => match option.as_str() {
            ALLOW_ONCE => Decision::Once(true),
            ALLOW_ALWAYS => Decision::Always(true),
            REJECT_ALWAYS => Decision::Always(false),
            _ => Decision::Once(false),
        },
        PermissionAnswer::Dismissed => Decision::Once(false),
        PermissionAnswer::TurnCancelled => Decision::Cancelled,
    }
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_name_exactly_the_tools() {
        let definitions = definitions();
        let names: Vec<&str> = definitions
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, TOOL_NAMES);
    }

    #[test]
    fn calls_parse_with_clear_errors() {
        assert_eq!(
            Call::parse("read_file", r#"{"path":"a.txt","extra":1}"#),
            Ok(Call::ReadFile {
                path: "a.txt".into()
            })
        );
        assert_eq!(
            Call::parse("search", r#"{"pattern":"fn main"}"#),
            Ok(Call::Search {
                pattern: "fn main".into(),
                path: None
            })
        );
        assert_eq!(
            Call::parse("list_dir", ""),
            Ok(Call::ListDir {
                path: String::new()
            })
        );
        assert_eq!(
            Call::parse("delete_everything", "{}").unwrap_err(),
            "unknown tool \"delete_everything\"; the tools are read_file, list_dir, search, write_file, edit_file, run_command"
        );
        assert!(
            Call::parse("read_file", "{")
                .unwrap_err()
                .starts_with("the arguments of read_file are not valid JSON")
        );
        assert_eq!(
            Call::parse("edit_file", r#"{"path":"a"}"#).unwrap_err(),
            "invalid arguments for edit_file: missing field `old_text`"
        );
    }

    #[test]
    fn kinds_titles_and_permission_groups() {
        let run = Call::RunCommand {
            command: "cargo test\necho done".into(),
        };
        assert_eq!(
            (run.kind(), run.title(), run.permission_group()),
            (
                ToolKind::Execute,
                "Run cargo test …".to_owned(),
                Some("execute")
            )
        );
        let edit = Call::EditFile {
            path: "a.rs".into(),
            old_text: "x".into(),
            new_text: "y".into(),
        };
        assert_eq!(
            (edit.kind(), edit.title(), edit.permission_group()),
            (ToolKind::Edit, "Edit a.rs".to_owned(), Some("edit"))
        );
        let search = Call::Search {
            pattern: "x".into(),
            path: Some("src".into()),
        };
        assert_eq!(
            (search.kind(), search.title(), search.permission_group()),
            (ToolKind::Search, "Search \"x\" in src".to_owned(), None)
        );
        assert_eq!(
            Call::ListDir {
                path: String::new()
            }
            .title(),
            "List ."
        );
    }

    #[test]
    fn permission_answers_map_to_decisions() {
        let selected = |id: &str| decide(&PermissionAnswer::Selected(id.into()));
        assert_eq!(selected(ALLOW_ONCE), Decision::Once(true));
        assert_eq!(selected(ALLOW_ALWAYS), Decision::Always(true));
        assert_eq!(selected(REJECT_ONCE), Decision::Once(false));
        assert_eq!(selected(REJECT_ALWAYS), Decision::Always(false));
        assert_eq!(selected("something-else"), Decision::Once(false));
        assert_eq!(decide(&PermissionAnswer::Dismissed), Decision::Once(false));
        assert_eq!(
            decide(&PermissionAnswer::TurnCancelled),
            Decision::Cancelled
        );
        let ids: Vec<String> = options()
            .iter()
            .map(|option| option.option_id.0.to_string())
            .collect();
        assert_eq!(ids, [ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS]);
    }
}
