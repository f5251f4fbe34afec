//! End-to-end: `isolation: worktree` through the real binaries, on real git repositories the
//! tests make: `acp-host run --worktree`, batch lines, `acp-host worktrees`, and what a killed
//! host leaves behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use acp_tests::{
    HANG_GUARD, bin, code, processes_in, read_pid, run_to_end, stderr, stdout, suite_state,
    wait_for_file, wait_until_dead,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::common::{json_run, mock, temp};
use super::run::{host, path_str};

/// `git` in `dir` with a fixed identity, none of the caller's git variables; its stdout.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_output(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        stderr(&out)
    );
    stdout(&out)
}

fn git_output(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .expect("git runs")
}

/// A repository at `<tmp>/repo` with `notes.txt` ("parent\n") and `sub/keep.txt` committed.
pub(crate) fn repository(tmp: &Path) -> PathBuf {
    let repo = tmp.join("repo");
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("notes.txt"), "parent\n").unwrap();
    std::fs::write(repo.join("sub/keep.txt"), "keep\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    repo
}

fn head(repo: &Path) -> String {
    git(repo, &["rev-parse", "HEAD"]).trim().to_owned()
}

/// The branches under `acp/`, sorted.
pub(crate) fn acp_branches(repo: &Path) -> Vec<String> {
    git(
        repo,
        &["branch", "--list", "acp/*", "--format=%(refname:short)"],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// The folders in `.acp-host/worktrees/`, sorted.
pub(crate) fn worktree_folders(repo: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(repo.join(".acp-host/worktrees")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn worktrees_cmd(repo: &Path, args: &[&str]) -> Output {
    run_to_end(
        Command::new(bin("acp-host"))
            .current_dir(repo)
            .env(protocol::env_vars::XDG_STATE_HOME, suite_state())
            .env_remove("ACP_HOST_LOG")
            .arg("worktrees")
            .args(args),
    )
}

fn listing(repo: &Path, args: &[&str]) -> Value {
    let out = worktrees_cmd(repo, args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let value: Value = serde_json::from_str(&stdout(&out)).unwrap();
    protocol::schema::check_keys(&protocol::schema::output("worktrees.json").unwrap(), &value)
        .unwrap();
    value
}

#[test]
fn run_worktree_commits_the_agent_s_change_on_its_branch_and_leaves_the_parent_tree_alone() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let base = head(&repo);
    // The parent's own uncommitted change: not carried in, said in the record.
    std::fs::write(repo.join("notes.txt"), "parent, edited\n").unwrap();
    let agent = mock(&["hello", "--write-file", "here.txt=child\n"]);
    let (_, result) = json_run(
        host(&repo).args([
            "--json",
            "--worktree=fix-login",
            "--cwd",
            "sub",
            "--agent",
            &agent,
            "Fix the login\nin detail",
        ]),
        0,
    );
    let root = repo.join(".acp-host/worktrees/fix-login");
    let worktree = &result["worktree"];
    let commit = worktree["commit"].as_str().unwrap().to_owned();
    assert_eq!(
        worktree,
        &serde_json::json!({
            "name": "fix-login",
            "path": path_str(&root),
            "branch": "acp/fix-login",
            "base": base,
            "commit": commit,
            "outcome": "committed",
            "parentDirty": true,
            "changedFiles": 1,
            "insertions": 1,
            "deletions": 0,
        })
    );
    // The agent worked in the same folder inside its worktree.
    assert_eq!(
        std::fs::read_to_string(root.join("sub/here.txt")).unwrap(),
        "child\n"
    );
    assert!(!repo.join("sub/here.txt").exists());
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "parent, edited\n"
    );
    // One commit on the branch, by acp-host, the prompt's first line as subject.
    assert_eq!(
        git(
            &repo,
            &[
                "log",
                "--format=%an <%ae>|%cn|%s",
                &format!("{base}..acp/fix-login")
            ]
        ),
        "acp-host <acp-host@localhost>|acp-host|Fix the login\n"
    );
    assert_eq!(git(&repo, &["rev-parse", "acp/fix-login"]).trim(), commit);
    assert_eq!(
        git(&repo, &["show", "acp/fix-login:sub/here.txt"]),
        "child\n"
    );
    assert_eq!(git(&repo, &["show", "acp/fix-login:notes.txt"]), "parent\n");
    // The parent's status shows its own change only; .acp-host/ is excluded, no tracked file
    // touched.
    assert_eq!(git(&repo, &["status", "--porcelain"]), " M notes.txt\n");
    let exclude = std::fs::read_to_string(repo.join(".git/info/exclude")).unwrap();
    assert!(exclude.ends_with("\n/.acp-host/\n"), "{exclude}");
    // Kept, settled (unlocked): listed as kept.
    let listed = listing(&repo, &["list", "--json"]);
    assert_eq!(
        listed["worktrees"],
        serde_json::json!([{
            "name": "fix-login",
            "path": path_str(&root),
            "branch": "acp/fix-login",
            "head": commit,
            "state": "kept",
        }])
    );
    // The same name again gets the next one.
    let (_, again) = json_run(
        host(&repo).args([
            "--json",
            "--worktree=fix-login",
            "--agent",
            &mock(&["hello", "--write-file", "x.txt=x"]),
            "again",
        ]),
        0,
    );
    assert_eq!(again["worktree"]["name"], "fix-login-2");
    assert_eq!(acp_branches(&repo), ["acp/fix-login", "acp/fix-login-2"]);
    // remove takes the folder and the branch.
    let out = worktrees_cmd(&repo, &["remove", "fix-login-2"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "removed worktree fix-login-2\n");
    assert_eq!(acp_branches(&repo), ["acp/fix-login"]);
    assert_eq!(worktree_folders(&repo), ["fix-login"]);
    assert!(processes_in(tmp.path()).is_empty());
}

#[test]
fn a_run_that_changed_nothing_leaves_no_worktree_and_no_branch() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let out = run_to_end(host(&repo).args(["--worktree", "--agent", &mock(&["hello"]), "say hi"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello from acp child");
    let said = stderr(&out);
    assert!(
        said.starts_with("acp-host: worktree say-hi-")
            && said.ends_with(": no changes, removed with its branch\n"),
        "{said}"
    );
    assert!(worktree_folders(&repo).is_empty());
    assert!(acp_branches(&repo).is_empty());
    assert_eq!(
        git(&repo, &["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
}

#[test]
fn a_worktree_that_cannot_be_made_ends_the_run_before_the_agent_starts() {
    let tmp = temp();
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let unborn = tmp.path().join("unborn");
    std::fs::create_dir(&unborn).unwrap();
    git(&unborn, &["init", "-q"]);
    let repo = repository(tmp.path());
    let with_modules = tmp.path().join("modules");
    std::fs::create_dir(&with_modules).unwrap();
    git(&with_modules, &["init", "-q"]);
    std::fs::write(with_modules.join(".gitmodules"), "").unwrap();
    git(&with_modules, &["add", "."]);
    git(&with_modules, &["commit", "-q", "-m", "m"]);
    let agent = mock(&["hello", "--record", path_str(&tmp.path().join("record"))]);
    for (dir, flags, says) in [
        (
            &plain,
            vec!["--worktree"],
            format!(
                "{} is not inside a git repository (a worktree needs one): fatal: not a git repository",
                plain.display()
            ),
        ),
        (
            &unborn,
            vec!["--worktree"],
            format!(
                "the repository at {} has no commit yet (unborn HEAD): commit once before asking for a worktree",
                unborn.display()
            ),
        ),
        (
            &with_modules,
            vec!["--worktree"],
            format!(
                "the repository at {} has submodules",
                with_modules.display()
            ),
        ),
        (
            &repo,
            vec!["--worktree=a/b"],
            "worktree name \"a/b\" has \"/\"".to_owned(),
        ),
        (
            &repo,
            vec!["--worktree", "--worktree-base", "nope"],
            format!(
                "--worktree-base nope: not a commit in {}: fatal:",
                repo.display()
            ),
        ),
    ] {
        let (_, result) = json_run(
            host(dir)
                .arg("--json")
                .args(&flags)
                .args(["--agent", &agent, "hi"]),
            1,
        );
        assert_eq!(result["errorKind"], "worktree", "{result}");
        let error = result["error"].as_str().unwrap();
        assert!(error.starts_with(&says), "{error}\nwanted: {says}");
        assert!(result.get("worktree").is_none());
    }
    assert!(!tmp.path().join("record").exists(), "no agent started");
    assert!(worktree_folders(&repo).is_empty());
    assert!(acp_branches(&repo).is_empty());
}

#[test]
fn a_cancelled_run_keeps_its_changes_and_a_killed_host_s_worktree_is_pruned() {
    let tmp = temp();
    let repo = repository(tmp.path());
    // Cancelled (SIGTERM) after writing: kept, uncommitted, said so.
    let ready = tmp.path().join("ready");
    let agent = mock(&[
        "hang",
        "--ready",
        path_str(&ready),
        "--write-file",
        "half.txt=half",
    ]);
    let child = host(&repo)
        .args(["--json", "--worktree=cancelled", "--agent", &agent, "go"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for_file(&ready, HANG_GUARD));
    kill(
        Pid::from_raw(i32::try_from(child.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let out = acp_tests::wait_output(child);
    assert_eq!(code(&out), 130, "{}", stderr(&out));
    let result = super::common::result_record(&out);
    assert_eq!(result["worktree"]["outcome"], "interrupted");
    assert_eq!(result["worktree"]["commit"], Value::Null);
    assert_eq!(result["worktree"]["changedFiles"], 1);
    let kept = repo.join(".acp-host/worktrees/cancelled");
    assert_eq!(
        std::fs::read_to_string(kept.join("half.txt")).unwrap(),
        "half"
    );

    // A SIGKILLed host: the watchdog ends the agent, the worktree stays locked as the run's.
    let ready = tmp.path().join("ready2");
    let pid_file = tmp.path().join("pid");
    let agent = mock(&[
        "hang",
        "--ready",
        path_str(&ready),
        "--pid-file",
        path_str(&pid_file),
    ]);
    let mut child = host(&repo)
        .args(["--worktree=crashed", "--agent", &agent, "go"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for_file(&ready, HANG_GUARD));
    let running = listing(&repo, &["--json"]);
    let states: Vec<(&str, &str)> = running["worktrees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["name"].as_str().unwrap(), w["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("cancelled", "kept"), ("crashed", "running")]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(wait_until_dead(read_pid(&pid_file).unwrap(), HANG_GUARD));
    let abandoned = listing(&repo, &["list", "--json"]);
    assert_eq!(abandoned["worktrees"][1]["state"], "abandoned");
    let out = worktrees_cmd(&repo, &["prune"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "removed worktree crashed (its run was killed; no changes)\n"
    );
    assert_eq!(worktree_folders(&repo), ["cancelled"]);
    assert_eq!(acp_branches(&repo), ["acp/cancelled"]);
    let out = worktrees_cmd(&repo, &["prune"]);
    assert_eq!(stdout(&out), "nothing to prune\n");
    // A kept worktree with changes is removed only when forced.
    let out = worktrees_cmd(&repo, &["remove", "cancelled"]);
    assert_eq!(code(&out), 1);
    assert_eq!(
        stderr(&out),
        "acp-host: error: worktree cancelled has uncommitted changes: commit them there, or pass --force to throw them away\n"
    );
    let out = worktrees_cmd(&repo, &["remove", "cancelled", "--force"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(worktree_folders(&repo).is_empty());
    assert!(acp_branches(&repo).is_empty());
    assert!(processes_in(tmp.path()).is_empty());
}

#[test]
fn a_batch_of_twenty_worktree_lines_gives_each_run_its_own_branch() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let base = head(&repo);
    let lines: Vec<String> = (1..=20)
        .map(|n| {
            // Lines 19 and 20 change nothing; the others write the same path, each its own text.
            let agent = if n > 18 {
                mock(&["hello"])
            } else {
                mock(&["hello", "--write-file", &format!("notes.txt=line {n}\n")])
            };
            let worktree = if n == 1 {
                Value::from("first")
            } else {
                Value::from(true)
            };
            serde_json::json!({
                "id": n.to_string(),
                "prompt": format!("job {n}"),
                "agent": agent,
                "cwd": path_str(&repo),
                "worktree": worktree,
            })
            .to_string()
        })
        .collect();
    std::fs::write(tmp.path().join("jobs.ndjson"), lines.join("\n") + "\n").unwrap();
    let out = run_to_end(
        super::batch::batch(tmp.path())
            .env(protocol::env_vars::XDG_STATE_HOME, suite_state())
            .args(["--jobs", "20", "jobs.ndjson"]),
    );
    assert_eq!(code(&out), 0, "{}{}", stderr(&out), stdout(&out));
    let records = super::common::records(&out);
    super::batch::checked(&records);
    assert_eq!(records.len(), 20);
    let mut committed = Vec::new();
    for record in &records {
        let n: u32 = record["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(record["status"], "completed", "{record}");
        let worktree = &record["worktree"];
        assert_eq!(worktree["base"], base.as_str());
        let name = worktree["name"].as_str().unwrap().to_owned();
        if n == 1 {
            assert_eq!(name, "first");
        } else {
            assert!(name.starts_with(&format!("job-{n}-")), "{name}");
        }
        if n > 18 {
            assert_eq!(worktree["outcome"], "removed", "{record}");
            continue;
        }
        assert_eq!(worktree["outcome"], "committed", "{record}");
        assert_eq!(
            (
                &worktree["changedFiles"],
                &worktree["insertions"],
                &worktree["deletions"]
            ),
            (&Value::from(1), &Value::from(1), &Value::from(1))
        );
        let branch = format!("acp/{name}");
        assert_eq!(worktree["branch"], branch.as_str());
        assert_eq!(
            git(&repo, &["show", &format!("{branch}:notes.txt")]),
            format!("line {n}\n")
        );
        assert_eq!(
            git(
                &repo,
                &["rev-list", "--count", &format!("{base}..{branch}")]
            )
            .trim(),
            "1"
        );
        committed.push(name);
    }
    committed.sort();
    assert_eq!(committed.len(), 18);
    assert_eq!(worktree_folders(&repo), committed);
    let mut branches: Vec<String> = committed.iter().map(|name| format!("acp/{name}")).collect();
    branches.sort();
    assert_eq!(acp_branches(&repo), branches);
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "parent\n"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert!(processes_in(tmp.path()).is_empty());
}

/// One model reply calling `subagent` once per `(agent, prompt, isolation)`, all in the same
/// response (so the children run at the same time).
fn subagent_calls(calls: &[(&str, &str, Option<&str>)]) -> acp_tests::mock_llm::Reply {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (agent, prompt, isolation))| {
            let mut arguments = serde_json::json!({"agent": agent, "prompt": prompt});
            if let Some(isolation) = isolation {
                arguments["isolation"] = Value::from(*isolation);
            }
            serde_json::json!({"index": index, "id": format!("call_{index}"), "type": "function",
                "function": {"name": "subagent", "arguments": arguments.to_string()}})
        })
        .collect();
    acp_tests::mock_llm::Reply::Events(vec![
        serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": calls}, "finish_reason": null}]})
            .to_string(),
        serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            .to_string(),
        "[DONE]".to_owned(),
    ])
}

/// Writes the approved definition `<repo>/subagents/<name>.md` running the mock with `args`,
/// with `extra` lines in its `run:` table.
fn mock_subagent(repo: &Path, name: &str, args: &[&str], extra: &str) {
    super::children::write_approved(
        &repo.join("subagents"),
        &format!("{name}.md"),
        &format!(
            "---\ndescription: the mock agent\nrun:\n  agent: {}\n{extra}---\nYou are the mock.\n",
            serde_json::to_string(&mock(args)).unwrap()
        ),
    );
}

/// The name in a tool result's worktree line (`[worktree NAME: ...`).
fn worktree_named(result: &str) -> String {
    let start = result.find("[worktree ").expect("a worktree line") + "[worktree ".len();
    let rest = &result[start..];
    rest[..rest.find(':').unwrap()].to_owned()
}

/// The subagents of the parallel test, committed in `repo`: three writers of the same path, each
/// held at its session's start until the test opens the gate `go` (each touching
/// `<dir>/ready-N` there), so they run at the same time; `quiet`, whose definition asks for its
/// worktree (`run.isolation`) and which changes nothing; `stuck`, which writes, then never
/// answers: its timeout stops it, and its worktree is kept with the change uncommitted.
fn define_writers(repo: &Path, dir: &Path, go: &Path) {
    for n in 1..=3 {
        let ready = dir.join(format!("ready-{n}"));
        mock_subagent(
            repo,
            &format!("writer-{n}"),
            &[
                "gated-session",
                "--go",
                path_str(go),
                "--ready",
                path_str(&ready),
                "--write-file",
                &format!("notes.txt=child {n}\n"),
            ],
            "",
        );
    }
    mock_subagent(repo, "quiet", &["hello"], "  isolation: worktree\n");
    mock_subagent(
        repo,
        "stuck",
        &["hang", "--write-file", "half.txt=half\n"],
        "  timeout: 1\n",
    );
    // The definitions are the repository's own, committed: the parent's tree starts clean.
    git(repo, &["add", "subagents"]);
    git(repo, &["commit", "-q", "-m", "subagents"]);
}

/// Asserts what writer `n` of the parallel test left: its call's `result` and its card (in
/// `records`) name its worktree, the branch holds one commit with its content; its name.
fn assert_writer(repo: &Path, base: &str, records: &[Value], n: u32, result: &str) -> String {
    let name = worktree_named(result);
    assert!(name.starts_with(&format!("write-notes-{n}-")), "{result}");
    let branch = format!("acp/{name}");
    let commit = git(repo, &["rev-parse", &branch]).trim().to_owned();
    let root = repo.join(".acp-host/worktrees").join(&name);
    // The result names the worktree's path, branch, commit and diff stat.
    assert_eq!(
        result,
        format!(
            "hello from acp child\n\n[worktree {name}: committed {} on branch {branch} (base {}), \
             1 file changed, 1 insertion(+), 1 deletion(-); kept at {}. Nothing was merged: \
             merge or cherry-pick the branch to take it.]",
            &commit[..12],
            &base[..12],
            root.display()
        )
    );
    // One commit on the branch, holding this child's content.
    assert_eq!(
        git(repo, &["rev-list", "--count", &format!("{base}..{branch}")]).trim(),
        "1"
    );
    assert_eq!(
        git(repo, &["show", &format!("{branch}:notes.txt")]),
        format!("child {n}\n")
    );
    assert_eq!(
        git(repo, &["diff", "--name-only", base, &branch]),
        "notes.txt\n"
    );
    // Its card: titled as isolated, completed with the same text.
    let card: Vec<&Value> = records
        .iter()
        .filter(|r| r["update"]["toolCallId"] == format!("call_{}", n - 1))
        .collect();
    assert_eq!(
        card[0]["update"]["title"],
        format!("Subagent writer-{n}: write notes {n} (in a worktree)")
    );
    let last = card.last().unwrap();
    assert_eq!(last["update"]["status"], "completed");
    assert_eq!(last["update"]["content"][0]["content"]["text"], result);
    name
}

/// Asserts what the child its timeout stopped left (its call's `result`): a kept worktree with
/// the change staged, not committed, and said so; its name.
fn assert_interrupted(repo: &Path, base: &str, stuck: &str) -> String {
    let name = worktree_named(stuck);
    let root = repo.join(".acp-host/worktrees").join(&name);
    assert!(stuck.starts_with("subagent stuck ended timeout"), "{stuck}");
    assert!(
        stuck.ends_with(&format!(
            "\n\n[worktree {name}: the child did not finish; changes left uncommitted on branch \
             acp/{name} (base {}), 1 file changed, 1 insertion(+), 0 deletions(-); kept at {}. \
             Nothing was committed or merged: look at the worktree before using it.]",
            &base[..12],
            root.display()
        )),
        "{stuck}"
    );
    assert_eq!(git(&root, &["status", "--porcelain"]), "A  half.txt\n");
    assert_eq!(
        git(repo, &["rev-parse", &format!("acp/{name}")]).trim(),
        base
    );
    name
}

#[test]
fn three_children_of_one_reply_write_the_same_file_each_in_its_own_worktree() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let go = tmp.path().join("go");
    define_writers(&repo, tmp.path(), &go);
    let base = head(&repo);
    let llm = super::children::keyed_llm([
        subagent_calls(&[
            ("writer-1", "write notes 1", Some("worktree")),
            ("writer-2", "write notes 2", Some("worktree")),
            ("writer-3", "write notes 3", Some("worktree")),
            ("quiet", "say hi", None),
            ("stuck", "half done", Some("worktree")),
        ]),
        super::children::send_message("call_more", "agent-1", "once more"),
        super::children::list_agents("call_list"),
        acp_tests::mock_llm::Reply::text(["all done"]),
    ]);
    // The parent's state lives beside the repository, not in it.
    let child =
        super::children::model_parent(tmp.path(), &llm, false, &["--max-parallel-subagents", "5"])
            .args(["--json", "--cwd", path_str(&repo), "go"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    for n in 1..=3 {
        assert!(
            wait_for_file(tmp.path().join(format!("ready-{n}")), HANG_GUARD),
            "writer-{n} did not start while the others waited"
        );
    }
    std::fs::write(&go, "").unwrap();
    let out = acp_tests::wait_output(child);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let records = super::common::records(&out);
    let result = records.last().unwrap();
    assert_eq!(result["output"], "all done", "{result}");
    // The parent's working tree is as it was.
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "parent\n"
    );
    let requests = super::children::model_requests(&llm, 4);
    // A child in a worktree is not continued: its worktree was settled when it ended.
    assert_eq!(
        requests[2].tool_result("call_more").as_deref(),
        Some(
            "child agent-1 cannot be continued: it worked in a worktree of its own, settled when \
             its run ended (its result says where its changes are); start a new subagent call"
        )
    );
    let listed = requests[3].tool_result("call_list").unwrap();
    assert_eq!(
        listed
            .matches("(cannot be continued: it worked in a worktree of its own)")
            .count(),
        5,
        "{listed}"
    );
    // The prompt face: offered in a repository.
    let subagent = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap()
        .clone();
    assert_eq!(
        subagent["function"]["parameters"]["properties"]["isolation"]["enum"],
        serde_json::json!(["worktree"])
    );
    let mut names = Vec::new();
    for n in 1..=3 {
        let result = requests[1].tool_result(&format!("call_{}", n - 1)).unwrap();
        names.push(assert_writer(&repo, &base, &records, n, &result));
    }
    // The child that changed nothing left no worktree and no branch.
    let quiet = requests[1].tool_result("call_3").unwrap();
    let name = worktree_named(&quiet);
    assert!(name.starts_with("say-hi-"), "{quiet}");
    assert_eq!(
        quiet,
        format!("hello from acp child\n\n[worktree {name}: no changes, removed with its branch.]")
    );
    // The one its timeout stopped kept its worktree, the change staged, not committed.
    let stuck = requests[1].tool_result("call_4").unwrap();
    let name = assert_interrupted(&repo, &base, &stuck);
    names.push(name);
    names.sort();
    assert_eq!(worktree_folders(&repo), names);
    let branches: Vec<String> = names.iter().map(|name| format!("acp/{name}")).collect();
    assert_eq!(acp_branches(&repo), branches);
    super::children::assert_none_left(tmp.path());
}

#[test]
fn outside_a_repository_isolation_is_not_offered_and_a_call_asking_for_it_starts_nothing() {
    let tmp = temp();
    let dir = tmp.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    let record = tmp.path().join("record");
    super::children::write_approved(
        &dir.join("subagents"),
        "writer.md",
        &format!(
            "---\ndescription: the mock agent\nrun:\n  agent: {}\n---\nYou are the mock.\n",
            serde_json::to_string(&mock(&[
                "hello",
                "--record",
                path_str(&record),
                "--write-file",
                "x.txt=x"
            ]))
            .unwrap()
        ),
    );
    let llm = super::children::keyed_llm([
        subagent_calls(&[("writer", "write x", Some("worktree"))]),
        acp_tests::mock_llm::Reply::text(["done"]),
    ]);
    let out = run_to_end(
        super::children::model_parent(tmp.path(), &llm, false, &[]).args([
            "--cwd",
            path_str(&dir),
            "go",
        ]),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let requests = super::children::model_requests(&llm, 2);
    let subagent = requests[0]
        .tools()
        .iter()
        .find(|t| t["function"]["name"] == "subagent")
        .unwrap()
        .clone();
    assert!(
        subagent["function"]["parameters"]["properties"]
            .get("isolation")
            .is_none(),
        "{subagent}"
    );
    assert_eq!(
        requests[1].tool_result("call_0").as_deref(),
        Some(
            "isolation \"worktree\" needs the session's folder inside a git repository, and this \
             one is not; call subagent without isolation (or work in a repository)"
        )
    );
    assert!(!record.exists(), "no child started");
    assert!(!dir.join("x.txt").exists());
    super::children::assert_none_left(tmp.path());
}

#[test]
fn worktreeinclude_copies_the_ignored_files_it_names_and_nothing_else() {
    let tmp = temp();
    let repo = repository(tmp.path());
    std::fs::write(repo.join(".gitignore"), ".env\nbuild/\n").unwrap();
    std::fs::write(repo.join(".worktreeinclude"), ".env\n").unwrap();
    git(&repo, &["add", ".gitignore", ".worktreeinclude"]);
    git(&repo, &["commit", "-q", "-m", "ignores"]);
    std::fs::write(repo.join(".env"), "KEY=1\n").unwrap();
    std::fs::create_dir(repo.join("build")).unwrap();
    std::fs::write(repo.join("build/out.o"), "object\n").unwrap();
    // An untracked file the parent has not ignored: the parent's own, not copied.
    std::fs::write(repo.join("draft.txt"), "draft\n").unwrap();
    let (_, result) = json_run(
        host(&repo).args([
            "--json",
            "--worktree=inc",
            "--agent",
            &mock(&["hello", "--write-file", "seen.txt=seen\n"]),
            "look around",
        ]),
        0,
    );
    let root = repo.join(".acp-host/worktrees/inc");
    assert_eq!(result["worktree"]["outcome"], "committed", "{result}");
    assert_eq!(
        std::fs::read_to_string(root.join(".env")).unwrap(),
        "KEY=1\n"
    );
    assert!(!root.join("build").exists());
    assert!(!root.join("draft.txt").exists());
    // The copy is ignored in the worktree too: the commit holds the agent's file only.
    assert_eq!(result["worktree"]["changedFiles"], 1);
    assert_eq!(
        git(&repo, &["diff", "--name-only", "HEAD", "acp/inc"]),
        "seen.txt\n"
    );
}

#[test]
fn a_sandboxed_agent_writes_in_its_worktree_and_not_in_the_parent_s_tree() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let outside = repo.join("outside.txt");
    let (_, result) = json_run(
        host(&repo).args([
            "--json",
            "--sandbox",
            "workspace-write",
            "--worktree=boxed",
            "--agent",
            &mock(&[
                "hello",
                "--write-file",
                "inside.txt=inside\n",
                "--write-file",
                &format!("{}=escaped\n", outside.display()),
            ]),
            "write both",
        ]),
        0,
    );
    assert_eq!(result["sandbox"]["mode"], "workspace-write", "{result}");
    assert_eq!(result["worktree"]["outcome"], "committed", "{result}");
    assert_eq!(result["worktree"]["changedFiles"], 1);
    assert_eq!(git(&repo, &["show", "acp/boxed:inside.txt"]), "inside\n");
    // The parent's tree was out of the sandbox's reach.
    assert!(!outside.exists());
    let tail = result["stderrTail"].as_str().unwrap();
    assert!(
        tail.contains(&format!("mock: cannot write {}", outside.display())),
        "{tail}"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
}

#[test]
fn two_runs_racing_for_one_name_get_two_worktrees() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let go = tmp.path().join("go");
    // Both hold their session's start until both worktrees exist, so they overlap.
    let spawn = |n: u32| {
        host(&repo)
            .args([
                "--json",
                "--worktree=race",
                "--agent",
                &mock(&[
                    "gated-session",
                    "--go",
                    path_str(&go),
                    "--ready",
                    path_str(&tmp.path().join(format!("ready-{n}"))),
                    "--write-file",
                    &format!("notes.txt=run {n}\n"),
                ]),
                &format!("run {n}"),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let children = [spawn(1), spawn(2)];
    for n in 1..=2 {
        assert!(wait_for_file(
            tmp.path().join(format!("ready-{n}")),
            HANG_GUARD
        ));
    }
    std::fs::write(&go, "").unwrap();
    let mut names = Vec::new();
    for (n, child) in (1..=2).zip(children) {
        let out = acp_tests::wait_output(child);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let result = super::common::result_record(&out);
        let name = result["worktree"]["name"].as_str().unwrap().to_owned();
        assert_eq!(
            git(&repo, &["show", &format!("acp/{name}:notes.txt")]),
            format!("run {n}\n")
        );
        names.push(name);
    }
    names.sort();
    assert_eq!(names, ["race", "race-2"]);
    assert_eq!(worktree_folders(&repo), names);
    assert_eq!(acp_branches(&repo), ["acp/race", "acp/race-2"]);
    assert!(processes_in(tmp.path()).is_empty());
}

#[test]
fn a_definition_s_isolation_and_batch_s_worktree_flags_are_honoured() {
    let tmp = temp();
    let repo = repository(tmp.path());
    let first = head(&repo);
    mock_subagent(
        &repo,
        "isolated",
        &["hello", "--write-file", "notes.txt=by the definition\n"],
        "  isolation: worktree\n",
    );
    git(&repo, &["add", "subagents"]);
    git(&repo, &["commit", "-q", "-m", "subagents"]);
    let second = head(&repo);
    // acp-host run --subagent: the definition asks, no flag needed.
    let (_, result) = json_run(
        host(&repo).args(["--json", "--subagent", "isolated", "from the shell"]),
        0,
    );
    let worktree = &result["worktree"];
    assert_eq!(worktree["outcome"], "committed", "{result}");
    assert_eq!(worktree["base"], second.as_str());
    let branch = worktree["branch"].as_str().unwrap();
    assert_eq!(
        git(&repo, &["show", &format!("{branch}:notes.txt")]),
        "by the definition\n"
    );
    // batch: --worktree-base and --worktree-keep-dirty shape every line's worktree, the
    // line's own and the definition's.
    let lines = [
        serde_json::json!({"id": "own", "prompt": "p", "cwd": path_str(&repo), "worktree": "own",
            "agent": mock(&["hello", "--write-file", "notes.txt=own\n"])}),
        serde_json::json!({"id": "defined", "prompt": "p", "cwd": path_str(&repo),
            "subagent": "isolated"}),
        serde_json::json!({"id": "plain", "prompt": "p", "cwd": path_str(&repo),
            "agent": mock(&["hello"])}),
    ]
    .map(|line| line.to_string());
    std::fs::write(tmp.path().join("jobs.ndjson"), lines.join("\n") + "\n").unwrap();
    let out = run_to_end(
        super::batch::batch(tmp.path())
            .env(protocol::env_vars::XDG_STATE_HOME, suite_state())
            .args([
                "--worktree-base",
                &first,
                "--worktree-keep-dirty",
                "jobs.ndjson",
            ]),
    );
    assert_eq!(code(&out), 0, "{}{}", stderr(&out), stdout(&out));
    let records = super::common::records(&out);
    super::batch::checked(&records);
    for record in &records {
        let worktree = &record["worktree"];
        if record["id"] == "plain" {
            assert!(worktree.is_null(), "{record}");
            continue;
        }
        assert_eq!(worktree["outcome"], "uncommitted", "{record}");
        assert_eq!(worktree["base"], first.as_str(), "{record}");
        assert_eq!(worktree["commit"], Value::Null);
        let root = PathBuf::from(worktree["path"].as_str().unwrap());
        // From the first commit: the definitions are not in it; the change is staged.
        assert!(!root.join("subagents").exists());
        assert_eq!(git(&root, &["status", "--porcelain"]), "M  notes.txt\n");
    }
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
}
