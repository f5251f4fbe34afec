//! End-to-end: the real pair, `acp-host run` driving `acp-child` on its offline backend, as the
//! README's quick start does. Files are checked on disk; processes are checked gone.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use acp_tests::{bin, wait_until};
use nix::sys::signal::Signal;
use protocol::env_vars;

fn host(dir: &Path) -> Command {
    let mut cmd = Command::new(bin("acp-host"));
    cmd.current_dir(dir)
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("acp-host runs")
}

#[test]
fn the_quick_start_answers_honestly_without_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(host(dir.path()).arg("hello"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), acp_child::NO_MODEL_REPLY.concat());
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn write_is_rejected_by_default_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(host(dir.path()).arg("/write notes.txt hello there"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "permission denied: did not write notes.txt"
    );
    assert!(!dir.path().join("notes.txt").exists());
    assert!(
        text(&out.stderr).contains(
            "permission reject for Write notes.txt (edit): selected reject-once [by policy]"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn write_with_allow_writes_the_file_and_read_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(host(dir.path()).args(["--permission", "allow", "/write notes.txt hello there"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "wrote 11 bytes to notes.txt");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "hello there"
    );

    let out = run(host(dir.path()).arg("/read notes.txt"));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "hello there");
}

#[test]
fn writing_outside_the_cwd_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let out = run(host(&inner).args(["--permission", "allow", "/write ../escape.txt x"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).starts_with("refused: ../escape.txt is outside the session directory")
    );
    assert!(!dir.path().join("escape.txt").exists());
}

#[test]
fn ctrl_c_during_sleep_aborts_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = host(dir.path())
        .args(["--json", "/sleep 60"])
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Wait for the sleep tool call to be reported: the turn is then in flight.
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        for line in lines.by_ref().map_while(Result::ok) {
            let started = line.contains("\"sessionUpdate\":\"tool_call\"");
            seen.push(line);
            if started {
                break;
            }
        }
        (lines, seen)
    });
    let (lines, seen) = reader.join().unwrap();
    let start: serde_json::Value = serde_json::from_str(&seen[0]).unwrap();
    let agent_pid = u32::try_from(start["pid"].as_u64().unwrap()).unwrap();
    crate::run::signal(&child, Signal::SIGINT);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let result: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(result["status"], "aborted");
    assert_eq!(result["stopReason"], "cancelled");
    assert!(wait_until(Duration::from_secs(10), || {
        !acp_tests::process_alive(agent_pid)
    }));
}

#[test]
fn the_start_record_comes_before_updates_sent_right_after_session_new() {
    // acp-child announces its commands right after answering session/new: that update races the
    // answer inside the host and must still be streamed after `start`.
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let out = run(host(dir.path()).args(["--json", "hello"]));
        assert_eq!(out.status.code(), Some(0));
        let types: Vec<String> = text(&out.stdout)
            .lines()
            .map(|line| {
                let record: serde_json::Value = serde_json::from_str(line).unwrap();
                let kind = record["update"]["sessionUpdate"].as_str().unwrap_or("");
                format!(
                    "{}{}",
                    record["type"].as_str().unwrap(),
                    if kind.is_empty() {
                        String::new()
                    } else {
                        format!(":{kind}")
                    }
                )
            })
            .collect();
        assert_eq!(types[0], "start", "{types:?}");
        assert_eq!(types[1], "update:available_commands_update", "{types:?}");
        assert_eq!(types.last().unwrap(), "result");
    }
}

#[test]
fn agents_lists_acp_child_installed_beside_acp_host() {
    let home = tempfile::tempdir().unwrap();
    let out = run(Command::new(bin("acp-host"))
        .args(["agents", "--json"])
        .env(env_vars::HOME, home.path())
        // Not on PATH: found beside acp-host, as `run --agent acp-child` finds it.
        .env(env_vars::PATH, "/usr/bin:/bin"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let child = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "acp-child")
        .unwrap();
    assert_eq!(child["installed"], true);
    assert_eq!(child["acpCommand"], serde_json::json!(["acp-child"]));
    assert_eq!(child["acpCommandFound"], true);
    let claude = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "claude-code")
        .unwrap();
    assert_eq!(claude["acpCommandFound"], false);
    assert_eq!(
        claude["install"],
        "npm install -g @zed-industries/claude-code-acp"
    );
}
