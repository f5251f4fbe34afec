//! Shared helpers of the end-to-end suites, the implementation of the `mock-agent` binary
//! ([`mock`]), the mock OpenAI-compatible model server ([`mock_llm`]), and the scripted ACP client
//! the `acp-child` suites drive the agent with ([`acp_client`]).
//!
//! The helpers wait on conditions (a file appearing, a process dying) by polling with short
//! intervals up to a deadline; they never sleep a fixed time and never wait unbounded.

pub mod acp_client;
pub mod doc_links;
pub mod file_server;
pub mod mock;
pub mod mock_llm;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// How often the wait helpers re-check their condition.
const POLL: Duration = Duration::from_millis(10);

/// The path of binary `name` built from another workspace package (for example `acp-host`).
///
/// Cargo only exposes `CARGO_BIN_EXE_*` for the test's own package, so this looks next to the
/// running test executable: `target/<profile>/deps/<test>` -> `target/<profile>/<name>`.
/// Panics, with the fix, when the binary has not been built.
#[must_use]
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path is readable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "binary {name} not found at {}: run `cargo build --workspace` (same profile) before the \
         end-to-end suites",
        path.display()
    );
    path
}

/// Where an instrumented build (`scripts/coverage`) writes its profile. A test that clears a
/// binary's environment passes it on ([`instrumentation_env`]), or that binary's lines go uncounted.
pub const LLVM_PROFILE_FILE: &str = "LLVM_PROFILE_FILE";

/// [`LLVM_PROFILE_FILE`] with its value when this test run is instrumented, else nothing: what a
/// command whose environment a test cleared gets back (`.env_clear().envs(instrumentation_env())`).
#[must_use]
pub fn instrumentation_env() -> Option<(&'static str, std::ffi::OsString)> {
    std::env::var_os(LLVM_PROFILE_FILE).map(|value| (LLVM_PROFILE_FILE, value))
}

/// Guards every wait of the end-to-end suites against a hang; never expected to elapse.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// `acp-host run` in `dir`, with short teardown graces (so ladder tests stay quick; a test may
/// pass its own, the last value wins), without `ACP_HOST_LOG` (so stderr is exactly ours) and
/// without an inherited delegation depth.
#[must_use]
pub fn host_run(dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("acp-host"));
    cmd.current_dir(dir)
        .env(protocol::env_vars::XDG_STATE_HOME, suite_state())
        .env_remove("ACP_HOST_LOG")
        // The suite may itself run inside a delegated agent: its agents start at depth 0.
        .env_remove(protocol::env_vars::ACP_HOST_DEPTH)
        .env_remove(protocol::env_vars::ACP_HOST_MAX_DEPTH)
        .arg("run")
        .args([
            "--eof-grace",
            "2",
            "--term-grace",
            "2",
            "--cancel-grace",
            "2",
        ]);
    cmd
}

/// The state directory (`XDG_STATE_HOME`) of the processes the suites start: approvals of
/// subagent definitions (`acp-host trust`) land here, beside the binaries, never in the user's
/// own state. Approvals name a definition's path, so tests in their own temp folders never see
/// each other's; a test about what is remembered uses a folder of its own instead.
#[must_use]
pub fn suite_state() -> PathBuf {
    bin("acp-host")
        .parent()
        .expect("binaries live in a folder")
        .join("e2e-state")
}

/// Approves definition `file` as its person would from a shell (`acp-host trust --approve
/// FILE`, in [`suite_state`]), so a repository definition starts without asking.
///
/// # Panics
///
/// When the command fails.
pub fn approve_definition(file: &Path) {
    approve_definition_in(file, &suite_state());
}

/// [`approve_definition`] with approvals kept in state directory `state`.
///
/// # Panics
///
/// When the command fails.
pub fn approve_definition_in(file: &Path, state: &Path) {
    let out = run_to_end(
        std::process::Command::new(bin("acp-host"))
            .env(protocol::env_vars::XDG_STATE_HOME, state)
            .args(["trust", "--approve"])
            .arg(file),
    );
    assert!(
        out.status.success(),
        "acp-host trust --approve {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) to its end, under [`HANG_GUARD`].
///
/// # Panics
///
/// When the command cannot start or does not exit in time (it is then killed).
#[must_use]
pub fn run_to_end(cmd: &mut std::process::Command) -> std::process::Output {
    wait_output(spawn_captured(cmd))
}

/// Starts `cmd` with stdin closed and stdout and stderr captured.
///
/// # Panics
///
/// When the command cannot start.
#[must_use]
pub fn spawn_captured(cmd: &mut std::process::Command) -> std::process::Child {
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts")
}

/// Waits for a spawned process and collects its output, with a hang guard: a hang fails the
/// test (and the process is killed) instead of wedging CI.
///
/// # Panics
///
/// When the process does not exit within twice [`HANG_GUARD`].
#[must_use]
pub fn wait_output(child: std::process::Child) -> std::process::Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(output) = rx.recv_timeout(HANG_GUARD * 2) {
        output.expect("the output is readable")
    } else {
        if let Ok(pid) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        panic!("process {pid} did not exit within {:?}", HANG_GUARD * 2);
    }
}

/// Forwards each line read from `reader` (a child's stdout or stderr) to a channel, from a
/// thread, so a test can wait for a line with a deadline while the process runs.
#[must_use]
pub fn line_channel(
    reader: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(reader)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A finished process's stdout.
///
/// # Panics
///
/// When it is not UTF-8.
#[must_use]
pub fn stdout(output: &std::process::Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

/// A finished process's stderr, lossily decoded.
#[must_use]
pub fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A finished process's exit code.
///
/// # Panics
///
/// When a signal ended it.
#[must_use]
pub fn code(output: &std::process::Output) -> i32 {
    output.status.code().expect("the process exited normally")
}

/// Polls until `path` exists; `false` if it still does not after `timeout`.
#[must_use]
pub fn wait_for_file(path: impl AsRef<Path>, timeout: Duration) -> bool {
    let path = path.as_ref();
    wait_until(timeout, || path.exists())
}

/// Starts `cmd` (stdin closed, stdout and stderr piped) and waits, within [`HANG_GUARD`], for
/// `ready` to exist (the agent it runs writes it once it is up).
///
/// # Panics
///
/// When the command cannot start, or `ready` does not appear in time ("{what} never became
/// ready").
#[must_use]
pub fn spawn_until_ready(
    cmd: &mut std::process::Command,
    ready: &Path,
    what: &str,
) -> std::process::Child {
    let child = spawn_captured(cmd);
    assert!(
        wait_for_file(ready, HANG_GUARD),
        "{what} never became ready"
    );
    child
}

/// Whether process `pid` is alive. A zombie (exited, not yet reaped) counts as dead: it runs no
/// code and holds no resources a test cares about. Pid 0 and pids beyond `i32` are never alive.
#[must_use]
pub fn process_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    // `kill(0, ..)` would address our own process group, not a process.
    if raw == 0 {
        return false;
    }
    match kill(Pid::from_raw(raw), None) {
        // EPERM: it exists but belongs to someone else.
        Ok(()) | Err(Errno::EPERM) => !is_zombie(pid),
        Err(_) => false,
    }
}

/// Polls until process `pid` is dead (see [`process_alive`]); `false` if it is still alive
/// after `timeout`.
#[must_use]
pub fn wait_until_dead(pid: u32, timeout: Duration) -> bool {
    wait_until(timeout, || !process_alive(pid))
}

/// Reads a pid file written by the mock (`--pid-file`); `None` if absent or not a pid.
#[must_use]
pub fn read_pid(path: impl AsRef<Path>) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// State `Z` in `/proc/<pid>/stat`. The state follows the command name, which is in
/// parentheses and may itself contain spaces or parentheses, hence the last `)`.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Polls `condition` every few milliseconds until it holds; `false` if it still does not after
/// `timeout`. The building block of the other waits, for conditions they do not cover.
#[must_use]
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Live processes (zombies excluded) whose working directory is `dir`: how a test finds the
/// agents a chain of delegations started there, without knowing their pids.
#[must_use]
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .filter(|pid| process_alive(*pid))
        .collect()
}

/// [`processes_in`] without the watchdogs acp-host puts between itself and each agent: the
/// processes a test reasons about (acp-host, agents, their children). (A spawner, which forks
/// the watchdogs, works in `/` and is never among them.)
#[must_use]
pub fn agents_in(dir: &Path) -> Vec<u32> {
    processes_in(dir)
        .into_iter()
        .filter(|pid| !is_watchdog(*pid))
        .collect()
}

/// Whether `pid` is an acp-host watchdog (by its process name: its command line is its host's).
#[must_use]
pub fn is_watchdog(pid: u32) -> bool {
    comm_is(pid, acp_host::watchdog::PROCESS_NAME)
}

/// Whether `pid` is a spawner, the small copy of acp-host (or acp-child) that forks the
/// watchdogs (by its process name).
#[must_use]
pub fn is_spawner(pid: u32) -> bool {
    comm_is(pid, acp_host::spawner::PROCESS_NAME)
}

fn comm_is(pid: u32, name: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == name)
}

/// The names of a process's threads (`/proc/<pid>/task/*/comm`), sorted.
#[must_use]
pub fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|task| {
            let comm = task.unwrap().path().join("comm");
            std::fs::read_to_string(comm).unwrap().trim().to_owned()
        })
        .collect();
    names.sort();
    names
}

/// The parent of `pid` (from `/proc/<pid>/stat`).
#[must_use]
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The parent of `pid`, skipping the watchdog and the spawner in between (the agent's logical
/// parent: the acp-host or acp-child that started it).
#[must_use]
pub fn logical_parent(pid: u32) -> Option<u32> {
    let mut parent = parent_of(pid)?;
    if is_watchdog(parent) {
        parent = parent_of(parent)?;
        if is_spawner(parent) {
            parent = parent_of(parent)?;
        }
    }
    Some(parent)
}

/// `text` with every duration in seconds as acp-host prints them (`0.0 s`, `12.5 s`,
/// `1,234.5 s`) shown as `[T] s`, for a snapshot of output that reports times.
#[must_use]
pub fn redact_seconds(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" s") {
        let head = &rest[..at];
        let start = head
            .rfind(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
            .map_or(0, |index| index + 1);
        let number = &head[start..];
        let decimal = number.split_once('.').is_some_and(|(whole, fraction)| {
            whole.starts_with(|c: char| c.is_ascii_digit())
                && !fraction.is_empty()
                && fraction.chars().all(|c| c.is_ascii_digit())
        });
        out.push_str(if decimal { &head[..start] } else { head });
        if decimal {
            out.push_str("[T]");
        }
        out.push_str(" s");
        rest = &rest[at + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds_are_redacted_and_nothing_else() {
        assert_eq!(
            redact_seconds("a (0 running, 1 failed, 0.0 s) of 2 in 1,234.5 s; 3 s"),
            "a (0 running, 1 failed, [T] s) of 2 in [T] s; 3 s"
        );
        assert_eq!(redact_seconds("no time"), "no time");
    }

    #[test]
    fn a_live_process_is_alive_until_it_exits_and_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(process_alive(pid));
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, which counts as dead.
        assert!(wait_until_dead(pid, Duration::from_secs(5)));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn pid_zero_and_out_of_range_pids_are_not_alive() {
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
    }

    #[test]
    fn wait_for_file_sees_a_file_and_times_out_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready");
        assert!(!wait_for_file(&path, Duration::from_millis(30)));
        std::fs::write(&path, "").unwrap();
        assert!(wait_for_file(&path, Duration::from_millis(30)));
    }

    #[test]
    fn read_pid_parses_the_mock_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pid");
        assert_eq!(read_pid(&path), None);
        std::fs::write(&path, "1234\n").unwrap();
        assert_eq!(read_pid(&path), Some(1234));
    }
}
