//! Trace export through the real binaries: a test OTLP/HTTP receiver on loopback (HTTP/1.1,
//! protobuf decoded with the official `opentelemetry-proto` messages) records what acp-host and
//! every acp-child below it export; `--trace-out` writes the same spans as OTLP/JSON lines; a dead
//! collector is one warning; the collector's headers never reach an agent.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use acp_tests::mock_llm::{MockLlm, Reply, Usage};
use acp_tests::{code, run_to_end, stderr, stdout};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use protocol::env_vars::{
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    TRACEPARENT, TRACESTATE,
};
use protocol::trace::parse_traceparent;
use serde_json::json;

use super::children::{assert_none_left, mock_definition, model_parent, offline_parent};
use super::common::mock;

/// One exported span, flattened for assertions.
#[derive(Debug, Clone, PartialEq)]
struct Recorded {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    /// OTLP's numbering: 2 server, 3 client.
    kind: i32,
    attributes: BTreeMap<String, String>,
    events: Vec<(String, BTreeMap<String, String>)>,
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(Any::StringValue(text)) => text.clone(),
        Some(Any::IntValue(number)) => number.to_string(),
        Some(Any::DoubleValue(number)) => number.to_string(),
        Some(Any::BoolValue(flag)) => flag.to_string(),
        Some(Any::ArrayValue(array)) => array
            .values
            .iter()
            .map(|value| text(Some(value)))
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    }
}

fn map(pairs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|pair| (pair.key.clone(), text(pair.value.as_ref())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<Recorded> {
    let mut out = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .map(|resource| map(&resource.attributes))
            .and_then(|attributes| attributes.get("service.name").cloned())
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                out.push(Recorded {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: map(&span.attributes),
                    events: span
                        .events
                        .iter()
                        .map(|event| (event.name.clone(), map(&event.attributes)))
                        .collect(),
                });
            }
        }
    }
    out
}

/// A test OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body, answered `200`.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Recorded>>>,
    /// The headers of every request, lowercased names.
    headers: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let (into, seen) = (Arc::clone(&spans), Arc::clone(&headers));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (into, seen) = (Arc::clone(&into), Arc::clone(&seen));
                std::thread::spawn(move || serve(stream, &into, &seen));
            }
        });
        Self {
            port,
            spans,
            headers,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Recorded> {
        self.spans.lock().unwrap().clone()
    }
}

/// Serves one connection's requests (keep-alive) until the client closes it.
fn serve(stream: TcpStream, into: &Mutex<Vec<Recorded>>, seen: &Mutex<Vec<String>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let lower = header.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            seen.lock().unwrap().push(lower);
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        into.lock().unwrap().extend(flatten(request));
        let _ = writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

/// The spans of a `--trace-out` file (one OTLP/JSON request a line).
fn file_spans(path: &Path) -> Vec<Recorded> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .flat_map(|line| flatten(serde_json::from_str(line).unwrap()))
        .collect()
}

fn by_id(spans: &[Recorded]) -> BTreeMap<String, Recorded> {
    spans
        .iter()
        .map(|span| (span.span_id.clone(), span.clone()))
        .collect()
}

const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_three_level_tree_is_one_exported_trace_with_every_parent_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let log = dir.path().join("mock.log");
    mock_definition(
        dir.path(),
        "leaf",
        &format!("text --text leaf-answer --trace-log {}", log.display()),
    );
    let trace_out = dir.path().join("spans.jsonl");
    let out = run_to_end(
        offline_parent(dir.path(), &[])
            .env(TRACEPARENT, GIVEN)
            .env_remove(TRACESTATE)
            .env(OTEL_EXPORTER_OTLP_ENDPOINT, receiver.endpoint())
            .env_remove(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
            .args(["--max-depth", "3", "--permission", "allow"])
            .args(["--trace-out", trace_out.to_str().unwrap()])
            .arg("/delegate acp-child /delegate leaf hi"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("leaf-answer"), "{}", stdout(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    let spans = receiver.spans();
    let given = parse_traceparent(GIVEN).unwrap();
    assert!(
        spans
            .iter()
            .all(|span| span.trace_id == given.trace_id_hex()),
        "one trace: {spans:#?}"
    );
    // acp-host's run (client) -> acp-child's turn (server) -> its child's run (client) -> the
    // second acp-child's turn (server) -> the leaf's run (client): five spans, three processes.
    let ids = by_id(&spans);
    let chain = |leaf: &Recorded| {
        let mut chain = vec![leaf.clone()];
        while let Some(parent) = ids.get(&chain.last().unwrap().parent) {
            chain.push(parent.clone());
        }
        chain
    };
    let leaf_run = spans
        .iter()
        .find(|span| span.name == "invoke_agent leaf")
        .unwrap_or_else(|| panic!("the leaf's run span: {spans:#?}"));
    let path: Vec<(String, i32)> = chain(leaf_run)
        .iter()
        .map(|span| (span.service.clone(), span.kind))
        .collect();
    assert_eq!(
        path,
        [
            ("acp-child".to_owned(), 3),
            ("acp-child".to_owned(), 2),
            ("acp-child".to_owned(), 3),
            ("acp-child".to_owned(), 2),
            ("acp-host".to_owned(), 3),
        ],
        "{spans:#?}"
    );
    let top = chain(leaf_run).last().unwrap().clone();
    assert_eq!(top.parent, given.span_id_hex(), "under the given parent");
    for span in chain(leaf_run) {
        assert_eq!(span.attributes["gen_ai.operation.name"], "invoke_agent");
        assert!(
            span.attributes.contains_key("gen_ai.conversation.id"),
            "{span:#?}"
        );
    }
    // The exported leaf run span is the one the mock received in `_meta`.
    let mock_log = std::fs::read_to_string(&log).unwrap();
    let sent = mock_log
        .lines()
        .find_map(|line| line.strip_prefix("trace session/prompt "))
        .unwrap();
    assert_eq!(
        parse_traceparent(sent.split(' ').next().unwrap())
            .unwrap()
            .span_id_hex(),
        leaf_run.span_id
    );
    // acp-host's run ended with its teardown's step.
    assert!(
        top.events
            .iter()
            .any(|(name, attributes)| name == "teardown"
                && attributes.contains_key("acp.agent.ended_by")),
        "{top:#?}"
    );
    // --trace-out: the same spans, every process's, in the one file.
    let mut from_file: Vec<String> = file_spans(&trace_out)
        .into_iter()
        .map(|span| span.span_id)
        .collect();
    let mut sent: Vec<String> = spans.into_iter().map(|span| span.span_id).collect();
    from_file.sort();
    sent.sort();
    assert_eq!(from_file, sent);
    assert_none_left(dir.path());
}

#[test]
fn model_requests_and_tool_calls_are_spans_with_usage_and_a_permission_event() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let llm = MockLlm::builder()
        .reply_with_usage(
            Reply::tool_call(
                "call_1",
                "write_file",
                &json!({"path": "notes.txt", "content": "secret contents"}),
                1,
            ),
            Usage::new(11, 7),
        )
        .reply_with_usage(Reply::text(["done"]), Usage::new(13, 5))
        .start();
    let out = run_to_end(
        model_parent(dir.path(), &llm, true, &[])
            .env(OTEL_EXPORTER_OTLP_ENDPOINT, receiver.endpoint())
            .env_remove(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
            .args(["--permission", "allow", "go"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let spans = receiver.spans();
    let chats: Vec<&Recorded> = spans
        .iter()
        .filter(|span| {
            span.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some("chat")
        })
        .collect();
    assert_eq!(chats.len(), 2, "{spans:#?}");
    let turn = spans
        .iter()
        .find(|span| span.service == "acp-child" && span.kind == 2)
        .unwrap();
    for chat in &chats {
        assert_eq!(chat.parent, turn.span_id, "a model request under its turn");
        assert!(chat.attributes.contains_key("gen_ai.request.model"));
    }
    let tokens = |span: &Recorded| {
        let count = |key: &str| {
            span.attributes
                .get(key)
                .cloned()
                .unwrap_or_else(|| panic!("{key} on {span:#?}"))
        };
        (
            count("gen_ai.usage.input_tokens"),
            count("gen_ai.usage.output_tokens"),
        )
    };
    assert_eq!(tokens(chats[0]), ("11".to_owned(), "7".to_owned()));
    assert_eq!(tokens(chats[1]), ("13".to_owned(), "5".to_owned()));
    // The turn and acp-host's run carry what the tree spent.
    assert_eq!(tokens(turn), ("24".to_owned(), "12".to_owned()));
    let run = spans
        .iter()
        .find(|span| span.service == "acp-host" && span.name.starts_with("invoke_agent"))
        .unwrap();
    assert_eq!(tokens(run), ("24".to_owned(), "12".to_owned()));
    assert_eq!(turn.parent, run.span_id);
    // The tool call: its name and status, a permission event, never its arguments.
    let tool = spans
        .iter()
        .find(|span| {
            span.service == "acp-child"
                && span
                    .attributes
                    .get("gen_ai.operation.name")
                    .map(String::as_str)
                    == Some("execute_tool")
        })
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(tool.parent, turn.span_id);
    assert_eq!(tool.attributes["acp.tool.status"], "completed");
    let (_, permission) = tool
        .events
        .iter()
        .find(|(name, _)| name == "permission")
        .unwrap_or_else(|| panic!("{tool:#?}"));
    assert!(
        tool.events
            .iter()
            .any(|(name, _)| name == "permission_asked"),
        "{tool:#?}"
    );
    assert!(
        permission.contains_key("acp.permission.wait_ms"),
        "{permission:?}"
    );
    let everything = format!("{spans:?}");
    assert!(!everything.contains("secret contents"), "{everything}");
}

#[test]
fn a_dead_collector_is_one_warning_and_the_run_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = run_to_end(
        acp_tests::host_run(dir.path())
            .env(
                OTEL_EXPORTER_OTLP_ENDPOINT,
                format!("http://127.0.0.1:{port}"),
            )
            .env(
                OTEL_EXPORTER_OTLP_HEADERS,
                "authorization=Bearer sk-dead-collector-secret",
            )
            .args(["--agent", &mock(&["hello"]), "hi"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let all = stderr(&out);
    let warnings: Vec<&str> = all
        .lines()
        .filter(|line| line.contains("warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", stderr(&out));
    assert!(
        warnings[0].contains("OpenTelemetry collector"),
        "{warnings:?}"
    );
    assert!(!stderr(&out).contains("sk-dead-collector-secret"));
}

#[test]
fn the_collectors_headers_never_reach_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let out = run_to_end(
        acp_tests::host_run(dir.path())
            .env(OTEL_EXPORTER_OTLP_ENDPOINT, receiver.endpoint())
            .env(OTEL_EXPORTER_OTLP_HEADERS, "x-team=team-secret-value")
            .args([
                "--json",
                "--agent",
                &mock(&[
                    "echo-env",
                    OTEL_EXPORTER_OTLP_HEADERS,
                    OTEL_EXPORTER_OTLP_ENDPOINT,
                ]),
                "x",
            ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("team-secret-value"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(&receiver.endpoint()),
        "{}",
        stdout(&out)
    );
    // acp-host itself sent them to the collector.
    assert!(
        receiver
            .headers
            .lock()
            .unwrap()
            .iter()
            .any(|header| header == "x-team: team-secret-value"),
        "{:?}",
        receiver.headers.lock().unwrap()
    );
}

/// The names of a process's threads (`/proc/PID/task/*/comm`, cut at 15 bytes by the kernel).
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
                .map(|name| name.trim_end().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The pid of the process in `dir` whose command name is `name`.
fn named_in(dir: &Path, name: &str) -> Option<u32> {
    acp_tests::processes_in(dir).into_iter().find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == name)
    })
}

/// The batch processor's thread, as the kernel names it.
const EXPORT_THREAD: &str = "OpenTelemetry.T";

/// How many export threads acp-host and its acp-child have while a prompt runs, with or
/// without a collector named.
fn export_threads(collector: Option<&Receiver>) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = offline_parent(dir.path(), &[]);
    cmd.env_remove(OTEL_EXPORTER_OTLP_ENDPOINT)
        .env_remove(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
        .arg("/sleep 60");
    if let Some(receiver) = collector {
        cmd.env(OTEL_EXPORTER_OTLP_ENDPOINT, receiver.endpoint());
    }
    let host = acp_tests::spawn_captured(&mut cmd);
    // acp-child serves on its `serve` thread, started after export was set up.
    let mut child = None;
    assert!(acp_tests::wait_until(acp_tests::HANG_GUARD, || {
        child = named_in(dir.path(), "acp-child");
        child.is_some_and(|pid| threads(pid).iter().any(|name| name == "serve"))
    }));
    let count = |pid: u32| {
        threads(pid)
            .iter()
            .filter(|name| *name == EXPORT_THREAD)
            .count()
    };
    let counts = (count(host.id()), count(child.unwrap()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(host.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = acp_tests::wait_output(host);
    assert_none_left(dir.path());
    counts
}

#[test]
fn no_collector_no_export_thread_in_either_binary() {
    assert_eq!(export_threads(None), (0, 0));
    let receiver = Receiver::start();
    assert_eq!(export_threads(Some(&receiver)), (1, 1), "one thread each");
    // acp-host exported its run on its way out, the SIGTERM's cancel an event of it.
    let spans = receiver.spans();
    let run = spans
        .iter()
        .find(|span| span.service == "acp-host" && span.name.starts_with("invoke_agent"))
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(
        run.attributes.get("acp.run.status").map(String::as_str),
        Some("aborted"),
        "{spans:#?}"
    );
    assert!(
        run.events.iter().any(|(name, _)| name == "cancel"),
        "{run:#?}"
    );
}
