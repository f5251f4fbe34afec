//! End-to-end tests of `acp-host sync` and `acp-host agents` through the real binary, with a
//! temporary $HOME, a controlled PATH and a temporary state folder: every row of the state table
//! and every rule of docs/sync.md, the hostile inputs it refuses, and whole human reports as
//! snapshots.

use std::fs;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::time::Duration;

use acp_tests::{bin, line_channel, wait_for_file, wait_output};
use serde_json::Value;

/// A temporary machine: $HOME, a project with `subagents/`, a PATH folder, a state folder.
struct Env {
    _root: tempfile::TempDir,
    home: PathBuf,
    project: PathBuf,
    path_dir: PathBuf,
    state: PathBuf,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

impl Env {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let home = root.path().join("home");
        let project = root.path().join("project");
        let path_dir = root.path().join("bin");
        let state = root.path().join("state");
        for dir in [&home, &project.join("subagents"), &path_dir] {
            fs::create_dir_all(dir).unwrap();
        }
        Env {
            _root: root,
            home,
            project,
            path_dir,
            state,
        }
    }

    /// Marks agents installed through their marker folders.
    fn install(&self, agents: &[&str]) {
        for agent in agents {
            let spec = protocol::registry::find_canonical(agent).unwrap();
            fs::create_dir_all(self.home.join(spec.marker_dirs[0])).unwrap();
        }
    }

    /// Puts a fake executable on PATH.
    fn on_path(&self, binary: &str) {
        let path = self.path_dir.join(binary);
        fs::write(&path, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn define(&self, name: &str, text: &str) {
        fs::write(
            self.project.join("subagents").join(format!("{name}.md")),
            text,
        )
        .unwrap();
    }

    fn simple(&self, name: &str, agents: &str) {
        self.define(
            name,
            &format!(
                "---\ndescription: \"{name} things\"\nagents: [{agents}]\n---\n\nDo {name}.\n"
            ),
        );
    }

    fn undefine(&self, name: &str) {
        fs::remove_file(self.project.join("subagents").join(format!("{name}.md"))).unwrap();
    }

    fn write(&self, rel: &str, contents: &str) {
        let path = self.home.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.home.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    fn exists(&self, rel: &str) -> bool {
        self.home.join(rel).exists()
    }

    /// `acp-host <args>` in the project, with only this machine's variables.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut command = Command::new(bin("acp-host"));
        command
            .args(args)
            .current_dir(&self.project)
            .env_clear()
            .envs(acp_tests::instrumentation_env())
            .env("HOME", &self.home)
            .env("PATH", &self.path_dir)
            .env("XDG_STATE_HOME", &self.state);
        command
    }

    fn command(&self, args: &[&str]) -> Run {
        let output = self.cmd(args).output().unwrap();
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    fn sync(&self, args: &[&str]) -> Run {
        let mut all = vec!["sync"];
        all.extend_from_slice(args);
        self.command(&all)
    }

    /// A sync expected to succeed.
    fn sync_ok(&self, args: &[&str]) -> Run {
        let run = self.sync(args);
        assert_eq!(
            run.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            run.stdout, run.stderr
        );
        run
    }

    /// `(action, agent/name)` of every planned operation (a `--dry-run --json` run).
    fn actions(&self, args: &[&str]) -> Vec<(String, String)> {
        let mut all = vec!["--dry-run", "--json"];
        all.extend_from_slice(args);
        let json = self.sync(&all).json();
        json["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|op| {
                (
                    op["action"].as_str().unwrap().to_owned(),
                    format!(
                        "{}/{}",
                        op["agent"].as_str().unwrap(),
                        op["name"].as_str().unwrap()
                    ),
                )
            })
            .collect()
    }

    /// Every file under $HOME except the state folder, with its bytes.
    fn tree(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
            let Ok(entries) = fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push((path.clone(), fs::read(&path).unwrap_or_default()));
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.home, &mut out);
        out.sort();
        out
    }

    fn backups(&self) -> Vec<PathBuf> {
        let root = self.state.join("acp-host/backups");
        let mut runs: Vec<PathBuf> = fs::read_dir(&root)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        runs.sort();
        runs
    }
}

fn pair(action: &str, target: &str) -> (String, String) {
    (action.to_owned(), target.to_owned())
}

fn marker(name: &str) -> String {
    protocol::sync::render::marker(name)
}

const CORDIS: &str = ".dsh/cordis.patch.yml";

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("invalid YAML ({e}):\n{text}"))
}

// ---- Planning, ownership and the state table ----

#[test]
fn planning_writes_nothing() {
    let env = Env::new();
    env.install(&["claude-code", "codex"]);
    env.simple("review", "claude-code, codex");
    let before = env.tree();
    let json = env.sync(&["--dry-run", "--json"]).json();
    assert_eq!(json["canApply"], true);
    assert!(json["changes"].as_u64().unwrap() > 0);
    assert_eq!(json["result"], Value::Null);
    assert_eq!(env.tree(), before);
    assert!(!env.exists(".claude/agents"));
}

#[test]
fn unmarked_files_conflict_and_force_authorizes_exactly_one() {
    let env = Env::new();
    env.install(&["claude-code", "codex"]);
    env.simple("verifier", "claude-code, codex");
    env.write(".claude/agents/verifier.md", "my claude verifier\n");
    env.write(".codex/agents/verifier.toml", "name = \"mine\"\n");
    let before = env.tree();

    let run = env.sync(&[]);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("conflict "))
            .count(),
        2,
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("(resolve with --force claude-code/verifier)"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("plan cannot apply"), "{}", run.stderr);
    assert_eq!(env.tree(), before);

    let json = env
        .sync(&["--json", "--force", "claude-code/verifier"])
        .json();
    let ops = json["operations"].as_array().unwrap();
    assert_eq!(
        (ops[0]["action"].as_str(), ops[0]["authorized"].as_bool()),
        (Some("update"), Some(true))
    );
    assert_eq!(
        (ops[1]["action"].as_str(), ops[1]["authorized"].as_bool()),
        (Some("conflict"), Some(false))
    );
    assert_eq!(json["success"], false);
    assert_eq!(
        env.tree(),
        before,
        "a plan with a remaining conflict writes nothing"
    );

    for malformed in [
        "claude-code",
        "claude-code/verifier/x",
        "",
        "*/verifier",
        "claude-code/*",
        "nope/verifier",
    ] {
        let run = env.sync(&["--force", malformed]);
        assert_eq!(run.code, 2, "{malformed}: {}", run.stderr);
        assert!(run.stderr.contains("--force"), "{}", run.stderr);
    }
    assert_eq!(env.tree(), before);

    env.sync_ok(&[
        "--force",
        "claude-code/verifier",
        "--force",
        "codex/verifier",
    ]);
    assert!(
        env.read(".claude/agents/verifier.md")
            .contains(&marker("verifier"))
    );
    assert!(
        env.read(".codex/agents/verifier.toml")
            .starts_with(&format!("# {}", marker("verifier")))
    );
}

#[test]
fn orphans_are_reported_and_pruned_unmanaged_never_appear() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("legacy", "claude-code");
    env.sync_ok(&[]);
    env.undefine("legacy");
    env.simple("review", "claude-code");
    env.write(".claude/agents/user_notes.md", "my notes\n");

    let run = env.sync_ok(&[]);
    assert!(
        run.stdout.contains("orphan    claude-code/legacy"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("(resolve with --prune)"));
    assert!(
        run.stderr
            .contains("warning: 1 managed orphan(s) kept; run with --prune"),
        "{}",
        run.stderr
    );
    assert!(!run.stdout.contains("user_notes"));
    assert!(env.exists(".claude/agents/legacy.md"));

    let ops = env.actions(&["--prune"]);
    assert_eq!(
        ops,
        [
            pair("remove", "claude-code/legacy"),
            pair("noop", "claude-code/review")
        ]
    );
    let run = env.sync_ok(&["--prune"]);
    assert!(!run.stdout.contains("user_notes"));
    assert!(!env.exists(".claude/agents/legacy.md"));
    assert_eq!(env.read(".claude/agents/user_notes.md"), "my notes\n");
}

#[test]
fn two_dsh_subagents_make_one_file_plan() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("alpha", "dsh");
    env.simple("beta", "dsh");
    let json = env.sync(&["--dry-run", "--json"]).json();
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    assert!(files[0]["path"].as_str().unwrap().ends_with(CORDIS));
    assert_eq!(files[0]["operations"].as_array().unwrap().len(), 2);
}

#[test]
fn execute_creates_files() {
    let env = Env::new();
    env.install(&["claude-code", "dsh"]);
    env.simple("alpha", "claude-code, dsh");
    env.simple("beta", "dsh");
    let run = env.sync_ok(&[]);
    assert!(
        run.stdout
            .contains("sync: 2 applied, 0 noop, 0 skipped, 0 conflicted, 0 failed"),
        "{}",
        run.stdout
    );
    assert!(
        env.read(".claude/agents/alpha.md")
            .ends_with("\n\nDo alpha.\n")
    );
    let cordis = env.read(CORDIS);
    assert!(cordis.contains("- id: acp-host-subagent-alpha\n"));
    assert!(cordis.contains("- id: acp-host-subagent-beta\n"));
    assert_eq!(yaml(&cordis).as_array().unwrap().len(), 2);
}

#[test]
fn a_stale_plan_writes_nothing() {
    let env = Env::new();
    env.install(&["claude-code", "dsh"]);
    env.simple("alpha", "claude-code, dsh");
    env.write(CORDIS, "- initial: true\n");
    let config = acp_host::sync_exec::SyncConfig {
        source: env.project.join("subagents"),
        scope: protocol::registry::Scope::User,
        home: env.home.clone(),
        project_root: env.project.clone(),
        agents: Vec::new(),
        authorization: protocol::sync::Authorization::default(),
        path_var: None,
    };
    let prepared = acp_host::sync_exec::prepare(&config).unwrap();
    assert!(prepared.plan.can_apply());
    env.write(CORDIS, "- initial: false\n- edited: elsewhere\n");
    let exec = acp_host::sync_exec::ExecConfig::for_user(&env.home, Some(&env.state))
        .expect("a state folder");
    let result = acp_host::sync_exec::execute(&prepared.plan, &exec);
    assert!(!result.success);
    let error = result.error.as_deref().unwrap();
    assert!(error.starts_with("plan is stale: "), "{error}");
    assert!(error.contains(CORDIS), "{error}");
    assert_eq!(result.failed_files.len(), 1);
    assert!(result.failed_files[0].ends_with(CORDIS));
    assert!(!result.partial);
    assert_eq!(env.read(CORDIS), "- initial: false\n- edited: elsewhere\n");
    assert!(
        !env.exists(".claude/agents/alpha.md"),
        "nothing is written when any file is stale"
    );
    assert!(env.backups().is_empty());
}

#[test]
fn unmarked_conflicts_marked_updates_identical_noops() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("mine", "claude-code");
    env.simple("ours", "claude-code");
    env.write(
        ".claude/agents/mine.md",
        "---\nname: mine\n---\nhand written\n",
    );
    env.sync(&[]);
    assert_eq!(
        env.read(".claude/agents/mine.md"),
        "---\nname: mine\n---\nhand written\n"
    );

    env.undefine("mine");
    env.sync_ok(&[]);
    assert_eq!(env.actions(&[]), [pair("noop", "claude-code/ours")]);
    env.define(
        "ours",
        "---\ndescription: changed\nagents: [claude-code]\n---\nNew body.\n",
    );
    assert_eq!(env.actions(&[]), [pair("update", "claude-code/ours")]);
    env.sync_ok(&[]);
    assert!(env.read(".claude/agents/ours.md").contains("New body."));
    assert_eq!(env.actions(&[]), [pair("noop", "claude-code/ours")]);
}

#[test]
fn unmanaged_dsh_items_survive() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("alpha", "dsh");
    let manual = "# my harness settings\n- id: custom-manual\n  persona: Keep me intact\n";
    env.write(CORDIS, manual);
    env.sync_ok(&[]);
    let cordis = env.read(CORDIS);
    assert!(cordis.starts_with(manual), "{cordis}");
    assert_eq!(yaml(&cordis).as_array().unwrap().len(), 2);
}

/// The golden files of the `protocol` crate, written through the binary.
#[test]
fn every_format_is_written_byte_exact_and_pi_waits_for_its_extension() {
    let env = Env::new();
    let all = [
        "claude-code",
        "codex",
        "opencode",
        "github-copilot",
        "agy",
        "grok",
        "pi",
        "dsh",
        "gemini",
        "cursor",
        "factory-droid",
        "kiro",
        "qwen-code",
    ];
    env.install(&all);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/tests/golden");
    let definition = fs::read_to_string(golden.join("source/review.md")).unwrap();
    env.define("review", &definition);
    let ops = env.actions(&[]);
    assert!(ops.contains(&pair("skip", "pi/review")), "{ops:?}");
    env.sync_ok(&[]);
    assert!(!env.exists(".pi/agent/agents/review.md"));
    env.write(".pi/agent/extensions/subagent/index.ts", "export {}\n");
    assert_eq!(
        env.actions(&[])
            .iter()
            .filter(|(a, _)| a == "create")
            .count(),
        1
    );
    env.sync_ok(&[]);
    for (rel, file) in [
        (".claude/agents/review.md", "claude-code.md"),
        (".codex/agents/review.toml", "codex.toml"),
        (".config/opencode/agents/review.md", "opencode.md"),
        (".copilot/agents/review.agent.md", "github-copilot.agent.md"),
        (".gemini/config/agents/review/agent.md", "agy.md"),
        (".grok/agents/review.md", "grok.md"),
        (".pi/agent/agents/review.md", "pi.md"),
        (CORDIS, "dsh.yml"),
        (".gemini/agents/review.md", "gemini.md"),
        (".cursor/agents/review.md", "cursor.md"),
        (".factory/droids/review.md", "factory-droid.md"),
        (".kiro/agents/review.md", "kiro.md"),
        (".qwen/agents/review.md", "qwen-code.md"),
    ] {
        assert_eq!(
            env.read(rel),
            fs::read_to_string(golden.join(file)).unwrap(),
            "{rel}"
        );
    }
    // A second sync is a no-op everywhere (the copilot marker sits on line 10).
    let json = env.sync(&["--json"]).json();
    assert!(
        json["operations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|op| op["action"] == "noop"),
        "{json}"
    );
}

#[test]
fn awkward_descriptions_round_trip() {
    let env = Env::new();
    env.install(&["claude-code", "codex", "dsh"]);
    let description = "Say \"hi\": use & and # and\nnew lines, 'quotes' and \\ too";
    env.define(
        "awkward",
        &format!(
            "---\ndescription: {}\nagents: [claude-code, codex, dsh]\n---\nBody with ''' and \"\"\" inside\nid: x\nname: y\n",
            serde_json::to_string(description).unwrap()
        ),
    );
    env.sync_ok(&[]);
    let codex: toml::Table = env.read(".codex/agents/awkward.toml").parse().unwrap();
    assert_eq!(codex["description"].as_str(), Some(description));
    assert_eq!(
        codex["developer_instructions"].as_str(),
        Some("Body with ''' and \"\"\" inside\nid: x\nname: y")
    );
    let claude = env.read(".claude/agents/awkward.md");
    let frontmatter = claude
        .strip_prefix("---\n")
        .unwrap()
        .split_once("\n---\n")
        .unwrap()
        .0;
    assert_eq!(yaml(frontmatter)["description"], description);
    let dsh = yaml(&env.read(CORDIS));
    assert_eq!(
        dsh[0]["config"]["persona"],
        "Body with ''' and \"\"\" inside\nid: x\nname: y"
    );
    // The persona's `id:` / `name:` lines do not hide the item: the next sync is a no-op.
    assert!(env.actions(&[]).iter().all(|(a, _)| a == "noop"));
}

#[test]
fn a_broken_definition_aborts_before_any_prune() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("legacy", "claude-code");
    env.simple("review", "claude-code");
    env.sync_ok(&[]);
    env.undefine("legacy");
    env.define(
        "review",
        "---\ndescripton: typo\nagents: [claude-code]\n---\nbody\n",
    );
    let before = env.tree();
    let run = env.sync(&["--prune"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("subagents/review.md: 2 problems: field `descripton`: unknown field"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("nothing was written"), "{}", run.stderr);
    assert_eq!(env.tree(), before);
    assert!(env.exists(".claude/agents/legacy.md"));

    env.define("review", "---\nagents: [claude-code]\n---\nbody\n");
    let run = env.sync(&["--prune"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("subagents/review.md: field `description`: missing"),
        "{}",
        run.stderr
    );
    assert_eq!(env.tree(), before);
}

#[test]
fn codex_disabled_blocks_everything() {
    let env = Env::new();
    env.install(&["claude-code", "codex"]);
    env.write(".codex/config.toml", "[agents]\nenabled = false\n");
    env.simple("review", "claude-code, codex");
    let run = env.sync(&[]);
    assert_eq!(run.code, 1);
    assert!(
        run.stdout.contains("error     codex/review"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("subagents are disabled in ~/.codex/config.toml"),
        "{}",
        run.stdout
    );
    assert!(!env.exists(".codex/agents/review.toml"));
    assert!(!env.exists(".claude/agents/review.md"));
}

#[test]
fn option_validation_names_the_field() {
    let env = Env::new();
    env.install(&["dsh", "codex"]);
    let cases = [
        (
            "codex: {temperature: \"1\"}",
            "field `codex.temperature`: unknown codex option",
        ),
        (
            "codex: {model: 3}",
            "field `codex.model`: must be a non-empty string, got the number 3",
        ),
        ("dsh: {tools: 123}", "field `dsh.tools`"),
        ("dsh: {tools: [\"\"]}", "field `dsh.tools`"),
        ("dsh: {maxTokens: -10}", "field `dsh.maxTokens`"),
        ("dsh: {maxTokens: \"4096\"}", "field `dsh.maxTokens`"),
        ("dsh: {maxTokens: true}", "field `dsh.maxTokens`"),
        (
            "dsh: {backgroundMode: invalid}",
            "field `dsh.backgroundMode`: must be one of: one-shot, continuable",
        ),
        (
            "dsh: {provider: acp, backgroundMode: continuable}",
            "field `dsh.backgroundMode`: provider acp runs a background subagent one-shot",
        ),
        ("platform: {x: 1}", "field `platform`: unknown field"),
    ];
    for (options, expected) in cases {
        env.define(
            "x",
            &format!("---\ndescription: d\nagents: [dsh]\n{options}\n---\nbody\n"),
        );
        let run = env.sync(&[]);
        assert_eq!(run.code, 1, "{options}");
        assert!(
            run.stderr.contains(&format!("subagents/x.md: {expected}")),
            "{options}: {}",
            run.stderr
        );
        assert!(!env.exists(CORDIS));
    }
    env.define(
        "x",
        "---\ndescription: d\nagents: [dsh]\ndsh: {tools: x}\n---\nbody\n",
    );
    env.sync_ok(&[]);
    assert_eq!(
        yaml(&env.read(CORDIS))[0]["config"]["toolFilter"]["allow"],
        serde_json::json!(["x"])
    );
}

#[test]
fn an_empty_canonical_folder_creates_nothing() {
    let env = Env::new();
    env.install(&["claude-code", "codex", "dsh"]);
    let before = env.tree();
    let run = env.sync_ok(&[]);
    assert!(run.stdout.contains("sync: 0 applied"), "{}", run.stdout);
    assert_eq!(env.tree(), before);
    assert!(!env.exists(".claude/agents"));
    // A missing source folder is an error, not an empty set.
    let run = env.sync(&["--source", "nowhere"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("source folder nowhere does not exist"),
        "{}",
        run.stderr
    );
}

#[test]
fn dry_run_lists_actions_and_writes_nothing() {
    let env = Env::new();
    env.install(&["claude-code", "dsh"]);
    env.simple("alpha", "claude-code, dsh");
    env.sync_ok(&[]);
    env.define(
        "alpha",
        "---\ndescription: changed\nagents: [claude-code, dsh]\n---\nNew.\n",
    );
    env.simple("beta", "claude-code");
    let before = env.tree();
    let run = env.sync_ok(&["--dry-run", "--diff"]);
    assert!(
        run.stdout.contains("update    claude-code/alpha"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("create    claude-code/beta"));
    assert!(run.stdout.contains("update    dsh/alpha"));
    assert!(run.stdout.contains("-Do alpha.\n+New.\n"), "{}", run.stdout);
    assert!(
        run.stdout.contains("+++ b/~/.claude/agents/beta.md"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("dry run: 3 file(s) would change"),
        "{}",
        run.stdout
    );
    assert_eq!(env.tree(), before);
    assert!(env.backups().is_empty());
}

#[test]
fn an_unmanaged_dsh_item_with_our_tool_name_conflicts_until_forced() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("alpha", "dsh");
    let text = "- id: my-alpha\n  name: '@deepseek-ai/dsh-tool-subagent'\n  config:\n    toolName: alpha\n    persona: mine\n- id: other\n  x: 1\n";
    env.write(CORDIS, text);
    let run = env.sync(&[]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("conflict  dsh/alpha"), "{}", run.stdout);
    assert!(run.stdout.contains("(resolve with --force dsh/alpha)"));
    assert_eq!(env.read(CORDIS), text);

    env.sync_ok(&["--force", "dsh/alpha"]);
    let cordis = env.read(CORDIS);
    assert!(
        cordis.starts_with(&format!(
            "- id: acp-host-subagent-alpha\n  # {}\n",
            marker("alpha")
        )),
        "{cordis}"
    );
    assert!(cordis.ends_with("- id: other\n  x: 1\n"));
    assert_eq!(env.actions(&[]), [pair("noop", "dsh/alpha")]);
}

#[test]
fn prune_never_touches_unmanaged_dsh_items() {
    let env = Env::new();
    env.install(&["dsh"]);
    let text = "- id: acp-host-subagent-old\n  name: '@deepseek-ai/dsh-tool-subagent'\n  config:\n    toolName: old\n- id: custom\n  persona: mine\n";
    env.write(CORDIS, text);
    let run = env.sync_ok(&["--prune"]);
    assert!(!run.stdout.contains("dsh/old"), "{}", run.stdout);
    assert_eq!(env.read(CORDIS), text);
}

#[test]
fn agents_not_installed_are_skipped() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("review", "claude-code, codex, dsh");
    let run = env.sync_ok(&[]);
    let codex = run
        .stdout
        .lines()
        .find(|l| l.starts_with("skip      codex/review "))
        .unwrap();
    assert!(
        codex.contains(
            "  ~/.codex/agents/review.toml  not installed on this host (no `codex` on PATH"
        ),
        "{codex}"
    );
    assert!(run.stdout.contains("skip      dsh/review"));
    assert!(!env.exists(".codex"));
    assert!(!env.exists(".dsh"));
    // Installed through PATH instead: no longer skipped.
    env.on_path("codex");
    assert!(env.actions(&[]).contains(&pair("create", "codex/review")));
}

#[test]
fn dropping_dsh_orphans_its_item_and_prune_removes_it() {
    let env = Env::new();
    env.install(&["dsh", "claude-code"]);
    env.write(CORDIS, "- id: custom\n  persona: mine\n");
    env.simple("alpha", "dsh, claude-code");
    env.simple("beta", "dsh");
    env.sync_ok(&[]);
    env.simple("alpha", "claude-code");
    assert!(env.actions(&[]).contains(&pair("orphan", "dsh/alpha")));
    env.sync_ok(&["--prune"]);
    let cordis = env.read(CORDIS);
    assert!(!cordis.contains("acp-host-subagent-alpha"), "{cordis}");
    assert!(cordis.starts_with("- id: custom\n  persona: mine\n- id: acp-host-subagent-beta\n"));
    assert!(env.exists(".claude/agents/alpha.md"));
}

// ---- The state table, row by row, on a dedicated file ----

#[test]
fn state_table_rows() {
    let env = Env::new();
    env.install(&["claude-code"]);
    let target = ".claude/agents/x.md";
    env.simple("x", "claude-code");
    // missing, defined -> CREATE
    assert_eq!(env.actions(&[]), [pair("create", "claude-code/x")]);
    env.sync_ok(&[]);
    // present, marker, identical -> NOOP
    assert_eq!(env.actions(&[]), [pair("noop", "claude-code/x")]);
    // present, marker, changed -> UPDATE
    env.write(
        target,
        &env.read(target).replace("Do x.", "Edited by hand."),
    );
    assert_eq!(env.actions(&[]), [pair("update", "claude-code/x")]);
    env.sync_ok(&[]);
    // present, no marker, defined, no force -> CONFLICT (preserve)
    env.write(target, "mine\n");
    assert_eq!(env.actions(&[]), [pair("conflict", "claude-code/x")]);
    assert_eq!(env.sync(&[]).code, 1);
    assert_eq!(env.read(target), "mine\n");
    // ... with --force -> UPDATE (authorized)
    assert_eq!(
        env.actions(&["--force", "claude-code/x"]),
        [pair("update", "claude-code/x")]
    );
    env.sync_ok(&["--force", "claude-code/x"]);
    assert!(env.read(target).contains(&marker("x")));
    // present, marker, not defined, no prune -> ORPHAN (notify only)
    env.undefine("x");
    assert_eq!(env.actions(&[]), [pair("orphan", "claude-code/x")]);
    env.sync_ok(&[]);
    assert!(env.exists(target));
    // ... with --prune -> REMOVE (authorized)
    assert_eq!(env.actions(&["--prune"]), [pair("remove", "claude-code/x")]);
    env.sync_ok(&["--prune"]);
    assert!(!env.exists(target));
    // present, no marker, not defined, any flags -> IGNORE (preserve)
    env.write(target, "mine\n");
    for flags in [&[][..], &["--prune"][..]] {
        assert!(env.actions(flags).is_empty());
        env.sync_ok(flags);
        assert_eq!(env.read(target), "mine\n");
    }
}

// ---- Hostile and awkward inputs ----

#[test]
fn editing_a_dsh_item_that_is_not_last_keeps_valid_yaml_and_comments() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("alpha", "dsh");
    env.simple("beta", "dsh");
    env.write(CORDIS, "- id: first\n  x: 1\n");
    env.sync_ok(&[]);
    // A user comment after the alpha item, and another item after it.
    let cordis = env.read(CORDIS).replace(
        "- id: acp-host-subagent-beta",
        "# keep this comment about alpha\n- id: acp-host-subagent-beta",
    );
    env.write(CORDIS, &cordis);
    env.define(
        "alpha",
        "---\ndescription: d\nagents: [dsh]\n---\nA much longer\npersona\nnow.\n",
    );
    assert_eq!(
        env.actions(&[]),
        [pair("update", "dsh/alpha"), pair("noop", "dsh/beta")]
    );
    env.sync_ok(&[]);
    let cordis = env.read(CORDIS);
    let items = yaml(&cordis);
    assert_eq!(items.as_array().unwrap().len(), 3, "{cordis}");
    assert_eq!(
        items[1]["config"]["persona"],
        "A much longer\npersona\nnow."
    );
    assert!(
        cordis.contains(
            "      now.\n# keep this comment about alpha\n- id: acp-host-subagent-beta\n"
        ),
        "{cordis}"
    );
    assert!(env.actions(&[]).iter().all(|(a, _)| a == "noop"));
}

#[test]
fn a_dsh_file_that_is_a_mapping_is_refused() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("alpha", "dsh");
    for text in [
        "plugins:\n  - a\n",
        "",
        "# nothing but a comment\n",
        "[a, b]\n",
    ] {
        env.write(CORDIS, text);
        let run = env.sync(&[]);
        assert_eq!(run.code, 1, "{text:?}");
        assert!(run.stdout.contains("error     dsh/alpha"), "{}", run.stdout);
        assert_eq!(env.read(CORDIS), text);
    }
}

#[test]
fn backups_keep_every_previous_version() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    env.sync_ok(&[]);
    assert!(env.backups().is_empty(), "creating a file needs no backup");
    let first = env.read(".claude/agents/x.md");
    env.define(
        "x",
        "---\ndescription: two\nagents: [claude-code]\n---\nTwo.\n",
    );
    let run = env.sync_ok(&[]);
    assert!(run.stdout.contains("backups in "), "{}", run.stdout);
    let second = env.read(".claude/agents/x.md");
    env.define(
        "x",
        "---\ndescription: three\nagents: [claude-code]\n---\nThree.\n",
    );
    env.sync_ok(&[]);
    let runs = env.backups();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let mirrored = |run: &Path| {
        let canonical = fs::canonicalize(env.home.join(".claude/agents/x.md")).unwrap();
        fs::read_to_string(run.join(canonical.strip_prefix("/").unwrap())).unwrap()
    };
    assert_eq!(mirrored(&runs[0]), first);
    assert_eq!(mirrored(&runs[1]), second);
    // Prune backs up what it removes.
    env.undefine("x");
    env.sync_ok(&["--prune"]);
    assert_eq!(env.backups().len(), 3);
}

#[test]
fn pruning_an_agy_subagent_removes_its_folder_only_when_empty() {
    let env = Env::new();
    env.install(&["agy"]);
    env.simple("x", "agy");
    env.simple("y", "agy");
    env.sync_ok(&[]);
    assert!(env.exists(".gemini/config/agents/x/agent.md"));
    // The user keeps a file of their own next to y's definition.
    fs::write(env.home.join(".gemini/config/agents/y/notes.txt"), "mine").unwrap();
    env.undefine("x");
    env.undefine("y");
    env.sync_ok(&["--prune"]);
    assert!(
        !env.exists(".gemini/config/agents/x"),
        "the emptied folder of x stays behind"
    );
    assert!(!env.exists(".gemini/config/agents/y/agent.md"));
    assert_eq!(env.read(".gemini/config/agents/y/notes.txt"), "mine");
    assert!(env.exists(".gemini/config/agents"));
}

#[test]
fn temp_files_left_by_a_killed_sync_are_removed_by_the_next_one() {
    let env = Env::new();
    env.install(&["claude-code", "agy"]);
    env.simple("x", "\"claude-code\", \"agy\"");
    env.sync_ok(&[]);
    let debris = [
        ".claude/agents/.acp-host-a1B2c3.tmp",
        ".gemini/config/agents/x/.acp-host-Zz9yY8.tmp",
    ];
    for rel in debris {
        env.write(rel, "half a file");
    }
    // Files that only look alike, and debris in a folder sync does not write, are not ours.
    let kept = [
        ".claude/agents/.acp-host-notes.tmp",
        ".claude/.acp-host-a1B2c3.tmp",
    ];
    for rel in kept {
        env.write(rel, "theirs");
    }
    let backup_debris = env
        .state
        .join("acp-host/backups/20260101T000000.000Z/.acp-host-q1w2e3.tmp");
    fs::create_dir_all(backup_debris.parent().unwrap()).unwrap();
    fs::write(&backup_debris, "").unwrap();

    // A dry run writes nothing, debris included.
    env.sync_ok(&["--dry-run"]);
    assert!(debris.iter().all(|rel| env.exists(rel)));

    env.undefine("x");
    env.sync_ok(&["--prune"]);
    for rel in debris {
        assert!(!env.exists(rel), "{rel} removed");
    }
    assert!(!backup_debris.exists());
    assert!(
        !env.exists(".gemini/config/agents/x"),
        "the debris no longer blocks removing agy's folder"
    );
    for rel in kept {
        assert_eq!(env.read(rel), "theirs");
    }
}

#[test]
fn old_backup_runs_are_pruned_to_keep_backups() {
    let env = Env::new();
    env.install(&["claude-code"]);
    // A folder that is not one of our runs is never touched by retention.
    let foreign = env.state.join("acp-host/backups/keep-me");
    fs::create_dir_all(&foreign).unwrap();
    let mut versions = Vec::new();
    for n in 0..4 {
        env.define(
            "x",
            &format!("---\ndescription: v{n}\nagents: [claude-code]\n---\nV{n}.\n"),
        );
        env.sync_ok(&["--keep-backups", "2"]);
        versions.push(env.read(".claude/agents/x.md"));
    }
    let runs: Vec<PathBuf> = env
        .backups()
        .into_iter()
        .filter(|r| *r != foreign)
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let canonical = fs::canonicalize(env.home.join(".claude/agents/x.md")).unwrap();
    let mirrored =
        |run: &Path| fs::read_to_string(run.join(canonical.strip_prefix("/").unwrap())).unwrap();
    // The newest two backups hold the versions before the last two updates.
    assert_eq!(mirrored(&runs[0]), versions[1]);
    assert_eq!(mirrored(&runs[1]), versions[2]);
    assert!(foreign.is_dir());
}

#[test]
fn a_symlink_out_of_the_target_folder_is_never_written() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    let outside = env.home.join("dotfiles-x.md");
    fs::write(&outside, "theirs\n").unwrap();
    fs::create_dir_all(env.home.join(".claude/agents")).unwrap();
    symlink(&outside, env.home.join(".claude/agents/x.md")).unwrap();
    let run = env.sync(&["--force", "claude-code/x"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stdout.contains("refusing to write through"),
        "{}",
        run.stdout
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "theirs\n");
}

#[test]
fn a_symlink_inside_the_target_folder_is_written_through() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    env.sync_ok(&[]);
    let agents = env.home.join(".claude/agents");
    fs::rename(agents.join("x.md"), agents.join("real-x.md")).unwrap();
    symlink("real-x.md", agents.join("x.md")).unwrap();
    env.define(
        "x",
        "---\ndescription: d\nagents: [claude-code]\n---\nChanged.\n",
    );
    env.sync_ok(&[]);
    assert!(
        fs::symlink_metadata(agents.join("x.md"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        fs::read_to_string(agents.join("real-x.md"))
            .unwrap()
            .contains("Changed.")
    );
}

#[test]
fn two_targets_joined_by_a_symlink_collide() {
    let env = Env::new();
    env.install(&["claude-code", "grok"]);
    env.simple("x", "claude-code, grok");
    fs::create_dir_all(env.home.join(".claude/agents")).unwrap();
    symlink(
        env.home.join(".claude/agents"),
        env.home.join(".grok/agents"),
    )
    .unwrap();
    let run = env.sync(&[]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("error: collision: "), "{}", run.stderr);
    assert!(!env.exists(".claude/agents/x.md"));
}

#[test]
fn the_file_mode_is_kept() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    env.sync_ok(&[]);
    let path = env.home.join(".claude/agents/x.md");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    env.define(
        "x",
        "---\ndescription: d\nagents: [claude-code]\n---\nChanged.\n",
    );
    env.sync_ok(&[]);
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // A read-only managed file is replaced (its folder is writable) and stays read-only.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
    env.define(
        "x",
        "---\ndescription: d\nagents: [claude-code]\n---\nChanged again.\n",
    );
    env.sync_ok(&[]);
    assert!(
        env.read(".claude/agents/x.md")
            .ends_with("Changed again.\n")
    );
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o444
    );
}

// ---- CLI surface ----

#[test]
fn a_force_that_matches_no_conflict_is_rejected_and_nothing_is_written() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    let run = env.sync(&["--force", "claude-code/x"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("--force claude-code/x matches no conflict (it is create)"),
        "{}",
        run.stderr
    );
    assert!(!env.exists(".claude/agents/x.md"));
}

#[test]
fn agent_filter_and_usage_errors() {
    let env = Env::new();
    env.install(&["claude-code", "codex"]);
    env.simple("x", "claude-code, codex");
    assert_eq!(
        env.actions(&["--agent", "codex"]),
        [pair("create", "codex/x")]
    );
    // Aliases resolve to the canonical name.
    assert_eq!(
        env.actions(&["--agent", "claude"]),
        [pair("create", "claude-code/x")]
    );
    for args in [
        &["--agent", "nope"][..],
        &["--agent", "acp-child"],
        &["--scope", "galaxy"],
        &["--bogus"],
    ] {
        let run = env.sync(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
    assert!(!env.exists(".codex/agents"));
}

#[test]
fn project_scope_writes_under_the_project_root() {
    let env = Env::new();
    env.install(&["claude-code", "github-copilot", "opencode", "grok"]);
    env.simple("x", "claude-code, github-copilot, opencode, grok");
    let run = env.sync_ok(&["--scope", "project"]);
    assert!(
        run.stdout.contains("grok has no project scope"),
        "{}",
        run.stdout
    );
    for rel in [
        ".claude/agents/x.md",
        ".github/agents/x.agent.md",
        ".opencode/agents/x.md",
    ] {
        assert!(env.project.join(rel).is_file(), "{rel}");
    }
    assert!(!env.exists(".claude/agents"));
    let root = tempfile::tempdir().unwrap();
    env.sync_ok(&[
        "--scope",
        "project",
        "--project-root",
        root.path().to_str().unwrap(),
    ]);
    assert!(root.path().join(".claude/agents/x.md").is_file());
}

/// Every agent that takes definitions, in registry order.
const ALL_TARGETS: [&str; 13] = [
    "claude-code",
    "codex",
    "gemini",
    "opencode",
    "github-copilot",
    "agy",
    "grok",
    "pi",
    "dsh",
    "cursor",
    "factory-droid",
    "kiro",
    "qwen-code",
];

/// The five targets of issue 45, each with its user (and project) file for subagent `x`.
const NEW_TARGETS: [(&str, &str); 5] = [
    ("gemini", ".gemini/agents/x.md"),
    ("cursor", ".cursor/agents/x.md"),
    ("factory-droid", ".factory/droids/x.md"),
    ("kiro", ".kiro/agents/x.md"),
    ("qwen-code", ".qwen/agents/x.md"),
];

#[test]
fn one_definition_reaches_all_thirteen_targets_in_one_run() {
    let env = Env::new();
    env.install(&ALL_TARGETS);
    env.write(".pi/agent/extensions/subagent/index.ts", "export {}\n");
    env.simple("x", &ALL_TARGETS.map(|a| format!("\"{a}\"")).join(", "));
    env.simple("y", "dsh");
    let json = env.sync(&["--json"]).json();
    assert_eq!(json["success"], true, "{json}");
    let ops = json["operations"].as_array().unwrap();
    let agents: Vec<&str> = ops
        .iter()
        .filter(|op| op["name"] == "x")
        .map(|op| op["agent"].as_str().unwrap())
        .collect();
    assert_eq!(
        agents, ALL_TARGETS,
        "one operation per target, registry order"
    );
    assert!(ops.iter().all(|op| op["action"] == "create"), "{json}");
    // 12 dedicated files and one shared file holding both DSH items: one write each.
    let files = json["result"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 13, "{json}");
    assert!(files.iter().all(|f| f["outcome"] == "applied"));
    let cordis = yaml(&env.read(CORDIS));
    assert_eq!(cordis.as_array().unwrap().len(), 2);
    for (_, rel) in NEW_TARGETS {
        let text = env.read(rel);
        assert!(text.starts_with("---\nname: \"x\"\ndescription: \"x things\"\n---\n<!-- "));
        assert!(text.contains(&marker("x")), "{rel}");
    }
    // A second run is a no-op everywhere.
    let ops = env.actions(&[]);
    assert!(ops.iter().all(|(action, _)| action == "noop"), "{ops:?}");
}

#[test]
fn the_new_targets_keep_every_invariant_in_both_scopes() {
    let env = Env::new();
    env.install(&NEW_TARGETS.map(|(agent, _)| agent));
    let five = "gemini, cursor, factory-droid, kiro, qwen-code";
    env.simple("x", five);
    // Project scope: every one of them has it.
    env.sync_ok(&["--scope", "project"]);
    for (_, rel) in NEW_TARGETS {
        assert!(env.project.join(rel).is_file(), "{rel}");
        assert!(!env.exists(rel), "{rel}: nothing under $HOME");
    }
    // User scope: an unmanaged Cursor file is a conflict, kept byte for byte, and the blocked
    // plan writes nothing at all.
    let mine = "---\nname: x\ndescription: mine\nreadonly: true\n---\nMy own.\n";
    env.write(".cursor/agents/x.md", mine);
    let run = env.sync(&[]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains("(resolve with --force cursor/x)"),
        "{}",
        run.stdout
    );
    assert_eq!(env.read(".cursor/agents/x.md"), mine);
    assert!(!env.exists(".gemini/agents/x.md"));
    // Another target's force does not authorize it.
    assert_eq!(env.sync(&["--force", "kiro/x"]).code, 1);
    assert_eq!(env.read(".cursor/agents/x.md"), mine);
    env.sync_ok(&["--force", "cursor/x"]);
    assert!(env.read(".cursor/agents/x.md").contains(&marker("x")));
    assert!(env.actions(&[]).iter().all(|(action, _)| action == "noop"));
    // Drop two agents: their files are managed orphans, pruned only with --prune; a file of the
    // user's beside them is never reported or touched.
    env.write(".kiro/agents/notes.md", "mine\n");
    env.simple("x", "gemini, factory-droid, qwen-code");
    let ops = env.actions(&[]);
    assert!(ops.contains(&pair("orphan", "cursor/x")), "{ops:?}");
    assert!(ops.contains(&pair("orphan", "kiro/x")), "{ops:?}");
    assert!(
        !ops.iter().any(|(_, target)| target == "kiro/notes"),
        "{ops:?}"
    );
    env.sync_ok(&[]);
    assert!(
        env.exists(".cursor/agents/x.md"),
        "orphans are kept without --prune"
    );
    env.sync_ok(&["--prune"]);
    assert!(!env.exists(".cursor/agents/x.md"));
    assert!(!env.exists(".kiro/agents/x.md"));
    assert_eq!(env.read(".kiro/agents/notes.md"), "mine\n");
    assert!(env.exists(".gemini/agents/x.md"));
}

#[test]
fn check_reports_drift_per_target_and_the_fields_each_target_drops() {
    let env = Env::new();
    env.install(&["codex", "cursor", "kiro"]);
    env.define(
        "review",
        "---\ndescription: \"Review\"\nagents: [codex, cursor, kiro]\nrun: {tools: [read]}\ncursor: {readonly: true}\nkiro: {tools: [read]}\n---\n\nReview.\n",
    );
    let before = env.tree();
    let run = env.sync(&["--check"]);
    assert_eq!(run.code, 1, "everything is missing: drift");
    assert_eq!(env.tree(), before, "--check writes nothing");
    assert!(
        run.stdout.ends_with(
            "check: 3 target(s) drift (codex 1, cursor 1, kiro 1), 0 conflict(s), 0 error(s); out of sync; nothing written\n"
        ),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stderr,
        "warning: codex/review: tools (set by run.tools, kiro.tools) has no equivalent in codex; its file is written without it\n\
         warning: codex/review: readonly (set by cursor.readonly) has no equivalent in codex; its file is written without it\n\
         warning: cursor/review: tools (set by run.tools, kiro.tools) has no equivalent in cursor; its file is written without it\n\
         warning: kiro/review: readonly (set by cursor.readonly) has no equivalent in kiro; its file is written without it\n"
    );
    env.sync_ok(&[]);
    let run = env.sync(&["--check"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout.ends_with(
            "check: 0 target(s) drift, 0 conflict(s), 0 error(s); in sync; nothing written\n"
        ),
        "{}",
        run.stdout
    );
    // A hand edit of a managed file is drift on that target alone.
    let edited = env
        .read(".kiro/agents/review.md")
        .replace("Review.", "Edited.");
    env.write(".kiro/agents/review.md", &edited);
    let json = env.sync(&["--check", "--json"]).json();
    assert_eq!(json["success"], false);
    assert_eq!(json["check"], true);
    assert_eq!(json["dryRun"], true);
    let drifting: Vec<&str> = json["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["action"] != "noop")
        .map(|op| op["agent"].as_str().unwrap())
        .collect();
    assert_eq!(drifting, ["kiro"]);
    assert_eq!(json["dropped"].as_array().unwrap().len(), 4);
    assert_eq!(
        json["dropped"][0]["setBy"],
        serde_json::json!(["run.tools", "kiro.tools"])
    );
    assert_eq!(env.read(".kiro/agents/review.md"), edited);
    // An orphan is drift too: the target holds what no definition says.
    env.sync_ok(&[]);
    env.simple("review", "codex, kiro");
    assert_eq!(env.sync(&["--check"]).code, 1);
    env.sync_ok(&["--prune"]);
    assert_eq!(env.sync(&["--check"]).code, 0);
}

#[test]
fn adopt_turns_an_agents_own_files_into_canonical_ones_and_takes_them_over_only_when_told() {
    let env = Env::new();
    env.install(&["claude-code"]);
    let originals = [
        (
            "alpha",
            "---\nname: alpha\ndescription: Alpha things\nmodel: sonnet\ntools: Read, Grep\n---\nDo alpha.\n",
        ),
        (
            "beta",
            "---\nname: beta\ndescription: \"Beta: with a colon\"\n---\n\nDo beta.\n\nCarefully.\n",
        ),
        (
            "gamma",
            "---\nname: gamma\ndescription: Gamma\ncolor: blue\n---\nDo gamma.\n",
        ),
    ];
    for (name, text) in originals {
        env.write(&format!(".claude/agents/{name}.md"), text);
    }
    env.write(".claude/agents/README.txt", "notes\n");
    let canonical = |name: &str| env.project.join("subagents").join(format!("{name}.md"));
    let before = env.tree();
    let run = env.sync(&["--adopt", "claude-code", "--dry-run"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!canonical("alpha").exists(), "a dry run writes nothing");
    // Adopting writes the canonical files and leaves every original as it was.
    let run = env.sync(&["--adopt", "claude-code"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(env.tree(), before, "the originals are untouched");
    assert_eq!(
        fs::read_to_string(canonical("alpha")).unwrap(),
        "---\ndescription: \"Alpha things\"\nagents: [\"claude-code\"]\nclaude-code: {\"model\": \"sonnet\", \"tools\": \"Read, Grep\"}\n---\n\nDo alpha.\n"
    );
    assert_eq!(
        fs::read_to_string(canonical("beta")).unwrap(),
        "---\ndescription: \"Beta: with a colon\"\nagents: [\"claude-code\"]\n---\n\nDo beta.\n\nCarefully.\n"
    );
    assert_eq!(
        run.stderr,
        "warning: claude-code/gamma: lost color: not an option acp-host knows for claude-code; dropped\n"
    );
    assert!(
        run.stdout.ends_with(
            "adopt: 3 adopted, 0 unchanged, 0 managed already, 0 conflict(s), 0 error(s); 3 original(s) left as the agent's (take them over with --adopt-mark, or --force claude-code/NAME each; one that lost a field needs its --force)\n"
        ),
        "{}",
        run.stdout
    );
    // The originals are still the agent's: a plain sync conflicts on each.
    assert_eq!(env.sync(&["--dry-run"]).code, 1);
    // --adopt-mark takes over only what was read back whole: gamma lost a field and needs its
    // own force, so the marking sync is blocked and nothing is marked.
    let run = env.sync(&["--adopt", "claude-code", "--adopt-mark"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains("conflict  claude-code/gamma"),
        "{}",
        run.stdout
    );
    assert_eq!(env.tree(), before);
    let run = env.sync(&[
        "--adopt",
        "claude-code",
        "--adopt-mark",
        "--force",
        "claude-code/gamma",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("adopt: 0 adopted, 3 unchanged"),
        "{}",
        run.stdout
    );
    for (name, _) in originals {
        let text = env.read(&format!(".claude/agents/{name}.md"));
        assert!(text.contains(&marker(name)), "{name}: {text}");
    }
    assert!(!env.read(".claude/agents/gamma.md").contains("color"));
    assert!(
        env.read(".claude/agents/alpha.md")
            .contains("\ntools: \"Read, Grep\"\n"),
        "Claude's tool list survives the takeover as written"
    );
    assert_eq!(env.read(".claude/agents/README.txt"), "notes\n");
    assert_eq!(env.backups().len(), 1, "each original was backed up first");
    // A second sync is a no-op, and adopting again finds them managed already.
    let ops = env.actions(&[]);
    assert_eq!(ops.len(), 3);
    assert!(ops.iter().all(|(action, _)| action == "noop"), "{ops:?}");
    let json = env.sync(&["--adopt", "claude-code", "--json"]).json();
    assert_eq!(json["success"], true);
    assert!(
        json["adoptions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["action"] == "managed"),
        "{json}"
    );
}

#[test]
fn adopt_never_replaces_a_canonical_file_and_refuses_what_it_cannot_read() {
    let env = Env::new();
    env.install(&["cursor", "dsh"]);
    env.write(
        ".cursor/agents/x.md",
        "---\nname: x\ndescription: Cursor x\nreadonly: true\nis_background: true\n---\nX.\n",
    );
    env.write(".cursor/agents/y.md", "no frontmatter\n");
    env.define(
        "x",
        "---\ndescription: mine\nagents: [cursor]\n---\n\nMine.\n",
    );
    let run = env.sync(&["--adopt", "cursor"]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("conflict  cursor/x"), "{}", run.stdout);
    assert!(run.stdout.contains("error     cursor/y"), "{}", run.stdout);
    assert!(run.stdout.contains("nothing written"), "{}", run.stdout);
    assert_eq!(
        fs::read_to_string(env.project.join("subagents/x.md")).unwrap(),
        "---\ndescription: mine\nagents: [cursor]\n---\n\nMine.\n"
    );
    assert!(!env.project.join("subagents/y.md").exists());
    // Only the names given; the project scope reads the project's folder.
    env.undefine("x");
    let run = env.sync(&["--adopt", "cursor", "x"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let adopted = fs::read_to_string(env.project.join("subagents/x.md")).unwrap();
    assert!(
        adopted.contains("cursor: {\"is_background\": true, \"readonly\": true}"),
        "{adopted}"
    );
    assert_eq!(env.sync(&["--adopt", "cursor", "nope"]).code, 1);
    assert_eq!(
        env.sync(&["--adopt", "cursor", "--scope", "project"]).code,
        0
    );
    // A shared file, an agent without the scope, a bad name and names without an agent are
    // refused.
    assert_eq!(env.sync(&["--adopt", "dsh"]).code, 1);
    let run = env.sync(&["--adopt", "grok", "--scope", "project"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("grok has no project scope"),
        "{}",
        run.stderr
    );
    assert_eq!(env.sync(&["--adopt", "cursor", "Bad"]).code, 2);
    assert_eq!(env.sync(&["--adopt", "aikito", "x"]).code, 2);
    assert_eq!(env.sync(&["--adopt", "nope"]).code, 2);
}

#[test]
fn json_result_is_structured_per_file() {
    let env = Env::new();
    env.install(&["claude-code", "dsh"]);
    env.simple("x", "claude-code, dsh, grok");
    let json = env.sync(&["--json"]).json();
    assert_eq!(json["success"], true);
    let result = &json["result"];
    assert_eq!(result["partial"], false);
    assert_eq!(result["failedFiles"], serde_json::json!([]));
    let outcomes: Vec<&str> = result["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes.iter().filter(|o| **o == "applied").count(), 2);
    assert_eq!(outcomes.iter().filter(|o| **o == "skipped").count(), 1);
}

#[test]
fn help_teaches_with_examples() {
    let env = Env::new();
    let run = env.command(&["sync", "--help"]);
    assert_eq!(run.code, 0);
    for needle in [
        "Examples:",
        "--force <AGENT/NAME>",
        "--dry-run",
        "Exit codes:",
        "subagents/review.md",
    ] {
        assert!(run.stdout.contains(needle), "{needle}: {}", run.stdout);
    }
    let run = env.command(&["agents", "--help"]);
    assert!(run.stdout.contains("Examples:"));
}

#[test]
fn agents_lists_the_registry_with_evidence() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.on_path("codex");
    let run = env.command(&["agents"]);
    assert_eq!(run.code, 0);
    let line = |name: &str| {
        run.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {}", run.stdout))
            .to_owned()
    };
    assert!(line("claude-code").contains("installed (~/.claude exists)"));
    assert!(
        line("claude-code")
            .contains("~/.claude/agents/{name}.md (project: .claude/agents/{name}.md)")
    );
    assert!(line("claude-code").contains("acp: claude-code-acp"));
    assert!(line("codex").contains("installed (`codex` on PATH)"));
    assert!(line("grok").contains("not installed"));
    assert!(line("pi").contains("[needs ~/.pi/agent/extensions/subagent/index.ts]"));
    let json = env.command(&["agents", "--json"]).json();
    let agents = json["agents"].as_array().unwrap();
    let codex = agents.iter().find(|a| a["name"] == "codex").unwrap();
    assert_eq!(codex["installed"], true);
    assert_eq!(codex["availability"]["evidence"], "codex");
    assert_eq!(codex["sync"]["options"][0]["name"], "model");
}

// ---- Properties through the binary ----

mod properties {
    use std::fmt::Write as _;

    use proptest::prelude::*;
    use protocol::sync::dsh;

    use super::*;

    const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

    /// The file without the items we manage: the bytes a sync must never change.
    fn outside_managed(text: &str) -> String {
        let Ok(items) = dsh::locate(text.as_bytes()) else {
            return text.to_owned();
        };
        let mut edits = dsh::Edits::default();
        for (i, item) in items.iter().enumerate() {
            if item.our_name().is_some_and(|n| item.managed_for(n)) {
                edits.items.insert(i, None);
            }
        }
        dsh::apply(text, &items, &edits)
    }

    fn foreign() -> impl Strategy<Value = String> {
        (
            "[a-z]{1,8}",
            prop::collection::vec("[a-zA-Z0-9:#'-][a-zA-Z0-9 :#'-]{0,19}", 1..3),
            "[a-z ]{0,12}",
        )
            .prop_map(|(id, lines, comment)| {
                let mut item = format!("# {comment}\n- id: {id}\n  persona: |-\n");
                for line in lines {
                    let _ = writeln!(item, "    {line}");
                }
                item
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        #[test]
        fn outside_bytes_never_change_and_a_second_sync_is_a_noop(
            foreign_items in prop::collection::vec(foreign(), 1..4),
            first in prop::collection::btree_set(0..NAMES.len(), 0..=NAMES.len()),
            second in prop::collection::btree_set(0..NAMES.len(), 0..=NAMES.len()),
            bodies in prop::collection::vec("[a-zA-Z :#'\n-]{1,30}", NAMES.len()),
        ) {
            let env = Env::new();
            env.install(&["dsh"]);
            let original = foreign_items.concat();
            env.write(CORDIS, &original);
            for (round, defined) in [&first, &second].into_iter().enumerate() {
                for (i, name) in NAMES.iter().enumerate() {
                    let path = env.project.join("subagents").join(format!("{name}.md"));
                    if defined.contains(&i) {
                        let body = format!("{}\nround {round}", bodies[i].trim());
                        env.define(name, &format!("---\ndescription: d\nagents: [dsh]\n---\n{body}\n"));
                    } else if path.exists() {
                        env.undefine(name);
                    }
                }
                let before = env.read(CORDIS);
                let run = env.sync(&["--prune"]);
                prop_assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
                let after = if env.exists(CORDIS) { env.read(CORDIS) } else { String::new() };
                prop_assert_eq!(outside_managed(&after), outside_managed(&before));
                prop_assert_eq!(outside_managed(&after), original.clone());
                let json = env.sync(&["--prune", "--json"]).json();
                prop_assert_eq!(&json["changes"], 0, "{}", json);
                prop_assert_eq!(env.read(CORDIS), after);
            }
        }
    }
}

// ---- Failed writes ----

#[test]
fn a_failed_backup_writes_nothing() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "claude-code");
    env.sync_ok(&[]);
    env.define(
        "x",
        "---\ndescription: d\nagents: [claude-code]\n---\nChanged.\n",
    );
    let before = env.read(".claude/agents/x.md");
    // The backup root is a file: no backup folder can be made (even as root).
    let backups = env.state.join("acp-host/backups");
    fs::create_dir_all(backups.parent().unwrap()).unwrap();
    fs::write(&backups, "not a folder").unwrap();
    let json = env.sync(&["--json"]).json();
    assert_eq!(json["success"], false);
    let result = &json["result"];
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .starts_with("cannot back up "),
        "{result}"
    );
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .ends_with("nothing was written"),
        "{result}"
    );
    assert_eq!(result["partial"], false);
    assert_eq!(result["files"][0]["outcome"], "failed");
    assert_eq!(env.read(".claude/agents/x.md"), before);
    assert_eq!(env.sync(&[]).code, 1);
}

/// A write that fails after another succeeded: reported per file, as a partial run.
#[test]
fn a_failed_write_reports_the_file_and_replaces_nothing() {
    use acp_host::sync_exec::Outcome;
    use protocol::sync::{Change, FilePlan, Plan};

    let env = Env::new();
    let good = env.home.join("a/good.md");
    fs::write(env.home.join("blocker"), "a file where a folder should be").unwrap();
    let bad = env.home.join("blocker/sub/bad.md");
    let file = |target: &Path| FilePlan {
        path: target.to_path_buf(),
        target: target.to_path_buf(),
        pre_image: Some(acp_host::sync_exec::read_facts(target)),
        change: Change::Write(b"new\n".to_vec()),
        operations: Vec::new(),
    };
    let plan = Plan {
        operations: Vec::new(),
        files: vec![file(&good), file(&bad)],
        errors: Vec::new(),
    };
    let exec = acp_host::sync_exec::ExecConfig::for_user(&env.home, Some(&env.state))
        .expect("a state folder");
    let result = acp_host::sync_exec::execute(&plan, &exec);
    // Every new file is written beside its target before the first rename, so a file that
    // cannot be written stops the run with no target replaced.
    assert!(!result.success);
    assert!(!result.partial && !result.recovery_required());
    assert_eq!(result.failed_files, [bad]);
    let error = result.error.as_deref().unwrap();
    assert!(
        error.starts_with("write failed: cannot inspect "),
        "{error}"
    );
    assert!(error.ends_with("; nothing was written"), "{error}");
    let outcomes: Vec<_> = result.files.iter().map(|f| f.outcome).collect();
    assert_eq!(outcomes, [Outcome::Skipped, Outcome::Failed]);
    assert_eq!(
        result.files[0].detail.as_deref(),
        Some("not written: another file could not be written")
    );
    assert!(!good.exists(), "no target is written");
    let debris: Vec<_> = fs::read_dir(env.home.join("a")).unwrap().collect();
    assert!(debris.is_empty(), "the staged file is removed: {debris:?}");
}

// ---- Whole human reports ----

impl Env {
    /// A run's exit code, stdout and stderr, with the temporary root as `[ROOT]` and the backup
    /// run folder's timestamp as `[STAMP]`, for a snapshot.
    fn report(&self, run: &Run) -> String {
        let root = self.home.parent().unwrap().display().to_string();
        let text = format!(
            "exit: {}\n--- stdout\n{}--- stderr\n{}",
            run.code, run.stdout, run.stderr
        )
        .replace(&root, "[ROOT]");
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("backups/") {
            let (head, tail) = rest.split_at(at + "backups/".len());
            out.push_str(head);
            let stamp = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .unwrap_or(tail.len());
            out.push_str("[STAMP]");
            rest = &tail[stamp..];
        }
        out.push_str(rest);
        out
    }
}

#[test]
fn human_reports() {
    let env = Env::new();
    env.install(&["claude-code", "codex", "dsh"]);
    env.simple("review", "\"claude-code\", \"dsh\"");
    env.simple("verify", "\"claude-code\", \"codex\"");
    insta::assert_snapshot!("report_create", env.report(&env.sync(&[])));
    insta::assert_snapshot!("report_noop", env.report(&env.sync(&[])));

    env.define(
        "review",
        "---\ndescription: \"review things\"\nagents: [\"claude-code\", \"dsh\"]\n---\n\nDo review, twice.\n",
    );
    insta::assert_snapshot!(
        "report_dry_run_with_diff",
        env.report(&env.sync(&["--dry-run", "--diff"]))
    );

    env.write(".codex/agents/mine.toml", "name = \"mine\"\n");
    env.simple("mine", "\"codex\"");
    insta::assert_snapshot!("report_conflict", env.report(&env.sync(&[])));
    env.undefine("mine");

    env.undefine("verify");
    insta::assert_snapshot!("report_orphans", env.report(&env.sync(&[])));
    insta::assert_snapshot!("report_prune", env.report(&env.sync(&["--prune"])));
}

// ---- Concurrency: deterministic pause points (`ACP_HOST_SYNC_PAUSE`) ----

const DEADLINE: Duration = Duration::from_secs(20);

impl Env {
    /// A `sync` child that stops at `point` until [`Env::release`].
    fn paused_sync(&self, point: &str, args: &[&str]) -> std::process::Child {
        let mut all = vec!["sync"];
        all.extend_from_slice(args);
        let child = self
            .cmd(&all)
            .env(
                protocol::env_vars::ACP_HOST_SYNC_PAUSE,
                format!("{point}:{}", self.pauses().display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            wait_for_file(self.pauses().join(format!("{point}.ready")), DEADLINE),
            "the sync never reached {point}"
        );
        child
    }

    fn release(&self, point: &str) {
        fs::write(self.pauses().join(format!("{point}.go")), "").unwrap();
    }

    fn pauses(&self) -> PathBuf {
        let dir = self.home.parent().unwrap().join("pauses");
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}

#[test]
fn two_syncs_take_turns_and_no_wait_fails_at_once() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.simple("x", "dsh");
    // A second source folder with another subagent for the same shared file.
    let other = env.project.join("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(
        other.join("y.md"),
        "---\ndescription: \"y things\"\nagents: [dsh]\n---\n\nDo y.\n",
    )
    .unwrap();
    let first = env.paused_sync("locked", &[]);

    let busy = env.sync(&["--no-wait", "--source", "other"]);
    assert_eq!(busy.code, 1, "{}", busy.stderr);
    assert!(
        busy.stderr
            .starts_with("acp-host: error: another acp-host sync is running"),
        "{}",
        busy.stderr
    );
    assert!(!env.exists(CORDIS), "--no-wait wrote nothing");

    let mut second = env
        .cmd(&["sync", "--source", "other"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_channel(second.stderr.take().unwrap());
    let waiting = lines.recv_timeout(DEADLINE).unwrap();
    assert!(
        waiting.starts_with("waiting for another acp-host sync to finish"),
        "{waiting}"
    );
    env.release("locked");
    let first = wait_output(first);
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let second = wait_output(second);
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    // The second planned after the first wrote: both items are in the file.
    let items = yaml(&env.read(CORDIS));
    let ids: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["acp-host-subagent-x", "acp-host-subagent-y"]);
}

#[test]
fn a_file_edited_during_the_sync_is_not_overwritten() {
    let env = Env::new();
    env.install(&["claude-code", "dsh"]);
    env.simple("x", "\"claude-code\", \"dsh\"");
    env.simple("y", "\"claude-code\"");
    env.sync_ok(&[]);
    for name in ["x", "y"] {
        env.define(
            name,
            &format!("---\ndescription: d\nagents: [\"claude-code\", \"dsh\"]\n---\nNew {name}.\n"),
        );
    }
    let sync = env.paused_sync("writing", &[]);
    // The user edits the shared file and one dedicated file after the plan was checked.
    let edited_dsh = format!("{}- id: mine\n  name: mine\n", env.read(CORDIS));
    env.write(CORDIS, &edited_dsh);
    env.write(".claude/agents/x.md", "my own x\n");
    env.release("writing");
    let output = wait_output(sync);
    let stderr = acp_tests::stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(env.read(CORDIS), edited_dsh, "the edit survives");
    assert_eq!(env.read(".claude/agents/x.md"), "my own x\n");
    assert!(
        env.read(".claude/agents/y.md").ends_with("New y.\n"),
        "the rest of the plan is written"
    );
    assert!(
        stderr.contains("failed: ~/.claude/agents/x.md: changed during the sync; not written"),
        "{stderr}"
    );
    assert!(stderr.contains("error: plan is stale: "), "{stderr}");
    let stdout = acp_tests::stdout(&output);
    assert!(
        stdout.ends_with(&format!(
            "sync: 1 applied, 0 noop, 0 skipped, 0 conflicted, 2 failed (files); backups in {}/acp-host/backups/{}\n",
            env.state.display(),
            stdout.trim_end().rsplit('/').next().unwrap()
        )),
        "{stdout}"
    );
}

#[test]
fn a_folder_swapped_for_a_symlink_during_the_sync_is_not_written_through() {
    let env = Env::new();
    env.install(&["claude-code"]);
    env.simple("x", "\"claude-code\"");
    env.sync_ok(&[]);
    env.define(
        "x",
        "---\ndescription: d\nagents: [\"claude-code\"]\n---\nNew x.\n",
    );
    let elsewhere = env.home.parent().unwrap().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    let sync = env.paused_sync("writing", &[]);
    // After the plan was checked, the folder is moved away and a symlink out of home takes its
    // place.
    let agents = env.home.join(".claude/agents");
    fs::rename(&agents, env.home.join(".claude/agents.moved")).unwrap();
    symlink(&elsewhere, &agents).unwrap();
    env.release("writing");
    let output = wait_output(sync);
    let stderr = acp_tests::stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("failed: ~/.claude/agents/x.md: changed during the sync; not written"),
        "{stderr}"
    );
    let written: Vec<_> = fs::read_dir(&elsewhere).unwrap().collect();
    assert!(written.is_empty(), "nothing lands outside: {written:?}");
    assert!(
        !env.read(".claude/agents.moved/x.md").contains("New x."),
        "the moved folder keeps the old file"
    );
}

#[test]
fn a_name_too_long_for_one_agent_writes_nothing() {
    let env = Env::new();
    env.install(&["claude-code", "github-copilot"]);
    // 249 + `.md` fits in 255 bytes; 249 + `.agent.md` does not.
    let name = "a".repeat(249);
    env.simple(&name, "\"claude-code\", \"github-copilot\"");
    let run = env.sync(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    let json = run.json();
    assert_eq!(json["canApply"], false);
    let copilot = &json["operations"][1];
    assert_eq!(copilot["agent"], "github-copilot");
    assert_eq!(copilot["action"], "error");
    assert!(
        copilot["reason"]
            .as_str()
            .unwrap()
            .starts_with("a file name of 258 bytes is too long"),
        "{copilot}"
    );
    assert_eq!(env.tree(), [], "nothing written, not even for claude-code");
}

#[test]
fn a_byte_order_mark_and_a_copilot_description_are_accepted() {
    let env = Env::new();
    env.install(&["github-copilot"]);
    env.define(
        "x",
        "\u{feff}---\ndescription: canonical\nagents: [github-copilot]\ngithub-copilot: {description: \"for copilot\"}\n---\nBody.\n",
    );
    env.sync_ok(&[]);
    assert!(
        env.read(".copilot/agents/x.agent.md")
            .starts_with("---\ndescription: \"for copilot\"\nname: \"x\"\n---\n")
    );
}

#[test]
fn a_symlinked_folder_that_leaves_home_shows_the_real_destination() {
    let env = Env::new();
    env.install(&["claude-code"]);
    let dotfiles = env.home.parent().unwrap().join("dotfiles/agents");
    fs::create_dir_all(&dotfiles).unwrap();
    symlink(&dotfiles, env.home.join(".claude/agents")).unwrap();
    env.simple("x", "\"claude-code\"");
    let run = env.sync_ok(&[]);
    insta::assert_snapshot!("report_symlinked_folder", env.report(&run));
    assert!(dotfiles.join("x.md").is_file());
}

// ---- Crash consistency ----

/// A small deterministic generator (xorshift64*), so a failing run can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                pending.push(path);
            } else {
                out.push((path.clone(), fs::read(&path).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

fn is_temp(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "tmp")
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".acp-host-"))
}

/// A backup is a whole copy of a version of the file it backs up, never a torn one.
fn assert_backups_whole(env: &Env, old_or_new: &dyn Fn(&Path, &[u8]) -> bool) {
    let backups = env.state.join("acp-host/backups");
    for (path, bytes) in files_under(&backups) {
        if is_temp(&path) {
            continue;
        }
        // `<root>/<run>/<absolute path of the original>`
        let relative = path.strip_prefix(&backups).unwrap();
        let original = Path::new("/").join(relative.components().skip(1).collect::<PathBuf>());
        assert!(
            old_or_new(&original, &bytes),
            "torn backup {}",
            path.display()
        );
    }
}

#[test]
#[expect(
    clippy::print_stderr,
    reason = "the round count, for a person reading a failed run"
)]
fn syncs_killed_at_random_points_leave_every_file_old_or_new() {
    const SEED: u64 = 0x005E_ED0F_C4A5;
    const DEFINITIONS: usize = 30;
    // Bounded for CI: kills stop after this long (or 60 kills), whatever the machine's speed.
    let budget = Duration::from_secs(8);
    let env = Env::new();
    env.install(&["claude-code", "codex", "dsh"]);
    env.write(
        CORDIS,
        "# keep this comment\n- id: mine-1\n  name: first\n# and this one\n- id: mine-2\n  name: second\n",
    );
    let write_version = |version: &str| {
        for i in 0..DEFINITIONS {
            env.define(
                &format!("agent-{i}"),
                &format!(
                    "---\ndescription: \"agent {i}\"\nagents: [\"claude-code\", \"codex\", \"dsh\"]\n---\n\nVersion {version} of agent {i}.\n"
                ),
            );
        }
    };
    // The complete states every file must be in, whatever the kill interrupted: the user's own
    // file before the first sync (its backup is a copy of it), then the two versions.
    let mut versions: Vec<std::collections::BTreeMap<PathBuf, Vec<u8>>> =
        vec![files_under(&env.home).into_iter().collect()];
    // The quicker of two full syncs: one stalled by another program's disk traffic would spread
    // the kill points so far past a usual run that few syncs are killed at all.
    let mut full_sync = Duration::MAX;
    for version in ["A", "B"] {
        write_version(version);
        let start = std::time::Instant::now();
        env.sync_ok(&[]);
        full_sync = full_sync.min(start.elapsed());
        versions.push(files_under(&env.home).into_iter().collect());
    }
    let targets: Vec<PathBuf> = versions[1].keys().cloned().collect();
    let old_or_new = |path: &Path, bytes: &[u8]| {
        versions
            .iter()
            .any(|v| v.get(path).is_some_and(|b| b == bytes))
    };

    let mut rng = Rng(SEED);
    let started = std::time::Instant::now();
    let mut kills = 0;
    let mut round = 0;
    while started.elapsed() < budget && kills < 60 {
        write_version(if round % 2 == 0 { "A" } else { "B" });
        round += 1;
        let mut child = env
            .cmd(&["sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A random point of the run: anywhere from start-up to the end of a full sync.
        let micros = u64::try_from(full_sync.as_micros()).unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(micros)));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();

        for path in &targets {
            let bytes = fs::read(path).unwrap_or_else(|e| panic!("seed {SEED:#x}: {e}"));
            assert!(
                old_or_new(path, &bytes),
                "seed {SEED:#x}, round {round}: {} is neither version",
                path.display()
            );
        }
        let dsh = env.read(CORDIS);
        let items = yaml(&dsh);
        let ids: Vec<&str> = items
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["id"].as_str())
            .collect();
        assert!(ids.starts_with(&["mine-1", "mine-2"]), "{ids:?}");
        assert!(dsh.contains("# keep this comment\n") && dsh.contains("# and this one\n"));
        assert_backups_whole(&env, &old_or_new);
    }
    eprintln!("{kills} syncs killed in {round} rounds (seed {SEED:#x})");
    assert!(kills >= 5, "only {kills} syncs were killed mid-run");

    env.sync_ok(&[]);
    let debris: Vec<PathBuf> = files_under(&env.home)
        .into_iter()
        .chain(files_under(&env.state))
        .map(|(path, _)| path)
        .filter(|path| is_temp(path))
        .collect();
    assert_eq!(
        debris,
        Vec::<PathBuf>::new(),
        "temp files after a clean sync"
    );
}

#[test]
fn adopt_aikito_takes_over_its_marked_files_lists_each_and_nothing_else() {
    let env = Env::new();
    env.install(&["claude-code", "codex"]);
    env.simple("review", "claude-code, codex");
    env.simple("theirs", "claude-code");
    let aikito = |name: &str| {
        format!("generated by aikito from subagents/{name}.md - edits will be overwritten")
    };
    let adopted_md = format!(
        "---\nname: review\n---\n<!-- {} -->\n\nOld.\n",
        aikito("review")
    );
    let adopted_toml = format!("# {}\nname = \"review\"\n", aikito("review"));
    // Aikito's marker for another name: not the exact marker, never adopted.
    let foreign = format!(
        "---\nname: theirs\n---\n<!-- {} -->\n\nMine.\n",
        aikito("other")
    );
    env.write(".claude/agents/review.md", &adopted_md);
    env.write(".codex/agents/review.toml", &adopted_toml);
    env.write(".claude/agents/theirs.md", &foreign);
    // Without --adopt they are conflicts, and nothing is written.
    let run = env.sync(&[]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(env.read(".claude/agents/review.md"), adopted_md);
    // With it, aikito's exact marker is ours for this run; the other file still conflicts.
    assert_eq!(
        env.actions(&["--adopt", "aikito"]),
        [
            pair("update", "claude-code/review"),
            pair("conflict", "claude-code/theirs"),
            pair("update", "codex/review"),
        ]
    );
    env.undefine("theirs");
    let run = env.sync_ok(&["--adopt", "aikito"]);
    let adopted: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| line.contains("adopted: generated by aikito"))
        .collect();
    assert_eq!(
        adopted.len(),
        2,
        "each adopted file is listed:\n{}",
        run.stdout
    );
    let md = env.read(".claude/agents/review.md");
    assert!(
        md.contains(&format!("<!-- {} -->", marker("review"))),
        "{md}"
    );
    assert!(!md.contains("aikito"), "{md}");
    assert!(
        env.read(".codex/agents/review.toml")
            .starts_with(&format!("# {}\n", marker("review")))
    );
    assert_eq!(
        env.read(".claude/agents/theirs.md"),
        foreign,
        "never touched"
    );
    // Ours from now on: a plain sync has nothing to do.
    assert_eq!(
        env.actions(&[]),
        [
            pair("noop", "claude-code/review"),
            pair("noop", "codex/review")
        ]
    );
}

#[test]
fn a_dsh_item_for_an_acp_provider_is_provider_managed_and_carries_the_exact_tool_filter() {
    let env = Env::new();
    env.install(&["dsh"]);
    env.define(
        "review",
        "---\ndescription: d\nagents: [dsh]\nrun: {tools: [], denyTools: [shell]}\ndsh: {provider: acp}\n---\nReview.\n",
    );
    env.define(
        "capped",
        "---\ndescription: d\nagents: [dsh]\ndsh: {provider: acp, maxDepth: 2, providerHonoursDepth: true}\n---\nCap.\n",
    );
    env.sync_ok(&[]);
    let items = yaml(&env.read(CORDIS));
    let config = |id: &str| {
        items
            .as_array()
            .unwrap()
            .iter()
            .find(|item| item["id"] == id)
            .unwrap()["config"]
            .clone()
    };
    let review = config("acp-host-subagent-review");
    assert_eq!(review["maxDepth"], "provider-managed");
    assert_eq!(
        review["toolFilter"],
        serde_json::json!({"allow": [], "deny": ["shell"]})
    );
    assert_eq!(config("acp-host-subagent-capped")["maxDepth"], 2);
    // A number the definition does not say is enforced: refused, naming the field.
    env.define(
        "capped",
        "---\ndescription: d\nagents: [dsh]\ndsh: {provider: acp, maxDepth: 2}\n---\nCap.\n",
    );
    let run = env.sync(&[]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains(
            "field `dsh.maxDepth`: a number (2) must be enforced by the provider: set \
             dsh.providerHonoursDepth: true if provider acp enforces it, or write maxDepth: \
             provider-managed"
        ),
        "{}",
        run.stderr
    );
}
