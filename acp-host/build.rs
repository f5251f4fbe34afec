//! Release builds learn the git commit they are built from, for `--version` of both binaries
//! (`ACP_HOST_BUILD_COMMIT`, read by `acp_host::BUILD_COMMIT`): from `.cargo_vcs_info.json` in a
//! package from crates.io, else from `git` in a checkout. No git, no checkout, no commit: the
//! version says none, and the build goes on. Debug builds leave it out on purpose, so a commit
//! does not rebuild the workspace's debug binaries. How the binaries link is their own packages'
//! (`acp-host-cli/build.rs`, `acp-child/build.rs`).

use std::env;
use std::path::Path;
use std::process::Command;

/// The variable the build passes the commit in.
const COMMIT_VAR: &str = "ACP_HOST_BUILD_COMMIT";
/// How many hex digits of the commit `--version` shows.
const COMMIT_DIGITS: usize = 12;

fn main() {
    let release = env::var("PROFILE").is_ok_and(|profile| profile == "release");
    if release && let Some(commit) = commit() {
        println!("cargo:rustc-env={COMMIT_VAR}={commit}");
    }
}

/// The commit this package was built from: the one cargo recorded when packaging it, else the
/// checkout's HEAD (changes not committed are not told apart).
fn commit() -> Option<String> {
    let dir = env::var_os("CARGO_MANIFEST_DIR")?;
    let dir = Path::new(&dir);
    let vcs_info = dir.join(".cargo_vcs_info.json");
    if let Ok(text) = std::fs::read_to_string(&vcs_info) {
        // `{"git": {"sha1": "..."}, ...}`: the one field read, without a JSON parser.
        let sha = text.split("\"sha1\"").nth(1)?.split('"').nth(1)?;
        return Some(sha.chars().take(COMMIT_DIGITS).collect());
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", &format!("--short={COMMIT_DIGITS}"), "HEAD"])?;
    // A new commit or a checkout changes HEAD or the branch it names: run again then.
    if let Some(file) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={}", dir.join(file).display());
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(file) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={}", dir.join(file).display());
    }
    Some(head)
}
