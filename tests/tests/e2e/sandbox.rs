//! Containment through the real binaries: an agent started under `--sandbox` / `--network` is
//! confined by the kernel (Landlock, seccomp), its whole tree with it, and its record says what
//! held.
//!
//! Each test's agent is a shell that tries what a sandbox must stop (and what it must allow),
//! writes one line per try into `probe.txt` in its working directory, then becomes the mock
//! agent, so the run completes as any other. Each test has a home of its own (`HOME`) with a
//! planted key, and a state folder of its own with another session's file.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use acp_tests::{bin, code, processes_in, run_to_end, stderr};
use serde_json::Value;

use acp_tests::mock_llm::{MockLlm, Reply};

use crate::common::{json_run, mock, result_record, temp};

/// A test's folders: the agent's working directory, a home with a key, a state folder with
/// another session's file, and a folder outside all of them.
struct Scene {
    _dir: tempfile::TempDir,
    work: PathBuf,
    home: PathBuf,
    state: PathBuf,
    outside: PathBuf,
    /// Whether acp-host is told to confine by Landlock alone (`ACP_HOST_SANDBOX_NAMESPACES=0`:
    /// the walk around the denied paths) rather than decide (masks in the agent's own
    /// namespaces, where the machine allows them).
    walk: bool,
}

fn scene() -> Scene {
    scene_in(false)
}

/// Both ways a sandbox keeps the denied paths out: as acp-host decides here, then by Landlock
/// alone.
fn both_ways() -> [Scene; 2] {
    [scene_in(false), scene_in(true)]
}

fn scene_in(walk: bool) -> Scene {
    let dir = temp();
    let root = dir.path().canonicalize().unwrap();
    let [work, home, state, outside] =
        ["work", "home", "state", "outside"].map(|name| root.join(name));
    for folder in [
        &work,
        &outside,
        &home.join(".ssh"),
        &state.join("acp-child/sessions"),
    ] {
        std::fs::create_dir_all(folder).unwrap();
    }
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").unwrap();
    std::fs::write(
        state.join("acp-child/sessions/other-session.jsonl"),
        "SOMEONE ELSE'S SESSION\n",
    )
    .unwrap();
    Scene {
        _dir: dir,
        work,
        home,
        state,
        outside,
        walk,
    }
}

impl Scene {
    /// `acp-host SUBCOMMAND` with this scene's home and state, in its working directory.
    fn host(&self, subcommand: &str) -> Command {
        let mut cmd = self.command(&bin("acp-host"));
        cmd.arg(subcommand);
        cmd
    }

    /// `program` with this scene's home and state, in its working directory.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.work)
            .env("HOME", &self.home)
            .env(protocol::env_vars::XDG_STATE_HOME, &self.state)
            .env_remove(protocol::env_vars::ACP_HOST_SANDBOX)
            .env_remove(protocol::env_vars::ACP_HOST_DEPTH)
            .env_remove(protocol::env_vars::ACP_HOST_MAX_DEPTH)
            .env_remove("ACP_HOST_LOG");
        if self.walk {
            cmd.env(protocol::env_vars::ACP_HOST_SANDBOX_NAMESPACES, "0");
        } else {
            cmd.env_remove(protocol::env_vars::ACP_HOST_SANDBOX_NAMESPACES);
        }
        cmd
    }

    /// `acp-host run --json FLAGS --agent AGENT hi`, which must complete: its result record.
    fn run(&self, flags: &[&str], agent: &str) -> Value {
        let out = run_to_end(
            self.host("run")
                .arg("--json")
                .args(flags)
                .args(["--agent", agent, "hi"]),
        );
        assert_eq!(
            code(&out),
            0,
            "walk={} {}\n{}",
            self.walk,
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
        result_record(&out)
    }

    /// The probe's lines, as the agent wrote them.
    fn probe(&self) -> String {
        std::fs::read_to_string(self.work.join("probe.txt")).unwrap_or_default()
    }
}

/// An agent that runs `tries` (`name: shell command` each; the line says `ok` when the command
/// succeeded, `denied` when it failed), writing `probe.txt` in its working directory, then
/// becomes the mock agent (`hello`).
pub(crate) fn prober(tries: &[(&str, String)]) -> String {
    let mut script = String::from("{\n");
    for (name, command) in tries {
        let _ = writeln!(
            script,
            "if ( {command} ) >/dev/null 2>&1; then echo '{name}: ok'; else echo '{name}: denied'; fi"
        );
    }
    script.push_str("} > probe.txt\nexec ");
    script.push_str(&mock(&["hello"]));
    shell_words::join(["bash", "-c", &script])
}

fn quote(path: &Path) -> String {
    shell_words::quote(&path.display().to_string()).into_owned()
}

/// The tries every file test makes, against `scene`'s folders.
fn file_tries(scene: &Scene) -> Vec<(&'static str, String)> {
    let outside = quote(&scene.outside.join("written"));
    let escapee = quote(&scene.outside.join("by-escapee"));
    vec![
        ("write inside", "echo x > inside.txt".to_owned()),
        ("write outside", format!("echo x > {outside}")),
        ("write temp", "f=$(mktemp) && rm \"$f\"".to_owned()),
        (
            "read key",
            format!("cat {}", quote(&scene.home.join(".ssh/id_ed25519"))),
        ),
        (
            "read other session",
            format!(
                "cat {}",
                quote(&scene.state.join("acp-child/sessions/other-session.jsonl"))
            ),
        ),
        ("read system", "cat /etc/passwd".to_owned()),
        // Folders that hold a denied path stay listable (what they hold is not readable).
        ("list folders", "ls / \"$HOME\" \"$HOME/.ssh\"".to_owned()),
        (
            "escapee writes outside",
            format!("setsid bash -c 'echo y > {escapee}'"),
        ),
    ]
}

/// The lines of [`file_tries`] under `workspace-write`.
const CONFINED: &str = "write inside: ok\nwrite outside: denied\nwrite temp: ok\nread key: denied\n\
                        read other session: denied\nread system: ok\nlist folders: ok\n\
                        escapee writes outside: denied\n";

#[test]
fn a_workspace_write_agent_writes_only_inside_and_reads_no_credentials() {
    for scene in both_ways() {
        a_workspace_write_agent_in(&scene);
    }
}

fn a_workspace_write_agent_in(scene: &Scene) {
    let mut tries = file_tries(scene);
    tries.push(("new user namespace", "unshare -U true".to_owned()));
    // A copy of the home's mount (`open_tree`) would hold the key without what hides it.
    tries.push((
        "key through a copied mount",
        format!(
            "python3 -c 'import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); \
             fd = libc.syscall(428, -100, {home}, 1); sys.exit(1) if fd < 0 else \
             print(os.read(os.open(\".ssh/id_ed25519\", os.O_RDONLY, dir_fd=fd), 99))'",
            home = shell_words::quote(&format!("b{:?}", scene.home.display().to_string()))
        ),
    ));
    let out = run_to_end(scene.host("run").args([
        "--json",
        "--sandbox",
        "workspace-write",
        "--agent",
        &prober(&tries),
        "hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        scene.probe(),
        format!("{CONFINED}new user namespace: denied\nkey through a copied mount: denied\n")
    );
    // Still its job inside: the answer, and the file it wrote where it works.
    let result = result_record(&out);
    assert_eq!(result["output"], "hello from acp child");
    assert!(scene.work.join("inside.txt").is_file());
    assert_eq!(std::fs::read_dir(&scene.outside).unwrap().count(), 0);
    let sandbox = &result["sandbox"];
    assert_eq!(sandbox["mode"], "workspace-write");
    assert_eq!(sandbox["network"], "on");
    assert_eq!(sandbox["enforced"], "full");
    assert!(sandbox["abi"].as_u64().unwrap() >= 6, "{sandbox}");
    let listed = |key: &str, path: &Path| {
        sandbox[key].as_array().unwrap().iter().any(|entry| {
            entry
                .as_str()
                .unwrap()
                .starts_with(&path.display().to_string())
        })
    };
    assert!(listed("writable", &scene.work), "{sandbox}");
    assert!(listed("denied", &scene.home.join(".ssh")), "{sandbox}");
    assert!(
        listed("denied", &scene.state.join("acp-child/sessions")),
        "{sandbox}"
    );
    // The agent's own temporary folder went with the run.
    // (a folder made for it on disk, or a tmpfs of its own namespace: nothing on disk).
    let temp = sandbox["writable"][1].as_str().unwrap();
    let in_namespace = Path::new(temp) == scene.state.join("acp-host/tmp");
    assert!(
        (in_namespace && !scene.walk) || temp.contains("acp-sandbox-"),
        "{sandbox}"
    );
    assert!(!Path::new(temp).exists());
    assert!(processes_in(&scene.work).is_empty());
}

#[test]
fn read_only_writes_nothing_but_its_temporary_folder_and_off_is_unconfined() {
    let scene = scene();
    let tries = file_tries(&scene);
    let result = scene.run(&["--sandbox", "read-only"], &prober(&tries));
    assert_eq!(result["sandbox"]["mode"], "read-only");
    // The probe itself cannot be written in its working directory: the run still completes.
    assert_eq!(scene.probe(), "");
    assert_eq!(result["output"], "hello from acp child");

    // The same agent without a sandbox does everything (the tries are real), and the record
    // has no `sandbox`.
    let result = scene.run(&[], &prober(&tries));
    assert_eq!(result.get("sandbox"), None);
    assert_eq!(
        scene.probe(),
        "write inside: ok\nwrite outside: ok\nwrite temp: ok\nread key: ok\n\
         read other session: ok\nread system: ok\nlist folders: ok\nescapee writes outside: ok\n"
    );
}

#[test]
fn git_stays_read_only_unless_asked_and_new_files_still_go_anywhere_else() {
    // With namespaces (the walk cannot make new files at a root's top level, the probe's own).
    let scene = &scene();
    std::fs::create_dir(scene.work.join(".git")).unwrap();
    std::fs::write(scene.work.join(".git/config"), "[core]\n").unwrap();
    std::fs::create_dir(scene.work.join("src")).unwrap();
    let tries = [
        ("git config", "echo hook >> .git/config".to_owned()),
        (
            "git hook",
            "mkdir -p .git/hooks && echo x > .git/hooks/pre-commit".to_owned(),
        ),
        ("new top-level file", "echo x > NEW.md".to_owned()),
        ("new nested file", "echo x > src/new.rs".to_owned()),
        (
            "remount it writable",
            "mount -o remount,bind,rw .git && echo x >> .git/config".to_owned(),
        ),
        // mount_setattr(AT_FDCWD, ".git", AT_RECURSIVE, {clear MOUNT_ATTR_RDONLY}).
        (
            "clear its read-only flag",
            "python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); \
             attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0); \
             sys.exit(libc.syscall(442, -100, b\".git\", 0x8000, attr, 32) != 0)' \
             && echo x >> .git/config"
                .to_owned(),
        ),
    ];
    let result = scene.run(&["--sandbox", "workspace-write"], &prober(&tries));
    assert_eq!(
        scene.probe(),
        "git config: denied\ngit hook: denied\nnew top-level file: ok\nnew nested file: ok\n\
         remount it writable: denied\nclear its read-only flag: denied\n"
    );
    assert_eq!(
        std::fs::read_to_string(scene.work.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert_eq!(
        result["sandbox"]["readOnly"],
        serde_json::json!([scene.work.join(".git").display().to_string()])
    );

    scene.run(
        &["--sandbox", "workspace-write", "--sandbox-write-git"],
        &prober(&tries),
    );
    assert_eq!(
        scene.probe(),
        "git config: ok\ngit hook: ok\nnew top-level file: ok\nnew nested file: ok\n\
         remount it writable: denied\nclear its read-only flag: denied\n"
    );
}

#[test]
fn network_off_refuses_tcp_and_udp_and_tcp_port_allows_that_port_only() {
    let scene = scene();
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = |listener: &TcpListener| listener.local_addr().unwrap().port();
    let connect = |port: u16| format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
    let tries = [
        ("allowed port", connect(port(&allowed))),
        ("other port", connect(port(&other))),
        (
            "udp",
            "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'"
                .to_owned(),
        ),
    ];
    let run = |network: &str| scene.run(&["--network", network], &prober(&tries));
    let result = run("off");
    assert_eq!(
        scene.probe(),
        "allowed port: denied\nother port: denied\nudp: denied\n"
    );
    assert_eq!(result["sandbox"]["network"], "off");
    // Files were not asked about: nothing is denied there.
    assert_eq!(result["sandbox"]["mode"], "off");
    assert_eq!(result["sandbox"]["denied"], serde_json::json!([]));

    let result = run(&format!("tcp:{}", port(&allowed)));
    assert_eq!(
        scene.probe(),
        "allowed port: ok\nother port: denied\nudp: denied\n"
    );
    assert_eq!(
        result["sandbox"]["network"],
        format!("tcp:{}", port(&allowed))
    );
    allowed.set_nonblocking(true).unwrap();
    assert!(allowed.accept().is_ok(), "the allowed port was reached");
    other.set_nonblocking(true).unwrap();
    assert!(other.accept().is_err(), "the other port was never reached");
}

#[test]
fn acp_childs_own_write_works_inside_a_workspace_write_sandbox() {
    let scene = scene();
    let (_, result) = json_run(
        scene.host("run").args([
            "--json",
            "--sandbox",
            "workspace-write",
            "--network",
            "off",
            "--permission",
            "allow",
            "/write notes.txt hello",
        ]),
        0,
    );
    assert_eq!(result["status"], "completed");
    assert_eq!(result["sandbox"]["enforced"], "full");
    assert_eq!(
        std::fs::read_to_string(scene.work.join("notes.txt")).unwrap(),
        "hello"
    );
}

#[test]
fn a_child_of_a_sandboxed_agent_is_at_least_as_confined_whatever_it_asks() {
    let scene = scene();
    let tries = file_tries(&scene);
    // The sandboxed agent is itself acp-host, asking for no sandbox for its own agent.
    let inner = shell_words::join([
        bin("acp-host").display().to_string().as_str(),
        "run",
        "--json",
        "--sandbox",
        "off",
        "--agent",
        &prober(&tries),
        "hi",
    ]);
    let script = format!("{inner} > inner.json; exec {}", mock(&["hello"]));
    let result = scene.run(
        &["--sandbox", "workspace-write"],
        &shell_words::join(["bash", "-c", &script]),
    );
    assert_eq!(result["sandbox"]["enforced"], "full");
    let inner = std::fs::read_to_string(scene.work.join("inner.json")).unwrap();
    let inner: Value = serde_json::from_str(inner.lines().last().unwrap()).unwrap();
    // The inner run's settings say what the kernel holds anyway.
    assert_eq!(inner["sandbox"]["mode"], "workspace-write", "{inner}");
    assert_eq!(scene.probe(), CONFINED);
}

#[test]
fn without_landlock_a_sandboxed_run_refuses_before_starting_and_best_effort_says_what_did_not_hold()
{
    let scene = scene();
    let sentinel = scene.work.join("started");
    let agent = shell_words::join([
        "sh",
        "-c",
        &format!("touch {}; exec {}", quote(&sentinel), mock(&["hello"])),
    ]);
    let host = |extra: &[&str]| {
        let mut cmd = scene.command(&bin("no-landlock"));
        cmd.arg(bin("acp-host"))
            .args([
                "run",
                "--json",
                "--sandbox",
                "workspace-write",
                "--agent",
                &agent,
            ])
            .args(extra)
            .arg("hi");
        cmd
    };
    let (_, result) = json_run(&mut host(&[]), 1);
    assert_eq!(result["errorKind"], "sandbox");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "the sandbox cannot be enforced on this machine: file access limits (needs Landlock, \
             which this kernel does not offer)"
        ),
        "{error}"
    );
    assert!(error.contains("--sandbox-best-effort"), "{error}");
    assert_eq!(result["agentExit"]["endedBy"], "not-spawned");
    assert!(!sentinel.exists(), "nothing started");

    let (_, result) = json_run(&mut host(&["--sandbox-best-effort"]), 0);
    assert!(sentinel.exists());
    let sandbox = &result["sandbox"];
    assert_eq!(sandbox["enforced"], "partial", "{sandbox}");
    assert_eq!(sandbox["abi"], Value::Null);
    assert_eq!(sandbox["denied"], serde_json::json!([]));
    assert!(
        sandbox["notEnforced"][0]
            .as_str()
            .unwrap()
            .starts_with("file access limits"),
        "{sandbox}"
    );
}

#[test]
fn verbose_says_what_the_sandbox_holds_and_a_bad_setting_is_a_usage_error() {
    let scene = scene();
    let out = run_to_end(scene.host("run").args([
        "-v",
        "--sandbox",
        "read-only",
        "--network",
        "tcp:443",
        "--agent",
        &mock(&["hello"]),
        "hi",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().any(|line| line
            .starts_with("acp-host: sandbox read-only, network tcp:443, Landlock ABI ")
            && line.ends_with("enforced in full")),
        "{err}"
    );

    for (flag, value, message) in [
        (
            "--sandbox",
            "sealed",
            "unknown sandbox mode \"sealed\": use off, read-only or workspace-write",
        ),
        ("--network", "udp:53", "unknown network setting \"udp:53\""),
    ] {
        let out = run_to_end(scene.host("run").args([flag, value, "hi"]));
        assert_eq!(code(&out), 2);
        assert!(stderr(&out).contains(message), "{}", stderr(&out));
    }
    let out = run_to_end(scene.host("run").args(["--sandbox-write", "out", "hi"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("--sandbox-write needs --sandbox workspace-write"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn batch_takes_the_flag_and_a_line_only_tightens_it() {
    let scene = scene();
    let tries = [("write inside", "echo x > inside.txt".to_owned())];
    let agent = prober(&tries);
    let input = scene.work.join("lines.ndjson");
    std::fs::write(
        &input,
        format!(
            "{}\n{}\n",
            serde_json::json!({"id": "loose", "prompt": "hi", "agent": agent, "sandbox": "off", "cwd": "a"}),
            serde_json::json!({"id": "tight", "prompt": "hi", "agent": agent, "sandbox": "read-only", "network": "off", "cwd": "b"}),
        ),
    )
    .unwrap();
    for sub in ["a", "b"] {
        std::fs::create_dir(scene.work.join(sub)).unwrap();
    }
    let out = run_to_end(scene.host("batch").args([
        "--sandbox",
        "workspace-write",
        "--jobs",
        "1",
        input.to_str().unwrap(),
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records: Vec<Value> = acp_tests::stdout(&out)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let sandbox_of = |id: &str| {
        records
            .iter()
            .find(|record| record["id"] == id)
            .map(|record| record["sandbox"].clone())
            .unwrap()
    };
    assert_eq!(sandbox_of("loose")["mode"], "workspace-write");
    assert_eq!(sandbox_of("tight")["mode"], "read-only");
    assert_eq!(sandbox_of("tight")["network"], "off");
    let probe = |sub: &str| std::fs::read_to_string(scene.work.join(sub).join("probe.txt")).ok();
    assert_eq!(probe("a").as_deref(), Some("write inside: ok\n"));
    assert_eq!(probe("b"), None);
}

#[test]
fn a_definition_only_tightens_the_sandbox_and_its_approval_names_it() {
    let scene = scene();
    let tries = file_tries(&scene);
    let definition = |name: &str, run: &str| {
        let agent = serde_json::to_string(&prober(&tries)).unwrap();
        let folder = scene.work.join("subagents");
        std::fs::create_dir_all(&folder).unwrap();
        let file = folder.join(format!("{name}.md"));
        std::fs::write(
            &file,
            format!("---\ndescription: d\nrun: {{agent: {agent}, {run}}}\n---\nBody.\n"),
        )
        .unwrap();
        file.canonicalize().unwrap()
    };
    let loose = definition("loose", "sandbox: off, network: on");
    let tight = definition("tight", "sandbox: read-only, network: \"off\"");

    // A repository definition asks first, and says which sandbox it would run in.
    let out = run_to_end(scene.host("run").args([
        "--sandbox",
        "workspace-write",
        "--subagent",
        "loose",
        "hi",
    ]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains(" in sandbox workspace-write, network on: "),
        "{}",
        stderr(&out)
    );
    for file in [&loose, &tight] {
        acp_tests::approve_definition_in(file, &scene.state);
    }

    // `sandbox: off` under the person's workspace-write stays workspace-write.
    let (_, result) = json_run(
        scene.host("run").args([
            "--json",
            "--sandbox",
            "workspace-write",
            "--subagent",
            "loose",
            "hi",
        ]),
        0,
    );
    assert_eq!(result["sandbox"]["mode"], "workspace-write");
    assert_eq!(scene.probe(), CONFINED);

    // A stricter definition tightens a run that asked for none.
    let (_, result) = json_run(
        scene
            .host("run")
            .args(["--json", "--subagent", "tight", "hi"]),
        0,
    );
    assert_eq!(result["sandbox"]["mode"], "read-only");
    assert_eq!(result["sandbox"]["network"], "off");
}

#[test]
fn acp_childs_subagents_run_in_its_subagent_sandbox() {
    let scene = scene();
    let defs = temp();
    let agent = serde_json::to_string(&prober(&file_tries(&scene))).unwrap();
    std::fs::write(
        defs.path().join("probe.md"),
        format!("---\ndescription: probes\nrun: {{agent: {agent}}}\n---\nProbe.\n"),
    )
    .unwrap();
    let parent = shell_words::join([
        bin("acp-child").display().to_string().as_str(),
        "--subagent-sandbox",
        "workspace-write",
        "--subagents",
        defs.path().to_str().unwrap(),
    ]);
    let (_, result) = json_run(
        scene
            .host("run")
            .args(["--json", "--agent", &parent, "/delegate probe go"]),
        0,
    );
    assert_eq!(result["status"], "completed");
    // The parent itself ran unconfined; its child did not.
    assert_eq!(result.get("sandbox"), None);
    assert_eq!(scene.probe(), CONFINED);
}

#[test]
fn a_credential_folder_behind_a_link_is_denied_where_it_really_is() {
    for scene in both_ways() {
        a_credential_folder_behind_a_link_in(&scene);
    }
}

fn a_credential_folder_behind_a_link_in(scene: &Scene) {
    // A dotfile manager's ~/.config: a link to a folder elsewhere.
    let real = scene.outside.join("dotfiles/config");
    std::fs::create_dir_all(real.join("gcloud")).unwrap();
    std::fs::write(real.join("gcloud/credentials.db"), "TOKEN\n").unwrap();
    std::fs::write(real.join("settings.ini"), "ok\n").unwrap();
    std::os::unix::fs::symlink(&real, scene.home.join(".config")).unwrap();
    let tries = [
        (
            "through the link",
            "cat \"$HOME/.config/gcloud/credentials.db\"".to_owned(),
        ),
        (
            "where it is",
            format!("cat {}", quote(&real.join("gcloud/credentials.db"))),
        ),
        ("beside it", "cat \"$HOME/.config/settings.ini\"".to_owned()),
    ];
    let result = scene.run(&["--sandbox", "workspace-write"], &prober(&tries));
    assert_eq!(
        scene.probe(),
        "through the link: denied\nwhere it is: denied\nbeside it: ok\n"
    );
    // Masks follow the link themselves; the walk lists where the folder really is.
    let denied = result["sandbox"]["denied"].to_string();
    assert_eq!(
        denied.contains(&real.join("gcloud").display().to_string()),
        scene.walk,
        "{denied}"
    );
}

#[test]
fn without_user_namespaces_the_walk_confines_alike_and_forcing_them_fails_naming_the_way_out() {
    let scene = scene();
    let tries = file_tries(&scene);
    let host = |force: bool| {
        let mut cmd = scene.command(&bin("no-landlock"));
        cmd.arg("--no-namespaces").arg(bin("acp-host")).args([
            "run",
            "--json",
            "--sandbox",
            "workspace-write",
            "--agent",
            &prober(&tries),
            "hi",
        ]);
        if force {
            cmd.env(protocol::env_vars::ACP_HOST_SANDBOX_NAMESPACES, "1");
        }
        cmd
    };
    // A filter above acp-host (a container's): it confines by Landlock alone, as tightly.
    let (_, result) = json_run(&mut host(false), 0);
    assert_eq!(result["sandbox"]["enforced"], "full");
    assert_eq!(scene.probe(), CONFINED);

    std::fs::remove_file(scene.work.join("probe.txt")).unwrap();
    let (_, result) = json_run(&mut host(true), 1);
    assert_eq!(result["errorKind"], "sandbox");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.starts_with("could not put agent bash into its sandbox"),
        "{error}"
    );
    assert!(error.contains("ACP_HOST_SANDBOX_NAMESPACES=0"), "{error}");
    assert_eq!(scene.probe(), "", "nothing of the agent ran");
    assert!(processes_in(&scene.work).is_empty());
}

#[test]
fn a_sandboxed_acp_child_keeps_its_session_and_resumes_it() {
    for scene in both_ways() {
        let llm = MockLlm::start(vec![Reply::text(["first"]), Reply::text(["second"])]);
        let agent = shell_words::join([
            bin("acp-child").display().to_string().as_str(),
            "--model",
            "mock-model",
            "--base-url",
            &llm.base_url(),
        ]);
        let sessions = scene.state.join("acp-child/sessions");
        let first = scene.run(&["--sandbox", "workspace-write"], &agent);
        let session = first["sessionId"].as_str().unwrap().to_owned();
        // The session is in the store once the run is over, and nothing else was left there.
        let file = sessions.join(format!("{session}.jsonl"));
        assert!(file.is_file(), "{}", file.display());
        let mut left: Vec<String> = std::fs::read_dir(&sessions)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut expected = vec![
            ".runs".to_owned(),
            "other-session.jsonl".to_owned(),
            format!("{session}.jsonl"),
        ];
        expected.retain(|name| name != ".runs" || !scene.walk);
        assert_eq!(left, expected);
        if !scene.walk {
            assert_eq!(
                std::fs::read_dir(sessions.join(".runs")).unwrap().count(),
                0
            );
        }

        let second = scene.run(
            &["--sandbox", "workspace-write", "--resume", &session],
            &agent,
        );
        assert_eq!(second["output"], "second");
        let requests = llm.requests();
        assert_eq!(requests.len(), 2);
        assert!(
            requests[1]
                .messages()
                .iter()
                .any(|message| message["content"] == "first"),
            "the resumed turn carries the first: {:?}",
            requests[1].messages()
        );
        assert!(std::fs::read_to_string(&file).unwrap().contains("second"));
        assert_eq!(
            std::fs::read_to_string(sessions.join("other-session.jsonl")).unwrap(),
            "SOMEONE ELSE'S SESSION\n"
        );
    }
}

#[test]
fn what_a_dead_host_left_in_the_store_is_taken_back_by_the_next_sandboxed_start() {
    let scene = scene();
    let sessions = scene.state.join("acp-child/sessions");
    let left = sessions.join(".runs/1-1");
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(
        left.join("orphan.jsonl"),
        "A SESSION OF A RUN WHOSE HOST DIED\n",
    )
    .unwrap();
    // Left a minute ago (a folder made just now may be a start's that has not locked it yet).
    let minute_ago = std::time::SystemTime::now() - std::time::Duration::from_mins(1);
    std::fs::File::open(&left)
        .unwrap()
        .set_modified(minute_ago)
        .unwrap();
    let mut cmd = scene.host("run");
    cmd.env(protocol::env_vars::ACP_HOST_SANDBOX_NAMESPACES, "1")
        .args([
            "--json",
            "--sandbox",
            "read-only",
            "--agent",
            &mock(&["hello"]),
            "hi",
        ]);
    json_run(&mut cmd, 0);
    assert_eq!(
        std::fs::read_to_string(sessions.join("orphan.jsonl")).unwrap(),
        "A SESSION OF A RUN WHOSE HOST DIED\n"
    );
    assert!(!left.exists());
}
