//! The spawner: each agent's watchdog forked from a small process instead of from the host.
//!
//! A watchdog ([`crate::watchdog`]) forked from the host copies the host's page tables, and every
//! page either side writes while the watchdog lives is copied then (copy-on-write). For a batch,
//! a server or a delegating agent, big processes that keep working while their agents run, that
//! is most of what a run costs beyond the agent itself (docs/benchmarks.md). [`start`], called
//! once at the top of `main` while the process has one thread and little memory, forks the
//! spawner: a process that waits for requests on a socket and forks a watchdog for each. The host
//! then never forks while it runs.
//!
//! Shape: host -> spawner -> watchdog -> agent. A request carries the agent's program, arguments,
//! working directory and environment, and five file descriptors (`SCM_RIGHTS`): the agent's
//! stdin, stdout and stderr ends, the read end of the watchdog's life pipe and the write end of
//! its report pipe; the answer is the watchdog's pid. The watchdog leads the agent's group and
//! behaves as one forked from the host does, but it is not the host's child: the spawner reaps
//! it, writes its wait status on its report pipe (`exit <status>`) and closes its own copy of
//! that pipe, so the host's EOF there means the watchdog is gone and reaped (see `process`). The
//! spawner is not a subreaper, so what a watchdog leaves behind still re-parents to the host
//! (which is one), as from a watchdog the host forked itself.
//!
//! The spawner ends with the host: only the host holds the other end of its socket, and EOF
//! (the host's exit, or its death by SIGKILL) ends it; each watchdog kills its own tree once its
//! life pipe closes, wherever it was forked from. It holds none of the host's stdio (a reader of the host's stdout
//! sees EOF when the host exits, not later), works in `/`, blocks every signal (a Ctrl-C to the
//! terminal's group is the host's to handle), reaps only its own children (the watchdogs), and is
//! not dumpable (its memory is a copy of the host's at start, environment included).
//!
//! Who starts one: `acp-host batch` and `serve`, and acp-child on a model backend, the programs
//! that start many agents while they work. A one-shot `acp-host run` does not: for its only
//! agent a spawner adds a round trip and saves nothing (measured in docs/benchmarks.md).
//!
//! Invariants: the spawner is forked only from a process with one thread (checked), so it may
//! run ordinary code; the socket carries one request and its answer at a time (a lock); the
//! spawner holds one descriptor per live watchdog (its report pipe, until it reaps it); when
//! there is no spawner (never started, not Linux, or gone), `process` forks the watchdog from the
//! host itself.

use std::ffi::{OsStr, c_int};
use std::io::{self, IoSlice, IoSliceMut, Read as _, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use nix::libc;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::lock;
use crate::spawn_spec::SpawnSpec;
use crate::watchdog::{NOT_STARTED, NulError, Watchdog};

/// The spawner's name in `/proc/<pid>/comm` (and `ps`): its command line is the host's.
pub const PROCESS_NAME: &str = "acp-spawner";

/// How many descriptors a request carries: stdin, stdout, stderr, life, report.
const FDS: usize = 5;
/// A request's header: the payload's length, then how many argument and environment strings
/// it holds (native-endian `u32`s: both ends are one binary).
const HEADER: usize = 12;

/// The host's end of the spawner's socket and the spawner's pid; `None` until [`start`] (or
/// once the spawner is gone or let go).
static CHANNEL: Mutex<Option<Channel>> = Mutex::new(None);

struct Channel {
    socket: UnixStream,
    pid: libc::pid_t,
}

/// Why [`start`] did not start a spawner (each agent's watchdog is then forked from this
/// process, as without one).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "the spawner must be started while this process has one thread (it has {0}): call \
         acp_host::spawner::start first thing in main"
    )]
    Threads(usize),
    #[error("could not start the spawner")]
    Io(#[source] io::Error),
}

/// Forks this process's spawner. Call it once, first thing in `main`, before any thread or
/// runtime exists: a program that runs agents under the watchdog then forks a small process for
/// each of them instead of itself. Later calls do nothing; off Linux (glibc) it does nothing.
/// Optional: without it every watchdog is a fork of the calling process.
pub fn start() -> Result<(), StartError> {
    if !crate::watchdog::AVAILABLE {
        return Ok(());
    }
    let mut channel = lock(&CHANNEL);
    if channel.is_some() {
        return Ok(());
    }
    let threads = threads().map_err(StartError::Io)?;
    if threads != 1 {
        return Err(StartError::Threads(threads));
    }
    let (host, spawner) = UnixStream::pair().map_err(StartError::Io)?;
    match fork() {
        Err(err) => Err(StartError::Io(err)),
        Ok(0) => serve(&spawner),
        Ok(pid) => {
            drop(spawner);
            *channel = Some(Channel { socket: host, pid });
            Ok(())
        }
    }
}

/// Ends this process's spawner and reaps it: a program's last step once no agent runs (a
/// watchdog still alive ends its tree when this process exits, as ever). Without it the spawner
/// ends on its own once this process has exited, and is reaped by whoever adopts it. Without a
/// spawner it does nothing.
pub fn stop() {
    let Some(Channel { socket, pid }) = lock(&CHANNEL).take() else {
        return;
    };
    drop(socket);
    let pid = nix::unistd::Pid::from_raw(pid);
    // Still our unreaped child (so the pid is still its own): it has nothing left to do, no need
    // to wait for it to see the EOF.
    if let Ok(nix::sys::wait::WaitStatus::StillAlive) =
        nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
    {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
    }
}

/// What a spawn through the spawner came to.
#[derive(Debug)]
pub(crate) enum Spawned {
    /// The watchdog's pid.
    Watchdog(u32),
    /// An argument, variable or the working directory has a NUL byte: nothing was asked.
    Nul(NulError),
    /// The spawner could not fork the watchdog (say, at the user's process limit).
    Failed(io::Error),
    /// No spawner (never started, or gone): fork the watchdog here.
    Unavailable,
}

/// Asks the spawner for a watchdog of `spec`'s agent, joined to the host by `fds` (stdin read
/// end, stdout write end, stderr write end, life read end, report write end), which the watchdog
/// gets copies of; the caller closes its own.
pub(crate) fn spawn(spec: &SpawnSpec, fds: [RawFd; FDS]) -> Spawned {
    // A sandboxed agent's watchdog is forked where its sandbox was prepared (its ruleset's
    // descriptors and filters live there): the host.
    if spec.sandbox.is_some() {
        return Spawned::Unavailable;
    }
    let mut channel = lock(&CHANNEL);
    let Some(Channel { socket, .. }) = channel.as_mut() else {
        return Spawned::Unavailable;
    };
    let (header, payload) = match encode(spec) {
        Ok(request) => request,
        Err(err) => return Spawned::Nul(err),
    };
    match exchange(socket, &header, &payload, &fds) {
        Ok(Ok(pid)) => Spawned::Watchdog(pid),
        Ok(Err(err)) => Spawned::Failed(err),
        Err(err) => {
            // Gone (killed, out of memory): every later start forks here, said once.
            tracing::warn!(%err, "the spawner is gone; watchdogs are forked from this process");
            *channel = None;
            Spawned::Unavailable
        }
    }
}

/// The request's header and payload: the working directory, the program, its arguments, then
/// `NAME=VALUE` per variable, each ended by a NUL.
fn encode(spec: &SpawnSpec) -> Result<([u8; HEADER], Vec<u8>), NulError> {
    let mut payload = Vec::with_capacity(4096);
    // A variable is named by its name alone: its value may be a secret.
    let mut push = |bytes: &[&[u8]]| {
        if bytes.iter().any(|part| part.contains(&0)) {
            return Err(NulError::new(OsStr::from_bytes(bytes[0])));
        }
        for part in bytes {
            payload.extend_from_slice(part);
        }
        payload.push(0);
        Ok(())
    };
    push(&[spec.cwd.as_os_str().as_bytes()])?;
    push(&[spec.program.as_os_str().as_bytes()])?;
    for arg in &spec.args {
        push(&[arg.as_bytes()])?;
    }
    for (key, value) in &spec.env {
        push(&[key.as_bytes(), b"=", value.as_bytes()])?;
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_ne_bytes();
    let mut header = [0u8; HEADER];
    header[..4].copy_from_slice(&count(payload.len()));
    header[4..8].copy_from_slice(&count(spec.args.len()));
    header[8..].copy_from_slice(&count(spec.env.len()));
    Ok((header, payload))
}

/// One request and its answer: the watchdog's pid, or the spawner's `fork` error (inside); the
/// outer error is the socket's (the spawner is gone).
fn exchange(
    socket: &mut UnixStream,
    header: &[u8; HEADER],
    payload: &[u8],
    fds: &[RawFd; FDS],
) -> io::Result<io::Result<u32>> {
    let total = HEADER + payload.len();
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(header), IoSlice::new(payload)],
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if sent < HEADER {
        socket.write_all(&header[sent..])?;
        socket.write_all(payload)?;
    } else if sent < total {
        socket.write_all(&payload[sent - HEADER..])?;
    }
    let mut answer = [0u8; 4];
    socket.read_exact(&mut answer)?;
    let answer = i32::from_ne_bytes(answer);
    Ok(u32::try_from(answer).map_err(|_| io::Error::from_raw_os_error(-answer)))
}

/// This process's thread count (`/proc/self/stat`, field 20).
fn threads() -> io::Result<usize> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(17)?.parse().ok())
        .ok_or_else(|| io::Error::other("unreadable /proc/self/stat"))
}

#[expect(
    unsafe_code,
    reason = "fork: of a process with one thread (checked by the callers), so the child may run \
              ordinary code"
)]
fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the callers fork only a process with one thread: `start` checks it, and the
    // spawner never starts one. The child therefore holds no lock another thread held.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// A request as the spawner received it.
struct Request {
    payload: Vec<u8>,
    args: usize,
    vars: usize,
    /// stdin, stdout, stderr, life, report.
    fds: Vec<OwnedFd>,
}

/// The spawner's life: answers requests until the host is gone, then exits.
fn serve(socket: &UnixStream) -> ! {
    let Ok(events) = quiet(socket.as_raw_fd()) else {
        exit(1)
    };
    // Each live watchdog's pid and the spawner's copy of its report pipe's write end.
    let mut live: Vec<(libc::pid_t, OwnedFd)> = Vec::new();
    loop {
        reap(&mut live);
        let mut fds = [
            libc::pollfd {
                fd: socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: events,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if poll(&mut fds).is_err() {
            continue;
        }
        if fds[1].revents != 0 {
            drain(events);
        }
        if fds[0].revents == 0 {
            continue;
        }
        // EOF (or a broken request): the host is gone, and so is the way to answer.
        let Ok(Some(request)) = receive(socket) else {
            exit(0)
        };
        let answer = match start_watchdog(request) {
            Ok((pid, report)) => {
                live.push((pid, report));
                pid
            }
            Err(err) => -err.raw_os_error().unwrap_or(libc::EINVAL),
        };
        if (&*socket).write_all(&answer.to_ne_bytes()).is_err() {
            exit(0);
        }
    }
}

/// The spawner's set-up: named, not dumpable, in `/`, no stdio of the host's, no other
/// descriptor but its socket, every signal blocked; returns a signalfd of SIGCHLD.
#[expect(
    unsafe_code,
    reason = "process attributes of the spawner itself: prctl, descriptors, the signal mask"
)]
fn quiet(socket: RawFd) -> io::Result<RawFd> {
    // SAFETY: system calls on integers and static C strings.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"acp-spawner".as_ptr());
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
        libc::chdir(c"/".as_ptr());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        // Everything else the host had open at start (a caller's leaked descriptor, a
        // jobserver's pipe) must not be held here for the host's whole life.
        let socket = u32::try_from(socket).unwrap_or(u32::MAX);
        if socket > 3 {
            libc::syscall(libc::SYS_close_range, 3_u32, socket - 1, 0);
        }
        libc::syscall(libc::SYS_close_range, socket + 1, u32::MAX, 0);
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, std::ptr::null_mut());
        let mut chld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut chld);
        libc::sigaddset(&raw mut chld, libc::SIGCHLD);
        let fd = libc::signalfd(-1, &raw const chld, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// Reads one request; `None` on EOF.
fn receive(socket: &UnixStream) -> io::Result<Option<Request>> {
    let mut header = [0u8; HEADER];
    let mut space = nix::cmsg_space!([RawFd; FDS]);
    let (got, fds) = {
        let mut iov = [IoSliceMut::new(&mut header)];
        let message = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::with_capacity(FDS);
        for message in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = message {
                // Each received descriptor is new in this process and ours alone (`owned`).
                fds.extend(received.into_iter().map(owned));
            }
        }
        (message.bytes, fds)
    };
    if got == 0 {
        return Ok(None);
    }
    let mut reader = socket;
    reader.read_exact(&mut header[got..])?;
    let field = |i: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&header[i * 4..i * 4 + 4]);
        usize::try_from(u32::from_ne_bytes(bytes)).unwrap_or(usize::MAX)
    };
    let mut payload = vec![0u8; field(0)];
    reader.read_exact(&mut payload)?;
    if fds.len() != FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(Some(Request {
        payload,
        args: field(1),
        vars: field(2),
        fds,
    }))
}

#[expect(
    unsafe_code,
    reason = "adopting a descriptor the kernel just installed in this process"
)]
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was received with SCM_RIGHTS: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Forks the watchdog of one request; returns its pid and the spawner's copy of its report
/// pipe's write end (kept until the watchdog is reaped). The request's other descriptors are
/// closed here once the watchdog has its copies.
fn start_watchdog(mut request: Request) -> io::Result<(c_int, OwnedFd)> {
    let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
    let Some(strings) = request.payload.strip_suffix(&[0]) else {
        return Err(invalid());
    };
    let mut strings = strings.split(|byte| *byte == 0);
    let cwd = strings.next().ok_or_else(invalid)?;
    let program = strings.next().ok_or_else(invalid)?;
    let args: Vec<&[u8]> = strings.by_ref().take(request.args).collect();
    let vars: Vec<&[u8]> = strings.collect();
    if args.len() != request.args || vars.len() != request.vars {
        return Err(invalid());
    }
    let [stdin, stdout, stderr, life, report] = [0, 1, 2, 3, 4].map(|i| request.fds[i].as_raw_fd());
    let watchdog =
        Watchdog::from_entries(program, args, vars, life, report, None).map_err(|_| invalid())?;
    let cwd = std::ffi::CString::new(cwd).map_err(|_| invalid())?;
    let pid = fork()?;
    if pid == 0 {
        become_watchdog(&watchdog, [stdin, stdout, stderr], &cwd, report);
    }
    Ok((pid, request.fds.swap_remove(4)))
}

/// In the forked child: the agent's stdio on 0, 1 and 2, its own process group, its working
/// directory, then the watchdog's life (which never returns).
#[expect(
    unsafe_code,
    reason = "a forked child's set-up: descriptors, process group, signal disposition, chdir"
)]
fn become_watchdog(
    watchdog: &Watchdog,
    stdio: [RawFd; 3],
    cwd: &std::ffi::CStr,
    report: RawFd,
) -> ! {
    // SAFETY: system calls on integers and a C string, in a process with one thread.
    unsafe {
        for (fd, target) in stdio.into_iter().zip(0..) {
            if libc::dup2(fd, target) < 0 {
                crate::watchdog::report_err(report, errno());
                libc::_exit(NOT_STARTED);
            }
        }
        // Own group: wrapper launchers (npx, uvx, sh -c) must not orphan the real agent.
        libc::setpgid(0, 0);
        // The host ignores SIGPIPE, and an ignored signal stays ignored across exec: the agent
        // starts with the default, as a child of std's `Command` does.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if libc::chdir(cwd.as_ptr()) != 0 {
            crate::watchdog::report_line(report, b"cwd ", i64::from(errno()));
            libc::_exit(NOT_STARTED);
        }
    }
    if watchdog.serve().is_err() {
        crate::watchdog::report_err(report, errno());
    }
    exit(NOT_STARTED)
}

fn errno() -> c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reaps every exited watchdog and tells its host how it ended: `exit <wait status>` on its
/// report pipe, whose last write end then closes here. So the host's EOF comes once the
/// watchdog is reaped, never while its zombie still holds the agent's process group (which
/// would make the host look for the group's members in the whole process table).
#[expect(
    unsafe_code,
    reason = "waitpid on the spawner's own children; fcntl on a descriptor it owns"
)]
fn reap(live: &mut Vec<(libc::pid_t, OwnedFd)>) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid with a stack integer; the spawner's only children are its watchdogs.
        let pid = unsafe { libc::waitpid(-1, &raw mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        let Some(at) = live.iter().position(|(watchdog, _)| *watchdog == pid) else {
            continue;
        };
        let (_, report) = live.swap_remove(at);
        // The watchdog is gone, so this is the pipe's last writer: never blocking here costs
        // nobody a line, and a host that stopped reading cannot stall the spawner.
        // SAFETY: fcntl on a descriptor this process owns.
        unsafe { libc::fcntl(report.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        crate::watchdog::report_line(report.as_raw_fd(), b"exit ", i64::from(status));
    }
}

#[expect(unsafe_code, reason = "poll on a stack array")]
fn poll(fds: &mut [libc::pollfd; 2]) -> io::Result<()> {
    // SAFETY: poll on a stack array of two pollfds.
    if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[expect(unsafe_code, reason = "a read of the signalfd into a stack buffer")]
fn drain(events: RawFd) {
    let mut info = [0u8; 128 * 4];
    // SAFETY: a read into a stack buffer.
    unsafe { libc::read(events, info.as_mut_ptr().cast(), info.len()) };
}

#[expect(
    unsafe_code,
    reason = "_exit: the spawner never runs the host's exit handlers"
)]
fn exit(code: c_int) -> ! {
    // SAFETY: ends this process; nothing of the host's (atexit handlers, stdio buffers) runs.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(args: &[&str], env: &[(&str, &str)]) -> SpawnSpec {
        SpawnSpec {
            program: "agent".into(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            cwd: "/work".into(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            stderr_tail_bytes: 0,
            stderr_lines: None,
            sandbox: None,
        }
    }

    #[test]
    fn a_request_holds_the_working_directory_program_arguments_and_environment() {
        let (header, payload) = encode(&spec(&["--x", ""], &[("A", "1"), ("B", "")])).unwrap();
        assert_eq!(payload, b"/work\0agent\0--x\0\0A=1\0B=\0");
        let field = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(
            (field(0), field(1), field(2)),
            (u32::try_from(payload.len()).unwrap(), 2, 2)
        );
    }

    #[test]
    fn a_nul_byte_is_refused_before_anything_is_sent() {
        let err = encode(&spec(&["a\0b"], &[])).unwrap_err();
        assert!(err.to_string().contains("NUL"), "{err}");
        let err = encode(&spec(&[], &[("K", "v\0w")])).unwrap_err();
        assert!(err.to_string().ends_with(": \"K\""), "{err}");
    }
}
