//! State the handlers and the drive share ([`Shared`]), read by `run` on every settle path: the
//! output, permission records, our session id, tool-call notes, child sessions, the persona's
//! delivery and the structured answer; and what every `session/update` does before observers see
//! it ([`handle_update`]).
//!
//! Invariants:
//! - output is the tail (at most the run's `max_output_bytes`) of every `agent_message_chunk`
//!   text of our own session (a child's text is an event, not output), in order, kept here so a
//!   partial output survives cancel and error;
//! - a `session/update` for a session that is neither ours nor an announced child's is ignored
//!   (logged), neither output nor event;
//! - `ready` comes before every update: what arrives before our session is announced is held
//!   (within [`HELD_UPDATES_MAX_BYTES`]) and released in order once it is, or, resuming, dropped
//!   (the replayed history: the run shows only the new turn);
//! - nothing grows with the length of a run: permission records are capped at
//!   [`MAX_PERMISSION_RECORDS`] and tool-call notes at [`MAX_TOOL_CALLS`], with counts of what was
//!   dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use agent_client_protocol::v1::schema::{ContentBlock, SessionNotification, SessionUpdate};
use protocol::capabilities::PersonaDelivery;
use protocol::child_session::ChildSession;
use protocol::permission::PermissionDecision;
use protocol::result::MAX_PERMISSION_RECORDS;

use super::children::Children;
use super::usage::Tally;
use super::{ChildRef, DriveEvents, Structured};
use crate::lock;

/// The most tool calls whose title and kind are remembered (for permission requests that name
/// only the id); later ones are not remembered.
const MAX_TOOL_CALLS: usize = 4096;
/// Updates that arrive before `session/new` answered are held (to announce the session first, and
/// to know whether they are of our session) up to this many bytes; beyond it they are dropped.
const HELD_UPDATES_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Which session a notification is of.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    Ours,
    Child(ChildRef),
    Foreign,
}

/// State the handlers and the drive share, read by `run` on every settle path.
#[derive(Debug)]
pub(crate) struct Shared {
    output: Mutex<OutputTail>,
    permissions: Mutex<Capped<PermissionDecision>>,
    session_id: Mutex<Option<String>>,
    /// Whether the agent advertised `loadSession` at `initialize`, once it answered.
    resumable: Mutex<Option<bool>>,
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
    /// What the agent reported spending, and the run's budget.
    usage: Mutex<Tally>,
}

impl Shared {
    pub(crate) fn new(
        max_output_bytes: usize,
        budget: protocol::usage::Budget,
        on_unreported: protocol::usage::Unreported,
    ) -> Self {
        Shared {
            output: Mutex::new(OutputTail::new(max_output_bytes)),
            permissions: Mutex::new(Capped::new(MAX_PERMISSION_RECORDS)),
            session_id: Mutex::default(),
            resumable: Mutex::default(),
            cancelling: AtomicBool::new(false),
            garbage_lines: AtomicU64::new(0),
            foreign_updates: AtomicU64::new(0),
            start_gate: Mutex::default(),
            tool_calls: Mutex::default(),
            children: Mutex::default(),
            persona_delivery: Mutex::default(),
            turn_text: Mutex::default(),
            structured: Mutex::default(),
            usage: Mutex::new(Tally::new(budget).on_unreported(on_unreported)),
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
pub(super) struct ToolCallInfo {
    pub(super) title: Option<String>,
    pub(super) kind: Option<String>,
}

/// The last `cap` bytes of the output text, cut on a character boundary, and how many bytes
/// were dropped before them.
#[derive(Debug)]
struct OutputTail {
    cap: usize,
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl OutputTail {
    fn new(cap: usize) -> Self {
        OutputTail {
            cap,
            bytes: VecDeque::new(),
            dropped: 0,
        }
    }

    fn push(&mut self, text: &str) {
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
    fn take(&mut self) -> (String, Option<u64>) {
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
struct Capped<T> {
    cap: usize,
    items: Vec<T>,
    dropped: u64,
}

impl<T> Capped<T> {
    fn new(cap: usize) -> Self {
        Capped {
            cap,
            items: Vec::new(),
            dropped: 0,
        }
    }

    fn push(&mut self, item: T) {
        if self.items.len() < self.cap {
            self.items.push(item);
        } else {
            self.dropped += 1;
        }
    }
}

/// Which result is being settled: a kept session's turn (the agent lives on) or the run's last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResultOf {
    Turn,
    Run,
}

impl Shared {
    /// The output (taken: called once, when the run settles) and how many bytes were dropped.
    pub(crate) fn take_output(&self) -> (String, Option<u64>) {
        lock(&self.output).take()
    }

    /// The recorded decisions (taken) and how many more were not recorded.
    pub(crate) fn take_permissions(&self) -> (Vec<PermissionDecision>, Option<u64>) {
        let mut permissions = lock(&self.permissions);
        let dropped = permissions.dropped;
        (
            std::mem::take(&mut permissions.items),
            (dropped > 0).then_some(dropped),
        )
    }

    pub(crate) fn session_id(&self) -> Option<String> {
        lock(&self.session_id).clone()
    }

    /// The child sessions for a result: a kept session's turn lists those that changed in it,
    /// still tracked; the run's final result takes them (called once, when the run settles).
    pub(crate) fn children_for(&self, result: ResultOf) -> Vec<ChildSession> {
        let mut children = lock(&self.children);
        match result {
            ResultOf::Turn => children.changed(),
            ResultOf::Run => children.take(),
        }
    }

    /// What the agent reported spending since the last turn settled (a run's only turn: in
    /// all); `None`: no token counts.
    pub(crate) fn take_turn_usage(&self) -> Option<protocol::usage::Usage> {
        lock(&self.usage).take_turn()
    }

    /// The run's budget (what an agent that holds its own is handed at session start).
    pub(crate) fn budget(&self) -> protocol::usage::Budget {
        lock(&self.usage).budget()
    }

    /// The budget overrun, once the reported usage passed the run's budget.
    pub(crate) fn overrun(&self) -> Option<protocol::usage::Overrun> {
        lock(&self.usage).overrun().cloned()
    }

    /// Why the run was cancelled for its budget although nothing passed it: the agent reported
    /// no usage (or no cost) by the end of its first reply (`--on-unreported error`).
    pub(crate) fn budget_unheld(&self) -> Option<&'static str> {
        lock(&self.usage).unheld()
    }

    /// Why the run's budget could not be held on what the agent reported, if it could not.
    pub(crate) fn budget_unenforceable(&self) -> Option<&'static str> {
        lock(&self.usage).unenforceable()
    }

    /// Fires once the reported usage passes the run's budget.
    pub(crate) fn budget_passed(&self) -> tokio_util::sync::CancellationToken {
        lock(&self.usage).passed()
    }

    /// A prompt response (its `usage`, when it reports one).
    pub(super) fn answered(&self, response: &serde_json::Value) {
        lock(&self.usage).answered(response);
    }

    pub(crate) fn take_structured(&self) -> Option<Structured> {
        lock(&self.structured).take()
    }

    /// Starts collecting a new turn's text (for a run asking a structured answer).
    pub(super) fn begin_turn_text(&self, cap: usize) {
        *lock(&self.turn_text) = Some(OutputTail::new(cap));
    }

    /// The turn's text and how many bytes of it did not fit.
    pub(super) fn take_turn_text(&self) -> (String, Option<u64>) {
        lock(&self.turn_text)
            .as_mut()
            .map(OutputTail::take)
            .unwrap_or_default()
    }

    pub(crate) fn persona_delivery(&self) -> Option<PersonaDelivery> {
        *lock(&self.persona_delivery)
    }

    pub(crate) fn garbage_lines(&self) -> u64 {
        self.garbage_lines.load(Ordering::Relaxed)
    }

    /// One more non-JSON line skipped on the agent's stdout.
    pub(super) fn count_garbage_line(&self) {
        self.garbage_lines.fetch_add(1, Ordering::Relaxed);
    }

    /// Resuming: what arrives before the session is announced is the replayed history, dropped.
    pub(super) fn discard_until_open(&self) {
        lock(&self.start_gate).discard = true;
    }

    pub(crate) fn resumable(&self) -> Option<bool> {
        *lock(&self.resumable)
    }

    pub(super) fn set_resumable(&self, resumable: bool) {
        *lock(&self.resumable) = Some(resumable);
    }

    pub(super) fn set_session_id(&self, session_id: &str) {
        *lock(&self.session_id) = Some(session_id.to_owned());
    }

    pub(super) fn set_persona_delivery(&self, delivery: Option<PersonaDelivery>) {
        *lock(&self.persona_delivery) = delivery;
    }

    pub(super) fn set_structured(&self, outcome: Structured) {
        *lock(&self.structured) = Some(outcome);
    }

    /// Called before session/cancel is sent: from then on permissions are answered `cancelled`.
    pub(super) fn begin_cancelling(&self) {
        self.cancelling.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_cancelling(&self) -> bool {
        self.cancelling.load(Ordering::SeqCst)
    }

    /// What updates said about a tool call of `session` (nothing, when none named it).
    pub(super) fn tool_call(&self, session: &str, tool_call_id: &str) -> ToolCallInfo {
        lock(&self.tool_calls)
            .get(&tool_call_key(session, tool_call_id))
            .cloned()
            .unwrap_or_default()
    }

    /// Announces the session, then releases the updates that raced ahead of it, in order (those
    /// of another session are dropped).
    pub(super) fn open_start_gate(&self, session_id: &str, events: &dyn DriveEvents) {
        let mut gate = lock(&self.start_gate);
        events.ready(session_id);
        for (notification, _) in gate.held.drain(..) {
            let scope = self.scope(&notification);
            if let Some((update, child)) =
                self.take_in(&notification.session_id, notification.update, scope)
            {
                events.update_now(update, child);
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
        let mut gate = lock(&self.start_gate);
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
        if lock(&self.session_id).as_deref() == Some(theirs) {
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
    pub(super) fn child(&self, session_id: &str) -> Option<ChildRef> {
        lock(&self.children).get(session_id).map(|child| ChildRef {
            session_id: child.session_id.clone(),
            name: child.name.clone(),
        })
    }

    /// What an update of our session or of a child's does before observers see it: output text
    /// (ours only), tool-call notes, child announcements; then the update observers get, with the
    /// child it belongs to. `None` for a foreign session.
    fn take_in(
        &self,
        session: &agent_client_protocol::v1::schema::SessionId,
        update: SessionUpdate,
        scope: Scope,
    ) -> Option<(SessionUpdate, Option<ChildRef>)> {
        let child = match scope {
            Scope::Ours => None,
            Scope::Child(child) => Some(child),
            Scope::Foreign => return None,
        };
        match &update {
            SessionUpdate::AgentMessageChunk(chunk) if child.is_none() => {
                if let ContentBlock::Text(text) = &chunk.content {
                    lock(&self.output).push(&text.text);
                    if let Some(turn) = lock(&self.turn_text).as_mut() {
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
                if let Some(ours) = self.session_id() {
                    lock(&self.children).apply(&session.0, &ours, announced);
                }
            }
            SessionUpdate::UsageUpdate(usage) => match &child {
                None => lock(&self.usage).updated(usage),
                Some(child) => lock(&self.children).usage(
                    &child.session_id,
                    usage.meta.as_ref(),
                    usage.cost.as_ref(),
                ),
            },
            // An agent that knows no context window carries its counts here.
            SessionUpdate::SessionInfoUpdate(info) if info.meta.is_some() => match &child {
                None => lock(&self.usage).counted(info.meta.as_ref(), None),
                Some(child) => {
                    lock(&self.children).usage(&child.session_id, info.meta.as_ref(), None);
                }
            },
            _ => {}
        }
        Some((update, child))
    }

    pub(super) async fn record(
        &self,
        decision: PermissionDecision,
        waited: std::time::Duration,
        events: &dyn DriveEvents,
    ) {
        events.permission(&decision, waited).await;
        lock(&self.permissions).push(decision);
    }
}

/// What every `session/update` does, whichever path decoded it: through the start gate, then
/// output text, tool-call notes and the event (waiting while observers are behind).
pub(super) async fn handle_update(
    shared: &Shared,
    events: &dyn DriveEvents,
    notification: SessionNotification,
    size: usize,
) {
    if let Some((notification, scope)) = shared.admit(notification, size)
        && let Some((update, child)) =
            shared.take_in(&notification.session_id, notification.update, scope)
    {
        events.update(update, size, child).await;
    }
}

/// Tool call ids are per session: the key of one in [`Shared`]'s notes.
fn tool_call_key(session: &str, tool_call_id: &str) -> String {
    format!("{session}\u{0}{tool_call_id}")
}

fn remember_tool_call(shared: &Shared, id: String, title: Option<String>, kind: Option<String>) {
    let mut calls = lock(&shared.tool_calls);
    if calls.len() >= MAX_TOOL_CALLS && !calls.contains_key(&id) {
        return;
    }
    let entry = calls.entry(id).or_default();
    entry.title = title.or(entry.title.take());
    entry.kind = kind.or(entry.kind.take());
}

/// The wire name of a tool kind (`edit`, `execute`, ...).
fn kind_name(kind: agent_client_protocol::v1::schema::ToolKind) -> Option<String> {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {

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
}
