//! The command line: clap types, conversion into typed configs, rendering, exit codes.
//!
//! Invariants: clap lives only here; each subcommand converts its raw arguments once into the typed
//! config the library takes, then renders the library's result. [`main`] is the one edge every
//! subcommand shares: it sets logging up once (`tracing` to stderr, filtered by `ACP_HOST_LOG`,
//! `info` under `--verbose`, else `warn`), runs the subcommand, and prints a [`CliError`] with one
//! prefix (`acp-host: error: ...`) and its exit code. A broken stdout pipe (`| head`) is never an
//! error ([`write_stdout`]); a broken stderr never panics (every diagnostic goes through `note!`).

/// `eprintln!` that never panics. stderr closed or failing (`2>&-`, a reader that went away) must
/// not crash a run or a batch, nor kill the task that handles Ctrl-C / SIGTERM (a panic there left
/// acp-host deaf to signals); the line is then lost, nothing else.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics (see [`note!`]).
macro_rules! note_text {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod agents;
mod batch;
mod docs;
mod remote;
mod run;
mod sandbox;
mod subagent;
mod sync;
mod trace;
mod trust;
mod worktrees;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::LazyLock;

use clap::{Parser, Subcommand};
use protocol::status::{EXIT_USAGE, Status};

/// `--version`: the version, the commit when known, the ACP protocol version.
static VERSION: LazyLock<String> =
    LazyLock::new(|| acp_host::version_text(env!("CARGO_PKG_VERSION")));

/// `acp-host --help`'s first steps.
const AFTER_HELP: &str = "\
Examples:
  acp-host run \"hello\"                          one prompt to acp-child (offline until it has a model)
  acp-host run --agent codex \"fix the tests\"    the same prompt to another agent
  acp-host agents                               the agents acp-host knows, and which are installed
  acp-host batch jobs.ndjson > results.ndjson   many prompts, one agent each (see batch --help)

`acp-host COMMAND --help` says more, with each command's exit codes.";

/// Run ACP agents as out-of-process subagents, and keep subagent definitions in sync.
#[derive(Debug, Parser)]
#[command(name = "acp-host", version = VERSION.as_str(), propagate_version = true,
          after_help = AFTER_HELP)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The command line of `acp-host run ...` alone: [`Cli`] with its one subcommand `run`, declared
/// like it (a test holds the two to the same help and errors). A one-shot run parses with it, so it
/// does not build the arguments of every other subcommand first (clap builds the whole tree before
/// it parses: about a tenth of a one-shot run's instructions in the host).
#[derive(Debug, Parser)]
#[command(name = "acp-host", version = VERSION.as_str(), propagate_version = true)]
struct RunOnly {
    #[command(subcommand)]
    command: RunCommand,
}

#[derive(Debug, Subcommand)]
enum RunCommand {
    // As in `Command`.
    #[command(args_override_self = true)]
    Run(Box<run::RunArgs>),
}

/// Parses argv: with [`RunOnly`] when it names `run` (what it parses is then exactly what [`Cli`]
/// would), else with the whole [`Cli`].
fn parse() -> Result<Command, clap::Error> {
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "run") {
        let RunOnly {
            command: RunCommand::Run(args),
        } = RunOnly::try_parse()?;
        return Ok(Command::Run(args));
    }
    Cli::try_parse()
        .map(|cli| cli.command)
        .map_err(with_suggestion)
}

/// A misspelled subcommand clap found nothing close to (its own measure is Jaro's: `rn` is not
/// close to `run`), given the visible subcommands at most a couple of edits away
/// (`protocol::suggest`), in clap's own "tip: a similar subcommand exists" line.
fn with_suggestion(mut err: clap::Error) -> clap::Error {
    use clap::CommandFactory as _;
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidSubcommand
        || err.get(ContextKind::SuggestedSubcommand).is_some()
    {
        return err;
    }
    let Some(ContextValue::String(word)) = err.get(ContextKind::InvalidSubcommand) else {
        return err;
    };
    let command = Cli::command();
    let names = command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(clap::Command::get_name);
    let close: Vec<String> = protocol::suggest::closest(word, names)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if !close.is_empty() {
        err.insert(
            ContextKind::SuggestedSubcommand,
            ContextValue::Strings(close),
        );
    }
    err
}

#[derive(Debug, Subcommand)]
enum Command {
    // A flag given twice takes its last value, so wrappers can append overrides.
    #[command(args_override_self = true)]
    Run(Box<run::RunArgs>),
    #[command(args_override_self = true)]
    Batch(batch::BatchArgs),
    Sync(sync::SyncArgs),
    Agents(agents::AgentsArgs),
    Trust(trust::TrustArgs),
    Worktrees(worktrees::WorktreesArgs),
    Completions(docs::CompletionsArgs),
    Man(docs::ManArgs),
    Serve(remote::ServeArgs),
    /// The agent process of `acp-host run --agent ws://...` (not for direct use).
    #[command(hide = true)]
    Bridge(remote::BridgeArgs),
}

impl Command {
    /// Whether the subcommand asked for `--verbose` (the log level `info` instead of `warn`).
    fn verbose(&self) -> bool {
        match self {
            Command::Run(args) => args.verbose(),
            Command::Batch(_)
            | Command::Sync(_)
            | Command::Agents(_)
            | Command::Trust(_)
            | Command::Worktrees(_)
            | Command::Completions(_)
            | Command::Man(_)
            | Command::Serve(_)
            | Command::Bridge(_) => false,
        }
    }
}

/// Why a subcommand failed; printed once by [`main`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Bad flags or arguments: nothing was done (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The command could not do its work (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Failed(_) => Status::Error.exit_code(),
        })
    }
}

pub fn main() -> ExitCode {
    let command = match parse() {
        Ok(command) => command,
        Err(err) => {
            // clap prints help/version to stdout and usage errors to stderr; map its codes onto ours.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(command.verbose());
    // Before the runtime and any thread: the commands that run many agents fork each one's
    // watchdog from this small copy of acp-host, never from acp-host itself while it works. A
    // one-shot `run` forks its one watchdog itself: a spawner would add a round trip to its
    // start and save it nothing (docs/benchmarks.md).
    let spawner =
        matches!(command, Command::Batch(_) | Command::Serve(_)).then(acp_host::spawner::start);
    if let Some(Err(err)) = spawner {
        tracing::warn!(
            "{}; watchdogs are forked from acp-host itself",
            protocol::report::describe(&err)
        );
    }
    let outcome = match command {
        Command::Run(args) => run::execute(&args),
        Command::Batch(args) => batch::execute(&args),
        Command::Sync(args) => sync::execute(&args),
        Command::Agents(args) => agents::execute(&args),
        Command::Trust(args) => trust::execute(&args),
        Command::Worktrees(args) => worktrees::execute(&args),
        Command::Completions(args) => docs::completions(&args),
        Command::Man(args) => docs::man(&args),
        Command::Serve(args) => remote::execute_serve(&args),
        Command::Bridge(args) => remote::execute_bridge(&args),
    };
    // Every agent is torn down by now: the spawner is reaped here, like every other child, not
    // left to whoever adopts it.
    acp_host::spawner::stop();
    outcome.unwrap_or_else(|err| {
        note!("{}{err}", protocol::remote::ERROR_PREFIX);
        err.exit_code()
    })
}

fn init_logging(verbose: bool) {
    // `--verbose` shows the SDK's warnings too (a peer's unanswered optional method).
    let default = if verbose {
        "info"
    } else {
        protocol::env_vars::DEFAULT_LOG_FILTER
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env(protocol::env_vars::ACP_HOST_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file or CI capture gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Writes a listing to stdout: pretty JSON with `--json` (`json`), else its `human` text.
pub(crate) fn write_listing(
    json: bool,
    listing: &impl serde::Serialize,
    human: impl FnOnce() -> String,
) -> Result<ExitCode, CliError> {
    let text = if json {
        let mut json = serde_json::to_string_pretty(listing)
            .map_err(|err| CliError::Failed(format!("cannot serialize the listing: {err}")))?;
        json.push('\n');
        json
    } else {
        human()
    };
    write_stdout(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// How a write to stdout went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Done,
    /// The reader closed the pipe (`| head`): it has what it wanted; stop writing, no error.
    Closed,
}

/// Writes to stdout and flushes. A closed pipe is not an error ([`Written::Closed`]); any other
/// failure is.
pub(crate) fn write_stdout(bytes: &[u8]) -> Result<Written, CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(Written::Done),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(Written::Closed),
        Err(err) => Err(CliError::Failed(format!("cannot write to stdout: {err}"))),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::{Cli, RunOnly};

    /// `run` parsed alone must be `run` parsed with the whole tree: same help, same errors, same
    /// version.
    #[test]
    fn the_run_only_parser_is_the_whole_trees_run() {
        let whole = || Cli::command();
        let alone = || RunOnly::command();
        let run_of = |mut command: clap::Command| {
            command.build();
            command
                .find_subcommand_mut("run")
                .expect("a run subcommand")
                .clone()
        };
        let (mut a, mut b) = (run_of(whole()), run_of(alone()));
        assert_eq!(
            a.render_long_help().to_string(),
            b.render_long_help().to_string()
        );
        assert_eq!(a.render_help().to_string(), b.render_help().to_string());
        assert_eq!(a.render_usage().to_string(), b.render_usage().to_string());
        assert_eq!(a.get_version(), b.get_version());
        for argv in [
            &["acp-host", "run"][..],
            &["acp-host", "run", "--nope", "hi"],
            &["acp-host", "run", "--timeout", "x", "hi"],
            &["acp-host", "run", "--help"],
            &["acp-host", "run", "-h"],
            &["acp-host", "run", "--version"],
            &["acp-host", "run", "--json", "--json", "hi"],
            &["acp-host", "run", "--resume", "a", "--fork", "b", "hi"],
            &["acp-host", "run", "--schema-retries", "2", "hi"],
        ] {
            let render = |result: Result<clap::ArgMatches, clap::Error>| match result {
                // The run subcommand's matches (the top level's list every subcommand it knows).
                Ok(matches) => format!("{:?}", matches.subcommand()),
                Err(err) => format!("{:?}: {}", err.kind(), err.render()),
            };
            assert_eq!(
                render(whole().try_get_matches_from(argv)),
                render(alone().try_get_matches_from(argv)),
                "{argv:?}"
            );
        }
    }
}
