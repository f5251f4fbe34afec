//! End-to-end: `acp-host run` driving `acp-child` on its model backend, against the scripted
//! OpenAI-compatible mock server (`acp_tests::mock_llm`), through the real binaries.
//!
//! Each test scripts the model's replies, then asserts what the user sees (exit code, exact
//! stdout, stderr where it matters), what the model was sent (the recorded requests), files on
//! disk, and that no process is left behind. Waits are on conditions (stdout records, recorded
//! requests, process death) with hang guards, never fixed sleeps.
//!
//! These tests are written against the model backend's contract (flags `--model`, `--base-url`,
//! `--max-retries`, `--retry-base-ms`, `--max-turn-requests`; tools `read_file`, `list_dir`,
//! `search`, `write_file`, `edit_file`, `run_command`; key from `ACP_CHILD_API_KEY`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use acp_tests::mock_llm::{Finish, MockLlm, RecordedRequest, Reply};
use acp_tests::{
    HANG_GUARD, code, line_channel, run_to_end, stderr, stdout, wait_output, wait_until_dead,
};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::common::{json_run, temp};

/// The key the tests forward; the mock requires it unless a test says otherwise.
const KEY: &str = "test-key";

/// The model name every test configures.
const MODEL: &str = "mock-model";

/// Variables of the test's own environment that would change what acp-child does.
const AMBIENT: &[&str] = &[
    "ACP_HOST_LOG",
    "ACP_CHILD_LOG",
    "ACP_CHILD_MODEL",
    "ACP_CHILD_BASE_URL",
    "ACP_CHILD_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A mock requiring [`KEY`] and answering with `script`.
fn llm(script: Vec<Reply>) -> MockLlm {
    MockLlm::builder()
        .replies(script)
        .require_key(Some(KEY))
        .start()
}

/// `acp-host run` in `dir` (see [`acp_tests::host_run`]) without the ambient model settings.
fn host(dir: &Path) -> Command {
    let mut cmd = acp_tests::host_run(dir);
    for name in AMBIENT {
        cmd.env_remove(name);
    }
    cmd
}

/// The `--agent` command line: `acp-child --model mock-model --base-url URL` plus `extra`.
fn agent(base_url: &str, extra: &[&str]) -> String {
    let mut words = vec!["acp-child", "--model", MODEL, "--base-url", base_url];
    words.extend_from_slice(extra);
    shell_words::join(words)
}

/// `acp-host run --env ACP_CHILD_API_KEY=test-key --agent "<agent>" <host_args>`; the prompt
/// is appended by the caller.
fn model_host(dir: &Path, llm: &MockLlm, agent_args: &[&str], host_args: &[&str]) -> Command {
    let mut cmd = host(dir);
    cmd.args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
        .args(["--agent", &agent(&llm.base_url(), agent_args)])
        .args(host_args);
    cmd
}

/// Asserts the exit code, showing stderr and the model's requests when it differs.
fn assert_code(output: &Output, expected: i32, llm: &MockLlm) {
    assert_eq!(
        code(output),
        expected,
        "stdout: {}\nstderr: {}\nrequests: {:#?}",
        stdout(output),
        stderr(output),
        llm.requests()
    );
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The recorded requests, asserting there are exactly `n`, all to the chat endpoint.
fn chat_requests(llm: &MockLlm, n: usize) -> Vec<RecordedRequest> {
    let requests = llm.requests();
    assert_eq!(requests.len(), n, "{requests:#?}");
    for request in &requests {
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("POST", "/v1/chat/completions")
        );
    }
    requests
}

/// The tool result for `id` in `request`, asserting the assistant's call announces it first.
fn tool_result(request: &RecordedRequest, id: &str) -> String {
    assert!(
        request.tool_call_precedes_result(id),
        "no assistant tool call {id} before its result: {:#}",
        request.body
    );
    request
        .tool_result(id)
        .unwrap_or_else(|| panic!("no tool message for {id}: {:#}", request.body))
}

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    listener.local_addr().unwrap().port()
}

/// A host whose stdout NDJSON lines go to a channel, for waiting on records mid-run.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watched {
    fn spawn(cmd: &mut Command) -> Watched {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("acp-host starts");
        let lines = line_channel(child.stdout.take().expect("stdout piped"));
        Watched {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a JSON record matching `wanted`, returning it.
    fn wait_record(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + HANG_GUARD;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            self.seen.push(line.clone());
            let record: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            if wanted(&record) {
                return record;
            }
        }
        let _ = self.child.kill();
        panic!("no such record on stdout; saw {:#?}", self.seen);
    }

    fn interrupt(&self) {
        crate::run::signal(&self.child, Signal::SIGINT);
    }

    /// Waits for the exit; returns it with every stdout record (seen earlier or not).
    fn finish(self) -> (Output, Vec<Value>) {
        let Watched {
            child,
            lines,
            mut seen,
        } = self;
        let output = wait_output(child);
        // The reader thread ends at stdout EOF, which came with the exit.
        seen.extend(lines.iter());
        let records = seen
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        (output, records)
    }
}

fn start_pid(start: &Value) -> u32 {
    assert_eq!(start["type"], "start", "{start}");
    u32::try_from(
        start["pid"]
            .as_u64()
            .expect("the start record has the agent pid"),
    )
    .unwrap()
}

fn is_message_chunk(record: &Value) -> bool {
    record["type"] == "update"
        && record["update"]["sessionUpdate"] == "agent_message_chunk"
        && record["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Streaming text and the request the model receives
// ---------------------------------------------------------------------------------------------

#[test]
fn a_text_stream_prints_exactly_the_text_and_the_request_is_openai_shaped() {
    let dir = temp();
    let llm = llm(vec![Reply::text(["Hello", " world"])]);
    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("say hello"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "Hello world");
    assert_eq!(stderr(&out), "");

    let request = &chat_requests(&llm, 1)[0];
    assert_eq!(request.body["model"], MODEL);
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.authorization(), Some("Bearer test-key"));
    let user = request.last_user_text().expect("a user message");
    assert!(user.contains("say hello"), "user message: {user:?}");

    let tools: BTreeSet<&str> = request.tool_names().into_iter().collect();
    assert_eq!(
        tools,
        BTreeSet::from([
            "read_file",
            "list_dir",
            "search",
            "write_file",
            "edit_file",
            "run_command",
            "task_output",
            "task_list",
            "task_kill"
        ]),
        "{:#}",
        request.body["tools"]
    );
    for tool in request.tools() {
        assert_eq!(tool["type"], "function", "{tool}");
        let name = tool["function"]["name"].as_str().unwrap();
        let properties: BTreeSet<&str> = tool["function"]["parameters"]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} has parameters.properties: {tool}"))
            .keys()
            .map(String::as_str)
            .collect();
        let expected: &[&str] = match name {
            "read_file" | "list_dir" => &["path"],
            "search" => &["pattern", "path"],
            "write_file" => &["path", "content"],
            "edit_file" => &["path", "old_text", "new_text"],
            "run_command" => &["command", "outside_sandbox", "run_in_background"],
            "task_output" => &["task_id", "wait"],
            "task_list" => &[],
            "task_kill" => &["task_id"],
            other => panic!("unexpected tool {other}"),
        };
        assert_eq!(properties, expected.iter().copied().collect(), "{name}");
    }
}

#[test]
fn model_and_base_url_come_from_the_environment_too() {
    let dir = temp();
    let llm = llm(vec![Reply::text(["from env"])]);
    let out = run_to_end(
        host(dir.path())
            .args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
            .args(["--env", &format!("ACP_CHILD_MODEL={MODEL}")])
            .args(["--env", &format!("ACP_CHILD_BASE_URL={}", llm.base_url())])
            .args(["--agent", "acp-child"])
            .arg("hi"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "from env");
    assert_eq!(chat_requests(&llm, 1)[0].body["model"], MODEL);
}

#[test]
fn without_a_model_or_a_base_url_the_backend_stays_offline_and_calls_nothing() {
    let dir = temp();
    let llm = llm(vec![Reply::text(["never"])]);
    let out = run_to_end(
        host(dir.path())
            .args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
            .args(["--agent", "acp-child"])
            .arg("hello"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), acp_child::NO_MODEL_REPLY.concat());
    assert!(llm.requests().is_empty(), "{:#?}", llm.requests());
    assert_eq!(llm.model_listings(), 0);
}

/// `acp-host run` of `acp-child --base-url URL` (no `--model`) with `host_args`.
fn discovering_host(dir: &Path, llm: &MockLlm, host_args: &[&str]) -> Command {
    let mut cmd = host(dir);
    cmd.args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
        .args([
            "--agent",
            &shell_words::join(["acp-child", "--base-url", &llm.base_url()]),
        ])
        .args(host_args);
    cmd
}

#[test]
fn a_base_url_alone_answers_with_the_one_model_the_server_lists() {
    let dir = temp();
    let llm = MockLlm::builder()
        .models(["only-model"])
        .reply(Reply::text(["found it"]))
        .require_key(Some(KEY))
        .start();
    let out = run_to_end(discovering_host(dir.path(), &llm, &[]).arg("hi"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "found it");
    assert_eq!(chat_requests(&llm, 1)[0].body["model"], "only-model");
    assert_eq!(llm.model_listings(), 1, "listed once, at start");
}

#[test]
fn of_several_listed_models_the_first_is_used_and_the_rest_are_the_sessions_model_option() {
    let dir = temp();
    let llm = MockLlm::builder()
        .models(["first", "second", "third"])
        .reply(Reply::text(["one"]))
        .reply(Reply::text(["two"]))
        .require_key(Some(KEY))
        .start();
    let out = run_to_end(discovering_host(dir.path(), &llm, &[]).arg("hi"));
    assert_code(&out, 0, &llm);
    // The others are offered: acp-host selects one through the session's model option.
    let out = run_to_end(discovering_host(dir.path(), &llm, &["--model", "third"]).arg("hi"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "two");
    let requests = chat_requests(&llm, 2);
    assert_eq!(requests[0].body["model"], "first");
    assert_eq!(requests[1].body["model"], "third");
}

#[test]
fn a_base_url_alone_whose_server_lists_no_model_or_fails_is_a_clear_error_exit_2() {
    let dir = temp();
    for (llm, expected) in [
        (
            MockLlm::builder().models(Vec::<String>::new()).start(),
            "acp-child: error: no --model given, and the model server at {base}/models lists no \
             models; load a model on the server, or name one with --model NAME (or \
             ACP_CHILD_MODEL)\n",
        ),
        (
            MockLlm::builder().models_fail().start(),
            "acp-child: error: no --model given, and the model server's models cannot be listed \
             (GET {base}/models: HTTP 500); check that the server at {base} is running, or name a \
             model with --model NAME (or ACP_CHILD_MODEL)\n",
        ),
        (
            MockLlm::builder().models_status(404).start(),
            "acp-child: error: no --model given, and the model server's models cannot be listed \
             (GET {base}/models: HTTP 404); check that the server at {base} is running, or name a \
             model with --model NAME (or ACP_CHILD_MODEL)\n",
        ),
    ] {
        let mut cmd = Command::new(acp_tests::bin("acp-child"));
        for name in AMBIENT {
            cmd.env_remove(name);
        }
        cmd.args(["--base-url", &llm.base_url()])
            .env("ACP_CHILD_STATE_DIR", dir.path());
        let out = run_to_end(&mut cmd);
        assert_code(&out, 2, &llm);
        assert_eq!(stderr(&out), expected.replace("{base}", &llm.base_url()));
        assert_eq!(stdout(&out), "", "nothing served");
        assert!(llm.requests().is_empty());
    }
    // Nothing listening at all: the same, with the connection's failure.
    let base = format!("http://127.0.0.1:{}/v1", closed_port());
    let mut cmd = Command::new(acp_tests::bin("acp-child"));
    for name in AMBIENT {
        cmd.env_remove(name);
    }
    cmd.args(["--base-url", &base])
        .env("ACP_CHILD_STATE_DIR", dir.path());
    let out = run_to_end(&mut cmd);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let error = stderr(&out);
    assert!(
        error.starts_with(&format!(
            "acp-child: error: no --model given, and the model server's models cannot be listed \
             (GET {base}/models: "
        )) && error.ends_with(&format!(
            "); check that the server at {base} is running, or name a model with --model NAME \
             (or ACP_CHILD_MODEL)\n"
        )),
        "{error}"
    );
}

#[test]
fn the_deepseek_key_is_a_fallback_for_the_bearer() {
    let dir = temp();
    let llm = MockLlm::builder()
        .reply(Reply::text(["ok"]))
        .require_key(Some("ds-fallback-key"))
        .start();
    let out = run_to_end(
        host(dir.path())
            .args(["--env", "DEEPSEEK_API_KEY=ds-fallback-key"])
            .args(["--agent", &agent(&llm.base_url(), &[])])
            .arg("hi"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "ok");
    assert_eq!(
        chat_requests(&llm, 1)[0].authorization(),
        Some("Bearer ds-fallback-key")
    );
}

#[test]
fn the_key_goes_only_into_the_authorization_header() {
    let dir = temp();
    let secret = "sk-mock-7f3a9c2e-never-print-me";
    let llm = MockLlm::builder()
        .reply(Reply::text(["fine"]))
        .require_key(Some(secret))
        .start();
    // --json and --verbose together show the most: every event, the agent's stderr.
    let out = run_to_end(
        host(dir.path())
            .args(["--env", &format!("ACP_CHILD_API_KEY={secret}")])
            .args(["--agent", &agent(&llm.base_url(), &[])])
            .args(["--json", "--verbose"])
            .arg("hi"),
    );
    assert_code(&out, 0, &llm);
    let request = &chat_requests(&llm, 1)[0];
    assert_eq!(
        request.authorization(),
        Some(format!("Bearer {secret}").as_str())
    );
    assert!(!request.raw_body.contains(secret), "key in the body");
    assert!(!stdout(&out).contains(secret), "key on stdout");
    assert!(!stderr(&out).contains(secret), "key on stderr");
}

#[test]
fn reasoning_goes_to_thoughts_not_to_stdout() {
    let dir = temp();
    let thoughts = || Reply::Reasoning {
        thoughts: vec!["pondering ".into(), "the question".into()],
        text: vec!["the answer".into()],
    };
    let llm = llm(vec![thoughts(), thoughts(), thoughts()]);

    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("think"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "the answer");
    assert_eq!(stderr(&out), "", "thoughts are hidden without --verbose");

    let out = run_to_end(model_host(dir.path(), &llm, &[], &["--verbose"]).arg("think"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "the answer");
    assert!(
        stderr(&out).contains("pondering the question"),
        "{}",
        stderr(&out)
    );

    let out = run_to_end(model_host(dir.path(), &llm, &[], &["--json"]).arg("think"));
    assert_code(&out, 0, &llm);
    let records: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let thought: String = records
        .iter()
        .filter(|r| r["type"] == "update" && r["update"]["sessionUpdate"] == "agent_thought_chunk")
        .filter_map(|r| r["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(thought, "pondering the question");
    let result = records.last().unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["output"], "the answer");
}

// ---------------------------------------------------------------------------------------------
// Stop reasons and errors
// ---------------------------------------------------------------------------------------------

#[test]
fn finish_length_is_max_tokens_exit_3() {
    let dir = temp();
    let llm = llm(vec![Reply::Text {
        chunks: vec!["trunc".into(), "ated".into()],
        finish: Finish::Length,
    }]);
    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("long"));
    assert_code(&out, 3, &llm);
    assert_eq!(stdout(&out), "truncated");
    assert_eq!(stderr(&out).trim(), "acp-host: max-tokens");
}

#[test]
fn finish_content_filter_is_refusal_exit_5() {
    let dir = temp();
    let llm = llm(vec![Reply::Text {
        chunks: Vec::new(),
        finish: Finish::ContentFilter,
    }]);
    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("bad"));
    assert_code(&out, 5, &llm);
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out).trim(), "acp-host: refusal");
}

#[test]
fn a_wrong_key_is_exit_1_naming_the_key_variable() {
    let dir = temp();
    let llm = llm(vec![Reply::text(["never"])]);
    let out = run_to_end(
        host(dir.path())
            .args(["--env", "ACP_CHILD_API_KEY=wrong-key-4011"])
            .args(["--agent", &agent(&llm.base_url(), &[])])
            .arg("hi"),
    );
    assert_code(&out, 1, &llm);
    assert_eq!(stdout(&out), "");
    let err = stderr(&out);
    assert!(err.contains("ACP_CHILD_API_KEY"), "{err}");
    assert!(!err.contains("wrong-key-4011"), "the key leaked: {err}");
    let requests = llm.requests();
    let first = requests.first().expect("the model was called");
    assert_eq!(first.authorization(), Some("Bearer wrong-key-4011"));
    assert_eq!(llm.remaining(), 1, "a 401 consumes no reply");
}

#[test]
fn an_unreachable_server_is_exit_1_naming_the_base_url() {
    let dir = temp();
    let base_url = format!("http://127.0.0.1:{}/v1", closed_port());
    let out = run_to_end(
        host(dir.path())
            .args(["--env", &format!("ACP_CHILD_API_KEY={KEY}")])
            .args(["--agent", &agent(&base_url, &["--retry-base-ms", "10"])])
            .arg("hi"),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains(&base_url), "{}", stderr(&out));
}

#[test]
fn rate_limits_are_retried_then_the_answer_streams() {
    let dir = temp();
    let llm = llm(vec![
        Reply::status(429, "Rate limit reached"),
        Reply::status(429, "Rate limit reached"),
        Reply::text(["after ", "retries"]),
    ]);
    let out = run_to_end(
        model_host(
            dir.path(),
            &llm,
            &["--max-retries", "3", "--retry-base-ms", "10"],
            &[],
        )
        .arg("hi"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "after retries");
    let requests = chat_requests(&llm, 3);
    assert!(
        requests.iter().all(|r| r.body == requests[0].body),
        "a retry resends the same request"
    );
}

#[test]
fn rate_limits_beyond_max_retries_are_an_error() {
    let dir = temp();
    let llm = llm(vec![
        Reply::status(429, "Rate limit reached"),
        Reply::status(429, "Rate limit reached"),
        Reply::text(["never"]),
    ]);
    let out = run_to_end(
        model_host(
            dir.path(),
            &llm,
            &["--max-retries", "1", "--retry-base-ms", "10"],
            &[],
        )
        .arg("hi"),
    );
    assert_code(&out, 1, &llm);
    assert_eq!(stdout(&out), "");
    // One attempt plus one retry.
    chat_requests(&llm, 2);
}

#[test]
fn max_turn_requests_stops_before_a_second_model_call_exit_4() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "some notes\n").unwrap();
    let llm = llm(vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 2),
        Reply::text(["never"]),
    ]);
    let out = run_to_end(
        model_host(dir.path(), &llm, &["--max-turn-requests", "1"], &["--json"]).arg("read"),
    );
    assert_code(&out, 4, &llm);
    let result: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(result["status"], "max-turn-requests");
    assert_eq!(result["output"], "");
    chat_requests(&llm, 1);
}

// ---------------------------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------------------------

#[test]
fn read_file_needs_no_permission_and_its_content_goes_back_to_the_model() {
    let dir = temp();
    std::fs::write(dir.path().join("notes.txt"), "line one\nline two\n").unwrap();
    let llm = llm(vec![
        Reply::tool_call("call_read_1", "read_file", &json!({"path": "notes.txt"}), 5),
        Reply::text(["read it"]),
    ]);
    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("read notes"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "read it");
    assert_eq!(stderr(&out), "", "no permission was asked");
    let requests = chat_requests(&llm, 2);
    let result = tool_result(&requests[1], "call_read_1");
    assert!(result.contains("line one\nline two"), "{result:?}");
}

fn write_script() -> Vec<Reply> {
    vec![
        Reply::tool_call(
            "call_write_1",
            "write_file",
            &json!({"path": "out.txt", "content": "written by model"}),
            4,
        ),
        Reply::text(["done"]),
    ]
}

#[test]
fn write_file_with_permission_allow_writes_exactly_the_content() {
    let dir = temp();
    let llm = llm(write_script());
    let out = run_to_end(
        model_host(dir.path(), &llm, &[], &["--permission", "allow"]).arg("write out.txt"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "done");
    assert_eq!(read(dir.path().join("out.txt")), "written by model");
    assert!(
        stderr(&out).contains("selected allow-once [by policy]"),
        "{}",
        stderr(&out)
    );
    let requests = chat_requests(&llm, 2);
    assert_eq!(requests[0].tool_result("call_write_1"), None);
    let result = tool_result(&requests[1], "call_write_1");
    assert!(!result.contains("permission denied"), "{result:?}");
}

#[test]
fn write_file_is_rejected_by_default_and_the_model_is_told() {
    let dir = temp();
    let llm = llm(write_script());
    let out = run_to_end(model_host(dir.path(), &llm, &[], &[]).arg("write out.txt"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "done");
    assert!(!dir.path().join("out.txt").exists());
    assert!(
        stderr(&out).contains("selected reject-once [by policy]"),
        "{}",
        stderr(&out)
    );
    let requests = chat_requests(&llm, 2);
    let result = tool_result(&requests[1], "call_write_1");
    assert!(result.contains("permission denied"), "{result:?}");
}

#[test]
fn edit_file_with_permission_allow_replaces_exactly_the_old_text() {
    let dir = temp();
    let path = dir.path().join("poem.txt");
    std::fs::write(&path, "alpha beta gamma\nbeta is second\n").unwrap();
    let llm = llm(vec![
        Reply::tool_call(
            "call_edit_1",
            "edit_file",
            &json!({"path": "poem.txt", "old_text": "alpha beta", "new_text": "alpha BETA"}),
            3,
        ),
        Reply::text(["edited"]),
    ]);
    let out = run_to_end(
        model_host(dir.path(), &llm, &[], &["--permission", "allow"]).arg("edit poem.txt"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "edited");
    assert_eq!(read(&path), "alpha BETA gamma\nbeta is second\n");
    tool_result(&chat_requests(&llm, 2)[1], "call_edit_1");
}

#[test]
fn run_command_with_permission_allow_runs_in_the_session_directory() {
    let dir = temp();
    let llm = llm(vec![
        Reply::tool_call(
            "call_run_1",
            "run_command",
            &json!({"command": "echo hi > made.txt"}),
            2,
        ),
        Reply::text(["ran"]),
    ]);
    let out = run_to_end(
        model_host(dir.path(), &llm, &[], &["--permission", "allow"]).arg("make a file"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "ran");
    assert_eq!(read(dir.path().join("made.txt")), "hi\n");
    tool_result(&chat_requests(&llm, 2)[1], "call_run_1");
}

#[test]
fn run_command_runs_in_its_sandbox_says_so_when_refused_and_asks_to_leave_it() {
    let dir = temp();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let escape = "echo in > inside.txt && echo out > ../outside.txt";
    let sandboxed = llm(vec![
        Reply::tool_call("call_run_1", "run_command", &json!({"command": escape}), 2),
        Reply::tool_call(
            "call_run_2",
            "run_command",
            &json!({"command": "echo out > ../outside.txt", "outside_sandbox": true}),
            2,
        ),
        Reply::text(["ran"]),
    ]);
    let (_, result) = json_run(
        model_host(
            &inner,
            &sandboxed,
            &[],
            &["--permission", "allow", "--json"],
        )
        .arg("escape"),
        0,
    );
    assert_eq!(result["output"], "ran");
    let requests = chat_requests(&sandboxed, 3);
    let refused = tool_result(&requests[1], "call_run_1");
    assert!(read(inner.join("inside.txt")) == "in\n", "{refused}");
    assert!(refused.starts_with("exit code: "), "{refused}");
    assert!(
        refused
            .contains("[the command ran in a sandbox workspace-write, network off, Landlock ABI")
            && refused.contains("call run_command again with outside_sandbox: true"),
        "{refused}"
    );
    // Outside the sandbox, through the same permission request, titled so.
    assert_eq!(read(dir.path().join("outside.txt")), "out\n");
    let titles: Vec<&str> = result["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|decision| decision["title"].as_str())
        .collect();
    assert!(
        titles
            .iter()
            .any(|title| title.ends_with("(outside the sandbox)")),
        "{titles:?}"
    );

    // The person can turn it off.
    std::fs::remove_file(dir.path().join("outside.txt")).unwrap();
    let open = llm(vec![
        Reply::tool_call("call_run_1", "run_command", &json!({"command": escape}), 2),
        Reply::text(["ran"]),
    ]);
    let out = run_to_end(
        model_host(
            &inner,
            &open,
            &["--command-sandbox", "off"],
            &["--permission", "allow"],
        )
        .arg("escape"),
    );
    assert_code(&out, 0, &open);
    assert_eq!(read(dir.path().join("outside.txt")), "out\n");
}

#[test]
fn a_path_outside_the_session_directory_is_refused_even_when_allowed() {
    let dir = temp();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let llm = llm(vec![
        Reply::tool_call(
            "call_escape_1",
            "write_file",
            &json!({"path": "../outside.txt", "content": "escaped"}),
            3,
        ),
        Reply::text(["ok"]),
    ]);
    let out = run_to_end(model_host(&inner, &llm, &[], &["--permission", "allow"]).arg("escape"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "ok");
    assert!(!dir.path().join("outside.txt").exists());
    let result = tool_result(&chat_requests(&llm, 2)[1], "call_escape_1");
    assert!(
        result.contains("outside the session directory"),
        "{result:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

/// Interrupts a `--json` run once `ready` holds, then asserts exit 130, a cancelled result, and
/// the agent process gone. Returns the result record.
fn interrupt_run(dir: &Path, llm: &MockLlm, ready: impl FnOnce(&mut Watched)) -> Value {
    let mut run = Watched::spawn(model_host(dir, llm, &[], &["--json"]).arg("stream"));
    let pid = start_pid(&run.wait_record(|r| r["type"] == "start"));
    ready(&mut run);
    run.interrupt();
    let (out, records) = run.finish();
    assert_code(&out, 130, llm);
    let result = records.last().expect("a result record").clone();
    assert_eq!(result["type"], "result", "{result}");
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["stopReason"], "cancelled", "the agent acknowledged");
    assert!(
        wait_until_dead(pid, HANG_GUARD),
        "acp-child {pid} is still alive after acp-host exited"
    );
    result
}

#[test]
fn ctrl_c_mid_stream_stops_the_stream_and_leaves_no_process() {
    let dir = temp();
    let chunks: Vec<String> = (0..500).map(|i| format!("c{i} ")).collect();
    let full: String = chunks.concat();
    let llm = llm(vec![Reply::Slow {
        chunks,
        interval: Duration::from_millis(50),
    }]);
    let result = interrupt_run(dir.path(), &llm, |run| {
        let first = run.wait_record(is_message_chunk);
        let text = first["update"]["content"]["text"].as_str().unwrap();
        assert!(text.starts_with("c0 "), "{first}");
    });
    let output = result["output"].as_str().unwrap();
    assert!(
        output.starts_with("c0 ") && full.starts_with(output),
        "{output:?}"
    );
    // The whole stream takes 25 s; the connection must be dropped long before.
    assert!(llm.wait_for_stream_ends(1, HANG_GUARD));
    let end = llm.stream_ends()[0];
    assert!(!end.complete(), "{end:?}");
    chat_requests(&llm, 1);
}

#[test]
fn ctrl_c_while_the_model_has_not_answered_leaves_no_process() {
    let dir = temp();
    let llm = llm(vec![Reply::Hang]);
    let result = interrupt_run(dir.path(), &llm, |_| {
        assert!(llm.wait_for_requests(1, HANG_GUARD), "the model was called");
    });
    assert_eq!(result["output"], "");
    chat_requests(&llm, 1);
}

// ---------------------------------------------------------------------------------------------
// Resuming a session (`run --resume`)
// ---------------------------------------------------------------------------------------------

/// Every text of the model request's messages, in order (system prompt excluded).
fn texts(request: &RecordedRequest) -> Vec<String> {
    request.messages()[1..]
        .iter()
        .map(acp_tests::mock_llm::message_text)
        .collect()
}

#[test]
fn resume_continues_the_saved_session_and_prints_nothing_of_the_replay() {
    let dir = temp();
    let state = temp();
    let llm = llm(vec![
        Reply::text(["first ", "answer"]),
        Reply::text(["second answer"]),
        Reply::text(["third answer"]),
    ]);
    let state_args = ["--state-dir", state.path().to_str().unwrap()];

    let out =
        run_to_end(model_host(dir.path(), &llm, &state_args, &["--json"]).arg("first question"));
    assert_code(&out, 0, &llm);
    let first = super::common::result_record(&out);
    assert_eq!(first["output"], "first answer");
    let session = first["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();

    // --json: no record of the replayed history, only the new turn.
    let out = run_to_end(
        model_host(
            dir.path(),
            &llm,
            &state_args,
            &["--json", "--resume", &session],
        )
        .arg("second question"),
    );
    assert_code(&out, 0, &llm);
    let records = super::common::records(&out);
    let updates: Vec<&Value> = records
        .iter()
        .filter(|record| record["type"] == "update")
        .map(|record| &record["update"])
        .collect();
    assert_eq!(
        updates,
        [
            &json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "second answer"}})
        ],
        "{records:#?}"
    );
    let second = super::common::result_record(&out);
    assert_eq!(second["output"], "second answer");
    assert_eq!(second["sessionId"], session.as_str());
    assert_eq!(records[0]["type"], "start");
    assert_eq!(records[0]["sessionId"], session.as_str());

    // Human mode: exactly the new answer.
    let out = run_to_end(
        model_host(dir.path(), &llm, &state_args, &["--resume", &session]).arg("third question"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "third answer");
    assert_eq!(stderr(&out), "");

    // The model saw the history each time.
    let requests = chat_requests(&llm, 3);
    assert_eq!(texts(&requests[0]).last().unwrap(), "first question");
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
}

/// The session id of a finished `--json` run.
fn session_of(out: &Output) -> String {
    super::common::result_record(out)["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned()
}

#[test]
fn two_resumes_of_one_session_at_once_one_runs_the_other_is_refused_and_every_turn_is_kept() {
    let dir = temp();
    let state = temp();
    let gate = dir.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let llm = llm(vec![
        Reply::tool_call(
            "call_one",
            "run_command",
            &json!({"command": "echo one"}),
            1,
        ),
        Reply::text(["done one"]),
        // Holds its session open until the test opens the gate (opened read-write: no block).
        Reply::tool_call(
            "call_two",
            "run_command",
            &json!({"command": "exec 3<> gate; touch started; read line <&3; echo two"}),
            1,
        ),
        Reply::text(["done two"]),
        Reply::text(["three"]),
    ]);
    let state_args = ["--state-dir", state.path().to_str().unwrap()];
    let allow = ["--json", "--permission", "allow"];
    let out = run_to_end(model_host(dir.path(), &llm, &state_args, &allow).arg("first"));
    assert_code(&out, 0, &llm);
    let session = session_of(&out);

    let resume = ["--json", "--permission", "allow", "--resume", &session];
    let running = model_host(dir.path(), &llm, &state_args, &resume)
        .arg("second")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        acp_tests::wait_for_file(dir.path().join("started"), HANG_GUARD),
        "the first resume never ran its command"
    );
    let out = run_to_end(model_host(dir.path(), &llm, &state_args, &resume).arg("meanwhile"));
    assert_code(&out, 1, &llm);
    let refused = super::common::result_record(&out);
    assert_eq!(refused["errorKind"], "handshake", "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "session busy: session {session} is open elsewhere (another acp-child, or another \
             session of this one); one writer per session: wait until it ends"
        )),
        "{error}"
    );
    std::fs::write(&gate, "go\n").unwrap();
    let out = wait_output(running);
    assert_code(&out, 0, &llm);
    assert_eq!(super::common::result_record(&out)["output"], "done two");

    // Every turn, with its command's real output, is in the file.
    let out =
        run_to_end(model_host(dir.path(), &llm, &state_args, &["--resume", &session]).arg("third"));
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "three");
    let requests = chat_requests(&llm, 5);
    let last = &requests[4];
    for (call, output) in [("call_one", "one"), ("call_two", "two")] {
        let result = tool_result(last, call);
        assert!(
            result.contains(output) && !result.contains("not run"),
            "{call}: {result:?}"
        );
    }
    let said: Vec<String> = texts(last)
        .into_iter()
        .filter(|text| !text.is_empty())
        .collect();
    for text in ["first", "done one", "second", "done two", "third"] {
        assert!(said.iter().any(|t| t == text), "{text}: {said:?}");
    }
    assert!(!said.iter().any(|t| t == "meanwhile"), "{said:?}");
}

#[test]
fn a_session_file_torn_inside_a_multi_byte_character_loads_without_that_line() {
    let dir = temp();
    let state = temp();
    let llm = llm(vec![Reply::text(["caf\u{e9}"]), Reply::text(["again"])]);
    let state_args = ["--state-dir", state.path().to_str().unwrap()];
    let out = run_to_end(model_host(dir.path(), &llm, &state_args, &["--json"]).arg("first"));
    assert_code(&out, 0, &llm);
    let session = session_of(&out);
    let file = state.path().join(format!("{session}.jsonl"));
    let torn = "{\"type\":\"user\",\"text\":\"th\u{e9}\"}\n".as_bytes();
    let cut = torn.iter().position(|&b| b == 0xC3).unwrap() + 1;
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(&torn[..cut]);
    std::fs::write(&file, &bytes).unwrap();

    let out = run_to_end(
        model_host(dir.path(), &llm, &state_args, &["--resume", &session]).arg("second"),
    );
    assert_code(&out, 0, &llm);
    assert_eq!(stdout(&out), "again");
    let requests = chat_requests(&llm, 2);
    assert_eq!(texts(&requests[1]), ["first", "caf\u{e9}", "second"]);
    // The torn line was ended: the new turn's records are lines of their own.
    let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
    assert!(text.ends_with('\n'), "{text}");
    assert!(
        text.contains("\n{\"type\":\"user\",\"text\":\"second\"}\n"),
        "{text}"
    );
}

#[test]
fn a_fifo_or_a_symlink_as_a_session_file_is_refused_at_once() {
    let dir = temp();
    let state = temp();
    let outside = temp();
    let llm = llm(vec![]);
    let state_args = ["--state-dir", state.path().to_str().unwrap()];
    let fifo = "sess-0123456789abcdef";
    nix::unistd::mkfifo(
        &state.path().join(format!("{fifo}.jsonl")),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let link = "sess-fedcba9876543210";
    std::fs::write(
        outside.path().join("elsewhere.jsonl"),
        "{\"type\":\"session\",\"cwd\":\"/\"}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("elsewhere.jsonl"),
        state.path().join(format!("{link}.jsonl")),
    )
    .unwrap();
    for (id, kind) in [(fifo, "a FIFO"), (link, "a symlink")] {
        let out = run_to_end(
            model_host(dir.path(), &llm, &state_args, &["--json", "--resume", id]).arg("again"),
        );
        assert_code(&out, 1, &llm);
        let result = super::common::result_record(&out);
        assert_eq!(result["errorKind"], "handshake", "{result}");
        let error = result["error"].as_str().unwrap();
        assert!(
            error.contains(&format!(
                "{id}.jsonl is {kind}, not a regular file; acp-child reads only regular files \
                 of its state directory"
            )),
            "{error}"
        );
    }
    chat_requests(&llm, 0);
}

#[test]
fn resuming_an_unknown_session_is_a_handshake_error_and_the_model_is_not_called() {
    let dir = temp();
    let state = temp();
    let llm = llm(vec![]);
    let out = run_to_end(
        model_host(
            dir.path(),
            &llm,
            &["--state-dir", state.path().to_str().unwrap()],
            &["--json", "--resume", "sess-0123456789abcdef"],
        )
        .arg("again"),
    );
    assert_code(&out, 1, &llm);
    let result = super::common::result_record(&out);
    assert_eq!(result["errorKind"], "handshake");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("agent answered session/load with error")
            && error.contains("unknown session sess-0123456789abcdef"),
        "{error}"
    );
    chat_requests(&llm, 0);
}
