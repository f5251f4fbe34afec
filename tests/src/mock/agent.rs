//! Process setup and the agent's main loop, plus the waits every script is built from.
//!
//! One task owns stdout and runs the script; the stdin reader and the SIGTERM trap are the
//! only other tasks. The script is sequential: while a prompt turn is in flight it pulls
//! messages itself ([`Agent::absorb`]), filing responses by id and noting `session/cancel`,
//! and defers anything else to the main loop. Stdin EOF is handled in exactly one place,
//! [`Agent::at_eof`], whichever wait observes it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::cli::{Common, Config, Scenario};
use super::files::{self, Log};
use super::inbox::Inbox;
use super::signals::{self, TermAction};
use super::wire::{self, Inbound, Outbound};

/// Exit status when the mock cannot set itself up (`EX_SOFTWARE`).
pub const SETUP_FAILURE_EXIT: i32 = 70;

/// How often `gated-session` looks for its go file.
const GATE_POLL: Duration = Duration::from_millis(10);

/// What stdin EOF (or a closed stdout) means for the process.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EofPolicy {
    /// Exit 0, like a well-behaved agent.
    Exit,
    /// Wait, create the marker, exit 0: an agent flushing its session on EOF.
    FlushMarker { marker: PathBuf, delay: Duration },
    /// Keep running until a signal ends the process.
    Ignore,
}

impl EofPolicy {
    fn of(scenario: &Scenario, common: &Common) -> Self {
        match scenario {
            Scenario::FlushOnEof { marker, delay } => Self::FlushMarker {
                marker: marker.clone(),
                delay: *delay,
            },
            Scenario::Stubborn | Scenario::TermMarker { .. } => Self::Ignore,
            _ if common.ignore_eof => Self::Ignore,
            _ => Self::Exit,
        }
    }
}

/// The running mock.
pub(super) struct Agent {
    pub(super) scenario: Scenario,
    pub(super) common: Common,
    pub(super) log: Log,
    /// Set when `session/cancel` arrives during a prompt turn; reset when a turn starts.
    pub(super) cancelled: bool,
    /// The `cwd` of `session/new`, for `echo-cwd` and `fs-request`.
    pub(super) session_cwd: Option<String>,
    /// The params of `initialize`, for `echo-initialize`.
    pub(super) initialize: Value,
    /// The params of `session/new`, for `configurable`.
    pub(super) new_session: Value,
    /// The model `configurable` currently runs.
    pub(super) model: Option<String>,
    /// Prompts answered so far (`answers`).
    pub(super) prompts: usize,
    out: Outbound,
    inbox: Inbox,
    eof: EofPolicy,
    next_request_id: u64,
    responses: HashMap<u64, Result<Value, Value>>,
    /// Held (never waited on) so the grandchild outlives any of our own bookkeeping; the test
    /// checks it is reaped by the host's process-group teardown.
    _grandchildren: Vec<Child>,
}

/// Runs the mock; returns only the status of a process that ends before serving (setup
/// failure, `exit-before-init`). Every other exit goes through `std::process::exit` after
/// stdout is flushed, because a tokio runtime would otherwise wait for the blocked stdin read.
pub async fn run(config: Config) -> i32 {
    let Config { scenario, common } = config;
    files::record(common.record.as_deref(), "start");
    if let Some(text) = &common.stderr {
        if text.ends_with('\n') {
            eprint!("{text}");
        } else {
            eprintln!("{text}");
        }
    }
    let grandchildren = match spawn_grandchildren(&scenario) {
        Ok(children) => children,
        Err(error) => {
            eprintln!("mock: cannot spawn a grandchild `sleep 1000`: {error}");
            return SETUP_FAILURE_EXIT;
        }
    };
    if let Some(pid_file) = &common.pid_file {
        let pids: Vec<String> = if grandchildren.is_empty() {
            vec![std::process::id().to_string()]
        } else {
            grandchildren.iter().map(|c| c.id().to_string()).collect()
        };
        files::write_atomically(pid_file, &format!("{}\n", pids.join(" ")));
    }
    if let Scenario::ExitBeforeInit { code } = scenario {
        eprintln!("mock: cannot start");
        return code.into();
    }
    let term = match &scenario {
        Scenario::TermMarker { marker } => Some(TermAction::Marker(marker.clone())),
        Scenario::Stubborn => Some(TermAction::Ignore),
        _ if common.trap_term => Some(TermAction::Ignore),
        _ => None,
    };
    if let Some(action) = term
        && let Err(error) = signals::trap_term(action)
    {
        eprintln!("mock: cannot register the SIGTERM listener: {error}");
        return SETUP_FAILURE_EXIT;
    }

    let log = Log::new(common.log.clone());
    let mut agent = Agent {
        eof: EofPolicy::of(&scenario, &common),
        out: Outbound::new(scenario == Scenario::Garbage),
        inbox: Inbox::spawn(log.clone()),
        scenario,
        common,
        log,
        cancelled: false,
        session_cwd: None,
        initialize: Value::Null,
        new_session: Value::Null,
        model: None,
        prompts: 0,
        next_request_id: 0,
        responses: HashMap::new(),
        _grandchildren: grandchildren,
    };
    if let Err(error) = agent.out.preamble().await {
        agent.stdout_closed(&error).await;
    }
    match agent.serve().await {}
}

/// The grandchildren a scenario starts before serving (none for most).
fn spawn_grandchildren(scenario: &Scenario) -> std::io::Result<Vec<Child>> {
    match scenario {
        Scenario::Grandchild => Ok(vec![spawn_grandchild()?]),
        Scenario::Escapee { hold_stdout, .. } => {
            let in_group = spawn_grandchild()?;
            // The `setsid` utility calls setsid() and execs in place (we are not a group leader
            // in our child), so its pid is the sleeper's: a new session and a new group, beyond
            // any process-group teardown.
            let mut escapee = Command::new("setsid");
            escapee.args(["sleep", "1000"]).stdin(Stdio::null());
            if !hold_stdout {
                escapee.stdout(Stdio::null());
            }
            Ok(vec![in_group, escapee.spawn()?])
        }
        _ => Ok(Vec::new()),
    }
}

/// `sleep 1000` in our process group, with stdin detached but stdout/stderr inherited, like the
/// real agent under a wrapper launcher (it keeps the host's pipes open until it dies).
fn spawn_grandchild() -> std::io::Result<Child> {
    Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .spawn()
}

impl Agent {
    async fn serve(&mut self) -> Infallible {
        loop {
            match self.next().await {
                Inbound::Request { id, method, params } => {
                    self.on_request(&id, &method, &params).await;
                }
                // A `session/cancel` outside a prompt turn has nothing to cancel.
                Inbound::Notification { .. } => {}
                Inbound::Response { id, outcome } => self.file_response(&id, outcome),
            }
        }
    }

    async fn on_request(&mut self, id: &Value, method: &str, params: &Value) {
        if self.scenario == Scenario::Silent {
            return;
        }
        // The trace context a client propagates (W3C, root keys of `_meta`), for the tracing
        // suite: `trace <method> <traceparent> [<tracestate>]`.
        if let Some(parent) = params.pointer("/_meta/traceparent").and_then(Value::as_str) {
            let state = params.pointer("/_meta/tracestate").and_then(Value::as_str);
            let line = match state {
                Some(state) => format!("trace {method} {parent} {state}"),
                None => format!("trace {method} {parent}"),
            };
            Log::new(self.common.trace_log.clone()).line(&line);
        }
        match method {
            "initialize" => {
                self.initialize = params.clone();
                let mut result = wire::initialize_result();
                result["agentCapabilities"] = wire::advertised(&self.common.advertise);
                self.send(&wire::response(id, result)).await;
            }
            "session/new" => self.new_session(id, params).await,
            "session/set_config_option"
                if matches!(self.scenario, Scenario::Configurable { .. }) =>
            {
                self.set_config_option(id, params).await;
            }
            "session/prompt" => self.prompt(id, params).await,
            other => {
                let message = format!("the mock agent does not implement {other}");
                self.send(&wire::error_response(id, wire::METHOD_NOT_FOUND, &message))
                    .await;
            }
        }
    }

    async fn new_session(&mut self, id: &Value, params: &Value) {
        self.session_cwd = params.get("cwd").and_then(Value::as_str).map(str::to_owned);
        // What a client asked of the session at start, for tests of the start extension; the
        // trace context goes to `--trace-log` instead.
        let mut asked = params.clone();
        if let Some(meta) = asked.get_mut("_meta").and_then(Value::as_object_mut) {
            meta.remove("traceparent");
            meta.remove("tracestate");
            if meta.is_empty() {
                asked.as_object_mut().map(|params| params.remove("_meta"));
            }
        }
        if let Some(meta) = asked.get("_meta") {
            self.log.line(&format!("session/new _meta {meta}"));
        }
        self.new_session = asked;
        let result = match &self.scenario {
            Scenario::Configurable { models, .. } => {
                self.model = models.first().cloned();
                json!({"sessionId": wire::SESSION_ID, "configOptions": wire::model_options(models, self.model.as_deref())})
            }
            Scenario::NoSessionId => json!({}),
            Scenario::AuthRequired { message } => {
                let error = wire::error_response(id, -32000, message);
                self.send(&error).await;
                return;
            }
            Scenario::GatedSession { go } => {
                let go = go.clone();
                self.touch_ready();
                self.gate(&go).await;
                json!({"sessionId": wire::SESSION_ID})
            }
            _ => json!({"sessionId": wire::SESSION_ID}),
        };
        self.send(&wire::response(id, result)).await;
    }

    /// `configurable`: selects one of its models, or answers invalid params.
    async fn set_config_option(&mut self, id: &Value, params: &Value) {
        let Scenario::Configurable { models, .. } = &self.scenario else {
            return;
        };
        let value = params.get("value").and_then(Value::as_str).unwrap_or("");
        let frame = if params.get("configId").and_then(Value::as_str) == Some("llm")
            && models.iter().any(|m| m == value)
        {
            let options = wire::model_options(models, Some(value));
            self.model = Some(value.to_owned());
            wire::response(id, json!({"configOptions": options}))
        } else {
            wire::error_response(id, -32602, "no such option or value")
        };
        self.send(&frame).await;
    }

    /// Waits until `go` exists, still handling stdin (EOF ends the wait per the EOF policy).
    pub(super) async fn gate(&mut self, go: &Path) {
        while !go.exists() {
            tokio::select! {
                () = self.absorb() => {}
                () = tokio::time::sleep(GATE_POLL) => {}
            }
        }
    }

    /// The next message for the main loop (deferred ones first).
    async fn next(&mut self) -> Inbound {
        match self.inbox.next().await {
            Some(message) => message,
            None => match self.at_eof().await {},
        }
    }

    /// Takes one fresh message during a script step: responses are filed by id,
    /// `session/cancel` sets [`Self::cancelled`], anything else waits for the main loop.
    /// Cancel-safe, so steps may race it against a timer.
    pub(super) async fn absorb(&mut self) {
        let Some(message) = self.inbox.next_fresh().await else {
            match self.at_eof().await {}
        };
        match message {
            Inbound::Response { id, outcome } => self.file_response(&id, outcome),
            Inbound::Notification { method, .. } if method == "session/cancel" => {
                self.cancelled = true;
            }
            other => self.inbox.defer(other),
        }
    }

    fn file_response(&mut self, id: &Value, outcome: Result<Value, Value>) {
        match id.as_u64() {
            Some(id) => {
                self.responses.insert(id, outcome);
            }
            None => eprintln!("mock: ignoring a response to an id it never used: {id}"),
        }
    }

    /// Sends a request to the client; returns its id for [`Self::response_to`].
    pub(super) async fn request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        self.send(&wire::request(id, method, params)).await;
        id
    }

    /// Waits for the client's answer to our request `id`.
    pub(super) async fn response_to(&mut self, id: u64) -> Result<Value, Value> {
        loop {
            if let Some(outcome) = self.responses.remove(&id) {
                return outcome;
            }
            self.absorb().await;
        }
    }

    /// Waits for a response with a null id: the answer to a message the client could not read
    /// (JSON-RPC answers those with `"id": null`).
    pub(super) async fn response_to_null_id(&mut self) -> Result<Value, Value> {
        loop {
            let Some(message) = self.inbox.next_fresh().await else {
                match self.at_eof().await {}
            };
            match message {
                Inbound::Response {
                    id: Value::Null,
                    outcome,
                } => return outcome,
                Inbound::Response { id, outcome } => self.file_response(&id, outcome),
                other => self.inbox.defer(other),
            }
        }
    }

    /// Waits until `session/cancel` has arrived in this turn.
    pub(super) async fn until_cancelled(&mut self) {
        while !self.cancelled {
            self.absorb().await;
        }
    }

    /// `true` if `session/cancel` arrives within `duration`.
    pub(super) async fn cancelled_within(&mut self, duration: Duration) -> bool {
        tokio::select! {
            () = self.until_cancelled() => true,
            () = tokio::time::sleep(duration) => false,
        }
    }

    /// Writes a frame; a closed stdout means the client is gone, handled like stdin EOF.
    pub(super) async fn send(&mut self, frame: &Value) {
        if let Err(error) = self.out.send(frame).await {
            self.stdout_closed(&error).await;
        }
    }

    /// Writes one line as given (it need not be valid JSON or UTF-8).
    pub(super) async fn send_raw(&mut self, line: &[u8]) {
        if let Err(error) = self.out.send_raw(line).await {
            self.stdout_closed(&error).await;
        }
    }

    async fn stdout_closed(&mut self, error: &std::io::Error) {
        eprintln!("mock: stdout is closed ({error}); handling it like stdin EOF");
        match self.at_eof().await {}
    }

    /// The single home of what EOF means (see [`EofPolicy`]).
    async fn at_eof(&mut self) -> Infallible {
        match &self.eof {
            EofPolicy::Exit => {
                files::record(self.common.record.as_deref(), "end");
                std::process::exit(0)
            }
            EofPolicy::FlushMarker { marker, delay } => {
                let marker = marker.clone();
                tokio::time::sleep(*delay).await;
                // A last line on stdout, as agents flushing a session do: the marker proves the
                // client was still reading (a closed pipe would have failed the write).
                let last = wire::session_update(
                    wire::SESSION_ID,
                    wire::text_chunk("agent_thought_chunk", "flushed on eof"),
                );
                if let Err(error) = self.out.send(&last).await {
                    eprintln!("mock: the last line on eof failed: {error}");
                    std::process::exit(1);
                }
                files::touch(&marker);
                std::process::exit(0)
            }
            EofPolicy::Ignore => std::future::pending().await,
        }
    }

    pub(super) fn touch_ready(&self) {
        if let Some(ready) = &self.common.ready {
            files::touch(ready);
        }
    }
}
