//! The sessions of one connection and their in-flight prompt turns.
//!
//! Invariants: session ids are minted here only ([`Sessions::mint_id`]): `sess-1`, `sess-2`, ...
//! for sessions that live as long as the connection, `sess-<uuid>` for saved ones (unique across
//! connections, as their files are); a session has at most one prompt turn in flight; the turn's
//! slot is freed when its [`ActiveTurn`] guard is dropped, which the server does *before* answering
//! `session/prompt`, so a client may send its next prompt as soon as it sees the response.
//! Cancelling a session cancels only its current turn.
//!
//! Each session also has a [`Memory`]: the conversation so far (for the model backend and
//! `session/load`), the standing permission answers (`allow-always` / `reject-always`, per
//! permission kind), the tool call ids announced so far (each is announced once) and the
//! session's [`Settings`] (system prompt, model, tool filter, output schema, depth cap). It lives
//! as long as the connection and is shared with the session's turns.
//!
//! The children a turn exposes as sessions of their own (ACP subagent sessions, when the client
//! advertised them) are in [`ChildSessions`](crate::backend::children::ChildSessions): their ids are minted here too (`sub-1`, `sub-2`, ...,
//! counting on this connection, never an id a child agent chose), and `session/cancel` naming one
//! cancels that child only.
//!
//! Synchronous on purpose: every method is a short critical section, safe to call from the SDK's
//! dispatch loop (which must not block) and from spawned turn tasks.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use protocol::capabilities::ToolFilter;
use protocol::depth::DepthBudget;
use protocol::structured::OutputSchema;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::backend::children::table::Tasks;

use crate::persona::{Persona, SessionPersona};
use crate::store::{ChildRecord, Record, SavedSettings, SessionFile};
use crate::workspace::Workspace;

/// Why a prompt cannot start.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum SessionError {
    #[error("unknown session {id}; create a session with session/new first")]
    Unknown { id: String },
    #[error(
        "session {id} already has a prompt in flight; wait for its response or send session/cancel first"
    )]
    Busy { id: String },
    #[error("session {id} is already open on this connection; keep using it")]
    AlreadyOpen { id: String },
}

/// What the client chose for a session: at `session/new` (system prompt, tool filter) and with
/// `session/set_config_option` (model). `None`: the agent's own default.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub(crate) persona: Option<SessionPersona>,
    pub(crate) model: Option<String>,
    pub(crate) tools: Option<ToolFilter>,
    /// A structured answer is asked for: the capture tool is offered with this schema.
    pub(crate) output: Option<Arc<OutputSchema>>,
    /// The session's own delegation cap (the start extension's `maxDepth`): it lowers this
    /// agent's inherited one for the session's delegation and commands, never raises it.
    pub(crate) max_depth: Option<u32>,
    /// The budget the client holds the run to (the start extension's `budget`): the model
    /// backend ends a turn before a request would pass it. Never saved: it is the client's run's,
    /// not the session's (a loaded session gets the one its new run sends, if any).
    pub(crate) budget: Option<protocol::usage::Budget>,
    /// This agent's own delegation standing, handed to the session when it is opened (the one
    /// reading of it, at start: `AgentConfig`'s); `None` when the values it inherited are
    /// malformed. Never saved: it is this process's, not the session's.
    pub(crate) agent_depth: Option<DepthBudget>,
}

impl Settings {
    /// Where this session stands for delegation (its children, the commands it runs): this
    /// agent's own standing with the cap lowered by the session's (`max_depth`); `None` when
    /// this agent's inherited values are malformed.
    pub(crate) fn depth(&self) -> Option<DepthBudget> {
        self.agent_depth.map(|depth| depth.lowered(self.max_depth))
    }

    /// What is saved of these settings with a persistent session.
    fn saved(&self) -> SavedSettings {
        SavedSettings {
            model: self.model.clone(),
            persona: self.persona.as_ref().map(|p| p.template.clone()),
            persona_replaces: self.persona.as_ref().is_some_and(|p| p.replace),
            tools: self.tools.clone(),
            output_schema: self.output.as_ref().map(|o| o.schema().clone()),
            max_depth: self.max_depth,
        }
    }

    /// The settings a saved session was left with. A saved persona or schema that no longer
    /// parses (a file edited by hand) is dropped with a warning rather than making the session
    /// unloadable.
    pub(crate) fn restored(saved: SavedSettings) -> Self {
        let persona = saved.persona.and_then(|template| {
            Persona::new(&template)
                .map(|persona| SessionPersona {
                    persona,
                    replace: saved.persona_replaces,
                    template,
                })
                .inspect_err(|error| {
                    tracing::warn!(error = %protocol::report::describe(error), "dropping the saved system prompt");
                })
                .ok()
        });
        let output = saved.output_schema.and_then(|schema| {
            OutputSchema::compile(schema)
                .map(Arc::new)
                .inspect_err(|error| {
                    tracing::warn!(%error, "dropping the saved output schema");
                })
                .ok()
        });
        Self {
            persona,
            model: saved.model,
            tools: saved.tools,
            output,
            max_depth: saved.max_depth,
            budget: None,
            agent_depth: None,
        }
    }
}

/// What a session remembers between its turns.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    history: Mutex<Vec<Record>>,
    standing: Mutex<HashMap<String, bool>>,
    tool_call_ids: Mutex<ToolCallIds>,
    settings: Mutex<Settings>,
    /// The structured answer captured in the current turn.
    captured: Mutex<Option<serde_json::Value>>,
    /// Where the conversation is also saved (persistent sessions only): the session's file,
    /// locked for as long as this memory lives.
    saved_to: Option<SessionFile>,
    /// The session's delegated children and background tasks.
    tasks: Arc<Tasks>,
    /// What the session spent since it was opened or loaded in this process (not saved: a
    /// loaded session counts from zero), and the context its last model request carried.
    usage: Mutex<SessionUsage>,
}

/// A session's usage so far ([`Memory::spend`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionUsage {
    pub(crate) total: protocol::usage::Usage,
    /// The last model request's context (`used`) and the window (`size`), when known.
    pub(crate) context: Option<(u64, u64)>,
}

impl Memory {
    #[cfg(test)]
    fn with_history(history: Vec<Record>) -> Self {
        Self {
            history: Mutex::new(history),
            ..Self::default()
        }
    }

    /// A memory whose additions (and settings) are also saved to the session's `file`; it
    /// starts with `history` and `settings` (a loaded session's).
    #[must_use]
    pub(crate) fn persistent(file: SessionFile, history: Vec<Record>, settings: Settings) -> Self {
        let (children, history): (Vec<Record>, Vec<Record>) = history
            .into_iter()
            .partition(|record| matches!(record, Record::Child(_)));
        let children = children.into_iter().filter_map(|record| match record {
            Record::Child(child) => Some(child),
            _ => None,
        });
        Self {
            history: Mutex::new(history),
            standing: Mutex::default(),
            tool_call_ids: Mutex::default(),
            settings: Mutex::new(settings),
            captured: Mutex::default(),
            saved_to: Some(file),
            tasks: Arc::new(Tasks::restored(children)),
            usage: Mutex::default(),
        }
    }

    /// Marks the end of a prompt turn for a persistent session: what came before is completed
    /// turns, what a fork copies. A failed save is logged.
    pub(crate) fn end_turn(&self) {
        if let Some(file) = &self.saved_to
            && let Err(error) = file.end_turn()
        {
            tracing::warn!(session = %file.id(), error = %protocol::report::describe(&error), "cannot save the end of a turn");
        }
    }

    /// Where a persistent session is saved: the state directory holding its file (what a
    /// forked child must read); `None` for a session that is not saved.
    pub(crate) fn saved_in(&self) -> Option<&std::path::Path> {
        self.saved_to.as_ref().and_then(SessionFile::dir)
    }

    /// What the session spent so far, and the context of its last model request.
    pub(crate) fn usage(&self) -> SessionUsage {
        lock(&self.usage).clone()
    }

    /// Adds to what the session spent (and, for a model request, the context it carried);
    /// returns the session's usage so far.
    pub(crate) fn spend(
        &self,
        spent: &protocol::usage::Usage,
        context: Option<(u64, u64)>,
    ) -> SessionUsage {
        let mut usage = lock(&self.usage);
        usage.total.add(spent);
        if context.is_some() {
            usage.context = context;
        }
        usage.clone()
    }

    /// What the session spent so far, tree-wide (its own requests and its children's).
    pub(crate) fn spent(&self) -> protocol::usage::Usage {
        lock(&self.usage).total.clone()
    }

    /// The session's children and background tasks.
    pub(crate) fn tasks(&self) -> &Arc<Tasks> {
        &self.tasks
    }

    /// Saves a child's record for a persistent session (not part of the conversation). A failed
    /// save is logged: the child's answer is not lost for it.
    pub(crate) fn record_child(&self, child: ChildRecord) {
        if let Some(file) = &self.saved_to
            && let Err(error) = file.append(&[Record::Child(child)])
        {
            tracing::warn!(session = %file.id(), error = %protocol::report::describe(&error), "cannot save a child");
        }
    }

    #[must_use]
    pub(crate) fn history(&self) -> Vec<Record> {
        lock(&self.history).clone()
    }

    /// Adds to the conversation, and saves it for a persistent session. A failed save is logged
    /// and the turn goes on: losing the file must not lose the answer being given.
    pub(crate) fn extend(&self, records: impl IntoIterator<Item = Record>) {
        let records: Vec<Record> = records.into_iter().collect();
        if let Some(file) = &self.saved_to
            && let Err(error) = file.append(&records)
        {
            tracing::warn!(session = %file.id(), error = %protocol::report::describe(&error), "cannot save the session");
        }
        lock(&self.history).extend(records);
    }

    /// The standing answer for a tool kind: `Some(true)` after allow-always, `Some(false)` after
    /// reject-always, `None` when the user must be asked.
    #[must_use]
    pub(crate) fn standing(&self, kind: &str) -> Option<bool> {
        lock(&self.standing).get(kind).copied()
    }

    /// Remembers an allow-always (`true`) or reject-always (`false`) for a tool kind.
    pub(crate) fn set_standing(&self, kind: &str, allow: bool) {
        lock(&self.standing).insert(kind.to_owned(), allow);
    }

    #[must_use]
    pub(crate) fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    /// Changes the session's settings; a persistent session saves them when they changed (a
    /// failed save is logged: the session goes on with them).
    pub(crate) fn configure(&self, change: impl FnOnce(&mut Settings)) {
        let mut settings = lock(&self.settings);
        let before = settings.saved();
        change(&mut settings);
        let after = settings.saved();
        if let Some(file) = &self.saved_to
            && after != before
            && let Err(error) = file.save_settings(&after)
        {
            tracing::warn!(session = %file.id(), error = %protocol::report::describe(&error), "cannot save the session's settings");
        }
    }

    /// Keeps a checked structured answer: the first of a turn wins (a capture ends the turn).
    pub(crate) fn capture(&self, value: serde_json::Value) {
        lock(&self.captured).get_or_insert(value);
    }

    /// Whether a structured answer was captured since the last take.
    #[must_use]
    pub(crate) fn has_captured(&self) -> bool {
        lock(&self.captured).is_some()
    }

    /// The structured answer captured since the last take.
    pub(crate) fn take_captured(&self) -> Option<serde_json::Value> {
        lock(&self.captured).take()
    }

    /// The id to announce a tool call under: `proposed` when it is non-empty and not yet
    /// announced in this session, else a fresh `call-<n>`. Either way it is now taken.
    pub(crate) fn claim_tool_call_id(&self, proposed: &str) -> String {
        lock(&self.tool_call_ids).claim(proposed)
    }
}

/// The tool call ids a session has announced.
#[derive(Debug, Default)]
struct ToolCallIds {
    taken: HashSet<String>,
    minted: u64,
}

impl ToolCallIds {
    fn claim(&mut self, proposed: &str) -> String {
        if !proposed.is_empty() && self.taken.insert(proposed.to_owned()) {
            return proposed.to_owned();
        }
        loop {
            self.minted += 1;
            let id = format!("call-{}", self.minted);
            if self.taken.insert(id.clone()) {
                return id;
            }
        }
    }
}

/// Every critical section leaves its data consistent, so a panic elsewhere that poisoned a lock
/// left nothing half-done: keep serving.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    minted: u64,
    turns_started: u64,
    sessions: HashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    workspace: Arc<Workspace>,
    memory: Arc<Memory>,
    turn: Option<InFlight>,
}

#[derive(Debug)]
struct InFlight {
    number: u64,
    cancel: CancellationToken,
}

/// A prompt turn in flight: holds its session's slot until dropped.
#[derive(Debug)]
pub(crate) struct ActiveTurn {
    sessions: Arc<Sessions>,
    session_id: String,
    number: u64,
    cancel: CancellationToken,
    workspace: Arc<Workspace>,
    memory: Arc<Memory>,
}

impl Sessions {
    /// A fresh session id: `sess-<n>` (counting on this connection), or `sess-<uuid>` for a
    /// session that is saved and so must not collide with one saved by another connection.
    pub(crate) fn mint_id(&self, saved: bool) -> String {
        if saved {
            return format!("sess-{}", uuid::Uuid::new_v4().simple());
        }
        let mut inner = self.lock();
        inner.minted += 1;
        format!("sess-{}", inner.minted)
    }

    /// Registers a session (new with a minted id, or loaded) with what it remembers. Refuses an
    /// id already open on this connection.
    pub(crate) fn open(
        &self,
        id: &str,
        workspace: Workspace,
        memory: Memory,
    ) -> Result<(), SessionError> {
        let mut inner = self.lock();
        if inner.sessions.contains_key(id) {
            return Err(SessionError::AlreadyOpen { id: id.to_owned() });
        }
        inner.sessions.insert(
            id.to_owned(),
            Entry {
                workspace: Arc::new(workspace),
                memory: Arc::new(memory),
                turn: None,
            },
        );
        Ok(())
    }

    /// Starts a prompt turn, or says why it cannot start.
    pub(crate) fn begin_turn(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<ActiveTurn, SessionError> {
        let mut inner = self.lock();
        inner.turns_started += 1;
        let number = inner.turns_started;
        let entry = inner
            .sessions
            .get_mut(session_id)
            .ok_or_else(|| SessionError::Unknown {
                id: session_id.to_owned(),
            })?;
        if entry.turn.is_some() {
            return Err(SessionError::Busy {
                id: session_id.to_owned(),
            });
        }
        let cancel = CancellationToken::new();
        entry.turn = Some(InFlight {
            number,
            cancel: cancel.clone(),
        });
        Ok(ActiveTurn {
            sessions: Arc::clone(self),
            session_id: session_id.to_owned(),
            number,
            cancel,
            workspace: Arc::clone(&entry.workspace),
            memory: Arc::clone(&entry.memory),
        })
    }

    /// What session `id` remembers, if it is open.
    pub(crate) fn memory(&self, id: &str) -> Option<Arc<Memory>> {
        self.lock()
            .sessions
            .get(id)
            .map(|entry| Arc::clone(&entry.memory))
    }

    /// Cancels the session's in-flight turn; returns whether there was one.
    pub(crate) fn cancel(&self, session_id: &str) -> bool {
        let inner = self.lock();
        match inner
            .sessions
            .get(session_id)
            .and_then(|entry| entry.turn.as_ref())
        {
            Some(turn) => {
                turn.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Removes session `id` (cancelling its turn); returns what it remembered, its tasks with it.
    pub(crate) fn close(&self, id: &str) -> Option<Arc<Memory>> {
        let entry = self.lock().sessions.remove(id)?;
        if let Some(turn) = &entry.turn {
            turn.cancel.cancel();
        }
        Some(entry.memory)
    }

    /// Every open session's memory (the connection is closing: their tasks end with it).
    pub(crate) fn memories(&self) -> Vec<Arc<Memory>> {
        self.lock()
            .sessions
            .values()
            .map(|entry| Arc::clone(&entry.memory))
            .collect()
    }

    /// Cancels every in-flight turn (the connection is closing).
    pub(crate) fn cancel_all(&self) {
        let inner = self.lock();
        for turn in inner
            .sessions
            .values()
            .filter_map(|entry| entry.turn.as_ref())
        {
            turn.cancel.cancel();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }
}

impl ActiveTurn {
    #[must_use]
    pub(crate) fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Cancelled when the client sends `session/cancel` for this session.
    #[must_use]
    pub(crate) fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    #[must_use]
    pub(crate) fn workspace(&self) -> &Arc<Workspace> {
        &self.workspace
    }

    #[must_use]
    pub(crate) fn memory(&self) -> &Arc<Memory> {
        &self.memory
    }
}

impl Drop for ActiveTurn {
    fn drop(&mut self) {
        let mut inner = self.sessions.lock();
        if let Some(entry) = inner.sessions.get_mut(&self.session_id)
            && entry
                .turn
                .as_ref()
                .is_some_and(|turn| turn.number == self.number)
        {
            entry.turn = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions_with_two() -> (Arc<Sessions>, String, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Arc::new(Sessions::default());
        let open = || {
            let id = sessions.mint_id(false);
            let workspace = Workspace::open(dir.path()).unwrap();
            sessions.open(&id, workspace, Memory::default()).unwrap();
            id
        };
        let (first, second) = (open(), open());
        (sessions, first, second, dir)
    }

    #[test]
    fn ids_are_sequential_and_unique() {
        let (_, first, second, _dir) = sessions_with_two();
        assert_eq!((first.as_str(), second.as_str()), ("sess-1", "sess-2"));
    }

    #[test]
    fn saved_session_ids_are_random() {
        let sessions = Sessions::default();
        let (a, b) = (sessions.mint_id(true), sessions.mint_id(true));
        assert!(a.starts_with("sess-") && a.len() == 37, "{a}");
        assert_ne!(a, b);
        assert_eq!(sessions.mint_id(false), "sess-1");
    }

    #[test]
    fn tool_call_ids_are_unique_within_a_session() {
        let memory = Memory::default();
        let claimed: Vec<String> = ["call_1", "", "call_1", "call-2", "", "call-1", "call_2"]
            .into_iter()
            .map(|proposed| memory.claim_tool_call_id(proposed))
            .collect();
        assert_eq!(
            claimed,
            [
                "call_1", "call-1", "call-2", "call-3", "call-4", "call-5", "call_2"
            ]
        );
    }

    #[test]
    fn one_turn_per_session_and_the_slot_frees_on_drop() {
        let (sessions, first, second, _dir) = sessions_with_two();
        let turn = sessions.begin_turn(&first).unwrap();
        assert_eq!(
            sessions.begin_turn(&first).unwrap_err(),
            SessionError::Busy { id: first.clone() }
        );
        // Another session is independent.
        let other = sessions.begin_turn(&second).unwrap();
        drop(turn);
        let again = sessions.begin_turn(&first).unwrap();
        assert_eq!(again.session_id(), first);
        drop((other, again));
    }

    #[test]
    fn unknown_sessions_are_reported() {
        let sessions = Arc::new(Sessions::default());
        assert_eq!(
            sessions.begin_turn("sess-9").unwrap_err().to_string(),
            "unknown session sess-9; create a session with session/new first"
        );
        assert!(!sessions.cancel("sess-9"));
    }

    #[test]
    fn opened_sessions_keep_their_id_and_memory() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Arc::new(Sessions::default());
        let history = vec![Record::User { text: "hi".into() }];
        sessions
            .open(
                "sess-x",
                Workspace::open(dir.path()).unwrap(),
                Memory::with_history(history.clone()),
            )
            .unwrap();
        assert_eq!(
            sessions
                .open(
                    "sess-x",
                    Workspace::open(dir.path()).unwrap(),
                    Memory::default()
                )
                .unwrap_err(),
            SessionError::AlreadyOpen {
                id: "sess-x".into()
            }
        );
        let turn = sessions.begin_turn("sess-x").unwrap();
        assert_eq!(turn.memory().history(), history);
        assert_eq!(turn.memory().standing("edit"), None);
        turn.memory().set_standing("edit", true);
        drop(turn);
        let again = sessions.begin_turn("sess-x").unwrap();
        assert_eq!(again.memory().standing("edit"), Some(true));
        assert_eq!(again.memory().standing("execute"), None);
    }

    #[test]
    fn cancel_reaches_only_the_sessions_current_turn() {
        let (sessions, first, second, _dir) = sessions_with_two();
        assert!(!sessions.cancel(&first), "nothing in flight yet");
        let turn = sessions.begin_turn(&first).unwrap();
        let other = sessions.begin_turn(&second).unwrap();
        assert!(sessions.cancel(&first));
        assert!(turn.cancellation().is_cancelled());
        assert!(!other.cancellation().is_cancelled());
        drop(turn);
        // A new turn starts uncancelled.
        let next = sessions.begin_turn(&first).unwrap();
        assert!(!next.cancellation().is_cancelled());
        sessions.cancel_all();
        assert!(next.cancellation().is_cancelled() && other.cancellation().is_cancelled());
    }
}
