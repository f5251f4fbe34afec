//! `acp-host batch`: many runs from NDJSON lines, up to `--jobs` at once, each through the same
//! request building and library `run` as `acp-host run`.
//!
//! Invariants:
//! - every line is read and checked (its fields, its agent, its cwd, its subagent definition, its
//!   env names) before anything is spawned; a bad line is a usage error (exit 2) naming the line
//!   and the field. Only the parsed lines are kept (their prompts), never a run's output;
//! - at most `--jobs` agents run at once; each result is written (one `BatchRecord` line) as its
//!   run ends, by a writer thread behind a bounded queue, so memory is bounded by `--jobs`, not
//!   by the number of lines, and a stalled stdout slows the batch down instead of growing it;
//! - the first Ctrl-C / SIGTERM starts no more runs and cancels the running ones (the same
//!   cancel, graces and teardown as `run`); the second kills them; lines never started are
//!   written as `not-started` records. Exit 130 then, else 1 when any run did not complete, else 0;
//! - progress goes to stderr: a live bar on a terminal, one plain line per finished run otherwise.
//!   Stdout carries only the records.

use std::io::{BufRead, IsTerminal};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use acp_host::agents::{self, HostFacts};
use acp_host::run::{self as library, Cancel, PrepareError, RunOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use protocol::batch::{self, BatchLine, BatchRecord, NotStarted};
use protocol::env_scrub::EnvForward;
use protocol::request::StartRequest;
use protocol::result::Status;
use protocol::structured::{DEFAULT_SCHEMA_RETRIES, OutputSpec};

use super::run::{BatchFlags, PolicyArg, RunArgs, Seconds, Signals, parse_seconds, request_for};
use super::{CliError, Written, subagent};

/// Run many prompts, one agent each, up to --jobs at once.
///
/// Input: NDJSON, one JSON object per line with the fields `prompt` (required), `id` (default:
/// the line number), `agent`, `subagent`, `cwd`, `timeout` (seconds), `env` (names to forward)
/// and `outputSchema` (a JSON Schema, inline, as `run --output-schema`). Every line is checked
/// before anything starts. Output: one JSON record per line as its run ends, in completion order:
/// the `acp-host run --json` result with the line's `id` (type `result`), or type `not-started`
/// for lines that never started (Ctrl-C).
#[derive(Debug, clap::Args)]
#[command(after_long_help = after_help())]
pub struct BatchArgs {
    /// The NDJSON file, or `-` for stdin.
    #[arg(value_name = "FILE | -", default_value = "-")]
    input: String,

    /// How many agents run at once [default: the number of CPUs].
    #[arg(long, value_name = "N")]
    jobs: Option<NonZeroUsize>,

    /// The agent of lines without `agent`: a registry name or a command line [default:
    /// acp-child, or the line's subagent definition's agent].
    #[arg(long, value_name = "NAME|COMMAND-LINE")]
    agent: Option<String>,

    /// How to answer the agents' permission requests (nobody is asked during a batch)
    /// [default: reject, or the line's --subagents folder definition's; relay rejects]. A
    /// <cwd>/subagents/ definition only lowers it, and runs only once approved (`acp-host trust`)
    /// or under `allow`.
    #[arg(long, value_enum)]
    permission: Option<BatchPolicy>,

    /// Give up on a run after this many seconds (status `timeout` in its record), for lines
    /// without `timeout`.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    timeout: Option<Seconds>,

    /// A folder of subagent definitions for lines with `subagent`, after <cwd>/subagents/
    /// (repeatable).
    #[arg(long = "subagents", value_name = "DIR")]
    subagent_dirs: Vec<PathBuf>,
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
acp-host batch --permission allow --timeout 600 jobs.ndjson > results.ndjson\n",
        batch::exit_code_table()
    )
}

/// Records waiting for the writer thread at most (beyond the running ones).
const WRITE_QUEUE: usize = 16;

/// After Ctrl-C, how long the last records may wait for a stalled stdout before acp-host exits.
const LATE_WRITE: Duration = Duration::from_millis(100);

pub(super) fn execute(args: &BatchArgs) -> Result<ExitCode, CliError> {
    let lines = read_lines(args)?;
    let jobs = args
        .jobs
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get);
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
    let (records, writer) = Writer::start(jobs);
    let (seen_tx, seen) = tokio::sync::watch::channel(0_u32);
    let cancel = Cancel::new();
    let output = Output {
        records,
        interrupted: seen.clone(),
    };
    let summary = runtime.block_on(async {
        if let Some(signals) = signals {
            tokio::spawn(signals.watch(cancel.clone(), seen_tx));
        }
        drive(lines, args, jobs, &cancel, output, &mut progress).await
    });
    let interrupted = *seen.borrow() > 0;
    progress.finish(&summary);
    writer.finish(if interrupted { Some(LATE_WRITE) } else { None });
    Ok(ExitCode::from(batch::exit_code(
        interrupted,
        summary.completed + summary.failed,
        summary.completed,
    )))
}

/// Reads and checks every line; keeps only the parsed lines.
fn read_lines(args: &BatchArgs) -> Result<Vec<BatchLine>, CliError> {
    let (input, name): (Box<dyn BufRead>, String) = if args.input == "-" {
        (Box::new(std::io::stdin().lock()), "stdin".into())
    } else {
        let file = std::fs::File::open(&args.input)
            .map_err(|err| CliError::Usage(format!("cannot read {}: {err}", args.input)))?;
        (Box::new(std::io::BufReader::new(file)), args.input.clone())
    };
    let mut checker = Checker::new(args);
    if let Some(agent) = &args.agent {
        checker
            .agent(agent)
            .map_err(|problem| CliError::Usage(format!("--agent {agent}: {problem}")))?;
    }
    let mut ids = std::collections::HashMap::new();
    let mut lines = Vec::new();
    for (index, text) in input.lines().enumerate() {
        let number = index + 1;
        let text = text.map_err(|err| {
            CliError::Usage(format!("{name}: line {number}: cannot read it: {err}"))
        })?;
        let Some(line) = batch::parse_line(number, &text) else {
            continue;
        };
        let line = line.map_err(|err| CliError::Usage(format!("{name}: {err}")))?;
        if let Some(first) = ids.insert(line.id.clone(), number) {
            return Err(CliError::Usage(format!(
                "{name}: line {number}, field `id`: {:?} is already the id of line {first}; ids \
                 must be unique",
                line.id
            )));
        }
        checker.check(&line).map_err(|(field, problem)| {
            CliError::Usage(format!("{name}: line {number}, field `{field}`: {problem}"))
        })?;
        lines.push(line);
    }
    Ok(lines)
}

/// Checks a line against the machine, as `acp-host run` would before spawning.
struct Checker<'a> {
    args: &'a BatchArgs,
    facts: HostFacts,
    /// Each agent is looked up once, however many lines name it.
    agents: std::collections::HashMap<String, Result<(), String>>,
}

impl<'a> Checker<'a> {
    fn new(args: &'a BatchArgs) -> Self {
        Checker {
            args,
            facts: HostFacts::from_env(),
            agents: std::collections::HashMap::new(),
        }
    }

    /// Whether `agent` names a command that can be launched and whose program is there: unlike
    /// `run`, where a missing program is the run's spawn error, a batch refuses it up front
    /// rather than fail it once per line.
    fn agent(&mut self, agent: &str) -> Result<(), String> {
        let facts = &self.facts;
        self.agents
            .entry(agent.to_owned())
            .or_insert_with(|| {
                let resolved = agents::resolve(agent, facts).map_err(|err| err.to_string())?;
                if resolved.location.is_found() {
                    return Ok(());
                }
                let program = resolved.command.program.display();
                Err(match resolved.command.install_hint {
                    Some(hint) => format!("{program} is not installed (`{hint}`)"),
                    None => format!("{program} is not found (not on PATH, not a file)"),
                })
            })
            .clone()
    }

    /// `(field, problem)` for the first thing wrong with the line.
    fn check(&mut self, line: &BatchLine) -> Result<(), (&'static str, String)> {
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
        let request =
            line_request(&run_args(self.args, line), line).map_err(|err| ("subagent", err))?;
        library::prepare(request, std::env::vars_os()).map_err(|err| match err {
            PrepareError::Env(err) => ("env", err.to_string()),
            PrepareError::Schema(err) => ("outputSchema", err.to_string()),
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
}

/// Starts runs while fewer than `jobs` run and no cancel came; writes each record as it ends.
async fn drive(
    lines: Vec<BatchLine>,
    args: &BatchArgs,
    jobs: usize,
    cancel: &Cancel,
    mut output: Output,
    progress: &mut Progress,
) -> Summary {
    let mut summary = Summary::default();
    let mut pending = lines.into_iter();
    let mut running = tokio::task::JoinSet::new();
    // The line id of each task, for a task that fails (panics) instead of returning its record.
    let mut ids = std::collections::HashMap::new();
    loop {
        while running.len() < jobs && !cancel.is_cancelled() {
            let Some(line) = pending.next() else {
                break;
            };
            let run_args = run_args(args, &line);
            let id = line.id.clone();
            let task = running.spawn(run_line(line, run_args, cancel.clone()));
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
            id: line.id,
            status: NotStarted::NotStarted,
            error: None,
        };
        summary.count(&record);
        output.write(&record).await;
    }
    summary
}

impl Summary {
    fn count(&mut self, record: &BatchRecord) {
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
/// `run` reads a file).
fn line_request(args: &RunArgs, line: &BatchLine) -> Result<StartRequest, String> {
    let mut request = request_for(args, line.prompt.clone())?;
    if let Some(schema) = &line.output_schema {
        request.wants.output = Some(OutputSpec {
            schema: schema.clone(),
            retries: DEFAULT_SCHEMA_RETRIES,
        });
    }
    Ok(request)
}

/// One line's run: the same request building, preparation and library run as `acp-host run`.
async fn run_line(line: BatchLine, args: RunArgs, cancel: Cancel) -> BatchRecord {
    let not_started = |error: String| BatchRecord::NotStarted {
        id: line.id.clone(),
        status: NotStarted::NotStarted,
        error: Some(error),
    };
    // Checked before the batch started; a failure now means the machine changed meanwhile.
    let request = match line_request(&args, &line) {
        Ok(built) => built,
        Err(error) => return not_started(error),
    };
    let prepared = match library::prepare(request, std::env::vars_os()) {
        Ok(prepared) => prepared,
        Err(error) => return not_started(error.to_string()),
    };
    let result = library::run(prepared, &RunOptions::default(), &cancel).await;
    BatchRecord::Result {
        id: line.id,
        result: Box::new(result),
    }
}

/// Where records go: the writer thread's queue. Waiting for room is the backpressure of a slow
/// reader, until Ctrl-C: from then on a record that does not fit is dropped (and counted), so a
/// stalled stdout never keeps acp-host from ending.
struct Output {
    records: tokio::sync::mpsc::Sender<Vec<u8>>,
    interrupted: tokio::sync::watch::Receiver<u32>,
}

impl Output {
    async fn write(&mut self, record: &BatchRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => {
                tracing::warn!(%err, "cannot serialize a batch record");
                return;
            }
        };
        line.push(b'\n');
        let room = if *self.interrupted.borrow() > 0 {
            self.records.try_reserve().ok()
        } else {
            tokio::select! {
                room = self.records.reserve() => room.ok(),
                _ = self.interrupted.changed() => self.records.try_reserve().ok(),
            }
        };
        // No room after Ctrl-C, or the writer is gone (stdout failed): the record is lost.
        if let Some(room) = room {
            room.send(line);
        } else {
            tracing::warn!("a batch record was not written: stdout is not being read");
        }
    }
}

/// Writes records to stdout on a thread of its own, so a stalled reader never blocks the runs'
/// I/O or a signal.
struct Writer {
    done: std::sync::mpsc::Receiver<()>,
}

impl Writer {
    fn start(jobs: usize) -> (tokio::sync::mpsc::Sender<Vec<u8>>, Writer) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(WRITE_QUEUE.max(jobs));
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut open = true;
            while let Some(line) = rx.blocking_recv() {
                if !open {
                    continue;
                }
                match super::write_stdout(&line) {
                    Ok(Written::Done) => {}
                    Ok(Written::Closed) => open = false,
                    Err(err) => {
                        tracing::warn!(%err, "stopped writing batch records");
                        open = false;
                    }
                }
            }
            let _ = done_tx.send(());
        });
        (tx, Writer { done })
    }

    /// Waits until every record is written, or at most `limit`.
    fn finish(self, limit: Option<Duration>) {
        let _ = match limit {
            Some(limit) => self.done.recv_timeout(limit).ok(),
            None => self.done.recv().ok(),
        };
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
        note!(
            "acp-host: batch: {} completed, {} failed ({} not started) of {} in {:.1} s",
            summary.completed,
            summary.failed,
            summary.not_started,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
    }
}
