//! `bench-agent CHUNKS BYTES`: the benchmarks' minimal ACP agent, written without any SDK and
//! without serde: it answers `initialize` and `session/new` at once and, on `session/prompt`,
//! streams CHUNKS `agent_message_chunk` updates of BYTES bytes of text each, then `end_turn`.
//! Stdin EOF ends it. What it costs is the floor any client's figures are compared with.

use std::io::{BufRead, BufWriter, Write};

fn main() {
    let mut args = std::env::args().skip(1);
    let chunks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let text = "x".repeat(bytes);
    let chunk = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{{\"sessionId\":\"s\",\
         \"update\":{{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{{\"type\":\"text\",\
         \"text\":\"{text}\"}}}}}}}}\n"
    );
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    for line in stdin.lines() {
        let Ok(line) = line else { break };
        let Some(id) = request_id(&line) else {
            continue;
        };
        let result = if line.contains("\"initialize\"") {
            "{\"protocolVersion\":1,\"agentCapabilities\":{},\"authMethods\":[]}"
        } else if line.contains("\"session/new\"") {
            "{\"sessionId\":\"s\"}"
        } else if line.contains("\"session/prompt\"") {
            for _ in 0..chunks {
                if out.write_all(chunk.as_bytes()).is_err() {
                    return;
                }
            }
            "{\"stopReason\":\"end_turn\"}"
        } else {
            continue;
        };
        let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}\n");
        if out
            .write_all(answer.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
    }
}

/// The `"id"` of a request line, as written (a number or a quoted string).
fn request_id(line: &str) -> Option<&str> {
    let rest = &line[line.find("\"id\":")? + 5..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim())
}
