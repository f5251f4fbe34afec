//! Delegation: running a subagent (any ACP agent, acp-child itself included) as a separate
//! process through acp-host's run library, for the model's `subagent` tool and the offline
//! `/delegate` command alike.
//!
//! Invariants:
//! - the subagents are the registry agents the user enabled (`--subagent-agents`), then the
//!   definitions with a `run:` table in `<session cwd>/subagents/` and the `--subagents` folders
//!   ([`Subagents::catalog`], read at each use; a bad file is a noted problem, never fatal, and
//!   never hides the others); a model or a prompt never names a command line;
//! - a definition asks its agent for a persona, model and tool filter
//!   (`protocol::definition::RunSpec::wants`, as `acp-host run --subagent` does); the run library
//!   honours them or refuses the run before the prompt, never ignores them;
//! - a child runs at this agent's depth + 1 (`protocol::depth`): the ambient environment handed to
//!   the library carries this agent's own standing, so a child past the cap is refused by the one
//!   rule in acp-host (execution face); [`Subagents::offered`] is the prompt face;
//! - a child gets the scrubbed environment plus only the names `--subagent-env` and its
//!   definition's `env` forward;
//! - at most `--max-parallel-subagents` turns of children run at once (a semaphore,
//!   [`Subagents::slot`]: a first turn and a `send_message` turn alike hold a slot while they run,
//!   an idle child none; waiting for a slot observes the turn's cancellation);
//! - every failure (unknown name, spawn error, crash, timeout, refusal, cancellation) is a
//!   [`Delegated`] result with `failed` set, never an error of the parent's turn;
//! - a child is a kept session of the run library ([`LiveChild`]) from its first turn on; its
//!   observer and permission handler send what its run observes where its [`Route`] points: to
//!   the turn in flight that shows it, installed by that turn before the turn starts and cleared
//!   once it answered (the library hands a turn's result over only once its observers saw that
//!   turn's updates, so each turn is delivered whole); with no turn installed (a background
//!   child's first turn, a child idle between turns) its updates are dropped and its permission
//!   requests answered by the policy (`relay` rejects);
//! - one path ([`LiveChild::drive`]) runs every turn shown somewhere: a foreground first turn
//!   ([`Subagents::run`]) and a `send_message` turn ([`Subagents::send`]) alike;
//! - when the client advertised `subagents`, each such turn is a session of its own
//!   ([`Exposure`]): an id minted on this connection (never the child agent's own; a new one per
//!   turn, so each announced session gets exactly one final state), announced with a
//!   `subagent_update` on the turn's session (name, task, `capabilities.cancel`, `running`)
//!   before anything else of it; then its updates go out under that id, its permission requests
//!   are asked on it, and exactly one final `subagent_update` (`idle` with the stop reason,
//!   `protocol::child_session`) follows once the turn answered, every update of it was relayed
//!   and every request of it was resolved (a request still pending is withdrawn first). A
//!   child's own children (it announces them to us: acp-host's library speaks subagent sessions)
//!   are relayed the same way, each under an id minted here and announced on its parent's minted
//!   id; one the child never ended is reported `unknown` (its outcome is lost with the turn).
//!   `session/cancel` naming the child's session cancels the child (its own children go with
//!   it); a session it announces is offered `cancel` when the child offered it, and
//!   `session/cancel` naming it is forwarded to the child (through the run library's
//!   `Cancel::cancel_session`), ending that session only;
//! - otherwise the child's streamed text reaches the parent's client as the tool call's content,
//!   bounded to the last [`SHOWN_BYTES`], and its own children stay hidden;
//! - its permission requests are relayed to the parent's client (`relay`, through
//!   `backend::permission::relay`) or answered by policy (`reject`, `allow`);
//! - the parent turn's `session/cancel` cancels the child of every turn it shows (session/cancel,
//!   then the teardown ladder: a cancelled turn ends its child) and the call then waits for the
//!   turn's result, so no child of a cancelled turn outlives it;
//! - a start is validated whole ([`Subagents::preflight`]: name, definition, cwd, environment,
//!   schema) before anything is registered or spawned; a background child runs detached
//!   ([`Subagents::run_detached`]) under a [`Cancel`] its owner (the session's `backend::tasks`)
//!   holds;
//! - with `--child-idle-timeout`, a child that answered (completed) its first turn stays alive,
//!   idle, foreground or background alike (the caller keeps it in the session's table), and a
//!   message goes to its process; it ends on its own after the idle timeout. Otherwise, and for
//!   the offline `/delegate` (one-shot: no table of children there), its session ends with its
//!   first turn and its process is gone before the call returns. A message to a child whose
//!   process is gone is a cold resume (`StartRequest::resume`: `session/load` of its session in
//!   a fresh process), and one whose agent cannot load sessions is a clear result, not a
//!   protocol error;
//! - a message has no output schema: its answer is plain text.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acp_host::agents::{self, HostFacts};
use acp_host::permission::{Decision, DecisionFuture, PermissionHandler};
use acp_host::run::{self, Cancel, Observer, ObserverError, RunOptions};
use std::collections::HashMap;

use acp_host::definitions;
use acp_host::trust::TrustStore;
use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RunningStateUpdate, SessionCancelCapabilities,
    SessionId, SessionReference, SessionUpdate, StateUpdate, SubagentSessionCapabilities,
    SubagentUpdate, ToolCallContent, ToolCallId, ToolCallUpdateFields, ToolKind,
};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use protocol::capabilities::Wants;
use protocol::child_session::ChildState;
use protocol::definition::{Definition, RunPermission, RunSpec};
use protocol::depth::Budget;
use protocol::env_scrub::{EnvForward, Redactor};
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use protocol::events::Event;
use protocol::permission::{Answer, DecidedBy, PermissionPolicy, PermissionRequest};
use protocol::registry;
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::result::{ErrorKind, RunResult, Status};
use protocol::structured::{DEFAULT_SCHEMA_RETRIES, OutputSpec};
use protocol::trust::{self, Digest, Source, TrustState};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::Turn;
use super::model::tools::CANCELLED;
use super::permission::{self, Via};
use crate::session::{CancellableChild, ChildSessions};

/// How a subagent's tool call is shown: the kind ACP agents give delegated work.
pub(crate) const KIND: ToolKind = ToolKind::Think;

/// The title of a subagent's tool call: the subagent's name and [`label`].
pub(crate) fn title(name: &str, description: Option<&str>, prompt: &str) -> String {
    format!("Subagent {name}: {}", label(description, prompt))
}

/// What a child is doing, in a few words: the short label (else the prompt's first line, cut).
/// Also the task its session is announced with.
pub(crate) fn label(description: Option<&str>, prompt: &str) -> String {
    let label = description
        .map(str::trim)
        .filter(|label| !label.is_empty())
        .unwrap_or_else(|| prompt.lines().next().unwrap_or("").trim());
    if label.chars().count() > 60 {
        label.chars().take(59).chain(['…']).collect()
    } else {
        label.to_owned()
    }
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

impl SubagentPermission {
    fn as_str(self) -> &'static str {
        RunPermission::from(self).as_str()
    }
}

impl From<RunPermission> for SubagentPermission {
    fn from(permission: RunPermission) -> Self {
        match permission {
            RunPermission::Relay => Self::Relay,
            RunPermission::Reject => Self::Reject,
            RunPermission::Allow => Self::Allow,
        }
    }
}

impl From<SubagentPermission> for RunPermission {
    fn from(permission: SubagentPermission) -> Self {
        match permission {
            SubagentPermission::Relay => Self::Relay,
            SubagentPermission::Reject => Self::Reject,
            SubagentPermission::Allow => Self::Allow,
        }
    }
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
    /// `--no-background`: no `run_in_background` (left out of the schema, refused if sent).
    pub no_background: bool,
    /// `--child-idle-timeout`: how long a child that answered (foreground or background) stays
    /// alive for a `send_message`; zero ends every child with its run.
    pub child_idle_timeout: Duration,
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
    /// Where it was found, which decides whether it starts unasked (`protocol::trust`).
    pub(crate) source: Source,
    /// Its definition file and content (none for a registry agent).
    origin: Option<Origin>,
}

/// A definition's file and the digest of the content it was parsed from.
#[derive(Debug, Clone)]
struct Origin {
    file: PathBuf,
    digest: Digest,
}

impl Target {
    /// Whether it starts without asking the person: from a source they named, or a repository
    /// definition whose exact content they approved always.
    pub(crate) fn trust(&self, store: Option<&TrustStore>) -> TrustState {
        match (&self.origin, self.source) {
            (_, source) if source.trusted() => TrustState::Trusted,
            (Some(origin), _) => store.map_or(TrustState::NotApproved, |store| {
                store.state(&origin.file, &origin.digest)
            }),
            (None, _) => TrustState::NotApproved,
        }
    }
}

/// What a definition adds to a run (nothing, for a registry agent).
#[derive(Debug, Clone, Default)]
struct Launch {
    /// Its persona (the body), model and tool filter.
    wants: Wants,
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
    /// Where "allow always" approvals of repository definitions are kept; `None` when this user
    /// has no state directory (then an approval holds for one start).
    trust: Option<TrustStore>,
    env: Vec<String>,
    timeout: Option<Duration>,
    background: bool,
    idle_timeout: Option<Duration>,
}

/// A child's result, as the model (or the offline reply) gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delegated {
    pub(crate) text: String,
    pub(crate) failed: bool,
    /// The ACP session id the child's agent reported (to continue it later).
    pub(crate) session: Option<String>,
}

impl Delegated {
    pub(crate) fn failed(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            failed: true,
            session: None,
        }
    }
}

/// A start that passed validation (and, for a repository definition, the person's approval):
/// ready to run, nothing spawned yet.
pub(crate) struct Start {
    pub(crate) name: String,
    prepared: run::Prepared,
    permission: SubagentPermission,
    /// It continues a child's saved session.
    resume: bool,
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
                source: Source::Registry,
                origin: None,
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
            trust: TrustStore::from_env()
                .inspect_err(|error| {
                    tracing::warn!(
                        error = %crate::describe(error),
                        "approvals of subagent definitions hold for one start only"
                    );
                })
                .ok(),
            env: options.env,
            timeout: options.timeout,
            background: !options.no_background,
            idle_timeout: (!options.child_idle_timeout.is_zero())
                .then_some(options.child_idle_timeout),
        })
    }

    /// Whether starting `target` asks the person first (a repository definition not approved
    /// for its content).
    pub(crate) fn needs_approval(&self, target: &Target) -> bool {
        !target.trust(self.trust.as_ref()).may_start()
    }

    /// Whether children may run in the background (`run_in_background`).
    pub(crate) fn background(&self) -> bool {
        self.background
    }

    /// Whether delegation is offered (the prompt face): some subagent is available and this
    /// agent is below the depth cap.
    pub(crate) fn offered(&self, catalog: &Catalog) -> bool {
        !catalog.targets.is_empty() && self.budget.is_some_and(Budget::may_delegate)
    }

    /// The enabled registry agents, then the definitions with a `run:` table found in
    /// `<cwd>/subagents/` (repository content) and the `--subagents` folders (named by the
    /// person), the first of a name winning. A file that cannot be used is a problem in the
    /// catalog (and a log line), never hides the others.
    pub(crate) fn catalog(&self, cwd: &Path) -> Catalog {
        let mut catalog = Catalog {
            targets: self.targets.clone(),
            problems: Vec::new(),
        };
        let folders = std::iter::once((definitions::repository_folder(cwd), Source::Repository))
            .chain(self.dirs.iter().map(|dir| (dir.clone(), Source::Folder)));
        for (dir, source) in folders {
            let folder = definitions::read_folder(&dir, source, source == Source::Folder);
            catalog.problems.extend(folder.problems);
            for located in folder.definitions {
                let shown = dir.join(located.file.file_name().unwrap_or_default());
                let located_problem = |message: String| format!("{}: {message}", shown.display());
                // A sync-only definition says nothing about running it out of process.
                let Some(run) = located.definition.run.clone() else {
                    continue;
                };
                if catalog
                    .targets
                    .iter()
                    .any(|t| t.name == located.definition.name)
                {
                    catalog.problems.push(located_problem(format!(
                        "subagent `{}` is already defined earlier (registry agents, then <cwd>/subagents, then --subagents in order); rename one",
                        located.definition.name
                    )));
                    continue;
                }
                let origin = Origin {
                    file: located.file,
                    digest: located.digest,
                };
                match self.definition_target(located.definition, &run, source, origin) {
                    Ok(target) => catalog.targets.push(target),
                    Err(message) => catalog.problems.push(located_problem(message)),
                }
            }
        }
        for problem in &catalog.problems {
            tracing::warn!(%problem, "subagent definition not available");
        }
        catalog
    }

    /// How a definition runs, or why it cannot be honoured by this session.
    fn definition_target(
        &self,
        definition: Definition,
        run: &RunSpec,
        source: Source,
        origin: Origin,
    ) -> Result<Target, String> {
        let agent = run.agent.as_deref().unwrap_or(registry::ACP_CHILD);
        let resolved = agents::resolve(agent, &self.facts)
            .map_err(|error| format!("field `run.agent`: {}", crate::describe(&error)))?;
        let mut command = resolved.command;
        command.display.clone_from(&definition.name);
        let wants = run.wants(&definition.body);
        command
            .args
            .extend(protocol::capabilities::launch_args(&wants, resolved.spec));
        Ok(Target {
            name: definition.name,
            description: definition.description,
            command,
            launch: Launch {
                wants,
                permission: run.permission.map(SubagentPermission::from),
                env: run.env.clone(),
                timeout: run.timeout.map(Duration::from_secs),
                max_depth: run.max_depth,
            },
            source,
            origin: Some(origin),
        })
    }

    /// The environment the library reads this agent's standing from: its own, even when it was
    /// started by a person (no `ACP_HOST_DEPTH`), so its children run one deeper; the cap lowered
    /// to the session's own (`cap`, the start extension's `maxDepth`).
    fn ambient(&self, cap: Option<u32>) -> Vec<(OsString, OsString)> {
        let mut ambient: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(budget) = self.budget.map(|budget| budget.lowered(cap)) {
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

    /// The start request for `target` and the permission policy of its run.
    fn request(
        &self,
        target: &Target,
        prompt: &str,
        cwd: &Path,
        output_schema: Option<&serde_json::Value>,
        resume: Option<String>,
    ) -> (StartRequest, SubagentPermission) {
        let launch = &target.launch;
        let permission = match (launch.permission, target.source) {
            // A repository definition only lowers what its child may do, never raises it.
            (Some(asked), Source::Repository) => {
                SubagentPermission::from(trust::cap(asked.into(), self.permission.into()))
            }
            (asked, _) => asked.unwrap_or(self.permission),
        };
        let mut env = self.env.clone();
        env.extend(launch.env.iter().filter(|n| !self.env.contains(n)).cloned());
        let request = StartRequest {
            agent: target.command.clone(),
            prompt: prompt.to_owned(),
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
            wants: Wants {
                output: output_schema.map(|schema| OutputSpec {
                    schema: schema.clone(),
                    retries: DEFAULT_SCHEMA_RETRIES,
                }),
                ..launch.wants.clone()
            },
            resume,
        };
        (request, permission)
    }

    /// Validates a start of subagent `name` on `prompt` for tool call `call` of `turn`'s session
    /// (in its directory, under its depth cap; with `output_schema`, the answer must match it;
    /// with `resume`, the child's saved session is continued): everything that can fail before a
    /// process exists, the person's approval of a repository definition last ([`approve`]).
    /// `Err` is the call's result.
    pub(crate) async fn preflight(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        name: &str,
        prompt: &str,
        output_schema: Option<&serde_json::Value>,
        resume: Option<String>,
    ) -> Result<Start, Delegated> {
        let cwd = turn.workspace().root();
        let catalog = self.catalog(cwd);
        let Some(target) = catalog.targets.iter().find(|t| t.name == name) else {
            return Err(unknown(name, &catalog));
        };
        let resuming = resume.is_some();
        let (request, permission) = self.request(target, prompt, cwd, output_schema, resume);
        let asking = Asking::of(target, &request, permission);
        let cap = turn.memory().settings().max_depth;
        let prepared = run::prepare(request, self.ambient(cap)).map_err(|error| {
            Delegated::failed(format!(
                "subagent {name} was not started: {}",
                crate::describe(&error)
            ))
        })?;
        if !target.trust(self.trust.as_ref()).may_start() {
            approve(turn, call, name, &asking, self.trust.as_ref()).await?;
        }
        Ok(Start {
            name: name.to_owned(),
            prepared,
            permission,
            resume: resuming,
        })
    }

    /// Holds one of the `--max-parallel-subagents` slots, unless `cancelled` completes first:
    /// every turn of a child (its first, a message) holds one while it runs; an idle child holds
    /// none. `Err` is the call's result.
    async fn slot(
        &self,
        cancelled: impl Future<Output = ()>,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, Delegated> {
        tokio::select! {
            biased;
            () = cancelled => Err(Delegated::failed(CANCELLED)),
            slot = self.slots.acquire() => {
                slot.map_err(|_| Delegated::failed("subagents are shutting down"))
            }
        }
    }

    /// A child for validated start `start`, not spawned yet, and its first turn's result:
    /// awaiting the future spawns it (so a turn shown somewhere installs its route first). With
    /// `keep` and an idle timeout its kept session waits for messages after that turn; otherwise
    /// it ends as soon as its first turn answered.
    fn spawn(
        &self,
        start: Start,
        cancel: Cancel,
        keep: bool,
    ) -> (
        Arc<LiveChild>,
        impl Future<Output = Option<RunResult>> + Send + 'static,
    ) {
        let Start {
            name,
            prepared,
            permission,
            resume: _,
        } = start;
        let route = Arc::new(Route::default());
        let redactor = Arc::new(prepared.redactor().clone());
        let options = RunOptions {
            observers: vec![Arc::new(Forwarded {
                route: Arc::clone(&route),
                redactor: Arc::clone(&redactor),
            }) as Arc<dyn Observer>],
            permissions: (permission == SubagentPermission::Relay).then(|| {
                Arc::new(Relay {
                    route: Arc::clone(&route),
                    redactor: Arc::clone(&redactor),
                }) as Arc<dyn PermissionHandler>
            }),
            ..RunOptions::default()
        };
        let (first, first_rx) = oneshot::channel();
        let (follow_ups, follow_ups_rx) = mpsc::channel(1);
        let session = run::Session {
            first,
            follow_ups: follow_ups_rx,
            // Not kept: no message can come in no time, so the session ends with its first turn.
            idle_timeout: Some(self.idle_timeout.filter(|_| keep).unwrap_or(Duration::ZERO)),
        };
        let live = Arc::new(LiveChild {
            name,
            follow_ups,
            cancel: cancel.clone(),
            route,
            redactor,
            handle: std::sync::Mutex::new(None),
        });
        let first = {
            let live = Arc::clone(&live);
            async move {
                let handle = tokio::spawn(async move {
                    run::run_session(prepared, &options, &cancel, session).await
                });
                *live
                    .handle
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(handle);
                first_rx.await.ok()
            }
        };
        (live, first)
    }

    /// What a first turn leaves: its result for the call, and the child when it stays alive
    /// (`keep`, the turn completed, the session still open); otherwise the child is closed (its
    /// process gone) before this returns.
    async fn settle(
        live: Arc<LiveChild>,
        result: Option<RunResult>,
        resume: bool,
        keep: bool,
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let Some(result) = result else {
            live.close().await;
            return (live.abnormal(), None);
        };
        let completed = result.status == Status::Completed;
        let delegated = live.redacted(outcome(&live.name, result, resume));
        if keep && completed && live.is_open() {
            (delegated, Some(live))
        } else {
            live.close().await;
            (delegated, None)
        }
    }

    /// Runs a validated start with nobody to ask (a background task): no route is installed, so
    /// its permission requests are answered by policy (`relay` rejects: the turn that could ask
    /// may be over) and nothing of it is shown; `cancel` stops it. With an idle timeout, a child
    /// that answered its turn stays alive for further messages ([`LiveChild`]); otherwise, or
    /// when its turn did not complete, its process is gone when this returns.
    pub(crate) async fn run_detached(
        &self,
        start: Start,
        cancel: Cancel,
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let _slot = match self.slot(cancel.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return (refused, None),
        };
        let resume = start.resume;
        let keep = self.idle_timeout.is_some();
        let (live, first) = self.spawn(start, cancel, keep);
        let result = first.await;
        Self::settle(live, result, resume, keep).await
    }

    /// Runs a validated start (`start`, labelled `description`, on `prompt`) for tool call `call`
    /// of `turn`, to its result ([`LiveChild::drive`] shows it); with an output schema, the
    /// result is the child's checked JSON answer. With `keep` (and an idle timeout), a child that
    /// answered stays alive, idle, and is returned; otherwise its process is gone when this
    /// returns, as it is when the turn was cancelled.
    pub(crate) async fn run(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        start: Start,
        prompt: &str,
        description: Option<&str>,
        keep: bool,
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let _slot = match self.slot(turn.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return (refused, None),
        };
        let resume = start.resume;
        let keep = keep && self.idle_timeout.is_some();
        let (live, first) = self.spawn(start, Cancel::new(), keep);
        let shown = Shown {
            turn,
            call,
            task: label(description, prompt),
        };
        let result = live.drive(&shown, first).await;
        if turn.is_cancelled() {
            live.close().await;
            return (cancelled(result.as_ref()), None);
        }
        Self::settle(live, result, resume, keep).await
    }

    /// Delivers `message` to a child kept alive (`live`) as its next turn, shown on tool call
    /// `call` of `turn` exactly like a first turn ([`LiveChild::drive`]): its updates shown or
    /// relayed, its permission requests relayed, a new announced session when the client speaks
    /// subagent sessions, the turn's cancellation honoured (which ends the child). `None` when it
    /// no longer takes messages (then nothing was sent). A follow-up has no output schema: its
    /// answer is plain text.
    pub(crate) async fn send(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        live: &LiveChild,
        message: &str,
    ) -> Option<Delegated> {
        let _slot = match self.slot(turn.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return Some(refused),
        };
        let permit = live.follow_ups.reserve().await.ok()?;
        let (reply, answer) = oneshot::channel();
        let follow_up = run::FollowUp {
            prompt: message.to_owned(),
            reply,
        };
        let answer = async move {
            permit.send(follow_up);
            answer.await.ok()
        };
        let shown = Shown {
            turn,
            call,
            task: label(None, message),
        };
        let result = live.drive(&shown, answer).await;
        if turn.is_cancelled() {
            return Some(cancelled(result.as_ref()));
        }
        Some(match result {
            Some(result) => live.redacted(outcome(&live.name, result, false)),
            None => live.abnormal(),
        })
    }
}

/// What the person is shown before a repository definition's child starts: everything the start
/// would hand the definition.
struct Asking {
    file: PathBuf,
    digest: Option<Digest>,
    /// The whole command line, quoted as a shell would read it.
    command: String,
    /// Every variable forwarded (names; `--subagent-env`'s and the definition's).
    env: Vec<String>,
    permission: SubagentPermission,
}

impl Asking {
    fn of(target: &Target, request: &StartRequest, permission: SubagentPermission) -> Self {
        Self {
            file: target
                .origin
                .as_ref()
                .map(|origin| origin.file.clone())
                .unwrap_or_default(),
            digest: target.origin.as_ref().map(|origin| origin.digest.clone()),
            command: target.command.command_line(),
            env: request
                .env
                .iter()
                .map(|forward| forward.name().to_owned())
                .collect(),
            permission,
        }
    }

    /// The refusal when the person did not approve.
    fn refused(&self, name: &str, why: &str) -> Delegated {
        Delegated::failed(format!(
            "subagent {name} needs your approval to run {}{why}; nothing was started. Approve it \
             when asked, or from a shell: acp-host trust --approve {}",
            self.command,
            self.file.display()
        ))
    }
}

/// Asks the person (this agent's client, `session/request_permission` of kind `execute` on tool
/// call `call`) whether repository definition `name` may start, showing its file, command line,
/// forwarded variables and permission policy. "Allow always" is remembered in `store` for this
/// exact content. `Err` is the call's result: rejected, dismissed, unanswerable or cancelled.
async fn approve(
    turn: &Turn,
    call: &ToolCallId,
    name: &str,
    asking: &Asking,
    store: Option<&TrustStore>,
) -> Result<(), Delegated> {
    let env = if asking.env.is_empty() {
        "no variables".to_owned()
    } else {
        asking.env.join(", ")
    };
    let permission = SubagentPermission::as_str(asking.permission);
    let text = format!(
        "Subagent {name} is defined in {file}, a file of this folder (not one you named). \
         Starting it runs:\n\n    {command}\n\nforwarding {env}; its own permission requests: \
         {permission}.",
        file = asking.file.display(),
        command = asking.command,
    );
    let fields = ToolCallUpdateFields::new()
        .title(format!("Start subagent {name}: {}", asking.command))
        .kind(ToolKind::Execute)
        .content(vec![ToolCallContent::from(text)])
        .raw_input(serde_json::json!({
            "definition": asking.file,
            "command": asking.command,
            "env": asking.env,
            "permission": permission,
        }));
    let options = vec![
        PermissionOption::new(
            permission::ALLOW_ONCE,
            "Allow once",
            PermissionOptionKind::AllowOnce,
        ),
        PermissionOption::new(
            permission::ALLOW_ALWAYS,
            "Allow always (until the file changes)",
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(
            permission::REJECT_ONCE,
            "Reject",
            PermissionOptionKind::RejectOnce,
        ),
    ];
    let answer = match turn.request_permission(call, fields, options).await {
        Ok(answer) => answer,
        Err(error) => {
            return Err(
                asking.refused(name, &format!(" (cannot ask: {})", crate::describe(&error)))
            );
        }
    };
    if turn.is_cancelled() {
        return Err(Delegated::failed(CANCELLED));
    }
    match answer {
        permission::Answer::Selected(option) if option == permission::ALLOW_ONCE => Ok(()),
        permission::Answer::Selected(option) if option == permission::ALLOW_ALWAYS => {
            if let (Some(store), Some(digest)) = (store, &asking.digest) {
                if let Err(error) = store.approve(&asking.file, digest) {
                    tracing::warn!(
                        error = %crate::describe(&error),
                        "the approval holds for this start only"
                    );
                }
            } else {
                tracing::warn!("no state directory: the approval holds for this start only");
            }
            Ok(())
        }
        permission::Answer::TurnCancelled => Err(Delegated::failed(CANCELLED)),
        permission::Answer::ClientError(error) => Err(asking.refused(
            name,
            &format!(" (the client answered the request with an error: {error})"),
        )),
        permission::Answer::Selected(_) | permission::Answer::Dismissed => {
            Err(asking.refused(name, ""))
        }
    }
}

/// The result of a call whose turn was cancelled (with the child's session, to continue it).
fn cancelled(result: Option<&RunResult>) -> Delegated {
    Delegated {
        session: result.and_then(|result| result.session_id.clone()),
        ..Delegated::failed(CANCELLED)
    }
}

/// The parent turn a turn of a child is shown on: its tool call, and the task the child's
/// session is announced with.
struct Shown<'a> {
    turn: &'a Turn,
    call: &'a ToolCallId,
    task: String,
}

/// A child's process and its kept session of the run library, from its first turn on. Between
/// turns it is idle and ends on its own after the idle timeout; [`LiveChild::close`] ends it at
/// once and waits until its process is gone. What its run observes goes where its [`Route`]
/// points: to the turn in flight ([`LiveChild::drive`]), or nowhere.
#[derive(Debug)]
pub(crate) struct LiveChild {
    name: String,
    follow_ups: mpsc::Sender<run::FollowUp>,
    cancel: Cancel,
    route: Arc<Route>,
    /// The credential values this agent handed the child (and those withheld from it): a child
    /// that echoes one never gets it past this agent ([`LiveChild::redacted`], [`Forwarded`],
    /// [`Relay`]).
    redactor: Arc<Redactor>,
    /// Set once its run is spawned.
    handle: std::sync::Mutex<Option<tokio::task::JoinHandle<RunResult>>>,
}

impl LiveChild {
    /// Whether it still takes messages (not ended by its idle timeout, a failure or a close).
    pub(crate) fn is_open(&self) -> bool {
        !self.follow_ups.is_closed()
    }

    /// Drives one turn of it (its first, or a message) whose result `answer` brings, shown on
    /// `shown`: the one path of every turn shown somewhere. The route is installed before
    /// `answer` is first polled (which starts the turn) and cleared once it answered; meanwhile
    /// its updates are relayed on its announced session (the client speaks subagent sessions) or
    /// its text shown on the tool card, its permission requests relayed, and the turn's (or the
    /// announced session's) cancellation cancels the child. Once it answered, the updates it
    /// sent before its answer are delivered, pending requests are withdrawn and resolved, then
    /// the announced session's one final state goes out.
    async fn drive(
        &self,
        shown: &Shown<'_>,
        answer: impl Future<Output = Option<RunResult>>,
    ) -> Option<RunResult> {
        let Shown { turn, call, task } = shown;
        let name = self.name.as_str();
        // Fired once the turn answered: relayed requests still pending are withdrawn.
        let turn_over = CancellationToken::new();
        let mut exposure = turn.child_sessions().map(|children| {
            let mut exposure = Exposure::announce(turn, children, call, name, task);
            exposure.run = Some((self.cancel.clone(), turn_over.clone()));
            exposure
        });
        let (updates, mut update_rx) = mpsc::unbounded_channel();
        let (asks, mut ask_rx) = mpsc::unbounded_channel();
        self.route.install(Routed {
            updates,
            all: exposure.is_some(),
            asks,
        });
        let mut text = String::new();
        let mut relays = FuturesUnordered::new();
        let exposed_cancel = exposure
            .as_ref()
            .map_or_else(CancellationToken::new, |e| e.child.cancellation().clone());
        tokio::pin!(answer);
        let result = loop {
            tokio::select! {
                biased;
                result = &mut answer => break result,
                () = turn.cancelled(), if !self.cancel.is_cancelled() => self.cancel.cancel(),
                () = exposed_cancel.cancelled(), if !self.cancel.is_cancelled() => self.cancel.cancel(),
                Some(()) = relays.next(), if !relays.is_empty() => {}
                Some((request, answer)) = ask_rx.recv() => {
                    // The updates already delivered first (the tool call asked about).
                    while let Ok((session, update)) = update_rx.try_recv() {
                        deliver(turn, call, exposure.as_mut(), &mut text, session.as_ref(), update);
                    }
                    let via = match &exposure {
                        Some(exposure) => exposure.via(&request, &turn_over),
                        None => Some(Via::Parent { subagent: name }),
                    };
                    relays.push(relay(turn, via, request, answer));
                }
                Some((session, update)) = update_rx.recv() => {
                    deliver(turn, call, exposure.as_mut(), &mut text, session.as_ref(), update);
                }
            }
        };
        // The run library hands a turn's result over only once its observers saw the turn's
        // updates: what is left of them is in the channel, which ends with the route.
        self.route.clear();
        turn_over.cancel();
        while relays.next().await.is_some() {}
        while let Some((session, update)) = update_rx.recv().await {
            deliver(
                turn,
                call,
                exposure.as_mut(),
                &mut text,
                session.as_ref(),
                update,
            );
        }
        if let Some(mut exposure) = exposure.take() {
            exposure.end(turn, result.as_ref());
        }
        result
    }

    /// `result` with the credential values this agent handed the child redacted.
    fn redacted(&self, mut result: Delegated) -> Delegated {
        result.text = self.redactor.redact(&result.text);
        result
    }

    /// The result of a turn whose answer never came (its run ended abnormally).
    fn abnormal(&self) -> Delegated {
        Delegated::failed(format!("subagent {} ended abnormally", self.name))
    }

    /// Ends it (session/cancel while a turn runs, then the teardown ladder) and waits until its
    /// process is gone.
    pub(crate) async fn close(&self) {
        self.cancel.cancel();
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(handle) = handle
            && let Err(error) = handle.await
        {
            tracing::warn!(%error, "a live child ended abnormally");
        }
    }

    /// Ends it without waiting (its run tears its process down on its own).
    pub(crate) fn cancel(&self) {
        self.cancel.cancel();
    }
}

/// Where a child's run sends what it observes: to the turn of it in flight that shows it, once
/// that turn installed itself, until it clears itself. With nothing installed (a background
/// child's first turn, a child idle between turns), updates are dropped and permission requests
/// are answered by the policy (`relay` rejects).
#[derive(Debug, Default)]
struct Route {
    to: std::sync::Mutex<Option<Routed>>,
}

/// The turn a [`Route`] points to.
#[derive(Debug)]
struct Routed {
    updates: mpsc::UnboundedSender<(Option<String>, serde_json::Value)>,
    /// Every update (the child is exposed as a session), else only the run's own text.
    all: bool,
    asks: mpsc::UnboundedSender<(PermissionRequest, oneshot::Sender<Decision>)>,
}

impl Route {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Routed>> {
        self.to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn install(&self, routed: Routed) {
        *self.lock() = Some(routed);
    }

    /// Points nowhere again; the turn's channels end once drained.
    fn clear(&self) {
        *self.lock() = None;
    }
}

/// A finished run as the call's result: the answer (the checked JSON with an output schema), or
/// how it ended.
fn outcome(name: &str, result: RunResult, resume: bool) -> Delegated {
    // A cold resume its agent refused before the prompt (no `loadSession`, or a start-time
    // capability it cannot honour): the library's message says why and names the agent.
    if resume
        && result.error_kind == Some(ErrorKind::Capability)
        && let Some(error) = &result.error
    {
        return Delegated::failed(format!("subagent {name} cannot be continued: {error}"));
    }
    if result.status == Status::Completed {
        return Delegated {
            text: result
                .structured
                .as_ref()
                .map_or(result.output, ToString::to_string),
            failed: false,
            session: result.session_id,
        };
    }
    Delegated {
        session: result.session_id.clone(),
        ..ended(name, &result)
    }
}

/// The result of a call naming no available subagent: what is available, and why some are not.
fn unknown(name: &str, catalog: &Catalog) -> Delegated {
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
    Delegated::failed(text)
}

/// One update of the child's run: relayed on its session when exposed, else shown on the card.
fn deliver(
    turn: &Turn,
    call: &ToolCallId,
    exposure: Option<&mut Exposure>,
    shown: &mut String,
    session: Option<&String>,
    update: serde_json::Value,
) {
    match exposure {
        Some(exposure) => exposure.relay(turn, session, update),
        None => show(turn, call, shown, session, &update),
    }
}

/// Without subagent sessions: the child's own text, shown (its tail) as the tool call's content.
fn show(
    turn: &Turn,
    call: &ToolCallId,
    shown: &mut String,
    session: Option<&String>,
    update: &serde_json::Value,
) {
    if session.is_some()
        || update.get("sessionUpdate").and_then(|v| v.as_str()) != Some("agent_message_chunk")
    {
        return;
    }
    let Some(text) = update.pointer("/content/text").and_then(|v| v.as_str()) else {
        return;
    };
    push_bounded(shown, text);
    let content = vec![ToolCallContent::from(shown.clone())];
    if let Err(error) = turn.update_tool_call(call, ToolCallUpdateFields::new().content(content)) {
        tracing::debug!(error = %crate::describe(&error), "cannot show a subagent's text");
    }
}

/// A child exposed as a session of its own, with the sessions it announced in turn.
struct Exposure {
    children: Arc<ChildSessions>,
    /// The child's session, cancellable by the client while this lives.
    child: CancellableChild,
    /// The child agent's ids of the sessions it announced -> the ids minted for them here.
    nested: HashMap<String, String>,
    /// Minted ids of nested sessions not ended yet, in announcement order, with the minted id of
    /// the session each was announced on.
    open: Vec<(String, String)>,
    /// Nested sessions the client may cancel (the child offered it), by minted id, while open.
    nested_cancellable: HashMap<String, CancellableChild>,
    /// The child's run and the token fired when this turn of it is over: a nested session's
    /// cancel is forwarded through the run (`Cancel::cancel_session`) until then.
    run: Option<(Cancel, CancellationToken)>,
}

impl Exposure {
    /// Mints the child's session and announces it on the turn's session; the tool call then
    /// references it.
    fn announce(
        turn: &Turn,
        children: &Arc<ChildSessions>,
        call: &ToolCallId,
        name: &str,
        task: &str,
    ) -> Self {
        let child = children.cancellable();
        let announce = SubagentUpdate::new(child.id().to_owned())
            .title(name.to_owned())
            .description(task.to_owned())
            .capabilities(
                SubagentSessionCapabilities::new().cancel(SessionCancelCapabilities::new()),
            )
            .state(StateUpdate::Running(RunningStateUpdate::new()));
        let announced = turn
            .notify_on(turn.session(), SessionUpdate::SubagentUpdate(announce))
            .and_then(|()| {
                turn.update_tool_call(
                    call,
                    ToolCallUpdateFields::new().content(vec![ToolCallContent::from(
                        SessionReference::new(child.id().to_owned()),
                    )]),
                )
            });
        if let Err(error) = announced {
            tracing::debug!(error = %crate::describe(&error), "cannot announce a child session");
        }
        Self {
            children: Arc::clone(children),
            child,
            nested: HashMap::new(),
            open: Vec::new(),
            nested_cancellable: HashMap::new(),
            run: None,
        }
    }

    /// Mints the id of a nested session the child announced (`theirs`); cancellable by the
    /// client when the child offers it (`offers_cancel`): a `session/cancel` naming the minted id
    /// is forwarded to the child as one naming `theirs`, and cancels that session only.
    fn mint_nested(&mut self, theirs: &str, offers_cancel: bool) -> String {
        let Some((cancel, over)) = self.run.clone().filter(|_| offers_cancel) else {
            return self.children.mint();
        };
        let nested = self.children.cancellable();
        let minted = nested.id().to_owned();
        let cancelled = nested.cancellation().clone();
        let theirs = theirs.to_owned();
        tokio::spawn(async move {
            tokio::select! {
                () = cancelled.cancelled() => cancel.cancel_session(&theirs),
                () = over.cancelled() => {}
            }
        });
        self.nested_cancellable.insert(minted.clone(), nested);
        minted
    }

    /// The minted id of the session an update of the child's run is of: the child's own
    /// (`None`), or one it announced.
    fn minted(&self, session: Option<&String>) -> Option<String> {
        match session {
            None => Some(self.child.id().to_owned()),
            Some(theirs) => self.nested.get(theirs).cloned(),
        }
    }

    /// Where a relayed permission request is asked: on the session it was made on.
    fn via<'a>(
        &self,
        request: &PermissionRequest,
        withdraw: &'a CancellationToken,
    ) -> Option<Via<'a>> {
        let session = self.minted(request.session_id.as_ref())?;
        Some(Via::Session {
            session: SessionId::new(session),
            withdraw,
        })
    }

    /// Sends one update of the child's run on its minted session, ids mapped.
    fn relay(&mut self, turn: &Turn, session: Option<&String>, mut update: serde_json::Value) {
        let Some(on) = self.minted(session) else {
            tracing::debug!(
                ?session,
                "dropped an update of a session the child never announced"
            );
            return;
        };
        match update.get("sessionUpdate").and_then(|v| v.as_str()) {
            // A child session takes no prompt from the client: its commands would mislead.
            Some("available_commands_update") => return,
            Some("subagent_update") => {
                let Some(theirs) = update.get("sessionId").and_then(|v| v.as_str()) else {
                    return;
                };
                let offers_cancel = update.pointer("/capabilities/cancel").is_some();
                let minted = if let Some(minted) = self.nested.get(theirs) {
                    minted.clone()
                } else {
                    let minted = self.mint_nested(theirs, offers_cancel);
                    self.nested.insert(theirs.to_owned(), minted.clone());
                    self.open.push((minted.clone(), on.clone()));
                    minted
                };
                update["sessionId"] = minted.clone().into();
                if let Some(fields) = update.as_object_mut() {
                    // Offered only what is honoured here: cancel, through the child's run.
                    if self.nested_cancellable.contains_key(&minted) && offers_cancel {
                        fields.insert("capabilities".into(), serde_json::json!({"cancel": {}}));
                    } else {
                        fields.remove("capabilities");
                    }
                }
                if update
                    .get("state")
                    .and_then(ChildState::from_wire)
                    .is_some_and(|(state, _)| state.is_final())
                {
                    self.open.retain(|(open, _)| *open != minted);
                    self.nested_cancellable.remove(&minted);
                }
            }
            Some("tool_call" | "tool_call_update") => {
                // A reference to a session must name one the client knows: mapped, or dropped.
                if let Some(content) = update.get_mut("content").and_then(|c| c.as_array_mut()) {
                    content.retain_mut(|item| {
                        if item.get("type").and_then(|t| t.as_str()) != Some("session") {
                            return true;
                        }
                        let mapped = item
                            .get("sessionId")
                            .and_then(|id| id.as_str())
                            .and_then(|id| self.nested.get(id))
                            .cloned();
                        mapped.is_some_and(|id| {
                            item["sessionId"] = id.into();
                            true
                        })
                    });
                }
            }
            _ => {}
        }
        match serde_json::from_value::<SessionUpdate>(update) {
            Ok(update) => {
                if let Err(error) = turn.notify_on(SessionId::new(on), update) {
                    tracing::debug!(error = %crate::describe(&error), "cannot relay a child's update");
                }
            }
            Err(error) => tracing::debug!(%error, "dropped a child's update that does not decode"),
        }
    }

    /// The final snapshots: `unknown` for every nested session the child never ended (the
    /// deepest first), then the outcome of the child's turn on the turn's session (failed when
    /// its answer never came: `None`).
    fn end(&mut self, turn: &Turn, result: Option<&RunResult>) {
        for (minted, on) in self.open.drain(..).rev() {
            let update = SubagentUpdate::new(minted).state(StateUpdate::Unknown(
                agent_client_protocol::v1::schema::UnknownStateUpdate::new(),
            ));
            if let Err(error) =
                turn.notify_on(SessionId::new(on), SessionUpdate::SubagentUpdate(update))
            {
                tracing::debug!(error = %crate::describe(&error), "cannot end a nested session");
            }
        }
        let state = result.map_or(ChildState::Failed, |result| {
            ChildState::of_status(result.status)
        });
        let mut snapshot = serde_json::json!({
            "state": "idle",
            "stopReason": state.wire_stop_reason(result.and_then(|r| r.stop_reason.as_deref())),
        });
        if state == ChildState::Failed {
            let message = match result {
                Some(result) => result
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("ended {}", result.status)),
                None => "its run ended abnormally".to_owned(),
            };
            snapshot["error"] = serde_json::json!({
                "code": agent_client_protocol::ErrorCode::INTERNAL_ERROR.value(),
                "message": message,
            });
        }
        let update = match serde_json::from_value::<StateUpdate>(snapshot) {
            Ok(state) => SubagentUpdate::new(self.child.id().to_owned()).state(state),
            Err(error) => {
                tracing::warn!(%error, "cannot build a child's final state");
                SubagentUpdate::new(self.child.id().to_owned()).state(StateUpdate::Unknown(
                    agent_client_protocol::v1::schema::UnknownStateUpdate::new(),
                ))
            }
        };
        if let Err(error) = turn.notify_on(turn.session(), SessionUpdate::SubagentUpdate(update)) {
            tracing::debug!(error = %crate::describe(&error), "cannot end a child session");
        }
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

/// Relays one child permission request to this agent's client (`via` where it is asked; `None`
/// for a session the child never announced: rejected) and sends the decision back.
async fn relay(
    turn: &Turn,
    via: Option<Via<'_>>,
    request: PermissionRequest,
    answer: oneshot::Sender<Decision>,
) {
    let decision = match via {
        Some(via) => permission::relay(turn, via, &request).await,
        None => Decision {
            answer: Answer::Reject,
            decided_by: DecidedBy::Policy,
        },
    };
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

/// Forwards the child run's updates (with the child session each is of, `None` for the run's
/// own) to the turn its [`Route`] points to: all of them, or only the run's own text (the tool
/// card).
struct Forwarded {
    route: Arc<Route>,
    redactor: Arc<Redactor>,
}

impl Observer for Forwarded {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        if let Event::Update {
            session_id, update, ..
        } = event
            && let Some(to) = self.route.lock().as_ref()
            && (to.all
                || (session_id.is_none()
                    && update.get("sessionUpdate").and_then(|v| v.as_str())
                        == Some("agent_message_chunk")))
        {
            let mut update = update.clone();
            redact_strings(&self.redactor, &mut update);
            // The receiver is gone only once the turn has its result.
            let _ = to.updates.send((session_id.clone(), update));
        }
        Ok(())
    }
}

/// Redacts `redactor`'s values in every string of `value` (an update relayed as JSON).
fn redact_strings(redactor: &Redactor, value: &mut serde_json::Value) {
    if redactor.is_empty() {
        return;
    }
    match value {
        serde_json::Value::String(text) => *text = redactor.redact(text),
        serde_json::Value::Array(items) => {
            for item in items {
                redact_strings(redactor, item);
            }
        }
        serde_json::Value::Object(fields) => {
            for field in fields.values_mut() {
                redact_strings(redactor, field);
            }
        }
        _ => {}
    }
}

/// Hands the child's permission requests to the turn its [`Route`] points to, which asks the
/// parent's client; with none, the policy answers (`relay` rejects).
struct Relay {
    route: Arc<Route>,
    redactor: Arc<Redactor>,
}

impl PermissionHandler for Relay {
    fn decide(&self, mut request: PermissionRequest) -> DecisionFuture {
        request.title = request.title.map(|title| self.redactor.redact(&title));
        let (tx, rx) = oneshot::channel();
        let sent = self
            .route
            .lock()
            .as_ref()
            .is_some_and(|to| to.asks.send((request, tx)).is_ok());
        Box::pin(async move {
            if !sent {
                return Decision {
                    answer: Answer::Reject,
                    decided_by: DecidedBy::Policy,
                };
            }
            // Nobody left to ask: not an approval.
            rx.await.unwrap_or(Decision {
                answer: Answer::Cancelled,
                decided_by: DecidedBy::Cancel,
            })
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
