//! End-to-end: remote agents over ACP's HTTP/WebSocket transport. `acp-host serve` on 127.0.0.1
//! serves the mock agent (each connection its own process, in the agents' folder of the test) and
//! `acp-host run --agent ws://...` (its bridge) drives it: the same result as a local run,
//! permissions decided by the client, nothing left running after a client vanishes mid-turn or
//! the server stops, a wrong or missing token refused before anything is spawned, the connection
//! bound, and the server's refusals to start unsafely. A client that stops reading (a raw
//! WebSocket client, raw `http://` requests) slows its agent down while the server's peak RSS
//! stays bounded, and gets every chunk once it reads again; a stalled one is dropped after
//! `--stall-timeout`; bad frames both ways; a batch whose lines name the server's URLs.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use acp_tests::{
    HANG_GUARD, agents_in, bin, code, host_run, line_channel, processes_in, run_to_end, stderr,
    stdout, suite_state, wait_for_file, wait_output, wait_until,
};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::common::{json_run, mock, records, result_record, temp};
use super::run::signal;

/// The token the suites' servers require.
const TOKEN: &str = "e2e-serve-token-0123456789";

/// A running `acp-host serve`: its URL, its stderr lines so far, the folder its agents run in.
struct Serve {
    child: Option<Child>,
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
    /// The agents' working directory: what [`agents_in`] counts.
    agents: tempfile::TempDir,
    /// The token file (also the client's).
    token: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// `acp-host serve` of `agent` with the suite's token (unless `extra` has
    /// `--insecure-no-auth`) and `extra` flags, once it listens.
    fn start(agent: &str, extra: &[&str]) -> Serve {
        Serve::launch(agent, extra, None)
    }

    /// [`Serve::start`], the server allowed at most `files` open descriptors.
    fn limited(agent: &str, extra: &[&str], files: u32) -> Serve {
        Serve::launch(agent, extra, Some(files))
    }

    fn launch(agent: &str, extra: &[&str], files: Option<u32>) -> Serve {
        let (dir, agents) = (temp(), temp());
        let token = dir.path().join("token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let mut cmd = serve_command(dir.path(), files);
        cmd.args(["--listen", "127.0.0.1:0", "--agent", agent, "--cwd"])
            .arg(agents.path());
        if !extra.contains(&"--insecure-no-auth") {
            cmd.arg("--token-file").arg(&token);
        }
        let mut child = cmd
            .args(["--eof-grace", "2", "--term-grace", "2"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("acp-host serve starts");
        let channel = line_channel(child.stderr.take().expect("stderr piped"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut url = None;
        let deadline = std::time::Instant::now() + HANG_GUARD;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = channel.recv_timeout(left) else {
                break;
            };
            lines.lock().unwrap().push(line.clone());
            if let Some(at) = line.strip_prefix("acp-host serve: listening on ") {
                url = at.split_whitespace().next().map(str::to_owned);
                break;
            }
        }
        let Some(url) = url else {
            let _ = child.kill();
            panic!("acp-host serve never listened: {:?}", lines.lock().unwrap());
        };
        let keep = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in channel {
                keep.lock().unwrap().push(line);
            }
        });
        Serve {
            child: Some(child),
            url,
            lines,
            agents,
            token,
            _dir: dir,
        }
    }

    /// `host:port` of the server.
    fn authority(&self) -> &str {
        let rest = self.url.strip_prefix("ws://").unwrap();
        rest.split_once('/')
            .map_or(rest, |(authority, _)| authority)
    }

    /// `acp-host run --json` in `dir` through this server, with the token.
    fn run(&self, dir: &Path) -> Command {
        let mut cmd = host_run(dir);
        cmd.args(["--json", "--agent", &self.url, "--token-file"])
            .arg(&self.token);
        cmd
    }

    /// Asserts no agent process is left in the agents' folder (within [`HANG_GUARD`]).
    fn assert_no_agents(&self) {
        assert!(
            wait_until(HANG_GUARD, || processes_in(self.agents.path()).is_empty()),
            "served agents left: {:?}",
            processes_in(self.agents.path())
        );
    }

    /// SIGTERM, then the server's output once it exited.
    fn stop(&mut self) -> std::process::Output {
        let child = self.child.take().expect("running");
        signal(&child, Signal::SIGTERM);
        wait_output(child)
    }

    /// The end of a test's serving: every served agent gone, then a SIGTERM the server exits 0
    /// on.
    fn finish(&mut self) {
        self.assert_no_agents();
        let out = self.stop();
        assert_eq!(code(&out), 0, "{}", self.stderr());
    }

    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `acp-host serve` in `dir`, environment as `host_run` sets it; with `files`, under that limit
/// of open descriptors (`ulimit -n`, then the shell execs it: the same pid).
fn serve_command(dir: &Path, files: Option<u32>) -> Command {
    let mut cmd = match files {
        None => Command::new(bin("acp-host")),
        Some(files) => {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", &format!("ulimit -n {files} && exec \"$0\" \"$@\"")])
                .arg(bin("acp-host"));
            cmd
        }
    };
    cmd.current_dir(dir)
        .env(protocol::env_vars::XDG_STATE_HOME, suite_state())
        .env_remove("ACP_HOST_LOG")
        .env_remove(protocol::env_vars::ACP_HOST_DEPTH)
        .env_remove(protocol::env_vars::ACP_HOST_MAX_DEPTH)
        .arg("serve");
    cmd
}

/// A result record without what differs between any two runs (ids, pids, durations) and what
/// names the agent (its command line, or the URL).
fn comparable(mut result: Value) -> Value {
    for key in ["runId", "durationMs", "agent", "provider", "pid"] {
        result.as_object_mut().unwrap().remove(key);
    }
    result
}

/// The records of a run, comparable: without the result, and the start event's pid/ids/agent.
fn comparable_records(records: &[Value]) -> Vec<Value> {
    records.iter().cloned().map(comparable).collect()
}

#[test]
fn a_run_through_serve_gives_the_local_result_with_permissions_decided_by_the_client() {
    let agent = mock(&["permission", "--count", "2"]);
    let mut serve = Serve::start(&agent, &[]);
    for policy in ["allow", "reject"] {
        // One folder for both: the session's cwd is in the records.
        let dir = temp();
        let (local_records, local) = json_run(
            host_run(dir.path())
                .args(["--json", "--permission", policy, "--agent", &agent])
                .arg("go"),
            0,
        );
        let (remote_records, remote) = json_run(
            serve
                .run(dir.path())
                .args(["--permission", policy])
                .arg("go"),
            0,
        );
        assert_eq!(remote["status"], "completed", "{remote}");
        // Both of the agent's questions crossed the connection and were decided by the client's
        // --permission.
        let decisions = remote["permissions"].as_array().unwrap();
        assert_eq!(decisions.len(), 2, "{remote}");
        assert!(
            decisions.iter().all(|d| d["verdict"] == policy
                && d["outcome"]["optionId"] == format!("{policy}_once").as_str()),
            "{remote}"
        );
        assert_eq!(comparable(remote), comparable(local));
        assert_eq!(
            comparable_records(&remote_records),
            comparable_records(&local_records)
        );
        assert_eq!(remote_records[0]["agent"], serve.url.as_str());
    }
    serve.finish();
}

#[test]
fn served_agents_run_in_the_servers_sandbox_each_with_its_own_temporary_folder() {
    let outside = temp();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tries = [
        ("write inside", "echo x > inside.txt".to_owned()),
        (
            "write outside",
            format!("echo x > {}/written", outside.path().display()),
        ),
        ("write temp", "f=$(mktemp) && rm \"$f\"".to_owned()),
        ("tcp", format!("exec 3<>/dev/tcp/127.0.0.1/{port}")),
    ];
    let agent = super::sandbox::prober(&tries);
    let mut serve = Serve::start(
        &agent,
        &["--sandbox", "workspace-write", "--network", "off"],
    );
    let dir = temp();
    let (_, result) = json_run(serve.run(dir.path()).arg("hi"), 0);
    assert_eq!(result["output"], "hello from acp child");
    assert_eq!(
        std::fs::read_to_string(serve.agents.path().join("probe.txt")).unwrap(),
        "write inside: ok\nwrite outside: denied\nwrite temp: ok\ntcp: denied\n"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    serve.finish();
    assert!(
        serve
            .stderr()
            .contains("sandbox workspace-write, network off, Landlock ABI"),
        "{}",
        serve.stderr()
    );
}

#[test]
fn a_client_vanishing_mid_turn_leaves_nothing_running_and_the_server_serves_on() {
    let (dir, flags) = (temp(), temp());
    let ready = flags.path().join("ready");
    let mut serve = Serve::start(
        &mock(&["hang", "--ready", &ready.display().to_string()]),
        // Over HTTP a vanished client is seen by its event stream's end, after this grace.
        &["--stream-grace", "1"],
    );
    // Over one WebSocket, and over POSTs with a server-sent event stream.
    for url in [serve.url.clone(), serve.url.replacen("ws://", "http://", 1)] {
        let host = acp_tests::spawn_until_ready(
            host_run(dir.path())
                .args(["--json", "--agent", &url, "--token-file"])
                .arg(&serve.token)
                .arg("go"),
            &ready,
            &format!("{url}: the served agent"),
        );
        assert_eq!(agents_in(serve.agents.path()).len(), 1, "{url}");
        // The client dies mid-turn: its watchdog ends the bridge, and the connection drops.
        signal(&host, Signal::SIGKILL);
        let out = wait_output(host);
        assert_eq!(out.status.code(), None, "{url}: killed by a signal");
        serve.assert_no_agents();
        assert!(
            wait_until(HANG_GUARD, || processes_in(dir.path()).is_empty()),
            "{url}: client processes left: {:?}",
            processes_in(dir.path())
        );
        std::fs::remove_file(&ready).unwrap();
    }
    // The server is still there for the next client.
    let next = serve
        .run(dir.path())
        .args(["--timeout", "1"])
        .arg("go")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(next);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert_eq!(result_record(&out)["output"], "partial ");
    serve.finish();
}

#[test]
fn stopping_the_server_mid_turn_tears_its_agents_down_and_the_client_sees_the_end() {
    let (dir, flags) = (temp(), temp());
    let ready = flags.path().join("ready");
    let mut serve = Serve::start(
        &mock(&["hang", "--ready", &ready.display().to_string()]),
        &[],
    );
    let host =
        acp_tests::spawn_until_ready(serve.run(dir.path()).arg("go"), &ready, "the served agent");
    let out = serve.stop();
    assert_eq!(code(&out), 0, "{}", serve.stderr());
    // The server exits only after its agents are gone.
    assert!(processes_in(serve.agents.path()).is_empty());
    let out = wait_output(host);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "error", "{result}");
    assert_eq!(result["output"], "partial ", "{result}");
}

/// The mock's `--record` file shows every process that started.
fn record_of(dir: &Path) -> PathBuf {
    dir.join("record")
}

#[test]
fn a_missing_or_wrong_token_is_refused_and_nothing_is_spawned() {
    let (dir, flags) = (temp(), temp());
    let record = record_of(flags.path());
    let serve = Serve::start(
        &mock(&["hello", "--record", &record.display().to_string()]),
        &[],
    );
    let wrong = flags.path().join("wrong");
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    for token in [None, Some(&wrong)] {
        let mut cmd = host_run(dir.path());
        cmd.args(["--json", "--agent", &serve.url]);
        if let Some(token) = token {
            cmd.arg("--token-file").arg(token);
        }
        let out = run_to_end(cmd.arg("hi"));
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        let result = result_record(&out);
        assert_eq!(result["status"], "error", "{result}");
        assert!(
            result["stderrTail"]
                .as_str()
                .unwrap()
                .contains("401 Unauthorized"),
            "{result}"
        );
        // The token is never printed, by either side.
        assert!(
            !stderr(&out).contains(TOKEN)
                && !records(&out).iter().any(|r| r.to_string().contains(TOKEN))
        );
    }
    // Plain HTTP without the token: 401 with a bearer challenge, before the transport sees it.
    let response = raw_request(
        serve.authority(),
        "POST /acp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\n{}",
    );
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    assert!(response.contains("www-authenticate: Bearer"), "{response}");
    assert!(
        !record.exists(),
        "an agent was spawned: {:?}",
        std::fs::read_to_string(&record)
    );
    assert!(processes_in(serve.agents.path()).is_empty());
    assert!(!serve.stderr().contains(TOKEN));
    // The right token still works, and spawned exactly one agent.
    let (_, result) = json_run(serve.run(dir.path()).arg("hi"), 0);
    assert_eq!(result["output"], "hello from acp child", "{result}");
    let starts = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        starts.lines().filter(|l| l.starts_with("start ")).count(),
        1,
        "{starts}"
    );
}

/// Sends `request` to `authority` over plain TCP; the whole response.
fn raw_request(authority: &str, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

#[test]
fn connections_past_max_connections_are_refused_without_a_spawn() {
    let (dir, flags) = (temp(), temp());
    let (ready, record) = (flags.path().join("ready"), record_of(flags.path()));
    let mut serve = Serve::start(
        &mock(&[
            "hang",
            "--ready",
            &ready.display().to_string(),
            "--record",
            &record.display().to_string(),
        ]),
        &["--max-connections", "1"],
    );
    let first = serve
        .run(dir.path())
        .arg("go")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for_file(&ready, HANG_GUARD),
        "the first agent never became ready"
    );
    let out = run_to_end(serve.run(dir.path()).arg("second"));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let result = result_record(&out);
    assert!(
        result["stderrTail"]
            .as_str()
            .unwrap()
            .contains("503 Service Unavailable"),
        "{result}"
    );
    let starts = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        starts.lines().filter(|l| l.starts_with("start ")).count(),
        1,
        "{starts}"
    );
    assert!(
        serve
            .stderr()
            .contains("refused a connection: every slot is taken"),
        "{}",
        serve.stderr()
    );
    signal(&first, Signal::SIGINT);
    let out = wait_output(first);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    serve.finish();
}

#[test]
fn serve_refuses_to_start_unsafely_and_run_refuses_a_token_without_a_url() {
    let dir = temp();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--insecure-no-auth", "--agent", "e2e-no-such-agent --flag"],
            "agent e2e-no-such-agent --flag not found: e2e-no-such-agent is neither a known agent",
        ),
        (&[], "acp-host serve needs a token: pass --token-file FILE"),
        (
            &["--insecure-no-auth", "--listen", "0.0.0.0:0"],
            "--insecure-no-auth is only allowed on a loopback address, not 0.0.0.0:0",
        ),
        (
            &["--token-file", "missing"],
            "--token-file: cannot read the token file",
        ),
        (
            &["--insecure-no-auth", "--max-connections", "0"],
            "--max-connections must be at least 1",
        ),
    ];
    for (args, message) in cases {
        let out = run_to_end(serve_command(dir.path(), None).args(args));
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
    }
    std::fs::write(dir.path().join("empty"), "\n").unwrap();
    let out = run_to_end(serve_command(dir.path(), None).args(["--token-file", "empty"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("the token file empty is empty"),
        "{}",
        stderr(&out)
    );
    // A token anyone could guess is refused; one others can read is warned about.
    std::fs::write(dir.path().join("short"), "x\n").unwrap();
    let out = run_to_end(serve_command(dir.path(), None).args(["--token-file", "short"]));
    assert_eq!(code(&out), 2);
    assert_eq!(
        stderr(&out),
        "acp-host: error: --token-file: the token in short is shorter than 16 bytes: anyone \
         could guess it (make one with `head -c 32 /dev/urandom | base64 > FILE`)\n"
    );
    let readable = dir.path().join("readable");
    std::fs::write(&readable, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(
        &readable,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let mut serve = serve_command(dir.path(), None)
        .args(["--listen", "127.0.0.1:0", "--token-file", "readable"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_channel(serve.stderr.take().unwrap());
    assert_eq!(
        lines.recv_timeout(HANG_GUARD).unwrap(),
        "acp-host serve: warning: the token file readable can be read by other users (mode 644); \
         make it yours alone: chmod 600 readable"
    );
    assert!(
        lines
            .recv_timeout(HANG_GUARD)
            .unwrap()
            .starts_with("acp-host serve: listening on ws://127.0.0.1:")
    );
    signal(&serve, Signal::SIGTERM);
    assert_eq!(serve.wait().unwrap().code(), Some(0));
    let out = run_to_end(host_run(dir.path()).args(["--token-file", "empty", "hi"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("--token-file and --token-env are for a remote agent"),
        "{}",
        stderr(&out)
    );
    let out = run_to_end(host_run(dir.path()).env_remove("E2E_NO_SUCH_TOKEN").args([
        "--agent",
        "ws://127.0.0.1:1/acp",
        "--token-env",
        "E2E_NO_SUCH_TOKEN",
        "hi",
    ]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("the token variable E2E_NO_SUCH_TOKEN is not set"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_token_from_the_environment_reaches_the_connection_only() {
    let (dir, flags) = (temp(), temp());
    let record = record_of(flags.path());
    let serve = Serve::start(
        &mock(&[
            "echo-env",
            "E2E_SERVE_TOKEN",
            "--record",
            &record.display().to_string(),
        ]),
        &[],
    );
    let out = run_to_end(host_run(dir.path()).env("E2E_SERVE_TOKEN", TOKEN).args([
        "--json",
        "--agent",
        &serve.url,
        "--token-env",
        "E2E_SERVE_TOKEN",
        "hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    // The served agent's environment is the server's: the client's token is not in it.
    assert_eq!(result["output"], "E2E_SERVE_TOKEN unset", "{result}");
    assert!(!stderr(&out).contains(TOKEN));
}

#[test]
fn the_bridge_relays_until_its_stdin_closes_and_a_bad_frame_leaves_the_connection_whole() {
    let serve = Serve::start(&mock(&["hello"]), &[]);
    let session_dir = temp();
    for url in [serve.url.clone(), serve.url.replacen("ws://", "http://", 1)] {
        let mut bridge = Command::new(bin("acp-host"))
            .args(["bridge", &url, "--token-file"])
            .arg(&serve.token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the bridge starts");
        let lines = line_channel(bridge.stdout.take().unwrap());
        let mut stdin = bridge.stdin.take().unwrap();
        let answer = |id: u64| {
            let deadline = std::time::Instant::now() + HANG_GUARD;
            let mut seen = Vec::new();
            loop {
                let left = deadline
                    .checked_duration_since(std::time::Instant::now())
                    .unwrap_or_else(|| panic!("{url}: no answer to {id}: {seen:?}"));
                let line = lines
                    .recv_timeout(left)
                    .unwrap_or_else(|_| panic!("{url}: the bridge's stdout ended: {seen:?}"));
                let frame: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|err| panic!("{url}: not a frame on stdout ({err}): {line}"));
                if frame["id"] == id {
                    return frame;
                }
                seen.push(frame);
            }
        };
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":7,"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
        )
        .unwrap();
        let init = answer(7);
        assert_eq!(init["result"]["protocolVersion"], 1, "{url}: {init}");
        assert_eq!(agents_in(serve.agents.path()).len(), 1, "{url}");
        // Not JSON (and, over a WebSocket, a batch: not part of ACP), then a real request: the
        // connection and the agent are still there for it. Over HTTP the server answers a
        // batch's POST with 400, which ends the SDK client's connection.
        writeln!(stdin, "this is not a frame").unwrap();
        if url.starts_with("ws://") {
            writeln!(stdin, "[1, 2]").unwrap();
        }
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":8,"method":"session/new","params":{{"cwd":{},"mcpServers":[]}}}}"#,
            Value::from(session_dir.path().display().to_string())
        )
        .unwrap();
        let session = answer(8);
        assert!(
            session["result"]["sessionId"].is_string(),
            "{url}: {session}"
        );
        assert_eq!(agents_in(serve.agents.path()).len(), 1, "{url}");
        // Its stdin closed (a run's teardown), the bridge closes the connection and ends; the
        // server tears the agent down.
        drop(stdin);
        let out = wait_output(bridge);
        assert_eq!(code(&out), 0, "{url}: {}", stderr(&out));
        serve.assert_no_agents();
    }
}

#[test]
fn an_http_turn_longer_than_the_stream_grace_completes() {
    let dir = temp();
    let serve = Serve::start(
        &mock(&["slow-stream", "--chunks", "3", "--interval-ms", "700"]),
        &["--stream-grace", "0.5"],
    );
    let http = serve.url.replacen("ws://", "http://", 1);
    // The client's event stream stays open through the turn: the grace never starts.
    let (_, result) = json_run(
        host_run(dir.path())
            .args(["--json", "--agent", &http, "--token-file"])
            .arg(&serve.token)
            .arg("go"),
        0,
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "c1 c2 c3 ", "{result}");
    serve.assert_no_agents();
}

/// A TLS terminator on 127.0.0.1 in front of `backend` (what a reverse proxy does for
/// `acp-host serve`), with a certificate for `localhost` signed by a CA made by `openssl`; `None`
/// (said on stderr) where `openssl` is not installed. `cert` is the CA a client trusts through
/// `SSL_CERT_FILE`.
struct TlsProxy {
    port: u16,
    cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsProxy {
    fn start(backend: &str) -> Option<TlsProxy> {
        use pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::{self, pki_types};
        let dir = temp();
        let path = |name: &str| dir.path().join(name);
        if !make_certificates(&path) {
            return None;
        }
        let (cert, key) = (path("cert.pem"), path("key.pem"));
        let chain = pki_types::CertificateDer::pem_file_iter(&cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = pki_types::PrivateKeyDer::from_pem_file(&key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let backend = backend.to_owned();
        // Lives as long as the test process: each test binary run ends it.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, backend) = (acceptor.clone(), backend.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    });
                }
            });
        });
        Some(TlsProxy {
            port,
            cert: path("ca.pem"),
            _dir: dir,
        })
    }
}

/// The CA (`ca.pem`) and the server's certificate (`cert.pem`, `key.pem`) it signs, where `path`
/// names them; `false` (said on stderr) where `openssl` is not installed.
fn make_certificates(path: &dyn Fn(&str) -> PathBuf) -> bool {
    std::fs::write(
        path("leaf.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    // A CA (what the client trusts) and the server's certificate it signs.
    let steps: [Vec<std::ffi::OsString>; 3] = [
        args(
            &["req", "-x509"],
            &ec,
            &["-days", "1", "-subj", "/CN=e2e-ca"],
        )
        .chain(paths(&[
            ("-keyout", path("ca.key")),
            ("-out", path("ca.pem")),
        ]))
        .collect(),
        args(&["req"], &ec, &["-subj", "/CN=localhost"])
            .chain(paths(&[
                ("-keyout", path("key.pem")),
                ("-out", path("leaf.csr")),
            ]))
            .collect(),
        args(&["x509", "-req", "-days", "1"], &[], &[])
            .chain(paths(&[
                ("-in", path("leaf.csr")),
                ("-CA", path("ca.pem")),
                ("-CAkey", path("ca.key")),
                ("-extfile", path("leaf.ext")),
                ("-out", path("cert.pem")),
            ]))
            .collect(),
    ];
    for step in steps {
        let made = Command::new("openssl")
            .args(&step)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match made {
            Ok(out) => assert!(out.status.success(), "openssl {step:?}: {}", stderr(&out)),
            Err(err) => {
                #[expect(clippy::print_stderr, reason = "a skipped test says why")]
                {
                    eprintln!("skipped: the TLS test needs openssl: {err}");
                }
                return false;
            }
        }
    }
    true
}

/// `openssl` arguments: `head`, `mid`, `tail`, as OS strings.
fn args<'a>(
    head: &'a [&str],
    mid: &'a [&str],
    tail: &'a [&str],
) -> impl Iterator<Item = std::ffi::OsString> + 'a {
    head.iter().chain(mid).chain(tail).map(Into::into)
}

/// `openssl` options naming files.
fn paths(pairs: &[(&str, PathBuf)]) -> impl Iterator<Item = std::ffi::OsString> {
    pairs
        .iter()
        .flat_map(|(flag, path)| {
            [
                std::ffi::OsString::from(flag),
                path.clone().into_os_string(),
            ]
        })
        .collect::<Vec<_>>()
        .into_iter()
}

#[test]
fn wss_and_https_through_a_tls_terminator_reach_the_served_agent() {
    let serve = Serve::start(&mock(&["hello"]), &[]);
    let Some(proxy) = TlsProxy::start(serve.authority()) else {
        return;
    };
    let dir = temp();
    for scheme in ["wss", "https"] {
        let url = format!("{scheme}://localhost:{}/acp", proxy.port);
        let (_, result) = json_run(
            host_run(dir.path())
                .env("SSL_CERT_FILE", &proxy.cert)
                .args(["--json", "--agent", &url, "--token-file"])
                .arg(&serve.token)
                .arg("hi"),
            0,
        );
        assert_eq!(result["output"], "hello from acp child", "{url}: {result}");
        // Without the certificate trusted, the connection is refused, not downgraded.
        let out = run_to_end(
            host_run(dir.path())
                .env_remove("SSL_CERT_FILE")
                .args(["--json", "--agent", &url, "--token-file"])
                .arg(&serve.token)
                .arg("hi"),
        );
        assert_eq!(code(&out), 1, "{url}: {}", stderr(&out));
        assert_eq!(result_record(&out)["status"], "error");
    }
    serve.assert_no_agents();
}

/// A WebSocket client of `acp-host serve` that reads only when the test says so: what a client
/// that stops reading (stuck, or on a link slower than its agent) looks like to the server.
struct WsClient {
    socket: tungstenite::WebSocket<std::net::TcpStream>,
}

impl WsClient {
    fn connect(serve: &Serve) -> WsClient {
        let stream = std::net::TcpStream::connect(serve.authority()).unwrap();
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let request = tungstenite::ClientRequestBuilder::new(serve.url.parse().unwrap())
            .with_header("Authorization", format!("Bearer {TOKEN}"));
        let (socket, _) = tungstenite::client(request, stream).expect("the upgrade is accepted");
        WsClient { socket }
    }

    fn send(&mut self, frame: &Value) {
        self.socket
            .send(tungstenite::Message::text(frame.to_string()))
            .unwrap();
    }

    /// The next frame from the agent.
    fn next(&mut self) -> Value {
        loop {
            match self.socket.read().expect("the connection is open") {
                tungstenite::Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).expect("a frame is JSON");
                }
                tungstenite::Message::Close(_) => panic!("the server closed the connection"),
                _ => {}
            }
        }
    }

    /// Frames up to the answer to request `id`: the notifications before it, and the answer.
    fn until_answer(&mut self, id: u64) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next();
            if frame["id"] == id && frame.get("method").is_none() {
                return (before, frame);
            }
            before.push(frame);
        }
    }

    /// `initialize` and `session/new` in `cwd`, then `session/prompt` sent (id 3): its session.
    fn start_prompt(&mut self, cwd: &Path) -> String {
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
        );
        self.until_answer(1);
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": {"cwd": cwd.display().to_string(), "mcpServers": []}}),
        );
        let (_, new) = self.until_answer(2);
        let session = new["result"]["sessionId"].as_str().unwrap().to_owned();
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}}),
        );
        session
    }
}

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`: the peak resident set).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Every chunk of the flood arrived, in order, and `server` (at `before` KiB when the flood
/// began) peaked under its bound while relaying it.
fn assert_flood_relayed(texts: &[&str], server: u32, before: u64) {
    assert_eq!(texts.len(), FLOOD_CHUNKS);
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(
            *text,
            acp_tests::mock::cli::flood_chunk(index, FLOOD_BYTES),
            "chunk {index}"
        );
    }
    let peak = status_kib(server, "VmHWM");
    assert!(
        peak < before + STALLED_GROWTH_KIB,
        "serve peaked at {peak} KiB from {before} KiB relaying 64 MiB"
    );
}

/// Bytes `pid` has written so far (`wchar` of `/proc/PID/io`).
fn written(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|line| line.strip_prefix("wchar: "))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// Waits until `pid` has written at least `least` bytes and then nothing for a second: it is
/// blocked on its full stdout. What it has written.
fn wait_blocked(pid: u32, at_least: u64) -> u64 {
    let quiet = std::time::Duration::from_secs(1);
    let (mut seen, mut since) = (written(pid), std::time::Instant::now());
    let blocked = wait_until(HANG_GUARD, || {
        let now = written(pid);
        if now != seen {
            (seen, since) = (now, std::time::Instant::now());
        }
        now >= at_least && since.elapsed() >= quiet
    });
    assert!(blocked, "agent {pid} never blocked: {seen} bytes written");
    seen
}

/// The only agent the server runs now.
fn the_agent(serve: &Serve) -> u32 {
    let mut agents = Vec::new();
    assert!(
        wait_until(HANG_GUARD, || {
            agents = agents_in(serve.agents.path());
            agents.len() == 1
        }),
        "agents: {agents:?}"
    );
    agents[0]
}

/// What the flood of [`FLOOD_CHUNKS`] chunks of [`FLOOD_BYTES`] sends: 64 MiB.
const FLOOD_CHUNKS: usize = 1024;
const FLOOD_BYTES: usize = 64 * 1024;

/// How much the server may grow while its client does not read (one frame in hand, the
/// transport's buffers; the kernel's socket buffers are not the server's memory).
const STALLED_GROWTH_KIB: u64 = 16 * 1024;

fn flood_agent() -> String {
    mock(&[
        "flood",
        "--chunks",
        &FLOOD_CHUNKS.to_string(),
        "--bytes",
        &FLOOD_BYTES.to_string(),
    ])
}

#[test]
fn a_client_that_stops_reading_slows_its_agent_down_and_the_server_stays_small() {
    let mut serve = Serve::start(&flood_agent(), &[]);
    let server = serve.child.as_ref().unwrap().id();
    let cwd = temp();
    let mut client = WsClient::connect(&serve);
    let session = client.start_prompt(cwd.path());
    let agent = the_agent(&serve);
    let before = status_kib(server, "VmRSS");
    // The client reads nothing: the agent is stopped by its full pipe long before its 64 MiB.
    let sent = wait_blocked(agent, 1024 * 1024);
    let total = u64::try_from(FLOOD_CHUNKS * FLOOD_BYTES).unwrap();
    assert!(sent < total / 2, "the agent wrote {sent} of {total} bytes");
    let peak = status_kib(server, "VmHWM");
    assert!(
        peak < before + STALLED_GROWTH_KIB,
        "serve peaked at {peak} KiB from {before} KiB while its client did not read"
    );
    // The client reads again: the turn ends with every chunk, in order.
    let (updates, answer) = client.until_answer(3);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let texts: Vec<&str> = updates
        .iter()
        .filter(|u| u["params"]["sessionId"] == session.as_str())
        .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_flood_relayed(&texts, server, before);
    client.socket.close(None).unwrap();
    serve.finish();
}

#[test]
fn a_stalled_client_is_dropped_after_the_stall_timeout_and_an_abrupt_disconnect_leaves_nothing() {
    // Taken for dead after a second of taking nothing.
    let mut serve = Serve::start(&flood_agent(), &["--stall-timeout", "1"]);
    let cwd = temp();
    let mut client = WsClient::connect(&serve);
    client.start_prompt(cwd.path());
    the_agent(&serve);
    serve.assert_no_agents();
    assert!(
        wait_until(HANG_GUARD, || {
            serve.stderr().contains(
            "the client took no frame of its agent for 1s (--stall-timeout): ending it and its agent"
        )
        }),
        "{}",
        serve.stderr()
    );
    drop(client);
    let out = serve.stop();
    assert_eq!(code(&out), 0, "{}", serve.stderr());

    // A client that vanishes while its agent is blocked on it: the socket's end is seen, the agent
    // torn down.
    let mut serve = Serve::start(&flood_agent(), &[]);
    let mut client = WsClient::connect(&serve);
    client.start_prompt(cwd.path());
    wait_blocked(the_agent(&serve), 1024 * 1024);
    drop(client);
    serve.assert_no_agents();
    // And the server serves the next client.
    let mut next = WsClient::connect(&serve);
    next.send(
        &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
    );
    let (_, init) = next.until_answer(1);
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    drop(next);
    serve.finish();
}

/// An `http://` client of `acp-host serve` on raw sockets: POSTs, and event streams it reads
/// only when the test says so.
struct HttpClient {
    authority: String,
    connection: String,
}

/// One server-sent event stream, read line by line.
struct EventStream {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl EventStream {
    /// The next event's frame (keep-alives and chunk sizes skipped).
    fn next(&mut self) -> Value {
        use std::io::BufRead as _;
        loop {
            let mut line = String::new();
            let read = self
                .reader
                .read_line(&mut line)
                .expect("the stream is open");
            assert!(read > 0, "the event stream ended");
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return serde_json::from_str(data).expect("an event is a frame");
            }
        }
    }

    fn until_answer(&mut self, id: u64) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next();
            if frame["id"] == id && frame.get("method").is_none() {
                return (before, frame);
            }
            before.push(frame);
        }
    }
}

impl HttpClient {
    /// `initialize` by POST: the connection it starts.
    fn connect(serve: &Serve) -> HttpClient {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;
        let response = raw_request(serve.authority(), &post(init, None, None));
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        let connection = response
            .lines()
            .find_map(|line| line.strip_prefix("acp-connection-id: "))
            .expect("a connection id")
            .trim()
            .to_owned();
        HttpClient {
            authority: serve.authority().to_owned(),
            connection,
        }
    }

    fn post(&self, frame: &Value, session: Option<&str>) {
        let response = raw_request(
            &self.authority,
            &post(&frame.to_string(), Some(&self.connection), session),
        );
        assert!(response.starts_with("HTTP/1.1 202"), "{response}");
    }

    /// Opens the connection's event stream, or a session's.
    fn events(&self, session: Option<&str>) -> EventStream {
        let mut stream = std::net::TcpStream::connect(&self.authority).unwrap();
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let session = session.map_or_else(String::new, |id| format!("Acp-Session-Id: {id}\r\n"));
        write!(
            stream,
            "GET /acp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Accept: text/event-stream\r\nAcp-Connection-Id: {}\r\n{session}\r\n",
            self.connection
        )
        .unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut status = String::new();
        std::io::BufRead::read_line(&mut reader, &mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        EventStream { reader }
    }
}

/// A POST of `body` with the suite's token.
fn post(body: &str, connection: Option<&str>, session: Option<&str>) -> String {
    let headers: String = [
        ("Acp-Connection-Id", connection),
        ("Acp-Session-Id", session),
    ]
    .iter()
    .filter_map(|(name, value)| value.map(|id| format!("{name}: {id}\r\n")))
    .collect();
    format!(
        "POST /acp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
        body.len()
    )
}

#[test]
fn an_http_client_that_stops_reading_slows_its_agent_down_and_a_dead_one_is_dropped() {
    for stall in [None, Some("1")] {
        let mut extra = vec!["--stream-grace", "1"];
        extra.extend(stall.iter().flat_map(|s| ["--stall-timeout", s]));
        let mut serve = Serve::start(&flood_agent(), &extra);
        let server = serve.child.as_ref().unwrap().id();
        let cwd = temp();
        let client = HttpClient::connect(&serve);
        let mut events = client.events(None);
        client.post(
            &serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                "params": {"cwd": cwd.path().display().to_string(), "mcpServers": []}}),
            None,
        );
        let (_, new) = events.until_answer(2);
        let session = new["result"]["sessionId"].as_str().unwrap().to_owned();
        let agent = the_agent(&serve);
        let before = status_kib(server, "VmRSS");
        // The prompt's updates go to the session's event stream, which nobody reads yet.
        client.post(
            &serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                "params": {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}}),
            Some(&session),
        );
        if stall.is_some() {
            // Taken for dead: the connection and its agent end.
            serve.assert_no_agents();
            assert!(
                wait_until(HANG_GUARD, || {
                    serve.stderr().contains(
                    "the client took none of its agent's output for 1s (acp-host serve --stall-timeout): ending it and its agent"
                )
                }),
                "{}",
                serve.stderr()
            );
            let out = serve.stop();
            assert_eq!(code(&out), 0, "{}", serve.stderr());
            continue;
        }
        let sent = wait_blocked(agent, 1024 * 1024);
        let total = u64::try_from(FLOOD_CHUNKS * FLOOD_BYTES).unwrap();
        assert!(sent < total / 2, "the agent wrote {sent} of {total} bytes");
        let peak = status_kib(server, "VmHWM");
        assert!(
            peak < before + STALLED_GROWTH_KIB,
            "serve peaked at {peak} KiB from {before} KiB while its client did not read"
        );
        // The client opens the session's stream and reads: every chunk, in order.
        let mut updates = client.events(Some(&session));
        let (frames, answer) = updates.until_answer(3);
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        let texts: Vec<&str> = frames
            .iter()
            .filter_map(|u| u["params"]["update"]["content"]["text"].as_str())
            .collect();
        assert_flood_relayed(&texts, server, before);
        // Both streams dropped: after the grace, the connection and its agent end.
        drop((events, updates));
        serve.finish();
    }
}

#[test]
fn a_batch_runs_its_url_lines_through_serve_with_the_token_and_leaves_nothing() {
    let (dir, flags) = (temp(), temp());
    let record = record_of(flags.path());
    let mut serve = Serve::start(
        &mock(&["echo-prompt", "--record", &record.display().to_string()]),
        &["--max-connections", "4"],
    );
    let http = serve.url.replacen("ws://", "http://", 1);
    // Lines without `agent` take --agent's URL; one names the http:// URL, one a local agent
    // (which gets no token).
    let mut lines: Vec<Value> = (1..=6)
        .map(|n| serde_json::json!({"id": format!("r{n}"), "prompt": format!("p{n}")}))
        .collect();
    lines[1]["agent"] = Value::from(http.as_str());
    lines[2]["agent"] = Value::from(mock(&["echo-prompt"]));
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    super::batch::jobs_file(dir.path(), &text);
    let batch = |token: &[&str]| {
        let mut cmd = super::batch::batch(dir.path());
        cmd.args(["--jobs", "3", "--agent", &serve.url])
            .args(token)
            .arg("jobs.ndjson");
        cmd
    };
    let token_file = serve.token.display().to_string();
    for token in [
        vec!["--token-file", token_file.as_str()],
        vec!["--token-env", "E2E_BATCH_TOKEN"],
    ] {
        let out = run_to_end(batch(&token).env("E2E_BATCH_TOKEN", TOKEN));
        assert_eq!(code(&out), 0, "{token:?}: {}", stderr(&out));
        let records = records(&out);
        super::batch::checked(&records);
        let mut seen: Vec<(String, String)> = records
            .iter()
            .map(|r| {
                assert_eq!(r["status"], "completed", "{r}");
                (
                    r["id"].as_str().unwrap().to_owned(),
                    r["output"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        seen.sort();
        let expected: Vec<(String, String)> = (1..=6)
            .map(|n| (format!("r{n}"), format!("p{n}")))
            .collect();
        assert_eq!(seen, expected);
        // Five lines crossed the connection: the server spawned five agents.
        let starts = std::fs::read_to_string(&record).unwrap();
        assert_eq!(
            starts.lines().filter(|l| l.starts_with("start ")).count(),
            5,
            "{starts}"
        );
        assert!(!stderr(&out).contains(TOKEN) && !stdout(&out).contains(TOKEN));
        serve.assert_no_agents();
        super::batch::assert_no_process_left(dir.path());
        // Removed once every served agent is gone: each writes `end` to it as it exits.
        std::fs::remove_file(&record).unwrap();
    }
    // Without the token every remote line's record says why; nothing was spawned.
    let out = run_to_end(&mut batch(&[]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let records = records(&out);
    let refused: Vec<&Value> = records.iter().filter(|r| r["status"] == "error").collect();
    assert_eq!(refused.len(), 5, "{records:?}");
    assert!(
        refused.iter().all(|r| r["stderrTail"]
            .as_str()
            .unwrap()
            .contains("401 Unauthorized")),
        "{refused:?}"
    );
    assert!(!record.exists());
    // A token nobody would use, or one that cannot be read, is refused before anything runs.
    let local = super::batch::batch(dir.path())
        .args(["--agent", &mock(&["echo-prompt"]), "--token-file"])
        .arg(&serve.token)
        .arg("-")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&local), 2);
    assert!(
        stderr(&local)
            .contains("--token-file and --token-env are for lines whose agent is a remote URL"),
        "{}",
        stderr(&local)
    );
    let unset =
        run_to_end(batch(&["--token-env", "E2E_NO_SUCH_TOKEN"]).env_remove("E2E_NO_SUCH_TOKEN"));
    assert_eq!(code(&unset), 2);
    assert!(
        stderr(&unset).contains("--token-env: the token variable E2E_NO_SUCH_TOKEN is not set"),
        "{}",
        stderr(&unset)
    );
    assert!(!record.exists());
    super::batch::assert_no_process_left(dir.path());
    let out = serve.stop();
    assert_eq!(code(&out), 0, "{}", serve.stderr());
}

#[test]
fn an_agent_frame_that_is_not_utf8_is_relayed_as_a_local_run_decodes_it() {
    let agent = mock(&["bad-utf8"]);
    let mut serve = Serve::start(&agent, &[]);
    let dir = temp();
    let (_, local) = json_run(
        host_run(dir.path())
            .args(["--json", "--agent", &agent])
            .arg("hi"),
        0,
    );
    assert!(
        local["output"].as_str().unwrap().starts_with("caf\u{fffd}"),
        "{local}"
    );
    for url in [serve.url.clone(), serve.url.replacen("ws://", "http://", 1)] {
        let (_, remote) = json_run(
            host_run(dir.path())
                .args(["--json", "--agent", &url, "--token-file"])
                .arg(&serve.token)
                .arg("hi"),
            0,
        );
        assert_eq!(remote["output"], local["output"], "{url}: {remote}");
    }
    serve.finish();
}

#[test]
fn a_websocket_upgrade_from_a_browser_origin_is_refused_and_nothing_is_spawned() {
    let flags = temp();
    let record = record_of(flags.path());
    let serve = Serve::start(
        &mock(&["hello", "--record", &record.display().to_string()]),
        &[],
    );
    // A web page's WebSocket carries its Origin; with the right token it is still refused.
    let response = raw_request(
        serve.authority(),
        &format!(
            "GET /acp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nUpgrade: websocket\r\n\
             Connection: close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\nOrigin: http://page.example\r\n\r\n"
        ),
    );
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("requests from browser pages are refused"),
        "{response}"
    );
    assert!(!record.exists(), "an agent was spawned");
    assert!(processes_in(serve.agents.path()).is_empty());
}

/// A raw `initialize` POST to `/acp` with `headers` (each `Name: value\r\n`).
fn initialize_with(headers: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;
    format!(
        "POST /acp HTTP/1.1\r\n{headers}Content-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn a_web_page_after_dns_rebinding_is_refused_on_every_route_and_nothing_is_spawned() {
    let (dir, flags) = (temp(), temp());
    let record = record_of(flags.path());
    let mut serve = Serve::start(
        &mock(&["hello", "--record", &record.display().to_string()]),
        &["--insecure-no-auth"],
    );
    let port = serve.authority().rsplit(':').next().unwrap().to_owned();
    let foreign = format!("Host: rebound.attacker.example:{port}\r\n");
    let page = format!("Origin: http://rebound.attacker.example:{port}\r\n");
    let loopback = format!("Host: 127.0.0.1:{port}\r\n");
    // What a page's fetch sends once its name resolves to 127.0.0.1: its own Host, and its
    // Origin on a POST; a cross-origin page sends a loopback Host with its Origin.
    for (headers, refusal) in [
        (
            format!("{foreign}{page}"),
            "requests from browser pages are refused",
        ),
        (foreign.clone(), "answers only requests to a loopback host"),
        (
            format!("{loopback}{page}"),
            "requests from browser pages are refused",
        ),
    ] {
        let response = raw_request(serve.authority(), &initialize_with(&headers));
        assert!(
            response.starts_with("HTTP/1.1 403"),
            "{headers}: {response}"
        );
        assert!(response.contains(refusal), "{response}");
    }
    for (headers, status) in [(&foreign, "HTTP/1.1 403"), (&loopback, "HTTP/1.1 200")] {
        let response = raw_request(
            serve.authority(),
            &format!("GET /health HTTP/1.1\r\n{headers}Connection: close\r\n\r\n"),
        );
        assert!(response.starts_with(status), "{headers}: {response}");
    }
    assert!(
        !record.exists(),
        "an agent was spawned: {:?}",
        std::fs::read_to_string(&record)
    );
    // A client of the transport names the loopback address it dials: served, one agent.
    let (_, result) = json_run(
        host_run(dir.path()).args(["--json", "--agent", &serve.url, "hi"]),
        0,
    );
    assert_eq!(result["output"], "hello from acp child", "{result}");
    let starts = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        starts.lines().filter(|l| l.starts_with("start ")).count(),
        1,
        "{starts}"
    );
    serve.finish();
}

/// The kernel's timer on the server's side of the TCP connection from `client` to
/// `server` (both on 127.0.0.1), from `/proc/net/tcp`: its kind (`tr`: 2 is keepalive) and the
/// seconds left on it.
fn server_side_timer(server: &str, client: std::net::SocketAddr) -> Option<(u32, f64)> {
    let port = |authority: &str| u16::from_str_radix(authority.rsplit(':').next()?, 16).ok();
    let server_port: u16 = server.rsplit(':').next()?.parse().ok()?;
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // local address, remote address, state 01 = ESTABLISHED, then tr:tm->when.
        let ours = port(fields.get(1)?)? == server_port
            && port(fields.get(2)?)? == client.port()
            && *fields.get(3)? == "01";
        let (kind, when) = fields.get(5)?.split_once(':')?;
        let ticks = u64::from_str_radix(when, 16).ok()?;
        #[expect(
            clippy::cast_precision_loss,
            reason = "ticks left on a timer of seconds"
        )]
        ours.then(|| (u32::from_str_radix(kind, 16).ok(), ticks as f64 / 100.0))
            .and_then(|(kind, left)| Some((kind?, left)))
    })
}

#[test]
fn an_idle_connection_is_probed_so_a_vanished_client_cannot_hold_its_slot() {
    // The kernel probes a quiet connection after --stall-timeout: a client gone without a FIN
    // (its machine off, a NAT that forgot it) fails its probes and its agent is torn down.
    let mut serve = Serve::start(&mock(&["echo-prompt"]), &["--stall-timeout", "30"]);
    let client = WsClient::connect(&serve);
    let local = client.socket.get_ref().local_addr().unwrap();
    let mut seen = None;
    assert!(
        wait_until(HANG_GUARD, || {
            seen = server_side_timer(serve.authority(), local);
            seen.is_some_and(|(kind, _)| kind == 2)
        }),
        "no keepalive timer on the server's side of {local}: {seen:?}"
    );
    let (_, left) = seen.unwrap();
    assert!(
        left > 0.0 && left <= 30.0,
        "the first probe is due in {left}s"
    );
    drop(client);
    serve.finish();
}

/// A WebSocket server on 127.0.0.1 that floods its one client with `frames` notifications of
/// `bytes` each, answering nothing (the handshake never ends), says so on `flooded` once the
/// socket took them all, then closes the connection when `close` says. Its URL.
fn flooding_server(
    frames: usize,
    bytes: usize,
) -> (
    String,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}/acp", listener.local_addr().unwrap());
    let (flooded_tx, flooded) = std::sync::mpsc::channel();
    let (close, close_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let Ok(mut socket) = tungstenite::accept(stream) else {
            return;
        };
        let frame = serde_json::json!({"jsonrpc": "2.0", "method": "_flood",
            "params": {"pad": "x".repeat(bytes)}})
        .to_string();
        for _ in 0..frames {
            if socket
                .send(tungstenite::Message::text(frame.clone()))
                .is_err()
            {
                return;
            }
        }
        let _ = flooded_tx.send(());
        let _ = close_rx.recv_timeout(HANG_GUARD);
        let _ = socket.close(None);
        let _ = socket.flush();
    });
    (url, flooded, close)
}

/// Frames of a flooding server (64 MiB), and how much the bridge may grow from its start while
/// its run reads them (its runtime, its HTTP client, a frame in hand; it held the whole flood
/// when it queued without a bound).
const BRIDGE_FLOOD_FRAMES: usize = 1024;
const BRIDGE_GROWTH_KIB: u64 = 48 * 1024;

#[test]
fn a_server_that_floods_the_bridge_is_slowed_down_and_the_bridge_stays_small() {
    let dir = temp();
    let (url, flooded, close) = flooding_server(BRIDGE_FLOOD_FRAMES, FLOOD_BYTES);
    let run = host_run(dir.path())
        .args(["--json", "--agent", &url, "hi"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut bridge = Vec::new();
    assert!(
        wait_until(HANG_GUARD, || {
            bridge = agents_in(dir.path());
            bridge.retain(|pid| *pid != run.id());
            bridge.len() == 1
        }),
        "bridge: {bridge:?}"
    );
    let bridge = bridge[0];
    let before = status_kib(bridge, "VmRSS");
    // All of it sent: the bridge reads a frame only once its stdout took the last one.
    flooded
        .recv_timeout(HANG_GUARD * 2)
        .expect("the flood was sent");
    let peak = status_kib(bridge, "VmHWM");
    close.send(()).unwrap();
    let out = wait_output(run);
    assert!(
        peak < before + BRIDGE_GROWTH_KIB,
        "the bridge peaked at {peak} KiB from {before} KiB while a server flooded it"
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(processes_in(dir.path()).is_empty());
}

/// Sockets an attacker opens and never finishes a request on, against a server allowed
/// [`GATED_FILES`] descriptors.
const HALF_OPEN: usize = 400;
const GATED_FILES: u32 = 256;

#[test]
fn half_open_connections_are_capped_and_timed_out_so_health_and_clients_are_served() {
    let dir = temp();
    let mut serve = Serve::limited(&mock(&["hello"]), &["--header-timeout", "2"], GATED_FILES);
    // Half of them send the start of a request, the others nothing at all.
    let mut held: Vec<std::net::TcpStream> = (0..HALF_OPEN)
        .map(|index| {
            let mut socket = std::net::TcpStream::connect(serve.authority()).unwrap();
            if index % 2 == 0 {
                socket
                    .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            socket
        })
        .collect();
    // The server is not starved of descriptors: it answers at once, and serves a client.
    let response = raw_request(
        serve.authority(),
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok"), "{response}");
    let (_, result) = json_run(serve.run(dir.path()).arg("hi"), 0);
    assert_eq!(result["output"], "hello from acp child", "{result}");
    // Every held socket is closed by the server: the oldest past the cap at once, the rest
    // after --header-timeout.
    for (index, socket) in held.iter_mut().enumerate() {
        socket.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let mut byte = [0_u8; 1];
        let read = socket.read(&mut byte);
        assert!(
            matches!(read, Ok(0))
                || read
                    .as_ref()
                    .is_err_and(|err| err.kind() == std::io::ErrorKind::ConnectionReset),
            "socket {index}: {read:?}"
        );
    }
    serve.finish();
}

/// POSTs of [`FLOOD_BYTES`] a client sends while its agent reads none (32 MiB), at most.
const POST_FLOOD: usize = 512;

#[test]
fn an_http_client_posting_faster_than_its_agent_reads_is_slowed_down_then_refused() {
    // An agent that answers `initialize`, then never reads its stdin again.
    let script = "read -r line; printf '%s\\n' \
        '{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":1,\"agentCapabilities\":{}}}'; \
        exec sleep 1000";
    let agent = shell_words::join(["sh", "-c", script]);
    let mut serve = Serve::start(&agent, &["--stall-timeout", "1", "--stream-grace", "1"]);
    let server = serve.child.as_ref().unwrap().id();
    let client = HttpClient::connect(&serve);
    let events = client.events(None);
    let before = status_kib(server, "VmRSS");
    let frame = serde_json::json!({"jsonrpc": "2.0", "method": "_flood",
        "params": {"pad": "x".repeat(FLOOD_BYTES)}})
    .to_string();
    let mut accepted = 0;
    let refused = (0..POST_FLOOD).find_map(|_| {
        let response = raw_request(
            serve.authority(),
            &post(&frame, Some(&client.connection), None),
        );
        if response.starts_with("HTTP/1.1 202") {
            accepted += 1;
            None
        } else {
            Some(response)
        }
    });
    let peak = status_kib(server, "VmHWM");
    // What waits: the transport's share (4 MiB), the agent's stdin queue (64 frames), its pipe.
    assert!(
        (64..=160).contains(&accepted),
        "{accepted} POSTs accepted while the agent read none"
    );
    let refused = refused.expect("a POST past the bound is refused");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("the agent read none of this connection's messages for 1s"),
        "{refused}"
    );
    assert!(
        peak < before + STALLED_GROWTH_KIB,
        "serve peaked at {peak} KiB from {before} KiB while a client posted {accepted} messages"
    );
    drop(events);
    serve.finish();
}

#[test]
fn secrets_in_a_remote_agents_url_never_reach_the_runs_events_or_result() {
    let dir = temp();
    // Nothing listens there: the bridge fails, and says so with the address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://bob:url-secret-1234@127.0.0.1:{port}/acp?token=query-secret-5678");
    let out = run_to_end(host_run(dir.path()).args(["--json", "--agent", &url, "hi"]));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let shown = format!("ws://[redacted]@127.0.0.1:{port}/acp?token=[redacted]");
    let all = format!("{}{}", stdout(&out), stderr(&out));
    for secret in ["url-secret-1234", "query-secret-5678"] {
        assert!(!all.contains(secret), "{secret} shown: {all}");
    }
    let end = records(&out);
    assert_eq!(end[0]["type"], "end", "{end:?}");
    assert_eq!(end[0]["provider"], shown, "{end:?}");
    let result = result_record(&out);
    assert!(
        result["stderrTail"]
            .as_str()
            .unwrap()
            .contains(&format!("connection refused to 127.0.0.1:{port}: ")),
        "{result}"
    );
    assert!(processes_in(dir.path()).is_empty());
    // A run that reaches its server names it the same way from its start.
    let mut serve = Serve::start(&mock(&["hello"]), &[]);
    let url = format!("{}?token=query-secret-5678", serve.url);
    let (records, result) = json_run(
        host_run(dir.path())
            .args(["--json", "--token-file"])
            .arg(&serve.token)
            .args(["--agent", &url, "hi"]),
        0,
    );
    assert_eq!(result["output"], "hello from acp child", "{result}");
    let shown = format!("{}?token=[redacted]", serve.url);
    assert_eq!(records[0]["type"], "start", "{records:?}");
    assert_eq!(records[0]["agent"], shown, "{records:?}");
    assert!(
        !records
            .iter()
            .any(|r| r.to_string().contains("query-secret-5678")),
        "{records:?}"
    );
    serve.finish();
}
