//! End-to-end: the errors a new user meets first, through the real binary. Each says what went
//! wrong in its first words and names the fix; one kind of failure has one exit code in `run` and
//! in a batch line.

use std::process::Command;

use acp_tests::{bin, code, run_to_end, stderr};

use super::batch::batch;
use super::common::{result_record, temp};
use super::run::host;

/// A loopback port nothing listens on: bound, then let go.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_refused_connection_to_a_remote_agent_says_so_and_asks_for_serve() {
    let dir = temp();
    let port = closed_port();
    for scheme in ["ws", "http"] {
        let url = format!("{scheme}://127.0.0.1:{port}/acp");
        let out = run_to_end(host(dir.path()).args(["--json", "--agent", &url, "hi"]));
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        let expected = format!(
            "connection refused to 127.0.0.1:{port}: is acp-host serve running there? (start it \
             there with `acp-host serve --listen 127.0.0.1:{port}`, or fix --agent's URL)"
        );
        let result = result_record(&out);
        assert_eq!(result["error"], expected.as_str(), "{result}");
        assert_eq!(result["errorKind"], "handshake", "{result}");
        // A person reads it first on stderr.
        let out = run_to_end(host(dir.path()).args(["--agent", &url, "hi"]));
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!("acp-host: error: {expected}\n")),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_misspelled_subcommand_gets_a_suggestion() {
    for (typo, meant) in [("rn", "run"), ("btach", "batch"), ("agnets", "agents")] {
        let out = run_to_end(Command::new(bin("acp-host")).arg(typo));
        assert_eq!(code(&out), 2);
        let err = stderr(&out);
        assert!(
            err.starts_with(&format!("error: unrecognized subcommand '{typo}'\n")),
            "{err}"
        );
        assert!(
            err.contains(&format!("tip: a similar subcommand exists: '{meant}'")),
            "{err}"
        );
    }
    // Nothing close: no tip.
    let out = run_to_end(Command::new(bin("acp-host")).arg("zzzzzz"));
    assert_eq!(code(&out), 2);
    assert!(!stderr(&out).contains("tip:"), "{}", stderr(&out));
}

/// `--agent cladue`: the same message and exit code (2, nothing spawned) in `run` and in a batch
/// line, naming the close registry name and `acp-host agents`.
#[test]
fn a_misspelled_agent_is_one_usage_error_in_run_and_in_a_batch_line() {
    let dir = temp();
    let message = "agent cladue not found: cladue is neither a known agent nor a program on PATH; \
                   did you mean claude? `acp-host agents` lists the known agents (install one, \
                   or pass a command on PATH or its full path)";
    let out = run_to_end(host(dir.path()).args(["--json", "--agent", "cladue", "hi"]));
    assert_eq!(code(&out), 2);
    assert!(out.stdout.is_empty());
    assert_eq!(stderr(&out), format!("acp-host: error: {message}\n"));

    std::fs::write(
        dir.path().join("jobs.ndjson"),
        "{\"prompt\": \"hi\", \"agent\": \"cladue\"}\n",
    )
    .unwrap();
    let out = run_to_end(batch(dir.path()).arg("jobs.ndjson"));
    assert_eq!(code(&out), 2);
    assert!(out.stdout.is_empty());
    assert_eq!(
        stderr(&out),
        format!("acp-host: error: jobs.ndjson: line 1, field `agent`: {message}\n")
    );
    let out = run_to_end(batch(dir.path()).args(["--agent", "cladue", "jobs.ndjson"]));
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).starts_with("acp-host: error: agent cladue not found: "));
}

#[test]
fn batch_flags_refused_in_plain_words_with_the_fix() {
    let dir = temp();
    std::fs::write(dir.path().join("jobs.ndjson"), "{\"prompt\": \"hi\"}\n").unwrap();
    let out = run_to_end(batch(dir.path()).args(["--jobs", "0", "jobs.ndjson"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: --jobs 0: no agent could ever run; pass --jobs 1 or more, or leave it \
         out (the number of CPUs)\n"
    );
    let out = run_to_end(batch(dir.path()).args(["--skip-done", "nosuch.ndjson", "jobs.ndjson"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: --skip-done nosuch.ndjson: no such file; create it with `touch \
         nosuch.ndjson` before the first run (an empty file skips nothing)\n"
    );
    assert!(!dir.path().join("nosuch.ndjson").exists());
}

/// A line that is not JSON is named once, with the column in that line.
#[test]
fn a_bad_json_line_names_its_line_once() {
    let dir = temp();
    std::fs::write(
        dir.path().join("bad.ndjson"),
        "{\"prompt\": \"a\"}\n{\"prompt\" \"b\"}\n",
    )
    .unwrap();
    let out = run_to_end(batch(dir.path()).arg("bad.ndjson"));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: bad.ndjson: line 2: not valid JSON at column 11: expected `:`; each \
         line is one JSON object, {\"prompt\": \"...\"}\n"
    );
}

/// The failure rows of the serve, agents and trust tables are what the binary exits with.
#[test]
fn serve_agents_and_trust_exit_as_their_tables_say() {
    use protocol::exit_table::Documented;
    let dir = temp();
    let code_of = |command: Documented, name: &str| {
        command
            .exit_rows()
            .iter()
            .find(|row| row.name == name)
            .map(|row| i32::from(row.code))
            .unwrap()
    };
    let host = |args: &[&str]| {
        let mut cmd = Command::new(bin("acp-host"));
        cmd.current_dir(dir.path())
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_STATE_HOME", dir.path().join("state"))
            .args(args);
        run_to_end(&mut cmd)
    };
    // A taken address: serve cannot listen.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = host(&["serve", "--insecure-no-auth", "--listen", &address]);
    assert_eq!(
        code(&out),
        code_of(Documented::Serve, "failed"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).starts_with(&format!("acp-host: error: cannot listen on {address}")));
    let out = host(&["serve", "--agent", "cladue", "--insecure-no-auth"]);
    assert_eq!(
        code(&out),
        code_of(Documented::Serve, "usage"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).starts_with("acp-host: error: agent cladue not found: "));
    // A registry that cannot be read.
    let out = host(&["agents", "--registry", "nowhere.json"]);
    assert_eq!(
        code(&out),
        code_of(Documented::Agents, "failed"),
        "{}",
        stderr(&out)
    );
    let out = host(&["agents", "--nope"]);
    assert_eq!(code(&out), code_of(Documented::Agents, "usage"));
    // A path that is neither a folder nor a definition.
    let out = host(&["trust", "nowhere"]);
    assert_eq!(
        code(&out),
        code_of(Documented::Trust, "usage"),
        "{}",
        stderr(&out)
    );
    let out = host(&["trust"]);
    assert_eq!(
        code(&out),
        code_of(Documented::Trust, "done"),
        "{}",
        stderr(&out)
    );
}
