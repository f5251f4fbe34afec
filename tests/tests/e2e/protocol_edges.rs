//! End-to-end: odd protocol input answered right, through `acp-host run` and the scripted mock.
//!
//! Permission requests the SDK's typed parser refuses (unknown kinds, numeric ids, missing names,
//! one id under two kinds) still reach the policy and the record; updates for a session that is
//! not ours are ignored; messages read cleanly and name what to do.

use std::path::Path;
use std::process::Output;

use acp_tests::{code, run_to_end, stderr, stdout};
use serde_json::{Value, json};

use super::common::{mock, records, result_record, temp};

/// `permission-raw` offering `options`, under `--permission policy`, with `--json`.
fn raw_permission(dir: &Path, policy: &str, options: &Value) -> Output {
    let agent = mock(&["permission-raw", "--options-json", &options.to_string()]);
    run_to_end(acp_tests::host_run(dir).args([
        "--json",
        "--permission",
        policy,
        "--agent",
        &agent,
        "x",
    ]))
}

/// The one recorded decision of a run that answered exactly one request.
fn only_decision(result: &Value) -> &Value {
    let decisions = result["permissions"].as_array().expect("permissions array");
    assert_eq!(decisions.len(), 1, "{result}");
    &decisions[0]
}

#[test]
fn unknown_kinds_numeric_ids_and_missing_names_reach_the_policy_and_the_record() {
    let dir = temp();
    let options = json!([
        {"optionId": "forever", "name": "Allow forever", "kind": "allow_forever"},
        {"optionId": 1, "kind": "allow_once"},
        {"optionId": 2, "name": "Reject", "kind": "reject_once"},
    ]);
    let out = raw_permission(dir.path(), "allow", &options);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    // The agent gets its own number back, not a string.
    assert_eq!(result["output"], "selected json:1");
    let decision = only_decision(&result);
    assert_eq!(
        decision["offered"],
        json!([
            {"optionId": "forever", "kind": "allow_forever"},
            {"optionId": "1", "kind": "allow_once"},
            {"optionId": "2", "kind": "reject_once"},
        ])
    );
    assert_eq!(decision["verdict"], "allow");
    assert_eq!(
        decision["outcome"],
        json!({"outcome": "selected", "optionId": "1", "kind": "allow_once"})
    );
}

#[test]
fn an_unknown_kind_is_offered_but_never_chosen() {
    let dir = temp();
    let options = json!([
        {"optionId": "forever", "name": "Allow forever", "kind": "allow_forever"},
        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
    ]);
    let out = raw_permission(dir.path(), "allow", &options);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["output"], "cancelled");
    let decision = only_decision(&result);
    assert_eq!(decision["verdict"], "allow");
    assert_eq!(decision["outcome"], json!({"outcome": "cancelled"}));
    assert_eq!(decision["offered"][0]["kind"], "allow_forever");
}

#[test]
fn one_id_under_two_kinds_is_answered_cancelled() {
    let dir = temp();
    let options = json!([
        {"optionId": "ok", "name": "Allow", "kind": "allow_once"},
        {"optionId": "ok", "name": "Reject", "kind": "reject_once"},
        {"optionId": "never", "name": "Never", "kind": "reject_always"},
    ]);
    for policy in ["reject", "allow"] {
        let out = raw_permission(dir.path(), policy, &options);
        assert_eq!(code(&out), 0, "{policy}: {}", stderr(&out));
        let result = result_record(&out);
        assert_eq!(result["output"], "cancelled", "{policy}");
        let decision = only_decision(&result);
        assert_eq!(decision["verdict"], policy);
        assert_eq!(decision["outcome"], json!({"outcome": "cancelled"}));
    }
}

#[test]
fn a_decision_is_shown_on_stderr_in_human_mode_and_streamed_under_json() {
    let dir = temp();
    let agent = mock(&["permission"]);
    let human = run_to_end(acp_tests::host_run(dir.path()).args(["--agent", &agent, "x"]));
    assert_eq!(code(&human), 0, "{}", stderr(&human));
    assert_eq!(
        stderr(&human),
        "acp-host: permission reject for Write notes.txt (edit): selected reject_once [by policy]\n"
    );
    let json = run_to_end(acp_tests::host_run(dir.path()).args(["--json", "--agent", &agent, "x"]));
    assert_eq!(code(&json), 0, "{}", stderr(&json));
    // Under --json stdout is the record: the decision is a `permission` event there, not a line
    // on stderr.
    assert_eq!(stderr(&json), "");
    let events: Vec<Value> = stdout(&json)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|event: &Value| event["type"] == "permission")
        .collect();
    assert_eq!(events.len(), 1, "{}", stdout(&json));
    assert_eq!(events[0]["outcome"]["optionId"], "reject_once");
}

#[test]
fn updates_for_another_session_are_ignored() {
    let dir = temp();
    let agent = mock(&["foreign-session"]);
    let human =
        run_to_end(acp_tests::host_run(dir.path()).args(["--verbose", "--agent", &agent, "x"]));
    assert_eq!(code(&human), 0, "{}", stderr(&human));
    assert_eq!(stdout(&human), "hello from acp child");
    // Logged, and the tool call of the other session is not shown.
    assert!(stderr(&human).contains("not ours"), "{}", stderr(&human));
    assert!(!stderr(&human).contains("Intrude"), "{}", stderr(&human));

    let json = run_to_end(acp_tests::host_run(dir.path()).args(["--json", "--agent", &agent, "x"]));
    assert_eq!(code(&json), 0, "{}", stderr(&json));
    let records = records(&json);
    let result = records.last().unwrap();
    assert_eq!(result["output"], "hello from acp child");
    let updates: Vec<&Value> = records.iter().filter(|r| r["type"] == "update").collect();
    assert_eq!(updates.len(), 1, "{}", stdout(&json));
    assert_eq!(
        updates[0]["update"]["content"]["text"],
        "hello from acp child"
    );
}

/// `acp-host run --json` with only `PATH` and `extra` in its environment, so what it withholds is
/// known exactly.
fn clean_env_run(dir: &Path, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = acp_tests::host_run(dir);
    cmd.env_clear()
        .envs(acp_tests::instrumentation_env())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(extra.iter().copied())
        .arg("--json")
        .args(args);
    run_to_end(&mut cmd)
}

#[test]
fn the_auth_hint_names_the_withheld_key_and_reads_cleanly() {
    let dir = temp();
    let agent = mock(&["auth-required", "--message", "No API key configured."]);
    let out = clean_env_run(
        dir.path(),
        &[
            ("GEMINI_API_KEY", "test-value-123"),
            ("PGPASSWORD", "pw-value-123"),
        ],
        &["--agent", &agent, "x"],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(
        result["error"],
        "agent answered session/new with error -32000: No API key configured; the agent needs \
         authentication: log in with the agent itself once, or forward its API key with --env \
         GEMINI_API_KEY (acp-host withheld it)"
    );
    assert_eq!(result["errorKind"], "handshake");
}

#[test]
fn initialize_names_the_client() {
    let dir = temp();
    let out = clean_env_run(
        dir.path(),
        &[],
        &["--agent", &mock(&["echo-initialize"]), "x"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let info: Value =
        serde_json::from_str(result_record(&out)["output"].as_str().unwrap()).unwrap();
    let version =
        run_to_end(std::process::Command::new(acp_tests::bin("acp-host")).arg("--version"));
    assert_eq!(info["name"], "acp-host");
    // `--version` says more after the version (the commit, the ACP protocol version).
    assert_eq!(
        stdout(&version).trim(),
        format!(
            "acp-host {}",
            acp_host::version_text(info["version"].as_str().unwrap())
        )
    );
}

#[test]
fn ask_without_a_terminal_says_so_once_then_rejects() {
    let dir = temp();
    let mut cmd = acp_tests::host_run(dir.path());
    cmd.args([
        "--json",
        "--permission",
        "ask",
        "--agent",
        &mock(&["permission"]),
        "x",
    ]);
    let out = super::run::run_without_tty(&mut cmd);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "acp-host: --permission ask: no terminal to ask on (/dev/tty cannot be opened); rejecting \
         the agent's permission requests\n"
    );
    let result = result_record(&out);
    assert_eq!(result["output"], "selected reject_once");
    assert_eq!(only_decision(&result)["decidedBy"], "policy");
}
