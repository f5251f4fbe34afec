//! The one owner of an agent process.
//!
//! [`AgentProcess`] spawns the agent with an explicit environment (nothing inherited implicitly),
//! in its own process group, with a parent-death signal on Linux, and drains its stderr into a
//! bounded tail and, line by line, to an optional [`StderrSink`] (each line capped at
//! [`STDERR_LINE_MAX`] bytes). It never writes to the host's own stderr: a host embedded in an
//! agent uses its stderr as the log channel. It tears the whole group down with a bounded, idempotent ladder:
//! already exited -> close stdin and wait the EOF grace -> SIGTERM the group and wait the TERM
//! grace -> SIGKILL the group and reap; then any group member the leader left behind (a wrapper's
//! grandchild) gets the same TERM -> KILL treatment.
//!
//! Invariants: nothing else in the host sends signals; every path ends with the leader reaped
//! (`shutdown`) or at least `SIGKILL`ed (`Drop`); a second `shutdown` returns the first outcome.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Sink;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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

/// Receives the agent's stderr one line at a time (without the line ending, lossily decoded).
pub type StderrSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What to spawn, fully resolved.
#[derive(Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Absolute, already validated.
    pub cwd: PathBuf,
    /// The complete environment of the child; nothing else is inherited. OS strings: a variable
    /// need not be UTF-8.
    pub env: BTreeMap<OsString, OsString>,
    /// How many trailing bytes of stderr to keep for the result.
    pub stderr_tail_bytes: usize,
    /// Where each stderr line goes as it arrives, if anywhere.
    pub stderr_lines: Option<StderrSink>,
}

impl std::fmt::Debug for SpawnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("stderr_tail_bytes", &self.stderr_tail_bytes)
            .field("stderr_lines", &self.stderr_lines.is_some())
            .finish_non_exhaustive()
    }
}

/// The graces of the teardown ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Graces {
    /// After closing stdin: a real agent flushes its session and stops its own children on EOF.
    pub eof: Duration,
    /// After SIGTERM to the group.
    pub term: Duration,
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

/// The agent's stdin as a line sink: each item is one frame, newline appended by the writer task.
pub(crate) type LineSink = std::pin::Pin<Box<dyn Sink<String, Error = io::Error> + Send>>;

/// The agent's pipes, handed to the protocol layer (stdin stays open until teardown closes it).
pub struct AgentPipes {
    pub(crate) stdin: LineSink,
    pub(crate) stdout: ChildStdout,
}

/// A running (or finished) agent process and its process group.
pub struct AgentProcess {
    child: Child,
    pid: u32,
    /// Cancelling it makes the stdin writer drop the pipe: the agent sees EOF.
    close_stdin: CancellationToken,
    writer: Option<JoinHandle<()>>,
    stderr: Arc<Mutex<StderrTail>>,
    stderr_task: Option<JoinHandle<()>>,
    outcome: Option<Teardown>,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess")
            .field("pid", &self.pid)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl AgentProcess {
    /// Spawns the agent in its own process group with exactly `spec.env`.
    pub fn spawn(spec: &SpawnSpec) -> Result<(AgentProcess, AgentPipes), SpawnError> {
        let program = spec.program.display().to_string();
        let mut command = tokio::process::Command::new(&spec.program);
        command
            .args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own group: wrapper launchers (npx, uvx, sh -c) must not orphan the real agent.
            .process_group(0);
        set_parent_death_signal(&mut command);
        let mut child = command.spawn().map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => SpawnError::NotFound {
                program: program.clone(),
                source,
            },
            io::ErrorKind::PermissionDenied => SpawnError::PermissionDenied {
                program: program.clone(),
                source,
            },
            _ => SpawnError::Io {
                program: program.clone(),
                source,
            },
        })?;
        let pid = child.id().unwrap_or_default();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were requested")
        };

        let close_stdin = CancellationToken::new();
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(write_lines(stdin, rx, close_stdin.clone()));
        let sink = futures::sink::unfold(tx, |tx, line: String| async move {
            tx.send(line)
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "agent stdin is closed"))?;
            Ok::<_, io::Error>(tx)
        });

        let tail = Arc::new(Mutex::new(StderrTail::new(spec.stderr_tail_bytes)));
        let stderr_task = tokio::spawn(drain_stderr(
            stderr,
            Arc::clone(&tail),
            spec.stderr_lines.clone(),
        ));

        tracing::debug!(pid, program, "agent spawned");
        Ok((
            AgentProcess {
                child,
                pid,
                close_stdin,
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

    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The last bytes of the agent's stderr, lossily decoded.
    #[must_use]
    pub fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|tail| tail.to_string_lossy())
            .unwrap_or_default()
    }

    /// Resolves when the leader has exited (without reaping the rest of the group).
    pub async fn exited(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Tears the process group down with the ladder and returns what happened. Idempotent.
    pub async fn shutdown(&mut self, graces: Graces) -> Teardown {
        if let Some(outcome) = &self.outcome {
            return outcome.clone();
        }
        let (status, rung) = self.stop_leader(graces).await;
        let (leftovers, survivors) = self.sweep_group(graces.term).await;
        // The stderr pipe closes when the last writer in the group exits; wait (bounded) so the
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
        if let Ok(Some(status)) = self.child.try_wait() {
            self.close_stdin.cancel();
            return (Some(status), Rung::Exited);
        }
        self.close_stdin.cancel();
        if let Ok(Ok(status)) = tokio::time::timeout(graces.eof, self.child.wait()).await {
            return (Some(status), Rung::Eof);
        }
        self.signal_group(Signal::SIGTERM);
        if let Ok(Ok(status)) = tokio::time::timeout(graces.term, self.child.wait()).await {
            return (Some(status), Rung::Term);
        }
        self.signal_group(Signal::SIGKILL);
        (self.child.wait().await.ok(), Rung::Kill)
    }

    /// After the leader is gone, terminates whatever it left in its group.
    async fn sweep_group(&self, term_grace: Duration) -> (usize, Vec<i32>) {
        let leftovers = group_members(self.pid);
        if leftovers.is_empty() {
            return (0, Vec::new());
        }
        tracing::debug!(
            pid = self.pid,
            ?leftovers,
            "agent left processes in its group"
        );
        self.signal_group(Signal::SIGTERM);
        if !wait_group_empty(self.pid, term_grace).await {
            self.signal_group(Signal::SIGKILL);
            wait_group_empty(self.pid, KILL_CONFIRM).await;
        }
        (leftovers.len(), group_members(self.pid))
    }

    fn signal_group(&self, signal: Signal) {
        let Ok(pgid) = i32::try_from(self.pid) else {
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

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.outcome.is_none() {
            // An abandoned run (panic, dropped future): no graces, but never a leak.
            self.signal_group(Signal::SIGKILL);
            let _ = self.child.start_kill();
        }
    }
}

#[expect(
    unsafe_code,
    reason = "pre_exec is the only way to set the parent-death signal in the child before exec"
)]
fn set_parent_death_signal(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // syscalls (prctl, getppid); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                // The host may have died between fork and prctl: then no signal would ever come.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::other("acp-host exited while starting the agent"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Writes each line plus `\n`; drops the pipe (EOF for the agent) only when teardown says so or
/// the agent stops reading.
async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<String>,
    close: CancellationToken,
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
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await
        };
        if let Err(err) = written.await {
            tracing::debug!(%err, "agent stdin write failed");
            break;
        }
    }
}

async fn drain_stderr(
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<StderrTail>>,
    sink: Option<StderrSink>,
) {
    let mut buf = vec![0u8; 8192];
    let mut lines = StderrLines::default();
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Ok(mut tail) = tail.lock() {
                    tail.push(&buf[..n]);
                }
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

/// Live (non-zombie) members of process group `pgid`. Linux reads /proc; elsewhere a signal-0
/// probe answers "some or none".
fn group_members(pgid: u32) -> Vec<i32> {
    #[cfg(target_os = "linux")]
    {
        // One signal-0 probe first: an empty group (the usual case) costs no /proc scan.
        if let Ok(pgid) = i32::try_from(pgid)
            && killpg(Pid::from_raw(pgid), None) == Err(nix::errno::Errno::ESRCH)
        {
            return Vec::new();
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|stat| parse_stat(&stat))
                    .is_some_and(|(state, pgrp)| state != 'Z' && state != 'X' && pgrp == pgid)
            })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let Ok(pgid) = i32::try_from(pgid) else {
            return Vec::new();
        };
        if killpg(Pid::from_raw(pgid), None).is_ok() {
            vec![pgid]
        } else {
            Vec::new()
        }
    }
}

/// `(state, pgrp)` from a /proc/<pid>/stat line; the command name may contain spaces and ')'.
#[cfg(target_os = "linux")]
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

async fn wait_group_empty(pgid: u32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if group_members(pgid).is_empty() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[cfg(target_os = "linux")]
    #[test]
    fn parses_stat_with_odd_names() {
        assert_eq!(parse_stat("42 (a b) c) S 1 42 42 0 -1"), Some(('S', 42)));
    }
}
