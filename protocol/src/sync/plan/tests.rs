//! Unit tests of the planner: every state-table row, for dedicated files and for DSH items.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::definition::{self, SourceEntry};
use crate::registry::{self, AgentAvailability, Scope};
use crate::sync::{AgentView, ForceTarget, RegistryView, readiness};
use serde_json::Value;

const HOME: &str = "/home/u";

fn def(name: &str, agents: &str) -> Definition {
    let text =
        format!("---\ndescription: \"{name} things\"\nagents: [{agents}]\n---\n\nDo {name}.\n");
    definition::load_set(vec![SourceEntry::File {
        name: format!("{name}.md"),
        contents: text.into_bytes(),
    }])
    .unwrap()
    .remove(0)
}

fn view(installed: &[&str]) -> RegistryView {
    let agents = registry::sync_agents()
        .map(|(spec, target)| {
            let availability = if installed.contains(&spec.name) {
                AgentAvailability::MarkerDir("x".into())
            } else {
                AgentAvailability::NotInstalled
            };
            AgentView {
                spec,
                target,
                readiness: readiness((spec, target), Scope::User, &availability, true, None),
                availability,
            }
        })
        .collect();
    RegistryView {
        scope: Scope::User,
        base: PathBuf::from(HOME),
        agents,
    }
}

/// A snapshot of an in-memory home: `files` maps paths relative to $HOME to contents.
fn snapshot(view: &RegistryView, defs: &[Definition], files: &BTreeMap<&str, String>) -> Snapshot {
    let request = view.scan_request(defs);
    let home = Path::new(HOME);
    let facts = |path: &Path| FileFacts {
        physical: path.to_path_buf(),
        link: None,
        state: files
            .get(path.strip_prefix(home).unwrap().to_str().unwrap())
            .map_or(FileState::Missing, |c| {
                FileState::File(c.clone().into_bytes())
            }),
    };
    let mut snapshot = Snapshot::default();
    for path in &request.files {
        snapshot.files.insert(path.clone(), facts(path));
    }
    for folder in request.folders.keys() {
        let mut entries: Vec<String> = files
            .keys()
            .filter_map(|rel| {
                let rest = home.join(rel);
                let rest = rest.strip_prefix(folder).ok()?;
                Some(rest.components().next()?.as_os_str().to_str()?.to_owned())
            })
            .collect();
        entries.dedup();
        for path in request.candidates(folder, &entries) {
            snapshot.files.insert(path.clone(), facts(&path));
        }
        snapshot.folders.insert(folder.clone(), entries);
    }
    snapshot
}

fn run(
    defs: &[Definition],
    installed: &[&str],
    files: &[(&str, String)],
    auth: &Authorization,
) -> Plan {
    let view = view(installed);
    let files: BTreeMap<&str, String> = files.iter().cloned().collect();
    plan(defs, &view, &snapshot(&view, defs, &files), auth)
}

fn actions(plan: &Plan) -> Vec<(Action, String)> {
    plan.operations
        .iter()
        .map(|op| (op.action, op.target()))
        .collect()
}

fn force(target: &str) -> Authorization {
    Authorization {
        forces: [target.parse::<ForceTarget>().unwrap()].into(),
        prune: false,
        adopt: None,
    }
}

fn prune() -> Authorization {
    Authorization {
        forces: BTreeSet::default(),
        prune: true,
        adopt: None,
    }
}

fn rendered(agent: &str, d: &Definition) -> String {
    render::render_file(registry::find_sync(agent).unwrap().1.format, agent, d)
}

#[test]
fn create_when_missing_and_planning_is_pure() {
    let defs = [def("review", "claude-code, codex")];
    let p = run(
        &defs,
        &["claude-code", "codex"],
        &[],
        &Authorization::default(),
    );
    assert_eq!(
        actions(&p),
        [
            (Action::Create, "claude-code/review".into()),
            (Action::Create, "codex/review".into())
        ]
    );
    assert!(p.can_apply());
    assert_eq!(p.changes(), 2);
    assert_eq!(
        p.files[0].path,
        PathBuf::from("/home/u/.claude/agents/review.md")
    );
    assert_eq!(
        p.files[0].change,
        Change::Write(rendered("claude-code", &defs[0]).into_bytes())
    );
    // Same inputs, same plan.
    assert_eq!(
        p,
        run(
            &defs,
            &["claude-code", "codex"],
            &[],
            &Authorization::default()
        )
    );
}

#[test]
fn noop_update_conflict_and_forced_update() {
    let defs = [def("review", "claude-code")];
    let path = ".claude/agents/review.md";
    let current = rendered("claude-code", &defs[0]);
    let p = run(
        &defs,
        &["claude-code"],
        &[(path, current.clone())],
        &Authorization::default(),
    );
    assert_eq!(p.operations[0].action, Action::Noop);
    assert_eq!(p.changes(), 0);

    let stale = current.replace("Do review.", "Old text.");
    let p = run(
        &defs,
        &["claude-code"],
        &[(path, stale)],
        &Authorization::default(),
    );
    assert_eq!(p.operations[0].action, Action::Update);
    assert!(!p.operations[0].requires_force && p.can_apply());

    let mine = "---\nname: review\n---\nmy own\n".to_owned();
    let p = run(
        &defs,
        &["claude-code"],
        &[(path, mine.clone())],
        &Authorization::default(),
    );
    let op = &p.operations[0];
    assert_eq!(
        (op.action, op.requires_force, op.authorized),
        (Action::Conflict, true, false)
    );
    assert_eq!(
        op.resolution().as_deref(),
        Some("--force claude-code/review")
    );
    assert!(!p.can_apply());
    assert_eq!(p.files[0].change, Change::Keep);

    let p = run(
        &defs,
        &["claude-code"],
        &[(path, mine)],
        &force("claude-code/review"),
    );
    let op = &p.operations[0];
    assert_eq!(
        (op.action, op.requires_force, op.authorized),
        (Action::Update, true, true)
    );
    assert!(p.can_apply());
    assert_eq!(p.files[0].change, Change::Write(current.into_bytes()));
}

#[test]
fn force_authorizes_exactly_one_target() {
    let defs = [def("verifier", "claude-code, codex")];
    let files = [
        (".claude/agents/verifier.md", "mine\n".to_owned()),
        (".codex/agents/verifier.toml", "mine = true\n".to_owned()),
    ];
    let p = run(
        &defs,
        &["claude-code", "codex"],
        &files,
        &Authorization::default(),
    );
    assert_eq!(p.count(Action::Conflict), 2);
    assert!(!p.can_apply());
    let p = run(
        &defs,
        &["claude-code", "codex"],
        &files,
        &force("claude-code/verifier"),
    );
    assert_eq!(
        actions(&p),
        [
            (Action::Update, "claude-code/verifier".into()),
            (Action::Conflict, "codex/verifier".into())
        ]
    );
    assert!(p.operations[0].authorized && !p.operations[1].authorized);
    assert!(!p.can_apply());
}

#[test]
fn a_force_that_matches_no_conflict_is_an_error() {
    let defs = [def("review", "claude-code")];
    let p = run(&defs, &["claude-code"], &[], &force("claude-code/review"));
    assert!(!p.can_apply());
    assert_eq!(p.errors.len(), 1);
    assert!(
        p.errors[0].contains("--force claude-code/review matches no conflict (it is create)"),
        "{:?}",
        p.errors
    );
    let p = run(&defs, &["claude-code"], &[], &force("codex/other"));
    assert!(p.errors[0].contains("nothing is planned for it"));
}

#[test]
fn orphans_need_prune_and_unmanaged_files_are_ignored() {
    let defs = [def("review", "claude-code")];
    let legacy = rendered("claude-code", &def("legacy", "claude-code"));
    let files = [
        (".claude/agents/legacy.md", legacy),
        (".claude/agents/user_notes.md", "notes\n".to_owned()),
        (".claude/agents/unmanaged.md", "mine\n".to_owned()),
    ];
    let p = run(&defs, &["claude-code"], &files, &Authorization::default());
    assert_eq!(
        actions(&p),
        [
            (Action::Orphan, "claude-code/legacy".into()),
            (Action::Create, "claude-code/review".into())
        ]
    );
    assert!(p.can_apply(), "orphans alone do not block");
    assert_eq!(p.operations[0].resolution().as_deref(), Some("--prune"));
    let p = run(&defs, &["claude-code"], &files, &prune());
    assert_eq!(
        actions(&p),
        [
            (Action::Remove, "claude-code/legacy".into()),
            (Action::Create, "claude-code/review".into())
        ]
    );
    let legacy_file = p
        .files
        .iter()
        .find(|f| f.path.ends_with("legacy.md"))
        .unwrap();
    assert_eq!(legacy_file.change, Change::Remove);
    assert!(p.files.iter().all(|f| !f.path.ends_with("unmanaged.md")));
}

#[test]
fn agents_not_installed_are_skipped_and_not_scanned() {
    let defs = [def("review", "claude-code, pi")];
    let legacy = rendered("claude-code", &def("legacy", "claude-code"));
    let p = run(
        &defs,
        &[],
        &[(".claude/agents/legacy.md", legacy)],
        &prune(),
    );
    assert_eq!(
        actions(&p),
        [
            (Action::Skip, "claude-code/review".into()),
            (Action::Skip, "pi/review".into())
        ]
    );
    assert!(
        p.operations[0]
            .reason
            .starts_with("not installed on this host")
    );
    assert!(p.can_apply());
    assert_eq!(p.changes(), 0);
}

#[test]
fn a_blocked_agent_blocks_the_plan() {
    let defs = [def("review", "claude-code, codex")];
    let mut v = view(&["claude-code", "codex"]);
    let codex = v
        .agents
        .iter_mut()
        .find(|a| a.spec.name == "codex")
        .unwrap();
    codex.readiness = readiness(
        (codex.spec, codex.target),
        Scope::User,
        &codex.availability,
        true,
        Some("[agents]\nenabled = false\n"),
    );
    let s = snapshot(&v, &defs, &BTreeMap::new());
    let p = plan(&defs, &v, &s, &Authorization::default());
    assert_eq!(
        actions(&p),
        [
            (Action::Create, "claude-code/review".into()),
            (Action::Error, "codex/review".into())
        ]
    );
    assert!(!p.can_apply());
}

#[test]
fn two_targets_in_one_physical_file_collide() {
    let defs = [def("review", "claude-code, opencode")];
    let v = view(&["claude-code", "opencode"]);
    let mut s = snapshot(&v, &defs, &BTreeMap::new());
    let shared = PathBuf::from("/home/u/.claude/agents/review.md");
    for facts in s.files.values_mut() {
        facts.physical.clone_from(&shared);
    }
    let p = plan(&defs, &v, &s, &Authorization::default());
    assert!(!p.can_apply());
    assert!(
        p.errors[0].starts_with(
            "collision: /home/u/.claude/agents/review.md is the target of both claude-code"
        ),
        "{:?}",
        p.errors
    );
    assert_eq!(p.files.len(), 1);
    assert_eq!(p.files[0].change, Change::Keep);
}

#[test]
fn unreadable_targets_are_errors() {
    let defs = [def("review", "claude-code")];
    let v = view(&["claude-code"]);
    let mut s = snapshot(&v, &defs, &BTreeMap::new());
    s.files.values_mut().next().unwrap().state =
        FileState::Unwritable("symlink leaves its folder".into());
    let p = plan(&defs, &v, &s, &Authorization::default());
    assert_eq!(p.operations[0].action, Action::Error);
    assert_eq!(p.operations[0].reason, "symlink leaves its folder");
    assert!(!p.can_apply());
}

const DSH: &str = ".dsh/cordis.patch.yml";

fn dsh_item(d: &Definition) -> String {
    render::render_dsh_item(d)
}

#[test]
fn dsh_creates_aggregate_into_one_file() {
    let defs = [def("alpha", "dsh"), def("beta", "dsh")];
    let p = run(&defs, &["dsh"], &[], &Authorization::default());
    assert_eq!(p.files.len(), 1);
    assert_eq!(p.files[0].operations.len(), 2);
    assert_eq!(
        p.files[0].change,
        Change::Write((dsh_item(&defs[0]) + &dsh_item(&defs[1])).into_bytes())
    );
}

#[test]
fn dsh_state_table() {
    let defs = [def("alpha", "dsh"), def("beta", "dsh"), def("gamma", "dsh")];
    let old_beta = dsh_item(&defs[1]).replace("Do beta.", "Old beta.");
    let orphan = dsh_item(&def("gone", "dsh"));
    let manual = "- id: custom-manual\n  persona: Keep me intact\n";
    let hand_gamma = "- id: my-gamma\n  name: '@deepseek-ai/dsh-tool-subagent'\n  config:\n    toolName: gamma\n";
    let text = format!(
        "# my settings\n{manual}{}{old_beta}# note about beta\n{orphan}{hand_gamma}",
        dsh_item(&defs[0])
    );
    let files = [(DSH, text.clone())];
    let p = run(&defs, &["dsh"], &files, &Authorization::default());
    assert_eq!(
        actions(&p),
        [
            (Action::Noop, "dsh/alpha".into()),
            (Action::Update, "dsh/beta".into()),
            (Action::Conflict, "dsh/gamma".into()),
            (Action::Orphan, "dsh/gone".into()),
        ]
    );
    assert!(
        p.operations[2].reason.contains("id my-gamma"),
        "{}",
        p.operations[2].reason
    );
    assert!(!p.can_apply());

    let auth = Authorization {
        forces: ["dsh/gamma".parse().unwrap()].into(),
        prune: true,
        adopt: None,
    };
    let p = run(&defs, &["dsh"], &files, &auth);
    assert_eq!(p.count(Action::Remove), 1);
    assert_eq!(p.count(Action::Update), 2);
    assert!(p.can_apply());
    let Change::Write(new) = &p.files[0].change else {
        panic!("{:?}", p.files[0].change)
    };
    let expected = format!(
        "# my settings\n{manual}{}{}# note about beta\n{}",
        dsh_item(&defs[0]),
        dsh_item(&defs[1]),
        dsh_item(&defs[2])
    );
    assert_eq!(String::from_utf8(new.clone()).unwrap(), expected);
    // Re-planning on the result is all NOOP.
    let p = run(
        &defs,
        &["dsh"],
        &[(DSH, expected)],
        &Authorization::default(),
    );
    assert!(
        p.operations.iter().all(|op| op.action == Action::Noop),
        "{:?}",
        actions(&p)
    );
}

#[test]
fn dsh_refuses_a_file_that_is_not_a_list() {
    let defs = [def("alpha", "dsh")];
    for text in ["key: value\n", "", "# only comments\n"] {
        let p = run(
            &defs,
            &["dsh"],
            &[(DSH, text.to_owned())],
            &Authorization::default(),
        );
        assert_eq!(p.operations[0].action, Action::Error, "{text:?}");
        assert!(!p.can_apply());
        assert_eq!(p.files[0].change, Change::Keep);
    }
    // Nothing defined for dsh: a foreign file is not ours to judge.
    let p = run(
        &[def("alpha", "claude-code")],
        &["dsh"],
        &[(DSH, "key: value\n".to_owned())],
        &Authorization::default(),
    );
    assert!(p.operations.iter().all(|op| op.agent != "dsh"));
}

#[test]
fn dsh_duplicate_claims_are_an_error() {
    let defs = [def("alpha", "dsh")];
    let item = dsh_item(&defs[0]);
    let p = run(
        &defs,
        &["dsh"],
        &[(DSH, format!("{item}{item}"))],
        &Authorization::default(),
    );
    assert_eq!(p.operations[0].action, Action::Error);
    assert!(
        p.operations[0]
            .reason
            .contains("2 items claim subagent alpha (lines 1, ")
    );
}

#[test]
fn pruning_the_last_dsh_item_removes_the_file() {
    let orphan = dsh_item(&def("gone", "dsh"));
    let p = run(&[], &["dsh"], &[(DSH, orphan)], &prune());
    assert_eq!(actions(&p), [(Action::Remove, "dsh/gone".into())]);
    assert_eq!(p.files[0].change, Change::Remove);
}

#[test]
fn marker_in_a_persona_is_not_ownership() {
    let defs = [def("alpha", "dsh")];
    let fake = format!(
        "- id: acp-host-subagent-alpha\n  persona: |-\n    # {}\n",
        render::marker("alpha")
    );
    let p = run(&defs, &["dsh"], &[(DSH, fake)], &Authorization::default());
    assert_eq!(p.operations[0].action, Action::Conflict);
}

mod properties {
    use std::fmt::Write as _;

    use proptest::prelude::*;

    use super::*;

    const NAMES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

    /// One piece of a generated DSH file.
    #[derive(Debug, Clone)]
    enum Piece {
        Comment(String),
        /// A hand-written item with a persona of arbitrary lines (`id:`, `name:`, the marker…).
        Foreign(Vec<String>),
        /// Our item for NAMES[i], stale or not.
        Ours(usize, bool),
    }

    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9 :#'\"-]{0,24}",
            Just("id: acp-host-subagent-alpha".to_owned()),
            Just("name: '@deepseek-ai/dsh-tool-subagent'".to_owned()),
            Just(format!("# {}", render::marker("beta"))),
            Just("- id: fake".to_owned()),
        ]
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            "[a-z ]{0,20}".prop_map(Piece::Comment),
            prop::collection::vec(line(), 1..4).prop_map(Piece::Foreign),
            (0..NAMES.len(), any::<bool>()).prop_map(|(i, stale)| Piece::Ours(i, stale)),
        ]
    }

    fn build(pieces: &[Piece]) -> String {
        let mut seen = BTreeSet::new();
        let mut text = String::new();
        for (n, piece) in pieces.iter().enumerate() {
            match piece {
                Piece::Comment(c) => {
                    let _ = writeln!(text, "# {c}");
                }
                Piece::Foreign(lines) => {
                    let _ = write!(text, "- id: custom-{n}\n  persona: |-\n");
                    for line in lines {
                        let _ = writeln!(text, "    {line}");
                    }
                }
                Piece::Ours(i, stale) => {
                    // One item per subagent: a duplicate would be an (also tested) error.
                    if seen.insert(*i) {
                        let item = dsh_item(&def(NAMES[*i], "dsh"));
                        text.push_str(&if *stale {
                            item.replace("Do ", "Did ")
                        } else {
                            item
                        });
                    }
                }
            }
        }
        text
    }

    /// The file without its managed items: what must never change.
    fn outside_managed(text: &str) -> String {
        let items = match dsh::locate(text.as_bytes()) {
            Ok(items) => items,
            // Every item went and comments remain: all of it is outside.
            Err(dsh::DshError::Empty) => return text.to_owned(),
            Err(e) => panic!("{e}: {text}"),
        };
        let mut edits = Edits::default();
        for (i, item) in items.iter().enumerate() {
            if item.our_name().is_some_and(|n| item.managed_for(n)) {
                edits.items.insert(i, None);
            }
        }
        dsh::apply(text, &items, &edits)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn dsh_bytes_outside_managed_items_never_change_and_resync_is_a_noop(
            pieces in prop::collection::vec(piece(), 1..10),
            defined in prop::collection::btree_set(0..NAMES.len(), 0..=NAMES.len()),
        ) {
            let text = build(&pieces);
            prop_assume!(!text.is_empty() && dsh::locate(text.as_bytes()).is_ok_and(|items| !items.is_empty()));
            let defs: Vec<Definition> = defined.iter().map(|&i| def(NAMES[i], "dsh")).collect();
            let p = run(&defs, &["dsh"], &[(DSH, text.clone())], &prune());
            prop_assert!(p.can_apply(), "{:?}", actions(&p));
            let new = match &p.files.first().map(|f| f.change.clone()) {
                Some(Change::Write(bytes)) => String::from_utf8(bytes.clone()).unwrap(),
                Some(Change::Remove) => String::new(),
                _ => text.clone(),
            };
            if !new.is_empty() {
                let parsed: Result<Value, _> = serde_saphyr::from_str(&new);
                prop_assert!(parsed.is_ok(), "{new}");
                prop_assert_eq!(outside_managed(&new), outside_managed(&text));
            }
            let again = run(&defs, &["dsh"], &[(DSH, new.clone())], &prune());
            prop_assert_eq!(again.changes(), 0, "{:?}", actions(&again));
            prop_assert!(again.operations.iter().all(|op| op.action == Action::Noop));
        }

        #[test]
        fn every_format_round_trips_arbitrary_text(
            description in "[^\u{0}]{1,40}",
            body in "[^\u{0}]{1,80}",
        ) {
            prop_assume!(!description.trim().is_empty());
            let text = format!("---\ndescription: {}\nagents: [codex]\n---\n{body}\n", serde_json::to_string(&description).unwrap());
            let Ok(d) = definition::parse("x.md", text.as_bytes()) else {
                // A blank body is refused by design; nothing to render.
                return Ok(());
            };
            prop_assert_eq!(&d.description, &description);
            let codex: toml::Table = rendered("codex", &d).parse().unwrap();
            prop_assert_eq!(codex["description"].as_str(), Some(description.as_str()));
            prop_assert_eq!(codex["developer_instructions"].as_str(), Some(d.body.as_str()));
            let md = rendered("claude-code", &d);
            let (yaml, _) = md.strip_prefix("---\n").unwrap().split_once("\n---\n").unwrap();
            let fields: Value = serde_saphyr::from_str(yaml).unwrap();
            prop_assert_eq!(fields["description"].as_str(), Some(description.as_str()));
            prop_assert!(render::is_managed(registry::find_sync("claude-code").unwrap().1.format, "x", md.as_bytes()));
            let dsh: Value = serde_saphyr::from_str(&dsh_item(&d)).unwrap();
            prop_assert_eq!(dsh[0]["config"]["persona"].as_str(), Some(d.body.as_str()));
        }
    }
}

#[test]
fn a_change_in_a_folder_that_cannot_be_written_blocks_the_plan() {
    let defs = [def("review", "claude-code, codex")];
    let v = view(&["claude-code", "codex"]);
    let mut s = snapshot(&v, &defs, &BTreeMap::new());
    let reason = "cannot write into /home/u/.codex/agents: read-only file system".to_owned();
    s.unwritable.insert(
        PathBuf::from("/home/u/.codex/agents/review.toml"),
        reason.clone(),
    );
    let p = plan(&defs, &v, &s, &Authorization::default());
    assert_eq!(p.errors, [reason]);
    assert!(!p.can_apply());
    // A folder that cannot be written blocks nothing when nothing in it changes.
    let done = BTreeMap::from([(".codex/agents/review.toml", rendered("codex", &defs[0]))]);
    let mut s = snapshot(&v, &defs, &done);
    s.unwritable.insert(
        PathBuf::from("/home/u/.codex/agents/review.toml"),
        "read-only".to_owned(),
    );
    assert!(plan(&defs, &v, &s, &Authorization::default()).can_apply());
}

#[test]
fn a_splice_that_would_break_an_alias_fails_closed() {
    // The user's item aliases an anchor inside our (stale) item; replacing ours would drop it.
    let stale = dsh_item(&def("alpha", "dsh"))
        .replace("Do alpha.", "Did alpha.")
        .replace("    provider: spawn", "    provider: &spawner spawn");
    let text = format!("{stale}- id: mine\n  provider: *spawner\n");
    let p = run(
        &[def("alpha", "dsh")],
        &["dsh"],
        &[(DSH, text)],
        &Authorization::default(),
    );
    assert_eq!(actions(&p), [(Action::Error, "dsh/alpha".to_owned())]);
    assert!(
        p.operations[0]
            .reason
            .starts_with("editing this file would make it invalid")
    );
    assert!(!p.can_apply());
    assert_eq!(p.changes(), 0);
}

#[test]
fn document_markers_and_directives_are_refused() {
    for text in [
        "- id: mine\n  name: x\n...\n",
        "%YAML 1.2\n---\n- id: mine\n  name: x\n",
    ] {
        let p = run(
            &[def("alpha", "dsh")],
            &["dsh"],
            &[(DSH, text.to_owned())],
            &Authorization::default(),
        );
        assert_eq!(p.operations[0].action, Action::Error, "{text}");
        assert!(
            p.operations[0]
                .reason
                .contains("document marker or directive"),
            "{}",
            p.operations[0].reason
        );
    }
}

#[test]
fn a_crlf_shared_file_keeps_its_line_endings() {
    let text = "- id: mine\r\n  name: x\r\n".to_owned();
    let defs = [def("alpha", "dsh")];
    let p = run(&defs, &["dsh"], &[(DSH, text)], &Authorization::default());
    let Change::Write(bytes) = &p.files[0].change else {
        panic!("{:?}", actions(&p));
    };
    let new = String::from_utf8(bytes.clone()).unwrap();
    assert!(!new.replace("\r\n", "").contains('\n'), "{new:?}");
    // Synced again, it is up to date.
    let again = run(&defs, &["dsh"], &[(DSH, new)], &Authorization::default());
    assert_eq!(actions(&again), [(Action::Noop, "dsh/alpha".to_owned())]);
}

#[test]
fn adopt_takes_over_only_files_with_the_tools_exact_marker_for_the_same_name() {
    let defs = [def("review", "claude-code, codex")];
    let aikito = |name: &str| {
        format!("generated by aikito from subagents/{name}.md - edits will be overwritten")
    };
    let adopt = Authorization {
        adopt: Some(crate::sync::Adopt::Aikito),
        ..Authorization::default()
    };
    let files = [
        (
            ".claude/agents/review.md",
            format!(
                "---\nname: review\n---\n<!-- {} -->\n\nold\n",
                aikito("review")
            ),
        ),
        (
            ".codex/agents/review.toml",
            format!("# {}\nname = \"review\"\n", aikito("review")),
        ),
    ];
    // Without --adopt they are someone else's: conflicts.
    let p = run(
        &defs,
        &["claude-code", "codex"],
        &files,
        &Authorization::default(),
    );
    assert_eq!(p.count(Action::Conflict), 2);
    let p = run(&defs, &["claude-code", "codex"], &files, &adopt);
    assert_eq!(p.count(Action::Update), 2);
    assert!(p.can_apply());
    for op in &p.operations {
        assert_eq!(
            op.reason,
            "adopted: generated by aikito with the same marker convention; rewritten with \
             acp-host's marker"
        );
    }
    for file in &p.files {
        let Change::Write(bytes) = &file.change else {
            panic!("{file:?}");
        };
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(&render::marker("review")), "{text}");
    }
    // Not the exact marker (another name, another place, another tool): never adopted.
    for mine in [
        format!("---\nname: review\n---\n<!-- {} -->\n", aikito("other")),
        format!("---\nname: review\n---\nbody\n<!-- {} -->\n", aikito("review")),
        "---\nname: review\n---\n<!-- generated by aikito2 from subagents/review.md - edits will be overwritten -->\n".to_owned(),
    ] {
        let p = run(
            &defs,
            &["claude-code"],
            &[(".claude/agents/review.md", mine.clone())],
            &adopt,
        );
        assert_eq!(p.count(Action::Conflict), 1, "{mine}");
    }
    // An aikito file whose subagent is not defined is not ours to remove.
    let p = run(
        &defs,
        &["claude-code"],
        &[(
            ".claude/agents/gone.md",
            format!("---\nname: gone\n---\n<!-- {} -->\n", aikito("gone")),
        )],
        &Authorization {
            prune: true,
            ..adopt
        },
    );
    assert_eq!(p.count(Action::Remove), 0);
}

#[test]
fn a_target_that_is_not_a_file_is_an_error_dedicated_or_shared() {
    for (agents, path) in [
        ("claude-code", format!("{HOME}/.claude/agents/review.md")),
        ("dsh", format!("{HOME}/{DSH}")),
    ] {
        let defs = [def("review", agents)];
        let v = view(&[agents]);
        let mut s = snapshot(&v, &defs, &BTreeMap::new());
        s.files.get_mut(Path::new(&path)).unwrap().state = FileState::NotAFile;
        let p = plan(&defs, &v, &s, &Authorization::default());
        assert_eq!(actions(&p), [(Action::Error, format!("{agents}/review"))]);
        assert_eq!(
            p.operations[0].reason,
            "is a folder or special file where a file belongs; move it away"
        );
        assert!(!p.can_apply());
    }
}

#[test]
fn a_target_the_caller_did_not_read_is_an_error_not_a_guess() {
    for agents in ["claude-code", "dsh"] {
        let defs = [def("review", agents), def("audit", agents)];
        let v = view(&[agents]);
        let p = plan(&defs, &v, &Snapshot::default(), &Authorization::default());
        assert_eq!(
            actions(&p),
            [
                (Action::Error, format!("{agents}/audit")),
                (Action::Error, format!("{agents}/review"))
            ]
        );
        assert!(p.operations.iter().all(|op| op.reason == NOT_READ));
        assert!(p.files.is_empty(), "nothing to write");
    }
}

#[test]
fn a_name_too_long_for_the_file_system_is_refused_at_planning() {
    let long = format!("r{}", "e".repeat(254));
    let defs = [def(&long, "claude-code")];
    let p = run(&defs, &["claude-code"], &[], &Authorization::default());
    assert_eq!(p.operations[0].action, Action::Error);
    assert!(
        p.operations[0]
            .reason
            .starts_with("a file name of 258 bytes"),
        "{}",
        p.operations[0].reason
    );
    assert!(p.files.is_empty());
}

#[test]
fn a_ready_agent_without_a_path_in_the_scope_is_skipped() {
    let (spec, target) = registry::find_sync("pi").unwrap();
    let v = RegistryView {
        scope: Scope::Project,
        base: PathBuf::from(HOME),
        agents: vec![AgentView {
            spec,
            target,
            availability: AgentAvailability::MarkerDir(".pi".into()),
            readiness: Readiness::Ready,
        }],
    };
    let defs = [def("review", "pi")];
    let p = plan(&defs, &v, &Snapshot::default(), &Authorization::default());
    assert_eq!(actions(&p), [(Action::Skip, "pi/review".into())]);
    assert_eq!(p.operations[0].reason, "pi has no path in this scope");
    assert_eq!(p.operations[0].path, None);
}

#[test]
fn orphan_candidates_that_are_unread_or_not_files_are_left_alone() {
    let gone = def("gone", "claude-code");
    let v = view(&["claude-code"]);
    let managed = rendered("claude-code", &gone);
    let files = BTreeMap::from([(".claude/agents/gone.md", managed)]);
    let mut s = snapshot(&v, &[], &files);
    let path = PathBuf::from(format!("{HOME}/.claude/agents/gone.md"));
    assert!(s.files.contains_key(&path), "a candidate is read");
    s.files.get_mut(&path).unwrap().state = FileState::NotAFile;
    let p = plan(&[], &v, &s, &prune());
    assert!(p.operations.is_empty(), "{:?}", p.operations);
    s.files.remove(&path);
    let p = plan(&[], &v, &s, &prune());
    assert!(p.operations.is_empty(), "{:?}", p.operations);
}

#[test]
fn skipped_definitions_of_one_shared_file_share_its_plan() {
    let defs = [def("alpha", "dsh"), def("beta", "dsh")];
    let p = run(&defs, &[], &[], &Authorization::default());
    assert_eq!(
        actions(&p),
        [
            (Action::Skip, "dsh/alpha".into()),
            (Action::Skip, "dsh/beta".into())
        ]
    );
    assert_eq!(p.files.len(), 1);
    assert_eq!(p.files[0].operations, [0, 1]);
    assert_eq!(p.files[0].change, Change::Keep);
    assert!(p.errors.is_empty(), "one target, no collision");
    assert_eq!(
        p.resting_outcome(&p.files[0]),
        crate::sync::Outcome::Skipped
    );
}

#[test]
fn an_item_appended_to_a_file_without_a_final_newline_starts_on_its_own_line() {
    let defs = [def("alpha", "dsh"), def("beta", "dsh")];
    let alpha = dsh_item(&defs[0]);
    let p = run(
        &defs,
        &["dsh"],
        &[(DSH, alpha.trim_end().to_owned())],
        &Authorization::default(),
    );
    assert_eq!(
        actions(&p),
        [
            (Action::Noop, "dsh/alpha".into()),
            (Action::Create, "dsh/beta".into())
        ]
    );
    assert_eq!(
        p.files[0].change,
        Change::Write((alpha + &dsh_item(&defs[1])).into_bytes())
    );
}

#[test]
fn a_shared_file_that_is_not_utf8_is_an_error() {
    let defs = [def("alpha", "dsh")];
    let v = view(&["dsh"]);
    let mut s = snapshot(&v, &defs, &BTreeMap::new());
    let path = PathBuf::from(format!("{HOME}/{DSH}"));
    s.files.get_mut(&path).unwrap().state = FileState::File(vec![b'-', b' ', 0xff, b'\n']);
    let p = plan(&defs, &v, &s, &Authorization::default());
    assert_eq!(actions(&p), [(Action::Error, "dsh/alpha".into())]);
    assert_eq!(p.operations[0].reason, "is not UTF-8 text");
}

#[test]
fn an_unmarked_plugin_item_without_an_id_is_named_by_its_tool() {
    let defs = [def("alpha", "dsh")];
    let foreign = "- name: '@deepseek-ai/dsh-tool-subagent'\n  config:\n    toolName: alpha\n";
    let p = run(
        &defs,
        &["dsh"],
        &[(DSH, foreign.to_owned())],
        &Authorization::default(),
    );
    assert_eq!(actions(&p), [(Action::Conflict, "dsh/alpha".into())]);
    assert_eq!(
        p.operations[0].reason,
        "item at line 1 (toolName alpha) has no acp-host marker (not ours); preserved"
    );
}
