//! Helpers shared by the end-to-end modules that need this test binary's own environment (the
//! `mock-agent` path cargo gives integration tests); everything else lives in `acp_tests`.

use std::process::Output;

use acp_tests::stdout;
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
