//! What may be started, and a start validated whole before anything exists.
//!
//! Invariants:
//! - the subagents are the registry agents the person enabled (`--subagent-agents`, each under
//!   the name given, an alias such as `claude` included; two names of one agent are refused at
//!   start), then the
//!   definitions with a `run:` table in `<session cwd>/subagents/` (repository content) and the
//!   `--subagents` folders (the person's), the first of a name winning; a bad file is a noted
//!   problem, never fatal, and never hides the others;
//! - a definition asks its agent for a persona, model and tool filter
//!   (`protocol::definition::RunSpec::wants`, as `acp-host run --subagent` does); the run library
//!   honours them or refuses the run before the prompt, never ignores them;
//! - a child runs at this agent's depth + 1 (`protocol::depth`): the ambient environment handed to
//!   the library carries this agent's own standing, so a child past the cap is refused by the one
//!   rule in acp-host (execution face); [`Catalog::offered`] is the prompt face;
//! - a child gets the scrubbed environment plus only the names `--subagent-env` and its
//!   definition's `env` forward; a repository definition's permission is capped at the parent's
//!   (`protocol::definition::cap`);
//! - a child asked to start from the parent's conversation (`context: fork`, a call's or its
//!   definition's `run.context`) starts with `session/fork` of the parent's saved session, only
//!   when it is acp-child (which reads the parent's state directory, handed to it as
//!   `ACP_CHILD_STATE_DIR`); any other agent is refused as the call's result, never started fresh;
//! - a child asked to work in a worktree of its own (a call's `isolation`, its definition's
//!   `run.isolation`; `RunSpec::settle`: only ever added) gets one from the run library
//!   (`RunOptions::worktree`); a cold resume of such a child is refused, never run in the
//!   parent's folder;
//! - a start is validated whole ([`Subagents::preflight`]: name, definition, cwd, environment,
//!   schema, then the person's approval of a repository definition) before anything is
//!   registered or spawned.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use acp_host::agents::{self, HostFacts};
use acp_host::definitions;
use acp_host::run;
use acp_host::trust::TrustStore;
use agent_client_protocol::v1::schema::ToolCallId;
use protocol::capabilities::Wants;
use protocol::definition::{
    Definition, Isolation, RunContext, RunPermission, RunSettings, RunSpec,
};
use protocol::depth::{DepthBudget, DepthError, Inherited, Standing};
use protocol::env_scrub::{EnvForward, EnvForwardError};
use protocol::env_vars::{ACP_CHILD_STATE_DIR, ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use protocol::permission::PermissionPolicy;
use protocol::registry;
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::structured::{DEFAULT_SCHEMA_RETRIES, OutputSpec};
use protocol::trust::{Digest, Source, TrustState};
use tokio::sync::Semaphore;

use super::approval::{Asking, approve};
use super::{Delegated, Task};
use crate::backend::Turn;

/// The default of `--max-parallel-subagents`.
pub const DEFAULT_MAX_PARALLEL_SUBAGENTS: usize = 4;

/// This agent's own delegation standing, from what acp-host set in its environment (unset: a
/// person started it, depth 0 of the default limit): the one reading of it, for its children and
/// for the commands it runs. A value past `protocol::depth::MAX_CHAIN_DEPTH` stands at the cap
/// (`past_bound` says which, for the binary to warn once); a malformed one is an error, and then
/// this agent may not delegate.
pub fn inherited_standing() -> Result<Standing, DepthError> {
    let (depth, max_depth) = (
        std::env::var(ACP_HOST_DEPTH).ok(),
        std::env::var(ACP_HOST_MAX_DEPTH).ok(),
    );
    protocol::depth::own(Inherited {
        depth: depth.as_deref(),
        max_depth: max_depth.as_deref(),
    })
}

/// [`inherited_standing`]'s budget, for an agent run without subagents (read once, when its
/// `AgentConfig` is made); `None` when the inherited values are malformed (they are then passed
/// on as they are, and acp-host refuses to start an agent from them).
pub(crate) fn inherited_budget() -> Option<DepthBudget> {
    inherited_standing().ok().map(|standing| standing.budget)
}

/// What the user enabled, from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubagentOptions {
    /// Registry names (`acp-child`, `codex`, ...).
    pub agents: Vec<String>,
    /// `None`: [`DEFAULT_MAX_PARALLEL_SUBAGENTS`].
    pub max_parallel: Option<usize>,
    /// How a child's permission requests are answered: `relay` asks this agent's own client
    /// (the person in the editor), title prefixed by the subagent's name, with the child's
    /// options, the answer going back by kind; `reject` / `allow` answer by policy.
    pub permission: RunPermission,
    /// Names of variables forwarded to every child (never values).
    pub env: Vec<String>,
    /// A child running longer is cancelled and torn down.
    pub timeout: Option<Duration>,
    /// `--subagent-token-budget`: a child whose reported tokens pass this is cancelled (a
    /// definition's `tokenBudget` only lowers it).
    pub token_budget: Option<u64>,
    /// This agent's own token budget (`ACP_HOST_TOKEN_BUDGET`, set by the acp-host that started
    /// it): a child gets at most what is left of it.
    pub inherited_token_budget: Option<u64>,
    /// This agent's own standing; `None` when its inherited values are malformed (then it may
    /// not delegate: the library refuses every start the same way).
    pub budget: Option<DepthBudget>,
    /// Folders of definitions (`--subagents`), looked at after `<session cwd>/subagents/`.
    pub dirs: Vec<PathBuf>,
    /// `--no-background`: no `run_in_background` (left out of the schema, refused if sent).
    pub no_background: bool,
    /// `--child-idle-timeout`: how long a child that answered (foreground or background) stays
    /// alive for a `send_message`; zero ends every child with its run.
    pub child_idle_timeout: Duration,
    /// `--subagent-sandbox`, `--subagent-network`: every child's sandbox, which a definition
    /// only tightens (and this agent's own sandbox bounds anyway).
    pub sandbox: protocol::sandbox::Policy,
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
    #[error(
        "--subagent-agents: {given} and {other} are the same agent ({canonical}); name it once"
    )]
    SameAgent {
        given: String,
        other: String,
        canonical: String,
    },
    #[error("--max-parallel-subagents must be at least 1")]
    NoParallelism,
    #[error(
        "--subagent-env {name:?}: takes a variable NAME only, never NAME=VALUE (acp-child forwards its own value of NAME: set it in acp-child's environment)"
    )]
    EnvValue { name: String },
    #[error(
        "--subagent-env {name:?}: not a variable name (a non-empty NAME with no `=` or NUL byte)"
    )]
    EnvName { name: String },
}

/// One agent a subagent call may name: an enabled registry agent, or a definition's `run:`.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(super) command: AgentCommand,
    launch: Launch,
    /// Where it was found, which decides whether it starts unasked (`protocol::trust`).
    pub(crate) source: Source,
    /// Its definition file and content (none for a registry agent).
    pub(super) origin: Option<Origin>,
    /// It runs acp-child, which can start from this agent's saved conversation (`context: fork`).
    pub(crate) forkable: bool,
}

/// A definition's file and the digest of the content it was parsed from.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    pub(super) file: PathBuf,
    pub(super) digest: Digest,
}

impl Target {
    /// What a fresh start of `task` on it starts from: the call's `context`, else the
    /// definition's `run.context`, else fresh.
    pub(super) fn context(&self, task: &Task<'_>) -> RunContext {
        task.context.or(self.launch.run.context).unwrap_or_default()
    }

    /// Whether it starts without asking the person: from a source they named, or a repository
    /// definition whose exact content they approved always.
    pub(super) fn trust(&self, store: Option<&TrustStore>) -> TrustState {
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
    /// Its permission, variables, timeout and depth limit, settled at each start
    /// (`RunSpec::settle`).
    run: RunSpec,
}

/// The subagents available to a session, and the definition files that could not be used.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) targets: Vec<Target>,
    /// One line per problem, naming the file (and field).
    pub(crate) problems: Vec<String>,
}

impl Catalog {
    /// Whether delegation is offered (the prompt face): some subagent is available and the
    /// session (`depth`: this agent's standing, lowered by the start extension's `maxDepth`) is
    /// below the depth cap.
    pub(super) fn offered(&self, depth: Option<DepthBudget>) -> bool {
        !self.targets.is_empty() && depth.is_some_and(DepthBudget::may_delegate)
    }

    /// Whether a fresh start of `task` starts from the parent's conversation.
    pub(super) fn forks(&self, task: &Task<'_>) -> bool {
        self.targets
            .iter()
            .find(|t| t.name == task.name)
            .is_some_and(|target| target.context(task) == RunContext::Fork)
    }
}

/// The enabled subagents and how they run; shared by every session of the connection.
#[derive(Debug)]
pub struct Subagents {
    /// The enabled registry agents.
    targets: Vec<Target>,
    dirs: Vec<PathBuf>,
    facts: HostFacts,
    budget: Option<DepthBudget>,
    /// The `--max-parallel-subagents` slots; shared, so a child's teardown can hold its slot
    /// after the call that ran it returned.
    pub(super) slots: Arc<Semaphore>,
    permission: RunPermission,
    /// Where "allow always" approvals of repository definitions are kept; `None` when this user
    /// has no state directory (then an approval holds for one start).
    trust: Option<TrustStore>,
    env: Vec<String>,
    timeout: Option<Duration>,
    token_budget: Option<u64>,
    inherited_token_budget: Option<u64>,
    background: bool,
    pub(super) idle_timeout: Option<Duration>,
    sandbox: protocol::sandbox::Policy,
}

/// A start that passed validation (and, for a repository definition, the person's approval):
/// ready to run, nothing spawned yet.
pub(super) struct Start {
    pub(super) name: String,
    pub(super) prepared: run::Prepared,
    pub(super) permission: RunPermission,
    /// It continues a child's saved session.
    pub(super) resume: bool,
    /// The child's token budget, for the call's result when it passes it.
    pub(super) token_budget: Option<u64>,
    /// It runs in a git worktree of its own (the call's `isolation`, its definition's
    /// `run.isolation`): made before it starts, settled once its process is gone.
    pub(super) worktree: Option<acp_host::worktree::Spec>,
    /// The span of the turn that started it: the child's run continues its trace.
    pub(super) trace: protocol::trace::TraceParent,
}

/// The parent's session a forked child starts from, and where it is saved.
struct ForkFrom {
    session: String,
    state_dir: String,
}

impl Subagents {
    /// Resolves the enabled registry agents to their commands (found where `acp-host run` would
    /// find them).
    pub fn resolve(options: SubagentOptions) -> Result<Self, SubagentError> {
        let facts = HostFacts::from_env();
        let mut targets = Vec::new();
        // Each enabled agent under the name the person gave (an alias included), with the
        // registry's canonical name, to tell two names of one agent apart from a repeat.
        let mut canonical: Vec<&'static str> = Vec::new();
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
            if let Some(index) = canonical.iter().position(|known| *known == spec.name) {
                let other: &Target = &targets[index];
                if other.name == *name {
                    continue;
                }
                return Err(SubagentError::SameAgent {
                    given: other.name.clone(),
                    other: name.clone(),
                    canonical: spec.name.to_owned(),
                });
            }
            let resolved =
                agents::resolve(name, &facts).map_err(|source| SubagentError::Resolve {
                    name: name.clone(),
                    source,
                })?;
            canonical.push(spec.name);
            targets.push(Target {
                name: name.clone(),
                description: spec.summary.to_owned(),
                command: resolved.command,
                launch: Launch::default(),
                source: Source::Registry,
                origin: None,
                forkable: spec.name == registry::ACP_CHILD,
            });
        }
        for name in &options.env {
            match EnvForward::parse(name) {
                Ok(EnvForward::Inherit(_)) => {}
                Ok(EnvForward::Set(name, _)) => return Err(SubagentError::EnvValue { name }),
                Err(_) => {
                    return Err(SubagentError::EnvName {
                        name: name.split('=').next().unwrap_or_default().to_owned(),
                    });
                }
            }
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
            slots: Arc::new(Semaphore::new(parallel)),
            permission: options.permission,
            trust: TrustStore::from_env()
                .inspect_err(|error| {
                    tracing::warn!(
                        error = %protocol::report::describe(error),
                        "approvals of subagent definitions hold for one start only"
                    );
                })
                .ok(),
            env: options.env,
            timeout: options.timeout,
            token_budget: options.token_budget,
            inherited_token_budget: options.inherited_token_budget,
            background: !options.no_background,
            idle_timeout: (!options.child_idle_timeout.is_zero())
                .then_some(options.child_idle_timeout),
            sandbox: options.sandbox,
        })
    }

    /// Whether starting `target` asks the person first (a repository definition not approved
    /// for its content).
    pub(super) fn needs_approval(&self, target: &Target) -> bool {
        !target.trust(self.trust.as_ref()).may_start()
    }

    /// Whether children may run in the background (`run_in_background`).
    pub(super) fn background(&self) -> bool {
        self.background
    }

    /// This agent's own standing, as the binary read it at start; `None` when its inherited
    /// values are malformed. Each session is handed it when it opens (`Settings::depth`).
    pub(crate) fn depth(&self) -> Option<DepthBudget> {
        self.budget
    }

    /// The enabled registry agents, then the definitions with a `run:` table found in
    /// `<cwd>/subagents/` (repository content) and the `--subagents` folders (named by the
    /// person), the first of a name winning. A file that cannot be used is a problem in the
    /// catalog (and a log line), never hides the others.
    pub(super) fn catalog(&self, cwd: &Path) -> Catalog {
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
        let resolved = agents::resolve(agent, &self.facts).map_err(|error| {
            format!("field `run.agent`: {}", protocol::report::describe(&error))
        })?;
        let forkable = resolved
            .spec
            .is_some_and(|spec| spec.name == registry::ACP_CHILD);
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
                run: run.clone(),
            },
            source,
            origin: Some(origin),
            forkable,
        })
    }

    /// The environment the library reads this agent's standing from: the session's (`depth`:
    /// this agent's own, even when it was started by a person, with no `ACP_HOST_DEPTH`, so its
    /// children run one deeper; the cap lowered to the session's own); `None` passes on what
    /// this agent inherited as it is.
    fn ambient(depth: Option<DepthBudget>) -> Vec<(OsString, OsString)> {
        let mut ambient: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(budget) = depth {
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

    /// The start request for `task` on `target`, the permission policy of its run (continuing
    /// its saved session `resume`, else starting from a fork of the parent's session `fork`;
    /// either way a `fork` child gets the parent's state directory), and where it works: a
    /// worktree when the call or the definition asks for one (`RunSpec::settle`).
    fn request(
        &self,
        target: &Target,
        task: &Task<'_>,
        cwd: &Path,
        resume: Option<String>,
        fork: Option<ForkFrom>,
        spent: u64,
    ) -> (StartRequest, RunPermission, Option<Isolation>) {
        let launch = &target.launch;
        // At most `--subagent-token-budget`, and what is left of this agent's own budget.
        let left = protocol::usage::left(self.inherited_token_budget, spent);
        let defaults = RunSettings {
            permission: Some(self.permission),
            timeout: self.timeout,
            max_depth: None,
            token_budget: protocol::usage::child_budget(None, self.token_budget, left),
            cost_budget: None,
            env: self.env.clone(),
            isolation: None,
        };
        // The call's own settings: its `isolation`.
        let explicit = RunSettings {
            isolation: task.isolation,
            ..RunSettings::default()
        };
        let settled = launch.run.settle(target.source, &explicit, &defaults);
        let permission = settled.permission;
        let mut env: Vec<EnvForward> = self
            .env
            .iter()
            .chain(&settled.env)
            .cloned()
            .map(EnvForward::Inherit)
            .collect();
        // A fork reads the parent's session where the parent saved it, and is saved there.
        if let Some(fork) = &fork {
            env.retain(|forward| forward.name() != ACP_CHILD_STATE_DIR);
            env.push(EnvForward::Set(
                ACP_CHILD_STATE_DIR.to_owned(),
                fork.state_dir.clone(),
            ));
        }
        let request = StartRequest {
            agent: target.command.clone(),
            prompt: task.prompt.to_owned(),
            cwd: cwd.to_path_buf(),
            env,
            // `relay`: the library rejects what the relay handler does not answer.
            permission: match permission {
                RunPermission::Allow => PermissionPolicy::Allow,
                RunPermission::Reject | RunPermission::Relay => PermissionPolicy::Reject,
            },
            timeouts: Timeouts {
                overall: settled.timeout,
                ..Timeouts::default()
            },
            max_depth: settled.max_depth,
            wants: Wants {
                output: task.output_schema.map(|schema| OutputSpec {
                    schema: schema.clone(),
                    retries: DEFAULT_SCHEMA_RETRIES,
                }),
                ..launch.wants.clone()
            },
            fork: fork.map(|fork| fork.session).filter(|_| resume.is_none()),
            resume,
            budget: protocol::usage::Budget {
                tokens: settled.token_budget,
                // A definition's `costBudget`, held against the cost the child reports.
                cost: settled.cost_budget.map(protocol::usage::CostLimit::amount),
            },
            on_unreported: protocol::usage::Unreported::default(),
            sandbox: launch.run.sandbox_within(&self.sandbox),
        };
        (request, permission, settled.isolation)
    }

    /// Validates a start of subagent `name` on `prompt` for tool call `call` of `turn`'s session
    /// (in its directory, under its depth cap; with `output_schema`, the answer must match it;
    /// with `resume`, the child's saved session is continued): everything that can fail before a
    /// process exists, the person's approval of a repository definition last ([`approve`]).
    /// `Err` is the call's result.
    pub(super) async fn preflight(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        catalog: &Catalog,
        task: Task<'_>,
        resume: Option<String>,
    ) -> Result<Start, Delegated> {
        let name = task.name;
        let cwd = turn.workspace().root();
        let Some(target) = catalog.targets.iter().find(|t| t.name == name) else {
            return Err(unknown(name, catalog));
        };
        let resuming = resume.is_some();
        // A forked child, continued too, reads the parent's state directory, where its own
        // session is saved; continuing it continues its own session, never a new fork.
        let spent = turn.memory().usage().total.total_tokens;
        let fork = match target.context(&task) {
            RunContext::Fork => Some(fork_from(turn, target).map_err(Delegated::failed)?),
            RunContext::Fresh => None,
        };
        let forks = fork.is_some() && !resuming;
        let (request, permission, isolation) =
            self.request(target, &task, cwd, resume, fork, spent);
        if resuming && isolation.is_some() {
            return Err(Delegated::failed(format!(
                "subagent {name} runs in a worktree of its own (isolation: worktree), settled \
                 when its run ended: a child of it cannot be continued; start a new subagent call \
                 (its branch holds what the last one did)"
            )));
        }
        let token_budget = request.budget.tokens;
        let asking = Asking {
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
            fork: forks,
            sandbox: if request.sandbox.is_active() {
                format!(
                    "{}, network {}",
                    request.sandbox.mode, request.sandbox.network
                )
            } else {
                "none".to_owned()
            },
        };
        let depth = turn.memory().settings().depth();
        let prepared = run::prepare(request, Self::ambient(depth)).map_err(|error| {
            let why = match &error {
                run::PrepareError::Env(EnvForwardError::NotSet(variable)) => {
                    self.not_set(target, variable)
                }
                _ => protocol::report::describe(&error),
            };
            Delegated::failed(format!("subagent {name} was not started: {why}"))
        })?;
        if !target.trust(self.trust.as_ref()).may_start() {
            approve(turn, call, name, &asking, self.trust.as_ref()).await?;
        }
        Ok(Start {
            name: name.to_owned(),
            prepared,
            permission,
            resume: resuming,
            token_budget,
            // Named from the prompt and the run id; from the session's HEAD, committed when done.
            worktree: isolation.map(|_| acp_host::worktree::Spec::default()),
            trace: turn.trace().clone(),
        })
    }
}

impl Subagents {
    /// Why a start failed on `variable`, forwarded but unset, in this agent's terms: what
    /// forwards it (`--subagent-env`, else the definition's `run.env`) and what to change.
    fn not_set(&self, target: &Target, variable: &str) -> String {
        let by = if self.env.iter().any(|name| name == variable) {
            format!("--subagent-env {variable}")
        } else {
            match &target.origin {
                Some(origin) => format!("`run.env` of {}", origin.file.display()),
                None => "its definition's `run.env`".to_owned(),
            }
        };
        format!(
            "{variable} is forwarded by {by}, but it is not set in acp-child's environment (set it where acp-child is started, or stop forwarding it)"
        )
    }
}

/// Where a child of `target` asked to fork `turn`'s session starts from, or why it cannot
/// (the call's result, once made one): only acp-child reads this agent's saved sessions.
fn fork_from(turn: &Turn, target: &Target) -> Result<ForkFrom, String> {
    let name = &target.name;
    if !target.forkable {
        return Err(format!(
            "subagent {name} cannot start from this conversation (context: fork): it is not \
             acp-child, and only acp-child reads this agent's saved sessions; call it with \
             context \"fresh\" and put what it needs in the prompt"
        ));
    }
    let fresh = "call it with context \"fresh\" and put what it needs in the prompt";
    let Some(dir) = turn.memory().saved_in() else {
        return Err(format!(
            "subagent {name} cannot start from this conversation (context: fork): this \
             session is not saved; {fresh}"
        ));
    };
    let Some(dir) = dir.to_str() else {
        return Err(format!(
            "subagent {name} cannot start from this conversation (context: fork): the state \
             directory {} is not UTF-8, so it cannot be handed to the child; {fresh}",
            dir.display()
        ));
    };
    Ok(ForkFrom {
        session: turn.session().0.to_string(),
        state_dir: dir.to_owned(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
            budget: Some(DepthBudget {
                depth: 1,
                max_depth: 1,
            }),
            ..SubagentOptions::default()
        })
        .unwrap();
        let catalog = subagents.catalog(Path::new("/nonexistent"));
        assert_eq!(catalog.targets.len(), 1);
        let at = |depth, max_depth| Some(DepthBudget { depth, max_depth });
        assert!(
            !catalog.offered(subagents.depth()),
            "at the cap, delegation is not offered"
        );
        assert!(catalog.offered(at(0, 1)));
        assert!(!catalog.offered(at(0, 0)));
        assert!(
            !catalog.offered(None),
            "malformed inherited values: not offered"
        );
        let empty = Catalog {
            targets: Vec::new(),
            problems: Vec::new(),
        };
        assert!(!empty.offered(at(0, 1)), "nothing to start: not offered");
    }
}
