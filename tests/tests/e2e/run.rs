//! End-to-end: `acp-host run` driving the scripted mock agent through real processes and pipes.
//!
//! Each test asserts the exit code, the exact stdout, the relevant stderr or JSON fields, and that
//! the agent (and any grandchild) is gone afterwards. Waits are on conditions (ready files, stderr
//! lines, process death), never fixed sleeps; generous deadlines only guard against hangs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;

use acp_tests::{
    HANG_GUARD, bin, code, line_channel, read_pid, run_to_end, stderr, stdout, wait_for_file,
    wait_output, wait_until_dead,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use protocol::env_vars;
use serde_json::Value;

use super::common::{assert_run_schemas, mock, records, result_record, temp};

pub(crate) fn host(dir: &Path) -> Command {
    acp_tests::host_run(dir)
}

pub(crate) fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

pub(crate) fn assert_dead(pid_file: &Path) {
    let pid = read_pid(pid_file).expect("the mock wrote its pid");
    assert!(
        wait_until_dead(pid, HANG_GUARD),
        "process {pid} is still alive after acp-host exited"
    );
}

pub(crate) fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), sig).expect("signal acp-host");
}

/// Starts a host whose stderr lines are forwarded to a channel (to wait on diagnostics).
pub(crate) fn spawn_watched(cmd: &mut Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acp-host starts");
    let rx = line_channel(child.stderr.take().expect("stderr piped"));
    (child, rx)
}

pub(crate) fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("stderr never contained {needle:?}; saw {seen:?}");
}

// ---------------------------------------------------------------------------------------------
// The happy path and the stop-reason table
// ---------------------------------------------------------------------------------------------

#[test]
fn happy_path_prints_exactly_the_agent_text() {
    let dir = temp();
    let pid = dir.path().join("pid");
    let out = run_to_end(
        host(dir.path())
            .args(["--agent", &mock(&["hello", "--pid-file", path_str(&pid)])])
            .arg("hi"),
    );
    assert_eq!(code(&out), 0, "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "hello from acp child");
    assert_eq!(stderr(&out), "");
    assert_dead(&pid);
}

#[test]
fn stop_reasons_map_to_statuses_and_exit_codes() {
    let dir = temp();
    for (reason, text, status, exit) in [
        ("end_turn", "done", "completed", 0),
        ("max_tokens", "trunc", "max-tokens", 3),
        ("max_turn_requests", "many", "max-turn-requests", 4),
        ("refusal", "", "refusal", 5),
        ("cancelled", "", "aborted", 130),
        ("galaxy_brain", "odd", "error", 1),
    ] {
        let out = run_to_end(
            host(dir.path())
                .args(["--json", "--agent"])
                .arg(mock(&["text", "--text", text, "--stop", reason]))
                .arg("go"),
        );
        assert_eq!(code(&out), exit, "{reason}: {}", stderr(&out));
        let result = result_record(&out);
        assert_eq!(result["status"], status, "{reason}");
        assert_eq!(result["stopReason"], reason);
        assert_eq!(result["output"], text, "{reason}");
        if status == "error" {
            assert_eq!(
                result["error"],
                "agent returned an unknown stop reason: \"galaxy_brain\""
            );
        } else {
            assert_eq!(result["error"], Value::Null);
        }
    }
}

#[test]
fn human_mode_reports_non_completed_status_on_stderr_only() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .args(["--agent"])
            .arg(mock(&["text", "--text", "partial", "--stop", "max_tokens"]))
            .arg("go"),
    );
    assert_eq!(code(&out), 3);
    assert_eq!(stdout(&out), "partial");
    assert_eq!(stderr(&out).trim(), "acp-host: max-tokens");
}

#[test]
fn chunks_are_concatenated_and_thoughts_tools_plans_are_not_output() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .args(["--agent", &mock(&["thought"])])
            .arg("think"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "final answer");

    let out = run_to_end(
        host(dir.path())
            .args(["--agent"])
            .arg(mock(&[
                "text",
                "--text",
                "one two three four",
                "--chunks",
                "4",
            ]))
            .arg("go"),
    );
    assert_eq!(stdout(&out), "one two three four");
}

#[test]
fn verbose_shows_thoughts_and_tool_calls_on_stderr_not_stdout() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .args(["--verbose", "--agent", &mock(&["thought"])])
            .arg("think"),
    );
    assert_eq!(code(&out), 0);
    assert_eq!(stdout(&out), "final answer");
    // The whole of stderr, the agent's command line as [AGENT] and its pid as [PID].
    let agent = mock(&["thought"]);
    let err = stderr(&out).replace(&agent, "[AGENT]");
    let pid = err.find("(pid ").expect("the ready line names the pid") + "(pid ".len();
    let pid_end = pid + err[pid..].find(',').unwrap();
    insta::assert_snapshot!(format!("{}[PID]{}", &err[..pid], &err[pid_end..]));
}

#[test]
fn the_agents_stderr_is_shown_under_verbose_only_and_never_streamed_as_json() {
    let dir = temp();
    let agent = mock(&["hello", "--stderr", "mock: starting"]);
    let quiet = run_to_end(host(dir.path()).args(["--agent", &agent, "hi"]));
    assert_eq!(code(&quiet), 0);
    assert!(
        !stderr(&quiet).contains("mock: starting"),
        "{}",
        stderr(&quiet)
    );
    let verbose = run_to_end(host(dir.path()).args(["--verbose", "--agent", &agent, "hi"]));
    assert_eq!(code(&verbose), 0);
    assert!(
        stderr(&verbose).lines().any(|l| l == "mock: starting"),
        "{}",
        stderr(&verbose)
    );
    let json = run_to_end(host(dir.path()).args(["--json", "--verbose", "--agent", &agent, "hi"]));
    assert_eq!(code(&json), 0);
    assert!(records(&json).iter().all(|r| r["type"] != "stderr"));
    assert!(stderr(&json).lines().any(|l| l == "mock: starting"));
}

#[test]
fn json_streams_start_updates_and_a_complete_result() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .args(["--json", "--agent", &mock(&["thought"])])
            .arg("think"),
    );
    assert_eq!(code(&out), 0);
    let records = records(&out);
    assert_eq!(records[0]["type"], "start");
    assert_eq!(records[0]["sessionId"], "mock-session-1");
    let updates: Vec<&str> = records
        .iter()
        .filter(|r| r["type"] == "update")
        .map(|r| r["update"]["sessionUpdate"].as_str().unwrap())
        .collect();
    assert!(updates.contains(&"agent_thought_chunk"), "{updates:?}");
    assert!(updates.contains(&"agent_message_chunk"), "{updates:?}");
    let result = result_record(&out);
    assert_run_schemas(&records);
    assert_eq!(result["output"], "final answer");
    assert_eq!(result["agentExit"]["code"], 0);
    assert_eq!(result["agentExit"]["endedBy"], "eof");
    assert_eq!(result["runId"], records[0]["runId"]);
}

#[test]
fn run_ids_are_minted_by_the_host_and_differ_between_runs() {
    let dir = temp();
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let out = run_to_end(
                host(dir.path())
                    .args(["--json", "--agent", &mock(&["session-echo"])])
                    .arg("x"),
            );
            let result = result_record(&out);
            assert_eq!(result["output"], "session mock-session-1");
            assert_eq!(result["sessionId"], "mock-session-1");
            result["runId"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
    assert!(
        ids.iter()
            .all(|id| id != "mock-session-1" && !id.is_empty())
    );
}

#[test]
fn prompt_can_come_from_stdin() {
    let dir = temp();
    let mut child = host(dir.path())
        .args(["--agent", &mock(&["echo-env", "NOTHING"]), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"from stdin").unwrap();
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "NOTHING unset");
}

// ---------------------------------------------------------------------------------------------
// Permissions
// ---------------------------------------------------------------------------------------------

fn permission_run(dir: &Path, policy: Option<&str>, options: Option<&str>) -> (String, Value) {
    let mut args = vec!["permission"];
    if let Some(options) = options {
        args.extend(["--options", options]);
    }
    let mut cmd = host(dir);
    cmd.args(["--json", "--agent", &mock(&args)]);
    if let Some(policy) = policy {
        cmd.args(["--permission", policy]);
    }
    let out = run_to_end(cmd.arg("write notes"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    (result["output"].as_str().unwrap().to_owned(), result)
}

#[test]
fn permission_default_policy_rejects_by_kind() {
    let dir = temp();
    let (output, result) = permission_run(dir.path(), None, None);
    assert_eq!(output, "selected reject_once");
    let decision = &result["permissions"][0];
    assert_eq!(decision["verdict"], "reject");
    assert_eq!(decision["decidedBy"], "policy");
    assert_eq!(decision["title"], "Write notes.txt");
    assert_eq!(decision["toolKind"], "edit");
    assert_eq!(decision["outcome"]["optionId"], "reject_once");
}

#[test]
fn permission_allow_prefers_allow_once_even_when_always_is_listed_first() {
    let dir = temp();
    let (output, _) = permission_run(dir.path(), Some("allow"), None);
    assert_eq!(output, "selected allow_once");
    let (output, _) = permission_run(dir.path(), Some("allow"), Some("reject_once,allow_always"));
    assert_eq!(output, "selected allow_always");
}

#[test]
fn permission_without_a_matching_kind_is_cancelled() {
    let dir = temp();
    let (output, result) = permission_run(dir.path(), Some("allow"), Some("reject_once"));
    assert_eq!(output, "cancelled");
    assert_eq!(result["permissions"][0]["outcome"]["outcome"], "cancelled");
    let (output, _) = permission_run(dir.path(), Some("reject"), Some("allow_once"));
    assert_eq!(output, "cancelled");
}

#[test]
fn permission_ask_without_a_terminal_rejects() {
    let dir = temp();
    let mut cmd = host(dir.path());
    // No controlling terminal: `ask` must behave as `reject`, not hang.
    cmd.args([
        "--json",
        "--permission",
        "ask",
        "--agent",
        &mock(&["permission"]),
    ])
    .arg("x");
    let out = run_without_tty(&mut cmd);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(result_record(&out)["output"], "selected reject_once");
}

/// Runs in a new session (setsid) so /dev/tty is unavailable, as in CI.
pub(super) fn run_without_tty(cmd: &mut Command) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    // A new process group alone keeps the controlling terminal; setsid detaches from it.
    let mut wrapped = Command::new("setsid");
    wrapped
        .arg("-w")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .current_dir(cmd.get_current_dir().unwrap());
    run_to_end(&mut wrapped)
}

/// A host whose mock agent has reached its ready point (normally: the prompt arrived). The mock
/// writes its pid and logs every message it receives.
struct Started {
    child: Child,
    stderr: mpsc::Receiver<String>,
    pid: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Started {
    /// `acp-host run --json <host_args> --agent "<mock scenario...> --ready --pid-file --log" x`,
    /// then waits for the ready file. `{dir}` in a scenario argument is the test's temp dir.
    fn new(host_args: &[&str], scenario: &[&str]) -> Started {
        let dir = temp();
        let ready = dir.path().join("ready");
        let pid = dir.path().join("pid");
        let log = dir.path().join("log");
        let base = path_str(dir.path()).to_owned();
        let mut args: Vec<String> = scenario.iter().map(|a| a.replace("{dir}", &base)).collect();
        for (flag, path) in [("--ready", &ready), ("--pid-file", &pid), ("--log", &log)] {
            args.extend([flag.to_owned(), path_str(path).to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, stderr) = spawn_watched(host(dir.path()).arg("--json").args(host_args).args([
            "--agent",
            &mock(&args),
            "x",
        ]));
        assert!(
            wait_for_file(&ready, HANG_GUARD),
            "the mock never became ready"
        );
        Started {
            child,
            stderr,
            pid,
            log,
            dir,
        }
    }

    fn signal(&self, sig: Signal) {
        signal(&self.child, sig);
    }

    /// Waits for the host to exit; returns its output and the mock's log.
    fn finish(self) -> (Output, String, PathBuf, tempfile::TempDir) {
        let out = wait_output(self.child);
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        (out, log, self.pid, self.dir)
    }
}

#[test]
fn permission_requests_after_cancel_are_answered_cancelled() {
    let started = Started::new(&["--permission", "allow"], &["permission-after-cancel"]);
    started.signal(Signal::SIGINT);
    let (out, log, ..) = started.finish();
    assert_eq!(code(&out), 130);
    assert!(log.contains("permission cancelled"), "mock log: {log}");
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

#[test]
fn ctrl_c_cancels_a_cooperative_agent_and_keeps_partial_output() {
    let started = Started::new(&[], &["hang"]);
    started.signal(Signal::SIGINT);
    let (out, log, pid, _dir) = started.finish();
    assert_eq!(code(&out), 130);
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["stopReason"], "cancelled");
    assert_eq!(result["output"], "partial ");
    assert!(log.contains("session/cancel"), "{log}");
    assert_dead(&pid);
}

#[test]
fn sigterm_to_the_host_cancels_like_ctrl_c() {
    let started = Started::new(&[], &["hang"]);
    started.signal(Signal::SIGTERM);
    let (out, ..) = started.finish();
    assert_eq!(code(&out), 130);
    assert_eq!(result_record(&out)["status"], "aborted");
}

#[test]
fn a_closed_stderr_never_keeps_a_signal_from_ending_the_run() {
    let dir = temp();
    let ready = dir.path().join("ready");
    let pid = dir.path().join("pid");
    let agent = mock(&[
        "hang",
        "--ready",
        path_str(&ready),
        "--pid-file",
        path_str(&pid),
    ]);
    let mut child = host(dir.path())
        .args(["--agent", &agent, "x"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for_file(&ready, HANG_GUARD),
        "the mock never became ready"
    );
    // Whoever read stderr went away: saying "cancelling" there fails, and must not matter.
    drop(child.stderr.take());
    signal(&child, Signal::SIGTERM);
    let out = wait_output(child);
    assert_eq!(code(&out), 130);
    assert_eq!(stdout(&out), "partial ");
    assert_dead(&pid);
}

#[test]
fn an_agent_crashing_on_cancel_is_aborted_not_error() {
    let started = Started::new(&[], &["crash-on-cancel"]);
    started.signal(Signal::SIGINT);
    let (out, ..) = started.finish();
    assert_eq!(code(&out), 130);
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["error"], Value::Null);
    assert_eq!(result["agentExit"]["code"], 9);
}

#[test]
fn an_agent_ignoring_cancel_is_aborted_after_the_grace_and_reaped() {
    let started = Started::new(&[], &["ignore-cancel", "--ignore-eof"]);
    started.signal(Signal::SIGINT);
    let (out, _log, pid, _dir) = started.finish();
    assert_eq!(code(&out), 130);
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["output"], "partial ");
    assert_eq!(result["agentExit"]["endedBy"], "term");
    assert_dead(&pid);
}

#[test]
fn ctrl_c_mid_stream_keeps_what_streamed() {
    let started = Started::new(
        &[],
        &["slow-stream", "--chunks", "1000", "--interval-ms", "20"],
    );
    started.signal(Signal::SIGINT);
    let (out, ..) = started.finish();
    assert_eq!(code(&out), 130);
    let result = result_record(&out);
    let output = result["output"].as_str().unwrap();
    assert!(output.starts_with("c1 "), "{output:?}");
    assert!(
        !output.contains("c1000 "),
        "the stream was not cut: {output:?}"
    );
}

#[test]
fn a_second_ctrl_c_kills_at_once() {
    // Graces long enough that only the second Ctrl-C can explain a prompt exit.
    let started = Started::new(
        &[
            "--cancel-grace",
            "600",
            "--eof-grace",
            "600",
            "--term-grace",
            "600",
        ],
        &["ignore-cancel", "--ignore-eof", "--trap-term"],
    );
    started.signal(Signal::SIGINT);
    wait_line(&started.stderr, "cancelling");
    started.signal(Signal::SIGINT);
    let (out, _log, pid, _dir) = started.finish();
    assert_eq!(code(&out), 130);
    assert_eq!(result_record(&out)["agentExit"]["endedBy"], "kill");
    assert_dead(&pid);
}

#[test]
fn cancel_before_session_new_never_sends_the_prompt() {
    // The mock touches the ready file on session/new and then waits for a go file that never comes.
    let started = Started::new(&[], &["gated-session", "--go", "{dir}/go"]);
    started.signal(Signal::SIGINT);
    let (out, log, pid, _dir) = started.finish();
    assert_eq!(code(&out), 130);
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["output"], "");
    assert_eq!(result["sessionId"], Value::Null);
    assert!(!log.contains("session/prompt"), "prompt was sent: {log}");
    assert!(
        !log.contains("session/cancel"),
        "no session to cancel: {log}"
    );
    assert_dead(&pid);
}

#[test]
fn timeout_cancels_and_exits_124() {
    let dir = temp();
    let pid = dir.path().join("pid");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--timeout",
        "0.5",
        "--agent",
        &mock(&["hang", "--pid-file", path_str(&pid)]),
        "x",
    ]));
    assert_eq!(code(&out), 124);
    let result = result_record(&out);
    assert_eq!(result["status"], "timeout");
    assert_eq!(result["output"], "partial ");
    assert_eq!(result["error"], "timed out after 500 ms");
    assert_dead(&pid);
}

#[test]
fn a_silent_agent_fails_the_handshake_deadline_or_the_timeout() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args([
        "--handshake-timeout",
        "0.5",
        "--agent",
        &mock(&["silent"]),
        "x",
    ]));
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains("agent did not answer initialize within 500 ms"),
        "{}",
        stderr(&out)
    );

    let out =
        run_to_end(host(dir.path()).args(["--timeout", "0.5", "--agent", &mock(&["silent"]), "x"]));
    assert_eq!(code(&out), 124, "{}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------------------

#[test]
fn a_missing_command_is_an_error_naming_it() {
    let dir = temp();
    let out =
        run_to_end(host(dir.path()).args(["--json", "--agent", "no-such-agent-xyz --acp", "x"]));
    // A usage error, as in a batch line: nothing spawned, no result record.
    assert_eq!(code(&out), 2);
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        stderr(&out),
        "acp-host: error: agent no-such-agent-xyz --acp not found: no-such-agent-xyz is neither a \
         known agent nor a program on PATH; `acp-host agents` lists the known agents (install \
         one, or pass a command on PATH or its full path)\n"
    );
}

#[test]
fn a_crash_mid_turn_is_an_error_with_partial_output_and_stderr_tail() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args(["--agent", &mock(&["crash-on-prompt"]), "x"]));
    assert_eq!(code(&out), 1);
    assert_eq!(stdout(&out), "partial output");
    let err = stderr(&out);
    assert!(
        err.contains("acp-host: error: agent closed its output before answering session/prompt; it exited with code 3"),
        "{err}"
    );
    assert!(err.contains("mock: fatal error"), "{err}");
    // Reported once.
    assert_eq!(err.matches("acp-host: error:").count(), 1, "{err}");
}

#[test]
fn an_agent_exiting_before_initialize_is_an_error() {
    let dir = temp();
    let out =
        run_to_end(host(dir.path()).args(["--json", "--agent", &mock(&["exit-before-init"]), "x"]));
    assert_eq!(code(&out), 1);
    let result = result_record(&out);
    assert_eq!(
        result["error"],
        "agent closed its output before answering initialize; it exited with code 7"
    );
    assert_eq!(result["stderrTail"], "mock: cannot start\n");
}

#[test]
fn session_new_without_a_session_id_is_a_startup_failure_and_the_agent_quiesces() {
    let dir = temp();
    let log = dir.path().join("log");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--agent",
        &mock(&["no-session-id", "--log", path_str(&log)]),
        "x",
    ]));
    assert_eq!(code(&out), 1);
    let result = result_record(&out);
    assert_eq!(
        result["error"],
        "agent answered session/new without a sessionId: {}"
    );
    assert_eq!(result["agentExit"]["endedBy"], "eof");
    let log = std::fs::read_to_string(log).unwrap();
    assert!(log.contains("eof"), "{log}");
    assert!(!log.contains("session/prompt"), "{log}");
}

#[test]
fn non_json_lines_on_stdout_are_skipped() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args(["--agent", &mock(&["garbage"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello from acp child");
}

#[test]
fn a_huge_frame_is_delivered_whole() {
    let dir = temp();
    let bytes = 8 * 1024 * 1024;
    let out = run_to_end(host(dir.path()).args([
        "--agent",
        &mock(&["huge", "--bytes", &bytes.to_string()]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.len(), bytes);
    assert!(text.bytes().all(|b| b == b'x'));
}

#[test]
fn fs_and_terminal_requests_get_method_not_found() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args(["--agent", &mock(&["fs-request"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "fs: -32601 terminal: -32601");
    // The SDK's warning about the unanswered methods is for --verbose only.
    assert!(
        !stderr(&out).contains("Method not found"),
        "{}",
        stderr(&out)
    );
    let verbose =
        run_to_end(host(dir.path()).args(["--verbose", "--agent", &mock(&["fs-request"]), "x"]));
    assert_eq!(code(&verbose), 0, "{}", stderr(&verbose));
    assert!(
        stderr(&verbose).contains("Method not found"),
        "{}",
        stderr(&verbose)
    );
}

// ---------------------------------------------------------------------------------------------
// Teardown
// ---------------------------------------------------------------------------------------------

#[test]
fn a_grandchild_is_not_left_behind() {
    let dir = temp();
    let ready = dir.path().join("ready");
    let grandchild = dir.path().join("grandchild");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--timeout",
        "1",
        "--agent",
        &mock(&[
            "grandchild",
            "--pid-file",
            path_str(&grandchild),
            "--ready",
            path_str(&ready),
        ]),
        "x",
    ]));
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_dead(&grandchild);
}

#[test]
fn an_agent_ignoring_eof_and_sigterm_is_killed() {
    let dir = temp();
    let pid = dir.path().join("pid");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--eof-grace",
        "0.2",
        "--term-grace",
        "0.2",
        "--agent",
        &mock(&["stubborn", "--pid-file", path_str(&pid)]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["output"], "hello from acp child");
    assert_eq!(result["agentExit"]["endedBy"], "kill");
    assert_eq!(result["agentExit"]["signal"], 9);
    assert_dead(&pid);
}

#[test]
fn the_eof_grace_lets_an_agent_flush_before_exiting() {
    let dir = temp();
    let marker = dir.path().join("flushed");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--eof-grace",
        "10",
        "--agent",
        &mock(&[
            "flush-on-eof",
            "--marker",
            path_str(&marker),
            "--delay-ms",
            "300",
        ]),
        "x",
    ]));
    assert_eq!(code(&out), 0);
    assert_eq!(result_record(&out)["agentExit"]["endedBy"], "eof");
    assert!(marker.exists(), "the agent was killed before it flushed");
}

#[test]
fn the_sigterm_rung_fires_when_eof_is_ignored() {
    let dir = temp();
    let marker = dir.path().join("termed");
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--eof-grace",
        "0.2",
        "--agent",
        &mock(&["term-marker", "--marker", path_str(&marker)]),
        "x",
    ]));
    assert_eq!(code(&out), 0);
    assert_eq!(result_record(&out)["agentExit"]["endedBy"], "term");
    assert!(marker.exists(), "SIGTERM did not reach the agent");
}

// ---------------------------------------------------------------------------------------------
// Environment and working directory
// ---------------------------------------------------------------------------------------------

#[test]
fn credentials_are_scrubbed_and_explicit_forwards_reach_the_agent() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .env("OPENAI_API_KEY", "sk-test-not-a-real-key-0123456789")
            .env("MY_SECRET_THING", "x")
            .env("INNOCENT_URL", "https://user:hunter2@example.com/")
            .env("PLAIN_VALUE", "hello")
            .env("FORWARDED_TOKEN", "keep-me")
            .args([
                "--json",
                "--env",
                "FORWARDED_TOKEN",
                "--env",
                "SET_HERE=42",
                "--agent",
                &mock(&[
                    "echo-env",
                    "OPENAI_API_KEY",
                    "MY_SECRET_THING",
                    "INNOCENT_URL",
                    "PLAIN_VALUE",
                    "FORWARDED_TOKEN",
                    "SET_HERE",
                ]),
                "x",
            ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(
        result["output"],
        "OPENAI_API_KEY unset\nMY_SECRET_THING unset\nINNOCENT_URL unset\nPLAIN_VALUE=hello\nFORWARDED_TOKEN=keep-me\nSET_HERE=42"
    );
    let scrubbed: Vec<&str> = result["scrubbedEnv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in ["OPENAI_API_KEY", "MY_SECRET_THING", "INNOCENT_URL"] {
        assert!(
            scrubbed.contains(&name),
            "{name} not reported: {scrubbed:?}"
        );
    }
    assert!(!scrubbed.contains(&"FORWARDED_TOKEN"));
    assert!(
        !stdout(&out).contains("hunter2"),
        "a secret value leaked into the JSON"
    );
}

#[test]
fn forwarding_an_unset_variable_is_a_usage_error() {
    let dir = temp();
    let log = dir.path().join("log");
    let out = run_to_end(host(dir.path()).env_remove("NOT_SET_ANYWHERE").args([
        "--env",
        "NOT_SET_ANYWHERE",
        "--agent",
        &mock(&["hello", "--log", path_str(&log)]),
        "x",
    ]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("--env NOT_SET_ANYWHERE: the variable is not set"),
        "{}",
        stderr(&out)
    );
    assert!(!log.exists(), "an agent was spawned");
}

#[test]
fn cwd_defaults_to_the_callers_directory() {
    let dir = temp();
    let canonical = dir.path().canonicalize().unwrap();
    let out = run_to_end(host(&canonical).args(["--agent", &mock(&["echo-cwd"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let cwd = canonical.display();
    assert_eq!(stdout(&out), format!("process: {cwd}\nsession: {cwd}"));
}

#[test]
fn a_configured_cwd_wins_and_a_relative_one_is_made_absolute() {
    let dir = temp();
    let canonical = dir.path().canonicalize().unwrap();
    let sub = canonical.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out =
        run_to_end(host(&canonical).args(["--cwd", "sub", "--agent", &mock(&["echo-cwd"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let cwd = sub.display();
    assert_eq!(stdout(&out), format!("process: {cwd}\nsession: {cwd}"));
}

#[test]
fn an_unusable_cwd_is_refused_before_spawning() {
    let dir = temp();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let sentinel = dir.path().join("spawned");
    let agent = format!("touch {}", path_str(&sentinel));
    for cwd in [dir.path().join("missing"), file] {
        let out =
            run_to_end(host(dir.path()).args(["--cwd", path_str(&cwd), "--agent", &agent, "x"]));
        assert_eq!(code(&out), 2);
        assert!(
            stderr(&out).contains(&format!(
                "working directory is not an accessible directory: {}",
                cwd.display()
            )),
            "{}",
            stderr(&out)
        );
        assert!(
            !sentinel.exists(),
            "an agent was spawned for cwd {}",
            cwd.display()
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let dir = temp();
    for args in [
        vec!["--permission", "maybe", "x"],
        vec!["--timeout", "soon", "x"],
        vec!["--env", "=x", "x"],
        vec!["--agent", "", "x"],
        vec!["--agent", "grok", "x"],
        vec!["  "],
    ] {
        let out = run_to_end(host(dir.path()).args(&args));
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty());
    }
}

#[test]
fn the_agent_dies_with_the_host() {
    let started = Started::new(&[], &["ignore-cancel", "--ignore-eof"]);
    // SIGKILL: the host gets no chance to tear down; the parent-death signal must do it.
    started.signal(Signal::SIGKILL);
    let (_out, _log, pid, _dir) = started.finish();
    assert_dead(&pid);
}

#[test]
fn a_closed_stdout_pipe_is_not_an_error() {
    let dir = temp();
    let mut child = host(dir.path())
        .args(["--agent", &mock(&["huge", "--bytes", "4000000"]), "x"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 5];
    std::io::Read::read_exact(&mut out, &mut first).unwrap();
    assert_eq!(&first, b"xxxxx");
    drop(out);
    let output = wait_output(child);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stderr(&output), "");
}

/// `--permission ask` on a real terminal: `script` gives acp-host a pseudo-terminal whose input
/// is the answer we type.
fn ask_on_a_terminal(answer: &str) -> String {
    let dir = temp();
    let command = shell_words::join(&[
        bin("acp-host").display().to_string(),
        "run".into(),
        "--permission".into(),
        "ask".into(),
        "--agent".into(),
        mock(&["permission"]),
        "x".into(),
    ]);
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux is installed");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), answer.as_bytes()).unwrap();
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    stdout(&out)
}

#[test]
fn permission_ask_prompts_on_the_terminal_with_title_and_kind() {
    let yes = ask_on_a_terminal("y\n");
    assert!(
        yes.contains("acp-host: allow edit \"Write notes.txt\"? [y/N]"),
        "{yes}"
    );
    assert!(yes.contains("selected allow_once"), "{yes}");
    assert!(yes.contains("[by user]"), "{yes}");

    let no = ask_on_a_terminal("n\n");
    assert!(no.contains("selected reject_once"), "{no}");
}

#[test]
fn a_missing_registry_agent_says_how_to_install_it() {
    let dir = temp();
    let out = run_to_end(
        host(dir.path())
            .env(env_vars::PATH, "/usr/bin:/bin")
            .args(["--json", "--agent", "claude", "x"]),
    );
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: agent claude is not installed: claude-code-acp is not on PATH; install \
         it (`npm install -g @zed-industries/claude-code-acp`), or pass --agent with its full \
         path\n"
    );
}

#[test]
fn an_agent_requiring_authentication_says_how_to_get_past_it() {
    let dir = temp();
    // Nothing key-shaped withheld: the hint cannot name a variable.
    let out = run_to_end(
        host(dir.path())
            .env_clear()
            .envs(acp_tests::instrumentation_env())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["--json", "--agent", &mock(&["auth-required"]), "x"]),
    );
    assert_eq!(code(&out), 1);
    assert_eq!(
        result_record(&out)["error"],
        "agent answered session/new with error -32000: Authentication required; the agent needs \
         authentication: log in with the agent itself once, or forward its API key with --env NAME"
    );
}

#[test]
fn a_non_executable_command_is_an_error_naming_it() {
    let dir = temp();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let out = run_to_end(host(dir.path()).args(["--json", "--agent", path_str(&script), "x"]));
    // Refused before anything is spawned, as a batch line's is.
    assert_eq!(code(&out), 2);
    assert!(out.stdout.is_empty());
    let script = script.display();
    assert_eq!(
        stderr(&out),
        format!(
            "acp-host: error: agent {script} cannot start: {script} is not an executable file; \
             make it one (`chmod +x {script}`) or fix the path\n"
        )
    );
}

/// Every error path of a run sets a machine-readable `errorKind` beside the human `error`; a run
/// without an error has none.
#[test]
fn every_error_has_a_kind() {
    let dir = temp();
    // A program that is not there is refused before a run exists (exit 2); one that cannot be
    // executed is the run's spawn error.
    let script = dir.path().join("no-interpreter.sh");
    std::fs::write(&script, "#!/no/such/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--agent", path_str(&script)], "spawn"),
        (
            &["--handshake-timeout", "0.3", "--agent", &mock(&["silent"])],
            "handshake",
        ),
        (&["--agent", &mock(&["auth-required"])], "handshake"),
        (&["--agent", &mock(&["no-session-id"])], "handshake"),
        (
            &[
                "--agent",
                &mock(&["text", "--text", "t", "--stop", "weird"]),
            ],
            "protocol",
        ),
        (&["--agent", &mock(&["crash-on-prompt"])], "crash"),
        (
            &["--agent", &mock(&["exit-before-init", "--code", "4"])],
            "crash",
        ),
        (
            &["--timeout", "0.5", "--agent", &mock(&["silent"])],
            "timeout",
        ),
    ];
    for (args, kind) in cases {
        let out = run_to_end(host(dir.path()).arg("--json").args(*args).arg("x"));
        let result = result_record(&out);
        assert_eq!(result["errorKind"], *kind, "{args:?}: {result}");
        assert!(result["error"].is_string(), "{args:?}: {result}");
    }
    let out = run_to_end(host(dir.path()).args(["--json", "--agent", &mock(&["hello"]), "x"]));
    let result = result_record(&out);
    assert_eq!(result["errorKind"], Value::Null, "{result}");
    assert_eq!(result["error"], Value::Null, "{result}");
}

#[test]
fn resume_is_refused_before_any_prompt_when_the_agent_cannot_load_sessions() {
    let dir = temp();
    let log = dir.path().join("log");
    let agent = mock(&["hello", "--log", path_str(&log)]);
    let out =
        run_to_end(host(dir.path()).args(["--json", "--resume", "sess-1", "--agent", &agent, "x"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "error");
    assert_eq!(result["errorKind"], "capability");
    assert_eq!(
        result["error"],
        format!(
            "cannot resume session sess-1: agent {agent} does not advertise loadSession, so it \
             cannot continue a saved session; start a new session instead"
        )
    );
    // initialize, then nothing but the end of the pipe.
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "initialize\neof\n");
}
