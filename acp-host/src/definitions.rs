//! Subagent definitions on disk, for the runs that start them (`acp-host run --subagent`,
//! batch lines, acp-child's delegation, `acp-host trust`): a folder's definitions ([`read_folder`])
//! or one found by name ([`find`]), each with where it came from (`protocol::trust::Source`), its
//! file and its content's digest, so trust is decided on the very bytes that were parsed. What a
//! found definition's `run:` table becomes is `protocol::definition::RunSpec::settle`.
//!
//! Invariants: symlinks are never followed, a folder's or a file's (a problem, like any unusable
//! file), whether a folder is listed or a definition is looked up by name (one reader,
//! `locate`);
//! a file's identity is its folder's canonical path joined with its name, so the same file named
//! through two paths is one approval; a bad file is a problem naming it, never hiding the others.

use std::path::{Path, PathBuf};

use protocol::definition::{self, Definition, Problem, RunSpec, SourceEntry};
use protocol::report::{describe, printable, printable_path};
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
    let canonical = canonical_folder(dir);
    for entry in entries {
        let name = entry.name().to_owned();
        if definition::IGNORED_ENTRIES.contains(&name.as_str()) {
            continue;
        }
        match locate(&canonical, &entry, source) {
            Ok(located) => folder.definitions.push(located),
            Err(problem) => folder
                .problems
                .push(format!("{}: {problem}", dir.join(&name).display())),
        }
    }
    folder
}

/// The folder's canonical path, which every identity of its files starts from.
fn canonical_folder(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// The definition `entry` of the folder whose canonical path is `canonical` holds
/// (`protocol::definition::parse_entry`: a symlink is a problem), with its identity (the
/// canonical folder joined with the entry's name) and digest. The one way a definition is read,
/// for every reader: a folder's listing ([`read_folder`]) and a lookup by name ([`find`]).
fn locate(canonical: &Path, entry: &SourceEntry, source: Source) -> Result<Located, Problem> {
    let (definition, contents) = definition::parse_entry(entry)?;
    Ok(Located {
        definition,
        file: canonical.join(entry.name()),
        source,
        digest: Digest::of(contents),
    })
}

/// `find` found no usable definition.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("--subagent {name:?}: a subagent name matches ^[a-z][a-z0-9-]*$")]
    BadName { name: String },
    #[error("--subagent {name}: {}", printable(reason))]
    Folder { name: String, reason: String },
    #[error("{}: {}", printable_path(path), printable(&problem.to_string()))]
    Invalid {
        path: PathBuf,
        problem: Box<Problem>,
    },
    #[error(
        "{}: has no `run:` table; add `run: {{}}` to run it with the defaults (acp-child)",
        printable_path(path)
    )]
    NoRun { path: PathBuf },
    #[error(
        "--subagent {name}: no {name}.md in {} (add the definition, or pass --subagents DIR)",
        searched.iter().map(|dir| printable_path(dir)).collect::<Vec<_>>().join(", ")
    )]
    Missing {
        name: String,
        searched: Vec<PathBuf>,
    },
}

/// A definition found by name, with its `run:` table.
#[derive(Debug, Clone)]
pub struct Found {
    pub located: Located,
    pub run: RunSpec,
}

/// Finds definition `name` with a `run:` table: `NAME.md` in `<cwd>/subagents/` (repository
/// content), then in each of `dirs` (folders the person named), the first found. A bad file is an
/// error naming it and its field, never skipped for a later one.
pub fn find(name: &str, cwd: &Path, dirs: &[PathBuf]) -> Result<Found, FindError> {
    if !definition::is_valid_name(name) {
        return Err(FindError::BadName {
            name: name.to_owned(),
        });
    }
    let file = format!("{name}.md");
    let searched: Vec<(PathBuf, Source)> =
        std::iter::once((repository_folder(cwd), Source::Repository))
            .chain(dirs.iter().map(|dir| (dir.clone(), Source::Folder)))
            .collect();
    for (dir, source) in &searched {
        let path = dir.join(&file);
        // The folder and the file are read as a folder's listing reads them: a symlink (the
        // folder, or the file) is refused, so an approval of another folder's file never
        // carries over to this one, whose working directory gives its `agent:` another meaning.
        let entry = match crate::sync_exec::read_source_entry(dir, &file) {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(error) => {
                return Err(FindError::Folder {
                    name: name.to_owned(),
                    reason: describe(&error),
                });
            }
        };
        let located = locate(&canonical_folder(dir), &entry, *source).map_err(|problem| {
            FindError::Invalid {
                path: path.clone(),
                problem: Box::new(problem),
            }
        })?;
        let Some(run) = located.definition.run.clone() else {
            return Err(FindError::NoRun { path });
        };
        return Ok(Found { located, run });
    }
    Err(FindError::Missing {
        name: name.to_owned(),
        searched: searched.into_iter().map(|(dir, _)| dir).collect(),
    })
}
