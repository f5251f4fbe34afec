//! One run: validate -> spawn -> drive -> settle -> teardown, returning a [`RunResult`] on every
//! path after validation.
//!
//! Where it lives: this module holds the public API and the sequence of one run (`run_with`);
//! `prepare` validates a request before anything is spawned, `session` keeps an agent and its
//! session between turns, `supervise` watches the drive (cancel, deadline, the agent's exit) and
//! tears down, `settle` maps how the drive ended onto the result, `observers` delivers events.
//!
//! Invariants:
//! - after validation nothing panics or hangs: spawn, transport and protocol failures become
//!   status `error` with a message; the handshake has a deadline; cancellation (the injected
//!   [`Cancel`]) settles without the agent's cooperation within the cancel grace;
//! - teardown runs on every path once a process exists, and the result records how it ended;
//! - the run id is minted here, never taken from the agent;
//! - what the request asks of the agent at start (persona, model, tool filter, an explicit depth
//!   cap) is honoured or the run ends `error` with kind `capability` before the prompt is sent
//!   (`protocol::capabilities`);
//! - memory is flat in the length of a run: the output keeps its tail (`max_output_bytes`),
//!   permission records and tool-call notes are capped with counts of what was dropped, and
//!   observers are fed through a bounded queue ([`OBSERVER_BUDGET_BYTES`]).

mod observers;
mod prepare;
mod session;
mod settle;
mod supervise;

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::events::{EndEvent, Event};
use protocol::result::{DEFAULT_MAX_OUTPUT_BYTES, ErrorKind, RunResult};
use protocol::status::Status;
use tokio_util::sync::CancellationToken;

use self::observers::Notifier;
pub use self::observers::{EventSink, EventStream, event_stream};
pub use self::prepare::{PrepareError, Prepared, prepare, resolve_cwd};
use self::session::{KeptSession, session_turns};
use self::settle::{record_teardown, settle_turn, spawn_failure_message};
use self::supervise::{Drive, Supervised, drive_config, supervise, tear_down};
use crate::client::{self, ResultOf, Shared};
use crate::lock;
use crate::permission::PermissionHandler;
use crate::process::{AgentProcess, Graces, SpawnError, SpawnSpec, StderrSink};

/// Default limit of one frame on the agent's stdout.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Default size of the stderr tail kept for the result.
pub const DEFAULT_STDERR_TAIL_BYTES: usize = 16 * 1024;
/// Bytes of events queued for observers at most; past it the drive waits for them, which stops
/// the reading of the agent's stdout: backpressure instead of buffering.
pub const OBSERVER_BUDGET_BYTES: usize = 1024 * 1024;

/// Error returned by an observer; logged, never propagated.
pub type ObserverError = Box<dyn std::error::Error + Send + Sync>;

/// Sees every event of a run (lifecycle `subagent/start` / `subagent/end`, updates, permission
/// decisions, the agent's stderr lines). Observe-only; called from the run's tasks, so it should
/// return quickly.
pub trait Observer: Send + Sync {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError>;

    /// Called after a burst of events, before the observer's thread waits for more: an observer
    /// that buffers its output writes it now.
    fn flush(&self) {}
}

/// Cancellation of a run, injected by the caller (Ctrl-C handler, a parent agent, a test).
///
/// `cancel` is graceful: session/cancel, then a bounded wait, then the teardown ladder. `kill`
/// skips the graces (a second Ctrl-C). `cancel_session` cancels one child session the agent
/// exposed, and the run goes on.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    graceful: CancellationToken,
    immediate: CancellationToken,
    sessions: Arc<client::SessionCancels>,
}

impl Cancel {
    #[must_use]
    pub fn new() -> Self {
        Cancel::default()
    }

    pub fn cancel(&self) {
        self.graceful.cancel();
    }

    pub fn kill(&self) {
        self.graceful.cancel();
        self.immediate.cancel();
    }

    /// Cancels one child session the agent announced in this run (ACP subagent sessions, as
    /// observers see them in `Event::Update`'s `session_id`): `session/cancel` naming it is sent to the
    /// agent while the prompt runs, and the run itself goes on. An id the agent did not announce
    /// is ignored.
    pub fn cancel_session(&self, session_id: &str) {
        self.sessions.push(session_id);
    }

    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.graceful.is_cancelled()
    }

    /// Resolves once the run is cancelled (gracefully or killed).
    pub async fn cancelled(&self) {
        self.graceful.cancelled().await;
    }
}

/// Host-side settings that are not part of the start request.
#[derive(Clone, Default)]
pub struct RunOptions {
    pub observers: Vec<Arc<dyn Observer>>,
    /// Where the events go instead, for a caller that reads them on its own runtime
    /// ([`event_stream`]): no observers' thread is started, and `observers` are not called.
    pub events: Option<EventSink>,
    /// Decides the agent's permission requests; `None` applies the request's policy (where `ask`,
    /// with nobody to ask, rejects).
    pub permissions: Option<Arc<dyn PermissionHandler>>,
    /// `None` uses [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: Option<usize>,
    /// `None` uses [`DEFAULT_STDERR_TAIL_BYTES`].
    pub stderr_tail_bytes: Option<usize>,
    /// The most bytes of output the result keeps (the tail); `None` uses
    /// [`DEFAULT_MAX_OUTPUT_BYTES`].
    pub max_output_bytes: Option<usize>,
    /// The most bytes of a turn's text a structured answer is read from (a longer answer is a
    /// violation naming this limit); `None` uses [`DEFAULT_MAX_OUTPUT_BYTES`].
    pub max_answer_bytes: Option<usize>,
    /// Run the agent in a git worktree of its own (`isolation: worktree`): made from the
    /// repository's `HEAD` before the agent starts, its working directory the same folder inside
    /// it (and, sandboxed, the worktree its writable root in place of that folder); settled once
    /// the agent's tree is gone (removed when unchanged, else committed on its branch or kept),
    /// as the result's `worktree` says. A worktree that cannot be made ends the run `error`
    /// with kind `worktree`, nothing spawned.
    pub worktree: Option<crate::worktree::Spec>,
    /// The trace this run continues (W3C trace context): the run's own span is made under it and
    /// its context goes to the agent in `_meta` of every request; `None` starts a new trace.
    pub trace: Option<protocol::trace::TraceParent>,
}

/// A new span: under `parent` (the same trace, its state kept), else the root of a new trace.
/// Ids are a v4 UUID's random bytes. Each run makes its own with this; a caller grouping runs
/// (a batch's span, acp-child's turn) makes the parent it passes in [`RunOptions::trace`].
#[must_use]
pub fn new_span(parent: Option<&protocol::trace::TraceParent>) -> protocol::trace::TraceParent {
    let first = *uuid::Uuid::new_v4().as_bytes();
    let mut span_id = [0; 8];
    span_id.copy_from_slice(&first[..8]);
    if let Some(parent) = parent {
        return parent.child(span_id);
    }
    let mut random = [0; 24];
    random[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    random[16..].copy_from_slice(&span_id);
    protocol::trace::TraceParent {
        span: protocol::trace::SpanContext::root(random),
        state: None,
    }
}

/// Runs a prepared request to its result. Never panics on agent misbehaviour; always tears down.
pub async fn run(prepared: Prepared, options: &RunOptions, cancel: &Cancel) -> RunResult {
    run_with(prepared, options, cancel, None).await
}

/// A further prompt for a kept session and where its turn's result goes.
#[derive(Debug)]
pub struct FollowUp {
    pub prompt: String,
    pub reply: tokio::sync::oneshot::Sender<RunResult>,
}

/// How the caller talks to a kept session ([`run_session`]).
#[derive(Debug)]
pub struct Session {
    /// Gets the first turn's result (or, when the run ends before it, the final one).
    pub first: tokio::sync::oneshot::Sender<RunResult>,
    /// Further prompts, one turn at a time; dropping the sender ends the session.
    pub follow_ups: tokio::sync::mpsc::Receiver<FollowUp>,
    /// Ends the session when no prompt came for this long after a turn; `None` waits forever.
    pub idle_timeout: Option<Duration>,
}

/// Like [`run`], but the agent and its session are kept after the first turn and answer each
/// [`FollowUp`] with that turn's result, until the caller drops its sender, the idle timeout
/// passes, the run is cancelled, or a turn ends without a stop reason; then teardown. Returns the
/// final result (also sent to a turn still waiting for one).
pub async fn run_session(
    prepared: Prepared,
    options: &RunOptions,
    cancel: &Cancel,
    session: Session,
) -> RunResult {
    let Session {
        first,
        follow_ups,
        idle_timeout,
    } = session;
    let waiting = Arc::new(std::sync::Mutex::new(Some(first)));
    let kept = KeptSession {
        waiting: Arc::clone(&waiting),
        follow_ups: tokio::sync::Mutex::new(follow_ups),
        idle_timeout,
    };
    let result = run_with(prepared, options, cancel, Some(kept)).await;
    let reply = lock(&waiting).take();
    if let Some(reply) = reply {
        let _ = reply.send(result.clone());
    }
    result
}

async fn run_with(
    prepared: Prepared,
    options: &RunOptions,
    cancel: &Cancel,
    kept: Option<KeptSession>,
) -> RunResult {
    let started = Instant::now();
    let Prepared {
        request,
        mut env,
        budget,
        schema,
        sandbox,
    } = prepared;
    let run_id = uuid::Uuid::new_v4().to_string();
    let mut request = request;
    let mut sandbox = sandbox;
    // Made before the start event, which names the agent's working directory; not when the run
    // is refused anyway.
    let worktree = match &options.worktree {
        Some(spec) if budget.is_ok() && !cancel.is_cancelled() => {
            let made = make_worktree(spec, &request, &run_id).await;
            if let Ok(created) = &made {
                sandbox = sandbox.moved(&request.cwd, &created.root);
                if sandbox.is_active() {
                    env.env.insert(
                        protocol::env_vars::ACP_HOST_SANDBOX.into(),
                        sandbox.env_value().into(),
                    );
                }
                request.cwd.clone_from(&created.cwd);
            }
            Some(made)
        }
        _ => None,
    };
    // The run's span: what the agent receives in `_meta`, and what is exported (when on).
    let trace = new_span(options.trace.as_ref());
    let notifier = Arc::new(
        Notifier::new(
            run_id.clone(),
            (options.observers.clone(), options.events.clone()),
            request.agent.display.clone(),
            request.cwd.display().to_string(),
            env.scrubbed.clone(),
        )
        .traced(crate::telemetry::RunTrace::start(
            &trace,
            options.trace.as_ref(),
            || env.redactor.redact(&request.agent.display),
        )),
    );
    let mut result = RunResult::unsettled(run_id, env.scrubbed.clone());
    let budget = match budget {
        Ok(budget) => budget,
        Err(refused) => {
            result.set_error(ErrorKind::DepthLimit, refused.to_string());
            return finish(result, started, &notifier, false, cancel).await;
        }
    };
    if cancel.is_cancelled() {
        result.status = Status::Aborted;
        return finish(result, started, &notifier, false, cancel).await;
    }
    let created = match worktree {
        Some(Ok(created)) => Some(created),
        Some(Err(err)) => {
            result.set_error(ErrorKind::Worktree, err.to_string());
            return finish(result, started, &notifier, false, cancel).await;
        }
        None => None,
    };
    let prompt = request.prompt.clone();
    // Boxed: the drive's state is large, and every caller's future would carry it inline.
    let with_output = Box::pin(spawn_and_drive(
        Start {
            request,
            env,
            budget,
            schema,
            sandbox,
            trace,
        },
        options,
        cancel,
        kept,
        (&notifier, &mut result),
    ))
    .await;
    if let Some(created) = created {
        settle_worktree(created, options, &prompt, &mut result).await;
    }
    finish(result, started, &notifier, with_output, cancel).await
}

/// A run's start, validated, with its worktree made.
struct Start {
    request: protocol::request::StartRequest,
    env: protocol::env_scrub::Scrubbed,
    budget: protocol::depth::DepthBudget,
    schema: Option<Arc<protocol::structured::OutputSchema>>,
    sandbox: protocol::sandbox::Standing,
    /// The run's span.
    trace: protocol::trace::TraceParent,
}

/// Makes a run's worktree, off the runtime's threads (git is a blocking call).
async fn make_worktree(
    spec: &crate::worktree::Spec,
    request: &protocol::request::StartRequest,
    run_id: &str,
) -> Result<crate::worktree::Created, crate::worktree::WorktreeError> {
    let (spec, cwd, prompt, run_id) = (
        spec.clone(),
        request.cwd.clone(),
        request.prompt.clone(),
        run_id.to_owned(),
    );
    tokio::task::spawn_blocking(move || crate::worktree::create(&cwd, &spec, &prompt, &run_id))
        .await
        .unwrap_or_else(|join| Err(crate::worktree::WorktreeError::Task(join.to_string())))
}

/// Settles a run's worktree once its agent is gone, into `result.worktree`; a failure to is a
/// warning (the worktree stays for `acp-host worktrees`), never the run's error.
async fn settle_worktree(
    created: crate::worktree::Created,
    options: &RunOptions,
    prompt: &str,
    result: &mut RunResult,
) {
    let keep_dirty = options
        .worktree
        .as_ref()
        .is_some_and(|spec| spec.keep_dirty);
    let (status, prompt, run_id) = (result.status, prompt.to_owned(), result.run_id.clone());
    let settled = tokio::task::spawn_blocking(move || {
        crate::worktree::settle(&created, status, keep_dirty, &prompt, &run_id)
            .map_err(|err| (err.to_string(), created.root.display().to_string()))
    })
    .await
    .unwrap_or_else(|join| Err((join.to_string(), String::new())));
    match settled {
        Ok(record) => result.worktree = Some(record),
        Err((err, root)) => result.warnings.push(format!(
            "the worktree at {root} could not be settled and was left as it is: {err}"
        )),
    }
}

/// Spawns, drives and tears down the agent, into `result`; whether the output goes with the end
/// event (the agent ran).
async fn spawn_and_drive(
    start: Start,
    options: &RunOptions,
    cancel: &Cancel,
    kept: Option<KeptSession>,
    (notifier, result): (&Arc<Notifier>, &mut RunResult),
) -> bool {
    let Start {
        request,
        mut env,
        budget,
        schema,
        sandbox,
        trace,
    } = start;
    let Ok(confinement) = confine(&sandbox, &request, &mut env.env, result) else {
        return false;
    };

    let spec = SpawnSpec {
        program: request.agent.program.clone(),
        args: request.agent.args.clone(),
        cwd: request.cwd.clone(),
        env: env.env,
        stderr_tail_bytes: options
            .stderr_tail_bytes
            .unwrap_or(DEFAULT_STDERR_TAIL_BYTES),
        // Observers see each line with credential values redacted, like the result's tail.
        stderr_lines: (!options.observers.is_empty() || options.events.is_some()).then(|| {
            let notifier = Arc::clone(notifier);
            let redactor = env.redactor.clone();
            Arc::new(move |line: &str| notifier.stderr(&redactor.redact(line))) as StderrSink
        }),
        sandbox: confinement.clone(),
    };
    let (mut process, pipes) = match AgentProcess::spawn_unconfirmed(&spec) {
        Ok(spawned) => spawned,
        Err(err) => {
            result.set_error(spawn_kind(&err), spawn_failure_message(&err, &request));
            return false;
        }
    };
    // The pid is stored once the agent's start is confirmed (`supervise`).
    notifier.start_after(process.first_write());

    let shared = Arc::new(Shared::new(
        options.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
        request.budget,
        request.on_unreported,
    ));
    let timeouts = request.timeouts;
    // The agent's stdout is drained until teardown is over (an agent flushing on EOF must not
    // die of EPIPE), then left.
    let drain_until = CancellationToken::new();
    let _stop_draining = drain_until.clone().drop_guard();
    let (turns, busy) = session_turns(kept, result, &request, &env.redactor, &shared);
    let drive = Drive {
        config: drive_config(&request, options, (budget, trace), schema, cancel, turns),
        pipes,
        shared: &shared,
        notifier,
        cancel,
        overall: timeouts.overall,
        drain_until,
        busy,
    };
    let Supervised {
        end,
        killed,
        timed_out,
        not_started,
    } = supervise(&mut process, drive).await;
    // The agent never ran (its exec failed under the watchdog): the run is a spawn failure, as
    // if the spawn itself had failed.
    if let Some(err) = not_started.or_else(|| process.confirm().err()) {
        process.shutdown(Graces::NONE).await;
        result.set_error(spawn_kind(&err), spawn_failure_message(&err, &request));
        return false;
    }

    let teardown = tear_down(&mut process, killed, &timeouts, cancel, notifier).await;
    record_teardown(result, &teardown, &process);
    settle_turn(
        result,
        ResultOf::Run,
        end,
        timed_out,
        &request,
        &shared,
        &env.redactor,
    );
    true
}

/// The sandbox of a run, prepared (`None` when it asks for none) and reported in `result`, or
/// refused (`Err`: `result` says why); the agent's `TMPDIR` becomes its own temporary folder,
/// which goes when the caller drops the confinement (after teardown).
fn confine(
    sandbox: &protocol::sandbox::Standing,
    request: &protocol::request::StartRequest,
    env: &mut std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>,
    result: &mut RunResult,
) -> Result<Option<Arc<crate::sandbox::Confinement>>, ()> {
    if !sandbox.is_active() {
        return Ok(None);
    }
    let place = crate::sandbox::Place {
        env,
        sessions: request
            .resume
            .iter()
            .chain(&request.fork)
            .map(String::as_str)
            .collect(),
    };
    let confinement = crate::sandbox::confine(sandbox, &place)
        .map_err(|err| result.set_error(ErrorKind::Sandbox, err.to_string()))?;
    if let Some(temp) = confinement.temp_dir() {
        env.insert("TMPDIR".into(), temp.into());
    }
    result.sandbox = Some(confinement.report().clone());
    Ok(Some(Arc::new(confinement)))
}

/// A spawn error's kind: the sandbox's own, or a spawn failure.
fn spawn_kind(err: &SpawnError) -> ErrorKind {
    match err {
        SpawnError::Sandbox { .. } => ErrorKind::Sandbox,
        _ => ErrorKind::Spawn,
    }
}

/// Delivers the end event (with the output as its last message when `with_output`) and waits
/// for the observers. The output is shared with the event, not copied, and taken back once the
/// observers are done with it (copied only if one still holds it).
async fn finish(
    mut result: RunResult,
    started: Instant,
    notifier: &Notifier,
    with_output: bool,
    cancel: &Cancel,
) -> RunResult {
    result.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let output = with_output.then(|| Arc::new(std::mem::take(&mut result.output)));
    notifier.deliver_now(Event::End(EndEvent {
        run_id: result.run_id.clone(),
        provider: notifier.agent().to_owned(),
        status: result.status,
        stop_reason: result.stop_reason.clone(),
        last_assistant_message: output.clone(),
    }));
    // Before the observers catch up: after a cancel, the process may end while they do.
    notifier.trace().end(&result);
    notifier.caught_up(cancel).await;
    if let Some(output) = output {
        result.output = Arc::try_unwrap(output).unwrap_or_else(|shared| (*shared).clone());
    }
    result
}
