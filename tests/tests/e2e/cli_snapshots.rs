//! Snapshots of whole command runs users meet first: the help texts (acp-host's and acp-child's)
//! and the agent listing.
//! A change to any of them shows up as a reviewable snapshot diff (`cargo insta review`).

use std::process::Command;

use acp_tests::bin;

fn run(args: &[&str], home: &std::path::Path) -> String {
    let out = Command::new(bin("acp-host"))
        .args(args)
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
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
    insta::assert_snapshot!("sync_help", run(&["sync", "--help"], home.path()));
    insta::assert_snapshot!("agents_help", run(&["agents", "--help"], home.path()));
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
