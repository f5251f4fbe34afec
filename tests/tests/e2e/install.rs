//! What a person meets installing the binaries: `--version` (version, commit when the build
//! knew it, ACP protocol version), shell completions that load in a real bash, and man pages
//! generated from the clap definitions (written to disk, and snapshotted).
//!
//! The `cargo install` of both binaries into a fresh root is `scripts/install-check` (run by
//! `.ci/run`): it builds the workspace a second time, too slow for a test.

use std::process::Command;

use acp_tests::{bin, code, run_to_end, stderr, stdout};

#[test]
fn version_says_the_acp_protocol_version_and_the_commit_when_known() {
    let expected = acp_host::version_text(env!("CARGO_PKG_VERSION"));
    assert!(expected.ends_with("ACP protocol version 1)"), "{expected}");
    for name in ["acp-host", "acp-child"] {
        for flag in ["--version", "-V"] {
            let out = run_to_end(Command::new(bin(name)).arg(flag));
            assert_eq!(code(&out), 0, "{name} {flag}: {}", stderr(&out));
            assert_eq!(
                stdout(&out),
                format!("{name} {expected}\n"),
                "{name} {flag}"
            );
        }
    }
    // Debug builds leave the commit out (a commit must not rebuild them); release builds say it.
    assert_eq!(acp_host::BUILD_COMMIT.is_some(), !cfg!(debug_assertions));
}

/// The bash completion script loads in a real bash, registers itself for acp-host, and completes
/// a subcommand and a flag; acp-child's registers for acp-child.
#[test]
fn bash_completions_load_in_a_real_bash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args, word, expected) in [
        (
            "acp-host",
            &["completions", "bash"][..],
            "comp",
            "completions",
        ),
        (
            "acp-child",
            &["--completions", "bash"][..],
            "--child-idle",
            "--child-idle-timeout",
        ),
    ] {
        let out = run_to_end(Command::new(bin(name)).args(args));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let script = dir.path().join(format!("{name}.bash"));
        std::fs::write(&script, stdout(&out)).unwrap();
        // The completion function is whatever `complete -p` says it registered.
        let probe = format!(
            r#"source "$1" || exit 9
complete -p {name} || exit 8
fn=$(complete -p {name} | sed -E 's/.*-F ([^ ]+).*/\1/')
COMP_WORDS=({name} {word}); COMP_CWORD=1; COMP_LINE="{name} {word}"; COMP_POINT=${{#COMP_LINE}}
"$fn" {name} {word} {name}
printf 'reply:%s\n' "${{COMPREPLY[@]}}""#
        );
        let out = run_to_end(
            Command::new("bash")
                .args(["--norc", "--noprofile", "-c", &probe, "probe"])
                .arg(&script),
        );
        assert_eq!(code(&out), 0, "{name}: {}", stderr(&out));
        let text = stdout(&out);
        let mut lines = text.lines();
        let registered = lines.next().unwrap_or_default();
        assert!(
            registered.starts_with("complete ")
                && registered.contains(" -F ")
                && registered.ends_with(&format!(" {name}")),
            "{name}: {registered}"
        );
        let replies: Vec<&str> = lines.filter_map(|l| l.strip_prefix("reply:")).collect();
        assert_eq!(replies, [expected], "{name}: {text}");
    }
}

#[test]
fn completions_for_every_shell_clap_knows() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run_to_end(Command::new(bin("acp-host")).args(["completions", shell]));
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        assert!(stdout(&out).contains("acp-host"), "{shell}");
        let out = run_to_end(Command::new(bin("acp-child")).args(["--completions", shell]));
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        assert!(stdout(&out).contains("acp-child"), "{shell}");
    }
    let out = run_to_end(Command::new(bin("acp-host")).args(["completions", "tcsh"]));
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("invalid value 'tcsh'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn man_pages_are_written_one_per_subcommand_and_snapshotted() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man/man1");
    let out = run_to_end(
        Command::new(bin("acp-host"))
            .args(["man", "--dir"])
            .arg(&man),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    let mut names: Vec<String> = std::fs::read_dir(&man)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "acp-host-agents.1",
            "acp-host-batch.1",
            "acp-host-completions.1",
            "acp-host-man.1",
            "acp-host-run.1",
            "acp-host-serve.1",
            "acp-host-sync.1",
            "acp-host-trust.1",
            "acp-host-worktrees-list.1",
            "acp-host-worktrees-prune.1",
            "acp-host-worktrees-remove.1",
            "acp-host-worktrees.1",
            "acp-host.1",
        ]
    );
    let run_page = std::fs::read_to_string(man.join("acp-host-run.1")).unwrap();
    assert!(run_page.contains(r"\fBacp\-host run\fR"), "{run_page}");
    // `acp-host man` prints the top page, the same bytes `--dir` wrote.
    let out = run_to_end(Command::new(bin("acp-host")).arg("man"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let top = stdout(&out);
    assert_eq!(
        top,
        std::fs::read_to_string(man.join("acp-host.1")).unwrap()
    );
    insta::assert_snapshot!("acp_host_man_page", top);
    let out = run_to_end(Command::new(bin("acp-child")).arg("--man"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    insta::assert_snapshot!("acp_child_man_page", stdout(&out));
}

#[test]
fn man_into_a_folder_that_cannot_be_made_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, "mine").unwrap();
    let out = run_to_end(
        Command::new(bin("acp-host"))
            .args(["man", "--dir"])
            .arg(&file),
    );
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(
        err.starts_with("acp-host: error: cannot write the man page ")
            && err.contains("not-a-folder"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}
