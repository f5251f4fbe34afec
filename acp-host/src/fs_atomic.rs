//! The one place that writes files: atomic replace (temp file in the same folder, fsync, rename),
//! keeping the file mode, never following a symlink out of the target folder.
//!
//! Invariants:
//! - A reader sees the old bytes or the new bytes, never a mix: content goes to a temp file in
//!   the destination folder (same filesystem), is made durable (`fsync` of that temp file), then
//!   renamed over the target, and the folder is fsynced so the rename survives a crash. A rename
//!   never installs contents not yet on disk.
//! - A [`Batch`] keeps that order for many files while paying for it once: every temp file is
//!   written first, each one's writeback started by a helper thread right after (a hint, see
//!   below); then all of them are fsynced by many threads at once ([`Batch::sync_data`]); only
//!   when every fsync has returned does the first rename run; the touched folders are fsynced
//!   last, also at once.
//!   The crash argument is per file and uses only what `fsync` promises for that file: a target
//!   is renamed only after its temp file's own fsync succeeded, so whatever a crash keeps of the
//!   rename points at durable contents; until the folder's fsync the rename may be lost, which
//!   leaves the old file. Nothing relies on the journal, on the order in which the kernel
//!   writes things back, or on `syncfs`, which flushes every dirty page of the whole filesystem
//!   (another program's too: with other programs writing to the disk, 0.45 to 0.9 s of a
//!   1,000-definition sync, where fsyncing its own 4,000 files takes 0.04 to 0.09 s). Starting
//!   writeback early (`posix_fadvise(DONTNEED)` on Linux, which writes dirty pages back and
//!   drops only clean ones) lets the data go to disk while later files are still being written,
//!   and lets a journalling filesystem commit many files' allocations at once, so the parallel
//!   fsyncs mostly wait for I/O already under way and share the device flushes.
//! - A target that is a symlink is written through only when the file it resolves to lies inside
//!   the link's own folder ([`resolve`]); otherwise the write is refused. The same rule decides
//!   what the planner sees ([`crate::sync_exec::read_facts`]) and what gets written.
//! - A run computes each target folder's canonical path once ([`Folders`]; a `realpath` costs a
//!   `readlink` per path component, and thousands of files share a handful of folders), so a
//!   folder swapped for a symlink later would not show in that cached path. A [`Batch`] closes
//!   that gap with checks per folder and one `stat` per file instead of a `realpath` per file:
//!   it opens each folder once when staging and refuses ([`FsError::Changed`], before any temp
//!   file goes there) a folder whose device and inode are not those the run saw when it
//!   checked the pre-images (a folder that did not exist then must have a canonical path free of
//!   symlinks once created); right before each rename it refuses the file when the path of the
//!   target's folder leads anywhere but to the folder held (a `stat`, following symlinks as a
//!   write would); and it renames through the held descriptor (`renameat`), so the rename lands
//!   in the folder that was checked even if a path changed after the check: the check and the
//!   rename cannot disagree about which folder they mean, where a per-file `realpath` followed
//!   by a rename by path could. A refused file's temp file is removed from the held folder.
//! - Backups go through the same temp file + fsync + rename path, renamed without replacing: an
//!   existing file is never overwritten, and a crash leaves no torn backup (only a temp file).
//! - Temp files are named `.acp-host-XXXXXX.tmp` (six random alphanumerics); [`clean_debris`]
//!   removes exactly those, which only a killed write leaves behind.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Mode of files we create (existing files keep theirs).
const NEW_FILE_MODE: u32 = 0o644;

const TEMP_PREFIX: &str = ".acp-host-";
const TEMP_SUFFIX: &str = ".tmp";
const TEMP_RANDOM: usize = 6;

/// Whether a folder entry is one of our temp files (exact shape, nothing looser).
fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|random| {
            random.len() == TEMP_RANDOM && random.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// A new temp file in `folder`, named so that [`clean_debris`] recognizes it.
fn temp_in(folder: &Path) -> io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .suffix(TEMP_SUFFIX)
        .rand_bytes(TEMP_RANDOM)
        .tempfile_in(folder)
}

/// Removes the temp files a killed write left in `folder` (regular files named exactly like ours;
/// never a symlink, never a folder) and returns them. A missing folder has none.
pub fn clean_debris(folder: &Path) -> Result<Vec<PathBuf>, FsError> {
    let entries = match fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(FsError::Inspect {
                path: folder.to_path_buf(),
                source,
            });
        }
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let ours = entry.file_name().to_str().is_some_and(is_temp_name)
            && entry.file_type().is_ok_and(|t| t.is_file());
        if !ours {
            continue;
        }
        let path = entry.path();
        fs::remove_file(&path).map_err(|source| FsError::Remove {
            path: path.clone(),
            source,
        })?;
        removed.push(path);
    }
    if !removed.is_empty() {
        sync_folder(folder)?;
    }
    Ok(removed)
}

/// A failed file-system operation, with the path it was about.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(
        "refusing to write through {path}: it is a symlink to {target}, outside its folder; replace the link with a regular file"
    )]
    SymlinkEscapes { path: PathBuf, target: PathBuf },
    #[error("cannot create folder {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} changed since it was read; not written (sync again to plan with the new contents)"
    )]
    Changed { path: PathBuf },
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where a write to a path lands.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The file that is read and written (canonical folder, symlink inside its folder followed).
    pub physical: PathBuf,
    /// The symlink target as read, when the path is a symlink.
    pub link: Option<PathBuf>,
    /// What is at the path when it exists and is not a symlink (so it describes `physical`
    /// too): the one `lstat` a reader or writer needs.
    pub(crate) metadata: Option<fs::Metadata>,
}

/// A folder's identity (device, inode): the same folder whatever path leads to it.
type FolderId = (u64, u64);

fn folder_id(metadata: &fs::Metadata) -> FolderId {
    use std::os::unix::fs::MetadataExt as _;
    (metadata.dev(), metadata.ino())
}

/// A target folder as one run saw it: its canonical path and, when it existed, its identity.
#[derive(Debug, Clone)]
struct Folder {
    canonical: PathBuf,
    id: Option<FolderId>,
}

/// The canonical folders of one run's targets, each computed once (a `realpath`, one
/// `readlink` per path component, per folder instead of per file: a sync writes thousands of
/// files into a handful of folders). A cached path is only as current as the moment it was
/// computed, so a [`Batch`] does not trust it to rename: it holds each folder open, checks at
/// staging that the folder it opened is the one seen here, and right before each rename that
/// the target's path still leads to that folder (see [`Batch::apply`]).
#[derive(Debug, Default)]
pub struct Folders {
    known: std::cell::RefCell<std::collections::HashMap<PathBuf, Folder>>,
}

impl Folders {
    fn folder(&self, parent: &Path) -> Folder {
        if let Some(folder) = self.known.borrow().get(parent) {
            return folder.clone();
        }
        let canonical = canonical_lenient(parent);
        let id = fs::metadata(&canonical)
            .ok()
            .filter(fs::Metadata::is_dir)
            .map(|m| folder_id(&m));
        let folder = Folder { canonical, id };
        self.known
            .borrow_mut()
            .insert(parent.to_path_buf(), folder.clone());
        folder
    }

    /// [`resolve`], with the folder's canonical path computed once per run.
    pub fn resolve(&self, path: &Path) -> Result<Resolved, FsError> {
        resolve_in(path, &self.folder(parent_of_ref(path)).canonical)
    }
}

fn parent_of_ref(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("/"))
}

/// The canonical form of a path whose tail may not exist yet: the nearest existing ancestor is
/// canonicalized and the missing components are appended.
fn canonical_lenient(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut tail = Vec::new();
    loop {
        if let Ok(canonical) = fs::canonicalize(existing) {
            return tail.iter().rev().fold(canonical, |acc, c| acc.join(c));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Resolves `path` for reading and writing, refusing a symlink that leaves its folder.
pub fn resolve(path: &Path) -> Result<Resolved, FsError> {
    Folders::default().resolve(path)
}

/// [`resolve`] with `folder`, the canonical path of `path`'s folder, already known.
fn resolve_in(path: &Path, folder: &Path) -> Result<Resolved, FsError> {
    let parent = parent_of_ref(path);
    let file_name = path.file_name().map(PathBuf::from).unwrap_or_default();
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Resolved {
                physical: folder.join(file_name),
                link: None,
                metadata: None,
            });
        }
        Err(source) => {
            return Err(FsError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !metadata.file_type().is_symlink() {
        return Ok(Resolved {
            physical: folder.join(file_name),
            link: None,
            metadata: Some(metadata),
        });
    }
    let target = fs::read_link(path).map_err(|source| FsError::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    let joined = parent.join(&target);
    let resolved = fs::canonicalize(&joined).unwrap_or_else(|_| canonical_lenient(&joined));
    if resolved.starts_with(folder) && resolved != folder {
        Ok(Resolved {
            physical: resolved,
            link: Some(target),
            metadata: None,
        })
    } else {
        Err(FsError::SymlinkEscapes {
            path: path.to_path_buf(),
            target,
        })
    }
}

fn create_parent(path: &Path) -> Result<&Path, FsError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent).map_err(|source| FsError::CreateDir {
        path: parent.to_path_buf(),
        source,
    })?;
    Ok(parent)
}

/// Makes a rename or removal in `folder` durable.
fn sync_folder(folder: &Path) -> Result<(), FsError> {
    File::open(folder)
        .and_then(|f| f.sync_all())
        .map_err(|source| FsError::Write {
            path: folder.to_path_buf(),
            source,
        })
}

/// Atomically replaces (or creates) the file `path` resolves to with `contents`, creating
/// missing parent folders and keeping an existing file's mode.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), FsError> {
    let folder = replace(path, contents)?;
    sync_folder(&folder)
}

/// Writes many files, paying for the flushes to disk once rather than file by file. Each file is
/// first [staged](Batch::stage_write) (its new contents written to a temp file beside it, its
/// writeback started), then [`Batch::sync_data`] fsyncs every staged temp file, many at once,
/// then each is [applied](Batch::apply) (renamed over its target, or the target removed), and
/// [`Batch::finish`] fsyncs every touched folder once, which makes the renames durable. A crash
/// at any point leaves each target old or new, never torn: a rename only ever installs contents
/// whose own fsync has returned. Staged files never applied are removed when the batch is
/// dropped.
#[derive(Debug, Default)]
pub struct Batch {
    staged: Vec<Option<Staged>>,
    folders: std::collections::BTreeSet<PathBuf>,
    synced: bool,
    writeback: Option<Writeback>,
    /// Folders already created (or found) this batch: `create_dir_all` stats its path each time.
    created: std::collections::HashSet<PathBuf>,
    /// Folders held open, by the path they were opened at, with their identity: renames go
    /// through these descriptors (`renameat`), so they land in the folder that was checked.
    held: Vec<(File, FolderId)>,
    held_at: std::collections::HashMap<PathBuf, usize>,
}

/// A thread that starts the writeback of each temp file handed to it and then closes it, so the
/// thread staging files does not wait on the block layer file by file (each start is a block
/// allocation and an I/O submission: 25 to 90 µs per small file where docs/benchmarks.md was
/// measured).
/// The queue is bounded: a batch of thousands never holds more than a few hundred fds.
#[derive(Debug)]
struct Writeback {
    files: std::sync::mpsc::SyncSender<File>,
    thread: std::thread::JoinHandle<()>,
}

/// How many staged files may wait for [`Writeback`] (each one an open fd).
const WRITEBACK_QUEUE: usize = 256;

impl Writeback {
    /// `None` where starting writeback early is not done, or when no thread can be spawned.
    fn spawn() -> Option<Writeback> {
        if !cfg!(any(target_os = "linux", target_os = "android")) {
            return None;
        }
        let (files, queue) = std::sync::mpsc::sync_channel::<File>(WRITEBACK_QUEUE);
        let thread = std::thread::Builder::new()
            .name("writeback".to_owned())
            .spawn(move || queue.into_iter().for_each(|file| start_writeback(&file)))
            .ok()?;
        Some(Writeback { files, thread })
    }

    /// Waits until every file handed over has had its writeback started.
    fn drain(self) {
        drop(self.files);
        // A panic there could only have skipped hints; the fsyncs that follow do not depend on
        // them.
        let _ = self.thread.join();
    }
}

/// One staged operation.
#[derive(Debug)]
enum Staged {
    /// Rename `temp` over `physical` (the file `target` resolves to), both inside held folder
    /// `dir`, once the path `target`'s folder leads to is still held folder `folder` (the same
    /// one unless `target` is a symlink into a subfolder).
    Replace {
        target: PathBuf,
        physical: PathBuf,
        temp: tempfile::TempPath,
        folder: usize,
        dir: usize,
    },
    /// Rename `temp` to `path`, never replacing an existing file.
    New {
        path: PathBuf,
        temp: tempfile::TempPath,
    },
    /// Remove what `target` resolves to.
    Remove { target: PathBuf },
}

/// A staged operation, by position; [`Batch::apply`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedId(usize);

impl Batch {
    /// Stages the atomic replace (or creation) of the file `path` resolves to with `contents`:
    /// missing parent folders are created, an existing file's mode is kept. Nothing is visible
    /// at `path` until [`Batch::apply`].
    pub fn stage_write(&mut self, path: &Path, contents: &[u8]) -> Result<StagedId, FsError> {
        self.stage_write_in(path, contents, &Folders::default())
    }

    /// [`Batch::stage_write`] with the run's `folders`; [`FsError::Changed`] when the folder
    /// opened now is not the one `folders` saw (swapped since it was checked), before anything
    /// is written into it.
    pub fn stage_write_in(
        &mut self,
        path: &Path,
        contents: &[u8],
        folders: &Folders,
    ) -> Result<StagedId, FsError> {
        let folder = folders.folder(parent_of_ref(path));
        let Resolved {
            physical,
            link,
            metadata,
        } = resolve_in(path, &folder.canonical)?;
        let mode = match (metadata, link) {
            (Some(metadata), _) => metadata.permissions().mode(),
            (None, Some(_)) => {
                fs::metadata(&physical).map_or(NEW_FILE_MODE, |m| m.permissions().mode())
            }
            (None, None) => NEW_FILE_MODE,
        };
        let dir_path = parent_of(&physical);
        self.create_once(&dir_path)?;
        let changed = || FsError::Changed {
            path: path.to_path_buf(),
        };
        let folder_at = self
            .hold(&folder.canonical, folder.id)?
            .ok_or_else(changed)?;
        let dir = if dir_path == folder.canonical {
            folder_at
        } else {
            self.hold(&dir_path, None)?.ok_or_else(changed)?
        };
        let temp = self.stage_temp(&physical, contents, mode)?;
        Ok(self.push(Staged::Replace {
            target: path.to_path_buf(),
            physical,
            temp,
            folder: folder_at,
            dir,
        }))
    }

    fn create_once(&mut self, folder: &Path) -> Result<(), FsError> {
        if !self.created.contains(folder) {
            fs::create_dir_all(folder).map_err(|source| FsError::CreateDir {
                path: folder.to_path_buf(),
                source,
            })?;
            self.created.insert(folder.to_path_buf());
        }
        Ok(())
    }

    /// Opens `folder` (once per batch) and returns its place among the held folders; `None` when
    /// it is not the folder expected: another identity than `expected`, or, when it did not
    /// exist when checked (so has no identity yet), a path that now leads through a symlink.
    fn hold(
        &mut self,
        folder: &Path,
        expected: Option<FolderId>,
    ) -> Result<Option<usize>, FsError> {
        let at = if let Some(&at) = self.held_at.get(folder) {
            at
        } else {
            let inspect = |source| FsError::Inspect {
                path: folder.to_path_buf(),
                source,
            };
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(nix::fcntl::OFlag::O_DIRECTORY.bits())
                .open(folder)
                .map_err(inspect)?;
            let id = folder_id(&file.metadata().map_err(inspect)?);
            if expected.is_none() && fs::canonicalize(folder).map_err(inspect)? != folder {
                return Ok(None);
            }
            self.held.push((file, id));
            self.held_at
                .insert(folder.to_path_buf(), self.held.len() - 1);
            self.held.len() - 1
        };
        Ok(expected
            .is_none_or(|id| id == self.held[at].1)
            .then_some(at))
    }

    /// Stages writing a new file at `path` (a backup): [`Batch::apply`] fails rather than
    /// replace an existing file.
    pub fn stage_new(&mut self, path: &Path, contents: &[u8]) -> Result<StagedId, FsError> {
        let temp = self.stage_temp(path, contents, NEW_FILE_MODE)?;
        Ok(self.push(Staged::New {
            path: path.to_path_buf(),
            temp,
        }))
    }

    /// Stages the removal of what `path` resolves to (and the symlink itself, when it is one).
    pub fn stage_remove(&mut self, path: &Path) -> StagedId {
        self.push(Staged::Remove {
            target: path.to_path_buf(),
        })
    }

    /// A temp file beside `path` holding `contents` with `mode`, handed to [`Writeback`] (which
    /// closes it: a batch of thousands must not hold thousands of fds; the fsync through a new
    /// descriptor still reports a writeback error nobody has seen yet), not yet synced.
    fn stage_temp(
        &mut self,
        path: &Path,
        contents: &[u8],
        mode: u32,
    ) -> Result<tempfile::TempPath, FsError> {
        let folder = parent_of_ref(path);
        self.create_once(folder)?;
        let (file, temp) = filled_temp(folder, path, contents, mode)?.into_parts();
        if self.writeback.is_none() {
            self.writeback = Writeback::spawn();
        }
        // Without the thread (or once it is gone) the hint is given here.
        let unsent = match &self.writeback {
            Some(writeback) => writeback.files.send(file).err().map(|e| e.0),
            None => Some(file),
        };
        if let Some(file) = unsent {
            start_writeback(&file);
        }
        Ok(temp)
    }

    fn push(&mut self, staged: Staged) -> StagedId {
        self.staged.push(Some(staged));
        StagedId(self.staged.len() - 1)
    }

    /// Makes every staged temp file durable: each one fsynced, on up to 64 threads at once.
    /// Required before the first [`Batch::apply`]; when any fsync fails, the error names that
    /// file's target and no operation can be applied.
    pub fn sync_data(&mut self) -> Result<(), FsError> {
        if let Some(writeback) = self.writeback.take() {
            writeback.drain();
        }
        let temps: Vec<(&Path, &Path)> = self
            .staged
            .iter()
            .flatten()
            .filter_map(|staged| match staged {
                Staged::Replace { temp, target, .. } => Some((&**temp, target.as_path())),
                Staged::New { temp, path } => Some((&**temp, path.as_path())),
                Staged::Remove { .. } => None,
            })
            .collect();
        fsync_all(&temps)?;
        self.synced = true;
        Ok(())
    }

    /// Applies staged operation `id`, only if `unchanged()` still holds right before the rename
    /// or unlink (otherwise [`FsError::Changed`], the target left as it is). Each id applies
    /// once; [`Batch::sync_data`] must have run.
    pub fn apply(&mut self, id: StagedId, unchanged: &dyn Fn() -> bool) -> Result<(), FsError> {
        let taken = self
            .synced
            .then(|| self.staged.get_mut(id.0).and_then(Option::take))
            .flatten();
        let Some(staged) = taken else {
            return Err(FsError::Write {
                path: PathBuf::new(),
                source: io::Error::other("staged write applied twice or before sync_data"),
            });
        };
        let target = match &staged {
            Staged::Replace { target, .. } | Staged::Remove { target } => target.clone(),
            Staged::New { path, .. } => path.clone(),
        };
        // The one check per file that the folder was not swapped since it was checked: the path
        // to the target's folder still leads to the folder held open (one `stat`, where
        // recomputing the canonical path costs a `readlink` per component).
        let moved = match &staged {
            Staged::Replace { folder, .. } => fs::metadata(parent_of_ref(&target))
                .map_or(true, |m| folder_id(&m) != self.held[*folder].1),
            _ => false,
        };
        if moved || !unchanged() {
            // Its temp file is removed from the held folder, wherever the path leads now.
            if let Staged::Replace { temp, dir, .. } = staged
                && let Some(name) = temp.file_name()
                && nix::unistd::unlinkat(
                    &self.held[dir].0,
                    name,
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                )
                .is_ok()
            {
                let _ = temp.keep();
            }
            return Err(FsError::Changed { path: target });
        }
        let write_error = |path: &Path, source| FsError::Write {
            path: path.to_path_buf(),
            source,
        };
        match staged {
            Staged::Replace {
                physical,
                temp,
                dir,
                ..
            } => {
                let dir_file = &self.held[dir].0;
                let (Some(from), Some(to)) = (temp.file_name(), physical.file_name()) else {
                    return Err(write_error(&physical, io::Error::other("no file name")));
                };
                nix::fcntl::renameat(dir_file, from, dir_file, to)
                    .map_err(|errno| write_error(&physical, io::Error::from(errno)))?;
                // Renamed: nothing is left at the temp path to remove.
                let _ = temp.keep();
                self.folders.insert(parent_of(&physical));
            }
            Staged::New { path, temp } => {
                temp.persist_noclobber(&path)
                    .map_err(|e| write_error(&path, e.error))?;
                self.folders.insert(parent_of(&path));
            }
            Staged::Remove { target } => self.folders.extend(unlink(&target)?),
        }
        Ok(())
    }

    /// Fsyncs every folder touched (making the applied renames and removals durable); staged
    /// files not applied are removed.
    pub fn finish(self) -> Result<(), FsError> {
        let folders: Vec<(&Path, &Path)> = self
            .folders
            .iter()
            .map(|folder| (folder.as_path(), folder.as_path()))
            .collect();
        fsync_all(&folders)
    }
}

/// How many threads [`fsync_all`] uses at most, the calling thread included. An fsync mostly
/// waits for the disk, and fsyncs in flight at the same time share the device's cache flushes
/// (and a journal's commits): with 4,000 files, 16 threads took three to ten times as long as 64.
const FLUSH_THREADS: usize = 64;

/// Fsyncs every file or folder `(path, named)`, up to [`FLUSH_THREADS`] at a time; an error
/// names `named` and stops handing out more work (of several failures, the first in `paths`'
/// order among those tried is returned). A thread that cannot be spawned only means fewer
/// fsyncs at once: the calling thread works through the list too.
fn fsync_all(paths: &[(&Path, &Path)]) -> Result<(), FsError> {
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<(usize, FsError)>> = Mutex::new(None);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(path, named)) = paths.get(i) else {
                return;
            };
            if let Err(source) = File::open(path).and_then(|f| f.sync_all()) {
                next.store(paths.len(), Ordering::Relaxed);
                let mut failed = crate::lock(&failed);
                if failed.as_ref().is_none_or(|(first, _)| i < *first) {
                    *failed = Some((
                        i,
                        FsError::Write {
                            path: named.to_path_buf(),
                            source,
                        },
                    ));
                }
                return;
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..FLUSH_THREADS.min(paths.len()) {
            if std::thread::Builder::new()
                .name("fsync".to_owned())
                .spawn_scoped(scope, work)
                .is_err()
            {
                break;
            }
        }
        work();
    });
    match failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new("/")).to_path_buf()
}

/// Asks the kernel to start writing `file`'s dirty pages now, without waiting: on Linux,
/// `POSIX_FADV_DONTNEED` writes dirty pages back before it drops clean ones (pages being
/// written are kept, and so is a partial last page). Only a hint: durability comes from the
/// fsync, so a failure here is ignored. Elsewhere nothing is done.
fn start_writeback(file: &File) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let _ = nix::fcntl::posix_fadvise(
            file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = file;
}

/// A temp file in `folder` (for `path`, named in errors) holding `contents` with `mode`, open and
/// not yet synced.
fn filled_temp(
    folder: &Path,
    path: &Path,
    contents: &[u8],
    mode: u32,
) -> Result<tempfile::NamedTempFile, FsError> {
    let write_error = |source| FsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut temp = temp_in(folder).map_err(write_error)?;
    temp.write_all(contents).map_err(write_error)?;
    temp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(write_error)?;
    Ok(temp)
}

/// The atomic replace without the folder fsync; returns the folder to fsync.
fn replace(path: &Path, contents: &[u8]) -> Result<PathBuf, FsError> {
    let Resolved { physical, .. } = resolve(path)?;
    let folder = create_parent(&physical)?;
    let write_error = |source| FsError::Write {
        path: physical.clone(),
        source,
    };
    let mode = match fs::metadata(&physical) {
        Ok(metadata) => metadata.permissions().mode(),
        Err(_) => NEW_FILE_MODE,
    };
    let temp = filled_temp(folder, &physical, contents, mode)?;
    temp.as_file().sync_all().map_err(write_error)?;
    temp.persist(&physical).map_err(|e| write_error(e.error))?;
    Ok(folder.to_path_buf())
}

/// An exclusive advisory lock (`flock`) on a file, held until dropped (or the process dies: the
/// kernel releases it, so a killed sync never leaves a stale lock).
#[derive(Debug)]
pub struct Lock {
    _held: nix::fcntl::Flock<File>,
}

impl Lock {
    /// Takes the lock on `path` (created, with its folders, when missing) without waiting;
    /// `None` when another process holds it.
    pub fn try_acquire(path: &Path) -> Result<Option<Lock>, FsError> {
        Self::take(path, nix::fcntl::FlockArg::LockExclusiveNonblock)
    }

    /// Takes the lock on `path`, waiting for its holder to release it.
    pub fn acquire(path: &Path) -> Result<Lock, FsError> {
        Self::take(path, nix::fcntl::FlockArg::LockExclusive)?.ok_or_else(|| FsError::Write {
            path: path.to_path_buf(),
            source: io::Error::from(io::ErrorKind::WouldBlock),
        })
    }

    fn take(path: &Path, how: nix::fcntl::FlockArg) -> Result<Option<Lock>, FsError> {
        create_parent(path)?;
        let error = |source| FsError::Write {
            path: path.to_path_buf(),
            source,
        };
        // Never truncated: the file holds nothing, only its lock matters.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(error)?;
        match nix::fcntl::Flock::lock(file, how) {
            Ok(held) => Ok(Some(Lock { _held: held })),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, errno)) => Err(error(io::Error::from(errno))),
        }
    }
}

/// Removes the file `path` resolves to (and the symlink itself, when `path` is one).
pub fn remove(path: &Path) -> Result<(), FsError> {
    unlink(path)?
        .iter()
        .try_for_each(|folder| sync_folder(folder))
}

/// The removal without the folder fsync; returns the folders to fsync.
fn unlink(path: &Path) -> Result<Vec<PathBuf>, FsError> {
    let Resolved { physical, link, .. } = resolve(path)?;
    let remove = |p: &Path| match fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(FsError::Remove {
            path: p.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    };
    remove(&physical)?;
    let mut folders = vec![physical.parent().unwrap_or(Path::new("/")).to_path_buf()];
    if link.is_some() {
        remove(path)?;
        folders.push(path.parent().unwrap_or(Path::new("/")).to_path_buf());
    }
    Ok(folders)
}

/// Removes `path` if it is an empty folder (a real one, not a symlink); a folder with anything
/// in it is kept and reported as an error.
pub fn remove_empty_folder(path: &Path) -> Result<(), FsError> {
    let error = |source| FsError::Remove {
        path: path.to_path_buf(),
        source,
    };
    if !fs::symlink_metadata(path).map_err(error)?.is_dir() {
        return Err(error(io::Error::other("not a folder")));
    }
    // `remove_dir` refuses a folder that is not empty, which is exactly the rule.
    fs::remove_dir(path).map_err(error)?;
    sync_folder(path.parent().unwrap_or(Path::new("/")))
}

/// Removes a whole folder this tool created (an old backup run). Refuses a symlink: only a real
/// folder is deleted, never what a link points to.
pub fn remove_tree(path: &Path) -> Result<(), FsError> {
    let inspect = |source| FsError::Remove {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::symlink_metadata(path).map_err(inspect)?;
    if !meta.is_dir() {
        return Err(inspect(io::Error::other("not a folder")));
    }
    fs::remove_dir_all(path).map_err(inspect)?;
    sync_folder(path.parent().unwrap_or(Path::new("/")))
}

/// Writes a new file through a fsynced temp file renamed without replacing: fails if `path`
/// exists (backups are never overwritten), and a crash leaves the whole file or none.
pub fn write_new(path: &Path, contents: &[u8]) -> Result<(), FsError> {
    let folder = create_parent(path)?;
    let write_error = |source| FsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let temp = filled_temp(folder, path, contents, NEW_FILE_MODE)?;
    temp.as_file().sync_all().map_err(write_error)?;
    temp.persist_noclobber(path)
        .map_err(|e| write_error(e.error))?;
    Ok(())
}

/// A new, empty folder inside `parent` (created if missing) that an install fills before it is
/// moved into place with [`rename_folder`]; removed with everything in it when dropped first, so
/// a failed install leaves nothing half-written.
pub fn staging_folder(parent: &Path) -> Result<tempfile::TempDir, FsError> {
    create_folder(parent)?;
    // 0755 at most whatever the umask: the folder becomes an install that others only read.
    tempfile::Builder::new()
        .prefix(".staging-")
        .permissions(Permissions::from_mode(0o755))
        .tempdir_in(parent)
        .map_err(|source| FsError::CreateDir {
            path: parent.to_path_buf(),
            source,
        })
}

/// A temporary file in `folder` (created if missing), removed when dropped: a download in
/// progress.
pub fn temp_file_in(folder: &Path) -> Result<tempfile::NamedTempFile, FsError> {
    create_folder(folder)?;
    tempfile::Builder::new()
        .prefix(".download-")
        .tempfile_in(folder)
        .map_err(|source| FsError::Write {
            path: folder.to_path_buf(),
            source,
        })
}

/// Creates `path` and its missing parents as folders, never writable by others (mode 0755 at
/// most, whatever the umask).
pub fn create_folder(path: &Path) -> Result<(), FsError> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|source| FsError::CreateDir {
            path: path.to_path_buf(),
            source,
        })
}

/// Creates the new file `path` with `mode` for the caller to fill: fails when anything exists at
/// `path`, a symlink included (`O_EXCL` never follows one), so an unpacked entry never writes
/// through a link or over another entry.
pub fn create_new_file(path: &Path, mode: u32) -> Result<File, FsError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| FsError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// Opens the log file `path` the person named for appending (created with mode 0600 when
/// absent): an append-only log, never replaced; each record is one `write` of a whole line, so
/// several processes appending to one file (a tree's levels, `--trace-out`) never interleave
/// within a line.
pub fn open_append_log(path: &Path) -> Result<File, FsError> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| FsError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// Creates the one new folder `path` (its parent must exist): `Ok(false)` when something is
/// already there. Two processes claiming the same path get one `true` between them, which is
/// what makes a name taken by a racing run go to the next one (`worktree`).
pub fn claim_folder(path: &Path) -> Result<bool, FsError> {
    use std::os::unix::fs::DirBuilderExt as _;
    match fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(FsError::CreateDir {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Copies the file `from` to `to` (atomically, parent folders created), with `from`'s
/// permission bits.
pub fn copy_file(from: &Path, to: &Path) -> Result<(), FsError> {
    let inspect = |source| FsError::Inspect {
        path: from.to_path_buf(),
        source,
    };
    let contents = fs::read(from).map_err(inspect)?;
    let mode = fs::metadata(from).map_err(inspect)?.permissions().mode();
    write_atomic(to, &contents)?;
    set_mode(to, mode & 0o7777)
}

/// Creates the symlink `link` pointing at `target` (the caller checked the target).
pub fn create_symlink(target: &Path, link: &Path) -> Result<(), FsError> {
    std::os::unix::fs::symlink(target, link).map_err(|source| FsError::Write {
        path: link.to_path_buf(),
        source,
    })
}

/// Sets the permission bits of `path` (not following a symlink's target out: callers pass files
/// they created).
pub fn set_mode(path: &Path, mode: u32) -> Result<(), FsError> {
    fs::set_permissions(path, Permissions::from_mode(mode)).map_err(|source| FsError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Moves the filled folder `from` to `to` in one rename (same filesystem), then makes the rename
/// durable. `Ok(false)` when `to` already exists (another process installed the same thing
/// first): `from` is left for its owner to drop.
pub fn rename_folder(from: &Path, to: &Path) -> Result<bool, FsError> {
    let parent = create_parent(to)?;
    match fs::rename(from, to) {
        Ok(()) => {
            sync_folder(parent)?;
            Ok(true)
        }
        Err(err)
            if to.is_dir()
                && matches!(
                    err.kind(),
                    io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::AlreadyExists
                ) =>
        {
            Ok(false)
        }
        Err(source) => Err(FsError::Write {
            path: to.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn writes_atomically_creating_folders_and_keeping_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/c.md");
        write_atomic(&path, b"one").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
    }

    #[test]
    fn follows_a_symlink_inside_its_folder_only() {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("agents");
        fs::create_dir(&agents).unwrap();
        fs::write(agents.join("real.md"), "old").unwrap();
        symlink("real.md", agents.join("link.md")).unwrap();
        write_atomic(&agents.join("link.md"), b"new").unwrap();
        assert_eq!(fs::read(agents.join("real.md")).unwrap(), b"new");
        assert!(
            fs::symlink_metadata(agents.join("link.md"))
                .unwrap()
                .file_type()
                .is_symlink()
        );

        let outside = dir.path().join("outside.md");
        fs::write(&outside, "theirs").unwrap();
        symlink(&outside, agents.join("escape.md")).unwrap();
        let err = write_atomic(&agents.join("escape.md"), b"x").unwrap_err();
        assert!(matches!(err, FsError::SymlinkEscapes { .. }), "{err}");
        assert!(err.to_string().starts_with("refusing to write through"));
        assert_eq!(fs::read(&outside).unwrap(), b"theirs");
        assert!(matches!(
            remove(&agents.join("escape.md")),
            Err(FsError::SymlinkEscapes { .. })
        ));
        assert_eq!(fs::read(&outside).unwrap(), b"theirs");
    }

    #[test]
    fn a_symlinked_folder_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("dotfiles")).unwrap();
        symlink(dir.path().join("dotfiles"), dir.path().join("agents")).unwrap();
        write_atomic(&dir.path().join("agents/x.md"), b"x").unwrap();
        assert_eq!(fs::read(dir.path().join("dotfiles/x.md")).unwrap(), b"x");
        let resolved = resolve(&dir.path().join("agents/x.md")).unwrap();
        assert_eq!(
            resolved.physical,
            fs::canonicalize(dir.path()).unwrap().join("dotfiles/x.md")
        );
    }

    #[test]
    fn backups_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b/x.md");
        write_new(&path, b"1").unwrap();
        assert!(write_new(&path, b"2").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"1");
    }

    #[test]
    fn debris_is_exactly_our_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let ours = [".acp-host-a1B2c3.tmp", ".acp-host-zzzzzz.tmp"];
        let theirs = [
            ".acp-host-notes.tmp",
            ".acp-host-abc123.tmp.bak",
            "acp-host-abc123.tmp",
            ".acp-host-abc12!.tmp",
            "x.md",
        ];
        for name in ours.iter().chain(&theirs) {
            fs::write(dir.path().join(name), "x").unwrap();
        }
        fs::create_dir(dir.path().join(".acp-host-folder.tmp")).unwrap();
        let mut removed = clean_debris(dir.path()).unwrap();
        removed.sort();
        assert_eq!(
            removed,
            ours.iter().map(|n| dir.path().join(n)).collect::<Vec<_>>()
        );
        for name in theirs {
            assert!(dir.path().join(name).exists(), "{name} kept");
        }
        assert!(dir.path().join(".acp-host-folder.tmp").is_dir());
        assert!(
            clean_debris(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
        // What a write leaves while in flight is recognized as ours.
        let temp = temp_in(dir.path()).unwrap();
        let name = temp.path().file_name().unwrap().to_str().unwrap();
        assert!(is_temp_name(name), "{name}");
    }

    #[test]
    fn a_held_lock_is_refused_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/sync.lock");
        let held = Lock::try_acquire(&path).unwrap().expect("free");
        assert!(
            Lock::try_acquire(&path).unwrap().is_none(),
            "held elsewhere"
        );
        drop(held);
        assert!(Lock::acquire(&path).is_ok());
    }

    #[test]
    fn remove_deletes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.md");
        fs::write(&path, "x").unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_batch_shows_nothing_until_applied_and_keeps_a_changed_target() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, gone) = (
            dir.path().join("a.md"),
            dir.path().join("b.md"),
            dir.path().join("gone.md"),
        );
        fs::write(&b, "old b").unwrap();
        fs::write(&gone, "x").unwrap();
        let mut batch = Batch::default();
        let write_a = batch.stage_write(&a, b"new a").unwrap();
        let write_b = batch.stage_write(&b, b"new b").unwrap();
        let remove = batch.stage_remove(&gone);
        // Staged: targets untouched, only temp files beside them.
        assert!(!a.exists());
        assert_eq!(fs::read_to_string(&b).unwrap(), "old b");
        assert!(matches!(
            batch.apply(write_a, &|| true),
            Err(FsError::Write { .. })
        ));
        batch.sync_data().unwrap();
        batch.apply(write_a, &|| true).unwrap();
        assert!(matches!(
            batch.apply(write_b, &|| false),
            Err(FsError::Changed { .. })
        ));
        batch.apply(remove, &|| true).unwrap();
        batch.finish().unwrap();
        assert_eq!(fs::read_to_string(&a).unwrap(), "new a");
        assert_eq!(fs::read_to_string(&b).unwrap(), "old b");
        // The temp file of the write that was not applied is gone with the batch.
        assert_eq!(names_in(dir.path()), ["a.md", "b.md"]);
    }

    #[test]
    fn a_dropped_batch_leaves_no_temp_file_and_a_backup_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let backup = dir.path().join("backup.md");
        fs::write(&backup, "first").unwrap();
        let mut batch = Batch::default();
        batch.stage_write(&dir.path().join("x.md"), b"x").unwrap();
        drop(batch);
        assert_eq!(names_in(dir.path()), ["backup.md"]);
        let mut batch = Batch::default();
        let id = batch.stage_new(&backup, b"second").unwrap();
        batch.sync_data().unwrap();
        assert!(batch.apply(id, &|| true).is_err());
        assert_eq!(fs::read_to_string(&backup).unwrap(), "first");
    }

    #[test]
    fn a_batch_larger_than_the_flush_threads_writes_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let count = FLUSH_THREADS * 3 + 1;
        let paths: Vec<PathBuf> = (0..count)
            .map(|i| dir.path().join(format!("f{}/x{i}.md", i % 3)))
            .collect();
        fs::create_dir(dir.path().join("f0")).unwrap();
        fs::write(&paths[0], "old").unwrap();
        let mut batch = Batch::default();
        let ids: Vec<StagedId> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| batch.stage_write(p, format!("new {i}").as_bytes()).unwrap())
            .collect();
        batch.sync_data().unwrap();
        for id in ids {
            batch.apply(id, &|| true).unwrap();
        }
        batch.finish().unwrap();
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(fs::read_to_string(path).unwrap(), format!("new {i}"));
        }
        for folder in ["f0", "f1", "f2"] {
            let names = names_in(&dir.path().join(folder));
            assert!(names.iter().all(|n| !is_temp_name(n)), "{names:?}");
        }
    }

    #[test]
    fn a_failed_flush_names_its_target_and_nothing_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (lost, kept) = (dir.path().join("lost/x.md"), dir.path().join("kept"));
        let mut batch = Batch::default();
        let mut ids = vec![batch.stage_write(&lost, b"x").unwrap()];
        for i in 0..20 {
            fs::create_dir_all(&kept).unwrap();
            fs::write(kept.join(format!("{i}.md")), "old").unwrap();
            ids.push(
                batch
                    .stage_write(&kept.join(format!("{i}.md")), b"new")
                    .unwrap(),
            );
        }
        // Something else removes the temp file between staging and the flush.
        let temp = names_in(&dir.path().join("lost")).pop().unwrap();
        assert!(is_temp_name(&temp), "{temp}");
        fs::remove_file(dir.path().join("lost").join(&temp)).unwrap();

        let err = batch.sync_data().unwrap_err();
        assert!(
            matches!(&err, FsError::Write { path, .. } if *path == lost),
            "{err}"
        );
        assert!(err.to_string().starts_with("cannot write "), "{err}");
        for id in ids {
            assert!(
                batch.apply(id, &|| true).is_err(),
                "nothing applies after a failed flush"
            );
        }
        drop(batch);
        assert!(names_in(&dir.path().join("lost")).is_empty());
        let names = names_in(&kept);
        assert_eq!(names.len(), 20, "no temp file left: {names:?}");
        assert_eq!(fs::read_to_string(kept.join("0.md")).unwrap(), "old");
    }

    #[test]
    fn a_folder_swapped_after_its_check_is_refused_at_staging_and_before_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let (agents, moved, outside) = (
            dir.path().join("agents"),
            dir.path().join("moved"),
            dir.path().join("outside"),
        );
        fs::create_dir(&agents).unwrap();
        fs::create_dir(&outside).unwrap();
        let swap = || {
            fs::rename(&agents, &moved).unwrap();
            symlink(&outside, &agents).unwrap();
        };
        let unswap = || {
            fs::remove_file(&agents).unwrap();
            fs::rename(&moved, &agents).unwrap();
        };
        // Swapped between the check (`folders`) and staging.
        let folders = Folders::default();
        folders.resolve(&agents.join("x.md")).unwrap();
        swap();
        let mut batch = Batch::default();
        assert!(matches!(
            batch.stage_write_in(&agents.join("x.md"), b"x", &folders),
            Err(FsError::Changed { .. })
        ));
        unswap();
        // Swapped between staging and the rename.
        let folders = Folders::default();
        let mut batch = Batch::default();
        let id = batch
            .stage_write_in(&agents.join("x.md"), b"x", &folders)
            .unwrap();
        batch.sync_data().unwrap();
        swap();
        assert!(matches!(
            batch.apply(id, &|| true),
            Err(FsError::Changed { .. })
        ));
        drop(batch);
        assert!(names_in(&outside).is_empty());
        assert!(names_in(&moved).is_empty(), "the temp file is gone too");
    }

    #[test]
    fn finishing_fsyncs_the_folders_and_reports_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        fs::create_dir(&gone).unwrap();
        let mut batch = Batch::default();
        let id = batch.stage_write(&gone.join("x.md"), b"x").unwrap();
        batch.sync_data().unwrap();
        batch.apply(id, &|| true).unwrap();
        fs::remove_dir_all(&gone).unwrap();
        let err = batch.finish().unwrap_err();
        assert!(
            matches!(&err, FsError::Write { path, .. } if path.ends_with("gone")),
            "{err}"
        );
    }
}
