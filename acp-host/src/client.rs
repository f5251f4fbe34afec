//! The ACP client side of one run, on the official SDK: framing of the agent's stdout, the
//! handlers for `session/update` and `session/request_permission`, and the drive
//! initialize -> session/new -> session/prompt, with cancellation.
//!
//! Invariants:
//! - no client capabilities are advertised, so `fs/*` and `terminal/*` requests get the SDK's
//!   "method not found" (-32601);
//! - output is every `agent_message_chunk` text of our session, in order, kept in [`Shared`] so a
//!   partial output survives cancel and error; a `session/update` for another session id is
//!   ignored (logged), neither output nor event;
//! - once cancellation began, every permission request (pending or new) is answered `cancelled`;
//! - a permission request is read leniently from its JSON (unknown option kinds, numeric ids,
//!   missing names), so it always reaches the handler and the record; the chosen id is echoed back
//!   exactly as the agent sent it;
//! - the prompt is never sent if cancellation came before `session/new` answered;
//! - a non-JSON line on the agent's stdout is skipped (and counted), never fatal; a frame larger
//!   than [`DriveConfig::max_frame_bytes`] ends the run with a clear error instead of eating memory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, Implementation, InitializeRequest, NewSessionRequest,
    PromptRequest, SessionNotification, SessionUpdate, TextContent,
};
use agent_client_protocol::{Agent, Client, Lines, UntypedMessage};
use futures::Stream;
use protocol::permission::{
    self, Answer, DecidedBy, OfferedKind, OfferedOption, Outcome, PermissionDecision,
    PermissionRequest,
};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStdout;
use tokio_util::sync::CancellationToken;

use crate::permission::{Decision, PermissionHandler};
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
}

/// What the drive reports as it goes.
pub(crate) trait DriveEvents: Send + Sync {
    /// session/new answered: the agent is ready.
    fn ready(&self, session_id: &str);
    /// One `session/update` (the `update` object as sent).
    fn update(&self, update: serde_json::Value);
    /// One permission request was answered.
    fn permission(&self, decision: &PermissionDecision);
}

/// State the handlers and the drive share, read by `run` on every settle path.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    output: Mutex<String>,
    permissions: Mutex<Vec<PermissionDecision>>,
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
    /// Title and kind of each tool call seen in updates: a permission request may carry only the
    /// tool call id, and the decision should still say what it was about.
    tool_calls: Mutex<HashMap<String, ToolCallInfo>>,
}

/// Updates that arrived before the drive announced the session as ready.
#[derive(Debug, Default)]
struct StartGate {
    open: bool,
    held: Vec<SessionNotification>,
}

/// What updates said about one tool call.
#[derive(Debug, Clone, Default)]
struct ToolCallInfo {
    title: Option<String>,
    kind: Option<String>,
}

impl Shared {
    pub(crate) fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    pub(crate) fn permissions(&self) -> Vec<PermissionDecision> {
        self.permissions
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    pub(crate) fn session_id(&self) -> Option<String> {
        self.session_id.lock().ok().and_then(|s| s.clone())
    }

    pub(crate) fn garbage_lines(&self) -> u64 {
        self.garbage_lines.load(Ordering::Relaxed)
    }

    /// Announces the session, then releases the updates that raced ahead of it, in order.
    fn open_start_gate(&self, session_id: &str, events: &dyn DriveEvents) {
        let Ok(mut gate) = self.start_gate.lock() else {
            return;
        };
        events.ready(session_id);
        for notification in gate.held.drain(..) {
            self.accept(&notification, events);
        }
        gate.open = true;
    }

    /// One `session/update`: held until the session is ready, then accepted. The gate's lock is
    /// held while accepting, so updates keep their order.
    fn receive(&self, notification: SessionNotification, events: &dyn DriveEvents) {
        let Ok(mut gate) = self.start_gate.lock() else {
            return;
        };
        if gate.open {
            self.accept(&notification, events);
        } else {
            gate.held.push(notification);
        }
    }

    /// Takes an update of our session into the output and the events; drops any other.
    fn accept(&self, notification: &SessionNotification, events: &dyn DriveEvents) {
        let theirs = notification.session_id.to_string();
        if self.session_id().as_deref() != Some(theirs.as_str()) {
            if self.foreign_updates.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::info!(session = %theirs, "ignoring session/update for a session that is not ours");
            } else {
                tracing::debug!(session = %theirs, "ignoring session/update for a session that is not ours");
            }
            return;
        }
        on_session_update(self, events, &notification.update);
    }

    fn record(&self, decision: PermissionDecision, events: &dyn DriveEvents) {
        events.permission(&decision);
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
    Prompt,
}

impl Stage {
    pub(crate) fn method(self) -> &'static str {
        match self {
            Stage::Initialize => "initialize",
            Stage::NewSession => "session/new",
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
}

/// Runs initialize -> session/new -> session/prompt over the agent's pipes until the prompt is
/// answered, the connection fails, or `cancel` fires (then session/cancel and a bounded wait).
pub(crate) async fn drive(
    pipes: AgentPipes,
    config: DriveConfig,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    cancel: CancellationToken,
) -> DriveEnd {
    let frames = frames(pipes.stdout, config.max_frame_bytes, Arc::clone(&shared));
    let transport = Lines::new(pipes.stdin, frames);

    let on_update = {
        let shared = Arc::clone(&shared);
        let events = Arc::clone(&events);
        async move |notification: SessionNotification, _cx: ConnectionTo<Agent>| {
            shared.receive(notification, events.as_ref());
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
    shared.record(
        PermissionDecision {
            tool_call_id: request.tool_call_id,
            title: request.title,
            tool_kind: request.tool_kind,
            offered: request.offered,
            verdict: decision.answer.verdict(),
            decided_by: decision.decided_by,
            outcome,
        },
        events.as_ref(),
    );
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
    let session_id = match handshake(cx, config, cancel).await {
        Ok(id) => id,
        Err(end) => return end,
    };
    if let Ok(mut slot) = shared.session_id.lock() {
        *slot = Some(session_id.clone());
    }
    shared.open_start_gate(&session_id, events);

    let prompt = PromptRequest::new(
        session_id.clone(),
        vec![ContentBlock::Text(TextContent::new(config.prompt.clone()))],
    );
    let prompt = match UntypedMessage::new("session/prompt", prompt) {
        Ok(message) => message,
        Err(err) => return failed(Stage::Prompt, &err),
    };
    let answer = cx.send_request(prompt).block_task();
    tokio::pin!(answer);
    tokio::select! {
        biased;
        response = &mut answer => match response {
            Ok(value) => stop_reason_of(&value),
            Err(err) => failed(Stage::Prompt, &err),
        },
        () = cancel.cancelled() => {
            shared.cancelling.store(true, Ordering::SeqCst);
            if let Err(err) = cx.send_notification(CancelNotification::new(session_id)) {
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
            DriveEnd::Cancelled { prompt_sent: true, stop_reason }
        }
    }
}

/// initialize, then session/new, within the handshake deadline: the session id, or how the drive
/// ended (cancelled first, timed out, or failed).
async fn handshake(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    cancel: &CancellationToken,
) -> Result<String, DriveEnd> {
    // Which handshake step a timeout interrupted, for the message.
    let initialized = AtomicBool::new(false);
    let steps = async {
        cx.send_request(
            InitializeRequest::new(ProtocolVersion::V1)
                .client_info(Implementation::new("acp-host", env!("CARGO_PKG_VERSION"))),
        )
        .block_task()
        .await
        .map_err(|err| failed(Stage::Initialize, &err))?;
        initialized.store(true, Ordering::Relaxed);
        // Untyped so that a response without a session id is reported as such, not as a parse error.
        let new_session = UntypedMessage::new("session/new", NewSessionRequest::new(&config.cwd))
            .map_err(|err| failed(Stage::NewSession, &err))?;
        let response = cx
            .send_request(new_session)
            .block_task()
            .await
            .map_err(|err| failed(Stage::NewSession, &err))?;
        match response
            .get("sessionId")
            .and_then(serde_json::Value::as_str)
        {
            Some(id) if !id.is_empty() => Ok(id.to_owned()),
            _ => Err(DriveEnd::Failed {
                stage: Stage::NewSession,
                closed: false,
                message: format!("agent answered session/new without a sessionId: {response}"),
            }),
        }
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(DriveEnd::Cancelled { prompt_sent: false, stop_reason: None }),
        answer = tokio::time::timeout(config.handshake_timeout, steps) => answer.unwrap_or_else(|_| {
            let stage = if initialized.load(Ordering::Relaxed) {
                Stage::NewSession
            } else {
                Stage::Initialize
            };
            Err(DriveEnd::HandshakeTimeout { stage })
        }),
    }
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

fn on_session_update(shared: &Shared, events: &dyn DriveEvents, update: &SessionUpdate) {
    match update {
        SessionUpdate::AgentMessageChunk(chunk) => {
            if let ContentBlock::Text(text) = &chunk.content
                && let Ok(mut output) = shared.output.lock()
            {
                output.push_str(&text.text);
            }
        }
        SessionUpdate::ToolCall(call) => {
            remember_tool_call(
                shared,
                call.tool_call_id.to_string(),
                Some(call.title.clone()),
                kind_name(call.kind),
            );
        }
        SessionUpdate::ToolCallUpdate(call) => remember_tool_call(
            shared,
            call.tool_call_id.to_string(),
            call.fields.title.clone(),
            call.fields.kind.and_then(kind_name),
        ),
        _ => {}
    }
    match serde_json::to_value(update) {
        Ok(value) => events.update(value),
        Err(err) => tracing::debug!(%err, "could not serialize a session update"),
    }
}

fn remember_tool_call(shared: &Shared, id: String, title: Option<String>, kind: Option<String>) {
    if let Ok(mut calls) = shared.tool_calls.lock() {
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
    let known = shared
        .tool_calls
        .lock()
        .ok()
        .and_then(|calls| calls.get(&tool_call_id).cloned())
        .unwrap_or_default();
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

/// The agent's stdout as a stream of JSON frames: blank and non-JSON lines are skipped (some
/// agents print banners to stdout), oversized frames end the stream with an error.
fn frames(
    stdout: ChildStdout,
    max_frame_bytes: usize,
    shared: Arc<Shared>,
) -> impl Stream<Item = std::io::Result<String>> + Send + 'static {
    let state = (BufReader::new(stdout), Vec::new(), false);
    futures::stream::unfold(state, move |(mut reader, mut buf, done)| {
        let shared = Arc::clone(&shared);
        async move {
            if done {
                return None;
            }
            loop {
                match read_frame(&mut reader, &mut buf, max_frame_bytes).await {
                    Ok(Some(())) => match frame_text(&mut buf) {
                        Some(frame) => return Some((Ok(frame), (reader, buf, false))),
                        None if buf.is_empty() => {}
                        None => {
                            shared.garbage_lines.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(
                                line = %String::from_utf8_lossy(&buf[..buf.len().min(200)]),
                                "skipped a non-JSON line on the agent's stdout"
                            );
                        }
                    },
                    Ok(None) => return None,
                    Err(err) => return Some((Err(err), (reader, buf, true))),
                }
            }
        }
    })
}

/// The JSON frame in `buf`, moved out without copying when the line needs no trimming. `None`
/// leaves `buf` holding a non-JSON line (or nothing, for a blank one) for the caller to report.
fn frame_text(buf: &mut Vec<u8>) -> Option<String> {
    let trimmed = std::str::from_utf8(buf).ok()?.trim();
    if trimmed.is_empty() {
        buf.clear();
        return None;
    }
    if !trimmed.starts_with('{') {
        return None;
    }
    if trimmed.len() == buf.len() {
        // Valid UTF-8 was checked above; the frame is the whole line: no copy.
        return String::from_utf8(std::mem::take(buf)).ok();
    }
    Some(trimmed.to_owned())
}

/// Reads one `\n`-terminated line into `buf` (without the newline); `None` at EOF.
async fn read_frame(
    reader: &mut BufReader<ChildStdout>,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<()>> {
    buf.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if buf.is_empty() { None } else { Some(()) });
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if buf.len() + chunk.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("agent sent a frame larger than {max} bytes"),
            ));
        }
        buf.extend_from_slice(chunk);
        let consumed = found.unwrap_or(chunk.len());
        reader.consume(consumed);
        if found.is_some() {
            return Ok(Some(()));
        }
    }
}
