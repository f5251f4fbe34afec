//! The binary's duties as a child subreaper (`acp_host::process::harden_host`): a process that a
//! command left behind and whose parent has exited (a background job of a finished shell, a
//! `setsid()` escapee) re-parents to acp-child rather than to init. It is reaped when it exits, so
//! no zombie accumulates in a long-lived agent, and killed when acp-child ends, so it does not
//! outlive it.
//!
//! Which children are such orphans is the kernel's answer, not a guess: an orphan re-parents to
//! the subreaper's first live thread, the main thread, and acp-child never starts a process from
//! its main thread (the runtime, and with it every spawn of `run_command` and of acp-host's run
//! library, runs on a thread of its own). So the main thread's children
//! (`/proc/<pid>/task/<pid>/children`) are exactly the adopted orphans, and reaping them can
//! never take an exit status that tokio, or the library, waits for.
//!
//! Invariants: never `waitpid(-1)`: a pid is reaped only when named by the main thread's list
//! while serving, or once the runtime is gone (nothing waits for a child then) by any thread's
//! list; processes are started only from the runtime's thread, which lives until serving is over
//! (when a thread exits, its children move to the main thread); reading `/proc` is best effort.
//! Without `/proc` or its `children` lists (not Linux, or a kernel built without
//! `CONFIG_PROC_CHILDREN`) nothing is found: orphans are then reaped by init once acp-child has
//! exited, and an escapee survives it, as without the subreaper.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How long [`end_all`] keeps killing (a tree that forks under SIGKILL converges quickly; this
/// only bounds a process the kernel cannot end, such as one stuck in uninterruptible I/O).
const END_DEADLINE: Duration = Duration::from_secs(5);
/// How often [`end_all`] looks again while processes are still dying.
const END_POLL: Duration = Duration::from_millis(1);

/// Reaps adopted orphans as they exit, for as long as the runtime runs: once at start, then on
/// every SIGCHLD (signals coalesce, so each wake-up reaps every orphan that has exited).
pub(crate) async fn reap_while_serving() {
    let mut exits = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(exits) => exits,
        Err(error) => {
            tracing::warn!(
                %error,
                "cannot watch for exited processes; orphans of commands are reaped when acp-child exits"
            );
            return;
        }
    };
    loop {
        for pid in children(Threads::Main) {
            // Not exited yet (0), or already gone: either is fine.
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        }
        if exits.recv().await.is_none() {
            return;
        }
    }
}

/// Once serving is over and the runtime is gone: kills (SIGKILL) every process still below
/// acp-child and reaps it. Killing a child re-parents its own children here (a subreaper), so
/// looking again reaches the whole tree, escapees included.
pub(crate) fn end_all() {
    let deadline = Instant::now() + END_DEADLINE;
    loop {
        let left = children(Threads::All);
        if left.is_empty() {
            return;
        }
        for pid in &left {
            // ESRCH (it exited meanwhile) is the goal; a zombie is reaped just below.
            let _ = kill(*pid, Signal::SIGKILL);
            let _ = waitpid(*pid, Some(WaitPidFlag::WNOHANG));
        }
        if Instant::now() >= deadline {
            tracing::warn!(?left, "processes below acp-child survived SIGKILL");
            return;
        }
        std::thread::sleep(END_POLL);
    }
}

/// Whose children [`children`] lists.
#[derive(Debug, Clone, Copy)]
enum Threads {
    /// The main thread's: the adopted orphans.
    Main,
    /// Every thread's: every child of the process.
    All,
}

/// The children (zombies included) of this process's threads. Empty without `/proc`.
fn children(threads: Threads) -> Vec<Pid> {
    let process = std::process::id();
    let tids: Vec<String> = match threads {
        Threads::Main => vec![process.to_string()],
        Threads::All => std::fs::read_dir(format!("/proc/{process}/task"))
            .map(|tasks| {
                tasks
                    .filter_map(|task| task.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    tids.iter()
        .filter_map(|tid| {
            std::fs::read_to_string(format!("/proc/{process}/task/{tid}/children")).ok()
        })
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .map(Pid::from_raw)
                .collect::<Vec<_>>()
        })
        .collect()
}
