//! Delegation: running a subagent (any ACP agent, acp-child itself included) as a separate
//! process through acp-host's run library, for the model's `subagent` tool and the offline
//! `/delegate` command alike.
//!
//! Invariants:
//! - the subagents are the registry agents the user enabled (`--subagent-agents`), then the
//!   definitions with a `run:` table in `<session cwd>/subagents/` and the `--subagents` folders
//!   ([`Subagents::catalog`], read at each use; a bad file is a noted problem, never fatal, and
//!   never hides the others); a model or a prompt never names a command line;
//! - a definition's fields reach its agent by `protocol::definition::plan_run` (the rule
//!   `acp-host run --subagent` uses too); what cannot be honoured is refused, never ignored;
//! - a child runs at this agent's depth + 1 (`protocol::depth`): the ambient environment handed to
//!   the library carries this agent's own standing, so a child past the cap is refused by the one
//!   rule in acp-host (execution face); [`Subagents::offered`] is the prompt face;
//! - a child gets the scrubbed environment plus only the names `--subagent-env` and its
//!   definition's `env` forward;
//! - at most `--max-parallel-subagents` children run at once (a semaphore; waiting for a slot
//!   observes the turn's cancellation);
//! - every failure (unknown name, spawn error, crash, timeout, refusal, cancellation) is a
//!   [`Delegated`] result with `failed` set, never an error of the parent's turn;
//! - the child's streamed text reaches the parent's client as the tool call's content, bounded to
//!   the last [`SHOWN_BYTES`]; its permission requests are relayed to the parent's client
//!   (`relay`, through `backend::permission::relay`) or answered by policy (`reject`, `allow`);
//! - the parent's `session/cancel` cancels every running child (session/cancel, then the teardown
//!   ladder) and the call then waits for the child's result, so no child outlives the turn.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acp_host::agents::{self, HostFacts};
use acp_host::permission::{Decision, DecisionFuture, PermissionHandler};
use acp_host::run::{self, Cancel, Observer, ObserverError, RunOptions};
use agent_client_protocol::v1::schema::{
    ToolCallContent, ToolCallId, ToolCallUpdateFields, ToolKind,
};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use protocol::definition::{
    self, Definition, PersonaDelivery, Problem, RunPermission, RunSpec, SourceEntry,
};
use protocol::depth::Budget;
use protocol::env_scrub::EnvForward;
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use protocol::events::Event;
use protocol::permission::{Answer, DecidedBy, PermissionPolicy, PermissionRequest};
use protocol::registry;
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::result::{RunResult, Status};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::Turn;
use super::model::tools::CANCELLED;
use super::permission;

/// How a subagent's tool call is shown: the kind ACP agents give delegated work.
pub(crate) const KIND: ToolKind = ToolKind::Think;

/// The title of a subagent's tool call: the subagent's name and the short label (else the
/// prompt's first line, cut).
pub(crate) fn title(name: &str, description: Option<&str>, prompt: &str) -> String {
    let label = description
        .map(str::trim)
        .filter(|label| !label.is_empty())
        .unwrap_or_else(|| prompt.lines().next().unwrap_or("").trim());
    let label: String = if label.chars().count() > 60 {
        label.chars().take(59).chain(['…']).collect()
    } else {
        label.to_owned()
    };
    format!("Subagent {name}: {label}")
}

/// How much of a running child's text its tool card shows (the tail): the whole text travels
/// once more as the result.
pub(crate) const SHOWN_BYTES: usize = 8 * 1024;
/// The default of `--max-parallel-subagents`.
pub const DEFAULT_MAX_PARALLEL_SUBAGENTS: usize = 4;

/// How a child's permission requests are answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SubagentPermission {
    /// Asked of this agent's own client (the person in the editor), title prefixed by the
    /// subagent's name, with the child's options; the answer goes back by kind.
    #[default]
    Relay,
    Reject,
    Allow,
}

/// What the user enabled, from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubagentOptions {
    /// Registry names (`acp-child`, `codex`, ...).
    pub agents: Vec<String>,
    /// `None`: [`DEFAULT_MAX_PARALLEL_SUBAGENTS`].
    pub max_parallel: Option<usize>,
    pub permission: SubagentPermission,
    /// Names of variables forwarded to every child (never values).
    pub env: Vec<String>,
    /// A child running longer is cancelled and torn down.
    pub timeout: Option<Duration>,
    /// This agent's own standing; `None` when its inherited values are malformed (then it may
    /// not delegate: the library refuses every start the same way).
    pub budget: Option<Budget>,
    /// Folders of definitions (`--subagents`), looked at after `<session cwd>/subagents/`.
    pub dirs: Vec<PathBuf>,
}

/// `--subagent-agents` names something that cannot be a subagent.
#[derive(Debug, thiserror::Error)]
pub enum SubagentError {
    #[error(
        "--subagent-agents: {name:?} is not a registry agent that speaks ACP (choose from: {known})"
    )]
    Unknown { name: String, known: String },
    #[error("--subagent-agents: cannot resolve {name}")]
    Resolve {
        name: String,
        #[source]
        source: agents::ResolveError,
    },
    #[error("--max-parallel-subagents must be at least 1")]
    NoParallelism,
}

/// One agent a subagent call may name: an enabled registry agent, or a definition's `run:`.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) description: String,
    command: AgentCommand,
    launch: Launch,
}

/// What a definition adds to a run (nothing, for a registry agent).
#[derive(Debug, Clone, Default)]
struct Launch {
    /// The definition's body.
    persona: Option<String>,
    /// acp-child takes the persona as `--persona FILE`; other agents get it before the task.
    persona_flag: bool,
    permission: Option<SubagentPermission>,
    env: Vec<String>,
    timeout: Option<Duration>,
    max_depth: Option<u32>,
}

/// The subagents available to a session, and the definition files that could not be used.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) targets: Vec<Target>,
    /// One line per problem, naming the file (and field).
    pub(crate) problems: Vec<String>,
}

/// The enabled subagents and how they run; shared by every session of the connection.
#[derive(Debug)]
pub struct Subagents {
    /// The enabled registry agents.
    targets: Vec<Target>,
    dirs: Vec<PathBuf>,
    facts: HostFacts,
    budget: Option<Budget>,
    slots: Semaphore,
    permission: SubagentPermission,
    env: Vec<String>,
    timeout: Option<Duration>,
}

/// A child's result, as the model (or the offline reply) gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delegated {
    pub(crate) text: String,
    pub(crate) failed: bool,
}

impl Delegated {
    fn failed(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            failed: true,
        }
    }
}

impl Subagents {
    /// Resolves the enabled registry agents to their commands (found where `acp-host run` would
    /// find them).
    pub fn resolve(options: SubagentOptions) -> Result<Self, SubagentError> {
        let facts = HostFacts::from_env();
        let mut targets = Vec::new();
        for name in &options.agents {
            let spec = registry::find(name)
                .filter(|spec| spec.acp_command.is_some())
                .ok_or_else(|| SubagentError::Unknown {
                    name: name.clone(),
                    known: registry::names()
                        .into_iter()
                        .filter(|known| {
                            registry::find(known).is_some_and(|spec| spec.acp_command.is_some())
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            if targets.iter().any(|t: &Target| t.name == spec.name) {
                continue;
            }
            let resolved =
                agents::resolve(spec.name, &facts).map_err(|source| SubagentError::Resolve {
                    name: name.clone(),
                    source,
                })?;
            targets.push(Target {
                name: spec.name.to_owned(),
                description: spec.summary.to_owned(),
                command: resolved.command,
                launch: Launch::default(),
            });
        }
        let parallel = options
            .max_parallel
            .unwrap_or(DEFAULT_MAX_PARALLEL_SUBAGENTS);
        if parallel == 0 {
            return Err(SubagentError::NoParallelism);
        }
        Ok(Self {
            targets,
            dirs: options.dirs,
            facts,
            budget: options.budget,
            slots: Semaphore::new(parallel),
            permission: options.permission,
            env: options.env,
            timeout: options.timeout,
        })
    }

    /// Whether delegation is offered (the prompt face): some subagent is available and this
    /// agent is below the depth cap.
    pub(crate) fn offered(&self, catalog: &Catalog) -> bool {
        !catalog.targets.is_empty() && self.budget.is_some_and(Budget::may_delegate)
    }

    /// The enabled registry agents, then the definitions with a `run:` table found in
    /// `<cwd>/subagents/` and the `--subagents` folders (the first of a name wins). A file that
    /// cannot be used is a problem in the catalog (and a log line), never hides the others.
    pub(crate) fn catalog(&self, cwd: &Path) -> Catalog {
        let mut catalog = Catalog {
            targets: self.targets.clone(),
            problems: Vec::new(),
        };
        let local = cwd.join(definition_dir());
        let dirs =
            std::iter::once((local, false)).chain(self.dirs.iter().map(|d| (d.clone(), true)));
        for (dir, explicit) in dirs {
            if !explicit && !dir.is_dir() {
                continue;
            }
            let entries = match acp_host::sync_exec::read_source(&dir) {
                Ok(entries) => entries,
                Err(error) => {
                    catalog.problems.push(crate::describe(&error));
                    continue;
                }
            };
            for entry in entries {
                let file = entry.name().to_owned();
                if definition::IGNORED_ENTRIES.contains(&file.as_str()) {
                    continue;
                }
                let located = |message: String| format!("{}: {message}", dir.join(&file).display());
                let definition = match entry {
                    SourceEntry::File { name, contents } => definition::parse(&name, &contents),
                    SourceEntry::Symlink { .. } => Err(Problem::Symlink),
                    SourceEntry::Folder { .. } => Err(Problem::Folder),
                    SourceEntry::Other { .. } => Err(Problem::NotAFile),
                };
                let definition = match definition {
                    Ok(definition) => definition,
                    Err(problem) => {
                        catalog.problems.push(located(problem.to_string()));
                        continue;
                    }
                };
                // A sync-only definition says nothing about running it out of process.
                let Some(run) = definition.run.clone() else {
                    continue;
                };
                if catalog.targets.iter().any(|t| t.name == definition.name) {
                    catalog.problems.push(located(format!(
                        "subagent `{}` is already defined earlier (registry agents, then <cwd>/subagents, then --subagents in order); rename one",
                        definition.name
                    )));
                    continue;
                }
                match self.definition_target(definition, &run) {
                    Ok(target) => catalog.targets.push(target),
                    Err(message) => catalog.problems.push(located(message)),
                }
            }
        }
        for problem in &catalog.problems {
            tracing::warn!(%problem, "subagent definition not available");
        }
        catalog
    }

    /// How a definition runs, or why it cannot be honoured by this session.
    fn definition_target(&self, definition: Definition, run: &RunSpec) -> Result<Target, String> {
        let agent = run.agent.as_deref().unwrap_or(registry::ACP_CHILD);
        let resolved = agents::resolve(agent, &self.facts)
            .map_err(|error| format!("field `run.agent`: {}", crate::describe(&error)))?;
        let acp_child = resolved
            .spec
            .is_some_and(|spec| spec.name == registry::ACP_CHILD);
        let plan = definition::plan_run(run, agent, acp_child)?;
        let mut command = resolved.command;
        command.args.extend(plan.args);
        command.display.clone_from(&definition.name);
        Ok(Target {
            name: definition.name,
            description: definition.description,
            command,
            launch: Launch {
                persona: Some(definition.body),
                persona_flag: plan.persona == PersonaDelivery::Flag,
                permission: run.permission.map(|p| match p {
                    RunPermission::Relay => SubagentPermission::Relay,
                    RunPermission::Reject => SubagentPermission::Reject,
                    RunPermission::Allow => SubagentPermission::Allow,
                }),
                env: run.env.clone(),
                timeout: run.timeout.map(Duration::from_secs),
                max_depth: run.max_depth,
            },
        })
    }

    /// The environment the library reads this agent's standing from: its own, even when it was
    /// started by a person (no `ACP_HOST_DEPTH`), so its children run one deeper.
    fn ambient(&self) -> Vec<(OsString, OsString)> {
        let mut ambient: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(budget) = self.budget {
            ambient.retain(|(name, _)| name != ACP_HOST_DEPTH && name != ACP_HOST_MAX_DEPTH);
            ambient.extend(
                budget
                    .env()
                    .into_iter()
                    .map(|(name, value)| (name.into(), value.into())),
            );
        }
        ambient
    }

    /// The start request for `target`, the permission policy of its run, and the persona file
    /// that must outlive the run; `Err` when it cannot be started.
    fn request(
        &self,
        target: &Target,
        prompt: &str,
        cwd: &Path,
    ) -> Result<
        (
            StartRequest,
            SubagentPermission,
            Option<tempfile::NamedTempFile>,
        ),
        Delegated,
    > {
        let launch = &target.launch;
        let mut agent = target.command.clone();
        let mut prompt = prompt.to_owned();
        // Kept until the run ends: acp-child reads its persona file when it starts.
        let mut persona_file = None;
        if let Some(persona) = &launch.persona {
            if launch.persona_flag {
                match write_persona(persona) {
                    Ok(file) => {
                        agent.args.push("--persona".to_owned());
                        agent.args.push(file.path().display().to_string());
                        persona_file = Some(file);
                    }
                    Err(error) => {
                        return Err(Delegated::failed(format!(
                            "subagent {} was not started: cannot write its persona to a temporary file: {error}",
                            target.name
                        )));
                    }
                }
            } else {
                prompt = definition::prompt_with_persona(persona, &prompt);
            }
        }
        let permission = launch.permission.unwrap_or(self.permission);
        let mut env = self.env.clone();
        env.extend(launch.env.iter().filter(|n| !self.env.contains(n)).cloned());
        let request = StartRequest {
            agent,
            prompt,
            cwd: cwd.to_path_buf(),
            env: env.into_iter().map(EnvForward::Inherit).collect(),
            permission: match permission {
                SubagentPermission::Allow => PermissionPolicy::Allow,
                SubagentPermission::Reject | SubagentPermission::Relay => PermissionPolicy::Reject,
            },
            timeouts: Timeouts {
                overall: launch.timeout.or(self.timeout),
                ..Timeouts::default()
            },
            max_depth: launch.max_depth,
            resume: None,
        };
        Ok((request, permission, persona_file))
    }

    /// Runs subagent `name` on `prompt` for tool call `call` of `turn`, to its result.
    pub(crate) async fn run(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        name: &str,
        prompt: &str,
    ) -> Delegated {
        let catalog = self.catalog(turn.workspace().root());
        let Some(target) = catalog.targets.iter().find(|t| t.name == name) else {
            let names: Vec<&str> = catalog.targets.iter().map(|t| t.name.as_str()).collect();
            let mut text = if names.is_empty() {
                format!(
                    "unknown subagent {name:?}: none are available (enable registry agents with --subagent-agents, or add definitions with a `run:` table under subagents/)"
                )
            } else {
                format!(
                    "unknown subagent {name:?}; the subagents are: {}",
                    names.join(", ")
                )
            };
            for problem in &catalog.problems {
                let _ = write!(text, "\n{problem}");
            }
            return Delegated::failed(text);
        };
        let slot = tokio::select! {
            biased;
            () = turn.cancelled() => return Delegated::failed(CANCELLED),
            slot = self.slots.acquire() => slot,
        };
        let Ok(_slot) = slot else {
            return Delegated::failed("subagents are shutting down");
        };
        let (request, permission, _persona_file) =
            match self.request(target, prompt, turn.workspace().root()) {
                Ok(built) => built,
                Err(refused) => return refused,
            };
        let prepared = match run::prepare(request, self.ambient()) {
            Ok(prepared) => prepared,
            Err(error) => {
                return Delegated::failed(format!(
                    "subagent {name} was not started: {}",
                    crate::describe(&error)
                ));
            }
        };
        let (text_tx, mut text_rx) = mpsc::unbounded_channel();
        let (ask_tx, mut ask_rx) = mpsc::unbounded_channel();
        let options = RunOptions {
            observers: vec![Arc::new(Streamed { text: text_tx }) as Arc<dyn Observer>],
            permissions: (permission == SubagentPermission::Relay)
                .then(|| Arc::new(Relay { asks: ask_tx }) as Arc<dyn PermissionHandler>),
            ..RunOptions::default()
        };
        let cancel = Cancel::new();
        let child = run::run(prepared, &options, &cancel);
        tokio::pin!(child);
        let mut shown = String::new();
        let mut relays = FuturesUnordered::new();
        let result = loop {
            tokio::select! {
                biased;
                result = &mut child => break result,
                () = turn.cancelled(), if !cancel.is_cancelled() => cancel.cancel(),
                Some(()) = relays.next(), if !relays.is_empty() => {}
                Some((request, answer)) = ask_rx.recv() => {
                    relays.push(relay(turn, name, request, answer));
                }
                Some(text) = text_rx.recv() => {
                    push_bounded(&mut shown, &text);
                    let content = vec![ToolCallContent::from(shown.clone())];
                    if let Err(error) = turn.update_tool_call(call, ToolCallUpdateFields::new().content(content)) {
                        tracing::debug!(error = %crate::describe(&error), "cannot show a subagent's text");
                    }
                }
            }
        };
        if turn.is_cancelled() {
            return Delegated::failed(CANCELLED);
        }
        if result.status == Status::Completed {
            return Delegated {
                text: result.output,
                failed: false,
            };
        }
        ended(name, &result)
    }
}

/// A child's result when it did not complete: its status, stop reason and error, then its
/// output so far.
fn ended(name: &str, result: &RunResult) -> Delegated {
    let mut text = format!("subagent {name} ended {}", result.status);
    if let Some(reason) = &result.stop_reason {
        let _ = write!(text, " (stop reason {reason})");
    }
    if let Some(error) = &result.error {
        let _ = write!(text, ": {error}");
    }
    if !result.output.is_empty() {
        text.push_str("\n\nIts output so far:\n");
        text.push_str(&result.output);
    }
    Delegated::failed(text)
}

/// Where definitions live inside a session directory.
fn definition_dir() -> &'static str {
    "subagents"
}

/// The persona, in a private temporary file for acp-child's `--persona`.
fn write_persona(persona: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::Builder::new()
        .prefix("acp-child-persona-")
        .suffix(".md")
        .tempfile()?;
    std::io::Write::write_all(&mut file, persona.as_bytes())?;
    Ok(file)
}

/// Relays one child permission request to this agent's client and sends the decision back.
async fn relay(
    turn: &Turn,
    subagent: &str,
    request: PermissionRequest,
    answer: oneshot::Sender<Decision>,
) {
    let decision = permission::relay(turn, subagent, &request).await;
    // The child's run may have ended meanwhile; nobody waits for the answer then.
    let _ = answer.send(decision);
}

/// Appends `text`, keeping at most [`SHOWN_BYTES`] (the tail, cut at a character boundary).
fn push_bounded(shown: &mut String, text: &str) {
    shown.push_str(text);
    if shown.len() > SHOWN_BYTES {
        let mut cut = shown.len() - SHOWN_BYTES;
        while !shown.is_char_boundary(cut) {
            cut += 1;
        }
        shown.replace_range(..cut, "");
    }
}

/// Forwards the child's message text to the tool call that runs it.
struct Streamed {
    text: mpsc::UnboundedSender<String>,
}

impl Observer for Streamed {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        if let Event::Update { update, .. } = event
            && update.get("sessionUpdate").and_then(|v| v.as_str()) == Some("agent_message_chunk")
            && let Some(text) = update.pointer("/content/text").and_then(|v| v.as_str())
        {
            // The receiver is gone only once the call has its result.
            let _ = self.text.send(text.to_owned());
        }
        Ok(())
    }
}

/// Hands the child's permission requests to the call's loop, which asks the parent's client.
struct Relay {
    asks: mpsc::UnboundedSender<(PermissionRequest, oneshot::Sender<Decision>)>,
}

impl PermissionHandler for Relay {
    fn decide(&self, request: PermissionRequest) -> DecisionFuture {
        let (tx, rx) = oneshot::channel();
        let sent = self.asks.send((request, tx)).is_ok();
        Box::pin(async move {
            match (sent, rx.await) {
                (true, Ok(decision)) => decision,
                // Nobody left to ask: not an approval.
                _ => Decision {
                    answer: Answer::Cancelled,
                    decided_by: DecidedBy::Cancel,
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shown_text_keeps_the_tail_at_a_char_boundary() {
        let mut shown = String::new();
        push_bounded(&mut shown, "héllo ");
        assert_eq!(shown, "héllo ");
        push_bounded(&mut shown, &"é".repeat(SHOWN_BYTES));
        assert!(shown.len() <= SHOWN_BYTES);
        assert!(shown.chars().all(|c| c == 'é'));
    }

    #[test]
    fn only_registry_acp_agents_can_be_enabled() {
        let error = Subagents::resolve(SubagentOptions {
            agents: vec!["rm -rf /".into()],
            ..SubagentOptions::default()
        })
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--subagent-agents: \"rm -rf /\" is not a registry agent")
        );
        let subagents = Subagents::resolve(SubagentOptions {
            agents: vec!["acp-child".into(), "acp-child".into()],
            budget: Some(Budget {
                depth: 1,
                max_depth: 1,
            }),
            ..SubagentOptions::default()
        })
        .unwrap();
        let catalog = subagents.catalog(Path::new("/nonexistent"));
        assert_eq!(catalog.targets.len(), 1);
        assert!(
            !subagents.offered(&catalog),
            "at the cap, delegation is not offered"
        );
    }
}
