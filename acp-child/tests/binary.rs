//! Smoke tests of the `acp-child` binary itself. Their presence also makes `cargo test --workspace`
//! build the binary that the end-to-end suites in `tests/` run.

use std::process::{Command, Stdio};

fn acp_child() -> Command {
    Command::new(env!("CARGO_BIN_EXE_acp-child"))
}

#[test]
fn version_names_the_agent() {
    let out = acp_child().arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "acp-child {}\n",
            acp_host::version_text(env!("CARGO_PKG_VERSION"))
        )
    );
}

#[test]
fn an_empty_stdin_is_a_clean_exit_with_nothing_on_stdout() {
    let out = acp_child()
        .stdin(Stdio::null())
        .env_remove("ACP_CHILD_MODEL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
}
