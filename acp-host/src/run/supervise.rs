//! Supervision of the drive and teardown: the protocol is driven while the caller's cancel, the
//! overall deadline and the agent's exit are watched, whichever comes first; then the ladder.
//!
//! Invariants:
//! - a kill (`Cancel::kill`, a second Ctrl-C) ends supervision at once and skips the graces; one
//!   during the graces cuts them short;
//! - the deadline is the caller's: in a kept session it counts per turn, never while idle; from a
//!   cancel, the deadline or a kill on, observers are shed (what does not fit is dropped), so a
//!   slow observer delays none of them;
//! - the agent's start is confirmed once its first request is written, before the drive can
//!   announce the session with its pid; a start the watchdog reports failed is a spawn failure;
//! - passing the budget (the agent's reported usage, `client::usage`) cancels the turn like the
//!   deadline, and sheds observers likewise;
//! - after the agent exited, the drive gets [`EXIT_DRAIN`] to read what it wrote (a grandchild
//!   may hold stdout open), then the run settles without it.

use std::sync::Arc;
use std::time::Duration;

use protocol::depth::DepthBudget;
use protocol::request::StartRequest;
use protocol::structured::OutputSchema;
use tokio_util::sync::CancellationToken;

use super::observers::Notifier;
use super::{Cancel, DEFAULT_MAX_FRAME_BYTES, RunOptions};
use crate::client::{self, DriveConfig, DriveEnd, DriveEvents, Shared, Stage};
use crate::process::{AgentPipes, AgentProcess, Graces, SpawnError, Teardown};

/// After the agent exits, how long the drive may still read what it wrote before exiting.
const EXIT_DRAIN: Duration = Duration::from_millis(500);

/// How supervision of the drive ended.
pub(super) struct Supervised {
    /// `None` when the run was killed before the drive ended.
    pub(super) end: Option<DriveEnd>,
    pub(super) killed: bool,
    pub(super) timed_out: bool,
    /// The watchdog reported that the agent could not start.
    pub(super) not_started: Option<SpawnError>,
}

/// What supervision needs of the run: the drive to start, and what it watches besides.
pub(super) struct Drive<'a> {
    pub(super) config: DriveConfig,
    pub(super) pipes: AgentPipes,
    pub(super) shared: &'a Arc<Shared>,
    pub(super) notifier: &'a Arc<Notifier>,
    pub(super) cancel: &'a Cancel,
    /// The overall deadline of a turn (the request's), if any.
    pub(super) overall: Option<Duration>,
    /// Fires once teardown is over: the agent's stdout is drained until then.
    pub(super) drain_until: CancellationToken,
    /// True while a turn runs (always, for a plain run): the deadline counts then only.
    pub(super) busy: tokio::sync::watch::Receiver<bool>,
}

/// The drive's settings: the request's, the host's options, and what the run decided (the
/// agent's standing, the compiled schema, a kept session's further turns).
pub(super) fn drive_config(
    request: &StartRequest,
    options: &RunOptions,
    (budget, trace): (DepthBudget, protocol::trace::TraceParent),
    schema: Option<Arc<OutputSchema>>,
    cancel: &Cancel,
    turns: Option<Arc<dyn client::Turns>>,
) -> DriveConfig {
    let timeouts = request.timeouts;
    tracing::debug!(
        traceparent = %trace.span.traceparent(),
        parent = %options.trace.as_ref().map_or_else(String::new, |parent| parent.span.span_id_hex()),
        "run span"
    );
    DriveConfig {
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
        // An explicit cap is asked of the agent too, as the cap it stands under (the smallest of
        // the inherited one and the request's): the environment alone could be ignored.
        max_depth: request.max_depth.map(|_| budget.max_depth),
        agent: request.agent.display.clone(),
        schema,
        max_answer_bytes: options
            .max_answer_bytes
            .unwrap_or(super::DEFAULT_MAX_OUTPUT_BYTES),
        resume: request.resume.clone(),
        fork: request.fork.clone(),
        child_cancels: Arc::clone(&cancel.sessions),
        turns,
        trace,
    }
}

/// Drives the protocol while watching the caller's cancel, the overall deadline and the agent's
/// exit, whichever comes first.
pub(super) async fn supervise(process: &mut AgentProcess, drive: Drive<'_>) -> Supervised {
    let Drive {
        config,
        pipes,
        shared,
        notifier,
        cancel,
        overall,
        drain_until,
        mut busy,
    } = drive;
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
    let deadline = tokio::time::sleep(overall.unwrap_or(Duration::MAX / 4));
    tokio::pin!(deadline);

    let mut timed_out = false;
    // Passing the budget cancels the turn as the deadline does (`client::usage`).
    let budget_passed = shared.budget_passed();
    let mut over_budget = false;
    // The agent's start is confirmed once the first request is written (it waits in the pipe
    // meanwhile), before the drive can announce the session with the agent's pid.
    let first_write = process.first_write();
    let mut unconfirmed = true;
    loop {
        tokio::select! {
            biased;
            () = cancel.immediate.cancelled() => {
                notifier.shed();
                return Supervised { end: None, killed: true, timed_out, not_started: None };
            }
            () = first_write.cancelled(), if unconfirmed => {
                unconfirmed = false;
                match process.confirm() {
                    Ok(pid) => notifier.set_pid(pid),
                    Err(err) => {
                        return Supervised { end: None, killed: false, timed_out, not_started: Some(err) };
                    }
                }
            }
            end = &mut drive => return Supervised { end: Some(end), killed: false, timed_out, not_started: None },
            // Cancelling must not wait for a slow observer either (the agent's answer to
            // session/cancel has to be read).
            () = drive_cancel.cancelled(), if !notifier.is_shedding() => notifier.shed(),
            Ok(()) = busy.changed() => {
                if *busy.borrow_and_update()
                    && let Some(limit) = overall
                {
                    deadline.as_mut().reset(tokio::time::Instant::now() + limit);
                }
            }
            () = &mut deadline, if !timed_out && overall.is_some() && *busy.borrow() => {
                timed_out = true;
                // The deadline is the caller's: a slow observer must not stretch it.
                notifier.shed();
                drive_cancel.cancel();
            }
            () = budget_passed.cancelled(), if !over_budget => {
                over_budget = true;
                notifier.shed();
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

/// The teardown ladder with the run's graces, or none after a kill; a kill (second Ctrl-C) during
/// the graces cuts them short.
pub(super) async fn tear_down(
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
    notifier.shed();
    process.shutdown(now).await
}
