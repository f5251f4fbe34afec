//! End-to-end tests of the `acp-child` agent: the real binary over real pipes.
//!
//! Most tests drive it with the ACP SDK's client side (`Client.v1()`); the transport is built by
//! hand so that every line the agent writes to stdout is also recorded, and each run then checks
//! that stdout carried only JSON-RPC frames and that the agent exited with code 0 once its stdin
//! closed. One test speaks raw NDJSON to close stdin in the middle of a turn.
//!
//! No fixed sleeps: tests wait for protocol events (a tool call, a response, EOF), each wait
//! bounded by [`TIMEOUT`].

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::util::MatchDispatch;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse,
    NewSessionRequest, PromptResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
    StopReason, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate,
    ToolKind,
};
use agent_client_protocol::v1::{ActiveSession, ConnectionTo, SessionMessage};
use agent_client_protocol::{Agent, Client, Error as AcpError, ErrorCode, Lines};
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The bound on every wait; generous for a loaded 2-core machine, far below "hung".
const TIMEOUT: Duration = Duration::from_secs(30);

/// The reply to plain text, exactly.
const NO_MODEL_REPLY: &str = "No model is configured: acp-child is running its offline backend and cannot answer free-form prompts.\n\
A model backend (any OpenAI-compatible API) is planned but not available in this version.\n\
Offline commands that work now: /read PATH, /write PATH TEXT, /sleep SECONDS.\n";

/// The `acp-child` binary, next to this test executable's directory (`target/<profile>/`).
fn acp_child_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps");
    let bin = profile_dir.join(format!("acp-child{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found; build it first with `cargo build -p acp-child` (`cargo test --workspace` does)",
        bin.display()
    );
    bin
}

/// A running agent whose stdout is recorded line by line.
struct Spawned {
    child: Child,
    stdout_log: Arc<Mutex<Vec<String>>>,
    stdout_done: tokio::task::JoinHandle<()>,
    stderr: tokio::task::JoinHandle<String>,
}

/// The agent's stdout, one line per item, as the SDK's `Lines` transport wants it.
type StdoutLines = futures::channel::mpsc::UnboundedReceiver<std::io::Result<String>>;

/// Spawns the agent (with debug logging on, to prove logs stay off stdout); returns it with its
/// stdin and its recorded stdout lines.
fn spawn_agent() -> (Spawned, ChildStdin, StdoutLines) {
    let mut child = Command::new(acp_child_bin())
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
                        stdout_log.lock().unwrap().push(line.clone());
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
        stdout_done,
        stderr,
    };
    (spawned, stdin, lines)
}

/// What a finished run left behind.
struct Finished {
    stdout: Vec<String>,
    stderr: String,
}

impl Spawned {
    /// Waits for stdout EOF and the exit (the caller has closed stdin), then checks the invariants
    /// of every run: exit code 0 and a stdout made only of JSON-RPC frames.
    async fn finish(mut self) -> Finished {
        tokio::time::timeout(TIMEOUT, &mut self.stdout_done)
            .await
            .expect("acp-child closes stdout after stdin EOF")
            .unwrap();
        let status: ExitStatus = tokio::time::timeout(TIMEOUT, self.child.wait())
            .await
            .expect("acp-child exits after stdin EOF")
            .unwrap();
        let stderr = self.stderr.await.unwrap();
        assert_eq!(status.code(), Some(0), "exit status; stderr:\n{stderr}");
        let stdout = self.stdout_log.lock().unwrap().clone();
        for line in &stdout {
            let frame: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("stdout line is not JSON ({error}): {line}"));
            assert_eq!(frame["jsonrpc"], "2.0", "not a JSON-RPC frame: {line}");
            assert!(
                frame.get("id").is_some() || frame.get("method").is_some(),
                "not a JSON-RPC frame: {line}"
            );
        }
        Finished { stdout, stderr }
    }
}

/// Runs `main` against a fresh agent through the SDK client, after `initialize`; then closes the
/// agent's stdin (by ending the connection) and checks how it exited.
async fn with_agent<R>(
    main: impl AsyncFnOnce(ConnectionTo<Agent>, InitializeResponse) -> Result<R, AcpError>,
) -> (R, Finished) {
    let (spawned, stdin, lines) = spawn_agent();
    let sink = futures::sink::unfold(stdin, async |mut stdin: ChildStdin, line: String| {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let transport = Lines::new(Box::pin(sink), lines);
    // The transport, and with it the agent's stdin, is dropped when `connect_with` returns.
    let result = tokio::time::timeout(
        TIMEOUT,
        Client
            .v1()
            .connect_with(transport, async |cx: ConnectionTo<Agent>| {
                let init = cx
                    .send_request(InitializeRequest::new(ProtocolVersion::V1))
                    .block_task()
                    .await?;
                main(cx, init).await
            }),
    )
    .await
    .expect("the client session finished in time")
    .expect("the client session succeeded");
    (result, spawned.finish().await)
}

/// How the test client answers `session/request_permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// Select `allow-once`.
    Allow,
    /// Select `reject-once`.
    Reject,
    /// Answer with the `cancelled` outcome, without cancelling the turn.
    Dismiss,
    /// Send `session/cancel` first, then answer `cancelled`, as a client does when the user stops
    /// the turn while a permission prompt is open.
    CancelTurn,
    /// Fail the test if asked.
    NotExpected,
}

/// Everything the agent sent for one prompt turn.
#[derive(Debug, Default)]
struct TurnLog {
    text: String,
    updates: Vec<SessionUpdate>,
    permission_requests: Vec<RequestPermissionRequest>,
}

impl TurnLog {
    fn tool_calls(&self) -> Vec<&ToolCall> {
        self.updates
            .iter()
            .filter_map(|update| match update {
                SessionUpdate::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect()
    }

    fn tool_call_updates(&self) -> Vec<&ToolCallUpdate> {
        self.updates
            .iter()
            .filter_map(|update| match update {
                SessionUpdate::ToolCallUpdate(update) => Some(update),
                _ => None,
            })
            .collect()
    }

    /// The final status of the only tool call of the turn.
    fn final_status(&self) -> ToolCallStatus {
        let updates = self.tool_call_updates();
        let last = updates.last().expect("the tool call was updated");
        last.fields.status.expect("the last update sets a status")
    }
}

/// Reads the session's updates, answering permission requests with `reply`, until `stop_at`
/// matches an update (returns `None`) or the prompt response arrives (returns it).
async fn read_until(
    session: &mut ActiveSession<'static, Agent>,
    log: &mut TurnLog,
    reply: Reply,
    stop_at: impl Fn(&SessionUpdate) -> bool,
) -> Result<Option<Result<PromptResponse, AcpError>>, AcpError> {
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
                        let outcome = match reply {
                            Reply::Allow => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new("allow-once"),
                            ),
                            Reply::Reject => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new("reject-once"),
                            ),
                            Reply::Dismiss => RequestPermissionOutcome::Cancelled,
                            Reply::CancelTurn => {
                                connection
                                    .send_notification(CancelNotification::new(session_id))?;
                                RequestPermissionOutcome::Cancelled
                            }
                            Reply::NotExpected => panic!("unexpected permission request"),
                        };
                        responder.respond(RequestPermissionResponse::new(outcome))
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
async fn prompt(
    session: &mut ActiveSession<'static, Agent>,
    prompt: &str,
    reply: Reply,
) -> Result<(TurnLog, Result<PromptResponse, AcpError>), AcpError> {
    session.send_prompt(prompt)?;
    let mut log = TurnLog::default();
    let response = read_until(session, &mut log, reply, |_| false)
        .await?
        .expect("read_until stops only at the response");
    Ok((log, response))
}

async fn new_session(
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

fn stop_reason(response: Result<PromptResponse, AcpError>) -> StopReason {
    response.expect("the prompt succeeded").stop_reason
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap()
}

#[tokio::test]
async fn hello_gets_the_honest_offline_reply() {
    let dir = tempfile::tempdir().unwrap();
    let ((init, log, stop), _) = with_agent(async |cx, init| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) = prompt(&mut session, "hello", Reply::NotExpected).await?;
        Ok((init, log, stop_reason(response)))
    })
    .await;
    assert_eq!(init.protocol_version, ProtocolVersion::V1);
    assert!(!init.agent_capabilities.load_session);
    let info = init.agent_info.expect("agentInfo");
    assert_eq!(
        (info.name.as_str(), info.version.as_str()),
        ("acp-child", "0.1.0")
    );
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(log.text, NO_MODEL_REPLY);
    // Streamed: one chunk per line.
    let chunks = log
        .updates
        .iter()
        .filter(|update| matches!(update, SessionUpdate::AgentMessageChunk(_)))
        .count();
    assert_eq!(chunks, 3);
    // The offline commands are advertised when the session starts.
    let commands: Vec<&str> = log
        .updates
        .iter()
        .find_map(|update| match update {
            SessionUpdate::AvailableCommandsUpdate(update) => Some(&update.available_commands),
            _ => None,
        })
        .expect("available_commands_update")
        .iter()
        .map(|command| command.name.as_str())
        .collect();
    assert_eq!(commands, ["read", "write", "sleep"]);
}

#[tokio::test]
async fn write_with_allow_writes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ((log, stop), _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) =
            prompt(&mut session, "/write out.txt hello world", Reply::Allow).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(log.text, "wrote 11 bytes to out.txt");
    let target = canonical(dir.path()).join("out.txt");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello world");

    let calls = log.tool_calls();
    assert_eq!(calls.len(), 1);
    let call = calls[0];
    assert_eq!(call.title, "Write out.txt");
    assert_eq!(call.kind, ToolKind::Edit);
    assert_eq!(call.status, ToolCallStatus::Pending);
    assert_eq!(call.locations, vec![ToolCallLocation::new(&target)]);

    assert_eq!(log.permission_requests.len(), 1);
    let request = &log.permission_requests[0];
    assert_eq!(request.tool_call.tool_call_id, call.tool_call_id);
    let options: Vec<&str> = request
        .options
        .iter()
        .map(|option| option.option_id.0.as_ref())
        .collect();
    assert_eq!(options, ["allow-once", "reject-once"]);

    assert_eq!(log.final_status(), ToolCallStatus::Completed);
    let last = *log.tool_call_updates().last().unwrap();
    let content = last.fields.content.as_ref().expect("diff content");
    let [ToolCallContent::Diff(diff)] = content.as_slice() else {
        panic!("expected one diff, got {content:?}");
    };
    assert_eq!(
        (
            diff.path.as_path(),
            diff.new_text.as_str(),
            diff.old_text.as_deref()
        ),
        (target.as_path(), "hello world", None)
    );
}

#[tokio::test]
async fn write_without_permission_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let (turns, _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let mut turns = Vec::new();
        for reply in [Reply::Reject, Reply::Dismiss] {
            let (log, response) = prompt(&mut session, "/write out.txt hello", reply).await?;
            turns.push((reply, log, stop_reason(response)));
        }
        Ok(turns)
    })
    .await;
    for (reply, log, stop) in turns {
        assert_eq!(stop, StopReason::EndTurn, "{reply:?}");
        assert_eq!(
            log.text, "permission denied: did not write out.txt",
            "{reply:?}"
        );
        assert_eq!(log.permission_requests.len(), 1, "{reply:?}");
        assert_eq!(log.final_status(), ToolCallStatus::Failed, "{reply:?}");
    }
    assert!(!dir.path().join("out.txt").exists());
}

#[tokio::test]
async fn cancelling_while_asking_permission_cancels_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let ((log, stop), _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) =
            prompt(&mut session, "/write out.txt hello", Reply::CancelTurn).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    assert_eq!(stop, StopReason::Cancelled);
    assert_eq!(log.permission_requests.len(), 1);
    assert_eq!(log.final_status(), ToolCallStatus::Failed);
    assert!(!dir.path().join("out.txt").exists());
}

#[tokio::test]
async fn read_shows_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(dir.path().join("docs/notes.txt"), "line one\nline two\n").unwrap();
    let ((log, stop), _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) =
            prompt(&mut session, "/read docs/notes.txt", Reply::NotExpected).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(log.text, "line one\nline two\n");
    let calls = log.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].title, "Read docs/notes.txt");
    assert_eq!(calls[0].kind, ToolKind::Read);
    assert_eq!(
        calls[0].locations,
        vec![ToolCallLocation::new(
            canonical(dir.path()).join("docs/notes.txt")
        )]
    );
    assert_eq!(log.final_status(), ToolCallStatus::Completed);
}

#[tokio::test]
async fn paths_escaping_the_session_directory_are_refused() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("project");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(outer.path().join("secret.txt"), "secret").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(outer.path().join("secret.txt"), root.join("link.txt")).unwrap();
    let (turns, _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, &root).await?;
        let mut turns = Vec::new();
        for text in [
            "/read ../secret.txt",
            "/write ../evil.txt pwned",
            "/read link.txt",
        ] {
            if text.contains("link") && !cfg!(unix) {
                continue;
            }
            let (log, response) = prompt(&mut session, text, Reply::NotExpected).await?;
            turns.push((text, log, stop_reason(response)));
        }
        Ok(turns)
    })
    .await;
    let root = canonical(&root);
    let secret = canonical(&outer.path().join("secret.txt"));
    let expected = |text: &str| match text {
        "/read ../secret.txt" => format!(
            "refused: ../secret.txt is outside the session directory {}; use a path inside it",
            root.display()
        ),
        "/write ../evil.txt pwned" => format!(
            "refused: ../evil.txt is outside the session directory {}; use a path inside it",
            root.display()
        ),
        _ => format!(
            "refused: link.txt resolves through a symlink to {}, outside the session directory {}; use a path inside it",
            secret.display(),
            root.display()
        ),
    };
    for (text, log, stop) in turns {
        assert_eq!(stop, StopReason::EndTurn, "{text}");
        assert_eq!(log.text, expected(text), "{text}");
        assert!(log.permission_requests.is_empty(), "{text}");
        assert_eq!(log.final_status(), ToolCallStatus::Failed, "{text}");
    }
    assert!(!outer.path().join("evil.txt").exists());
    assert_eq!(
        std::fs::read_to_string(outer.path().join("secret.txt")).unwrap(),
        "secret"
    );
}

#[tokio::test]
async fn sleep_replies_and_bad_commands_get_usage() {
    let dir = tempfile::tempdir().unwrap();
    let (turns, _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let mut turns = Vec::new();
        for text in [
            "/sleep 0",
            "/frobnicate",
            "/sleep soon",
            "/write only-a-path",
        ] {
            let (log, response) = prompt(&mut session, text, Reply::NotExpected).await?;
            turns.push((log.text, stop_reason(response)));
        }
        Ok(turns)
    })
    .await;
    let expected = [
        "slept 0 s",
        "unknown command /frobnicate. Offline commands: /read PATH, /write PATH TEXT, /sleep SECONDS.",
        "usage: /sleep SECONDS (SECONDS must be a whole number from 0 to 3600)",
        "usage: /write PATH TEXT (missing TEXT)",
    ];
    for ((text, stop), expected) in turns.into_iter().zip(expected) {
        assert_eq!(stop, StopReason::EndTurn);
        assert_eq!(text, expected);
    }
}

#[tokio::test]
async fn sleep_is_cancelled_promptly_while_other_sessions_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let ((busy, other_text, cancel_to_response, stop, log), _) = with_agent(async |cx, _| {
        let mut sleeper = new_session(&cx, dir.path()).await?;
        let mut other = new_session(&cx, dir.path()).await?;
        sleeper.send_prompt("/sleep 30")?;
        let mut log = TurnLog::default();
        let early = read_until(&mut sleeper, &mut log, Reply::NotExpected, |update| {
            matches!(update, SessionUpdate::ToolCall(_))
        })
        .await?;
        assert!(early.is_none(), "the sleep ended before it was cancelled");

        // The dispatch loop is free while the turn sleeps: another session is served ...
        let (other_log, other_response) = prompt(&mut other, "hello", Reply::NotExpected).await?;
        assert_eq!(stop_reason(other_response), StopReason::EndTurn);
        // ... and a second prompt on the busy session is refused at once.
        sleeper.send_prompt("hello")?;
        let busy = read_until(&mut sleeper, &mut log, Reply::NotExpected, |_| false)
            .await?
            .expect("a response");

        let cancelled_at = Instant::now();
        cx.send_notification(CancelNotification::new(sleeper.session_id().clone()))?;
        let response = read_until(&mut sleeper, &mut log, Reply::NotExpected, |_| false)
            .await?
            .expect("a response");
        Ok((
            busy,
            other_log.text,
            cancelled_at.elapsed(),
            stop_reason(response),
            log,
        ))
    })
    .await;
    let busy = busy.expect_err("the second prompt is refused");
    assert_eq!(busy.code, ErrorCode::INVALID_REQUEST);
    assert_eq!(
        busy.message,
        "session/prompt: session sess-1 already has a prompt in flight; wait for its response or send session/cancel first"
    );
    assert_eq!(other_text, NO_MODEL_REPLY);
    assert_eq!(stop, StopReason::Cancelled);
    assert!(
        cancel_to_response < Duration::from_secs(10),
        "cancel took {cancel_to_response:?} against a 30 s sleep"
    );
    assert_eq!(log.tool_calls()[0].title, "Sleep 30 s");
    assert_eq!(log.final_status(), ToolCallStatus::Failed);
    assert_eq!(log.text, "");
}

#[tokio::test]
async fn two_sessions_work_in_their_own_directories() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    std::fs::write(first.path().join("name.txt"), "first").unwrap();
    std::fs::write(second.path().join("name.txt"), "second").unwrap();
    let (ids_and_texts, _) = with_agent(async |cx, _| {
        let mut a = new_session(&cx, first.path()).await?;
        let mut b = new_session(&cx, second.path()).await?;
        let (log_b, _) = prompt(&mut b, "/read name.txt", Reply::NotExpected).await?;
        let (log_a, _) = prompt(&mut a, "/read name.txt", Reply::NotExpected).await?;
        Ok([
            (a.session_id().0.to_string(), log_a.text),
            (b.session_id().0.to_string(), log_b.text),
        ])
    })
    .await;
    assert_eq!(
        ids_and_texts,
        [
            ("sess-1".to_owned(), "first".to_owned()),
            ("sess-2".to_owned(), "second".to_owned())
        ]
    );
}

#[tokio::test]
async fn session_new_requires_an_absolute_existing_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let (errors, _) = with_agent(async |cx, _| {
        let mut errors = Vec::new();
        for cwd in [Path::new("relative/dir"), missing.as_path()] {
            let error = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await
                .expect_err("session/new is refused");
            errors.push(error);
        }
        Ok(errors)
    })
    .await;
    assert_eq!(errors[0].code, ErrorCode::INVALID_PARAMS);
    assert_eq!(
        errors[0].message,
        "session/new: session directory relative/dir is not an absolute path; ACP clients must send an absolute cwd in session/new"
    );
    assert_eq!(errors[1].code, ErrorCode::INVALID_PARAMS);
    assert!(
        errors[1].message.starts_with(&format!(
            "session/new: cannot open session directory {}; pass an existing directory as cwd: ",
            missing.display()
        )),
        "{}",
        errors[1].message
    );
}

#[tokio::test]
async fn logs_go_to_stderr_and_stdout_carries_only_frames() {
    let dir = tempfile::tempdir().unwrap();
    let ((), finished) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (_, response) = prompt(&mut session, "hello", Reply::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(())
    })
    .await;
    // `finish` already parsed every stdout line as JSON-RPC; debug logs went to stderr.
    assert!(
        finished.stderr.contains("session created"),
        "stderr:\n{}",
        finished.stderr
    );
    assert!(finished.stdout.len() >= 6, "{:?}", finished.stdout);
    assert!(
        !finished
            .stdout
            .iter()
            .any(|line| line.contains("session created"))
    );
}

/// Raw NDJSON: closing stdin in the middle of a turn still ends the agent with code 0.
#[tokio::test]
async fn stdin_eof_exits_zero_even_mid_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (spawned, mut stdin, mut lines) = spawn_agent();
    let cwd = serde_json::to_string(&canonical(dir.path())).unwrap();
    let frames = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#.to_owned(),
        format!(r#"{{"jsonrpc":"2.0","id":2,"method":"session/new","params":{{"cwd":{cwd},"mcpServers":[]}}}}"#),
        r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"sess-1","prompt":[{"type":"text","text":"/sleep 30"}]}}"#.to_owned(),
    ];
    // A client waits for each response (the SDK refuses `session/new` before `initialize` is
    // answered); for the prompt, it waits for the sleep's tool call instead.
    let waits = ["response", "response", "tool_call"];
    for (frame, wait) in frames.iter().zip(waits) {
        stdin.write_all(frame.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
        tokio::time::timeout(TIMEOUT, async {
            while let Some(line) = lines.next().await {
                let frame: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
                assert!(frame.get("error").is_none(), "{frame}");
                let seen = if wait == "response" {
                    frame.get("result").is_some()
                } else {
                    frame["params"]["update"]["sessionUpdate"] == wait
                };
                if seen {
                    return;
                }
            }
            panic!("stdout closed while waiting for a {wait}");
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for a {wait}"));
    }
    drop(stdin);
    let started = Instant::now();
    let finished = spawned.finish().await;
    assert!(started.elapsed() < Duration::from_secs(10));
    // initialize, session/new, available commands, the tool call; the abandoned turn is not
    // answered (nobody is listening once stdin is closed).
    assert_eq!(finished.stdout.len(), 4, "{:?}", finished.stdout);
}

/// Closing stdin before any frame is a clean exit too.
#[tokio::test]
async fn stdin_eof_before_any_frame_exits_zero() {
    let (spawned, stdin, _lines) = spawn_agent();
    drop(stdin);
    let finished = spawned.finish().await;
    assert!(finished.stdout.is_empty());
}

#[test]
fn version_and_help_describe_the_agent() {
    assert_cmd::Command::new(acp_child_bin())
        .arg("--version")
        .assert()
        .success()
        .stdout("acp-child 0.1.0\n");
    let help = assert_cmd::Command::new(acp_child_bin())
        .arg("--help")
        .assert()
        .success();
    let help = String::from_utf8(help.get_output().stdout.clone()).unwrap();
    for needle in [
        "ACP agent speaking JSON-RPC (ACP v1) on stdin/stdout",
        "launched by an ACP client such as Zed or acp-host",
        "/read PATH",
        "/write PATH TEXT",
        "/sleep SECONDS",
        "ACP_CHILD_LOG",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}
