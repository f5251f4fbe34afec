//! Prompt-turn backends: what answers a `session/prompt`.
//!
//! A [`Backend`] receives a [`Turn`] and returns the turn's stop reason. The [`Turn`] is the only
//! way a backend talks to the client (message chunks, tool calls, permission requests) and learns
//! about `session/cancel`, so a backend never touches the SDK connection or the session table
//! directly. Today there is one backend, [`offline::Offline`]; a model backend (an OpenAI-compatible
//! API) is planned and will implement the same trait.
//!
//! Invariant: a backend returns [`StopReason::Cancelled`] once it has observed the turn's
//! cancellation, and only then; everything it sent before returning reaches the client before the
//! `session/prompt` response (both go through the same ordered outgoing queue).

pub mod offline;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, PermissionOption, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionNotification, SessionUpdate, StopReason,
    TextContent, ToolCall, ToolCallId, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{Client, Error as AcpError};
use futures::future::BoxFuture;
use thiserror::Error;

use crate::session::ActiveTurn;
use crate::tools::Workspace;

/// Answers prompt turns.
pub trait Backend: Send + Sync + 'static {
    /// Runs one prompt turn to its end.
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>>;
}

/// A turn failed for a reason the backend cannot report as a reply: the client went away.
#[derive(Debug, Error)]
pub enum TurnError {
    #[error("cannot {action} for session {session_id}: the client connection failed")]
    Client {
        action: &'static str,
        session_id: String,
        // Boxed: the SDK error is large and this is the cold path of every hot `Result`.
        #[source]
        source: Box<AcpError>,
    },
}

/// How the client answered a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    /// The user picked this option.
    Selected(String),
    /// The client answered with the `cancelled` outcome.
    Dismissed,
    /// The turn was cancelled (`session/cancel`) before the client answered; the pending request
    /// was withdrawn with `$/cancel_request`.
    TurnCancelled,
}

/// One prompt turn: the prompt, the session's directory, the client, and the cancellation signal.
pub struct Turn {
    active: ActiveTurn,
    client: ConnectionTo<Client>,
    prompt: Vec<ContentBlock>,
    tool_calls: u64,
}

impl Turn {
    /// Binds a started turn to the client connection it reports to.
    #[must_use]
    pub fn new(
        active: ActiveTurn,
        client: ConnectionTo<Client>,
        prompt: Vec<ContentBlock>,
    ) -> Self {
        Self {
            active,
            client,
            prompt,
            tool_calls: 0,
        }
    }

    /// The prompt's text: its text blocks joined by newlines (other blocks are ignored for now).
    #[must_use]
    pub fn prompt_text(&self) -> String {
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

    /// The session's directory.
    #[must_use]
    pub fn workspace(&self) -> &Workspace {
        self.active.workspace()
    }

    /// Whether `session/cancel` arrived for this turn.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.active.cancellation().is_cancelled()
    }

    /// Completes when `session/cancel` arrives for this turn.
    pub async fn cancelled(&self) {
        self.active.cancellation().cancelled().await;
    }

    /// Streams a piece of the agent's reply.
    pub fn say(&self, text: impl Into<String>) -> Result<(), TurnError> {
        self.notify(
            "send a message chunk",
            SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
                TextContent::new(text),
            ))),
        )
    }

    /// Announces a new tool call; its id is set here (`call-<n>`, unique within the turn) and
    /// returned for later updates. Any id already on `call` is replaced.
    pub fn start_tool_call(&mut self, call: ToolCall) -> Result<ToolCallId, TurnError> {
        self.tool_calls += 1;
        let id = ToolCallId::new(format!("call-{}", self.tool_calls));
        let mut call = call;
        call.tool_call_id = id.clone();
        self.notify("announce a tool call", SessionUpdate::ToolCall(call))?;
        Ok(id)
    }

    /// Updates a tool call's status, content or other fields.
    pub fn update_tool_call(
        &self,
        id: &ToolCallId,
        fields: ToolCallUpdateFields,
    ) -> Result<(), TurnError> {
        self.notify(
            "update a tool call",
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.clone(), fields)),
        )
    }

    /// Asks the user to approve a tool call; `fields` (such as a diff preview) travel with the
    /// request so the client can show what it approves. Cancellation of the turn wins over a pending answer:
    /// the request is then withdrawn (dropping it sends `$/cancel_request`) and the answer is
    /// [`PermissionAnswer::TurnCancelled`].
    pub async fn request_permission(
        &self,
        id: &ToolCallId,
        fields: ToolCallUpdateFields,
        options: Vec<PermissionOption>,
    ) -> Result<PermissionAnswer, TurnError> {
        if self.is_cancelled() {
            return Ok(PermissionAnswer::TurnCancelled);
        }
        let request = RequestPermissionRequest::new(
            self.session_id(),
            ToolCallUpdate::new(id.clone(), fields),
            options,
        );
        let response = self.client.send_request(request).block_task();
        tokio::select! {
            biased;
            () = self.cancelled() => Ok(PermissionAnswer::TurnCancelled),
            response = response => match response {
                Ok(response) => Ok(match response.outcome {
                    RequestPermissionOutcome::Selected(selected) => {
                        PermissionAnswer::Selected(selected.option_id.0.to_string())
                    }
                    // `Cancelled` and any outcome added by a later protocol revision: not an approval.
                    _ => PermissionAnswer::Dismissed,
                }),
                Err(source) => Err(self.client_error("request permission", source)),
            },
        }
    }

    fn session_id(&self) -> SessionId {
        SessionId::new(self.active.session_id())
    }

    fn notify(&self, action: &'static str, update: SessionUpdate) -> Result<(), TurnError> {
        self.client
            .send_notification(SessionNotification::new(self.session_id(), update))
            .map_err(|source| self.client_error(action, source))
    }

    fn client_error(&self, action: &'static str, source: AcpError) -> TurnError {
        TurnError::Client {
            action,
            session_id: self.active.session_id().to_owned(),
            source: Box::new(source),
        }
    }
}
