//! `acp-host serve` (any stdio agent behind ACP's HTTP/WebSocket transport) and the hidden
//! `acp-host bridge URL` (the agent process `acp-host run --agent ws://...` spawns).
//!
//! Invariants: a token is read from a file or a variable, never taken from the command line, and
//! never printed; `serve` refuses to start without a token unless `--insecure-no-auth` on a
//! loopback address (`protocol::remote::check_listen`), and says where it listens on stderr once
//! it does (`acp-host serve: listening on ws://ADDR/acp`); the first SIGINT/SIGTERM stops it
//! after every agent was torn down. The bridge writes nothing but frames to stdout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use acp_host::agents::{self, HostFacts};
use acp_host::process::Graces;
use acp_host::remote::bridge::{self, BridgeConfig};
use acp_host::remote::serve::{self, ServeConfig, Server};
use acp_host::run;
use protocol::env_scrub::EnvForward;
use protocol::permission::PermissionPolicy;
use protocol::registry;
use protocol::remote::{self, DEFAULT_MAX_CONNECTIONS};
use protocol::request::{StartRequest, Timeouts};
use tokio_util::sync::CancellationToken;

use super::CliError;
use super::run::{Seconds, parse_seconds};
use super::sandbox::SandboxArgs;

/// Serve a stdio ACP agent over ACP's Streamable HTTP / WebSocket transport.
///
/// Each connection gets its own agent process, owned as `acp-host run` owns one (scrubbed
/// environment, own process group, watchdog, teardown of its whole tree when the connection
/// closes or the server stops). Clients connect with `acp-host run --agent ws://ADDR/acp
/// --token-file FILE` (or any ACP client of the transport). TLS is a reverse proxy's job.
#[derive(Debug, clap::Args)]
#[command(after_long_help = serve_after_help())]
pub(super) struct ServeArgs {
    /// The address to listen on (port 0: any free port, printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8765")]
    listen: SocketAddr,

    /// The agent each connection gets: a registry name (see `acp-host agents`) or a command line,
    /// split shell-style.
    #[arg(long, value_name = "NAME|COMMAND-LINE", default_value = registry::ACP_CHILD)]
    agent: String,

    /// Require the bearer token in FILE (one line) on every request: 401 without it.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,

    /// Serve without a token; allowed on a loopback address only (anyone who can reach it runs
    /// the agent as you).
    #[arg(long)]
    insecure_no_auth: bool,

    /// Agents running at once, at most; a connection past it is refused (503).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,

    /// Working directory of the agents (default: the current directory). A session's own
    /// directory is the client's, taken as a path on this machine.
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Forward a variable to the agents: NAME passes this environment's value, NAME=VALUE sets
    /// one. Repeatable. Credential-shaped variables are withheld unless forwarded like this.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,

    /// Teardown: after closing an agent's stdin, wait this long for it to exit by itself.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().eof_grace))]
    eof_grace: Seconds,

    /// Teardown: after SIGTERM to an agent's process group, wait this long before SIGKILL.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().term_grace))]
    term_grace: Seconds,

    /// Over http://, end a connection and its agent once it has had no event stream open for
    /// this long (a client that vanished; a WebSocket's end is seen at once).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(STREAM_GRACE))]
    stream_grace: Seconds,

    /// A client that takes none of its agent's output for this long, while output waits for it,
    /// is taken for dead: its connection and agent end. A slower client only slows its agent
    /// down (the server stops reading the agent's output while a client lags).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(STALL_TIMEOUT))]
    stall_timeout: Seconds,

    /// A connection that has made no authenticated request this long after it opened (its
    /// headers sent slowly, or never) is closed; at most 128 such connections are open at once,
    /// the oldest closed first.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(HEADER_TIMEOUT))]
    header_timeout: Seconds,

    /// The sandbox of every connection's agent (each gets its own temporary folder).
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// Default `--header-timeout`: an honest client sends its headers at once.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Default `--stream-grace`: room for a client to reopen a dropped event stream.
const STREAM_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Default `--stall-timeout`: far beyond any live client's pause, short of holding a slot for ever.
const STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(2);

const SERVE_AFTER_HELP: &str = "\
Examples:
  acp-host serve --token-file ~/.config/acp/token --agent acp-child
  acp-host run --agent ws://127.0.0.1:8765/acp --token-file ~/.config/acp/token \"hello\"
  acp-host serve --insecure-no-auth --listen 127.0.0.1:0 --agent codex

The token file holds one line; clients send it as `Authorization: Bearer TOKEN`. Connections are
logged at info (ACP_HOST_LOG=info). docs/remote.md shows a reverse proxy for TLS and what does
not cross the connection.
";

fn serve_after_help() -> String {
    format!(
        "{SERVE_AFTER_HELP}\n{}",
        protocol::exit_table::Documented::Serve.exit_table()
    )
}

/// The agent end of a remote agent: relays stdin/stdout to the URL (run by `acp-host run`).
#[derive(Debug, clap::Args)]
pub(super) struct BridgeArgs {
    /// ws://, wss://, http:// or https://; an empty path means /acp.
    url: String,

    /// The bearer token is in FILE (one line).
    #[arg(long, value_name = "FILE", conflicts_with = "token_env")]
    token_file: Option<PathBuf>,

    /// The bearer token is the value of the variable NAME.
    #[arg(long, value_name = "NAME")]
    token_env: Option<String>,
}

pub(super) fn execute_bridge(args: &BridgeArgs) -> Result<ExitCode, CliError> {
    let token = match (&args.token_file, &args.token_env) {
        (Some(path), _) => Some(bridge::token_from_file(path).map_err(usage)?),
        (None, Some(name)) => {
            let value = std::env::var(name).ok();
            Some(bridge::token_from_var(name, value.as_deref()).map_err(usage)?)
        }
        (None, None) => None,
    };
    let runtime = current_thread()?;
    let outcome = runtime.block_on(bridge::bridge(BridgeConfig {
        url: args.url.clone(),
        token,
    }));
    // The stdin reader may be parked in a read that never returns (the server ended first).
    runtime.shutdown_background();
    // The error reaches the run's stderr tail: the URL's secrets are not shown.
    let (_, secrets) = remote::shown_url(&args.url);
    outcome.map(|()| ExitCode::SUCCESS).map_err(|err| {
        CliError::Failed(remote::redact_url_secrets(
            &protocol::report::describe(&err),
            &secrets,
        ))
    })
}

/// What every connection's agent is started from: its environment, delegation standing and
/// sandbox, as `acp-host run` would compute them.
fn served_request(
    args: &ServeArgs,
    agent: &protocol::request::AgentCommand,
    cwd: &std::path::Path,
) -> Result<StartRequest, CliError> {
    let env = args
        .env
        .iter()
        .map(|arg| EnvForward::parse(arg).map_err(usage))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(StartRequest {
        agent: agent.clone(),
        prompt: String::new(),
        cwd: cwd.to_path_buf(),
        env,
        permission: PermissionPolicy::Reject,
        timeouts: Timeouts::default(),
        max_depth: None,
        wants: protocol::capabilities::Wants::default(),
        resume: None,
        fork: None,
        budget: protocol::usage::Budget::default(),
        on_unreported: protocol::usage::Unreported::default(),
        sandbox: args
            .sandbox
            .policy(&run::resolve_cwd(None).map_err(usage)?)
            .map_err(CliError::Usage)?,
    })
}

pub(super) fn execute_serve(args: &ServeArgs) -> Result<ExitCode, CliError> {
    let token = args
        .token_file
        .as_deref()
        .map(bridge::token_from_file)
        .transpose()
        .map_err(|err| CliError::Usage(format!("--token-file: {err}")))?;
    if let (Some(path), Some(token)) = (&args.token_file, &token) {
        remote::check_serve_token(token).map_err(|err| {
            CliError::Usage(format!(
                "--token-file: the token in {} {err}",
                protocol::report::printable_path(path)
            ))
        })?;
        warn_if_exposed(path);
    }
    remote::check_listen(
        args.listen,
        token.is_some(),
        args.insecure_no_auth,
        args.max_connections,
    )
    .map_err(usage)?;
    let resolved = agents::resolve(&args.agent, &HostFacts::from_env()).map_err(usage)?;
    // Every connection would fail to start it: say so once, before listening.
    if let Some(problem) = resolved.not_found() {
        return Err(CliError::Usage(problem));
    }
    let cwd = run::resolve_cwd(args.cwd.as_deref()).map_err(usage)?;
    let request = served_request(args, &resolved.command, &cwd)?;
    let prepared = run::prepare(request, std::env::vars_os()).map_err(usage)?;
    // A sandbox this kernel cannot hold is said before anything listens.
    let sandbox = acp_host::sandbox::foresee(prepared.sandbox())
        .map_err(|err| CliError::Failed(err.to_string()))?;
    if let Err(err) = prepared.budget() {
        return Err(CliError::Usage(format!(
            "the served agents may not start: {err}"
        )));
    }
    let config = ServeConfig {
        agent: resolved.command,
        cwd,
        prepared,
        token,
        max_connections: args.max_connections,
        graces: Graces {
            eof: args.eof_grace.0,
            term: args.term_grace.0,
        },
        stream_grace: args.stream_grace.0,
        stall_timeout: args.stall_timeout.0,
        header_timeout: args.header_timeout.0,
    };
    // The main thread: agents are spawned on it, and it lives as long as the server (see
    // `Server::run`).
    let runtime = current_thread()?;
    let outcome = runtime.block_on(async {
        let stop = CancellationToken::new();
        watch_signals(stop.clone())?;
        let server = Server::bind(args.listen, config)
            .await
            .map_err(|err| CliError::Failed(err.to_string()))?;
        let addr = server
            .local_addr()
            .map_err(|err| CliError::Failed(format!("cannot read the bound address: {err}")))?;
        note!(
            "acp-host serve: listening on ws://{addr}{} (agent: {}, at most {} at once)",
            serve::ENDPOINT,
            args.agent,
            args.max_connections
        );
        if let Some(sandbox) = &sandbox {
            note!(
                "acp-host serve: every agent runs in its own {}",
                sandbox.describe()
            );
        }
        server
            .run(stop)
            .await
            .map_err(|err| CliError::Failed(err.to_string()))
    });
    runtime.shutdown_background();
    outcome.map(|()| ExitCode::SUCCESS)
}

/// A token file others can read is a token others may have: said once, at start.
fn warn_if_exposed(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = std::fs::metadata(path)
        && remote::token_file_exposed(meta.permissions().mode())
    {
        note!(
            "acp-host serve: warning: the token file {} can be read by other users (mode {:o}); \
             make it yours alone: chmod 600 {}",
            protocol::report::printable_path(path),
            meta.permissions().mode() & 0o777,
            protocol::report::printable_path(path)
        );
    }
}

/// SIGINT or SIGTERM stops the server (its agents are torn down first).
fn watch_signals(stop: CancellationToken) -> Result<(), CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let cannot = |err: std::io::Error| CliError::Failed(format!("cannot handle signals: {err}"));
    let mut int = signal(SignalKind::interrupt()).map_err(cannot)?;
    let mut term = signal(SignalKind::terminate()).map_err(cannot)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        note!("acp-host serve: stopping (ending every connection and its agent)");
        stop.cancel();
    });
    Ok(())
}

fn current_thread() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| CliError::Failed(format!("cannot start the async runtime: {err}")))
}

fn usage(err: impl std::fmt::Display) -> CliError {
    CliError::Usage(err.to_string())
}
