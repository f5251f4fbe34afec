//! The ACP client side of one run, on the official SDK: the drive initialize -> session/new ->
//! session/prompt over the agent's pipes, with cancellation, and the handlers for
//! `session/update` and `session/request_permission`.
//!
//! Where it lives: [`framing`] reads the agent's stdout (lines, the reader task), [`fast`] decodes
//! `session/update` without the SDK's dispatch, [`shared`] holds what the handlers and the drive
//! share (output, records, notes), [`children`] tracks the child sessions the agent announces,
//! [`converse`] runs the handshake and the turns, [`permission`] answers permission requests.
//!
//! Invariants:
//! - the only client capability advertised is `subagents` (ACP subagent sessions): no handler is
//!   registered for `fs/*` and `terminal/*`, so they get the SDK's "method not found" (-32601);
//! - a child session the agent announces is part of the run: its updates reach observers with its
//!   session id and name ([`ChildRef`]), its permission requests go to the same handler as ours,
//!   and the result lists it with its last state;
//! - every way the drive ends (a stop reason, a cancel, a timeout, a failure of the connection or
//!   of the protocol, a refusal) is a [`DriveEnd`], which `run` settles into the result.

mod children;
mod converse;
mod fast;
mod framing;
mod permission;
mod shared;
mod usage;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{SessionNotification, SessionUpdate};
use agent_client_protocol::{Agent, Client, Lines};
use futures::{SinkExt, StreamExt};
use protocol::capabilities::{Refusal, Wants};
use protocol::permission::PermissionDecision;
use protocol::structured::{OutputSchema, StructuredVia, Violation};
use tokio_util::sync::CancellationToken;

use self::framing::{Reader, pump};
use self::permission::{RawPermissionRequest, answer_permission, permission_request};
use self::shared::handle_update;
pub(crate) use self::shared::{ResultOf, Shared};
use crate::lock;
use crate::permission::PermissionHandler;
use crate::process::AgentPipes;

/// Settings of one drive.
#[derive(Clone)]
pub(crate) struct DriveConfig {
    /// Absolute; sent as the session/new cwd.
    pub(crate) cwd: PathBuf,
    pub(crate) prompt: String,
    /// Decides each permission request the agent sends.
    pub(crate) permissions: Arc<dyn PermissionHandler>,
    /// initialize + session/new must both answer within this.
    pub(crate) handshake_timeout: Duration,
    /// After session/cancel, how long to wait for the agent's answer to the prompt.
    pub(crate) cancel_grace: Duration,
    /// Larger stdout lines end the run (a runaway agent must not exhaust the host's memory).
    pub(crate) max_frame_bytes: usize,
    /// Continue this saved session (`session/load`) instead of creating one.
    pub(crate) resume: Option<String>,
    /// Start as a fork of this session (`session/fork`) instead of creating one.
    pub(crate) fork: Option<String>,
    /// What the run asks of the agent at start; refused before the prompt when it cannot.
    pub(crate) wants: Wants,
    /// The delegation cap the agent must enforce itself (the start extension's `maxDepth`), when
    /// one was asked for explicitly; refused before the prompt when it cannot.
    pub(crate) max_depth: Option<u32>,
    /// The agent as the user named it, for refusals.
    pub(crate) agent: String,
    /// The compiled output schema of `wants.output`.
    pub(crate) schema: Option<Arc<OutputSchema>>,
    /// The most bytes of a turn's text kept for its structured answer.
    pub(crate) max_answer_bytes: usize,
    /// Child sessions to cancel while a prompt runs.
    pub(crate) child_cancels: Arc<SessionCancels>,
    /// Further prompts after the first turn (a session kept open, `run::run_session`); `None`
    /// ends the drive with the first turn.
    pub(crate) turns: Option<Arc<dyn Turns>>,
    /// The run's span, sent as `traceparent` (and `tracestate`) in `_meta` of every request.
    pub(crate) trace: protocol::trace::TraceParent,
}

/// The source of a kept session's further prompts.
pub(crate) trait Turns: Send + Sync {
    /// Called with the end of each turn the agent answered while it stays alive: hands that
    /// turn's result out, then waits for the next prompt; `None` ends the drive.
    fn next(&self, end: &DriveEnd) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>>;
}

/// Child sessions the caller asked to cancel ([`crate::run::Cancel::cancel_session`]), queued
/// for the drive, which sends `session/cancel` for each one the agent announced while its prompt
/// runs.
#[derive(Debug, Default)]
pub(crate) struct SessionCancels {
    queue: Mutex<Vec<String>>,
    notify: tokio::sync::Notify,
}

impl SessionCancels {
    pub(crate) fn push(&self, session_id: &str) {
        lock(&self.queue).push(session_id.to_owned());
        self.notify.notify_one();
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.queue))
    }
}

/// The structured answer of a run, once the drive has checked it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Structured {
    Matched {
        value: serde_json::Value,
        via: StructuredVia,
    },
    /// The last answer's violations, after every follow-up.
    Mismatched {
        via: StructuredVia,
        violations: Vec<Violation>,
    },
}

/// A future an event sink returns: resolved once the event is queued (or shed).
pub(crate) type Queued<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// What the drive reports as it goes.
pub(crate) trait DriveEvents: Send + Sync {
    /// session/new answered: the agent is ready. Never waits.
    fn ready(&self, session_id: &str);
    /// One `session/update` (the typed `update` of the notification), `size` bytes on the wire, of our
    /// session (`child` `None`) or of a child session. Waits while the observers are behind: this
    /// is the backpressure that slows the agent down. The update may be held back for a batch
    /// until [`DriveEvents::flush`].
    fn update(&self, update: SessionUpdate, size: usize, child: Option<ChildRef>) -> Queued<'_>;
    /// Sends the updates held back so far: called whenever the reader is about to wait.
    fn flush(&self);
    /// Like [`DriveEvents::update`], but never waits (for the few updates held before ready).
    fn update_now(&self, update: SessionUpdate, child: Option<ChildRef>);
    /// A permission request about `tool_call_id` (of child session `session`, `None`: ours)
    /// arrived; only the exported trace records it.
    fn permission_asked(&self, _session: Option<&str>, _tool_call_id: &str) {}
    /// One permission request was answered, `waited` after it was asked. Waits like
    /// [`DriveEvents::update`].
    fn permission(&self, decision: &PermissionDecision, waited: Duration) -> Queued<'_>;
    /// Waits until the observers have seen every event handed over so far (held updates
    /// included): a permission request is decided only after the updates the agent sent before
    /// it, so whoever is asked (a relay, a person reading `--verbose`) sees the tool call first.
    fn delivered(&self) -> Queued<'_>;
}

/// Which child session an update belongs to: its id and its name, when announced with one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildRef {
    pub(crate) session_id: String,
    pub(crate) name: Option<String>,
}

/// Where in the protocol the drive stopped without a stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Initialize,
    NewSession,
    SetConfigOption,
    LoadSession,
    ForkSession,
    Prompt,
}

impl Stage {
    pub(crate) fn method(self) -> &'static str {
        match self {
            Stage::Initialize => "initialize",
            Stage::NewSession => "session/new",
            Stage::SetConfigOption => "session/set_config_option",
            Stage::LoadSession => "session/load",
            Stage::ForkSession => "session/fork",
            Stage::Prompt => "session/prompt",
        }
    }
}

/// How the drive ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriveEnd {
    /// The agent answered the prompt with this stop reason (wire name, possibly unknown).
    Stopped { stop_reason: String },
    /// Cancellation was requested. `prompt_sent` is false when it came before session/new answered;
    /// `stop_reason` is the agent's answer if it came within the cancel grace.
    Cancelled {
        prompt_sent: bool,
        stop_reason: Option<String>,
    },
    /// The agent did not answer in time during the handshake.
    HandshakeTimeout { stage: Stage },
    /// The connection failed: the agent closed stdout (exited), or broke the protocol.
    Failed {
        stage: Stage,
        /// The agent's stdout closed: it most likely exited; `run` adds the exit status.
        closed: bool,
        message: String,
    },
    /// The transport itself failed (an oversized frame, an unreadable stdout), at any stage.
    ConnectionFailed { message: String },
    /// The agent answered the handshake with ACP's auth-required error; `run` adds how to get
    /// past it (acp-host never runs an agent's interactive login).
    AuthRequired { stage: Stage, message: String },
    /// The agent cannot honour what the run asked of it at start; the prompt was not sent.
    Refused(Refusal),
    /// Resuming, but the agent's `initialize` answer does not advertise `loadSession`: nothing
    /// was sent after `initialize`.
    CannotResume,
    /// Forking, but the agent's `initialize` answer does not advertise
    /// `sessionCapabilities.fork`: nothing was sent after `initialize`.
    CannotFork,
}

/// Runs initialize -> session/new -> session/prompt over the agent's pipes until the prompt is
/// answered, the connection fails, or `cancel` fires (then session/cancel and a bounded wait).
///
/// The agent's stdout keeps being drained after this returns, until EOF or `drain_until` fires
/// (teardown is over).
pub(crate) async fn drive(
    pipes: AgentPipes,
    config: DriveConfig,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    cancel: CancellationToken,
    drain_until: CancellationToken,
) -> DriveEnd {
    if config.resume.is_some() {
        shared.discard_until_open();
    }
    // Outgoing frames: the SDK's and the reader's (answers to batch arrays) share the pipe.
    let (out_tx, out_rx) = futures::channel::mpsc::unbounded::<String>();
    let mut stdin = pipes.stdin;
    tokio::spawn(async move {
        let mut out_rx = out_rx.map(Ok);
        if let Err(err) = stdin.send_all(&mut out_rx).await {
            tracing::debug!(%err, "agent stdin closed");
        }
    });
    // One frame in flight: the reader waits for the SDK instead of queueing behind it.
    let (frames_tx, frames_rx) = futures::channel::mpsc::channel::<std::io::Result<String>>(0);
    tokio::spawn(pump(
        Reader::new(pipes.stdout, config.max_frame_bytes),
        frames_tx,
        out_tx.clone(),
        Arc::clone(&shared),
        Arc::clone(&events),
        drain_until,
    ));
    let outgoing = out_tx.sink_map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::BrokenPipe, "agent stdin is closed")
    });
    let transport = Lines::new(outgoing, frames_rx);

    let on_update = {
        let shared = Arc::clone(&shared);
        let events = Arc::clone(&events);
        // Only frames the fast path declined get here; both paths end in `handle_update`.
        async move |notification: SessionNotification, _cx: ConnectionTo<Agent>| {
            handle_update(&shared, events.as_ref(), notification, 0).await;
            events.flush();
            Ok(())
        }
    };
    let on_permission = {
        let shared = Arc::clone(&shared);
        let events = Arc::clone(&events);
        let cancel = cancel.clone();
        let handler = Arc::clone(&config.permissions);
        async move |request: RawPermissionRequest,
                    responder: agent_client_protocol::v1::Responder<serde_json::Value>,
                    cx: ConnectionTo<Agent>| {
            let (request, ids) = permission_request(&request.0, &shared);
            let answer = answer_permission(
                request,
                ids,
                Arc::clone(&handler),
                Arc::clone(&shared),
                Arc::clone(&events),
                cancel.clone(),
            );
            // Decide off the dispatch loop: an interactive question must not stall updates.
            cx.spawn(async move { responder.respond(answer.await) })
        }
    };

    let result = Client
        .v1()
        .name("acp-host")
        .on_receive_notification(on_update, agent_client_protocol::on_receive_notification!())
        .on_receive_request(on_permission, agent_client_protocol::on_receive_request!())
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            Ok(converse::converse(&cx, &config, &shared, events.as_ref(), &cancel).await)
        })
        .await;
    result.unwrap_or_else(|err| DriveEnd::ConnectionFailed {
        message: format!("connection to the agent failed: {err}"),
    })
}
