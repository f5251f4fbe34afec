//! Trace propagation through the real binaries: acp-host continues the W3C trace it is given
//! (`TRACEPARENT`/`TRACESTATE`, `--traceparent`) and sends its run's span as root keys of
//! `params._meta` of every request; acp-child continues what its prompt carried for each child it
//! starts, so acp-host -> acp-child -> acp-child -> mock agent is one trace. The mock agent logs
//! each request's context (`--trace-log`: `trace <method> <traceparent> [<tracestate>]`).

use std::path::Path;

use acp_tests::{code, host_run, run_to_end, stderr, stdout};
use protocol::env_vars::{TRACEPARENT, TRACESTATE};
use protocol::trace::{SpanContext, parse_traceparent};

use super::children::{assert_none_left, mock_definition, offline_parent};
use super::common::mock_path;

const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The `(method, span, tracestate)` of every request the mock logged with a trace context.
fn received(log: &Path) -> Vec<(String, SpanContext, Option<String>)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("trace "))
        .map(|line| {
            let mut words = line.split(' ');
            let method = words.next().unwrap().to_owned();
            let span = parse_traceparent(words.next().unwrap()).unwrap();
            (method, span, words.next().map(str::to_owned))
        })
        .collect()
}

/// acp-host driving the mock's `hello`, logging to `<dir>/mock.log`.
fn hello(dir: &Path) -> std::process::Command {
    let mut cmd = host_run(dir);
    let agent = format!(
        "{} hello --trace-log {}",
        mock_path(),
        dir.join("mock.log").display()
    );
    cmd.env_remove(TRACEPARENT)
        .env_remove(TRACESTATE)
        .args(["--agent", &agent]);
    cmd
}

#[test]
fn every_request_carries_the_run_span_under_the_given_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(
        hello(dir.path())
            .env(TRACEPARENT, GIVEN)
            .env(TRACESTATE, "vendor=abc")
            .arg("hi"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let given = parse_traceparent(GIVEN).unwrap();
    let seen = received(&dir.path().join("mock.log"));
    let methods: Vec<&str> = seen.iter().map(|(method, ..)| method.as_str()).collect();
    assert_eq!(methods, ["initialize", "session/new", "session/prompt"]);
    let run_span = seen[0].1;
    for (method, span, state) in &seen {
        // One span for the run, a child of the given one: same trace and flags, its own id.
        assert_eq!(*span, run_span, "{method}");
        assert_eq!(state.as_deref(), Some("vendor=abc"), "{method}");
    }
    assert_eq!(run_span.trace_id, given.trace_id);
    assert_eq!(run_span.flags, given.flags);
    assert_ne!(run_span.span_id, given.span_id);
}

#[test]
fn the_flag_wins_over_the_environment_and_no_parent_starts_a_new_trace() {
    let dir = tempfile::tempdir().unwrap();
    let flag = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let out =
        run_to_end(
            hello(dir.path())
                .env(TRACEPARENT, GIVEN)
                .args(["--traceparent", flag, "hi"]),
        );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let seen = received(&dir.path().join("mock.log"));
    assert_eq!(
        seen[0].1.trace_id,
        parse_traceparent(flag).unwrap().trace_id
    );
    assert!(!seen[0].1.sampled());
    assert_eq!(seen[0].2, None);

    std::fs::remove_file(dir.path().join("mock.log")).unwrap();
    let out = run_to_end(hello(dir.path()).arg("hi"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let seen = received(&dir.path().join("mock.log"));
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_ne!(
        seen[0].1.trace_id,
        parse_traceparent(GIVEN).unwrap().trace_id
    );
    assert!(seen.iter().all(|(_, span, _)| *span == seen[0].1));
}

#[test]
fn a_malformed_parent_is_a_usage_error_naming_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(hello(dir.path()).args(["--traceparent", "nope", "hi"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out).trim(),
        "acp-host: error: --traceparent: traceparent \"nope\" is not a W3C trace parent; \
         expected 00-<32 hex>-<16 hex>-<2 hex>, e.g. \
         00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; fix it or unset it to start a \
         new trace"
    );
    let out = run_to_end(hello(dir.path()).env(TRACEPARENT, "00-x").arg("hi"));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("$TRACEPARENT: traceparent \"00-x\""),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("mock.log").exists(), "nothing was started");
}

#[test]
fn acp_host_to_acp_child_to_acp_child_to_the_mock_is_one_trace() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mock.log");
    mock_definition(
        dir.path(),
        "leaf",
        &format!("text --text leaf-answer --trace-log {}", log.display()),
    );
    let out = run_to_end(
        offline_parent(dir.path(), &[])
            .env(TRACEPARENT, GIVEN)
            .env_remove(TRACESTATE)
            .args(["--max-depth", "3", "--permission", "allow"])
            .arg("/delegate acp-child /delegate leaf hi"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("leaf-answer"), "{}", stdout(&out));
    let given = parse_traceparent(GIVEN).unwrap();
    let seen = received(&log);
    assert_eq!(
        seen.iter()
            .map(|(method, ..)| method.as_str())
            .collect::<Vec<_>>(),
        ["initialize", "session/new", "session/prompt"]
    );
    for (method, span, _) in &seen {
        assert_eq!(
            span.trace_id, given.trace_id,
            "{method}: one trace across four processes"
        );
        assert_ne!(span.span_id, given.span_id, "{method}");
    }
    assert_none_left(dir.path());
}

#[test]
fn a_batch_is_one_trace_each_line_a_run_span_under_the_batch_span() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = ["a", "b"]
        .iter()
        .map(|id| serde_json::json!({"id": id, "prompt": "hi"}).to_string())
        .collect();
    super::batch::jobs_file(dir.path(), &lines);
    let agent = format!(
        "{} hello --trace-log {}",
        mock_path(),
        dir.path().join("mock.log").display()
    );
    let out = run_to_end(
        super::batch::batch(dir.path())
            .env(TRACEPARENT, GIVEN)
            .env_remove(TRACESTATE)
            .args(["--jobs", "1", "--agent", &agent, "jobs.ndjson"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let seen = received(&dir.path().join("mock.log"));
    assert_eq!(seen.len(), 6, "{seen:?}");
    let given = parse_traceparent(GIVEN).unwrap();
    assert!(
        seen.iter()
            .all(|(_, span, _)| span.trace_id == given.trace_id)
    );
    // Each line's run has a span of its own, the same on all of its requests.
    let (first, second) = (seen[0].1, seen[3].1);
    assert!(seen[..3].iter().all(|(_, span, _)| *span == first));
    assert!(seen[3..].iter().all(|(_, span, _)| *span == second));
    assert_ne!(first.span_id, second.span_id);
    assert!(first.span_id != given.span_id && second.span_id != given.span_id);
}

/// `(span, parent span id)` of each span logged at debug level (`run span`, `turn span`), in
/// order.
fn logged_spans(stderr: &str) -> Vec<(SpanContext, String)> {
    stderr
        .lines()
        .filter(|line| line.contains("run span ") || line.contains("turn span "))
        .map(|line| {
            let field = |name: &str| {
                let at = line.find(name).unwrap() + name.len();
                line[at..].split(' ').next().unwrap().to_owned()
            };
            (
                parse_traceparent(&field(" traceparent=")).unwrap(),
                field(" parent="),
            )
        })
        .collect()
}

#[test]
fn each_level_parents_its_span_on_the_one_it_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mock.log");
    mock_definition(
        dir.path(),
        "leaf",
        &format!("text --text leaf-answer --trace-log {}", log.display()),
    );
    let mut cmd = host_run(dir.path());
    cmd.env(TRACEPARENT, GIVEN)
        .env_remove(TRACESTATE)
        .env("ACP_HOST_LOG", "acp_host=debug")
        .env("ACP_CHILD_LOG", "acp_child=debug,acp_host=debug")
        .env_remove("ACP_CHILD_MODEL")
        .args(["-v", "--agent", "acp-child", "/delegate leaf hi"]);
    let out = run_to_end(&mut cmd);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let spans = logged_spans(&stderr(&out));
    // acp-host's run, acp-child's turn, the child's run (acp-host's library in acp-child).
    assert_eq!(spans.len(), 3, "{}", stderr(&out));
    let given = parse_traceparent(GIVEN).unwrap();
    let mut parent = given.span_id_hex();
    for (span, logged_parent) in &spans {
        assert_eq!(span.trace_id, given.trace_id);
        assert_eq!(
            *logged_parent, parent,
            "each span's parent is the span before it"
        );
        parent = span.span_id_hex();
    }
    // What the mock received is the last run's span, on every request.
    let seen = received(&log);
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|(_, span, _)| *span == spans[2].0));
    assert_none_left(dir.path());
}
