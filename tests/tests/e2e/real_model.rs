//! End-to-end against a real model server: acp-child on llama.cpp (llama-cpp-python's
//! OpenAI-compatible server, serving SmolLM2-135M-Instruct), through acp-host, as a new user runs
//! it: `--base-url` alone (the model discovered), a turn, a cancel, usage estimated (the server
//! sends none), `--token-budget` held before a request and mid-stream, a delegated child.
//!
//! Opt-in: `scripts/real-model` installs the server and the model from `PyPI` into a cached venv,
//! starts it on loopback and runs this module with [`BASE_URL_VAR`] set. Without it every test
//! says it is skipped and passes: the rest of the suite never needs a model. What a small model
//! says is not scripted, so the tests assert what the toolkit guarantees (statuses, exit codes,
//! counts, the estimate's marking, the cut's place, no process left), never the words.

use std::path::Path;
use std::process::{Command, Stdio};

use acp_tests::{HANG_GUARD, line_channel, wait_output};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::children::assert_none_left;
use super::common::{MODEL_ENV, json_run, temp};

/// The real server's base URL (`http://127.0.0.1:PORT/v1`), set by `scripts/real-model`.
const BASE_URL_VAR: &str = "ACP_TESTS_REAL_MODEL_URL";

/// A prompt whose answer runs long: SmolLM2-135M wrote 1,400 to 2,000 tokens for it, run after
/// run (until the context filled), where a request to count came back short now and then.
const LONG: &str = "Write a long story about a dragon who learns to cook, with many chapters.";

/// The server's base URL, or `None` (the test is skipped) when the suite runs without one.
#[expect(clippy::print_stderr, reason = "a skipped test says why")]
fn server() -> Option<String> {
    let url = std::env::var(BASE_URL_VAR)
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        eprintln!("skipped: the real-model suite needs {BASE_URL_VAR} (run scripts/real-model)");
    }
    url
}

/// `acp-host run --json` of `acp-child --base-url URL` (no `--model`) in `dir`, with `host_args`.
fn real_run(dir: &Path, url: &str, host_args: &[&str]) -> Command {
    let mut cmd = acp_tests::host_run(dir);
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    let state = dir.join(".state").display().to_string();
    let agent = shell_words::join(["acp-child", "--base-url", url, "--state-dir", &state]);
    cmd.args(["--json", "--agent", &agent]).args(host_args);
    cmd
}

/// The message chunks among `records` (the text the model streamed, one delta each).
fn chunks(records: &[Value]) -> usize {
    records
        .iter()
        .filter(|r| r["type"] == "update" && r["update"]["sessionUpdate"] == "agent_message_chunk")
        .count()
}

#[test]
fn base_url_alone_answers_with_the_servers_model_and_the_usage_is_an_estimate() {
    let Some(url) = server() else { return };
    let dir = temp();
    let (records, result) = json_run(real_run(dir.path(), &url, &[]).arg("Say hello."), 0);
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["stopReason"], "end_turn");
    let output = result["output"].as_str().unwrap();
    assert!(!output.trim().is_empty(), "{result}");
    assert_ne!(
        output,
        acp_child::NO_MODEL_REPLY.concat(),
        "not the offline backend"
    );
    // llama.cpp sends no usage: acp-child's count, marked. Each delta is a token there.
    let usage = &result["usage"];
    assert_eq!(usage["estimated"], true, "{result}");
    let output_tokens = usage["outputTokens"].as_u64().unwrap();
    assert!(output_tokens >= chunks(&records) as u64, "{result}");
    assert!(
        usage["inputTokens"].as_u64().unwrap() > 100,
        "the system prompt and tools"
    );
    assert_none_left(dir.path());
}

#[test]
fn ctrl_c_mid_answer_ends_the_run_cancelled_and_leaves_nothing() {
    let Some(url) = server() else { return };
    let dir = temp();
    let mut child = real_run(dir.path(), &url, &[])
        .arg(LONG)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acp-host starts");
    let lines = line_channel(child.stdout.take().expect("stdout piped"));
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + HANG_GUARD;
    // The answer is streaming once a few chunks came.
    while seen
        .iter()
        .filter(|line: &&String| line.contains("agent_message_chunk"))
        .count()
        < 3
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = lines.recv_timeout(left) else {
            let _ = child.kill();
            panic!("no answer streamed; saw {seen:#?}");
        };
        seen.push(line);
    }
    crate::run::signal(&child, Signal::SIGINT);
    let out = wait_output(child);
    seen.extend(lines.iter());
    assert_eq!(acp_tests::code(&out), 130, "{}", acp_tests::stderr(&out));
    let result: Value = serde_json::from_str(seen.last().unwrap()).unwrap();
    assert_eq!(result["status"], "aborted", "{result}");
    assert_eq!(result["stopReason"], "cancelled");
    assert_none_left(dir.path());
}

/// The estimate of a request the turn did not send, from the budget stop's error.
fn next_request(error: &str) -> u64 {
    let about = error
        .split("(about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no estimate in {error:?}"));
    about.replace(',', "").parse().unwrap()
}

#[test]
fn a_token_budget_holds_before_the_request_and_mid_stream() {
    let Some(url) = server() else { return };
    let dir = temp();
    // 20 tokens: the first request alone passes it; nothing is sent.
    let (records, result) = json_run(
        real_run(dir.path(), &url, &["--token-budget", "20"]).arg(LONG),
        7,
    );
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["stopReason"], "max_tokens");
    assert_eq!(chunks(&records), 0);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.ends_with(
            "would pass the token budget of 20: the agent ended its turn before sending it"
        ),
        "{error}"
    );
    // Room for the same request and 20 tokens of answer: cut off after about 20 chunks of a
    // long answer, where it passed.
    let input = next_request(error);
    let budget = (input + 20).to_string();
    let (records, result) = json_run(
        real_run(dir.path(), &url, &["--token-budget", &budget]).arg(LONG),
        7,
    );
    assert_eq!(result["status"], "over-budget", "{result}");
    assert_eq!(result["stopReason"], "max_tokens");
    let streamed = chunks(&records);
    assert!((1..=36).contains(&streamed), "{streamed} chunks: {result}");
    assert_eq!(result["usage"]["estimated"], true);
    // Cut at the delta that passed it: one token past, or a few when that delta's text is long
    // (its bytes at 4 a token count then).
    let total = result["usage"]["totalTokens"].as_u64().unwrap();
    assert!((input + 21..=input + 25).contains(&total), "{result}");
    assert_eq!(
        result["error"],
        format!(
            "used {} tokens, over the token budget of {}",
            protocol::usage::thousands(total),
            protocol::usage::thousands(input + 20)
        )
    );
    assert_none_left(dir.path());
}

#[test]
fn an_offline_parent_delegates_to_a_child_on_the_real_model() {
    let Some(url) = server() else { return };
    let dir = temp();
    let mut cmd = acp_tests::host_run(dir.path());
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    let state = dir.path().join(".state").display().to_string();
    // The child learns the server from its environment: the parent forwards the variable.
    let parent = shell_words::join([
        "acp-child",
        "--subagent-agents",
        "acp-child",
        "--subagent-env",
        "ACP_CHILD_BASE_URL",
        "--subagent-env",
        "ACP_CHILD_STATE_DIR",
    ]);
    cmd.args(["--json", "--agent", &parent])
        .args(["--env", &format!("ACP_CHILD_BASE_URL={url}")])
        .args(["--env", &format!("ACP_CHILD_STATE_DIR={state}")])
        .args(["--token-budget", "100000"])
        .arg("/delegate acp-child Say hi in three words.");
    let (_, result) = json_run(&mut cmd, 0);
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        !result["output"].as_str().unwrap().trim().is_empty(),
        "{result}"
    );
    // The parent spends nothing itself: its usage is its child's, estimated on the real server,
    // so the budget was held (no error, no warning).
    assert_eq!(result["usage"]["estimated"], true, "{result}");
    assert!(result.get("warnings").is_none(), "{result}");
    assert_none_left(dir.path());
}
