//! End-to-end: delegation across processes. The depth budget (`ACP_HOST_DEPTH`,
//! `ACP_HOST_MAX_DEPTH`) set by `acp-host run` and enforced before anything is spawned; acp-child
//! delegating to child acp-child processes offline (`/delegate`) and on the mock model (the
//! `subagent` tool): relayed permissions, the depth cap's two faces, timeouts, cancellation,
//! parallel children, and no process left behind.

use std::path::Path;
use std::process::Command;

use acp_tests::mock_llm::{MockLlm, Reply};
use acp_tests::{code, host_run, run_to_end, stderr, stdout};
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use serde_json::{Value, json};

use super::children::{
    KEY, MODEL, assert_none_left, kept, keyed_llm, model_parent, model_requests, offline_parent,
    parallel_calls, write_approved, write_definition,
};
use super::common::{json_run, mock_path};

/// `acp-host run` with the mock echoing the depth variables it was given; it honours the start
/// extension's `maxDepth`, so an explicit cap may be asked of it.
fn echo_depth(dir: &Path) -> Command {
    echo_depth_advertising(dir, "max-depth")
}

/// [`echo_depth`] advertising `advertise` (`--advertise`), logging what it receives to
/// `<dir>/mock.log`.
fn echo_depth_advertising(dir: &Path, advertise: &str) -> Command {
    let mut cmd = host_run(dir);
    let advertise = if advertise.is_empty() {
        String::new()
    } else {
        format!(" --advertise {advertise}")
    };
    let agent = format!(
        "{} echo-env {ACP_HOST_DEPTH} {ACP_HOST_MAX_DEPTH} --log {}{advertise}",
        mock_path(),
        dir.join("mock.log").display()
    );
    cmd.env_remove(ACP_HOST_DEPTH)
        .env_remove(ACP_HOST_MAX_DEPTH)
        .args(["--agent", &agent]);
    cmd
}

/// The `acp-host/start` object the mock received with `session/new`, if any.
fn start_extension_received(dir: &Path) -> Option<Value> {
    std::fs::read_to_string(dir.join("mock.log"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("session/new _meta "))
        .map(|meta| serde_json::from_str::<Value>(meta).unwrap()["acp-host/start"].clone())
}

#[test]
fn an_agent_started_by_a_person_runs_at_depth_0_whatever_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(echo_depth(dir.path()).args([
        "--env",
        &format!("{ACP_HOST_DEPTH}=7"),
        "--env",
        &format!("{ACP_HOST_MAX_DEPTH}=9"),
        "hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{ACP_HOST_DEPTH}=0\n{ACP_HOST_MAX_DEPTH}=1")
    );
}

#[test]
fn an_agent_started_from_an_agent_is_one_deeper_and_the_cap_only_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(echo_depth(dir.path()).env(ACP_HOST_DEPTH, "0").args([
        "--max-depth",
        "3",
        "hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{ACP_HOST_DEPTH}=1\n{ACP_HOST_MAX_DEPTH}=3")
    );
    // The explicit cap is also asked of the agent, through the start extension.
    assert_eq!(
        start_extension_received(dir.path()),
        Some(json!({"version": 1, "maxDepth": 3}))
    );
    let out = run_to_end(
        echo_depth(dir.path())
            .env(ACP_HOST_DEPTH, "0")
            .env(ACP_HOST_MAX_DEPTH, "2")
            .args(["--max-depth", "5", "hi"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{ACP_HOST_DEPTH}=1\n{ACP_HOST_MAX_DEPTH}=2")
    );
}

#[test]
fn an_explicit_cap_for_an_agent_that_cannot_honour_it_is_refused_before_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let (_, result) = json_run(
        echo_depth_advertising(dir.path(), "tools").args(["--json", "--max-depth", "2", "hi"]),
        1,
    );
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "capability");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("capability depth: agent ")
            && error.contains("cannot take a delegation depth cap (2)"),
        "{error}"
    );
    let log = std::fs::read_to_string(dir.path().join("mock.log")).unwrap();
    assert!(
        !log.contains("session/new") && !log.contains("session/prompt"),
        "{log}"
    );

    // The implicit budget is never refused, and is in the environment of every agent.
    let out = run_to_end(echo_depth_advertising(dir.path(), "").arg("hi"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{ACP_HOST_DEPTH}=0\n{ACP_HOST_MAX_DEPTH}=1")
    );
}

#[test]
fn acp_child_enforces_the_cap_asked_at_start_even_when_its_environment_allows_more() {
    let dir = tempfile::tempdir().unwrap();
    // A wrapper lifts the cap in acp-child's environment; the start extension's cap still holds.
    let agent = format!(
        "env ACP_HOST_MAX_DEPTH=5 {} --subagent-agents acp-child",
        acp_tests::bin("acp-child").display()
    );
    let run = |max_depth: &str| {
        let mut cmd = host_run(dir.path());
        cmd.env_remove(ACP_HOST_DEPTH)
            .env_remove(ACP_HOST_MAX_DEPTH)
            .env_remove("ACP_CHILD_MODEL")
            .args(["--agent", &agent, "--max-depth", max_depth])
            .arg("/delegate acp-child /write notes.txt x");
        run_to_end(&mut cmd)
    };
    let out = run("0");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "subagent acp-child ended error: depth limit: the agent would run at depth 1, deeper than \
         the limit of 0 (raise it with --max-depth or the definition's maxDepth where the limit \
         allows; ACP_HOST_MAX_DEPTH set by a parent can only shrink)"
    );
    assert!(!dir.path().join("notes.txt").exists());
    assert_none_left(dir.path());

    // On the model: the session is not offered the `subagent` tool, and a call made anyway is
    // refused by the same depth rule, as at an inherited cap: nothing is started.
    let llm = MockLlm::builder()
        .replies([
            Reply::tool_call(
                "call_forced",
                "subagent",
                &json!({"agent": "acp-child", "prompt": "p"}),
                1,
            ),
            Reply::text(["done"]),
        ])
        .start();
    let mut cmd = host_run(dir.path());
    for name in [ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH, "ACP_CHILD_MODEL"] {
        cmd.env_remove(name);
    }
    let agent = format!(
        "env ACP_HOST_MAX_DEPTH=5 {} --subagent-agents acp-child --model {MODEL} --base-url {} \
         --state-dir {}",
        acp_tests::bin("acp-child").display(),
        llm.base_url(),
        dir.path().join(".state").display()
    );
    let out = run_to_end(cmd.args([
        "--env",
        &format!("ACP_CHILD_API_KEY={KEY}"),
        "--agent",
        &agent,
        "--max-depth",
        "0",
        "go",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "done");
    let requests = model_requests(&llm, 2);
    assert!(!requests[0].tool_names().contains(&"subagent"));
    assert_eq!(
        requests[1].tool_result("call_forced").as_deref(),
        Some(
            "subagent acp-child ended error: depth limit: the agent would run at depth 1, deeper \
             than the limit of 0 (raise it with --max-depth or the definition's maxDepth where \
             the limit allows; ACP_HOST_MAX_DEPTH set by a parent can only shrink)"
        )
    );
    assert_none_left(dir.path());
}

#[test]
fn a_start_past_the_cap_is_refused_and_nothing_is_spawned() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("mock.pid");
    let mut cmd = host_run(dir.path());
    cmd.env(ACP_HOST_DEPTH, "1")
        .env(ACP_HOST_MAX_DEPTH, "1")
        .args(["--json", "--agent"])
        .arg(format!(
            "{} hello --pid-file {}",
            mock_path(),
            pid_file.display()
        ))
        .arg("hi");
    let out = run_to_end(&mut cmd);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // No start (nothing was spawned): the end of the run, then its result.
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["type"], "end");
    assert_eq!(lines[0]["lastAssistantMessage"], Value::Null);
    let result = &lines[1];
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "depth-limit");
    assert_eq!(result["agentExit"]["endedBy"], "not-spawned");
    assert_eq!(
        result["error"],
        "depth limit: the agent would run at depth 2, deeper than the limit of 1 (raise it with \
         --max-depth or the definition's maxDepth where the limit allows; ACP_HOST_MAX_DEPTH set \
         by a parent can only shrink)"
    );
    assert!(!pid_file.exists(), "the mock was spawned");

    // A malformed inherited value fails closed.
    let out = run_to_end(echo_depth(dir.path()).env(ACP_HOST_DEPTH, "deep").arg("hi"));
    assert_eq!(code(&out), 1);
    assert_eq!(
        stderr(&out),
        "acp-host: error: depth limit: ACP_HOST_DEPTH=\"deep\" is not a whole number; refusing to \
         start an agent\n"
    );
}

#[test]
fn a_depth_near_u32_max_stands_at_the_cap_instead_of_overflowing_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("mock.pid");
    let (depth, max_depth) = ("4294967294", "4294967295");
    let past = "ACP_HOST_DEPTH=4294967294 is past 64, the deepest a chain of agents may go, so it \
                reads as at the cap";
    // Held by acp-host run: refused before anything is spawned. (Counting up with saturation, the
    // agent ran at depth u32::MAX "within" a cap of u32::MAX, and so did every agent below it.)
    let mut cmd = host_run(dir.path());
    cmd.env(ACP_HOST_DEPTH, depth)
        .env(ACP_HOST_MAX_DEPTH, max_depth)
        .args(["--json", "--agent"])
        .arg(format!(
            "{} hello --pid-file {}",
            mock_path(),
            pid_file.display()
        ))
        .arg("hi");
    let (records, result) = json_run(&mut cmd, 1);
    assert_eq!(records.len(), 2, "no start: {records:?}");
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "depth-limit");
    assert_eq!(result["agentExit"]["endedBy"], "not-spawned");
    assert_eq!(
        result["error"],
        format!("depth limit: {past}; refusing to start an agent")
    );
    assert!(!pid_file.exists(), "the mock was spawned");

    // Held by acp-child (set by a wrapper): it runs, warns, is not offered delegation, and a
    // `/delegate` is refused by the depth rule with nothing spawned.
    let agent = format!(
        "env {ACP_HOST_DEPTH}={depth} {ACP_HOST_MAX_DEPTH}={max_depth} {} --subagent-agents \
         acp-child",
        acp_tests::bin("acp-child").display()
    );
    let mut cmd = host_run(dir.path());
    cmd.env_remove("ACP_CHILD_MODEL").args([
        "--json",
        "--permission",
        "allow",
        "--agent",
        &agent,
        "/delegate acp-child /write notes.txt x",
    ]);
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(
        result["output"],
        "subagent acp-child ended error: depth limit: the agent would run at depth 65, deeper \
         than the limit of 64 (raise it with --max-depth or the definition's maxDepth where the \
         limit allows; ACP_HOST_MAX_DEPTH set by a parent can only shrink)"
    );
    // Its session never existed: nothing was announced.
    assert_eq!(result.get("children"), None, "{result}");
    let stderr_tail = result["stderrTail"].as_str().unwrap();
    assert!(
        stderr_tail.contains("WARN") && stderr_tail.contains(past),
        "{stderr_tail}"
    );
    assert!(!dir.path().join("notes.txt").exists());
    assert_none_left(dir.path());
}

// ---------------------------------------------------------------------------------------------
// acp-child delegating, offline: `/delegate NAME PROMPT`
// ---------------------------------------------------------------------------------------------

#[test]
fn delegate_runs_a_child_whose_write_is_relayed_to_the_outer_client() {
    let dir = tempfile::tempdir().unwrap();
    let (records, result) = json_run(
        offline_parent(dir.path(), &[]).args([
            "--json",
            "--permission",
            "allow",
            "/delegate acp-child /write notes.txt from the child",
        ]),
        0,
    );
    assert_eq!(result["output"], "wrote 14 bytes to notes.txt");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "from the child"
    );
    // The child's request reached the outer client (acp-host speaks subagent sessions: on the
    // child's own session).
    let permissions = result["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 1, "{permissions:?}");
    assert_eq!(permissions[0]["title"], "Write notes.txt");
    assert_eq!(permissions[0]["sessionId"], "sub-1");
    assert_eq!(permissions[0]["toolKind"], "edit");
    assert_eq!(permissions[0]["verdict"], "allow");
    // The subagent's card: announced, then completed with the child's answer.
    let card: Vec<&Value> = records
        .iter()
        .filter(|r| r["update"]["title"] == "Subagent acp-child: /write notes.txt from the child")
        .collect();
    assert_eq!(card.len(), 1);
    assert_eq!(card[0]["update"]["kind"], "think");
    // The lifecycle: start once the session exists, end with provider, status, stop reason and
    // the last assistant message, then the result.
    let start = &records[0];
    assert_eq!(start["type"], "start");
    assert_eq!(start["provider"], "acp-child --subagent-agents acp-child");
    let end = &records[records.len() - 2];
    assert_eq!(end["type"], "end");
    assert_eq!(end["runId"], start["runId"]);
    assert_eq!(end["provider"], start["provider"]);
    assert_eq!(end["status"], "completed");
    assert_eq!(end["stopReason"], "end_turn");
    assert_eq!(end["lastAssistantMessage"], "wrote 14 bytes to notes.txt");
    assert_none_left(dir.path());
}

#[test]
fn a_relayed_rejection_reaches_the_child_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (_, result) = json_run(
        offline_parent(dir.path(), &[]).args(["--json", "/delegate acp-child /write notes.txt x"]),
        0,
    );
    assert_eq!(
        result["output"],
        "permission denied: did not write notes.txt"
    );
    assert_eq!(result["permissions"][0]["title"], "Write notes.txt");
    assert_eq!(result["permissions"][0]["sessionId"], "sub-1");
    assert_eq!(result["permissions"][0]["verdict"], "reject");
    assert!(!dir.path().join("notes.txt").exists());
    assert_none_left(dir.path());
}

#[test]
fn subagent_permission_policy_answers_without_asking_the_outer_client() {
    let dir = tempfile::tempdir().unwrap();
    let (_, result) = json_run(
        offline_parent(dir.path(), &["--subagent-permission", "allow"])
            .args(["--json", "/delegate acp-child /write notes.txt x"]),
        0,
    );
    assert_eq!(result["output"], "wrote 1 bytes to notes.txt");
    assert_eq!(result["permissions"], serde_json::json!([]));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "x"
    );
}

#[test]
fn delegate_at_the_depth_cap_is_refused_and_nothing_is_spawned() {
    let dir = tempfile::tempdir().unwrap();
    // Started from an agent at depth 0, the delegating acp-child runs at depth 1: the cap.
    let out = run_to_end(
        offline_parent(dir.path(), &[])
            .env(ACP_HOST_DEPTH, "0")
            .args(["/delegate acp-child /write notes.txt x"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "subagent acp-child ended error: depth limit: the agent would run at depth 2, deeper than \
         the limit of 1 (raise it with --max-depth or the definition's maxDepth where the limit \
         allows; ACP_HOST_MAX_DEPTH set by a parent can only shrink)"
    );
    assert!(!dir.path().join("notes.txt").exists());
    assert_none_left(dir.path());
}

#[test]
fn delegate_with_nothing_available_says_how_to_enable_subagents() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(host_run(dir.path()).env_remove("ACP_CHILD_MODEL").args([
        "--agent",
        "acp-child",
        "/delegate acp-child hi",
    ]));
    assert_eq!(code(&out), 0);
    assert_eq!(
        stdout(&out),
        "unknown subagent \"acp-child\": none are available (enable registry agents with \
         --subagent-agents, or add definitions with a `run:` table under subagents/)"
    );
}

#[test]
fn a_child_past_its_timeout_is_a_result_and_is_torn_down() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(
        offline_parent(dir.path(), &["--subagent-timeout", "1"])
            .arg("/delegate acp-child /sleep 60"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "subagent acp-child ended timeout: timed out after 1 s"
    );
    assert_none_left(dir.path());
}

#[test]
fn cancelling_the_parent_mid_child_cancels_the_child_and_leaves_no_process() {
    use nix::sys::signal::Signal;
    let dir = tempfile::tempdir().unwrap();
    let (child, lines) = a_child_asleep(dir.path());
    // acp-host, the parent acp-child and its child all run in `dir`.
    assert_eq!(acp_tests::agents_in(dir.path()).len(), 3);
    crate::run::signal(&child, Signal::SIGINT);
    let out = acp_tests::wait_output(child);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    let last = lines.iter().last().expect("a result record");
    let result: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["stopReason"], "cancelled");
    // The child's session ended, cancelled, before the parent answered.
    assert_eq!(result["children"][0]["state"], "cancelled", "{result}");
    assert_none_left(dir.path());
}

/// A delegating acp-child relays its child's events on its runtime: while the child runs, the
/// parent has no thread besides its main one and the one that serves (no observers' thread per
/// child).
#[test]
fn a_parent_relays_its_childs_events_without_a_thread_of_their_own() {
    use nix::sys::signal::Signal;
    let dir = tempfile::tempdir().unwrap();
    let (host, _lines) = a_child_asleep(dir.path());
    let agents = acp_tests::agents_in(dir.path());
    let parent = agents
        .iter()
        .copied()
        .find(|pid| acp_tests::logical_parent(*pid) == Some(host.id()))
        .expect("the delegating acp-child");
    // Its child runs (asleep) below it.
    assert!(
        agents
            .iter()
            .any(|pid| acp_tests::logical_parent(*pid) == Some(parent)),
        "{agents:?}"
    );
    assert_eq!(acp_tests::thread_names(parent), ["acp-child", "serve"]);
    crate::run::signal(&host, Signal::SIGINT);
    let out = acp_tests::wait_output(host);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    assert_none_left(dir.path());
}

/// `acp-host run --json` of an offline parent delegating `/sleep 60` to acp-child, once the
/// child's session is announced (a `subagent_update`: it exists then, asleep); with the lines of
/// its stdout still to come.
fn a_child_asleep(dir: &Path) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut host = acp_tests::spawn_captured(
        offline_parent(dir, &[]).args(["--json", "/delegate acp-child /sleep 60"]),
    );
    let lines = acp_tests::line_channel(host.stdout.take().unwrap());
    until_line(&lines, "the child's session was never announced", |line| {
        line.contains(r#""sessionUpdate":"subagent_update""#)
    });
    (host, lines)
}

/// Reads `lines` up to the first that `matches` (failing with `never` past the hang guard).
fn until_line(
    lines: &std::sync::mpsc::Receiver<String>,
    never: &str,
    matches: impl Fn(&str) -> bool,
) {
    let deadline = std::time::Instant::now() + acp_tests::HANG_GUARD;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if matches(&lines.recv_timeout(left).expect(never)) {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// acp-child delegating on a model: the `subagent` tool
// ---------------------------------------------------------------------------------------------

#[test]
fn a_model_delegates_to_a_child_on_the_model_whose_write_is_relayed_and_which_cannot_delegate() {
    let dir = tempfile::tempdir().unwrap();
    let llm = keyed_llm([
        // The parent delegates.
        Reply::tool_call(
            "call_parent",
            "subagent",
            &json!({"agent": "acp-child", "prompt": "write the notes", "description": "Write notes"}),
            3,
        ),
        // The child writes (asking permission), then answers.
        Reply::tool_call(
            "call_child",
            "write_file",
            &json!({"path": "notes.txt", "content": "from the child"}),
            1,
        ),
        Reply::text(["child ", "done"]),
        // The parent reads the child's answer.
        Reply::text(["parent done"]),
    ]);
    let (records, result) = json_run(
        model_parent(dir.path(), &llm, true, &[]).args(["--json", "--permission", "allow", "go"]),
        0,
    );
    assert_eq!(result["output"], "parent done");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "from the child"
    );
    let permissions = result["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 1, "{permissions:?}");
    assert_eq!(permissions[0]["title"], "Write notes.txt");
    assert_eq!(permissions[0]["sessionId"], "sub-1");
    assert_eq!(permissions[0]["verdict"], "allow");

    let requests = model_requests(&llm, 4);
    // Prompt face: the parent (depth 0) is offered the tool, with the enabled names as an enum;
    // the child (depth 1, the cap) is not.
    assert!(requests[0].tool_names().contains(&"subagent"));
    let tool = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap();
    assert_eq!(
        tool["function"]["parameters"]["properties"]["agent"]["enum"],
        json!(["acp-child"])
    );
    assert_eq!(
        requests[1].last_user_text().as_deref(),
        Some("write the notes")
    );
    assert!(!requests[1].tool_names().contains(&"subagent"));
    assert!(!requests[2].tool_names().contains(&"subagent"));
    // The child's final text is the parent's tool result.
    assert_eq!(
        requests[3].tool_result("call_parent"),
        Some(kept("child done", "agent-1"))
    );
    // The card names the subagent and references the child's session, where its text went.
    let card_title = records
        .iter()
        .find(|r| r["update"]["sessionUpdate"] == "tool_call")
        .map(|r| r["update"]["title"].clone());
    assert_eq!(card_title, Some(json!("Subagent acp-child: Write notes")));
    assert!(records.iter().any(|r| {
        r["update"]["toolCallId"] == "call_parent"
            && r["update"]["content"] == json!([{"type": "session", "sessionId": "sub-1"}])
    }));
    let child_text: String = records
        .iter()
        .filter(|r| {
            r["sessionId"] == "sub-1" && r["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .filter_map(|r| r["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(child_text, "child done");
    assert_eq!(result["children"][0]["task"], "Write notes");
    assert_none_left(dir.path());
}

#[test]
fn subagent_calls_of_one_reply_run_together_up_to_the_limit() {
    for (limit, expected_max) in [(None, 4), (Some("2"), 2)] {
        let dir = tempfile::tempdir().unwrap();
        let llm = keyed_llm([
            parallel_calls(&["/sleep 2", "/sleep 2", "/sleep 2", "/sleep 2"]),
            Reply::text(["all done"]),
        ]);
        // Children that answered are not kept alive, so every child process counted is running.
        let mut extra = vec!["--child-idle-timeout", "0"];
        extra.extend(
            limit
                .map(|n| ["--max-parallel-subagents", n])
                .into_iter()
                .flatten(),
        );
        let child = model_parent(dir.path(), &llm, false, &extra)
            .arg("go")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // acp-host and the parent run in `dir` beside the children: watch how many children
        // run at once until the run ends. A pass over /proc is not atomic (under load it can see
        // a child that is exiting and the one started in its slot), and a watchdog is counted
        // until it names itself, so only processes seen in two passes in a row count: each child
        // sleeps 2 s, far longer than a pass.
        let pid = child.id();
        let mut most = 0;
        let mut before = std::collections::HashSet::new();
        // A parent on a model forks its children's watchdogs from its spawner.
        let mut under_spawner = false;
        while acp_tests::process_alive(pid) {
            let now: std::collections::HashSet<u32> =
                acp_tests::agents_in(dir.path()).into_iter().collect();
            under_spawner |= now.iter().any(|agent| {
                acp_tests::parent_of(*agent).is_some_and(|watchdog| {
                    acp_tests::is_watchdog(watchdog)
                        && acp_tests::parent_of(watchdog).is_some_and(acp_tests::is_spawner)
                })
            });
            most = most.max(now.intersection(&before).count().saturating_sub(2));
            if most > expected_max {
                break;
            }
            before = now;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = acp_tests::wait_output(child);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(stdout(&out), "all done");
        assert_eq!(most, expected_max, "limit {limit:?}");
        assert!(
            under_spawner,
            "no child ran under a watchdog of the parent's spawner"
        );
        let requests = llm.requests();
        assert_eq!(requests.len(), 2);
        for index in 0..4 {
            assert_eq!(
                requests[1].tool_result(&format!("call_{index}")).as_deref(),
                Some("slept 2 s")
            );
        }
        assert_none_left(dir.path());
    }
}

#[test]
fn a_forced_subagent_call_at_the_cap_is_refused_as_a_tool_result() {
    let dir = tempfile::tempdir().unwrap();
    let llm = keyed_llm([
        Reply::tool_call(
            "call_forced",
            "subagent",
            &json!({"agent": "acp-child", "prompt": "/write notes.txt x"}),
            1,
        ),
        Reply::text(["understood"]),
    ]);
    // Started from an agent at depth 0: the parent runs at depth 1, the cap.
    let out = run_to_end(
        model_parent(dir.path(), &llm, false, &[])
            .env(ACP_HOST_DEPTH, "0")
            .args(["--permission", "allow", "go"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "understood");
    let requests = llm.requests();
    assert!(!requests[0].tool_names().contains(&"subagent"));
    assert_eq!(
        requests[1].tool_result("call_forced").as_deref(),
        Some(
            "subagent acp-child ended error: depth limit: the agent would run at depth 2, deeper \
             than the limit of 1 (raise it with --max-depth or the definition's maxDepth where \
             the limit allows; ACP_HOST_MAX_DEPTH set by a parent can only shrink)"
        )
    );
    assert!(!dir.path().join("notes.txt").exists());
    assert_none_left(dir.path());
}

#[test]
fn a_child_that_cannot_start_is_a_result_naming_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    // The enabled agent is one whose program is not installed.
    let text = delegate_to_uninstalled(dir.path(), "codex");
    assert!(
        text.starts_with("subagent codex ended error: ")
            && text.contains("npm install -g @zed-industries/codex-acp"),
        "{text}"
    );
    assert_none_left(dir.path());
}

/// What an offline parent in `dir` answers to `/delegate NAME review` with registry agent `name`
/// enabled (`--subagent-agents NAME`) and nothing on PATH, so its program is not found.
fn delegate_to_uninstalled(dir: &Path, name: &str) -> String {
    let mut cmd = offline_parent(dir, &[]);
    cmd.args([
        "--agent",
        &format!("acp-child --subagent-agents {name}"),
        &format!("/delegate {name} review"),
    ])
    .env("PATH", "/nonexistent");
    let out = run_to_end(&mut cmd);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    stdout(&out)
}

#[tokio::test]
async fn a_command_the_agent_runs_inherits_its_standing_so_acp_host_inside_it_goes_one_deeper() {
    use acp_tests::acp_client::{Launch, Permission, new_session, prompt, with_launch};
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_env",
            "run_command",
            &json!({"command": format!("echo ${ACP_HOST_DEPTH}/${ACP_HOST_MAX_DEPTH}")}),
            1,
        ),
        Reply::text(["done"]),
    ]);
    // Started like an editor starts it: this test's own environment, no depth set by a host.
    let launch = Launch::model(&llm.base_url(), state.path());
    with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_log, response) = prompt(&mut session, "show the depth", Permission::Allow).await?;
        assert!(response.is_ok());
        Ok(())
    })
    .await;
    let own = protocol::depth::own(protocol::depth::Inherited {
        depth: std::env::var(ACP_HOST_DEPTH).ok().as_deref(),
        max_depth: std::env::var(ACP_HOST_MAX_DEPTH).ok().as_deref(),
    })
    .unwrap()
    .budget;
    let result = llm.requests()[1].tool_result("call_env").unwrap();
    assert!(
        result.contains(&format!("{}/{}", own.depth, own.max_depth)),
        "{result}"
    );
}

// ---------------------------------------------------------------------------------------------
// Subagent definitions with a `run:` table
// ---------------------------------------------------------------------------------------------

#[test]
fn a_definition_runs_a_foreign_agent_with_its_persona_before_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let agent = format!("{} echo-prompt", mock_path());
    write_approved(
        &dir.path().join("subagents"),
        "echo.md",
        &format!(
            "---\ndescription: answers from the mock\nrun:\n  agent: {}\n---\nYou are the echo.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    );
    // No registry agent enabled: the definition alone makes `echo` available.
    let out = run_to_end(
        host_run(dir.path())
            .env_remove("ACP_CHILD_MODEL")
            .env_remove(ACP_HOST_DEPTH)
            .env_remove(ACP_HOST_MAX_DEPTH)
            .args(["--agent", "acp-child", "/delegate echo say hi"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        protocol::capabilities::preamble("You are the echo.", "say hi")
    );
    assert_none_left(dir.path());
}

#[test]
fn one_bad_definition_is_reported_and_does_not_hide_the_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    let extra = tempfile::tempdir().unwrap();
    let agent = format!("{} text --text ok", mock_path());
    let good = format!(
        "---\ndescription: fine\nrun: {{agent: {}}}\n---\nBe fine.\n",
        serde_json::to_string(&agent).unwrap()
    );
    write_definition(extra.path(), "good.md", &good);
    write_definition(
        extra.path(),
        "typo.md",
        "---\ndescription: d\nrun: {modle: x}\n---\nB\n",
    );
    let host = |prompt: &str| {
        let mut cmd = host_run(dir.path());
        cmd.env_remove("ACP_CHILD_MODEL")
            .env_remove(ACP_HOST_DEPTH)
            .env_remove(ACP_HOST_MAX_DEPTH)
            .args([
                "--agent",
                &shell_words::join([
                    "acp-child",
                    "--subagents",
                    &extra.path().display().to_string(),
                ]),
                prompt,
            ]);
        run_to_end(&mut cmd)
    };
    let out = host("/delegate good go");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ok");
    let out = host("/delegate typo go");
    let shown = extra.path().display();
    assert_eq!(
        stdout(&out),
        format!(
            "unknown subagent \"typo\"; the subagents are: good\n\
             {shown}/typo.md: field `run.modle`: unknown run field; allowed: agent, model, tools, \
             denyTools, personaMode, permission, env, timeout, maxDepth, context, tokenBudget, costBudget, sandbox, network, isolation"
        )
    );
}

#[test]
fn a_definition_running_acp_child_applies_its_model_and_persona_and_is_offered_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_approved(
        &dir.path().join("subagents"),
        "reviewer.md",
        "---\ndescription: reviews code\nrun:\n  model: reviewer-model\n  personaMode: override\n  tools: [read_file, search]\n  denyTools: [search]\n  env: [ACP_CHILD_API_KEY]\n---\nYou review {{cwd}} as {{model}}.\n",
    );
    let llm = keyed_llm([
        Reply::tool_call(
            "call_review",
            "subagent",
            &json!({"agent": "reviewer", "prompt": "review it"}),
            1,
        ),
        Reply::text(["looks good"]),
        Reply::text(["reviewed"]),
    ]);
    // The parent's model is its own flag; the base URL travels in the environment.
    let out = run_to_end(
        model_parent(dir.path(), &llm, false, &[])
            .args(["--env", &format!("ACP_CHILD_BASE_URL={}", llm.base_url())])
            .arg("go"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "reviewed");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    let tool = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap();
    assert_eq!(
        tool["function"]["parameters"]["properties"]["agent"]["enum"],
        json!(["acp-child", "reviewer"])
    );
    assert!(
        tool["function"]["parameters"]["properties"]["agent"]["description"]
            .as_str()
            .unwrap()
            .contains("reviewer: reviews code")
    );
    // The child ran on the definition's model and tools, with the body as its whole system
    // prompt.
    assert_eq!(requests[1].body["model"], "reviewer-model");
    assert_eq!(requests[1].tool_names(), ["read_file"]);
    let canonical = dir.path().canonicalize().unwrap();
    assert_eq!(
        requests[1].messages()[0]["content"],
        format!("You review {} as reviewer-model.", canonical.display())
    );
    assert_eq!(
        requests[2].tool_result("call_review"),
        Some(kept("looks good", "agent-1"))
    );
    assert_none_left(dir.path());
}

// ---------------------------------------------------------------------------------------------
// `acp-host run --subagent NAME`
// ---------------------------------------------------------------------------------------------

/// `acp-host run` started by a person, offline, in `dir`.
fn person_run(dir: &Path) -> Command {
    let mut cmd = host_run(dir);
    cmd.env_remove("ACP_CHILD_MODEL")
        .env_remove(ACP_HOST_DEPTH)
        .env_remove(ACP_HOST_MAX_DEPTH);
    cmd
}

#[test]
fn run_subagent_applies_the_definition_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let mine = tempfile::tempdir().unwrap();
    // A folder the person names is theirs: its `permission: allow` applies as written.
    write_definition(
        mine.path(),
        "writer.md",
        "---\ndescription: writes\nrun: {permission: allow}\n---\nYou write.\n",
    );
    let named = ["--subagents", &mine.path().display().to_string()];
    let out = run_to_end(person_run(dir.path()).args(named).args([
        "--subagent",
        "writer",
        "/write a.txt hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "wrote 2 bytes to a.txt");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "hi"
    );
    // --permission on the command line wins over the definition's.
    let out = run_to_end(person_run(dir.path()).args(named).args([
        "--subagent",
        "writer",
        "--permission",
        "reject",
        "/write b.txt hi",
    ]));
    assert_eq!(stdout(&out), "permission denied: did not write b.txt");
    assert!(!dir.path().join("b.txt").exists());
}

#[test]
fn run_subagent_of_a_foreign_agent_sends_the_persona_before_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let defs = tempfile::tempdir().unwrap();
    let agent = format!("{} echo-prompt", mock_path());
    write_definition(
        defs.path(),
        "echo.md",
        &format!(
            "---\ndescription: d\nrun: {{agent: {}}}\n---\nYou echo.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    );
    let out = run_to_end(person_run(dir.path()).args([
        "--subagents",
        &defs.path().display().to_string(),
        "--subagent",
        "echo",
        "hello",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        protocol::capabilities::preamble("You echo.", "hello")
    );
}

#[test]
fn run_subagent_on_acp_child_applies_model_and_persona() {
    let dir = tempfile::tempdir().unwrap();
    write_approved(
        &dir.path().join("subagents"),
        "reviewer.md",
        "---\ndescription: d\nrun: {model: reviewer-model, env: [ACP_CHILD_API_KEY]}\n---\nReview as {{model}}.\n",
    );
    let llm = keyed_llm([Reply::text(["fine"])]);
    let out = run_to_end(
        person_run(dir.path())
            .env("ACP_CHILD_API_KEY", KEY)
            .env("ACP_CHILD_BASE_URL", llm.base_url())
            .env("ACP_CHILD_STATE_DIR", dir.path().join(".state"))
            .args(["--subagent", "reviewer", "review it"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "fine");
    let requests = llm.requests();
    assert_eq!(requests[0].body["model"], "reviewer-model");
    // Added to acp-child's own persona (the default mode), identity first.
    let system = requests[0].messages()[0]["content"].as_str().unwrap();
    assert!(
        system.starts_with("Review as reviewer-model.\n\nYou are acp-child"),
        "{system}"
    );
}

#[test]
fn run_subagent_refuses_bad_or_missing_definitions_before_spawning() {
    let dir = tempfile::tempdir().unwrap();
    let subagents = dir.path().join("subagents");
    write_definition(
        &subagents,
        "typo.md",
        "---\ndescription: d\nrun: {modle: x}\n---\nB\n",
    );
    write_definition(
        &subagents,
        "three.md",
        "---\ndescription: d\nrun: {modle: x, timeout: 0, permission: maybe}\n---\nB\n",
    );
    write_definition(
        &subagents,
        "plain.md",
        "---\ndescription: d\nagents: [codex]\n---\nB\n",
    );
    let shown = subagents.display();
    for (name, expected) in [
        (
            "typo",
            format!(
                "{shown}/typo.md: field `run.modle`: unknown run field; allowed: agent, model, \
                 tools, denyTools, personaMode, permission, env, timeout, maxDepth, context, tokenBudget, costBudget, sandbox, network, isolation"
            ),
        ),
        (
            "three",
            format!(
                "{shown}/three.md: 3 problems: field `run.modle`: unknown run field; allowed: \
                 agent, model, tools, denyTools, personaMode, permission, env, timeout, maxDepth, \
                 context, tokenBudget, costBudget, sandbox, network, isolation; field \
                 `run.timeout`: must be a whole number of seconds, at least 1, got the number 0; \
                 field `run.permission`: must be one of relay, reject, allow, got the string \
                 \"maybe\""
            ),
        ),
        (
            "plain",
            format!(
                "{shown}/plain.md: has no `run:` table; add `run: {{}}` to run it with the \
                 defaults (acp-child)"
            ),
        ),
        (
            "missing",
            format!(
                "--subagent missing: no missing.md in {shown} (add the definition, or pass \
                 --subagents DIR)"
            ),
        ),
    ] {
        let out = run_to_end(person_run(dir.path()).args(["--subagent", name, "hi"]));
        assert_eq!(code(&out), 2, "{name}");
        assert_eq!(
            stderr(&out),
            format!("acp-host: error: {expected}\n"),
            "{name}"
        );
        assert_eq!(stdout(&out), "");
    }
}

#[test]
fn a_child_that_crashes_is_a_result_with_its_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let agent = format!("{} crash-on-prompt", mock_path());
    write_approved(
        &dir.path().join("subagents"),
        "crasher.md",
        &format!(
            "---\ndescription: d\nrun: {{agent: {}}}\n---\nCrash.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    );
    let out =
        run_to_end(person_run(dir.path()).args(["--agent", "acp-child", "/delegate crasher go"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("subagent crasher ended error: ")
            && text.ends_with("\n\nIts output so far:\npartial output"),
        "{text}"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_delegated_answer_does_not_wait_for_the_child_to_exit_yet_the_child_exits_before_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("flushed");
    // It answers, then takes half a second to exit once its stdin is closed (within the EOF
    // grace of both its parent and acp-host), leaving the marker as it goes.
    let agent = format!(
        "{} flush-on-eof --marker {} --delay-ms 500",
        mock_path(),
        marker.display()
    );
    write_approved(
        &dir.path().join("subagents"),
        "lingerer.md",
        &format!(
            "---\ndescription: d\nrun: {{agent: {}}}\n---\nLinger.\n",
            serde_json::to_string(&agent).unwrap()
        ),
    );
    let mut child = acp_tests::spawn_captured(person_run(dir.path()).args([
        "--json",
        "--agent",
        "acp-child",
        "/delegate lingerer go",
    ]));
    let lines = acp_tests::line_channel(child.stdout.take().unwrap());
    until_line(&lines, "the delegation's call never completed", |line| {
        line.contains(r#""sessionUpdate":"tool_call_update""#)
            && line.contains(r#""status":"completed""#)
    });
    // The answer came while the child was still on its way out.
    assert!(
        !marker.exists(),
        "the call's answer waited for the child's process to exit"
    );
    let out = acp_tests::wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Its teardown was awaited before the parent ended: it exited on its own, not killed.
    assert!(marker.exists(), "the child did not finish its exit");
    let result: Value =
        serde_json::from_str(&lines.iter().last().expect("a result record")).unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    assert_none_left(dir.path());
}

#[test]
fn when_the_delegating_agent_dies_its_child_dies_too() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let host = offline_parent(dir.path(), &[])
        .arg("/delegate acp-child /sleep 60")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        acp_tests::wait_until(acp_tests::HANG_GUARD, || acp_tests::agents_in(dir.path())
            .len()
            >= 3),
        "the child never started"
    );
    // The delegating acp-child is the one acp-host started (under its watchdog).
    let delegating_pid = acp_tests::agents_in(dir.path())
        .into_iter()
        .find(|pid| acp_tests::logical_parent(*pid) == Some(host.id()))
        .expect("the delegating acp-child");
    kill(
        Pid::from_raw(i32::try_from(delegating_pid).unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let out = acp_tests::wait_output(host);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_none_left(dir.path());
}

#[test]
fn a_subagent_call_with_an_output_schema_returns_the_childs_checked_json() {
    let dir = tempfile::tempdir().unwrap();
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let llm = keyed_llm([
        Reply::tool_call(
            "call_parent",
            "subagent",
            &json!({"agent": "acp-child", "prompt": "count", "output_schema": schema}),
            1,
        ),
        // The child answers through its capture tool, which ends its turn.
        Reply::tool_call("call_child", "submit_result", &json!({"n": 4}), 1),
        Reply::text(["the child counted"]),
    ]);
    let out = run_to_end(model_parent(dir.path(), &llm, true, &[]).arg("go"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "the child counted");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    assert!(
        requests[1].tool_names().contains(&"submit_result"),
        "{:?}",
        requests[1].tool_names()
    );
    assert_eq!(
        requests[2].tool_result("call_parent"),
        Some(kept("{\"n\":4}", "agent-1"))
    );
    assert_none_left(dir.path());
}

#[test]
fn an_unset_forwarded_variable_is_named_with_the_acp_child_flag_that_forwards_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(
        offline_parent(dir.path(), &["--subagent-env", "ACP_TEST_NEVER_SET"])
            .env_remove("ACP_TEST_NEVER_SET")
            .args(["/delegate acp-child hi"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "subagent acp-child was not started: ACP_TEST_NEVER_SET is forwarded by --subagent-env \
         ACP_TEST_NEVER_SET, but it is not set in acp-child's environment (set it where acp-child \
         is started, or stop forwarding it)"
    );
    assert_none_left(dir.path());
}

#[test]
fn subagent_env_takes_names_only_and_is_checked_at_start() {
    for (arg, message) in [
        (
            "IS_SANDBOX=1",
            "acp-child: error: --subagent-env \"IS_SANDBOX\": takes a variable NAME only, never \
             NAME=VALUE (acp-child forwards its own value of NAME: set it in acp-child's \
             environment)\n",
        ),
        (
            "=1",
            "acp-child: error: --subagent-env \"\": not a variable name (a non-empty NAME with no \
             `=` or NUL byte)\n",
        ),
    ] {
        let out = run_to_end(
            Command::new(acp_tests::bin("acp-child"))
                .args(["--subagent-env", arg])
                .stdin(std::process::Stdio::null()),
        );
        assert_eq!(code(&out), 2, "{arg}");
        assert_eq!(stderr(&out), message, "{arg}");
        assert_eq!(stdout(&out), "", "{arg}");
    }
}

#[test]
fn a_registry_alias_is_enabled_under_the_name_given() {
    let dir = tempfile::tempdir().unwrap();
    // `claude` is claude-code's alias; its program is not installed here.
    let text = delegate_to_uninstalled(dir.path(), "claude");
    assert!(
        text.starts_with("subagent claude ended error: ")
            && text.contains("npm install -g @zed-industries/claude-code-acp"),
        "{text}"
    );
    assert_none_left(dir.path());
    // Two names of one agent are refused at start, naming both and the canonical one.
    let out = run_to_end(
        Command::new(acp_tests::bin("acp-child"))
            .args(["--subagent-agents", "claude,claude-code"])
            .stdin(std::process::Stdio::null()),
    );
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-child: error: --subagent-agents: claude and claude-code are the same agent \
         (claude-code); name it once\n"
    );
}

#[test]
fn a_child_failing_on_its_stderr_shows_why_in_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let defs = tempfile::tempdir().unwrap();
    write_definition(
        defs.path(),
        "failer.md",
        "---\ndescription: d\nrun:\n  agent: \"sh -c 'echo starting >&2; echo this agent cannot be used with root/sudo >&2; exit 3'\"\n---\nB\n",
    );
    let agent = shell_words::join([
        "acp-child",
        "--subagents",
        &defs.path().display().to_string(),
    ]);
    let out = run_to_end(person_run(dir.path()).args(["--agent", &agent, "/delegate failer hi"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "subagent failer ended error: agent closed its output before answering initialize; it \
         exited with code 3\n\nIts stderr (the end):\nstarting\nthis agent cannot be used with \
         root/sudo"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_child_session_that_failed_lists_its_error_and_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let defs = tempfile::tempdir().unwrap();
    write_definition(
        defs.path(),
        "crasher.md",
        &format!(
            "---\ndescription: d\nrun:\n  agent: {}\n---\nB\n",
            serde_json::to_string(&format!("{} crash-on-prompt", mock_path())).unwrap()
        ),
    );
    let agent = shell_words::join([
        "acp-child",
        "--subagents",
        &defs.path().display().to_string(),
    ]);
    let args = ["--agent", &agent, "/delegate crasher hi"];
    let (_, result) = json_run(person_run(dir.path()).arg("--json").args(args), 0);
    let child = &result["children"][0];
    assert_eq!(child["state"], "failed", "{result}");
    assert_eq!(child["stderrTail"], "mock: fatal error", "{result}");
    assert!(
        child["error"]
            .as_str()
            .is_some_and(|error| error.contains("exited with code 3")),
        "{result}"
    );
    // `--verbose` says it too, line by line.
    let out = run_to_end(person_run(dir.path()).arg("--verbose").args(args));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("[subagent] crasher failed (error): ")
            && err.contains("[subagent] crasher stderr: mock: fatal error\n"),
        "{err}"
    );
    // A status-only update of a card names the call by its title.
    assert!(
        err.contains("[tool_call_update] Subagent crasher: hi failed\n"),
        "{err}"
    );
    assert!(!err.contains("[tool_call_update]  "), "{err}");
    assert_none_left(dir.path());
}
