//! End-to-end: the behaviours behind acp-host's performance goals, through the real binary.
//!
//! Bounded output with exact truncation, a stalled stdout reader that still lets `--timeout` end
//! the run, a second Ctrl-C that cuts the teardown graces short, frames that are almost right
//! (invalid UTF-8, a batch array). Speed itself is measured by `scripts/bench`, not here: these
//! tests wait on conditions with hang guards only.

use std::process::Stdio;

use acp_tests::{HANG_GUARD, code, line_channel, run_to_end, stderr, stdout, wait_until};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::common::{mock, records, result_record, temp};
use super::run::{assert_dead, host, path_str, signal, spawn_watched, wait_line};

#[test]
fn the_result_keeps_exactly_the_tail_of_a_flood() {
    let dir = temp();
    let (chunks, bytes, max) = (300, 100, 1000);
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--max-output",
        &max.to_string(),
        "--agent",
        &mock(&[
            "flood",
            "--chunks",
            &chunks.to_string(),
            "--bytes",
            &bytes.to_string(),
        ]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let full: String = (0..chunks)
        .map(|i| acp_tests::mock::cli::flood_chunk(i, bytes))
        .collect();
    let result = result_record(&out);
    assert_eq!(result["output"], full[full.len() - max..]);
    assert_eq!(result["outputTruncatedBytes"], full.len() - max);
    // Every update still reached stdout: only the result's copy is bounded.
    let updates = records(&out)
        .iter()
        .filter(|r| r["type"] == "update")
        .count();
    assert_eq!(updates, chunks);
}

#[test]
fn an_output_within_the_limit_is_whole_and_says_nothing_was_dropped() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--agent",
        &mock(&["flood", "--chunks", "10", "--bytes", "10"]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["output"].as_str().map(str::len), Some(100));
    assert_eq!(result.get("outputTruncatedBytes"), None);
}

#[test]
fn a_stalled_stdout_reader_does_not_stop_the_timeout() {
    let dir = temp();
    let pid = dir.path().join("pid");
    // 100 MB of text into a stdout nobody reads: the pipe fills at once.
    let mut child = host(dir.path())
        .args([
            "--timeout",
            "1",
            "--eof-grace",
            "0.2",
            "--term-grace",
            "0.2",
            "--agent",
            &mock(&[
                "flood",
                "--chunks",
                "100000",
                "--bytes",
                "1024",
                "--pid-file",
                path_str(&pid),
            ]),
            "x",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acp-host starts");
    let errors = line_channel(child.stderr.take().expect("stderr piped"));
    // Hold the read end open, unread, until the host has exited.
    let _stalled = child.stdout.take();
    let mut status = None;
    assert!(
        wait_until(HANG_GUARD, || {
            status = child.try_wait().expect("waitable");
            status.is_some()
        }),
        "acp-host did not exit while its stdout was stalled"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(124));
    // The reader of stderr may still be behind the exit: wait for the line (or for EOF).
    wait_line(&errors, "timed out after 1 s");
    assert_dead(&pid);
}

#[test]
fn one_ctrl_c_ends_a_run_whose_stdout_is_stalled() {
    let dir = temp();
    let pid = dir.path().join("pid");
    let ready = dir.path().join("ready");
    let mut child = host(dir.path())
        .args([
            "--cancel-grace",
            "0.5",
            "--eof-grace",
            "0.2",
            "--term-grace",
            "0.2",
            "--agent",
            &mock(&[
                "flood",
                "--chunks",
                "100000",
                "--bytes",
                "1024",
                "--pid-file",
                path_str(&pid),
                "--ready",
                path_str(&ready),
            ]),
            "x",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("acp-host starts");
    let _stalled = child.stdout.take();
    assert!(acp_tests::wait_for_file(&ready, HANG_GUARD));
    signal(&child, Signal::SIGINT);
    let mut status = None;
    assert!(
        wait_until(HANG_GUARD, || {
            status = child.try_wait().expect("waitable");
            status.is_some()
        }),
        "one Ctrl-C did not end a run with a stalled stdout"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(130));
    assert_dead(&pid);
}

#[test]
fn a_second_ctrl_c_during_the_term_grace_kills_at_once() {
    let dir = temp();
    let pid = dir.path().join("pid");
    // An agent ignoring EOF and SIGTERM, and a TERM grace only the second Ctrl-C can cut short.
    let (child, errors) = spawn_watched(host(dir.path()).args([
        "--json",
        "--verbose",
        "--eof-grace",
        "0.1",
        "--term-grace",
        "600",
        "--agent",
        &mock(&["stubborn", "--pid-file", path_str(&pid)]),
        "x",
    ]));
    wait_line(&errors, "SIGTERM received and ignored");
    signal(&child, Signal::SIGINT);
    wait_line(&errors, "cancelling");
    signal(&child, Signal::SIGINT);
    let out = acp_tests::wait_output(child);
    let result = result_record(&out);
    assert_eq!(result["status"], "completed", "the answer came before");
    assert_eq!(result["output"], "hello from acp child");
    assert_eq!(result["agentExit"]["endedBy"], "kill");
    assert_dead(&pid);
}

#[test]
fn a_second_ctrl_c_during_the_eof_grace_kills_at_once() {
    let dir = temp();
    let pid = dir.path().join("pid");
    let ready = dir.path().join("ready");
    let (child, errors) = spawn_watched(host(dir.path()).args([
        "--json",
        "--eof-grace",
        "600",
        "--term-grace",
        "600",
        "--agent",
        &mock(&[
            "stubborn",
            "--pid-file",
            path_str(&pid),
            "--ready",
            path_str(&ready),
        ]),
        "x",
    ]));
    // `stubborn` touches ready once it has answered the prompt.
    assert!(acp_tests::wait_for_file(&ready, HANG_GUARD));
    signal(&child, Signal::SIGINT);
    wait_line(&errors, "cancelling");
    signal(&child, Signal::SIGINT);
    let out = acp_tests::wait_output(child);
    let result = result_record(&out);
    assert_eq!(result["agentExit"]["endedBy"], "kill");
    assert_dead(&pid);
}

#[test]
fn a_frame_with_a_byte_that_is_not_utf8_is_decoded_lossily() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args(["--json", "--agent", &mock(&["bad-utf8"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "completed");
    assert_eq!(result["output"], "caf\u{FFFD}");
    assert!(stderr(&out).contains("not valid UTF-8"), "{}", stderr(&out));
}

#[test]
fn a_batch_array_is_answered_with_an_invalid_request_error() {
    let dir = temp();
    let out = run_to_end(host(dir.path()).args(["--agent", &mock(&["batch"]), "x"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "batch: -32600");
    assert!(stderr(&out).contains("batch array"), "{}", stderr(&out));
}

#[test]
fn the_observed_stream_is_valid_json_records_to_the_end() {
    // Backpressure must not reorder: start first, every update, then the end and the result.
    let dir = temp();
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--agent",
        &mock(&["flood", "--chunks", "2000", "--bytes", "64"]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let all = records(&out);
    assert_eq!(
        all.first().map(|r| r["type"].clone()),
        Some(Value::from("start"))
    );
    // start + 2,000 updates + end + result.
    assert_eq!(all.len(), 2003);
    assert_eq!(all[all.len() - 2]["type"], "end");
    let texts: String = all
        .iter()
        .filter_map(|r| r.pointer("/update/content/text").and_then(Value::as_str))
        .collect();
    assert_eq!(texts, result_record(&out)["output"]);
}

#[test]
fn records_larger_than_a_write_piece_arrive_whole() {
    // The end event and the result each carry 300 KB of output, written out in pieces as they
    // are serialized: both must still be one complete line each, with the same text.
    let dir = temp();
    let out = run_to_end(host(dir.path()).args([
        "--json",
        "--agent",
        &mock(&["flood", "--chunks", "3000", "--bytes", "100"]),
        "x",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let all = records(&out);
    assert_eq!(all.len(), 3003);
    let full: String = (0..3000)
        .map(|i| acp_tests::mock::cli::flood_chunk(i, 100))
        .collect();
    let end = &all[all.len() - 2];
    assert_eq!(end["type"], "end");
    assert_eq!(end["lastAssistantMessage"], full);
    assert_eq!(result_record(&out)["output"], full);
}
