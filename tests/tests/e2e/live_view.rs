//! End-to-end: `acp-host run --progress`, the live view of the children acp-child runs. On a
//! terminal (a tmux pane) the tree shows three children running with their last line, then
//! completed, one line each; with stderr a pipe (auto) it is one plain line per change of state
//! and no escape code, a child's final line with what it spent; a question to the person shows the
//! child awaiting approval; `--progress off` shows none of it.

use std::path::Path;
use std::process::{Command, Stdio};

use acp_tests::mock_llm::{MockLlm, Reply, Usage};
use acp_tests::{code, stderr, stdout};
use serde_json::json;

use super::children::{assert_none_left, keyed_llm, mock_definition, model_parent, offline_parent};

/// The children of the tests: mock agents whose answer waits for `<dir>/go`.
const CHILDREN: [&str; 3] = ["gate-a", "gate-b", "gate-c"];

/// One model reply calling subagent `name` for each of `names`, all in the same response.
fn calls(names: &[&str]) -> Reply {
    let calls: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            json!({"index": index, "id": format!("call_{index}"), "type": "function",
                "function": {"name": "subagent",
                    "arguments": json!({"agent": name, "prompt": "wait"}).to_string()}})
        })
        .collect();
    Reply::Events(vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": calls}, "finish_reason": null}]})
            .to_string(),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        "[DONE]".to_owned(),
    ])
}

/// A parent acp-child on a mock model whose first reply starts the three gated children, and the
/// model; the children's definitions written in `dir`.
fn three_children(dir: &Path, extra: &[&str]) -> (Command, MockLlm) {
    for name in CHILDREN {
        mock_definition(
            dir,
            name,
            &format!("gated-prompt --go {}", dir.join("go").display()),
        );
    }
    let llm = keyed_llm([calls(&CHILDREN), Reply::text(["all done"])]);
    let mut cmd = model_parent(dir, &llm, false, &["--child-idle-timeout", "0"]);
    cmd.args(extra).arg("go");
    (cmd, llm)
}

/// `cmd` as one line of `sh`: its environment changes, program and arguments.
fn shell_line(cmd: &Command) -> String {
    let mut words = vec!["env".to_owned()];
    for (name, value) in cmd.get_envs() {
        let name = name.to_string_lossy().into_owned();
        match value {
            Some(value) => words.push(format!("{name}={}", value.to_string_lossy())),
            None => words.extend(["-u".to_owned(), name]),
        }
    }
    words.push(cmd.get_program().to_string_lossy().into_owned());
    words.extend(cmd.get_args().map(|arg| arg.to_string_lossy().into_owned()));
    shell_words::join(words)
}

/// Whether the pane's command wrote its exit status (the whole line) to `file`.
fn exited(file: &Path) -> bool {
    std::fs::read_to_string(file).is_ok_and(|code| code.ends_with('\n'))
}

/// A tmux server of the test's own (its socket in `dir`), killed when dropped.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    /// A tmux server in `dir` running `cmd` in `dir` in a 120x40 pane (its exit status then
    /// written to `<dir>/exit-code`); `None` (the test skipped) without tmux.
    #[expect(clippy::print_stderr, reason = "a skipped test says why")]
    fn start(dir: &Path, cmd: &Command) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            eprintln!("skipped: tmux is not installed");
            return None;
        }
        let script = format!(
            "cd {} && {}; echo $? > {}; sleep 600",
            shell_words::quote(&dir.to_string_lossy()),
            shell_line(cmd),
            shell_words::quote(&dir.join("exit-code").to_string_lossy())
        );
        let tmux = Tmux {
            socket: dir.join("tmux.sock"),
        };
        let size = ["-x", "120", "-y", "40"];
        let started = tmux
            .command()
            .args(["-f", "/dev/null", "new-session", "-d", "-s", "live"])
            .args(size)
            .arg(script)
            .env("TERM", "xterm-256color")
            .status()
            .unwrap();
        assert!(started.success());
        let raw = dir.join("raw.txt");
        let _ = tmux
            .command()
            .args(["pipe-pane", "-t", "live", "-o"])
            .arg(format!(
                "cat >> {}",
                shell_words::quote(&raw.to_string_lossy())
            ))
            .status();
        Some(tmux)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.arg("-S").arg(&self.socket);
        cmd
    }

    fn pane(&self) -> String {
        let out = self
            .command()
            .args(["capture-pane", "-p", "-t", "live"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the pane satisfies `condition`; the pane as last seen.
    fn until(&self, what: &str, mut condition: impl FnMut(&str) -> bool) -> String {
        let mut pane = String::new();
        let seen = acp_tests::wait_until(acp_tests::HANG_GUARD, || {
            pane = self.pane();
            condition(&pane)
        });
        let raw = std::fs::read(self.socket.with_file_name("raw.txt")).unwrap_or_default();
        assert!(
            seen,
            "the pane never showed {what}:\n{pane}\nraw: {:?}",
            String::from_utf8_lossy(&raw)
        );
        pane
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").status();
    }
}

#[test]
fn on_a_terminal_the_tree_shows_three_children_running_then_completed_on_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let (cmd, llm) = three_children(dir.path(), &[]);
    let done = dir.path().join("exit-code");
    let Some(tmux) = Tmux::start(dir.path(), &cmd) else {
        return;
    };
    let running = |pane: &str| {
        CHILDREN.iter().all(|name| {
            pane.lines()
                .any(|line| line.starts_with(&format!("{name} running ")))
        })
    };
    let pane = tmux.until("three children running", |pane| {
        running(pane) && pane.matches("  > waiting for go").count() == 3
    });
    assert!(!pane.contains("completed"), "{pane}");
    std::fs::write(dir.path().join("go"), "").unwrap();
    let pane = tmux.until("three children completed", |pane| {
        exited(&done) && pane.contains("all done")
    });
    assert_eq!(
        std::fs::read_to_string(&done).unwrap().trim(),
        "0",
        "{pane}"
    );
    // Collapsed: one line each, no last line under them, nothing still running.
    for name in CHILDREN {
        let line = pane
            .lines()
            .find(|line| line.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no line of {name}:\n{pane}"));
        assert!(line.starts_with(&format!("{name} completed ")), "{pane}");
    }
    assert!(
        !pane.contains("  > ") && !pane.contains("running"),
        "{pane}"
    );
    assert_eq!(llm.requests().len(), 2);
    drop(tmux);
    assert_none_left(dir.path());
}

#[test]
fn on_a_terminal_a_grandchild_and_its_child_are_shown_under_their_parents() {
    let dir = tempfile::tempdir().unwrap();
    // acp-child, a definition the children find in the session's folder too.
    super::children::write_approved(
        &dir.path().join("subagents"),
        "leaf.md",
        "---\ndescription: an acp-child\nrun: {}\n---\nDo as told.\n",
    );
    let gate = format!("gated-prompt --go {}", dir.path().join("go").display());
    mock_definition(dir.path(), "gate", &gate);
    let mut cmd = offline_parent(dir.path(), &[]);
    cmd.args([
        "--max-depth",
        "3",
        "/delegate leaf /delegate leaf /delegate gate go",
    ]);
    let done = dir.path().join("exit-code");
    let Some(tmux) = Tmux::start(dir.path(), &cmd) else {
        return;
    };
    let starts = |pane: &str, line: &str| pane.lines().any(|seen| seen.starts_with(line));
    let pane = tmux.until("three levels running", |pane| {
        starts(pane, "leaf running ")
            && starts(pane, "  leaf running ")
            && starts(pane, "    gate running ")
            && starts(pane, "      > waiting for go")
    });
    assert!(!pane.contains("completed"), "{pane}");
    std::fs::write(dir.path().join("go"), "").unwrap();
    let pane = tmux.until("three levels completed", |pane| {
        exited(&done)
            && starts(pane, "leaf completed ")
            && starts(pane, "  leaf completed ")
            && starts(pane, "    gate completed ")
    });
    assert_eq!(
        std::fs::read_to_string(&done).unwrap().trim(),
        "0",
        "{pane}"
    );
    assert!(pane.contains("released"), "{pane}");
    assert!(
        !pane.contains("  > ") && !pane.contains("running"),
        "{pane}"
    );
    drop(tmux);
    assert_none_left(dir.path());
}

#[test]
fn a_child_whose_question_waits_for_the_person_is_awaiting_approval_until_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = offline_parent(dir.path(), &[]);
    cmd.args([
        "--permission",
        "ask",
        "/delegate acp-child /write notes.txt from the child",
    ]);
    let done = dir.path().join("exit-code");
    let Some(tmux) = Tmux::start(dir.path(), &cmd) else {
        return;
    };
    let pane = tmux.until("the question", |pane| pane.contains("? [y/N]"));
    assert!(
        pane.contains("acp-host: child acp-child (sub-1): awaiting approval"),
        "{pane}"
    );
    let typed = tmux
        .command()
        .args(["send-keys", "-t", "live", "y", "Enter"])
        .status()
        .unwrap();
    assert!(typed.success());
    let pane = tmux.until("the child completed", |pane| {
        exited(&done)
            && pane
                .lines()
                .any(|line| line.starts_with("acp-child completed "))
    });
    assert_eq!(
        std::fs::read_to_string(&done).unwrap().trim(),
        "0",
        "{pane}"
    );
    assert!(!pane.contains("  > "), "{pane}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "from the child"
    );
    drop(tmux);
    assert_none_left(dir.path());
}

#[test]
fn with_stderr_a_pipe_each_change_of_state_is_one_plain_line_and_no_escape_code() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, _llm) = three_children(dir.path(), &[]);
    std::fs::write(dir.path().join("go"), "").unwrap();
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!out.stderr.contains(&0x1b) && !out.stdout.contains(&0x1b));
    assert_eq!(stdout(&out), "all done");
    let err = stderr(&out);
    for name in CHILDREN {
        let lines: Vec<&str> = err
            .lines()
            .filter(|line| line.starts_with(&format!("acp-host: child {name}")))
            .collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert_eq!(lines[0], format!("acp-host: child {name}: queued"));
        assert!(lines[1].starts_with(&format!("acp-host: child {name} (sub-")));
        assert!(lines[1].ends_with("): running"), "{err}");
        assert!(lines[2].contains("): completed after "), "{err}");
    }
    assert_none_left(dir.path());
}

/// `text` with each duration (`after 12ms`, `after 1.2s`) as `after [time]`.
fn redact_times(text: &str) -> String {
    text.lines()
        .map(|line| match line.find(" after ") {
            Some(at) => {
                let rest = &line[at + " after ".len()..];
                let end = rest.find([',', ':']).unwrap_or(rest.len());
                format!("{} after [time]{}", &line[..at], &rest[end..])
            }
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn plain_lines_of_a_delegation_and_its_refused_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let out = offline_parent(dir.path(), &[])
        .args([
            "--progress",
            "plain",
            "/delegate acp-child /delegate acp-child /sleep 0",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    insta::assert_snapshot!(redact_times(&stderr(&out)));
    assert_none_left(dir.path());
}

#[test]
fn progress_off_shows_no_child() {
    let dir = tempfile::tempdir().unwrap();
    let out = offline_parent(dir.path(), &[])
        .args(["--progress", "off", "/delegate acp-child /sleep 0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "slept 0 s");
    assert_eq!(stderr(&out), "");
    assert_none_left(dir.path());
}

#[test]
fn a_childs_final_line_says_what_it_spent() {
    let dir = tempfile::tempdir().unwrap();
    let llm = MockLlm::builder()
        .require_key(Some(super::children::KEY))
        .reply(super::children::parallel_calls(&["hello"]))
        .reply_with_usage(Reply::text(["child done"]), Usage::new(1_200, 34))
        .reply(Reply::text(["all done"]))
        .start();
    let out = model_parent(dir.path(), &llm, true, &["--child-idle-timeout", "0"])
        .args(["--progress", "plain", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "all done");
    let err = stderr(&out);
    let last = err
        .lines()
        .rfind(|line| line.starts_with("acp-host: child acp-child (sub-1): "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(last.contains(": completed after "), "{err}");
    assert!(last.ends_with(", 1,234 tokens"), "{err}");
    assert_none_left(dir.path());
}
