//! The watchdog: the agent's whole process tree dies with the host, even when the host is
//! killed with SIGKILL (Linux).
//!
//! Shape: host -> watchdog -> agent. The watchdog is a second mode of the `acp-host` binary
//! (`acp-host __acp-host-watchdog <life-fd> <report-fd> <program> [args...]`), found beside the
//! current executable, so it serves the binary and library users alike (acp-child ships beside
//! acp-host). It is the process-group leader the host signals, and a child subreaper, so every
//! descendant that escapes the group (`setsid()`) or loses its parent re-parents to it and stays
//! findable. It is transparent: the agent inherits its stdio, environment and working directory,
//! and it exits with the agent's status (the same code, or dying by the same signal), so the
//! host's EOF -> TERM -> KILL ladder reads exactly as without it.
//!
//! Two pipes join it to the host. The life pipe: only the host holds its write end, so EOF means
//! the host is gone (exited, crashed, killed) or abandoned the run; the watchdog then
//! SIGKILLs every process below it until none is left, and exits. The report pipe: `ok <pid>` or
//! `err <errno>` once the agent is (not) started, and, when the agent exits, `left <pid>...`:
//! the descendants still alive, which re-parent away as the watchdog exits and which the host's
//! sweep then ends.
//!
//! Why this and not the alternatives: a parent-death signal reaches only the direct child (not a
//! wrapper's real agent, not grandchildren); a cgroup is writable only under a delegating
//! service manager; making the host alone a subreaper covers the host's deliberate teardown but
//! not its own death. A separate process that outlives the host and is an ancestor of the whole
//! tree is the one design that covers all of these without privileges.
//!
//! Invariants: the watchdog blocks (never ignores) SIGTERM/SIGINT/SIGHUP/SIGQUIT once the agent
//! runs, so the group TERM ends the agent and not it, and the agent starts with the mask the
//! watchdog was given (a blocked mask would be inherited); it reaps only its own children (it is a fresh process, no runtime shares them); its pipe
//! fds are close-on-exec before the agent starts; nothing here sends a signal while the host
//! lives except to mirror the agent's death on itself.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::reaper;

/// The `argv[1]` that turns the `acp-host` binary into a watchdog. Not a user-facing command.
pub const MODE_ARG: &str = "__acp-host-watchdog";

/// The executable name looked for beside the current one.
const BINARY: &str = "acp-host";

/// Exit status when the watchdog cannot run at all (bad arguments, pipes gone).
const SETUP_FAILURE: i32 = 70;
/// Exit status after killing the tree because the host went away.
const HOST_GONE: i32 = 137;

/// How long the watchdog keeps killing after the host died (a tree that forks under SIGKILL
/// converges quickly; this only bounds a pathological case).
const KILL_DEADLINE: Duration = Duration::from_secs(10);
const KILL_POLL: Duration = Duration::from_millis(10);
/// How long an agent's exit with descendants still alive waits to tell "the host is alive" from
/// "the host is dying and its files are still being released". Paid only in that case.
const LEFTOVER_CONFIRM: Duration = Duration::from_millis(250);

/// The signals a group TERM (or a terminal) may send that must not end the watchdog first.
const BLOCKED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// The watchdog executable to use, if any: `acp-host` beside the current executable, on Linux.
/// `None` means the agent is spawned directly (parent-death signal, group sweep and the host's
/// own descendant tracking only).
pub(crate) fn locate() -> Option<PathBuf> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.with_file_name(BINARY);
    candidate.is_file().then_some(candidate)
}

/// Call first in a binary's `main` (acp-host's does): when the arguments ask for the watchdog
/// mode, this runs it and never returns; otherwise it returns at once.
pub fn run_if_requested() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(MODE_ARG)) {
        return;
    }
    let Some((life, report, program, rest)) = parse(args) else {
        eprintln!(
            "acp-host: {MODE_ARG} is internal (usage: {MODE_ARG} <life-fd> <report-fd> \
             <program> [args...]); run `acp-host run` instead"
        );
        std::process::exit(SETUP_FAILURE);
    };
    let code = serve(life, report, &program, &rest);
    std::process::exit(code);
}

type Parsed = (i32, i32, std::ffi::OsString, Vec<std::ffi::OsString>);

fn parse(mut args: impl Iterator<Item = std::ffi::OsString>) -> Option<Parsed> {
    let fd = |arg: Option<std::ffi::OsString>| arg?.to_str()?.parse::<i32>().ok();
    let life = fd(args.next()).filter(|fd| *fd > 2)?;
    let report = fd(args.next()).filter(|fd| *fd > 2 && *fd != life)?;
    let program = args.next()?;
    Some((life, report, program, args.collect()))
}

/// Opens inherited pipe end `fd` as a close-on-exec `File` and closes the inherited number, so
/// the agent never receives it. Going through `/proc/self/fd` needs no unsafe fd adoption;
/// `O_NONBLOCK` keeps the open from waiting for a peer that is already gone.
fn adopt(fd: i32, write: bool) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{fd}"))?;
    nix::unistd::close(fd).map_err(std::io::Error::from)?;
    let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) - nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(file)
}

fn serve(life: i32, report: i32, program: &std::ffi::OsStr, args: &[std::ffi::OsString]) -> i32 {
    let host = nix::unistd::getppid();
    // No reader: the host is gone before we started; nothing was spawned.
    let Ok(mut report) = adopt(report, true) else {
        return HOST_GONE;
    };
    let Ok(life) = adopt(life, false) else {
        return HOST_GONE;
    };
    #[cfg(target_os = "linux")]
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("acp-host watchdog: cannot become a child subreaper: {err}");
    }
    let agent = match std::process::Command::new(program).args(args).spawn() {
        Ok(child) => child,
        Err(err) => {
            let code = err.raw_os_error().unwrap_or(0);
            let _ = writeln!(report, "err {code}");
            return 127;
        }
    };
    // Only now: a blocked mask would be inherited by the agent (std does not reset it). The
    // group TERM comes after the EOF grace, long after this; and before any thread exists, so
    // every thread inherits the mask.
    let mut blocked = SigSet::empty();
    for signal in BLOCKED {
        blocked.add(signal);
    }
    if let Err(err) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None) {
        eprintln!("acp-host watchdog: cannot block termination signals: {err}");
    }
    let agent_pid = Pid::from_raw(i32::try_from(agent.id()).unwrap_or(i32::MAX));
    if writeln!(report, "ok {agent_pid}").is_err() {
        // The host stopped listening: the life pipe will say why; keep going.
    }
    // The agent holds the stdio now; our copies of stdin/stdout would keep the host's pipes
    // open after it exits. stderr stays for our own diagnostics (we exit with the agent).
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
    }

    // Held by whichever of "host gone" and "agent exited" acts first; the other then waits, so
    // a host dying as the agent exits still gets the tree killed before we exit.
    let acting = Arc::new(Mutex::new(()));
    let guard = Arc::clone(&acting);
    let life_probe = life.try_clone();
    std::thread::spawn(move || watch_life(life, &guard));

    let status = loop {
        // Also reaps the orphans that re-parent to us, so none lingers as a zombie.
        match waitpid(None::<Pid>, None) {
            Ok(status) if status.pid() == Some(agent_pid) => break Some(status),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break None,
        }
    };
    let _acting = acting.lock();
    let left = reaper::descendants(&[std::process::id().cast_signed()]);
    // An agent that exits because the host died (its stdin closed as the host's files were
    // released) may be reaped before the host's other files, the life pipe among them, are:
    // check the host ourselves, and when something would be left behind give its death a
    // moment to show, since leaving is final. Nothing left: nothing to lose, no wait.
    let confirm = if left.is_empty() {
        Duration::ZERO
    } else {
        LEFTOVER_CONFIRM
    };
    if nix::unistd::getppid() != host || life_probe.map_or(true, |life| host_gone(&life, confirm)) {
        kill_tree_and_exit();
    }
    let pids: Vec<String> = left.iter().map(ToString::to_string).collect();
    let _ = writeln!(report, "left {}", pids.join(" "));
    drop(report);
    mirror(status)
}

/// Blocks until the host closes the life pipe, then kills everything below us and exits.
fn watch_life(mut life: File, acting: &Mutex<()>) {
    let mut buf = [0u8; 64];
    loop {
        match life.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _acting = acting.lock();
    kill_tree_and_exit();
}

/// Whether the life pipe's write end closes (the host is gone) within `within`.
fn host_gone(life: &File, within: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let timeout = PollTimeout::try_from(within).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(life.as_fd(), PollFlags::POLLIN)];
    // Readable without the host ever writing, or hung up: both mean EOF.
    poll(&mut fds, timeout).is_ok_and(|ready| ready > 0)
}

/// SIGKILLs every process below us until none is left (bounded), then exits.
fn kill_tree_and_exit() -> ! {
    let me = std::process::id().cast_signed();
    let deadline = Instant::now() + KILL_DEADLINE;
    loop {
        let below = reaper::descendants(&[me]);
        if below.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in below {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(KILL_POLL);
    }
    std::process::exit(HOST_GONE);
}

/// Exits the way the agent did: its code, or death by its signal (unblocked and re-raised on
/// ourselves; a signal whose default is not to terminate falls back to 128 + signal).
fn mirror(status: Option<WaitStatus>) -> i32 {
    match status {
        Some(WaitStatus::Exited(_, code)) => code,
        Some(WaitStatus::Signaled(_, signal, _)) => {
            let _ = nix::sys::signal::raise(signal);
            let mut set = SigSet::empty();
            set.add(signal);
            let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
            128 + signal as i32
        }
        _ => SETUP_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> impl Iterator<Item = std::ffi::OsString> {
        args.iter()
            .map(|a| std::ffi::OsString::from(*a))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn parses_fds_program_and_args_and_rejects_stdio_fds() {
        let (life, report, program, rest) = parse(os(&["5", "6", "sh", "-c", "x"])).unwrap();
        assert_eq!((life, report, program.to_str()), (5, 6, Some("sh")));
        assert_eq!(rest, ["-c", "x"]);
        assert!(parse(os(&["1", "6", "sh"])).is_none());
        assert!(parse(os(&["5", "5", "sh"])).is_none());
        assert!(parse(os(&["5", "6"])).is_none());
        assert!(parse(os(&["x", "6", "sh"])).is_none());
    }
}
