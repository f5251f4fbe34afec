//! End-to-end: an agent on the other end of ssh (`acp-host run --agent "ssh -T HOST acp-child"`),
//! through a real loopback sshd (Debian's `openssh-server`, started by the test on 127.0.0.1 with
//! keys generated for it): a prompt, a cancel, a `--timeout` and acp-host killed with SIGKILL, with
//! nothing left running on either side afterwards, sshd serving no session. On a machine without
//! sshd each test says so on stderr and passes without running (CI installs it: `.ci/run`).
//!
//! The "remote" side is this machine: its processes are told apart by their working directory
//! (the remote command `cd`s into a folder of its own), and its environment is the one sshd
//! gives a session, not the test's.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use acp_tests::{
    HANG_GUARD, agents_in, bin, code, host_run, line_channel, logical_parent, process_alive,
    processes_in, run_to_end, stderr, stdout, suite_state, wait_output, wait_until,
};
use nix::sys::signal::Signal;
use protocol::env_vars;

use super::common::{mock_path, result_record, temp};
use super::run::signal;

/// Where Debian's `openssh-server` puts the daemon.
const SSHD: &str = "/usr/sbin/sshd";

/// The directory OpenSSH's privilege separation needs; the package's service creates it at
/// start (systemd's `RuntimeDirectory`), which a foreground sshd does not.
const PRIVSEP_DIR: &str = "/run/sshd";

/// Tries on another port when the one chosen was taken meanwhile.
const BIND_TRIES: usize = 5;

/// A running loopback sshd and the client configuration that reaches it as `Host remote`.
struct Sshd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Sshd {
    /// Starts sshd; `None` (with the reason printed) when this machine cannot run one.
    ///
    /// # Panics
    ///
    /// When sshd is installed but does not start (its stderr is in the message).
    #[must_use]
    fn start() -> Option<Sshd> {
        if !Path::new(SSHD).is_file() || which("ssh").is_none() || which("ssh-keygen").is_none() {
            skip("sshd, ssh or ssh-keygen is not installed (`apt-get install openssh-server`)");
            return None;
        }
        if let Err(err) = std::fs::create_dir_all(PRIVSEP_DIR) {
            skip(&format!(
                "cannot create {PRIVSEP_DIR} ({err}); create it as root (`mkdir -p {PRIVSEP_DIR}`)"
            ));
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        for key in ["host_key", "user_key"] {
            let status = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.path().join(key))
                .stdin(Stdio::null())
                .status()
                .expect("ssh-keygen runs");
            assert!(status.success(), "ssh-keygen {key}: {status}");
        }
        std::fs::copy(
            dir.path().join("user_key.pub"),
            dir.path().join("authorized_keys"),
        )
        .expect("authorized_keys");
        let mut last = String::new();
        for _ in 0..BIND_TRIES {
            let port = free_port();
            match Self::listen(&dir, port) {
                Ok(child) => {
                    Self::client_config(&dir, port);
                    return Some(Sshd { child, dir });
                }
                Err(stderr) if stderr.contains("Address already in use") => last = stderr,
                Err(stderr) => panic!("sshd did not start: {stderr}"),
            }
        }
        panic!("sshd found no free port in {BIND_TRIES} tries: {last}");
    }

    /// sshd on `port`, once it says it listens; its stderr when it exits instead.
    fn listen(dir: &tempfile::TempDir, port: u16) -> Result<Child, String> {
        let path = |name: &str| dir.path().join(name).display().to_string();
        let config = format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {}\nAuthorizedKeysFile {}\n\
             PidFile none\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n",
            path("host_key"),
            path("authorized_keys"),
        );
        std::fs::write(dir.path().join("sshd_config"), config).expect("sshd_config");
        let mut child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(path("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sshd starts");
        let lines = line_channel(child.stderr.take().expect("stderr piped"));
        let mut seen = String::new();
        let deadline = std::time::Instant::now() + HANG_GUARD;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match lines.recv_timeout(left) {
                Ok(line) if line.starts_with("Server listening on 127.0.0.1") => {
                    // Later lines (a session's errors) are drained, not kept.
                    std::thread::spawn(move || for _ in lines {});
                    return Ok(child);
                }
                Ok(line) => {
                    seen.push_str(&line);
                    seen.push('\n');
                }
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(seen)
    }

    /// `ssh_config`: `Host remote` is this server, with only the generated key and host key.
    fn client_config(dir: &tempfile::TempDir, port: u16) {
        let path = |name: &str| dir.path().join(name).display().to_string();
        let host_key = std::fs::read_to_string(dir.path().join("host_key.pub")).expect("host key");
        let mut fields = host_key.split_whitespace();
        let (kind, key) = (fields.next().unwrap(), fields.next().unwrap());
        let mut known = std::fs::File::create(dir.path().join("known_hosts")).unwrap();
        writeln!(known, "[127.0.0.1]:{port} {kind} {key}").unwrap();
        // No `User`: ssh logs in as the user running the test, whom the key is authorized for.
        std::fs::write(
            dir.path().join("ssh_config"),
            format!(
                "Host remote\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {}\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  \
                 StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n",
                path("user_key"),
                path("known_hosts"),
            ),
        )
        .expect("ssh_config");
    }

    /// The `ssh` command line that runs `remote` (a shell command line) on this server, as
    /// `acp-host run --agent` takes it.
    #[must_use]
    fn agent(&self, remote: &str) -> String {
        shell_words::join([
            "ssh",
            "-F",
            &self.dir.path().join("ssh_config").display().to_string(),
            "-T",
            "remote",
            remote,
        ])
    }

    /// The sessions sshd is serving now: its live child processes (one per connection).
    #[must_use]
    fn sessions(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| logical_parent(*pid) == Some(self.child.id()) && process_alive(*pid))
            .collect()
    }

    /// Waits until sshd serves no session; `false` if one is left after [`HANG_GUARD`].
    #[must_use]
    fn wait_idle(&self) -> bool {
        wait_until(HANG_GUARD, || self.sessions().is_empty())
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now (the kernel's choice; taken back before sshd binds it, hence
/// the retries).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

#[expect(clippy::print_stderr, reason = "a skipped suite says why, once")]
fn skip(why: &str) {
    eprintln!("skipped: the ssh suite needs a loopback sshd: {why}");
}

/// The remote command line: in `remote`, with this build's binaries first on PATH and acp-child's
/// state kept in the suites' folder (the session's environment is sshd's, not the test's), exec
/// `command`.
fn remote_command(remote: &Path, command: &str) -> String {
    let bin_dir = bin("acp-host").parent().unwrap().display().to_string();
    let state = suite_state().display().to_string();
    format!(
        "cd {} && export {}={} {}={} && unset {} && PATH={}:\"$PATH\" exec {command}",
        shell_words::quote(&remote.display().to_string()),
        env_vars::XDG_STATE_HOME,
        shell_words::quote(&state),
        env_vars::ACP_CHILD_STATE_DIR,
        shell_words::quote(&state),
        env_vars::ACP_CHILD_MODEL,
        shell_words::quote(&bin_dir),
    )
}

/// Asserts nothing runs in `local` nor in `remote`, and sshd serves no session.
fn assert_nothing_left(sshd: &Sshd, local: &Path, remote: &Path) {
    for (side, dir) in [("local", local), ("remote", remote)] {
        assert!(
            wait_until(HANG_GUARD, || processes_in(dir).is_empty()),
            "{side} processes left: {:?}",
            processes_in(dir)
        );
    }
    assert!(
        sshd.wait_idle(),
        "sshd sessions left: {:?}",
        sshd.sessions()
    );
}

#[test]
fn a_prompt_runs_on_the_remote_acp_child() {
    let Some(sshd) = Sshd::start() else { return };
    let (local, remote) = (temp(), temp());
    // The agent runs where ssh put it (the remote command's folder) and works in the session's
    // folder: the path acp-host sent, its own cwd, taken as it is on the remote side.
    let echo = shell_words::join([mock_path(), "echo-cwd"]);
    let out = run_to_end(host_run(local.path()).args([
        "--agent",
        &sshd.agent(&remote_command(remote.path(), &echo)),
        "where",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let canonical = |dir: &Path| dir.canonicalize().unwrap().display().to_string();
    assert_eq!(
        stdout(&out),
        format!(
            "process: {}\nsession: {}",
            canonical(remote.path()),
            canonical(local.path())
        )
    );
    let out = run_to_end(host_run(local.path()).args([
        "--json",
        "--permission",
        "allow",
        "--agent",
        &sshd.agent(&remote_command(remote.path(), "acp-child")),
        "/write notes.txt written over ssh",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        std::fs::read_to_string(local.path().join("notes.txt")).unwrap(),
        "written over ssh"
    );
    assert_nothing_left(&sshd, local.path(), remote.path());
}

/// `acp-host run --json` of the remote mock `hang` (ready once its partial text is sent), with
/// `host_args`; returns once the remote agent is ready.
fn hanging(sshd: &Sshd, host_args: &[&str]) -> (Child, tempfile::TempDir, tempfile::TempDir) {
    let (local, remote) = (temp(), temp());
    let ready = remote.path().join("ready");
    let command = shell_words::join([mock_path(), "hang", "--ready", &ready.display().to_string()]);
    let agent = sshd.agent(&remote_command(remote.path(), &command));
    let child = acp_tests::spawn_until_ready(
        host_run(local.path())
            .args(["--json", "--agent", &agent])
            .args(host_args)
            .arg("go"),
        &ready,
        "the remote agent",
    );
    (child, local, remote)
}

#[test]
fn ctrl_c_cancels_the_remote_turn_and_the_remote_agent_ends() {
    let Some(sshd) = Sshd::start() else { return };
    let (host, local, remote) = hanging(&sshd, &[]);
    signal(&host, Signal::SIGINT);
    let out = wait_output(host);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "aborted", "{result}");
    // The remote agent answered the cancel itself: it crossed the connection.
    assert_eq!(result["stopReason"], "cancelled", "{result}");
    assert_eq!(result["output"], "partial ", "{result}");
    assert_nothing_left(&sshd, local.path(), remote.path());
}

#[test]
fn a_timeout_ends_the_remote_turn_and_the_remote_agent() {
    let Some(sshd) = Sshd::start() else { return };
    // Room for ssh's own start on a loaded machine: the turn must have begun before it is up.
    let (host, local, remote) = hanging(&sshd, &["--timeout", "3"]);
    let out = wait_output(host);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    let result = result_record(&out);
    assert_eq!(result["status"], "timeout", "{result}");
    assert_eq!(result["output"], "partial ", "{result}");
    assert_nothing_left(&sshd, local.path(), remote.path());
}

#[test]
fn a_sigkilled_host_leaves_nothing_running_on_the_remote_side() {
    let Some(sshd) = Sshd::start() else { return };
    let (local, remote) = (temp(), temp());
    let agent = sshd.agent(&remote_command(
        remote.path(),
        "acp-child --subagent-agents acp-child",
    ));
    let host = host_run(local.path())
        .args(["--agent", &agent, "/delegate acp-child /sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acp-host starts");
    // The remote acp-child (in the remote command's folder) and the child it delegated to (in
    // the session's folder, beside acp-host and ssh), all running.
    assert!(
        wait_until(HANG_GUARD, || agents_in(remote.path()).len() == 1
            && agents_in(local.path()).len() >= 3),
        "the remote delegation never started: remote {:?}, local {:?}",
        processes_in(remote.path()),
        processes_in(local.path())
    );
    signal(&host, Signal::SIGKILL);
    let out = wait_output(host);
    assert_eq!(out.status.code(), None, "killed by a signal");
    // acp-host's watchdog ends ssh; the connection closes; sshd closes the remote acp-child's
    // stdin, and it ends with its child.
    assert_nothing_left(&sshd, local.path(), remote.path());
}
