//! Subagent definitions on disk, for the runs that start them (`acp-host run --subagent`,
//! batch lines, acp-child's delegation, `acp-host trust`): a folder's definitions ([`read_folder`])
//! or one found by name ([`find`]), each with where it came from (`protocol::trust::Source`), its
//! file and its content's digest, so trust is decided on the very bytes that were parsed. What a
//! found definition's `run:` table becomes is `protocol::definition::RunSpec::settle`.
//!
//! Invariants: symlinks inside a folder are never followed (a problem, like any unusable file);
//! a file's identity is its folder's canonical path joined with its name, so the same file named
//! through two paths is one approval; a bad file is a problem naming it, never hiding the others.

use std::path::{Path, PathBuf};

use protocol::definition::{self, Definition, Problem, RunSpec, SourceEntry};
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

/// `find` found no usable definition.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("--subagent {name:?}: a subagent name matches ^[a-z][a-z0-9-]*$")]
    BadName { name: String },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        problem: Box<Problem>,
    },
    #[error(
        "{}: has no `run:` table; add `run: {{}}` to run it with the defaults (acp-child)",
        path.display()
    )]
    NoRun { path: PathBuf },
    #[error(
        "--subagent {name}: no {name}.md in {} (add the definition, or pass --subagents DIR)",
        searched.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ")
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
        let contents = match std::fs::read(&path) {
            Ok(contents) => contents,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(FindError::Read { path, source }),
        };
        let definition =
            definition::parse(&file, &contents).map_err(|problem| FindError::Invalid {
                path: path.clone(),
                problem: Box::new(problem),
            })?;
        let Some(run) = definition.run.clone() else {
            return Err(FindError::NoRun { path });
        };
        return Ok(Found {
            located: Located {
                definition,
                file: std::fs::canonicalize(&path).unwrap_or(path),
                source: *source,
                digest: Digest::of(&contents),
            },
            run,
        });
    }
    Err(FindError::Missing {
        name: name.to_owned(),
        searched: searched.into_iter().map(|(dir, _)| dir).collect(),
    })
}
