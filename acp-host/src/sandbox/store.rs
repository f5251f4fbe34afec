//! acp-child's session store as a sandboxed agent sees it, where the agent has namespaces of its
//! own ([`super::mount`]): a folder of the run's own, `.runs/<name>/` inside the store, bound
//! over the store. The agent reads and writes there as in the store itself, and sees none of
//! the other sessions; the sessions the run names (`--resume`, `--fork`) are hard links into it
//! (one file: what the agent appends lands in the session itself).
//!
//! When the run ends ([`RunStore`] dropped, after the agent's tree is gone), the sessions it made
//! are linked into the store (never over a file there) and the folder removed. A host that died
//! first leaves its folder behind: the next sandboxed start adopts every folder whose lock
//! (`flock`, held by the host and its watchdog for the run's life) nobody holds, once it is
//! older than a few seconds (so never between its making and its locking).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The folder of the store that holds the runs' own folders.
const RUNS: &str = ".runs";

/// How old a run's folder must be before a start may take it for left over: it is locked a few
/// system calls after it is made.
const SETTLED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// A run's own folder of the store, locked while it lives, settled when dropped.
#[derive(Debug)]
pub(super) struct RunStore {
    store: PathBuf,
    dir: PathBuf,
    /// Held for the run's life: its release tells a later start that the folder is left over.
    _lock: File,
}

impl RunStore {
    /// Makes the run's folder in `store` (after adopting what dead runs left), with the
    /// `sessions` the run names linked in.
    pub(super) fn open(store: &Path, sessions: &[&str]) -> io::Result<RunStore> {
        let runs = store.join(RUNS);
        std::fs::create_dir_all(&runs)?;
        adopt(store, &runs);
        let name = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos())
        );
        let dir = runs.join(name);
        std::fs::create_dir(&dir)?;
        let lock = File::open(&dir)?;
        lock.lock()?;
        for file in sessions.iter().filter_map(|id| super::session_file(id)) {
            if let Some(found) = find(store, &runs, &file) {
                std::fs::hard_link(found, dir.join(&file))?;
            }
        }
        Ok(RunStore {
            store: store.to_path_buf(),
            dir,
            _lock: lock,
        })
    }

    /// The run's folder, bound over the store.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RunStore {
    fn drop(&mut self) {
        settle(&self.store, &self.dir);
    }
}

/// Where session file `file` (a [`super::session_file`] name) is: in the store, or in a run's folder (a run still going, or
/// left over).
fn find(store: &Path, runs: &Path, file: &str) -> Option<PathBuf> {
    let direct = store.join(file);
    if direct.is_file() {
        return Some(direct);
    }
    std::fs::read_dir(runs)
        .ok()?
        .filter_map(Result::ok)
        .map(|run| run.path().join(file))
        .find(|path| path.is_file())
}

/// Settles the folders of runs that are over: each one nobody holds the lock of.
fn adopt(store: &Path, runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        // A folder just made may not be locked yet: only one older than that is left over.
        let young = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age < SETTLED_AFTER));
        if young {
            continue;
        }
        let path = entry.path();
        let Ok(lock) = File::open(&path) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            settle(store, &path);
        }
    }
}

/// Links each file of run folder `dir` into `store` (a file already there, the same file or
/// not, is never replaced), then removes what was linked, and the folder once empty.
fn settle(store: &Path, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let from = entry.path();
        let to = store.join(entry.file_name());
        let linked = std::fs::hard_link(&from, &to).is_ok() || same_file(&from, &to);
        if linked {
            let _ = std::fs::remove_file(&from);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Whether two paths name one file (a session the run named, linked in).
fn same_file(one: &Path, two: &Path) -> bool {
    match (std::fs::metadata(one), std::fs::metadata(two)) {
        (Ok(one), Ok(two)) => one.dev() == two.dev() && one.ino() == two.ino(),
        _ => false,
    }
}
