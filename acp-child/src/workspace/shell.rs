//! `run_command`: a shell command in the session directory, bounded in time and output.
//!
//! The command runs as `sh -c COMMAND` in its own process group, with stdin closed. It ends in one
//! of three ways ([`Ended`]): it exits; it outlives the timeout; or the turn is cancelled. In the
//! last two cases the whole process group is killed (SIGKILL), so nothing it started lingers. When
//! the shell exits first, anything it left in the background is killed too once its output pipes
//! have had [`DRAIN_GRACE`] to close: a tool call never hangs on a background process holding a
//! pipe open. The group is also killed when the call is abandoned (its future dropped, as when the
//! connection closes mid-turn and the turn's task goes with it). A process that leaves the group
//! (`setsid`) is beyond the group kill; the acp-child binary, a child subreaper, adopts it once
//! its parent is gone, reaps it, and kills it when it stops serving (the binary's `orphans`).
//! [`run`] spawns on the thread that polls it, the runtime's, as every spawn of acp-child does:
//! a shell started from the main thread would look adopted there and could be reaped behind
//! tokio's back. Each stream keeps its first [`MAX_STREAM_BYTES`] bytes (the rest is counted and
//! discarded, never blocking the child on a full pipe). The command inherits this agent's
//! delegation standing (`ACP_HOST_DEPTH` and `ACP_HOST_MAX_DEPTH`, `protocol::depth`; the cap
//! lowered by the session's own `maxDepth`), so an `acp-host run` inside it starts its agent one
//! level deeper, even when this agent was started by an editor without them.
//!
//! A background command ([`run_into`] with no timeout: `run_command`'s `run_in_background`) is
//! the same run spawned as a task of the session's table: it ends when it exits or when its
//! task is stopped, its group killed either way; its [`Streams`] can be read while it runs.
//!
//! The command runs in the sandbox the person chose (`--command-sandbox`, `--command-network`;
//! by default `workspace-write` with the network off, best effort), held to the one this agent
//! itself runs in (`ACP_HOST_SANDBOX`): acp-host's library prepares it and the shell enters it
//! before its exec, so everything the command starts is confined too. A failure that looks like
//! the sandbox's refusal gets a note saying what the sandbox allows and how to ask for more.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt as _;
use tokio_util::sync::CancellationToken;

use super::ToolError;

/// Each of stdout and stderr keeps at most this many bytes (64 KiB for both).
pub(crate) const MAX_STREAM_BYTES: usize = 32 * 1024;
/// How long output pipes may stay open after the shell exits.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited on its own.
    Exited(ExitStatus),
    /// It ran longer than the timeout and was killed.
    TimedOut(Duration),
    /// The turn was cancelled and it was killed.
    Cancelled,
    /// A background command stopped by `task_kill`, or by its session's cancel or close, and
    /// killed.
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CommandOutput {
    pub(crate) ended: Ended,
    /// The sandbox it ran in, if any.
    pub(crate) sandbox: Option<protocol::sandbox::Report>,
    /// Its standard output (the first [`MAX_STREAM_BYTES`], lossy UTF-8).
    pub(crate) stdout: Captured,
    /// Its standard error (the first [`MAX_STREAM_BYTES`], lossy UTF-8).
    pub(crate) stderr: Captured,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Captured {
    pub(crate) bytes: Vec<u8>,
    /// How many bytes the stream produced in all.
    pub(crate) total: usize,
}

/// A command's two streams while it runs: what a background command's `task_output` shows
/// before it ends.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    stdout: Mutex<Captured>,
    stderr: Mutex<Captured>,
}

impl Streams {
    fn stdout(&self) -> &Mutex<Captured> {
        &self.stdout
    }

    fn stderr(&self) -> &Mutex<Captured> {
        &self.stderr
    }

    /// What the streams captured so far, as a finished command's output shows them.
    pub(crate) fn so_far(&self) -> String {
        let mut text = String::new();
        for (name, captured) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            render_stream(
                &mut text,
                name,
                &captured.lock().unwrap_or_else(PoisonError::into_inner),
            );
        }
        text.trim_start_matches('\n').to_owned()
    }
}

/// Appends one stream's section (none when it produced nothing), saying where it was cut.
fn render_stream(text: &mut String, name: &str, captured: &Captured) {
    if captured.total == 0 {
        return;
    }
    let _ = write!(
        text,
        "\n--- {name} ---\n{}",
        String::from_utf8_lossy(&captured.bytes)
    );
    if captured.total > captured.bytes.len() {
        let _ = write!(
            text,
            "\n[{name} truncated: showing the first {} of {} bytes]",
            captured.bytes.len(),
            captured.total
        );
    }
}

impl CommandOutput {
    /// Whether the command exited with status 0.
    #[must_use]
    pub(crate) fn succeeded(&self) -> bool {
        matches!(self.ended, Ended::Exited(status) if status.success())
    }

    /// The tool result shown to the model and the user.
    #[must_use]
    pub(crate) fn render(&self) -> String {
        let mut text = match self.ended {
            Ended::Exited(status) => match status.code() {
                Some(code) => format!("exit code: {code}"),
                None => format!("killed by a signal ({status})"),
            },
            Ended::TimedOut(limit) => format!(
                "timed out after {} s and was killed (raise --command-timeout for longer commands)",
                limit.as_secs()
            ),
            Ended::Cancelled => "cancelled by the user and killed".to_owned(),
            Ended::Stopped => {
                "stopped (task_kill, or its session was cancelled or closed) and killed".to_owned()
            }
        };
        if let Some(sandbox) = &self.sandbox
            && sandbox.enforced != protocol::sandbox::Enforced::Full
        {
            let _ = write!(text, "\n[{}]", sandbox.describe());
        }
        render_stream(&mut text, "stdout", &self.stdout);
        render_stream(&mut text, "stderr", &self.stderr);
        if let Some(sandbox) = &self.sandbox
            && !self.succeeded()
            && looks_refused(&self.stderr.bytes)
        {
            let _ = write!(
                text,
                "\n[the command ran in a {}: it may write only {}; credential folders are \
                 unreadable; the network is {}. If it needs more, call run_command again with \
                 outside_sandbox: true, which asks the user]",
                sandbox.describe(),
                if sandbox.writable.is_empty() {
                    "its temporary folder".to_owned()
                } else {
                    sandbox.writable.join(", ")
                },
                sandbox.network,
            );
        }
        text
    }
}

/// Whether a failed command's stderr reads like a sandbox's refusal.
fn looks_refused(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr);
    [
        "Permission denied",
        "Operation not permitted",
        "Read-only file system",
    ]
    .iter()
    .any(|refusal| text.contains(refusal))
}

/// The sandbox a command runs in: `policy` at `cwd`, held to the one this agent runs in.
fn standing(
    policy: &protocol::sandbox::Policy,
    cwd: &Path,
) -> Result<protocol::sandbox::Standing, ToolError> {
    use protocol::sandbox::Standing;
    let own = std::env::var(protocol::env_vars::ACP_HOST_SANDBOX).ok();
    let floor = match Standing::inherited(own.as_deref()) {
        Ok(floor) => floor,
        Err((strictest, why)) => {
            tracing::warn!(%why, "the inherited sandbox cannot be read; commands run in the strictest");
            Some(strictest)
        }
    };
    let standing = policy
        .at(cwd)
        .map_err(|err| ToolError::Sandbox(err.to_string()))?;
    Ok(floor.map_or_else(|| standing.clone(), |floor| standing.within(&floor)))
}

/// Runs `command` with `sh -c` in `cwd`, standing at `budget` (the session's: this agent's own,
/// its cap lowered by the session's `maxDepth`; `None` passes the inherited values on as they
/// are).
pub(crate) async fn run(
    command: &str,
    cwd: &Path,
    timeout: Duration,
    cancel: &CancellationToken,
    budget: Option<protocol::depth::DepthBudget>,
    sandbox: &protocol::sandbox::Policy,
) -> Result<CommandOutput, ToolError> {
    run_into(
        command,
        cwd,
        Some(timeout),
        cancel,
        budget,
        sandbox,
        &Arc::default(),
    )
    .await
}

/// [`run`], capturing into `streams` (read while it runs) and with no timeout when `timeout` is
/// `None` (a background command runs until it exits or `cancel` fires).
pub(crate) async fn run_into(
    command: &str,
    cwd: &Path,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    budget: Option<protocol::depth::DepthBudget>,
    sandbox: &protocol::sandbox::Policy,
    streams: &Arc<Streams>,
) -> Result<CommandOutput, ToolError> {
    let mut shell = tokio::process::Command::new("sh");
    if let Some(budget) = budget {
        shell.envs(budget.env());
    }
    // Kept until the command is done: its temporary folder goes with it.
    let standing = standing(sandbox, cwd)?;
    shell.env_remove(protocol::env_vars::ACP_HOST_SANDBOX);
    let confinement = if standing.is_active() {
        let env = std::env::vars_os().collect();
        let place = acp_host::sandbox::Place {
            env: &env,
            sessions: Vec::new(),
        };
        let confinement = acp_host::sandbox::confine(&standing, &place)
            .map_err(|err| ToolError::Sandbox(protocol::report::describe(&err)))?;
        if let Some(temp) = confinement.temp_dir() {
            shell.env("TMPDIR", temp);
        }
        shell.env(protocol::env_vars::ACP_HOST_SANDBOX, standing.env_value());
        let confinement = Arc::new(confinement);
        acp_host::process::confine_command(&mut shell, Arc::clone(&confinement));
        Some(confinement)
    } else {
        None
    };
    let mut child = shell
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ToolError::Spawn {
            cwd: cwd.to_path_buf(),
            source,
        })?;
    let mut group = GroupKiller(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    );
    let mut readers = tokio::task::JoinSet::new();
    if let Some(pipe) = child.stdout.take() {
        readers.spawn(drain(pipe, Arc::clone(streams), Streams::stdout));
    }
    if let Some(pipe) = child.stderr.take() {
        readers.spawn(drain(pipe, Arc::clone(streams), Streams::stderr));
    }
    let limit = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        biased;
        () = cancel.cancelled() => Ended::Cancelled,
        () = limit => Ended::TimedOut(timeout.unwrap_or_default()),
        status = child.wait() => match status {
            Ok(status) => Ended::Exited(status),
            Err(source) => return Err(ToolError::Spawn { cwd: cwd.to_path_buf(), source }),
        },
    };
    if matches!(ended, Ended::Exited(_)) {
        // Let the pipes close on their own; then clear out anything left in the background.
        let _ = tokio::time::timeout(DRAIN_GRACE, async {
            while readers.join_next().await.is_some() {}
        })
        .await;
    }
    group.kill();
    if !matches!(ended, Ended::Exited(_)) {
        let _ = child.wait().await;
    }
    // Killed, the group's pipes close at once; a process that left the group and kept a pipe
    // is not waited for.
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    readers.abort_all();
    // Copied, not taken: a background command's streams stay readable until its result is in.
    let copy = |captured: &Mutex<Captured>| {
        captured
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    };
    Ok(CommandOutput {
        ended,
        sandbox: confinement.map(|confinement| confinement.report().clone()),
        stdout: copy(&streams.stdout),
        stderr: copy(&streams.stderr),
    })
}

/// The command's process group, killed once: explicitly when the command is done with, or when
/// dropped. `kill_on_drop` alone reaches only the shell, so without this an abandoned call would
/// leave the shell's children running after the agent is gone.
struct GroupKiller(Option<Pid>);

impl GroupKiller {
    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            // ESRCH (the group is already gone) is the expected, fine outcome.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a pipe to its end into `which` of `streams`, keeping the first [`MAX_STREAM_BYTES`].
async fn drain(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    streams: Arc<Streams>,
    which: fn(&Streams) -> &Mutex<Captured>,
) {
    let mut buffer = vec![0_u8; 8192];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                let mut captured = which(&streams)
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                captured.total += read;
                let room = MAX_STREAM_BYTES.saturating_sub(captured.bytes.len());
                captured.bytes.extend_from_slice(&buffer[..read.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    async fn run_in_temp(command: &str, timeout: Duration) -> CommandOutput {
        let dir = tempfile::tempdir().unwrap();
        run(
            command,
            dir.path(),
            timeout,
            &CancellationToken::new(),
            None,
            &protocol::sandbox::UNRESTRICTED,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn output_and_exit_code_are_reported() {
        let output = run_in_temp("echo out; echo err >&2; exit 3", Duration::from_secs(30)).await;
        assert!(!output.succeeded());
        assert_eq!(
            output.render(),
            "exit code: 3\n--- stdout ---\nout\n\n--- stderr ---\nerr\n"
        );
        let quiet = run_in_temp("true", Duration::from_secs(30)).await;
        assert!(quiet.succeeded());
        assert_eq!(quiet.render(), "exit code: 0");
    }

    #[tokio::test]
    async fn runs_in_the_given_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), "m").unwrap();
        let output = run(
            "cat marker",
            dir.path(),
            Duration::from_secs(30),
            &CancellationToken::new(),
            None,
            &protocol::sandbox::UNRESTRICTED,
        )
        .await
        .unwrap();
        assert_eq!(output.stdout.bytes, b"m");
    }

    #[tokio::test]
    async fn output_is_capped() {
        let output = run_in_temp("head -c 100000 /dev/zero", Duration::from_secs(30)).await;
        assert_eq!(output.stdout.bytes.len(), MAX_STREAM_BYTES);
        assert_eq!(output.stdout.total, 100_000);
        assert!(output.render().ends_with(&format!(
            "[stdout truncated: showing the first {MAX_STREAM_BYTES} of 100000 bytes]"
        )));
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let started = Instant::now();
        let output = run_in_temp(
            "sleep 30 & sleep 30; echo never",
            Duration::from_millis(300),
        )
        .await;
        assert_eq!(output.ended, Ended::TimedOut(Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            output
                .render()
                .starts_with("timed out after 0 s and was killed")
        );
    }

    #[tokio::test]
    async fn cancellation_kills_promptly() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        let started = Instant::now();
        let (output, ()) = tokio::join!(
            run(
                "echo started; sleep 30",
                dir.path(),
                Duration::from_mins(1),
                &cancel,
                None,
                &protocol::sandbox::UNRESTRICTED,
            ),
            async move {
                tokio::task::yield_now().await;
                trigger.cancel();
            }
        );
        let output = output.unwrap();
        assert_eq!(output.ended, Ended::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn an_abandoned_call_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("sleep.pid");
        let never = CancellationToken::new();
        let call = run(
            "sleep 600 & echo $! > sleep.pid.tmp && mv sleep.pid.tmp sleep.pid; wait",
            dir.path(),
            Duration::from_mins(10),
            &never,
            None,
            &protocol::sandbox::UNRESTRICTED,
        );
        // Drop the call once the grandchild is running, as a dropped turn task does.
        let pid = tokio::select! {
            output = call => panic!("the command ended: {output:?}"),
            pid = async {
                loop {
                    if let Ok(text) = std::fs::read_to_string(&pid_file) {
                        break text.trim().parse::<i32>().unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } => pid,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(pid) {
            assert!(
                Instant::now() < deadline,
                "sleep (pid {pid}) outlived its call"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether `pid` exists and is not a zombie (killed, not yet reaped by its new parent).
    fn running(pid: i32) -> bool {
        nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // The state follows the command name, which is in parentheses.
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
    }

    #[tokio::test]
    async fn without_a_timeout_it_runs_until_cancelled_and_its_streams_read_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let streams = Arc::new(Streams::default());
        let call = run_into(
            "echo started; echo warned >&2; exec sleep 600",
            dir.path(),
            None,
            &cancel,
            None,
            &protocol::sandbox::UNRESTRICTED,
            &streams,
        );
        tokio::pin!(call);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            tokio::select! {
                output = &mut call => panic!("the command ended: {output:?}"),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            if streams.so_far() == "--- stdout ---\nstarted\n\n--- stderr ---\nwarned\n" {
                break;
            }
            assert!(Instant::now() < deadline, "{:?}", streams.so_far());
        }
        cancel.cancel();
        let output = call.await.unwrap();
        assert_eq!(output.ended, Ended::Cancelled);
        assert_eq!(output.stdout.bytes, b"started\n");
        let stopped = CommandOutput {
            ended: Ended::Stopped,
            ..output
        };
        assert_eq!(
            stopped.render().lines().next(),
            Some("stopped (task_kill, or its session was cancelled or closed) and killed")
        );
    }

    #[tokio::test]
    async fn a_background_process_holding_the_pipe_does_not_hang_the_call() {
        let started = Instant::now();
        let output = run_in_temp("sleep 30 & echo done", Duration::from_mins(1)).await;
        assert!(output.succeeded());
        assert_eq!(output.stdout.bytes, b"done\n");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
