//! Prompt-turn backends: what answers a `session/prompt`.
//!
//! A [`Backend`] receives a [`Turn`] and returns the turn's stop reason. The [`Turn`] is the only
//! way a backend talks to the client (message chunks, tool calls, permission requests) and learns
//! about `session/cancel`, so a backend never touches the SDK connection or the session table
//! directly. Two backends: [`offline::Offline`] (no model, the default) and [`model::Model`] (an
//! OpenAI-compatible Chat Completions API).
//!
//! Invariant: a backend returns [`StopReason::Cancelled`] once it has observed the turn's
//! cancellation, and only then; everything it sent before returning reaches the client before the
//! `session/prompt` response (both go through the same ordered outgoing queue).

pub mod model;
pub mod offline;

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, PermissionOption, ReadTextFileRequest, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionNotification, SessionUpdate, StopReason,
    TextContent, ToolCall, ToolCallId, ToolCallLocation, ToolCallUpdate, ToolCallUpdateFields,
    WriteTextFileRequest,
};
use agent_client_protocol::{Client, Error as AcpError, JsonRpcRequest};
use futures::future::BoxFuture;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::session::{ActiveTurn, Memory};
use crate::tools::Workspace;

/// Answers prompt turns.
pub trait Backend: Send + Sync + 'static {
    /// Runs one prompt turn to its end.
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>>;

    /// The agent's title in `initialize`, e.g. `acp-child (offline)`.
    fn title(&self) -> String;
}

/// The client's file system capabilities, from `initialize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientFs {
    /// The client answers `fs/read_text_file`.
    pub read: bool,
    /// The client answers `fs/write_text_file`.
    pub write: bool,
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
    #[error(transparent)]
    Model(#[from] model::client::ModelError),
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
    client_fs: ClientFs,
}

impl Turn {
    /// Binds a started turn to the client connection it reports to.
    #[must_use]
    pub fn new(
        active: ActiveTurn,
        client: ConnectionTo<Client>,
        prompt: Vec<ContentBlock>,
        client_fs: ClientFs,
    ) -> Self {
        Self {
            active,
            client,
            prompt,
            tool_calls: 0,
            client_fs,
        }
    }

    /// What the client offers for files.
    #[must_use]
    pub fn client_fs(&self) -> ClientFs {
        self.client_fs
    }

    /// What the session remembers (conversation, standing permission answers).
    #[must_use]
    pub fn memory(&self) -> &Arc<Memory> {
        self.active.memory()
    }

    /// The turn's cancellation signal, for work that must stop with it (a running command).
    #[must_use]
    pub fn cancellation(&self) -> &CancellationToken {
        self.active.cancellation()
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

    /// Streams a piece of the agent's reasoning.
    pub fn think(&self, text: impl Into<String>) -> Result<(), TurnError> {
        self.notify(
            "send a thought chunk",
            SessionUpdate::AgentThoughtChunk(ContentChunk::new(ContentBlock::Text(
                TextContent::new(text),
            ))),
        )
    }

    /// Announces a new tool call under the id it carries (the model backend uses the model's
    /// call ids, unique across the session, so replayed history never repeats an id).
    pub fn announce_tool_call(&self, call: ToolCall) -> Result<(), TurnError> {
        self.notify("announce a tool call", SessionUpdate::ToolCall(call))
    }

    /// Reads a file through the client (`fs/read_text_file`); `None` when the turn was cancelled
    /// first. A JSON-RPC error from the client is returned as the inner error.
    pub async fn client_read(&self, path: &Path) -> Option<Result<String, AcpError>> {
        let request = ReadTextFileRequest::new(self.session_id(), path);
        self.client_request(request)
            .await
            .map(|response| response.map(|response| response.content))
    }

    /// Writes a file through the client (`fs/write_text_file`); `None` when the turn was
    /// cancelled first.
    pub async fn client_write(&self, path: &Path, content: &str) -> Option<Result<(), AcpError>> {
        let request = WriteTextFileRequest::new(self.session_id(), path, content);
        self.client_request(request)
            .await
            .map(|response| response.map(|_| ()))
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

    pub(crate) fn client_error(&self, action: &'static str, source: AcpError) -> TurnError {
        TurnError::Client {
            action,
            session_id: self.active.session_id().to_owned(),
            source: Box::new(source),
        }
    }
}

/// A tool call's location: the lexically resolved path, or none when the path is refused.
#[must_use]
pub fn locations(workspace: &Workspace, path: &str) -> Vec<ToolCallLocation> {
    workspace
        .locate(path)
        .map(ToolCallLocation::new)
        .into_iter()
        .collect()
}
