//! The ACP agent server: SDK handlers for `initialize`, `session/new`, `session/load`,
//! `session/fork`, `session/prompt`, `session/cancel` and `session/close`.
//!
//! What differs between backends is asked of the [`Backend`]: sessions persist only when it has
//! a session store (the model backend): then `loadSession` is advertised, session ids are random
//! (`sess-<uuid>`, unique across connections), each session gets a JSONL file, and `session/load`
//! replays a saved conversation before answering, the session keeping the settings it was saved
//! with (system prompt, model, tool filter, output schema, depth limit) unless the request
//! replaces them. With a store, `sessionCapabilities.fork` is advertised too: `session/fork`
//! starts a new saved session from the source's completed turns (`store::Saved::completed`, read
//! without opening the source, which may be open mid-turn elsewhere, and never written) and its
//! settings, as `session/load` restores them; an unknown source is refused as `session/load`
//! refuses it. Without a store (the offline backend) ids are
//! `sess-1`, `sess-2`, ... and `session/load` is refused. The backend's slash commands, if any,
//! are advertised after `session/new`. When the client advertises `subagents`, delegated children
//! are exposed as sessions of their own (`backend::delegate`), and `session/cancel` naming one
//! cancels that child only.
//!
//! A session owns its background subagent tasks (`backend::children::table`): `session/cancel` cancels them
//! with the turn, `session/close` cancels and awaits them before answering, and so does the end of
//! the connection before `serve` returns, so no child process outlives its session.
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

use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol::v1::schema::{
    AgentCapabilities, AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate,
    CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock,
    ForkSessionRequest, ForkSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, SessionCapabilities, SessionCloseCapabilities, SessionConfigOption,
    SessionConfigOptionCategory, SessionConfigSelectOption, SessionForkCapabilities, SessionId,
    SessionNotification, SessionSystemPromptCapabilities, SessionSystemPromptModeCapabilities,
    SessionSystemPromptOverrideCapabilities, SessionUpdate, SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse, SystemPrompt, SystemPromptMode, UnstructuredCommandInput,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, ByteStreams, Client, ConnectTo, Error as AcpError, ErrorCode, on_receive_notification,
    on_receive_request,
};
use protocol::capabilities::{self, ToolFilter};
use protocol::depth::DepthBudget;
use protocol::structured::OutputSchema;
use serde_json::Value;
use thiserror::Error;
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

use crate::backend::children::{self, ChildSessions, Subagents};
use crate::backend::model::{ClientBuildError, Model, ModelConfig};
use crate::backend::offline::Offline;
use crate::backend::{Backend, ClientFs, ClientLink, Offers, Turn};
use crate::outbox::{self, Backlog, Metered};
use crate::persona::{Persona, SessionPersona};
use crate::session::{Memory, SessionError, Sessions, Settings};
use crate::stdio::Stdio;
use crate::store::{SavedSettings, StoreError};
use crate::workspace::Workspace;
use crate::{AGENT_NAME, AGENT_VERSION};
use protocol::report::describe;

/// What the server runs with: the backend answering prompt turns, and this agent's own
/// delegation standing, which every session it opens is handed.
#[derive(Clone)]
pub struct AgentConfig {
    backend: Arc<dyn Backend>,
    /// Read once: the subagents' (as the binary read it), else this process's environment;
    /// `None` when the inherited values are malformed.
    depth: Option<DepthBudget>,
}

impl AgentConfig {
    /// Without a model: the offline backend.
    #[must_use]
    pub fn offline() -> Self {
        Self::offline_with(None)
    }

    /// The offline backend, `/delegate` running `subagents` when given.
    #[must_use]
    pub fn offline_with(subagents: Option<Subagents>) -> Self {
        Self {
            depth: depth_of(subagents.as_ref()),
            backend: Arc::new(Offline {
                subagents: subagents.map(Arc::new),
            }),
        }
    }

    /// With a model: the model backend, sessions saved in its state directory.
    pub fn model(config: ModelConfig) -> Result<Self, ClientBuildError> {
        Self::model_with(config, None)
    }

    /// The model backend, offered the `subagent` tool when `subagents` are given.
    pub fn model_with(
        config: ModelConfig,
        subagents: Option<Subagents>,
    ) -> Result<Self, ClientBuildError> {
        Ok(Self {
            depth: depth_of(subagents.as_ref()),
            backend: Arc::new(Model::new(config, subagents.map(Arc::new))?),
        })
    }
}

/// This agent's own standing: the one `subagents` hold, else read from the environment.
fn depth_of(subagents: Option<&Subagents>) -> Option<DepthBudget> {
    subagents.map_or_else(children::inherited_budget, Subagents::depth)
}

impl AgentConfig {
    /// Waits until the backend knows what it needs before serving: with `--base-url` alone, the
    /// model, learnt from the server's listing (at most `client::LIST_TIMEOUT`). `Err` names the
    /// URL and `--model`; serve only after `Ok` (a turn of an undiscovered model would fail).
    pub async fn ready(&self) -> Result<(), crate::DiscoveryError> {
        self.backend.warm_up().await;
        self.backend.ready()
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
/// Transport choice: stdin and stdout on the runtime the turns (timers, cancellation) already
/// need, adapted with `tokio_util::compat` into the SDK's `ByteStreams`, rather than the SDK's
/// `stdio` feature, which wraps std's blocking handles with the `blocking` crate, a second thread
/// pool beside tokio's. Pipes and Unix sockets are polled, anything else goes through tokio's
/// blocking threads (`stdio`).
///
/// Stdout is metered (`outbox::Metered`): what a child relays waits while the client
/// is behind.
pub async fn serve_stdio(config: AgentConfig) -> Result<(), ServeError> {
    let backlog = Arc::new(Backlog::default());
    let Stdio {
        reader,
        writer,
        restore: _restore,
    } = Stdio::take();
    let transport = ByteStreams::new(
        Metered::new(writer, Arc::clone(&backlog)).compat_write(),
        reader.compat(),
    );
    serve(config, transport, backlog).await
}

/// What the client said it can do at `initialize`, read when a turn starts.
#[derive(Debug, Clone, Copy, Default)]
struct ClientOffers {
    fs: ClientFs,
    /// The client follows children exposed as sessions of their own (ACP subagent sessions);
    /// without it, a child's activity goes into its tool card.
    subagents: bool,
}

impl ClientOffers {
    fn of(request: &InitializeRequest) -> ClientOffers {
        let capabilities = &request.client_capabilities;
        ClientOffers {
            fs: ClientFs {
                read: capabilities.fs.read_text_file,
                write: capabilities.fs.write_text_file,
            },
            subagents: capabilities.subagents.is_some(),
        }
    }
}

/// How long `initialize` waits at most for the backend's warm-up (the models the server lists).
const WARM_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves ACP over any transport until the client closes it.
#[expect(
    clippy::too_many_lines,
    reason = "one builder chain: the SDK's handlers, one per method, each cloning what it shares"
)]
pub(crate) async fn serve(
    config: AgentConfig,
    transport: impl ConnectTo<Agent> + 'static,
    backlog: Arc<Backlog>,
) -> Result<(), ServeError> {
    let sessions = Arc::new(Sessions::default());
    let backend = config.backend;
    let depth = config.depth;
    // Set by `initialize`; read when a turn starts.
    let client = Arc::new(Mutex::new(ClientOffers::default()));
    let children = Arc::new(ChildSessions::default());
    let title = backend.title();
    // Learnt once at start (the models the server lists), off the connection's path.
    drop(tokio::spawn(backend.warm_up()));
    let result = Agent
        .v1()
        .name(AGENT_NAME)
        .on_receive_request(
            {
                let client = Arc::clone(&client);
                let persistent = backend.store().is_some();
                let backend = Arc::clone(&backend);
                async move |request: InitializeRequest,
                            responder: Responder<InitializeResponse>,
                            _cx: ConnectionTo<Client>| {
                    *client.lock().unwrap_or_else(PoisonError::into_inner) =
                        ClientOffers::of(&request);
                    // What the sessions are offered may depend on it; a slow server is not
                    // waited for long (its models are offered once they are listed).
                    let _ = tokio::time::timeout(WARM_UP_WAIT, backend.warm_up()).await;
                    let offers = backend.offers();
                    responder.respond(initialize(&request, &title, persistent, &offers))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                let backend = Arc::clone(&backend);
                let backlog = Arc::clone(&backlog);
                async move |request: NewSessionRequest,
                            responder: Responder<NewSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    new_session(
                        &sessions,
                        &*backend,
                        depth,
                        &request,
                        responder,
                        (&cx, &backlog),
                    )
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                let backend = Arc::clone(&backend);
                let backlog = Arc::clone(&backlog);
                async move |request: LoadSessionRequest,
                            responder: Responder<LoadSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    load_session(
                        &sessions,
                        &*backend,
                        depth,
                        &request,
                        responder,
                        (&cx, &backlog),
                    )
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                let backend = Arc::clone(&backend);
                async move |request: ForkSessionRequest,
                            responder: Responder<ForkSessionResponse>,
                            _cx: ConnectionTo<Client>| {
                    fork_session(&sessions, &*backend, depth, &request, responder)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                let backend = Arc::clone(&backend);
                async move |request: SetSessionConfigOptionRequest,
                            responder: Responder<SetSessionConfigOptionResponse>,
                            _cx: ConnectionTo<Client>| {
                    match set_config_option(&sessions, &backend.offers(), &request) {
                        Ok(options) => {
                            responder.respond(SetSessionConfigOptionResponse::new(options))
                        }
                        Err(error) => responder.respond_with_error(error),
                    }
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                let children = Arc::clone(&children);
                let backlog = Arc::clone(&backlog);
                async move |request: PromptRequest,
                            responder: Responder<PromptResponse>,
                            cx: ConnectionTo<Client>| {
                    let client = *client.lock().unwrap_or_else(PoisonError::into_inner);
                    let link = ClientLink {
                        fs: client.fs,
                        children: client.subagents.then(|| Arc::clone(&children)),
                        backlog: Arc::clone(&backlog),
                    };
                    prompt(&sessions, &backend, link, request, responder, &cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = Arc::clone(&sessions);
                async move |request: CloseSessionRequest,
                            responder: Responder<CloseSessionResponse>,
                            cx: ConnectionTo<Client>| {
                    close_session(&sessions, &request, responder, &cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            {
                let sessions = Arc::clone(&sessions);
                async move |notification: CancelNotification, _cx: ConnectionTo<Client>| {
                    cancel(&sessions, &children, notification.session_id.0.as_ref());
                    Ok(())
                }
            },
            on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    // Turns still running are abandoned with the connection; tell them, so none keeps waiting.
    sessions.cancel_all();
    // Background tasks end with the connection: each tears its child down before this returns.
    for memory in sessions.memories() {
        memory.tasks().shutdown().await;
    }
    result.map_err(|source| ServeError::Connection { source })
}

/// `session/cancel`: a session's prompt turn and its background tasks, else a child session exposed on this connection
/// (that child only, with its descendants).
fn cancel(sessions: &Sessions, children: &ChildSessions, id: &str) {
    if let Some(memory) = sessions.memory(id) {
        // Cancelling a session stops its background tasks too.
        memory.tasks().cancel_all();
    }
    if sessions.cancel(id) {
        tracing::debug!(session = id, "cancelling the prompt turn");
    } else if children.cancel(id) {
        tracing::debug!(session = id, "cancelling a child session");
    } else {
        tracing::debug!(session = id, "session/cancel with no prompt in flight");
    }
}

/// `session/close`: the session leaves the table (its turn cancelled), its background tasks are
/// cancelled and awaited (each child torn down), then the answer.
fn close_session(
    sessions: &Sessions,
    request: &CloseSessionRequest,
    responder: Responder<CloseSessionResponse>,
    cx: &ConnectionTo<Client>,
) -> Result<(), AcpError> {
    let id = request.session_id.0.as_ref();
    let Some(memory) = sessions.close(id) else {
        return responder.respond_with_error(AcpError::new(
            ErrorCode::RESOURCE_NOT_FOUND,
            format!("session/close: unknown session {id}"),
        ));
    };
    tracing::debug!(session = id, "closing the session");
    cx.spawn(async move {
        memory.tasks().shutdown().await;
        if let Err(error) = responder.respond(CloseSessionResponse::new()) {
            tracing::debug!(error = %describe(&error), "could not answer session/close");
        }
        Ok(())
    })
}

fn initialize(
    request: &InitializeRequest,
    title: &str,
    persistent: bool,
    offers: &Offers,
) -> InitializeResponse {
    tracing::debug!(client_version = ?request.protocol_version, "initialize");
    let mut capabilities = AgentCapabilities::new().load_session(persistent);
    let mut sessions = SessionCapabilities::new().close(SessionCloseCapabilities::new());
    if persistent {
        sessions = sessions.fork(SessionForkCapabilities::new());
    }
    if offers.system_prompt {
        sessions = sessions.system_prompt(
            SessionSystemPromptCapabilities::new().mode(
                SessionSystemPromptModeCapabilities::new()
                    .override_(SessionSystemPromptOverrideCapabilities::new()),
            ),
        );
    }
    capabilities = capabilities.session_capabilities(sessions);
    // Every backend honours a depth cap (the offline one delegates too); the tool filter and the
    // output schema need the model's tools.
    // The budget too: only a model spends.
    let mut fields = vec![capabilities::FIELD_MAX_DEPTH];
    if !offers.tools.is_empty() {
        fields.extend([
            capabilities::FIELD_TOOLS,
            capabilities::FIELD_OUTPUT_SCHEMA,
            capabilities::FIELD_BUDGET,
        ]);
    }
    capabilities = capabilities.meta(capabilities::Advertised::new(fields).to_meta());
    // Only v1 is spoken; answering with it lets a newer client downgrade or disconnect.
    InitializeResponse::new(protocol::version::ACP_PROTOCOL_VERSION)
        .agent_capabilities(capabilities)
        .agent_info(Implementation::new(AGENT_NAME, AGENT_VERSION).title(title))
}

/// The model config option of a session (none when the backend offers no models).
fn config_options(offers: &Offers, settings: &Settings) -> Vec<SessionConfigOption> {
    let Some(default) = offers.models.first() else {
        return Vec::new();
    };
    let current = settings.model.as_ref().unwrap_or(default);
    let values: Vec<SessionConfigSelectOption> = offers
        .models
        .iter()
        .map(|model| SessionConfigSelectOption::new(model.clone(), model.clone()))
        .collect();
    vec![
        SessionConfigOption::select(MODEL_OPTION, "Model", current.clone(), values)
            .category(SessionConfigOptionCategory::Model),
    ]
}

/// The id of the model config option.
const MODEL_OPTION: &str = "model";

/// What `session/new` (or `session/load`) asks of the session (`system_prompt`, the start
/// extension in `meta`), checked against what the backend offers, over `base` (a loaded
/// session's saved settings: what the request does not mention is kept), standing at this
/// agent's `depth`; `Err` is the message of an invalid-params error.
fn session_settings(
    system_prompt: Option<&SystemPrompt>,
    meta: Option<&serde_json::Map<String, Value>>,
    offers: &Offers,
    base: Settings,
    depth: Option<DepthBudget>,
) -> Result<Settings, String> {
    let mut settings = base;
    settings.agent_depth = depth;
    if let Some(system) = system_prompt {
        settings.persona = Some(session_persona(system, offers)?);
    }
    if let Some(extension) = meta.and_then(|meta| meta.get(capabilities::EXTENSION)) {
        let extension = start_extension(extension, offers)?;
        settings.tools = extension.tools.or(settings.tools);
        settings.output = extension.output.or(settings.output);
        settings.max_depth = extension.max_depth.or(settings.max_depth);
        settings.budget = extension.budget;
    }
    Ok(settings)
}

fn session_persona(system: &SystemPrompt, offers: &Offers) -> Result<SessionPersona, String> {
    if !offers.system_prompt {
        return Err("systemPrompt: this agent takes no system prompt".into());
    }
    let replace = match &system.mode {
        SystemPromptMode::Append => false,
        SystemPromptMode::Override => true,
        other => {
            return Err(format!(
                "systemPrompt: mode {other:?} is not supported; use append or override"
            ));
        }
    };
    if system.content.is_empty() {
        return Err("systemPrompt: content is empty".into());
    }
    let mut text = String::new();
    for block in &system.content {
        let ContentBlock::Text(block) = block else {
            return Err("systemPrompt: only text content is supported".into());
        };
        text.push_str(&block.text);
    }
    let persona = Persona::new(&text).map_err(|error| format!("systemPrompt: {error}"))?;
    Ok(SessionPersona {
        persona,
        replace,
        template: text,
    })
}

/// The start extension's fields, as a session takes them.
#[derive(Default)]
struct Extension {
    tools: Option<ToolFilter>,
    output: Option<Arc<OutputSchema>>,
    max_depth: Option<u32>,
    budget: Option<protocol::usage::Budget>,
}

/// The start extension's fields: a tool filter whose names must all exist, an output schema that
/// compiles, a depth cap that is a whole number.
fn start_extension(extension: &Value, offers: &Offers) -> Result<Extension, String> {
    let key = capabilities::EXTENSION;
    // Every backend honours a depth cap; the tool filter and the output schema need tools.
    let start = capabilities::SessionStart::read(extension, |field| {
        field == capabilities::FIELD_MAX_DEPTH || !offers.tools.is_empty()
    })
    .map_err(|error| error.to_string())?;
    let mut taken = Extension {
        max_depth: start.max_depth,
        budget: start.budget,
        ..Extension::default()
    };
    if let Some(schema) = start.output_schema {
        let schema = OutputSchema::compile(schema)
            .map_err(|error| format!("_meta.{key}.outputSchema: {error}"))?;
        taken.output = Some(Arc::new(schema));
    }
    if let Some(filter) = start.tools {
        filter
            .check(&offers.tools)
            .map_err(|error| format!("_meta.{key}.tools: {error}"))?;
        taken.tools = Some(filter);
    }
    Ok(taken)
}

/// Selects a session's model; answers every config option's current value.
fn set_config_option(
    sessions: &Sessions,
    offers: &Offers,
    request: &SetSessionConfigOptionRequest,
) -> Result<Vec<SessionConfigOption>, AcpError> {
    let invalid = |message: String| {
        AcpError::new(
            ErrorCode::INVALID_PARAMS,
            format!("session/set_config_option: {message}"),
        )
    };
    let id = request.session_id.0.as_ref();
    let Some(memory) = sessions.memory(id) else {
        return Err(AcpError::new(
            ErrorCode::RESOURCE_NOT_FOUND,
            format!("session/set_config_option: unknown session {id}"),
        ));
    };
    if request.config_id.0.as_ref() != MODEL_OPTION || offers.models.is_empty() {
        return Err(invalid(format!(
            "unknown config option {}; {}",
            request.config_id.0,
            if offers.models.is_empty() {
                "this agent offers none".to_owned()
            } else {
                format!("the options are: {MODEL_OPTION}")
            }
        )));
    }
    let Some(value) = request.value.as_value_id() else {
        return Err(invalid("the model option takes a value id".into()));
    };
    let value = value.0.as_ref();
    if !offers.models.iter().any(|model| model == value) {
        return Err(invalid(format!(
            "model {value} is not offered; the models are: {}",
            offers.models.join(", ")
        )));
    }
    memory.configure(|settings| settings.model = Some(value.to_owned()));
    Ok(config_options(offers, &memory.settings()))
}

fn new_session(
    sessions: &Sessions,
    backend: &dyn Backend,
    depth: Option<DepthBudget>,
    request: &NewSessionRequest,
    responder: Responder<NewSessionResponse>,
    (cx, backlog): (&ConnectionTo<Client>, &Backlog),
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
    let offers = backend.offers();
    let settings = match session_settings(
        request.system_prompt.as_ref(),
        request.meta.as_ref(),
        &offers,
        Settings::default(),
        depth,
    ) {
        Ok(settings) => settings,
        Err(message) => {
            return responder.respond_with_error(AcpError::new(
                ErrorCode::INVALID_PARAMS,
                format!("session/new: {message}"),
            ));
        }
    };
    let store = backend.store();
    let id = sessions.mint_id(store.is_some());
    let memory = match store {
        Some(store) => match store.create(&id, workspace.root()) {
            Ok(file) => Memory::persistent(file, Vec::new(), Settings::default()),
            Err(error) => {
                return responder.respond_with_error(AcpError::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("session/new: {}", describe(&error)),
                ));
            }
        },
        None => Memory::default(),
    };
    let options = config_options(&offers, &settings);
    memory.configure(|current| *current = settings);
    if let Err(error) = sessions.open(&id, workspace, memory) {
        // A freshly minted id cannot be open already; answer rather than assume.
        return responder.respond_with_error(AcpError::new(
            ErrorCode::INTERNAL_ERROR,
            format!("session/new: {error}"),
        ));
    }
    tracing::debug!(session = id, cwd = %request.cwd.display(), saved = store.is_some(), "session created");
    let mut response = NewSessionResponse::new(id.clone());
    if !options.is_empty() {
        response = response.config_options(options);
    }
    responder.respond(response)?;
    let commands = backend.available_commands();
    if commands.is_empty() {
        return Ok(());
    }
    // Advertise the slash commands so editors can offer them (e.g. Zed's `/` menu).
    let commands = commands
        .iter()
        .map(|help| {
            AvailableCommand::new(help.name, help.description).input(
                AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(help.input)),
            )
        })
        .collect();
    outbox::send(
        cx,
        backlog,
        SessionNotification::new(
            SessionId::new(id),
            SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)),
        ),
    )
}

fn load_session(
    sessions: &Sessions,
    backend: &dyn Backend,
    depth: Option<DepthBudget>,
    request: &LoadSessionRequest,
    responder: Responder<LoadSessionResponse>,
    (cx, backlog): (&ConnectionTo<Client>, &Backlog),
) -> Result<(), AcpError> {
    let refuse = |code, message: String| AcpError::new(code, format!("session/load: {message}"));
    let Some(store) = backend.store() else {
        return responder.respond_with_error(refuse(
            ErrorCode::METHOD_NOT_FOUND,
            "sessions are saved only when a model is configured (--model or ACP_CHILD_MODEL); this agent runs offline and does not advertise loadSession".to_owned(),
        ));
    };
    let id = request.session_id.0.as_ref();
    let workspace = match Workspace::open(&request.cwd) {
        Ok(workspace) => workspace,
        Err(error) => {
            return responder
                .respond_with_error(refuse(ErrorCode::INVALID_PARAMS, describe(&error)));
        }
    };
    // Open on this connection already: said as such, before the file's lock would refuse it.
    if sessions.memory(id).is_some() {
        let error = SessionError::AlreadyOpen { id: id.to_owned() };
        return responder.respond_with_error(refuse(ErrorCode::INVALID_REQUEST, error.to_string()));
    }
    let (saved, file) = match store.load(id) {
        Ok(loaded) => loaded,
        Err(error) => {
            return responder
                .respond_with_error(refuse(store_error_code(&error), describe(&error)));
        }
    };
    // The settings it was left with, then what this request asks (which wins where it speaks).
    let offers = backend.offers();
    let restored = restore(saved.settings, &offers, id);
    let settings = match session_settings(
        request.system_prompt.as_ref(),
        request.meta.as_ref(),
        &offers,
        restored.clone(),
        depth,
    ) {
        Ok(settings) => settings,
        Err(message) => {
            return responder.respond_with_error(refuse(ErrorCode::INVALID_PARAMS, message));
        }
    };
    let options = config_options(&offers, &settings);
    let memory = Memory::persistent(file, saved.history, restored);
    memory.tasks().add_unusable(saved.unusable_children);
    memory.configure(|current| *current = settings);
    let updates = backend.replay(&workspace, &memory);
    if let Err(error) = sessions.open(id, workspace, memory) {
        return responder.respond_with_error(refuse(ErrorCode::INVALID_REQUEST, error.to_string()));
    }
    tracing::debug!(
        session = id,
        updates = updates.len(),
        "session loaded; replaying"
    );
    // Replayed before the response: the same ordered outgoing queue carries both.
    for update in updates {
        outbox::send(
            cx,
            backlog,
            SessionNotification::new(request.session_id.clone(), update),
        )?;
    }
    let mut response = LoadSessionResponse::new();
    if !options.is_empty() {
        response = response.config_options(options);
    }
    responder.respond(response)
}

/// The JSON-RPC error code of a session file that cannot be used.
fn store_error_code(error: &StoreError) -> ErrorCode {
    match error {
        StoreError::NotFound { .. } => ErrorCode::RESOURCE_NOT_FOUND,
        StoreError::BadId { .. } | StoreError::NotAFile { .. } => ErrorCode::INVALID_PARAMS,
        StoreError::Busy { .. } | StoreError::Newer { .. } => ErrorCode::INVALID_REQUEST,
        StoreError::Io { .. } | StoreError::NoHeader { .. } => ErrorCode::INTERNAL_ERROR,
    }
}

/// The settings session `id` was saved with, as this agent can still honour them (a model no
/// longer offered falls back to the default).
fn restore(saved: Option<SavedSettings>, offers: &Offers, id: &str) -> Settings {
    let mut restored = saved.map(Settings::restored).unwrap_or_default();
    if let Some(model) = &restored.model
        && !offers.models.contains(model)
    {
        tracing::warn!(session = id, %model, "the saved model is no longer offered; using the default");
        restored.model = None;
    }
    restored
}

/// `session/fork`: a new saved session holding the source's completed turns, with its settings
/// (then what this request asks, like `session/load`). The source is read, never opened or
/// written: it may be open elsewhere, mid-turn (the parent of a forked child).
fn fork_session(
    sessions: &Sessions,
    backend: &dyn Backend,
    depth: Option<DepthBudget>,
    request: &ForkSessionRequest,
    responder: Responder<ForkSessionResponse>,
) -> Result<(), AcpError> {
    let refuse = |code, message: String| AcpError::new(code, format!("session/fork: {message}"));
    let Some(store) = backend.store() else {
        return responder.respond_with_error(refuse(
            ErrorCode::METHOD_NOT_FOUND,
            "sessions are saved only when a model is configured (--model or ACP_CHILD_MODEL); this agent runs offline and does not advertise sessionCapabilities.fork".to_owned(),
        ));
    };
    let source = request.session_id.0.as_ref();
    let workspace = match Workspace::open(&request.cwd) {
        Ok(workspace) => workspace,
        Err(error) => {
            return responder
                .respond_with_error(refuse(ErrorCode::INVALID_PARAMS, describe(&error)));
        }
    };
    let saved = match store.snapshot(source) {
        Ok(saved) => saved,
        Err(error) => {
            return responder
                .respond_with_error(refuse(store_error_code(&error), describe(&error)));
        }
    };
    let offers = backend.offers();
    let settings = match session_settings(
        request.system_prompt.as_ref(),
        request.meta.as_ref(),
        &offers,
        restore(saved.settings.clone(), &offers, source),
        depth,
    ) {
        Ok(settings) => settings,
        Err(message) => {
            return responder.respond_with_error(refuse(ErrorCode::INVALID_PARAMS, message));
        }
    };
    let id = sessions.mint_id(true);
    let file = match store.create(&id, workspace.root()) {
        Ok(file) => file,
        Err(error) => {
            return responder
                .respond_with_error(refuse(ErrorCode::INTERNAL_ERROR, describe(&error)));
        }
    };
    let history = saved.completed();
    let copied = history.len();
    let memory = Memory::persistent(file, Vec::new(), Settings::default());
    memory.extend(history);
    // The copied turns are completed turns of the fork too: a fork is forkable.
    memory.end_turn();
    let options = config_options(&offers, &settings);
    memory.configure(|current| *current = settings);
    if let Err(error) = sessions.open(&id, workspace, memory) {
        return responder.respond_with_error(refuse(ErrorCode::INTERNAL_ERROR, error.to_string()));
    }
    tracing::debug!(session = id, source, records = copied, "session forked");
    let mut response = ForkSessionResponse::new(id);
    if !options.is_empty() {
        response = response.config_options(options);
    }
    responder.respond(response)
}

/// Ends the turn's exported span with how it ended and what it spent (a no-op when export is off).
fn end_spans<E: std::fmt::Display>(
    turn: &Turn,
    result: &Result<agent_client_protocol::v1::schema::StopReason, E>,
    usage: Option<&(protocol::usage::Usage, protocol::usage::Breakdown)>,
    budget_stop: Option<&protocol::usage::Overrun>,
) {
    if !acp_host::telemetry::enabled() {
        return;
    }
    let ended = match result {
        Ok(stop) => Ok(serde_json::to_value(stop)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default()),
        Err(error) => Err(error.to_string()),
    };
    turn.spans().end_turn(
        ended.as_deref().map_err(String::as_str),
        usage.map(|(total, _)| total),
        budget_stop.map(ToString::to_string).as_deref(),
    );
}

fn prompt(
    sessions: &Arc<Sessions>,
    backend: &Arc<dyn Backend>,
    link: ClientLink,
    request: PromptRequest,
    responder: Responder<PromptResponse>,
    cx: &ConnectionTo<Client>,
) -> Result<(), AcpError> {
    let active = match sessions.begin_turn(request.session_id.0.as_ref()) {
        Ok(active) => active,
        Err(error) => {
            let code = match error {
                SessionError::Unknown { .. } => ErrorCode::RESOURCE_NOT_FOUND,
                SessionError::Busy { .. } | SessionError::AlreadyOpen { .. } => {
                    ErrorCode::INVALID_REQUEST
                }
            };
            return responder
                .respond_with_error(AcpError::new(code, format!("session/prompt: {error}")));
        }
    };
    let backend = Arc::clone(backend);
    let received = protocol::trace::TraceParent::from_meta(request.meta.as_ref());
    let mut turn = Turn::new(active, cx.clone(), request.prompt, link).traced(received.as_ref());
    // A capture of an earlier turn is never this turn's answer.
    turn.memory().take_captured();
    cx.spawn(async move {
        let result = backend.run_turn(&mut turn).await;
        turn.memory().end_turn();
        let captured = turn.memory().take_captured();
        let usage = turn.take_spent();
        let budget_stop = turn.take_budget_stop();
        end_spans(&turn, &result, usage.as_ref(), budget_stop.as_ref());
        // Free the session's slot before answering, so the next prompt is never refused as busy.
        drop(turn);
        let sent = match result {
            Ok(stop_reason) => {
                let mut response = PromptResponse::new(stop_reason);
                let mut meta = captured
                    .map(|structured| capabilities::Answer { structured }.to_meta())
                    .unwrap_or_default();
                // The turn's usage, tree-wide (its children's included), with its breakdown in
                // the `acp-host/usage` extension (docs/start-extension.md).
                // A turn ended for the session's budget says so there too (it may have spent
                // nothing: the first request would have passed it).
                match usage {
                    Some((total, breakdown)) => {
                        response = response.usage(total.to_acp());
                        meta.extend(
                            protocol::usage::Breakdown {
                                budget_stop,
                                ..breakdown
                            }
                            .to_meta(),
                        );
                    }
                    None if budget_stop.is_some() => meta.extend(
                        protocol::usage::Breakdown {
                            budget_stop,
                            ..protocol::usage::Breakdown::default()
                        }
                        .to_meta(),
                    ),
                    None => {}
                }
                if !meta.is_empty() {
                    response = response.meta(meta);
                }
                responder.respond(response)
            }
            Err(error) => {
                let message = describe(&error);
                tracing::warn!(%message, "prompt turn failed");
                responder.respond_with_error(AcpError::new(error.code(), message))
            }
        };
        if let Err(error) = sent {
            // The client is gone; the connection is shutting down on its own.
            tracing::debug!(error = %describe(&error), "could not answer session/prompt");
        }
        Ok(())
    })
}
