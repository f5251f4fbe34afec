//! The documents: README.md and every page under `docs/` (the mdBook's source) link only to
//! files that exist and to headings those files have (`acp_tests::doc_links`). A broken link
//! fails here with its file, line and target; CI also builds the book (`.ci/run`).

use std::path::{Path, PathBuf};

/// README.md and `docs/*.md`, from the repository's root.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../");
    let report: Vec<String> = broken
        .iter()
        .map(|broken| broken.to_string().replace(&root.display().to_string(), ""))
        .collect();
    assert!(report.is_empty(), "broken links:\n{}", report.join("\n"));
}
