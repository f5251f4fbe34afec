//! The `acp-host` binary: the CLI.
//!
//! Start-up hardening comes first, before any agent can be spawned: the process becomes
//! non-dumpable (its environment, with the credentials withheld from agents, is unreadable to
//! them through /proc) and a child subreaper (orphans of an agent's tree stay findable).
//!
//! The withheld variables are not also removed from this process's environment: the kernel serves
//! `/proc/<pid>/environ` from the block the process started with, which `unsetenv` leaves as it
//! was, so removal would hide nothing; non-dumpable is what keeps that block out of reach.

#![expect(
    clippy::print_stderr,
    reason = "the binary is the edge that tells the person"
)]

mod cli;

fn main() -> std::process::ExitCode {
    if let Err(err) = acp_host::process::harden_host() {
        eprintln!("acp-host: warning: {}", protocol::report::describe(&err));
    }
    cli::main()
}
