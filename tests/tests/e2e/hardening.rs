//! End-to-end: what an agent must not get from the host, and that no process of the agent's
//! tree outlives the host: inherited file descriptors, the host's own environment through
//! `/proc`, grandchildren that leave the process group with `setsid()`, and the host itself
//! being killed with SIGKILL with a wrapper launcher in between. acp-child hardens itself the
//! same way: its environment (with the API key) is out of reach of the subagents and commands it
//! starts, and what a command detaches is adopted, reaped, and ended with acp-child, even when an
//! editor (no acp-host, no watchdog) started it.
//!
//! "Gone" means every descendant the test saw (walking `/proc`) or the mock reported, not only
//! the agent's process group. Waits poll with deadlines; nothing sleeps a fixed time.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

use acp_tests::acp_client::{Launch, Permission, new_session, prompt_ends, with_launch};
use acp_tests::mock_llm::{MockLlm, Reply};
use acp_tests::{
    HANG_GUARD, bin, code, parent_of, process_alive, read_pid, run_to_end, stderr, stdout,
    wait_for_file, wait_output, wait_until, wait_until_dead,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use serde_json::json;

use super::children::write_definition;
use super::common::{mock, mock_path, temp};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// Both pids the `escapee` scenario wrote: the in-group grandchild, then the setsid one.
fn escapee_pids(pid_file: &Path) -> Vec<u32> {
    assert!(
        wait_for_file(pid_file, HANG_GUARD),
        "the mock wrote no pids"
    );
    let text = std::fs::read_to_string(pid_file).expect("pid file readable");
    let pids: Vec<u32> = text
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 2, "two grandchildren: {text:?}");
    pids
}

fn assert_all_dead(pids: &[u32], what: &str) {
    for pid in pids {
        assert!(
            wait_until_dead(*pid, HANG_GUARD),
            "process {pid} ({what}) is still alive: {}",
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ")
        );
    }
}

/// Every process below `root` now, by parent links in `/proc` (the test's own view, independent
/// of the host's).
fn descendants(root: u32) -> Vec<u32> {
    let table: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let parent = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, parent))
        })
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, _) in table.iter().filter(|(_, ppid)| *ppid == parent) {
            found.push(*pid);
            frontier.push(*pid);
        }
    }
    found
}

#[test]
fn a_file_descriptor_the_host_inherited_does_not_reach_the_agent() {
    let dir = temp();
    let marker = dir.path().join("inherited-fd-marker");
    std::fs::write(&marker, "not for the agent").unwrap();
    // The caller's shell opens fd 7 without close-on-exec, as `exec 7<file` does, then becomes
    // acp-host.
    let out = run_to_end(
        Command::new("sh")
            .current_dir(dir.path())
            .args(["-c", r#"exec 7<"$0" && exec "$@""#, path_str(&marker)])
            .arg(bin("acp-host"))
            .args(["run", "--agent", &mock(&["probe-fd", "--fd", "7"]), "x"]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("fd 7: "), "{text}");
    assert!(
        !text.contains("inherited-fd-marker"),
        "the agent got the host's fd 7: {text}"
    );
}

/// `acp-host` in `dir`, as an unprivileged user. Root reads any process's /proc entries whatever
/// its dumpable flag; the guarantee is about an agent running as the same unprivileged user, so
/// as root the host (and so everything it starts) runs as nobody, and `dir` is opened to it.
/// `setpriv` execs acp-host in place: the child's pid is the host's.
fn unprivileged_host(dir: &Path) -> Command {
    let as_root = std::fs::metadata("/proc/self")
        .is_ok_and(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0);
    let mut host = if as_root {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin("acp-host"));
        cmd
    } else {
        Command::new(bin("acp-host"))
    };
    host.current_dir(dir)
        .env_remove("ACP_HOST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    host
}

#[test]
fn an_agent_cannot_read_the_hosts_environment_through_proc() {
    let dir = temp();
    let secret = "hunter2-do-not-leak-4f1c9";
    let child = unprivileged_host(dir.path())
        .env("ACP_TEST_HARDENING_TOKEN", secret)
        .args(["run", "--agent", &mock(&["ancestor-environ"]), "x"])
        .spawn()
        .expect("acp-host starts");
    let host_pid = child.id();
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains(secret) && !stderr(&out).contains(secret),
        "a withheld value reached the agent: {text}"
    );
    let host_line = text
        .lines()
        .find(|line| line.starts_with(&format!("{host_pid}: ")))
        .unwrap_or_else(|| panic!("the agent saw no ancestor {host_pid}: {text}"));
    assert!(host_line.contains("unreadable"), "{host_line}");
}

#[test]
fn a_subagent_cannot_read_acp_childs_environment_through_proc() {
    let dir = temp();
    let secret = "hunter2-do-not-leak-acp-child-7d2e";
    // acp-child holds the secret (forwarded, as an API key is); the mock it delegates to gets the
    // scrubbed environment and reads every ancestor's: acp-child's watchdog (a copy of its
    // memory), acp-child, acp-host's watchdog, acp-host.
    // In a folder the person names (its own, so no approval is asked: the host runs as nobody).
    let defs = dir.path().join("defs");
    write_definition(
        &defs,
        "probe.md",
        &format!(
            "---\ndescription: the mock\nrun:\n  agent: {}\n---\nProbe.\n",
            serde_json::to_string(&mock(&["ancestor-environ"])).unwrap()
        ),
    );
    let agent = shell_words::join(["acp-child", "--subagents", &defs.display().to_string()]);
    let child = unprivileged_host(dir.path())
        .env_remove(ACP_HOST_DEPTH)
        .env_remove(ACP_HOST_MAX_DEPTH)
        .env_remove("ACP_CHILD_MODEL")
        .env("ACP_TEST_HARDENING_TOKEN", secret)
        .args([
            "run",
            "--env",
            "ACP_TEST_HARDENING_TOKEN",
            "--agent",
            &agent,
        ])
        .arg("/delegate probe x")
        .spawn()
        .expect("acp-host starts");
    let host_pid = child.id();
    let out = wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains(secret) && !stderr(&out).contains(secret),
        "the secret reached the subagent: {text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    let host_at = lines
        .iter()
        .position(|line| line.starts_with(&format!("{host_pid}: ")))
        .unwrap_or_else(|| panic!("the subagent saw no ancestor {host_pid}: {text}"));
    assert!(host_at >= 3, "the ancestors below acp-host: {text}");
    for line in &lines[..=host_at] {
        assert!(line.contains("unreadable"), "{line}\nin: {text}");
    }
}

/// Kills `pid` if it is still alive after a failed wait, so a failing test leaves nothing.
fn kill_if_alive(pid: u32) {
    if process_alive(pid) {
        let _ = kill(Pid::from_raw(pid.cast_signed()), Signal::SIGKILL);
    }
}

/// Shell text starting `sleep 600` in a session of its own (`setsid`), its pid in `pid_file`
/// once it has left the command's process group: the command goes on only then, so the group
/// kill at the command's end cannot catch it before it is detached.
fn detach_sleep(pid_file: &str) -> String {
    format!(
        "setsid sh -c 'echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 600' \
         </dev/null >/dev/null 2>&1 & until [ -e {pid_file} ]; do sleep 0.01; done"
    )
}

/// How long a wait inside a client session may take: well within the session's own deadline
/// (`acp_client::TIMEOUT`), so a failure names what did not happen.
const IN_SESSION: std::time::Duration = std::time::Duration::from_secs(10);

#[tokio::test]
async fn a_setsid_grandchild_of_a_command_does_not_outlive_acp_child() {
    let cwd = temp();
    let state = temp();
    // The escapee leaves the command's process group and session, so the group kill at the
    // command's end misses it; it re-parents to acp-child, which ends it when its client (here:
    // this test, as an editor: no acp-host, no watchdog) closes the connection.
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_run_1",
            "run_command",
            &json!({"command": detach_sleep("escapee.pid")}),
            1,
        ),
        Reply::text(["ran"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (pid, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        prompt_ends(&mut session, "run it", Permission::Allow).await?;
        let pid = read_pid(cwd.path().join("escapee.pid")).expect("the command wrote its pid");
        assert!(
            process_alive(pid),
            "the escapee {pid} died with its command"
        );
        // Returning closes acp-child's stdin; `with_launch` sees it exit with code 0.
        Ok(pid)
    })
    .await;
    assert_eq!(
        llm.requests()[1].tool_result("call_run_1").as_deref(),
        Some("exit code: 0")
    );
    let gone = tokio::task::spawn_blocking(move || wait_until_dead(pid, HANG_GUARD))
        .await
        .unwrap();
    kill_if_alive(pid);
    assert!(gone, "the setsid grandchild {pid} outlived acp-child");
}

#[tokio::test]
async fn an_orphan_a_command_left_is_adopted_by_acp_child_and_reaped_when_it_exits() {
    let cwd = temp();
    let state = temp();
    let llm = MockLlm::start(vec![
        Reply::tool_call(
            "call_run_1",
            "run_command",
            // `$PPID` is acp-child; the escapee outlives its shell, which exits with 7.
            &json!({"command": format!(
                "{}; echo $PPID > agent.pid; exit 7",
                detach_sleep("orphan.pid")
            )}),
            1,
        ),
        Reply::text(["ran"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path());
    let (orphan, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        prompt_ends(&mut session, "run it", Permission::Allow).await?;
        let (agent, orphan) = (
            read_pid(cwd.path().join("agent.pid")).expect("the command wrote acp-child's pid"),
            read_pid(cwd.path().join("orphan.pid")).expect("the command wrote its escapee's pid"),
        );
        let adopted = tokio::task::spawn_blocking(move || {
            wait_until(IN_SESSION, || parent_of(orphan) == Some(agent))
        })
        .await
        .unwrap();
        if !adopted {
            kill_if_alive(orphan);
        }
        assert!(
            adopted,
            "the orphan {orphan} re-parented to {:?}, not to acp-child {agent}",
            parent_of(orphan)
        );
        // Once it exits, acp-child reaps it (no zombie is left), while serving on.
        kill(Pid::from_raw(orphan.cast_signed()), Signal::SIGKILL).unwrap();
        let reaped = tokio::task::spawn_blocking(move || {
            wait_until(IN_SESSION, || {
                !Path::new(&format!("/proc/{orphan}")).exists()
            })
        })
        .await
        .unwrap();
        assert!(reaped, "the orphan {orphan} was left a zombie of acp-child");
        Ok(orphan)
    })
    .await;
    // Reaping orphans never took the exit status tokio waits for: the shell's own.
    assert_eq!(
        llm.requests()[1].tool_result("call_run_1").as_deref(),
        Some("exit code: 7"),
        "orphan {orphan}"
    );
}

/// `escapee --then <then> --stdout <stdout>` run to its end; both grandchildren must be gone.
fn escapees_are_gone_after(then: &str, stdout_mode: &str, host_args: &[&str], exit: i32) {
    let dir = temp();
    let pids = dir.path().join("pids");
    let out = run_to_end(
        acp_tests::host_run(dir.path())
            .args(["--json", "--term-grace", "0.5"])
            .args(host_args)
            .args([
                "--agent",
                &mock(&[
                    "escapee",
                    "--then",
                    then,
                    "--stdout",
                    stdout_mode,
                    "--pid-file",
                    path_str(&pids),
                ]),
                "x",
            ]),
    );
    assert_eq!(code(&out), exit, "{then}/{stdout_mode}: {}", stderr(&out));
    assert_all_dead(
        &escapee_pids(&pids),
        &format!("grandchild, agent {then}, stdout {stdout_mode}"),
    );
}

#[test]
fn a_setsid_grandchild_is_gone_after_the_agent_answered() {
    escapees_are_gone_after("answer", "null", &[], 0);
    escapees_are_gone_after("answer", "hold", &[], 0);
}

#[test]
fn a_setsid_grandchild_is_gone_after_the_agent_exited_without_answering() {
    escapees_are_gone_after("exit", "null", &[], 1);
    escapees_are_gone_after("exit", "hold", &[], 1);
}

#[test]
fn a_setsid_grandchild_is_gone_after_a_timeout() {
    escapees_are_gone_after("hang", "hold", &["--timeout", "0.5"], 124);
}

#[test]
fn the_whole_tree_dies_when_the_host_is_sigkilled_even_under_a_wrapper() {
    let dir = temp();
    let pids = dir.path().join("pids");
    let ready = dir.path().join("ready");
    // The agent ignores stdin EOF, so it is alive when the host dies and only the watchdog can
    // end it (an agent exiting at that very moment is the best-effort case docs/run.md names).
    let agent = mock(&[
        "escapee",
        "--then",
        "hang",
        "--ignore-eof",
        "--stdout",
        "hold",
        "--pid-file",
        path_str(&pids),
        "--ready",
        path_str(&ready),
    ]);
    // A wrapper launcher (like npx) between host and agent: the parent-death signal alone
    // would reach only the wrapper.
    let wrapped = shell_words::join(&["sh".to_owned(), "-c".to_owned(), format!("{agent}; true")]);
    let child = acp_tests::spawn_until_ready(
        acp_tests::host_run(dir.path()).args(["--agent", &wrapped, "x"]),
        &ready,
        "the mock",
    );
    let host = child.id();
    let mut tree = descendants(host);
    tree.extend(escapee_pids(&pids));
    // watchdog (or wrapper), sh, the mock and its two grandchildren at least.
    assert!(tree.len() >= 4, "the tree below the host: {tree:?}");
    kill(Pid::from_raw(host.cast_signed()), Signal::SIGKILL).expect("SIGKILL acp-host");
    let out = wait_output(child);
    assert_all_dead(
        &tree,
        &format!(
            "below the SIGKILLed host, whose stderr was {:?}",
            stderr(&out)
        ),
    );
}

/// Control for the fd test: without the host in between, the shell's fd 7 does reach a child,
/// so the test above would see it if acp-host passed it on.
#[test]
fn the_inherited_fd_test_would_see_a_leak() {
    let dir = temp();
    let marker = dir.path().join("inherited-fd-marker");
    std::fs::write(&marker, "x").unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", r#"exec 7<"$0" && exec "$@""#, path_str(&marker)])
        .arg(mock_path())
        .args(["probe-fd", "--fd", "7"]);
    // Drive the mock directly over its stdin: one prompt turn.
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(
        &mut stdin,
        concat!(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}"#,
            "\n"
        )
        .as_bytes(),
    )
    .unwrap();
    drop(stdin);
    let out = wait_output(child);
    assert!(
        stdout(&out).contains("inherited-fd-marker"),
        "{}",
        stdout(&out)
    );
}

/// The tree of a batch: acp-host -> its spawner -> each agent's watchdog -> the agent. The
/// spawner (forked at acp-host's start) works in `/` and holds none of acp-host's stdio or other
/// files, so a reader of acp-host's stdout sees EOF when acp-host exits; and it is gone, with the
/// whole tree, once acp-host is, even killed with SIGKILL.
#[test]
fn each_watchdog_of_a_batch_is_forked_by_a_spawner_that_holds_none_of_the_hosts_files() {
    let dir = temp();
    let ready = dir.path().join("ready");
    super::batch::jobs_file(dir.path(), &[r#"{"prompt":"x"}"#.to_owned()]);
    let child = acp_tests::spawn_until_ready(
        super::batch::batch(dir.path()).args([
            "--agent",
            &mock(&["hang", "--ready", path_str(&ready)]),
            "jobs.ndjson",
        ]),
        &ready,
        "the mock",
    );
    let host = child.id();
    let below = descendants(host);
    let only = |what: &str, is: fn(u32) -> bool| {
        let found: Vec<u32> = below.iter().copied().filter(|pid| is(*pid)).collect();
        match found[..] {
            [pid] => pid,
            _ => panic!("one {what} below acp-host: {found:?} of {below:?}"),
        }
    };
    let spawner = only("spawner", acp_tests::is_spawner);
    assert_eq!(parent_of(spawner), Some(host));
    let watchdog = only("watchdog", acp_tests::is_watchdog);
    assert_eq!(parent_of(watchdog), Some(spawner));
    let agent = below
        .iter()
        .copied()
        .find(|pid| parent_of(*pid) == Some(watchdog))
        .expect("the agent below its watchdog");
    assert_eq!(acp_tests::logical_parent(agent), Some(host));
    assert_eq!(
        std::fs::read_link(format!("/proc/{spawner}/cwd")).unwrap(),
        Path::new("/")
    );
    let files: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{spawner}/fd"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| {
            let target = std::fs::read_link(entry.path())
                .map_or_else(|_| "?".to_owned(), |target| target.display().to_string());
            (entry.file_name().to_string_lossy().into_owned(), target)
        })
        .collect();
    let mut others: Vec<&str> = Vec::new();
    for (fd, target) in &files {
        match fd.as_str() {
            "0" | "1" | "2" => assert_eq!(target, "/dev/null", "the spawner's fd {fd}"),
            _ => others.push(target.split(':').next().unwrap_or_default()),
        }
    }
    others.sort_unstable();
    // Its socket to acp-host, its signalfd, and the write end of the one live watchdog's report
    // pipe (held until it reaps the watchdog).
    assert_eq!(others, ["anon_inode", "pipe", "socket"], "{files:?}");
    kill(Pid::from_raw(host.cast_signed()), Signal::SIGKILL).expect("SIGKILL acp-host");
    let out = wait_output(child);
    assert_eq!(out.status.signal(), Some(9));
    assert_all_dead(&[spawner, watchdog, agent], "below the SIGKILLed acp-host");
}

/// Whether this machine's C compiler has libgcc's static unwinder, which the build scripts link
/// into acp-host and acp-child when it does (`static_unwinder`).
fn static_unwinder_available() -> bool {
    Command::new("cc")
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .is_some_and(|path| Path::new(&path).is_absolute() && Path::new(&path).is_file())
}

fn maps_libgcc_s(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("the process is alive")
        .contains("libgcc_s")
}

/// Neither binary loads `libgcc_s.so.1` (whose constructor runs `cpuid` at every start): the
/// unwinder is linked in. Checked on running processes, where the dynamic loader has done its
/// work.
#[test]
fn neither_binary_loads_libgcc_s_when_the_static_unwinder_is_there() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) || !static_unwinder_available() {
        #[expect(clippy::print_stderr, reason = "a skipped test says why")]
        {
            eprintln!("skipped: no libgcc_eh.a here, so the binaries link libgcc_s as before");
        }
        return;
    }
    let dir = temp();
    let ready = dir.path().join("ready");
    let host = acp_tests::spawn_until_ready(
        acp_tests::host_run(dir.path()).args([
            "--agent",
            &mock(&["hang", "--ready", path_str(&ready)]),
            "x",
        ]),
        &ready,
        "the mock",
    );
    let mut child = Command::new(bin("acp-child"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acp-child starts");
    // acp-child is up once it answers: the loader is long done by then.
    let mut stdin = child.stdin.take().expect("stdin piped");
    let lines = acp_tests::line_channel(child.stdout.take().expect("stdout piped"));
    std::io::Write::write_all(
        &mut stdin,
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n",
    )
    .unwrap();
    lines
        .recv_timeout(HANG_GUARD)
        .expect("acp-child answers initialize");
    let (host_maps, child_maps) = (maps_libgcc_s(host.id()), maps_libgcc_s(child.id()));
    // Both end as users end them: acp-host on SIGTERM (it tears its agent down), acp-child on EOF.
    kill(
        Pid::from_raw(host.id().try_into().unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let _ = wait_output(host);
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert!(!host_maps, "acp-host loaded libgcc_s");
    assert!(!child_maps, "acp-child loaded libgcc_s");
}
