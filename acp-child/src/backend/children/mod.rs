//! The children wing: everything about a subagent acp-child starts, in one folder. A child is
//! any ACP agent (acp-child itself included) run as its own process through acp-host's run
//! library; the model's tools and the offline `/delegate` reach children only through here.
//!
//! Map (docs/acp-child.md, "The children wing", has the diagram of a child's states):
//! - [`catalog`]: what may be started: the options the person gave, the registry agents they
//!   enabled and the definition folders ([`Subagents`], shared by the connection's sessions), a
//!   session's [`Catalog`], and a start validated whole before anything exists ([`catalog::Start`]);
//! - [`approval`]: the person's approval of a repository definition, asked before it starts;
//! - [`live`]: a child's process and kept session ([`LiveChild`]), the parallel slots, and the
//!   one path that drives every turn shown somewhere;
//! - [`exposure`]: how a turn of a child is shown: a subagent session of its own when the client
//!   speaks them (ids minted in [`ChildSessions`]), else its text on the tool card;
//! - [`table`]: the session's children and background tasks, which outlive a tool call.
//!
//! Invariants: a model or a prompt never names a command line (only enabled registry agents and
//! definitions); every failure is a [`Delegated`] result with `failed` set, never an error of
//! the parent's turn; no child outlives the session that owns it.

mod approval;
mod catalog;
mod exposure;
mod live;
pub(crate) mod table;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use acp_host::run::Cancel;
use agent_client_protocol::v1::schema::{ToolCallId, ToolKind};
use protocol::capabilities::ToolFilter;
use protocol::depth::DepthBudget;

use crate::backend::CANCELLED;
use crate::backend::Turn;
use crate::session::Memory;

pub(crate) use self::catalog::Catalog;
pub(crate) use self::catalog::inherited_budget;
pub use self::catalog::{
    DEFAULT_MAX_PARALLEL_SUBAGENTS, SubagentError, SubagentOptions, Subagents, inherited_standing,
};
pub(crate) use self::exposure::ChildSessions;
pub(crate) use self::live::LiveChild;

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

/// A child's result, as the model (or the offline reply) gets it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Delegated {
    pub(crate) text: String,
    pub(crate) failed: bool,
    /// The ACP session id the child's agent reported (to continue it later).
    pub(crate) session: Option<String>,
    /// Whether its agent advertises `loadSession` (can be cold-resumed), once known.
    pub(crate) resumable: Option<bool>,
    /// What the child reported spending in this run (already added to the calling turn's).
    pub(crate) usage: Option<protocol::usage::Usage>,
}

impl Delegated {
    pub(crate) fn failed(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            failed: true,
            session: None,
            resumable: None,
            usage: None,
        }
    }
}

/// What a call asks a child to do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Task<'s> {
    /// The subagent (an enabled registry agent or a definition).
    pub(crate) name: &'s str,
    pub(crate) prompt: &'s str,
    /// A short label for the person (else the prompt's first line).
    pub(crate) description: Option<&'s str>,
    /// With it, the child's answer must match this JSON Schema (the result is the value).
    pub(crate) output_schema: Option<&'s serde_json::Value>,
    /// What the child starts from; `None`: its definition's `run.context`, else fresh.
    pub(crate) context: Option<protocol::definition::RunContext>,
    /// Where it works: `worktree`, a git worktree of its own; `None`: its definition's
    /// `run.isolation`, else the session's folder.
    pub(crate) isolation: Option<protocol::definition::Isolation>,
}

/// How a started child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The call waits for its answer; it stays alive, idle, for `send_message` afterwards.
    Foreground,
    /// The call returns a task id at once; the session owns the run.
    Background,
    /// The call waits for its answer and its process ends right after (the offline `/delegate`:
    /// no child entry to keep it in; the session's table awaits its teardown).
    OneShot,
}

/// Which of the children's tools a turn offers (the prompt face of the depth rule): one rule for
/// all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offered {
    /// `subagent`, `send_message`, `list_agents`: some subagent is available and this agent is
    /// below its depth cap.
    pub(crate) delegation: bool,
    /// `run_in_background` and the task tools: delegation is, `--no-background` is off, and the
    /// session's tool filter lets [`BACKGROUND_TOOLS`] through (a task nothing could collect or
    /// stop is not offered).
    pub(crate) background: bool,
    /// Continuing a child (a child kept idle after its answer, the promise in `subagent`'s
    /// description): delegation is, and the session's tool filter lets [`MESSAGING_TOOLS`]
    /// through; otherwise nothing could message a child, so none is kept.
    pub(crate) messaging: bool,
    /// `isolation: worktree`: delegation is, and the session's folder is inside a git
    /// repository (`acp_host::worktree::in_repository`).
    pub(crate) isolation: bool,
}

/// The tools that collect and stop a background task; `run_in_background` needs both.
pub(crate) const BACKGROUND_TOOLS: [&str; 2] = ["task_output", "task_kill"];

/// The tools that find and continue a child; keeping a child idle needs both.
pub(crate) const MESSAGING_TOOLS: [&str; 2] = ["send_message", "list_agents"];

/// The result of a forced `run_in_background` when the session's tool filter leaves out the
/// task tools.
pub(crate) const BACKGROUND_FILTERED: &str = "background subagents are not available in this \
     session (its tool filter leaves out task_output or task_kill); call subagent without \
     run_in_background";

/// The result of a forced `isolation: worktree` in a session whose folder is in no git
/// repository.
pub(crate) const ISOLATION_NO_REPOSITORY: &str = "isolation \"worktree\" needs the session's \
     folder inside a git repository, and this one is not; call subagent without isolation (or \
     work in a repository)";

/// The result of a forced `run_in_background` under `--no-background`.
pub(crate) const BACKGROUND_DISABLED: &str = "background subagents are disabled in this agent \
     (--no-background); call subagent without run_in_background";

/// The children wing as one turn sees it: the connection's [`Subagents`], the catalog of what
/// may be started in the turn's session directory (read once per turn), and through the turn
/// the session's table of children. Every operation on a child goes through here, with the
/// child's life (register, preflight, run, record, keep alive, release) written once.
pub(crate) struct Children<'a> {
    subagents: &'a Arc<Subagents>,
    catalog: Catalog,
    /// Where the session stands for delegation (this agent's standing, lowered by the session's
    /// cap): whether delegation is offered at all.
    depth: Option<DepthBudget>,
    /// The session's tool filter, which decides what of the children's tools is offered.
    filter: Option<ToolFilter>,
    /// The session's folder is inside a git repository: a child may get a worktree.
    repository: bool,
}

impl<'a> Children<'a> {
    /// The wing for a turn of `turn`'s session: reads the definitions in its directory once.
    pub(crate) fn new(subagents: &'a Arc<Subagents>, turn: &Turn) -> Self {
        let settings = turn.memory().settings();
        Self {
            subagents,
            catalog: subagents.catalog(turn.workspace().root()),
            depth: settings.depth(),
            filter: settings.tools,
            repository: acp_host::worktree::in_repository(turn.workspace().root()),
        }
    }

    /// Which children's tools are offered.
    pub(crate) fn offered(&self) -> Offered {
        let delegation = self.catalog.offered(self.depth);
        Offered {
            delegation,
            background: delegation
                && self.subagents.background()
                && self.filter_allows(&BACKGROUND_TOOLS),
            messaging: delegation && self.filter_allows(&MESSAGING_TOOLS),
            isolation: delegation && self.repository,
        }
    }

    /// Whether the session's tool filter lets every one of `names` through.
    fn filter_allows(&self, names: &[&str]) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|filter| names.iter().all(|name| filter.allows(name)))
    }

    /// What may be started, and the definition files that could not be used.
    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Whether starting `target` asks the person first.
    pub(crate) fn needs_approval(&self, target: &catalog::Target) -> bool {
        self.subagents.needs_approval(target)
    }

    /// Starts `task` for tool call `call` of `turn`. Everything that can fail before a process
    /// exists is checked first, so a refused start registers nothing. The result is the child's
    /// answer ([`Mode::Foreground`], [`Mode::OneShot`]) or, at once, the task id that collects it
    /// ([`Mode::Background`]).
    pub(crate) async fn start(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        task: Task<'_>,
        mode: Mode,
    ) -> Delegated {
        if mode == Mode::Background && !self.subagents.background() {
            return Delegated::failed(BACKGROUND_DISABLED);
        }
        // Only the filter's own refusal here: a start past the depth cap is refused as such.
        if mode == Mode::Background && !self.filter_allows(&BACKGROUND_TOOLS) {
            return Delegated::failed(BACKGROUND_FILTERED);
        }
        if task.isolation.is_some() && !self.repository {
            return Delegated::failed(ISOLATION_NO_REPOSITORY);
        }
        let start = match self
            .subagents
            .preflight(turn, call, &self.catalog, task, None)
            .await
        {
            Ok(start) => start,
            Err(refused) => return refused,
        };
        // A child answered stays alive, idle, only when something could message it, and never
        // one in a worktree: its worktree is settled (committed, or removed) when its run ends,
        // and the call's result says how.
        let isolated = start.worktree.is_some();
        let keep = self.offered().messaging && !isolated;
        if mode == Mode::OneShot {
            let result = self
                .subagents
                .run(turn, call, start, task.prompt, task.description, false)
                .await
                .0;
            spent(turn, task.name, &result);
            return result;
        }
        let memory = Arc::clone(turn.memory());
        let table = Arc::clone(memory.tasks());
        let (child, gate) = match table.new_child(task.name, &label(task.description, task.prompt))
        {
            Ok(child) => child,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        if self.catalog.forks(&task) {
            table.child_forked(&child);
        }
        if isolated {
            table.child_isolated(&child);
        }
        if mode == Mode::Foreground {
            let (mut result, live) = self
                .subagents
                .run(turn, call, start, task.prompt, task.description, keep)
                .await;
            spent(turn, task.name, &result);
            if keep && continuable(&result, live.is_some()) {
                let _ = write!(
                    result.text,
                    "\n\n[child {child}: send_message to {child} continues this conversation]"
                );
            }
            record(&memory, &child, &result, live);
            drop(gate);
            return result;
        }
        let cancel = Cancel::new();
        let run = {
            let subagents = Arc::clone(self.subagents);
            let cancel = cancel.clone();
            let child = child.clone();
            move |running: Arc<AtomicBool>| async move {
                let (result, live) = subagents.run_detached(start, cancel, &running, keep).await;
                record(&memory, &child, &result, live);
                result
            }
        };
        let label = label(task.description, task.prompt);
        match table.spawn(&child, task.name, &label, cancel, gate, run) {
            Ok(id) => Delegated {
                text: format!(
                    "started background task {id}: subagent {} as child {child}. It runs on its \
                     own: task_output {id} returns its result (wait: true blocks until it is \
                     done), task_kill stops it, and you are told when it finishes.",
                    task.name
                ),
                failed: false,
                session: None,
                resumable: None,
                usage: None,
            },
            Err(error) => {
                table.child_ended(&child, None, None, true);
                Delegated::failed(error.to_string())
            }
        }
    }

    /// Sends `message` to child `child_id` of `turn`'s session as its next turn, shown on tool
    /// call `call`: after its running turn if any, in its live process when it is idle, else by
    /// a cold resume of its saved session in a fresh process.
    pub(crate) async fn message(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        child_id: &str,
        message: &str,
    ) -> Delegated {
        let memory = Arc::clone(turn.memory());
        let table = memory.tasks();
        let child = match table.child(child_id) {
            Ok(child) => child,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        // One turn at a time: wait for the child's current run, if any.
        let gate = tokio::select! {
            biased;
            () = turn.cancelled() => return Delegated::failed(CANCELLED),
            gate = Arc::clone(&child.gate).lock_owned() => gate,
        };
        let child = match table.child(child_id) {
            Ok(child) => child,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        // The child is marked running only once its message was accepted; a message refused
        // before that leaves it as it was (a refusal is no run of the child).
        let before = child.status;
        if let Some(live) = child.live() {
            let accepted = AtomicBool::new(false);
            let sent = self
                .subagents
                .send(turn, call, live, message, || {
                    accepted.store(true, Ordering::Release);
                    table.child_running(&child.id);
                })
                .await;
            match sent {
                Some(result) if accepted.load(Ordering::Acquire) => {
                    spent(turn, &child.agent, &result);
                    record(&memory, &child.id, &result, None);
                    drop(gate);
                    return result;
                }
                // No slot (the turn was cancelled while it waited): the child was not reached.
                Some(refused) => return refused,
                // Its idle queue closed meanwhile (the idle timeout won the race): cold resume.
                None => {}
            }
        }
        if child.isolated {
            return Delegated::failed(format!(
                "child {} cannot be continued: it worked in a worktree of its own, settled when \
                 its run ended (its result says where its changes are); start a new subagent call",
                child.id
            ));
        }
        let Some(session) = child.session.clone() else {
            return Delegated::failed(format!(
                "child {} cannot be continued: its agent reported no session id",
                child.id
            ));
        };
        let start = match self
            .subagents
            .preflight(
                turn,
                call,
                &self.catalog,
                Task {
                    name: &child.agent,
                    prompt: message,
                    description: None,
                    output_schema: None,
                    // A forked child's session is where its parent's is.
                    context: child
                        .forked
                        .then_some(protocol::definition::RunContext::Fork),
                    isolation: None,
                },
                Some(session),
            )
            .await
        {
            Ok(start) => start,
            Err(refused) => {
                return Delegated::failed(format!(
                    "child {} cannot be continued: {}",
                    child.id, refused.text
                ));
            }
        };
        table.child_running(&child.id);
        let (result, live) = self
            .subagents
            .run(turn, call, start, message, None, true)
            .await;
        spent(turn, &child.agent, &result);
        if result.failed && result.session.is_none() {
            // The cold resume was refused before its session was loaded (no `loadSession`, a
            // start that failed): the child and its saved session are as they were (what its
            // agent said of `loadSession` is kept).
            table.restore_child(&child.id, before, result.resumable);
        } else {
            record(&memory, &child.id, &result, live);
        }
        drop(gate);
        result
    }

    /// Background task `task_id`'s status line, then its result once there is one; with `wait`,
    /// first waits (at most that long) until it is done.
    pub(crate) async fn output(
        turn: &Turn,
        task_id: &str,
        wait: Option<std::time::Duration>,
    ) -> Delegated {
        let table = Arc::clone(turn.memory().tasks());
        let (view, done) = match table.get(task_id) {
            Ok(found) => found,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        let Some(wait) = wait.filter(|_| view.result.is_none()) else {
            count_spending(turn, &table, task_id);
            return ok(table::report(&view));
        };
        tokio::select! {
            biased;
            () = turn.cancelled() => return Delegated::failed(CANCELLED),
            () = done.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
        count_spending(turn, &table, task_id);
        match table.get(task_id) {
            Ok((view, _)) => ok(table::report(&view)),
            Err(error) => Delegated::failed(error.to_string()),
        }
    }

    /// Stops background task `task_id` (a child: session/cancel, then the teardown ladder; a
    /// command: its process group killed) and waits, at most `timeout`, until it is torn down.
    pub(crate) async fn kill(
        turn: &Turn,
        task_id: &str,
        timeout: std::time::Duration,
    ) -> Delegated {
        let table = Arc::clone(turn.memory().tasks());
        let (before, _) = match table.get(task_id) {
            Ok(found) => found,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        if before.result.is_some() {
            count_spending(turn, &table, task_id);
            return ok(format!("{task_id} had already finished: {}", before.line()));
        }
        let done = match table.kill(task_id) {
            Ok(done) => done,
            Err(error) => return Delegated::failed(error.to_string()),
        };
        tokio::select! {
            biased;
            () = turn.cancelled() => return Delegated::failed(CANCELLED),
            () = done.cancelled() => {}
            () = tokio::time::sleep(timeout) => {
                return Delegated::failed(format!("{task_id} is still stopping"));
            }
        }
        count_spending(turn, &table, task_id);
        match table.get(task_id) {
            Ok((view, _)) => ok(format!("killed {}", view.line())),
            Err(error) => Delegated::failed(error.to_string()),
        }
    }

    /// One status line per background task the session keeps, then how many were dropped.
    pub(crate) fn list_tasks(turn: &Turn) -> String {
        let (tasks, dropped) = turn.memory().tasks().list();
        table::describe_tasks(&tasks, dropped)
    }

    /// One line per child of the session, and why one cannot be continued.
    pub(crate) fn list_children(&self, turn: &Turn) -> String {
        let (children, unusable) = turn.memory().tasks().children();
        let available = |name: &str| self.catalog.targets.iter().any(|t| t.name == name);
        table::describe_children(&children, &unusable, available)
    }
}

/// A successful result.
fn ok(text: String) -> Delegated {
    Delegated {
        text,
        failed: false,
        session: None,
        resumable: None,
        usage: None,
    }
}

/// Adds what background task `task_id`'s child spent to `turn`, once: the turn its result
/// reaches counts it (`task_output` here, a completion notice in the model's loop).
pub(crate) fn count_spending(turn: &Turn, table: &table::Tasks, task_id: &str) {
    if let Some((name, usage)) = table.take_spending(task_id)
        && let Err(error) = turn.spent_child(&name, &usage)
    {
        tracing::debug!(error = %protocol::report::describe(&error), "could not report usage");
    }
}

/// Adds what a child reported spending to the calling turn (its total, its breakdown, the
/// session's), so the turn's usage is the tree's.
fn spent(turn: &Turn, name: &str, result: &Delegated) {
    if let Some(usage) = &result.usage
        && let Err(error) = turn.spent_child(name, usage)
    {
        tracing::debug!(error = %protocol::report::describe(&error), "could not report usage");
    }
}

/// Whether a child whose run ended with `result` can take a `send_message`: its process stays
/// alive for it (`live`), or its session can be loaded in a fresh process (its agent reported a
/// session id and did not say it cannot load one). `Children::message` refuses the rest.
fn continuable(result: &Delegated, live: bool) -> bool {
    live || (result.session.is_some() && result.resumable != Some(false))
}

/// Records how a run of `child` ended, in the session's table and its store, and keeps its
/// process alive (`live`) when it stays for more messages.
fn record(memory: &Memory, child: &str, result: &Delegated, live: Option<Arc<LiveChild>>) {
    let table = memory.tasks();
    if let Some(record) = table.child_ended(
        child,
        result.session.as_deref(),
        result.resumable,
        result.failed,
    ) {
        memory.record_child(record);
    }
    if let Some(live) = live {
        table.set_live(child, live);
    }
}
