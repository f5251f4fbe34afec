//! End-to-end tests of the `acp-child` agent's offline backend: the real binary over real pipes.
//!
//! Most tests drive it with the ACP SDK's client side through [`acp_tests::acp_client`], which
//! records every stdout line and then checks that stdout carried only JSON-RPC frames and that the
//! agent exited with code 0 once its stdin closed. One test speaks raw NDJSON to close stdin in
//! the middle of a turn. The model backend has its own suite, `acp_child_model.rs`.
//!
//! No fixed sleeps: tests wait for protocol events (a tool call, a response, EOF), each wait
//! bounded by [`TIMEOUT`].

use std::path::Path;
use std::time::{Duration, Instant};

use acp_tests::acp_client::{
    Answers, Launch, PERMISSION_ERROR, Permission, TIMEOUT, TurnLog, canonical, new_session,
    prompt, prompt_ends, read_until, spawn_agent, stop_reason, with_agent, with_launch,
};
use acp_tests::bin;
use agent_client_protocol::ErrorCode;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, NewSessionRequest, SessionUpdate, StopReason, ToolCallContent,
    ToolCallLocation, ToolCallStatus, ToolKind,
};
use futures::StreamExt as _;
use tokio::io::AsyncWriteExt as _;

/// The reply to plain text, exactly.
const NO_MODEL_REPLY: &str = "No model is configured: acp-child is running its offline backend and cannot answer free-form prompts.\n\
To use a model, start it with --model NAME and a key in ACP_CHILD_API_KEY (or DEEPSEEK_API_KEY / OPENAI_API_KEY), or --base-url for a local server.\n\
Offline commands that work now: /read PATH, /write PATH TEXT, /sleep SECONDS, /delegate NAME PROMPT.\n";

#[tokio::test]
async fn hello_gets_the_honest_offline_reply() {
    let dir = tempfile::tempdir().unwrap();
    let ((init, log, stop), _) = with_agent(async |cx, init| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) = prompt(&mut session, "hello", Permission::NotExpected).await?;
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
    assert_eq!(commands, ["read", "write", "sleep", "delegate"]);
}

#[tokio::test]
async fn write_with_allow_writes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ((log, stop), _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) = prompt(
            &mut session,
            "/write out.txt hello world",
            Permission::Allow,
        )
        .await?;
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
        for reply in [Permission::Reject, Permission::Dismiss] {
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
async fn a_permission_request_the_client_answers_with_an_error_rejects_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let ((log, stop), finished) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) =
            prompt(&mut session, "/write out.txt hello", Permission::Fail).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    let reason = format!(
        "the client answered the permission request with an error ({PERMISSION_ERROR}); the call was not run"
    );
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(log.text, format!("did not write out.txt: {reason}"));
    let updates = log.tool_call_updates();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].fields.status, Some(ToolCallStatus::Failed));
    assert_eq!(
        updates[0].fields.content,
        Some(vec![ToolCallContent::from(reason)])
    );
    assert!(!dir.path().join("out.txt").exists());
    assert!(
        !finished.stderr.contains("client connection failed")
            && finished
                .stderr
                .contains("the client answered a permission request with an error"),
        "{}",
        finished.stderr
    );
}

#[tokio::test]
async fn tool_call_ids_are_unique_across_the_turns_of_a_session() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "A").unwrap();
    let (ids, _) = with_agent(async |cx, _| {
        let mut sessions = [
            new_session(&cx, dir.path()).await?,
            new_session(&cx, dir.path()).await?,
        ];
        let mut ids = Vec::new();
        for which in [0, 0, 1, 0] {
            let session = &mut sessions[which];
            let (log, _) = prompt(session, "/read a.txt", Permission::NotExpected).await?;
            let update_ids: Vec<String> = log
                .tool_call_updates()
                .iter()
                .map(|update| update.tool_call_id.0.to_string())
                .collect();
            assert_eq!(update_ids.len(), 1);
            let call_id = log.tool_calls()[0].tool_call_id.0.to_string();
            assert_eq!(
                update_ids[0], call_id,
                "the update names the announced call"
            );
            ids.push(call_id);
        }
        Ok(ids)
    })
    .await;
    // Unique within each session; each session counts on its own.
    assert_eq!(ids, ["call-1", "call-2", "call-1", "call-3"]);
}

#[tokio::test]
async fn cancelling_while_asking_permission_cancels_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let ((log, stop), _) = with_agent(async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let (log, response) =
            prompt(&mut session, "/write out.txt hello", Permission::CancelTurn).await?;
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
        let (log, response) = prompt(
            &mut session,
            "/read docs/notes.txt",
            Permission::NotExpected,
        )
        .await?;
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
            let (log, response) = prompt(&mut session, text, Permission::NotExpected).await?;
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
            let (log, response) = prompt(&mut session, text, Permission::NotExpected).await?;
            turns.push((log.text, stop_reason(response)));
        }
        Ok(turns)
    })
    .await;
    let expected = [
        "slept 0 s",
        "unknown command /frobnicate. Offline commands: /read PATH, /write PATH TEXT, /sleep SECONDS, /delegate NAME PROMPT.",
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
        let early = read_until(&mut sleeper, &mut log, Permission::NotExpected, |update| {
            matches!(update, SessionUpdate::ToolCall(_))
        })
        .await?;
        assert!(early.is_none(), "the sleep ended before it was cancelled");

        // The dispatch loop is free while the turn sleeps: another session is served ...
        let (other_log, other_response) =
            prompt(&mut other, "hello", Permission::NotExpected).await?;
        assert_eq!(stop_reason(other_response), StopReason::EndTurn);
        // ... and a second prompt on the busy session is refused at once.
        sleeper.send_prompt("hello")?;
        let busy = read_until(&mut sleeper, &mut log, Permission::NotExpected, |_| false)
            .await?
            .expect("a response");

        let cancelled_at = Instant::now();
        cx.send_notification(CancelNotification::new(sleeper.session_id().clone()))?;
        let response = read_until(&mut sleeper, &mut log, Permission::NotExpected, |_| false)
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
        let (log_b, _) = prompt(&mut b, "/read name.txt", Permission::NotExpected).await?;
        let (log_a, _) = prompt(&mut a, "/read name.txt", Permission::NotExpected).await?;
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
        let (_, response) = prompt(&mut session, "hello", Permission::NotExpected).await?;
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
    let (spawned, mut stdin, mut lines) = spawn_agent(&[]);
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
    let (spawned, stdin, _lines) = spawn_agent(&[]);
    drop(stdin);
    let finished = spawned.finish().await;
    assert!(finished.stdout.is_empty());
}

#[test]
fn version_and_help_describe_the_agent() {
    assert_cmd::Command::new(bin("acp-child"))
        .arg("--version")
        .assert()
        .success()
        .stdout(format!(
            "acp-child {}\n",
            acp_host::version_text(env!("CARGO_PKG_VERSION"))
        ));
    let help = assert_cmd::Command::new(bin("acp-child"))
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

#[tokio::test]
async fn read_and_write_go_through_a_client_that_offers_fs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "on-disk text").unwrap();
    let root = canonical(dir.path());
    let editor =
        Answers::editor(Permission::Allow).buffer(root.join("notes.txt"), "unsaved buffer");
    let launch = Launch::offline().client_fs(true, true);
    let ((read, write), _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, dir.path()).await?;
        let read = prompt_ends(&mut session, "/read notes.txt", editor.clone()).await?;
        let write = prompt_ends(&mut session, "/write notes.txt edited", editor).await?;
        Ok((read, write))
    })
    .await;
    // The reply is the editor's buffer, not the disk.
    assert_eq!(read.text, "unsaved buffer");
    let reads: Vec<_> = read.reads.iter().map(|r| r.path.clone()).collect();
    assert_eq!(reads, [root.join("notes.txt")]);
    // The write is shown against the buffer and sent to the client; the disk is untouched.
    assert_eq!(write.text, "wrote 6 bytes to notes.txt");
    let writes: Vec<_> = write
        .writes
        .iter()
        .map(|w| (w.path.clone(), w.content.clone()))
        .collect();
    assert_eq!(writes, [(root.join("notes.txt"), "edited".to_owned())]);
    let [asked] = write.permission_requests.as_slice() else {
        panic!("{:?}", write.permission_requests);
    };
    let content = asked
        .tool_call
        .fields
        .content
        .as_deref()
        .unwrap_or_default();
    let [ToolCallContent::Diff(diff)] = content else {
        panic!("expected one diff, got {content:?}");
    };
    assert_eq!(diff.old_text.as_deref(), Some("unsaved buffer"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "on-disk text"
    );
}

/// Drives one turn over raw NDJSON on `stdin` (acp-child's stdin pipe), reading `lines` (its
/// stdout): initialize, session/new in `dir`, the offline reply to `hello`; returns once the
/// prompt is answered.
fn one_raw_turn(
    stdin: &mut impl std::io::Write,
    lines: &std::sync::mpsc::Receiver<String>,
    dir: &Path,
) {
    let cwd = serde_json::to_string(&canonical(dir)).unwrap();
    let frames = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#.to_owned(),
        format!(r#"{{"jsonrpc":"2.0","id":2,"method":"session/new","params":{{"cwd":{cwd},"mcpServers":[]}}}}"#),
        r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"sess-1","prompt":[{"type":"text","text":"hello"}]}}"#.to_owned(),
    ];
    for (id, frame) in (1..).zip(frames) {
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
        loop {
            let line = lines.recv_timeout(TIMEOUT).expect("an answer in time");
            let frame: serde_json::Value = serde_json::from_str(&line).unwrap();
            if frame["id"] == id {
                assert!(frame.get("result").is_some(), "{frame}");
                break;
            }
        }
    }
}

/// Starts acp-child on `child_stdin` and `child_stdout` (stderr piped), drives one turn through
/// `stdin` and `stdout` (the test's ends), and checks it serves on two threads: its stdio polled,
/// with no blocking thread of tokio's. The lines channel stays, so stdout is read to its end.
fn polled_turn(
    child_stdin: impl Into<std::process::Stdio>,
    child_stdout: impl Into<std::process::Stdio>,
    stdout: impl std::io::Read + Send + 'static,
    stdin: &mut impl std::io::Write,
    dir: &Path,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let child = std::process::Command::new(bin("acp-child"))
        .stdin(child_stdin)
        .stdout(child_stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = acp_tests::line_channel(stdout);
    one_raw_turn(stdin, &lines, dir);
    assert_eq!(acp_tests::thread_names(child.id()), ["acp-child", "serve"]);
    (child, lines)
}

fn nonblocking(fd: &impl std::os::fd::AsFd) -> bool {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd, FcntlArg::F_GETFL).unwrap();
    OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK)
}

/// Over pipes (as acp-host and editors start it), acp-child polls its stdin and stdout on its
/// runtime: no thread besides the main one and the one that serves. The non-blocking flag it set
/// on the pipes' shared file descriptions is put back when it ends.
#[test]
fn over_pipes_stdio_is_polled_on_the_runtime_and_the_flags_are_put_back() {
    let dir = tempfile::tempdir().unwrap();
    let (stdin_read, mut stdin) = std::io::pipe().unwrap();
    let (stdout, stdout_write) = std::io::pipe().unwrap();
    // The test keeps a copy of each of the child's ends: one file description each, shared.
    let (stdin_kept, stdout_kept) = (
        stdin_read.try_clone().unwrap(),
        stdout_write.try_clone().unwrap(),
    );
    let (child, _lines) = polled_turn(stdin_read, stdout_write, stdout, &mut stdin, dir.path());
    assert!(nonblocking(&stdin_kept) && nonblocking(&stdout_kept));
    drop(stdin);
    let finished = acp_tests::wait_output(child);
    assert!(
        finished.status.success(),
        "{}",
        acp_tests::stderr(&finished)
    );
    assert!(!nonblocking(&stdin_kept) && !nonblocking(&stdout_kept));
}

/// With stderr on the same pipe as stdout (`2>&1`), stdout stays blocking: a non-blocking write
/// end would make stderr's writes fail once the pipe is full. The session works all the same.
#[test]
fn with_stderr_on_the_stdout_pipe_stdio_stays_blocking_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (stdin_read, mut stdin) = std::io::pipe().unwrap();
    let (stdout, stdout_write) = std::io::pipe().unwrap();
    let kept = stdout_write.try_clone().unwrap();
    let child = std::process::Command::new(bin("acp-child"))
        .stdin(stdin_read)
        .stderr(stdout_write.try_clone().unwrap())
        .stdout(stdout_write)
        .spawn()
        .unwrap();
    // stderr's log lines are not JSON; `one_raw_turn` reads past them.
    let frames = acp_tests::line_channel(stdout);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in frames.iter().filter(|line| line.starts_with('{')) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    one_raw_turn(&mut stdin, &lines, dir.path());
    assert!(!nonblocking(&kept));
    drop(stdin);
    assert!(acp_tests::wait_output(child).status.success());
}

/// Over Unix sockets (libuv, hence Neovim, hands a child one socketpair per stdio stream), stdin
/// and stdout are polled too, and a turn works.
#[test]
fn over_unix_sockets_stdio_is_polled_on_the_runtime() {
    use std::os::unix::net::UnixStream;
    let dir = tempfile::tempdir().unwrap();
    let (mut stdin, child_stdin) = UnixStream::pair().unwrap();
    let (stdout, child_stdout) = UnixStream::pair().unwrap();
    let kept = child_stdout.try_clone().unwrap();
    let (child, _lines) = polled_turn(
        std::os::fd::OwnedFd::from(child_stdin),
        std::os::fd::OwnedFd::from(child_stdout),
        stdout,
        &mut stdin,
        dir.path(),
    );
    assert!(nonblocking(&kept));
    // EOF on the socket ends the connection, as on a pipe.
    stdin.shutdown(std::net::Shutdown::Write).unwrap();
    let finished = acp_tests::wait_output(child);
    assert!(
        finished.status.success(),
        "{}",
        acp_tests::stderr(&finished)
    );
    assert!(!nonblocking(&kept));
}
