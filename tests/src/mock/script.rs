//! What each scenario does with a `session/prompt` turn. Pure helpers (chunk splitting,
//! permission request shape, outcome wording) are separate functions, unit-tested below.

use std::time::Duration;

use serde_json::{Value, json};

use super::agent::Agent;
use super::cli::{DEFAULT_PERMISSION_OPTIONS, EscapeeThen, Scenario};
use super::wire;

const HELLO: &str = "hello from acp child";

/// What a hang-like scenario does once `session/cancel` arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnCancel {
    /// Answer the pending prompt with `cancelled` (a cooperative agent).
    Answer,
    /// Keep waiting.
    Ignore,
    /// Exit with status 9 (tears the pipe mid-turn).
    Crash,
}

impl Agent {
    #[expect(
        clippy::too_many_lines,
        reason = "a dispatch table: one short arm per scenario reads best in one place"
    )]
    pub(super) async fn prompt(&mut self, id: &Value, params: &Value) {
        self.cancelled = false;
        let session = params
            .get("sessionId")
            .and_then(Value::as_str)
            .unwrap_or(wire::SESSION_ID)
            .to_owned();
        let session = session.as_str();
        for (path, text) in &self.common.write_files {
            if let Err(error) = std::fs::write(path, text) {
                eprintln!("mock: cannot write {}: {error}", path.display());
            }
        }
        if ready_at_prompt(&self.scenario) {
            self.touch_ready();
        }
        match self.scenario.clone() {
            // `silent` never gets here; the gated, id-less and pre-init ones only differ
            // before the prompt.
            Scenario::Hello
            | Scenario::Garbage
            | Scenario::FlushOnEof { .. }
            | Scenario::TermMarker { .. }
            | Scenario::GatedSession { .. }
            | Scenario::NoSessionId
            | Scenario::AuthRequired { .. }
            | Scenario::ExitBeforeInit { .. }
            | Scenario::Silent
            | Scenario::Escapee {
                then: EscapeeThen::Answer,
                ..
            } => self.reply(id, session, [HELLO], "end_turn").await,
            Scenario::Stubborn => {
                self.reply(id, session, [HELLO], "end_turn").await;
                self.touch_ready();
            }
            Scenario::Text { text, stop, chunks } => {
                self.reply(id, session, split_chunks(&text, chunks), &stop)
                    .await;
            }
            Scenario::Thought => self.thought(id, session).await,
            Scenario::Hang
            | Scenario::Grandchild
            | Scenario::Escapee {
                then: EscapeeThen::Hang,
                ..
            } => {
                let on_cancel = if self.common.ignore_cancel {
                    OnCancel::Ignore
                } else {
                    OnCancel::Answer
                };
                self.hang(id, session, on_cancel).await;
            }
            Scenario::IgnoreCancel => self.hang(id, session, OnCancel::Ignore).await,
            Scenario::CrashOnCancel => self.hang(id, session, OnCancel::Crash).await,
            Scenario::CrashOnPrompt => {
                self.say(session, "partial output").await;
                eprintln!("mock: fatal error");
                std::process::exit(3);
            }
            Scenario::Permission { options, count } => {
                self.permission(id, session, &options, count).await;
            }
            Scenario::PermissionAfterCancel => self.permission_after_cancel(id, session).await,
            Scenario::Huge { bytes } => {
                self.reply(id, session, ["x".repeat(bytes)], "end_turn")
                    .await;
            }
            Scenario::EchoCwd => {
                let process = std::env::current_dir().map_or_else(
                    |error| format!("<unavailable: {error}>"),
                    |cwd| cwd.display().to_string(),
                );
                let announced = self.session_cwd.as_deref().unwrap_or("<none>");
                let text = format!("process: {process}\nsession: {announced}");
                self.reply(id, session, [text], "end_turn").await;
            }
            Scenario::EchoEnv { names } => {
                let lines: Vec<String> = names.iter().map(|name| env_line(name)).collect();
                self.reply(id, session, [lines.join("\n")], "end_turn")
                    .await;
            }
            Scenario::FsRequest => self.fs_request(id, session).await,
            Scenario::EchoPrompt => {
                self.reply(id, session, [prompt_text(params)], "end_turn")
                    .await;
            }
            Scenario::SessionEcho => {
                let text = format!("session {session}");
                self.reply(id, session, [text], "end_turn").await;
            }
            Scenario::GatedPrompt { go } => {
                self.say(session, "waiting for go\n").await;
                self.gate(&go).await;
                self.reply(id, session, ["released"], "end_turn").await;
            }
            Scenario::SlowStream { chunks, interval } => {
                self.slow_stream(id, session, chunks, interval).await;
            }
            Scenario::Escapee {
                then: EscapeeThen::Exit,
                ..
            } => std::process::exit(0),
            Scenario::ProbeFd { fd } => self.reply(id, session, [probe_fd(fd)], "end_turn").await,
            Scenario::OpencodeUsage { tokens, cost } => {
                self.opencode_usage(id, session, tokens, cost.parse().unwrap_or(0.0))
                    .await;
            }
            Scenario::PermissionRaw { options } => self.permission_raw(id, session, options).await,
            Scenario::ForeignSession => self.foreign_session(id, session).await,
            Scenario::EchoInitialize => {
                let info = self.initialize.get("clientInfo").cloned();
                let text = info.unwrap_or_default().to_string();
                self.reply(id, session, [text], "end_turn").await;
            }
            Scenario::AncestorEnviron => {
                self.reply(id, session, [ancestor_environ()], "end_turn")
                    .await;
            }
            Scenario::Flood { chunks, bytes } => {
                let texts = (0..chunks).map(|index| super::cli::flood_chunk(index, bytes));
                self.reply(id, session, texts, "end_turn").await;
            }
            Scenario::BadUtf8 => self.bad_utf8(id, session).await,
            Scenario::Answers { answers } => {
                let answer = answers
                    .get(self.prompts)
                    .or(answers.last())
                    .cloned()
                    .unwrap_or_default();
                self.prompts += 1;
                let captured = self
                    .new_session
                    .pointer("/_meta/acp-host~1start/outputSchema")
                    .is_some()
                    .then(|| serde_json::from_str::<Value>(&answer).ok())
                    .flatten();
                if answer == "{hang}" {
                    self.hang(id, session, OnCancel::Answer).await;
                } else if let Some(value) = captured {
                    // Asked for a structured answer through the start extension: the value goes
                    // in the prompt response, as a capture tool's would.
                    self.say(session, "captured").await;
                    let result = json!({"stopReason": "end_turn",
                                        "_meta": {"acp-host/start": {"structured": value}}});
                    self.send(&wire::response(id, result)).await;
                } else {
                    let text = answer.replace("{prompt}", &prompt_text(params));
                    self.reply(id, session, [text], "end_turn").await;
                }
            }
            Scenario::Configurable { .. } => {
                let field = |key: &str| {
                    self.new_session
                        .get(key)
                        .cloned()
                        .unwrap_or(Value::Null)
                        .to_string()
                };
                let text = format!(
                    "model {}\nsystemPrompt {}\nmeta {}\nprompt {}",
                    self.model.as_deref().unwrap_or("none"),
                    field("systemPrompt"),
                    field("_meta"),
                    prompt_text(params)
                );
                self.reply(id, session, [text], "end_turn").await;
            }
            Scenario::Batch => self.batch(id, session).await,
        }
    }
}

/// The prompt's text blocks, one per line.
fn prompt_text(params: &Value) -> String {
    let texts: Vec<&str> = params
        .get("prompt")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    texts.join("\n")
}

impl Agent {
    /// Frames with one byte that is not UTF-8 each, written raw.
    async fn bad_utf8(&mut self, id: &Value, session: &str) {
        let chunk = wire::session_update(session, wire::text_chunk("agent_message_chunk", "caf@"));
        let answer = wire::response(
            id,
            json!({"stopReason": "end_turn", "_meta": {"note": "@"}}),
        );
        for frame in [chunk, answer] {
            let mut bytes = serde_json::to_vec(&frame).unwrap_or_default();
            // `@` stands in for the bad byte: Latin-1 `é`, never valid UTF-8 on its own.
            for byte in &mut bytes {
                if *byte == b'@' {
                    *byte = 0xE9;
                }
            }
            self.send_raw(&bytes).await;
        }
    }

    /// A batch array of one request; the answer is reported as text.
    async fn batch(&mut self, id: &Value, session: &str) {
        let request = wire::request(
            7,
            "fs/read_text_file",
            json!({"sessionId": session, "path": "/dev/null"}),
        );
        self.send_raw(Value::Array(vec![request]).to_string().as_bytes())
            .await;
        let answer = self.response_to_null_id().await;
        let text = format!("batch: {}", describe_reply(&answer));
        self.reply(id, session, [text], "end_turn").await;
    }

    /// The chunk is sent before `--ready` is touched, so a test that cancels on ready knows
    /// the partial text is already on the wire.
    async fn hang(&mut self, id: &Value, session: &str, on_cancel: OnCancel) {
        self.say(session, "partial ").await;
        self.touch_ready();
        loop {
            self.until_cancelled().await;
            match on_cancel {
                OnCancel::Answer => {
                    self.finish(id, "cancelled").await;
                    return;
                }
                OnCancel::Crash => {
                    eprintln!("mock: crashing on session/cancel");
                    std::process::exit(9);
                }
                OnCancel::Ignore => self.cancelled = false,
            }
        }
    }

    async fn thought(&mut self, id: &Value, session: &str) {
        let updates = [
            wire::text_chunk("agent_thought_chunk", "thinking..."),
            json!({"sessionUpdate": "tool_call", "toolCallId": "call-1",
                   "title": "Read notes.txt", "kind": "read", "status": "pending"}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "call-1",
                   "status": "completed"}),
            json!({"sessionUpdate": "plan", "entries": [
                {"content": "Answer the question", "priority": "high", "status": "in_progress"}
            ]}),
            wire::text_chunk("user_message_chunk", "echo"),
        ];
        for update in updates {
            self.send(&wire::session_update(session, update)).await;
        }
        self.reply(id, session, ["final answer"], "end_turn").await;
    }

    async fn opencode_usage(&mut self, id: &Value, session: &str, tokens: u64, cost: f64) {
        self.say(session, "counted").await;
        let input = tokens / 4 * 3;
        let update = json!({"sessionUpdate": "usage_update", "used": input, "size": 200_000,
            "cost": {"amount": cost, "currency": "USD"}});
        self.send(&wire::session_update(session, update)).await;
        let answer = json!({"stopReason": "end_turn", "usage": {"totalTokens": tokens,
            "inputTokens": input, "outputTokens": tokens - input, "cachedReadTokens": 10},
            "_meta": {}});
        self.send(&wire::response(id, answer)).await;
    }

    async fn permission(&mut self, id: &Value, session: &str, options: &[String], count: usize) {
        let mut outcomes = Vec::new();
        for _ in 0..count.max(1) {
            let asked = self
                .request(
                    "session/request_permission",
                    permission_request(session, options),
                )
                .await;
            outcomes.push(describe_permission(&self.response_to(asked).await));
            if self.cancelled {
                break;
            }
        }
        let outcome = outcomes.join("\n");
        // A cancel that arrived while the question was open ends the turn as ACP requires.
        let stop = if self.cancelled {
            "cancelled"
        } else {
            "end_turn"
        };
        self.reply(id, session, [outcome], stop).await;
    }

    async fn permission_raw(&mut self, id: &Value, session: &str, options: Value) {
        let mut params = permission_request(session, &[]);
        params["options"] = options;
        let asked = self.request("session/request_permission", params).await;
        let outcome = describe_permission(&self.response_to(asked).await);
        self.reply(id, session, [outcome], "end_turn").await;
    }

    /// Updates for a session the client never opened, then a normal answer in ours.
    async fn foreign_session(&mut self, id: &Value, session: &str) {
        let other = "other-session";
        let chunk = wire::text_chunk("agent_message_chunk", "intruder ");
        self.send(&wire::session_update(other, chunk)).await;
        let call = json!({"sessionUpdate": "tool_call", "toolCallId": "call-x",
                          "title": "Intrude", "kind": "execute", "status": "pending"});
        self.send(&wire::session_update(other, call)).await;
        self.reply(id, session, [HELLO], "end_turn").await;
    }

    /// `--ready` after the first chunk, so a test interrupting on ready interrupts mid-stream.
    async fn slow_stream(&mut self, id: &Value, session: &str, chunks: usize, interval: Duration) {
        for index in 1..=chunks {
            self.say(session, format!("c{index} ")).await;
            if index == 1 {
                self.touch_ready();
            }
            if index < chunks && self.cancelled_within(interval).await {
                self.finish(id, "cancelled").await;
                return;
            }
        }
        self.finish(id, "end_turn").await;
    }

    /// ACP requires a client that has sent `session/cancel` to answer every later permission
    /// request with `cancelled`; the outcome goes to stderr and the log for the test to check.
    async fn permission_after_cancel(&mut self, id: &Value, session: &str) {
        self.until_cancelled().await;
        let options: Vec<String> = DEFAULT_PERMISSION_OPTIONS
            .iter()
            .map(|kind| (*kind).to_owned())
            .collect();
        let asked = self
            .request(
                "session/request_permission",
                permission_request(session, &options),
            )
            .await;
        let outcome = describe_permission(&self.response_to(asked).await);
        eprintln!("mock: permission after cancel: {outcome}");
        self.log.line(&format!("permission {outcome}"));
        self.finish(id, "cancelled").await;
    }

    /// Both requests go out before either answer is awaited, as a real agent may do.
    async fn fs_request(&mut self, id: &Value, session: &str) {
        let cwd = self.session_cwd.clone().unwrap_or_else(|| ".".to_owned());
        let read = self
            .request(
                "fs/read_text_file",
                json!({"sessionId": session, "path": format!("{cwd}/notes.txt")}),
            )
            .await;
        let terminal = self
            .request(
                "terminal/create",
                json!({"sessionId": session, "command": "true"}),
            )
            .await;
        let read = describe_reply(&self.response_to(read).await);
        let terminal = describe_reply(&self.response_to(terminal).await);
        let text = format!("fs: {read} terminal: {terminal}");
        self.reply(id, session, [text], "end_turn").await;
    }

    /// Sends each text as an `agent_message_chunk`, then answers the prompt with `stop`.
    async fn reply<T: Into<String>>(
        &mut self,
        id: &Value,
        session: &str,
        texts: impl IntoIterator<Item = T>,
        stop: &str,
    ) {
        for text in texts {
            self.say(session, text).await;
        }
        self.finish(id, stop).await;
    }

    async fn say(&mut self, session: &str, text: impl Into<String>) {
        let chunk = wire::text_chunk("agent_message_chunk", text);
        self.send(&wire::session_update(session, chunk)).await;
    }

    async fn finish(&mut self, id: &Value, stop: &str) {
        self.send(&wire::response(id, json!({"stopReason": stop})))
            .await;
    }
}

/// Ready at the prompt, except where a scenario's own step says otherwise.
fn ready_at_prompt(scenario: &Scenario) -> bool {
    !matches!(
        scenario,
        Scenario::Stubborn
            | Scenario::Answers { .. }
            | Scenario::Hang
            | Scenario::Grandchild
            | Scenario::IgnoreCancel
            | Scenario::CrashOnCancel
            | Scenario::SlowStream { .. }
            | Scenario::Escapee {
                then: EscapeeThen::Hang,
                ..
            }
    )
}

/// `text` cut into exactly `count` pieces of near-equal length (on char boundaries, longer
/// pieces first); no pieces for empty text, so an empty answer sends no chunk at all.
fn split_chunks(text: &str, count: usize) -> Vec<String> {
    if text.is_empty() || count == 0 {
        return Vec::new();
    }
    let chars: Vec<char> = text.chars().collect();
    let (base, longer) = (chars.len() / count, chars.len() % count);
    let mut rest = chars.as_slice();
    (0..count)
        .map(|index| {
            let (piece, tail) = rest.split_at(base + usize::from(index < longer));
            rest = tail;
            piece.iter().collect()
        })
        .collect()
}

/// `session/request_permission` params for writing notes.txt, offering `kinds` in order with
/// each option id equal to its kind.
fn permission_request(session: &str, kinds: &[String]) -> Value {
    let options: Vec<Value> = kinds
        .iter()
        .map(|kind| json!({"optionId": kind, "name": option_name(kind), "kind": kind}))
        .collect();
    json!({
        "sessionId": session,
        "toolCall": {
            "toolCallId": "call-1",
            "title": "Write notes.txt",
            "kind": "edit",
            "status": "pending",
        },
        "options": options,
    })
}

fn option_name(kind: &str) -> &str {
    match kind {
        "allow_once" => "Allow once",
        "allow_always" => "Always allow",
        "reject_once" => "Reject",
        "reject_always" => "Always reject",
        other => other,
    }
}

/// `selected <optionId>`, `cancelled`, `error <code>`, or `unexpected <json>`.
fn describe_permission(reply: &Result<Value, Value>) -> String {
    match reply {
        Ok(result) => match result.pointer("/outcome/outcome").and_then(Value::as_str) {
            Some("selected") => match result.pointer("/outcome/optionId") {
                Some(Value::String(option)) => format!("selected {option}"),
                Some(Value::Null) | None => format!("unexpected {result}"),
                Some(other) => format!("selected json:{other}"),
            },
            Some("cancelled") => "cancelled".to_owned(),
            _ => format!("unexpected {result}"),
        },
        Err(error) => format!("error {}", error.get("code").unwrap_or(error)),
    }
}

/// An error's code, or the whole result as JSON.
fn describe_reply(reply: &Result<Value, Value>) -> String {
    match reply {
        Ok(result) => result.to_string(),
        Err(error) => error.get("code").unwrap_or(error).to_string(),
    }
}

fn probe_fd(fd: u32) -> String {
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Ok(target) => format!("fd {fd}: {}", target.display()),
        Err(_) => format!("fd {fd}: closed"),
    }
}

/// Walks the parent chain through `/proc/<pid>/stat` and tries each ancestor's environ.
fn ancestor_environ() -> String {
    let mut lines = Vec::new();
    let mut pid = parent_of("self");
    while let Some(current) = pid.filter(|p| *p > 1) {
        let line = match std::fs::read(format!("/proc/{current}/environ")) {
            Ok(bytes) => {
                let entries: Vec<String> = bytes
                    .split(|b| *b == 0)
                    .filter(|e| !e.is_empty())
                    .map(|e| String::from_utf8_lossy(e).into_owned())
                    .collect();
                format!("{current}: {}", entries.join(" "))
            }
            Err(error) => format!("{current}: unreadable ({error})"),
        };
        lines.push(line);
        pid = parent_of(&current.to_string());
    }
    lines.join("\n")
}

/// The ppid field of `/proc/<pid>/stat`, after the parenthesised command name.
fn parent_of(pid: &str) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn env_line(name: &str) -> String {
    match std::env::var_os(name) {
        Some(value) => format!("{name}={}", value.to_string_lossy()),
        None => format!("{name} unset"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_exact_in_count_and_content() {
        assert_eq!(split_chunks("hello", 2), ["hel", "lo"]);
        assert_eq!(split_chunks("héllo", 5), ["h", "é", "l", "l", "o"]);
        assert_eq!(split_chunks("ab", 3), ["a", "b", ""]);
        assert!(split_chunks("", 3).is_empty());
    }

    #[test]
    fn permission_request_matches_the_acp_shape() {
        let kinds = vec!["reject_once".to_owned()];
        assert_eq!(
            permission_request("s", &kinds),
            json!({
                "sessionId": "s",
                "toolCall": {"toolCallId": "call-1", "title": "Write notes.txt",
                             "kind": "edit", "status": "pending"},
                "options": [{"optionId": "reject_once", "name": "Reject", "kind": "reject_once"}],
            })
        );
    }

    #[test]
    fn permission_outcomes_are_described() {
        let selected = json!({"outcome": {"outcome": "selected", "optionId": "allow_once"}});
        assert_eq!(describe_permission(&Ok(selected)), "selected allow_once");
        let cancelled = json!({"outcome": {"outcome": "cancelled"}});
        assert_eq!(describe_permission(&Ok(cancelled)), "cancelled");
        assert_eq!(
            describe_permission(&Err(json!({"code": -32603}))),
            "error -32603"
        );
        assert_eq!(
            describe_permission(&Ok(json!({}))),
            "unexpected {}".to_owned()
        );
    }

    #[test]
    fn replies_are_described_by_code_or_result() {
        assert_eq!(
            describe_reply(&Err(json!({"code": -32601, "message": "x"}))),
            "-32601"
        );
        assert_eq!(
            describe_reply(&Ok(json!({"content": "hi"}))),
            r#"{"content":"hi"}"#
        );
    }
}
