//! Forks: a session started from a copy of another's completed turns (ACP `session/fork`), through
//! the real binaries on the mock model, which records what each request carried.
//!
//! `acp-host run --fork` on acp-child (the new session's first request holds the source's turns
//! and the new prompt, the source file stays byte-identical, a fork is itself loadable and
//! forkable, an unknown source is refused like `--resume`'s), refused with nothing prompted on an
//! agent that cannot fork, as a batch line's `fork`; and delegation with `context: "fork"` (the
//! child's first request holds the parent's earlier turns, not the turn in flight; an agent that
//! cannot fork is refused as the call's result, never started fresh; `list_agents` says which
//! child is a fork; a fork and a fresh child in one turn each start from their own context).

use std::path::Path;

use acp_tests::mock_llm::{MockLlm, RecordedRequest, Reply, message_text};
use acp_tests::{code, run_to_end, stderr, stdout};
use serde_json::{Value, json};

use super::children::{
    assert_none_left, call, kept, keyed_llm, list_agents, mock_definition, model_parent,
    model_requests, send_message,
};
use super::common::{acp_child_json_run, json_run, mock, result_record, temp};

/// Every text of a model request's messages, in order (system prompt excluded).
fn texts(request: &RecordedRequest) -> Vec<String> {
    request.messages()[1..].iter().map(message_text).collect()
}

/// The session id of a finished run's result.
fn session_of(result: &Value) -> String {
    result["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned()
}

/// The session file of `id` under `dir/.state`.
fn session_file(dir: &Path, id: &str) -> std::path::PathBuf {
    dir.join(".state").join(format!("{id}.jsonl"))
}

#[test]
fn a_fork_starts_from_the_completed_turns_with_the_source_settings_and_leaves_the_source_alone() {
    let dir = temp();
    let llm = MockLlm::start(vec![
        Reply::text(["first answer"]),
        Reply::text(["second answer"]),
        Reply::text(["third answer"]),
        Reply::text(["fourth answer"]),
    ]);
    let deny = ["--deny-tools", "write_file"];
    let (_, first) = json_run(
        acp_child_json_run(dir.path(), &llm, &[])
            .args(deny)
            .arg("first question"),
        0,
    );
    let source = session_of(&first);
    assert_eq!(first["forkedFrom"], Value::Null, "{first}");
    let source_file = session_file(dir.path(), &source);
    let before = std::fs::read(&source_file).unwrap();

    // The fork: a new session whose first request holds the source's turn and the new prompt.
    let (_, forked) = json_run(
        acp_child_json_run(dir.path(), &llm, &[])
            .args(["--fork", &source])
            .arg("second question"),
        0,
    );
    let fork = session_of(&forked);
    assert_ne!(fork, source);
    assert_eq!(forked["forkedFrom"], source.as_str(), "{forked}");
    assert_eq!(forked["output"], "second answer");
    assert_eq!(
        std::fs::read(&source_file).unwrap(),
        before,
        "the source was written"
    );
    assert!(session_file(dir.path(), &fork).is_file());

    // A fork is forkable (its copied and its own turns are complete) ...
    let (_, again) = json_run(
        acp_child_json_run(dir.path(), &llm, &[])
            .args(["--fork", &fork])
            .arg("third question"),
        0,
    );
    assert_eq!(again["forkedFrom"], fork.as_str());
    // ... and loadable, without the turn its own fork took.
    let (_, resumed) = json_run(
        acp_child_json_run(dir.path(), &llm, &[])
            .args(["--resume", &fork])
            .arg("fourth question"),
        0,
    );
    assert_eq!(resumed["sessionId"], fork.as_str());
    assert_eq!(resumed["forkedFrom"], Value::Null);
    assert_eq!(std::fs::read(&source_file).unwrap(), before);

    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    assert_eq!(texts(&requests[0]), ["first question"]);
    assert_eq!(
        texts(&requests[1]),
        ["first question", "first answer", "second question"]
    );
    assert_eq!(
        texts(&requests[2]),
        [
            "first question",
            "first answer",
            "second question",
            "second answer",
            "third question"
        ]
    );
    assert_eq!(
        texts(&requests[3]),
        [
            "first question",
            "first answer",
            "second question",
            "second answer",
            "fourth question"
        ]
    );
    // The source's settings came along: the same system prompt and the tool filter.
    for request in &requests {
        assert_eq!(request.messages()[0], requests[0].messages()[0]);
        assert!(!request.tool_names().contains(&"write_file"), "{request:?}");
        assert!(request.tool_names().contains(&"read_file"), "{request:?}");
    }
    assert_none_left(dir.path());
}

#[test]
fn forking_an_unknown_session_is_refused_like_loading_one_and_the_model_is_not_called() {
    let dir = temp();
    let llm = MockLlm::start(Vec::new());
    let out = run_to_end(
        acp_child_json_run(dir.path(), &llm, &[])
            .args(["--fork", "sess-0123456789abcdef"])
            .arg("again"),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["errorKind"], "handshake", "{result}");
    assert_eq!(result["forkedFrom"], Value::Null);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("agent answered session/fork with error")
            && error.contains(&format!(
                "session/fork: unknown session sess-0123456789abcdef: no saved session in {}",
                dir.path().join(".state").display()
            )),
        "{error}"
    );
    assert!(llm.requests().is_empty());
}

#[test]
fn fork_is_refused_before_any_prompt_when_the_agent_cannot_fork() {
    let dir = temp();
    let log = dir.path().join("log");
    let agent = mock(&["hello", "--log", log.to_str().unwrap()]);
    let out = run_to_end(
        acp_tests::host_run(dir.path())
            .args(["--json", "--fork", "sess-1", "--agent", &agent, "x"]),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "capability");
    assert_eq!(result["forkedFrom"], Value::Null);
    assert_eq!(
        result["error"],
        format!(
            "cannot fork session sess-1: agent {agent} does not advertise \
             sessionCapabilities.fork, so it cannot start from a copy of a session; resume it \
             (--resume) or start a new session instead"
        )
    );
    // initialize, then nothing but the end of the pipe.
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "initialize\neof\n");
}

#[test]
fn fork_and_resume_together_are_a_usage_error() {
    let dir = temp();
    let out = run_to_end(
        acp_tests::host_run(dir.path()).args(["--fork", "sess-1", "--resume", "sess-2", "x"]),
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("'--fork <SESSION_ID>' cannot be used with '--resume <SESSION_ID>'"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn a_batch_line_forks_with_its_fork_field() {
    let dir = temp();
    let llm = MockLlm::start(vec![Reply::text(["one"]), Reply::text(["two"])]);
    let (_, first) = json_run(acp_child_json_run(dir.path(), &llm, &[]).arg("first"), 0);
    let source = session_of(&first);
    let state = dir.path().join(".state").display().to_string();
    let agent = shell_words::join([
        "acp-child",
        "--model",
        "mock-model",
        "--base-url",
        &llm.base_url(),
        "--state-dir",
        &state,
    ]);
    let input = dir.path().join("lines.jsonl");
    std::fs::write(
        &input,
        format!(
            "{}\n",
            json!({"id": "f", "prompt": "second", "fork": source})
        ),
    )
    .unwrap();
    let mut batch = std::process::Command::new(acp_tests::bin("acp-host"));
    batch
        .current_dir(dir.path())
        .env_remove("ACP_HOST_LOG")
        .env_remove(protocol::env_vars::ACP_HOST_DEPTH)
        .env_remove(protocol::env_vars::ACP_HOST_MAX_DEPTH);
    for name in super::common::MODEL_ENV {
        batch.env_remove(name);
    }
    let out = run_to_end(batch.args(["batch", "--agent", &agent, input.to_str().unwrap()]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let record: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(record["id"], "f", "{record}");
    assert_eq!(record["forkedFrom"], source.as_str(), "{record}");
    assert_eq!(record["output"], "two");
    let requests = llm.requests();
    assert_eq!(texts(&requests[1]), ["first", "one", "second"]);
}

/// A reply delegating `prompt` to `agent` in the foreground, as a fork of the conversation.
fn delegate_forked(id: &str, agent: &str, prompt: &str) -> Reply {
    call(
        id,
        "subagent",
        &json!({"agent": agent, "prompt": prompt, "context": "fork"}),
    )
}

#[test]
fn a_forked_child_knows_the_parents_completed_turns_and_a_foreign_agent_is_refused() {
    let dir = temp();
    mock_definition(dir.path(), "echo", "hello");
    let llm = keyed_llm([
        // The parent's first turn.
        Reply::text(["noted"]),
        // Its second: a fork asked of an agent that cannot fork, then of acp-child.
        delegate_forked("call_echo", "echo", "what is the code word?"),
        delegate_forked("call_fork", "acp-child", "what is the code word?"),
        // The child's first request.
        Reply::text(["tulip"]),
        Reply::text(["the child says tulip"]),
        // The third: the children, as a loaded session keeps them, and the fork continued (its
        // process is gone with the parent's: a cold resume of its own session).
        list_agents("call_list"),
        send_message("call_again", "agent-1", "and backwards?"),
        Reply::text(["pilut"]),
        Reply::text(["listed"]),
    ]);
    // The parent's state directory is its flag's, not the environment's its children inherit:
    // only the one it hands a forked child leads there.
    let parent_state = dir.path().join(".parent-state");
    let state_flag = ["--state-dir", parent_state.to_str().unwrap()];
    let json_parent = || {
        let mut cmd = model_parent(dir.path(), &llm, true, &state_flag);
        cmd.arg("--json");
        cmd
    };
    let (_, first) = json_run(json_parent().arg("the code word is tulip"), 0);
    let session = session_of(&first);
    let (_, second) = json_run(
        json_parent()
            .args(["--resume", &session])
            .arg("ask a fork for the code word"),
        0,
    );
    assert_eq!(second["output"], "the child says tulip", "{second}");
    let (_, third) = json_run(
        json_parent().args(["--resume", &session]).arg("list them"),
        0,
    );
    assert_eq!(third["output"], "listed");

    let requests = model_requests(&llm, 9);
    // The tool says which agent can inherit the conversation.
    let subagent = requests[1]
        .tools()
        .iter()
        .find(|tool| tool["function"]["name"] == "subagent")
        .expect("subagent is offered");
    let agents = subagent["function"]["parameters"]["properties"]["agent"]["description"]
        .as_str()
        .unwrap();
    assert!(
        agents.contains("(can start from this conversation: context fork)")
            && agents.contains(
                "echo: the mock agent (cannot inherit this conversation: context fresh only)"
            ),
        "{agents}"
    );
    assert_eq!(
        subagent["function"]["parameters"]["properties"]["context"]["enum"],
        json!(["fresh", "fork"])
    );
    // The foreign agent was refused as the call's result, and started nothing.
    assert_eq!(
        requests[2].tool_result("call_echo").unwrap(),
        "subagent echo cannot start from this conversation (context: fork): it is not acp-child, \
         and only acp-child reads this agent's saved sessions; call it with context \"fresh\" \
         and put what it needs in the prompt"
    );
    // The child's first request: the parent's completed turn and its own prompt, nothing of the
    // turn in flight (neither its prompt nor the subagent calls).
    assert_eq!(
        texts(&requests[3]),
        ["the code word is tulip", "noted", "what is the code word?"]
    );
    assert_eq!(
        requests[4].tool_result("call_fork").unwrap(),
        kept("tulip", "agent-1")
    );
    let listed = requests[6].tool_result("call_list").unwrap();
    assert!(
        listed.starts_with("agent-1: subagent acp-child (a fork of this conversation), ended,"),
        "{listed}"
    );
    // `send_message` continued the fork's own session: its history, then the message.
    assert_eq!(
        texts(&requests[7]),
        [
            "the code word is tulip",
            "noted",
            "what is the code word?",
            "tulip",
            "and backwards?"
        ]
    );
    assert_eq!(requests[8].tool_result("call_again").unwrap(), "pilut");
    // The parent's session and its fork, side by side; nothing in the inherited directory.
    let saved = |dir: &Path| {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .filter(|entry| {
                    entry
                        .as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
                })
                .count()
        })
    };
    assert_eq!(saved(&parent_state), 2);
    assert_eq!(saved(&dir.path().join(".state")), 0);
    assert_none_left(dir.path());
}

#[test]
fn a_fork_and_a_fresh_child_in_one_turn_each_start_from_their_own_context() {
    let dir = temp();
    let llm = keyed_llm([
        // The parent's first turn.
        Reply::text(["noted"]),
        // Its second: a fork, then a fresh child of the same agent, in one turn.
        delegate_forked("call_fork", "acp-child", "what is the code word?"),
        Reply::text(["tulip"]),
        call(
            "call_fresh",
            "subagent",
            &json!({"agent": "acp-child", "prompt": "what is the code word?"}),
        ),
        Reply::text(["no idea"]),
        list_agents("call_list"),
        Reply::text(["asked both"]),
    ]);
    let parent_state = dir.path().join(".parent-state");
    let state_flag = ["--state-dir", parent_state.to_str().unwrap()];
    let json_parent = || {
        let mut cmd = model_parent(dir.path(), &llm, true, &state_flag);
        cmd.arg("--json");
        cmd
    };
    let (_, first) = json_run(json_parent().arg("the code word is tulip"), 0);
    let session = session_of(&first);
    let (_, second) = json_run(
        json_parent()
            .args(["--resume", &session])
            .arg("ask a fork and a fresh child"),
        0,
    );
    assert_eq!(second["output"], "asked both", "{second}");
    let requests = model_requests(&llm, 7);
    // The fork's first request: the parent's completed turn, then its prompt.
    assert_eq!(
        texts(&requests[2]),
        ["the code word is tulip", "noted", "what is the code word?"]
    );
    assert_eq!(
        requests[3].tool_result("call_fork").unwrap(),
        kept("tulip", "agent-1")
    );
    // The fresh child's: its prompt alone, nothing of the parent's nor of the fork's.
    assert_eq!(texts(&requests[4]), ["what is the code word?"]);
    assert_eq!(
        requests[5].tool_result("call_fresh").unwrap(),
        kept("no idea", "agent-2")
    );
    let listed = requests[6].tool_result("call_list").unwrap();
    let heads: Vec<&str> = listed
        .lines()
        .map(|line| {
            line.split_once(", last activity")
                .map_or(line, |(head, _)| head)
        })
        .collect();
    assert_eq!(
        heads,
        [
            "agent-1: subagent acp-child (a fork of this conversation), idle",
            "agent-2: subagent acp-child, idle"
        ],
        "{listed}"
    );
    assert_none_left(dir.path());
}

#[test]
fn a_definition_with_run_context_fork_starts_its_child_as_a_fork() {
    let dir = temp();
    super::children::write_approved(
        &dir.path().join("subagents"),
        "twin.md",
        "---\ndescription: a twin\nrun:\n  context: fork\n---\nYou are the twin.\n",
    );
    let llm = keyed_llm([
        Reply::text(["noted"]),
        call(
            "call_twin",
            "subagent",
            &json!({"agent": "twin", "prompt": "and you?"}),
        ),
        Reply::text(["tulip too"]),
        Reply::text(["done"]),
    ]);
    let json_parent = || {
        let mut cmd = model_parent(dir.path(), &llm, true, &[]);
        cmd.arg("--json");
        cmd
    };
    let (_, first) = json_run(json_parent().arg("the code word is tulip"), 0);
    let session = session_of(&first);
    let (_, second) = json_run(
        json_parent()
            .args(["--resume", &session])
            .arg("ask the twin"),
        0,
    );
    assert_eq!(second["output"], "done", "{second}");
    let requests = model_requests(&llm, 4);
    assert_eq!(
        texts(&requests[2]),
        ["the code word is tulip", "noted", "and you?"]
    );
    // `acp-host run --subagent twin` has no conversation to copy: refused, not run fresh.
    let out = run_to_end(acp_tests::host_run(dir.path()).args(["--subagent", "twin", "hello"]));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "subagent twin has `run.context: fork`: it starts from a copy of a session, and a \
             run from here has none to copy; pass --fork SESSION_ID (a result's sessionId)"
        ),
        "{}",
        stderr(&out)
    );
    assert_none_left(dir.path());
}

#[tokio::test]
async fn acp_child_advertises_fork_only_with_saved_sessions_and_refuses_what_load_refuses() {
    use acp_tests::acp_client::{Launch, new_session, with_launch};
    use agent_client_protocol::ErrorCode;
    use agent_client_protocol::v1::schema::ForkSessionRequest;

    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(Vec::new());
    let (errors, _) = with_launch(
        Launch::model(&llm.base_url(), state.path()),
        async |cx, init| {
            assert!(init.agent_capabilities.session_capabilities.fork.is_some());
            // A fresh session has no completed turn: its fork is a new, empty session.
            let open = new_session(&cx, cwd.path()).await?;
            let fork = cx
                .send_request(ForkSessionRequest::new(
                    open.session_id().clone(),
                    cwd.path(),
                ))
                .block_task()
                .await?;
            assert_ne!(&fork.session_id, open.session_id());
            let mut errors = Vec::new();
            for id in ["sess-0123456789abcdef", "../escape"] {
                let error = cx
                    .send_request(ForkSessionRequest::new(id, cwd.path()))
                    .block_task()
                    .await
                    .expect_err("session/fork is refused");
                errors.push((error.code, error.message));
            }
            Ok(errors)
        },
    )
    .await;
    assert_eq!(
        errors,
        [
            (
                ErrorCode::RESOURCE_NOT_FOUND,
                format!(
                    "session/fork: unknown session sess-0123456789abcdef: no saved session in {}; \
                     create one with session/new",
                    state.path().display()
                )
            ),
            (
                ErrorCode::INVALID_PARAMS,
                "session/fork: invalid session id \"../escape\": session ids are letters, digits, \
                 '-' and '_' (as returned by session/new)"
                    .to_owned()
            ),
        ]
    );
    assert!(llm.requests().is_empty());

    // Offline, nothing is saved: nothing to fork, and it says so.
    let (error, _) = with_launch(Launch::offline(), async |cx, init| {
        assert!(init.agent_capabilities.session_capabilities.fork.is_none());
        Ok(cx
            .send_request(ForkSessionRequest::new("sess-1", cwd.path()))
            .block_task()
            .await
            .expect_err("session/fork is refused offline"))
    })
    .await;
    assert_eq!(error.code, ErrorCode::METHOD_NOT_FOUND);
    assert!(
        error
            .message
            .starts_with("session/fork: sessions are saved only when a model is configured"),
        "{}",
        error.message
    );
}
