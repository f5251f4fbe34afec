//! End-to-end: `acp-host batch` running the scripted mock agent, many at once, through the real
//! binaries: the concurrency limit (checked by the agents' own start/end records), records in
//! completion order with their ids, lines refused before anything is spawned, exit codes, Ctrl-C
//! with no process left, and progress on a terminal and off one.

use std::path::Path;
use std::process::{Command, Stdio};

use acp_tests::{
    HANG_GUARD, bin, code, processes_in, run_to_end, stderr, stdout, wait_output, wait_until,
};
use nix::sys::signal::Signal;
use protocol::{env_vars, schema};
use serde_json::Value;

use super::common::{mock, records, temp};

/// `acp-host batch` in `dir`, without `ACP_HOST_LOG` and an inherited delegation depth.
fn batch(dir: &Path) -> Command {
    let mut cmd = Command::new(bin("acp-host"));
    cmd.current_dir(dir)
        .env_remove("ACP_HOST_LOG")
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH)
        .arg("batch");
    cmd
}

/// Writes `lines` as `jobs.ndjson` in `dir`.
fn jobs_file(dir: &Path, lines: &[String]) {
    std::fs::write(dir.join("jobs.ndjson"), lines.join("\n") + "\n").unwrap();
}

fn line(id: &str, prompt: &str) -> String {
    serde_json::json!({"id": id, "prompt": prompt}).to_string()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// Every record checked against the schema of `acp-host batch`'s output.
fn checked(records: &[Value]) {
    let schema = schema::output("batch-result.json").unwrap();
    for record in records {
        schema::check_keys(&schema, record).unwrap_or_else(|e| panic!("{e}: {record}"));
    }
}

/// The most agents alive at once according to their `--record` file, and how many ran.
fn most_at_once(record: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(record).expect("the agents recorded their lives");
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let delta = match fields[0] {
                "start" => 1,
                "end" => -1,
                other => panic!("unknown record {other:?}"),
            };
            (fields[2].parse().unwrap(), delta)
        })
        .collect();
    // At the same instant an end frees its slot before a start takes one.
    events.sort_unstable();
    let (mut now, mut most) = (0, 0);
    for (_, delta) in &events {
        now += delta;
        most = most.max(now);
    }
    assert_eq!(now, 0, "every agent that started ended: {text}");
    let started = events.iter().filter(|(_, delta)| *delta == 1).count();
    (usize::try_from(most).unwrap(), started)
}

fn assert_no_process_left(dir: &Path) {
    assert!(
        wait_until(HANG_GUARD, || processes_in(dir).is_empty()),
        "processes left in {}: {:?}",
        dir.display(),
        processes_in(dir)
    );
}

#[test]
fn no_more_agents_than_jobs_run_at_once_and_every_line_gets_its_record() {
    let dir = temp();
    let record = dir.path().join("record");
    let ids: Vec<String> = (1..=9).map(|i| format!("r{i}")).collect();
    let lines: Vec<String> = ids.iter().map(|id| line(id, "go")).collect();
    jobs_file(dir.path(), &lines);
    // Each run streams for about 200 ms, so runs overlap whenever the limit allows it.
    let agent = mock(&[
        "slow-stream",
        "--chunks",
        "5",
        "--interval-ms",
        "50",
        "--record",
        path_str(&record),
    ]);
    let out = run_to_end(batch(dir.path()).args(["--jobs", "3", "--agent", &agent, "jobs.ndjson"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let mut seen: Vec<String> = records
        .iter()
        .map(|record| {
            assert_eq!(record["type"], "result", "{record}");
            assert_eq!(record["status"], "completed", "{record}");
            assert_eq!(record["output"], "c1 c2 c3 c4 c5 ", "{record}");
            record["id"].as_str().unwrap().to_owned()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, ids);
    let (most, started) = most_at_once(&record);
    assert_eq!(started, 9);
    assert!(most <= 3, "{most} agents ran at once with --jobs 3");
    assert!(most >= 2, "the runs never overlapped: {most}");
    assert_no_process_left(dir.path());
}

#[test]
fn records_come_in_completion_order_and_ids_default_to_line_numbers() {
    let dir = temp();
    let slow = mock(&["slow-stream", "--chunks", "4", "--interval-ms", "100"]);
    let lines = [
        serde_json::json!({"prompt": "slow", "agent": slow}).to_string(),
        String::new(),
        serde_json::json!({"prompt": "fast", "id": 7}).to_string(),
    ];
    jobs_file(dir.path(), &lines);
    let child = batch(dir.path())
        .args(["--jobs", "2", "--agent", &mock(&["hello"]), "-"])
        .stdin(std::fs::File::open(dir.path().join("jobs.ndjson")).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let order: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["output"].as_str().unwrap()))
        .collect();
    // The second line is blank: the third keeps its own number as a line, and its own id.
    assert_eq!(
        order,
        [("7", "hello from acp child"), ("1", "c1 c2 c3 c4 ")]
    );
}

#[test]
fn a_bad_line_is_refused_before_anything_is_spawned() {
    let dir = temp();
    let log = dir.path().join("log");
    let agent = mock(&["hello", "--log", path_str(&log)]);
    for (bad, error) in [
        (
            r#"{"prompt":"x","model":"m"}"#.to_owned(),
            "line 2, field `model`: unknown field; a line has id, prompt, agent, subagent, \
             cwd, timeout, env, outputSchema",
        ),
        (
            r#"{"prompt":"x","outputSchema":{"type":7}}"#.to_owned(),
            "line 2, field `outputSchema`: ",
        ),
        (
            r#"{"id":"b"}"#.to_owned(),
            "line 2, field `prompt`: missing (it is required)",
        ),
        (
            r#"{"prompt":"x","timeout":"soon"}"#.to_owned(),
            "line 2, field `timeout`: expected a number of seconds, got a string",
        ),
        (
            r#"{"prompt":"x","agent":"no-such-agent-program"}"#.to_owned(),
            "line 2, field `agent`: no-such-agent-program is not found (not on PATH, not a file)",
        ),
        (
            r#"{"prompt":"x","cwd":"missing"}"#.to_owned(),
            "line 2, field `cwd`: working directory is not an accessible directory: ",
        ),
        (
            r#"{"prompt":"x","id":"1"}"#.to_owned(),
            "line 2, field `id`: \"1\" is already the id of line 1; ids must be unique",
        ),
    ] {
        jobs_file(dir.path(), &[line("1", "fine"), bad, line("3", "fine")]);
        let out = run_to_end(batch(dir.path()).args(["--agent", &agent, "jobs.ndjson"]));
        assert_eq!(code(&out), 2, "{error}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{error}");
        let expected = format!("acp-host: error: jobs.ndjson: {error}");
        assert!(stderr(&out).starts_with(&expected), "{}", stderr(&out));
        assert!(!log.exists(), "an agent was spawned for {error}");
    }
}

#[test]
fn a_line_with_an_output_schema_gets_its_checked_value_or_schema_mismatch() {
    let dir = temp();
    let answers = serde_json::to_string(&["```json\n{\"n\": 1}\n```"]).unwrap();
    let agent = mock(&["answers", "--answers-json", &answers]);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"]
    });
    let strict = serde_json::json!({"type": "object", "required": ["missing"]});
    jobs_file(
        dir.path(),
        &[
            serde_json::json!({"id": "fits", "prompt": "count", "outputSchema": schema})
                .to_string(),
            serde_json::json!({"id": "misfits", "prompt": "count", "outputSchema": strict})
                .to_string(),
        ],
    );
    let out = run_to_end(batch(dir.path()).args(["--agent", &agent, "jobs.ndjson"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let by_id = |id: &str| records.iter().find(|r| r["id"] == id).unwrap().clone();
    let fits = by_id("fits");
    assert_eq!(fits["status"], "completed");
    assert_eq!(fits["structured"], serde_json::json!({"n": 1}));
    assert_eq!(fits["structuredVia"], "text");
    let misfits = by_id("misfits");
    assert_eq!(misfits["status"], "schema-mismatch", "{misfits}");
    assert!(
        misfits["error"].as_str().unwrap().contains("missing"),
        "{misfits}"
    );
    assert_no_process_left(dir.path());
}

#[test]
fn one_run_that_does_not_complete_makes_the_exit_code_1() {
    let dir = temp();
    let crash = mock(&["crash-on-prompt"]);
    jobs_file(
        dir.path(),
        &[
            line("ok", "x"),
            serde_json::json!({"id": "bad", "prompt": "x", "agent": crash}).to_string(),
        ],
    );
    let out = run_to_end(batch(dir.path()).args(["--agent", &mock(&["hello"]), "jobs.ndjson"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let by_id = |id: &str| records.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(by_id("ok")["status"], "completed");
    let bad = by_id("bad");
    assert_eq!(bad["status"], "error");
    assert_eq!(bad["errorKind"], "crash");
    assert_eq!(bad["output"], "partial output");
    assert!(
        stderr(&out).contains("acp-host: batch: 1 completed, 1 failed (0 not started) of 2 in "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn ctrl_c_cancels_the_running_agents_and_reports_the_rest_not_started() {
    let dir = temp();
    let record = dir.path().join("record");
    let ids = ["a", "b", "c", "d", "e"];
    let lines: Vec<String> = ids.iter().map(|id| line(id, "wait")).collect();
    jobs_file(dir.path(), &lines);
    let agent = mock(&["hang", "--record", path_str(&record)]);
    let child = batch(dir.path())
        .args(["--jobs", "2", "--agent", &agent, "jobs.ndjson"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = || {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("start"))
            .count()
    };
    assert!(
        wait_until(HANG_GUARD, || started() == 2),
        "two agents start"
    );
    crate::run::signal(&child, Signal::SIGINT);
    let out = wait_output(child);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    assert_eq!(records.len(), 5, "{records:#?}");
    let (ran, rest) = records.split_at(2);
    for record in ran {
        assert_eq!(record["type"], "result", "{record}");
        assert_eq!(record["status"], "aborted", "{record}");
    }
    let mut not_started: Vec<&str> = rest
        .iter()
        .map(|record| {
            assert_eq!(record["type"], "not-started", "{record}");
            assert_eq!(record["status"], "not-started", "{record}");
            record["id"].as_str().unwrap()
        })
        .collect();
    not_started.sort_unstable();
    assert_eq!(not_started, ["c", "d", "e"]);
    assert_eq!(started(), 2, "nothing started after Ctrl-C");
    assert!(
        stderr(&out).contains("0 completed, 5 failed (3 not started) of 5"),
        "{}",
        stderr(&out)
    );
    assert_no_process_left(dir.path());
}

#[test]
fn progress_is_plain_lines_off_a_terminal() {
    let dir = temp();
    jobs_file(dir.path(), &[line("a", "x"), line("b", "x")]);
    let out = run_to_end(batch(dir.path()).args([
        "--jobs",
        "1",
        "--agent",
        &mock(&["hello"]),
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    assert_eq!(lines[0], "acp-host: batch: 2 runs, at most 1 at once");
    assert!(
        lines[1].starts_with("acp-host: [1/2] a: completed (0 running, 0 failed, "),
        "{err}"
    );
    assert!(
        lines[2].starts_with("acp-host: [2/2] b: completed (0 running, 0 failed, "),
        "{err}"
    );
    assert!(
        lines[3].starts_with("acp-host: batch: 2 completed, 0 failed (0 not started) of 2 in "),
        "{err}"
    );
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "{err:?}");
}

#[test]
fn progress_is_a_live_bar_on_a_terminal() {
    let dir = temp();
    jobs_file(
        dir.path(),
        &[line("a", "x"), line("b", "x"), line("c", "x")],
    );
    // `script` gives acp-host a pseudo-terminal for stderr; stdout still goes to a file.
    let command = format!(
        "{} > out.ndjson",
        shell_words::join([
            bin("acp-host").display().to_string(),
            "batch".into(),
            "--jobs".into(),
            "2".into(),
            "--agent".into(),
            mock(&["hello"]),
            "jobs.ndjson".into(),
        ])
    );
    let child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path())
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux is installed");
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let terminal = String::from_utf8_lossy(&out.stdout).into_owned();
    // Redrawn in place (carriage return, erase line), ending full.
    assert!(terminal.contains("\r\u{1b}[2K"), "{terminal:?}");
    assert!(
        terminal.contains("3/3 done, 0 running, 0 failed"),
        "{terminal:?}"
    );
    assert!(!terminal.contains("acp-host: [1/3]"), "{terminal:?}");
    let written = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    assert_eq!(written.lines().count(), 3, "{written}");
}

#[test]
fn ctrl_c_ends_the_batch_even_when_nobody_reads_its_stdout() {
    let dir = temp();
    let record = dir.path().join("record");
    let lines: Vec<String> = (1..=40).map(|i| line(&i.to_string(), "big")).collect();
    jobs_file(dir.path(), &lines);
    // Each record carries 100 KB of output: the pipe fills at the first, the queue soon after.
    let agent = mock(&["huge", "--bytes", "100000", "--record", path_str(&record)]);
    let mut child = batch(dir.path())
        .args(["--jobs", "2", "--agent", &agent, "jobs.ndjson"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ended = || {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("end"))
            .count()
    };
    // As many runs ended as the writer and its queue (16) hold: the batch is stalled, or about
    // to be, on its stdout.
    assert!(
        wait_until(HANG_GUARD, || ended() >= 17),
        "runs ended: {}",
        ended()
    );
    crate::run::signal(&child, Signal::SIGINT);
    let mut status = None;
    assert!(
        wait_until(HANG_GUARD, || {
            status = child.try_wait().unwrap();
            status.is_some()
        }),
        "acp-host batch did not end with its stdout unread"
    );
    assert_eq!(status.unwrap().code(), Some(130));
    drop(child.stdout.take());
    assert_no_process_left(dir.path());
}
