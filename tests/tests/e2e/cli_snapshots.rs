//! Snapshots of whole command runs users meet first: the help texts (acp-host's and acp-child's)
//! and the agent listing.
//! A change to any of them shows up as a reviewable snapshot diff (`cargo insta review`).

use std::process::Command;

use acp_tests::bin;
use protocol::env_vars;

fn run(args: &[&str], home: &std::path::Path) -> String {
    let out = Command::new(bin("acp-host"))
        .args(args)
        .env(env_vars::HOME, home)
        .env(env_vars::PATH, "/usr/bin:/bin")
        // The ACP Registry cache under the temporary home, never the person's own.
        .env_remove(env_vars::XDG_CACHE_HOME)
        .env("COLUMNS", "100")
        .output()
        .expect("acp-host runs");
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    let mut text = String::from_utf8(out.stdout).expect("UTF-8");
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn help_texts() {
    let home = tempfile::tempdir().unwrap();
    insta::assert_snapshot!("help", run(&["--help"], home.path()));
    insta::assert_snapshot!("run_help", run(&["run", "--help"], home.path()));
    insta::assert_snapshot!("batch_help", run(&["batch", "--help"], home.path()));
    insta::assert_snapshot!("sync_help", run(&["sync", "--help"], home.path()));
    insta::assert_snapshot!("agents_help", run(&["agents", "--help"], home.path()));
    insta::assert_snapshot!("trust_help", run(&["trust", "--help"], home.path()));
    insta::assert_snapshot!("serve_help", run(&["serve", "--help"], home.path()));
}

#[test]
fn acp_child_help() {
    let out = Command::new(bin("acp-child"))
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .expect("acp-child runs");
    assert_eq!(out.status.code(), Some(0));
    insta::assert_snapshot!(String::from_utf8(out.stdout).expect("UTF-8"));
}

#[test]
fn agents_listing_on_a_bare_host() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".claude")).unwrap();
    insta::assert_snapshot!(run(&["agents"], home.path()));
}

#[test]
fn agents_json_on_a_bare_host() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".claude")).unwrap();
    let text = run(&["agents", "--json"], home.path());
    let listing: serde_json::Value = serde_json::from_str(&text).unwrap();
    let schema = protocol::schema::output("agents.json").unwrap();
    protocol::schema::check_keys(&schema, &listing).unwrap();
    insta::assert_snapshot!(text);
}

/// `agents` and `run` resolve agents with one rule: only acp-child is looked up beside acp-host,
/// so a `codex-acp` lying there is neither listed as found nor started by `run --agent codex`.
#[test]
fn agents_and_run_agree_on_programs_beside_acp_host() {
    use std::os::unix::fs::PermissionsExt as _;
    let home = tempfile::tempdir().unwrap();
    let host_dir = tempfile::tempdir().unwrap();
    let host = host_dir.path().join("acp-host");
    std::fs::copy(bin("acp-host"), &host).unwrap();
    for name in ["acp-child", "codex-acp"] {
        let path = host_dir.path().join(name);
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run_host = |args: &[&str]| {
        let run = || {
            Command::new(&host)
                .args(args)
                .current_dir(home.path())
                .env(env_vars::HOME, home.path())
                .env(env_vars::PATH, "/usr/bin:/bin")
                .env_remove(env_vars::ACP_HOST_LOG)
                .output()
        };
        // The copy's write fd may still be open in a child another test thread forked at that
        // moment (until that child execs or closes it): the kernel then refuses the exec.
        let mut output = run();
        let _ = acp_tests::wait_until(acp_tests::HANG_GUARD, || {
            let busy = output
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ExecutableFileBusy);
            if busy {
                output = run();
            }
            !busy
        });
        output.expect("acp-host runs")
    };
    let listing = String::from_utf8(run_host(&["agents"]).stdout).unwrap();
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} line in {listing}"))
            .to_owned()
    };
    assert!(
        line("acp-child").contains("installed (`acp-child` beside acp-host)"),
        "{listing}"
    );
    assert!(line("acp-child").ends_with("acp: acp-child"), "{listing}");
    assert!(line("codex").contains("not installed"), "{listing}");
    assert!(
        line("codex").contains("acp: codex-acp (not found; install:"),
        "{listing}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&run_host(&["agents", "--json"]).stdout).unwrap();
    let codex = &json["agents"][2];
    assert_eq!(codex["name"], "codex");
    assert_eq!(codex["acpCommandFound"], false);
    assert_eq!(json["agents"][0]["availability"]["state"], "beside-host");

    // Refused before anything is spawned, as a usage error: no result record.
    let run = run_host(&["run", "--json", "--agent", "codex", "x"]);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stdout.is_empty());
    let err = String::from_utf8(run.stderr).unwrap();
    assert!(
        err.starts_with(
            "acp-host: error: agent codex is not installed: codex-acp is not on PATH; install it"
        ),
        "{err}"
    );
}

/// Logging is set up once for every subcommand: `sync`'s own log lines reach stderr too.
#[test]
fn sync_logs_like_every_subcommand() {
    let root = tempfile::tempdir().unwrap();
    let (home, project, state) = (
        root.path().join("home"),
        root.path().join("project"),
        root.path().join("state"),
    );
    std::fs::create_dir_all(home.join(".gemini/config")).unwrap();
    std::fs::create_dir_all(project.join("subagents")).unwrap();
    let definition = project.join("subagents/y.md");
    std::fs::write(
        &definition,
        "---\ndescription: \"y things\"\nagents: [agy]\n---\n\nDo y.\n",
    )
    .unwrap();
    let sync = |args: &[&str]| {
        Command::new(bin("acp-host"))
            .arg("sync")
            .args(args)
            .current_dir(&project)
            .env_clear()
            .envs(acp_tests::instrumentation_env())
            .env(env_vars::HOME, &home)
            .env(env_vars::PATH, root.path())
            .env(env_vars::XDG_STATE_HOME, &state)
            .env(env_vars::ACP_HOST_LOG, "debug")
            .output()
            .expect("acp-host runs")
    };
    assert_eq!(sync(&[]).status.code(), Some(0));
    // A file of the user's keeps the subagent's folder when the subagent is pruned: sync logs it.
    std::fs::write(home.join(".gemini/config/agents/y/notes.txt"), "mine").unwrap();
    std::fs::remove_file(&definition).unwrap();
    let pruned = sync(&["--prune"]);
    assert_eq!(pruned.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&pruned.stderr);
    assert!(
        stderr.contains("subagent folder kept"),
        "{stderr}{}",
        String::from_utf8_lossy(&pruned.stdout)
    );
    // Logs to a pipe or a file are plain text: colour codes are for a terminal only.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

/// A page of the manual (`docs/NAME`).
fn doc_page(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The one page of the manual that holds `marker`, with its name.
fn page_holding(marker: &str) -> (String, String) {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut holding: Vec<(String, String)> = std::fs::read_dir(&docs)
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .filter_map(|path| {
            let text = std::fs::read_to_string(&path).expect("a page of docs/");
            let name = path.file_name()?.to_string_lossy().into_owned();
            text.contains(marker).then_some((name, text))
        })
        .collect();
    assert_eq!(holding.len(), 1, "{marker} on exactly one page of docs/");
    holding.remove(0)
}

/// An exit-code row as both places show it: code, name, when (backticks dropped).
type Row = (u8, String, String);

/// The rows of the `Exit codes:` section of a help text (a row clap wrapped is joined again).
fn help_rows(help: &str) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for line in help
        .lines()
        .skip_while(|line| *line != "Exit codes:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
    {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if let Ok(code) = first.parse::<u8>() {
            rows.push((
                code,
                words.next().unwrap_or_default().to_owned(),
                words.collect::<Vec<_>>().join(" "),
            ));
        } else {
            let last = rows.last_mut().expect("a wrapped row follows its row");
            last.2 = format!("{} {}", last.2, line.trim());
        }
    }
    rows
}

/// The rows of the manual's table after `<!-- exit codes: NAME -->` (on whichever page of
/// `docs/` holds it), with the page's name.
fn manual_rows(name: &str) -> (String, Vec<Row>) {
    let marker = format!("<!-- exit codes: {name} -->");
    let (page, text) = page_holding(&marker);
    let after = &text[text.find(&marker).expect("the marker")..];
    let rows = after
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().replace('`', ""))
                .collect();
            assert_eq!(cells.len(), 3, "{line}");
            (
                cells[0].parse().unwrap(),
                cells[1].clone(),
                cells[2].clone(),
            )
        })
        .collect();
    (page, rows)
}

/// The exit-code tables of run, batch, serve, agents and trust: the same in `--help` (through the
/// real binary) and in the manual (`docs/`), row for row, and both are `protocol::exit_table`'s.
#[test]
fn exit_code_tables_agree_between_help_and_the_manual() {
    let home = tempfile::tempdir().unwrap();
    for command in protocol::exit_table::Documented::ALL {
        let help = help_rows(&run(&[command.name(), "--help"], home.path()));
        let table: Vec<Row> = command
            .exit_rows()
            .iter()
            .map(|row| (row.code, row.name.to_owned(), row.when.to_owned()))
            .collect();
        assert_eq!(help, table, "acp-host {} --help", command.name());
        let (page, rows) = manual_rows(command.name());
        assert_eq!(rows, table, "docs/{page}, {}", command.name());
    }
}

/// Every field a batch line takes (`protocol::batch::FIELDS`, what the parser accepts) is named
/// in `batch --help` and has its row in docs/batch.md's table of fields, and no other row is there.
#[test]
fn batch_help_and_its_page_name_every_field_a_line_takes() {
    let home = tempfile::tempdir().unwrap();
    let help = run(&["batch", "--help"], home.path());
    let page = doc_page("batch.md");
    let table = &page[page.find("| field | meaning |").expect("the fields table")..];
    let rows: Vec<&str> = table
        .lines()
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| line.split('`').nth(1))
        .collect();
    let mut documented = rows.clone();
    documented.sort_unstable();
    let mut fields = protocol::batch::FIELDS.to_vec();
    fields.sort_unstable();
    assert_eq!(documented, fields, "docs/batch.md's fields table");
    for field in protocol::batch::FIELDS {
        assert!(
            help.contains(&format!("`{field}`")),
            "batch --help lacks `{field}`"
        );
    }
}

/// `acp-host --help` starts a new user off with an example.
#[test]
fn the_top_help_has_a_first_example() {
    let home = tempfile::tempdir().unwrap();
    let help = run(&["--help"], home.path());
    assert!(
        help.contains("Examples:\n  acp-host run \"hello\""),
        "{help}"
    );
}
