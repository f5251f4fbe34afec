//! `no-landlock [--no-namespaces] PROGRAM [ARG...]`: runs PROGRAM as on a kernel without
//! Landlock. A seccomp filter answers the three Landlock system calls `ENOSYS` (what a kernel
//! built without it says), then PROGRAM is executed under it (the filter is inherited by
//! everything it starts). The sandbox suite runs acp-host through it to see a run refused, or run
//! best effort, where the kernel cannot confine. With `--no-namespaces`, Landlock is left alone
//! and `unshare` is refused instead (`EPERM`, what a container's filter says): a machine that
//! gives no user namespace.

#![expect(
    clippy::print_stderr,
    reason = "the helper reports its usage errors and a failed exec"
)]

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::process::ExitCode;

use nix::libc;
use seccompiler::{SeccompAction, SeccompFilter};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let mut program = args.next();
    let namespaces = program.as_deref() == Some(std::ffi::OsStr::new("--no-namespaces"));
    if namespaces {
        program = args.next();
    }
    let Some(program) = program else {
        eprintln!("usage: no-landlock [--no-namespaces] PROGRAM [ARG...]");
        return ExitCode::from(64);
    };
    let (refused, errno) = if namespaces {
        (vec![libc::SYS_unshare], libc::EPERM)
    } else {
        (
            vec![
                libc::SYS_landlock_create_ruleset,
                libc::SYS_landlock_add_rule,
                libc::SYS_landlock_restrict_self,
            ],
            libc::ENOSYS,
        )
    };
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        refused.into_iter().map(|nr| (nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(errno).unwrap_or(38)),
        std::env::consts::ARCH
            .try_into()
            .expect("a supported architecture"),
    )
    .and_then(seccompiler::BpfProgram::try_from)
    .expect("the filter compiles");
    if let Err(err) = seccompiler::apply_filter(&filter) {
        eprintln!("no-landlock: cannot install the filter: {err}");
        return ExitCode::from(70);
    }
    let err = std::process::Command::new(&program).args(args).exec();
    eprintln!(
        "no-landlock: cannot run {}: {err}",
        program.to_string_lossy()
    );
    ExitCode::from(127)
}
