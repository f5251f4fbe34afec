//! `list_dir` and `search`: look around the workspace, with bounded output.
//!
//! Both work on the local file system (ACP has no client request for listing or searching) and
//! stay inside the workspace: the starting folder is resolved by [`Workspace::resolve_dir`] and
//! the walk never follows symlinks, so it cannot leave the root. `search` honours `.gitignore`
//! (through the `ignore` crate, the walker behind ripgrep), skips `.git`, binary and large files,
//! and stops after [`MAX_MATCHES`] matches, so a broad pattern cannot flood the model's context.

use std::fmt::Write as _;
use std::path::Path;

use regex::Regex;

use super::{MAX_READ_BYTES, ToolError, Workspace};

/// The most entries `list_dir` shows.
pub(crate) const MAX_ENTRIES: usize = 500;
/// The most matching lines `search` shows.
pub(crate) const MAX_MATCHES: usize = 200;
/// Longer matching lines are cut to this many characters.
pub(crate) const MAX_LINE_CHARS: usize = 300;

/// Lists a folder: one entry per line, sorted, folders with a trailing `/`.
pub(crate) fn list_dir(workspace: &Workspace, requested: &str) -> Result<String, ToolError> {
    let dir = workspace.resolve_dir(requested)?;
    let io_error = |source| ToolError::Io {
        action: "list",
        requested: requested.to_owned(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        // `file_type` does not follow symlinks: a link to a folder is listed as a plain entry.
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    if names.is_empty() {
        return Ok(format!("{} is empty", display(requested)));
    }
    let total = names.len();
    let mut text = names
        .into_iter()
        .take(MAX_ENTRIES)
        .collect::<Vec<_>>()
        .join("\n");
    if total > MAX_ENTRIES {
        let _ = write!(text, "\n[{} more entries not shown]", total - MAX_ENTRIES);
    }
    Ok(text)
}

/// The matcher for a search pattern: the pattern as a regular expression when it is one, else
/// the plain text (so `foo(` still finds `foo(`).
#[must_use]
pub(crate) fn matcher(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|_| {
        // An escaped literal always compiles.
        Regex::new(&regex::escape(pattern)).unwrap_or_else(|_| unreachable!("escaped regex"))
    })
}

/// Searches text files under `requested` (default: the whole workspace) for `pattern`; each match
/// is `path:line: text`, with paths relative to the workspace root.
pub(crate) fn search(
    workspace: &Workspace,
    pattern: &str,
    requested: Option<&str>,
) -> Result<String, ToolError> {
    let requested = requested.unwrap_or("");
    let start = workspace.resolve_dir(requested)?;
    let regex = matcher(pattern);
    let walker = ignore::WalkBuilder::new(&start)
        .hidden(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(|entry| entry.file_name() != ".git")
        .sort_by_file_path(Ord::cmp)
        .build();
    let mut lines = Vec::new();
    let mut more = false;
    'files: for entry in walker.flatten() {
        if !entry.file_type().is_some_and(|kind| kind.is_file()) {
            continue;
        }
        let path = entry.path();
        let Some(text) = small_text(path) else {
            continue;
        };
        let shown = path.strip_prefix(workspace.root()).unwrap_or(path);
        for (number, line) in text.lines().enumerate() {
            if regex.is_match(line) {
                if lines.len() == MAX_MATCHES {
                    more = true;
                    break 'files;
                }
                lines.push(format!("{}:{}: {}", shown.display(), number + 1, cut(line)));
            }
        }
    }
    if lines.is_empty() {
        return Ok(format!(
            "no matches for {pattern:?} in {}",
            display(requested)
        ));
    }
    let mut text = lines.join("\n");
    if more {
        let _ = write!(
            text,
            "\n[stopped after {MAX_MATCHES} matches; narrow the pattern or the path]"
        );
    }
    Ok(text)
}

fn display(requested: &str) -> &str {
    if requested.trim().is_empty() {
        "."
    } else {
        requested
    }
}

/// A file's text, when it is UTF-8 and not larger than [`MAX_READ_BYTES`].
fn small_text(path: &Path) -> Option<String> {
    let size = std::fs::metadata(path).ok()?.len();
    if size > MAX_READ_BYTES {
        return None;
    }
    String::from_utf8(std::fs::read(path).ok()?).ok()
}

fn cut(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("src/deep")).unwrap();
        std::fs::write(
            dir.path().join("src/lib.rs"),
            "fn main() {\n    foo(1);\n}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("src/deep/x.txt"), "foo( here\nnothing\n").unwrap();
        std::fs::write(dir.path().join("README.md"), "hello\n").unwrap();
        std::fs::write(dir.path().join("bin.dat"), [0xff, 0xfe, b'f', b'o', b'o']).unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        (dir, workspace)
    }

    #[test]
    fn list_dir_sorts_and_marks_folders() {
        let (_dir, workspace) = workspace();
        assert_eq!(
            list_dir(&workspace, ".").unwrap(),
            "README.md\nbin.dat\nsrc/"
        );
        assert_eq!(
            list_dir(&workspace, "").unwrap(),
            "README.md\nbin.dat\nsrc/"
        );
        assert_eq!(list_dir(&workspace, "src").unwrap(), "deep/\nlib.rs");
        assert!(matches!(
            list_dir(&workspace, "README.md"),
            Err(ToolError::NotADirectory { .. })
        ));
        assert!(matches!(
            list_dir(&workspace, ".."),
            Err(ToolError::Escapes { .. })
        ));
    }

    #[test]
    fn search_finds_regex_and_plain_text_matches() {
        let (_dir, workspace) = workspace();
        assert_eq!(
            search(&workspace, r"foo\(\d\)", None).unwrap(),
            "src/lib.rs:2:     foo(1);"
        );
        // Not a valid regex: searched as plain text.
        assert_eq!(
            search(&workspace, "foo(", Some("src")).unwrap(),
            "src/deep/x.txt:1: foo( here\nsrc/lib.rs:2:     foo(1);"
        );
        assert_eq!(
            search(&workspace, "absent", None).unwrap(),
            "no matches for \"absent\" in ."
        );
        assert!(matches!(
            search(&workspace, "x", Some("../")),
            Err(ToolError::Escapes { .. })
        ));
    }

    #[test]
    fn search_output_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("many.txt"), "x\n".repeat(MAX_MATCHES + 5)).unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let text = search(&workspace, "x", None).unwrap();
        assert_eq!(text.lines().count(), MAX_MATCHES + 1);
        assert!(text.ends_with("[stopped after 200 matches; narrow the pattern or the path]"));
    }
}
