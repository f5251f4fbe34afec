//! How a turn of a child is shown to this agent's client: a subagent session of its own when
//! the client advertised ACP's subagent sessions, else the child's text on the tool card.
//!
//! Invariants:
//! - a child's session id is minted on this connection ([`ChildSessions`]: `sub-1`, `sub-2`, ...),
//!   never a child agent's own, a new one per turn, so each announced session gets exactly one
//!   final state;
//! - it is announced with a `subagent_update` on the turn's session (name, task,
//!   `capabilities.cancel`, `running`) before anything else of it; then its updates go out under
//!   that id, its permission requests are asked on it, and exactly one final `subagent_update`
//!   (`protocol::child_session`) follows once the turn answered, every update of it was relayed
//!   and every request of it resolved;
//! - the sessions a child announces in turn are relayed the same way, under ids minted here and
//!   announced on their parent's minted id ([`map_ids`], pure); one the child never ended is
//!   reported `unknown`; `session/cancel` naming one is forwarded to the child
//!   (`Cancel::cancel_session`) when the child offered cancel;
//! - it is announced once its session exists (the run reported it ready), never for a child
//!   whose process or session never came: that call's card says why it failed, and no session
//!   was left without a final state;
//! - without subagent sessions, the child's streamed text is the tool call's content, bounded to
//!   the last [`SHOWN_BYTES`] and sent at a bounded rate ([`Card`]), and its own children stay
//!   hidden.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use acp_host::run::Cancel;
use agent_client_protocol::schema::MaybeUndefined;
use agent_client_protocol::v1::schema::{
    ContentBlock, IdleStateUpdate, IdleStopReason, RunningStateUpdate, SessionCancelCapabilities,
    SessionId, SessionReference, SessionUpdate, StateUpdate, SubagentSessionCapabilities,
    SubagentUpdate, ToolCallContent, ToolCallId, ToolCallUpdateFields, UnknownStateUpdate,
};
use protocol::child_session::{ChildState, failure_data};
use protocol::env_scrub::Redactor;
use protocol::permission::PermissionRequest;
use protocol::result::RunResult;
use protocol::usage::Usage;
use tokio_util::sync::CancellationToken;

use crate::backend::Turn;
use crate::backend::permission::Via;

/// How much of a running child's text its tool card shows (the tail): the whole text travels
/// once more as the result.
pub(super) const SHOWN_BYTES: usize = 8 * 1024;
/// How long new text waits at most before the card shows it, when too little came to send it at
/// once ([`Card`]).
pub(super) const CARD_DELAY: Duration = Duration::from_millis(100);

/// What a child's run saw, on its way to the turn that shows it.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every one is an update, held in a bounded queue: boxing would cost each an \
              allocation"
)]
pub(super) enum Seen {
    /// Its session exists (session/new or session/load answered).
    Ready,
    /// One of its updates, with the child session it is of (`None`: the run's own).
    Update(Option<String>, SessionUpdate),
}

/// How one turn of a child is shown: on a session of its own, announced once its session exists
/// (the client follows subagent sessions), else on its tool call's card.
pub(super) struct View<'a> {
    turn: &'a Turn,
    call: &'a ToolCallId,
    name: &'a str,
    task: &'a str,
    /// The child's run and the token fired when this turn of it is over.
    run: (Cancel, CancellationToken),
    /// `Some` when the client follows subagent sessions.
    follows: Option<&'a Arc<ChildSessions>>,
    /// Once announced.
    exposure: Option<Exposure>,
    card: Card,
}

impl<'a> View<'a> {
    pub(super) fn new(
        turn: &'a Turn,
        call: &'a ToolCallId,
        name: &'a str,
        task: &'a str,
        run: (Cancel, CancellationToken),
    ) -> Self {
        Self {
            turn,
            call,
            name,
            task,
            run,
            follows: turn.child_sessions(),
            exposure: None,
            card: Card::default(),
        }
    }

    /// Whether every update of the child goes to the client (on its session), else only its
    /// text (the card).
    pub(super) fn relays_all(&self) -> bool {
        self.follows.is_some()
    }

    /// Announces the child's session, once, when the client follows subagent sessions.
    pub(super) fn announce(&mut self) {
        if let (Some(children), None) = (self.follows, &self.exposure) {
            let mut exposure =
                Exposure::announce(self.turn, children, self.call, self.name, self.task);
            exposure.run = Some(self.run.clone());
            self.exposure = Some(exposure);
        }
    }

    /// Cancelled when the client cancels the announced session (never before it is announced).
    pub(super) fn exposed_cancel(&self) -> CancellationToken {
        self.exposure
            .as_ref()
            .map_or_else(CancellationToken::new, |exposure| {
                exposure.child.cancellation().clone()
            })
    }

    /// Handles one thing the child's run saw: anything of it means its session exists; an update
    /// is relayed on that session, or its text taken for the card (shown when due).
    pub(super) fn take(&mut self, seen: Seen) {
        self.announce();
        let Seen::Update(session, update) = seen else {
            return;
        };
        if let Some(exposure) = &mut self.exposure {
            exposure.relay(self.turn, session.as_ref(), update);
        } else {
            self.card.take(session.as_ref(), &update);
            self.tick();
        }
    }

    /// Shows the card's tail if it is due.
    pub(super) fn tick(&mut self) {
        self.card.show_if_due(self.turn, self.call, Instant::now());
    }

    /// Whether something waits for the client to have room.
    pub(super) fn waits_for_room(&self) -> bool {
        self.relays_all() || self.card.has_unseen()
    }

    /// Completes when the card's unseen text is due by [`CARD_DELAY`]; never without any.
    pub(super) async fn card_due(&self) {
        match self.card.deadline() {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    }

    /// Where a relayed permission request is asked: on the session it was made on, or on the
    /// parent's (the card); `None` for a session the child never announced.
    pub(super) fn via<'w>(
        &self,
        request: &PermissionRequest,
        withdraw: &'w CancellationToken,
    ) -> Option<Via<'w>>
    where
        'a: 'w,
    {
        match &self.exposure {
            Some(exposure) => exposure.via(request, withdraw),
            None => Some(Via::Parent {
                subagent: self.name,
            }),
        }
    }

    /// The announced session's final state, once the turn answered (`None`: it never did),
    /// what it quotes of the child redacted by `redactor`.
    pub(super) fn end(mut self, result: Option<&RunResult>, redactor: &Redactor) {
        if let Some(mut exposure) = self.exposure.take() {
            exposure.end(self.turn, result, redactor);
        }
    }
}

/// Without subagent sessions: the child's own text, shown as the tool call's content. An update
/// of a card replaces its content, so each one carries the tail ([`SHOWN_BYTES`]); it is sent
/// only once at least half of it is new, or [`CARD_DELAY`] after new text came, and only while the
/// client keeps up ([`crate::outbox`]): what reaches the client is at most twice the child's text
/// plus one tail per delay, whatever the size of the child's chunks, and the text a slow client
/// has not seen is coalesced into the tail, never queued.
#[derive(Debug, Default)]
struct Card {
    shown: String,
    /// Bytes of `shown` the client has not seen yet.
    unseen: usize,
    /// When the oldest of them came.
    since: Option<Instant>,
}

impl Card {
    /// Takes the text of the run's own message chunks (a nested session's stay hidden).
    fn take(&mut self, session: Option<&String>, update: &SessionUpdate) {
        if session.is_some() {
            return;
        }
        let SessionUpdate::AgentMessageChunk(chunk) = update else {
            return;
        };
        let ContentBlock::Text(text) = &chunk.content else {
            return;
        };
        if text.text.is_empty() {
            return;
        }
        self.push_bounded(&text.text);
        self.unseen = (self.unseen + text.text.len()).min(self.shown.len());
        self.since.get_or_insert_with(Instant::now);
    }

    /// Appends `text`, keeping at most [`SHOWN_BYTES`] (the tail, cut at a character boundary).
    fn push_bounded(&mut self, text: &str) {
        let shown = &mut self.shown;
        shown.push_str(text);
        if shown.len() > SHOWN_BYTES {
            let cut = shown.ceil_char_boundary(shown.len() - SHOWN_BYTES);
            shown.replace_range(..cut, "");
        }
    }

    /// When unseen text is due by [`CARD_DELAY`] (`None`: nothing unseen).
    fn deadline(&self) -> Option<Instant> {
        self.since.map(|since| since + CARD_DELAY)
    }

    /// Whether there is unseen text.
    fn has_unseen(&self) -> bool {
        self.unseen > 0
    }

    /// Shows the tail when it is due at `now` and the client has room.
    fn show_if_due(&mut self, turn: &Turn, call: &ToolCallId, now: Instant) {
        let due = self.unseen * 2 >= self.shown.len()
            || self.deadline().is_some_and(|deadline| now >= deadline);
        if !self.has_unseen() || !due || !turn.backlog().has_room() {
            return;
        }
        self.unseen = 0;
        self.since = None;
        let content = vec![ToolCallContent::from(self.shown.clone())];
        if let Err(error) =
            turn.update_tool_call(call, ToolCallUpdateFields::new().content(content))
        {
            tracing::debug!(error = %protocol::report::describe(&error), "cannot show a subagent's text");
        }
    }
}

/// A child exposed as a session of its own, with the sessions it announced in turn.
pub(super) struct Exposure {
    children: Arc<ChildSessions>,
    /// The child's session, cancellable by the client while this lives.
    pub(super) child: CancellableChild,
    /// The ids of the child's session and of those it announced.
    ids: Ids,
    /// Nested sessions the client may cancel (the child offered it), by minted id, while open.
    nested_cancellable: HashMap<String, CancellableChild>,
    /// The child's run and the token fired when this turn of it is over: a nested session's
    /// cancel is forwarded through the run (`Cancel::cancel_session`) until then.
    pub(super) run: Option<(Cancel, CancellationToken)>,
}

impl Exposure {
    /// Mints the child's session and announces it on the turn's session; the tool call then
    /// references it.
    pub(super) fn announce(
        turn: &Turn,
        children: &Arc<ChildSessions>,
        call: &ToolCallId,
        name: &str,
        task: &str,
    ) -> Self {
        let child = children.cancellable();
        let announce = SubagentUpdate::new(child.id().to_owned())
            .title(name.to_owned())
            .description(task.to_owned())
            .capabilities(
                SubagentSessionCapabilities::new().cancel(SessionCancelCapabilities::new()),
            )
            .state(StateUpdate::Running(RunningStateUpdate::new()));
        let announced = turn
            .notify_on(turn.session(), SessionUpdate::SubagentUpdate(announce))
            .and_then(|()| {
                turn.update_tool_call(
                    call,
                    ToolCallUpdateFields::new().content(vec![ToolCallContent::from(
                        SessionReference::new(child.id().to_owned()),
                    )]),
                )
            });
        if let Err(error) = announced {
            tracing::debug!(error = %protocol::report::describe(&error), "cannot announce a child session");
        }
        Self {
            children: Arc::clone(children),
            ids: Ids::new(child.id()),
            child,
            nested_cancellable: HashMap::new(),
            run: None,
        }
    }

    /// Where a relayed permission request is asked: on the session it was made on.
    pub(super) fn via<'a>(
        &self,
        request: &PermissionRequest,
        withdraw: &'a CancellationToken,
    ) -> Option<Via<'a>> {
        let session = self.ids.minted(request.session_id.as_deref())?;
        Some(Via::Session {
            session: SessionId::new(session),
            withdraw,
        })
    }

    /// Sends one update of the child's run on its minted session, ids mapped ([`map_ids`]).
    fn relay(&mut self, turn: &Turn, session: Option<&String>, mut update: SessionUpdate) {
        let mapped = {
            let (children, run) = (&self.children, self.run.clone());
            let cancellable = &mut self.nested_cancellable;
            map_ids(
                &mut self.ids,
                session.map(String::as_str),
                &mut update,
                &mut |theirs, offers_cancel| {
                    mint_nested(children, run.as_ref(), cancellable, theirs, offers_cancel)
                },
            )
        };
        let Mapped::Send { on, ended } = mapped else {
            tracing::debug!(?session, "dropped an update the client must not see");
            return;
        };
        if let Some(ended) = ended {
            self.nested_cancellable.remove(&ended);
        }
        if let Err(error) = turn.notify_on(SessionId::new(on), update) {
            tracing::debug!(error = %protocol::report::describe(&error), "cannot relay a child's update");
        }
    }

    /// The final snapshots: `unknown` for every nested session the child never ended (the
    /// deepest first), then the outcome of the child's turn on the turn's session (failed when
    /// its answer never came: `None`).
    pub(super) fn end(&mut self, turn: &Turn, result: Option<&RunResult>, redactor: &Redactor) {
        for (minted, on) in self.ids.open.drain(..).rev() {
            let update =
                SubagentUpdate::new(minted).state(StateUpdate::Unknown(UnknownStateUpdate::new()));
            if let Err(error) =
                turn.notify_on(SessionId::new(on), SessionUpdate::SubagentUpdate(update))
            {
                tracing::debug!(error = %protocol::report::describe(&error), "cannot end a nested session");
            }
        }
        let state = result.map_or(ChildState::Failed, |result| {
            ChildState::of_status(result.status)
        });
        let mut stop_reason = state.idle_stop_reason(result.and_then(|r| r.stop_reason.as_deref()));
        if let Some(IdleStopReason::Error(failure)) = &mut stop_reason {
            let message = match result {
                Some(result) => result.error.as_deref().map_or_else(
                    || format!("ended {}", result.status),
                    |error| redactor.redact(error),
                ),
                None => "its run ended abnormally".to_owned(),
            };
            let mut error = agent_client_protocol::v1::schema::Error::new(
                agent_client_protocol::ErrorCode::INTERNAL_ERROR.value(),
                message,
            );
            // Why an agent failed is often only on its stderr (a missing login, root refused).
            error.data =
                result.and_then(|result| failure_data(&redactor.redact(&result.stderr_tail)));
            failure.error = Some(Box::new(error));
        }
        let update = SubagentUpdate::new(self.child.id().to_owned()).state(StateUpdate::Idle(
            IdleStateUpdate::new()
                .stop_reason(stop_reason)
                .usage(result.and_then(|r| r.usage.as_ref()).map(Usage::to_acp)),
        ));
        if let Err(error) = turn.notify_on(turn.session(), SessionUpdate::SubagentUpdate(update)) {
            tracing::debug!(error = %protocol::report::describe(&error), "cannot end a child session");
        }
    }
}

/// Mints the id of a nested session the child announced (`theirs`); cancellable by the client
/// when the child offers it (`offers_cancel`) and its run is known: a `session/cancel` naming the
/// minted id is forwarded to the child as one naming `theirs`, and cancels that session only.
/// Returns the minted id and whether it is cancellable.
fn mint_nested(
    children: &Arc<ChildSessions>,
    run: Option<&(Cancel, CancellationToken)>,
    cancellable: &mut HashMap<String, CancellableChild>,
    theirs: &str,
    offers_cancel: bool,
) -> (String, bool) {
    let Some((cancel, over)) = run.filter(|_| offers_cancel).cloned() else {
        return (children.mint(), false);
    };
    let nested = children.cancellable();
    let minted = nested.id().to_owned();
    let cancelled = nested.cancellation().clone();
    let theirs = theirs.to_owned();
    tokio::spawn(async move {
        tokio::select! {
            () = cancelled.cancelled() => cancel.cancel_session(&theirs),
            () = over.cancelled() => {}
        }
    });
    cancellable.insert(minted.clone(), nested);
    (minted, true)
}

/// The session ids of one exposed turn of a child: its own minted id, and the ids minted here for
/// the sessions it announced in turn.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ids {
    /// The child's own session, as the client knows it.
    child: String,
    /// The child agent's ids of the sessions it announced -> the ids minted for them here.
    nested: HashMap<String, String>,
    /// Minted ids of nested sessions not ended yet, in announcement order, with the minted id of
    /// the session each was announced on.
    open: Vec<(String, String)>,
    /// Minted ids the client may cancel (their child offered it), while open.
    cancellable: std::collections::HashSet<String>,
    /// Announcements past [`MAX_NESTED`], dropped (with every update of theirs).
    dropped: u64,
}

/// The most sessions one turn of a child may announce in turn (acp-host's client tracks as many):
/// a child announcing without end must not grow this agent's memory; later ones are dropped and
/// counted.
const MAX_NESTED: usize = 1024;

impl Ids {
    fn new(child: &str) -> Self {
        Self {
            child: child.to_owned(),
            nested: HashMap::new(),
            open: Vec::new(),
            cancellable: std::collections::HashSet::new(),
            dropped: 0,
        }
    }

    /// The minted id of the session an update of the child's run is of: the child's own
    /// (`None`), or one it announced; `None` for one it never announced.
    fn minted(&self, session: Option<&str>) -> Option<String> {
        match session {
            None => Some(self.child.clone()),
            Some(theirs) => self.nested.get(theirs).cloned(),
        }
    }
}

/// What [`map_ids`] made of one update.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mapped {
    /// Send it on this minted session; `ended`: the nested session whose final state it carries.
    Send { on: String, ended: Option<String> },
    /// The client must not see it: of a session the child never announced, or a command list (a
    /// child session takes no prompt from the client).
    Drop,
}

/// Maps the session ids in one update of the child's run (on `session`, its own when `None`) to
/// the ids the client knows, minting one (`mint(theirs, offers_cancel) -> (minted, cancellable)`)
/// for each session the child announces: a pure rewrite of the update, apart from `mint`.
/// A nested session is offered `cancel` only when it is cancellable here; a reference to a session
/// the client does not know is dropped from a tool call's content.
fn map_ids(
    ids: &mut Ids,
    session: Option<&str>,
    update: &mut SessionUpdate,
    mint: &mut dyn FnMut(&str, bool) -> (String, bool),
) -> Mapped {
    let Some(on) = ids.minted(session) else {
        return Mapped::Drop;
    };
    let mut ended = None;
    match update {
        SessionUpdate::AvailableCommandsUpdate(_) => return Mapped::Drop,
        SessionUpdate::SubagentUpdate(announced) => {
            let theirs = announced.session_id.0.to_string();
            let offers_cancel = announced
                .capabilities
                .value()
                .is_some_and(|offered| offered.cancel.is_some());
            let minted = if let Some(minted) = ids.nested.get(&theirs) {
                minted.clone()
            } else if ids.nested.len() >= MAX_NESTED {
                ids.dropped += 1;
                if ids.dropped == 1 {
                    tracing::warn!(
                        limit = MAX_NESTED,
                        "a child announced more sessions than are relayed; dropping the rest"
                    );
                }
                return Mapped::Drop;
            } else {
                let (minted, cancellable) = mint(&theirs, offers_cancel);
                if cancellable {
                    ids.cancellable.insert(minted.clone());
                }
                ids.nested.insert(theirs, minted.clone());
                ids.open.push((minted.clone(), on.clone()));
                minted
            };
            announced.session_id = SessionId::new(minted.clone());
            // Offered only what is honoured here: cancel, through the child's run.
            announced.capabilities = if ids.cancellable.contains(&minted) && offers_cancel {
                MaybeUndefined::Value(
                    SubagentSessionCapabilities::new().cancel(SessionCancelCapabilities::new()),
                )
            } else {
                MaybeUndefined::Undefined
            };
            if announced
                .state
                .value()
                .and_then(ChildState::from_update)
                .is_some_and(|(state, _)| state.is_final())
            {
                ids.open.retain(|(open, _)| *open != minted);
                ids.cancellable.remove(&minted);
                ended = Some(minted);
            }
        }
        // A reference to a session must name one the client knows: mapped, or dropped.
        SessionUpdate::ToolCall(call) => map_references(ids, &mut call.content),
        SessionUpdate::ToolCallUpdate(call) => {
            if let Some(content) = &mut call.fields.content {
                map_references(ids, content);
            }
        }
        _ => {}
    }
    Mapped::Send { on, ended }
}

/// Maps the session references of a tool call's content to the minted ids; drops those naming a
/// session the client does not know.
fn map_references(ids: &Ids, content: &mut Vec<ToolCallContent>) {
    content.retain_mut(|item| {
        let ToolCallContent::Session(reference) = item else {
            return true;
        };
        match ids.nested.get(&*reference.session_id.0) {
            Some(minted) => {
                reference.session_id = SessionId::new(minted.clone());
                true
            }
            None => false,
        }
    });
}

/// The child sessions exposed on this connection: minted ids, and the cancellation of those the
/// client may cancel (a running delegated child).
#[derive(Debug, Default)]
pub(crate) struct ChildSessions {
    inner: Mutex<ChildInner>,
}

#[derive(Debug, Default)]
struct ChildInner {
    minted: u64,
    cancellable: HashMap<String, CancellationToken>,
}

/// A child session the client may cancel while this lives.
#[derive(Debug)]
pub(super) struct CancellableChild {
    children: Arc<ChildSessions>,
    id: String,
    cancel: CancellationToken,
}

impl ChildSessions {
    /// A fresh child session id, unique on this connection.
    pub(crate) fn mint(&self) -> String {
        let mut inner = lock(&self.inner);
        inner.minted += 1;
        format!("sub-{}", inner.minted)
    }

    /// A fresh child session that `session/cancel` can cancel until the guard is dropped.
    pub(super) fn cancellable(self: &Arc<Self>) -> CancellableChild {
        let id = self.mint();
        let cancel = CancellationToken::new();
        lock(&self.inner)
            .cancellable
            .insert(id.clone(), cancel.clone());
        CancellableChild {
            children: Arc::clone(self),
            id,
            cancel,
        }
    }

    /// Cancels the child session `id`; returns whether it is one that can be cancelled now.
    pub(crate) fn cancel(&self, id: &str) -> bool {
        match lock(&self.inner).cancellable.get(id) {
            Some(cancel) => {
                cancel.cancel();
                true
            }
            None => false,
        }
    }
}

impl CancellableChild {
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Cancelled when the client sends `session/cancel` for this child.
    pub(super) fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }
}

impl Drop for CancellableChild {
    fn drop(&mut self) {
        lock(&self.children.inner).cancellable.remove(&self.id);
    }
}

/// Every critical section leaves its data consistent, so a panic elsewhere that poisoned a lock
/// left nothing half-done: keep serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Mints `sub-N` counting from 2 (`sub-1` is the child), cancellable when offered.
    fn minter() -> impl FnMut(&str, bool) -> (String, bool) {
        let mut minted = 1;
        move |_, offers_cancel| {
            minted += 1;
            (format!("sub-{minted}"), offers_cancel)
        }
    }

    /// An update as the schema decodes it from the wire.
    fn update(value: serde_json::Value) -> SessionUpdate {
        serde_json::from_value(value).unwrap()
    }

    fn subagent(update: &SessionUpdate) -> &SubagentUpdate {
        match update {
            SessionUpdate::SubagentUpdate(announced) => announced,
            other => panic!("not a subagent_update: {other:?}"),
        }
    }

    #[test]
    fn the_childs_own_updates_go_out_on_its_minted_session_unchanged() {
        let mut ids = Ids::new("sub-1");
        let mut chunk = update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}),
        );
        let before = chunk.clone();
        let mapped = map_ids(&mut ids, None, &mut chunk, &mut minter());
        assert_eq!(
            mapped,
            Mapped::Send {
                on: "sub-1".into(),
                ended: None
            }
        );
        assert_eq!(chunk, before);
    }

    #[test]
    fn a_session_the_child_never_announced_and_command_lists_are_dropped() {
        let mut ids = Ids::new("sub-1");
        let mut chunk = update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": ""}}),
        );
        assert_eq!(
            map_ids(&mut ids, Some("theirs"), &mut chunk, &mut minter()),
            Mapped::Drop
        );
        let mut commands =
            update(json!({"sessionUpdate": "available_commands_update", "availableCommands": []}));
        assert_eq!(
            map_ids(&mut ids, None, &mut commands, &mut minter()),
            Mapped::Drop
        );
    }

    #[test]
    fn an_announced_session_gets_a_minted_id_and_only_the_cancel_honoured_here() {
        let mut ids = Ids::new("sub-1");
        let mut mint = minter();
        let mut announce = update(json!({
            "sessionUpdate": "subagent_update", "sessionId": "child-own-7",
            "capabilities": {"cancel": {}, "other": {}}, "state": {"state": "running"},
        }));
        let mapped = map_ids(&mut ids, None, &mut announce, &mut mint);
        assert_eq!(
            mapped,
            Mapped::Send {
                on: "sub-1".into(),
                ended: None
            }
        );
        assert_eq!(&*subagent(&announce).session_id.0, "sub-2");
        assert_eq!(
            serde_json::to_value(&subagent(&announce).capabilities).unwrap(),
            json!({"cancel": {}})
        );
        assert_eq!(ids.open, [("sub-2".to_owned(), "sub-1".to_owned())]);
        // Its own updates now go out on the minted id.
        let mut chunk = update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": ""}}),
        );
        assert_eq!(
            map_ids(&mut ids, Some("child-own-7"), &mut chunk, &mut mint),
            Mapped::Send {
                on: "sub-2".into(),
                ended: None
            }
        );
        // One announced without cancel is offered none.
        let mut plain = update(
            json!({"sessionUpdate": "subagent_update", "sessionId": "child-own-8", "capabilities": {"cancel": {}}}),
        );
        let mut no_cancel = |_: &str, _: bool| ("sub-3".to_owned(), false);
        map_ids(&mut ids, None, &mut plain, &mut no_cancel);
        assert_eq!(&*subagent(&plain).session_id.0, "sub-3");
        let wire = serde_json::to_value(&plain).unwrap();
        assert!(wire.get("capabilities").is_none(), "{wire}");
        // Its final state ends it.
        let mut done = update(
            json!({"sessionUpdate": "subagent_update", "sessionId": "child-own-7", "state": {"state": "idle", "stopReason": "end_turn"}}),
        );
        assert_eq!(
            map_ids(&mut ids, None, &mut done, &mut mint),
            Mapped::Send {
                on: "sub-1".into(),
                ended: Some("sub-2".into())
            }
        );
        assert_eq!(&*subagent(&done).session_id.0, "sub-2");
        assert_eq!(ids.open, [("sub-3".to_owned(), "sub-1".to_owned())]);
        assert!(!ids.cancellable.contains("sub-2"));
    }

    #[test]
    fn announcements_past_the_cap_are_dropped_and_counted() {
        let mut ids = Ids::new("sub-1");
        let mut mint = minter();
        for n in 0..=MAX_NESTED {
            let mut announce =
                SessionUpdate::SubagentUpdate(SubagentUpdate::new(format!("theirs-{n}")));
            let mapped = map_ids(&mut ids, None, &mut announce, &mut mint);
            assert_eq!(matches!(mapped, Mapped::Drop), n == MAX_NESTED, "{n}");
        }
        assert_eq!(ids.nested.len(), MAX_NESTED);
        assert_eq!(ids.dropped, 1);
        // A session already announced is still relayed.
        let mut chunk = SessionUpdate::SubagentUpdate(SubagentUpdate::new("theirs-0"));
        assert!(matches!(
            map_ids(&mut ids, None, &mut chunk, &mut mint),
            Mapped::Send { .. }
        ));
    }

    #[test]
    fn a_tool_calls_session_references_are_mapped_or_dropped() {
        let mut ids = Ids::new("sub-1");
        let mut mint = minter();
        let mut announce =
            update(json!({"sessionUpdate": "subagent_update", "sessionId": "theirs"}));
        map_ids(&mut ids, None, &mut announce, &mut mint);
        let content = json!([
            {"type": "session", "sessionId": "theirs"},
            {"type": "session", "sessionId": "unknown"},
            {"type": "content", "content": {"type": "text", "text": "t"}},
        ]);
        let mapped = json!([
            {"type": "session", "sessionId": "sub-2"},
            {"type": "content", "content": {"type": "text", "text": "t"}},
        ]);
        for kind in ["tool_call_update", "tool_call"] {
            let mut call = update(json!({
                "sessionUpdate": kind, "toolCallId": "c", "title": "t", "content": content,
            }));
            map_ids(&mut ids, None, &mut call, &mut mint);
            assert_eq!(
                serde_json::to_value(&call).unwrap()["content"],
                mapped,
                "{kind}"
            );
        }
    }

    #[test]
    fn the_shown_text_keeps_the_tail_at_a_char_boundary() {
        let mut card = Card::default();
        card.push_bounded("héllo ");
        assert_eq!(card.shown, "héllo ");
        card.push_bounded(&"é".repeat(SHOWN_BYTES));
        assert!(card.shown.len() <= SHOWN_BYTES);
        assert!(card.shown.chars().all(|c| c == 'é'));
    }
}
