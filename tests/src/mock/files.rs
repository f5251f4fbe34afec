//! The files a test watches: the `--log` trail, ready/marker files and pid files.
//!
//! Failures here are reported on stderr and otherwise ignored: the mock must never panic, and
//! a test waiting on a file that never appears times out with the mock's stderr as the clue.
//! Files whose content a test reads (pid files) are written atomically (temporary file, then
//! rename), so a test that sees the file never reads it half-written.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The `--log` trail: one line per event, appended with a single `write` and no buffering, so
/// a line is on disk before the mock does anything else.
#[derive(Debug, Clone, Default)]
pub(super) struct Log {
    path: Option<PathBuf>,
}

impl Log {
    #[must_use]
    pub(super) fn new(path: Option<PathBuf>) -> Self {
        Self { path }
    }

    /// Appends `line` (a newline is added).
    pub(super) fn line(&self, line: &str) {
        let Some(path) = &self.path else { return };
        let appended = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
        if let Err(error) = appended {
            eprintln!("mock: cannot append to log {}: {error}", path.display());
        }
    }
}

/// Appends `<event> <pid> <ns>` to the `--record` file (see `Common::record`).
pub(super) fn record(path: Option<&Path>, event: &str) {
    let Some(path) = path else { return };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    Log::new(Some(path.to_path_buf())).line(&format!("{event} {} {now}", std::process::id()));
}

/// Creates `path` if it does not exist (content untouched if it does).
pub(super) fn touch(path: &Path) {
    if let Err(error) = OpenOptions::new().create(true).append(true).open(path) {
        eprintln!("mock: cannot touch {}: {error}", path.display());
    }
}

/// Writes `contents` to `path` via a sibling temporary file and a rename.
pub(super) fn write_atomically(path: &Path, contents: &str) {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".tmp.{}", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let written =
        std::fs::write(&temporary, contents).and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = written {
        eprintln!("mock: cannot write {}: {error}", path.display());
    }
}
