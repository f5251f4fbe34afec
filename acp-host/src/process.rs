//! The one owner of an agent process.
//!
//! [`AgentProcess`] spawns the agent with an explicit environment (nothing inherited implicitly,
//! no inherited file descriptor above stderr), in its own process group, and drains its stderr
//! into a bounded tail and, line by line, to an optional [`StderrSink`] (each line capped at
//! [`STDERR_LINE_MAX`] bytes). It never writes to the host's own stderr: a host embedded in an
//! agent uses its stderr as the log channel. On Linux (glibc) the agent runs under the
//! watchdog ([`crate::watchdog`], a fork of this process: host -> watchdog -> agent; the watchdog
//! leads the group and kills the whole tree if the host dies); elsewhere, or should the watchdog
//! fail to start, it is spawned directly with a parent-death signal. It tears the whole tree down with a bounded,
//! idempotent ladder:
//! already exited -> close stdin and wait the EOF grace -> SIGTERM the group and wait the TERM
//! grace -> SIGKILL the group and reap; then everything the leader left behind gets the same
//! TERM -> KILL treatment: its group's members and, on Linux, every descendant tracked through
//! `/proc` (before each signal, and as reported by the watchdog), including processes that left
//! the group with `setsid()`.
//!
//! Invariants: nothing else in the host sends signals; every path ends with the leader reaped
//! (`shutdown`) or at least killed (`Drop`: the watchdog's life pipe closes, or SIGKILL to the
//! group); a second `shutdown` returns the first outcome; only pids found below the agent are
//! reaped, never `waitpid(-1)`.

use std::collections::{BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Sink;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use protocol::result::EndedBy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::lock;
pub use crate::spawn_spec::{SpawnSpec, StderrSink};

/// How long the watchdog may take to start the agent and say so.
const WATCHDOG_HANDSHAKE: Duration = Duration::from_secs(10);

/// How long leftover group members get between our SIGKILL and giving up on observing their exit.
const KILL_CONFIRM: Duration = Duration::from_secs(2);
/// Poll interval while waiting for leftover group members (they are not our children, so there is
/// no exit notification to await).
const GROUP_POLL: Duration = Duration::from_millis(10);

/// The longest stderr line passed to a [`StderrSink`]; the rest of a longer line is dropped and the
/// line ends with [`STDERR_CUT_MARKER`].
pub const STDERR_LINE_MAX: usize = 4096;
/// Appended to a stderr line cut at [`STDERR_LINE_MAX`] bytes.
pub const STDERR_CUT_MARKER: &str = " [line cut at 4096 bytes]";

/// The graces of the teardown ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Graces {
    /// After closing stdin: a real agent flushes its session and stops its own children on EOF.
    pub eof: Duration,
    /// After SIGTERM to the group.
    pub term: Duration,
}

impl Graces {
    /// No grace at all: straight to SIGKILL when anything is still running.
    pub(crate) const NONE: Graces = Graces {
        eof: Duration::ZERO,
        term: Duration::ZERO,
    };
}

/// The spawn failed; nothing is running.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The caller knows how to fix it (install hints), so the message states only the fact.
    #[error("agent command not found: {program}")]
    NotFound {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("agent command is not executable: {program} (check its permissions)")]
    PermissionDenied {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("could not start agent {program}")]
    Io {
        program: String,
        #[source]
        source: io::Error,
    },
    /// The kernel refused to put the agent into its sandbox: nothing of it ran.
    #[error(
        "could not put agent {program} into its sandbox (where the kernel refuses user namespaces, set ACP_HOST_SANDBOX_NAMESPACES=0 to confine by Landlock alone)"
    )]
    Sandbox {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// The rung of the ladder that ended the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// It had already exited when teardown began.
    Exited,
    /// It exited after its stdin was closed.
    Eof,
    /// SIGTERM to the group ended it.
    Term,
    /// SIGKILL was needed.
    Kill,
}

impl Rung {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::Exited => "exited",
            Rung::Eof => "eof",
            Rung::Term => "term",
            Rung::Kill => "kill",
        }
    }
}

/// The result records the rung that ended the agent (`agentExit.endedBy`).
impl From<Rung> for EndedBy {
    fn from(rung: Rung) -> Self {
        match rung {
            Rung::Exited => EndedBy::Exited,
            Rung::Eof => EndedBy::Eof,
            Rung::Term => EndedBy::Term,
            Rung::Kill => EndedBy::Kill,
        }
    }
}

/// What teardown observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Teardown {
    pub rung: Rung,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Group members still alive after the leader was reaped (and then terminated).
    pub leftovers: usize,
    /// Pids that survived even SIGKILL within the confirmation window (should be empty).
    pub survivors: Vec<i32>,
}

/// Frames waiting for the agent's stdin, at most, before a writer waits.
const STDIN_QUEUE_FRAMES: usize = 64;

/// The agent's stdin as a line sink: each item is one frame, newline appended by the writer task.
pub(crate) type LineSink = std::pin::Pin<Box<dyn Sink<String, Error = io::Error> + Send>>;

/// The agent's pipes, handed to the protocol layer (stdin stays open until teardown closes it).
pub struct AgentPipes {
    pub(crate) stdin: LineSink,
    pub(crate) stdout: pipe::Receiver,
}

/// A running (or finished) agent process and its process tree.
pub struct AgentProcess {
    /// The leader of the agent's process group: the watchdog (with our ends of its pipes), or
    /// the agent itself.
    child: Leader,
    leader: u32,
    /// The agent's own pid (the watchdog's child when there is one).
    pid: u32,
    /// Processes found below the leader; they may have left its group.
    tracked: BTreeSet<i32>,
    /// Cancelling it makes the stdin writer drop the pipe: the agent sees EOF.
    close_stdin: CancellationToken,
    /// Fired once the first line reached the agent's stdin, or at teardown.
    first_write: CancellationToken,
    writer: Option<JoinHandle<()>>,
    stderr: Arc<Mutex<StderrTail>>,
    stderr_task: Option<JoinHandle<()>>,
    outcome: Option<Teardown>,
}

/// The leader of the agent's group, and how its end is learnt.
enum Leader {
    /// The agent itself, our child: no watchdog could run.
    Agent(Child),
    /// The agent's watchdog, and our ends of its pipes.
    Watchdog {
        /// Forked from this process: our child, reaped by us. `None`: forked by the spawner
        /// (`crate::spawner`), so never ours to reap; the spawner reaped it once its report
        /// pipe is at EOF, with the status its `exit` line said.
        child: Option<Child>,
        watch: Watch,
    },
}

/// The host's ends of the watchdog's pipes.
struct Watch {
    /// Only we hold the write end: closing it (or dying) tells the watchdog to kill the tree.
    _life: OwnedFd,
    /// `ok <pid>` / `err <errno>` / `cwd <errno>` / `sandbox <errno>`, then `left <pid>...` when the agent exits and,
    /// from the spawner, `exit <status>` once it reaped the watchdog. Non-blocking.
    report: pipe::Receiver,
    /// Bytes read from `report` not yet consumed as a line.
    pending: Vec<u8>,
    /// The first line's verdict, once read: the agent's pid, or why it did not start.
    started: Option<Result<u32, StartFailed>>,
    /// The `left` lines' pids, until the sweep takes them.
    left: Vec<i32>,
    /// The `exit` line's wait status.
    exit: Option<i32>,
    /// The report pipe is at EOF: the watchdog is gone.
    eof: bool,
    /// The agent's program and working directory, for a spawn error.
    program: PathBuf,
    cwd: PathBuf,
}

/// Why the watchdog's first report says the agent is not running.
#[derive(Debug, Clone)]
enum StartFailed {
    /// `err <errno>`: the agent's exec failed.
    Errno(i32),
    /// `cwd <errno>`: the agent's working directory could not be entered.
    Cwd(i32),
    /// `sandbox <errno>`: the sandbox could not be entered.
    Sandbox(i32),
    /// No usable first line: the watchdog itself failed.
    Unavailable(String),
}

impl StartFailed {
    fn into_spawn_error(self, program: &Path, cwd: &Path) -> SpawnError {
        match self {
            StartFailed::Errno(code) => spawn_error(program, io::Error::from_raw_os_error(code)),
            StartFailed::Cwd(code) => SpawnError::Io {
                program: program.display().to_string(),
                source: io::Error::new(
                    io::Error::from_raw_os_error(code).kind(),
                    format!(
                        "cannot enter its working directory {}: {}",
                        cwd.display(),
                        io::Error::from_raw_os_error(code)
                    ),
                ),
            },
            StartFailed::Sandbox(code) => SpawnError::Sandbox {
                program: program.display().to_string(),
                source: io::Error::from_raw_os_error(code),
            },
            StartFailed::Unavailable(reason) => SpawnError::Io {
                program: program.display().to_string(),
                source: io::Error::other(format!("the watchdog failed to start: {reason}")),
            },
        }
    }
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess")
            .field("pid", &self.pid)
            .field("leader", &self.leader)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

/// Why the watchdog could not be used (the agent is then spawned directly).
#[derive(Debug)]
enum Watched {
    /// The agent itself could not start: the caller's error, no fallback.
    Agent(SpawnError),
    Unavailable(String),
}

/// Process-wide hardening for a program that runs agents; the `acp-host` binary calls it at
/// start-up, a library user should call it once before its first run (it changes the whole
/// process, so the library never does it behind the caller's back). On Linux:
///
/// - not dumpable (`PR_SET_DUMPABLE` 0): an agent running as the same user can no longer read
///   this process's environment, memory or file descriptors through `/proc` (or attach a
///   debugger), so the credentials the scrub withholds stay out of its reach. It also disables
///   core dumps of this process.
/// - a child subreaper: orphans of the agent's tree re-parent here, not to init, so they stay
///   findable (and are reaped) until teardown ends them.
///
/// Elsewhere it does nothing. This keeps accidents out, not a determined same-user attacker:
/// such a process can still, for example, read the files the credentials came from.
pub fn harden_host() -> Result<(), HardenError> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_dumpable(false).map_err(|e| HardenError::Dumpable(e.into()))?;
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| HardenError::Subreaper(e.into()))?;
    }
    Ok(())
}

/// The most open files [`raise_open_files`] asks for when the hard limit is unlimited.
const OPEN_FILES_CEILING: u64 = 1 << 20;

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (at most 2^20 when the hard limit
/// is unlimited), for a process that holds a few descriptors per child (pipes, a
/// watchdog's report, a pidfd): a thousand children need about five thousand, and many systems
/// start a process with a soft limit of 1,024. Raising the soft limit up to the hard one needs no
/// privilege. Children inherit the raised limit (a program of theirs that uses `select(2)` only
/// breaks past 1,024 descriptors, where it would have failed with the old limit anyway).
///
/// Returns `(before, after)` when the limit was raised, `None` when it already was as high or
/// could not be read or set (the process then runs with what it has).
#[must_use]
pub fn raise_open_files() -> Option<(u64, u64)> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let target = if hard == RLIM_INFINITY {
        OPEN_FILES_CEILING
    } else {
        hard.min(OPEN_FILES_CEILING)
    };
    if soft != RLIM_INFINITY && soft < target {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard).ok()?;
        return Some((soft, target));
    }
    None
}

/// [`harden_host`] failed; the process runs unhardened.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    #[error("could not make this process non-dumpable (prctl PR_SET_DUMPABLE)")]
    Dumpable(#[source] io::Error),
    #[error("could not make this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER)")]
    Subreaper(#[source] io::Error),
}

impl AgentProcess {
    /// Spawns the agent in its own process group with exactly `spec.env`, under the watchdog
    /// when one is available.
    pub fn spawn(spec: &SpawnSpec) -> Result<(AgentProcess, AgentPipes), SpawnError> {
        if crate::watchdog::AVAILABLE {
            match Self::spawn_watched(spec) {
                Ok((mut process, pipes)) => match process.confirm_watched() {
                    Ok(_) => return Ok((process, pipes)),
                    Err(StartFailed::Unavailable(reason)) => {
                        tracing::warn!(reason, "watchdog unavailable; spawning the agent directly");
                    }
                    Err(failed) => return Err(failed.into_spawn_error(&spec.program, &spec.cwd)),
                },
                Err(Watched::Agent(err)) => return Err(err),
                // Not working: the tree no longer dies with the host; say so.
                Err(Watched::Unavailable(reason)) => {
                    tracing::warn!(reason, "watchdog unavailable; spawning the agent directly");
                }
            }
        }
        Self::spawn_direct(spec)
    }

    /// [`AgentProcess::spawn`] without waiting for the watchdog's word that the agent started:
    /// the caller writes to the agent meanwhile (the pipe holds it), then calls
    /// [`AgentProcess::confirm`] before it relies on the pid or reports the run. On a busy
    /// machine the watchdog's wake-up after the agent's exec can wait behind the agent's own
    /// start-up; not waiting for it keeps the first request off that path.
    pub(crate) fn spawn_unconfirmed(
        spec: &SpawnSpec,
    ) -> Result<(AgentProcess, AgentPipes), SpawnError> {
        if crate::watchdog::AVAILABLE {
            match Self::spawn_watched(spec) {
                Ok(spawned) => return Ok(spawned),
                Err(Watched::Agent(err)) => return Err(err),
                Err(Watched::Unavailable(reason)) => {
                    tracing::warn!(reason, "watchdog unavailable; spawning the agent directly");
                }
            }
        }
        Self::spawn_direct(spec)
    }

    fn spawn_direct(spec: &SpawnSpec) -> Result<(AgentProcess, AgentPipes), SpawnError> {
        let command = command(
            spec,
            spec.program.as_os_str(),
            spec.args.iter().map(OsString::from),
        );
        let confine = spec
            .sandbox
            .as_deref()
            .map(crate::sandbox::Confinement::raw);
        let mut child = spawn_command(command, &spec.program, confine)?;
        let pid = child.id().unwrap_or_default();
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            unreachable!("all three pipes were requested")
        };
        let ends = (|| {
            Ok::<_, io::Error>(HostEnds {
                stdin: stdin.into_owned_fd()?,
                stdout: stdout.into_owned_fd()?,
                stderr: stderr.into_owned_fd()?,
            })
        })()
        .map_err(|source| spawn_error(&spec.program, source))?;
        Self::start(Leader::Agent(child), pid, pid, ends, spec)
            .map_err(|source| spawn_error(&spec.program, source))
    }

    /// Whether the agent started (waiting, at most [`WATCHDOG_HANDSHAKE`], for the watchdog's
    /// first report if it has not been read yet): its pid, or the spawn error. Idempotent.
    pub(crate) fn confirm(&mut self) -> Result<u32, SpawnError> {
        let (program, cwd) = match self.watch() {
            Some(watch) => (watch.program.clone(), watch.cwd.clone()),
            None => return Ok(self.pid),
        };
        self.confirm_watched()
            .map_err(|failed| failed.into_spawn_error(&program, &cwd))
    }

    fn confirm_watched(&mut self) -> Result<u32, StartFailed> {
        let Some(watch) = self.watch_mut() else {
            return Ok(self.pid);
        };
        let started = watch.handshake();
        if let Ok(pid) = started {
            self.pid = pid;
        }
        started
    }

    fn spawn_watched(spec: &SpawnSpec) -> Result<(AgentProcess, AgentPipes), Watched> {
        let unavailable = |what: &str, err: &dyn std::fmt::Display| {
            Watched::Unavailable(format!("{what}: {err}"))
        };
        let nul = |err: crate::watchdog::NulError| {
            Watched::Agent(SpawnError::Io {
                program: spec.program.display().to_string(),
                source: io::Error::new(io::ErrorKind::InvalidInput, err),
            })
        };
        let pipe = |what: &str| {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| unavailable(what, &e))
        };
        let (life_read, life) = pipe("life pipe")?;
        let (report_read, report_write) = pipe("report pipe")?;
        let (stdin_read, stdin) = pipe("stdin pipe")?;
        let (stdout, stdout_write) = pipe("stdout pipe")?;
        let (stderr, stderr_write) = pipe("stderr pipe")?;
        let agent_ends = [
            &stdin_read,
            &stdout_write,
            &stderr_write,
            &life_read,
            &report_write,
        ]
        .map(AsRawFd::as_raw_fd);
        let (child, leader) = match crate::spawner::spawn(spec, agent_ends) {
            crate::spawner::Spawned::Watchdog(pid) => (None, pid),
            crate::spawner::Spawned::Nul(err) => return Err(nul(err)),
            crate::spawner::Spawned::Failed(source) => {
                return Err(Watched::Agent(SpawnError::Io {
                    program: spec.program.display().to_string(),
                    source,
                }));
            }
            crate::spawner::Spawned::Unavailable => {
                let watchdog = crate::watchdog::Watchdog::new(
                    spec.program.as_os_str(),
                    spec.args.iter().map(std::ffi::OsStr::new),
                    spec.env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())),
                    life_read.as_raw_fd(),
                    report_write.as_raw_fd(),
                    spec.sandbox
                        .as_deref()
                        .map(crate::sandbox::Confinement::raw),
                )
                .map_err(nul)?;
                // The program is never executed by this command: the forked child becomes the
                // watchdog and starts the agent itself (see `watchdog`).
                let mut command = process_command(spec, spec.program.as_os_str());
                command
                    .stdin(Stdio::from(stdin_read))
                    .stdout(Stdio::from(stdout_write))
                    .stderr(Stdio::from(stderr_write));
                watch_pre_exec(&mut command, watchdog);
                let child = command.spawn().map_err(|e| unavailable("spawn", &e))?;
                let leader = child.id().unwrap_or_default();
                (Some(child), leader)
            }
        };
        // Our copies of the watchdog's ends must go, or EOF could never be seen on either side
        // (the command, which held the fallback's, is gone already).
        drop((life_read, report_write));
        // From here on a watchdog runs and has started the agent: a failure is this run's spawn
        // error, never a reason to start the agent a second time without one. (Returning drops
        // the life pipe, and the watchdog ends what it started.)
        let started_but = |source: io::Error| {
            Watched::Agent(SpawnError::Io {
                program: spec.program.display().to_string(),
                source,
            })
        };
        let report = pipe::Receiver::from_owned_fd(report_read).map_err(started_but)?;
        let watch = Watch {
            _life: life,
            report,
            pending: Vec::new(),
            started: None,
            left: Vec::new(),
            exit: None,
            eof: false,
            program: spec.program.clone(),
            cwd: spec.cwd.clone(),
        };
        let ends = HostEnds {
            stdin,
            stdout,
            stderr,
        };
        Self::start(Leader::Watchdog { child, watch }, leader, 0, ends, spec).map_err(started_but)
    }

    fn start(
        child: Leader,
        leader: u32,
        pid: u32,
        ends: HostEnds,
        spec: &SpawnSpec,
    ) -> io::Result<(AgentProcess, AgentPipes)> {
        let stdin = pipe::Sender::from_owned_fd(ends.stdin)?;
        let stdout = pipe::Receiver::from_owned_fd(ends.stdout)?;
        let stderr = pipe::Receiver::from_owned_fd(ends.stderr)?;

        let close_stdin = CancellationToken::new();
        let first_write = CancellationToken::new();
        // Bounded: a writer of frames faster than the agent reads them waits (a served agent's
        // client is slowed down, never queued for without bound).
        let (tx, rx) = mpsc::channel::<String>(STDIN_QUEUE_FRAMES);
        let writer = tokio::spawn(write_lines(
            stdin,
            rx,
            close_stdin.clone(),
            first_write.clone(),
        ));
        let sink = futures::sink::unfold(tx, |tx, line: String| async move {
            tx.send(line)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "agent stdin is closed"))?;
            Ok::<_, io::Error>(tx)
        });

        let tail = Arc::new(Mutex::new(StderrTail::new(spec.stderr_tail_bytes)));
        let stderr_task = tokio::spawn(drain_stderr(
            stderr,
            Arc::clone(&tail),
            spec.stderr_lines.clone(),
        ));

        tracing::debug!(pid, leader, program = %spec.program.display(), watched = matches!(child, Leader::Watchdog { .. }), "agent spawned");
        Ok((
            AgentProcess {
                child,
                leader,
                pid,
                tracked: BTreeSet::new(),
                close_stdin,
                first_write,
                writer: Some(writer),
                stderr: tail,
                stderr_task: Some(stderr_task),
                outcome: None,
            },
            AgentPipes {
                stdin: Box::pin(sink),
                stdout,
            },
        ))
    }

    /// The agent's pid (not the watchdog's).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn watch(&self) -> Option<&Watch> {
        match &self.child {
            Leader::Watchdog { watch, .. } => Some(watch),
            Leader::Agent(_) => None,
        }
    }

    fn watch_mut(&mut self) -> Option<&mut Watch> {
        match &mut self.child {
            Leader::Watchdog { watch, .. } => Some(watch),
            Leader::Agent(_) => None,
        }
    }

    /// Fires once the first line was written to the agent's stdin (or teardown began): from then
    /// on the agent has what it needs to answer, and the host's own set-up can run beside it.
    pub(crate) fn first_write(&self) -> CancellationToken {
        self.first_write.clone()
    }

    /// The last bytes of the agent's stderr, lossily decoded.
    #[must_use]
    pub fn stderr_tail(&self) -> String {
        lock(&self.stderr).to_string_lossy()
    }

    /// Resolves when the leader has exited (without reaping the rest of the tree).
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        match &mut self.child {
            Leader::Agent(child)
            | Leader::Watchdog {
                child: Some(child), ..
            } => child.wait().await,
            Leader::Watchdog { child: None, watch } => watch.exited().await,
        }
    }

    /// The leader's status if it has exited, without waiting.
    fn try_exited(&mut self) -> io::Result<Option<ExitStatus>> {
        match &mut self.child {
            Leader::Agent(child)
            | Leader::Watchdog {
                child: Some(child), ..
            } => child.try_wait(),
            Leader::Watchdog { child: None, watch } => {
                watch.read_available();
                Ok(watch.eof.then(|| watch.status()))
            }
        }
    }

    /// Tears the process tree down with the ladder and returns what happened. Idempotent.
    pub async fn shutdown(&mut self, graces: Graces) -> Teardown {
        if let Some(outcome) = &self.outcome {
            return outcome.clone();
        }
        self.first_write.cancel();
        let (status, rung) = self.stop_leader(graces).await;
        let (leftovers, survivors) = self.sweep(graces.term).await;
        // The stderr pipe closes when the last writer in the tree exits; wait (bounded) so the
        // tail we report is complete.
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
        let outcome = Teardown {
            rung,
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            leftovers,
            survivors,
        };
        tracing::debug!(pid = self.pid, ?outcome, "agent torn down");
        self.outcome = Some(outcome.clone());
        outcome
    }

    async fn stop_leader(&mut self, graces: Graces) -> (Option<ExitStatus>, Rung) {
        // Under the watchdog, what the agent leaves when it exits on EOF is in its report; a
        // walk of the tree is needed only before a signal.
        if self.watch().is_none() {
            self.track();
        }
        if let Ok(Some(status)) = self.try_exited() {
            self.close_stdin.cancel();
            return (Some(status), Rung::Exited);
        }
        self.close_stdin.cancel();
        if let Ok(Ok(status)) = tokio::time::timeout(graces.eof, self.exited()).await {
            return (Some(status), Rung::Eof);
        }
        self.track();
        self.signal_group(Signal::SIGTERM);
        if let Ok(Ok(status)) = tokio::time::timeout(graces.term, self.exited()).await {
            return (Some(status), Rung::Term);
        }
        // The last chance to see the tree whole: SIGKILL ends the watchdog with the agent.
        self.track();
        self.signal_group(Signal::SIGKILL);
        (self.exited().await.ok(), Rung::Kill)
    }

    /// Adds everything now below the leader (or below a tracked process) to `tracked`.
    fn track(&mut self) {
        let Ok(leader) = i32::try_from(self.leader) else {
            return;
        };
        let mut roots: Vec<i32> = self.tracked.iter().copied().collect();
        roots.push(leader);
        self.tracked.extend(crate::reaper::descendants(&roots));
    }

    /// The watchdog's last word: the descendants still alive when the agent exited.
    fn read_report(&mut self) {
        let Some(watch) = self.watch_mut() else {
            return;
        };
        watch.read_available();
        let left = std::mem::take(&mut watch.left);
        self.tracked.extend(left);
    }

    /// Everything of the agent's still alive: its group's members and the tracked tree (with
    /// whatever the tracked processes started since). Dead tracked pids are reaped and dropped.
    fn remaining(&mut self) -> Vec<i32> {
        let dead: Vec<i32> = self
            .tracked
            .iter()
            .copied()
            .filter(|pid| !crate::reaper::alive(*pid))
            .collect();
        for pid in dead {
            crate::reaper::reap(pid);
            self.tracked.remove(&pid);
        }
        let roots: Vec<i32> = self.tracked.iter().copied().collect();
        self.tracked.extend(crate::reaper::descendants(&roots));
        let mut all: BTreeSet<i32> = self.tracked.clone();
        // An empty group (the usual case) costs one kill(-pgid, 0); only a group with members
        // left is looked up in the whole process table.
        let members = group_members(self.leader);
        if cfg!(target_os = "linux") && !members.is_empty() {
            let pgid = i32::try_from(self.leader).unwrap_or(-1);
            let table = crate::reaper::processes();
            all.extend(table.iter().filter(|e| e.pgrp == pgid).map(|e| e.pid));
        } else {
            all.extend(members);
        }
        all.into_iter().collect()
    }

    /// After the leader is gone, terminates whatever the agent left behind.
    async fn sweep(&mut self, term_grace: Duration) -> (usize, Vec<i32>) {
        self.read_report();
        let leftovers = self.remaining();
        if leftovers.is_empty() {
            return (0, Vec::new());
        }
        tracing::debug!(pid = self.pid, ?leftovers, "agent left processes behind");
        self.signal_remaining(Signal::SIGTERM);
        if !self.wait_gone(term_grace).await {
            self.signal_remaining(Signal::SIGKILL);
            self.wait_gone(KILL_CONFIRM).await;
        }
        (leftovers.len(), self.remaining())
    }

    fn signal_remaining(&mut self, signal: Signal) {
        self.signal_group(signal);
        for pid in self.tracked.clone() {
            // ESRCH: it exited meanwhile, which is the goal.
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    async fn wait_gone(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.remaining().is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
    }

    fn signal_group(&self, signal: Signal) {
        let Ok(pgid) = i32::try_from(self.leader) else {
            return;
        };
        // ESRCH means the group is already gone, which is the goal.
        if let Err(err) = killpg(Pid::from_raw(pgid), signal)
            && err != nix::errno::Errno::ESRCH
        {
            tracing::warn!(pgid, %signal, %err, "could not signal the agent's process group");
        }
    }
}

impl Watch {
    /// The first line's verdict, waiting for it at most [`WATCHDOG_HANDSHAKE`]; no line (EOF or
    /// the timeout) is `Unavailable`. Idempotent.
    fn handshake(&mut self) -> Result<u32, StartFailed> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let deadline = std::time::Instant::now() + WATCHDOG_HANDSHAKE;
        loop {
            self.read_available();
            if let Some(started) = &self.started {
                return started.clone();
            }
            let left = deadline.checked_duration_since(std::time::Instant::now());
            if self.eof || left.is_none() {
                let why = if self.eof { "it exited" } else { "timed out" };
                let started = Err(StartFailed::Unavailable(format!("no handshake ({why})")));
                self.started = Some(started.clone());
                return started;
            }
            let timeout = left
                .and_then(|left| PollTimeout::try_from(left).ok())
                .unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.report.as_fd(), PollFlags::POLLIN)];
            if let Err(err) = poll(&mut fds, timeout)
                && err != nix::errno::Errno::EINTR
            {
                self.eof = true;
            }
        }
    }

    /// Reads what the report pipe holds now (it never blocks) and takes in its whole lines.
    fn read_available(&mut self) {
        let mut buf = [0u8; 4096];
        while !self.eof {
            // A plain read, not the runtime's `try_read`: that trusts the reactor's readiness,
            // which nobody updates while this thread is blocked in `handshake`.
            match nix::unistd::read(&self.report, &mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => self.eof = true,
            }
        }
        self.take_lines();
    }

    /// Takes in the whole lines of `pending`: the first line's verdict, `left` pids, the `exit`
    /// status.
    fn take_lines(&mut self) {
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let (word, rest) = line
                .trim_end()
                .split_once(' ')
                .unwrap_or((line.trim_end(), ""));
            let number = || rest.trim().parse::<i32>();
            match word {
                "left" => self.left.extend(
                    rest.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                ),
                "exit" => self.exit = number().ok(),
                _ if self.started.is_some() => {}
                "ok" => {
                    self.started =
                        Some(rest.trim().parse::<u32>().map_err(|_| {
                            StartFailed::Unavailable(format!("bad handshake {line:?}"))
                        }));
                }
                "err" => self.started = Some(Err(StartFailed::Errno(number().unwrap_or(0)))),
                "cwd" => self.started = Some(Err(StartFailed::Cwd(number().unwrap_or(0)))),
                "sandbox" => {
                    self.started = Some(Err(StartFailed::Sandbox(number().unwrap_or(0))));
                }
                _ => {
                    self.started = Some(Err(StartFailed::Unavailable(format!(
                        "bad handshake {line:?}"
                    ))));
                }
            }
        }
        // A partial last line waits for its end, bounded: report lines are at most 16 KiB.
        if self.eof {
            self.pending.clear();
        }
    }

    /// Resolves once the watchdog is gone (its report pipe at EOF): its status.
    async fn exited(&mut self) -> io::Result<ExitStatus> {
        let mut buf = [0u8; 4096];
        while !self.eof {
            self.report.readable().await?;
            // A read that would block clears the readiness: the next wait then sleeps until the
            // watchdog writes or exits.
            match self.report.try_read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) => {}
                Err(_) => self.eof = true,
            }
        }
        self.take_lines();
        Ok(self.status())
    }

    /// The watchdog's wait status, from the spawner's `exit` line (the agent's, which the watchdog
    /// mirrors); without one (the spawner gone too), death by SIGKILL.
    fn status(&self) -> ExitStatus {
        std::os::unix::process::ExitStatusExt::from_raw(self.exit.unwrap_or(nix::libc::SIGKILL))
    }
}

/// The host's ends of the agent's stdio.
struct HostEnds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.first_write.cancel();
        if self.outcome.is_none() {
            // An abandoned run (panic, dropped future): no graces, but never a leak.
            self.track();
            for pid in &self.tracked {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            if matches!(self.child, Leader::Agent(_)) {
                self.signal_group(Signal::SIGKILL);
            }
            if let Leader::Agent(child) = &mut self.child {
                let _ = child.start_kill();
            }
            // A watchdog: dropping our ends of its pipes right after this (the leader is the
            // first field dropped) closes the life pipe, and it SIGKILLs its whole tree,
            // escapees included; killing its group here could end it before it acts.
        }
    }
}

/// The agent's command: exact environment, cwd, piped stdio, own group.
fn command(
    spec: &SpawnSpec,
    program: &std::ffi::OsStr,
    args: impl IntoIterator<Item = OsString>,
) -> tokio::process::Command {
    let mut command = process_command(spec, program);
    command.args(args).env_clear().envs(&spec.env);
    command
}

/// What the agent's and the watchdog's commands share.
fn process_command(spec: &SpawnSpec, program: &std::ffi::OsStr) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own group: wrapper launchers (npx, uvx, sh -c) must not orphan the real agent.
        .process_group(0);
    command
}

/// Spawns a direct agent (no watchdog) with the pre-exec hook: close-on-exec of inherited fds,
/// the parent-death signal.
fn spawn_command(
    mut command: tokio::process::Command,
    program: &Path,
    confine: Option<crate::sandbox::Raw>,
) -> Result<Child, SpawnError> {
    pre_exec(&mut command, confine);
    command
        .spawn()
        .map_err(|source| spawn_error(program, source))
}

fn spawn_error(program: &Path, source: io::Error) -> SpawnError {
    let program = program.display().to_string();
    match source.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound { program, source },
        io::ErrorKind::PermissionDenied => SpawnError::PermissionDenied { program, source },
        _ => SpawnError::Io { program, source },
    }
}

/// The fd numbers the fallback close-on-exec loop visits: below the soft `RLIMIT_NOFILE`
/// (computed before fork, where any call is allowed).
fn open_max() -> RawFd {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .and_then(|(soft, _)| RawFd::try_from(soft).ok())
        .unwrap_or(RawFd::MAX)
        .min(1 << 20)
}

#[expect(
    unsafe_code,
    reason = "pre_exec is the only way to run code in the child between fork and exec: marking \
              inherited fds close-on-exec and setting the parent-death signal"
)]
fn pre_exec(command: &mut tokio::process::Command, confine: Option<crate::sandbox::Raw>) {
    use nix::libc;
    let max_fd = open_max();
    #[cfg(target_os = "linux")]
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe syscalls
    // (close_range, fcntl, prctl, getppid) on plain integers captured by copy; it allocates
    // nothing and takes no lock. Marking (not closing) every fd above stderr close-on-exec leaves
    // std's own exec-error pipe working (it is close-on-exec already) while no fd the host
    // inherited without CLOEXEC reaches the agent.
    unsafe {
        command.pre_exec(move || {
            #[cfg(target_os = "linux")]
            let marked = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) == 0;
            #[cfg(not(target_os = "linux"))]
            let marked = false;
            // Kernels before 5.11 (and other unixes): visit every possible fd.
            if !marked {
                for fd in 3..max_fd {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                    }
                }
            }
            #[cfg(target_os = "linux")]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                // The host may have died between fork and prctl: then no signal would ever come.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::other("acp-host exited while starting the agent"));
                }
            }
            // Last, so the agent's exec is the first thing done inside its sandbox (std hands
            // only the errno of a failure back to the spawn).
            if let Some(confine) = &confine {
                confine.enter().map_err(io::Error::from_raw_os_error)?;
            }
            Ok(())
        });
    }
}

/// Makes `command`'s child enter `confinement` just before its exec: for a process started
/// outside the run library (acp-child's shell commands). The command keeps the confinement alive
/// until it is dropped; the caller keeps it too until the child has exited (its temporary folder
/// goes with it). A child that cannot enter it is not started (the spawn fails with the errno).
#[expect(
    unsafe_code,
    reason = "pre_exec is the only way to run code in the child between fork and exec: entering \
              the sandbox, in async-signal-safe system calls"
)]
pub fn confine_command(
    command: &mut tokio::process::Command,
    confinement: Arc<crate::sandbox::Confinement>,
) {
    let raw = confinement.raw();
    // SAFETY: `enter` runs only async-signal-safe system calls on data prepared before the fork
    // (see `sandbox::Raw`), which `confinement`, moved into the closure, keeps alive.
    unsafe {
        command.pre_exec(move || {
            let _keep = &confinement;
            raw.enter().map_err(io::Error::from_raw_os_error)
        });
    }
}

/// Makes the command's forked child the watchdog: it runs [`crate::watchdog::Watchdog::serve`]
/// and never execs the command's program.
#[expect(
    unsafe_code,
    reason = "pre_exec is the only way to run code in the child between fork and exec: the \
              watchdog's whole life, in async-signal-safe system calls"
)]
fn watch_pre_exec(command: &mut tokio::process::Command, watchdog: crate::watchdog::Watchdog) {
    // SAFETY: `serve` runs only async-signal-safe system calls on data prepared before the fork
    // (see the `watchdog` module's invariants).
    unsafe {
        command.pre_exec(move || watchdog.serve());
    }
}

/// Writes each line plus `\n`; drops the pipe (EOF for the agent) only when teardown says so or
/// the agent stops reading.
async fn write_lines(
    mut stdin: pipe::Sender,
    mut rx: mpsc::Receiver<String>,
    close: CancellationToken,
    first_write: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            biased;
            () = close.cancelled() => break,
            line = rx.recv() => {
                let Some(line) = line else {
                    // The protocol layer is done, but EOF is the ladder's first rung: keep the
                    // pipe open until teardown closes it, so the rung that ended the agent is exact.
                    close.cancelled().await;
                    break;
                };
                line
            }
        };
        // One write per line: the newline written apart woke the agent a second time.
        let mut line = line;
        line.push('\n');
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        if let Err(err) = written.await {
            tracing::debug!(%err, "agent stdin write failed");
            break;
        }
        if !first_write.is_cancelled() {
            first_write.cancel();
        }
    }
}

async fn drain_stderr(
    mut stderr: pipe::Receiver,
    tail: Arc<Mutex<StderrTail>>,
    sink: Option<StderrSink>,
) {
    // Read into its capacity, never zeroed first: most agents write nothing to stderr.
    let mut buf = Vec::with_capacity(8192);
    let mut lines = StderrLines::default();
    loop {
        buf.clear();
        match stderr.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                lock(&tail).push(&buf[..n]);
                if let Some(sink) = &sink {
                    lines.push(&buf[..n], |line| sink(line));
                }
            }
        }
    }
    if let Some(sink) = &sink {
        lines.finish(|line| sink(line));
    }
}

/// Splits stderr bytes into lines, each at most [`STDERR_LINE_MAX`] bytes: memory stays bounded
/// whatever the agent writes.
#[derive(Debug, Default)]
struct StderrLines {
    line: Vec<u8>,
    /// The current line was already emitted cut; its rest is dropped up to the newline.
    cut: bool,
}

impl StderrLines {
    fn push(&mut self, mut data: &[u8], mut emit: impl FnMut(&str)) {
        while !data.is_empty() {
            let (chunk, newline) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], Some(i + 1)),
                None => (data, None),
            };
            if !self.cut {
                let room = STDERR_LINE_MAX - self.line.len();
                if chunk.len() > room {
                    self.line.extend_from_slice(&chunk[..room]);
                    let mut text = String::from_utf8_lossy(&self.line).into_owned();
                    text.push_str(STDERR_CUT_MARKER);
                    emit(&text);
                    self.line.clear();
                    self.cut = true;
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            match newline {
                Some(consumed) => {
                    if !self.cut {
                        self.emit_line(&mut emit);
                    }
                    self.cut = false;
                    data = &data[consumed..];
                }
                None => data = &[],
            }
        }
    }

    /// The last line, when the stream ended without a newline.
    fn finish(&mut self, mut emit: impl FnMut(&str)) {
        if !self.cut && !self.line.is_empty() {
            self.emit_line(&mut emit);
        }
    }

    fn emit_line(&mut self, emit: &mut impl FnMut(&str)) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        emit(&String::from_utf8_lossy(line));
        self.line.clear();
    }
}

/// The last `cap` bytes written to stderr.
#[derive(Debug)]
struct StderrTail {
    cap: usize,
    bytes: VecDeque<u8>,
}

impl StderrTail {
    fn new(cap: usize) -> Self {
        StderrTail {
            cap,
            bytes: VecDeque::with_capacity(cap.min(64 * 1024)),
        }
    }

    fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.cap)..];
        let overflow = (self.bytes.len() + data.len()).saturating_sub(self.cap);
        self.bytes.drain(..overflow);
        self.bytes.extend(data);
    }

    fn to_string_lossy(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let mut all = Vec::with_capacity(a.len() + b.len());
        all.extend_from_slice(a);
        all.extend_from_slice(b);
        String::from_utf8_lossy(&all).into_owned()
    }
}

/// Whether process group `pgid` still has members, where there is no /proc to list them: a
/// signal-0 probe answers "some or none".
fn group_members(pgid: u32) -> Vec<i32> {
    let Ok(pgid) = i32::try_from(pgid) else {
        return Vec::new();
    };
    if killpg(Pid::from_raw(pgid), None).is_ok() {
        vec![pgid]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // One below the target: lowering it further could starve the tests running beside.
        let low = hard.min(OPEN_FILES_CEILING) - 1;
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();
        let raised = raise_open_files();
        let (now, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let target = hard.min(OPEN_FILES_CEILING);
        assert_eq!(now, target);
        assert_eq!(raised, Some((low, target)));
        // Already as high: nothing to do.
        assert_eq!(raise_open_files(), None);
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    }

    use super::*;

    /// A `Watch` whose report pipe already holds `report` and is closed (the watchdog gone).
    fn watch_reading(report: &[u8]) -> Watch {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        nix::unistd::write(&write, report).unwrap();
        drop(write);
        let (_, life) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        Watch {
            _life: life,
            report: pipe::Receiver::from_owned_fd(read).unwrap(),
            pending: Vec::new(),
            started: None,
            left: Vec::new(),
            exit: None,
            eof: false,
            program: PathBuf::from("agent"),
            cwd: PathBuf::from("/gone"),
        }
    }

    #[tokio::test]
    async fn a_spawned_watchdogs_report_gives_the_agent_its_leftovers_and_its_status() {
        let mut watch = watch_reading(b"ok 42\nleft 7 8\nexit 256\n");
        assert!(matches!(watch.handshake(), Ok(42)));
        let status = watch.exited().await.unwrap();
        assert_eq!(status.code(), Some(1));
        assert_eq!(watch.left, [7, 8]);
        // The agent killed by a signal: the watchdog's status says so.
        let mut watch = watch_reading(b"ok 42\nleft\nexit 15\n");
        let status = watch.exited().await.unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(15)
        );
        assert!(watch.left.is_empty());
        // No `exit` line: the watchdog itself was killed (the ladder's last rung).
        let mut watch = watch_reading(b"ok 42\n");
        let status = watch.exited().await.unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    /// The spawn error a watchdog's first report line makes, for agent `agent` in `cwd`.
    fn start_error(report: &[u8], cwd: &str) -> SpawnError {
        watch_reading(report)
            .handshake()
            .unwrap_err()
            .into_spawn_error(Path::new("agent"), Path::new(cwd))
    }

    #[tokio::test]
    async fn a_working_directory_the_watchdog_could_not_enter_is_named_in_the_spawn_error() {
        assert_eq!(
            protocol::report::describe(&start_error(b"cwd 2\n", "/gone")),
            "could not start agent agent: cannot enter its working directory /gone: No such \
             file or directory (os error 2)"
        );
        let err = start_error(b"err 13\n", "/");
        assert!(
            matches!(err, SpawnError::PermissionDenied { .. }),
            "{err:?}"
        );
        assert_eq!(
            protocol::report::describe(&start_error(b"", "/")),
            "could not start agent agent: the watchdog failed to start: no handshake (it exited)"
        );
    }

    #[test]
    fn stderr_tail_keeps_the_last_bytes() {
        let mut tail = StderrTail::new(5);
        tail.push(b"abc");
        tail.push(b"defg");
        assert_eq!(tail.to_string_lossy(), "cdefg");
        tail.push(b"0123456789");
        assert_eq!(tail.to_string_lossy(), "56789");
    }

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut lines = StderrLines::default();
        let mut out = Vec::new();
        for chunk in chunks {
            lines.push(chunk, |line| out.push(line.to_owned()));
        }
        lines.finish(|line| out.push(line.to_owned()));
        out
    }

    #[test]
    fn stderr_lines_are_split_across_chunks() {
        assert_eq!(
            split(&[b"one\ntw", b"o\r\n\nthree"]),
            ["one", "two", "", "three"]
        );
        assert!(split(&[b""]).is_empty());
    }

    #[test]
    fn a_long_stderr_line_is_cut_with_a_marker() {
        let long = vec![b'x'; STDERR_LINE_MAX * 2 + 10];
        let lines = split(&[&long[..5000], &long[5000..], b"\nnext\n"]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0],
            format!("{}{STDERR_CUT_MARKER}", "x".repeat(STDERR_LINE_MAX))
        );
        assert_eq!(lines[1], "next");
        let exact = vec![b'y'; STDERR_LINE_MAX];
        assert_eq!(split(&[&exact, b"\n"]), [String::from_utf8(exact).unwrap()]);
    }
}
