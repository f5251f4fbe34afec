//! File access for the agent's tools, confined to a session's directory.
//!
//! Invariant: every path a tool touches is inside the session directory (the [`Workspace`] root,
//! canonicalised when the session is created). Confinement is checked twice: lexically first
//! ([`confine_lexically`], pure: `..` may not climb above the root), then against the real file
//! system (the canonical target, or for a new file its canonical parent, must still be under the
//! root, which catches symlinks pointing outside).
//!
//! The [`Workspace`] reads and writes the local file system; the model backend routes reads and
//! writes through the client's `fs/read_text_file` / `fs/write_text_file` when the client offers
//! them, after resolving the path here. Submodules: [`listing`] (list a folder, search text),
//! [`shell`] (run a command), [`edit`] (exact replacement). Writes are atomic (a temporary file in
//! the same directory, then a rename) so a failed write never leaves a half-written file behind.

use std::io;
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

pub(crate) mod edit;
pub(crate) mod listing;
pub(crate) mod shell;

/// The largest file `/read` returns; larger files would flood the client's transcript.
pub(crate) const MAX_READ_BYTES: u64 = 1024 * 1024;

/// Why a tool refused or failed; the `Display` text (with its cause chain) is shown to the user.
#[derive(Debug, Error)]
pub(crate) enum ToolError {
    #[error(
        "session directory {} is not an absolute path; ACP clients must send an absolute cwd in session/new",
        cwd.display()
    )]
    NotAbsolute { cwd: PathBuf },
    #[error("cannot open session directory {}; pass an existing directory as cwd", cwd.display())]
    Root {
        cwd: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("session directory {} is not a directory; pass a directory as cwd", cwd.display())]
    RootNotDirectory { cwd: PathBuf },
    #[error("no path given; name a file inside the session directory")]
    EmptyPath,
    /// The command's sandbox cannot be had here (or could not be prepared); nothing ran.
    #[error("{0}")]
    Sandbox(String),
    #[error(
        "refused: {requested} is outside the session directory {}; use a path inside it",
        root.display()
    )]
    Escapes { requested: String, root: PathBuf },
    #[error(
        "refused: {requested} resolves through a symlink to {}, outside the session directory {}; use a path inside it",
        target.display(),
        root.display()
    )]
    EscapesViaSymlink {
        requested: String,
        target: PathBuf,
        root: PathBuf,
    },
    #[error("cannot {action} {requested}")]
    Io {
        action: &'static str,
        requested: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {requested}: it is a directory; name a file")]
    IsDirectory { requested: String },
    #[error("cannot list {requested}: it is not a directory; use read_file for files")]
    NotADirectory { requested: String },
    #[error("old_text is empty; give the exact text to replace (use write_file to create a file)")]
    EmptyOldText,
    #[error(
        "old_text was not found in {requested}; read the file and copy the exact text, including whitespace"
    )]
    OldTextNotFound { requested: String },
    #[error(
        "old_text matches {count} places in {requested}; include more surrounding lines so it matches exactly one"
    )]
    OldTextAmbiguous { requested: String, count: usize },
    #[error("cannot run the command in {}", cwd.display())]
    Spawn {
        cwd: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot show {requested}: it is not UTF-8 text")]
    NotText { requested: String },
    #[error(
        "cannot show {requested}: it is {size} bytes, more than the {MAX_READ_BYTES} byte limit"
    )]
    TooLarge { requested: String, size: u64 },
}

/// The directory a session works in; every tool path is resolved against and confined to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Workspace {
    root: PathBuf,
}

/// The outcome of a successful write, for the tool call's diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    /// The file written (canonical, inside the workspace).
    pub(crate) path: PathBuf,
    /// The previous contents, when the file existed and was UTF-8 text.
    pub(crate) old_text: Option<String>,
    pub(crate) bytes: usize,
}

impl Workspace {
    /// Opens a session directory: it must be absolute, exist, and be a directory.
    pub(crate) fn open(cwd: &Path) -> Result<Self, ToolError> {
        if !cwd.is_absolute() {
            return Err(ToolError::NotAbsolute {
                cwd: cwd.to_path_buf(),
            });
        }
        let root = std::fs::canonicalize(cwd).map_err(|source| ToolError::Root {
            cwd: cwd.to_path_buf(),
            source,
        })?;
        if !root.is_dir() {
            return Err(ToolError::RootNotDirectory {
                cwd: cwd.to_path_buf(),
            });
        }
        Ok(Self { root })
    }

    /// The canonical session directory.
    #[must_use]
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The absolute path `requested` names, confined lexically (no file system access). Use it
    /// for display (tool call locations); use [`Self::read_text`] / [`Self::write_text`] to act.
    pub(crate) fn locate(&self, requested: &str) -> Result<PathBuf, ToolError> {
        confine_lexically(&self.root, requested)
    }

    /// Resolves an existing directory inside the workspace, the root itself included (an empty
    /// path or `.` names the root), following symlinks.
    pub(crate) fn resolve_dir(&self, requested: &str) -> Result<PathBuf, ToolError> {
        let lexical = if requested.trim().is_empty() {
            self.root.clone()
        } else {
            normalize_within(&self.root, requested)?
        };
        let target = std::fs::canonicalize(&lexical).map_err(|source| ToolError::Io {
            action: "list",
            requested: requested.to_owned(),
            source,
        })?;
        let target = self.check_inside(requested, target)?;
        if target.is_dir() {
            Ok(target)
        } else {
            Err(ToolError::NotADirectory {
                requested: requested.to_owned(),
            })
        }
    }

    /// Resolves an existing file, following symlinks, and checks it is still inside the root.
    pub(crate) fn resolve_existing(&self, requested: &str) -> Result<PathBuf, ToolError> {
        let lexical = self.locate(requested)?;
        let target = std::fs::canonicalize(&lexical).map_err(|source| ToolError::Io {
            action: "read",
            requested: requested.to_owned(),
            source,
        })?;
        self.check_inside(requested, target)
    }

    /// Resolves a file to be written. It may not exist yet; then its parent directory must exist
    /// (writes never create directories) and resolve inside the root.
    pub(crate) fn resolve_for_write(&self, requested: &str) -> Result<PathBuf, ToolError> {
        let lexical = self.locate(requested)?;
        if lexical.symlink_metadata().is_ok() {
            let target = std::fs::canonicalize(&lexical).map_err(|source| ToolError::Io {
                action: "write",
                requested: requested.to_owned(),
                source,
            })?;
            let target = self.check_inside(requested, target)?;
            if target.is_dir() {
                return Err(ToolError::IsDirectory {
                    requested: requested.to_owned(),
                });
            }
            return Ok(target);
        }
        // `locate` guarantees a file name: a path equal to the root exists and was handled above.
        let (Some(parent), Some(name)) = (lexical.parent(), lexical.file_name()) else {
            return Err(ToolError::Escapes {
                requested: requested.to_owned(),
                root: self.root.clone(),
            });
        };
        let parent = std::fs::canonicalize(parent).map_err(|source| ToolError::Io {
            action: "write",
            requested: requested.to_owned(),
            source,
        })?;
        let parent = self.check_inside(requested, parent)?;
        Ok(parent.join(name))
    }

    /// Reads a UTF-8 text file inside the workspace, at most [`MAX_READ_BYTES`] long.
    pub(crate) fn read_text(&self, requested: &str) -> Result<String, ToolError> {
        let path = self.resolve_existing(requested)?;
        let io_error = |source| ToolError::Io {
            action: "read",
            requested: requested.to_owned(),
            source,
        };
        let size = std::fs::metadata(&path).map_err(io_error)?.len();
        if size > MAX_READ_BYTES {
            return Err(ToolError::TooLarge {
                requested: requested.to_owned(),
                size,
            });
        }
        let bytes = std::fs::read(&path).map_err(io_error)?;
        String::from_utf8(bytes).map_err(|_| ToolError::NotText {
            requested: requested.to_owned(),
        })
    }

    /// The current text of a file about to be written, for a diff; `None` when it does not exist
    /// yet or is not text.
    #[must_use]
    pub(crate) fn existing_text(path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    /// Writes `text` to a file inside the workspace, atomically. An existing file keeps its
    /// permissions; a new file is readable by everyone and writable by its owner (0644).
    pub(crate) fn write_text(&self, requested: &str, text: &str) -> Result<Written, ToolError> {
        let path = self.resolve_for_write(requested)?;
        let io_error = |source| ToolError::Io {
            action: "write",
            requested: requested.to_owned(),
            source,
        };
        let old_text = Self::existing_text(&path);
        let permissions = std::fs::metadata(&path).ok().map(|meta| meta.permissions());
        let parent = path.parent().unwrap_or(&self.root);
        let mut temp = tempfile::NamedTempFile::new_in(parent).map_err(io_error)?;
        io::Write::write_all(&mut temp, text.as_bytes()).map_err(io_error)?;
        if let Some(permissions) = permissions.or_else(default_permissions) {
            std::fs::set_permissions(temp.path(), permissions).map_err(io_error)?;
        }
        temp.persist(&path).map_err(|error| io_error(error.error))?;
        Ok(Written {
            path,
            old_text,
            bytes: text.len(),
        })
    }

    fn check_inside(&self, requested: &str, target: PathBuf) -> Result<PathBuf, ToolError> {
        if target.starts_with(&self.root) {
            Ok(target)
        } else {
            Err(ToolError::EscapesViaSymlink {
                requested: requested.to_owned(),
                target,
                root: self.root.clone(),
            })
        }
    }
}

/// The permissions of a newly created file: 0644 on Unix, where the temporary file would
/// otherwise stay 0600; elsewhere the temporary file's own permissions are already the usual ones.
#[cfg_attr(
    unix,
    expect(
        clippy::unnecessary_wraps,
        reason = "`None` on platforms other than Unix"
    )
)]
fn default_permissions() -> Option<std::fs::Permissions> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        Some(std::fs::Permissions::from_mode(0o644))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Joins `requested` to `root` and normalises `.` and `..` without touching the file system. The
/// result must be strictly inside `root` (the root itself is not a file). An absolute `requested`
/// is accepted when it lies inside `root`.
pub(crate) fn confine_lexically(root: &Path, requested: &str) -> Result<PathBuf, ToolError> {
    if requested.trim().is_empty() {
        return Err(ToolError::EmptyPath);
    }
    let resolved = normalize_within(root, requested)?;
    if resolved == root {
        Err(ToolError::Escapes {
            requested: requested.to_owned(),
            root: root.to_path_buf(),
        })
    } else {
        Ok(resolved)
    }
}

/// Joins `requested` to `root` and normalises `.` and `..` lexically; the result is `root` or a
/// path under it.
fn normalize_within(root: &Path, requested: &str) -> Result<PathBuf, ToolError> {
    let escapes = || ToolError::Escapes {
        requested: requested.to_owned(),
        root: root.to_path_buf(),
    };
    let mut resolved = PathBuf::new();
    for component in root.join(requested).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !resolved.pop() {
                    return Err(escapes());
                }
            }
            other => resolved.push(other),
        }
    }
    if resolved.starts_with(root) {
        Ok(resolved)
    } else {
        Err(escapes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/project";

    fn confined(requested: &str) -> Result<PathBuf, String> {
        confine_lexically(Path::new(ROOT), requested).map_err(|error| error.to_string())
    }

    #[test]
    fn relative_paths_resolve_under_the_root() {
        assert_eq!(confined("a.txt"), Ok(PathBuf::from("/project/a.txt")));
        assert_eq!(
            confined("./src/../b.rs"),
            Ok(PathBuf::from("/project/b.rs"))
        );
        assert_eq!(
            confined("src/./lib.rs"),
            Ok(PathBuf::from("/project/src/lib.rs"))
        );
    }

    #[test]
    fn absolute_paths_inside_the_root_are_accepted() {
        assert_eq!(
            confined("/project/a/b.txt"),
            Ok(PathBuf::from("/project/a/b.txt"))
        );
    }

    #[test]
    fn escapes_are_refused_with_a_clear_message() {
        for requested in [
            "../secret",
            "src/../../x",
            "/etc/passwd",
            "/projectile/x",
            ".",
            "src/..",
        ] {
            let error = confined(requested).expect_err(requested);
            assert_eq!(
                error,
                format!(
                    "refused: {requested} is outside the session directory /project; use a path inside it"
                )
            );
        }
        assert_eq!(
            confined("  "),
            Err("no path given; name a file inside the session directory".to_owned())
        );
    }

    #[test]
    fn open_requires_an_absolute_existing_directory() {
        assert!(matches!(
            Workspace::open(Path::new("relative/dir")),
            Err(ToolError::NotAbsolute { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(matches!(
            Workspace::open(&missing),
            Err(ToolError::Root { .. })
        ));
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            Workspace::open(&file),
            Err(ToolError::RootNotDirectory { .. })
        ));
    }

    #[test]
    fn read_and_write_stay_inside_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let written = workspace.write_text("note.txt", "hello\n").unwrap();
        assert_eq!(written.bytes, 6);
        assert_eq!(written.old_text, None);
        assert_eq!(workspace.read_text("note.txt").unwrap(), "hello\n");
        let again = workspace.write_text("./note.txt", "bye").unwrap();
        assert_eq!(again.old_text.as_deref(), Some("hello\n"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("note.txt")).unwrap(),
            "bye"
        );
        assert!(matches!(
            workspace.write_text("missing-dir/x.txt", "x"),
            Err(ToolError::Io {
                action: "write",
                ..
            })
        ));
        assert!(matches!(
            workspace.read_text("nope.txt"),
            Err(ToolError::Io { action: "read", .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        for requested in ["link", "out/secret"] {
            assert!(matches!(
                workspace.read_text(requested),
                Err(ToolError::EscapesViaSymlink { .. })
            ));
        }
        for requested in ["link", "out/new.txt"] {
            assert!(matches!(
                workspace.write_text(requested, "x"),
                Err(ToolError::EscapesViaSymlink { .. })
            ));
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "s"
        );
        assert!(!outside.path().join("new.txt").exists());
    }

    #[cfg(unix)]
    #[test]
    fn writes_keep_existing_permissions_and_default_to_0644() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        workspace.write_text("new.txt", "x").unwrap();
        let mode = |name: &str| {
            std::fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("new.txt"), 0o644);
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
        workspace
            .write_text("run.sh", "#!/bin/sh\necho hi\n")
            .unwrap();
        assert_eq!(mode("run.sh"), 0o750);
    }
}
