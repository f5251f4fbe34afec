//! Self-test of the mock OpenAI-compatible server (`acp_tests::mock_llm`) through real sockets.
//!
//! The client here is raw `std::net::TcpStream` speaking HTTP/1.0 on purpose: a 1.0 response
//! with a streamed body is delimited by the connection closing, not by chunked encoding, so the
//! bytes read are exactly the SSE bytes the server wrote, and the framing can be asserted to
//! the byte. Waits are on conditions with hang guards, never fixed sleeps.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use acp_tests::mock_llm::{DONE, Finish, MockLlm, Reply};
use serde_json::{Value, json};

/// Guards every wait against a hang; never expected to elapse.
const HANG_GUARD: Duration = Duration::from_secs(30);

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    /// The `data:` payloads, asserting the framing: every event is exactly one `data: ` line
    /// followed by a blank line, and nothing else is in the body.
    fn sse_payloads(&self) -> Vec<String> {
        assert_eq!(self.status, 200, "{}", self.body);
        assert_eq!(self.header("content-type"), Some("text/event-stream"));
        assert!(self.body.ends_with("\n\n"), "{:?}", self.body);
        let payloads: Vec<String> = self
            .body
            .split_terminator("\n\n")
            .map(|event| {
                assert!(!event.contains('\n'), "one line per event: {event:?}");
                event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data line: {event:?}"))
                    .to_owned()
            })
            .collect();
        let reframed = payloads.iter().fold(String::new(), |mut all, p| {
            let _ = write!(all, "data: {p}\n\n");
            all
        });
        assert_eq!(reframed, self.body, "nothing but data events");
        payloads
    }

    /// The chunks of an SSE body, `[DONE]` asserted last and dropped.
    fn chunks(&self) -> Vec<Value> {
        let mut payloads = self.sse_payloads();
        assert_eq!(payloads.pop().as_deref(), Some(DONE));
        payloads
            .iter()
            .map(|p| serde_json::from_str(p).unwrap_or_else(|e| panic!("{e}: {p}")))
            .collect()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to the mock");
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    stream
}

fn send(stream: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &str) {
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(request, "{name}: {value}\r\n");
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let mut stream = connect(addr);
    send(&mut stream, method, path, headers, body);
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .expect("the response ends within the hang guard");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    RawResponse {
        status: status.parse().unwrap(),
        headers: lines
            .map(|l| l.split_once(": ").unwrap())
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
        body: body.to_owned(),
    }
}

fn chat(llm: &MockLlm, headers: &[(&str, &str)], body: &Value) -> RawResponse {
    request(
        llm.addr(),
        "POST",
        "/v1/chat/completions",
        headers,
        &body.to_string(),
    )
}

fn prompt(text: &str) -> Value {
    json!({
        "model": "mock-model",
        "stream": true,
        "messages": [{"role": "user", "content": text}],
    })
}

/// Each chunk's `[delta, finish_reason]`.
fn deltas(chunks: &[Value]) -> Vec<Value> {
    chunks
        .iter()
        .map(|c| json!([c["choices"][0]["delta"], c["choices"][0]["finish_reason"]]))
        .collect()
}

#[test]
fn a_text_reply_is_sse_framed_exactly_like_openai() {
    let llm = MockLlm::start(vec![Reply::text(["Hello", " world"])]);
    assert_eq!(
        llm.base_url(),
        format!("http://127.0.0.1:{}/v1", llm.addr().port())
    );
    let response = chat(&llm, &[], &prompt("hi"));
    assert_eq!(response.header("cache-control"), Some("no-cache"));
    let chunks = response.chunks();
    assert_eq!(
        deltas(&chunks),
        [
            json!([{"role": "assistant", "content": ""}, null]),
            json!([{"content": "Hello"}, null]),
            json!([{"content": " world"}, null]),
            json!([{}, "stop"]),
        ]
    );
    for chunk in &chunks {
        assert_eq!(chunk["id"], "chatcmpl-mock-1");
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(
            chunk["model"], "mock-model",
            "the request's model is echoed"
        );
        assert_eq!(chunk["choices"][0]["index"], 0);
    }
}

#[test]
fn requests_are_recorded_with_headers_and_parsed_body() {
    let llm = MockLlm::start(vec![Reply::text(["a"]), Reply::text(["b"])]);
    let body = prompt("first");
    chat(&llm, &[("Authorization", "Bearer k1")], &body).chunks();
    chat(&llm, &[], &prompt("second")).chunks();
    assert!(llm.wait_for_requests(2, HANG_GUARD));
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].authorization(), Some("Bearer k1"));
    assert_eq!(requests[0].header("content-type"), Some("application/json"));
    assert_eq!(requests[0].body, body);
    assert_eq!(requests[0].raw_body, body.to_string());
    assert_eq!(requests[0].last_user_text().as_deref(), Some("first"));
    assert_eq!(requests[1].authorization(), None);
    assert_eq!(requests[1].last_user_text().as_deref(), Some("second"));
    assert_eq!(llm.remaining(), 0);
    // Both streams ran to the end.
    assert!(llm.wait_for_stream_ends(2, HANG_GUARD));
    let mut ends = llm.stream_ends();
    ends.sort_by_key(|e| e.request);
    assert_eq!(ends.iter().map(|e| e.request).collect::<Vec<_>>(), [0, 1]);
    // Role, one text chunk, finish, [DONE].
    assert!(
        ends.iter().all(|e| e.complete() && e.total == 4),
        "{ends:?}"
    );
}

#[test]
fn tool_call_arguments_are_split_across_chunks() {
    let arguments = json!({"path": "out.txt", "content": "written by model"});
    let llm = MockLlm::start(vec![Reply::tool_call(
        "call_1",
        "write_file",
        &arguments,
        4,
    )]);
    let chunks = chat(&llm, &[], &prompt("go")).chunks();
    let deltas = deltas(&chunks);
    assert_eq!(deltas.len(), 1 + 1 + 4 + 1, "role, name, 4 pieces, finish");
    assert_eq!(
        deltas[1],
        json!([{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "write_file", "arguments": ""}}]}, null])
    );
    let pieces: Vec<&str> = deltas[2..6]
        .iter()
        .map(|d| {
            assert_eq!(d[0]["tool_calls"][0]["index"], 0);
            assert_eq!(
                d[0]["tool_calls"][0].get("id"),
                None,
                "only the first names it"
            );
            d[0]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert!(pieces.iter().all(|p| !p.is_empty()), "{pieces:?}");
    let joined: Value = serde_json::from_str(&pieces.concat()).unwrap();
    assert_eq!(joined, arguments);
    assert_eq!(deltas[6], json!([{}, "tool_calls"]));
}

#[test]
fn reasoning_and_finish_reasons_and_usage_are_streamed() {
    let llm = MockLlm::start(vec![
        Reply::Reasoning {
            thoughts: vec!["think".into()],
            text: vec!["say".into()],
        },
        Reply::Text {
            chunks: vec!["cut".into()],
            finish: Finish::ContentFilter,
        },
    ]);
    let chunks = chat(&llm, &[], &prompt("a")).chunks();
    assert_eq!(
        deltas(&chunks)[1..],
        [
            json!([{"content": null, "reasoning_content": "think"}, null]),
            json!([{"content": "say", "reasoning_content": null}, null]),
            json!([{}, "stop"]),
        ]
    );
    let mut body = prompt("b");
    body["stream_options"] = json!({"include_usage": true});
    let chunks = chat(&llm, &[], &body).chunks();
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(chunks[3]["usage"]["total_tokens"], 0);
    assert_eq!(chunks.len(), 4);
}

#[test]
fn a_wrong_or_missing_key_gets_401_and_consumes_nothing() {
    let llm = MockLlm::builder()
        .reply(Reply::text(["ok"]))
        .require_key(Some("test-key"))
        .start();
    for headers in [&[("Authorization", "Bearer wrong")][..], &[]] {
        let response = chat(&llm, headers, &prompt("x"));
        assert_eq!(response.status, 401);
        assert_eq!(response.header("content-type"), Some("application/json"));
        let error = response.json();
        assert_eq!(error["error"]["code"], "invalid_api_key");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Incorrect API key"),
            "{error}"
        );
    }
    assert_eq!(llm.remaining(), 1);
    let chunks = chat(&llm, &[("Authorization", "Bearer test-key")], &prompt("x")).chunks();
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "ok");
    assert_eq!(llm.requests().len(), 3);
}

#[test]
fn status_replies_carry_openai_error_bodies() {
    let llm = MockLlm::start(vec![
        Reply::status(429, "Rate limit reached"),
        Reply::status(500, "boom"),
        Reply::status(42, "not a status"),
    ]);
    let response = chat(&llm, &[], &prompt("x"));
    assert_eq!(response.status, 429);
    assert_eq!(
        response.json(),
        json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error",
            "param": null, "code": "rate_limit_exceeded"}})
    );
    let response = chat(&llm, &[], &prompt("x"));
    assert_eq!(response.status, 500);
    assert_eq!(response.json()["error"]["message"], "boom");
    let response = chat(&llm, &[], &prompt("x"));
    assert_eq!(response.status, 500);
    assert_eq!(
        response.json()["error"]["message"],
        "mock script error: 42 is not an HTTP status"
    );
}

#[test]
fn a_request_beyond_the_script_gets_500_mock_script_exhausted() {
    let llm = MockLlm::start(vec![Reply::text(["only"])]);
    chat(&llm, &[], &prompt("1")).chunks();
    let response = chat(&llm, &[], &prompt("2"));
    assert_eq!(response.status, 500);
    assert_eq!(
        response.json()["error"]["message"],
        "mock script exhausted: request #2 to /v1/chat/completions has no scripted reply"
    );
    assert_eq!(llm.requests().len(), 2);
}

#[test]
fn models_are_listed_as_configured_or_fail_and_are_counted_apart() {
    let llm = MockLlm::builder().models(["m1", "m2"]).start();
    let response = request(llm.addr(), "GET", "/v1/models", &[], "");
    assert_eq!(response.status, 200);
    let ids: Vec<Value> = response.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].clone())
        .collect();
    assert_eq!(ids, [json!("m1"), json!("m2")]);
    assert_eq!(llm.model_listings(), 1);
    assert!(llm.requests().is_empty(), "listings are not chat requests");
    let failing = MockLlm::builder().models_fail().start();
    let response = request(failing.addr(), "GET", "/v1/models", &[], "");
    assert_eq!(response.status, 500);
    assert_eq!(failing.model_listings(), 1);
}

#[test]
fn other_paths_and_bad_bodies_are_refused_and_recorded() {
    let llm = MockLlm::start(vec![Reply::text(["kept"])]);
    let response = request(llm.addr(), "POST", "/chat/completions", &[], "{}");
    assert_eq!(response.status, 404);
    assert_eq!(
        response.json()["error"]["message"],
        "mock llm serves only POST /v1/chat/completions, not POST /chat/completions"
    );
    let response = request(llm.addr(), "GET", "/v1/chat/completions", &[], "");
    assert_eq!(response.status, 404);
    let response = request(llm.addr(), "POST", "/v1/chat/completions", &[], "{not json");
    assert_eq!(response.status, 400);
    let requests = llm.requests();
    assert_eq!(
        requests
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>(),
        [
            "POST /chat/completions",
            "GET /v1/chat/completions",
            "POST /v1/chat/completions"
        ]
    );
    assert_eq!(requests[2].body, Value::Null);
    assert_eq!(requests[2].raw_body, "{not json");
    assert_eq!(llm.remaining(), 1, "refused requests consume nothing");
}

#[test]
fn a_slow_stream_stops_writing_when_the_client_leaves() {
    let chunks: Vec<String> = (0..1000).map(|i| format!("c{i} ")).collect();
    let llm = MockLlm::start(vec![Reply::Slow {
        chunks,
        interval: Duration::from_millis(20),
    }]);
    let mut stream = connect(llm.addr());
    send(
        &mut stream,
        "POST",
        "/v1/chat/completions",
        &[],
        &prompt("x").to_string(),
    );
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !line.contains(r#""content":"c0 ""#) {
        line.clear();
        assert_ne!(
            reader.read_line(&mut line).unwrap(),
            0,
            "stream ended early"
        );
    }
    drop(reader);
    // The whole stream would take 20 s; the end must come long before, at the next write.
    assert!(llm.wait_for_stream_ends(1, Duration::from_secs(10)));
    let end = llm.stream_ends()[0];
    assert!(!end.complete(), "{end:?}");
    assert!(end.sent >= 2 && end.sent < end.total, "{end:?}");
}

#[test]
fn a_hanging_reply_blocks_only_its_own_request_and_drop_ends_it() {
    let llm = MockLlm::start(vec![Reply::Hang, Reply::text(["next"])]);
    let mut hung = connect(llm.addr());
    send(
        &mut hung,
        "POST",
        "/v1/chat/completions",
        &[],
        &prompt("x").to_string(),
    );
    assert!(llm.wait_for_requests(1, HANG_GUARD));
    let chunks = chat(&llm, &[], &prompt("y")).chunks();
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "next");

    let addr = llm.addr();
    drop(llm);
    // The hanging connection is closed without a response, and the port is closed.
    let mut rest = Vec::new();
    let _ = hung.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert!(TcpStream::connect(addr).is_err(), "the port is closed");
}

#[test]
fn waits_report_false_when_nothing_arrives() {
    let llm = MockLlm::start(Vec::new());
    assert!(!llm.wait_for_requests(1, Duration::from_millis(30)));
    assert!(!llm.wait_for_stream_ends(1, Duration::from_millis(30)));
    assert!(llm.requests().is_empty());
}

#[test]
fn http_1_1_clients_get_a_chunked_stream_on_a_kept_alive_connection() {
    // What real clients (reqwest, the SDKs) speak: keep-alive, chunked transfer encoding.
    let llm = MockLlm::start(vec![Reply::text(["one"]), Reply::text(["two"])]);
    let mut stream = connect(llm.addr());
    let body = prompt("x").to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    for expected in ["one", "two"] {
        stream.write_all(request.as_bytes()).unwrap();
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_ascii_lowercase());
        }
        assert_eq!(head[0], "http/1.1 200 ok");
        assert!(
            head.contains(&"transfer-encoding: chunked".to_owned()),
            "{head:?}"
        );
        // Read chunk by chunk up to the terminating zero-size chunk.
        let mut sse = String::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim_end(), 16).unwrap();
            let mut data = vec![0; size + 2];
            reader.read_exact(&mut data).unwrap();
            if size == 0 {
                break;
            }
            sse.push_str(std::str::from_utf8(&data[..size]).unwrap());
        }
        assert!(sse.ends_with("data: [DONE]\n\n"), "{sse:?}");
        assert!(
            sse.contains(&format!(r#""content":"{expected}""#)),
            "{sse:?}"
        );
    }
    assert_eq!(llm.requests().len(), 2);
}
