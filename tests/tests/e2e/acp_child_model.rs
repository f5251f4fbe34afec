//! Protocol-level end-to-end tests of `acp-child`'s model backend: the real binary over real pipes,
//! driven by the SDK's client side ([`acp_tests::acp_client`]), with the scripted mock
//! OpenAI-compatible server ([`acp_tests::mock_llm`]) standing in for the model.
//!
//! What only the protocol level can show, and the `acp-host` suite (`model.rs`) cannot: session
//! persistence and `session/load` across processes, file access routed through a client that
//! advertises `fs` (and withdrawn with `$/cancel_request` on cancel), several sessions (busy,
//! cancelled) on one connection, path confinement before any read, the exact frames on stdout, and
//! stdin closing in the middle of a command. Every run also checks that stdout carried only
//! JSON-RPC frames and that the agent exited with code 0 on stdin EOF.
//!
//! No fixed sleeps: tests wait for protocol events (an update, a response), each bounded by
//! [`acp_tests::acp_client::TIMEOUT`]; the mock's records are read once the responses that imply
//! them have arrived.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use acp_tests::acp_client::{
    Answers, Launch, PERMISSION_ERROR, Permission, TIMEOUT, TurnLog, canonical, load_session,
    new_session, prompt, prompt_ends, read_until, stop_reason, with_launch,
};
use acp_tests::mock_llm::{MockLlm, RecordedRequest, Reply, message_text};
use agent_client_protocol::ErrorCode;
use agent_client_protocol::util::MatchDispatch;
use agent_client_protocol::v1::SessionMessage;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, ContentChunk, LoadSessionRequest, ReadTextFileRequest,
    ReadTextFileResponse, SessionId, SessionUpdate, StopReason, TextContent, ToolCall,
    ToolCallContent, ToolCallLocation, ToolCallStatus, ToolKind,
};
use serde_json::{Value, json};

use super::common::temp;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn text_chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
}

fn user_chunk(text: &str) -> SessionUpdate {
    SessionUpdate::UserMessageChunk(text_chunk(text))
}

fn agent_chunk(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(text_chunk(text))
}

/// The conversation of a model request after the system prompt: `(role, text)` per message,
/// with an assistant message carrying tool calls as `assistant+tool_calls:<id>,...` and a tool
/// result as `tool:<id>`.
fn conversation(request: &RecordedRequest) -> Vec<(String, String)> {
    request.messages()[1..]
        .iter()
        .map(|message| {
            let role = message["role"].as_str().unwrap_or_default();
            let role = match (role, message["tool_calls"].as_array()) {
                ("assistant", Some(calls)) if !calls.is_empty() => {
                    let ids: Vec<&str> = calls.iter().filter_map(|c| c["id"].as_str()).collect();
                    format!("assistant+tool_calls:{}", ids.join(","))
                }
                ("tool", _) => format!("tool:{}", message["tool_call_id"].as_str().unwrap()),
                _ => role.to_owned(),
            };
            (role, message_text(message))
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(role, text)| ((*role).to_owned(), (*text).to_owned()))
        .collect()
}

/// The text of a model request's system prompt.
fn system_prompt(request: &RecordedRequest) -> String {
    let system = &request.messages()[0];
    assert_eq!(system["role"], "system");
    message_text(system)
}

/// The result the model received for tool call `id`.
fn tool_result(request: &RecordedRequest, id: &str) -> String {
    assert!(
        request.tool_call_precedes_result(id),
        "{id} is not announced before its result: {}",
        request.body
    );
    request
        .tool_result(id)
        .unwrap_or_else(|| panic!("no tool result for {id}: {}", request.body))
}

/// The final status of every tool call update that sets one, in order.
fn statuses(log: &TurnLog) -> Vec<ToolCallStatus> {
    log.tool_call_updates()
        .iter()
        .filter_map(|update| update.fields.status)
        .collect()
}

/// `(session, path)` of every `fs/read_text_file` the client answered, checking it asked for
/// the whole file.
fn reads_of(log: &TurnLog) -> Vec<(SessionId, PathBuf)> {
    log.reads
        .iter()
        .map(|read| {
            assert_eq!((read.line, read.limit), (None, None), "{read:?}");
            (read.session_id.clone(), read.path.clone())
        })
        .collect()
}

/// `(session, path, content)` of every `fs/write_text_file` the client received.
fn writes_of(log: &TurnLog) -> Vec<(SessionId, PathBuf, String)> {
    log.writes
        .iter()
        .map(|write| {
            (
                write.session_id.clone(),
                write.path.clone(),
                write.content.clone(),
            )
        })
        .collect()
}

/// `(tool call id, path, old text, new text)` of the diff each permission request shows.
fn asked_diffs(log: &TurnLog) -> Vec<(String, PathBuf, Option<String>, String)> {
    log.permission_requests
        .iter()
        .map(|request| {
            let content = request
                .tool_call
                .fields
                .content
                .as_deref()
                .unwrap_or_default();
            let [ToolCallContent::Diff(diff)] = content else {
                panic!("expected one diff, got {content:?}");
            };
            (
                request.tool_call.tool_call_id.0.to_string(),
                diff.path.clone(),
                diff.old_text.clone(),
                diff.new_text.clone(),
            )
        })
        .collect()
}

/// `(sessionUpdate, text)` of a `session/update` notification frame.
fn update_of(frame: &Value) -> Option<(String, String)> {
    (frame["method"] == "session/update").then(|| {
        let update = &frame["params"]["update"];
        (
            update["sessionUpdate"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            update["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    })
}

// ---------------------------------------------------------------------------------------------
// session/load across processes
// ---------------------------------------------------------------------------------------------

const FIRST_PROMPT: &str = "what is the first answer?";
const SECOND_PROMPT: &str = "and the second?";

#[tokio::test]
async fn session_load_in_a_new_process_replays_the_conversation_then_continues_it() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::text(["first ", "answer"]),
        Reply::text(["second answer"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());

    // Process A: one turn, then stdin closes.
    let ((id, first), _) = with_launch(launch.clone(), async |cx, init| {
        assert!(init.agent_capabilities.load_session);
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, FIRST_PROMPT, Permission::NotExpected).await?;
        Ok((session.session_id().clone(), log))
    })
    .await;
    assert_eq!(first.text, "first answer");
    assert_eq!(
        first.updates,
        [agent_chunk("first "), agent_chunk("answer")]
    );
    let id_text = id.0.to_string();
    assert!(id_text.starts_with("sess-"), "{id_text}");
    assert!(state.path().join(format!("{id_text}.jsonl")).is_file());

    // Process B, same state directory: load, then a second turn.
    let ((load_session, second), finished) = with_launch(launch, async |cx, init| {
        let mut session = load_session(&cx, id.clone(), cwd.path()).await?;
        let log = prompt_ends(&mut session, SECOND_PROMPT, Permission::NotExpected).await?;
        Ok((init.agent_capabilities.load_session, log))
    })
    .await;
    assert!(load_session, "loadSession is advertised with a model");
    // The replay (one chunk per saved message), then the new turn.
    assert_eq!(
        second.updates,
        [
            user_chunk(FIRST_PROMPT),
            agent_chunk("first answer"),
            agent_chunk("second answer")
        ]
    );

    // On the wire, the replay came before the session/load response, and nothing else did.
    let frames = finished.frames();
    let load_id = finished.sent_request_id("session/load");
    let answered = frames
        .iter()
        .position(|frame| frame["id"] == load_id && frame.get("result").is_some())
        .expect("session/load was answered");
    let before: Vec<(String, String)> = frames[..answered]
        .iter()
        .filter_map(|frame| {
            let update = update_of(frame)?;
            assert_eq!(frame["params"]["sessionId"], id_text.as_str());
            Some(update)
        })
        .collect();
    assert_eq!(
        before,
        pairs(&[
            ("user_message_chunk", FIRST_PROMPT),
            ("agent_message_chunk", "first answer")
        ])
    );

    // The model saw the whole conversation, in order.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        conversation(&requests[1]),
        pairs(&[
            ("user", FIRST_PROMPT),
            ("assistant", "first answer"),
            ("user", SECOND_PROMPT)
        ])
    );
    assert_eq!(system_prompt(&requests[0]), system_prompt(&requests[1]));
}

#[tokio::test]
async fn session_load_replays_a_tool_call_with_its_result() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("notes.txt"), "remember the milk").unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 3),
        Reply::text(["The note says: remember the milk."]),
        Reply::text(["You are welcome."]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (id, _) = with_launch(launch.clone(), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "read my notes", Permission::NotExpected).await?;
        assert_eq!(log.final_status(), ToolCallStatus::Completed);
        Ok(session.session_id().clone())
    })
    .await;

    let (log, _) = with_launch(launch, async |cx, _| {
        let mut session = load_session(&cx, id.clone(), cwd.path()).await?;
        let log = prompt_ends(&mut session, "thanks", Permission::NotExpected).await?;
        Ok(log)
    })
    .await;
    let notes = canonical(cwd.path()).join("notes.txt");
    let replayed_call = ToolCall::new("call_read_1", "Read notes.txt")
        .kind(ToolKind::Read)
        .status(ToolCallStatus::Completed)
        .locations(vec![ToolCallLocation::new(&notes)])
        .raw_input(json!({"path": "notes.txt"}))
        .content(vec!["remember the milk".into()]);
    assert_eq!(
        log.updates,
        [
            user_chunk("read my notes"),
            SessionUpdate::ToolCall(replayed_call),
            agent_chunk("The note says: remember the milk."),
            agent_chunk("You are welcome."),
        ]
    );
    // The continued conversation carries the call and its result where the model put them.
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        conversation(&requests[2]),
        pairs(&[
            ("user", "read my notes"),
            ("assistant+tool_calls:call_read_1", ""),
            ("tool:call_read_1", "remember the milk"),
            ("assistant", "The note says: remember the milk."),
            ("user", "thanks"),
        ])
    );
}

#[tokio::test]
async fn session_load_of_an_unknown_bad_or_open_session_is_a_clear_error() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(Vec::new());
    let launch = Launch::model(&llm.base_url(), state.path());
    let (errors, _) = with_launch(launch, async |cx, _| {
        let open = new_session(&cx, cwd.path()).await?;
        let mut errors = Vec::new();
        for id in [
            SessionId::new("sess-0123456789abcdef"),
            SessionId::new("../escape"),
            open.session_id().clone(),
        ] {
            let error = cx
                .send_request(LoadSessionRequest::new(id, cwd.path()))
                .block_task()
                .await
                .expect_err("session/load is refused");
            errors.push((error.code, error.message, open.session_id().0.to_string()));
        }
        Ok(errors)
    })
    .await;
    let open_id = &errors[2].2;
    let expected = [
        (
            ErrorCode::RESOURCE_NOT_FOUND,
            format!(
                "session/load: unknown session sess-0123456789abcdef: no saved session in {}; create one with session/new",
                state.path().display()
            ),
        ),
        (
            ErrorCode::INVALID_PARAMS,
            "session/load: invalid session id \"../escape\": session ids are letters, digits, '-' and '_' (as returned by session/new)".to_owned(),
        ),
        (
            ErrorCode::INVALID_REQUEST,
            format!("session/load: session {open_id} is already open on this connection; keep using it"),
        ),
    ];
    let got: Vec<(ErrorCode, String)> = errors
        .into_iter()
        .map(|(code, message, _)| (code, message))
        .collect();
    assert_eq!(got, expected);
    assert!(llm.requests().is_empty(), "no model request was made");
}

// ---------------------------------------------------------------------------------------------
// File access through a client that advertises fs
// ---------------------------------------------------------------------------------------------

/// The model's side of the editor test: read, write, edit, a read the editor refuses, done.
fn editor_script() -> Vec<Reply> {
    vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 3),
        Reply::tool_call(
            "call_write_1",
            "write_file",
            &json!({"path": "out.txt", "content": "via client"}),
            2,
        ),
        Reply::tool_call(
            "call_edit_1",
            "edit_file",
            &json!({"path": "notes.txt", "old_text": "unsaved", "new_text": "edited"}),
            2,
        ),
        Reply::tool_call(
            "call_read_2",
            "read_file",
            &json!({"path": "closed.txt"}),
            1,
        ),
        Reply::text(["done"]),
    ]
}

#[tokio::test]
async fn a_client_with_fs_serves_reads_and_edits_from_its_buffers_and_receives_the_writes() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("notes.txt"), "on-disk text").unwrap();
    std::fs::write(cwd.path().join("closed.txt"), "the editor refuses this one").unwrap();
    let root = canonical(cwd.path());
    let llm = MockLlm::start(editor_script());
    let launch = Launch::model(&llm.base_url(), state.path()).client_fs(true, true);
    let editor =
        Answers::editor(Permission::Allow).buffer(root.join("notes.txt"), "unsaved buffer text");
    let ((log, session_id), _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "use the editor", editor).await?;
        Ok((log, session.session_id().clone()))
    })
    .await;
    assert_eq!(log.text, "done");
    let requests = llm.requests();
    assert_eq!(requests.len(), 5);

    // Reads go to the client by absolute path inside the session directory, and see the buffer:
    // notes.txt for read_file, then again for edit_file; the editor refuses closed.txt.
    let at = |name: &str| (session_id.clone(), root.join(name));
    assert_eq!(
        reads_of(&log),
        [at("notes.txt"), at("notes.txt"), at("closed.txt")]
    );
    assert_eq!(
        tool_result(&requests[1], "call_read_1"),
        "unsaved buffer text"
    );
    assert_eq!(
        tool_result(&requests[4], "call_read_2"),
        format!(
            "the client could not read closed.txt: no buffer for {}",
            root.join("closed.txt").display()
        )
    );

    // Each write is approved once, shown as a diff against the buffer, and sent to the client.
    let diff = |id: &str, name: &str, old: Option<&str>, new: &str| {
        (
            id.to_owned(),
            root.join(name),
            old.map(str::to_owned),
            new.to_owned(),
        )
    };
    assert_eq!(
        asked_diffs(&log),
        [
            diff("call_write_1", "out.txt", None, "via client"),
            diff(
                "call_edit_1",
                "notes.txt",
                Some("unsaved buffer text"),
                "edited buffer text"
            ),
        ]
    );
    let wrote =
        |name: &str, content: &str| (session_id.clone(), root.join(name), content.to_owned());
    assert_eq!(
        writes_of(&log),
        [
            wrote("out.txt", "via client"),
            wrote("notes.txt", "edited buffer text")
        ]
    );
    assert_eq!(
        tool_result(&requests[2], "call_write_1"),
        "wrote 10 bytes to out.txt"
    );
    assert_eq!(
        tool_result(&requests[3], "call_edit_1"),
        "edited notes.txt: replaced 1 occurrence"
    );

    // The disk is untouched.
    assert!(!root.join("out.txt").exists(), "the agent wrote to disk");
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).unwrap(),
        "on-disk text"
    );
    assert_eq!(
        statuses(&log),
        [
            ToolCallStatus::Completed,
            ToolCallStatus::Completed,
            ToolCallStatus::Completed,
            ToolCallStatus::Failed
        ]
    );
}

#[tokio::test]
async fn a_client_without_fs_gets_no_fs_requests_and_reads_come_from_disk() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("notes.txt"), "on-disk text").unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 1),
        Reply::text(["done"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    // `Permission::NotExpected` without buffers: any fs/* request fails the test.
    let (log, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "read from disk", Permission::NotExpected).await?;
        Ok(log)
    })
    .await;
    assert_eq!(log.text, "done");
    assert!(log.reads.is_empty() && log.writes.is_empty());
    assert_eq!(
        tool_result(&llm.requests()[1], "call_read_1"),
        "on-disk text"
    );
}

// ---------------------------------------------------------------------------------------------
// Several sessions on one connection
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn interleaved_sessions_keep_their_own_directories_and_conversations() {
    let first = temp();
    let second = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::text(["answer a1"]),
        Reply::text(["answer b1"]),
        Reply::text(["answer a2"]),
        Reply::text(["answer b2"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (texts, _) = with_launch(launch, async |cx, _| {
        let mut a = new_session(&cx, first.path()).await?;
        let mut b = new_session(&cx, second.path()).await?;
        assert_ne!(a.session_id(), b.session_id());
        let mut texts = Vec::new();
        for (on_a, text) in [(true, "a1"), (false, "b1"), (true, "a2"), (false, "b2")] {
            let session = if on_a { &mut a } else { &mut b };
            let log = prompt_ends(session, text, Permission::NotExpected).await?;
            texts.push(log.text);
        }
        Ok(texts)
    })
    .await;
    assert_eq!(texts, ["answer a1", "answer b1", "answer a2", "answer b2"]);
    let requests = llm.requests();
    assert_eq!(requests.len(), 4);
    // Each request was made in its session's directory ...
    for (request, dir) in requests.iter().zip([&first, &second, &first, &second]) {
        let root = canonical(dir.path()).display().to_string();
        let system = system_prompt(request);
        assert!(system.contains(&root), "{root} not in {system:?}");
    }
    // ... with its session's conversation only.
    assert_eq!(
        conversation(&requests[2]),
        pairs(&[("user", "a1"), ("assistant", "answer a1"), ("user", "a2")])
    );
    assert_eq!(
        conversation(&requests[3]),
        pairs(&[("user", "b1"), ("assistant", "answer b1"), ("user", "b2")])
    );
}

#[tokio::test]
async fn a_busy_session_refuses_a_second_prompt_and_cancels_promptly_while_another_works() {
    let first = temp();
    let second = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        // Far longer than the test may take: only cancellation ends this turn.
        Reply::Slow {
            chunks: vec!["slow start".into(), " never sent".into()],
            interval: Duration::from_mins(10),
        },
        Reply::text(["other answer"]),
        Reply::text(["after cancel"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let ((busy, other, cancel_took, cancelled, after, busy_id), _) =
        with_launch(launch, async |cx, _| {
            let mut slow = new_session(&cx, first.path()).await?;
            let mut other = new_session(&cx, second.path()).await?;
            slow.send_prompt("take your time")?;
            let mut log = TurnLog::default();
            // The model is streaming this turn once its first chunk arrives.
            let early = read_until(&mut slow, &mut log, Permission::NotExpected, |update| {
                matches!(update, SessionUpdate::AgentMessageChunk(_))
            })
            .await?;
            assert!(early.is_none(), "the slow turn ended on its own");

            // Another session is served meanwhile ...
            let (other_log, other_response) =
                prompt(&mut other, "quick", Permission::NotExpected).await?;
            assert_eq!(stop_reason(other_response), StopReason::EndTurn);
            // ... while a second prompt on the busy session is refused at once.
            slow.send_prompt("again")?;
            let busy = read_until(&mut slow, &mut log, Permission::NotExpected, |_| false)
                .await?
                .expect("a response");

            let cancelled_at = Instant::now();
            cx.send_notification(CancelNotification::new(slow.session_id().clone()))?;
            let response = read_until(&mut slow, &mut log, Permission::NotExpected, |_| false)
                .await?
                .expect("a response");
            let cancel_took = cancelled_at.elapsed();
            let cancelled = (stop_reason(response), log.text);

            // The cancelled session takes the next prompt.
            let after = prompt_ends(&mut slow, "after", Permission::NotExpected).await?;
            Ok((
                busy,
                other_log.text,
                cancel_took,
                cancelled,
                after.text,
                slow.session_id().0.to_string(),
            ))
        })
        .await;
    let busy = busy.expect_err("the second prompt is refused");
    assert_eq!(busy.code, ErrorCode::INVALID_REQUEST);
    assert_eq!(
        busy.message,
        format!(
            "session/prompt: session {busy_id} already has a prompt in flight; wait for its response or send session/cancel first"
        )
    );
    assert_eq!(other, "other answer");
    assert_eq!(cancelled, (StopReason::Cancelled, "slow start".to_owned()));
    assert!(
        cancel_took < Duration::from_secs(10),
        "cancel took {cancel_took:?}"
    );
    assert_eq!(after, "after cancel");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "the refused prompt made no request");
    assert_eq!(
        conversation(&requests[1]),
        pairs(&[("user", "quick")]),
        "the other session's request"
    );
    // The cancelled turn kept what was shown; the refused prompt left no trace.
    assert_eq!(
        conversation(&requests[2]),
        pairs(&[
            ("user", "take your time"),
            ("assistant", "slow start"),
            ("user", "after")
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// Path confinement
// ---------------------------------------------------------------------------------------------

/// What one confinement run produced: the turn and the model's requests.
async fn escape_attempts(client_fs: bool) -> (TurnLog, Vec<RecordedRequest>, tempfile::TempDir) {
    let outer = temp();
    let state = temp();
    let root = outer.path().join("project");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(outer.path().join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(outer.path().join("secret.txt"), root.join("link.txt")).unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call("call_up", "read_file", &json!({"path": "../secret.txt"}), 2),
        Reply::tool_call("call_link", "read_file", &json!({"path": "link.txt"}), 2),
        Reply::tool_call(
            "call_write_up",
            "write_file",
            &json!({"path": "../evil.txt", "content": "pwned"}),
            2,
        ),
        Reply::text(["refused"]),
    ]);
    let mut launch = Launch::model(&llm.base_url(), state.path());
    // An editor that would hand the secret out if asked: asking at all is the failure.
    let mut answers = Answers::from(Permission::NotExpected);
    if client_fs {
        launch = launch.client_fs(true, true);
        answers = Answers::editor(Permission::NotExpected)
            .buffer(canonical(&outer.path().join("secret.txt")), "top secret");
    }
    let (log, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, &root).await?;
        let log = prompt_ends(&mut session, "escape", answers).await?;
        Ok(log)
    })
    .await;
    (log, llm.requests(), outer)
}

#[tokio::test]
async fn paths_outside_the_session_directory_are_refused_before_anything_is_read() {
    for client_fs in [false, true] {
        let (log, requests, outer) = escape_attempts(client_fs).await;
        let root = canonical(&outer.path().join("project"));
        let secret = canonical(&outer.path().join("secret.txt"));
        assert_eq!(log.text, "refused", "client_fs: {client_fs}");
        assert_eq!(requests.len(), 4, "client_fs: {client_fs}");
        let results = [
            tool_result(&requests[1], "call_up"),
            tool_result(&requests[2], "call_link"),
            tool_result(&requests[3], "call_write_up"),
        ];
        assert_eq!(
            results,
            [
                format!(
                    "refused: ../secret.txt is outside the session directory {}; use a path inside it",
                    root.display()
                ),
                format!(
                    "refused: link.txt resolves through a symlink to {}, outside the session directory {}; use a path inside it",
                    secret.display(),
                    root.display()
                ),
                format!(
                    "refused: ../evil.txt is outside the session directory {}; use a path inside it",
                    root.display()
                ),
            ],
            "client_fs: {client_fs}"
        );
        // Nothing was read, asked for, or written; the secret never reached the model.
        assert!(log.reads.is_empty(), "client_fs: {client_fs}");
        assert!(log.writes.is_empty(), "client_fs: {client_fs}");
        assert!(log.permission_requests.is_empty(), "client_fs: {client_fs}");
        for request in &requests {
            assert!(!request.raw_body.contains("top secret"));
        }
        assert!(!outer.path().join("evil.txt").exists());
        assert_eq!(
            statuses(&log),
            [ToolCallStatus::Failed; 3],
            "client_fs: {client_fs}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// stdout purity
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn debug_logs_and_command_output_stay_off_stdout_during_a_tool_turn() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("a.txt"), "file text").unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_run_1",
            "run_command",
            // `cat` ends at once only if the command's stdin is closed, not the agent's protocol.
            &json!({"command": "cat; echo to-stdout; echo to-stderr >&2"}),
            4,
        ),
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "a.txt"}), 2),
        Reply::text(["all ", "done"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (log, finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "run and read", Permission::Allow).await?;
        Ok(log)
    })
    .await;
    assert_eq!(log.text, "all done");
    let requests = llm.requests();
    assert_eq!(
        tool_result(&requests[1], "call_run_1"),
        "exit code: 0\n--- stdout ---\nto-stdout\n\n--- stderr ---\nto-stderr\n"
    );
    assert_eq!(tool_result(&requests[2], "call_read_1"), "file text");

    // `finish` parsed every stdout line as a JSON-RPC frame; the command's output is inside
    // frames only, and the debug logs (one per model request) went to stderr.
    assert!(
        finished
            .stdout
            .iter()
            .all(|line| !line.starts_with("to-std") && !line.contains("model request")),
        "{:?}",
        finished.stdout
    );
    let model_requests = finished
        .stderr
        .lines()
        .filter(|line| line.contains("DEBUG") && line.contains("model request"))
        .count();
    assert_eq!(model_requests, 3, "stderr:\n{}", finished.stderr);
    assert!(
        !finished.stderr.contains("to-stderr"),
        "{}",
        finished.stderr
    );
    // Every frame is accounted for: responses to the client's requests, session updates,
    // permission requests; nothing else.
    for frame in finished.frames() {
        let method = frame["method"].as_str();
        assert!(
            matches!(
                method,
                None | Some("session/update" | "session/request_permission")
            ),
            "{frame}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation while the client holds an fs request
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn cancel_while_the_editor_has_not_answered_a_read_withdraws_it_and_ends_the_turn() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("notes.txt"), "on-disk text").unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 2),
        Reply::text(["next answer"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path()).client_fs(true, true);
    let ((stop, log, next), finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        session.send_prompt("read it")?;
        // Take the read request and sit on it, as a busy editor would.
        let mut held = None;
        while held.is_none() {
            let SessionMessage::Message(dispatch) = session.read_update().await? else {
                panic!("the turn ended before the read");
            };
            MatchDispatch::new(dispatch.into_raw())
                .if_request(async |request: ReadTextFileRequest, responder| {
                    held = Some((request, responder));
                    Ok(())
                })
                .await
                .otherwise_ignore()?;
        }
        cx.send_notification(CancelNotification::new(session.session_id().clone()))?;
        let mut log = TurnLog::default();
        let response = read_until(&mut session, &mut log, Permission::NotExpected, |_| false)
            .await?
            .expect("a response");
        // A late answer to the withdrawn request is harmless.
        let (_, responder) = held.expect("held");
        responder.respond(ReadTextFileResponse::new("late buffer text"))?;
        let (next, next_response) = prompt(&mut session, "next", Permission::NotExpected).await?;
        assert_eq!(stop_reason(next_response), StopReason::EndTurn);
        Ok((stop_reason(response), log, next.text))
    })
    .await;
    assert_eq!(stop, StopReason::Cancelled);
    assert_eq!(log.final_status(), ToolCallStatus::Failed);
    assert_eq!(next, "next answer");
    // The agent withdrew its read with `$/cancel_request` for that request's id.
    let frames = finished.frames();
    let read_id = frames
        .iter()
        .find(|frame| frame["method"] == "fs/read_text_file")
        .expect("the read was sent")["id"]
        .clone();
    assert!(
        frames
            .iter()
            .any(|frame| frame["method"] == "$/cancel_request"
                && frame["params"]["requestId"] == read_id),
        "{frames:#?}"
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        conversation(&requests[1]),
        pairs(&[
            ("user", "read it"),
            ("assistant+tool_calls:call_read_1", ""),
            ("tool:call_read_1", "cancelled by the user"),
            ("user", "next"),
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// stdin EOF in the middle of a model turn
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn stdin_eof_while_a_command_runs_exits_zero_and_kills_the_command() {
    let cwd = temp();
    let state = temp();
    let pid_file = cwd.path().join("sleep.pid");
    let llm = MockLlm::start(vec![Reply::tool_call(
        "call_run_1",
        "run_command",
        // Not the last command of the script, so `sh` cannot exec it: a grandchild of the agent.
        &json!({"command": "sleep 600 & echo $! > sleep.pid; wait; echo never"}),
        2,
    )]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let started = Instant::now();
    let (pid, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        session.send_prompt("run forever")?;
        let mut log = TurnLog::default();
        let ended = read_until(&mut session, &mut log, Permission::Allow, |update| {
            matches!(update, SessionUpdate::ToolCallUpdate(update)
                if update.fields.status == Some(ToolCallStatus::InProgress))
        })
        .await?;
        assert!(ended.is_none(), "the turn ended before the command ran");
        let pid_file = pid_file.clone();
        let pid = tokio::task::spawn_blocking(move || {
            assert!(acp_tests::wait_for_file(&pid_file, TIMEOUT), "no pid file");
            // Written by `echo`: wait for the whole line.
            let mut pid = None;
            assert!(acp_tests::wait_until(TIMEOUT, || {
                pid = acp_tests::read_pid(&pid_file);
                pid.is_some()
            }));
            pid.expect("a pid")
        })
        .await
        .expect("the pid wait finished");
        assert!(acp_tests::process_alive(pid));
        // Returning closes the agent's stdin with the turn in flight.
        Ok(pid)
    })
    .await;
    // `with_launch` checked exit code 0; the command went with the agent.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        acp_tests::wait_until_dead(pid, Duration::from_secs(10)),
        "the command (pid {pid}) outlived the agent"
    );
}

// ---------------------------------------------------------------------------------------------
// Remembered permissions and the persona
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn allow_always_is_remembered_for_the_session_and_that_tool_kind_only() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_w1",
            "write_file",
            &json!({"path": "a.txt", "content": "A"}),
            1,
        ),
        Reply::text(["first"]),
        Reply::tool_call(
            "call_w2",
            "write_file",
            &json!({"path": "b.txt", "content": "B"}),
            1,
        ),
        Reply::text(["second"]),
        Reply::tool_call(
            "call_c1",
            "run_command",
            &json!({"command": "echo ran > c.txt"}),
            1,
        ),
        Reply::text(["third"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (logs, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        // The first edit is allowed "always"...
        let first = prompt_ends(&mut session, "write a", Permission::AllowAlways).await?;
        // ...so the second edit must not ask at all...
        let second = prompt_ends(&mut session, "write b", Permission::NotExpected).await?;
        // ...but a command is another kind of tool and still asks.
        let third = prompt_ends(&mut session, "run it", Permission::Reject).await?;
        Ok((first, second, third))
    })
    .await;
    let (first, second, third) = logs;
    assert_eq!(first.permission_requests.len(), 1);
    assert!(second.permission_requests.is_empty());
    assert_eq!(third.permission_requests.len(), 1);
    assert_eq!(
        (
            first.text.as_str(),
            second.text.as_str(),
            third.text.as_str()
        ),
        ("first", "second", "third")
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("a.txt")).unwrap(),
        "A"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("b.txt")).unwrap(),
        "B"
    );
    assert!(
        !cwd.path().join("c.txt").exists(),
        "the rejected command ran"
    );
    assert!(tool_result(&llm.requests()[5], "call_c1").contains("permission denied"));
}

#[tokio::test]
async fn the_persona_file_becomes_the_system_prompt_with_model_and_cwd() {
    let cwd = temp();
    let state = temp();
    let persona = state.path().join("persona.md");
    std::fs::write(
        &persona,
        "You are a careful reviewer using {{model}} in {{cwd}}; fn f() { {x} }; {{{{model}} is \
         literal",
    )
    .unwrap();
    let llm = MockLlm::start(vec![Reply::text(["ok"])]);
    let launch = Launch::model(&llm.base_url(), state.path())
        .arg("--persona")
        .arg(persona.as_os_str());
    let (text, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "hi", Permission::NotExpected).await?;
        Ok(log.text)
    })
    .await;
    assert_eq!(text, "ok");
    assert_eq!(
        system_prompt(&llm.requests()[0]),
        format!(
            "You are a careful reviewer using mock-model in {}; fn f() {{ {{x}} }}; {{{{model}}}} \
             is literal",
            canonical(cwd.path()).display()
        )
    );
}

#[tokio::test]
async fn an_empty_persona_file_sends_no_system_message() {
    let cwd = temp();
    let state = temp();
    let persona = state.path().join("persona.md");
    std::fs::write(&persona, "\n").unwrap();
    let llm = MockLlm::start(vec![Reply::text(["ok"])]);
    let launch = Launch::model(&llm.base_url(), state.path())
        .arg("--persona")
        .arg(persona.as_os_str());
    let (text, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "hi", Permission::NotExpected).await?;
        Ok(log.text)
    })
    .await;
    assert_eq!(text, "ok");
    let requests = llm.requests();
    let roles: Vec<&Value> = requests[0].messages().iter().map(|m| &m["role"]).collect();
    assert_eq!(roles, [&json!("user")]);
}

#[tokio::test]
async fn a_prompt_whose_model_request_failed_is_not_kept_in_the_history() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::status(401, "bad key"),
        Reply::text(["second answer"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (second, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, failed) = prompt(&mut session, "first prompt", Permission::NotExpected).await?;
        assert!(failed.is_err(), "a 401 fails the prompt: {failed:?}");
        let log = prompt_ends(&mut session, "second prompt", Permission::NotExpected).await?;
        Ok(log.text)
    })
    .await;
    assert_eq!(second, "second answer");
    // Sending again after fixing the key must not show the model the failed prompt as well.
    assert_eq!(
        conversation(&llm.requests()[1]),
        pairs(&[("user", "second prompt")])
    );
    let saved: String = std::fs::read_dir(state.path())
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    assert!(!saved.contains("first prompt"), "{saved}");
    assert!(saved.contains("second prompt"), "{saved}");
}

// ---------------------------------------------------------------------------------------------
// Model server answers: errors, retries, keys (through the real binary)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn model_server_failures_are_exact_json_rpc_errors_and_retries_recover() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        // A rejected key: not retried, answered as ACP's auth-required.
        Reply::status(401, "invalid api key"),
        Reply::status(403, "forbidden"),
        // Anything else the server refuses names the model and the URL.
        Reply::status(404, "model not found"),
        // Rate limits past the retry budget (one attempt plus two retries).
        Reply::status(429, "quota exceeded"),
        Reply::status(429, "quota exceeded"),
        Reply::status(429, "quota exceeded"),
        // A failed server and a rate limit are retried, then the answer streams.
        Reply::status(503, "busy"),
        Reply::status(429, "slow down"),
        Reply::text(["recovered"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path())
        .arg("--max-retries")
        .arg("2")
        .arg("--retry-base-ms")
        .arg("1");
    let (outcomes, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let mut outcomes = Vec::new();
        for _ in 0..5 {
            let (log, response) = prompt(&mut session, "hi", Permission::NotExpected).await?;
            outcomes.push(match response {
                Ok(response) => (None, format!("{:?}: {}", response.stop_reason, log.text)),
                Err(error) => (Some(error.code), error.message),
            });
        }
        Ok(outcomes)
    })
    .await;
    let bad_key = |status: u16| {
        format!(
            "model server rejected the API key (HTTP {status}): set ACP_CHILD_API_KEY (or DEEPSEEK_API_KEY / OPENAI_API_KEY) to a valid key; with acp-host forward it with --env ACP_CHILD_API_KEY (no key was set, so none was sent)"
        )
    };
    let base_url = llm.base_url();
    assert_eq!(
        outcomes,
        [
            (Some(ErrorCode::AUTH_REQUIRED), bad_key(401)),
            (Some(ErrorCode::AUTH_REQUIRED), bad_key(403)),
            (
                Some(ErrorCode::INTERNAL_ERROR),
                format!(
                    "the model server refused the request (HTTP 404): model not found; check the model name (mock-model) and the base URL ({base_url})"
                )
            ),
            (
                Some(ErrorCode::INTERNAL_ERROR),
                "the model server is rate limiting requests (HTTP 429), still after 2 retries: quota exceeded; wait and try again, or raise --max-retries".to_owned()
            ),
            (None, "EndTurn: recovered".to_owned()),
        ]
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 9, "401, 403 and 404 are not retried");
    assert!(
        requests
            .iter()
            .all(|request| request.authorization().is_none()),
        "no key set: no Authorization header"
    );
}

#[tokio::test]
async fn an_unreachable_model_server_is_named() {
    let cwd = temp();
    let state = temp();
    // Bind then drop: nothing listens on the port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let launch = Launch::model(&base_url, state.path());
    let (error, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "hi", Permission::NotExpected).await?;
        Ok(response.expect_err("an unreachable server fails the prompt"))
    })
    .await;
    assert_eq!(error.code, ErrorCode::INTERNAL_ERROR);
    assert!(
        error
            .message
            .starts_with(&format!("cannot reach the model server at {base_url}: ")),
        "{}",
        error.message
    );
}

// ---------------------------------------------------------------------------------------------
// Tool calls as a client sees them: ids, titles, text around them, failed permission handlers
// ---------------------------------------------------------------------------------------------

/// `data:` payloads of one streamed reply: text, then a call to `read_file`, finish `tool_calls`.
fn text_then_tool_call(text: &str, id: &str, path: &str) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "mock-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
        .to_string()
    };
    let call = json!({"tool_calls": [{
        "index": 0,
        "id": id,
        "type": "function",
        "function": {"name": "read_file", "arguments": json!({"path": path}).to_string()},
    }]});
    Reply::Events(vec![
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(call, Value::Null),
        chunk(json!({}), json!("tool_calls")),
        "[DONE]".to_owned(),
    ])
}

#[tokio::test]
async fn text_resuming_after_a_tool_call_starts_a_new_paragraph() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("a.txt"), "hi").unwrap();
    let llm = MockLlm::start(vec![
        text_then_tool_call("Let me look.", "call_1", "a.txt"),
        Reply::text(["It says ", "hi."]),
        text_then_tool_call("Line first.\n", "call_2", "a.txt"),
        Reply::text(["No extra break."]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (logs, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (first, _) = prompt(&mut session, "read a", Permission::NotExpected).await?;
        let (second, _) = prompt(&mut session, "again", Permission::NotExpected).await?;
        Ok((first, second))
    })
    .await;
    let (first, second) = logs;
    assert_eq!(first.text, "Let me look.\n\nIt says hi.");
    let chunks: Vec<&SessionUpdate> = first
        .updates
        .iter()
        .filter(|update| matches!(update, SessionUpdate::AgentMessageChunk(_)))
        .collect();
    assert_eq!(
        chunks,
        [
            &agent_chunk("Let me look."),
            &agent_chunk("\n\n"),
            &agent_chunk("It says "),
            &agent_chunk("hi."),
        ]
    );
    assert_eq!(second.text, "Line first.\nNo extra break.");
}

#[tokio::test]
async fn tool_call_ids_are_unique_in_a_session_while_the_model_keeps_its_own() {
    let cwd = temp();
    let state = temp();
    std::fs::write(cwd.path().join("a.txt"), "A").unwrap();
    let read = |id: &str| Reply::tool_call(id, "read_file", &json!({"path": "a.txt"}), 1);
    let llm = MockLlm::start(vec![
        read("call_1"),
        Reply::text(["one"]),
        // The same id in a later turn, then in the same turn, then an empty one.
        read("call_1"),
        read("call_1"),
        read(""),
        Reply::text(["two"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (ids, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let mut ids = Vec::new();
        for text in ["first", "second"] {
            let log = prompt_ends(&mut session, text, Permission::NotExpected).await?;
            let announced: Vec<String> = log
                .tool_calls()
                .iter()
                .map(|call| call.tool_call_id.0.to_string())
                .collect();
            let updated: Vec<String> = log
                .tool_call_updates()
                .iter()
                .map(|update| update.tool_call_id.0.to_string())
                .collect();
            assert_eq!(announced, updated, "each update names its announced call");
            ids.extend(announced);
        }
        Ok(ids)
    })
    .await;
    assert_eq!(ids[..3], ["call_1", "call-1", "call-2"]);
    assert!(
        ids[3].starts_with("call_") && ids[3].len() > "call_".len(),
        "an empty id is minted: {ids:?}"
    );
    // The model sees its own ids in the conversation it is sent.
    let requests = llm.requests();
    let last = conversation(&requests[5]);
    let tool_ids: Vec<&str> = last
        .iter()
        .filter_map(|(role, _)| role.strip_prefix("tool:"))
        .collect();
    assert_eq!(tool_ids, ["call_1", "call_1", "call_1", ids[3].as_str()]);
}

#[tokio::test]
async fn malformed_tool_calls_are_titled_and_failed() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::tool_call("call_a", "frobnicate", &json!({}), 1),
        Reply::Events(vec![
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "id": "call_b", "type": "function",
                "function": {"name": " ", "arguments": "{not json"},
            }]}, "finish_reason": "tool_calls"}]})
            .to_string(),
            "[DONE]".to_owned(),
        ]),
        Reply::text(["ok"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (log, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "go", Permission::NotExpected).await?;
        Ok(log)
    })
    .await;
    let shown: Vec<(&str, ToolKind, ToolCallStatus)> = log
        .tool_calls()
        .iter()
        .map(|call| (call.title.as_str(), call.kind, call.status))
        .collect();
    assert_eq!(
        shown,
        [
            ("frobnicate", ToolKind::Other, ToolCallStatus::Failed),
            ("Unnamed tool call", ToolKind::Other, ToolCallStatus::Failed),
        ]
    );
    let requests = llm.requests();
    assert_eq!(
        tool_result(&requests[1], "call_a"),
        "unknown tool \"frobnicate\"; the tools are read_file, list_dir, search, write_file, edit_file, run_command, task_output, task_list, task_kill"
    );
}

#[tokio::test]
async fn a_permission_handler_error_rejects_the_call_and_the_turn_goes_on() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_w",
            "write_file",
            &json!({"path": "out.txt", "content": "x"}),
            1,
        ),
        Reply::text(["understood"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let ((log, stop), finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (log, response) = prompt(&mut session, "write", Permission::Fail).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    let reason = format!(
        "the client answered the permission request with an error ({PERMISSION_ERROR}); the call was not run"
    );
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(log.text, "understood");
    assert_eq!(log.final_status(), ToolCallStatus::Failed);
    assert_eq!(tool_result(&llm.requests()[1], "call_w"), reason);
    assert!(!cwd.path().join("out.txt").exists());
    assert!(
        !finished.stderr.contains("client connection failed"),
        "{}",
        finished.stderr
    );
}

#[tokio::test]
async fn a_retry_after_header_wins_over_the_backoff() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::StatusRetryAfter {
            status: 429,
            message: "slow down".to_owned(),
            seconds: 0,
        },
        Reply::text(["answered"]),
    ]);
    // A ten-minute backoff: only `Retry-After: 0` lets the answer arrive within the deadline.
    let launch = Launch::model(&llm.base_url(), state.path())
        .arg("--retry-base-ms")
        .arg("600000");
    let (text, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let log = prompt_ends(&mut session, "hi", Permission::NotExpected).await?;
        Ok(log.text)
    })
    .await;
    assert_eq!(text, "answered");
    assert_eq!(llm.requests().len(), 2);
}
