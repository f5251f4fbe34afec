//! The mock agent itself, driven over real pipes: the exact frames it sends, its noise, its
//! exit codes, and the files and signals the host suites rely on. Every read has a deadline,
//! so a broken mock fails a test instead of hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use acp_tests::{process_alive, read_pid, wait_for_file, wait_until, wait_until_dead};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

use super::common::mock_path;

const DEADLINE: Duration = Duration::from_secs(10);

/// A running mock with line-wise access to its stdout.
struct Mock {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Mock {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(mock_path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so a test can signal the mock's whole tree without hitting itself.
            .process_group(0)
            .spawn()
            .expect("mock-agent starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    fn send(&mut self, frame: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        writeln!(stdin, "{frame}").expect("the mock reads stdin");
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line, raw.
    fn line(&self) -> String {
        self.lines
            .recv_timeout(DEADLINE)
            .expect("the mock wrote a line within the deadline")
    }

    /// The next stdout line, as JSON.
    fn frame(&self) -> Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"))
    }

    /// Waits for exit (bounded); returns status and stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        self.close_stdin();
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait works") {
                break status;
            }
            assert!(Instant::now() < deadline, "the mock did not exit in time");
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .expect("stderr is piped")
            .read_to_string(&mut stderr)
            .expect("stderr is readable");
        (status, stderr)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        // Best effort: a failed test must not leave a mock (or its grandchild) behind. Only
        // while the mock is unreaped: then its pid, which is the group id, cannot be reused.
        if let Ok(None) = self.child.try_wait() {
            let _ = killpg(self.pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
           "params": {"protocolVersion": 1, "clientCapabilities": {}}})
}

fn new_session() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "session/new",
           "params": {"cwd": "/", "mcpServers": []}})
}

fn prompt() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
           "params": {"sessionId": "mock-session-1", "prompt": [{"type": "text", "text": "hi"}]}})
}

fn agent_text(text: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "mock-session-1",
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
    }})
}

fn stop(id: u64, reason: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": reason}})
}

/// The frames `hello` answers the three requests with, in order.
fn hello_frames() -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 0, "result":
               {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}}),
        json!({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "mock-session-1"}}),
        agent_text("hello from acp child"),
        stop(2, "end_turn"),
    ]
}

/// Sends initialize and session/new, checking both answers.
fn start_session(mock: &mut Mock) {
    mock.send(&initialize());
    assert_eq!(mock.frame(), hello_frames()[0]);
    mock.send(&new_session());
    assert_eq!(mock.frame(), hello_frames()[1]);
}

#[test]
fn hello_answers_with_exact_frames_logs_each_message_and_exits_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut mock = Mock::spawn(&["hello", "--log", log.to_str().unwrap()]);
    for request in [initialize(), new_session(), prompt()] {
        mock.send(&request);
    }
    let frames: Vec<Value> = (0..4).map(|_| mock.frame()).collect();
    assert_eq!(frames, hello_frames());

    let (status, stderr) = mock.finish();
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "initialize\nsession/new\nsession/prompt\neof\n"
    );
}

#[test]
fn garbage_prints_noise_before_and_between_the_hello_frames() {
    let mut mock = Mock::spawn(&["garbage"]);
    for request in [initialize(), new_session(), prompt()] {
        mock.send(&request);
    }
    let mut noise = Vec::new();
    let mut frames = Vec::new();
    while frames.len() < 4 {
        let line = mock.line();
        match serde_json::from_str::<Value>(&line) {
            Ok(frame) => frames.push(frame),
            Err(_) => noise.push((frames.len(), line)),
        }
    }
    assert_eq!(frames, hello_frames());
    let before_first = noise.iter().filter(|(seen, _)| *seen == 0).count();
    assert!(
        before_first >= 3,
        "a banner precedes the first frame: {noise:?}"
    );
    for frames_seen in 1..4 {
        assert!(
            noise.iter().any(|(seen, _)| *seen == frames_seen),
            "noise after frame {frames_seen}: {noise:?}"
        );
    }
    assert!(noise.iter().any(|(_, line)| line == "{not json"));
    assert!(noise.iter().any(|(_, line)| line.is_empty()));
}

#[test]
fn exit_before_init_exits_with_its_code_and_message_before_reading() {
    let (status, stderr) = Mock::spawn(&["exit-before-init"]).finish();
    assert_eq!(status.code(), Some(7));
    assert_eq!(stderr, "mock: cannot start\n");

    let mock = Mock::spawn(&["exit-before-init", "--code", "5"]);
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(5));
}

#[test]
fn usage_errors_exit_64_with_a_message() {
    for args in [
        &["nope"][..],
        &["hello", "--bogus"],
        &["hello", "--bytes", "1"],
        &[],
    ] {
        let (status, stderr) = Mock::spawn(args).finish();
        assert_eq!(status.code(), Some(64), "{args:?}");
        assert!(stderr.starts_with("mock-agent: "), "{args:?}: {stderr}");
    }
}

#[test]
fn text_sends_chunks_and_any_stop_reason() {
    let mut mock = Mock::spawn(&[
        "text",
        "--text",
        "abcde",
        "--chunks",
        "2",
        "--stop",
        "galaxy_brain",
    ]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("abc"));
    assert_eq!(mock.frame(), agent_text("de"));
    assert_eq!(mock.frame(), stop(2, "galaxy_brain"));
}

#[test]
fn hang_answers_cancel_with_cancelled_after_partial_text_and_ready() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let mut mock = Mock::spawn(&["hang", "--ready", ready.to_str().unwrap()]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("partial "));
    assert!(wait_for_file(&ready, DEADLINE));
    mock.send(&cancel());
    assert_eq!(mock.frame(), stop(2, "cancelled"));
}

#[test]
fn permission_reports_the_selected_option() {
    let mut mock = Mock::spawn(&["permission", "--options", "allow_always,allow_once"]);
    start_session(&mut mock);
    mock.send(&prompt());
    let request = mock.frame();
    assert_eq!(request["method"], "session/request_permission");
    assert_eq!(request["params"]["toolCall"]["title"], "Write notes.txt");
    let kinds: Vec<&Value> = request["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|option| &option["kind"])
        .collect();
    assert_eq!(kinds, ["allow_always", "allow_once"]);
    mock.send(&json!({"jsonrpc": "2.0", "id": request["id"],
                      "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}));
    assert_eq!(mock.frame(), agent_text("selected allow_once"));
    assert_eq!(mock.frame(), stop(2, "end_turn"));
}

#[test]
fn no_session_id_answers_an_empty_object_and_quiesces_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut mock = Mock::spawn(&["no-session-id", "--log", log.to_str().unwrap()]);
    mock.send(&initialize());
    mock.frame();
    mock.send(&new_session());
    assert_eq!(
        mock.frame(),
        json!({"jsonrpc": "2.0", "id": 1, "result": {}})
    );
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "initialize\nsession/new\neof\n"
    );
}

#[test]
fn term_marker_survives_eof_and_writes_its_marker_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let log = dir.path().join("log");
    let mut mock = Mock::spawn(&[
        "term-marker",
        "--marker",
        marker.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    // An answer proves the trap is registered (it is set up before the first frame).
    mock.send(&initialize());
    mock.frame();
    mock.close_stdin();
    let saw_eof =
        || std::fs::read_to_string(&log).is_ok_and(|text| text.lines().any(|line| line == "eof"));
    assert!(wait_until(DEADLINE, saw_eof), "the mock saw EOF");
    assert!(process_alive(mock.child.id()), "EOF is ignored");
    kill(mock.pid(), Signal::SIGTERM).unwrap();
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(0));
    assert!(marker.exists());
}

#[test]
fn grandchild_writes_the_grandchild_pid_and_dies_with_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mock = Mock::spawn(&["grandchild", "--pid-file", pid_file.to_str().unwrap()]);
    assert!(wait_for_file(&pid_file, DEADLINE));
    let grandchild = read_pid(&pid_file).expect("the pid file holds a pid");
    assert_ne!(grandchild, mock.child.id());
    assert!(process_alive(grandchild));
    killpg(mock.pid(), Signal::SIGKILL).unwrap();
    assert!(wait_until_dead(grandchild, DEADLINE));
}

fn cancel() -> Value {
    json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "mock-session-1"}})
}

fn log_has(log: &std::path::Path, wanted: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.lines().any(|line| line == wanted))
}

#[test]
fn crash_on_cancel_exits_9_and_crash_on_prompt_exits_3() {
    let mut mock = Mock::spawn(&["crash-on-cancel"]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("partial "));
    mock.send(&cancel());
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(9));

    let mut mock = Mock::spawn(&["crash-on-prompt"]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("partial output"));
    let (status, stderr) = mock.finish();
    assert_eq!(status.code(), Some(3));
    assert_eq!(stderr, "mock: fatal error\n");
}

#[test]
fn gated_session_answers_once_go_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let mut mock = Mock::spawn(&[
        "gated-session",
        "--ready",
        ready.to_str().unwrap(),
        "--go",
        go.to_str().unwrap(),
    ]);
    mock.send(&initialize());
    mock.frame();
    mock.send(&new_session());
    assert!(wait_for_file(&ready, DEADLINE));
    std::fs::write(&go, "").unwrap();
    assert_eq!(mock.frame(), hello_frames()[1]);
}

#[test]
fn gated_session_exits_on_eof_while_gated() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let mut mock = Mock::spawn(&[
        "gated-session",
        "--ready",
        ready.to_str().unwrap(),
        "--go",
        go.to_str().unwrap(),
    ]);
    mock.send(&initialize());
    mock.frame();
    mock.send(&new_session());
    assert!(wait_for_file(&ready, DEADLINE));
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(0));
}

#[test]
fn flush_on_eof_writes_its_marker_after_the_delay_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let mock = Mock::spawn(&[
        "flush-on-eof",
        "--marker",
        marker.to_str().unwrap(),
        "--delay-ms",
        "50",
    ]);
    let started = Instant::now();
    let (status, _) = mock.finish();
    assert_eq!(status.code(), Some(0));
    assert!(marker.exists());
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[test]
fn permission_after_cancel_reports_the_outcome_and_answers_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, log) = (dir.path().join("ready"), dir.path().join("log"));
    let mut mock = Mock::spawn(&[
        "permission-after-cancel",
        "--ready",
        ready.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert!(wait_for_file(&ready, DEADLINE));
    mock.send(&cancel());
    let request = mock.frame();
    assert_eq!(request["method"], "session/request_permission");
    mock.send(&json!({"jsonrpc": "2.0", "id": request["id"],
                      "result": {"outcome": {"outcome": "cancelled"}}}));
    assert_eq!(mock.frame(), stop(2, "cancelled"));
    assert!(log_has(&log, "permission cancelled"));
    let (_, stderr) = mock.finish();
    assert!(stderr.contains("mock: permission after cancel: cancelled"));
}

#[test]
fn slow_stream_streams_numbered_chunks_and_stops_on_cancel() {
    let mut mock = Mock::spawn(&["slow-stream", "--chunks", "3", "--interval-ms", "5"]);
    start_session(&mut mock);
    mock.send(&prompt());
    for chunk in ["c1 ", "c2 ", "c3 "] {
        assert_eq!(mock.frame(), agent_text(chunk));
    }
    assert_eq!(mock.frame(), stop(2, "end_turn"));

    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let mut mock = Mock::spawn(&[
        "slow-stream",
        "--chunks",
        "1000",
        "--interval-ms",
        "10000",
        "--ready",
        ready.to_str().unwrap(),
    ]);
    start_session(&mut mock);
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("c1 "));
    assert!(wait_for_file(&ready, DEADLINE));
    mock.send(&cancel());
    assert_eq!(mock.frame(), stop(2, "cancelled"));
}

#[test]
fn stubborn_survives_sigterm_and_eof_until_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let (ready, log) = (dir.path().join("ready"), dir.path().join("log"));
    let mut mock = Mock::spawn(&[
        "stubborn",
        "--ready",
        ready.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    start_session(&mut mock);
    kill(mock.pid(), Signal::SIGTERM).unwrap();
    mock.send(&prompt());
    assert_eq!(mock.frame(), agent_text("hello from acp child"));
    assert_eq!(mock.frame(), stop(2, "end_turn"));
    assert!(wait_for_file(&ready, DEADLINE));
    mock.close_stdin();
    assert!(wait_until(DEADLINE, || log_has(&log, "eof")));
    assert!(process_alive(mock.child.id()));
    kill(mock.pid(), Signal::SIGKILL).unwrap();
    let (status, _) = mock.finish();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[test]
fn huge_sends_one_8_mib_chunk_in_a_single_frame() {
    let mut mock = Mock::spawn(&["huge"]);
    start_session(&mut mock);
    mock.send(&prompt());
    let frame = mock.frame();
    let text = frame["params"]["update"]["content"]["text"]
        .as_str()
        .unwrap();
    assert_eq!(text.len(), 8 * 1024 * 1024);
    assert!(text.bytes().all(|byte| byte == b'x'));
    assert_eq!(mock.frame(), stop(2, "end_turn"));
}
