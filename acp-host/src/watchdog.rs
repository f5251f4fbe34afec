//! The watchdog: the agent's whole process tree dies with the host, even when the host is
//! killed with SIGKILL (Linux).
//!
//! Shape: host -> watchdog -> agent. The watchdog is a fork that never execs, so it costs one
//! fork, not a second program's start-up, and serves the binary and library users alike: a fork
//! of the host's spawner ([`crate::spawner`], a small process forked at the host's start) when
//! the host started one, which then sets the child's stdio, working directory and process group
//! and runs `Watchdog::serve`; else a fork of the host itself, whose spawn runs `Watchdog::serve`
//! as std's pre-exec hook (after std has set the same). It
//! is the process-group leader the host signals, and a child subreaper, so every descendant that
//! escapes the group (`setsid()`) or loses its parent re-parents to it and stays findable. It is
//! transparent: the agent inherits its stdio, working directory and the scrubbed environment,
//! and it exits with the agent's status (the same code, or dying by the same signal), so the
//! host's EOF -> TERM -> KILL ladder reads exactly as without it. It names itself
//! [`PROCESS_NAME`] (`/proc/<pid>/comm`).
//!
//! Two pipes join it to the host. The life pipe: only the host holds its write end, so EOF means
//! the host is gone (exited, crashed, killed) or abandoned the run; the watchdog then
//! SIGKILLs every process below it until none is left, and exits. The report pipe: `ok <pid>` or
//! `err <errno>` once the agent is (not) started, and, when the agent exits, `left <pid>...`:
//! its children still alive (everything else of the tree is below them), which re-parent away as
//! the watchdog exits and which the host's sweep then ends. A watchdog forked by the spawner
//! is not the host's child: the spawner reaps it and adds `exit <status>`, its wait status.
//!
//! Why this and not the alternatives: a parent-death signal reaches only the direct child (not a
//! wrapper's real agent, not grandchildren); a cgroup is writable only under a delegating
//! service manager; making the host alone a subreaper covers the host's deliberate teardown but
//! not its own death. A separate process that outlives the host and is an ancestor of the whole
//! tree is the one design that covers all of these without privileges.
//!
//! Invariants: the forked child runs only async-signal-safe system calls on data prepared before
//! the fork (it allocates nothing, takes no lock, and has one thread; it starts the agent with
//! `posix_spawn`, which shares its memory until the agent's exec); every fd the host had besides
//! stdio is close-on-exec before the agent starts and closed right after (another run's pipes
//! must not be held open by it), and that close is how the host's spawn learns it is running, so
//! the host sleeps through the agent's start instead of competing with it; it is not dumpable,
//! like the host it copies; it blocks every signal (SIGCHLD arrives through a signalfd), so the
//! group TERM ends the agent and not it, and the agent starts with an empty mask; it reaps only
//! its own children; nothing here sends a signal while the host lives except to mirror the
//! agent's death on itself.

use std::ffi::{CString, OsStr, OsString, c_char, c_int, c_short};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use nix::libc;

/// The watchdog's name in `/proc/<pid>/comm` (and `ps`): its command line is the host's.
pub const PROCESS_NAME: &str = "acp-watchdog";

/// Exit status after killing the tree because the host went away.
const HOST_GONE: c_int = 137;
/// Exit status when the agent could not be started (as a shell says for a command not run).
pub(crate) const NOT_STARTED: c_int = 127;

/// How long the watchdog keeps killing after the host died (a tree that forks under SIGKILL
/// converges quickly; this only bounds a pathological case).
const KILL_DEADLINE: Duration = Duration::from_secs(10);
const KILL_POLL: Duration = Duration::from_millis(1);
/// How long an agent's exit with descendants still alive waits to tell "the host is alive" from
/// "the host is dying and its files are still being released". Paid only in that case.
const LEFTOVER_CONFIRM: Duration = Duration::from_millis(250);

/// Whether this platform runs agents under the watchdog.
pub(crate) const AVAILABLE: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

#[expect(
    unsafe_code,
    reason = "libc's own declaration of `environ` is not on every target"
)]
unsafe extern "C" {
    /// The process's environment; set to the agent's before `posix_spawnp`, as std does, so the
    /// `PATH` search uses the agent's (scrubbed) environment.
    static mut environ: *const *const c_char;
}

/// Everything the forked watchdog needs, prepared (allocated) before the fork.
pub(crate) struct Watchdog {
    /// The strings the pointer arrays below point into; never touched after construction.
    _strings: Vec<CString>,
    program: *const c_char,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// The read end of the life pipe, the write end of the report pipe, in the child.
    life: RawFd,
    report: RawFd,
    /// The host's pid: when the watchdog's parent is no longer this, the host is gone.
    host: libc::pid_t,
    /// The sandbox entered before the agent starts (so the agent, and the watchdog with it, live
    /// in its domain), if any.
    confine: Option<crate::sandbox::Raw>,
    children_path: CString,
    dev_null: CString,
}

// SAFETY: the raw pointers point into `_strings`, which the struct owns and never mutates (a
// `CString`'s buffer does not move when the `CString` does); nothing else is shared.
#[expect(
    unsafe_code,
    reason = "the pointer arrays are read-only views of owned strings"
)]
unsafe impl Send for Watchdog {}
// SAFETY: as for `Send`: shared access only reads.
#[expect(
    unsafe_code,
    reason = "the pointer arrays are read-only views of owned strings"
)]
unsafe impl Sync for Watchdog {}

/// An argument or variable with an interior NUL cannot be passed to `exec`.
#[derive(Debug, thiserror::Error)]
#[error("agent argument or environment variable contains a NUL byte: {0:?}")]
pub(crate) struct NulError(OsString);

impl NulError {
    pub(crate) fn new(text: &OsStr) -> NulError {
        NulError(text.to_owned())
    }
}

impl Watchdog {
    /// Prepares the watchdog of one agent: `program` with `args` and exactly `env`, joined to
    /// the host by the pipe ends `life` (read) and `report` (write).
    pub(crate) fn new<'a>(
        program: &OsStr,
        args: impl IntoIterator<Item = &'a OsStr>,
        env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
        life: RawFd,
        report: RawFd,
        confine: Option<crate::sandbox::Raw>,
    ) -> Result<Watchdog, NulError> {
        let entries = env.into_iter().map(|(key, value)| {
            let mut pair = key.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(value.as_bytes());
            pair
        });
        Watchdog::from_entries(
            program.as_bytes(),
            args.into_iter().map(OsStrExt::as_bytes),
            entries,
            life,
            report,
            confine,
        )
    }

    /// [`Watchdog::new`] with the environment as `NAME=VALUE` entries (as the spawner receives
    /// it).
    pub(crate) fn from_entries<A: AsRef<[u8]>, E: Into<Vec<u8>>>(
        program: &[u8],
        args: impl IntoIterator<Item = A>,
        env: impl IntoIterator<Item = E>,
        life: RawFd,
        report: RawFd,
        confine: Option<crate::sandbox::Raw>,
    ) -> Result<Watchdog, NulError> {
        let c = |bytes: Vec<u8>| {
            CString::new(bytes)
                .map_err(|err| NulError(OsStr::from_bytes(&err.into_vec()).to_owned()))
        };
        let mut strings = vec![c(program.to_vec())?];
        for arg in args {
            strings.push(c(arg.as_ref().to_vec())?);
        }
        let words = strings.len();
        for entry in env {
            // A variable is named by its name alone (up to its `=`): its value may be a secret.
            strings.push(CString::new(entry.into()).map_err(|err| {
                let entry = err.into_vec();
                let name = entry.split(|b| *b == b'=').next().unwrap_or_default();
                NulError(OsStr::from_bytes(name).to_owned())
            })?);
        }
        let program = strings[0].as_ptr();
        let mut argv_ptrs: Vec<*const c_char> =
            strings[..words].iter().map(|s| s.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp: Vec<*const c_char> = strings[words..].iter().map(|s| s.as_ptr()).collect();
        envp.push(std::ptr::null());
        Ok(Watchdog {
            _strings: strings,
            program,
            argv: argv_ptrs,
            envp,
            life,
            report,
            host: libc::pid_t::try_from(std::process::id()).unwrap_or(0),
            confine,
            children_path: c"/proc/thread-self/children".to_owned(),
            dev_null: c"/dev/null".to_owned(),
        })
    }

    /// The watchdog's life, in the forked child: never returns on success. An `Err` (only before
    /// its first step is done) is reported by std to the host's spawn, which then fails; a later
    /// failure to start is an `err <errno>` report.
    #[expect(
        unsafe_code,
        reason = "the body of a forked child of a multi-threaded process: raw system calls only"
    )]
    pub(crate) fn serve(&self) -> io::Result<()> {
        // SAFETY: every call below is an async-signal-safe system call (or a libc wrapper of one)
        // on integers, stack buffers and the C strings prepared before the fork; nothing
        // allocates or locks. The pointer arrays are NUL-terminated.
        unsafe {
            for fd in [self.life, self.report] {
                if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // The sandbox first, while the ruleset's descriptor is still open: from here on the
            // watchdog and all it starts live in it. What the watchdog itself does (reading
            // `/proc`, opening `/dev/null`, signalling its own tree) the sandbox allows.
            if let Some(confine) = &self.confine
                && let Err(code) = confine.enter()
            {
                report_line(self.report, b"sandbox ", i64::from(code));
                libc::_exit(NOT_STARTED);
            }
            // The host's other fds (a file a thread of it is writing, another run's pipes) must
            // neither reach the agent nor be held here for long. Marking them all close-on-exec
            // keeps them from the agent; they are closed right after its start. Closing them
            // also closes std's exec-error pipe, which wakes the host's spawn, and on a busy
            // machine the woken host then held our CPU until it waited again (measured: about
            // 0.3 ms added before the agent's exec): so the host wakes once the agent runs.
            // Without CLOSE_RANGE_CLOEXEC (Linux < 5.11) they are closed first, as before. From
            // the close on there is no returning: a failure is reported on our own pipe.
            let deferred = mark_all_cloexec();
            if !deferred {
                close_all_but(&mut [self.life, self.report]);
            }
            let name = c"acp-watchdog";
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
            libc::prctl(libc::PR_SET_DUMPABLE, 0);
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) != 0 {
                say(b"acp-host watchdog: cannot become a child subreaper\n");
            }
            // Every signal blocked: SIGCHLD is read from a signalfd; the group TERM must end the
            // agent, not us; handlers the host installed must never run here.
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&raw mut all);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, std::ptr::null_mut()) != 0 {
                report_err(self.report, errno());
                libc::_exit(NOT_STARTED);
            }
            let mut chld: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut chld);
            libc::sigaddset(&raw mut chld, libc::SIGCHLD);
            let sfd = libc::signalfd(-1, &raw const chld, libc::SFD_CLOEXEC);
            if sfd < 0 {
                report_err(self.report, errno());
                libc::_exit(NOT_STARTED);
            }

            // The agent's start. posix_spawn (glibc: clone with CLONE_VM | CLONE_VFORK, then exec)
            // shares our memory until the exec instead of copying the page tables of the host
            // we are a fork of (measured: about 0.1 ms of a one-shot run), and hands back the
            // exec's errno itself. glibc's takes no lock and allocates only its child's stack,
            // with mmap: safe here like the system calls around it. The agent starts with an
            // empty signal mask; `environ` is the agent's, so the PATH search is the agent's.
            environ = self.envp.as_ptr();
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut empty);
            let mut agent: libc::pid_t = 0;
            let mut code = libc::posix_spawnattr_init(&raw mut attr);
            if code == 0 {
                code = libc::posix_spawnattr_setsigmask(&raw mut attr, &raw const empty);
            }
            if code == 0 {
                code = libc::posix_spawnattr_setflags(
                    &raw mut attr,
                    c_short::try_from(libc::POSIX_SPAWN_SETSIGMASK).unwrap_or(0),
                );
            }
            if code == 0 {
                code = libc::posix_spawnp(
                    &raw mut agent,
                    self.program,
                    std::ptr::null(),
                    &raw const attr,
                    self.argv.as_ptr().cast(),
                    self.envp.as_ptr().cast(),
                );
            }
            if deferred {
                close_all_but(&mut [self.life, self.report, sfd]);
            }
            if code != 0 {
                report_err(self.report, code);
                libc::_exit(NOT_STARTED);
            }
            let mut line = Line::<SHORT_LINE_BYTES>::new(b"ok ");
            line.number(i64::from(agent));
            line.end(self.report);

            // The agent holds the stdio now; our copies of stdin/stdout would keep the host's
            // pipes open after it exits. stderr stays for our own diagnostics.
            let null = libc::open(self.dev_null.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup2(null, 0);
                libc::dup2(null, 1);
                libc::close(null);
            }

            let status = self.wait_agent(agent, sfd);
            if reap() {
                self.report_left();
            } else {
                self.exit_if_host_gone(Duration::ZERO);
                Line::<SHORT_LINE_BYTES>::new(b"left").end(self.report);
            }
            libc::close(self.report);
            mirror(status)
        }
    }

    /// Waits for the agent's exit (reaping every orphan that re-parents to us meanwhile) unless
    /// the host goes first; returns the agent's wait status.
    #[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
    fn wait_agent(&self, agent: libc::pid_t, sfd: c_int) -> c_int {
        // SAFETY: as in `serve`: system calls on integers and stack buffers.
        unsafe {
            loop {
                let mut status = 0;
                loop {
                    let pid = libc::waitpid(-1, &raw mut status, libc::WNOHANG);
                    if pid == agent {
                        return status;
                    }
                    if pid <= 0 {
                        break;
                    }
                }
                let mut fds = [
                    libc::pollfd {
                        fd: self.life,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: sfd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
                    continue;
                }
                if fds[0].revents != 0 && life_closed(self.life) {
                    self.kill_tree_and_exit();
                }
                if fds[1].revents != 0 {
                    let mut info = [0u8; 128 * 4];
                    libc::read(sfd, info.as_mut_ptr().cast(), info.len());
                }
            }
        }
    }

    /// The agent's children still alive after it (`left <pid>...`), once the host is known to be
    /// alive. Out of line, and only called when a child is left: its pid list (4 KiB) and long
    /// line (16 KiB) are five pages of stack, and every page the watchdog touches is a fault (a
    /// copy of the host's page, or a fresh one), which a run that leaves nothing behind should
    /// not pay.
    #[inline(never)]
    #[cold]
    fn report_left(&self) {
        // Room for every pid a line can carry (the rest stay in the group or below these).
        let mut left = [0 as libc::pid_t; LEFT_MAX];
        let count = self.list_children(&mut left);
        // An agent that exits because the host died (its stdin closed as the host's files
        // were released) may be reaped before the host's other files, the life pipe among
        // them, are: when something would be left behind, give the host's death a moment to
        // show, since leaving is final.
        self.exit_if_host_gone(if count == 0 {
            Duration::ZERO
        } else {
            LEFTOVER_CONFIRM
        });
        let mut line = Line::<LINE_BYTES>::new(b"left");
        for pid in &left[..count] {
            line.push(b" ");
            line.number(i64::from(*pid));
        }
        line.end(self.report);
    }

    /// Kills the tree and exits when the host is gone: no longer our parent, or its life pipe
    /// readable (at EOF) within `within`.
    #[expect(unsafe_code, reason = "a raw system call in the forked watchdog")]
    fn exit_if_host_gone(&self, within: Duration) {
        // SAFETY: getppid has no arguments and cannot fail.
        if unsafe { libc::getppid() } != self.host || readable(self.life, within) {
            self.kill_tree_and_exit();
        }
    }

    /// Our live children (into `out`, as many as fit); reaps the dead ones.
    fn children(&self, out: &mut [libc::pid_t]) -> usize {
        if reap() { self.list_children(out) } else { 0 }
    }

    /// Our children as `/proc` lists them (into `out`, as many as fit).
    #[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
    fn list_children(&self, out: &mut [libc::pid_t]) -> usize {
        // SAFETY: as in `serve`: system calls on integers and stack buffers.
        unsafe {
            let fd = libc::open(
                self.children_path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return 0;
            }
            let mut count = 0;
            let mut current: Option<libc::pid_t> = None;
            let mut buf = [0u8; 1024];
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                let Ok(n @ 1..) = usize::try_from(n) else {
                    break;
                };
                for &byte in &buf[..n] {
                    if byte.is_ascii_digit() {
                        let digit = libc::pid_t::from(byte - b'0');
                        current = Some(current.unwrap_or(0).saturating_mul(10) + digit);
                    } else if let Some(pid) = current.take()
                        && count < out.len()
                    {
                        out[count] = pid;
                        count += 1;
                    }
                }
            }
            if let Some(pid) = current
                && count < out.len()
            {
                out[count] = pid;
                count += 1;
            }
            libc::close(fd);
            count
        }
    }

    /// SIGKILLs every process below us until none is left (bounded), then exits. Killing our
    /// children re-parents theirs to us (we are a subreaper), so repeating on our children
    /// reaches the whole tree, escapees included.
    #[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
    fn kill_tree_and_exit(&self) -> ! {
        let rounds = KILL_DEADLINE.as_millis() / KILL_POLL.as_millis().max(1);
        // SAFETY: as in `serve`: system calls on integers and stack buffers.
        unsafe {
            for _ in 0..rounds {
                let mut below = [0 as libc::pid_t; 256];
                let count = self.children(&mut below);
                if count == 0 {
                    let mut status = 0;
                    // ECHILD: no child at all, live or zombie.
                    if libc::waitpid(-1, &raw mut status, libc::WNOHANG) < 0 {
                        break;
                    }
                }
                for pid in &below[..count] {
                    libc::kill(*pid, libc::SIGKILL);
                }
                sleep(KILL_POLL);
            }
            libc::_exit(HOST_GONE)
        }
    }
}

/// Reaps every dead child; whether a live child is left. None (ECHILD) is the usual end of a
/// run.
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn reap() -> bool {
    let mut status = 0;
    // SAFETY: waitpid with a stack status word.
    let last = loop {
        let pid = unsafe { libc::waitpid(-1, &raw mut status, libc::WNOHANG) };
        if pid <= 0 {
            break pid;
        }
    };
    !(last < 0 && errno() == libc::ECHILD)
}

/// Closes every fd but 0, 1, 2 and `keep`.
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn close_all_but(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut first: u32 = 3;
    // SAFETY: close_range on fd numbers; closing an fd this process does not use is harmless.
    unsafe {
        for fd in keep.iter() {
            let Ok(fd) = u32::try_from(*fd) else { continue };
            if fd > first {
                libc::syscall(libc::SYS_close_range, first, fd - 1, 0);
            }
            first = first.max(fd + 1);
        }
        libc::syscall(libc::SYS_close_range, first, u32::MAX, 0);
    }
}

/// Marks every fd above stdio close-on-exec; `false` when the kernel cannot (before 5.11).
#[expect(unsafe_code, reason = "a raw system call in the forked watchdog")]
fn mark_all_cloexec() -> bool {
    // SAFETY: close_range on fd numbers with a flag that only sets close-on-exec.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3_u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
    }
}

/// Whether the life pipe says the host is gone: EOF or an error (the host never writes).
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn life_closed(life: RawFd) -> bool {
    let mut buf = [0u8; 64];
    // SAFETY: a read into a stack buffer.
    let n = unsafe { libc::read(life, buf.as_mut_ptr().cast(), buf.len()) };
    n == 0 || (n < 0 && errno() != libc::EINTR && errno() != libc::EAGAIN)
}

/// Whether the life pipe becomes readable (EOF: the host is gone) within `within`.
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn readable(life: RawFd, within: Duration) -> bool {
    let timeout = c_int::try_from(within.as_millis()).unwrap_or(c_int::MAX);
    let mut fds = [libc::pollfd {
        fd: life,
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: poll on a stack array of one pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout) > 0 }
}

#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn sleep(duration: Duration) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::c_long::from(duration.subsec_nanos()),
    };
    // SAFETY: nanosleep with a stack timespec.
    unsafe { libc::nanosleep(&raw const ts, std::ptr::null_mut()) };
}

fn errno() -> c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Writes a fixed diagnostic to stderr.
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn say(message: &[u8]) {
    // SAFETY: a write of a static buffer.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

pub(crate) fn report_err(report: RawFd, code: c_int) {
    report_line(report, b"err ", i64::from(code));
}

/// One short report line: `word` (with its trailing space) and a number.
pub(crate) fn report_line(report: RawFd, word: &[u8], value: i64) {
    let mut line = Line::<SHORT_LINE_BYTES>::new(word);
    line.number(value);
    line.end(report);
}

/// Exits the way the agent did: its code, or death by its signal (its default action restored,
/// unblocked and re-raised on ourselves; a signal whose default is not to end the process falls
/// back to 128 + signal).
#[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
fn mirror(status: c_int) -> ! {
    // SAFETY: signal disposition and mask changes on ourselves, then _exit.
    unsafe {
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            libc::sigaddset(&raw mut set, signal);
            libc::raise(signal);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
            libc::_exit(128 + signal);
        }
        libc::_exit(NOT_STARTED)
    }
}

/// The longest report line: `left` and up to [`LEFT_MAX`] pids of up to 7 digits.
const LINE_BYTES: usize = 16 * 1024;
const LEFT_MAX: usize = 1024;

/// The longest `ok <pid>` or `err <errno>` line.
const SHORT_LINE_BYTES: usize = 32;

/// One report line of at most `N` bytes, built on the stack (sized per line: every page of stack
/// the watchdog touches is a copy-on-write fault of the host's stack).
struct Line<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Line<N> {
    fn new(start: &[u8]) -> Line<N> {
        let mut line = Line {
            buf: [0; N],
            len: 0,
        };
        line.push(start);
        line
    }

    fn push(&mut self, bytes: &[u8]) {
        // Room is kept for the newline.
        let room = self.buf.len() - 1 - self.len;
        let n = bytes.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, value: i64) {
        let mut digits = [0u8; 24];
        let mut i = digits.len();
        let negative = value < 0;
        let mut rest = value.unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + u8::try_from(rest % 10).unwrap_or(0);
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if negative {
            i -= 1;
            digits[i] = b'-';
        }
        self.push(&digits[i..]);
    }

    /// Appends the newline and writes the line in one `write` (a pipe write this small is
    /// atomic).
    #[expect(unsafe_code, reason = "raw system calls in the forked watchdog")]
    fn end(mut self, fd: RawFd) {
        self.buf[self.len] = b'\n';
        self.len += 1;
        // SAFETY: a write of a stack buffer.
        unsafe { libc::write(fd, self.buf.as_ptr().cast(), self.len) };
    }

    #[cfg(test)]
    fn text(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_format_numbers_without_allocating() {
        let mut line = Line::<LINE_BYTES>::new(b"left");
        for pid in [7, 12345, 0, -3] {
            line.push(b" ");
            line.number(pid);
        }
        assert_eq!(line.text(), b"left 7 12345 0 -3");
    }

    #[test]
    fn a_nul_in_a_variable_names_the_variable_not_its_value() {
        let err = Watchdog::new(
            OsStr::new("sh"),
            [],
            [(OsStr::new("TOKEN"), OsStr::new("se\0cret"))],
            5,
            6,
            None,
        )
        .err()
        .expect("a NUL byte must be rejected");
        assert!(err.to_string().ends_with(": \"TOKEN\""), "{err}");
    }

    #[test]
    fn a_nul_in_an_argument_is_an_error_not_a_truncation() {
        let err = Watchdog::new(
            OsStr::new("sh"),
            [OsStr::new("a\0b")],
            std::iter::empty(),
            5,
            6,
            None,
        )
        .err()
        .expect("a NUL byte must be rejected");
        assert!(err.to_string().contains("NUL"), "{err}");
    }
}
