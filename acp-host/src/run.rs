//! One run: validate -> spawn -> drive -> settle -> teardown, returning a [`RunResult`] on every
//! path after validation.
//!
//! Invariants:
//! - validation ([`prepare`]) happens before anything is spawned; its errors are usage errors (an
//!   output schema that does not compile among them);
//! - after validation nothing panics or hangs: spawn, transport and protocol failures become
//!   status `error` with a message; the handshake has a deadline; cancellation (the injected
//!   [`Cancel`]) settles without the agent's cooperation within the cancel grace;
//! - teardown runs on every path once a process exists, and the result records how it ended;
//! - the run id is minted here, never taken from the agent;
//! - what the request asks of the agent at start (persona, model, tool filter, an explicit depth
//!   cap) is honoured or the run ends `error` with kind `capability` before the prompt is sent
//!   (`protocol::capabilities`);
//! - the agent's `ACP_HOST_DEPTH` / `ACP_HOST_MAX_DEPTH` are set here from the caller's own
//!   (`protocol::depth`), overriding any forwarded value; a start past the cap is refused with
//!   `depth-limit` before anything is spawned (a budget against runaway recursion, not a security
//!   boundary); a depth or cap past `protocol::depth::MAX_CHAIN_DEPTH` counts as at the cap, and
//!   a cap that reaches the agent that way is logged as a warning;
//! - where the result repeats the agent's words (stderr tail, error, stop reason), credential values
//!   are redacted (`protocol::env_scrub::Redactor`);
//! - observers are called in isolation, on a thread of their own, in order: one that fails or
//!   panics is logged and the others still see every event; one that is slow (a stalled stdout)
//!   slows the agent down through a bounded queue ([`OBSERVER_BUDGET_BYTES`]) and never delays
//!   cancellation, the timeout or teardown; once the run is cancelled, timed out or killed, events
//!   that do not fit are dropped for observers (the result still has them);
//! - a kept session ([`run_session`]) keeps the agent and its session after the first turn and
//!   answers each further prompt with that turn's own result (its output only); the caller's
//!   dropped sender, its idle timeout, a cancel, the overall timeout of a turn (counted per turn,
//!   never while idle) or a turn that fails end it, and it ends like any run, with teardown; each
//!   turn's result records the agent as `alive`, the last one how it ended;
//! - memory is flat in the length of a run: the output keeps its tail (`max_output_bytes`),
//!   permission records and tool-call notes are capped with counts of what was dropped.

use std::ffi::OsString;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::depth::{self, Budget, DepthError};
use protocol::env_scrub::{self, EnvForwardError, Redactor, Scrubbed};
use protocol::env_vars;
use protocol::events::{EndEvent, Event, StartEvent};
use protocol::permission::PermissionDecision;
use protocol::request::StartRequest;
use protocol::result::{AgentExit, DEFAULT_MAX_OUTPUT_BYTES, ErrorKind, RunResult, Status};
use protocol::structured::{self, OutputSchema, SchemaError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::client::{self, DriveConfig, DriveEnd, DriveEvents, Shared, Stage, Structured};
use crate::permission::PermissionHandler;
use crate::process::{AgentProcess, Graces, SpawnError, SpawnSpec, StderrSink, Teardown};

/// Default limit of one frame on the agent's stdout.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Default size of the stderr tail kept for the result.
pub const DEFAULT_STDERR_TAIL_BYTES: usize = 16 * 1024;
/// After the agent exits, how long the drive may still read what it wrote before exiting.
const EXIT_DRAIN: Duration = Duration::from_millis(500);
/// Bytes of events queued for observers at most; past it the drive waits for them, which stops
/// the reading of the agent's stdout: backpressure instead of buffering.
pub const OBSERVER_BUDGET_BYTES: usize = 1024 * 1024;
/// The least an event weighs against [`OBSERVER_BUDGET_BYTES`] (its fixed overhead).
const EVENT_MIN_BYTES: usize = 256;
/// After a cancel, a timeout or a kill, how long observers get to catch up before the run returns
/// anyway.
const LATE_FLUSH: Duration = Duration::from_millis(100);

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
}

/// The request was refused before anything was spawned.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("working directory must be absolute: {0} (resolve it first, e.g. with resolve_cwd)")]
    RelativeCwd(PathBuf),
    #[error("working directory is not an accessible directory: {path} ({reason})")]
    InaccessibleCwd { path: PathBuf, reason: String },
    #[error(transparent)]
    Env(#[from] EnvForwardError),
    #[error("no working directory: the current directory cannot be read ({0}); pass --cwd")]
    NoCurrentDir(#[source] std::io::Error),
    #[error(transparent)]
    Schema(#[from] SchemaError),
}

/// Resolves `--cwd` (or the caller's directory) to an absolute path, once, up front.
pub fn resolve_cwd(cwd: Option<&Path>) -> Result<PathBuf, PrepareError> {
    let current = || std::env::current_dir().map_err(PrepareError::NoCurrentDir);
    match cwd {
        Some(path) if path.is_absolute() => Ok(path.to_path_buf()),
        Some(path) => Ok(current()?.join(path)),
        None => current(),
    }
}

/// A validated run, ready to start.
#[derive(Debug, Clone)]
pub struct Prepared {
    request: StartRequest,
    env: Scrubbed,
    /// The agent's standing, or why it may not start (refused by [`run`], as a result).
    budget: Result<Budget, DepthError>,
    /// `request.wants.output`'s schema, compiled.
    schema: Option<Arc<OutputSchema>>,
}

impl Prepared {
    /// Names withheld from the agent's environment.
    #[must_use]
    pub fn scrubbed(&self) -> &[String] {
        &self.env.scrubbed
    }

    /// What replaces this run's credential values (withheld, and forwarded credential-shaped
    /// ones) in text: for a caller that relays the agent's words further (a delegating agent).
    #[must_use]
    pub fn redactor(&self) -> &Redactor {
        &self.env.redactor
    }

    /// The agent's delegation depth and cap, or why it may not start.
    pub fn budget(&self) -> Result<Budget, &DepthError> {
        self.budget.as_ref().copied()
    }
}

/// Validates the request against the machine (cwd) and computes the agent's environment from
/// `ambient` (normally `std::env::vars_os()`: a variable need not be UTF-8).
pub fn prepare(
    request: StartRequest,
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Prepared, PrepareError> {
    check_cwd(&request.cwd)?;
    let schema = match &request.wants.output {
        Some(output) => Some(Arc::new(OutputSchema::compile(output.schema.clone())?)),
        None => None,
    };
    let ambient: Vec<(OsString, OsString)> = ambient.into_iter().collect();
    // The caller's own standing comes from its environment (what it inherited), never from a
    // forwarded value: `--env ACP_HOST_DEPTH=0` must not lift the budget.
    let own = |name: &str| {
        ambient
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
    };
    let (own_depth, own_max) = (
        own(env_vars::ACP_HOST_DEPTH),
        own(env_vars::ACP_HOST_MAX_DEPTH),
    );
    let budget = depth::child(
        depth::Inherited {
            depth: own_depth.as_deref(),
            max_depth: own_max.as_deref(),
        },
        &[request.max_depth],
    )
    .map(|standing| {
        if let Some(past_bound) = standing.past_bound {
            tracing::warn!("{past_bound}: the agent may not delegate");
        }
        standing.budget
    });
    let mut env = env_scrub::scrub(ambient, &request.env)?;
    for name in [env_vars::ACP_HOST_DEPTH, env_vars::ACP_HOST_MAX_DEPTH] {
        env.env.remove(std::ffi::OsStr::new(name));
    }
    if let Ok(budget) = budget {
        for (name, value) in budget.env() {
            env.env.insert(name.into(), value.into());
        }
    }
    Ok(Prepared {
        request,
        env,
        budget,
        schema,
    })
}

fn check_cwd(cwd: &Path) -> Result<(), PrepareError> {
    if !cwd.is_absolute() {
        return Err(PrepareError::RelativeCwd(cwd.to_path_buf()));
    }
    let inaccessible = |reason: String| PrepareError::InaccessibleCwd {
        path: cwd.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(cwd).map_err(|e| inaccessible(e.to_string()))?;
    if !meta.is_dir() {
        return Err(inaccessible("not a directory".into()));
    }
    nix::unistd::access(cwd, nix::unistd::AccessFlags::X_OK)
        .map_err(|e| inaccessible(format!("cannot enter it: {}", e.desc())))?;
    Ok(())
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
    if let Some(reply) = waiting.lock().ok().and_then(|mut w| w.take()) {
        let _ = reply.send(result.clone());
    }
    result
}

/// What [`run_session`] hands to the run.
struct KeptSession {
    /// The turn waiting for its result.
    waiting: Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<RunResult>>>>,
    follow_ups: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<FollowUp>>,
    idle_timeout: Option<Duration>,
}

/// The drive's side of a kept session: settles each answered turn into its own result.
struct SessionTurns {
    kept: KeptSession,
    run_id: String,
    scrubbed: Vec<String>,
    request: StartRequest,
    redactor: Redactor,
    shared: Arc<Shared>,
    /// True while a turn runs: the overall timeout counts then only.
    busy: tokio::sync::watch::Sender<bool>,
    turn_started: std::sync::Mutex<Instant>,
}

impl client::Turns for SessionTurns {
    fn next(
        &self,
        end: &DriveEnd,
    ) -> std::pin::Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        let mut result = unsettled_result(self.run_id.clone(), self.scrubbed.clone());
        result.agent_exit.ended_by = "alive".into();
        settle(
            &mut result,
            Some(end.clone()),
            false,
            &self.request.timeouts,
            &self.request,
        );
        (result.output, result.output_truncated_bytes) = self.shared.take_output();
        (result.permissions, result.permissions_dropped) = self.shared.take_permissions();
        result.session_id = self.shared.session_id();
        result.children = self.shared.take_children();
        result.persona_delivery = self.shared.persona_delivery();
        record_structured(&mut result, self.shared.take_structured());
        redact_agent_text(&mut result, &self.redactor);
        result.duration_ms = self
            .turn_started
            .lock()
            .map(|started| u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX))
            .unwrap_or_default();
        self.busy.send_replace(false);
        if let Some(reply) = self.kept.waiting.lock().ok().and_then(|mut w| w.take()) {
            let _ = reply.send(result);
        }
        Box::pin(async move {
            let mut follow_ups = self.kept.follow_ups.lock().await;
            let next = match self.kept.idle_timeout {
                Some(idle) => {
                    if let Ok(next) = tokio::time::timeout(idle, follow_ups.recv()).await {
                        next
                    } else {
                        // Closed first, then drained: a prompt sent as the idle time ran out is
                        // still answered, and no later one is accepted only to be dropped.
                        follow_ups.close();
                        follow_ups.try_recv().ok()
                    }
                }
                None => follow_ups.recv().await,
            }?;
            if let Ok(mut waiting) = self.kept.waiting.lock() {
                *waiting = Some(next.reply);
            }
            if let Ok(mut started) = self.turn_started.lock() {
                *started = Instant::now();
            }
            self.busy.send_replace(true);
            Some(next.prompt)
        })
    }
}

/// The drive's side of a kept session, and whether a turn runs (always, for a plain run).
fn session_turns(
    kept: Option<KeptSession>,
    result: &RunResult,
    request: &StartRequest,
    redactor: &Redactor,
    shared: &Arc<Shared>,
) -> (
    Option<Arc<dyn client::Turns>>,
    tokio::sync::watch::Receiver<bool>,
) {
    let (busy, busy_rx) = tokio::sync::watch::channel(true);
    let turns = kept.map(|kept| {
        Arc::new(SessionTurns {
            kept,
            run_id: result.run_id.clone(),
            scrubbed: result.scrubbed_env.clone(),
            request: request.clone(),
            redactor: redactor.clone(),
            shared: Arc::clone(shared),
            busy,
            turn_started: std::sync::Mutex::new(Instant::now()),
        }) as Arc<dyn client::Turns>
    });
    (turns, busy_rx)
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
        env,
        budget,
        schema,
    } = prepared;
    let run_id = uuid::Uuid::new_v4().to_string();
    let notifier = Arc::new(Notifier::new(
        run_id.clone(),
        options.observers.clone(),
        request.agent.display.clone(),
        request.cwd.display().to_string(),
        env.scrubbed.clone(),
    ));
    let mut result = unsettled_result(run_id, env.scrubbed.clone());

    let budget = match budget {
        Ok(budget) => budget,
        Err(refused) => {
            result.error = Some(refused.to_string());
            result.error_kind = Some(ErrorKind::DepthLimit);
            return finish(result, started, &notifier, false, cancel).await;
        }
    };
    if cancel.is_cancelled() {
        result.status = Status::Aborted;
        return finish(result, started, &notifier, false, cancel).await;
    }

    let spec = SpawnSpec {
        program: request.agent.program.clone(),
        args: request.agent.args.clone(),
        cwd: request.cwd.clone(),
        env: env.env,
        stderr_tail_bytes: options
            .stderr_tail_bytes
            .unwrap_or(DEFAULT_STDERR_TAIL_BYTES),
        // Observers see each line with credential values redacted, like the result's tail.
        stderr_lines: (!options.observers.is_empty()).then(|| {
            let notifier = Arc::clone(&notifier);
            let redactor = env.redactor.clone();
            Arc::new(move |line: &str| notifier.stderr(&redactor.redact(line))) as StderrSink
        }),
    };
    let (mut process, pipes) = match AgentProcess::spawn_unconfirmed(&spec) {
        Ok(spawned) => spawned,
        Err(err) => {
            result.error = Some(spawn_failure_message(&err, &request));
            result.error_kind = Some(ErrorKind::Spawn);
            return finish(result, started, &notifier, false, cancel).await;
        }
    };
    // The pid is stored once the agent's start is confirmed (`supervise`).
    notifier.start_after(process.first_write());

    let shared = Arc::new(Shared::new(
        options.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
    ));
    let timeouts = request.timeouts;
    // The agent's stdout is drained until teardown is over (an agent flushing on EOF must not
    // die of EPIPE), then left.
    let drain_until = CancellationToken::new();
    let _stop_draining = drain_until.clone().drop_guard();
    let turns = session_turns(kept, &result, &request, &env.redactor, &shared);
    let supervised = supervise(
        &mut process,
        pipes,
        &request,
        // An explicit cap is asked of the agent too, as the cap it stands under (the smallest of
        // the inherited one and the request's): the environment alone could be ignored.
        request.max_depth.map(|_| budget.max_depth),
        schema,
        options,
        cancel,
        &shared,
        &notifier,
        drain_until,
        turns,
    )
    .await;
    let Supervised {
        end,
        killed,
        timed_out,
        not_started,
    } = supervised;
    // The agent never ran (its exec failed under the watchdog): the run is a spawn failure, as
    // if the spawn itself had failed.
    if let Some(err) = not_started.or_else(|| process.confirm().err()) {
        process.shutdown(Graces::NONE).await;
        result.error = Some(spawn_failure_message(&err, &request));
        result.error_kind = Some(ErrorKind::Spawn);
        return finish(result, started, &notifier, false, cancel).await;
    }

    let teardown = tear_down(&mut process, killed, &timeouts, cancel, &notifier).await;
    record_teardown(&mut result, &teardown, &process, &shared);

    settle(&mut result, end, timed_out, &timeouts, &request);
    record_structured(&mut result, shared.take_structured());
    redact_agent_text(&mut result, &env.redactor);
    if shared.garbage_lines() > 0 {
        tracing::info!(
            lines = shared.garbage_lines(),
            "skipped non-JSON lines on the agent's stdout"
        );
    }
    finish(result, started, &notifier, true, cancel).await
}

/// The teardown ladder with the run's graces, or none after a kill; a kill (second Ctrl-C) during
/// the graces cuts them short.
async fn tear_down(
    process: &mut AgentProcess,
    killed: bool,
    timeouts: &protocol::request::Timeouts,
    cancel: &Cancel,
    notifier: &Notifier,
) -> Teardown {
    let now = Graces {
        eof: Duration::ZERO,
        term: Duration::ZERO,
    };
    let graces = if killed {
        now
    } else {
        Graces {
            eof: timeouts.eof_grace,
            term: timeouts.term_grace,
        }
    };
    let teardown = tokio::select! {
        biased;
        () = cancel.immediate.cancelled(), if !killed => None,
        teardown = process.shutdown(graces) => Some(teardown),
    };
    if let Some(teardown) = teardown {
        return teardown;
    }
    notifier.shed.cancel();
    process.shutdown(now).await
}

/// The error of a failed spawn; a missing program comes with how to install it, when known.
fn spawn_failure_message(err: &SpawnError, request: &StartRequest) -> String {
    let message = protocol::report::describe(err);
    let SpawnError::NotFound { .. } = err else {
        return message;
    };
    let install = request
        .agent
        .install_hint
        .as_ref()
        .map_or_else(String::new, |hint| format!(" (`{hint}`)"));
    protocol::report::clause(
        &message,
        &format!("install it{install}, put it on PATH, or pass --agent with a full path"),
    )
}

/// Copies what teardown observed and what the drive collected into the result.
fn record_teardown(
    result: &mut RunResult,
    teardown: &Teardown,
    process: &AgentProcess,
    shared: &Shared,
) {
    result.agent_exit = AgentExit {
        code: teardown.code,
        signal: teardown.signal,
        ended_by: teardown.rung.as_str().to_owned(),
    };
    if !teardown.survivors.is_empty() {
        tracing::warn!(survivors = ?teardown.survivors, "processes of the agent survived SIGKILL");
    }
    result.stderr_tail = process.stderr_tail();
    (result.output, result.output_truncated_bytes) = shared.take_output();
    (result.permissions, result.permissions_dropped) = shared.take_permissions();
    result.session_id = shared.session_id();
    result.children = shared.take_children();
    result.persona_delivery = shared.persona_delivery();
}

/// The checked structured answer: its value, or (on a run that otherwise completed) status
/// `schema-mismatch` with the last violations.
fn record_structured(result: &mut RunResult, structured: Option<Structured>) {
    match structured {
        Some(Structured::Matched { value, via }) => {
            result.structured = Some(value);
            result.structured_via = Some(via);
        }
        Some(Structured::Mismatched { via, violations }) => {
            result.structured_via = Some(via);
            if result.status == Status::Completed {
                result.status = Status::SchemaMismatch;
                result.error_kind = Some(ErrorKind::SchemaMismatch);
                result.error = Some(format!(
                    "the answer does not match the output schema: {}",
                    structured::describe(&violations)
                ));
            }
        }
        None => {}
    }
}

/// The agent may print a credential it was given or found: where the result repeats the agent's
/// words (stderr tail, error, an unknown stop reason), credential values are redacted. The output
/// is the answer itself and is left alone.
fn redact_agent_text(result: &mut RunResult, redactor: &Redactor) {
    result.stderr_tail = redactor.redact(&result.stderr_tail);
    result.error = result.error.as_deref().map(|error| redactor.redact(error));
    result.stop_reason = result.stop_reason.as_deref().map(|r| redactor.redact(r));
}

/// How supervision of the drive ended.
struct Supervised {
    /// `None` when the run was killed before the drive ended.
    end: Option<DriveEnd>,
    killed: bool,
    timed_out: bool,
    /// The watchdog reported that the agent could not start.
    not_started: Option<SpawnError>,
}

/// Drives the protocol while watching the caller's cancel, the overall deadline and the agent's
/// exit, whichever comes first.
#[expect(
    clippy::too_many_arguments,
    reason = "the run's parts, passed once from `run`"
)]
async fn supervise(
    process: &mut AgentProcess,
    pipes: crate::process::AgentPipes,
    request: &StartRequest,
    max_depth: Option<u32>,
    schema: Option<Arc<OutputSchema>>,
    options: &RunOptions,
    cancel: &Cancel,
    shared: &Arc<Shared>,
    notifier: &Arc<Notifier>,
    drain_until: CancellationToken,
    (turns, mut busy): (
        Option<Arc<dyn client::Turns>>,
        tokio::sync::watch::Receiver<bool>,
    ),
) -> Supervised {
    let timeouts = request.timeouts;
    let config = DriveConfig {
        cwd: request.cwd.clone(),
        prompt: request.prompt.clone(),
        permissions: options
            .permissions
            .clone()
            .unwrap_or_else(|| Arc::new(request.permission)),
        handshake_timeout: timeouts.handshake,
        cancel_grace: timeouts.cancel_grace,
        max_frame_bytes: options.max_frame_bytes.unwrap_or(DEFAULT_MAX_FRAME_BYTES),
        wants: request.wants.clone(),
        max_depth,
        agent: request.agent.display.clone(),
        schema,
        max_answer_bytes: options.max_answer_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
        resume: request.resume.clone(),
        child_cancels: Arc::clone(&cancel.sessions),
        turns,
    };
    // The drive watches its own token: the caller's cancel and our deadline both feed it.
    let drive_cancel = cancel.graceful.child_token();
    let drive = client::drive(
        pipes,
        config,
        Arc::clone(shared),
        Arc::clone(notifier) as Arc<dyn DriveEvents>,
        drive_cancel.clone(),
        drain_until,
    );
    tokio::pin!(drive);
    // Restarted with each turn of a kept session, and not counted while it is idle.
    let deadline = tokio::time::sleep(timeouts.overall.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);

    let mut timed_out = false;
    // The agent's start is confirmed once the first request is written (it waits in the pipe
    // meanwhile), before the drive can announce the session with the agent's pid.
    let first_write = process.first_write();
    let mut unconfirmed = true;
    loop {
        tokio::select! {
            biased;
            () = cancel.immediate.cancelled() => {
                notifier.shed.cancel();
                return Supervised { end: None, killed: true, timed_out, not_started: None };
            }
            () = first_write.cancelled(), if unconfirmed => {
                unconfirmed = false;
                match process.confirm() {
                    Ok(pid) => notifier.pid.store(pid, Ordering::Relaxed),
                    Err(err) => {
                        return Supervised { end: None, killed: false, timed_out, not_started: Some(err) };
                    }
                }
            }
            end = &mut drive => return Supervised { end: Some(end), killed: false, timed_out, not_started: None },
            // Cancelling must not wait for a slow observer either (the agent's answer to
            // session/cancel has to be read).
            () = drive_cancel.cancelled(), if !notifier.shed.is_cancelled() => notifier.shed.cancel(),
            Ok(()) = busy.changed() => {
                if *busy.borrow_and_update()
                    && let Some(limit) = timeouts.overall
                {
                    deadline.as_mut().reset(tokio::time::Instant::now() + limit);
                }
            }
            () = &mut deadline, if !timed_out && timeouts.overall.is_some() && *busy.borrow() => {
                timed_out = true;
                // The deadline is the caller's: a slow observer must not stretch it.
                notifier.shed.cancel();
                drive_cancel.cancel();
            }
            _ = process.exited() => {
                // A grandchild may hold stdout open after the agent died: give the drive a moment
                // to read what was written, then settle without it.
                let end = tokio::time::timeout(EXIT_DRAIN, &mut drive)
                    .await
                    .unwrap_or_else(|_| DriveEnd::Failed {
                        stage: Stage::Prompt,
                        closed: true,
                        message: "agent exited before answering".into(),
                    });
                return Supervised { end: Some(end), killed: false, timed_out, not_started: None };
            }
        }
    }
}

/// The result before anything happened: status error until settled, nothing spawned yet.
fn unsettled_result(run_id: String, scrubbed_env: Vec<String>) -> RunResult {
    RunResult {
        run_id,
        status: Status::Error,
        stop_reason: None,
        output: String::new(),
        output_truncated_bytes: None,
        error: None,
        error_kind: None,
        scrubbed_env,
        agent_exit: AgentExit {
            ended_by: "not-spawned".into(),
            ..AgentExit::default()
        },
        stderr_tail: String::new(),
        duration_ms: 0,
        permissions: Vec::new(),
        permissions_dropped: None,
        session_id: None,
        children: Vec::new(),
        persona_delivery: None,
        structured: None,
        structured_via: None,
    }
}

/// Maps how the drive ended onto status, stop reason, error message and error kind.
fn settle(
    result: &mut RunResult,
    end: Option<DriveEnd>,
    timed_out: bool,
    timeouts: &protocol::request::Timeouts,
    request: &StartRequest,
) {
    let agent = request.agent.display.as_str();
    let exit = describe_exit(&result.agent_exit);
    let (status, stop_reason, error) = match end {
        // A second Ctrl-C: killed at once.
        None => (Status::Aborted, None, None),
        Some(_) if timed_out => (
            Status::Timeout,
            None,
            Some((
                ErrorKind::Timeout,
                format!(
                    "timed out after {}",
                    human_duration(timeouts.overall.unwrap_or_default())
                ),
            )),
        ),
        Some(DriveEnd::Stopped { stop_reason }) => {
            let status = Status::from_stop_reason(&stop_reason);
            let error = (status == Status::Error).then(|| {
                (
                    ErrorKind::Protocol,
                    format!("agent returned an unknown stop reason: {stop_reason:?}"),
                )
            });
            (status, Some(stop_reason), error)
        }
        Some(DriveEnd::Cancelled { stop_reason, .. }) => (Status::Aborted, stop_reason, None),
        Some(DriveEnd::HandshakeTimeout { stage }) => (
            Status::Error,
            None,
            Some((
                ErrorKind::Handshake,
                format!(
                    "agent did not answer {} within {} (is it an ACP agent? try --verbose)",
                    stage.method(),
                    human_duration(timeouts.handshake)
                ),
            )),
        ),
        Some(DriveEnd::Failed {
            stage,
            closed,
            message,
        }) => {
            let error = if closed {
                (
                    ErrorKind::Crash,
                    protocol::report::clause(&message, &format!("it {exit}")),
                )
            } else if stage == Stage::Prompt {
                (ErrorKind::Protocol, message)
            } else {
                (ErrorKind::Handshake, message)
            };
            (Status::Error, None, Some(error))
        }
        Some(DriveEnd::Refused(refusal)) => (
            Status::Error,
            None,
            Some((ErrorKind::Capability, refusal.to_string())),
        ),
        Some(DriveEnd::ConnectionFailed { message }) => {
            (Status::Error, None, Some((ErrorKind::Protocol, message)))
        }
        Some(DriveEnd::AuthRequired { stage, message }) => {
            let kind = if stage == Stage::Prompt {
                ErrorKind::Protocol
            } else {
                ErrorKind::Handshake
            };
            let hint = auth_hint(agent, &result.scrubbed_env);
            (
                Status::Error,
                None,
                Some((kind, protocol::report::clause(&message, &hint))),
            )
        }
        // Loading a saved session is a capability the agent advertises (`loadSession`) or not,
        // like the start-time ones: a refusal, not a failed handshake.
        Some(DriveEnd::CannotResume) => (
            Status::Error,
            None,
            Some((
                ErrorKind::Capability,
                format!(
                    "cannot resume session {}: agent {agent} does not advertise loadSession, so \
                     it cannot continue a saved session; start a new session instead",
                    request.resume.as_deref().unwrap_or_default()
                ),
            )),
        ),
    };
    result.status = status;
    result.stop_reason = stop_reason;
    (result.error_kind, result.error) = error.unzip();
}

/// How to get past an agent's auth-required answer, naming the variables acp-host withheld that
/// most likely hold its key.
fn auth_hint(agent: &str, withheld: &[String]) -> String {
    let fix = "the agent needs authentication: log in with the agent itself once, or forward its \
               API key with --env";
    match protocol::registry::likely_keys(agent, withheld).as_slice() {
        [] => format!("{fix} NAME"),
        [name] => format!("{fix} {name} (acp-host withheld it)"),
        names => format!("{fix} NAME (acp-host withheld {})", names.join(", ")),
    }
}

fn describe_exit(exit: &AgentExit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}

fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
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
        provider: notifier.agent.clone(),
        status: result.status,
        stop_reason: result.stop_reason.clone(),
        last_assistant_message: output.clone(),
    }));
    notifier.caught_up(cancel).await;
    if let Some(output) = output {
        result.output = Arc::try_unwrap(output).unwrap_or_else(|shared| (*shared).clone());
    }
    result
}

/// One event on its way to the observers' thread, holding its share of the budget.
enum Delivery {
    Event(Event, Option<OwnedSemaphorePermit>),
    /// Updates decoded from one read of the agent's stdout, sent together: one wake-up of the
    /// observers' thread per read, not per update.
    Batch(Vec<Delivery>),
    /// Answered once everything queued before it was delivered.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The most updates held back for one batch.
const BATCH_MAX: usize = 64;

/// Delivers on the observers' thread. Delivered updates go to `spent`, to be freed by the thread
/// that made them (see [`Notifier::queue`]); their share of the budget is released at once. Other
/// events are few and are dropped here: the end event shares the run's output, which the run
/// takes back as soon as the observers are done with it.
fn deliver_on_thread(
    observers: &[Arc<dyn Observer>],
    delivery: Delivery,
    run_id: &str,
    spent: &mut Vec<Event>,
) {
    match delivery {
        Delivery::Event(event, permit) => {
            notify(observers, &event, run_id);
            drop(permit);
            if matches!(event, Event::Update { .. }) {
                spent.push(event);
            }
        }
        Delivery::Batch(all) => {
            for delivery in all {
                deliver_on_thread(observers, delivery, run_id, spent);
            }
        }
        Delivery::Flush(done) => {
            flush_all(observers, run_id);
            let _ = done.send(());
        }
    }
}

fn flush_all(observers: &[Arc<dyn Observer>], run_id: &str) {
    for observer in observers {
        if std::panic::catch_unwind(AssertUnwindSafe(|| observer.flush())).is_err() {
            tracing::warn!(run_id, "observer panicked");
        }
    }
}

/// The observers' thread's queue, and the way back for what it delivered.
///
/// The updates that thread delivered come back (one vector per wake-up) and are freed where they
/// were made, in [`Notifier::send_pending`]: freed on the observers' thread, each of a streamed
/// update's allocations went back to the allocator arena the producing thread was allocating
/// from, and glibc's lock on that arena was half of a streaming run's futex calls
/// (docs/benchmarks.md). What waits on the way back is bounded like the queue: the producer frees
/// it before it sends each batch.
struct Queue {
    tx: std::sync::mpsc::Sender<Delivery>,
    /// In a mutex only to be shared: the producer is the one reader.
    spent: std::sync::Mutex<std::sync::mpsc::Receiver<Vec<Event>>>,
}

impl Queue {
    /// Whether the observers' thread is still there to take it.
    fn send(&self, delivery: Delivery) -> bool {
        self.tx.send(delivery).is_ok()
    }

    /// Frees the updates the observers are done with, on the calling (producing) thread.
    fn free_spent(&self) {
        if let Ok(spent) = self.spent.lock() {
            spent.try_iter().for_each(drop);
        }
    }
}

/// Fans events out to observers, each in isolation, on a thread of their own behind a queue of
/// at most [`OBSERVER_BUDGET_BYTES`].
struct Notifier {
    run_id: String,
    agent: String,
    cwd: String,
    scrubbed: Vec<String>,
    pid: std::sync::atomic::AtomicU32,
    /// Handed to the observers' thread when it starts.
    observers: std::sync::Mutex<Vec<Arc<dyn Observer>>>,
    /// Started on first use, which for a run is once its first request was written to the
    /// agent: the thread's creation then overlaps the agent's own start-up instead of delaying
    /// the spawn or that request. `None` when there are no observers.
    queue: std::sync::OnceLock<Option<Queue>>,
    budget: Arc<Semaphore>,
    /// Updates waiting for the end of the current read of the agent's stdout ([`Notifier::flush`]).
    pending: std::sync::Mutex<Vec<Delivery>>,
    /// Fired at a cancel, timeout or kill: from then on events that do not fit are dropped, not
    /// waited for.
    shed: CancellationToken,
    dropped: std::sync::atomic::AtomicU64,
}

impl Notifier {
    fn new(
        run_id: String,
        observers: Vec<Arc<dyn Observer>>,
        agent: String,
        cwd: String,
        scrubbed: Vec<String>,
    ) -> Self {
        Notifier {
            run_id,
            agent,
            cwd,
            scrubbed,
            pid: std::sync::atomic::AtomicU32::new(0),
            observers: std::sync::Mutex::new(observers),
            queue: std::sync::OnceLock::new(),
            budget: Arc::new(Semaphore::new(OBSERVER_BUDGET_BYTES)),
            pending: std::sync::Mutex::default(),
            shed: CancellationToken::new(),
            dropped: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Starts the observers' thread once `token` fires (the first request is on its way to the
    /// agent): its creation then overlaps the agent's start-up instead of delaying the request.
    fn start_after(self: &Arc<Self>, token: CancellationToken) {
        let notifier = Arc::clone(self);
        tokio::spawn(async move {
            token.cancelled().await;
            notifier.queue();
        });
    }

    /// The observers' queue, their thread started on first use (`None` without observers).
    fn queue(&self) -> Option<&Queue> {
        self.queue
            .get_or_init(|| {
                let observers = std::mem::take(&mut *self.observers.lock().ok()?);
                if observers.is_empty() {
                    return None;
                }
                let (tx, rx) = std::sync::mpsc::channel::<Delivery>();
                let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<Event>>();
                let run_id = self.run_id.clone();
                std::thread::Builder::new()
                    .name("acp-host-observers".into())
                    .spawn(move || {
                        let mut spent = Vec::new();
                        while let Ok(delivery) = rx.recv() {
                            deliver_on_thread(&observers, delivery, &run_id, &mut spent);
                            // Everything already queued first; flush before waiting for more.
                            while let Ok(delivery) = rx.try_recv() {
                                deliver_on_thread(&observers, delivery, &run_id, &mut spent);
                            }
                            flush_all(&observers, &run_id);
                            if !spent.is_empty() {
                                let _ = spent_tx.send(std::mem::take(&mut spent));
                            }
                        }
                    })
                    .inspect_err(|err| tracing::warn!(%err, "cannot start the observers' thread"))
                    .ok()
                    .map(|_| Queue {
                        tx,
                        spent: std::sync::Mutex::new(spent_rx),
                    })
            })
            .as_ref()
    }

    fn weight(size: usize) -> u32 {
        u32::try_from(size.clamp(EVENT_MIN_BYTES, OBSERVER_BUDGET_BYTES)).unwrap_or(u32::MAX)
    }

    /// Sends the batch of updates held so far (and frees the events the observers are done with).
    fn send_pending(&self) {
        let Some(queue) = self.queue() else {
            return;
        };
        queue.free_spent();
        let batch = self
            .pending
            .lock()
            .map(|mut pending| std::mem::take(&mut *pending))
            .unwrap_or_default();
        if !batch.is_empty() {
            let _ = queue.send(Delivery::Batch(batch));
        }
    }

    /// Queues `event`, waiting while the queue is full (unless shedding, then it is dropped). With
    /// `batch`, the event waits for [`DriveEvents::flush`] (or a full batch).
    async fn deliver(&self, event: Event, size: usize, batch: bool) {
        let Some(queue) = self.queue() else {
            return;
        };
        let weight = Self::weight(size);
        let permit = tokio::select! {
            biased;
            permit = Arc::clone(&self.budget).acquire_many_owned(weight) => permit.ok(),
            () = self.shed.cancelled() => {
                if let Ok(permit) = Arc::clone(&self.budget).try_acquire_many_owned(weight) {
                    Some(permit)
                } else {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        };
        if batch {
            let full = self.pending.lock().is_ok_and(|mut pending| {
                pending.push(Delivery::Event(event, permit));
                pending.len() >= BATCH_MAX
            });
            if full {
                self.send_pending();
            }
        } else {
            self.send_pending();
            let _ = queue.send(Delivery::Event(event, permit));
        }
    }

    /// Queues `event` without waiting, for events bounded in number (start, end, held updates).
    fn deliver_now(&self, event: Event) {
        self.send_pending();
        if let Some(queue) = self.queue() {
            let _ = queue.send(Delivery::Event(event, None));
        }
    }

    /// Queues `event` if it fits now; otherwise it is dropped (and counted). For callers that
    /// cannot wait (the stderr reader's callback).
    fn try_deliver(&self, event: Event, size: usize) {
        let Some(queue) = self.queue() else {
            return;
        };
        match Arc::clone(&self.budget).try_acquire_many_owned(Self::weight(size)) {
            Ok(permit) => {
                let _ = queue.send(Delivery::Event(event, Some(permit)));
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until the observers have seen every queued event; not after a kill, and only briefly
    /// after a cancel or a timeout.
    async fn caught_up(&self, cancel: &Cancel) {
        self.send_pending();
        if let Some(queue) = self.queue() {
            let (done, flushed) = tokio::sync::oneshot::channel();
            if queue.send(Delivery::Flush(done)) {
                let flushed = async {
                    let _ = flushed.await;
                };
                if self.shed.is_cancelled() {
                    let _ = tokio::time::timeout(LATE_FLUSH, flushed).await;
                } else {
                    tokio::select! {
                        biased;
                        () = cancel.immediate.cancelled() => {}
                        () = flushed => {}
                    }
                }
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                events = dropped,
                run_id = %self.run_id,
                "events were not shown: the reader of the output was too slow"
            );
        }
    }

    fn stderr(&self, line: &str) {
        self.try_deliver(
            Event::Stderr {
                run_id: self.run_id.clone(),
                line: line.to_owned(),
            },
            line.len(),
        );
    }
}

/// Calls every observer with `event`, each in isolation.
fn notify(observers: &[Arc<dyn Observer>], event: &Event, run_id: &str) {
    for observer in observers {
        match std::panic::catch_unwind(AssertUnwindSafe(|| observer.on_event(event))) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, run_id, "observer failed"),
            Err(_) => tracing::warn!(run_id, "observer panicked"),
        }
    }
}

impl DriveEvents for Notifier {
    fn ready(&self, session_id: &str) {
        let pid = self.pid.load(Ordering::Relaxed);
        self.deliver_now(Event::Start(StartEvent {
            run_id: self.run_id.clone(),
            agent: self.agent.clone(),
            provider: self.agent.clone(),
            cwd: self.cwd.clone(),
            pid: (pid != 0).then_some(pid),
            session_id: session_id.to_owned(),
            scrubbed_env: self.scrubbed.clone(),
        }));
    }

    fn update(
        &self,
        update: serde_json::Value,
        size: usize,
        child: Option<client::ChildRef>,
    ) -> client::Queued<'_> {
        let (session_id, subagent) = child.map(|c| (c.session_id, c.name)).unzip();
        let event = Event::Update {
            run_id: self.run_id.clone(),
            session_id,
            subagent: subagent.flatten(),
            update,
        };
        Box::pin(self.deliver(event, size, true))
    }

    fn flush(&self) {
        self.send_pending();
    }

    fn update_now(&self, update: serde_json::Value, child: Option<client::ChildRef>) {
        let (session_id, subagent) = child.map(|c| (c.session_id, c.name)).unzip();
        self.deliver_now(Event::Update {
            run_id: self.run_id.clone(),
            session_id,
            subagent: subagent.flatten(),
            update,
        });
    }

    fn delivered(&self) -> client::Queued<'_> {
        self.send_pending();
        let flushed = self.queue().and_then(|queue| {
            let (done, flushed) = tokio::sync::oneshot::channel();
            queue.send(Delivery::Flush(done)).then_some(flushed)
        });
        Box::pin(async move {
            if let Some(flushed) = flushed {
                let _ = flushed.await;
            }
        })
    }

    fn permission(&self, decision: &PermissionDecision) -> client::Queued<'_> {
        let event = Event::Permission {
            run_id: self.run_id.clone(),
            decision: decision.clone(),
        };
        Box::pin(self.deliver(event, 0, false))
    }
}
