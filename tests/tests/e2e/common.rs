//! Helpers shared by the end-to-end modules that need this test binary's own environment (the
//! `mock-agent` path cargo gives integration tests); everything else lives in `acp_tests`.

use std::path::Path;
use std::process::{Command, Output};

use acp_tests::mock_llm::MockLlm;
use acp_tests::{host_run, stdout};
use protocol::env_vars;
use serde_json::Value;

/// The scripted mock agent built beside this test binary.
pub(crate) fn mock_path() -> &'static str {
    env!("CARGO_BIN_EXE_mock-agent")
}

/// The `--agent` command line for the mock with these arguments.
pub(crate) fn mock(args: &[&str]) -> String {
    shell_words::join(std::iter::once(mock_path()).chain(args.iter().copied()))
}

/// All NDJSON records of a `--json` run; asserts every stdout line is JSON.
pub(crate) fn records(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect()
}

/// The last record of a `--json` run, which must be the result.
pub(crate) fn result_record(output: &Output) -> Value {
    let records = records(output);
    let last = records.last().expect("at least the result record").clone();
    assert_eq!(last["type"], "result", "last record is the result: {last}");
    last
}

pub(crate) fn temp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The model settings of the test's own environment, which would change what acp-child does.
pub(crate) const MODEL_ENV: &[&str] = &[
    env_vars::ACP_CHILD_MODEL,
    env_vars::ACP_CHILD_BASE_URL,
    env_vars::ACP_CHILD_API_KEY,
    env_vars::DEEPSEEK_API_KEY,
    env_vars::OPENAI_API_KEY,
];

/// `acp-host run --json` in `dir` of acp-child on the mock model `llm` (as model `mock-model`,
/// with `extra` arguments), its sessions saved under `dir/.state`.
pub(crate) fn acp_child_json_run(dir: &Path, llm: &MockLlm, extra: &[&str]) -> Command {
    let mut cmd = host_run(dir);
    for name in MODEL_ENV {
        cmd.env_remove(name);
    }
    let state = dir.join(".state").display().to_string();
    let base_url = llm.base_url();
    let agent = shell_words::join(
        ["acp-child", "--model", "mock-model"]
            .into_iter()
            .chain(extra.iter().copied())
            .chain([
                "--base-url",
                base_url.as_str(),
                "--state-dir",
                state.as_str(),
            ]),
    );
    cmd.args(["--json", "--agent", &agent]);
    cmd
}
