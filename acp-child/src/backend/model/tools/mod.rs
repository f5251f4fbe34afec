//! The model's tools: each in its own module with its name, argument schema, kind, permission and
//! execution together; [`Toolbox`] is the list the model is offered, so a tool is added or left
//! out in one place.
//!
//! Every call is reported: a `tool_call` (kind, title, locations, raw input) before it runs and a
//! `tool_call_update` (completed or failed, with content; edits carry a diff) after. A tool with a
//! [`PermissionKind`] asks first, through [`crate::backend::permission`] with the "always" options
//! offered; a rejection is not an error: the model gets [`PERMISSION_DENIED`] as the result and
//! the turn goes on. A call the model named or formed badly is announced (titled by its name) and
//! failed with an explanation the model can act on.
//!
//! Files: paths are confined by [`Workspace`] first (refusals are tool errors). Reads and writes
//! then go through the client (`fs/read_text_file`, `fs/write_text_file`) when it offers them, so
//! an editor sees its unsaved buffers; otherwise the local file system ([`files`]). Listing and
//! searching are always local (ACP has no such client request).

mod capture;
mod edit_file;
pub(crate) mod files;
mod list_agents;
mod list_dir;
mod read_file;
mod run_command;
mod search;
mod send_message;
pub(crate) mod subagent;
mod task_kill;
mod task_list;
mod task_output;
mod write_file;

use std::time::Duration;

use agent_client_protocol::v1::schema::{
    ToolCall, ToolCallContent, ToolCallId, ToolCallStatus, ToolCallUpdateFields, ToolKind,
};
use futures::future::BoxFuture;
use protocol::capabilities::ToolFilter;
use protocol::structured::{CAPTURE_TOOL, OutputSchema};
use serde_json::{Value, json};

use self::files::Files;
use crate::backend::children::{BACKGROUND_TOOLS, Children, Offered};
use crate::backend::permission::{self, Offer, PermissionKind, Verdict};
use crate::backend::{Turn, TurnError, locations};
use crate::store::RecordedCall;
use crate::workspace::Workspace;

pub(crate) use self::capture::{INSTRUCTION as CAPTURE_INSTRUCTION, RECORDED as CAPTURE_RECORDED};
pub(crate) use self::run_command::NAME as RUN_COMMAND;
pub(crate) use self::task_list::NAME as TASK_LIST;
pub(crate) use self::task_output::NAME as TASK_OUTPUT;

pub(crate) use crate::backend::{CANCELLED, PERMISSION_DENIED};

/// A tool the model can call.
pub(crate) trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &'static str;
    fn description(&self) -> &'static str;
    /// The JSON schema `properties` of its arguments, and which of them are required.
    fn parameters(&self) -> (Value, &'static [&'static str]);
    /// How the client shows its calls.
    fn kind(&self) -> ToolKind;
    /// The permission its calls need; `None`: they run without asking.
    fn permission(&self) -> Option<PermissionKind> {
        None
    }
    /// The tool as an `OpenAI` function definition for a request of a turn offering
    /// `offering`; `None`: not offered (a call the model makes anyway is still answered: refused
    /// with an explanation).
    fn definition(&self, _offering: &Offering) -> Option<Value> {
        Some(self.offer())
    }
    /// The tool as an `OpenAI` function definition, from its name, description and parameters.
    fn offer(&self) -> Value {
        let (properties, required) = self.parameters();
        function(self.name(), self.description(), &properties, required)
    }
    /// Parses a call's arguments (a JSON object).
    fn parse(&self, arguments: Value) -> Result<Box<dyn Call>, serde_json::Error>;
}

/// One parsed call of a tool.
pub(crate) trait Call: Send + Sync {
    /// A short human title (never empty).
    fn title(&self) -> String;
    /// The file the call is about, if any.
    fn path(&self) -> Option<&str> {
        None
    }
    fn run<'a>(&'a self, cx: &'a Context<'a>) -> BoxFuture<'a, Result<Outcome, TurnError>>;
}

/// What a turn offers beyond the plain tools: one rule, read by every tool's definition.
pub(crate) struct Offering<'a> {
    /// The turn's children wing; `None` when subagents are not enabled.
    pub(crate) children: Option<&'a Children<'a>>,
    /// `run_command`'s `run_in_background`: `--no-background` is off and the session's tool
    /// filter lets `run_command` and the tools that collect and stop a task
    /// ([`BACKGROUND_TOOLS`]) through (a task nothing could collect or stop is not offered).
    pub(crate) background_commands: bool,
}

impl Offering<'_> {
    /// Whether the task tools are offered: some kind of background task is.
    pub(crate) fn tasks(&self) -> bool {
        self.background_commands || offered(self.children, |offered| offered.background)
    }
}

/// What a running call may use.
pub(crate) struct Context<'a> {
    pub(crate) turn: &'a Turn,
    /// The id the call was announced under.
    pub(crate) id: &'a ToolCallId,
    permission: Option<PermissionKind>,
    /// The turn's children wing; `None` when subagents are not enabled.
    children: Option<&'a Children<'a>>,
    /// Whether `run_command` may run in the background ([`Offering::background_commands`]).
    background_commands: bool,
}

impl Context<'_> {
    /// The turn's children wing, or the call's result when subagents are not enabled.
    pub(crate) fn children(&self) -> Result<&Children<'_>, Outcome> {
        self.children
            .ok_or_else(|| Outcome::failed("subagents are not enabled"))
    }

    pub(crate) fn files(&self) -> Files<'_> {
        Files { turn: self.turn }
    }

    /// Asks permission (with `preview` shown) if the tool needs it; `Err(outcome)` when the call
    /// must not run, with what the model and the client get instead.
    pub(crate) async fn permit(
        &self,
        preview: ToolCallUpdateFields,
    ) -> Result<Result<(), Outcome>, TurnError> {
        let Some(kind) = self.permission else {
            return Ok(Ok(()));
        };
        let verdict = permission::ask(self.turn, self.id, kind, Offer::Always, preview).await?;
        Ok(match verdict {
            Verdict::Allowed => Ok(()),
            Verdict::Rejected => Err(Outcome::failed(PERMISSION_DENIED)),
            Verdict::ClientError(reason) => Err(Outcome::failed(reason)),
            Verdict::Cancelled => Err(Outcome::failed(CANCELLED)),
        })
    }
}

/// What a call returned to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolResult {
    /// The text the model gets.
    pub(crate) content: String,
    /// Whether the call failed (or was refused).
    pub(crate) failed: bool,
}

impl ToolResult {
    /// The tool card's final status.
    pub(crate) fn status(&self) -> ToolCallStatus {
        if self.failed {
            ToolCallStatus::Failed
        } else {
            ToolCallStatus::Completed
        }
    }
}

/// A call's result for the model, and what the client shows for it.
pub(crate) struct Outcome {
    result: ToolResult,
    shown: Vec<ToolCallContent>,
}

impl Outcome {
    pub(crate) fn ok(text: String) -> Self {
        Self::ok_showing(text.clone(), vec![text.into()])
    }

    /// A success the client shows differently from the model's text (an edit's diff).
    pub(crate) fn ok_showing(text: String, shown: Vec<ToolCallContent>) -> Self {
        Self {
            result: ToolResult {
                content: text,
                failed: false,
            },
            shown,
        }
    }

    pub(crate) fn failed(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Self {
            result: ToolResult {
                content: reason.clone(),
                failed: true,
            },
            shown: vec![reason.into()],
        }
    }
}

/// The tools offered to the model, in the order it sees them.
pub(crate) struct Toolbox {
    tools: Vec<Box<dyn Tool>>,
    /// Background tasks are allowed (no `--no-background`).
    background: bool,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A call, matched to its tool and parsed.
struct Parsed<'a> {
    tool: &'a dyn Tool,
    call: Box<dyn Call>,
}

impl Toolbox {
    /// Every built-in tool; `run_command` kills a command after `command_timeout` (one run in
    /// the `background`, when allowed, is a task); the task tools (`task_output`, `task_list`,
    /// `task_kill`; waits bounded by `command_timeout`) with `background` or `delegation`; with
    /// `delegation`, `subagent` and the tools reaching its children (`send_message`,
    /// `list_agents`).
    pub(crate) fn standard(
        command_timeout: Duration,
        command_sandbox: &protocol::sandbox::Policy,
        background: bool,
        delegation: bool,
    ) -> Self {
        let mut tools: Vec<Box<dyn Tool>> = vec![
            Box::new(read_file::ReadFile),
            Box::new(list_dir::ListDir),
            Box::new(search::Search),
            Box::new(write_file::WriteFile),
            Box::new(edit_file::EditFile),
            Box::new(run_command::RunCommand {
                timeout: command_timeout,
                sandbox: command_sandbox.clone(),
            }),
        ];
        if delegation {
            tools.push(Box::new(subagent::Subagent));
        }
        if delegation || background {
            tools.push(Box::new(task_output::TaskOutput {
                timeout: command_timeout,
            }));
            tools.push(Box::new(task_list::TaskList));
            tools.push(Box::new(task_kill::TaskKill {
                timeout: command_timeout,
            }));
        }
        if delegation {
            tools.push(Box::new(send_message::SendMessage));
            tools.push(Box::new(list_agents::ListAgents));
        }
        Self { tools, background }
    }

    /// What a turn whose children wing is `children` offers through the session's `filter`.
    fn offering<'c>(
        &self,
        children: Option<&'c Children<'c>>,
        filter: Option<&ToolFilter>,
    ) -> Offering<'c> {
        let allows = |name: &str| filter.is_none_or(|filter| filter.allows(name));
        Offering {
            children,
            background_commands: self.background
                && allows(RUN_COMMAND)
                && BACKGROUND_TOOLS.iter().all(|name| allows(name)),
        }
    }

    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|tool| tool.name()).collect()
    }

    /// The tools a session's filter lets through (all without one).
    fn allowed<'a, 'f>(
        &'a self,
        filter: Option<&'f ToolFilter>,
    ) -> impl Iterator<Item = &'a Box<dyn Tool>> + use<'a, 'f> {
        self.tools
            .iter()
            .filter(move |tool| filter.is_none_or(|filter| filter.allows(tool.name())))
    }

    /// The tools offered in a turn whose children wing is `children` through the session's
    /// `filter`, and the capture tool when the session asks for a structured answer (`output`),
    /// as the `tools` field of a request.
    pub(crate) fn definitions(
        &self,
        children: Option<&Children>,
        filter: Option<&ToolFilter>,
        output: Option<&OutputSchema>,
    ) -> Value {
        let offering = self.offering(children, filter);
        self.allowed(filter)
            .filter_map(|tool| tool.definition(&offering))
            .chain(output.map(capture::definition))
            .collect()
    }

    /// Parses a call from its name and JSON arguments; the error is the tool result explaining it
    /// (naming the tools offered with `children`). A tool the session's `filter` leaves out is
    /// unknown.
    fn parse(
        &self,
        name: &str,
        arguments: &str,
        children: Option<&Children>,
        filter: Option<&ToolFilter>,
    ) -> Result<Parsed<'_>, String> {
        let Some(tool) = self.allowed(filter).find(|tool| tool.name() == name) else {
            let offering = self.offering(children, filter);
            let offered: Vec<&str> = self
                .allowed(filter)
                .filter(|tool| tool.definition(&offering).is_some())
                .map(|tool| tool.name())
                .collect();
            if offered.is_empty() {
                return Err(format!(
                    "unknown tool {name:?}; no tools are offered in this session"
                ));
            }
            return Err(format!(
                "unknown tool {name:?}; the tools are {}",
                offered.join(", ")
            ));
        };
        let arguments: Value = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments).map_err(|error| {
                format!("the arguments of {name} are not valid JSON ({error}); send a JSON object")
            })?
        };
        let call = tool
            .parse(arguments)
            .map_err(|error| format!("invalid arguments for {name}: {error}"))?;
        Ok(Parsed {
            tool: &**tool,
            call,
        })
    }

    /// The `tool_call` announcing a recorded call (also used to replay history). Its id is the
    /// recorded one; the announcing [`Turn`] may replace it.
    pub(crate) fn announcement(&self, recorded: &RecordedCall, workspace: &Workspace) -> ToolCall {
        let raw_input = serde_json::from_str::<Value>(&recorded.arguments).ok();
        match self.parse(&recorded.name, &recorded.arguments, None, None) {
            Ok(parsed) => ToolCall::new(recorded.id.clone(), parsed.call.title())
                .raw_input(raw_input)
                .kind(parsed.tool.kind())
                .locations(
                    parsed
                        .call
                        .path()
                        .map(|path| locations(workspace, path))
                        .unwrap_or_default(),
                ),
            Err(_) => ToolCall::new(recorded.id.clone(), untitled(&recorded.name))
                .raw_input(raw_input)
                .kind(ToolKind::Other),
        }
    }

    /// Reports a call that is not run, failed with `reason` (also its result).
    pub(crate) fn refuse(
        &self,
        turn: &Turn,
        recorded: &RecordedCall,
        reason: String,
    ) -> Result<ToolResult, TurnError> {
        let announced = self.announcement(recorded, turn.workspace());
        refuse(turn, announced, recorded, reason)
    }

    /// Runs one tool call of a turn whose children wing is `children` to its end, reporting it
    /// to the client. Cancellation is observed: the result is then [`CANCELLED`].
    pub(crate) async fn run(
        &self,
        turn: &Turn,
        children: Option<&Children<'_>>,
        recorded: &RecordedCall,
    ) -> Result<ToolResult, TurnError> {
        let settings = turn.memory().settings();
        if let Some(schema) = &settings.output
            && recorded.name == CAPTURE_TOOL
        {
            return capture::run(turn, recorded, schema);
        }
        let announced = self.announcement(recorded, turn.workspace());
        let filter = settings.tools.as_ref();
        let parsed = match self.parse(&recorded.name, &recorded.arguments, children, filter) {
            Ok(parsed) => parsed,
            Err(reason) => return refuse(turn, announced, recorded, reason),
        };
        let permission = parsed.tool.permission();
        let status = if permission.is_some() {
            ToolCallStatus::Pending
        } else {
            ToolCallStatus::InProgress
        };
        let id = turn.announce_tool_call(announced.status(status), &recorded.id)?;
        let cx = Context {
            turn,
            id: &id,
            permission,
            children,
            background_commands: self.offering(children, filter).background_commands,
        };
        let Outcome { result, shown } = parsed.call.run(&cx).await?;
        turn.update_tool_call(
            &id,
            ToolCallUpdateFields::new()
                .status(result.status())
                .content(shown),
        )?;
        Ok(result)
    }
}

/// Announces `announced` (the call `recorded`) failed with `reason`, its result.
fn refuse(
    turn: &Turn,
    announced: ToolCall,
    recorded: &RecordedCall,
    reason: String,
) -> Result<ToolResult, TurnError> {
    turn.announce_tool_call(
        announced
            .status(ToolCallStatus::Failed)
            .content(vec![reason.clone().into()]),
        &recorded.id,
    )?;
    Ok(ToolResult {
        content: reason,
        failed: true,
    })
}

/// Whether a children's tool is offered in a turn whose wing is `children`, by `which` of the
/// one rule ([`Children::offered`]).
fn offered(children: Option<&Children>, which: impl FnOnce(Offered) -> bool) -> bool {
    children.is_some_and(|children| which(children.offered()))
}

/// The title of a call that could not be parsed: the tool's name, if it has one.
fn untitled(name: &str) -> String {
    if name.trim().is_empty() {
        "Unnamed tool call".to_owned()
    } else {
        name.to_owned()
    }
}

/// An `OpenAI` function definition.
fn function(name: &str, description: &str, properties: &Value, required: &[&str]) -> Value {
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
}

/// The schema of a path argument.
fn path_parameter() -> Value {
    json!({"type": "string", "description": "a path relative to the working directory"})
}

/// Parses a call's arguments into `T`, the tool's argument struct.
fn parse_into<T>(arguments: Value) -> Result<Box<dyn Call>, serde_json::Error>
where
    T: Call + serde::de::DeserializeOwned + 'static,
{
    Ok(Box::new(serde_json::from_value::<T>(arguments)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolbox() -> Toolbox {
        Toolbox::standard(
            Duration::from_secs(1),
            &protocol::sandbox::Policy::default(),
            false,
            false,
        )
    }

    /// `(kind, title, permission)` of a call.
    fn shown(name: &str, arguments: &str) -> (ToolKind, String, Option<PermissionKind>) {
        let toolbox = toolbox();
        let parsed = toolbox.parse(name, arguments, None, None).unwrap();
        (
            parsed.tool.kind(),
            parsed.call.title(),
            parsed.tool.permission(),
        )
    }

    #[test]
    fn definitions_name_exactly_the_tools() {
        let toolbox = toolbox();
        let definitions = toolbox.definitions(None, None, None);
        let names: Vec<&str> = definitions
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "read_file",
                "list_dir",
                "search",
                "write_file",
                "edit_file",
                "run_command"
            ]
        );
        assert_eq!(names, toolbox.names());
    }

    #[test]
    fn calls_parse_with_clear_errors() {
        let toolbox = toolbox();
        let error =
            |name: &str, arguments: &str| toolbox.parse(name, arguments, None, None).err().unwrap();
        assert_eq!(
            toolbox
                .parse("read_file", r#"{"path":"a.txt","extra":1}"#, None, None)
                .unwrap()
                .call
                .path(),
            Some("a.txt")
        );
        assert_eq!(
            shown("search", r#"{"pattern":"fn main"}"#).1,
            "Search \"fn main\""
        );
        assert_eq!(shown("list_dir", "").1, "List .");
        assert_eq!(
            error("delete_everything", "{}"),
            "unknown tool \"delete_everything\"; the tools are read_file, list_dir, search, write_file, edit_file, run_command"
        );
        assert!(
            error("read_file", "{").starts_with("the arguments of read_file are not valid JSON")
        );
        assert_eq!(
            error("edit_file", r#"{"path":"a"}"#),
            "invalid arguments for edit_file: missing field `old_text`"
        );
    }

    #[test]
    fn a_filter_leaves_tools_out_of_the_offer_and_the_calls() {
        let toolbox = toolbox();
        let filter = ToolFilter {
            allow: Some(vec!["read_file".into(), "run_command".into()]),
            deny: vec!["run_command".into()],
        };
        let offered = toolbox.definitions(None, Some(&filter), None);
        assert_eq!(offered.as_array().map(Vec::len), Some(1));
        assert_eq!(offered[0]["function"]["name"], "read_file");
        assert_eq!(
            toolbox
                .parse("run_command", r#"{"command":"ls"}"#, None, Some(&filter))
                .err()
                .unwrap(),
            "unknown tool \"run_command\"; the tools are read_file"
        );
    }

    #[test]
    fn kinds_titles_and_permissions() {
        assert_eq!(
            shown("run_command", r#"{"command":"cargo test\necho done"}"#),
            (
                ToolKind::Execute,
                "Run cargo test …".to_owned(),
                Some(PermissionKind::Execute)
            )
        );
        assert_eq!(
            shown(
                "edit_file",
                r#"{"path":"a.rs","old_text":"x","new_text":"y"}"#
            ),
            (
                ToolKind::Edit,
                "Edit a.rs".to_owned(),
                Some(PermissionKind::Edit)
            )
        );
        assert_eq!(
            shown("write_file", r#"{"path":"a.rs","content":""}"#),
            (
                ToolKind::Edit,
                "Write a.rs".to_owned(),
                Some(PermissionKind::Edit)
            )
        );
        assert_eq!(
            shown("search", r#"{"pattern":"x","path":"src"}"#),
            (ToolKind::Search, "Search \"x\" in src".to_owned(), None)
        );
        assert_eq!(
            shown("read_file", r#"{"path":"a"}"#),
            (ToolKind::Read, "Read a".to_owned(), None)
        );
        assert_eq!(
            shown("list_dir", r#"{"path":"src"}"#),
            (ToolKind::Read, "List src".to_owned(), None)
        );
    }

    #[test]
    fn a_call_that_does_not_parse_is_still_titled() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let recorded = |name: &str| RecordedCall {
            id: "c".into(),
            name: name.into(),
            arguments: "{".into(),
        };
        let toolbox = toolbox();
        assert_eq!(
            toolbox.announcement(&recorded("frob"), &workspace).title,
            "frob"
        );
        assert_eq!(
            toolbox.announcement(&recorded(" "), &workspace).title,
            "Unnamed tool call"
        );
    }
}
