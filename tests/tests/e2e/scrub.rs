//! End-to-end: the credential rule and redaction through the real `acp-host` binary and the mock
//! agent. The agent reports what it sees (`echo-env`); the host's exit code, result record and
//! stderr are checked for what must and must not appear. Every value is fake.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output};

use acp_tests::{code, run_to_end, stderr, stdout};
use serde_json::Value;

use super::common::{mock, mock_path, result_record};

const GH_TOKEN: &str = "ghp_FAKE0123456789abcdefghijklmnopqrstuv";
const OPENAI_KEY: &str = "sk-proj-FAKE0123456789abcdefghij_klmnop";
const DB_PASS: &str = "correct-horse-battery-staple";
const SLACK_HOOK: &str = "https://hooks.slack.com/services/T00000000/B00000000/FAKEFAKEFAKEFAKE";

fn host(dir: &Path) -> Command {
    acp_tests::host_run(dir)
}

fn scrubbed(result: &Value) -> Vec<String> {
    result["scrubbedEnv"]
        .as_array()
        .expect("scrubbedEnv is a list")
        .iter()
        .map(|v| v.as_str().expect("a name").to_owned())
        .collect()
}

#[test]
fn harmless_names_reach_the_agent_and_new_credential_shapes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let names = [
        "KEYBOARD_LAYOUT",
        "TOKENIZERS_PARALLELISM",
        "PASSWORD_STORE_DIR",
        "BRANCH",
        "SMTP_PASS",
        "NOTIFY_URL",
        "AZURE_STORAGE",
    ];
    let mut args = vec!["echo-env"];
    args.extend(names);
    let out = run_to_end(
        host(dir.path())
            .env("KEYBOARD_LAYOUT", "us")
            .env("TOKENIZERS_PARALLELISM", "false")
            .env("PASSWORD_STORE_DIR", "/home/alice/.password-store")
            .env("BRANCH", "sk-1234-add-login-page")
            .env("SMTP_PASS", "hunter2-fake")
            .env("NOTIFY_URL", SLACK_HOOK)
            .env(
                "AZURE_STORAGE",
                "AccountName=acct;AccountKey=FAKEkey0123==;EndpointSuffix=core.windows.net",
            )
            .args(["--json", "--agent", &mock(&args), "x"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(
        result["output"],
        "KEYBOARD_LAYOUT=us\nTOKENIZERS_PARALLELISM=false\n\
         PASSWORD_STORE_DIR=/home/alice/.password-store\nBRANCH=sk-1234-add-login-page\n\
         SMTP_PASS unset\nNOTIFY_URL unset\nAZURE_STORAGE unset"
    );
    let scrubbed = scrubbed(&result);
    for name in ["SMTP_PASS", "NOTIFY_URL", "AZURE_STORAGE"] {
        assert!(scrubbed.iter().any(|n| n == name), "{name}: {scrubbed:?}");
    }
    for name in ["KEYBOARD_LAYOUT", "TOKENIZERS_PARALLELISM", "BRANCH"] {
        assert!(!scrubbed.iter().any(|n| n == name), "{name}: {scrubbed:?}");
    }
    assert!(!stdout(&out).contains("FAKEFAKE"), "a value leaked");
}

#[test]
fn a_non_utf8_environment_neither_panics_nor_prints_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let os = |bytes: &[u8]| OsStr::from_bytes(bytes).to_owned();
    let out = run_to_end(
        host(dir.path())
            .env(os(b"ODD\xffNAME"), os(b"plain"))
            .env("LATIN1_GREETING", os(b"gr\xfc\xdf dich"))
            .env("LATIN1_TOKEN", os(b"\xfcber-geheim-0123"))
            .env("ODD_URL", os(b"https://u:p\xffFAKEpw@example.com/"))
            .args([
                "--json",
                "--verbose",
                "--agent",
                &mock(&["echo-env", "LATIN1_GREETING", "LATIN1_TOKEN", "ODD_URL"]),
                "x",
            ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    // The harmless value arrives (the mock prints it lossily); the credential-shaped ones do not.
    assert_eq!(
        result["output"],
        "LATIN1_GREETING=gr\u{fffd}\u{fffd} dich\nLATIN1_TOKEN unset\nODD_URL unset"
    );
    let scrubbed = scrubbed(&result);
    for name in ["LATIN1_TOKEN", "ODD_URL", "ODD\u{fffd}NAME"] {
        assert!(scrubbed.iter().any(|n| n == name), "{name}: {scrubbed:?}");
    }
    let all = format!("{}{}", stdout(&out), stderr(&out));
    for value in ["ber-geheim", "FAKEpw", "plain"] {
        assert!(!all.contains(value), "{value} was printed: {all}");
    }
    assert!(
        stderr(&out).contains("withheld from the agent:"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_malformed_env_argument_does_not_echo_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(host(dir.path()).args([
        "--env",
        &format!("={GH_TOKEN}"),
        "--agent",
        &mock(&["hello"]),
        "x",
    ]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: invalid --env with an empty NAME: expected NAME or NAME=VALUE with a \
         non-empty NAME and no NUL byte (the value is not shown)\n"
    );
    assert_eq!(stdout(&out), "");
}

/// The agent prints credentials it was given (forwarded, read from its environment) or could have
/// found elsewhere (withheld) to its stderr, returns one as its stop reason, and the run fails:
/// none of them is repeated. The agent is a script, so no value is on the host's command line.
fn leaky_run(dir: &Path, flags: &[&str]) -> Output {
    let script = dir.join("leaky-agent");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec '{}' text --text hi --stop \"$GH_TOKEN\" \\\n  \
             --stderr \"leaking $GH_TOKEN and {OPENAI_KEY} and $DB_PASS and {SLACK_HOOK}\"\n",
            mock_path()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = host(dir);
    cmd.env("GH_TOKEN", GH_TOKEN)
        .env("OPENAI_API_KEY", OPENAI_KEY)
        .env("NOTIFY_URL", SLACK_HOOK)
        .args(["--env", "GH_TOKEN", "--env", &format!("DB_PASS={DB_PASS}")]);
    run_to_end(
        cmd.args(flags)
            .args(["--agent", script.to_str().unwrap(), "x"]),
    )
}

#[test]
fn credential_values_are_redacted_in_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let out = leaky_run(dir.path(), &["--json"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(
        result["error"],
        "agent returned an unknown stop reason: \"[redacted GH_TOKEN]\""
    );
    assert_eq!(result["stopReason"], "[redacted GH_TOKEN]");
    assert_eq!(
        result["stderrTail"],
        "leaking [redacted GH_TOKEN] and [redacted OPENAI_API_KEY] and [redacted DB_PASS] and \
         [redacted NOTIFY_URL]\n"
    );
    for value in [GH_TOKEN, OPENAI_KEY, DB_PASS, SLACK_HOOK] {
        assert!(
            !stdout(&out).contains(value),
            "{value} leaked: {}",
            stdout(&out)
        );
    }
}

#[test]
fn credential_values_are_redacted_in_human_mode() {
    let dir = tempfile::tempdir().unwrap();
    let out = leaky_run(dir.path(), &[]);
    assert_eq!(code(&out), 1);
    assert_eq!(stdout(&out), "hi");
    assert_eq!(
        stderr(&out),
        "acp-host: error: agent returned an unknown stop reason: \"[redacted GH_TOKEN]\"\n\
         acp-host: agent stderr (last lines):\n  \
         leaking [redacted GH_TOKEN] and [redacted OPENAI_API_KEY] and [redacted DB_PASS] and \
         [redacted NOTIFY_URL]\n"
    );
}

#[test]
fn the_live_stderr_of_verbose_mode_is_redacted_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = leaky_run(dir.path(), &["--verbose"]);
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(
        err.lines().any(|line| line.ends_with(
            "leaking [redacted GH_TOKEN] and [redacted OPENAI_API_KEY] and [redacted DB_PASS] \
             and [redacted NOTIFY_URL]"
        )),
        "{err}"
    );
    for value in [GH_TOKEN, OPENAI_KEY, DB_PASS, SLACK_HOOK] {
        assert!(!err.contains(value), "{value} leaked: {err}");
    }
}
