//! The `acp-host` binary: the CLI.
//!
//! Start-up hardening comes first, before any agent can be spawned: the process becomes
//! non-dumpable (its environment, with the credentials withheld from agents, is unreadable to
//! them through /proc) and a child subreaper (orphans of an agent's tree stay findable).
//!
//! The withheld variables are not also removed from this process's environment: the kernel serves
//! `/proc/<pid>/environ` from the block the process started with, which `unsetenv` leaves as it
//! was, so removal would hide nothing; non-dumpable is what keeps that block out of reach.
//!
//! The entry point is the C `main` (`#![no_main]`), not the standard library's: before a Rust
//! `main` the standard library finds the main thread's stack guard, which on Linux reads and
//! parses all of `/proc/self/maps` (about a tenth of a millisecond of a one-shot run here,
//! docs/benchmarks.md), for a "stack overflow" message in place of a plain SIGSEGV. Of the rest
//! of that set-up, what acp-host relies on is done here: SIGPIPE is ignored (a closed pipe is an
//! `EPIPE` error, never a silent death), standard streams that were closed at exec are opened on
//! `/dev/null` (so no pipe of ours can become fd 0, 1 or 2), a panic ends the process with exit
//! code 101 after its message. Arguments and the environment
//! come from glibc, which hands them to the standard library whichever `main` runs.

// The test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]
#![expect(
    clippy::print_stderr,
    reason = "the binary is the edge that tells the person"
)]

mod cli;

use std::ffi::c_int;
use std::process::ExitCode;

/// What a Rust `main` that panicked exits with.
const PANICKED: c_int = 101;

#[cfg(not(test))]
#[expect(
    unsafe_code,
    reason = "the C entry point: the standard library's start-up is skipped (see the module doc)"
)]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const std::ffi::c_char) -> c_int {
    start()
}

/// Under the test harness, which brings its own `main`, this one is not called.
#[cfg(test)]
fn main() {
    let _: fn() -> c_int = start;
}

fn start() -> c_int {
    ignore_sigpipe();
    open_closed_std_streams();
    // No flush of stdout at the end: every write of acp-host flushes (`cli::write_stdout`), and
    // a flush here would wait for a writer thread blocked on a stalled reader (the standard
    // library's own exit flush only tries the lock).
    std::panic::catch_unwind(run).map_or(PANICKED, exit_status)
}

fn run() -> ExitCode {
    if let Err(err) = acp_host::process::harden_host() {
        eprintln!("acp-host: warning: {}", protocol::report::describe(&err));
    }
    cli::main()
}

/// The number an [`ExitCode`] stands for (every code acp-host returns is made from a `u8`).
fn exit_status(code: ExitCode) -> c_int {
    (0..=u8::MAX)
        .find(|n| ExitCode::from(*n) == code)
        .map_or(1, c_int::from)
}

/// As the standard library's start-up does: writing to a closed pipe is an `EPIPE` error, not
/// a signal that ends the process. Agents start with SIGPIPE at its default again (std's spawn
/// resets it in the child, and the watchdog is started that way).
#[expect(
    unsafe_code,
    reason = "setting a signal's disposition to ignored runs no handler code"
)]
fn ignore_sigpipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_IGN installs no handler, so no code can run in signal context.
    if let Err(err) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) } {
        eprintln!("acp-host: warning: cannot ignore SIGPIPE: {err}");
    }
}

/// As the standard library's start-up does: a standard stream closed at exec (`2>&-`) is opened
/// on `/dev/null`, so the first pipe opened later cannot take its number and receive what is
/// meant for it. Opening returns the lowest free number: one that is 0, 1 or 2 filled a closed
/// stream and stays open; the first above 2 is closed again.
fn open_closed_std_streams() {
    use std::os::fd::{AsRawFd as _, IntoRawFd as _};
    while let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        if null.as_raw_fd() > 2 {
            break;
        }
        // Inherited like the stream it stands for (std opens it without close-on-exec too), and
        // kept open for the life of the process.
        let _ = nix::fcntl::fcntl(
            &null,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        );
        let _ = null.into_raw_fd();
    }
}
