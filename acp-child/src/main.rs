//! The `acp-child` binary: parses the command line, sends logs to stderr, and serves ACP on
//! stdio until stdin closes (exit code 0) or the connection fails (exit code 1). A bad model
//! configuration (base URL, persona file, state directory) is reported before serving (exit 2).
//!
//! Start-up hardening comes first, as in acp-host, before any thread or process exists
//! (`acp_host::process::harden_host`): the process becomes non-dumpable (its environment, with
//! the API key it holds, is unreadable through `/proc` to the commands and subagents it starts)
//! and a child subreaper (what a command leaves behind, `setsid()` escapees included, re-parents
//! here: [`orphans`] reaps it as it exits and kills it when serving ends). A failure is a
//! warning; acp-child then runs unhardened. The runtime runs on a thread of its own, never on
//! the main thread, which is what lets [`orphans`] tell an adopted orphan from a child tokio
//! waits for.

#![expect(
    clippy::print_stderr,
    reason = "the binary reports what stops it before logging exists"
)]

mod orphans;

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;

use acp_child::{
    AGENT_NAME, AgentConfig, COMMANDS_HELP, DEEPSEEK_BASE_URL, DEFAULT_COMMAND_TIMEOUT_SECS,
    DEFAULT_MAX_PARALLEL_SUBAGENTS, DEFAULT_MAX_RETRIES, DEFAULT_MAX_TURN_REQUESTS,
    DEFAULT_RETRY_BASE_MS, KEY_VARIABLES, ModelConfig, ModelOptions, OPENAI_BASE_URL, STATE_SUBDIR,
    SubagentError, SubagentOptions, Subagents, describe, inherited_standing, serve_stdio,
    tool_names,
};
use clap::Parser;
use protocol::definition::RunPermission;
use protocol::env_vars::{
    ACP_CHILD_BASE_URL as BASE_URL_VAR, ACP_CHILD_LOG as LOG_ENV, ACP_CHILD_MODEL as MODEL_VAR,
    ACP_CHILD_STATE_DIR as STATE_DIR_VAR, DEFAULT_LOG_FILTER,
};
use tracing_subscriber::EnvFilter;

/// `--version`: the version, the commit when known, the ACP protocol version.
static VERSION: LazyLock<String> =
    LazyLock::new(|| acp_host::version_text(env!("CARGO_PKG_VERSION")));

/// The command line; the texts are user-facing, so they live in `help` attributes and
/// [`long_about`] rather than in doc comments. Defaults shown come from the library's constants.
#[derive(Debug, Parser)]
#[command(
    name = AGENT_NAME,
    version = VERSION.as_str(),
    about = "An ACP agent speaking JSON-RPC (ACP v1) on stdin/stdout.",
    long_about = long_about(),
    after_help = after_help()
)]
struct Cli {
    #[arg(
        long,
        value_name = "NAME",
        help = format!("The model name; enables the model backend [env: {MODEL_VAR}] [default: with --base-url, the first model the server lists at /models, the others offered per session; none listed is an error]")
    )]
    model: Option<String>,
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        help = "Further models a client may select per session (the session config option of category model), besides --model [default: none]"
    )]
    models: Vec<String>,
    #[arg(
        long,
        value_name = "URL",
        help = format!("The OpenAI-compatible base URL including /v1; alone (no --model) it enables the model backend with the server's model [env: {BASE_URL_VAR}] [default: {DEEPSEEK_BASE_URL} with {}, else {OPENAI_BASE_URL}]", KEY_VARIABLES[1])
    )]
    base_url: Option<String>,
    #[arg(
        long,
        value_name = "FILE",
        help = "A system prompt file; {{model}} and {{cwd}} in it are replaced (another {{...}} is an error) [default: built in]"
    )]
    persona: Option<PathBuf>,
    #[arg(
        long,
        value_name = "N",
        help = format!("The most model requests per prompt; reaching it ends the turn with max_turn_requests [default: {DEFAULT_MAX_TURN_REQUESTS}]")
    )]
    max_turn_requests: Option<u32>,
    #[arg(
        long,
        value_name = "DIR",
        help = format!("Where sessions are saved as JSONL [env: {STATE_DIR_VAR}] [default: $XDG_STATE_HOME/{STATE_SUBDIR} or ~/.local/state/{STATE_SUBDIR}]")
    )]
    state_dir: Option<PathBuf>,
    #[arg(
        long,
        value_name = "SECONDS",
        help = format!("How long run_command may run before it is killed [default: {DEFAULT_COMMAND_TIMEOUT_SECS}]")
    )]
    command_timeout: Option<u64>,
    #[arg(
        long,
        value_name = "MODE",
        help = "run_command's sandbox: off, read-only, or workspace-write (write only the session directory, its .git kept read-only; credential folders unreadable); enforced by the kernel (Landlock, seccomp), refused where it cannot be [default: workspace-write with --command-network off, with what the kernel enforces]"
    )]
    command_sandbox: Option<protocol::sandbox::Mode>,
    #[arg(
        long,
        value_name = "on|off|tcp:PORT",
        help = "run_command's network: on, off, or tcp:PORT[,PORT] (TCP to those ports only) [default: off]"
    )]
    command_network: Option<protocol::sandbox::Network>,
    #[arg(
        long,
        value_name = "N",
        help = format!("How many times a rate-limited (429) or failed (5xx) model request is retried [default: {DEFAULT_MAX_RETRIES}]")
    )]
    max_retries: Option<u32>,
    #[arg(
        long,
        value_name = "MS",
        help = format!("The first retry's delay in milliseconds, doubled for each further retry; a Retry-After header wins [default: {DEFAULT_RETRY_BASE_MS}]")
    )]
    retry_base_ms: Option<u64>,
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        help = "Registry agents this agent may delegate to, each in its own process (the model's subagent tool, /delegate), e.g. acp-child,codex [default: none]"
    )]
    subagent_agents: Vec<String>,
    #[arg(
        long = "subagents",
        value_name = "DIR",
        help = "A folder of subagent definitions (<name>.md with a run: table), looked at after <session cwd>/subagents/ (repeatable)"
    )]
    subagent_dirs: Vec<PathBuf>,
    #[arg(
        long,
        value_name = "N",
        help = format!("How many subagents may run at once [default: {DEFAULT_MAX_PARALLEL_SUBAGENTS}]")
    )]
    max_parallel_subagents: Option<usize>,
    #[arg(
        long,
        value_enum,
        value_name = "POLICY",
        default_value_t = PermissionArg::Relay,
        help = "How a subagent's permission requests are answered: relay asks this agent's own client"
    )]
    subagent_permission: PermissionArg,
    #[arg(
        long,
        value_name = "NAME",
        help = "Forward this variable to subagents (repeatable); they get the scrubbed environment otherwise, so a subagent acp-child needs its key forwarded"
    )]
    subagent_env: Vec<String>,
    #[arg(
        long,
        value_name = "SECONDS",
        help = "Cancel a subagent that runs longer than this [default: no limit]"
    )]
    subagent_timeout: Option<u64>,
    #[arg(
        long,
        value_name = "N",
        help = "Cancel a subagent once the tokens it reports pass N; its call's result says so and the turn goes on (a definition's tokenBudget only lowers it) [default: no limit]"
    )]
    subagent_token_budget: Option<u64>,
    #[arg(
        long,
        value_name = "MODE",
        help = "Every subagent's sandbox: off, read-only or workspace-write (as acp-host run --sandbox; a definition's run.sandbox only tightens it, and this agent's own sandbox bounds it) [default: off]"
    )]
    subagent_sandbox: Option<protocol::sandbox::Mode>,
    #[arg(
        long,
        value_name = "on|off|tcp:PORT",
        help = "Every subagent's network: on, off or tcp:PORT[,PORT] (a definition's run.network only tightens it) [default: on]"
    )]
    subagent_network: Option<protocol::sandbox::Network>,
    #[arg(
        long,
        value_name = "N",
        help = "The model's context window in tokens, for usage updates (used/size) [default: what the server's model listing says; unknown: the counts and cost go on a session_info_update instead]"
    )]
    context_window: Option<u64>,
    #[arg(
        long,
        value_name = "AMOUNT",
        requires = "price_output",
        value_parser = parse_price,
        help = "The price of a million input tokens, to report a cost (with --price-output) [default: none; no cost is reported]"
    )]
    price_input: Option<f64>,
    #[arg(
        long,
        value_name = "AMOUNT",
        requires = "price_input",
        value_parser = parse_price,
        help = "The price of a million output tokens (with --price-input)"
    )]
    price_output: Option<f64>,
    #[arg(
        long,
        value_name = "CODE",
        requires = "price_input",
        default_value = protocol::usage::DEFAULT_CURRENCY,
        help = "The currency of --price-input and --price-output"
    )]
    price_currency: String,
    #[arg(
        long,
        help = "No background tasks: neither the subagent tool nor run_command has run_in_background (refused if a model sends it), and the task tools are not offered"
    )]
    no_background: bool,
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 300,
        help = "How long a child that answered (foreground or background) stays alive, idle, for send_message (at most 4 per session; the oldest is closed); 0 ends every child with its run"
    )]
    child_idle_timeout: u64,
    #[arg(
        long,
        value_enum,
        value_name = "SHELL",
        help = "Print a shell completion script for acp-child and exit (source <(acp-child --completions bash))"
    )]
    completions: Option<clap_complete::Shell>,
    #[arg(
        long,
        help = "Print acp-child's man page (roff) and exit (acp-child --man | man -l -)"
    )]
    man: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PermissionArg {
    Relay,
    Reject,
    Allow,
}

/// The man page, rendered from the clap definition by the test below (`ACP_UPDATE_MAN=1` rewrites
/// it) and checked in: acp-child does not link a roff renderer it would run only for `--man`.
const MAN_PAGE: &str = include_str!("../acp-child.1");

/// `--completions SHELL` (generated from the clap definition) and `--man`, printed to stdout
/// (nothing is served then); `None` when neither was asked for.
fn print_docs(cli: &Cli) -> Option<ExitCode> {
    use clap::CommandFactory as _;
    use std::io::Write as _;
    let mut text = Vec::new();
    if let Some(shell) = cli.completions {
        clap_complete::generate(shell, &mut Cli::command(), AGENT_NAME, &mut text);
    } else if cli.man {
        text.extend_from_slice(MAN_PAGE.as_bytes());
    } else {
        return None;
    }
    let mut out = std::io::stdout().lock();
    Some(match out.write_all(&text).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader closed the pipe: it has what it wanted.
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{AGENT_NAME}: error: cannot write to stdout: {error}");
            ExitCode::FAILURE
        }
    })
}

/// The token budget acp-host gave this agent (`ACP_HOST_TOKEN_BUDGET`); a malformed one is taken
/// as nothing left (its children get no room), never as no budget.
fn inherited_token_budget() -> Option<u64> {
    let value = std::env::var_os(protocol::env_vars::ACP_HOST_TOKEN_BUDGET)?;
    let parsed = value.to_str().and_then(|text| text.trim().parse().ok());
    if parsed.is_none() {
        tracing::warn!(
            value = %value.to_string_lossy(),
            "{} is not a number of tokens; subagents get a budget of 0",
            protocol::env_vars::ACP_HOST_TOKEN_BUDGET
        );
    }
    Some(parsed.unwrap_or(0))
}

/// A price per million tokens: a non-negative number.
fn parse_price(arg: &str) -> Result<f64, String> {
    arg.parse::<f64>()
        .ok()
        .filter(|price| price.is_finite() && *price >= 0.0)
        .ok_or_else(|| format!("{arg:?} is not a price (a non-negative number, e.g. 0.27)"))
}

/// The long description in `--help`.
fn long_about() -> String {
    format!(
        "An ACP agent speaking JSON-RPC (ACP v1) on stdin/stdout.

It is meant to be launched by an ACP client such as Zed or acp-host, which writes requests to its \
stdin and reads responses and session updates from its stdout. Run by hand it just waits for \
JSON-RPC frames; close stdin (Ctrl-D) to exit.

With a model (--model or {MODEL_VAR}, or a local server's --base-url alone, whose first listed \
model is used) it is a coding agent backed by any OpenAI-compatible \
Chat Completions API (DeepSeek, OpenAI, llama.cpp, vLLM, Ollama): it streams answers and uses \
tools ({}), asking permission before every write and command. Without a model it runs its \
offline backend: prompts get an explanatory reply, and the offline commands below work.",
        tool_names().join(", ")
    )
}

impl Cli {
    /// The subagents enabled (registry agents, definition folders), standing at the depth this
    /// process inherited. Definitions in a session's `subagents/` folder are always looked at.
    fn subagents(&self) -> Result<Subagents, SubagentError> {
        let budget = match inherited_standing() {
            Ok(standing) => {
                if let Some(past_bound) = standing.past_bound {
                    tracing::warn!(%past_bound, "subagents are not offered");
                }
                Some(standing.budget)
            }
            Err(error) => {
                tracing::warn!(%error, "subagents are not offered");
                None
            }
        };
        Subagents::resolve(SubagentOptions {
            agents: self.subagent_agents.clone(),
            max_parallel: self.max_parallel_subagents,
            permission: match self.subagent_permission {
                PermissionArg::Relay => RunPermission::Relay,
                PermissionArg::Reject => RunPermission::Reject,
                PermissionArg::Allow => RunPermission::Allow,
            },
            env: self.subagent_env.clone(),
            timeout: self.subagent_timeout.map(std::time::Duration::from_secs),
            token_budget: self.subagent_token_budget,
            inherited_token_budget: inherited_token_budget(),
            budget,
            dirs: self
                .subagent_dirs
                .iter()
                .map(|dir| std::path::absolute(dir).unwrap_or_else(|_| dir.clone()))
                .collect(),
            no_background: self.no_background,
            child_idle_timeout: std::time::Duration::from_secs(self.child_idle_timeout),
            sandbox: protocol::sandbox::Policy {
                mode: self.subagent_sandbox.unwrap_or_default(),
                network: self.subagent_network.clone().unwrap_or_default(),
                ..protocol::sandbox::Policy::default()
            },
        })
    }

    fn model_options(self) -> ModelOptions {
        ModelOptions {
            model: self.model,
            models: self.models,
            base_url: self.base_url,
            persona: self.persona,
            max_turn_requests: self.max_turn_requests,
            state_dir: self.state_dir,
            command_timeout_secs: self.command_timeout,
            command_sandbox: self.command_sandbox,
            command_network: self.command_network.clone(),
            no_background: self.no_background,
            max_retries: self.max_retries,
            retry_base_ms: self.retry_base_ms,
            context_window: self.context_window,
            pricing: self
                .price_input
                .zip(self.price_output)
                .map(|(input, output)| protocol::usage::Pricing {
                    input_per_million: input,
                    output_per_million: output,
                    currency: self.price_currency.clone(),
                }),
        }
    }
}

fn after_help() -> String {
    let mut help = format!(
        "Environment:\n  \
         {MODEL_VAR:<20} the model name (same as --model)\n  \
         {BASE_URL_VAR:<20} the base URL (same as --base-url)\n  \
         {:<20} the API key; else {}, else {}; none: no key is sent\n  \
         {STATE_DIR_VAR:<20} the session directory (same as --state-dir)\n\n\
         acp-host passes no keys to its agents unless told: acp-host run --env {} ...\n\
         Base URL default: {DEEPSEEK_BASE_URL} when the key is {}, else {OPENAI_BASE_URL}.\n\n\
         Examples:\n  \
         DEEPSEEK_API_KEY=... acp-child --model deepseek-chat\n  \
         acp-child --model qwen2.5-coder --base-url http://localhost:11434/v1    # Ollama\n  \
         acp-child --base-url http://127.0.0.1:8080/v1    # llama.cpp: the model it serves\n\n",
        KEY_VARIABLES[0], KEY_VARIABLES[1], KEY_VARIABLES[2], KEY_VARIABLES[0], KEY_VARIABLES[1],
    );
    help.push_str("Offline commands (send them as the prompt text):\n");
    for command in COMMANDS_HELP {
        let usage = format!("/{} {}", command.name, command.input);
        // Writing to a String cannot fail.
        let _ = writeln!(help, "  {usage:<21} {}", command.description);
    }
    let _ = write!(
        help,
        "\nLogs go to stderr, filtered by default with {DEFAULT_LOG_FILTER};\nset {LOG_ENV} to a tracing filter instead, e.g. {LOG_ENV}=debug."
    );
    help
}

fn main() -> ExitCode {
    let hardened = acp_host::process::harden_host();
    let cli = Cli::parse();
    if let Some(code) = print_docs(&cli) {
        return code;
    }
    init_logging();
    if let Err(error) = hardened {
        tracing::warn!("{}", describe(&error));
    }
    // A tree of children holds a few descriptors each: 1,024 would cap it near 200.
    if let Some((before, after)) = acp_host::process::raise_open_files() {
        tracing::debug!(
            before,
            after,
            "raised the open-files limit (RLIMIT_NOFILE) to its hard limit"
        );
    }
    let subagents = match cli.subagents() {
        Ok(subagents) => Some(subagents),
        Err(error) => {
            eprintln!("{AGENT_NAME}: error: {}", describe(&error));
            return ExitCode::from(2);
        }
    };
    let config = match ModelConfig::resolve(cli.model_options(), |name| std::env::var(name).ok()) {
        Ok(None) => AgentConfig::offline_with(subagents),
        Ok(Some(model)) => {
            start_spawner();
            tracing::info!(
                model = model.model,
                base_url = model.base_url,
                key_from = model.api_key.as_ref().map_or("none", |key| key.variable),
                state_dir = %model.state_dir.display(),
                "model backend"
            );
            match AgentConfig::model_with(model, subagents) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("{AGENT_NAME}: error: {}", describe(&error));
                    return ExitCode::FAILURE;
                }
            }
        }
        Err(error) => {
            eprintln!("{AGENT_NAME}: error: {}", describe(&error));
            return ExitCode::from(2);
        }
    };
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, error)) => {
            eprintln!("{AGENT_NAME}: error: {error}");
            code
        }
    }
}

/// Starts the spawner while acp-child has one thread (before the serving thread exists): each
/// child's watchdog is then forked from this small copy of acp-child, never from acp-child
/// itself while it serves. Only a model backend does it: its turns fan out to many children at
/// once over a long session, where that pays (docs/benchmarks.md); the offline backend delegates
/// one `/delegate` at a time, and a spawner would only add a fork to every start.
fn start_spawner() {
    if let Err(error) = acp_host::spawner::start() {
        tracing::warn!(
            "{}; watchdogs are forked from acp-child itself",
            describe(&error)
        );
    }
}

/// Serves ACP on stdio on a thread of its own, never on the main thread (see [`orphans`]), then
/// ends what is left below this process; the error is the exit code and the text to print. A
/// model that cannot be discovered (`--base-url` alone) is a configuration error (exit 2),
/// reported before anything is served.
fn serve(config: AgentConfig) -> Result<(), (ExitCode, String)> {
    // After the spawner (the batch processor's thread must not exist when it forks); flushed
    // when dropped, once serving ended.
    let _exporting = start_export();
    let server = std::thread::Builder::new()
        .name("serve".to_owned())
        // The main thread's usual stack: the runtime and the connection's futures ran there.
        .stack_size(8 * 1024 * 1024)
        .spawn(move || {
            // Declared first, so dropped last: after the runtime, on every way out of here.
            let _end = EndAll;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| {
                    (
                        ExitCode::FAILURE,
                        format!("cannot start the async runtime: {error}"),
                    )
                })?;
            let result = runtime.block_on(async {
                if let Err(error) = config.ready().await {
                    return Err((ExitCode::from(2), describe(&error)));
                }
                tokio::spawn(orphans::reap_while_serving());
                serve_stdio(config)
                    .await
                    .map_err(|error| (ExitCode::FAILURE, describe(&error)))
            });
            // tokio reads stdin on a blocking thread that cannot be interrupted; if the
            // connection ended while stdin is still open, a plain drop would wait for one more
            // line. Don't wait.
            runtime.shutdown_background();
            result
        })
        .map_err(|error| {
            (
                ExitCode::FAILURE,
                format!("cannot start the thread that serves: {error}"),
            )
        })?;
    server
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Starts trace export when a collector is named (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...) or
/// `ACP_TRACE_OUT` names a file (docs/observability.md); a failure is a warning, never the end
/// of the session.
fn start_export() -> Exporting {
    let trace_out = std::env::var_os(protocol::env_vars::ACP_TRACE_OUT)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let content = std::env::var(protocol::env_vars::ACP_TRACE_CONTENT).is_ok_and(|v| v == "1");
    match acp_host::telemetry::init(acp_host::telemetry::Settings {
        service: AGENT_NAME,
        trace_out,
        content,
        warn: std::sync::Arc::new(|what: &str| tracing::warn!("{what}")),
    }) {
        Ok(started) => Exporting(started),
        Err(error) => {
            tracing::warn!("{}; spans are not exported", describe(&error));
            Exporting(false)
        }
    }
}

/// Flushes the exported spans when dropped (within `telemetry::FLUSH_TIMEOUT`).
struct Exporting(bool);

impl Drop for Exporting {
    fn drop(&mut self) {
        if self.0 {
            acp_host::telemetry::shutdown();
        }
    }
}

/// Once dropped (the runtime gone, nothing waiting for any child), kills and reaps every
/// process still below acp-child: [`orphans::end_all`].
struct EndAll;

impl Drop for EndAll {
    fn drop(&mut self) {
        // The spawner first: it is a child too, and the sweep would wait a poll for its end.
        acp_host::spawner::stop();
        orphans::end_all();
    }
}

/// Logs to stderr only: stdout belongs to the protocol.
fn init_logging() {
    let (filter, bad_filter) = match std::env::var(LOG_ENV) {
        Ok(directives) => match EnvFilter::try_new(&directives) {
            Ok(filter) => (filter, None),
            Err(error) => (
                EnvFilter::new(DEFAULT_LOG_FILTER),
                Some((directives, error)),
            ),
        },
        Err(_) => (EnvFilter::new(DEFAULT_LOG_FILTER), None),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a human at a terminal, not in a client's captured log.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .init();
    if let Some((directives, error)) = bad_filter {
        tracing::warn!(
            "ignoring {LOG_ENV}={directives:?} ({error}); logging at {DEFAULT_LOG_FILTER}. Use tracing directives such as `debug` or `acp_child=trace`"
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::{Cli, MAN_PAGE};

    /// The checked-in man page is the clap definition's, rendered with the version a build without
    /// a commit shows (a release build's commit would make every commit a change of the page).
    #[test]
    fn the_man_page_is_the_command_lines() {
        let version: &'static str =
            protocol::version::describe(env!("CARGO_PKG_VERSION"), None).leak();
        let mut page = Vec::new();
        clap_mangen::Man::new(Cli::command().version(version))
            .render(&mut page)
            .expect("rendering into memory");
        let page = String::from_utf8(page).expect("roff is text");
        if std::env::var_os("ACP_UPDATE_MAN").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/acp-child.1");
            std::fs::write(path, &page).expect("acp-child.1 is writable");
        } else {
            assert!(
                page == MAN_PAGE,
                "acp-child.1 is stale: rewrite it with ACP_UPDATE_MAN=1 cargo test -p acp-child --bin acp-child"
            );
        }
    }
}
