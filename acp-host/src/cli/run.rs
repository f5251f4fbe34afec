//! `acp-host run`: argv -> a validated start request -> the library's run -> rendering -> exit code.
//!
//! Invariants: usage errors (bad flags, cwd, `--env`, agent) exit 2 before anything is spawned;
//! human mode writes only the agent's message text to stdout, as it arrives; `--json` writes one
//! event per line and the result record last; diagnostics go to stderr; a closed stdout pipe is
//! not an error; the first Ctrl-C/SIGTERM cancels gracefully, the second kills at once.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acp_host::client::{Asker, PermissionView};
use acp_host::installed;
use acp_host::run::{self, Cancel, Observer, ObserverError, RunOptions};
use protocol::env_scrub::{self, EnvForward};
use protocol::events::{Event, ResultRecord};
use protocol::permission::{Outcome, PermissionPolicy};
use protocol::registry;
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::result::{EXIT_USAGE, RunResult, Status};

/// Drive one ACP agent on one prompt, as an out-of-process subagent.
///
/// The agent is spawned fresh in its own process group with a scrubbed environment, driven through
/// initialize -> session/new -> session/prompt, and always torn down (stdin EOF -> SIGTERM ->
/// SIGKILL of its whole group) before acp-host exits.
#[derive(Debug, clap::Args)]
#[command(after_long_help = after_help())]
pub struct RunArgs {
    /// The prompt, or `-` to read it from stdin.
    #[arg(value_name = "PROMPT | -")]
    prompt: String,

    /// A registry name (see `acp-host agents`) or a command line, split shell-style.
    #[arg(long, value_name = "NAME|COMMAND-LINE", default_value = registry::ACP_CHILD)]
    agent: String,

    /// Working directory of the agent and of its session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Forward a variable to the agent: NAME passes this environment's value, NAME=VALUE sets one.
    /// Repeatable. Credential-shaped variables are withheld unless forwarded like this.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,

    /// How to answer the agent's permission requests. `ask` prompts on the terminal and rejects
    /// when there is none.
    #[arg(long, value_enum, default_value_t = PolicyArg::Reject)]
    permission: PolicyArg,

    /// Give up after this many seconds: the agent is cancelled and torn down (exit 124).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    timeout: Option<Duration>,

    /// initialize and session/new must answer within this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, default_value = "60")]
    handshake_timeout: Duration,

    /// After cancelling, wait this long for the agent to acknowledge before tearing it down.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, default_value = "3")]
    cancel_grace: Duration,

    /// Teardown: after closing the agent's stdin, wait this long for it to exit by itself.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, default_value = "6")]
    eof_grace: Duration,

    /// Teardown: after SIGTERM to the agent's process group, wait this long before SIGKILL.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, default_value = "3")]
    term_grace: Duration,

    /// Write NDJSON events to stdout (start, updates, permissions), then a result record.
    #[arg(long)]
    json: bool,

    /// Show thoughts, tool calls, plans, permission decisions and the agent's stderr on stderr.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    Reject,
    Allow,
    Ask,
}

impl From<PolicyArg> for PermissionPolicy {
    fn from(arg: PolicyArg) -> Self {
        match arg {
            PolicyArg::Reject => PermissionPolicy::Reject,
            PolicyArg::Allow => PermissionPolicy::Allow,
            PolicyArg::Ask => PermissionPolicy::Ask,
        }
    }
}

fn after_help() -> String {
    format!(
        "{}\n{}\n\
Permissions:\n  Options are chosen by kind, never position: allow -> allow_once, else allow_always;\n  \
reject -> reject_once, else reject_always; otherwise the request is answered `cancelled`.\n\n\
Examples:\n  acp-host run \"hello\"\n  \
echo 'summarise README.md' | acp-host run --agent codex -\n  \
acp-host run --agent 'npx @zed-industries/claude-code-acp' --permission allow \"fix the tests\"\n  \
acp-host run --env DEEPSEEK_API_KEY --json --timeout 600 \"review this diff\"\n",
        Status::exit_code_table(),
        env_scrub::help_section()
    )
}

fn parse_seconds(arg: &str) -> Result<Duration, String> {
    let seconds: f64 = arg
        .parse()
        .map_err(|_| format!("{arg:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("{arg:?} must be a non-negative number of seconds"))
}

pub fn execute(args: &RunArgs) -> ExitCode {
    init_tracing(args.verbose);
    let request = match build_request(args) {
        Ok(request) => request,
        Err(message) => return usage_error(&message),
    };
    let prepared = match run::prepare(request, std::env::vars_os()) {
        Ok(prepared) => prepared,
        Err(err) => return usage_error(&err.to_string()),
    };
    if args.verbose && !prepared.scrubbed().is_empty() {
        eprintln!(
            "acp-host: withheld from the agent: {}",
            prepared.scrubbed().join(", ")
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("acp-host: error: cannot start the async runtime: {err}");
            return ExitCode::from(Status::Error.exit_code());
        }
    };
    let renderer = Arc::new(Renderer::new(args.json, args.verbose));
    let options = RunOptions {
        observers: vec![Arc::clone(&renderer) as Arc<dyn Observer>],
        asker: matches!(args.permission, PolicyArg::Ask)
            .then(TerminalAsker::open)
            .flatten()
            .map(|asker| Arc::new(asker) as Arc<dyn Asker>),
        echo_stderr: args.verbose,
        ..RunOptions::default()
    };
    let result = runtime.block_on(async {
        let cancel = Cancel::new();
        let signals = tokio::spawn(watch_signals(cancel.clone()));
        let result = run::run(prepared, &options, &cancel).await;
        signals.abort();
        result
    });
    renderer.finish(&result);
    // Do not wait for a permission question nobody answered.
    runtime.shutdown_background();
    ExitCode::from(result.exit_code())
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("acp-host: error: {message}");
    ExitCode::from(EXIT_USAGE)
}

fn build_request(args: &RunArgs) -> Result<StartRequest, String> {
    let prompt = if args.prompt == "-" {
        let mut prompt = String::new();
        std::io::stdin()
            .read_to_string(&mut prompt)
            .map_err(|err| format!("cannot read the prompt from stdin: {err}"))?;
        prompt
    } else {
        args.prompt.clone()
    };
    if prompt.trim().is_empty() {
        return Err("the prompt is empty (pass text, or - to read it from stdin)".into());
    }
    let env = args
        .env
        .iter()
        .map(|arg| EnvForward::parse(arg).map_err(|err| err.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = run::resolve_cwd(args.cwd.as_deref()).map_err(|err| err.to_string())?;
    Ok(StartRequest {
        agent: resolve_agent(&args.agent)?,
        prompt,
        cwd,
        env,
        permission: args.permission.into(),
        timeouts: Timeouts {
            overall: args.timeout,
            handshake: args.handshake_timeout,
            cancel_grace: args.cancel_grace,
            eof_grace: args.eof_grace,
            term_grace: args.term_grace,
        },
    })
}

/// A registry name launches its ACP command; anything else is a command line.
fn resolve_agent(agent: &str) -> Result<AgentCommand, String> {
    let words: Vec<String> = match registry::find(agent) {
        Some(spec) => match spec.acp_command {
            Some(command) => command.iter().map(|w| (*w).to_owned()).collect(),
            None => {
                return Err(format!(
                    "agent {agent} does not speak ACP; agents that do: {}",
                    registry::AGENTS
                        .iter()
                        .filter(|a| a.acp_command.is_some())
                        .map(|a| a.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        },
        None => shell_words::split(agent)
            .map_err(|err| format!("cannot parse --agent {agent:?}: {err}"))?,
    };
    let Some((program, args)) = words.split_first() else {
        return Err("--agent is empty (pass a registry name or a command line)".into());
    };
    // A known agent's program, named directly or in a command line, comes with its install hint.
    let install_hint = registry::AGENTS
        .iter()
        .find(|a| a.acp_command.and_then(<[_]>::first) == Some(&program.as_str()))
        .and_then(|a| a.install)
        .map(str::to_owned);
    let program = if program == registry::ACP_CHILD {
        installed::sibling(registry::ACP_CHILD).unwrap_or_else(|| PathBuf::from(program))
    } else {
        PathBuf::from(program)
    };
    Ok(AgentCommand {
        program,
        args: args.to_vec(),
        display: agent.to_owned(),
        install_hint,
    })
}

fn init_tracing(verbose: bool) {
    let default = if verbose { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env(protocol::env_vars::ACP_HOST_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

async fn watch_signals(cancel: Cancel) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot install signal handlers; Ctrl-C will not cancel gracefully");
        return;
    };
    let mut seen = 0;
    loop {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        seen += 1;
        if seen == 1 {
            eprintln!("acp-host: cancelling (press Ctrl-C again to kill the agent now)");
            cancel.cancel();
        } else {
            cancel.kill();
        }
    }
}

/// Renders events as they arrive: the message text (human) or NDJSON (`--json`).
struct Renderer {
    json: bool,
    verbose: bool,
    /// Set once stdout is gone (e.g. `| head`): stop writing, keep running.
    stdout_closed: AtomicBool,
    /// Whether the last text written ended with a newline (for the final newline on a TTY).
    ended_with_newline: Mutex<bool>,
}

impl Renderer {
    fn new(json: bool, verbose: bool) -> Self {
        Renderer {
            json,
            verbose,
            stdout_closed: AtomicBool::new(false),
            ended_with_newline: Mutex::new(true),
        }
    }

    fn write_stdout(&self, text: &str) {
        if self.stdout_closed.load(Ordering::Relaxed) {
            return;
        }
        let mut out = std::io::stdout().lock();
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            self.stdout_closed.store(true, Ordering::Relaxed);
        }
    }

    fn write_json(&self, value: &impl serde::Serialize) {
        match serde_json::to_string(value) {
            Ok(mut line) => {
                line.push('\n');
                self.write_stdout(&line);
            }
            Err(err) => tracing::warn!(%err, "cannot serialize an event"),
        }
    }

    fn finish(&self, result: &RunResult) {
        if self.json {
            self.write_json(&ResultRecord::Result(result.clone()));
            return;
        }
        let newline = self.ended_with_newline.lock().map_or(true, |g| *g);
        if !newline && std::io::stdout().is_terminal() {
            self.write_stdout("\n");
        }
        if result.status == Status::Completed {
            return;
        }
        match &result.error {
            Some(error) => eprintln!("acp-host: {}: {error}", result.status),
            None => eprintln!("acp-host: {}", result.status),
        }
        if result.status == Status::Error && !self.verbose && !result.stderr_tail.trim().is_empty()
        {
            eprintln!("acp-host: agent stderr (last lines):");
            for line in last_lines(&result.stderr_tail, 20) {
                eprintln!("  {line}");
            }
        }
    }

    fn human_update(&self, update: &serde_json::Value) {
        let kind = text_at(update, "/sessionUpdate").unwrap_or("");
        let text = text_at(update, "/content/text");
        match (kind, text) {
            ("agent_message_chunk", Some(text)) => {
                if let Ok(mut newline) = self.ended_with_newline.lock()
                    && !text.is_empty()
                {
                    *newline = text.ends_with('\n');
                }
                self.write_stdout(text);
            }
            _ if !self.verbose => {}
            ("agent_thought_chunk", Some(text)) => eprint!("{text}"),
            ("tool_call" | "tool_call_update", _) => eprintln!(
                "acp-host: [{kind}] {} {}",
                text_at(update, "/title").unwrap_or(""),
                text_at(update, "/status").unwrap_or("")
            ),
            ("plan", _) => eprintln!(
                "acp-host: [plan] {}",
                update
                    .get("entries")
                    .map_or_else(String::new, ToString::to_string)
            ),
            _ => {}
        }
    }
}

impl Observer for Renderer {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        if self.json {
            if !matches!(event, Event::End(_)) {
                self.write_json(event);
            }
            return Ok(());
        }
        match event {
            Event::Update { update, .. } => self.human_update(update),
            Event::Permission { decision, .. } => {
                let answer = match &decision.outcome {
                    Outcome::Selected { option_id, .. } => format!("selected {option_id}"),
                    Outcome::Cancelled => "cancelled".to_owned(),
                };
                eprintln!(
                    "acp-host: permission {} for {} ({}): {answer} [by {}]",
                    decision.verdict.as_str(),
                    decision.title.as_deref().unwrap_or("a tool call"),
                    decision.tool_kind.as_deref().unwrap_or("unknown kind"),
                    decision.decided_by
                );
            }
            Event::Start(start) if self.verbose => eprintln!(
                "acp-host: agent {} ready (pid {}, session {})",
                start.agent,
                start.pid.unwrap_or_default(),
                start.session_id
            ),
            Event::Start(_) | Event::End(_) => {}
        }
        Ok(())
    }
}

/// The string at a JSON pointer of a session update, if there is one.
fn text_at<'a>(value: &'a serde_json::Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(serde_json::Value::as_str)
}

fn last_lines(text: &str, n: usize) -> impl Iterator<Item = &str> {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(n);
    lines.into_iter().skip(skip)
}

/// Asks on the controlling terminal (`/dev/tty`), so it works even when stdin carries the prompt.
struct TerminalAsker {
    tty: Mutex<std::fs::File>,
}

impl TerminalAsker {
    fn open() -> Option<TerminalAsker> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .ok()
            .map(|tty| TerminalAsker {
                tty: Mutex::new(tty),
            })
    }
}

impl Asker for TerminalAsker {
    fn ask(&self, request: &PermissionView) -> bool {
        let Ok(mut tty) = self.tty.lock() else {
            return false;
        };
        let question = format!(
            "acp-host: allow {} \"{}\"? [y/N] ",
            request.tool_kind.as_deref().unwrap_or("tool call"),
            request.title.as_deref().unwrap_or("(untitled)")
        );
        if tty.write_all(question.as_bytes()).is_err() {
            return false;
        }
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        while let Ok(1) = tty.read(&mut byte) {
            if byte[0] == b'\n' {
                break;
            }
            answer.push(byte[0]);
        }
        matches!(
            String::from_utf8_lossy(&answer)
                .trim()
                .to_ascii_lowercase()
                .as_str(),
            "y" | "yes"
        )
    }
}
