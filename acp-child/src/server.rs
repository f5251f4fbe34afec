//! The ACP agent server: SDK handlers for `initialize`, `session/new`, `session/prompt` and
//! `session/cancel`.
//!
//! Invariants:
//! - handlers run inside the SDK's dispatch loop, which processes one message at a time; they
//!   only do short synchronous work. A prompt turn (which waits for `session/request_permission`
//!   answers and must observe a later `session/cancel`) runs in a task spawned with
//!   `ConnectionTo::spawn` and answers through its responder when done;
//! - the turn's slot in the session table is claimed inside the dispatch loop, so a second
//!   concurrent prompt on the same session is rejected deterministically, and freed before the
//!   `session/prompt` response is sent;
//! - a spawned turn task never returns an error (the SDK would shut the connection down): a
//!   failed turn is answered with a JSON-RPC error and logged.

use std::sync::Arc;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate,
    CancelNotification, Implementation, InitializeRequest, InitializeResponse, NewSessionRequest,
    NewSessionResponse, PromptRequest, PromptResponse, SessionId, SessionNotification,
    SessionUpdate, UnstructuredCommandInput,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, ByteStreams, Client, ConnectTo, Error as AcpError, ErrorCode, on_receive_notification,
    on_receive_request,
};
use thiserror::Error;
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

use crate::backend::offline::Offline;
use crate::backend::{Backend, Turn};
use crate::command::COMMANDS_HELP;
use crate::session::{SessionError, Sessions};
use crate::tools::Workspace;
use crate::{AGENT_NAME, AGENT_VERSION, describe};

/// What the server runs with.
#[derive(Clone)]
pub struct AgentConfig {
    /// Answers prompt turns.
    pub backend: Arc<dyn Backend>,
}

impl AgentConfig {
    /// The configuration without a model: the [`Offline`] backend.
    #[must_use]
    pub fn offline() -> Self {
        Self {
            backend: Arc::new(Offline),
        }
    }
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig").finish_non_exhaustive()
    }
}

/// The connection ended abnormally.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error(
        "the ACP connection failed; check that the client speaks ACP v1 JSON-RPC, one message per line"
    )]
    Connection {
        #[source]
        source: AcpError,
    },
}

/// Serves ACP on the process's stdin/stdout until stdin reaches EOF.
///
/// Transport choice: tokio's stdin/stdout adapted with `tokio_util::compat` into the SDK's
/// `ByteStreams`, rather than the SDK's `stdio` feature. That feature wraps std's blocking handles
/// with the `blocking` crate, a second thread pool beside tokio's; going through tokio keeps all
/// I/O on the one runtime the turns (timers, cancellation) already need.
pub async fn serve_stdio(config: AgentConfig) -> Result<(), ServeError> {
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    serve(config, transport).await
}

/// Serves ACP over any transport until the client closes it.
pub async fn serve(
    config: AgentConfig,
    transport: impl ConnectTo<Agent> + 'static,
) -> Result<(), ServeError> {
    let sessions = Arc::new(Sessions::default());
    let backend = config.backend;
    let result = Agent
        .v1()
        .name(AGENT_NAME)
        .on_receive_request(
            async |request: InitializeRequest,
                   responder: Responder<InitializeResponse>,
                   _cx: ConnectionTo<Client>| {
                responder.respond(initialize(&request))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                async move |request: NewSessionRequest,
                            responder: Responder<NewSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    new_session(&sessions, &request, responder, &cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                async move |request: PromptRequest,
                            responder: Responder<PromptResponse>,
                            cx: ConnectionTo<Client>| {
                    prompt(&sessions, &backend, request, responder, &cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            {
                let sessions = Arc::clone(&sessions);
                async move |notification: CancelNotification, _cx: ConnectionTo<Client>| {
                    let id = notification.session_id.0.as_ref();
                    if sessions.cancel(id) {
                        tracing::debug!(session = id, "cancelling the prompt turn");
                    } else {
                        tracing::debug!(session = id, "session/cancel with no prompt in flight");
                    }
                    Ok(())
                }
            },
            on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    // Turns still running are abandoned with the connection; tell them, so none keeps waiting.
    sessions.cancel_all();
    result.map_err(|source| ServeError::Connection { source })
}

fn initialize(request: &InitializeRequest) -> InitializeResponse {
    tracing::debug!(client_version = ?request.protocol_version, "initialize");
    // Only v1 is spoken; answering with it lets a newer client downgrade or disconnect.
    InitializeResponse::new(ProtocolVersion::V1)
        .agent_capabilities(AgentCapabilities::new())
        .agent_info(Implementation::new(AGENT_NAME, AGENT_VERSION).title("acp-child (offline)"))
}

fn new_session(
    sessions: &Sessions,
    request: &NewSessionRequest,
    responder: Responder<NewSessionResponse>,
    cx: &ConnectionTo<Client>,
) -> Result<(), AcpError> {
    let workspace = match Workspace::open(&request.cwd) {
        Ok(workspace) => workspace,
        Err(error) => {
            return responder.respond_with_error(AcpError::new(
                ErrorCode::INVALID_PARAMS,
                format!("session/new: {}", describe(&error)),
            ));
        }
    };
    let id = sessions.create(workspace);
    tracing::debug!(session = id, cwd = %request.cwd.display(), "session created");
    responder.respond(NewSessionResponse::new(id.clone()))?;
    // Advertise the offline commands so editors can offer them (e.g. Zed's `/` menu).
    let commands = COMMANDS_HELP
        .iter()
        .map(|help| {
            AvailableCommand::new(help.name, help.description).input(
                AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(help.input)),
            )
        })
        .collect();
    cx.send_notification(SessionNotification::new(
        SessionId::new(id),
        SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)),
    ))
}

fn prompt(
    sessions: &Arc<Sessions>,
    backend: &Arc<dyn Backend>,
    request: PromptRequest,
    responder: Responder<PromptResponse>,
    cx: &ConnectionTo<Client>,
) -> Result<(), AcpError> {
    let active = match sessions.begin_turn(request.session_id.0.as_ref()) {
        Ok(active) => active,
        Err(error) => {
            let code = match error {
                SessionError::Unknown { .. } => ErrorCode::RESOURCE_NOT_FOUND,
                SessionError::Busy { .. } => ErrorCode::INVALID_REQUEST,
            };
            return responder
                .respond_with_error(AcpError::new(code, format!("session/prompt: {error}")));
        }
    };
    let backend = Arc::clone(backend);
    let mut turn = Turn::new(active, cx.clone(), request.prompt);
    cx.spawn(async move {
        let result = backend.run_turn(&mut turn).await;
        // Free the session's slot before answering, so the next prompt is never refused as busy.
        drop(turn);
        let sent = match result {
            Ok(stop_reason) => responder.respond(PromptResponse::new(stop_reason)),
            Err(error) => {
                let message = describe(&error);
                tracing::warn!(%message, "prompt turn failed");
                responder.respond_with_error(AcpError::new(ErrorCode::INTERNAL_ERROR, message))
            }
        };
        if let Err(error) = sent {
            // The client is gone; the connection is shutting down on its own.
            tracing::debug!(error = %describe(&error), "could not answer session/prompt");
        }
        Ok(())
    })
}
