//! Smoke tests of the `acp-host` binary itself. Their presence also makes `cargo test --workspace`
//! build the binary that the end-to-end suites in `tests/` run.

use std::process::Command;

fn acp_host() -> Command {
    Command::new(env!("CARGO_BIN_EXE_acp-host"))
}

#[test]
fn version_names_the_tool() {
    let out = acp_host().arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!(
            "acp-host {}\n",
            acp_host::version_text(env!("CARGO_PKG_VERSION"))
        )
    );
}

#[test]
fn a_missing_prompt_is_a_usage_error() {
    let out = acp_host().arg("run").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("<PROMPT | ->"));
}
