//! Helpers shared by the suites in which a parent acp-child delegates (delegation, background
//! tasks, live children, subagent sessions): the mock model's key, subagent definitions running
//! the mock agent, the parent's launch (over ACP, or under `acp-host run`, offline or on the mock
//! model), the scripted tool calls that drive delegation, and waits on a child's process or on a
//! point of the parent's turn.
//!
//! Waits that block run off the runtime (`spawn_blocking`), so the connection keeps running
//! meanwhile, and each has a deadline ([`acp_tests::HANG_GUARD`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use acp_tests::acp_client::{Launch, Permission, TurnLog, read_until, stop_reason};
use acp_tests::host_run;
use acp_tests::mock_llm::{MockLlm, RecordedRequest, Reply};
use agent_client_protocol::v1::schema::{
    CancelNotification, CloseSessionRequest, SessionUpdate, StopReason,
};
use agent_client_protocol::v1::{ActiveSession, ConnectionTo};
use agent_client_protocol::{Agent, Error as AcpError};
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use serde_json::{Value, json};

use super::common::{MODEL_ENV, mock_path};

/// The API key the mock model requires; parents forward it to the children they start.
pub(super) const KEY: &str = "test-key";

/// The model acp-child asks the mock model server for.
pub(super) const MODEL: &str = "mock-model";

/// The mock model requiring [`KEY`], answering with `replies` in order.
pub(super) fn keyed_llm(replies: impl IntoIterator<Item = Reply>) -> MockLlm {
    MockLlm::builder()
        .require_key(Some(KEY))
        .replies(replies)
        .start()
}

/// The requests `llm` received, asserting there were `count`.
pub(super) fn model_requests(llm: &MockLlm, count: usize) -> Vec<RecordedRequest> {
    let requests = llm.requests();
    assert_eq!(requests.len(), count, "{requests:#?}");
    requests
}

/// Asserts that no process is left running in `dir`.
pub(super) fn assert_none_left(dir: &Path) {
    assert!(
        acp_tests::wait_until(acp_tests::HANG_GUARD, || acp_tests::processes_in(dir)
            .is_empty()),
        "processes left in {}: {:?}",
        dir.display(),
        acp_tests::processes_in(dir)
    );
}

/// Writes `text` as definition file `<dir>/<file>`, creating `dir`.
pub(super) fn write_definition(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(file), text).unwrap();
}

/// Writes definition `<cwd>/subagents/<name>.md` running the mock agent with `args`, approved
/// as the person would (the trust suite covers definitions that are not).
pub(super) fn mock_definition(cwd: &Path, name: &str, args: &str) {
    let agent = format!("{} {args}", mock_path());
    write_approved(
        &cwd.join("subagents"),
        &format!("{name}.md"),
        &format!(
            "---\ndescription: the mock agent\nrun:\n  agent: {}\n---\nYou are the mock.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    );
}

/// [`write_definition`], then approves the file (`acp-host trust --approve`), as a person who
/// read it would before a repository definition may start.
pub(super) fn write_approved(dir: &Path, file: &str, text: &str) {
    write_definition(dir, file, text);
    acp_tests::approve_definition(&dir.join(file));
}

/// A parent acp-child on `llm`, started by a person (depth 0 of 1), saving sessions in `state`,
/// with `extra` flags; with `children`, it may delegate to acp-child running on that model server
/// (its own key and state forwarded).
pub(super) fn parent(
    llm: &MockLlm,
    state: &Path,
    children: Option<&MockLlm>,
    extra: &[&str],
) -> Launch {
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

/// `acp-host run` driving an offline acp-child that may delegate to acp-child, started by a
/// person (depth 0), with `extra` acp-child flags.
pub(super) fn offline_parent(dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = host_run(dir);
    let mut words = vec!["acp-child", "--subagent-agents", "acp-child"];
    words.extend_from_slice(extra);
    cmd.env_remove(ACP_HOST_DEPTH)
        .env_remove(ACP_HOST_MAX_DEPTH)
        .env_remove("ACP_CHILD_MODEL")
        .args(["--agent", &shell_words::join(words)]);
    cmd
}

/// `acp-host run` driving acp-child on the mock model, allowed to delegate to acp-child;
/// the model settings travel in the environment (so a child acp-child inherits them) when
/// `inherit_model`, else as the parent's own flags (its children then run offline).
pub(super) fn model_parent(
    dir: &Path,
    llm: &MockLlm,
    inherit_model: bool,
    extra: &[&str],
) -> Command {
    let mut cmd = host_run(dir);
    for name in [ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH, "ACP_CHILD_LOG"]
        .iter()
        .chain(MODEL_ENV)
    {
        cmd.env_remove(name);
    }
    let state = dir.join(".state");
    cmd.args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
        .args(["--env", &format!("ACP_CHILD_STATE_DIR={}", state.display())]);
    let mut words = vec![
        "acp-child".to_owned(),
        "--subagent-agents".to_owned(),
        "acp-child".to_owned(),
        "--subagent-env".to_owned(),
        "ACP_CHILD_API_KEY".to_owned(),
    ];
    if inherit_model {
        cmd.args(["--env", &format!("ACP_CHILD_MODEL={MODEL}")])
            .args(["--env", &format!("ACP_CHILD_BASE_URL={}", llm.base_url())]);
    } else {
        words.extend(["--model".to_owned(), MODEL.to_owned()]);
        words.extend(["--base-url".to_owned(), llm.base_url()]);
    }
    words.extend(extra.iter().map(|w| (*w).to_owned()));
    cmd.args(["--agent", &shell_words::join(words)]);
    cmd
}

/// One model reply with a `subagent` call per prompt, all in the same response.
pub(super) fn parallel_calls(prompts: &[&str]) -> Reply {
    let calls: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| {
            json!({"index": index, "id": format!("call_{index}"), "type": "function",
                "function": {"name": "subagent",
                    "arguments": json!({"agent": "acp-child", "prompt": prompt}).to_string()}})
        })
        .collect();
    Reply::Events(vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": calls}, "finish_reason": null}]})
            .to_string(),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        "[DONE]".to_owned(),
    ])
}

/// A reply calling `tool` with `arguments` under id `id`.
pub(super) fn call(id: &str, tool: &str, arguments: &Value) -> Reply {
    Reply::tool_call(id, tool, arguments, 1)
}

/// A reply delegating `prompt` to subagent `agent`, in the foreground.
pub(super) fn delegate(id: &str, agent: &str, prompt: &str) -> Reply {
    call(id, "subagent", &json!({"agent": agent, "prompt": prompt}))
}

/// A reply starting subagent `agent` on `prompt` as a background task.
pub(super) fn delegate_in_background(id: &str, agent: &str, prompt: &str) -> Reply {
    call(
        id,
        "subagent",
        &json!({"agent": agent, "prompt": prompt, "run_in_background": true}),
    )
}

/// A reply waiting for background task `task` to finish (`task_output` with `wait`).
pub(super) fn await_task(id: &str, task: &str) -> Reply {
    call(id, "task_output", &json!({"task_id": task, "wait": true}))
}

/// A reply sending `message` to child `child`.
pub(super) fn send_message(id: &str, child: &str, message: &str) -> Reply {
    call(
        id,
        "send_message",
        &json!({"child_id": child, "message": message}),
    )
}

/// A reply listing the session's children.
pub(super) fn list_agents(id: &str) -> Reply {
    call(id, "list_agents", &json!({}))
}

/// Asserts that a `list_agents` result starts with `entry` (`agent-1: subagent echo, idle`),
/// then the time of its last activity.
pub(super) fn assert_listed(agents: &str, entry: &str) {
    assert!(
        agents.starts_with(&format!("{entry}, last activity ")),
        "{agents}"
    );
}

/// Reads the pid the mock child wrote to `file`, waiting for it.
pub(super) async fn child_pid(file: PathBuf) -> u32 {
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

/// Whether process `pid` died within the deadline.
pub(super) async fn died(pid: u32) -> bool {
    tokio::task::spawn_blocking(move || acp_tests::wait_until_dead(pid, acp_tests::HANG_GUARD))
        .await
        .unwrap()
}

/// Reads the turn running in `session` until the model's tool call `id` is announced; asserts
/// the turn did not end first.
pub(super) async fn until_tool_call(
    session: &mut ActiveSession<'static, Agent>,
    log: &mut TurnLog,
    id: &str,
) -> Result<(), AcpError> {
    let seen = read_until(session, log, Permission::NotExpected, |update| {
        matches!(update, SessionUpdate::ToolCall(call) if call.tool_call_id.to_string() == id)
    })
    .await?;
    assert!(seen.is_none(), "the turn ended before tool call {id}");
    Ok(())
}

/// Cancels the turn running in `session` and reads it to its end; its stop reason.
pub(super) async fn cancel_turn(
    cx: &ConnectionTo<Agent>,
    session: &mut ActiveSession<'static, Agent>,
    log: &mut TurnLog,
) -> Result<StopReason, AcpError> {
    cx.send_notification(CancelNotification::new(session.session_id().clone()))?;
    let response = read_until(session, log, Permission::NotExpected, |_| false)
        .await?
        .expect("the turn ends");
    Ok(stop_reason(response))
}

/// Closes `session`, whose child kept idle wrote its pid to `pid_file`: asserts the child was
/// alive before, and gone once the close is answered.
pub(super) async fn close_ends_idle_child(
    cx: &ConnectionTo<Agent>,
    session: &ActiveSession<'static, Agent>,
    pid_file: PathBuf,
) -> Result<(), AcpError> {
    let pid = child_pid(pid_file).await;
    assert!(acp_tests::process_alive(pid), "the idle child was not kept");
    cx.send_request(CloseSessionRequest::new(session.session_id().clone()))
        .block_task()
        .await?;
    assert!(
        !acp_tests::process_alive(pid),
        "close answered before the idle child was gone"
    );
    Ok(())
}

/// A foreground child's result as the parent's model is told it: `text`, then the child id that
/// `send_message` continues it with (`children::Children::start`).
pub(crate) fn kept(text: &str, child: &str) -> String {
    format!("{text}\n\n[child {child}: send_message to {child} continues this conversation]")
}
