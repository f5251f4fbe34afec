//! A child's process and its kept session of the run library, and the one path that drives
//! every turn of it shown somewhere.
//!
//! Invariants:
//! - at most `--max-parallel-subagents` turns of children run at once ([`Subagents::slot`]: a
//!   first turn and a `send_message` turn alike hold a slot while they run, an idle child none;
//!   a child ending after its answer holds its slot until its process is gone; waiting for a
//!   slot observes the turn's cancellation);
//! - a shown child that answered and that nothing can message (the offline `/delegate`, a turn
//!   without `send_message`) is torn down after its call returned (the session's table owns the
//!   teardown and closing the session awaits it): its exit is no part of the answer's latency.
//!   A child that could be continued by a cold resume, and the children of a cancelled turn, are
//!   gone before the call returns;
//! - a child is a kept session of the run library ([`LiveChild`]) from its first turn on; the
//!   task reading its run's events ([`Forwarded`], on this runtime: no thread per child) and its
//!   permission handler send what its run observes where its [`Route`] points: to
//!   the turn in flight that shows it, installed by that turn before the turn starts and cleared
//!   once it answered (the library hands a turn's result over only once its events were read past
//!   that turn's updates, so each turn is delivered whole); with no turn installed (a background
//!   child's first turn, a child idle between turns) its updates are dropped and its permission
//!   requests answered by the policy (`relay` rejects);
//! - one path ([`LiveChild::drive`]) runs every turn shown somewhere: a foreground first turn
//!   ([`Subagents::run`]) and a `send_message` turn ([`Subagents::send`]) alike; the parent turn's
//!   `session/cancel` cancels the child of every turn it shows and the call then waits for the
//!   turn's result, so no child of a cancelled turn outlives it;
//! - with `--child-idle-timeout`, a child that completed its first turn stays alive, idle; a
//!   message to a child whose process is gone is a cold resume (`session/load` in a fresh
//!   process); a message has no output schema: its answer is plain text;
//! - a child in a worktree of its own (`isolation: worktree`) is never kept: its call's answer
//!   is its run's final result, after its process is gone and its worktree settled, so the
//!   result says what became of the worktree (committed on its branch, removed, or kept);
//! - the credential values this agent handed a child never get past it: what it relays of the
//!   child is redacted ([`LiveChild::redacted`], [`Forwarded`], [`Relay`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use acp_host::permission::{Decision, DecisionFuture, PermissionHandler};
use acp_host::run::{self, Cancel, RunOptions};
use agent_client_protocol::v1::schema::{ContentBlock, MessageId, SessionUpdate, ToolCallId};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use protocol::child_session::{MAX_STDERR_TAIL_BYTES, stderr_end};
use protocol::env_scrub::Redactor;
use protocol::events::Event;
use protocol::permission::{Answer, DecidedBy, PermissionRequest};
use protocol::result::{ErrorKind, RunResult};
use protocol::status::Status;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use protocol::definition::RunPermission;

use super::catalog::{Start, Subagents};
use super::exposure::{Seen, View};
use super::table::Tasks;
use super::{Delegated, label};
use crate::backend::CANCELLED;
use crate::backend::Turn;
use crate::backend::permission::{self, Via};

impl Subagents {
    /// Holds one of the `--max-parallel-subagents` slots, unless `cancelled` completes first:
    /// every turn of a child (its first, a message) holds one while it runs; an idle child holds
    /// none. `Err` is the call's result.
    async fn slot(
        &self,
        cancelled: impl Future<Output = ()>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Delegated> {
        tokio::select! {
            biased;
            () = cancelled => Err(Delegated::failed(CANCELLED)),
            slot = Arc::clone(&self.slots).acquire_owned() => {
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
            token_budget,
            worktree,
            trace,
        } = start;
        // A child in a worktree is never kept: its answer is its run's final result, which says
        // what became of its worktree (settled once its process is gone).
        let whole_run = worktree.is_some();
        let route = Arc::new(Route::default());
        let redactor = Arc::new(prepared.redactor().clone());
        // The child's events are read on this runtime, by a task of their own: no thread per child.
        let (events, stream) = run::event_stream();
        let forwarded = Forwarded {
            route: Arc::clone(&route),
            redactor: Arc::clone(&redactor),
        };
        let options = RunOptions {
            events: Some(events),
            permissions: (permission == RunPermission::Relay).then(|| {
                Arc::new(Relay {
                    route: Arc::clone(&route),
                    redactor: Arc::clone(&redactor),
                }) as Arc<dyn PermissionHandler>
            }),
            worktree,
            trace: Some(trace),
            ..RunOptions::default()
        };
        let (first, first_rx) = oneshot::channel();
        let (follow_ups, follow_ups_rx) = mpsc::channel(1);
        let session = run::Session {
            first,
            follow_ups: follow_ups_rx,
            // Not kept: no message can come in no time, so the session ends with its first turn.
            idle_timeout: Some(
                self.idle_timeout
                    .filter(|_| keep && !whole_run)
                    .unwrap_or(Duration::ZERO),
            ),
        };
        let live = Arc::new(LiveChild {
            name,
            follow_ups,
            cancel: cancel.clone(),
            route,
            redactor,
            rejections: Arc::default(),
            handle: std::sync::Mutex::new(None),
            token_budget,
        });
        let first = {
            let live = Arc::clone(&live);
            async move {
                // Ends once the run is over and its sink is gone.
                tokio::spawn(forwarded.forward_all(stream));
                let handle = tokio::spawn(async move {
                    if !whole_run {
                        return run::run_session(prepared, &options, &cancel, session).await;
                    }
                    let result = run::run(prepared, &options, &cancel).await;
                    let run::Session { first, .. } = session;
                    let _ = first.send(result.clone());
                    result
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
    /// (`keep`, the turn completed, the session still open); otherwise the child is closed. With
    /// `later` (the session's table), its teardown goes on after this returns, holding `slot`
    /// until its process is gone, and closing the session awaits it; without, its process is
    /// gone before this returns.
    async fn settle(
        live: Arc<LiveChild>,
        result: Option<RunResult>,
        resume: bool,
        keep: bool,
        (slot, later): (tokio::sync::OwnedSemaphorePermit, Option<&Tasks>),
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let Some(result) = result else {
            live.close().await;
            return (live.abnormal(), None);
        };
        let completed = result.status == Status::Completed;
        let delegated = live.redacted(outcome(&live.name, result, resume, live.token_budget));
        if keep && completed && live.is_open() {
            return (delegated, Some(live));
        }
        match later {
            Some(table) => {
                table
                    .tear_down_later(async move {
                        live.close().await;
                        drop(slot);
                    })
                    .await;
            }
            None => live.close().await,
        }
        (delegated, None)
    }

    /// Runs a validated start with nobody to ask (a background task): no route is installed, so
    /// its permission requests are answered by policy (`relay` rejects: the turn that could ask
    /// may be over) and nothing of it is shown; `cancel` stops it; `running` is set once it holds
    /// a slot. With `keep` and an idle timeout, a child that answered its turn stays alive for
    /// further messages ([`LiveChild`]); otherwise, or when its turn did not complete, its
    /// process is gone when this returns.
    pub(super) async fn run_detached(
        &self,
        start: Start,
        cancel: Cancel,
        running: &std::sync::atomic::AtomicBool,
        keep: bool,
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let slot = match self.slot(cancel.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return (refused, None),
        };
        running.store(true, std::sync::atomic::Ordering::Release);
        let resume = start.resume;
        let keep = keep && self.idle_timeout.is_some();
        let (live, first) = self.spawn(start, cancel, keep);
        let result = first.await;
        // The task's result waits for the teardown: nobody waits on it, and the table's
        // shutdown awaits the task.
        Self::settle(live, result, resume, keep, (slot, None)).await
    }

    /// Runs a validated start (`start`, labelled `description`, on `prompt`) for tool call `call`
    /// of `turn`, to its result ([`LiveChild::drive`] shows it); with an output schema, the
    /// result is the child's checked JSON answer. With `keep` (something could message it) and an
    /// idle timeout, a child that answered stays alive, idle, and is returned; with `keep` and
    /// none, its process is gone when this returns (a cold resume must find its session closed);
    /// without `keep`, it is torn down after this returns (the session's table awaits it, the
    /// slot is held until its process is gone). When the turn was cancelled, its process is gone
    /// when this returns.
    pub(super) async fn run(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        start: Start,
        prompt: &str,
        description: Option<&str>,
        keep: bool,
    ) -> (Delegated, Option<Arc<LiveChild>>) {
        let slot = match self.slot(turn.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return (refused, None),
        };
        let resume = start.resume;
        // Something could message it later (by a cold resume of its session, if it is not kept).
        let continued = keep;
        let keep = keep && self.idle_timeout.is_some();
        let (live, first) = self.spawn(start, Cancel::new(), keep);
        let shown = Shown {
            turn,
            call,
            task: label(description, prompt),
            exists: false,
        };
        let result = live.drive(&shown, first).await;
        if turn.is_cancelled() {
            live.close().await;
            drop(slot);
            return (cancelled(result.as_ref()), None);
        }
        // A child nothing can message is torn down after this returns; one that could be
        // continued is gone first, so a cold resume never finds its session still open.
        let table = (!continued).then(|| Arc::clone(turn.memory().tasks()));
        Self::settle(live, result, resume, keep, (slot, table.as_deref())).await
    }

    /// Delivers `message` to a child kept alive (`live`) as its next turn, shown on tool call
    /// `call` of `turn` exactly like a first turn ([`LiveChild::drive`]): its updates shown or
    /// relayed, its permission requests relayed, a new announced session when the client speaks
    /// subagent sessions, the turn's cancellation honoured (which ends the child). `None` when it
    /// no longer takes messages (then nothing was sent). A follow-up has no output schema: its
    /// answer is plain text. `accepted` runs once the child's queue took the message (not when
    /// the wait for a slot was refused, nor when the queue had closed).
    pub(super) async fn send(
        &self,
        turn: &Turn,
        call: &ToolCallId,
        live: &LiveChild,
        message: &str,
        accepted: impl FnOnce(),
    ) -> Option<Delegated> {
        let _slot = match self.slot(turn.cancelled()).await {
            Ok(slot) => slot,
            Err(refused) => return Some(refused),
        };
        let permit = live.follow_ups.reserve().await.ok()?;
        accepted();
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
            exists: true,
        };
        let result = live.drive(&shown, answer).await;
        if turn.is_cancelled() {
            return Some(cancelled(result.as_ref()));
        }
        Some(match result {
            Some(result) => live.redacted(outcome(&live.name, result, false, live.token_budget)),
            None => live.abnormal(),
        })
    }
}

/// The result of a call whose turn was cancelled (with the child's session, to continue it).
fn cancelled(result: Option<&RunResult>) -> Delegated {
    Delegated {
        session: result.and_then(|result| result.session_id.clone()),
        resumable: result.and_then(|result| result.resumable),
        usage: result.and_then(|result| result.usage.clone()),
        ..Delegated::failed(CANCELLED)
    }
}

/// The parent turn a turn of a child is shown on: its tool call, and the task the child's
/// session is announced with.
struct Shown<'a> {
    turn: &'a Turn,
    call: &'a ToolCallId,
    task: String,
    /// The child's session exists already (a message to a live child): announced at once, not
    /// once its run reports it ready.
    exists: bool,
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
    /// The person's rejections of its relayed requests in a row: past [`MAX_REJECTIONS`] its
    /// further requests are rejected without asking (a child asking thousands of times must not
    /// become thousands of prompts).
    rejections: Arc<Rejections>,
    /// Set once its run is spawned.
    handle: std::sync::Mutex<Option<tokio::task::JoinHandle<RunResult>>>,
    /// Its token budget, named when a turn passes it.
    token_budget: Option<u64>,
}

/// After this many consecutive rejections by the person, a child's requests are rejected
/// without asking, for the rest of its life.
pub(super) const MAX_REJECTIONS: u32 = 3;

/// A child's consecutive rejections, and whether the person was told asking stopped.
#[derive(Debug, Default)]
struct Rejections {
    in_a_row: std::sync::atomic::AtomicU32,
    told: std::sync::atomic::AtomicBool,
}

impl Rejections {
    fn stopped(&self) -> bool {
        self.in_a_row.load(std::sync::atomic::Ordering::Acquire) >= MAX_REJECTIONS
    }

    /// Counts a decision the person made: a rejection adds one, anything else starts over.
    fn count(&self, decision: Decision) {
        if decision.decided_by != DecidedBy::User {
            return;
        }
        if decision.answer.verdict() == protocol::permission::Verdict::Reject {
            self.in_a_row
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        } else if decision.answer.verdict() == protocol::permission::Verdict::Allow {
            self.in_a_row.store(0, std::sync::atomic::Ordering::Release);
        }
    }
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
        let Shown {
            turn,
            call,
            task,
            exists,
        } = shown;
        let name = self.name.as_str();
        // Fired once the turn answered: relayed requests still pending are withdrawn.
        let turn_over = CancellationToken::new();
        let mut view = View::new(
            turn,
            call,
            name,
            task,
            (self.cancel.clone(), turn_over.clone()),
        );
        if *exists {
            view.announce();
        }
        let (updates, mut update_rx) = mpsc::channel(CHILD_QUEUE);
        let (asks, mut ask_rx) = mpsc::unbounded_channel();
        self.route.install(Routed {
            updates,
            all: view.relays_all(),
            asks,
        });
        let mut relays = FuturesUnordered::new();
        let backlog = turn.backlog();
        tokio::pin!(answer);
        let result = loop {
            let exposed_cancel = view.exposed_cancel();
            tokio::select! {
                biased;
                result = &mut answer => break result,
                () = turn.cancelled(), if !self.cancel.is_cancelled() => self.cancel.cancel(),
                () = exposed_cancel.cancelled(), if !self.cancel.is_cancelled() => self.cancel.cancel(),
                Some(()) = relays.next(), if !relays.is_empty() => {}
                Some((request, answer)) = ask_rx.recv() => {
                    // The updates already delivered first (the tool call asked about).
                    while let Ok(seen) = update_rx.try_recv() {
                        view.take(seen);
                    }
                    view.announce();
                    if self.rejections.stopped() {
                        let _ = answer.send(Decision {
                            answer: Answer::Reject,
                            decided_by: DecidedBy::Policy,
                        });
                        if !self.rejections.told.swap(true, std::sync::atomic::Ordering::AcqRel) {
                            stopped_asking(turn, call, name);
                        }
                        continue;
                    }
                    let via = view.via(&request, &turn_over);
                    relays.push(relay(turn, via, request, answer, &self.rejections));
                }
                // A child's session takes no more of its updates while the client is behind;
                // its text for a card is coalesced meanwhile.
                Some(seen) = update_rx.recv(), if !view.relays_all() || backlog.has_room() => {
                    view.take(seen);
                }
                () = backlog.room(), if view.waits_for_room() && !backlog.has_room() => view.tick(),
                () = view.card_due(), if backlog.has_room() => view.tick(),
            }
        };
        // The run library hands a turn's result over only once its events were read past the
        // turn's updates: what is left of them is in the channel, which ends with the route.
        self.route.clear();
        turn_over.cancel();
        while relays.next().await.is_some() {}
        while let Some(seen) = update_rx.recv().await {
            if view.relays_all() {
                tokio::select! {
                    biased;
                    () = turn.cancelled() => {}
                    () = backlog.room() => {}
                }
            }
            view.take(seen);
        }
        view.end(result.as_ref(), &self.redactor);
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

/// The most of what a child's run saw that waits for the turn showing it; past it [`Forwarded`]
/// waits, and once the run's budget is spent so does the run: it stops reading the child's
/// stdout, and the child blocks on a full
/// pipe (the end of the backpressure from a client that is behind: [`crate::outbox`]).
const CHILD_QUEUE: usize = 32;

/// The turn a [`Route`] points to.
#[derive(Debug)]
struct Routed {
    updates: mpsc::Sender<Seen>,
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
fn outcome(name: &str, result: RunResult, resume: bool, budget: Option<u64>) -> Delegated {
    // A cold resume its agent refused before the prompt (no `loadSession`, or a start-time
    // capability it cannot honour): the library's message says why and names the agent.
    if resume
        && result.error_kind == Some(ErrorKind::Capability)
        && let Some(error) = &result.error
    {
        return Delegated::failed(format!("subagent {name} cannot be continued: {error}"));
    }
    let worktree = result.worktree.as_ref().map(worktree_line);
    let mut delegated = if result.status == Status::Completed {
        Delegated {
            text: result
                .structured
                .as_ref()
                .map_or(result.output, ToString::to_string),
            failed: false,
            session: result.session_id,
            resumable: result.resumable,
            usage: result.usage,
        }
    } else {
        Delegated {
            session: result.session_id.clone(),
            resumable: result.resumable,
            usage: result.usage.clone(),
            ..ended(name, &result, budget)
        }
    };
    if let Some(line) = worktree {
        delegated.text.push_str("\n\n");
        delegated.text.push_str(&line);
    }
    delegated
}

/// What became of a child's worktree, for the call's result and its card: the record's line
/// (path, branch, commit, diff stat), and what is left to the parent.
fn worktree_line(record: &protocol::worktree::WorktreeRecord) -> String {
    use protocol::worktree::Outcome;
    let next = match record.outcome {
        Outcome::Removed => "",
        Outcome::Committed => " Nothing was merged: merge or cherry-pick the branch to take it.",
        Outcome::Uncommitted | Outcome::Interrupted => {
            " Nothing was committed or merged: look at the worktree before using it."
        }
    };
    format!("[{}.{next}]", record.describe())
}

/// A child's result when it did not complete: its status, stop reason and error, the end of its
/// stderr (an agent that fails says why there: a missing login, a refusal to run as root), then
/// its output so far.
fn ended(name: &str, result: &RunResult, budget: Option<u64>) -> Delegated {
    let mut text = format!("subagent {name} ended {}", result.status);
    match (&result.usage, budget) {
        // Cancelled for it: what it spent and its budget say it all.
        (Some(usage), Some(budget)) if result.status == Status::OverBudget => {
            let _ = write!(text, " ({} tokens, budget {budget})", usage.total_tokens);
        }
        _ => {
            if let Some(reason) = &result.stop_reason {
                let _ = write!(text, " (stop reason {reason})");
            }
            if let Some(error) = &result.error {
                let _ = write!(text, ": {error}");
            }
        }
    }
    let stderr = stderr_end(&result.stderr_tail, MAX_STDERR_TAIL_BYTES);
    if !stderr.is_empty() {
        tracing::debug!(subagent = name, %stderr, "a child did not complete");
        text.push_str("\n\nIts stderr (the end):\n");
        text.push_str(stderr);
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
    rejections: &Rejections,
) {
    let decision = match via {
        Some(via) => permission::relay(turn, via, &request).await,
        None => Decision {
            answer: Answer::Reject,
            decided_by: DecidedBy::Policy,
        },
    };
    rejections.count(decision);
    // The child's run may have ended meanwhile; nobody waits for the answer then.
    let _ = answer.send(decision);
}

/// Tells the person, once, on the child's tool card, that its requests are no longer asked.
fn stopped_asking(turn: &Turn, call: &ToolCallId, name: &str) {
    tracing::info!(
        subagent = name,
        "rejecting a child's further requests without asking"
    );
    let text = format!(
        "subagent {name}: you rejected {MAX_REJECTIONS} of its requests in a row; its further \
         requests are rejected without asking"
    );
    let fields =
        agent_client_protocol::v1::schema::ToolCallUpdateFields::new().content(vec![text.into()]);
    if let Err(error) = turn.update_tool_call(call, fields) {
        tracing::debug!(error = %protocol::report::describe(&error), "cannot tell the card");
    }
}

/// Forwards the child run's updates (with the child session each is of, `None` for the run's
/// own) to the turn its [`Route`] points to: all of them, or only the run's own text (the tool
/// card).
struct Forwarded {
    route: Arc<Route>,
    redactor: Arc<Redactor>,
}

impl Forwarded {
    /// Forwards every event of the run, in order, until the run is over. While the turn is
    /// behind this waits, and so, once what it has not read fills the run's observer budget,
    /// does the run: a full queue to the turn is the backpressure on the child.
    async fn forward_all(self, mut events: run::EventStream) {
        while let Some(event) = events.recv().await {
            self.forward(event).await;
        }
    }

    async fn forward(&self, event: Event) {
        let wanted = |to: &&Routed| match &event {
            Event::Start(_) => true,
            Event::Update {
                session_id, update, ..
            } => {
                to.all
                    || (session_id.is_none()
                        && matches!(update, SessionUpdate::AgentMessageChunk(_)))
            }
            _ => false,
        };
        let Some(updates) = self
            .route
            .lock()
            .as_ref()
            .filter(wanted)
            .map(|to| to.updates.clone())
        else {
            return;
        };
        let seen = match event {
            Event::Update {
                session_id, update, ..
            } => match redacted(&self.redactor, update) {
                Some(update) => Seen::Update(session_id, update),
                None => return,
            },
            _ => Seen::Ready,
        };
        // Waits while the turn is behind; the receiver is gone only once the turn has its result.
        let _ = updates.send(seen).await;
    }
}

/// `update` with `redactor`'s values redacted in every string of it; `None` when that leaves
/// something the schema does not decode (dropped, as the client could not read it either).
fn redacted(redactor: &Redactor, mut update: SessionUpdate) -> Option<SessionUpdate> {
    if redactor.is_empty() {
        return Some(update);
    }
    // The streaming shape, redacted in place: a text chunk's strings are its text and id.
    if let SessionUpdate::AgentMessageChunk(chunk)
    | SessionUpdate::AgentThoughtChunk(chunk)
    | SessionUpdate::UserMessageChunk(chunk) = &mut update
        && let ContentBlock::Text(text) = &mut chunk.content
        && chunk.meta.is_none()
        && text.meta.is_none()
        && text.annotations.is_none()
    {
        text.text = redactor.redact(&text.text);
        chunk.message_id = chunk
            .message_id
            .take()
            .map(|id| MessageId::new(redactor.redact(&id.0)));
        return Some(update);
    }
    // Anything else through its serde tree: the schema offers no walk over its strings.
    let mut value = serde_json::to_value(&update)
        .inspect_err(
            |error| tracing::debug!(%error, "dropped a child's update that does not encode"),
        )
        .ok()?;
    redact_strings(redactor, &mut value);
    serde_json::from_value(value)
        .inspect_err(
            |error| tracing::debug!(%error, "dropped a child's update that does not decode"),
        )
        .ok()
}

/// Redacts `redactor`'s values in every string of `value` (an update's serde tree).
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
        if !self.redactor.is_empty() {
            // The tool call relayed with it (a diff of a file holding a key, a command line).
            request.tool_call = request.tool_call.and_then(|fields| {
                let mut value = serde_json::to_value(&*fields).ok()?;
                redact_strings(&self.redactor, &mut value);
                serde_json::from_value(value).ok().map(Box::new)
            });
        }
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
