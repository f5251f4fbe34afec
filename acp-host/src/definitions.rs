//! Subagent definitions on disk, for the runs that start them (acp-child's delegation,
//! `acp-host trust`): a folder's definitions, each with where it came from
//! (`protocol::trust::Source`), its file and its content's digest, so trust is decided on the
//! very bytes that were parsed.
//!
//! Invariants: symlinks inside a folder are never followed (a problem, like any unusable file);
//! a file's identity is its folder's canonical path joined with its name, so the same file named
//! through two paths is one approval; a bad file is a problem naming it, never hiding the others.

use std::path::{Path, PathBuf};

use protocol::definition::{self, Definition, Problem, SourceEntry};
use protocol::report::describe;
use protocol::trust::{Digest, Source};

/// One definition as found.
#[derive(Debug, Clone)]
pub struct Located {
    pub definition: Definition,
    /// The file: its folder's canonical path joined with its name.
    pub file: PathBuf,
    pub source: Source,
    /// The digest of the bytes [`Located::definition`] was parsed from.
    pub digest: Digest,
}

/// A folder's usable definitions, and one line per file that is not one.
#[derive(Debug, Default)]
pub struct Folder {
    pub definitions: Vec<Located>,
    /// `<file>: <problem>` (or why the folder itself could not be read).
    pub problems: Vec<String>,
}

/// The folder of `dir`'s own definitions (`<dir>/subagents`).
#[must_use]
pub fn repository_folder(dir: &Path) -> PathBuf {
    dir.join(definition::DEFINITION_DIR)
}

/// Reads the definitions in folder `dir`, found as `source`. A missing folder is a problem only
/// when the person named it (`required`).
#[must_use]
pub fn read_folder(dir: &Path, source: Source, required: bool) -> Folder {
    let mut folder = Folder::default();
    if !required && !dir.is_dir() {
        return folder;
    }
    let entries = match crate::sync_exec::read_source(dir) {
        Ok(entries) => entries,
        Err(error) => {
            folder.problems.push(describe(&error));
            return folder;
        }
    };
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    for entry in entries {
        let name = entry.name().to_owned();
        if definition::IGNORED_ENTRIES.contains(&name.as_str()) {
            continue;
        }
        let file = canonical.join(&name);
        let parsed = match &entry {
            SourceEntry::File { name, contents } => definition::parse(name, contents)
                .map(|definition| (definition, Digest::of(contents))),
            SourceEntry::Symlink { .. } => Err(Problem::Symlink),
            SourceEntry::Folder { .. } => Err(Problem::Folder),
            SourceEntry::Other { .. } => Err(Problem::NotAFile),
        };
        match parsed {
            Ok((definition, digest)) => folder.definitions.push(Located {
                definition,
                file,
                source,
                digest,
            }),
            Err(problem) => folder
                .problems
                .push(format!("{}: {problem}", dir.join(&name).display())),
        }
    }
    folder
}
