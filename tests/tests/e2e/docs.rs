//! The documents: README.md, AGENTS.md and every page under `docs/` (the mdBook's source) link
//! only to files that exist and to headings those files have (`acp_tests::doc_links`). A broken
//! link fails here with its file, line and target; CI also builds the book (`.ci/run`).

use std::path::{Path, PathBuf};

/// README.md, AGENTS.md and `docs/*.md`, from the repository's root.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("AGENTS.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

#[test]
fn every_relative_link_and_anchor_in_the_documents_resolves() {
    let files = documents();
    assert!(files.len() > 5, "{files:?}");
    let broken = acp_tests::doc_links::check(&files);
    let root = format!("{}/", root().display());
    let report: Vec<String> = broken
        .iter()
        .map(|broken| broken.to_string().replace(&root, ""))
        .collect();
    assert!(report.is_empty(), "broken links:\n{}", report.join("\n"));
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository's root")
}

/// Every page under `docs/` is a chapter of the book: SUMMARY.md names it (the book would leave
/// an unnamed page out, and its links would be checked here but never published).
#[test]
fn the_books_summary_names_every_page() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).expect("SUMMARY.md");
    for page in documents()
        .iter()
        .filter(|path| path.parent() == Some(&root().join("docs")))
    {
        let name = page.file_name().unwrap().to_string_lossy();
        if name != "SUMMARY.md" {
            assert!(
                summary.contains(&format!("]({name})")),
                "docs/SUMMARY.md does not name docs/{name}"
            );
        }
    }
}

/// The README stays a map (at most about 400 lines), and its quick start's test command is
/// exactly the one CI runs (`.ci/run`), as are its first command's binaries the ones the suites
/// drive.
#[test]
fn the_readme_is_a_map_whose_quick_start_ci_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: move the manual to docs/"
    );
    let quick_start = &readme[readme.find("## Quick start").expect("a quick start")..];
    let block: Vec<&str> = quick_start
        .lines()
        .skip_while(|line| !line.starts_with("```sh"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .collect();
    assert_eq!(
        block,
        [
            "cargo build --workspace && ./target/debug/acp-host run \"hello\"",
            "cargo test --workspace --locked",
        ]
    );
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|line| line == block[1]),
        ".ci/run does not run the README's test command `{}`",
        block[1]
    );
}
