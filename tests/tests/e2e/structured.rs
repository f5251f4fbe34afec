//! End-to-end: structured output (`--output-schema`). A foreign agent (the mock's `answers`
//! scenario) is asked by instruction and its text is parsed; acp-child answers through its capture
//! tool on the mock model. An answer that does not match gets a follow-up in the same session
//! listing every violation, up to `--schema-retries`, then the run ends `schema-mismatch` (exit 6);
//! a schema that cannot compile is a usage error with nothing spawned. A foreign agent that lists
//! `outputSchema` in the start extension gets the schema at start and its value is still checked;
//! Ctrl-C during a follow-up ends the run like any other.

use std::path::Path;
use std::process::{Command, Stdio};

use acp_tests::mock_llm::{MockLlm, Reply};
use acp_tests::{
    HANG_GUARD, code, host_run, processes_in, run_to_end, stderr, stdout, wait_for_file,
    wait_output, wait_until,
};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::common::{acp_child_json_run, json_run, mock, result_record};

fn schema_file(dir: &Path, schema: &Value) -> String {
    let path = dir.join("schema.json");
    std::fs::write(&path, schema.to_string()).unwrap();
    path.display().to_string()
}

fn number_schema(dir: &Path) -> String {
    schema_file(
        dir,
        &json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    )
}

/// `acp-host run` of the mock answering `answers` in turn, logging what it receives.
fn answering(dir: &Path, answers: &[&str]) -> Command {
    answering_with(dir, answers, &[])
}

/// [`answering`], the mock given `extra` flags too.
fn answering_with(dir: &Path, answers: &[&str], extra: &[&str]) -> Command {
    let answers = serde_json::to_string(answers).unwrap();
    let log = dir.join("mock.log").display().to_string();
    let mut args = vec!["answers", "--answers-json", &answers, "--log", &log];
    args.extend_from_slice(extra);
    let mut cmd = host_run(dir);
    cmd.args(["--agent", &mock(&args)]);
    cmd
}

fn prompts_received(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("mock.log"))
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == "session/prompt")
        .count()
}

#[test]
fn a_schema_that_cannot_compile_is_a_usage_error_with_nothing_spawned() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("mock.pid");
    let agent = mock(&["hello", "--pid-file", &pid_file.display().to_string()]);
    let schema = schema_file(
        dir.path(),
        &json!({"type": "object", "propertiez": {}, "properties": {
            "n": {"type": "integr", "minimun": 1},
            "mail": {"type": "string", "format": "idn-email"},
        }}),
    );
    let out = run_to_end(host_run(dir.path()).args([
        "--agent",
        &agent,
        "--output-schema",
        &schema,
        "hi",
    ]));
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    // Every problem, in one error.
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: --output-schema {schema}: output schema is refused: /propertiez: \
             unknown keyword \"propertiez\" (did you mean \"properties\"?); /properties/n/type: \
             type \"integr\" is not a JSON type; the types are array, boolean, integer, null, \
             number, object, string; /properties/n/minimun: unknown keyword \"minimun\" (did you \
             mean \"minimum\"?); /properties/mail/format: format \"idn-email\" is not enforced; \
             the formats checked are date, date-time, time, duration, email, hostname, ipv4, \
             ipv6, uri, uri-reference, uuid, regex, json-pointer\n"
        )
    );
    assert_eq!(stdout(&out), "");
    assert!(!pid_file.exists(), "the agent was spawned");

    std::fs::write(dir.path().join("schema.json"), "{not json").unwrap();
    let out = run_to_end(host_run(dir.path()).args([
        "--agent",
        &agent,
        "--output-schema",
        &schema,
        "hi",
    ]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).starts_with(&format!(
            "acp-host: error: --output-schema {schema}: not JSON ("
        )),
        "{}",
        stderr(&out)
    );
    assert!(!pid_file.exists());

    // --schema-retries means nothing without a schema.
    let out =
        run_to_end(host_run(dir.path()).args(["--agent", &agent, "--schema-retries", "1", "hi"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("--output-schema <FILE>"),
        "{}",
        stderr(&out)
    );
    assert!(!pid_file.exists());
}

#[test]
fn a_format_the_schema_names_is_asserted() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema_file(dir.path(), &json!({"type": "string", "format": "email"}));
    let (_, result) = json_run(
        answering(dir.path(), &["\"not-an-email\"", "\"someone@example.com\""]).args([
            "--json",
            "--output-schema",
            &schema,
            "--schema-retries",
            "1",
            "mail",
        ]),
        0,
    );
    assert_eq!(result["structured"], json!("someone@example.com"));
    let output = result["output"].as_str().unwrap();
    assert!(
        output.ends_with("\"someone@example.com\""),
        "the second answer: {output}"
    );
    assert_eq!(prompts_received(dir.path()), 2, "the first was followed up");
    let (_, result) = json_run(
        answering(dir.path(), &["\"not-an-email\""]).args([
            "--json",
            "--output-schema",
            &schema,
            "--schema-retries",
            "0",
            "mail",
        ]),
        6,
    );
    assert_eq!(
        result["error"],
        "the answer does not match the output schema: (root): \"not-an-email\" is not a \
         \"email\""
    );
}

#[test]
fn a_foreign_agent_answering_in_text_gives_exactly_the_value_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let out = run_to_end(
        answering(dir.path(), &["Counted.\n```json\n{\"n\": 1}\n```\n"]).args([
            "--output-schema",
            &schema,
            "count",
        ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "{\"n\":1}\n");
    assert_eq!(prompts_received(dir.path()), 1);

    // The prompt carried the schema and the instruction.
    let (_, result) = json_run(
        answering(dir.path(), &["{prompt}\n```json\n{\"n\": 1}\n```"]).args([
            "--json",
            "--output-schema",
            &schema,
            "count",
        ]),
        0,
    );
    assert_eq!(result["structured"], json!({"n": 1}));
    assert_eq!(result["structuredVia"], "text");
    let output = result["output"].as_str().unwrap();
    assert!(
        output.starts_with("count\n\nEnd your answer with a JSON value matching this JSON Schema"),
        "{output}"
    );
}

#[test]
fn an_answer_that_does_not_match_is_followed_up_listing_the_violation_path() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let (_, result) = json_run(
        answering(
            dir.path(),
            &["{\"n\": \"one\"}", "{prompt}\n```json\n{\"n\": 2}\n```"],
        )
        .args(["--json", "--output-schema", &schema, "count"]),
        0,
    );
    assert_eq!(result["status"], "completed");
    assert_eq!(result["structured"], json!({"n": 2}));
    assert_eq!(
        prompts_received(dir.path()),
        2,
        "one follow-up, same session"
    );
    // The second answer echoes the follow-up it was sent.
    let output = result["output"].as_str().unwrap();
    assert!(
        output.contains(
            "Your answer did not match the required JSON Schema. Violations:\n- /n: \"one\" is not of type \"integer\"\n"
        ),
        "{output}"
    );
}

#[test]
fn retries_exhausted_is_schema_mismatch_exit_6_with_the_last_violations() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let (_, result) = json_run(
        answering(dir.path(), &["no json here"]).args([
            "--json",
            "--output-schema",
            &schema,
            "--schema-retries",
            "1",
            "count",
        ]),
        6,
    );
    assert_eq!(result["status"], "schema-mismatch");
    assert_eq!(result["errorKind"], "schema-mismatch");
    assert_eq!(
        result["error"],
        "the answer does not match the output schema: (root): no JSON value found in the answer"
    );
    assert_eq!(result["structured"], Value::Null);
    assert_eq!(prompts_received(dir.path()), 2);
    // Human mode: nothing on stdout, the reason on stderr.
    let out = run_to_end(answering(dir.path(), &["{\"n\": 1.5}"]).args([
        "--output-schema",
        &schema,
        "count",
    ]));
    assert_eq!(code(&out), 6);
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).starts_with(
            "acp-host: schema-mismatch: the answer does not match the output schema: /n: 1.5 is not of type \"integer\""
        ),
        "{}",
        stderr(&out)
    );
}

/// `acp-host run --json` of acp-child on the mock model.
fn acp_child_run(dir: &Path, llm: &MockLlm) -> Command {
    acp_child_json_run(dir, llm, &[])
}

#[test]
fn acp_child_answers_through_its_capture_tool() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let llm = MockLlm::start(vec![Reply::tool_call(
        "call_1",
        "submit_result",
        &json!({"n": 3}),
        1,
    )]);
    let out =
        run_to_end(acp_child_run(dir.path(), &llm).args(["--output-schema", &schema, "count"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["structured"], json!({"n": 3}));
    assert_eq!(result["structuredVia"], "capture-tool");
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "the capture ended the turn");
    let capture = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "submit_result")
        .expect("the capture tool is offered");
    assert_eq!(
        capture["function"]["parameters"],
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    );
    assert_eq!(
        requests[0].last_user_text().as_deref(),
        Some("count"),
        "no instruction in the prompt: acp-child has the tool"
    );
}

/// One model reply making each `(id, tool, arguments)` call, in order.
fn calls(calls: &[(&str, &str, Value)]) -> Reply {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (id, tool, arguments))| {
            json!({"index": index, "id": id, "type": "function",
                "function": {"name": tool, "arguments": arguments.to_string()}})
        })
        .collect();
    Reply::Events(vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": calls}, "finish_reason": null}]})
            .to_string(),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        "[DONE]".to_owned(),
    ])
}

#[test]
fn a_captured_answer_ends_the_turn_and_the_calls_after_it_are_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let llm = MockLlm::start(vec![
        calls(&[
            ("call_1", "submit_result", json!({"n": 1})),
            (
                "call_2",
                "write_file",
                json!({"path": "late.txt", "content": "written after the answer"}),
            ),
            ("call_3", "submit_result", json!({"n": 2})),
        ]),
        Reply::text(["never asked for"]),
    ]);
    let (records, result) = json_run(
        acp_child_run(dir.path(), &llm).args(["--output-schema", &schema, "count"]),
        0,
    );
    assert_eq!(
        result["structured"],
        json!({"n": 1}),
        "the first value wins"
    );
    assert_eq!(result["stopReason"], "end_turn");
    assert!(!dir.path().join("late.txt").exists(), "write_file ran");
    assert_eq!(llm.requests().len(), 1, "no request after the capture");
    assert_eq!(llm.remaining(), 1);
    for call in ["call_2", "call_3"] {
        let refused: Vec<&Value> = records
            .iter()
            .filter(|r| r["update"]["toolCallId"] == call)
            .collect();
        assert_eq!(refused.len(), 1, "{call}: {refused:?}");
        assert_eq!(refused[0]["update"]["status"], "failed", "{call}");
        assert_eq!(
            refused[0]["update"]["content"][0]["content"]["text"],
            "not run: the answer was already recorded through submit_result, which ends the turn",
            "{call}"
        );
    }
}

#[test]
fn acp_child_that_does_not_capture_is_followed_up_and_a_bad_capture_is_refused_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let llm = MockLlm::start(vec![
        Reply::text(["I think it is three."]),
        Reply::tool_call("call_1", "submit_result", &json!({"n": "three"}), 1),
        Reply::tool_call("call_2", "submit_result", &json!({"n": 3}), 1),
    ]);
    let out =
        run_to_end(acp_child_run(dir.path(), &llm).args(["--output-schema", &schema, "count"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["structured"], json!({"n": 3}));
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "the valid capture ended the turn");
    let follow_up = requests[1].last_user_text().unwrap();
    assert!(
        follow_up.contains("- (root): no JSON value found in the answer"),
        "{follow_up}"
    );
    let refused = requests[2].tool_result("call_1").unwrap();
    assert!(
        refused.starts_with("the result does not match the required schema: /n: \"three\" is not of type \"integer\""),
        "{refused}"
    );
}

#[test]
fn the_timeout_is_honoured_during_a_follow_up() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let (_, result) = json_run(
        answering(dir.path(), &["not yet", "{hang}"]).args([
            "--json",
            "--output-schema",
            &schema,
            "--timeout",
            "1",
            "count",
        ]),
        124,
    );
    assert_eq!(result["status"], "timeout");
    assert_eq!(result["structured"], Value::Null);
    assert_eq!(
        prompts_received(dir.path()),
        2,
        "timed out in the follow-up"
    );
}

#[test]
fn ctrl_c_during_a_follow_up_ends_the_run_aborted_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let ready = dir.path().join("ready");
    let ready_arg = ready.display().to_string();
    let child = answering_with(dir.path(), &["not yet", "{hang}"], &["--ready", &ready_arg])
        .args(["--json", "--output-schema", &schema, "count"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The mock is ready only in the `{hang}` answer: the follow-up is under way.
    assert!(
        wait_for_file(&ready, HANG_GUARD),
        "the follow-up never started"
    );
    crate::run::signal(&child, Signal::SIGINT);
    let out = wait_output(child);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["stopReason"], "cancelled");
    assert_eq!(result["structured"], Value::Null);
    assert_eq!(
        prompts_received(dir.path()),
        2,
        "cancelled in the follow-up"
    );
    let log = std::fs::read_to_string(dir.path().join("mock.log")).unwrap();
    assert!(log.contains("session/cancel"), "{log}");
    assert!(
        wait_until(HANG_GUARD, || processes_in(dir.path()).is_empty()),
        "processes left: {:?}",
        processes_in(dir.path())
    );
}

#[test]
fn a_foreign_agent_honouring_output_schema_gets_it_at_start_and_its_value_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let schema_value =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let schema = number_schema(dir.path());
    let (_, result) = json_run(
        answering_with(
            dir.path(),
            &["{\"n\": \"two\"}", "{\"n\": 2}"],
            &["--advertise", "output-schema"],
        )
        .args(["--json", "--output-schema", &schema, "count"]),
        0,
    );
    assert_eq!(result["structured"], json!({"n": 2}));
    assert_eq!(result["structuredVia"], "capture-tool");
    // The schema went in `session/new`'s `_meta`, not into the prompt.
    let log = std::fs::read_to_string(dir.path().join("mock.log")).unwrap();
    let meta: Value = log
        .lines()
        .find_map(|line| line.strip_prefix("session/new _meta "))
        .map_or_else(
            || panic!("no _meta on session/new: {log}"),
            |meta| serde_json::from_str(meta).unwrap(),
        );
    assert_eq!(
        meta["acp-host/start"],
        json!({"version": 1, "outputSchema": schema_value})
    );
    // The first value, captured but wrong, was checked by acp-host and followed up.
    assert_eq!(prompts_received(dir.path()), 2);
}

/// An answer of about `bytes` that is quadratic for an extraction restarting a parse at every
/// bracket: 127 nested arrays (`serde_json`'s depth limit) that never close, then `1,` to the end.
fn adversarial(bytes: usize) -> String {
    let mut text = "[".repeat(127);
    text.push_str(&"1,".repeat((bytes - 127) / 2));
    text
}

/// `acp-host run` of the mock answering `answers` (written to a file: they may be megabytes).
fn answering_from_file(dir: &Path, answers: &[String]) -> Command {
    let file = dir.join("answers.json");
    std::fs::write(&file, serde_json::to_string(answers).unwrap()).unwrap();
    let log = dir.join("mock.log").display().to_string();
    let mut cmd = host_run(dir);
    cmd.args([
        "--agent",
        &mock(&[
            "answers",
            "--answers-file",
            &file.display().to_string(),
            "--log",
            &log,
        ]),
    ]);
    cmd
}

#[test]
fn an_adversarial_8_mib_answer_is_checked_every_retry_without_freezing_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    // Just under --max-output's default: the whole text is read, at every one of the retries.
    let answer = adversarial(8 * 1024 * 1024 - 1024);
    let out = run_to_end(answering_from_file(dir.path(), &[answer]).args([
        "--output-schema",
        &schema,
        "count",
    ]));
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("no JSON value found in the answer"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        prompts_received(dir.path()),
        3,
        "the first answer and two follow-ups"
    );
}

#[test]
fn a_second_ctrl_c_while_adversarial_answers_are_checked_ends_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let mut child = answering_from_file(dir.path(), &[adversarial(8 * 1024 * 1024 - 1024)])
        .args([
            "--output-schema",
            &schema,
            "--schema-retries",
            "1000",
            "count",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Each answer is checked, then followed up: the run is busy with them from here on.
    assert!(
        wait_until(HANG_GUARD, || prompts_received(dir.path()) >= 2),
        "no answer was checked"
    );
    crate::run::signal(&child, Signal::SIGINT);
    crate::run::signal(&child, Signal::SIGINT);
    let mut status = None;
    assert!(
        wait_until(HANG_GUARD, || {
            status = child.try_wait().unwrap();
            status.is_some()
        }),
        "acp-host did not end after a second Ctrl-C"
    );
    assert_eq!(status.unwrap().code(), Some(130));
    assert!(
        wait_until(HANG_GUARD, || processes_in(dir.path()).is_empty()),
        "processes left: {:?}",
        processes_in(dir.path())
    );
}

#[test]
fn timeout_ends_a_run_busy_with_adversarial_answers() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let out = run_to_end(
        answering_from_file(dir.path(), &[adversarial(8 * 1024 * 1024 - 1024)]).args([
            "--output-schema",
            &schema,
            "--schema-retries",
            "1000",
            "--timeout",
            "2",
            "count",
        ]),
    );
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).starts_with("acp-host: timeout"),
        "{}",
        stderr(&out)
    );
    assert!(
        wait_until(HANG_GUARD, || processes_in(dir.path()).is_empty()),
        "processes left: {:?}",
        processes_in(dir.path())
    );
}

#[test]
fn a_valid_answer_over_8_mib_is_read_under_a_raised_max_output_and_names_the_limit_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let schema = number_schema(dir.path());
    let pad = "x".repeat(9 * 1024 * 1024);
    let answer = json!({"n": 1, "pad": pad}).to_string();
    let out = run_to_end(
        answering_from_file(dir.path(), std::slice::from_ref(&answer)).args([
            "--output-schema",
            &schema,
            "--max-output",
            "20000000",
            "count",
        ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{answer}\n"));

    let out = run_to_end(
        answering_from_file(dir.path(), std::slice::from_ref(&answer)).args([
            "--output-schema",
            &schema,
            "--schema-retries",
            "0",
            "count",
        ]),
    );
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    let error = stderr(&out);
    assert!(
        error.contains(&format!(
            "(root): the answer is {} bytes over the {}-byte limit on a structured answer's \
             text (acp-host --max-output), so it was not read",
            answer.len() - 8 * 1024 * 1024,
            8 * 1024 * 1024
        )),
        "{error}"
    );
}
