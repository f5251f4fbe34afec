//! A scripted ACP client for the protocol-level suites of `acp-child`: the real binary over real
//! pipes, driven with the SDK's client side (`Client.v1()`).
//!
//! The transport is built by hand so that every line the agent writes to stdout, and every line
//! the client sends, is recorded. [`Spawned::finish`] then checks the invariants of every run:
//! stdout carried only JSON-RPC frames, and the agent exited with code 0 once its stdin closed.
//!
//! The agent is started without the ambient model settings of the developer's environment
//! ([`AMBIENT`]), so an offline launch stays offline and a model launch talks only to the model
//! server the test names. Debug logging is always on, to prove logs stay off stdout.
//!
//! A client launched with [`Launch::subagents`] advertises ACP subagent sessions: every
//! `session/update` of every session is then recorded in arrival order ([`Finished::all_updates`]),
//! the updates of an announced child session do not reach the parent's session stream, and a
//! child's permission requests are answered with `allow-once` (recorded in
//! [`Finished::child_permissions`]).
//!
//! No fixed sleeps: callers wait for protocol events (an update, a response, EOF), each wait
//! bounded by [`TIMEOUT`].

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::util::MatchDispatch;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, ContentChunk, FileSystemCapabilities, InitializeRequest,
    InitializeResponse, PromptResponse, ReadTextFileRequest, ReadTextFileResponse,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate, StopReason,
    SubagentCapabilities, ToolCall, ToolCallStatus, ToolCallUpdate, WriteTextFileRequest,
    WriteTextFileResponse,
};
use agent_client_protocol::v1::{ActiveSession, ConnectionTo, Responder, SessionMessage};
use agent_client_protocol::{Agent, Client, Error as AcpError, ErrorCode, Handled, Lines};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The bound on every wait; generous for a loaded 2-core machine, far below "hung".
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variables that would configure the agent behind the test's back.
pub const AMBIENT: [&str; 6] = [
    "ACP_CHILD_MODEL",
    "ACP_CHILD_BASE_URL",
    "ACP_CHILD_API_KEY",
    "ACP_CHILD_STATE_DIR",
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
];

/// The model name model launches use; the mock server accepts any.
pub const MODEL: &str = "mock-model";

/// How to start the agent and what the client says in `initialize`.
#[derive(Debug, Clone)]
pub struct Launch {
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    initialize: InitializeRequest,
}

impl Launch {
    /// The offline backend; the client advertises no capabilities.
    #[must_use]
    pub fn offline() -> Self {
        Self {
            args: Vec::new(),
            env: Vec::new(),
            initialize: InitializeRequest::new(ProtocolVersion::V1),
        }
    }

    /// The model backend against `base_url` (a mock model server), saving sessions in
    /// `state_dir`; the client advertises no capabilities.
    #[must_use]
    pub fn model(base_url: &str, state_dir: &Path) -> Self {
        let mut launch = Self::offline();
        launch.args = vec![
            "--model".into(),
            MODEL.into(),
            "--base-url".into(),
            base_url.into(),
            "--state-dir".into(),
            state_dir.into(),
        ];
        launch
    }

    /// One more command-line argument for the agent (e.g. `--persona FILE`).
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// One more variable in the agent's environment.
    #[must_use]
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Advertises `fs.readTextFile` / `fs.writeTextFile` in `initialize`.
    #[must_use]
    pub fn client_fs(mut self, read: bool, write: bool) -> Self {
        let caps = self.initialize.client_capabilities.clone();
        self.initialize = self.initialize.client_capabilities(
            caps.fs(FileSystemCapabilities::new()
                .read_text_file(read)
                .write_text_file(write)),
        );
        self
    }

    /// Advertises `subagents` (ACP subagent sessions) in `initialize`; see the module's doc.
    #[must_use]
    pub fn subagents(mut self) -> Self {
        let caps = self.initialize.client_capabilities.clone();
        self.initialize = self
            .initialize
            .client_capabilities(caps.subagents(SubagentCapabilities::new()));
        self
    }
}

/// A running agent whose stdout is recorded line by line.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    stdout_log: Arc<Mutex<Vec<String>>>,
    sent_log: Arc<Mutex<Vec<String>>>,
    stdout_done: tokio::task::JoinHandle<()>,
    stderr: tokio::task::JoinHandle<String>,
}

/// The agent's stdout, one line per item, as the SDK's `Lines` transport wants it.
pub type StdoutLines = futures::channel::mpsc::UnboundedReceiver<std::io::Result<String>>;

/// Spawns `acp-child` with `args` (and debug logging, none of [`AMBIENT`]); returns it with its
/// stdin and its stdout lines, which are also recorded.
///
/// # Panics
///
/// When the binary is missing (see [`crate::bin`]) or cannot be started.
#[must_use]
pub fn spawn_agent(args: &[OsString]) -> (Spawned, ChildStdin, StdoutLines) {
    spawn_agent_with(args, &[])
}

/// [`spawn_agent`] with `env` added to the agent's environment.
///
/// # Panics
///
/// See [`spawn_agent`].
#[must_use]
pub fn spawn_agent_with(
    args: &[OsString],
    env: &[(OsString, OsString)],
) -> (Spawned, ChildStdin, StdoutLines) {
    let mut command = Command::new(crate::bin("acp-child"));
    for name in AMBIENT {
        command.env_remove(name);
    }
    command.env(protocol::env_vars::XDG_STATE_HOME, crate::suite_state());
    command.envs(env.iter().cloned());
    let mut child = command
        .args(args)
        .env("ACP_CHILD_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn acp-child");
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let stdout_log = Arc::new(Mutex::new(Vec::new()));
    let (tx, lines) = futures::channel::mpsc::unbounded();
    // Reads stdout to EOF on its own, whatever the client side does, so the agent never blocks
    // on a full pipe and every line it wrote is recorded.
    let stdout_done = tokio::spawn({
        let stdout_log = Arc::clone(&stdout_log);
        async move {
            let mut reader = BufReader::new(stdout).lines();
            loop {
                match reader.next_line().await {
                    Ok(Some(line)) => {
                        lock(&stdout_log).push(line.clone());
                        drop(tx.unbounded_send(Ok(line)));
                    }
                    Ok(None) => break,
                    Err(error) => {
                        drop(tx.unbounded_send(Err(error)));
                        break;
                    }
                }
            }
        }
    });
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        drop(stderr.read_to_string(&mut text).await);
        text
    });
    let spawned = Spawned {
        child,
        stdout_log,
        sent_log: Arc::default(),
        stdout_done,
        stderr,
    };
    (spawned, stdin, lines)
}

/// A test thread that panicked while holding a log left it consistent: keep reading it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a finished run left behind.
#[derive(Debug)]
pub struct Finished {
    /// Every line the agent wrote to stdout, in order.
    pub stdout: Vec<String>,
    /// Everything the agent wrote to stderr.
    pub stderr: String,
    /// Every line the SDK client sent (runs through [`with_launch`] only), in order.
    pub sent: Vec<String>,
    /// With [`Launch::subagents`]: every `session/update` of every session (session id, update),
    /// in arrival order.
    pub all_updates: Vec<(String, SessionUpdate)>,
    /// With [`Launch::subagents`]: the permission requests made on child sessions, in order.
    pub child_permissions: Vec<RequestPermissionRequest>,
}

impl Finished {
    /// The stdout frames, parsed (every line is one; [`Spawned::finish`] checked it).
    ///
    /// # Panics
    ///
    /// Never after `finish`; a line that is not JSON panics.
    #[must_use]
    pub fn frames(&self) -> Vec<Value> {
        parse(&self.stdout)
    }

    /// The frames the client sent, parsed.
    ///
    /// # Panics
    ///
    /// When a sent line is not JSON (the SDK only sends JSON).
    #[must_use]
    pub fn sent_frames(&self) -> Vec<Value> {
        parse(&self.sent)
    }

    /// The JSON-RPC id of the first request the client sent with `method`.
    ///
    /// # Panics
    ///
    /// When no such request was sent.
    #[must_use]
    pub fn sent_request_id(&self, method: &str) -> Value {
        self.sent_frames()
            .into_iter()
            .find(|frame| frame["method"] == method)
            .unwrap_or_else(|| panic!("the client sent no {method} request"))["id"]
            .clone()
    }
}

fn parse(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("line is not JSON ({error}): {line}"))
        })
        .collect()
}

impl Spawned {
    /// Waits for stdout EOF and the exit (the caller has closed stdin), then checks the invariants
    /// of every run: exit code 0 and a stdout made only of JSON-RPC frames.
    ///
    /// # Panics
    ///
    /// When an invariant does not hold, or the agent does not exit within [`TIMEOUT`].
    pub async fn finish(mut self) -> Finished {
        tokio::time::timeout(TIMEOUT, &mut self.stdout_done)
            .await
            .expect("acp-child closes stdout after stdin EOF")
            .expect("the stdout reader finished");
        let status: ExitStatus = tokio::time::timeout(TIMEOUT, self.child.wait())
            .await
            .expect("acp-child exits after stdin EOF")
            .expect("the exit status is readable");
        let stderr = self.stderr.await.expect("the stderr reader finished");
        assert_eq!(status.code(), Some(0), "exit status; stderr:\n{stderr}");
        let stdout = lock(&self.stdout_log).clone();
        for line in &stdout {
            let frame: Value = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("stdout line is not JSON ({error}): {line}"));
            assert_eq!(frame["jsonrpc"], "2.0", "not a JSON-RPC frame: {line}");
            assert!(
                frame.get("id").is_some() || frame.get("method").is_some(),
                "not a JSON-RPC frame: {line}"
            );
        }
        let sent = lock(&self.sent_log).clone();
        Finished {
            stdout,
            stderr,
            sent,
            all_updates: Vec::new(),
            child_permissions: Vec::new(),
        }
    }
}

/// Runs `main` against a fresh offline agent; see [`with_launch`].
pub async fn with_agent<R>(
    main: impl AsyncFnOnce(ConnectionTo<Agent>, InitializeResponse) -> Result<R, AcpError>,
) -> (R, Finished) {
    with_launch(Launch::offline(), main).await
}

/// Runs `main` against a fresh agent started as `launch` says, after `initialize`; then closes
/// the agent's stdin (by ending the connection) and checks how it exited.
///
/// # Panics
///
/// When the client session fails or outlasts [`TIMEOUT`], or [`Spawned::finish`] panics.
pub async fn with_launch<R>(
    launch: Launch,
    main: impl AsyncFnOnce(ConnectionTo<Agent>, InitializeResponse) -> Result<R, AcpError>,
) -> (R, Finished) {
    let (spawned, stdin, lines) = spawn_agent_with(&launch.args, &launch.env);
    let sent_log = Arc::clone(&spawned.sent_log);
    let sink = futures::sink::unfold(stdin, move |mut stdin: ChildStdin, line: String| {
        lock(&sent_log).push(line.clone());
        async move {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await?;
            Ok::<_, std::io::Error>(stdin)
        }
    });
    let transport = Lines::new(Box::pin(sink), lines);
    let initialize = launch.initialize;
    let children = ChildSessions::default();
    // The transport, and with it the agent's stdin, is dropped when `connect_with` returns.
    let result = tokio::time::timeout(
        TIMEOUT,
        Client
            .v1()
            .on_receive_notification(
                {
                    let children = children.clone();
                    async move |notification: SessionNotification, cx: ConnectionTo<Agent>| {
                        Ok(children.notification(notification, cx))
                    }
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                {
                    let children = children.clone();
                    async move |request: RequestPermissionRequest,
                                responder: Responder<RequestPermissionResponse>,
                                _cx: ConnectionTo<Agent>| {
                        children.permission(request, responder)
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async |cx: ConnectionTo<Agent>| {
                let init = cx.send_request(initialize).block_task().await?;
                main(cx, init).await
            }),
    )
    .await
    .expect("the client session finished in time")
    .expect("the client session succeeded");
    let mut finished = spawned.finish().await;
    finished.all_updates = std::mem::take(&mut *lock(&children.updates));
    finished.child_permissions = std::mem::take(&mut *lock(&children.permissions));
    (result, finished)
}

/// What the connection-level handlers of [`with_launch`] saw of every session.
#[derive(Debug, Clone, Default)]
struct ChildSessions {
    announced: Arc<Mutex<HashSet<String>>>,
    updates: Arc<Mutex<Vec<(String, SessionUpdate)>>>,
    permissions: Arc<Mutex<Vec<RequestPermissionRequest>>>,
}

impl ChildSessions {
    /// Records every update; keeps an announced child's away from the parent's session stream.
    fn notification(
        &self,
        notification: SessionNotification,
        cx: ConnectionTo<Agent>,
    ) -> Handled<(SessionNotification, ConnectionTo<Agent>)> {
        let session = notification.session_id.to_string();
        if let SessionUpdate::SubagentUpdate(child) = &notification.update {
            lock(&self.announced).insert(child.session_id.to_string());
        }
        lock(&self.updates).push((session.clone(), notification.update.clone()));
        if lock(&self.announced).contains(&session) {
            Handled::Yes
        } else {
            Handled::No {
                message: (notification, cx),
                retry: false,
            }
        }
    }

    /// Answers a child's permission request with `allow-once`; leaves the others to the session.
    fn permission(
        &self,
        request: RequestPermissionRequest,
        responder: Responder<RequestPermissionResponse>,
    ) -> Result<
        Handled<(
            RequestPermissionRequest,
            Responder<RequestPermissionResponse>,
        )>,
        AcpError,
    > {
        if !lock(&self.announced).contains(&request.session_id.to_string()) {
            return Ok(Handled::No {
                message: (request, responder),
                retry: false,
            });
        }
        lock(&self.permissions).push(request);
        responder.respond(RequestPermissionResponse::new(
            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new("allow-once")),
        ))?;
        Ok(Handled::Yes)
    }
}

/// How the test client answers `session/request_permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Select `allow-once`.
    Allow,
    /// Select `allow-always`: the agent should not ask again for this kind of tool.
    AllowAlways,
    /// Select `reject-once`.
    Reject,
    /// Answer with the `cancelled` outcome, without cancelling the turn.
    Dismiss,
    /// Send `session/cancel` first, then answer `cancelled`, as a client does when the user stops
    /// the turn while a permission prompt is open.
    CancelTurn,
    /// Answer with a JSON-RPC error ([`PERMISSION_ERROR`]), as a client whose permission
    /// handler failed.
    Fail,
    /// Fail the test if asked.
    NotExpected,
}

/// The error message of [`Permission::Fail`].
pub const PERMISSION_ERROR: &str = "the permission dialog crashed";

/// How the test client answers the agent's requests during a turn.
#[derive(Debug, Clone)]
pub struct Answers {
    permission: Permission,
    /// `None`: the client serves no `fs/*` requests (one fails the test). `Some`: it answers
    /// `fs/read_text_file` from these editor buffers (keyed by absolute path) and accepts every
    /// `fs/write_text_file`, recording both.
    buffers: Option<HashMap<PathBuf, String>>,
}

impl From<Permission> for Answers {
    fn from(permission: Permission) -> Self {
        Self {
            permission,
            buffers: None,
        }
    }
}

impl Answers {
    /// Answers permission requests with `permission` and serves `fs/*` from editor buffers;
    /// add them with [`Self::buffer`].
    #[must_use]
    pub fn editor(permission: Permission) -> Self {
        Self {
            permission,
            buffers: Some(HashMap::new()),
        }
    }

    /// An editor buffer: `fs/read_text_file` of `path` returns `text`.
    #[must_use]
    pub fn buffer(mut self, path: impl Into<PathBuf>, text: &str) -> Self {
        self.buffers
            .get_or_insert_with(HashMap::new)
            .insert(path.into(), text.to_owned());
        self
    }
}

/// Everything the agent sent for one prompt turn.
#[derive(Debug, Default)]
pub struct TurnLog {
    /// The agent's message text, concatenated.
    pub text: String,
    /// Every session update, in order.
    pub updates: Vec<SessionUpdate>,
    /// Every permission request, in order.
    pub permission_requests: Vec<RequestPermissionRequest>,
    /// Every `fs/read_text_file` request, in order.
    pub reads: Vec<ReadTextFileRequest>,
    /// Every `fs/write_text_file` request, in order.
    pub writes: Vec<WriteTextFileRequest>,
}

impl TurnLog {
    /// The `tool_call` updates.
    #[must_use]
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.updates
            .iter()
            .filter_map(|update| match update {
                SessionUpdate::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect()
    }

    /// The `tool_call_update` updates.
    #[must_use]
    pub fn tool_call_updates(&self) -> Vec<&ToolCallUpdate> {
        self.updates
            .iter()
            .filter_map(|update| match update {
                SessionUpdate::ToolCallUpdate(update) => Some(update),
                _ => None,
            })
            .collect()
    }

    /// The final status of the last updated tool call of the turn.
    ///
    /// # Panics
    ///
    /// When no tool call was updated, or the last update sets no status.
    #[must_use]
    pub fn final_status(&self) -> ToolCallStatus {
        let updates = self.tool_call_updates();
        let last = updates.last().expect("the tool call was updated");
        last.fields.status.expect("the last update sets a status")
    }
}

/// Reads the session's updates, answering the agent's requests as `answers` says, until
/// `stop_at` matches an update (returns `None`) or the prompt response arrives (returns it).
///
/// # Errors
///
/// When the connection fails.
///
/// # Panics
///
/// On a request `answers` does not expect, or a message that is neither an update, a request
/// nor the prompt response.
pub async fn read_until(
    session: &mut ActiveSession<'static, Agent>,
    log: &mut TurnLog,
    answers: impl Into<Answers>,
    stop_at: impl Fn(&SessionUpdate) -> bool,
) -> Result<Option<Result<PromptResponse, AcpError>>, AcpError> {
    let answers = answers.into();
    loop {
        match session.read_update().await? {
            SessionMessage::PromptResponse(response) => return Ok(Some(response)),
            SessionMessage::Message(dispatch) => {
                let mut stop = false;
                let session_id = session.session_id().clone();
                let connection = session.connection().clone();
                MatchDispatch::new(dispatch.into_raw())
                    .if_notification(async |notification: SessionNotification| {
                        if let SessionUpdate::AgentMessageChunk(ContentChunk {
                            content: ContentBlock::Text(text),
                            ..
                        }) = &notification.update
                        {
                            log.text.push_str(&text.text);
                        }
                        stop = stop_at(&notification.update);
                        log.updates.push(notification.update);
                        Ok(())
                    })
                    .await
                    .if_request(async |request: RequestPermissionRequest, responder| {
                        log.permission_requests.push(request);
                        if answers.permission == Permission::Fail {
                            return responder.respond_with_error(AcpError::new(
                                ErrorCode::INTERNAL_ERROR,
                                PERMISSION_ERROR,
                            ));
                        }
                        let outcome = match answers.permission {
                            Permission::Allow => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new("allow-once"),
                            ),
                            Permission::AllowAlways => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new("allow-always"),
                            ),
                            Permission::Reject => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new("reject-once"),
                            ),
                            Permission::Dismiss => RequestPermissionOutcome::Cancelled,
                            Permission::CancelTurn => {
                                connection
                                    .send_notification(CancelNotification::new(session_id))?;
                                RequestPermissionOutcome::Cancelled
                            }
                            Permission::NotExpected => panic!("unexpected permission request"),
                            Permission::Fail => unreachable!("answered above"),
                        };
                        responder.respond(RequestPermissionResponse::new(outcome))
                    })
                    .await
                    .if_request(async |request: ReadTextFileRequest, responder| {
                        let Some(buffers) = &answers.buffers else {
                            panic!("fs/read_text_file sent to a client without fs: {request:?}");
                        };
                        let buffer = buffers.get(&request.path).cloned();
                        let path = request.path.display().to_string();
                        log.reads.push(request);
                        match buffer {
                            Some(text) => responder.respond(ReadTextFileResponse::new(text)),
                            None => responder.respond_with_error(AcpError::new(
                                ErrorCode::RESOURCE_NOT_FOUND,
                                format!("no buffer for {path}"),
                            )),
                        }
                    })
                    .await
                    .if_request(async |request: WriteTextFileRequest, responder| {
                        assert!(
                            answers.buffers.is_some(),
                            "fs/write_text_file sent to a client without fs: {request:?}"
                        );
                        log.writes.push(request);
                        responder.respond(WriteTextFileResponse::new())
                    })
                    .await
                    .otherwise_ignore()?;
                if stop {
                    return Ok(None);
                }
            }
            other => panic!("unexpected session message {other:?}"),
        }
    }
}

/// Sends `prompt` and reads the whole turn.
///
/// # Errors
///
/// When the connection fails; a JSON-RPC error answering the prompt is in the returned result.
///
/// # Panics
///
/// See [`read_until`].
pub async fn prompt(
    session: &mut ActiveSession<'static, Agent>,
    prompt: &str,
    answers: impl Into<Answers>,
) -> Result<(TurnLog, Result<PromptResponse, AcpError>), AcpError> {
    session.send_prompt(prompt)?;
    let mut log = TurnLog::default();
    let response = read_until(session, &mut log, answers, |_| false)
        .await?
        .expect("read_until stops only at the response");
    Ok((log, response))
}

/// Sends `prompt`, reads the whole turn and asserts it ended normally (`end_turn`); its log.
///
/// # Errors
///
/// When the connection fails.
///
/// # Panics
///
/// When the prompt is answered with an error or another stop reason; see also [`read_until`].
pub async fn prompt_ends(
    session: &mut ActiveSession<'static, Agent>,
    prompt: &str,
    answers: impl Into<Answers>,
) -> Result<TurnLog, AcpError> {
    let (log, response) = self::prompt(session, prompt, answers).await?;
    assert_eq!(stop_reason(response), StopReason::EndTurn, "{prompt:?}");
    Ok(log)
}

/// Starts a session in `cwd` with `session/new`.
///
/// # Errors
///
/// When the agent refuses or the connection fails.
pub async fn new_session(
    cx: &ConnectionTo<Agent>,
    cwd: &Path,
) -> Result<ActiveSession<'static, Agent>, AcpError> {
    Ok(cx
        .build_session(cwd)
        .block_task()
        .start_session()
        .await?
        .session)
}

/// Loads saved session `id` in `cwd` with `session/load` (its replay is read with the turn that
/// follows).
///
/// # Errors
///
/// When the agent refuses or the connection fails.
pub async fn load_session(
    cx: &ConnectionTo<Agent>,
    id: impl Into<SessionId>,
    cwd: &Path,
) -> Result<ActiveSession<'static, Agent>, AcpError> {
    Ok(cx
        .load_session(id, cwd)
        .block_task()
        .start_session()
        .await?
        .session)
}

/// The stop reason of a successful prompt.
///
/// # Panics
///
/// When the prompt was answered with an error.
#[must_use]
pub fn stop_reason(response: Result<PromptResponse, AcpError>) -> StopReason {
    response.expect("the prompt succeeded").stop_reason
}

/// The canonical form of an existing path (tempdirs may sit behind symlinks, e.g. on macOS).
///
/// # Panics
///
/// When the path does not exist.
#[must_use]
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).expect("the path exists")
}
