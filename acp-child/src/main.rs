//! The `acp-child` binary: parses the command line, sends logs to stderr, and serves ACP on
//! stdio until stdin closes (exit code 0) or the connection fails (exit code 1).

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::process::ExitCode;

use acp_child::command::COMMANDS_HELP;
use acp_child::{AGENT_NAME, AgentConfig, describe, serve_stdio};
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// The environment variable holding the log filter (`tracing` directives, e.g. `debug`).
const LOG_ENV: &str = "ACP_CHILD_LOG";

/// An ACP agent speaking JSON-RPC (ACP v1) on stdin/stdout.
///
/// It is meant to be launched by an ACP client such as Zed or acp-host, which writes requests to
/// its stdin and reads responses and session updates from its stdout. Run by hand it just waits
/// for JSON-RPC frames; close stdin (Ctrl-D) to exit.
///
/// No model is configured yet (a model backend via an OpenAI-compatible API is planned); prompts
/// get an explanatory reply, and the offline commands below work now.
#[derive(Debug, Parser)]
#[command(name = AGENT_NAME, version, after_help = after_help())]
struct Cli {}

fn after_help() -> String {
    let mut help = String::from("Offline commands (send them as the prompt text):\n");
    for command in COMMANDS_HELP {
        let usage = format!("/{} {}", command.name, command.input);
        // Writing to a String cannot fail.
        let _ = writeln!(help, "  {usage:<18} {}", command.description);
    }
    let _ = write!(
        help,
        "\nLogs go to stderr; set {LOG_ENV} to a tracing filter (default: warn), e.g. {LOG_ENV}=debug."
    );
    help
}

fn main() -> ExitCode {
    let Cli {} = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{AGENT_NAME}: error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve_stdio(AgentConfig::offline()));
    // tokio reads stdin on a blocking thread that cannot be interrupted; if the connection ended
    // while stdin is still open, a plain drop would wait for one more line. Don't wait.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{AGENT_NAME}: error: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr only: stdout belongs to the protocol.
fn init_logging() {
    let (filter, bad_filter) = match std::env::var(LOG_ENV) {
        Ok(directives) => match EnvFilter::try_new(&directives) {
            Ok(filter) => (filter, None),
            Err(error) => (EnvFilter::new("warn"), Some((directives, error))),
        },
        Err(_) => (EnvFilter::new("warn"), None),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a human at a terminal, not in a client's captured log.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .init();
    if let Some((directives, error)) = bad_filter {
        tracing::warn!(
            "ignoring {LOG_ENV}={directives:?} ({error}); logging at warn. Use tracing directives such as `debug` or `acp_child=trace`"
        );
    }
}
