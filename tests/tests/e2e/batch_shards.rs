//! End-to-end: one batch spread over workers (`acp-host batch --shard`, `--shard-from-env`) and
//! resumed (`--skip-done`), through the real binaries: every id run by exactly one of the
//! workers, only what did not complete run again, bad shards refused with nothing spawned.

use std::collections::BTreeSet;
use std::path::Path;

use acp_tests::{code, run_to_end, stderr, stdout};
use protocol::env_vars;
use serde_json::Value;

use super::batch::{assert_no_process_left, batch, checked, jobs_file, path_str};
use super::common::{mock, records, temp};

/// 200 lines: ids `j1`..`j200`, of which every tenth (`j10`, `j20`, ...) runs `crash`, an agent
/// that crashes on its prompt; the rest run the batch's `--agent`.
fn two_hundred_lines(dir: &Path, crash: &str) -> BTreeSet<String> {
    let lines: Vec<String> = (1..=200)
        .map(|n| {
            let mut line = serde_json::json!({"id": format!("j{n}"), "prompt": format!("p{n}")});
            if n % 10 == 0 {
                line["agent"] = Value::String(crash.to_owned());
            }
            line.to_string()
        })
        .collect();
    jobs_file(dir, &lines);
    failing()
}

fn failing() -> BTreeSet<String> {
    (1..=20).map(|n| format!("j{}", n * 10)).collect()
}

fn ids(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|record| record["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn four_shards_run_every_line_exactly_once_and_skip_done_reruns_only_what_did_not_complete() {
    let dir = temp();
    let failing = two_hundred_lines(dir.path(), &mock(&["crash-on-prompt"]));
    let echo = mock(&["echo-prompt"]);
    let mut all = Vec::new();
    let mut results = String::new();
    for index in 0..4 {
        let mut cmd = batch(dir.path());
        cmd.args(["--jobs", "4", "--agent", &echo]);
        // Shard 2 takes its index the way a Kubernetes Indexed Job gives it.
        if index == 2 {
            cmd.env(env_vars::JOB_COMPLETION_INDEX, "2").args([
                "--shard-from-env",
                &format!("{}/4", env_vars::JOB_COMPLETION_INDEX),
            ]);
        } else {
            cmd.args(["--shard", &format!("{index}/4")]);
        }
        let out = run_to_end(cmd.arg("jobs.ndjson"));
        let records = records(&out);
        checked(&records);
        let theirs = ids(&records);
        let expected_code = i32::from(theirs.iter().any(|id| failing.contains(id)));
        assert_eq!(code(&out), expected_code, "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "acp-host: batch: shard {index}/4 takes {} of 200 lines\n",
                theirs.len()
            )),
            "{}",
            stderr(&out)
        );
        // A share, not everything nor nothing (200 ids hash about 50 to each of 4).
        assert!(
            (20..80).contains(&theirs.len()),
            "shard {index}: {}",
            theirs.len()
        );
        for record in &records {
            let id = record["id"].as_str().unwrap();
            if failing.contains(id) {
                assert_eq!(record["status"], "error", "{record}");
            } else {
                assert_eq!(record["status"], "completed", "{record}");
                assert_eq!(record["output"], format!("p{}", &id[1..]), "{record}");
            }
        }
        all.extend(theirs);
        results.push_str(&stdout(&out));
    }
    all.sort_by_key(|id| id[1..].parse::<u32>().unwrap());
    let every: Vec<String> = (1..=200).map(|n| format!("j{n}")).collect();
    assert_eq!(
        all, every,
        "the 4 shards together hold every id exactly once"
    );
    assert_no_process_left(dir.path());

    // Resumed: only the 20 lines that did not complete run again, each once.
    std::fs::write(dir.path().join("results.ndjson"), &results).unwrap();
    let record = dir.path().join("record");
    // The same lines, with agents that record their starts.
    two_hundred_lines(
        dir.path(),
        &mock(&["crash-on-prompt", "--record", path_str(&record)]),
    );
    let echo_recorded = mock(&["echo-prompt", "--record", path_str(&record)]);
    let out = run_to_end(batch(dir.path()).args([
        "--jobs",
        "4",
        "--agent",
        &echo_recorded,
        "--skip-done",
        "results.ndjson",
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let rerun = records(&out);
    checked(&rerun);
    let rerun: BTreeSet<String> = ids(&rerun).into_iter().collect();
    assert_eq!(rerun, failing);
    // The crashing agents record their start, not an end.
    let started = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("start "))
        .count();
    assert_eq!(started, 20, "only the lines not completed started an agent");
    assert!(
        stderr(&out).contains(
            "acp-host: batch: 200 lines, 180 of them already completed in results.ndjson\n"
        ),
        "{}",
        stderr(&out)
    );
    assert_no_process_left(dir.path());
}

#[test]
fn a_results_file_cut_or_holding_other_records_only_skips_completed_ids() {
    let dir = temp();
    let lines: Vec<String> = (1..=4)
        .map(|n| serde_json::json!({"id": format!("k{n}"), "prompt": format!("p{n}")}).to_string())
        .collect();
    jobs_file(dir.path(), &lines);
    // k1 completed; k2 timed out; k3 never started; k4's record was cut by a kill mid-write.
    std::fs::write(
        dir.path().join("results.ndjson"),
        concat!(
            r#"{"type":"result","id":"k1","status":"completed","output":"p1"}"#,
            "\n",
            r#"{"type":"result","id":"k2","status":"timeout"}"#,
            "\n",
            "not json at all\n",
            r#"{"type":"not-started","id":"k3","status":"not-started"}"#,
            "\n",
            r#"{"type":"result","id":"k4","status":"compl"#,
        ),
    )
    .unwrap();
    let out = run_to_end(batch(dir.path()).args([
        "--agent",
        &mock(&["echo-prompt"]),
        "--skip-done",
        "results.ndjson",
        "jobs.ndjson",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let mut rerun = ids(&records(&out));
    rerun.sort();
    assert_eq!(rerun, ["k2", "k3", "k4"]);
}

#[test]
fn bad_shards_and_a_missing_results_file_are_refused_before_anything_runs() {
    let dir = temp();
    let record = dir.path().join("record");
    jobs_file(dir.path(), &[r#"{"prompt":"p"}"#.to_owned()]);
    let agent = mock(&["echo-prompt", "--record", path_str(&record)]);
    let refused = |args: &[&str], env: Option<(&str, &str)>, message: &str| {
        let mut cmd = batch(dir.path());
        cmd.env_remove(env_vars::JOB_COMPLETION_INDEX)
            .args(["--agent", &agent])
            .args(args)
            .arg("jobs.ndjson");
        if let Some((name, value)) = env {
            cmd.env(name, value);
        }
        let out = run_to_end(&mut cmd);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!("acp-host: error: {message}\n"),
            "{args:?}"
        );
        assert_eq!(stdout(&out), "");
    };
    refused(
        &["--shard", "4/4"],
        None,
        "--shard 4/4: index 4 is not below the count 4; indexes are 0-based, from 0 to 3",
    );
    refused(
        &["--shard", "1"],
        None,
        "--shard 1: expected INDEX/COUNT, as in `--shard 0/4`",
    );
    refused(
        &["--shard-from-env", "JOB_COMPLETION_INDEX/4"],
        None,
        "--shard-from-env JOB_COMPLETION_INDEX/4: the variable JOB_COMPLETION_INDEX is not set; \
         the scheduler sets it for each worker (or use --shard INDEX/COUNT)",
    );
    refused(
        &["--shard-from-env", "JOB_COMPLETION_INDEX/4"],
        Some((env_vars::JOB_COMPLETION_INDEX, "7")),
        "--shard-from-env JOB_COMPLETION_INDEX/4: index 7 is not below the count 4; indexes are \
         0-based, from 0 to 3",
    );
    refused(
        &["--skip-done", "nowhere.ndjson"],
        None,
        "--skip-done nowhere.ndjson: no such file; create it with `touch nowhere.ndjson` before \
         the first run (an empty file skips nothing)",
    );
    assert!(!record.exists(), "no agent was started");
}

#[test]
fn skip_done_into_its_own_file_must_append() {
    let dir = temp();
    jobs_file(dir.path(), &[r#"{"id":"a","prompt":"p"}"#.to_owned()]);
    let results = dir.path().join("results.ndjson");
    let done = r#"{"type":"result","id":"a","status":"completed","output":"p"}"#;
    let agent = mock(&["echo-prompt"]);
    let batch_into = |redirect: &str| {
        std::fs::write(&results, format!("{done}\n")).unwrap();
        let line = format!(
            "exec {} batch --agent {} --skip-done results.ndjson jobs.ndjson {redirect} \
             results.ndjson",
            shell_words::quote(&acp_tests::bin("acp-host").display().to_string()),
            shell_words::quote(&agent),
        );
        run_to_end(
            std::process::Command::new("sh")
                .current_dir(dir.path())
                .env_remove("ACP_HOST_LOG")
                .args(["-c", &line]),
        )
    };
    // `1<>` opens without truncating: the new records would have overwritten the old ones.
    let out = batch_into("1<>");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "acp-host: error: --skip-done results.ndjson: it is also stdout, opened without append, \
         so the new records would overwrite it (and `> results.ndjson` has already emptied it); \
         append to it with `>> results.ndjson`\n"
    );
    assert_eq!(
        std::fs::read_to_string(&results).unwrap(),
        format!("{done}\n")
    );
    // `>>` appends: the line is done, nothing runs, the file is as it was.
    let out = batch_into(">>");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("acp-host: batch: 1 line, 1 of them already completed in results.ndjson\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&results).unwrap(),
        format!("{done}\n")
    );
}

/// `m1`..`m8`: `m3` and `m6` crash until the file `ok` exists, `m8` always crashes, the rest run
/// the batch's `--agent`.
fn eight_lines_two_flaky(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    // Crashes until the file `ok` exists, then answers.
    let flaky = dir.join("flaky.sh");
    std::fs::write(
        &flaky,
        format!(
            "#!/bin/sh\n[ -e {ok} ] && exec {echo}\nexec {crash}\n",
            ok = dir.join("ok").display(),
            echo = mock(&["echo-prompt"]),
            crash = mock(&["crash-on-prompt"]),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&flaky, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lines: Vec<String> = (1..=8)
        .map(|n| {
            let mut line = serde_json::json!({"id": format!("m{n}"), "prompt": format!("p{n}")});
            match n {
                3 | 6 => line["agent"] = Value::String(path_str(&flaky).to_owned()),
                8 => line["agent"] = Value::String(mock(&["crash-on-prompt"])),
                _ => {}
            }
            line.to_string()
        })
        .collect();
    jobs_file(dir, &lines);
}

/// `batch` appending to `results`, as the docs' recipes do (`>> results`).
fn append_to(cmd: &mut std::process::Command, results: &Path) -> std::process::Output {
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(results)
        .unwrap();
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("acp-host starts");
    acp_tests::wait_output(child)
}

/// Two shards, each resumed into its own results file after some lines failed: the files hold
/// the failed records beside their completed successors, `--merge` keeps each id's last record,
/// and docs/batch.md's failure query on its output lists only the line that really failed.
#[test]
fn merge_keeps_each_ids_last_record_and_the_failure_query_lists_only_real_failures() {
    let dir = temp();
    eight_lines_two_flaky(dir.path());
    let echo = mock(&["echo-prompt"]);
    let run_shards = |expected: i32| {
        for index in 0..2 {
            let results = dir.path().join(format!("results-{index}.ndjson"));
            let out = append_to(
                batch(dir.path())
                    .args(["--agent", &echo, "--shard", &format!("{index}/2")])
                    .args(["--skip-done", path_str(&results), "jobs.ndjson"]),
                &results,
            );
            assert_eq!(code(&out), expected, "{}", stderr(&out));
        }
    };
    for index in 0..2 {
        std::fs::write(dir.path().join(format!("results-{index}.ndjson")), "").unwrap();
    }
    run_shards(1);
    std::fs::write(dir.path().join("ok"), "").unwrap();
    // m8 still fails: both shards' batches exit 1, whichever has it.
    for index in 0..2 {
        let results = dir.path().join(format!("results-{index}.ndjson"));
        let out = append_to(
            batch(dir.path())
                .args(["--agent", &echo, "--shard", &format!("{index}/2")])
                .args(["--skip-done", path_str(&results), "jobs.ndjson"]),
            &results,
        );
        let holds_m8 = std::fs::read_to_string(&results)
            .unwrap()
            .contains("\"m8\"");
        assert_eq!(code(&out), i32::from(holds_m8), "{}", stderr(&out));
    }
    // Gathered without --merge, the redone lines still show as failures.
    let cat: Vec<Value> = (0..2)
        .flat_map(|index| {
            std::fs::read_to_string(dir.path().join(format!("results-{index}.ndjson")))
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(cat.len(), 11, "8 records, then 3 again: m3, m6 and m8");
    let out =
        run_to_end(batch(dir.path()).args(["--merge", "results-0.ndjson", "results-1.ndjson"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "acp-host: batch: merged 2 files: 11 records of 8 ids (3 replaced by a later record)\n"
    );
    let merged = records(&out);
    checked(&merged);
    let mut merged_ids = ids(&merged);
    merged_ids.sort();
    assert_eq!(merged_ids, ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"]);
    for record in &merged {
        let completed = record["id"] != "m8";
        assert_eq!(record["status"] == "completed", completed, "{record}");
    }
    // docs/batch.md's failure query, as written, on the merged file.
    if let Some(failures) = failure_query(dir.path(), &stdout(&out)) {
        assert_eq!(failures.lines().count(), 1, "{failures}");
        assert!(
            failures.starts_with("m8: error agent closed its output"),
            "{failures}"
        );
    }
    assert_no_process_left(dir.path());
}

/// docs/batch.md's failure query (its first `jq -r 'select(.status != "completed") | ...'`
/// line, as written there) on `records`, written to a file in `dir`; `None`, said on stderr,
/// without jq.
#[expect(clippy::print_stderr, reason = "a skipped check says why")]
fn failure_query(dir: &Path, records: &str) -> Option<String> {
    if !which("jq") {
        eprintln!("skipped: jq is not installed; docs/batch.md's failure query is not run");
        return None;
    }
    let merged = dir.join("results.ndjson");
    std::fs::write(&merged, records).unwrap();
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/batch.md"))
            .expect("docs/batch.md");
    let line = page
        .lines()
        .find(|line| line.starts_with("jq -r 'select(.status != \"completed\")"))
        .expect("docs/batch.md's failure query");
    let filter = &line[line.find('\'').unwrap() + 1..line.rfind('\'').unwrap()];
    let query = std::process::Command::new("jq")
        .args(["-r", filter])
        .arg(&merged)
        .output()
        .unwrap();
    assert!(query.status.success(), "{query:?}");
    Some(String::from_utf8(query.stdout).unwrap())
}

/// Whether `program` is on PATH.
fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

#[test]
fn merge_refuses_a_missing_file_stdout_and_an_input_to_run() {
    let dir = temp();
    std::fs::write(
        dir.path().join("r.ndjson"),
        "{\"type\":\"summary\"}\nnot json\n",
    )
    .unwrap();
    let out = run_to_end(batch(dir.path()).args(["--merge", "r.ndjson", "nosuch.ndjson"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: --merge nosuch.ndjson: no such file; give the results files of a \
         batch (its stdout)\n"
    );
    assert_eq!(stdout(&out), "");
    let out = run_to_end(batch(dir.path()).args(["jobs.ndjson", "--merge", "r.ndjson"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).starts_with("acp-host: error: --merge takes results files only"),
        "{}",
        stderr(&out)
    );
    let out = append_to(
        batch(dir.path()).args(["--merge", "r.ndjson"]),
        &dir.path().join("r.ndjson"),
    );
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).starts_with("acp-host: error: --merge r.ndjson: it is also stdout"),
        "{}",
        stderr(&out)
    );
    // Lines that are not records are left out, and said so.
    let out = run_to_end(batch(dir.path()).args(["--merge", "r.ndjson"]));
    assert_eq!(code(&out), 0);
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        "acp-host: batch: merged 1 file: 0 records of 0 ids (0 replaced by a later record); 2 \
         lines that are not records left out\n"
    );
}
