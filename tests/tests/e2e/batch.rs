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
pub(super) fn batch(dir: &Path) -> Command {
    let mut cmd = Command::new(bin("acp-host"));
    cmd.current_dir(dir)
        .env_remove("ACP_HOST_LOG")
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH)
        .arg("batch");
    cmd
}

/// Writes `lines` as `jobs.ndjson` in `dir`.
pub(super) fn jobs_file(dir: &Path, lines: &[String]) {
    std::fs::write(dir.join("jobs.ndjson"), lines.join("\n") + "\n").unwrap();
}

fn line(id: &str, prompt: &str) -> String {
    serde_json::json!({"id": id, "prompt": prompt}).to_string()
}

pub(super) fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// Every record checked against the schema of `acp-host batch`'s output.
pub(super) fn checked(records: &[Value]) {
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

pub(super) fn assert_no_process_left(dir: &Path) {
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
            "line 2, field `agent`: agent no-such-agent-program not found: no-such-agent-program is \
             neither a known agent nor a program on PATH",
        ),
        (
            r#"{"prompt":"x","cwd":"missing"}"#.to_owned(),
            "line 2, field `cwd`: working directory is not an accessible directory: ",
        ),
        (
            r#"{"prompt":"x","id":"1"}"#.to_owned(),
            "line 2, field `id`: \"1\" is already the id of line 1; ids must be unique",
        ),
        (
            r#"{"prompt":"x","agent":"a","prompt":"y"}"#.to_owned(),
            "line 2, field `prompt`: given twice; a line has each field once",
        ),
        (
            r#"{"prompt":"x","outputSchema":{"type":"object","required":[],"required":["n"]}}"#
                .to_owned(),
            "line 2, field `outputSchema`: key \"required\" is given twice",
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
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "{err:?}");
    insta::assert_snapshot!(acp_tests::redact_seconds(&err));
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
    // Records were lost to the reader that never read: the exit code says so.
    assert_eq!(status.unwrap().code(), Some(141));
    drop(child.stdout.take());
    assert_no_process_left(dir.path());
}

#[test]
fn jobs_above_the_cap_are_refused_with_nothing_run() {
    let dir = temp();
    let log = dir.path().join("log");
    jobs_file(dir.path(), &[line("a", "x")]);
    let agent = mock(&["hello", "--log", path_str(&log)]);
    for jobs in ["100000", "257"] {
        let out =
            run_to_end(batch(dir.path()).args(["--jobs", jobs, "--agent", &agent, "jobs.ndjson"]));
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert_eq!(stdout(&out), "");
        assert!(
            stderr(&out).starts_with(&format!("acp-host: error: --jobs {jobs}: at most ")),
            "{}",
            stderr(&out)
        );
        assert!(
            stderr(&out).ends_with("; lower --jobs\n"),
            "{}",
            stderr(&out)
        );
        assert!(!log.exists(), "an agent was spawned for --jobs {jobs}");
    }
    // Under a low open-file limit the cap is what fits, and the error says how to raise it.
    let mut limited = Command::new("sh");
    limited
        .current_dir(dir.path())
        .env_remove(env_vars::ACP_HOST_DEPTH)
        .env_remove(env_vars::ACP_HOST_MAX_DEPTH)
        .args([
            "-c",
            "ulimit -n 64 && exec \"$0\" batch --jobs 5 --agent \"$1\" jobs.ndjson",
            bin("acp-host").to_str().unwrap(),
            &agent,
        ]);
    let out = run_to_end(&mut limited);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "acp-host: error: --jobs 5: at most 4 (this process may open 64 files and each running \
         agent takes 8; raise the limit (`ulimit -n`)); lower --jobs\n"
    );
    assert!(!log.exists());
}

/// A tiny seeded generator: the same points every run, spread over the batch.
struct Seeded(u64);

impl Seeded {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn a_signal_at_any_point_of_a_1000_line_batch_leaves_exactly_1000_records() {
    let dir = temp();
    let ids: Vec<String> = (1..=1000).map(|i| format!("r{i}")).collect();
    let lines: Vec<String> = ids.iter().map(|id| line(id, "go")).collect();
    jobs_file(dir.path(), &lines);
    let agent = mock(&["hello"]);
    let mut seeded = Seeded(0x5eed);
    for round in 0..5 {
        // A point of the batch: right after it started, or after this many runs ended.
        let after = seeded.below(400);
        let signal = if round == 4 {
            Signal::SIGTERM
        } else {
            Signal::SIGINT
        };
        let out_path = dir.path().join(format!("out-{round}.ndjson"));
        let mut child = batch(dir.path())
            .args(["--jobs", "8", "--agent", &agent, "jobs.ndjson"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let progress = acp_tests::line_channel(child.stderr.take().unwrap());
        let marker = if after == 0 {
            "acp-host: batch: 1000 runs, at most 8 at once".to_owned()
        } else {
            format!("acp-host: [{after}/1000] ")
        };
        let deadline = std::time::Instant::now() + HANG_GUARD;
        let mut reached = false;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match progress.recv_timeout(left) {
                Ok(text) if text.starts_with(&marker) => {
                    reached = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        assert!(reached, "round {round}: the batch never reached {marker:?}");
        crate::run::signal(&child, signal);
        let mut status = None;
        assert!(
            wait_until(HANG_GUARD, || {
                status = child.try_wait().unwrap();
                status.is_some()
            }),
            "round {round}: acp-host batch did not end"
        );
        let text = std::fs::read_to_string(&out_path).unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        checked(&records);
        let mut seen: Vec<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
        seen.sort_unstable();
        let mut expected: Vec<&str> = ids.iter().map(String::as_str).collect();
        expected.sort_unstable();
        assert_eq!(
            seen.len(),
            1000,
            "round {round} (signal after {after} runs): {} records",
            seen.len()
        );
        assert_eq!(seen, expected, "round {round}: every line has one record");
        let completed = records
            .iter()
            .filter(|r| r["status"] == "completed")
            .count();
        let code = status.unwrap().code();
        assert!(
            code == Some(130) || (code == Some(0) && completed == 1000),
            "round {round}: exit {code:?} with {completed} completed"
        );
        assert_no_process_left(dir.path());
    }
}

#[test]
fn a_closed_stdout_stops_the_batch_and_its_exit_code_says_records_were_lost() {
    use std::io::BufRead as _;
    let dir = temp();
    let record = dir.path().join("record");
    let lines: Vec<String> = (1..=200).map(|i| line(&i.to_string(), "x")).collect();
    jobs_file(dir.path(), &lines);
    let agent = mock(&["hello", "--record", path_str(&record)]);
    let mut child = batch(dir.path())
        .args(["--jobs", "1", "--agent", &agent, "jobs.ndjson"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader takes one record, then goes away (`| head -1`).
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["status"], "completed", "{first}");
    let out = wait_output(child);
    assert_eq!(code(&out), 141, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("acp-host: batch: stdout was closed; starting no more runs\n"),
        "{err}"
    );
    assert!(
        err.contains(" records were not written: stdout was closed\n"),
        "{err}"
    );
    let started = std::fs::read_to_string(&record)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("start"))
        .count();
    assert!(
        started < 200,
        "every line ran though nobody read: {started}"
    );
    assert_no_process_left(dir.path());
}

#[test]
fn a_closed_stderr_loses_the_progress_lines_not_the_records() {
    let dir = temp();
    jobs_file(
        dir.path(),
        &[line("a", "x"), line("b", "x"), line("c", "x")],
    );
    let mut child = batch(dir.path())
        .args(["--jobs", "2", "--agent", &mock(&["hello"]), "jobs.ndjson"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let out = wait_output(child);
    assert_eq!(code(&out), 0);
    let records = records(&out);
    checked(&records);
    assert_eq!(records.len(), 3, "{records:#?}");
    assert_no_process_left(dir.path());
}

#[test]
fn a_line_checking_adversarial_answers_does_not_hold_up_its_siblings() {
    let dir = temp();
    // 127 arrays that never close, then `1,` to 8 MiB: slow to read for a quadratic extraction.
    let answer = format!(
        "{}{}",
        "[".repeat(127),
        "1,".repeat((8 * 1024 * 1024 - 1024 - 127) / 2)
    );
    let answers = dir.path().join("answers.json");
    std::fs::write(&answers, serde_json::to_string(&[answer]).unwrap()).unwrap();
    let adversarial = mock(&["answers", "--answers-file", path_str(&answers)]);
    let slow = mock(&["slow-stream", "--chunks", "10", "--interval-ms", "100"]);
    jobs_file(
        dir.path(),
        &[
            serde_json::json!({"id": "attack", "prompt": "count", "agent": adversarial,
                               "outputSchema": {"type": "object"}})
            .to_string(),
            serde_json::json!({"id": "sibling", "prompt": "go", "agent": slow, "timeout": 10})
                .to_string(),
        ],
    );
    let out = run_to_end(batch(dir.path()).args(["--jobs", "2", "jobs.ndjson"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let by_id = |id: &str| records.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(by_id("attack")["status"], "schema-mismatch");
    let sibling = by_id("sibling");
    assert_eq!(sibling["status"], "completed", "{sibling}");
    assert_no_process_left(dir.path());
}

#[test]
fn max_output_bounds_each_record_and_the_answers_its_lines_read() {
    let dir = temp();
    let pad = "x".repeat(9 * 1024 * 1024);
    let answer = serde_json::json!({"n": 1, "pad": pad}).to_string();
    let answers = dir.path().join("answers.json");
    std::fs::write(&answers, serde_json::to_string(&[&answer]).unwrap()).unwrap();
    let agent = mock(&["answers", "--answers-file", path_str(&answers)]);
    jobs_file(
        dir.path(),
        &[
            serde_json::json!({"id": "big", "prompt": "count", "outputSchema": {"type": "object"}})
                .to_string(),
        ],
    );
    let out = run_to_end(batch(dir.path()).args([
        "--agent",
        &agent,
        "--max-output",
        "20000000",
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let [record] = &records(&out)[..] else {
        panic!("one record: {}", stdout(&out));
    };
    assert_eq!(record["structured"]["n"], 1);
    assert_eq!(record["output"].as_str().unwrap().len(), answer.len());

    let out = run_to_end(batch(dir.path()).args(["--agent", &agent, "jobs.ndjson"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let [record] = &records(&out)[..] else {
        panic!("one record: {}", stdout(&out));
    };
    assert_eq!(record["status"], "schema-mismatch");
    // The record kept the end of the text of all three answers (the first and two follow-ups).
    assert_eq!(
        record["outputTruncatedBytes"],
        3 * answer.len() - 8 * 1024 * 1024
    );
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("over the 8388608-byte limit on a structured answer's text"),
        "{}",
        record["error"]
    );
}

#[test]
fn lines_asking_for_the_same_run_still_get_their_own_prompt_agent_cwd_and_env() {
    // A batch prepares a run once for the lines that ask for the same one (their prompt and id
    // aside): every line in between that asks for another must be run as it asks.
    let dir = temp();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let echo_env = mock(&["echo-env", "BATCH_TEST_TOKEN"]);
    let lines = [
        serde_json::json!({"id": "a", "prompt": "one"}).to_string(),
        serde_json::json!({"id": "b", "prompt": "two"}).to_string(),
        serde_json::json!({"id": "c", "prompt": "x", "agent": mock(&["echo-cwd"]), "cwd": "sub"})
            .to_string(),
        serde_json::json!({"id": "d", "prompt": "three"}).to_string(),
        serde_json::json!({"id": "e", "prompt": "y", "agent": echo_env, "env": ["BATCH_TEST_TOKEN"]})
            .to_string(),
        serde_json::json!({"id": "f", "prompt": "z", "agent": echo_env}).to_string(),
        serde_json::json!({"id": "g", "prompt": "four"}).to_string(),
    ];
    jobs_file(dir.path(), &lines);
    let out = run_to_end(batch(dir.path()).env("BATCH_TEST_TOKEN", "tok-123").args([
        "--jobs",
        "2",
        "--agent",
        &mock(&["echo-prompt"]),
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let outputs = completed_outputs(&records);
    let sub = std::fs::canonicalize(&sub).unwrap();
    let by_id = |id: &str| outputs.iter().find(|(i, _)| i == id).unwrap().1.clone();
    assert_eq!(by_id("a"), "one");
    assert_eq!(by_id("b"), "two");
    assert!(
        by_id("c").starts_with(&format!("process: {}\n", sub.display())),
        "{}",
        by_id("c")
    );
    assert_eq!(by_id("d"), "three");
    // A credential-shaped name: forwarded by its line, withheld from the next one.
    assert_eq!(by_id("e"), "BATCH_TEST_TOKEN=tok-123");
    assert_eq!(by_id("f"), "BATCH_TEST_TOKEN unset");
    assert_eq!(by_id("g"), "four");
    assert_eq!(outputs.len(), 7);
    assert_no_process_left(dir.path());
}

#[test]
fn a_working_directory_gone_since_the_check_leaves_its_line_not_started() {
    // Lines asking for the same run share its preparation, but each start checks its working
    // directory again: the second line, checked with the first before anything started, finds
    // it gone and gets a `not-started` record naming it; the others run.
    let dir = temp();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let gated = mock(&[
        "gated-session",
        "--go",
        path_str(&go),
        "--ready",
        path_str(&ready),
    ]);
    let lines = [
        serde_json::json!({"id": "first", "prompt": "x", "agent": gated, "cwd": "sub"}).to_string(),
        serde_json::json!({"id": "second", "prompt": "y", "agent": gated, "cwd": "sub"})
            .to_string(),
        serde_json::json!({"id": "third", "prompt": "z"}).to_string(),
    ];
    jobs_file(dir.path(), &lines);
    let child = batch(dir.path())
        .args(["--jobs", "1", "--agent", &mock(&["hello"]), "jobs.ndjson"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        acp_tests::wait_for_file(&ready, HANG_GUARD),
        "the first run never reached session/new"
    );
    std::fs::remove_dir(&sub).unwrap();
    std::fs::write(&go, "").unwrap();
    let out = wait_output(child);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let status: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        status,
        [
            ("first", "completed"),
            ("second", "not-started"),
            ("third", "completed")
        ]
    );
    let error = records[1]["error"].as_str().unwrap();
    assert!(
        error.starts_with("working directory is not an accessible directory: ")
            && error.contains("sub"),
        "{error}"
    );
    assert_no_process_left(dir.path());
}

/// `lines` as `jobs.ndjson`, and the folder a batch may keep them in (its `TMPDIR`).
fn long_input(dir: &Path, lines: &[String]) -> std::path::PathBuf {
    jobs_file(dir, lines);
    let spool = dir.join("tmp");
    std::fs::create_dir(&spool).unwrap();
    spool
}

/// Each record's `(id, output)`, sorted by id, every record asserted completed.
fn completed_outputs(records: &[Value]) -> Vec<(String, String)> {
    let mut outputs: Vec<(String, String)> = records
        .iter()
        .map(|record| {
            assert_eq!(record["status"], "completed", "{}", record["id"]);
            let id = record["id"].as_str().unwrap().to_owned();
            (id, record["output"].as_str().unwrap().to_owned())
        })
        .collect();
    outputs.sort();
    outputs
}

fn assert_empty(folder: &Path) {
    let left: Vec<_> = std::fs::read_dir(folder).unwrap().collect();
    assert!(left.is_empty(), "{} holds {left:?}", folder.display());
}

#[test]
fn lines_beyond_what_memory_keeps_run_from_the_temporary_file_each_with_its_own_prompt() {
    // 24 prompts of 64 KiB: 1.5 MiB of lines, past the 1 MiB a batch keeps in memory.
    let dir = temp();
    let lines: Vec<String> = (0..24)
        .map(|i| {
            line(
                &format!("big{i}"),
                &format!("{i}:{}", "x".repeat(64 * 1024)),
            )
        })
        .collect();
    let spool = long_input(dir.path(), &lines);
    let out = run_to_end(batch(dir.path()).env("TMPDIR", &spool).args([
        "--jobs",
        "4",
        "--agent",
        &mock(&["echo-prompt"]),
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = records(&out);
    checked(&records);
    let got = completed_outputs(&records);
    let mut expected: Vec<(String, String)> = (0..24)
        .map(|i| (format!("big{i}"), format!("{i}:{}", "x".repeat(64 * 1024))))
        .collect();
    expected.sort();
    assert!(got == expected, "each record echoes its own line's prompt");
    // The temporary file had no name there, and nothing is left of it.
    assert_empty(&spool);
    assert_no_process_left(dir.path());
}

#[test]
fn a_repeated_id_far_apart_in_a_long_input_is_refused_before_anything_is_spawned() {
    // 70,000 lines: line 69,001 repeats line 7's id, 65,536 ids (one table of them) apart,
    // so the repeat is found once the whole input is read. Every worker of a shard finds it,
    // whether the repeating line is its own or not.
    let dir = temp();
    let log = dir.path().join("log");
    let lines: Vec<String> = (1..=70_000)
        .map(|n| {
            let id = if n == 69_001 { 7 } else { n };
            format!(r#"{{"id":"k{id}","prompt":"p"}}"#)
        })
        .collect();
    let spool = long_input(dir.path(), &lines);
    let agent = mock(&["hello", "--log", path_str(&log)]);
    for shard in [None, Some("0/2"), Some("1/2")] {
        let mut cmd = batch(dir.path());
        cmd.env("TMPDIR", &spool).args(["--agent", &agent]);
        if let Some(shard) = shard {
            cmd.args(["--shard", shard]);
        }
        let out = run_to_end(cmd.arg("jobs.ndjson"));
        assert_eq!(code(&out), 2, "{shard:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "");
        assert_eq!(
            stderr(&out),
            "acp-host: error: jobs.ndjson: line 69001, field `id`: \"k7\" is already the id of \
             line 7; ids must be unique\n",
            "{shard:?}"
        );
        assert!(!log.exists(), "an agent was spawned");
        assert_empty(&spool);
    }
}

#[test]
fn a_long_input_with_no_room_for_its_temporary_file_is_refused_naming_tmpdir() {
    let dir = temp();
    let log = dir.path().join("log");
    let lines: Vec<String> = (0..40)
        .map(|i| line(&i.to_string(), &"y".repeat(32 * 1024)))
        .collect();
    jobs_file(dir.path(), &lines);
    let missing = dir.path().join("no-such-folder");
    let out = run_to_end(batch(dir.path()).env("TMPDIR", &missing).args([
        "--agent",
        &mock(&["hello", "--log", path_str(&log)]),
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    let expected = format!(
        "acp-host: error: cannot keep the input's lines in a temporary file in {}: ",
        missing.display()
    );
    assert!(stderr(&out).starts_with(&expected), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .ends_with("(set TMPDIR to a writable folder with room for about the input's size)\n"),
        "{}",
        stderr(&out)
    );
    assert!(!log.exists(), "an agent was spawned");
}
