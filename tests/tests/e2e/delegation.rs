//! End-to-end: delegation across processes. The depth budget (`ACP_HOST_DEPTH`,
//! `ACP_HOST_MAX_DEPTH`) set by `acp-host run` and enforced before anything is spawned.

use std::path::Path;
use std::process::Command;

use acp_tests::{code, host_run, run_to_end, stderr, stdout};
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use serde_json::Value;

fn mock_path() -> &'static str {
    env!("CARGO_BIN_EXE_mock-agent")
}

/// `acp-host run` with the mock echoing the depth variables it was given.
fn echo_depth(dir: &Path) -> Command {
    let mut cmd = host_run(dir);
    cmd.env_remove(ACP_HOST_DEPTH)
        .env_remove(ACP_HOST_MAX_DEPTH)
        .args([
            "--agent",
            &format!(
                "{} echo-env {ACP_HOST_DEPTH} {ACP_HOST_MAX_DEPTH}",
                mock_path()
            ),
        ]);
    cmd
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
    assert_eq!(lines.len(), 1, "only the result, no start: {lines:?}");
    let result = &lines[0];
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
