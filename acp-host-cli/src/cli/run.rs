//! `acp-host run`: argv -> a validated start request -> the library's run -> rendering -> exit code.
//!
//! Invariants: usage errors (bad flags, cwd, `--env`, agent) exit 2 before anything is spawned;
//! human mode writes only the agent's message text to stdout, as it arrives; `--json` writes one
//! event per line and the result record last; diagnostics go to stderr; a closed stdout pipe is
//! not an error (the renderer stops writing and the run goes on); the first Ctrl-C/SIGTERM cancels
//! gracefully, the second kills at once, at any stage (the handlers are installed before anything
//! else). Stdout is written on the library's observer thread, so a stalled reader slows the agent
//! down and never blocks a signal or the timeout; at the end the result waits for stdout only
//! until a signal comes (or briefly, after a timeout). Errors before the run are returned to the
//! CLI edge.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acp_host::agents::HostFacts;
use acp_host::remote::bridge;
use acp_host::run::{self, Cancel, RunOptions};
use protocol::batch::BatchLine;
use protocol::capabilities::{Persona, PersonaMode, ToolFilter, Wants};
use protocol::definition::{Isolation, RunPermission, RunSettings};
use protocol::env_scrub::{self, EnvForward};
use protocol::permission::PermissionPolicy;
use protocol::registry;
use protocol::remote::{self, TokenSource};
use protocol::request::{AgentCommand, StartRequest, Timeouts};
use protocol::result::DEFAULT_MAX_OUTPUT_BYTES;
use protocol::status::Status;
use protocol::structured::{DEFAULT_SCHEMA_RETRIES, OutputSpec};
use protocol::usage::{Budget, CostLimit};

use super::sandbox::SandboxArgs;
use super::{CliError, subagent};

mod ask;
mod live;
mod render;

use render::Renderer;

/// Drive one ACP agent on one prompt, as an out-of-process subagent.
///
/// The agent is spawned fresh in its own process group with a scrubbed environment, driven through
/// initialize -> session/new -> session/prompt, and always torn down (stdin EOF -> SIGTERM ->
/// SIGKILL of its whole group) before acp-host exits.
#[derive(Debug, clap::Args)]
#[command(after_long_help = after_help())]
pub(super) struct RunArgs {
    /// The prompt, or `-` to read it from stdin.
    #[arg(value_name = "PROMPT | -")]
    prompt: String,

    /// A registry name (see `acp-host agents`) or a command line, split shell-style [default:
    /// acp-child, or the --subagent definition's agent]; or a remote agent's URL (ws://, wss://,
    /// http://, https://; e.g. `acp-host serve`'s).
    #[arg(long, value_name = "NAME|COMMAND-LINE|URL")]
    agent: Option<String>,

    /// With a remote --agent URL: send the token in FILE (one line) as a bearer token.
    #[arg(long, value_name = "FILE", conflicts_with = "token_env")]
    token_file: Option<PathBuf>,

    /// With a remote --agent URL: send the value of the variable NAME as a bearer token (it
    /// reaches the connection only, never an agent).
    #[arg(long, value_name = "NAME")]
    token_env: Option<String>,

    /// Run as subagent NAME: its definition (`NAME.md` in ./subagents/ or a --subagents folder,
    /// with a `run:` table) gives the agent, persona, model, permission, env, timeout and depth
    /// limit; flags given here win. One in ./subagents/ is repository content: it runs only once
    /// approved (`acp-host trust --approve`), and its permission only ever lowers --permission.
    #[arg(long, value_name = "NAME")]
    subagent: Option<String>,

    /// A folder of subagent definitions for --subagent, after ./subagents/ (repeatable).
    #[arg(long = "subagents", value_name = "DIR")]
    subagent_dirs: Vec<PathBuf>,

    /// The agent's persona, read from FILE: sent as its session system prompt when it takes one,
    /// else before the prompt (see --persona-mode) [default: the --subagent definition's body].
    #[arg(long, value_name = "FILE")]
    persona: Option<PathBuf>,

    /// append: add the persona to the agent's instructions, falling back to a preamble of the
    /// prompt; strict: the same without the fallback (refused instead); override: replace the
    /// agent's default instructions (refused when it cannot) [default: append, or the definition's].
    #[arg(long, value_enum, value_name = "MODE")]
    persona_mode: Option<PersonaModeArg>,

    /// Select this model through the agent's session config option of category model; refused
    /// when the agent does not offer it [default: the --subagent definition's].
    #[arg(long, value_name = "NAME")]
    model: Option<String>,

    /// Only these tools (comma-separated; '' for none). Needs an agent honouring acp-host's
    /// start extension (acp-child does); refused otherwise.
    #[arg(long, value_name = "NAME,...")]
    tools: Option<String>,

    /// Never these tools (comma-separated); wins over --tools. Refused like --tools.
    #[arg(long, value_name = "NAME,...")]
    deny_tools: Option<String>,

    /// Ask for an answer matching this JSON Schema (a JSON file): through the agent's capture tool
    /// where it has one (acp-child), else by instruction and extraction from its text. Stdout then
    /// carries exactly the value, as one line of JSON (--verbose shows the text on stderr).
    #[arg(long, value_name = "FILE")]
    output_schema: Option<PathBuf>,

    /// Follow-up prompts, in the same session, after an answer that does not match
    /// --output-schema; then the run ends schema-mismatch (exit 6).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SCHEMA_RETRIES,
          requires = "output_schema")]
    schema_retries: u32,

    /// Continue the agent's saved session with this id (a result's `sessionId`) instead of
    /// starting a new one; the agent must support loading sessions (ACP `loadSession`). The replayed
    /// history is not printed.
    #[arg(long, value_name = "SESSION_ID")]
    resume: Option<String>,

    /// Start from a copy of the agent's session with this id (a result's `sessionId`): the new
    /// session knows its completed turns and the source is left as it was; the agent must support
    /// forking sessions (ACP `sessionCapabilities.fork`). The result's `sessionId` is the new one.
    #[arg(long, value_name = "SESSION_ID", conflicts_with = "resume")]
    fork: Option<String>,

    /// Working directory of the agent and of its session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Forward a variable to the agent: NAME passes this environment's value, NAME=VALUE sets one.
    /// Repeatable. Credential-shaped variables are withheld unless forwarded like this.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,

    /// How to answer the agent's permission requests. `ask` prompts on the terminal and rejects
    /// when there is none [default: reject, or a --subagents folder's definition's (relay:
    /// ask)]. `allow` also approves a ./subagents/ definition.
    #[arg(long, value_enum)]
    permission: Option<PolicyArg>,

    /// Give up after this many seconds: the agent is cancelled and torn down (exit 124).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    timeout: Option<Seconds>,

    /// initialize and session/new (session/load with --resume) must answer within this many
    /// seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().handshake))]
    handshake_timeout: Seconds,

    /// After cancelling, wait this long for the agent to acknowledge before tearing it down.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().cancel_grace))]
    cancel_grace: Seconds,

    /// Teardown: after closing the agent's stdin, wait this long for it to exit by itself.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().eof_grace))]
    eof_grace: Seconds,

    /// Teardown: after SIGTERM to the agent's process group, wait this long before SIGKILL.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = Seconds(Timeouts::default().term_grace))]
    term_grace: Seconds,

    /// The deepest a chain of agents starting agents may go (0: the agent may not delegate). It
    /// can only lower the limit inherited from a parent agent (`ACP_HOST_MAX_DEPTH`); default 1.
    /// Also asked of the agent through the acp-host/start extension: refused (exit 1) when the
    /// agent does not honour it.
    #[arg(long, value_name = "N")]
    max_depth: Option<u32>,

    /// Cancel the run once the tokens the agent reports (its subagents' included, when it counts
    /// them) pass N: status over-budget (exit 7). An agent that holds its budget itself (the
    /// start extension's budget: acp-child) is handed it and stops before a request would pass
    /// it. An agent that reports no usage by the end of its first reply cannot be held to it:
    /// see --on-unreported. A --subagent definition's tokenBudget only ever lowers it [default:
    /// none, or the definition's].
    #[arg(long, value_name = "N")]
    token_budget: Option<u64>,

    /// Cancel the run once the cost the agent reports passes AMOUNT (in the agent's currency):
    /// status over-budget (exit 7). An agent that reports no cost cannot be held to it: see
    /// --on-unreported.
    #[arg(long, value_name = "AMOUNT", value_parser = parse_amount)]
    cost_budget: Option<f64>,

    /// With a budget, what to do when the agent has reported no usage (no cost, for
    /// --cost-budget) by the end of its first reply (its first prompt answer): error cancels the
    /// run (status error, errorKind budget, exit 1); warn lets it run and warns in the result.
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = UnreportedArg::Error)]
    pub(super) on_unreported: UnreportedArg,

    /// With --json, the result keeps at most this many bytes of the agent's text (the end;
    /// `outputTruncatedBytes` says how much was dropped). Stdout streams everything regardless.
    /// With --output-schema, also the most bytes of a turn's text the answer is read from.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_OUTPUT_BYTES)]
    max_output: usize,

    /// Write NDJSON events to stdout (start, updates, permissions), then a result record.
    #[arg(long)]
    json: bool,

    /// Show thoughts, tool calls, plans, permission decisions and the agent's stderr on stderr.
    #[arg(short, long)]
    verbose: bool,

    /// How the children the agent runs are shown on stderr: tree (each child's state, time,
    /// tokens, cost and last line, redrawn in place under the answer; drawn on a terminal only,
    /// plain lines elsewhere or with --verbose), plain (one line per change of a child's state),
    /// off. auto: tree on a terminal, plain otherwise, off with --verbose (whose own lines say
    /// when each child starts and ends).
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,

    #[command(flatten)]
    sandbox: SandboxArgs,

    /// Continue this W3C trace (`00-<trace id>-<span id>-<flags>`): the run's span is its child
    /// and the agent gets the run's context in `_meta` of every request. Default: $TRACEPARENT
    /// (with $TRACESTATE), else a new trace.
    #[arg(long, value_name = "TRACEPARENT")]
    traceparent: Option<String>,

    /// Append this run's spans (and every acp-child's below it) to FILE as OTLP/JSON lines, one
    /// `ExportTraceServiceRequest` a line (the OTLP file format), beside any collector named by
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (docs/observability.md).
    #[arg(long, value_name = "FILE")]
    trace_out: Option<PathBuf>,

    /// Put tool call titles, arguments and results into exported spans (off: only tool names
    /// and statuses, never file contents or command lines).
    #[arg(long)]
    trace_content: bool,

    /// Run the agent in a git worktree of its own, made from HEAD under the repository's
    /// .acp-host/worktrees/NAME/ on a new branch acp/NAME (NAME: made from the prompt when not
    /// given; a taken one gets -2, -3, ...). Unchanged at the end: removed with its branch;
    /// changed: committed on the branch and kept (see `acp-host worktrees`).
    #[arg(long, value_name = "NAME", num_args = 0..=1, require_equals = true,
          default_missing_value = "")]
    worktree: Option<String>,

    /// With --worktree: start it from this commit, branch or tag instead of HEAD.
    #[arg(long, value_name = "REF", requires = "worktree")]
    worktree_base: Option<String>,

    /// With --worktree: leave the agent's changes uncommitted (staged) in the kept worktree.
    #[arg(long, requires = "worktree")]
    worktree_keep_dirty: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PersonaModeArg {
    Append,
    Strict,
    Override,
}

impl From<PersonaModeArg> for PersonaMode {
    fn from(arg: PersonaModeArg) -> Self {
        match arg {
            PersonaModeArg::Append => PersonaMode::Append,
            PersonaModeArg::Strict => PersonaMode::Strict,
            PersonaModeArg::Override => PersonaMode::Override,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProgressArg {
    Auto,
    Tree,
    Plain,
    Off,
}

impl From<ProgressArg> for protocol::live::Progress {
    fn from(arg: ProgressArg) -> Self {
        match arg {
            ProgressArg::Auto => Self::Auto,
            ProgressArg::Tree => Self::Tree,
            ProgressArg::Plain => Self::Plain,
            ProgressArg::Off => Self::Off,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum PolicyArg {
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
Sandbox:\n  Off unless asked: the agent can then do what you can. Turn it on with\n  \
--sandbox workspace-write --network off (or tcp:443 for a model API): the kernel (Landlock,\n  \
seccomp) keeps the agent and all it starts to writing its working directory, out of\n  \
~/.ssh, ~/.aws and the other credential folders, and off the network. It bounds files and\n  \
TCP; it is not a VM (docs/sandbox.md).\n\n\
Examples:\n  acp-host run \"hello\"\n  \
acp-host run --sandbox workspace-write --network off --permission allow \"fix the tests\"\n  \
acp-host run --worktree=fix-login --permission allow \"fix the login bug\"\n  \
echo 'summarise README.md' | acp-host run --agent codex -\n  \
acp-host run --agent 'npx @zed-industries/claude-code-acp' --permission allow \"fix the tests\"\n  \
acp-host run --env DEEPSEEK_API_KEY --json --timeout 600 \"review this diff\"\n",
        protocol::exit_table::Documented::Run.exit_table(),
        env_scrub::help_section()
    )
}

/// A duration given in (possibly fractional) seconds; displayed the same way, so `--help` shows
/// the defaults of [`Timeouts::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seconds(pub(super) Duration);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.as_secs_f64())
    }
}

pub(super) fn parse_amount(arg: &str) -> Result<f64, String> {
    arg.parse::<f64>()
        .ok()
        .filter(|amount| amount.is_finite() && *amount >= 0.0)
        .ok_or_else(|| format!("{arg:?} is not an amount (a non-negative number, e.g. 0.50)"))
}

pub(super) fn parse_seconds(arg: &str) -> Result<Seconds, String> {
    let seconds: f64 = arg
        .parse()
        .map_err(|_| format!("{arg:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds)
        .map(Seconds)
        .map_err(|_| format!("{arg:?} must be a non-negative number of seconds"))
}

impl RunArgs {
    pub(super) fn verbose(&self) -> bool {
        self.verbose
    }

    /// The arguments `acp-host run` would take for one line of `acp-host batch`: the line's fields
    /// over the batch's flags, every other flag at its default. A new line field is one more
    /// member here.
    pub(super) fn for_batch(line: &BatchLine, batch: &BatchFlags) -> RunArgs {
        let defaults = Timeouts::default();
        let agent = line.agent.clone().or_else(|| batch.agent.clone());
        // The token goes to the lines whose agent is a URL; a local agent takes none.
        let remote = agent
            .as_deref()
            .is_some_and(|agent| remote::remote_agent(agent).is_some());
        RunArgs {
            prompt: line.prompt.clone(),
            agent,
            token_file: batch.token_file.clone().filter(|_| remote),
            token_env: batch.token_env.clone().filter(|_| remote),
            subagent: line.subagent.clone(),
            subagent_dirs: batch.subagent_dirs.clone(),
            persona: None,
            persona_mode: None,
            model: None,
            tools: None,
            deny_tools: None,
            output_schema: None,
            schema_retries: DEFAULT_SCHEMA_RETRIES,
            resume: None,
            fork: line.fork.clone(),
            cwd: line.cwd.clone(),
            env: line.env.clone(),
            permission: batch.permission,
            timeout: line.timeout.or(batch.timeout).map(Seconds),
            handshake_timeout: Seconds(defaults.handshake),
            cancel_grace: Seconds(defaults.cancel_grace),
            eof_grace: Seconds(defaults.eof_grace),
            term_grace: Seconds(defaults.term_grace),
            max_depth: None,
            token_budget: line.token_budget,
            cost_budget: line.cost_budget,
            on_unreported: batch.on_unreported,
            max_output: DEFAULT_MAX_OUTPUT_BYTES,
            json: true,
            verbose: false,
            progress: ProgressArg::Off,
            sandbox: batch.sandbox.with_line(line.sandbox, line.network.as_ref()),
            // The batch's span is given in its `RunOptions`, not per line.
            traceparent: None,
            // Export is the batch's, started once.
            trace_out: None,
            trace_content: false,
            // `"worktree": true` is `--worktree` (no name), a name `--worktree=NAME`.
            worktree: line
                .worktree
                .as_ref()
                .map(|name| name.clone().unwrap_or_default()),
            worktree_base: batch.worktree_base.clone(),
            worktree_keep_dirty: batch.worktree_keep_dirty,
        }
    }

    /// The worktree the flags alone ask for (`--worktree[=NAME]`), without a definition's.
    pub(super) fn worktree_flags(&self) -> Option<acp_host::worktree::Spec> {
        self.worktree.as_ref().map(|_| self.worktree_spec())
    }

    /// The worktree of a run that has one (`--worktree[=NAME]`, an empty name being none given,
    /// or a definition's `run.isolation: worktree`), as the flags shape it.
    fn worktree_spec(&self) -> acp_host::worktree::Spec {
        acp_host::worktree::Spec {
            name: self.worktree.clone().filter(|name| !name.is_empty()),
            base: self.worktree_base.clone(),
            keep_dirty: self.worktree_keep_dirty,
        }
    }
}

/// What the flags of `acp-host batch` set for every line (a line's own fields win).
pub(super) struct BatchFlags {
    pub(super) agent: Option<String>,
    pub(super) permission: Option<PolicyArg>,
    pub(super) timeout: Option<Duration>,
    pub(super) subagent_dirs: Vec<PathBuf>,
    /// The remote agents' token (`--token-file`, `--token-env`), for the lines whose agent is
    /// a URL.
    pub(super) token_file: Option<PathBuf>,
    pub(super) token_env: Option<String>,
    /// The batch's sandbox flags, which a line only tightens.
    pub(super) sandbox: SandboxArgs,
    /// `--worktree-base`, `--worktree-keep-dirty`: for the lines that run in a worktree.
    pub(super) worktree_base: Option<String>,
    pub(super) worktree_keep_dirty: bool,
    /// `--on-unreported`, for every line.
    pub(super) on_unreported: UnreportedArg,
}

/// `--on-unreported`: `protocol::usage::Unreported` as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum UnreportedArg {
    Error,
    Warn,
}

impl UnreportedArg {
    fn policy(self) -> protocol::usage::Unreported {
        match self {
            Self::Error => protocol::usage::Unreported::Error,
            Self::Warn => protocol::usage::Unreported::Warn,
        }
    }
}

/// After a timeout or a kill, how long the result record may wait for a stdout that takes no
/// bytes (a stalled reader) before acp-host exits.
const LATE_WRITE: Duration = Duration::from_millis(100);
/// ... and for one that takes bytes now: the write completes without waiting on the reader, so
/// only a starved machine makes it slow, and the record must not be lost to that.
const LATE_WRITE_READY: Duration = Duration::from_secs(5);

/// How long the last write may take after a timeout or a kill: [`LATE_WRITE_READY`] when stdout
/// takes bytes now, else [`LATE_WRITE`].
fn late_write() -> Duration {
    if stdout_takes_bytes() {
        LATE_WRITE_READY
    } else {
        LATE_WRITE
    }
}

/// Whether stdout takes bytes now (room in its pipe, or a file): the last write then waits on
/// nobody.
fn stdout_takes_bytes() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLOUT)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
        && fds[0]
            .revents()
            .is_some_and(|events| events.contains(PollFlags::POLLOUT))
}

impl super::trace::Traced for RunArgs {
    fn traced(&self) -> (Option<&str>, Option<&Path>, bool) {
        (
            self.traceparent.as_deref(),
            self.trace_out.as_deref(),
            self.trace_content,
        )
    }
}

pub(super) fn execute(args: &RunArgs) -> Result<ExitCode, CliError> {
    // One thread is enough: nothing on the runtime blocks (stdout is written on the observers'
    // thread, a terminal question on its own), and it starts faster than a pool.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| CliError::Failed(format!("cannot start the async runtime: {err}")))?;
    // Until here a Ctrl-C simply ends acp-host (nothing is spawned yet, and reading a prompt from
    // stdin must stay interruptible); from here on it is ours, before anything is spawned, so no
    // signal falls between the spawn and the watcher. The persona file of a --subagent run lives
    // until the run has ended.
    let Built { request, worktree } = build_request(args).map_err(CliError::Usage)?;
    let (trace, _exporting) = super::trace::given_and_export(args)?;
    let signals = {
        let _runtime = runtime.enter();
        Signals::install()
    };
    let ask = request.permission == PermissionPolicy::Ask;
    let prepared = run::prepare(request, super::trace::agent_env()).map_err(|err| match err {
        run::PrepareError::Schema(err) => CliError::Usage(format!(
            "--output-schema {}: {err}",
            args.output_schema
                .as_deref()
                .map_or_else(String::new, |p| p.display().to_string())
        )),
        run::PrepareError::Persona(err) => CliError::Usage(match (&args.persona, &args.subagent) {
            (Some(path), _) => format!("--persona {}: {err}", path.display()),
            (None, Some(name)) => format!("--subagent {name}: {err}"),
            (None, None) => err.to_string(),
        }),
        err => CliError::Usage(err.to_string()),
    })?;
    if args.verbose && !prepared.scrubbed().is_empty() {
        note!(
            "acp-host: withheld from the agent: {}",
            prepared.scrubbed().join(", ")
        );
    }
    let renderer = Arc::new(Renderer::new(
        args.json,
        args.verbose,
        args.output_schema.is_some(),
    ));
    let live = live::Live::start(args.progress.into(), args.verbose, &renderer);
    let options = RunOptions {
        observers: live::observers(&renderer, live.as_ref()),
        permissions: ask.then(|| live::watched(ask::handler(), live.as_ref())),
        // Human mode printed the text as it came and shows no result: it keeps none of it.
        max_output_bytes: Some(if args.json { args.max_output } else { 0 }),
        // A structured answer is read from up to --max-output bytes of text, in either mode.
        max_answer_bytes: Some(args.max_output),
        worktree,
        trace,
        ..RunOptions::default()
    };
    let (seen_tx, mut seen) = tokio::sync::watch::channel(0_u32);
    let result = runtime.block_on(async {
        let cancel = Cancel::new();
        if let Some(signals) = signals {
            tokio::spawn(signals.beside(live.as_ref()).watch(cancel.clone(), seen_tx));
        }
        run::run(prepared, &options, &cancel).await
    });
    let code = ExitCode::from(result.exit_code());
    live::stop(live.as_deref());
    // The last stdout write may block on a stalled reader: it must not hold the exit hostage.
    let killed = *seen.borrow_and_update() >= 2;
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let writer = Arc::clone(&renderer);
    // After a timeout, a cancel or a kill, a stalled reader gets only a moment to take the record.
    let hurry = killed || matches!(result.status, Status::Timeout | Status::Aborted);
    // Asked before the last write starts (which may fill the pipe itself).
    let late = late_write();
    // Moved, not cloned: under --json the result may hold megabytes of output.
    let (record, report) = if args.json {
        (Some(result), None)
    } else {
        (None, Some(result))
    };
    let value_line = report
        .as_ref()
        .and_then(|result| result.structured.as_ref())
        .map(|value| format!("{value}\n"));
    if record.is_none() && value_line.is_none() && renderer.nothing_to_finish() {
        // Human mode whose text is all out: no last write that could block, no thread for it.
        let _ = done_tx.send(());
    } else {
        std::thread::spawn(move || {
            writer.finish(record, value_line.as_deref());
            let _ = done_tx.send(());
        });
    }
    runtime.block_on(async {
        let limit = async {
            if hurry {
                tokio::time::sleep(late).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = done => {}
            _ = seen.changed() => {}
            () = limit => {}
        }
    });
    live::summary(live.as_deref());
    if let Some(result) = report {
        renderer.report(&result);
    }
    // Do not wait for a permission question nobody answered.
    runtime.shutdown_background();
    Ok(code)
}

fn build_request(args: &RunArgs) -> Result<Built, String> {
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
    request_for(args, prompt)
}

/// A definition that starts from its parent's conversation needs one named: never run fresh.
fn check_fork_source(found: &subagent::Found, args: &RunArgs) -> Result<(), String> {
    if found.run.context == Some(protocol::definition::RunContext::Fork) && args.fork.is_none() {
        return Err(format!(
            "subagent {} has `run.context: fork`: it starts from a copy of a session, and a run \
             from here has none to copy; pass --fork SESSION_ID (a result's sessionId)",
            found.located.definition.name
        ));
    }
    Ok(())
}

/// A run's start request, and the worktree it runs in: the flags' (`--worktree`), or the one its
/// definition asks for (`run.isolation: worktree`, by `RunSpec::settle`'s rule).
pub(super) struct Built {
    pub(super) request: StartRequest,
    pub(super) worktree: Option<acp_host::worktree::Spec>,
}

/// The start request for `args` with this prompt (already read).
pub(super) fn request_for(args: &RunArgs, prompt: String) -> Result<Built, String> {
    let mut env = args
        .env
        .iter()
        .map(|arg| EnvForward::parse(arg).map_err(|err| err.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = run::resolve_cwd(args.cwd.as_deref()).map_err(|err| err.to_string())?;
    let found = args
        .subagent
        .as_deref()
        .map(|name| subagent::find(name, &cwd, &args.subagent_dirs))
        .transpose()?;
    let run_spec = found.as_ref().map(|found| &found.run);
    if let Some(found) = &found {
        check_fork_source(found, args)?;
    }
    let agent_name = args
        .agent
        .clone()
        .or_else(|| run_spec.and_then(|run| run.agent.clone()))
        .unwrap_or_else(|| registry::ACP_CHILD.to_owned());
    let wants = wants(args, found.as_ref())?;
    let agent = match remote::remote_agent(&agent_name) {
        Some(url) => remote_agent(args, url, &mut env)?,
        None => local_agent(args, &agent_name, &wants, &mut env)?,
    };
    let flag = args.permission.map(PermissionPolicy::from);
    let explicit = explicit_settings(args, flag, &env);
    // acp-host's default is `reject`; a definition's `relay` is asked on the terminal.
    let defaults = RunSettings {
        permission: Some(RunPermission::Reject),
        ..RunSettings::default()
    };
    let settled = found
        .as_ref()
        .map(|found| found.run.settle(found.located.source, &explicit, &defaults));
    let (permission, overall, max_depth, token_budget) = match &settled {
        Some(settled) => {
            env.extend(settled.env.iter().cloned().map(EnvForward::Inherit));
            (
                policy_of(settled.permission),
                settled.timeout,
                settled.max_depth,
                settled.token_budget,
            )
        }
        None => (
            flag.unwrap_or_default(),
            explicit.timeout,
            explicit.max_depth,
            explicit.token_budget,
        ),
    };
    // The person's sandbox flags, which a definition only tightens.
    let sandbox = args
        .sandbox
        .policy(&run::resolve_cwd(None).map_err(|err| err.to_string())?)?;
    let sandbox = run_spec.map_or_else(|| sandbox.clone(), |spec| spec.sandbox_within(&sandbox));
    if let Some(found) = &found {
        let names: Vec<String> = env
            .iter()
            .map(|forward| forward.name().to_owned())
            .collect();
        subagent::check_trust(found, flag, &agent.command_line(), &names, &sandbox)?;
    }
    let request = StartRequest {
        agent,
        prompt,
        cwd,
        env,
        permission,
        timeouts: timeouts(args, overall),
        max_depth,
        wants,
        resume: args.resume.clone(),
        fork: args.fork.clone(),
        budget: Budget {
            tokens: token_budget,
            // The lowest of the flag's and the definition's (`run.costBudget`).
            cost: settled.as_ref().map_or(args.cost_budget, |settled| {
                settled.cost_budget.map(CostLimit::amount)
            }),
        },
        on_unreported: args.on_unreported.policy(),
        sandbox,
    };
    // The flag's worktree, or the one the definition asks for (`run.isolation`).
    let isolation = settled.map_or(explicit.isolation, |settled| settled.isolation);
    Ok(Built {
        request,
        worktree: isolation.map(|_| args.worktree_spec()),
    })
}

/// The person's own settings for a definition's run: the flags of this run.
fn explicit_settings(
    args: &RunArgs,
    flag: Option<PermissionPolicy>,
    env: &[EnvForward],
) -> RunSettings {
    RunSettings {
        permission: flag.map(run_permission),
        timeout: args.timeout.map(|s| s.0),
        max_depth: args.max_depth,
        token_budget: args.token_budget,
        cost_budget: args.cost_budget.and_then(CostLimit::new),
        env: env
            .iter()
            .map(|forward| forward.name().to_owned())
            .collect(),
        isolation: args.worktree.as_ref().map(|_| Isolation::Worktree),
    }
}

/// The run's timeouts: `overall` as settled, the graces from the flags.
fn timeouts(args: &RunArgs, overall: Option<Duration>) -> Timeouts {
    Timeouts {
        overall,
        handshake: args.handshake_timeout.0,
        cancel_grace: args.cancel_grace.0,
        eof_grace: args.eof_grace.0,
        term_grace: args.term_grace.0,
    }
}

/// A `--permission` policy as a definition's `permission:` (asking is relaying to the person).
fn run_permission(policy: PermissionPolicy) -> RunPermission {
    match policy {
        PermissionPolicy::Ask => RunPermission::Relay,
        PermissionPolicy::Reject => RunPermission::Reject,
        PermissionPolicy::Allow => RunPermission::Allow,
    }
}

/// A settled `permission:` as the run's policy (a relayed request is asked on the terminal).
fn policy_of(permission: RunPermission) -> PermissionPolicy {
    match permission {
        RunPermission::Relay => PermissionPolicy::Ask,
        RunPermission::Reject => PermissionPolicy::Reject,
        RunPermission::Allow => PermissionPolicy::Allow,
    }
}

/// A local agent's command: our table, this host's PATH, else an ACP Registry id (the cached
/// registry; a binary is installed into the cache on first use). The manifest's variables go
/// first in `env`, so an `--env` of the same name wins.
fn local_agent(
    args: &RunArgs,
    name: &str,
    wants: &Wants,
    env: &mut Vec<EnvForward>,
) -> Result<AgentCommand, String> {
    if args.token_file.is_some() || args.token_env.is_some() {
        return Err(format!(
            "--token-file and --token-env are for a remote agent (--agent ws://HOST:PORT/acp), \
             not {name}"
        ));
    }
    let cache = acp_host::acp_registry::RegistryCache::from_env().ok();
    let resolved = acp_host::acp_registry::resolve(name, &HostFacts::from_env(), cache.as_ref())
        .map_err(|err| err.to_string())?;
    // Refused before anything is spawned, as a batch line's and serve's agent are (exit 2).
    if let Some(problem) = resolved.not_found() {
        return Err(problem);
    }
    env.splice(
        0..0,
        resolved
            .env
            .iter()
            .map(|(name, value)| EnvForward::Set(name.clone(), value.clone())),
    );
    let mut agent = resolved.command;
    agent
        .args
        .extend(protocol::capabilities::launch_args(wants, resolved.spec));
    Ok(agent)
}

/// The agent process of a remote agent: `acp-host bridge URL`, told where the token is. The token
/// is read here once (a usage error before anything runs), and `--token-env`'s variable is
/// forwarded to the bridge past the scrub (its value is then redacted like any credential).
fn remote_agent(
    args: &RunArgs,
    url: &str,
    env: &mut Vec<EnvForward>,
) -> Result<AgentCommand, String> {
    let token = match (&args.token_file, &args.token_env) {
        (Some(path), _) => {
            // The bridge runs in the agent's working directory: give it the file's full path.
            let path = std::path::absolute(path)
                .map_err(|err| format!("--token-file {}: {err}", path.display()))?;
            bridge::token_from_file(&path).map_err(|err| format!("--token-file: {err}"))?;
            Some(TokenSource::File(path))
        }
        (None, Some(name)) => {
            let value = std::env::var(name).ok();
            bridge::token_from_var(name, value.as_deref())
                .map_err(|err| format!("--token-env: {err}"))?;
            env.push(EnvForward::Inherit(name.clone()));
            Some(TokenSource::Env(name.clone()))
        }
        (None, None) => None,
    };
    let program = std::env::current_exe().map_err(|err| {
        let url = remote::shown_url(url).0;
        format!("cannot find acp-host's own binary to bridge to {url}: {err}")
    })?;
    Ok(AgentCommand {
        program,
        args: remote::bridge_args(url, token.as_ref()),
        // The run's events and result name the agent by this: its secrets (`user:TOKEN@`,
        // `?token=`) redacted.
        display: remote::shown_url(url).0,
        install_hint: None,
    })
}

/// The persona, model and tool filter: the flags, over the --subagent definition's.
fn wants(args: &RunArgs, found: Option<&subagent::Found>) -> Result<Wants, String> {
    let mut wants = found.map_or_else(Wants::default, |found| {
        found.run.wants(&found.located.definition.body)
    });
    if let Some(path) = &args.persona {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("--persona {}: cannot read it: {err}", path.display()))?;
        if text.trim().is_empty() {
            return Err(format!(
                "--persona {}: the file is empty; write the persona in it",
                path.display()
            ));
        }
        wants.persona = Some(Persona {
            text,
            mode: PersonaMode::default(),
        });
    }
    if let Some(mode) = args.persona_mode {
        let Some(persona) = &mut wants.persona else {
            return Err(
                "--persona-mode: there is no persona; pass --persona FILE or --subagent NAME"
                    .into(),
            );
        };
        persona.mode = mode.into();
    }
    if let Some(model) = &args.model {
        wants.model = Some(model.clone());
    }
    if let Some(path) = &args.output_schema {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("--output-schema {}: cannot read it: {err}", path.display()))?;
        let schema = serde_json::from_str(&text).map_err(|err| {
            format!(
                "--output-schema {}: not JSON ({err}); give a JSON Schema file",
                path.display()
            )
        })?;
        wants.output = Some(OutputSpec {
            schema,
            retries: args.schema_retries,
        });
    }
    let names = |list: &str| -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect()
    };
    if args.tools.is_some() || args.deny_tools.is_some() {
        let filter = wants.tools.get_or_insert_with(ToolFilter::default);
        if let Some(allow) = &args.tools {
            filter.allow = Some(names(allow));
        }
        if let Some(deny) = &args.deny_tools {
            filter.deny = names(deny);
        }
    }
    Ok(wants)
}

/// SIGINT and SIGTERM, registered (so no longer fatal) as soon as this exists.
pub(super) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    /// The live view whose tree a line for stderr hides meanwhile.
    live: Option<Arc<live::Live>>,
}

impl Signals {
    /// Must be called inside the runtime's context.
    pub(super) fn install() -> Option<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(int), Ok(term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            Some(Signals {
                int,
                term,
                live: None,
            })
        } else {
            tracing::warn!("cannot install signal handlers; Ctrl-C will not cancel gracefully");
            None
        }
    }

    /// Its line for stderr hides `live`'s tree meanwhile.
    fn beside(mut self, live: Option<&Arc<live::Live>>) -> Signals {
        self.live = live.cloned();
        self
    }

    /// The first signal cancels, the second kills; `seen` counts them for the exit path.
    pub(super) async fn watch(mut self, cancel: Cancel, seen: tokio::sync::watch::Sender<u32>) {
        loop {
            tokio::select! {
                _ = self.int.recv() => {}
                _ = self.term.recv() => {}
            }
            seen.send_modify(|n| *n += 1);
            if *seen.borrow() == 1 {
                live::note(
                    self.live.as_deref(),
                    "acp-host: cancelling (press Ctrl-C again to kill the agent now)",
                );
                cancel.cancel();
            } else {
                cancel.kill();
            }
        }
    }
}
