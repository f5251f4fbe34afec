//! End-to-end: subagents that outlive one tool call. A parent acp-child on the mock model starts
//! children in the background (`run_in_background`) and reaches them through `task_output`,
//! `task_list` and `task_kill`; a finished task's notice reaches the model's next request once;
//! `--no-background` refuses a forced background start with nothing spawned; cancelling or
//! closing the session, or ending the connection, tears its tasks down. Children are continued
//! with `send_message`: in its live process while a background child is kept idle (closed by the
//! idle timeout, or when its session is cancelled or closed), else by cold resume (`session/load` of the child's session
//! in a fresh process, its history intact on the child model's request), queued behind a running
//! turn, and across a parent resumed with `session/load`; `list_agents` lists them. No process is
//! left behind.

use std::path::Path;
use std::time::Duration;

use acp_tests::acp_client::{Launch, Permission, new_session, prompt, stop_reason, with_launch};
use acp_tests::mock_llm::{MockLlm, Reply, message_text};
use agent_client_protocol::v1::schema::{CancelNotification, CloseSessionRequest, StopReason};
use serde_json::{Value, json};

use super::common::mock_path;
use super::delegation::assert_none_left;

const KEY: &str = "sk-mock-background";

/// Writes definition `<cwd>/subagents/<name>.md` running the mock agent with `args`.
fn mock_definition(cwd: &Path, name: &str, args: &str) {
    let dir = cwd.join("subagents");
    std::fs::create_dir_all(&dir).unwrap();
    let agent = format!("{} {args}", mock_path());
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!(
            "---\ndescription: the mock agent\nrun:\n  agent: {}\n---\nYou are the mock.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    )
    .unwrap();
}

/// A parent acp-child on `llm`, saving sessions in `state`, with `extra` flags; with `children`,
/// it may delegate to acp-child running on that model server (its own key and state forwarded).
fn parent(llm: &MockLlm, state: &Path, children: Option<&MockLlm>, extra: &[&str]) -> Launch {
    let mut launch = Launch::model(&llm.base_url(), state)
        .env("ACP_CHILD_API_KEY", KEY)
        .env("ACP_HOST_DEPTH", "0")
        .env("ACP_HOST_MAX_DEPTH", "1");
    if let Some(children) = children {
        launch = launch
            .arg("--subagent-agents")
            .arg("acp-child")
            .env("ACP_CHILD_MODEL", "mock-model")
            .env("ACP_CHILD_BASE_URL", children.base_url())
            .env("ACP_CHILD_STATE_DIR", state);
        for name in [
            "ACP_CHILD_API_KEY",
            "ACP_CHILD_MODEL",
            "ACP_CHILD_BASE_URL",
            "ACP_CHILD_STATE_DIR",
        ] {
            launch = launch.arg("--subagent-env").arg(name);
        }
    }
    for flag in extra {
        launch = launch.arg(*flag);
    }
    launch
}

/// A reply calling `tool` with `arguments` under id `id`.
fn call(id: &str, tool: &str, arguments: &Value) -> Reply {
    Reply::tool_call(id, tool, arguments, 1)
}

/// How many messages of a request say `text`.
fn mentions(request: &acp_tests::mock_llm::RecordedRequest, text: &str) -> usize {
    request
        .messages()
        .iter()
        .filter(|m| message_text(m).contains(text))
        .count()
}

/// Runs one prompt of a fresh session in `cwd` on `launch`; the turn's stop reason.
async fn one_turn(launch: Launch, cwd: &Path, text: &str) -> StopReason {
    let (reason, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd).await?;
        let (_, response) = prompt(&mut session, text, Permission::NotExpected).await?;
        Ok(stop_reason(response))
    })
    .await;
    reason
}

fn started(task: &str, agent: &str, child: &str) -> String {
    format!(
        "started background task {task}: subagent {agent} as child {child}. It runs on its own: \
         task_output {task} returns its result (wait: true blocks until it is done), task_kill \
         stops it, and you are told when it finishes."
    )
}

#[tokio::test]
async fn a_background_task_returns_at_once_and_task_output_waits_for_its_result() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "echo", "text --text child-says-hi");
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "say hi", "run_in_background": true}),
            ),
            call(
                "call_out",
                "task_output",
                &json!({"task_id": "subagent-1", "wait": true}),
            ),
            call("call_list", "task_list", &json!({})),
            call(
                "call_other",
                "task_output",
                &json!({"task_id": "subagent-7"}),
            ),
            Reply::text(["done"]),
        ])
        .start();
    let reason = one_turn(parent(&llm, state.path(), None, &[]), cwd.path(), "go").await;
    assert_eq!(reason, StopReason::EndTurn);
    let requests = llm.requests();
    assert_eq!(requests.len(), 5, "{requests:#?}");
    // The prompt face: the parameter and the task tools are offered.
    let subagent = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap();
    assert_eq!(
        subagent["function"]["parameters"]["properties"]["run_in_background"]["type"],
        "boolean"
    );
    for tool in [
        "task_output",
        "task_list",
        "task_kill",
        "send_message",
        "list_agents",
    ] {
        assert!(requests[0].tool_names().contains(&tool), "{tool}");
    }
    assert_eq!(
        requests[1].tool_result("call_bg").unwrap(),
        started("subagent-1", "echo", "agent-1")
    );
    assert_eq!(
        requests[2].tool_result("call_out").unwrap(),
        "subagent-1 (completed): subagent echo as child agent-1: say hi\n\nchild-says-hi"
    );
    assert_eq!(
        requests[3].tool_result("call_list").unwrap(),
        "subagent-1 (completed): subagent echo as child agent-1: say hi"
    );
    assert_eq!(
        requests[4].tool_result("call_other").unwrap(),
        "no such task \"subagent-7\"; task_list shows this session's tasks"
    );
    // Collected with task_output: no completion notice follows.
    assert_eq!(mentions(&requests[4], "Background task subagent-1"), 0);
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn a_finished_tasks_notice_reaches_the_next_request_once() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "echo", "text --text the-answer");
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "work", "run_in_background": true}),
            ),
            // A message to the busy child waits for its turn; the child is not kept alive
            // (`--child-idle-timeout 0`) and the mock agent cannot load a session, so it cannot
            // be continued.
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "more"}),
            ),
            call("call_agents", "list_agents", &json!({})),
            Reply::text(["noted"]),
        ])
        .start();
    let launch = parent(&llm, state.path(), None, &["--child-idle-timeout", "0"]);
    let reason = one_turn(launch, cwd.path(), "go").await;
    assert_eq!(reason, StopReason::EndTurn);
    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    assert_eq!(
        requests[2].tool_result("call_msg").unwrap(),
        "subagent echo cannot be continued: cannot resume session mock-session-1: agent echo \
         does not advertise loadSession, so it cannot continue a saved session; start a new \
         session instead"
    );
    // By then the task had finished: its notice is a user message of that request, and stays in
    // the conversation once.
    let notice = "Background task subagent-1 (subagent echo, child agent-1) completed. Its \
                  result:\nthe-answer";
    assert_eq!(mentions(&requests[2], notice), 1, "{:#?}", requests[2]);
    assert_eq!(mentions(&requests[3], notice), 1);
    let user = requests[3]
        .messages()
        .iter()
        .find(|m| message_text(m) == notice)
        .unwrap();
    assert_eq!(user["role"], "user");
    let agents = requests[3].tool_result("call_agents").unwrap();
    assert!(
        agents.starts_with("agent-1: subagent echo, failed, last activity "),
        "{agents}"
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn task_kill_stops_a_running_task_and_leaves_no_process() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "stuck", "hang");
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "stuck", "prompt": "wait", "run_in_background": true}),
            ),
            call("call_kill", "task_kill", &json!({"task_id": "subagent-1"})),
            call("call_again", "task_kill", &json!({"task_id": "subagent-1"})),
            Reply::text(["stopped"]),
        ])
        .start();
    let reason = one_turn(parent(&llm, state.path(), None, &[]), cwd.path(), "go").await;
    assert_eq!(reason, StopReason::EndTurn);
    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    assert_eq!(
        requests[2].tool_result("call_kill").unwrap(),
        "killed subagent-1 (failed): subagent stuck as child agent-1: wait"
    );
    assert_eq!(
        requests[3].tool_result("call_again").unwrap(),
        "subagent-1 had already finished: subagent-1 (failed): subagent stuck as child agent-1: wait"
    );
    assert_eq!(mentions(&requests[3], "Background task subagent-1"), 0);
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn no_background_removes_the_parameter_and_refuses_a_forced_start_with_nothing_spawned() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pid_file = cwd.path().join("child.pid");
    mock_definition(
        cwd.path(),
        "echo",
        &format!("hello --pid-file {}", pid_file.display()),
    );
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "go", "run_in_background": true}),
            ),
            Reply::text(["ok"]),
        ])
        .start();
    let launch = parent(&llm, state.path(), None, &["--no-background"]);
    assert_eq!(
        one_turn(launch, cwd.path(), "go").await,
        StopReason::EndTurn
    );
    let requests = llm.requests();
    let subagent = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap();
    assert_eq!(
        subagent["function"]["parameters"]["properties"]["run_in_background"],
        Value::Null
    );
    for tool in ["task_output", "task_list", "task_kill"] {
        assert!(!requests[0].tool_names().contains(&tool), "{tool}");
    }
    assert_eq!(
        requests[1].tool_result("call_bg").unwrap(),
        "background subagents are disabled in this agent (--no-background); call subagent \
         without run_in_background"
    );
    assert!(!pid_file.exists(), "the child was spawned");
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn cancelling_or_closing_the_session_or_ending_the_connection_kills_its_tasks() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pid = |n: usize| cwd.path().join(format!("child-{n}.pid"));
    // One definition per task, so each child writes its own pid file.
    let start = |n: usize| {
        [
            call(
                &format!("call_{n}"),
                "subagent",
                &json!({"agent": format!("stuck{n}"), "prompt": "wait", "run_in_background": true}),
            ),
            Reply::text(["started"]),
        ]
    };
    for n in 1..=3 {
        mock_definition(
            cwd.path(),
            &format!("stuck{n}"),
            &format!("hang --pid-file {}", pid(n).display()),
        );
    }
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies(start(1).into_iter().chain(start(2)).chain(start(3)))
        .start();
    // Waited off the runtime: the client's connection must keep running meanwhile.
    let alive = async |n: usize| {
        let file = pid(n);
        tokio::task::spawn_blocking(move || {
            assert!(
                acp_tests::wait_for_file(&file, acp_tests::HANG_GUARD),
                "child {n} never started"
            );
            acp_tests::read_pid(&file).unwrap()
        })
        .await
        .unwrap()
    };
    let dead = async |pid: u32| {
        tokio::task::spawn_blocking(move || acp_tests::wait_until_dead(pid, acp_tests::HANG_GUARD))
            .await
            .unwrap()
    };
    let (pids, _) = with_launch(parent(&llm, state.path(), None, &[]), async |cx, _| {
        // session/cancel: its tasks are cancelled too.
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "one", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        let first = alive(1).await;
        cx.send_notification(CancelNotification::new(session.session_id().clone()))?;
        assert!(dead(first).await, "cancel left the task's child running");
        // session/close: answered once its tasks are torn down.
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "two", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        let second = alive(2).await;
        cx.send_request(CloseSessionRequest::new(session.session_id().clone()))
            .block_task()
            .await?;
        assert!(
            !acp_tests::process_alive(second),
            "close answered before its task's child was gone"
        );
        // The connection ends with a task running.
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "three", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(alive(3).await)
    })
    .await;
    assert!(
        dead(pids).await,
        "the connection's end left a task's child running"
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn send_message_cold_resumes_a_child_with_its_history_even_from_a_loaded_parent() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let children = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            Reply::text(["noted"]),
            Reply::text(["it was 7"]),
            Reply::text(["still 7"]),
        ])
        .start();
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_child",
                "subagent",
                &json!({"agent": "acp-child", "prompt": "remember 7"}),
            ),
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "which number?"}),
            ),
            call("call_agents", "list_agents", &json!({})),
            Reply::text(["first done"]),
            // The parent, loaded in a fresh process, continues the same child.
            call(
                "call_again",
                "send_message",
                &json!({"child_id": "agent-1", "message": "and now?"}),
            ),
            Reply::text(["second done"]),
        ])
        .start();
    // Not kept alive: every message is a cold resume.
    let launch = parent(
        &llm,
        state.path(),
        Some(&children),
        &["--child-idle-timeout", "0"],
    );
    let (id, _) = with_launch(launch.clone(), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "go", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(session.session_id().clone())
    })
    .await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    assert_eq!(requests[1].tool_result("call_child").unwrap(), "noted");
    assert_eq!(requests[2].tool_result("call_msg").unwrap(), "it was 7");
    let agents = requests[3].tool_result("call_agents").unwrap();
    assert!(
        agents.starts_with("agent-1: subagent acp-child, ended, last activity "),
        "{agents}"
    );
    // The child's second request carries its first exchange: the session was loaded.
    let child = children.requests();
    assert_eq!(child.len(), 2, "{child:#?}");
    let said: Vec<(String, String)> = child[1]
        .messages()
        .iter()
        .skip(1)
        .map(|m| (m["role"].as_str().unwrap().to_owned(), message_text(m)))
        .collect();
    assert_eq!(
        said,
        [
            ("user".to_owned(), "remember 7".to_owned()),
            ("assistant".to_owned(), "noted".to_owned()),
            ("user".to_owned(), "which number?".to_owned()),
        ]
    );

    // A fresh parent process loads the session: its child is still reachable.
    let ((), _) = with_launch(launch, async |cx, _| {
        let mut session = cx
            .load_session(id.clone(), cwd.path())
            .block_task()
            .start_session()
            .await?
            .session;
        let (_, response) = prompt(&mut session, "again", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(())
    })
    .await;
    let requests = llm.requests();
    assert_eq!(requests[5].tool_result("call_again").unwrap(), "still 7");
    let child = children.requests();
    assert_eq!(child.len(), 3);
    assert_eq!(mentions(&child[2], "which number?"), 1);
    assert_eq!(child[2].last_user_text().as_deref(), Some("and now?"));
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn a_message_to_a_busy_child_waits_for_its_current_turn() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let children = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            Reply::Slow {
                chunks: vec!["slow ".into(), "first".into()],
                interval: Duration::from_millis(300),
            },
            Reply::text(["second"]),
        ])
        .start();
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "acp-child", "prompt": "start", "run_in_background": true}),
            ),
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "next"}),
            ),
            call("call_out", "task_output", &json!({"task_id": "subagent-1"})),
            Reply::text(["done"]),
        ])
        .start();
    let launch = parent(&llm, state.path(), Some(&children), &[]);
    assert_eq!(
        one_turn(launch, cwd.path(), "go").await,
        StopReason::EndTurn
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    assert_eq!(requests[2].tool_result("call_msg").unwrap(), "second");
    // The message waited: the first turn had completed by then.
    assert_eq!(
        requests[3].tool_result("call_out").unwrap(),
        "subagent-1 (completed): subagent acp-child as child agent-1: start\n\nslow first"
    );
    let child = children.requests();
    assert_eq!(child.len(), 2);
    assert_eq!(mentions(&child[1], "slow first"), 1);
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn tasks_are_fenced_to_their_session_and_absent_at_the_depth_cap() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "echo", "text --text fenced");
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "hi", "run_in_background": true}),
            ),
            Reply::text(["started"]),
            // Another session of the same connection asks for the first one's task and child.
            call("call_out", "task_output", &json!({"task_id": "subagent-1"})),
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "hi"}),
            ),
            Reply::text(["nothing there"]),
        ])
        .start();
    let ((), _) = with_launch(parent(&llm, state.path(), None, &[]), async |cx, _| {
        for text in ["first", "second"] {
            let mut session = new_session(&cx, cwd.path()).await?;
            let (_, response) = prompt(&mut session, text, Permission::NotExpected).await?;
            assert_eq!(stop_reason(response), StopReason::EndTurn);
        }
        Ok(())
    })
    .await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 5, "{requests:#?}");
    assert_eq!(
        requests[3].tool_result("call_out").unwrap(),
        "no such task \"subagent-1\"; task_list shows this session's tasks"
    );
    assert_eq!(
        requests[4].tool_result("call_msg").unwrap(),
        "no such child \"agent-1\"; list_agents shows this session's children"
    );
    assert_none_left(cwd.path());

    // At the depth cap none of the delegation tools is offered.
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([Reply::text(["alone"])])
        .start();
    let launch = parent(&llm, state.path(), None, &[]).env("ACP_HOST_DEPTH", "1");
    assert_eq!(
        one_turn(launch, cwd.path(), "go").await,
        StopReason::EndTurn
    );
    let offered = llm.requests()[0].tool_names().join(",");
    for tool in [
        "subagent",
        "task_output",
        "task_list",
        "task_kill",
        "send_message",
        "list_agents",
    ] {
        assert!(
            !offered.contains(tool),
            "{tool} offered at the cap: {offered}"
        );
    }
}

/// Reads the pid the mock child wrote to `file`, waiting off the runtime for it.
async fn child_pid(file: std::path::PathBuf) -> u32 {
    tokio::task::spawn_blocking(move || {
        assert!(
            acp_tests::wait_for_file(&file, acp_tests::HANG_GUARD),
            "the child never started"
        );
        acp_tests::read_pid(&file).unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn send_message_reaches_an_idle_live_child_and_closing_the_session_ends_it() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pid_file = cwd.path().join("echo.pid");
    // The mock agent cannot load sessions: a cold resume would fail, so an answer to the message
    // can only come from the live process.
    mock_definition(
        cwd.path(),
        "echo",
        &format!("echo-prompt --pid-file {}", pid_file.display()),
    );
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "first", "run_in_background": true}),
            ),
            call(
                "call_out",
                "task_output",
                &json!({"task_id": "subagent-1", "wait": true}),
            ),
            call("call_idle", "list_agents", &json!({})),
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "second"}),
            ),
            call("call_again", "list_agents", &json!({})),
            Reply::text(["done"]),
        ])
        .start();
    let ((), _) = with_launch(parent(&llm, state.path(), None, &[]), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "go", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        let pid = child_pid(pid_file.clone()).await;
        assert!(acp_tests::process_alive(pid), "the idle child was not kept");
        cx.send_request(CloseSessionRequest::new(session.session_id().clone()))
            .block_task()
            .await?;
        assert!(
            !acp_tests::process_alive(pid),
            "close answered before the idle child was gone"
        );
        Ok(())
    })
    .await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 6, "{requests:#?}");
    assert!(
        requests[2]
            .tool_result("call_out")
            .unwrap()
            .starts_with("subagent-1 (completed): "),
        "{requests:#?}"
    );
    for id in ["call_idle", "call_again"] {
        let agents = requests.iter().find_map(|r| r.tool_result(id)).unwrap();
        assert!(
            agents.starts_with("agent-1: subagent echo, idle, last activity "),
            "{id}: {agents}"
        );
    }
    assert_eq!(requests[4].tool_result("call_msg").unwrap(), "second");
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn an_idle_child_is_closed_after_the_idle_timeout() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pid_file = cwd.path().join("echo.pid");
    mock_definition(
        cwd.path(),
        "echo",
        &format!("echo-prompt --pid-file {}", pid_file.display()),
    );
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "first", "run_in_background": true}),
            ),
            call(
                "call_out",
                "task_output",
                &json!({"task_id": "subagent-1", "wait": true}),
            ),
            Reply::text(["started"]),
            call("call_agents", "list_agents", &json!({})),
            Reply::text(["done"]),
        ])
        .start();
    let launch = parent(&llm, state.path(), None, &["--child-idle-timeout", "1"]);
    let ((), _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "go", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        let pid = child_pid(pid_file.clone()).await;
        let dead = tokio::task::spawn_blocking(move || {
            acp_tests::wait_until_dead(pid, acp_tests::HANG_GUARD)
        })
        .await
        .unwrap();
        assert!(dead, "the idle child outlived its idle timeout");
        let (_, response) = prompt(&mut session, "list", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(())
    })
    .await;
    let agents = llm.requests()[4].tool_result("call_agents").unwrap();
    assert!(
        agents.starts_with("agent-1: subagent echo, ended, last activity "),
        "{agents}"
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn past_four_idle_children_the_one_idle_longest_is_closed() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "echo", "echo-prompt");
    let mut replies = Vec::new();
    for n in 1..=5 {
        replies.push(call(
            &format!("call_bg{n}"),
            "subagent",
            &json!({"agent": "echo", "prompt": format!("job {n}"), "run_in_background": true}),
        ));
        replies.push(call(
            &format!("call_out{n}"),
            "task_output",
            &json!({"task_id": format!("subagent-{n}"), "wait": true}),
        ));
    }
    replies.push(call("call_agents", "list_agents", &json!({})));
    replies.push(Reply::text(["done"]));
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies(replies)
        .start();
    let reason = one_turn(parent(&llm, state.path(), None, &[]), cwd.path(), "go").await;
    assert_eq!(reason, StopReason::EndTurn);
    let requests = llm.requests();
    let agents = requests
        .last()
        .and_then(|r| r.tool_result("call_agents"))
        .unwrap();
    let statuses: Vec<&str> = agents
        .lines()
        .filter_map(|line| line.split(", ").nth(1))
        .collect();
    assert_eq!(
        statuses,
        ["ended", "idle", "idle", "idle", "idle"],
        "{agents}"
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn cancelling_the_session_ends_an_idle_child_and_a_later_message_cannot_reach_it() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let pid_file = cwd.path().join("echo.pid");
    // The mock agent cannot load sessions: after the cancel, only a live process could answer.
    mock_definition(
        cwd.path(),
        "echo",
        &format!("echo-prompt --pid-file {}", pid_file.display()),
    );
    let llm = MockLlm::builder()
        .require_key(Some(KEY))
        .replies([
            call(
                "call_bg",
                "subagent",
                &json!({"agent": "echo", "prompt": "first", "run_in_background": true}),
            ),
            call(
                "call_out",
                "task_output",
                &json!({"task_id": "subagent-1", "wait": true}),
            ),
            call("call_idle", "list_agents", &json!({})),
            Reply::text(["it idles"]),
            call(
                "call_msg",
                "send_message",
                &json!({"child_id": "agent-1", "message": "second"}),
            ),
            call("call_after", "list_agents", &json!({})),
            Reply::text(["done"]),
        ])
        .start();
    let ((), _) = with_launch(parent(&llm, state.path(), None, &[]), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) = prompt(&mut session, "go", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        let pid = child_pid(pid_file.clone()).await;
        assert!(acp_tests::process_alive(pid), "the idle child was not kept");
        // No turn is in flight: the cancel reaches the session's children only.
        cx.send_notification(CancelNotification::new(session.session_id().clone()))?;
        let dead = tokio::task::spawn_blocking(move || {
            acp_tests::wait_until_dead(pid, acp_tests::HANG_GUARD)
        })
        .await
        .unwrap();
        assert!(dead, "the cancel left the idle child running");
        let (_, response) = prompt(&mut session, "again", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(())
    })
    .await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 7, "{requests:#?}");
    let agents = requests[3].tool_result("call_idle").unwrap();
    assert!(
        agents.starts_with("agent-1: subagent echo, idle, last activity "),
        "{agents}"
    );
    // Its process is gone, so the message is a cold resume, which this agent refuses.
    assert_eq!(
        requests[5].tool_result("call_msg").unwrap(),
        "subagent echo cannot be continued: cannot resume session mock-session-1: agent echo \
         does not advertise loadSession, so it cannot continue a saved session; start a new \
         session instead"
    );
    let agents = requests[6].tool_result("call_after").unwrap();
    assert!(
        agents.starts_with("agent-1: subagent echo, failed, last activity "),
        "{agents}"
    );
    assert_none_left(cwd.path());
}
