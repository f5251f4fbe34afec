//! The ACP client side of one run, on the official SDK: framing of the agent's stdout, the
//! handlers for `session/update` and `session/request_permission`, and the drive
//! initialize -> session/new -> session/prompt, with cancellation.
//!
//! Invariants:
//! - the only client capability advertised is `subagents` (ACP subagent sessions): `fs/*` and
//!   `terminal/*` requests get the SDK's "method not found" (-32601);
//! - a child session the agent announces (a `subagent_update` on our session, or on a child
//!   already announced: nesting) is part of the run: its updates reach observers with its session
//!   id and name, its permission requests go to the same handler as ours, and the result lists it
//!   with its last state (one still running when the run settles is `disconnected`); at most
//!   [`MAX_CHILDREN`] are tracked, later ones are foreign;
//! - output is the tail (at most the run's `max_output_bytes`) of every
//!   `agent_message_chunk` text of our own session (a child's text is an event, not output), in
//!   order, kept in [`Shared`] so a partial output survives cancel and error; a `session/update`
//!   for any other session id is ignored (logged), neither output nor event; permission records are capped at [`MAX_PERMISSION_RECORDS`] and tool-call notes at
//!   [`MAX_TOOL_CALLS`], with counts of what was dropped: nothing grows with the length of a run;
//! - one task reads the agent's stdout ([`pump`]): `session/update` notifications are decoded and
//!   handled there ([`fast`]), everything else goes to the SDK through a one-frame channel, so a
//!   slow consumer stops the reading (the agent's pipe fills) instead of growing a queue;
//! - that task keeps draining (and discarding) the agent's stdout after the drive ended, until EOF
//!   or teardown ends it: an agent flushing a last line during the EOF grace never dies of EPIPE;
//! - once cancellation began, every permission request (pending or new) is answered `cancelled`;
//! - the caller may cancel one child session ([`SessionCancels`]): while a prompt runs, a
//!   `session/cancel` naming it is sent, only for a child the agent announced in this run;
//! - a permission request is read leniently from its JSON (unknown option kinds, numeric ids,
//!   missing names), so it always reaches the handler and the record; the chosen id is echoed back
//!   exactly as the agent sent it;
//! - the prompt is never sent if cancellation came before `session/new` answered;
//! - what the run asks at start is decided from the `initialize` answer
//!   (`protocol::capabilities`): `session/new` carries a `systemPrompt` or the start extension's
//!   `_meta` only when advertised, a model is selected with `session/set_config_option` before the
//!   prompt, and a refusal ends the drive before `session/new` (persona, tools) or before the
//!   prompt (model); `ready` is announced only once the session is configured;
//! - with an output schema, every turn that ends `end_turn` is checked (`protocol::structured`):
//!   the agent's captured value, else the value extracted from the turn's text (kept up to
//!   `max_answer_bytes`), on the blocking pool and raced against cancellation (`crate::answer`); a
//!   mismatch gets a follow-up prompt in the same session, at most `retries` times, each raced
//!   against cancellation like the first prompt;
//! - a kept session (`DriveConfig::turns`) answers further prompts in the same session after the
//!   first turn, one turn at a time, each raced against cancellation; a turn's result is handed
//!   over once the observers saw that turn's updates; waiting for the next prompt is raced too;
//!   any turn that does not end with a stop reason ends the drive;
//! - resuming (`DriveConfig::resume`) sends `session/load` instead of `session/new`, only to an
//!   agent whose `initialize` answer advertises `loadSession`; the history it replays before
//!   answering is discarded (neither output nor event): the run shows only the new turn;
//! - a non-JSON line on the agent's stdout is skipped (and counted), never fatal; a `{` line that
//!   is not valid UTF-8 is decoded lossily (with a warning); a batch array is answered with an
//!   "invalid request" error; a frame larger than [`DriveConfig::max_frame_bytes`] ends the run
//!   with a clear error instead of eating memory.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, Implementation, InitializeRequest,
    LoadSessionRequest, NewSessionRequest, PromptRequest, SessionNotification, SessionUpdate,
    SetSessionConfigOptionRequest, SubagentCapabilities, SubagentUpdate, SystemPrompt,
    SystemPromptMode, TextContent,
};
use agent_client_protocol::{Agent, Client, Lines, UntypedMessage};
use futures::{SinkExt, StreamExt};
use protocol::capabilities::{self, Offers, PersonaDelivery, Refusal, SessionPlan, Wants};
use protocol::child_session::{ChildSession, ChildState};
use protocol::permission::{
    self, Answer, DecidedBy, OfferedKind, OfferedOption, Outcome, PermissionDecision,
    PermissionRequest,
};
pub(crate) use protocol::result::MAX_PERMISSION_RECORDS;
use protocol::structured::{self, OutputSchema, StructuredVia, Violation};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::ChildStdout;
use tokio_util::sync::CancellationToken;

use crate::permission::{Decision, PermissionHandler};
use crate::process::AgentPipes;

/// The most tool calls whose title and kind are remembered (for permission requests that name
/// only the id); later ones are not remembered.
pub(crate) const MAX_TOOL_CALLS: usize = 4096;
/// Updates that arrive before `session/new` answered are held (to announce the session first, and
/// to know whether they are of our session) up to this many bytes; beyond it they are dropped.
const HELD_UPDATES_MAX_BYTES: usize = 4 * 1024 * 1024;
/// A read buffer grown past this by a large frame is released afterwards, so one 8 MiB frame does
/// not keep 8 MiB for the rest of the run.
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;
/// Read size on the agent's stdout.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// The most child sessions tracked in one run; later announcements are ignored (and their
/// sessions foreign), so a runaway agent cannot grow the result without bound.
pub(crate) const MAX_CHILDREN: usize = 1024;

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
        if let Ok(mut queue) = self.queue.lock() {
            queue.push(session_id.to_owned());
        }
        self.notify.notify_one();
    }

    fn take(&self) -> Vec<String> {
        self.queue
            .lock()
            .map(|mut queue| std::mem::take(&mut *queue))
            .unwrap_or_default()
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
    /// One `session/update` (the `update` object as sent), `size` bytes on the wire, of our
    /// session (`child` `None`) or of a child session. Waits while the observers are behind: this
    /// is the backpressure that slows the agent down. The update may be held back for a batch
    /// until [`DriveEvents::flush`].
    fn update(&self, update: serde_json::Value, size: usize, child: Option<ChildRef>)
    -> Queued<'_>;
    /// Sends the updates held back so far: called whenever the reader is about to wait.
    fn flush(&self);
    /// Like [`DriveEvents::update`], but never waits (for the few updates held before ready).
    fn update_now(&self, update: serde_json::Value, child: Option<ChildRef>);
    /// One permission request was answered. Waits like [`DriveEvents::update`].
    fn permission(&self, decision: &PermissionDecision) -> Queued<'_>;
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

/// Which session a notification is of.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    Ours,
    Child(ChildRef),
    Foreign,
}

/// The child sessions announced so far, in order.
#[derive(Debug, Default)]
struct Children {
    list: Vec<ChildSession>,
    index: HashMap<String, usize>,
}

impl Children {
    fn get(&self, session_id: &str) -> Option<&ChildSession> {
        self.index.get(session_id).map(|&i| &self.list[i])
    }

    /// Applies one `subagent_update` sent on `parent` (ours or a known child's): the first for a
    /// session id announces it, later ones patch it. A child is never re-parented, and one that
    /// ended stays ended.
    fn apply(&mut self, parent: &str, ours: &str, update: &SubagentUpdate) {
        let id = update.session_id.to_string();
        if id == ours || id == parent {
            return;
        }
        let index = match self.index.get(&id) {
            Some(&index) => index,
            None if self.list.len() < MAX_CHILDREN => {
                self.list.push(ChildSession {
                    session_id: id.clone(),
                    parent_session_id: parent.to_owned(),
                    name: None,
                    task: None,
                    state: ChildState::Running,
                    stop_reason: None,
                });
                self.index.insert(id, self.list.len() - 1);
                self.list.len() - 1
            }
            None => {
                tracing::debug!(session = %id, "too many child sessions; ignoring another");
                return;
            }
        };
        let child = &mut self.list[index];
        if child.parent_session_id != parent {
            tracing::debug!(session = %child.session_id, "ignoring a subagent_update from another parent");
            return;
        }
        if let Some(title) = update.title.value() {
            child.name = Some(title.clone());
        }
        if let Some(task) = update.description.value() {
            child.task = Some(task.clone());
        }
        if let Some(state) = update.state.value()
            && !child.state.is_final()
            && let Ok(wire) = serde_json::to_value(state)
            && let Some((state, stop_reason)) = ChildState::from_wire(&wire)
        {
            child.state = state;
            child.stop_reason = stop_reason;
        }
    }

    /// The list, a child that never reported its end being `disconnected`.
    fn take(&mut self) -> Vec<ChildSession> {
        let mut list = std::mem::take(&mut self.list);
        self.index.clear();
        for child in &mut list {
            if !child.state.is_final() {
                child.state = ChildState::Disconnected;
            }
        }
        list
    }
}

/// State the handlers and the drive share, read by `run` on every settle path.
#[derive(Debug)]
pub(crate) struct Shared {
    output: Mutex<OutputTail>,
    permissions: Mutex<Capped<PermissionDecision>>,
    session_id: Mutex<Option<String>>,
    /// Set before session/cancel is sent; from then on permissions are answered `cancelled`.
    cancelling: AtomicBool,
    /// Non-JSON lines skipped on the agent's stdout.
    garbage_lines: AtomicU64,
    /// `session/update`s ignored because their session id is not ours.
    foreign_updates: AtomicU64,
    /// Orders `ready` before every update: the session/new answer reaches the drive on another
    /// task than the notifications that follow it, so an early update waits here until ready
    /// (and until our session id is known, to tell whether it is ours).
    start_gate: Mutex<StartGate>,
    /// Title and kind of each tool call seen in updates (keyed by session and tool call id): a
    /// permission request may carry only the tool call id, and the decision should still say
    /// what it was about.
    tool_calls: Mutex<HashMap<String, ToolCallInfo>>,
    children: Mutex<Children>,
    /// How the persona reached the agent, once decided.
    persona_delivery: Mutex<Option<PersonaDelivery>>,
    /// The text of the current prompt turn, for extracting a structured answer (bounded like the
    /// output); `None` when no structured answer is asked for.
    turn_text: Mutex<Option<OutputTail>>,
    structured: Mutex<Option<Structured>>,
}

impl Shared {
    pub(crate) fn new(max_output_bytes: usize) -> Self {
        Shared {
            output: Mutex::new(OutputTail::new(max_output_bytes)),
            permissions: Mutex::new(Capped::new(MAX_PERMISSION_RECORDS)),
            session_id: Mutex::default(),
            cancelling: AtomicBool::new(false),
            garbage_lines: AtomicU64::new(0),
            foreign_updates: AtomicU64::new(0),
            start_gate: Mutex::default(),
            tool_calls: Mutex::default(),
            children: Mutex::default(),
            persona_delivery: Mutex::default(),
            turn_text: Mutex::default(),
            structured: Mutex::default(),
        }
    }
}

/// Updates that arrived before the drive announced the session as ready.
#[derive(Debug, Default)]
struct StartGate {
    open: bool,
    /// Resuming: what arrives before the session is announced is the replayed history, dropped.
    discard: bool,
    /// Whole notifications (with their wire size): whether one is ours is known only once open.
    held: Vec<(SessionNotification, usize)>,
    held_bytes: usize,
}

/// What updates said about one tool call.
#[derive(Debug, Clone, Default)]
struct ToolCallInfo {
    title: Option<String>,
    kind: Option<String>,
}

/// The last `cap` bytes of the output text, cut on a character boundary, and how many bytes
/// were dropped before them.
#[derive(Debug)]
pub(crate) struct OutputTail {
    cap: usize,
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl OutputTail {
    pub(crate) fn new(cap: usize) -> Self {
        OutputTail {
            cap,
            bytes: VecDeque::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, text: &str) {
        let text = text.as_bytes();
        let skip = text.len().saturating_sub(self.cap);
        let text = &text[skip..];
        let overflow = (self.bytes.len() + text.len()).saturating_sub(self.cap);
        self.bytes.drain(..overflow);
        self.bytes.extend(text);
        self.dropped += (skip + overflow) as u64;
    }

    /// The kept text and the count of dropped bytes (`None` when nothing was dropped). A cut
    /// through a character drops the rest of that character too, so the text stays valid UTF-8.
    pub(crate) fn take(&mut self) -> (String, Option<u64>) {
        let mut bytes = Vec::from(std::mem::take(&mut self.bytes));
        let mut dropped = std::mem::take(&mut self.dropped);
        if dropped > 0 {
            // UTF-8 continuation bytes are 0b10xx_xxxx.
            let partial = bytes.iter().take_while(|&&b| b & 0xC0 == 0x80).count();
            bytes.drain(..partial);
            dropped += partial as u64;
        }
        let text = String::from_utf8(bytes)
            .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned());
        (text, (dropped > 0).then_some(dropped))
    }
}

/// The first `cap` items and a count of the rest.
#[derive(Debug)]
pub(crate) struct Capped<T> {
    cap: usize,
    items: Vec<T>,
    dropped: u64,
}

impl<T> Capped<T> {
    pub(crate) fn new(cap: usize) -> Self {
        Capped {
            cap,
            items: Vec::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, item: T) {
        if self.items.len() < self.cap {
            self.items.push(item);
        } else {
            self.dropped += 1;
        }
    }
}

impl Shared {
    /// The output (taken: called once, when the run settles) and how many bytes were dropped.
    pub(crate) fn take_output(&self) -> (String, Option<u64>) {
        self.output.lock().map(|mut o| o.take()).unwrap_or_default()
    }

    /// The recorded decisions (taken) and how many more were not recorded.
    pub(crate) fn take_permissions(&self) -> (Vec<PermissionDecision>, Option<u64>) {
        self.permissions
            .lock()
            .map(|mut p| {
                let dropped = p.dropped;
                (
                    std::mem::take(&mut p.items),
                    (dropped > 0).then_some(dropped),
                )
            })
            .unwrap_or_default()
    }

    pub(crate) fn session_id(&self) -> Option<String> {
        self.session_id.lock().ok().and_then(|s| s.clone())
    }

    /// The child sessions announced (taken: called once, when the run settles).
    pub(crate) fn take_children(&self) -> Vec<ChildSession> {
        self.children
            .lock()
            .map(|mut children| children.take())
            .unwrap_or_default()
    }

    pub(crate) fn take_structured(&self) -> Option<Structured> {
        self.structured.lock().ok().and_then(|mut s| s.take())
    }

    /// Starts collecting a new turn's text (for a run asking a structured answer).
    fn begin_turn_text(&self, cap: usize) {
        if let Ok(mut text) = self.turn_text.lock() {
            *text = Some(OutputTail::new(cap));
        }
    }

    /// The turn's text and how many bytes of it did not fit.
    fn take_turn_text(&self) -> (String, Option<u64>) {
        self.turn_text
            .lock()
            .ok()
            .and_then(|mut text| text.as_mut().map(OutputTail::take))
            .unwrap_or_default()
    }

    pub(crate) fn persona_delivery(&self) -> Option<PersonaDelivery> {
        self.persona_delivery.lock().ok().and_then(|d| *d)
    }

    pub(crate) fn garbage_lines(&self) -> u64 {
        self.garbage_lines.load(Ordering::Relaxed)
    }

    /// Announces the session, then releases the updates that raced ahead of it, in order (those
    /// of another session are dropped).
    fn open_start_gate(&self, session_id: &str, events: &dyn DriveEvents) {
        let Ok(mut gate) = self.start_gate.lock() else {
            return;
        };
        events.ready(session_id);
        for (notification, _) in gate.held.drain(..) {
            let scope = self.scope(&notification);
            if let Some((value, child)) =
                self.take_in(&notification.session_id, notification.update, scope)
            {
                events.update_now(value, child);
            }
        }
        gate.held_bytes = 0;
        gate.open = true;
    }

    /// Holds an update that came before the session was announced (within a byte budget), else
    /// admits it with its scope. `None`: nothing to do now (held, or dropped).
    fn admit(
        &self,
        notification: SessionNotification,
        size: usize,
    ) -> Option<(SessionNotification, Scope)> {
        let Ok(mut gate) = self.start_gate.lock() else {
            return None;
        };
        if !gate.open {
            if gate.discard {
                return None;
            }
            if gate.held_bytes + size <= HELD_UPDATES_MAX_BYTES {
                gate.held_bytes += size;
                gate.held.push((notification, size));
            } else {
                tracing::debug!("dropped an update sent before session/new answered");
            }
            return None;
        }
        drop(gate);
        let scope = self.scope(&notification);
        Some((notification, scope))
    }

    /// Which session an update is of: ours, an announced child's, or another (logged: the first
    /// one, later ones quietly).
    fn scope(&self, notification: &SessionNotification) -> Scope {
        let theirs: &str = &notification.session_id.0;
        // Compared under the lock: this runs for every update, and a clone of our id would cost
        // an allocation each time.
        if self
            .session_id
            .lock()
            .is_ok_and(|ours| ours.as_deref() == Some(theirs))
        {
            return Scope::Ours;
        }
        if let Some(child) = self.child(theirs) {
            return Scope::Child(child);
        }
        if self.foreign_updates.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::info!(session = %theirs, "ignoring session/update for a session that is not ours");
        } else {
            tracing::debug!(session = %theirs, "ignoring session/update for a session that is not ours");
        }
        Scope::Foreign
    }

    /// The announced child with this session id.
    fn child(&self, session_id: &str) -> Option<ChildRef> {
        let children = self.children.lock().ok()?;
        children.get(session_id).map(|child| ChildRef {
            session_id: child.session_id.clone(),
            name: child.name.clone(),
        })
    }

    /// What an update of our session or of a child's does before observers see it: output text
    /// (ours only), tool-call notes, child announcements; then the value observers get, with the
    /// child it belongs to. `None` for a foreign session.
    fn take_in(
        &self,
        session: &agent_client_protocol::v1::schema::SessionId,
        update: SessionUpdate,
        scope: Scope,
    ) -> Option<(serde_json::Value, Option<ChildRef>)> {
        let child = match scope {
            Scope::Ours => None,
            Scope::Child(child) => Some(child),
            Scope::Foreign => return None,
        };
        match &update {
            SessionUpdate::AgentMessageChunk(chunk) if child.is_none() => {
                if let ContentBlock::Text(text) = &chunk.content {
                    if let Ok(mut output) = self.output.lock() {
                        output.push(&text.text);
                    }
                    if let Ok(mut turn) = self.turn_text.lock()
                        && let Some(turn) = turn.as_mut()
                    {
                        turn.push(&text.text);
                    }
                }
            }
            SessionUpdate::ToolCall(call) => {
                remember_tool_call(
                    self,
                    tool_call_key(&session.0, &call.tool_call_id.0),
                    Some(call.title.clone()),
                    kind_name(call.kind),
                );
            }
            SessionUpdate::ToolCallUpdate(call) => remember_tool_call(
                self,
                tool_call_key(&session.0, &call.tool_call_id.0),
                call.fields.title.clone(),
                call.fields.kind.and_then(kind_name),
            ),
            SessionUpdate::SubagentUpdate(announced) => {
                if let (Some(ours), Ok(mut children)) = (self.session_id(), self.children.lock()) {
                    children.apply(&session.0, &ours, announced);
                }
            }
            _ => {}
        }
        update_value(update).map(|value| (value, child))
    }

    async fn record(&self, decision: PermissionDecision, events: &dyn DriveEvents) {
        events.permission(&decision).await;
        if let Ok(mut all) = self.permissions.lock() {
            all.push(decision);
        }
    }
}

/// Where in the protocol the drive stopped without a stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Initialize,
    NewSession,
    SetConfigOption,
    LoadSession,
    Prompt,
}

impl Stage {
    pub(crate) fn method(self) -> &'static str {
        match self {
            Stage::Initialize => "initialize",
            Stage::NewSession => "session/new",
            Stage::SetConfigOption => "session/set_config_option",
            Stage::LoadSession => "session/load",
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
    if config.resume.is_some()
        && let Ok(mut gate) = shared.start_gate.lock()
    {
        gate.discard = true;
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
            Ok(converse(&cx, &config, &shared, events.as_ref(), &cancel).await)
        })
        .await;
    result.unwrap_or_else(|err| DriveEnd::ConnectionFailed {
        message: format!("connection to the agent failed: {err}"),
    })
}

/// `session/request_permission` with its params as sent: the SDK's typed request refuses (-32602)
/// options of a kind newer than it, a numeric `optionId` or a missing `name`, and such a request
/// must still reach the policy and the record.
#[derive(
    Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcRequest,
)]
#[request(method = "session/request_permission", response = serde_json::Value)]
#[serde(transparent)]
struct RawPermissionRequest(serde_json::Value);

/// Decides one permission request, records the decision, and builds the answer sent back.
/// `ids` maps each offered id's text to the JSON value the agent sent, which is echoed back as is
/// (an agent that numbered its options gets its number back).
async fn answer_permission(
    request: PermissionRequest,
    ids: Vec<(String, serde_json::Value)>,
    handler: Arc<dyn PermissionHandler>,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    cancel: CancellationToken,
) -> serde_json::Value {
    tokio::select! {
        () = events.delivered() => {}
        () = cancel.cancelled() => {}
    }
    let decision = decide_permission(handler, request.clone(), &shared, &cancel).await;
    let outcome = permission::choose_answer(decision.answer, &request.offered);
    let response = match &outcome {
        Outcome::Selected { option_id, .. } => {
            let raw = ids
                .into_iter()
                .find_map(|(text, raw)| (text == *option_id).then_some(raw))
                .unwrap_or_else(|| serde_json::Value::String(option_id.clone()));
            json!({"outcome": {"outcome": "selected", "optionId": raw}})
        }
        Outcome::Cancelled => json!({"outcome": {"outcome": "cancelled"}}),
    };
    shared
        .record(
            PermissionDecision {
                session_id: request.session_id,
                tool_call_id: request.tool_call_id,
                title: request.title,
                tool_kind: request.tool_kind,
                offered: request.offered,
                verdict: decision.answer.verdict(),
                decided_by: decision.decided_by,
                outcome,
            },
            events.as_ref(),
        )
        .await;
    response
}

/// The handler's decision, unless the turn is (or becomes) cancelled first.
async fn decide_permission(
    handler: Arc<dyn PermissionHandler>,
    request: PermissionRequest,
    shared: &Shared,
    cancel: &CancellationToken,
) -> Decision {
    let cancelled = Decision {
        answer: Answer::Cancelled,
        decided_by: DecidedBy::Cancel,
    };
    if shared.cancelling.load(Ordering::SeqCst) || cancel.is_cancelled() {
        return cancelled;
    }
    tokio::select! {
        () = cancel.cancelled() => cancelled,
        decision = handler.decide(request) => decision,
    }
}

async fn converse(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    events: &dyn DriveEvents,
    cancel: &CancellationToken,
) -> DriveEnd {
    let (session_id, plan) = match handshake(cx, config, shared, cancel).await {
        Ok(started) => started,
        Err(end) => return end,
    };
    shared.open_start_gate(&session_id, events);

    let mut text = match &plan.preamble {
        Some(persona) => capabilities::preamble(persona, &config.prompt),
        None => config.prompt.clone(),
    };
    if let Some(instruction) = &plan.output_instruction {
        text.push_str(instruction);
    }
    let mut end = first_turn(cx, config, shared, &session_id, &plan, text, cancel).await;
    let Some(turns) = &config.turns else {
        return end;
    };
    // A kept session: each further prompt is a plain turn, raced against cancellation like the
    // first; waiting for it is raced too (a cancel while idle ends the drive at once).
    loop {
        if !matches!(end, DriveEnd::Stopped { .. }) {
            return end;
        }
        // The turn's result is handed over only once the observers saw its updates, so a caller
        // routing them per turn gets each turn whole.
        tokio::select! {
            biased;
            () = cancel.cancelled() => {}
            () = events.delivered() => {}
        }
        let next = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                return DriveEnd::Cancelled { prompt_sent: false, stop_reason: None };
            }
            next = turns.next(&end) => next,
        };
        let Some(text) = next else {
            return end;
        };
        end = match prompt_turn(cx, config, shared, &session_id, text, cancel).await {
            Ok(response) => stop_reason_of(&response),
            Err(end) => end,
        };
    }
}

/// The first prompt, checked against the output schema when one was asked for.
async fn first_turn(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    session_id: &str,
    plan: &SessionPlan,
    mut text: String,
    cancel: &CancellationToken,
) -> DriveEnd {
    let (Some(schema), Some(output), Some(expected)) =
        (&config.schema, &config.wants.output, plan.structured_via)
    else {
        return match prompt_turn(cx, config, shared, session_id, text, cancel).await {
            Ok(response) => stop_reason_of(&response),
            Err(end) => end,
        };
    };
    // The answer is checked after each turn that ends normally; a mismatch is answered with a
    // follow-up in the same session, up to the retries.
    let mut follow_ups = output.retries;
    loop {
        shared.begin_turn_text(config.max_answer_bytes);
        let response = match prompt_turn(cx, config, shared, session_id, text, cancel).await {
            Ok(response) => response,
            Err(end) => return end,
        };
        let end = stop_reason_of(&response);
        if !matches!(&end, DriveEnd::Stopped { stop_reason } if stop_reason == "end_turn") {
            return end;
        }
        let captured = response
            .get("_meta")
            .and_then(|meta| meta.get(capabilities::EXTENSION))
            .and_then(|extension| extension.get("structured"))
            .cloned();
        // Without a capture, the answer's text is the candidate (an agent may answer in text
        // even when it has a capture tool). Checked off the runtime, raced against the cancel.
        let (turn_text, dropped) = shared.take_turn_text();
        let answer = structured::Answer {
            captured,
            text: turn_text,
            dropped,
            limit: config.max_answer_bytes,
        };
        let Ok(checked) = crate::answer::check(schema, answer, expected, cancel).await else {
            return DriveEnd::Cancelled {
                prompt_sent: true,
                stop_reason: Some("end_turn".to_owned()),
            };
        };
        let via = checked.via;
        let outcome = match checked.value {
            Ok(value) => Structured::Matched { value, via },
            Err(violations) if follow_ups > 0 => {
                follow_ups -= 1;
                tracing::info!(violations = %structured::describe(&violations), "answer does not match the output schema; following up");
                text = structured::nudge(&violations);
                continue;
            }
            Err(violations) => Structured::Mismatched { via, violations },
        };
        if let Ok(mut slot) = shared.structured.lock() {
            *slot = Some(outcome);
        }
        return end;
    }
}

/// One `session/prompt` with `text`, raced against cancellation: the agent's answer, or how the
/// drive ended (a failure, or the cancel, after session/cancel and a bounded wait).
async fn prompt_turn(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    session_id: &str,
    text: String,
    cancel: &CancellationToken,
) -> Result<serde_json::Value, DriveEnd> {
    let prompt = PromptRequest::new(
        session_id.to_owned(),
        vec![ContentBlock::Text(TextContent::new(text))],
    );
    let prompt = match UntypedMessage::new("session/prompt", prompt) {
        Ok(message) => message,
        Err(err) => return Err(failed(Stage::Prompt, &err)),
    };
    let answer = cx.send_request(prompt).block_task();
    tokio::pin!(answer);
    loop {
        tokio::select! {
            biased;
            response = &mut answer => return response.map_err(|err| failed(Stage::Prompt, &err)),
            () = cancel.cancelled() => break,
            () = config.child_cancels.notify.notified() => {
                for child in config.child_cancels.take() {
                    // Only a session the agent announced in this run: never ours, never foreign.
                    if shared.child(&child).is_none() {
                        tracing::debug!(session = %child, "not a child session of this run; not cancelled");
                        continue;
                    }
                    if let Err(err) = cx.send_notification(CancelNotification::new(child)) {
                        tracing::debug!(%err, "could not send session/cancel for a child session");
                    }
                }
            }
        }
    }
    shared.cancelling.store(true, Ordering::SeqCst);
    if let Err(err) = cx.send_notification(CancelNotification::new(session_id.to_owned())) {
        tracing::debug!(%err, "could not send session/cancel");
    }
    let stop_reason = match tokio::time::timeout(config.cancel_grace, answer).await {
        Ok(Ok(value)) => match stop_reason_of(&value) {
            DriveEnd::Stopped { stop_reason } => Some(stop_reason),
            _ => None,
        },
        // A torn pipe after cancel, or no answer within the grace: still a cancel.
        Ok(Err(_)) | Err(_) => None,
    };
    Err(DriveEnd::Cancelled {
        prompt_sent: true,
        stop_reason,
    })
}

/// initialize, the start-time capabilities decided, session/new (or session/load when resuming),
/// then the model selected, all within the handshake deadline: the session id and what the prompt
/// still needs, or how the drive ended (cancelled first, timed out, refused, or failed).
async fn handshake(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    cancel: &CancellationToken,
) -> Result<(String, SessionPlan), DriveEnd> {
    // Which handshake step a timeout interrupted, for the message.
    let stage = Mutex::new(Stage::Initialize);
    let at = |next: Stage| {
        if let Ok(mut stage) = stage.lock() {
            *stage = next;
        }
    };
    let steps = async {
        let initialized = cx
            .send_request(
                InitializeRequest::new(ProtocolVersion::V1)
                    .client_capabilities(
                        ClientCapabilities::new().subagents(SubagentCapabilities::new()),
                    )
                    .client_info(Implementation::new("acp-host", env!("CARGO_PKG_VERSION"))),
            )
            .block_task()
            .await
            .map_err(|err| failed(Stage::Initialize, &err))?;
        let offers =
            Offers::from_initialize(&serde_json::to_value(&initialized).unwrap_or_default());
        let plan =
            capabilities::plan_session(&config.wants, config.max_depth, &offers, &config.agent)
                .map_err(DriveEnd::Refused)?;
        if let Ok(mut delivery) = shared.persona_delivery.lock() {
            *delivery = plan.persona_delivery;
        }
        let system_prompt = plan.system_prompt.as_ref().map(|system| {
            SystemPrompt::new(vec![ContentBlock::Text(TextContent::new(
                system.text.clone(),
            ))])
            .mode(if system.replace {
                SystemPromptMode::Override
            } else {
                SystemPromptMode::Append
            })
        });
        let (session_id, response) = if let Some(session_id) = &config.resume {
            if !initialized.agent_capabilities.load_session {
                return Err(DriveEnd::CannotResume);
            }
            at(Stage::LoadSession);
            let mut request = LoadSessionRequest::new(session_id.clone(), &config.cwd)
                .system_prompt(system_prompt);
            request.meta.clone_from(&plan.meta);
            // An error answer (unknown session) fails here.
            let load = UntypedMessage::new("session/load", request)
                .map_err(|err| failed(Stage::LoadSession, &err))?;
            let response = cx
                .send_request(load)
                .block_task()
                .await
                .map_err(|err| failed(Stage::LoadSession, &err))?;
            (session_id.clone(), response)
        } else {
            at(Stage::NewSession);
            let mut request = NewSessionRequest::new(&config.cwd).system_prompt(system_prompt);
            request.meta.clone_from(&plan.meta);
            new_session(cx, request).await?
        };
        if let Ok(mut slot) = shared.session_id.lock() {
            *slot = Some(session_id.clone());
        }
        if let Some(model) = &config.wants.model {
            let choice =
                capabilities::plan_model(model, response.get("configOptions"), &config.agent)
                    .map_err(DriveEnd::Refused)?;
            if let Some(choice) = choice {
                at(Stage::SetConfigOption);
                let set = SetSessionConfigOptionRequest::new(
                    session_id.clone(),
                    choice.config_id,
                    choice.value.as_str(),
                );
                let set = UntypedMessage::new("session/set_config_option", set)
                    .map_err(|err| failed(Stage::SetConfigOption, &err))?;
                cx.send_request(set)
                    .block_task()
                    .await
                    .map_err(|err| failed(Stage::SetConfigOption, &err))?;
            }
        }
        Ok((session_id, plan))
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(DriveEnd::Cancelled { prompt_sent: false, stop_reason: None }),
        answer = tokio::time::timeout(config.handshake_timeout, steps) => answer.unwrap_or_else(|_| {
            let stage = stage.lock().map_or(Stage::Initialize, |stage| *stage);
            Err(DriveEnd::HandshakeTimeout { stage })
        }),
    }
}

/// `session/new`: the new session's id, with the whole answer (its config options).
async fn new_session(
    cx: &ConnectionTo<Agent>,
    request: NewSessionRequest,
) -> Result<(String, serde_json::Value), DriveEnd> {
    // Untyped so that a response without a session id is reported as such, not as a parse error.
    let new_session = UntypedMessage::new("session/new", request)
        .map_err(|err| failed(Stage::NewSession, &err))?;
    let response = cx
        .send_request(new_session)
        .block_task()
        .await
        .map_err(|err| failed(Stage::NewSession, &err))?;
    let session_id = match response
        .get("sessionId")
        .and_then(serde_json::Value::as_str)
    {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => {
            return Err(DriveEnd::Failed {
                stage: Stage::NewSession,
                closed: false,
                message: format!("agent answered session/new without a sessionId: {response}"),
            });
        }
    };
    Ok((session_id, response))
}

fn stop_reason_of(value: &serde_json::Value) -> DriveEnd {
    match value.get("stopReason").and_then(serde_json::Value::as_str) {
        Some(reason) => DriveEnd::Stopped {
            stop_reason: reason.to_owned(),
        },
        None => DriveEnd::Failed {
            stage: Stage::Prompt,
            closed: false,
            message: format!("agent answered session/prompt without a stopReason: {value}"),
        },
    }
}

fn failed(stage: Stage, err: &agent_client_protocol::Error) -> DriveEnd {
    let closed = err
        .data
        .as_ref()
        .and_then(|d| d.get("reason"))
        .and_then(serde_json::Value::as_str)
        .is_some_and(|r| r.contains("closed"));
    let message = if closed {
        format!(
            "agent closed its output before answering {}",
            stage.method()
        )
    } else {
        let data = err
            .data
            .as_ref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        let message = format!(
            "agent answered {} with error {}: {}{data}",
            stage.method(),
            err.code.value(),
            err.message
        );
        if err.code == agent_client_protocol::ErrorCode::AUTH_REQUIRED {
            return DriveEnd::AuthRequired { stage, message };
        }
        message
    };
    DriveEnd::Failed {
        stage,
        closed,
        message,
    }
}

/// The update as observers see it: the typed update serialized back, so both decode paths give
/// the same value. A text chunk's text is moved, not copied: one large frame costs one copy of its
/// text here, not two.
fn update_value(mut update: SessionUpdate) -> Option<serde_json::Value> {
    if let Some(value) = text_chunk_value(&mut update) {
        return Some(value);
    }
    let text = match &mut update {
        SessionUpdate::AgentMessageChunk(chunk)
        | SessionUpdate::AgentThoughtChunk(chunk)
        | SessionUpdate::UserMessageChunk(chunk) => match &mut chunk.content {
            ContentBlock::Text(text) => Some(std::mem::take(&mut text.text)),
            _ => None,
        },
        _ => None,
    };
    let mut value = serde_json::to_value(&update)
        .inspect_err(|err| tracing::debug!(%err, "could not serialize a session update"))
        .ok()?;
    // Walked by hand: `pointer_mut` allocates per token, and this runs for every chunk.
    if let Some(text) = text
        && let Some(slot) = value
            .get_mut("content")
            .and_then(|content| content.get_mut("text"))
    {
        *slot = serde_json::Value::String(text);
    }
    Some(value)
}

/// A text chunk without annotations or `_meta` as observers see it, built directly: what
/// `serde_json::to_value` makes of it (the tag, `content`, then `messageId`), without going
/// through serde's tagged-enum serializer for every chunk (a property test holds the two
/// equal). The text is moved out of `update`. `None` for any other update, left untouched.
fn text_chunk_value(update: &mut SessionUpdate) -> Option<serde_json::Value> {
    let (tag, chunk) = match update {
        SessionUpdate::AgentMessageChunk(chunk) => ("agent_message_chunk", chunk),
        SessionUpdate::AgentThoughtChunk(chunk) => ("agent_thought_chunk", chunk),
        SessionUpdate::UserMessageChunk(chunk) => ("user_message_chunk", chunk),
        _ => return None,
    };
    let ContentBlock::Text(text) = &mut chunk.content else {
        return None;
    };
    if chunk.meta.is_some() || text.annotations.is_some() || text.meta.is_some() {
        return None;
    }
    let mut content = serde_json::Map::with_capacity(2);
    content.insert("type".to_owned(), "text".into());
    content.insert("text".to_owned(), std::mem::take(&mut text.text).into());
    let mut value = serde_json::Map::with_capacity(3);
    value.insert("sessionUpdate".to_owned(), tag.into());
    value.insert("content".to_owned(), content.into());
    if let Some(id) = &chunk.message_id {
        value.insert("messageId".to_owned(), id.0.as_ref().into());
    }
    Some(value.into())
}

/// What every `session/update` does, whichever path decoded it: through the start gate, then
/// output text, tool-call notes and the event (waiting while observers are behind).
async fn handle_update(
    shared: &Shared,
    events: &dyn DriveEvents,
    notification: SessionNotification,
    size: usize,
) {
    if let Some((notification, scope)) = shared.admit(notification, size)
        && let Some((value, child)) =
            shared.take_in(&notification.session_id, notification.update, scope)
    {
        events.update(value, size, child).await;
    }
}

/// Tool call ids are per session: the key of one in [`Shared`]'s notes.
fn tool_call_key(session: &str, tool_call_id: &str) -> String {
    format!("{session}\u{0}{tool_call_id}")
}

fn remember_tool_call(shared: &Shared, id: String, title: Option<String>, kind: Option<String>) {
    if let Ok(mut calls) = shared.tool_calls.lock() {
        if calls.len() >= MAX_TOOL_CALLS && !calls.contains_key(&id) {
            return;
        }
        let entry = calls.entry(id).or_default();
        entry.title = title.or(entry.title.take());
        entry.kind = kind.or(entry.kind.take());
    }
}

/// The wire name of a tool kind (`edit`, `execute`, ...).
fn kind_name(kind: agent_client_protocol::v1::schema::ToolKind) -> Option<String> {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

/// What the request is about, read leniently from its params: its own fields, completed from
/// earlier tool call updates; every option with an id is kept (unknown kinds included, to be
/// recorded), with the raw id for the answer.
fn permission_request(
    params: &serde_json::Value,
    shared: &Shared,
) -> (PermissionRequest, Vec<(String, serde_json::Value)>) {
    let tool_call = params.get("toolCall").unwrap_or(&serde_json::Value::Null);
    let tool_call_id = tool_call
        .get("toolCallId")
        .and_then(id_text)
        .unwrap_or_default();
    let text = |value: &serde_json::Value, key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let session = params
        .get("sessionId")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let known = shared
        .tool_calls
        .lock()
        .ok()
        .and_then(|calls| calls.get(&tool_call_key(session, &tool_call_id)).cloned())
        .unwrap_or_default();
    // A child's request is answered like ours, and says whose it is.
    let session_id = shared.child(session).map(|child| child.session_id);
    let mut ids = Vec::new();
    let offered = params
        .get("options")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|option| {
            let raw = option.get("optionId").filter(|id| !id.is_null())?;
            let option_id = id_text(raw)?;
            ids.push((option_id.clone(), raw.clone()));
            let kind = match option.get("kind") {
                Some(serde_json::Value::String(kind)) => OfferedKind::from_wire(kind),
                Some(other) => OfferedKind::Unknown(other.to_string()),
                None => OfferedKind::Unknown(String::new()),
            };
            Some(OfferedOption { option_id, kind })
        })
        .collect();
    let request = PermissionRequest {
        session_id,
        title: text(tool_call, "title").or(known.title),
        tool_kind: text(tool_call, "kind").or(known.kind),
        tool_call_id,
        offered,
    };
    (request, ids)
}

/// An id's text: a string as is, a number (or any other non-null value) as its JSON text.
fn id_text(id: &serde_json::Value) -> Option<String> {
    match id {
        serde_json::Value::Null => None,
        serde_json::Value::String(id) => Some(id.clone()),
        other => Some(other.to_string()),
    }
}

/// What one line of the agent's stdout is.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Blank,
    /// Not JSON-RPC (a banner, a log line): skipped and counted.
    Garbage,
    /// A JSON-RPC batch: not part of ACP, answered with an error.
    Batch,
    /// A JSON object; `lossy` when invalid UTF-8 had to be replaced.
    Frame {
        text: String,
        lossy: bool,
    },
}

/// Classifies the line in `buf`, moving a frame out without copying when it needs no trimming.
/// `buf` keeps a garbage line for the caller to report.
fn classify(buf: &mut Vec<u8>) -> Line {
    let trimmed = buf.trim_ascii();
    match trimmed.first() {
        None => {
            buf.clear();
            Line::Blank
        }
        Some(b'[') => Line::Batch,
        Some(b'{') => {
            let whole = trimmed.len() == buf.len();
            match std::str::from_utf8(trimmed) {
                Ok(_) if whole => Line::Frame {
                    // Checked just above: the whole line is valid UTF-8.
                    text: String::from_utf8(std::mem::take(buf)).unwrap_or_default(),
                    lossy: false,
                },
                Ok(text) => Line::Frame {
                    text: text.to_owned(),
                    lossy: false,
                },
                Err(_) => Line::Frame {
                    text: String::from_utf8_lossy(trimmed).into_owned(),
                    lossy: true,
                },
            }
        }
        Some(_) => Line::Garbage,
    }
}

/// The answer to a batch array: ACP has no batches, and a silent drop would leave the agent
/// waiting for answers forever.
fn batch_error() -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32600,
            "message": "batch requests are not supported by this ACP client; send one message per line",
        },
    })
    .to_string()
}

/// The agent's stdout, split into lines. A line that lies whole in one read is handed out where
/// it lies, not copied; a line spread over reads is put together in `joined`.
struct Reader {
    stdout: ChildStdout,
    data: Box<[u8]>,
    /// The unread part of `data` is `start..end`.
    start: usize,
    end: usize,
    joined: Vec<u8>,
    /// Where the current line is: `data[range]`, or `joined` when `None`.
    current: Option<std::ops::Range<usize>>,
    max: usize,
}

/// The first `\n` in `bytes`. On x86-64 this is memchr's SSE2 search, which every x86-64 CPU
/// has, chosen at compile time: `memchr::memchr` picks AVX2 at run time, and its first call asks
/// the CPU for every feature it has (`cpuid`, which traps to the hypervisor on a virtual machine:
/// about 0.1 ms of a one-shot run there, measured), for no gain on lines of a few kilobytes.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if let Some(newline) = memchr::arch::x86_64::sse2::memchr::One::new(b'\n') {
        return newline.find(bytes);
    }
    memchr::memchr(b'\n', bytes)
}

impl Reader {
    fn new(stdout: ChildStdout, max: usize) -> Self {
        Reader {
            stdout,
            data: vec![0; READ_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            joined: Vec::new(),
            current: None,
            max,
        }
    }

    /// Finds the next `\n`-terminated line ([`Reader::line`], without the newline); `false` at
    /// EOF. `before_read` runs whenever the pipe itself is about to be read (which may wait).
    async fn next_line(&mut self, before_read: impl Fn()) -> std::io::Result<bool> {
        self.release();
        self.joined.clear();
        self.current = None;
        loop {
            if self.start == self.end {
                before_read();
                (self.start, self.end) = (0, 0);
                let n = self.stdout.read(&mut self.data).await?;
                if n == 0 {
                    return Ok(!self.joined.is_empty());
                }
                self.end = n;
            }
            let available = &self.data[self.start..self.end];
            let (chunk, found) = match find_newline(available) {
                Some(i) => (&available[..i], true),
                None => (available, false),
            };
            if self.joined.len() + chunk.len() > self.max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("agent sent a frame larger than {} bytes", self.max),
                ));
            }
            let from = self.start;
            self.start += chunk.len() + usize::from(found);
            if found && self.joined.is_empty() {
                self.current = Some(from..from + chunk.len());
                return Ok(true);
            }
            self.joined.extend_from_slice(chunk);
            if found {
                return Ok(true);
            }
        }
    }

    /// The current line (valid until the next [`Reader::next_line`]).
    fn line(&self) -> &[u8] {
        match &self.current {
            Some(range) => &self.data[range.clone()],
            None => &self.joined,
        }
    }

    /// The current line, owned.
    fn take_line(&mut self) -> Vec<u8> {
        match self.current.take() {
            Some(range) => self.data[range].to_vec(),
            None => std::mem::take(&mut self.joined),
        }
    }

    /// Lets go of a buffer a large frame grew, so one 8 MiB frame does not keep 8 MiB for the
    /// rest of the run.
    fn release(&mut self) {
        if self.joined.capacity() > KEEP_BUFFER_BYTES {
            self.joined = Vec::new();
        }
    }
}

/// Reads the agent's stdout for the whole life of the process: `session/update` notifications are
/// handled here, other frames go to the SDK one at a time; once the SDK is gone (the drive ended)
/// the rest is read and discarded until EOF or `drain_until`.
async fn pump(
    mut reader: Reader,
    mut frames: futures::channel::mpsc::Sender<std::io::Result<String>>,
    replies: futures::channel::mpsc::UnboundedSender<String>,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    drain_until: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            biased;
            () = drain_until.cancelled() => return,
            line = reader.next_line(|| events.flush()) => line,
        };
        match line {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                let _ = frames.send(Err(err)).await;
                return;
            }
        }
        if frames.is_closed() {
            continue;
        }
        // The hot path decodes from the read buffer itself: no copy of the line.
        let update = std::str::from_utf8(reader.line().trim_ascii())
            .ok()
            .and_then(fast::session_notification);
        if let Some(update) = update {
            let size = reader.line().len();
            // Released before the update is handled: a large frame is not held twice.
            reader.release();
            handle_update(&shared, events.as_ref(), update, size).await;
            continue;
        }
        let mut buf = reader.take_line();
        match classify(&mut buf) {
            Line::Blank => {}
            Line::Garbage => {
                shared.garbage_lines.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    line = %String::from_utf8_lossy(&buf[..buf.len().min(200)]),
                    "skipped a non-JSON line on the agent's stdout"
                );
            }
            Line::Batch => {
                tracing::warn!("the agent sent a JSON-RPC batch array; answered with an error");
                let _ = replies.unbounded_send(batch_error());
            }
            Line::Frame { text, lossy } => {
                if lossy {
                    tracing::warn!(
                        "the agent sent a frame that is not valid UTF-8; decoded it with \
                         replacement characters"
                    );
                }
                // Only a lossily decoded line can still be an update here.
                if lossy && let Some(update) = fast::session_notification(&text) {
                    let size = text.len();
                    drop(text);
                    handle_update(&shared, events.as_ref(), update, size).await;
                    continue;
                }
                events.flush();
                if frames.send(Ok(text)).await.is_err() {
                    // The drive ended: from now on the line is only drained.
                }
            }
        }
    }
}

/// The hot path: `session/update` notifications decoded straight from the line into the typed
/// update, without the SDK's generic dispatch (which parses every frame into a JSON tree first).
/// Anything this does not recognise exactly goes to the SDK, which stays the reference.
///
/// Two decoders, tried in turn:
/// - [`fast::text_chunk`]: the streaming shape (`agent_message_chunk`, `agent_thought_chunk`,
///   `user_message_chunk` carrying one text block) into plain structs of borrowed strings. The
///   SDK's `SessionUpdate` and `ContentBlock` are internally tagged enums, which serde can only
///   decode by first buffering every key and value of the object (an allocation each, the text
///   copied twice); here the text is copied once, or moved when it had escapes. Every struct
///   denies unknown fields and every field has the SDK's own type or a stricter one, so a frame is
///   either decoded exactly as the SDK would, or declined (an annotation, a `messageId` that is
///   not a string, a `_meta` that is not an object, a duplicate key, non-text content);
/// - the SDK's `SessionNotification` through serde derive: every other update.
pub(crate) mod fast {
    use std::borrow::Cow;

    use agent_client_protocol::v1::schema::{
        ContentBlock, ContentChunk, MessageId, Meta, SessionId, SessionNotification, SessionUpdate,
        TextContent,
    };
    use serde::Deserialize;
    use serde::de::IgnoredAny;

    #[derive(Deserialize)]
    struct Notification<'a, P> {
        #[serde(borrow)]
        jsonrpc: &'a str,
        #[serde(borrow)]
        method: &'a str,
        /// Present means a request, which this path does not handle.
        #[serde(default)]
        id: Option<IgnoredAny>,
        params: P,
    }

    /// `SessionNotification` with a [`Chunk`] as its update.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ChunkParams<'a> {
        #[serde(borrow)]
        session_id: Cow<'a, str>,
        #[serde(borrow)]
        update: Chunk<'a>,
        /// The SDK reads any other value as absent; here it declines.
        #[serde(default, rename = "_meta")]
        meta: Option<Meta>,
    }

    /// `SessionUpdate::*Chunk(ContentChunk)`: the tag and the chunk's fields in one object.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Chunk<'a> {
        #[serde(borrow)]
        session_update: Cow<'a, str>,
        #[serde(borrow)]
        content: TextBlock<'a>,
        /// The SDK reads a value that is not a string as absent; here it declines.
        #[serde(default)]
        message_id: Option<String>,
        #[serde(default, rename = "_meta")]
        meta: Option<Meta>,
    }

    /// `ContentBlock::Text(TextContent)`.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TextBlock<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
        #[serde(borrow)]
        text: Cow<'a, str>,
        /// Any value but `null` declines: rare on a chunk, and not worth a second copy of the
        /// SDK's lenient reading of it.
        #[serde(default)]
        annotations: Option<IgnoredAny>,
        #[serde(default, rename = "_meta")]
        meta: Option<Meta>,
    }

    /// The params of a `session/update` notification, or `None` for anything else (including a
    /// `session/update` that does not decode: the SDK then reports it as it always did).
    pub(crate) fn session_notification(line: &str) -> Option<SessionNotification> {
        // Cheap filter first: most other frames never reach the decoder.
        if !line.contains("\"session/update\"") {
            return None;
        }
        text_chunk(line).or_else(|| general(line))
    }

    /// Any update, through the SDK's types.
    pub(super) fn general(line: &str) -> Option<SessionNotification> {
        let frame: Notification<'_, SessionNotification> = serde_json::from_str(line).ok()?;
        is_notification(&frame).then_some(frame.params)
    }

    /// A text chunk, decoded without buffering; `None` declines (the general decoder decides).
    pub(super) fn text_chunk(line: &str) -> Option<SessionNotification> {
        let frame: Notification<'_, ChunkParams<'_>> = serde_json::from_str(line).ok()?;
        if !is_notification(&frame) {
            return None;
        }
        let ChunkParams {
            session_id,
            update,
            meta,
        } = frame.params;
        let Chunk {
            session_update,
            content,
            message_id,
            meta: chunk_meta,
        } = update;
        if content.kind != "text" || content.annotations.is_some() {
            return None;
        }
        let wrap: fn(ContentChunk) -> SessionUpdate = match &*session_update {
            "agent_message_chunk" => SessionUpdate::AgentMessageChunk,
            "agent_thought_chunk" => SessionUpdate::AgentThoughtChunk,
            "user_message_chunk" => SessionUpdate::UserMessageChunk,
            _ => return None,
        };
        // `into_owned` moves the text out when it had escapes, else copies it: once either way.
        let text = TextContent::new(content.text.into_owned()).meta(content.meta);
        let chunk = ContentChunk::new(ContentBlock::Text(text))
            .message_id(message_id.map(MessageId::new))
            .meta(chunk_meta);
        Some(SessionNotification::new(SessionId::new(&*session_id), wrap(chunk)).meta(meta))
    }

    fn is_notification<P>(frame: &Notification<'_, P>) -> bool {
        frame.jsonrpc == "2.0" && frame.method == "session/update" && frame.id.is_none()
    }
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::JsonRpcMessage;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn the_output_tail_keeps_the_last_bytes_and_counts_the_rest() {
        let mut tail = OutputTail::new(5);
        tail.push("abc");
        tail.push("defg");
        assert_eq!(tail.take(), ("cdefg".to_owned(), Some(2)));
        let mut tail = OutputTail::new(5);
        tail.push("0123456789");
        tail.push("ab");
        assert_eq!(tail.take(), ("789ab".to_owned(), Some(7)));
        let mut whole = OutputTail::new(5);
        whole.push("hi");
        assert_eq!(whole.take(), ("hi".to_owned(), None));
    }

    #[test]
    fn a_cut_through_a_character_drops_the_whole_character() {
        let mut tail = OutputTail::new(4);
        // "é" is two bytes: keeping 4 bytes of "xé12" + "3" would start inside it.
        tail.push("xé12");
        tail.push("3");
        assert_eq!(tail.take(), ("123".to_owned(), Some(3)));
    }

    #[test]
    fn capped_records_keep_the_first_and_count_the_rest() {
        let mut capped = Capped::new(2);
        for i in 0..5 {
            capped.push(i);
        }
        assert_eq!(capped.items, [0, 1]);
        assert_eq!(capped.dropped, 3);
    }

    fn subagent(value: Value) -> SubagentUpdate {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn children_are_announced_patched_nested_and_settled() {
        let mut children = Children::default();
        children.apply(
            "root",
            "root",
            &subagent(
                json!({"sessionId": "a", "title": "one", "description": "task",
                "state": {"state": "running"}}),
            ),
        );
        // Nested on `a`; an update for `b` from another parent, or one naming ours, is ignored.
        children.apply(
            "a",
            "root",
            &subagent(json!({"sessionId": "b", "title": "two"})),
        );
        children.apply(
            "root",
            "root",
            &subagent(json!({"sessionId": "b", "title": "moved"})),
        );
        children.apply("root", "root", &subagent(json!({"sessionId": "root"})));
        // A final state sticks; a later snapshot does not revive the child.
        children.apply(
            "root",
            "root",
            &subagent(
                json!({"sessionId": "a", "state": {"state": "idle", "stopReason": "cancelled"}}),
            ),
        );
        children.apply(
            "root",
            "root",
            &subagent(json!({"sessionId": "a", "state": {"state": "running"}})),
        );
        let list = children.take();
        let seen: Vec<String> = list
            .iter()
            .map(|c| {
                format!(
                    "{} on {}: {:?} {} {:?}",
                    c.session_id, c.parent_session_id, c.name, c.state, c.stop_reason
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                "a on root: Some(\"one\") cancelled Some(\"cancelled\")",
                // Never ended: disconnected once the run settled.
                "b on a: Some(\"two\") disconnected None",
            ]
        );
        assert_eq!(list[0].task.as_deref(), Some("task"));
    }

    #[test]
    fn children_beyond_the_cap_are_not_tracked() {
        let mut children = Children::default();
        for n in 0..=MAX_CHILDREN {
            children.apply(
                "root",
                "root",
                &subagent(json!({"sessionId": format!("c{n}")})),
            );
        }
        assert_eq!(children.take().len(), MAX_CHILDREN);
    }

    #[test]
    fn lines_are_classified() {
        let mut buf = b"  \r".to_vec();
        assert_eq!(classify(&mut buf), Line::Blank);
        let mut buf = b"Loading model...".to_vec();
        assert_eq!(classify(&mut buf), Line::Garbage);
        assert_eq!(buf, b"Loading model...", "kept for the report");
        let mut buf = b"[{\"jsonrpc\":\"2.0\"}]".to_vec();
        assert_eq!(classify(&mut buf), Line::Batch);
        let mut buf = b"{\"a\":1}".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":1}".into(),
                lossy: false
            }
        );
        let mut buf = b" {\"a\":1}\r".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":1}".into(),
                lossy: false
            }
        );
        let mut buf = b"{\"a\":\"caf\xe9\"}".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":\"caf\u{FFFD}\"}".into(),
                lossy: true
            }
        );
    }

    #[test]
    fn the_batch_answer_is_an_invalid_request_with_a_null_id() {
        let answer: Value = serde_json::from_str(&batch_error()).unwrap();
        assert_eq!(answer["id"], Value::Null);
        assert_eq!(answer["error"]["code"], -32600);
    }

    /// What the SDK's dispatch makes of a line: the JSON-RPC envelope, then the typed
    /// notification through the SDK's own parser.
    fn through_the_sdk(line: &str) -> Option<SessionNotification> {
        let message: Value = serde_json::from_str(line).ok()?;
        if message.get("jsonrpc")? != "2.0" || message.get("id").is_some() {
            return None;
        }
        let method = message.get("method")?.as_str()?;
        let params = message.get("params")?;
        SessionNotification::parse_message(method, params).ok()
    }

    fn update_strategy() -> impl Strategy<Value = Value> {
        let text = ".{0,40}";
        prop_oneof![
            chunk_strategy(),
            (
                text,
                prop::sample::select(vec!["read", "edit", "execute", "other"]),
                prop::sample::select(vec!["pending", "in_progress", "completed"])
            )
                .prop_map(|(title, kind, status)| json!({
                    "sessionUpdate": "tool_call",
                    "toolCallId": "call-1",
                    "title": title,
                    "kind": kind,
                    "status": status,
                })),
            (text, prop::option::of(Just("failed"))).prop_map(|(title, status)| json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": "call-2",
                "title": title,
                "status": status,
            })),
            text.prop_map(|content| json!({
                "sessionUpdate": "plan",
                "entries": [{"content": content, "priority": "high", "status": "pending"}],
            })),
            text.prop_map(|name| json!({"sessionUpdate": name, "content": 1})),
            (
                text,
                prop::sample::select(vec![
                    json!({"state": "running"}),
                    json!({"state": "idle", "stopReason": "end_turn"}),
                    json!({"state": "idle", "stopReason": "error", "error": {"code": -32603, "message": "boom"}}),
                    json!({"state": "unknown"}),
                ])
            )
                .prop_map(|(title, state)| json!({
                    "sessionUpdate": "subagent_update",
                    "sessionId": "child-1",
                    "title": title,
                    "capabilities": {"cancel": {}},
                    "state": state,
                })),
        ]
    }

    /// An object with `pairs` in the order `order` gives (a permutation of at least their
    /// number): `serde_json` keeps insertion order here, so the tag may come first, last or between.
    fn ordered(pairs: &[(&str, Value)], order: &[usize]) -> Value {
        let mut object = serde_json::Map::new();
        for &i in order {
            if let Some((key, value)) = pairs.get(i) {
                object.insert((*key).to_owned(), value.clone());
            }
        }
        Value::Object(object)
    }

    /// The streaming shapes and their neighbours: every chunk kind, text with characters JSON
    /// escapes, any key order, each optional field absent, `null`, well-formed or of a wrong type,
    /// annotations, unknown fields, and content that is not text.
    fn chunk_strategy() -> impl Strategy<Value = Value> {
        let kind = prop::sample::select(vec![
            "agent_message_chunk",
            "agent_thought_chunk",
            "user_message_chunk",
        ]);
        let text = prop_oneof![
            ".{0,40}",
            "[a-z \"\\\\/\t\u{1}\u{7f}\u{e9}\u{2028}\u{1F600}]{0,24}"
        ];
        let optional = |values: Vec<Value>| prop::option::of(prop::sample::select(values));
        let meta = optional(vec![
            json!({"k": [1, "v", {"n": null}], "a": 1.5}),
            json!({}),
            Value::Null,
            json!("not an object"),
        ]);
        let content_kind =
            prop::sample::select(vec!["text", "text", "text", "image", "resource_link"]);
        let annotations = prop::option::weighted(
            0.2,
            prop::sample::select(vec![
                Value::Null,
                json!({"priority": 1, "audience": ["user"]}),
            ]),
        );
        let message_id = optional(vec![json!("m-1"), Value::Null, json!(7)]);
        let unknown =
            prop::sample::select(vec![None, None, None, None, Some("content"), Some("chunk")]);
        let order = || Just((0..5).collect::<Vec<usize>>()).prop_shuffle();
        (
            (kind, text, content_kind, annotations, meta.clone()),
            (message_id, meta, unknown, order(), order()),
        )
            .prop_map(
                |(
                    (kind, text, content_kind, annotations, content_meta),
                    (message_id, chunk_meta, unknown, content_order, chunk_order),
                )| {
                    let mut content = match content_kind {
                        "text" => vec![("type", json!("text")), ("text", json!(text))],
                        "image" => vec![
                            ("type", json!("image")),
                            ("data", json!("aGk=")),
                            ("mimeType", json!("image/png")),
                        ],
                        _ => vec![
                            ("type", json!("resource_link")),
                            ("uri", json!("file:///a")),
                            ("name", json!(text)),
                        ],
                    };
                    content.extend(annotations.map(|a| ("annotations", a)));
                    content.extend(content_meta.map(|m| ("_meta", m)));
                    if unknown == Some("content") {
                        content.push(("unknownField", json!(true)));
                    }
                    // Past the permutation's length: the last extras always come last.
                    let content_order: Vec<usize> = content_order.into_iter().chain(5..8).collect();
                    let mut chunk = vec![
                        ("sessionUpdate", json!(kind)),
                        ("content", ordered(&content, &content_order)),
                    ];
                    chunk.extend(message_id.map(|id| ("messageId", id)));
                    chunk.extend(chunk_meta.map(|m| ("_meta", m)));
                    if unknown == Some("chunk") {
                        chunk.push(("unknownField", json!(1)));
                    }
                    ordered(&chunk, &chunk_order)
                },
            )
    }

    /// Frames around `update`; with `noise`, also another method, a request id and an unknown
    /// field in the update.
    fn frame_strategy(
        update: impl Strategy<Value = Value>,
        noise: bool,
    ) -> impl Strategy<Value = String> {
        (
            update,
            prop::sample::select(vec!["session/update", "session/other"]),
            prop::option::of(0_u32..3),
            prop::option::of(prop::sample::select(vec![
                json!({"x": [1, 2]}),
                Value::Null,
                json!(false),
            ])),
            prop::bool::ANY,
            prop::bool::ANY,
            prop::bool::ANY,
        )
            .prop_map(move |(update, method, id, meta, extra, escaped, pretty)| {
                let (method, id, extra) = if noise {
                    (method, id, extra)
                } else {
                    ("session/update", None, false)
                };
                let mut frame = json!({
                    "jsonrpc": "2.0",
                    "method": method,
                    "params": {"sessionId": "s", "update": update},
                });
                if let Some(id) = id {
                    frame["id"] = json!(id);
                }
                if let Some(meta) = meta {
                    frame["params"]["_meta"] = meta;
                }
                if extra {
                    frame["params"]["update"]["unknownField"] = json!(true);
                }
                let line = if pretty {
                    // Still one line: pretty printing with the newlines turned into spaces.
                    serde_json::to_string_pretty(&frame)
                        .unwrap()
                        .replace('\n', " ")
                } else {
                    frame.to_string()
                };
                if escaped {
                    // Escapes serde_json never writes, in keys, tags and text alike: an escape
                    // inside a JSON string never changes what it means.
                    line.replace("_chunk", "\\u005fchunk")
                        .replace("\"text\"", "\"t\\u0065xt\"")
                        .replace('\u{e9}', "\\u00e9")
                        .replace('\u{1F600}', "\\ud83d\\ude00")
                } else {
                    line
                }
            })
    }

    fn frame(params: &Value) -> String {
        json!({"jsonrpc": "2.0", "method": "session/update", "params": params}).to_string()
    }

    fn chunk_frame(update: &Value) -> String {
        frame(&json!({"sessionId": "s", "update": update}))
    }

    #[test]
    fn the_streaming_shapes_take_the_text_chunk_path() {
        let lines = [
            chunk_frame(&json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}})),
            // The tag last, every optional field set or null, escapes in the text.
            chunk_frame(&json!({"content": {"_meta": {"a": 1}, "text": "a\"b\\c\n\u{e9}",
                "annotations": null, "type": "text"}, "messageId": "m", "_meta": null,
                "sessionUpdate": "agent_thought_chunk"})),
            frame(&json!({"_meta": {"x": [1]}, "update": {"sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": ""}, "messageId": null}, "sessionId": "s"})),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent\u005fmessage_chunk","content":{"t\u0079pe":"t\u0065xt","text":"\ud83d\ude00"}}}}"#.to_owned(),
        ];
        for line in &lines {
            let fast = fast::text_chunk(line);
            assert!(fast.is_some(), "declined: {line}");
            assert_eq!(fast, through_the_sdk(line), "{line}");
        }
    }

    #[test]
    fn the_text_chunk_path_declines_what_it_does_not_understand_exactly() {
        let declined = [
            // Content that is not text, or text with annotations.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "image", "data": "aGk=", "mimeType": "image/png"}}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "annotations": {"priority": 1}}}),
            // Values the SDK reads as absent.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "messageId": 7}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "_meta": "x"}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "_meta": [1]}}),
            // Unknown fields, at either level.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "extra": 1}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "extra": 1}}),
            // Another update.
            json!({"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t"}),
        ];
        for update in &declined {
            let line = chunk_frame(update);
            assert!(fast::text_chunk(&line).is_none(), "taken: {line}");
            // The general decoder takes it, as the SDK does.
            let general = fast::session_notification(&line);
            assert!(general.is_some(), "{line}");
            assert_eq!(general, through_the_sdk(&line), "{line}");
        }
        // A chunk tag given as the variant's index: serde's tagged enums accept it.
        let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":1,"content":{"type":"text","text":"hi"}}}}"#;
        assert!(fast::text_chunk(line).is_none());
        assert_eq!(fast::session_notification(line), through_the_sdk(line));
        // Unknown params fields, a request id, a null text: declined here too.
        for line in [
            frame(&json!({"sessionId": "s", "extra": 1,
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}})),
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}})
            .to_string(),
            chunk_frame(&json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": null}})),
        ] {
            assert!(fast::text_chunk(&line).is_none(), "taken: {line}");
        }
    }

    #[test]
    fn a_duplicate_key_is_left_to_the_sdk() {
        // The SDK reads the frame into a JSON tree first, where the last duplicate wins; both
        // decoders here refuse duplicates, so such a frame reaches the SDK unchanged.
        for line in [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a","text":"b"}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"a"}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","sessionId":"t","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}}}"#,
        ] {
            assert!(fast::text_chunk(line).is_none(), "taken: {line}");
            assert!(fast::session_notification(line).is_none(), "taken: {line}");
            assert!(through_the_sdk(line).is_some(), "{line}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn both_paths_give_the_same_update_for_the_same_frame(
            line in prop_oneof![
                frame_strategy(update_strategy(), true),
                frame_strategy(chunk_strategy(), false),
            ]
        ) {
            let fast = fast::session_notification(&line);
            let sdk = through_the_sdk(&line);
            // The fast path may decline a frame (the SDK then handles it), never disagree: not
            // in the notification, nor in what observers get of it.
            if fast.is_some() {
                prop_assert_eq!(&fast, &sdk, "{}", line);
            }
            // What observers get is the update serialized, whichever way it is built (and in the
            // same key order).
            if let Some(notification) = sdk {
                let value = update_value(notification.update.clone());
                let serialized = serde_json::to_value(&notification.update).ok();
                prop_assert_eq!(
                    value.as_ref().map(ToString::to_string),
                    serialized.as_ref().map(ToString::to_string),
                    "{}", line
                );
            }
            // The text chunk decoder agrees with the general one whenever it takes a frame.
            if let Some(chunk) = fast::text_chunk(&line) {
                prop_assert_eq!(Some(chunk), fast::general(&line), "{}", line);
            }
            // And it declines no well-formed update the SDK accepts.
            prop_assert_eq!(fast.is_some(), through_the_sdk(&line).is_some(), "{}", line);
        }
    }
}
