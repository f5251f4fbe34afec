//! Prompt-turn backends: what answers a `session/prompt`.
//!
//! A [`Backend`] receives a [`Turn`] and returns the turn's stop reason. The [`Turn`] is the only
//! way a backend talks to the client (message chunks, tool calls, permission requests) and learns
//! about `session/cancel`, so a backend never touches the SDK connection or the session table
//! directly. Two backends: [`offline::Offline`] (no model, the default) and [`model::Model`] (an
//! OpenAI-compatible Chat Completions API). What differs between them for the server (slash
//! commands to advertise, whether sessions are saved) is asked of the backend, never inferred.
//! Asking the user before a change is one flow for both: [`permission`].
//!
//! Invariant: a backend returns [`StopReason::Cancelled`] once it has observed the turn's
//! cancellation, and only then; everything it sent before returning reaches the client before the
//! `session/prompt` response (both go through the same ordered outgoing queue).

pub(crate) mod children;
pub(crate) mod model;
pub(crate) mod offline;
pub(crate) mod permission;
mod turn;

use std::sync::Arc;

use agent_client_protocol::v1::schema::{SessionUpdate, StopReason, ToolCallLocation};
use agent_client_protocol::{Error as AcpError, ErrorCode};
use futures::future::BoxFuture;
use thiserror::Error;

pub(crate) use self::turn::{ClientFs, ClientLink, TextFlow, Turn};
use crate::session::Memory;
use crate::store::Store;
use crate::workspace::Workspace;

/// The tool result (and offline reply) when the user refuses a call.
pub(crate) const PERMISSION_DENIED: &str = "permission denied by the user";
/// The result when the turn is cancelled before or while a call (or a child) runs.
pub(crate) const CANCELLED: &str = "cancelled by the user";

/// Answers prompt turns.
pub(crate) trait Backend: Send + Sync + 'static {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>>;

    /// The agent's title in `initialize`, e.g. `acp-child (offline)`.
    fn title(&self) -> String;

    /// The slash commands this backend answers, advertised to the client after `session/new`.
    fn available_commands(&self) -> &'static [CommandHelp] {
        &[]
    }

    /// Where sessions are saved; `None`: they live as long as the connection and cannot be
    /// loaded (`loadSession` is not advertised).
    fn store(&self) -> Option<&Arc<Store>> {
        None
    }

    /// The updates showing a saved conversation again (`session/load`); its tool call ids are
    /// claimed in `memory`, which holds that conversation.
    fn replay(&self, _workspace: &Workspace, _memory: &Memory) -> Vec<SessionUpdate> {
        Vec::new()
    }

    /// What the backend learns once per process when serving starts (the model server's list of
    /// models); the server runs it at start, and `initialize` waits for it a short while at
    /// most. Awaiting it again is cheap. Nothing by default.
    fn warm_up(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    /// Whether the backend can answer, once [`Backend::warm_up`] was awaited: `Err` says why
    /// not (the model backend given `--base-url` alone, whose server listed no model). Ready by
    /// default.
    fn ready(&self) -> Result<(), model::DiscoveryError> {
        Ok(())
    }

    /// What a session of this backend can be given at start (advertised at `initialize` and in
    /// `session/new`'s answer); nothing by default.
    fn offers(&self) -> Offers {
        Offers::default()
    }
}

/// What a backend honours per session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Offers {
    /// A system prompt (`append` and `override`).
    pub(crate) system_prompt: bool,
    /// The tools a tool filter may name; empty: no tool filter is honoured.
    pub(crate) tools: Vec<&'static str>,
    /// The models a session may select, the default first; empty: no model option.
    pub(crate) models: Vec<String>,
}

/// How to use one slash command, for `--help` and the session's available-commands list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandHelp {
    /// Without the slash.
    pub name: &'static str,
    /// The arguments, as in `PATH TEXT`.
    pub input: &'static str,
    pub description: &'static str,
}

/// A turn failed for a reason the backend cannot report as a reply.
#[derive(Debug, Error)]
pub(crate) enum TurnError {
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

impl TurnError {
    /// The JSON-RPC error code answering the prompt: a rejected API key is ACP's
    /// auth-required, so clients can tell the user to fix their credentials.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            Self::Model(model::client::ModelError::BadKey { .. }) => ErrorCode::AUTH_REQUIRED,
            Self::Model(_) | Self::Client { .. } => ErrorCode::INTERNAL_ERROR,
        }
    }
}

/// A tool call's location: the lexically resolved path, or none when the path is refused.
pub(crate) fn locations(workspace: &Workspace, path: &str) -> Vec<ToolCallLocation> {
    workspace
        .locate(path)
        .map(ToolCallLocation::new)
        .into_iter()
        .collect()
}
