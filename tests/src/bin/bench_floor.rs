//! `bench-floor PROGRAM [ARG...]`: the benchmarks' floor client, std only. It spawns the agent,
//! sends initialize, session/new and session/prompt one after the other, frames every line the
//! agent writes (counting them and their bytes, parsing nothing), and when the prompt is answered
//! closes stdin and reaps the agent. No ACP client can do less and still be one.

#![expect(
    clippy::print_stderr,
    reason = "a benchmark tool reporting its own failures"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: bench-floor PROGRAM [ARG...]");
        return ExitCode::from(2);
    };
    let Ok(mut child) = Command::new(&program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    else {
        eprintln!("bench-floor: cannot start {program}");
        return ExitCode::FAILURE;
    };
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return ExitCode::FAILURE;
    };
    let requests = [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"hi"}]}}"#,
    ];
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    let (mut frames, mut bytes) = (0_u64, 0_u64);
    for request in requests {
        if writeln!(stdin, "{request}")
            .and_then(|()| stdin.flush())
            .is_err()
        {
            return ExitCode::FAILURE;
        }
        // Frame lines until the answer (a line with an id and a result) comes.
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return ExitCode::FAILURE,
                Ok(n) => {
                    frames += 1;
                    bytes += n as u64;
                }
            }
            if line.starts_with(br#"{"jsonrpc":"2.0","id":"#) {
                break;
            }
        }
    }
    drop(stdin);
    let _ = child.wait();
    eprintln!("bench-floor: {frames} frames, {bytes} bytes");
    ExitCode::SUCCESS
}
