//! `acp-host batch`: many runs from NDJSON lines, up to `--jobs` at once, each through the same
//! request building and library `run` as `acp-host run`.
//!
//! Invariants:
//! - every line is read and checked (its fields, its agent, its cwd, its subagent definition, its
//!   env names) before anything is spawned; a bad line is a usage error (exit 2) naming the line
//!   and the field. Only the text of the lines to run is kept (each is parsed again as it
//!   starts) and a 12-byte key of each id, never a run's output, and in memory only up to a
//!   fixed size: beyond it they go to unnamed temporary files (`lines`), so memory stays flat
//!   however many lines there are;
//! - lines asking for the same run (their prompt and id aside) share one check and, in a row,
//!   one preparation (the agent resolved, the environment scrubbed, the schema compiled); each
//!   start still checks its working directory, and a `subagent` line its definition's trust;
//! - at most `--jobs` agents run at once (`protocol::batch::check_jobs`: a fixed cap and the
//!   process's open-file and process limits; above, a usage error before any line is read); each
//!   result is written (one `BatchRecord` line) as its run ends, by a writer thread behind a
//!   bounded queue, so memory is bounded by `--jobs`, not by the number of lines, and a stalled
//!   stdout slows the batch down instead of growing it;
//! - every line gets exactly one record, in every ending: a run's result, or `not-started`.
//!   None is dropped for want of room: waiting for the writer is the only way to queue one. Only
//!   stdout itself can lose records: closed or failing (the batch then stops as on Ctrl-C), or,
//!   after Ctrl-C / SIGTERM, taking no byte for [`STALL`] while records wait (acp-host then stops
//!   waiting for it); the exit code is then `EXIT_OUTPUT_LOST` and stderr says how many;
//! - the first Ctrl-C / SIGTERM starts no more runs and cancels the running ones (the same
//!   cancel, graces and teardown as `run`); the second kills them; lines never started are
//!   written as `not-started` records. Exit 130 then, else 1 when any run did not complete, else 0;
//!   a signal while the input is read and checked simply ends acp-host (nothing has started);
//! - progress goes to stderr: a live bar on a terminal, one plain line per finished run otherwise.
//!   Stdout carries only the records.
//! - `--merge FILE...` runs nothing: it writes the records of results files as one, the last of
//!   each id kept (`merge`);
//! - with `--shard` / `--shard-from-env` and `--skip-done`, the batch is the lines of its shard
//!   (`protocol::shard`) less those with a `completed` record in the results file; "every line"
//!   above means every line of that batch. Every input line is still parsed (all workers refuse
//!   the same bad input and the same repeated id); only the batch's lines are checked against the
//!   machine and kept.

use std::io::{BufRead, IsTerminal};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use acp_host::agents::HostFacts;
use acp_host::run::{self as library, Cancel, PrepareError, RunOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use protocol::batch::{self, BatchEnd, BatchLine, BatchRecord, JobLimits, NotStarted};
use protocol::env_scrub::EnvForward;
use protocol::result::DEFAULT_MAX_OUTPUT_BYTES;
use protocol::shard::{self, Shard, ShardFromEnv};
use protocol::status::Status;
use protocol::structured::{DEFAULT_SCHEMA_RETRIES, OutputSpec};

use self::lines::{Done, IDS_IN_MEMORY, Ids, Pending, SPOOL_IN_MEMORY, id_key};
use super::run::{
    BatchFlags, Built, PolicyArg, RunArgs, Seconds, Signals, UnreportedArg, parse_seconds,
    request_for,
};
use super::sandbox::SandboxArgs;
use super::{CliError, Written, subagent};

mod lines;
mod merge;

/// Run many prompts, one agent each, up to --jobs at once.
///
/// Input: NDJSON, one JSON object per line with the fields `prompt` (required), `id` (default:
/// the line number), `agent`, `subagent`, `cwd`, `timeout` (seconds), `env` (names to forward),
/// `outputSchema` (a JSON Schema, inline, as `run --output-schema`), `fork` (as `run --fork`),
/// `tokenBudget` and `costBudget` (as `run --token-budget`, `--cost-budget`), `sandbox` and
/// `network` (as `run --sandbox`, `--network`; they only tighten this batch's), `worktree` (`true`
/// or a name, as `run --worktree[=NAME]`). Every line is checked
/// before anything starts. Output: one JSON record per line as its run ends, in completion order:
/// the `acp-host run --json` result with the line's `id` (type `result`), or type `not-started`
/// for lines that never started (Ctrl-C).
#[derive(Debug, clap::Args)]
#[command(after_long_help = after_help())]
pub(super) struct BatchArgs {
    /// The NDJSON file, or `-` for stdin.
    #[arg(value_name = "FILE | -", default_value = "-")]
    input: String,

    /// How many agents run at once [default: the number of CPUs]. At most 256, and no more
    /// than the open-file and process limits (`ulimit -n`, `ulimit -u`) leave room for.
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,

    /// The agent of lines without `agent`: a registry name or a command line [default:
    /// acp-child, or the line's subagent definition's agent].
    #[arg(long, value_name = "NAME|COMMAND-LINE|URL")]
    agent: Option<String>,

    /// For lines whose agent is a remote URL (the line's `agent`, or --agent ws://HOST:PORT/acp):
    /// send the token in FILE (one line) as a bearer token. Read once, before anything runs.
    #[arg(long, value_name = "FILE", conflicts_with = "token_env")]
    token_file: Option<PathBuf>,

    /// For lines whose agent is a remote URL: send the value of the variable NAME as a bearer
    /// token (forwarded to the remote agents' bridges only; never printed).
    #[arg(long, value_name = "NAME")]
    token_env: Option<String>,

    /// How to answer the agents' permission requests (nobody is asked during a batch)
    /// [default: reject, or the line's --subagents folder definition's; relay rejects]. A
    /// `<cwd>/subagents/` definition only lowers it, and runs only once approved (`acp-host trust`)
    /// or under `allow`.
    #[arg(long, value_enum)]
    permission: Option<BatchPolicy>,

    /// Give up on a run after this many seconds (status `timeout` in its record), for lines
    /// without `timeout`.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    timeout: Option<Seconds>,

    /// A folder of subagent definitions for lines with `subagent`, after `<cwd>/subagents/`
    /// (repeatable).
    #[arg(long = "subagents", value_name = "DIR")]
    subagent_dirs: Vec<PathBuf>,

    /// The most bytes of the agent's text each record keeps (the end; `outputTruncatedBytes`
    /// says how much was dropped), and the most a line's `outputSchema` answer is read from. At
    /// most `--jobs` times this is held at once.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_OUTPUT_BYTES)]
    max_output: usize,

    /// After every line's record, write one more line: `{"type": "summary", ...}` with the
    /// counts and the runs' usage summed (schemas/batch-summary.json).
    #[arg(long)]
    json_summary: bool,

    /// Run only this worker's share: the lines whose id (or line number) hashes to INDEX of
    /// COUNT (0-based; the first 8 bytes of the id's SHA-256, modulo COUNT). COUNT workers given
    /// the same input run every line exactly once between them.
    #[arg(long, value_name = "INDEX/COUNT", conflicts_with = "shard_from_env")]
    shard: Option<String>,

    /// --shard with INDEX, and COUNT if it is a name, read from the environment a scheduler
    /// sets: `JOB_COMPLETION_INDEX/4` (Kubernetes), `SLURM_ARRAY_TASK_ID/4` (Slurm). Give COUNT as
    /// a number: a scheduler's count is the submission's (a task resubmitted alone counts 1).
    #[arg(long, value_name = "VARIABLE/COUNT")]
    shard_from_env: Option<String>,

    /// Do not run again the lines whose id has a `completed` record in this file (an earlier
    /// batch's output): re-running an interrupted or partly failed batch resumes it. Skipped
    /// lines get no new record.
    #[arg(long, value_name = "RESULTS.jsonl")]
    skip_done: Option<PathBuf>,

    /// Run nothing: merge these results files (the stdout of a batch's shards and resumed
    /// runs) into one on stdout, the last record of each id kept (in the order given, then line
    /// order), so what a resume redid no longer shows as failed.
    #[arg(long, value_name = "RESULTS", num_args = 1.., conflicts_with_all = [
        "jobs", "agent", "shard", "shard_from_env", "skip_done", "json_summary", "token_file",
        "token_env", "timeout", "permission",
    ])]
    merge: Vec<PathBuf>,

    /// The sandbox of every line (a line's `sandbox` and `network` only tighten it).
    #[command(flatten)]
    sandbox: SandboxArgs,

    /// Continue this W3C trace (`00-<trace id>-<span id>-<flags>`): the batch's span is its
    /// child, and each line's run a child of the batch's span. Default: $TRACEPARENT (with
    /// $TRACESTATE), else a new trace.
    #[arg(long, value_name = "TRACEPARENT", conflicts_with = "merge")]
    traceparent: Option<String>,

    /// Append the batch's spans (and every acp-child's below its runs) to FILE as OTLP/JSON
    /// lines, one `ExportTraceServiceRequest` a line (docs/observability.md).
    #[arg(long, value_name = "FILE", conflicts_with = "merge")]
    trace_out: Option<PathBuf>,

    /// Put tool call titles, arguments and results into exported spans.
    #[arg(long, conflicts_with = "merge")]
    trace_content: bool,

    /// For the lines that run in a worktree (`"worktree"`, or a definition's `run.isolation`):
    /// start it from this commit, branch or tag instead of HEAD (as `run --worktree-base`).
    #[arg(long, value_name = "REF")]
    worktree_base: Option<String>,

    /// For the lines that run in a worktree: leave the agent's changes uncommitted (staged) in
    /// the kept worktree (as `run --worktree-keep-dirty`).
    #[arg(long)]
    worktree_keep_dirty: bool,
    /// A line with a budget whose agent reported no usage by the end of its first reply: error
    /// (its record is status error, errorKind budget) or warn (it runs on, its record warns).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = UnreportedArg::Error)]
    on_unreported: UnreportedArg,
}

/// `--permission` of a batch: no `ask`, there is nobody to ask while many agents run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BatchPolicy {
    Reject,
    Allow,
}

fn after_help() -> String {
    format!(
        "{}\n\
Examples:\n  \
echo '{{\"id\":\"readme\",\"prompt\":\"summarise README.md\"}}' | acp-host batch --agent codex\n  \
acp-host batch --permission allow --timeout 600 jobs.ndjson > results.ndjson\n  \
acp-host batch --shard 0/4 jobs.ndjson > results-0.ndjson\n  \
acp-host batch --skip-done results.ndjson jobs.ndjson >> results.ndjson\n  \
acp-host batch --merge results-*.ndjson | jq 'select(.status != \"completed\")'\n",
        protocol::exit_table::Documented::Batch.exit_table()
    )
}

/// Records waiting for the writer thread at most (beyond the running ones).
const WRITE_QUEUE: usize = 16;

/// After Ctrl-C / SIGTERM, how long stdout may take no byte at all while records wait before
/// acp-host stops waiting for it (the records left are lost, and the exit code says so). Before
/// a signal, a slow or stalled reader only slows the batch down.
const STALL: Duration = Duration::from_secs(1);

/// How often a stall is looked for.
const STALL_POLL: Duration = Duration::from_millis(50);

/// Records go to stdout in pieces of at most this size, so a stall shows within a record too.
const WRITE_PIECE: usize = 64 * 1024;

pub(super) fn execute(args: &BatchArgs) -> Result<ExitCode, CliError> {
    if !args.merge.is_empty() {
        if args.input != "-" {
            return Err(CliError::Usage(format!(
                "--merge takes results files only, not an input to run ({}); put it after \
                 --merge to merge it",
                args.input
            )));
        }
        return merge::execute(&args.merge);
    }
    let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let jobs = batch::check_jobs(args.jobs, cpus, &job_limits())
        .map_err(|err| CliError::Usage(err.to_string()))?;
    check_token(args)?;
    // The batch's own span: every line's run is made under it.
    let given = super::trace::given(args.traceparent.as_deref())?;
    let trace = acp_host::run::new_span(given.as_ref());
    let exporting = super::trace::export(args.trace_out.as_deref(), args.trace_content)?;
    let batch_span = super::trace::batch_span(&trace, given.as_ref());
    let share = Share::from_args(args)?;
    let (lines, taken) = read_lines(args, &share)?;
    share.note(&taken, args);
    // One thread: the runs' work is waiting on pipes, and it starts faster than a pool.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| CliError::Failed(format!("cannot start the async runtime: {err}")))?;
    let signals = {
        let _runtime = runtime.enter();
        Signals::install()
    };
    let mut progress = Progress::new(lines.len(), jobs);
    let (seen_tx, seen) = tokio::sync::watch::channel(0_u32);
    let cancel = Cancel::new();
    let (mut output, writer) = {
        let _runtime = runtime.enter();
        Output::start(jobs, &cancel, seen.clone())
    };
    let summary = runtime.block_on(async {
        if let Some(signals) = signals {
            tokio::spawn(signals.watch(cancel.clone(), seen_tx));
        }
        let summary = drive(
            lines,
            args,
            jobs,
            &cancel,
            &mut output,
            &mut progress,
            &trace,
        )
        .await;
        if args.json_summary {
            output.write(&summary.record()).await;
        }
        output.finish().await;
        summary
    });
    let interrupted = *seen.borrow() > 0;
    progress.finish(&summary);
    let records = summary.completed + summary.failed;
    // The summary line is one more to write.
    let lines = records + usize::from(args.json_summary);
    let lost = lines.saturating_sub(writer.written.load(Ordering::SeqCst));
    if lost > 0 {
        let why = writer.broken.get().map_or(
            "stdout took nothing for a while after the signal",
            String::as_str,
        );
        note!("acp-host: batch: {lost} of {lines} records were not written: {why}");
    }
    batch_span.end();
    drop(exporting);
    // The writer may be blocked on a stalled stdout: it ends with the process.
    runtime.shutdown_background();
    Ok(ExitCode::from(batch::exit_code(BatchEnd {
        interrupted,
        ended: records,
        completed: summary.completed,
        lost,
    })))
}

/// The soft limits that bound how many agents may run at once.
fn job_limits() -> JobLimits {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    let soft = |resource| {
        getrlimit(resource)
            .ok()
            .map(|(soft, _)| soft)
            .filter(|&soft| soft != RLIM_INFINITY)
    };
    JobLimits {
        open_files: soft(Resource::RLIMIT_NOFILE),
        processes: soft(Resource::RLIMIT_NPROC),
    }
}

/// Which lines this batch runs: its shard of the input, less those already done.
struct Share {
    shard: Option<Shard>,
    /// The keys of the ids with a `completed` record in `--skip-done`'s file.
    done: Done,
}

/// How the input's lines were shared out, for the note on stderr.
#[derive(Debug, Default)]
struct Taken {
    /// Lines read (blank ones aside).
    lines: usize,
    /// Lines of this worker's shard.
    shard: usize,
    /// Lines of the shard skipped as done.
    skipped: usize,
}

impl Share {
    fn from_args(args: &BatchArgs) -> Result<Share, CliError> {
        let shard = match (&args.shard, &args.shard_from_env) {
            (Some(text), _) => {
                Some(Shard::parse(text).map_err(|err| CliError::Usage(err.to_string()))?)
            }
            (None, Some(text)) => Some(
                ShardFromEnv::parse(text)
                    .and_then(|spec| spec.resolve(|name| std::env::var(name).ok()))
                    .map_err(|err| CliError::Usage(err.to_string()))?,
            ),
            (None, None) => None,
        };
        let done = match &args.skip_done {
            Some(path) => {
                refuse_overwrite(path)?;
                read_done(path)?
            }
            None => Done::default(),
        };
        Ok(Share { shard, done })
    }

    /// Whether this worker runs the line with this id: it is its shard's.
    fn owns(&self, id: &str) -> bool {
        self.shard.is_none_or(|shard| shard.owns(id))
    }

    /// Says on stderr what this worker takes, when it is not the whole input.
    fn note(&self, taken: &Taken, args: &BatchArgs) {
        let mut parts = Vec::new();
        let lines = if taken.lines == 1 { "line" } else { "lines" };
        match self.shard {
            Some(shard) => parts.push(format!(
                "shard {shard} takes {} of {} {lines}",
                taken.shard, taken.lines
            )),
            None if args.skip_done.is_some() => parts.push(format!("{} {lines}", taken.lines)),
            None => return,
        }
        if let Some(path) = &args.skip_done {
            parts.push(format!(
                "{} of them already completed in {}",
                taken.skipped,
                path.display()
            ));
        }
        note!("acp-host: batch: {}", parts.join(", "));
    }
}

/// Refuses a `--skip-done` file that is also stdout opened without append (`> file`, `1<> file`):
/// the new records would overwrite the earlier ones (with `>`, the shell has already emptied the
/// file, and every line would run again). `>> file` is how a batch resumes into its own results.
fn refuse_overwrite(path: &Path) -> Result<(), CliError> {
    if stdout_is(path) != Some(Open::Overwrites) {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "--skip-done {0}: it is also stdout, opened without append, so the new records would \
         overwrite it (and `> {0}` has already emptied it); append to it with `>> {0}`",
        path.display()
    )))
}

/// How stdout has a file open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// `>> file`.
    Appends,
    /// `> file`, `1<> file`.
    Overwrites,
}

/// How stdout has `path` open, when stdout is that file (the same device and inode).
fn stdout_is(path: &Path) -> Option<Open> {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    let stdout = std::io::stdout();
    let out = nix::sys::stat::fstat(stdout.as_fd()).ok()?;
    let file = std::fs::metadata(path).ok()?;
    if out.st_dev != file.dev() || out.st_ino != file.ino() {
        return None;
    }
    let appends =
        nix::fcntl::fcntl(stdout.as_fd(), nix::fcntl::FcntlArg::F_GETFL).is_ok_and(|flags| {
            nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_APPEND)
        });
    Some(if appends {
        Open::Appends
    } else {
        Open::Overwrites
    })
}

/// The ids with a `completed` record in `path`. Any other line (another status, a record cut
/// short by a batch killed while writing it, text that is not a record) marks nothing: at worst
/// a line runs again, never is one skipped that did not complete.
fn read_done(path: &Path) -> Result<Done, CliError> {
    let file = std::fs::File::open(path).map_err(|err| {
        let shown = protocol::report::printable_path(path);
        CliError::Usage(if err.kind() == std::io::ErrorKind::NotFound {
            format!(
                "--skip-done {shown}: no such file; create it with `touch {shown}` before the \
                 first run (an empty file skips nothing)"
            )
        } else {
            format!("--skip-done {shown}: cannot read it: {err}")
        })
    })?;
    let mut reader = std::io::BufReader::new(file);
    let mut done = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).map_err(|err| {
            CliError::Usage(format!(
                "--skip-done {}: cannot read it: {err}",
                path.display()
            ))
        })?;
        if read == 0 {
            return Ok(Done::new(done));
        }
        if let Some(id) = std::str::from_utf8(&line)
            .ok()
            .and_then(shard::completed_id)
        {
            done.push(id_key(&id));
        }
    }
}

/// Reads and checks every line; keeps only the lines this batch runs (its shard, less those
/// done), as their text. Every line is read (so every worker refuses the same bad input and the
/// same repeated id), but only the lines it runs are checked against the machine.
fn read_lines(args: &BatchArgs, share: &Share) -> Result<(Pending, Taken), CliError> {
    let (input, name): (Box<dyn BufRead>, String) = if args.input == "-" {
        (Box::new(std::io::stdin().lock()), "stdin".into())
    } else {
        let file = std::fs::File::open(&args.input)
            .map_err(|err| CliError::Usage(format!("cannot read {}: {err}", args.input)))?;
        (Box::new(std::io::BufReader::new(file)), args.input.clone())
    };
    let mut checker = Checker::new(args);
    if let Some(agent) = &args.agent {
        checker.agent(agent).map_err(CliError::Usage)?;
    }
    let mut ids = Ids::new(IDS_IN_MEMORY);
    let mut lines = Pending::new(SPOOL_IN_MEMORY);
    let mut taken = Taken::default();
    // Whether any line (of every worker's, so all refuse alike) goes to a remote agent.
    let mut remote = args.agent.as_deref().is_some_and(is_remote);
    let repeated = |repeat: lines::Repeat, id: &str| {
        CliError::Usage(format!(
            "{name}: line {}, field `id`: {id:?} is already the id of line {}; ids must be unique",
            repeat.line, repeat.first
        ))
    };
    for (index, text) in input.lines().enumerate() {
        let number = index + 1;
        let text = text.map_err(|err| {
            CliError::Usage(format!("{name}: line {number}: cannot read it: {err}"))
        })?;
        let Some(line) = batch::parse_line(number, &text) else {
            continue;
        };
        let line = line.map_err(|err| CliError::Usage(format!("{name}: {err}")))?;
        let key = id_key(&line.id);
        if let Some(repeat) = ids
            .insert(key, number as u64)
            .map_err(|err| spool_error(&err))?
        {
            return Err(repeated(repeat, &line.id));
        }
        taken.lines += 1;
        remote |= line.agent.as_deref().is_some_and(is_remote);
        let runs = share.owns(&line.id) && {
            taken.shard += 1;
            let done = share.done.contains(&key);
            taken.skipped += usize::from(done);
            !done
        };
        if !runs {
            lines
                .skip(number, &line.id)
                .map_err(|err| spool_error(&err))?;
            continue;
        }
        checker.check(&line).map_err(|(field, problem)| {
            CliError::Usage(format!("{name}: line {number}, field `{field}`: {problem}"))
        })?;
        lines.push(number, &text).map_err(|err| spool_error(&err))?;
    }
    // A repeat of a line read before the last table of ids was written out.
    if let Some(repeat) = ids.finish().map_err(|err| spool_error(&err))? {
        let id = lines.id_of(repeat.line).unwrap_or_default();
        return Err(repeated(repeat, &id));
    }
    if !remote && (args.token_file.is_some() || args.token_env.is_some()) {
        return Err(CliError::Usage(format!(
            "--token-file and --token-env are for lines whose agent is a remote URL (a line's \
             `agent` or --agent ws://HOST:PORT/acp); no line of {name} has one"
        )));
    }
    Ok((lines, taken))
}

/// A batch whose input does not fit in memory keeps it in `TMPDIR`: failing that is the
/// machine's, not the input's.
fn spool_error(err: &std::io::Error) -> CliError {
    CliError::Failed(format!(
        "cannot keep the input's lines in a temporary file in {}: {err} (set TMPDIR to a \
         writable folder with room for about the input's size)",
        std::env::temp_dir().display()
    ))
}

fn is_remote(agent: &str) -> bool {
    protocol::remote::remote_agent(agent).is_some()
}

/// The remote agents' token is read once, before any line: a bad one is one usage error, not a
/// failed record per line.
fn check_token(args: &BatchArgs) -> Result<(), CliError> {
    use acp_host::remote::bridge;
    if let Some(path) = &args.token_file {
        bridge::token_from_file(path)
            .map_err(|err| CliError::Usage(format!("--token-file: {err}")))?;
    } else if let Some(name) = &args.token_env {
        let value = std::env::var(name).ok();
        bridge::token_from_var(name, value.as_deref())
            .map_err(|err| CliError::Usage(format!("--token-env: {err}")))?;
    }
    Ok(())
}

/// Checks a line against the machine, as `acp-host run` would before spawning.
struct Checker<'a> {
    args: &'a BatchArgs,
    facts: HostFacts,
    /// Each agent is looked up once, however many lines name it.
    agents: std::collections::HashMap<String, Result<(), String>>,
    /// The last line checked whole: a line asking for the same run (its prompt and id aside)
    /// passes as it did, since nothing checked depends on those two.
    last: Option<BatchLine>,
}

/// Whether two lines ask for the same run but for their prompt and id: then everything built
/// from them besides the prompt is the same. (Every field is named, so a new one is not
/// forgotten here.)
fn same_run(a: &BatchLine, b: &BatchLine) -> bool {
    let BatchLine {
        id: _,
        prompt: _,
        agent,
        subagent,
        cwd,
        timeout,
        env,
        output_schema,
        fork,
        token_budget,
        cost_budget,
        sandbox,
        network,
        // The worktree is made by the run, not by its preparation.
        worktree: _,
    } = a;
    *agent == b.agent
        && *subagent == b.subagent
        && *cwd == b.cwd
        && *timeout == b.timeout
        && *env == b.env
        && *output_schema == b.output_schema
        && *fork == b.fork
        && *token_budget == b.token_budget
        && cost_budget.map(f64::to_bits) == b.cost_budget.map(f64::to_bits)
        && *sandbox == b.sandbox
        && *network == b.network
}

impl<'a> Checker<'a> {
    fn new(args: &'a BatchArgs) -> Self {
        Checker {
            args,
            facts: HostFacts::from_env(),
            agents: std::collections::HashMap::new(),
            last: None,
        }
    }

    /// Whether `agent` names a command that can be launched and whose program is there: refused
    /// up front, with the message and exit code of `run` (2), rather than failed once per line.
    fn agent(&mut self, agent: &str) -> Result<(), String> {
        // A remote agent is the server's to start: its URL is all there is to check here.
        if is_remote(agent) {
            return Ok(());
        }
        let facts = &self.facts;
        self.agents
            .entry(agent.to_owned())
            .or_insert_with(|| {
                let cache = acp_host::acp_registry::RegistryCache::from_env().ok();
                let resolved = acp_host::acp_registry::resolve(agent, facts, cache.as_ref())
                    .map_err(|err| err.to_string())?;
                resolved.not_found().map_or(Ok(()), Err)
            })
            .clone()
    }

    /// `(field, problem)` for the first thing wrong with the line.
    fn check(&mut self, line: &BatchLine) -> Result<(), (&'static str, String)> {
        if self.last.as_ref().is_some_and(|last| same_run(last, line)) {
            return Ok(());
        }
        self.check_whole(line)?;
        self.last = Some(line.clone());
        Ok(())
    }

    fn check_whole(&mut self, line: &BatchLine) -> Result<(), (&'static str, String)> {
        if let Some(agent) = &line.agent {
            self.agent(agent).map_err(|problem| ("agent", problem))?;
        }
        for name in &line.env {
            EnvForward::parse(name).map_err(|err| ("env", err.to_string()))?;
        }
        let cwd =
            library::resolve_cwd(line.cwd.as_deref()).map_err(|err| ("cwd", err.to_string()))?;
        if let Some(name) = &line.subagent {
            subagent::find(name, &cwd, &self.args.subagent_dirs)
                .map_err(|err| ("subagent", err))?;
        }
        // The whole request, as it will be built; what is left to fail here is the definition's.
        let request = line_request(&run_args(self.args, line), line)
            .map_err(|err| ("subagent", err))?
            .request;
        library::prepare(request, super::trace::agent_env()).map_err(|err| match err {
            PrepareError::Env(err) => ("env", err.to_string()),
            PrepareError::Schema(err) => ("outputSchema", err.to_string()),
            PrepareError::Persona(err) => ("subagent", err.to_string()),
            other => ("cwd", other.to_string()),
        })?;
        Ok(())
    }
}

/// `acp-host run`'s arguments for a line: the line's fields over the batch's flags.
fn run_args(args: &BatchArgs, line: &BatchLine) -> RunArgs {
    let flags = BatchFlags {
        agent: args.agent.clone(),
        permission: args.permission.map(|policy| match policy {
            BatchPolicy::Reject => PolicyArg::Reject,
            BatchPolicy::Allow => PolicyArg::Allow,
        }),
        timeout: args.timeout.map(|s| s.0),
        subagent_dirs: args.subagent_dirs.clone(),
        token_file: args.token_file.clone(),
        token_env: args.token_env.clone(),
        sandbox: args.sandbox.clone(),
        worktree_base: args.worktree_base.clone(),
        worktree_keep_dirty: args.worktree_keep_dirty,
        on_unreported: args.on_unreported,
    };
    RunArgs::for_batch(line, &flags)
}

/// How the batch went.
#[derive(Debug, Default)]
struct Summary {
    completed: usize,
    /// Runs that ended other than completed, and lines that did not start.
    failed: usize,
    not_started: usize,
    /// What the runs reported spending, summed (`None`: none reported any).
    usage: Option<protocol::usage::Usage>,
}

/// Starts runs while fewer than `jobs` run and no cancel came; writes each record as it ends.
async fn drive(
    lines: Pending,
    args: &BatchArgs,
    jobs: usize,
    cancel: &Cancel,
    output: &mut Output,
    progress: &mut Progress,
    trace: &protocol::trace::TraceParent,
) -> Summary {
    let mut summary = Summary::default();
    let mut pending = lines.lines();
    let mut running = tokio::task::JoinSet::new();
    // The line id of each task, for a task that fails (panics) instead of returning its record.
    let mut ids = std::collections::HashMap::new();
    let options = Arc::new(RunOptions {
        max_output_bytes: Some(args.max_output),
        max_answer_bytes: Some(args.max_output),
        trace: Some(trace.clone()),
        ..RunOptions::default()
    });
    let mut templates = Templates::default();
    loop {
        while running.len() < jobs && !cancel.is_cancelled() {
            let Some(line) = pending.next() else {
                break;
            };
            let (id, prepared, run_options) = match line {
                Ok(line) => {
                    let id = line.id.clone();
                    match templates.prepare(args, line) {
                        Ok((prepared, worktree)) => {
                            (id, Ok(prepared), line_options(&options, worktree))
                        }
                        Err(error) => (id, Err(error), Arc::clone(&options)),
                    }
                }
                Err((id, error)) => (id, Err(error), Arc::clone(&options)),
            };
            let task = running.spawn(run_line(id.clone(), prepared, run_options, cancel.clone()));
            ids.insert(task.id(), id);
            progress.started();
        }
        let Some(joined) = running.join_next_with_id().await else {
            break;
        };
        let record = match joined {
            Ok((task, record)) => {
                ids.remove(&task);
                record
            }
            Err(err) => BatchRecord::NotStarted {
                id: ids.remove(&err.id()).unwrap_or_default(),
                status: NotStarted::NotStarted,
                error: Some(format!("the run's task failed: {err}")),
            },
        };
        summary.count(&record);
        progress.ended(&record, &summary);
        output.write(&record).await;
    }
    for line in pending {
        let record = BatchRecord::NotStarted {
            id: line.map_or_else(|(id, _)| id, |line| line.id),
            status: NotStarted::NotStarted,
            error: None,
        };
        summary.count(&record);
        output.write(&record).await;
    }
    summary
}

impl Summary {
    /// The `--json-summary` line.
    fn record(&self) -> batch::BatchSummary {
        batch::BatchSummary {
            kind: batch::SummaryKind::Summary,
            completed: self.completed as u64,
            failed: self.failed as u64,
            not_started: self.not_started as u64,
            usage: self.usage.clone(),
        }
    }

    fn count(&mut self, record: &BatchRecord) {
        if let BatchRecord::Result { result, .. } = record
            && let Some(usage) = &result.usage
        {
            match &mut self.usage {
                Some(total) => total.add(usage),
                None => self.usage = Some(usage.clone()),
            }
        }
        match record {
            BatchRecord::Result { result, .. } if result.status == Status::Completed => {
                self.completed += 1;
            }
            BatchRecord::Result { .. } => self.failed += 1,
            BatchRecord::NotStarted { .. } => {
                self.failed += 1;
                self.not_started += 1;
            }
        }
    }
}

/// A line's start request: `acp-host run`'s, with the line's output schema (inline JSON, where
/// `run` reads a file), and its worktree (the line's `"worktree"`, or its definition's
/// `run.isolation`, shaped by `--worktree-base` / `--worktree-keep-dirty`).
fn line_request(args: &RunArgs, line: &BatchLine) -> Result<Built, String> {
    let mut built = request_for(args, line.prompt.clone())?;
    if let Some(schema) = &line.output_schema {
        built.request.wants.output = Some(OutputSpec {
            schema: schema.clone(),
            retries: DEFAULT_SCHEMA_RETRIES,
        });
    }
    Ok(built)
}

/// The batch's run options for a line running in `worktree`, else the shared ones.
fn line_options(
    options: &Arc<RunOptions>,
    worktree: Option<acp_host::worktree::Spec>,
) -> Arc<RunOptions> {
    match worktree {
        None => Arc::clone(options),
        Some(spec) => Arc::new(RunOptions {
            worktree: Some(spec),
            ..RunOptions::clone(options)
        }),
    }
}

/// One line's run: the library run of its prepared request, or the record of why it could not
/// be prepared (checked before the batch started, a failure now means the machine changed
/// meanwhile).
async fn run_line(
    id: String,
    prepared: Result<library::Prepared, String>,
    options: Arc<RunOptions>,
    cancel: Cancel,
) -> BatchRecord {
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            return BatchRecord::NotStarted {
                id,
                status: NotStarted::NotStarted,
                error: Some(error),
            };
        }
    };
    let result = library::run(prepared, &options, &cancel).await;
    BatchRecord::Result {
        id,
        result: Box::new(result),
    }
}

/// The prepared run of the last line, kept for the next lines asking for the same run (their
/// prompt and id aside): a line's request is built (its agent resolved, its env forwards parsed)
/// and prepared (the environment scrubbed, its schema compiled) once, not once per line, and
/// each run is that with its own prompt and its working directory checked again. A line with a
/// `subagent` is built whole every time: its definition's trust is checked at each start, as
/// `acp-host run --subagent` does.
#[derive(Default)]
struct Templates {
    last: Option<(BatchLine, library::Prepared)>,
}

impl Templates {
    /// The same request building and preparation as `acp-host run` (with the line's worktree),
    /// or why the line cannot run.
    fn prepare(
        &mut self,
        args: &BatchArgs,
        line: BatchLine,
    ) -> Result<(library::Prepared, Option<acp_host::worktree::Spec>), String> {
        if line.subagent.is_none()
            && let Some((last, template)) = &self.last
            && same_run(last, &line)
        {
            // Without a definition, a line's worktree is its own field's alone.
            let worktree = run_args(args, &line).worktree_flags();
            return template
                .for_prompt(line.prompt)
                .map(|prepared| (prepared, worktree))
                .map_err(|err| err.to_string());
        }
        let Built { request, worktree } = line_request(&run_args(args, &line), &line)?;
        let prepared =
            library::prepare(request, super::trace::agent_env()).map_err(|err| err.to_string())?;
        self.last = match line.subagent {
            Some(_) => None,
            None => prepared.for_prompt(String::new()).ok().map(|template| {
                (
                    BatchLine {
                        prompt: String::new(),
                        ..line
                    },
                    template,
                )
            }),
        };
        Ok((prepared, worktree))
    }
}

/// Where records go: the writer thread's queue. Waiting for room is the backpressure of a slow
/// reader; a record is never dropped for want of room. Only a stdout that is broken (closed,
/// failing), or that takes no byte for [`STALL`] after a signal, is given up: the records left
/// are then counted as lost (written never), so acp-host still ends.
struct Output {
    queue: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    writer: Arc<WriterState>,
    written: tokio::sync::watch::Receiver<usize>,
    interrupted: tokio::sync::watch::Receiver<u32>,
    /// Records handed to the writer.
    queued: usize,
    /// Stdout was given up: nothing more is queued.
    given_up: bool,
}

/// What the writer thread tells the batch.
#[derive(Debug, Default)]
struct WriterState {
    /// Records written whole.
    written: AtomicUsize,
    /// Bytes written, to tell a stall from a slow reader.
    bytes: AtomicU64,
    /// Why stdout takes no more records (closed, failing); set once.
    broken: OnceLock<String>,
}

impl Output {
    /// Starts the writer thread (inside the runtime's context). It stops the batch (`cancel`)
    /// when stdout breaks: nobody would see the records of further runs.
    fn start(
        jobs: usize,
        cancel: &Cancel,
        interrupted: tokio::sync::watch::Receiver<u32>,
    ) -> (Output, Arc<WriterState>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(WRITE_QUEUE.max(jobs));
        let (written_tx, written) = tokio::sync::watch::channel(0_usize);
        let writer = Arc::new(WriterState::default());
        let state = Arc::clone(&writer);
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while let Some(line) = rx.blocking_recv() {
                if state.broken.get().is_some() {
                    continue;
                }
                match state.write(&line) {
                    Ok(()) => {
                        let count = state.written.fetch_add(1, Ordering::SeqCst) + 1;
                        written_tx.send_replace(count);
                    }
                    Err(why) => {
                        note!("acp-host: batch: {why}; starting no more runs");
                        let _ = state.broken.set(why);
                        cancel.cancel();
                        written_tx.send_modify(|_| {});
                    }
                }
            }
        });
        let output = Output {
            queue: Some(tx),
            writer: Arc::clone(&writer),
            written,
            interrupted,
            queued: 0,
            given_up: false,
        };
        (output, writer)
    }

    async fn write(&mut self, record: &impl serde::Serialize) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => {
                tracing::warn!(%err, "cannot serialize a batch record");
                return;
            }
        };
        line.push(b'\n');
        if self.given_up || self.writer.broken.get().is_some() {
            return;
        }
        let Some(queue) = &self.queue else {
            return;
        };
        tokio::select! {
            room = queue.reserve() => match room {
                Ok(room) => {
                    room.send(line);
                    self.queued += 1;
                }
                Err(_) => self.given_up = true,
            },
            () = self.stalled() => self.given_up = true,
        }
    }

    /// Waits until every queued record is written, or stdout is given up.
    async fn finish(&mut self) {
        // The writer ends once it has taken the last record.
        self.queue = None;
        let queued = self.queued;
        let mut written = self.written.clone();
        tokio::select! {
            _ = written.wait_for(|&count| count >= queued) => {}
            () = self.stalled() => {}
        }
    }

    /// Resolves once stdout is broken, or, after Ctrl-C / SIGTERM, has taken no byte for
    /// [`STALL`] (called only while records wait for it).
    async fn stalled(&self) {
        let mut interrupted = self.interrupted.clone();
        let mut written = self.written.clone();
        // Without signal handlers no signal is counted: only a broken stdout gives up then.
        let mut signals = true;
        loop {
            if self.writer.broken.get().is_some() {
                return;
            }
            if *interrupted.borrow_and_update() > 0 {
                break;
            }
            tokio::select! {
                changed = interrupted.changed(), if signals => signals = changed.is_ok(),
                // The writer is gone (its thread ended): nothing more will be written.
                changed = written.changed() => if changed.is_err() { return },
            }
        }
        let mut last = (self.writer.bytes.load(Ordering::SeqCst), Instant::now());
        loop {
            tokio::time::sleep(STALL_POLL).await;
            let bytes = self.writer.bytes.load(Ordering::SeqCst);
            if self.writer.broken.get().is_some() {
                return;
            }
            if bytes != last.0 {
                last = (bytes, Instant::now());
            } else if last.1.elapsed() >= STALL {
                return;
            }
        }
    }
}

impl WriterState {
    /// Writes one record to stdout, in pieces (each counted as it goes); why it could not.
    fn write(&self, line: &[u8]) -> Result<(), String> {
        for piece in line.chunks(WRITE_PIECE) {
            match super::write_stdout(piece) {
                Ok(Written::Done) => {
                    self.bytes.fetch_add(piece.len() as u64, Ordering::SeqCst);
                }
                Ok(Written::Closed) => return Err("stdout was closed".to_owned()),
                Err(err) => return Err(err.to_string()),
            }
        }
        Ok(())
    }
}

/// Progress on stderr: a live bar on a terminal, plain lines otherwise.
struct Progress {
    total: usize,
    running: usize,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(total: usize, jobs: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "{elapsed_precise} [{bar:30}] {pos}/{len} done, {msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    )
                    .with_message("0 running, 0 failed");
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        if bar.is_none() {
            let runs = if total == 1 { "run" } else { "runs" };
            note!("acp-host: batch: {total} {runs}, at most {jobs} at once");
        }
        Progress {
            total,
            running: 0,
            started: Instant::now(),
            bar,
        }
    }

    fn started(&mut self) {
        self.running += 1;
    }

    fn ended(&mut self, record: &BatchRecord, summary: &Summary) {
        self.running = self.running.saturating_sub(1);
        let done = summary.completed + summary.failed;
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            bar.set_message(format!(
                "{} running, {} failed",
                self.running, summary.failed
            ));
            return;
        }
        let (id, status) = match record {
            BatchRecord::Result { id, result } => (id, result.status.as_str()),
            BatchRecord::NotStarted { id, .. } => (id, "not-started"),
        };
        note!(
            "acp-host: [{done}/{}] {id}: {status} ({} running, {} failed, {:.1} s)",
            self.total,
            self.running,
            summary.failed,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn finish(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_position((summary.completed + summary.failed) as u64);
            bar.set_message(format!("0 running, {} failed", summary.failed));
            bar.finish();
        }
        let usage = summary.usage.as_ref().map_or_else(String::new, |usage| {
            format!("; usage: {}", usage.describe())
        });
        note!(
            "acp-host: batch: {} completed, {} failed ({} not started) of {} in {:.1} s{usage}",
            summary.completed,
            summary.failed,
            summary.not_started,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
    }
}
