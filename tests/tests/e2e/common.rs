//! Helpers shared by the end-to-end modules that need this test binary's own environment (the
//! `mock-agent` path cargo gives integration tests); everything else lives in `acp_tests`.

use std::path::Path;
use std::process::{Command, Output};

use acp_tests::mock_llm::MockLlm;
use acp_tests::{code, host_run, run_to_end, stderr, stdout};
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

/// Asserts that every record of an `acp-host run --json` output matches its checked-in schema
/// (no key missing, none undeclared): `run-result` for the result, `run-event` for the others.
pub(crate) fn assert_run_schemas(records: &[Value]) {
    for record in records {
        let schema = if record["type"] == "result" {
            "run-result.json"
        } else {
            "run-event.json"
        };
        protocol::schema::check_keys(&protocol::schema::output(schema).unwrap(), record)
            .unwrap_or_else(|e| panic!("{e}: {record}"));
    }
}

/// Runs `cmd`, an `acp-host run --json`, to its end, asserting it exited with `expected` and that
/// every record matches its schema; its records and its result (the last record).
pub(crate) fn json_run(cmd: &mut Command, expected: i32) -> (Vec<Value>, Value) {
    let out = run_to_end(cmd);
    assert_eq!(code(&out), expected, "{}", stderr(&out));
    let records = records(&out);
    assert_run_schemas(&records);
    let result = result_record(&out);
    (records, result)
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
