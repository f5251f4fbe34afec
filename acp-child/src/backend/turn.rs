//! [`Turn`]: one prompt turn as a backend sees it, and its only way to reach the client.
//!
//! Invariants:
//! - every tool call is announced through [`Turn::announce_tool_call`], which gives it an id unique
//!   within the session (the one proposed, a model's call id, when it is non-empty and unused; else
//!   a fresh `call-<n>`) and a non-empty title;
//! - message text that resumes after a tool call is separated from the text before it: when that
//!   text did not end with a newline, a paragraph break is sent first ([`TextFlow`]);
//! - cancellation wins over every pending client request, which is then withdrawn;
//! - children are exposed as sessions of their own only when the client advertised `subagents`
//!   ([`Turn::child_sessions`]); their updates and requests go out under the ids minted for them
//!   ([`Turn::notify_on`], [`Turn::request_permission_on`]).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Cost, PermissionOption, ReadTextFileRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse, SessionId,
    SessionInfoUpdate, SessionNotification, SessionUpdate, TextContent, ToolCall, ToolCallId,
    ToolCallUpdate, ToolCallUpdateFields, UsageUpdate, WriteTextFileRequest,
};
use agent_client_protocol::{Client, Error as AcpError, JsonRpcRequest};
use tokio_util::sync::CancellationToken;

use super::TurnError;
use super::children::ChildSessions;
use super::permission::Answer;
use crate::outbox::{self, Backlog};
use crate::session::{ActiveTurn, Memory};
use crate::workspace::Workspace;
use protocol::report::describe;
use protocol::usage::{Breakdown, Usage};

/// The title of a tool call that would otherwise have none.
const UNTITLED: &str = "Tool call";

/// The client's file system capabilities, from `initialize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientFs {
    /// The client answers `fs/read_text_file`.
    pub(crate) read: bool,
    /// The client answers `fs/write_text_file`.
    pub(crate) write: bool,
}

/// Where the agent's message text stands relative to tool calls, so text on either side of a
/// tool call is never run together (pure; also used when replaying a saved session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TextFlow {
    mid_line: bool,
    after_tool_call: bool,
}

impl TextFlow {
    /// The separator to send before `text`, if any; records `text` as sent.
    pub(crate) fn text(&mut self, text: &str) -> Option<&'static str> {
        if text.is_empty() {
            return None;
        }
        let separator = (self.after_tool_call && self.mid_line).then_some("\n\n");
        self.mid_line = !text.ends_with('\n');
        self.after_tool_call = false;
        separator
    }

    pub(crate) fn tool_call(&mut self) {
        self.after_tool_call = true;
    }
}

/// What a turn knows of its client beyond the connection: its file system capabilities, the
/// child sessions when it follows them, and how far behind it is.
pub(crate) struct ClientLink {
    pub(crate) fs: ClientFs,
    /// `Some` when the client advertised `subagents`.
    pub(crate) children: Option<Arc<ChildSessions>>,
    /// What a child relays waits on it ([`crate::outbox`]).
    pub(crate) backlog: Arc<Backlog>,
}

/// One prompt turn: the prompt, the session's directory, the client, and the cancellation signal.
pub(crate) struct Turn {
    active: ActiveTurn,
    client: ConnectionTo<Client>,
    prompt: Vec<ContentBlock>,
    client_fs: ClientFs,
    /// `Some` when the client advertised `subagents`.
    children: Option<Arc<ChildSessions>>,
    /// How far behind the client is: what a child relays waits on it.
    backlog: Arc<Backlog>,
    flow: Mutex<TextFlow>,
    /// What the turn spent (its own model requests and its children's), once anything reported.
    spent: Mutex<Option<(Usage, Breakdown)>>,
    /// Why the turn ended for the session's budget, when it did.
    budget_stop: Mutex<Option<protocol::usage::Overrun>>,
    /// The turn's own span (W3C trace context): under the one the prompt carried in `_meta`,
    /// else the root of a new trace; every child started in the turn continues it.
    trace: protocol::trace::TraceParent,
    /// The turn's exported spans (off unless export is on): `invoke_agent`, its tool calls and
    /// permission answers.
    spans: acp_host::telemetry::RunTrace,
}

impl Turn {
    pub(crate) fn new(
        active: ActiveTurn,
        client: ConnectionTo<Client>,
        prompt: Vec<ContentBlock>,
        link: ClientLink,
    ) -> Self {
        let ClientLink {
            fs: client_fs,
            children,
            backlog,
        } = link;
        Self {
            active,
            client,
            prompt,
            client_fs,
            children,
            backlog,
            flow: Mutex::default(),
            spent: Mutex::default(),
            budget_stop: Mutex::default(),
            trace: acp_host::run::new_span(None),
            spans: acp_host::telemetry::RunTrace::default(),
        }
    }

    /// The turn ends (`max_tokens`) for the session's budget: `overrun` is what it would pass
    /// (or passed), reported in the prompt response's `_meta`.
    pub(crate) fn stop_for_budget(&self, overrun: protocol::usage::Overrun) {
        tracing::info!(%overrun, "ending the turn for the session's budget");
        *self
            .budget_stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(overrun);
    }

    /// Why the turn ended for the session's budget, if it did.
    pub(crate) fn take_budget_stop(&self) -> Option<protocol::usage::Overrun> {
        self.budget_stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The turn's span is made under `parent` (the trace context the prompt carried), when any.
    pub(crate) fn traced(mut self, parent: Option<&protocol::trace::TraceParent>) -> Self {
        if let Some(parent) = parent {
            self.trace = acp_host::run::new_span(Some(parent));
        }
        self.spans = acp_host::telemetry::RunTrace::serve(
            &self.trace,
            parent,
            crate::AGENT_NAME,
            self.active.session_id(),
        );
        tracing::debug!(
            traceparent = %self.trace.span.traceparent(),
            parent = %parent.map_or_else(String::new, |parent| parent.span.span_id_hex()),
            "turn span"
        );
        self
    }

    /// The turn's exported spans.
    pub(crate) fn spans(&self) -> &acp_host::telemetry::RunTrace {
        &self.spans
    }

    /// The turn's span: what a child started in it continues.
    pub(crate) fn trace(&self) -> &protocol::trace::TraceParent {
        &self.trace
    }

    /// One model request's usage (`context`: the context it carried and the window, when the
    /// window is known): added to the turn and the session, then a `usage_update` when the
    /// window is known (ACP's update requires one), else a `session_info_update`, carrying the
    /// session's cost and its cumulative counts (the `acp-host/usage` extension).
    pub(crate) fn spent_own(
        &self,
        usage: &Usage,
        context: Option<(u64, u64)>,
    ) -> Result<(), TurnError> {
        {
            let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
            let (total, breakdown) = spent.get_or_insert_default();
            total.add(usage);
            breakdown.own.add(usage);
        }
        self.report_usage(usage, context)
    }

    /// A child's usage (`name`: the subagent): added to the turn's total and its breakdown, and
    /// to the session's.
    pub(crate) fn spent_child(&self, name: &str, usage: &Usage) -> Result<(), TurnError> {
        {
            let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
            let (total, breakdown) = spent.get_or_insert_default();
            total.add(usage);
            breakdown.push_child(name, usage.clone());
        }
        self.report_usage(usage, None)
    }

    /// What the turn spent, tree-wide, and its breakdown; `None` when nothing reported usage.
    pub(crate) fn take_spent(&self) -> Option<(Usage, Breakdown)> {
        self.spent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn report_usage(&self, usage: &Usage, context: Option<(u64, u64)>) -> Result<(), TurnError> {
        let session = self.memory().spend(usage, context);
        let Some((used, size)) = session.context else {
            // ACP's `usage_update` needs the window: without one the counts and cost travel on
            // a `session_info_update` that changes nothing else, so a client holds its budget
            // and sees the cost mid-turn all the same (docs/start-extension.md). Nothing spent
            // yet (a server reporting zeros): nothing to tell.
            if session.total.is_empty() {
                return Ok(());
            }
            return self.notify(
                "report usage",
                SessionUpdate::SessionInfoUpdate(
                    SessionInfoUpdate::new().meta(session.total.to_meta()),
                ),
            );
        };
        let cost = session
            .total
            .cost
            .as_ref()
            .map(|cost| Cost::new(cost.amount, cost.currency.clone()));
        self.notify(
            "report usage",
            SessionUpdate::UsageUpdate(
                UsageUpdate::new(used, size)
                    .cost(cost)
                    .meta(session.total.to_meta()),
            ),
        )
    }

    /// The connection's child sessions, when the client understands them (else children are
    /// shown through the parent session only).
    pub(crate) fn child_sessions(&self) -> Option<&Arc<ChildSessions>> {
        self.children.as_ref()
    }

    /// The client's backlog of updates (a child's relay waits while it is full).
    pub(crate) fn backlog(&self) -> &Backlog {
        &self.backlog
    }

    /// This turn's session id.
    pub(crate) fn session(&self) -> SessionId {
        self.session_id()
    }

    pub(crate) fn client_fs(&self) -> ClientFs {
        self.client_fs
    }

    /// What the session remembers (conversation, standing permission answers, tool call ids).
    pub(crate) fn memory(&self) -> &Arc<Memory> {
        self.active.memory()
    }

    /// The turn's cancellation signal, for work that must stop with it (a running command).
    pub(crate) fn cancellation(&self) -> &CancellationToken {
        self.active.cancellation()
    }

    /// The prompt's text: its text blocks joined by newlines (other blocks are ignored for now).
    pub(crate) fn prompt_text(&self) -> String {
        let texts: Vec<&str> = self
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(text) => Some(text.text.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }

    pub(crate) fn workspace(&self) -> &Workspace {
        self.active.workspace()
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.active.cancellation().is_cancelled()
    }

    /// Completes when `session/cancel` arrives for this turn.
    pub(crate) async fn cancelled(&self) {
        self.active.cancellation().cancelled().await;
    }

    /// Streams a piece of the agent's reply (after a paragraph break when it resumes after a
    /// tool call mid-line).
    pub(crate) fn say(&self, text: impl Into<String>) -> Result<(), TurnError> {
        let text = text.into();
        let separator = self
            .flow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .text(&text);
        if let Some(separator) = separator {
            self.send_text(separator.to_owned())?;
        }
        self.send_text(text)
    }

    fn send_text(&self, text: String) -> Result<(), TurnError> {
        self.notify(
            "send a message chunk",
            SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
                TextContent::new(text),
            ))),
        )
    }

    /// Streams a piece of the agent's reasoning.
    pub(crate) fn think(&self, text: impl Into<String>) -> Result<(), TurnError> {
        self.notify(
            "send a thought chunk",
            SessionUpdate::AgentThoughtChunk(ContentChunk::new(ContentBlock::Text(
                TextContent::new(text),
            ))),
        )
    }

    /// Announces a new tool call and returns the id it was announced under, for later updates:
    /// `proposed` when it is non-empty and new to the session, else a fresh one (any id already
    /// on `call` is replaced). An empty title becomes a generic one.
    pub(crate) fn announce_tool_call(
        &self,
        call: ToolCall,
        proposed: &str,
    ) -> Result<ToolCallId, TurnError> {
        let id = ToolCallId::new(self.memory().claim_tool_call_id(proposed));
        let mut call = call;
        call.tool_call_id = id.clone();
        if call.title.trim().is_empty() {
            UNTITLED.clone_into(&mut call.title);
        }
        self.flow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tool_call();
        self.notify("announce a tool call", SessionUpdate::ToolCall(call))?;
        Ok(id)
    }

    /// Updates a tool call's status, content or other fields.
    pub(crate) fn update_tool_call(
        &self,
        id: &ToolCallId,
        fields: ToolCallUpdateFields,
    ) -> Result<(), TurnError> {
        self.notify(
            "update a tool call",
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.clone(), fields)),
        )
    }

    /// Reads a file through the client (`fs/read_text_file`); `None` when the turn was cancelled
    /// first. A JSON-RPC error from the client is returned as the inner error.
    pub(crate) async fn client_read(&self, path: &Path) -> Option<Result<String, AcpError>> {
        let request = ReadTextFileRequest::new(self.session_id(), path);
        self.client_request(request)
            .await
            .map(|response| response.map(|response| response.content))
    }

    /// Writes a file through the client (`fs/write_text_file`); `None` when the turn was
    /// cancelled first.
    pub(crate) async fn client_write(
        &self,
        path: &Path,
        content: &str,
    ) -> Option<Result<(), AcpError>> {
        let request = WriteTextFileRequest::new(self.session_id(), path, content);
        self.client_request(request)
            .await
            .map(|response| response.map(|_| ()))
    }

    /// Asks the user to approve a tool call (see [`super::permission::ask`], the one caller).
    /// Cancellation of the turn wins over a pending answer: the request is then withdrawn
    /// (dropping it sends `$/cancel_request`).
    pub(crate) async fn request_permission(
        &self,
        id: &ToolCallId,
        fields: ToolCallUpdateFields,
        options: Vec<PermissionOption>,
    ) -> Result<Answer, TurnError> {
        let request = RequestPermissionRequest::new(
            self.session_id(),
            ToolCallUpdate::new(id.clone(), fields),
            options,
        );
        let asked = std::time::Instant::now();
        self.spans.asked((None, &id.0));
        let answer = answer_of(self.client_request(request).await);
        self.spans.answered(
            (None, &id.0),
            match &answer {
                Answer::Selected(option) => option,
                Answer::TurnCancelled => "cancelled",
                Answer::Dismissed => "dismissed",
                Answer::ClientError(_) => "client-error",
            },
            None,
            asked.elapsed(),
        );
        Ok(answer)
    }

    /// Asks the client about tool call `id` of another session (a child's, exposed as a session
    /// of its own), offering `options`; withdrawn when the turn or `withdraw` is cancelled first.
    pub(crate) async fn request_permission_on(
        &self,
        session: SessionId,
        id: ToolCallId,
        fields: ToolCallUpdateFields,
        options: Vec<PermissionOption>,
        withdraw: &CancellationToken,
    ) -> Answer {
        let request =
            RequestPermissionRequest::new(session, ToolCallUpdate::new(id, fields), options);
        let response = tokio::select! {
            biased;
            () = withdraw.cancelled() => None,
            response = self.client_request(request) => response,
        };
        answer_of(response)
    }

    /// Sends an update on `session` (this turn's, or a child session exposed by it).
    pub(crate) fn notify_on(
        &self,
        session: SessionId,
        update: SessionUpdate,
    ) -> Result<(), TurnError> {
        outbox::send(
            &self.client,
            &self.backlog,
            SessionNotification::new(session, update),
        )
        .map_err(|source| TurnError::Client {
            action: "relay a child session's update",
            session_id: self.active.session_id().to_owned(),
            source: Box::new(source),
        })
    }

    /// Sends a request to the client, racing the turn's cancellation (which withdraws it).
    async fn client_request<R: JsonRpcRequest>(
        &self,
        request: R,
    ) -> Option<Result<R::Response, AcpError>> {
        if self.is_cancelled() {
            return None;
        }
        let response = self.client.send_request(request).block_task();
        tokio::select! {
            biased;
            () = self.cancelled() => None,
            response = response => Some(response),
        }
    }

    fn session_id(&self) -> SessionId {
        SessionId::new(self.active.session_id())
    }

    fn notify(&self, action: &'static str, update: SessionUpdate) -> Result<(), TurnError> {
        self.spans.update(&update, None);
        outbox::send(
            &self.client,
            &self.backlog,
            SessionNotification::new(self.session_id(), update),
        )
        .map_err(|source| TurnError::Client {
            action,
            session_id: self.active.session_id().to_owned(),
            source: Box::new(source),
        })
    }
}

/// What the client answered a permission request (`None`: the turn was cancelled, or the request
/// withdrawn, first).
fn answer_of(response: Option<Result<RequestPermissionResponse, AcpError>>) -> Answer {
    match response {
        None => Answer::TurnCancelled,
        Some(Ok(response)) => match response.outcome {
            RequestPermissionOutcome::Selected(selected) => {
                Answer::Selected(selected.option_id.0.to_string())
            }
            // `Cancelled` and any outcome added by a later protocol revision: not an approval.
            _ => Answer::Dismissed,
        },
        Some(Err(error)) => Answer::ClientError(describe(&error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_resuming_after_a_tool_call_mid_line_is_separated() {
        let mut flow = TextFlow::default();
        assert_eq!(flow.text("Reading"), None);
        assert_eq!(flow.text(" it."), None);
        flow.tool_call();
        assert_eq!(flow.text(""), None, "empty text changes nothing");
        assert_eq!(flow.text("It says A."), Some("\n\n"));
        assert_eq!(flow.text(" More."), None);
        flow.tool_call();
        flow.tool_call();
        assert_eq!(flow.text("Once."), Some("\n\n"));
        assert_eq!(flow.text("Line.\n"), None);
        flow.tool_call();
        assert_eq!(flow.text("After a newline."), None);
        let mut fresh = TextFlow::default();
        fresh.tool_call();
        assert_eq!(fresh.text("No text before."), None);
    }
}
