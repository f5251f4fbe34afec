//! Executes a sync plan: pre-image re-check, backups, atomic writes, per-file results.
//!
//! Flow: [`prepare`] reads the canonical folder, gathers host facts into a
//! [`protocol::sync::RegistryView`], reads every file the planner needs into a snapshot and calls
//! the pure planner; [`execute`] then applies the plan. Invariants:
//! - A plan that cannot apply writes nothing.
//! - Every pre-image is re-checked before the first write; any difference fails the run as stale
//!   (`plan is stale: <file>`) with nothing written. Each file's pre-image is checked once more
//!   right before its own rename: a file edited while the sync runs is not written (reported
//!   failed, the run exits 1) and the rest of the plan goes on.
//! - Every file that is replaced or removed is first copied to a new, timestamped backup folder
//!   under the user's state folder; backups are never overwritten.
//! - Temp files that a killed sync left (in the folders of the plan's files, and in the backups)
//!   are removed at the start of the next sync that can apply.
//! - Writes go through [`crate::fs_atomic`]'s batch: every new file's contents are written beside
//!   its target and made durable (every temp file fsynced, many at once) before the first
//!   rename; then the renames and removals run in sorted path order, and every touched folder is
//!   fsynced once. The first failure stops the run and the result says which file failed and
//!   whether files were already written (a file that cannot be written stops the run before any
//!   target is replaced).

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use protocol::definition::{self, Definition, DefinitionErrors, SourceEntry};
use protocol::registry::{self, Scope};
use protocol::sync::{
    self, AgentView, Authorization, Change, ChangeKind, FileFacts, FilePlan, FileState, Plan,
    RegistryView, Snapshot,
};

use crate::fs_atomic::{self, Folders, FsError};
use crate::installed;

/// What a sync run works on (built by the CLI from its flags, or by a library caller).
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The canonical folder (`subagents/`).
    pub source: PathBuf,
    pub scope: Scope,
    /// The user's home ($HOME): user-scope targets, marker folders, pi's extension, codex config.
    pub home: PathBuf,
    /// The project root (project-scope targets).
    pub project_root: PathBuf,
    /// Only these agents (canonical names); empty means every sync agent.
    pub agents: Vec<&'static str>,
    pub authorization: Authorization,
    /// The PATH value used to find installed binaries.
    pub path_var: Option<OsString>,
}

/// How many run folders of backups a sync keeps by default. Keeping every backup forever costs
/// 1.9 MB per edit at 1,000 DSH items; a bounded history still covers recent mistakes.
pub const DEFAULT_KEEP_BACKUPS: usize = 20;

/// Where execution keeps its backups (and how many), and where syncs take turns.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// `$XDG_STATE_HOME/acp-host/backups` or `~/.local/state/acp-host/backups`.
    pub backup_root: PathBuf,
    /// After a successful run that made backups, only the newest this many run folders are kept;
    /// `0` keeps them all.
    pub keep_backups: usize,
    /// The file whose `flock` a sync holds from planning to the last write
    /// (`<state>/acp-host/sync.lock`): two syncs never interleave.
    pub lock_path: PathBuf,
    /// The test hook of [`protocol::env_vars::ACP_HOST_SYNC_PAUSE`].
    pub pause: Option<PausePoint>,
}

/// A named point where a sync stops until a test lets it go (see
/// [`protocol::env_vars::ACP_HOST_SYNC_PAUSE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausePoint {
    pub point: String,
    pub dir: PathBuf,
}

impl PausePoint {
    /// Parses `<point>:<dir>`; `None` when malformed.
    #[must_use]
    pub fn parse(value: &str) -> Option<PausePoint> {
        let (point, dir) = value.split_once(':')?;
        (!point.is_empty() && !dir.is_empty()).then(|| PausePoint {
            point: point.to_owned(),
            dir: PathBuf::from(dir),
        })
    }

    /// At `point`, when it is ours: announces `<point>.ready` and waits for `<point>.go`.
    pub fn reached(pause: Option<&PausePoint>, point: &str) {
        let Some(pause) = pause.filter(|p| p.point == point) else {
            return;
        };
        let ready = pause.dir.join(format!("{point}.ready"));
        if let Err(e) = fs_atomic::write_atomic(&ready, b"") {
            tracing::warn!(error = %e, "test pause point not announced");
            return;
        }
        let go = pause.dir.join(format!("{point}.go"));
        while !go.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl ExecConfig {
    /// The backup root under the user's state folder ([`protocol::env_vars::state_home`]); `None`
    /// when there is neither a usable `$XDG_STATE_HOME` nor a home.
    #[must_use]
    pub fn for_user(home: &Path, xdg_state_home: Option<&Path>) -> Option<Self> {
        let state = protocol::env_vars::state_home(Some(home), xdg_state_home)?;
        Some(ExecConfig {
            backup_root: state.join("acp-host/backups"),
            keep_backups: DEFAULT_KEEP_BACKUPS,
            lock_path: state.join("acp-host/sync.lock"),
            pause: None,
        })
    }
}

/// Why a sync could not even be planned.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(
        "source folder {path} does not exist; create it with one <name>.md per subagent, or pass --source DIR"
    )]
    SourceMissing { path: PathBuf },
    #[error(
        "source folder {path} is a symlink; point --source at the real folder so every definition is read from one place"
    )]
    SourceSymlink { path: PathBuf },
    #[error("source {path} is not a folder; pass --source DIR with one <name>.md per subagent")]
    SourceNotAFolder { path: PathBuf },
    #[error("cannot read source folder {path}: {source}")]
    SourceRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Definitions(#[from] DefinitionErrors),
    #[error("{agent} has no project scope; adopt its files with --scope user")]
    AdoptNoScope { agent: &'static str },
    #[error(
        "{agent} keeps its subagents in one shared file; only agents with one file per subagent can be adopted"
    )]
    AdoptShared { agent: &'static str },
    #[error("cannot list {path}: {source}")]
    AdoptFolder {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    AdoptWrite {
        path: PathBuf,
        #[source]
        source: FsError,
    },
}

/// Everything [`prepare`] produced: the definitions, the agents it considered, the plan.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub definitions: Vec<Definition>,
    pub view: RegistryView,
    pub plan: Plan,
}

/// Reads the canonical folder without following symlinks.
pub fn read_source(dir: &Path) -> Result<Vec<SourceEntry>, SyncError> {
    check_source_folder(dir)?;
    let read_error = |source| SyncError::SourceRead {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().map_err(read_error)?;
        entries.push(source_entry(dir, name, kind)?);
    }
    Ok(entries)
}

/// Entry `name` of folder `dir`, read as [`read_source`] reads each (the folder itself checked
/// the same way, symlinks never followed); `None` when the folder or the entry does not exist.
pub fn read_source_entry(dir: &Path, name: &str) -> Result<Option<SourceEntry>, SyncError> {
    match check_source_folder(dir) {
        Err(SyncError::SourceMissing { .. }) => return Ok(None),
        checked => checked?,
    }
    match fs::symlink_metadata(dir.join(name)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SyncError::SourceRead {
            path: dir.to_path_buf(),
            source,
        }),
        Ok(meta) => source_entry(dir, name.to_owned(), meta.file_type()).map(Some),
    }
}

/// The folder of definitions is a real folder: not a symlink (its files would be another
/// folder's, their approvals included), not missing, not a file.
fn check_source_folder(dir: &Path) -> Result<(), SyncError> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SyncError::SourceMissing {
            path: dir.to_path_buf(),
        }),
        Err(source) => Err(SyncError::SourceRead {
            path: dir.to_path_buf(),
            source,
        }),
        Ok(m) if m.file_type().is_symlink() => Err(SyncError::SourceSymlink {
            path: dir.to_path_buf(),
        }),
        Ok(m) if !m.is_dir() => Err(SyncError::SourceNotAFolder {
            path: dir.to_path_buf(),
        }),
        Ok(_) => Ok(()),
    }
}

/// Entry `name` of `dir`, of type `kind` (not followed): a regular file's contents are read.
fn source_entry(dir: &Path, name: String, kind: fs::FileType) -> Result<SourceEntry, SyncError> {
    Ok(if kind.is_symlink() {
        SourceEntry::Symlink { name }
    } else if kind.is_dir() {
        SourceEntry::Folder { name }
    } else if kind.is_file() {
        let contents = fs::read(dir.join(&name)).map_err(|source| SyncError::SourceRead {
            path: dir.to_path_buf(),
            source,
        })?;
        SourceEntry::File { name, contents }
    } else {
        SourceEntry::Other { name }
    })
}

/// The agents a sync considers, with their availability and readiness on this host.
#[must_use]
pub fn registry_view(config: &SyncConfig) -> RegistryView {
    let path_var = config.path_var.as_deref();
    let agents = registry::sync_agents()
        .filter(|(spec, _)| config.agents.is_empty() || config.agents.contains(&spec.name))
        .map(|(spec, target)| {
            let availability = installed::availability(spec, &config.home, path_var);
            let requires_present = target
                .requires
                .is_none_or(|file| config.home.join(file).is_file());
            let switch_contents = target
                .switch
                .and_then(|switch| fs::read_to_string(config.home.join(switch.file)).ok());
            AgentView {
                spec,
                target,
                readiness: sync::readiness(
                    (spec, target),
                    config.scope,
                    &availability,
                    requires_present,
                    switch_contents.as_deref(),
                ),
                availability,
            }
        })
        .collect();
    RegistryView {
        scope: config.scope,
        base: match config.scope {
            Scope::User => config.home.clone(),
            Scope::Project => config.project_root.clone(),
        },
        agents,
    }
}

/// What is at `path` now: the one reader of target files, used for planning and for the
/// pre-image re-check alike.
#[must_use]
pub fn read_facts(path: &Path) -> FileFacts {
    read_facts_in(path, &Folders::default())
}

/// [`read_facts`] with the run's canonical folders (computed once per folder, not per file).
fn read_facts_in(path: &Path, folders: &Folders) -> FileFacts {
    let resolved = match folders.resolve(path) {
        Ok(resolved) => resolved,
        Err(e) => {
            let link = match &e {
                FsError::SymlinkEscapes { target, .. } => Some(target.clone()),
                _ => None,
            };
            return FileFacts {
                physical: path.to_path_buf(),
                link,
                state: FileState::Unwritable(e.to_string()),
            };
        }
    };
    // Not a symlink: resolving already looked at the file (or found none); a symlink's target is
    // looked at here.
    let metadata = match (&resolved.metadata, &resolved.link) {
        (Some(metadata), _) => Ok(metadata.clone()),
        (None, None) => Err(io::Error::from(io::ErrorKind::NotFound)),
        (None, Some(_)) => fs::symlink_metadata(&resolved.physical),
    };
    let state = match metadata {
        Err(e) if e.kind() == io::ErrorKind::NotFound => FileState::Missing,
        Err(e) => FileState::Unwritable(format!("cannot inspect {}: {e}", path.display())),
        Ok(m) if m.is_file() => match read_sized(&resolved.physical, m.len()) {
            Ok(bytes) => FileState::File(bytes),
            Err(e) => FileState::Unwritable(format!("cannot read {}: {e}", path.display())),
        },
        Ok(_) => FileState::NotAFile,
    };
    FileFacts {
        physical: resolved.physical,
        link: resolved.link,
        state,
    }
}

/// A file's bytes, its size already known (`fs::read` and `File::read_to_end` would `fstat` it
/// again, the latter `lseek` too). A file grown since reads on to its end all the same.
fn read_sized(path: &Path, len: u64) -> io::Result<Vec<u8>> {
    use io::Read as _;
    let mut file = fs::File::open(path)?;
    let mut bytes = vec![0; usize::try_from(len).unwrap_or(0).saturating_add(1)];
    let mut filled = 0;
    loop {
        match file.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if filled == bytes.len() {
            file.read_to_end(&mut bytes)?;
            return Ok(bytes);
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// Reads what a scan request asks for. A folder that cannot be listed lists nothing.
#[must_use]
pub fn read_snapshot(request: &sync::ScanRequest) -> Snapshot {
    let canonical = Folders::default();
    let read_facts = |path: &Path| read_facts_in(path, &canonical);
    let mut snapshot = Snapshot::default();
    for path in &request.files {
        snapshot.files.insert(path.clone(), read_facts(path));
    }
    for folder in request.folders.keys() {
        let mut entries: Vec<String> = fs::read_dir(folder)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        entries.sort();
        for path in request.candidates(folder, &entries) {
            snapshot
                .files
                .entry(path.clone())
                .or_insert_with(|| read_facts(&path));
        }
        snapshot.folders.insert(folder.clone(), entries);
    }
    let mut folders: std::collections::BTreeMap<PathBuf, Option<String>> =
        std::collections::BTreeMap::new();
    for (path, facts) in &snapshot.files {
        let Some(folder) = facts.physical.parent() else {
            continue;
        };
        let verdict = folders
            .entry(folder.to_path_buf())
            .or_insert_with(|| folder_unwritable(folder));
        if let Some(reason) = verdict {
            snapshot.unwritable.insert(path.clone(), reason.clone());
        }
    }
    snapshot
}

/// Why nothing can be written into `folder` (or, while it does not exist, into the nearest folder
/// that does, where it would be created), if nothing can: its permissions, a read-only file
/// system. The planner refuses changes there, so such a failure never comes after other writes.
fn folder_unwritable(folder: &Path) -> Option<String> {
    let existing = folder.ancestors().find(|a| a.is_dir())?;
    match nix::unistd::access(existing, nix::unistd::AccessFlags::W_OK) {
        Ok(()) => None,
        Err(errno) => Some(format!(
            "cannot write into {}: {}; fix its permissions (or leave the agent out with --agent)",
            existing.display(),
            io::Error::from(errno)
        )),
    }
}

/// The bytes at `path` for adopting: `Ok(None)` when nothing is there, `Err` when something is
/// there that cannot be read as a file (a folder, a symlink out of its folder, a read error).
fn read_for_adoption(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match read_facts(path).state {
        FileState::Missing => Ok(None),
        FileState::File(bytes) => Ok(Some(bytes)),
        FileState::NotAFile => Err(format!("{} is not a file", path.display())),
        FileState::Unwritable(reason) => Err(reason),
    }
}

/// `sync --adopt AGENT [NAME...]`: reads `agent`'s own files in the config's scope (every one
/// in its folder, or only `names`) and decides, for each, what adopting it does
/// ([`sync::import::adopt_one`]). Writes nothing.
pub fn plan_adoption(
    config: &SyncConfig,
    agent: &'static str,
    names: &[String],
) -> Result<Vec<sync::import::Adoption>, SyncError> {
    let Some((spec, target)) = registry::find_sync(agent) else {
        return Err(SyncError::AdoptShared { agent });
    };
    let base = match config.scope {
        Scope::User => &config.home,
        Scope::Project => &config.project_root,
    };
    let template = target
        .template(config.scope)
        .ok_or(SyncError::AdoptNoScope { agent })?;
    let location = sync::Location {
        agent: spec.name,
        format: target.format,
        base: base.clone(),
        template,
    };
    let folder = location.folder().ok_or(SyncError::AdoptShared { agent })?;
    let explicit = !names.is_empty();
    let mut wanted: Vec<String> = names.to_vec();
    if !explicit {
        match fs::read_dir(&folder) {
            Ok(entries) => wanted.extend(
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter_map(|entry| location.name_of_entry(&entry)),
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SyncError::AdoptFolder {
                    path: folder,
                    source,
                });
            }
        }
    }
    wanted.sort();
    wanted.dedup();
    let mut adoptions = Vec::new();
    for name in &wanted {
        let path = location.path_for(name);
        let contents = match read_for_adoption(&path) {
            Ok(Some(bytes)) => Ok(bytes),
            // A folder entry that holds no definition (agy's `<name>/` without `agent.md`).
            Ok(None) if !explicit => continue,
            Ok(None) => Err(format!("no {agent} subagent at {}", path.display())),
            Err(reason) => Err(reason),
        };
        let canonical = read_for_adoption(&config.source.join(format!("{name}.md")));
        let adoption = match canonical {
            Ok(canonical) => sync::import::adopt_one(
                agent,
                &target,
                (name, &path),
                contents.as_deref().map_err(Clone::clone),
                canonical.as_deref(),
            ),
            Err(reason) => sync::import::adopt_one(
                agent,
                &target,
                (name, &path),
                Err(format!("subagents/{name}.md: {reason}")),
                None,
            ),
        };
        adoptions.push(adoption);
    }
    Ok(adoptions)
}

/// Writes the canonical file of every adoption that creates one, each as a new file (never
/// replacing one that appeared since it was planned). Returns the files written.
pub fn write_adoptions(
    source: &Path,
    adoptions: &[sync::import::Adoption],
) -> Result<Vec<PathBuf>, SyncError> {
    let mut written = Vec::new();
    for adoption in adoptions
        .iter()
        .filter(|a| a.action == sync::import::AdoptAction::Create)
    {
        let Some(text) = &adoption.text else {
            continue;
        };
        let path = source.join(format!("{}.md", adoption.name));
        fs_atomic::write_new(&path, text.as_bytes()).map_err(|source| SyncError::AdoptWrite {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}

/// Reads and validates the definitions, gathers host facts and files, and plans. Writes nothing.
pub fn prepare(config: &SyncConfig) -> Result<Prepared, SyncError> {
    let definitions = definition::load_set(read_source(&config.source)?)?;
    let view = registry_view(config);
    let snapshot = read_snapshot(&view.scan_request(&definitions));
    let plan = sync::plan(&definitions, &view, &snapshot, &config.authorization);
    Ok(Prepared {
        definitions,
        view,
        plan,
    })
}

pub use protocol::sync::report::{ExecutionResult, FileResult, Outcome};

fn result_for(plan: &Plan, file: &FilePlan) -> FileResult {
    let outcome = if file.change == Change::Keep {
        plan.resting_outcome(file)
    } else {
        Outcome::Skipped
    };
    let detail = match outcome {
        Outcome::Skipped if file.change != Change::Keep => Some("not attempted".to_owned()),
        Outcome::Skipped => plan.operations_of(file).next().map(|op| op.reason.clone()),
        _ => None,
    };
    FileResult {
        path: file.path.clone(),
        outcome,
        change: file.change.kind(),
        detail,
        backup: None,
    }
}

/// Marks every not-yet-done file to change as skipped with `detail`, and returns a failure.
fn stop(
    mut files: Vec<FileResult>,
    error: String,
    failed: Vec<PathBuf>,
    detail: &str,
) -> ExecutionResult {
    for file in &mut files {
        if file.outcome == Outcome::Skipped
            && file.change != ChangeKind::Keep
            && !failed.contains(&file.path)
        {
            file.detail = Some(detail.to_owned());
        }
    }
    let partial = files.iter().any(|f| f.outcome == Outcome::Applied);
    ExecutionResult {
        success: false,
        files,
        error: Some(error),
        failed_files: failed,
        partial,
        backup_dir: None,
    }
}

/// A new backup folder for this run: `<root>/<UTC timestamp>[-n]`, never an existing one.
fn new_backup_dir(root: &Path) -> Result<PathBuf, FsError> {
    let stamp = jiff::Timestamp::now()
        .strftime("%Y%m%dT%H%M%S%.3fZ")
        .to_string();
    fs::create_dir_all(root).map_err(|source| FsError::CreateDir {
        path: root.to_path_buf(),
        source,
    })?;
    for n in 0u32.. {
        let dir = if n == 0 {
            root.join(&stamp)
        } else {
            root.join(format!("{stamp}-{n}"))
        };
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(FsError::CreateDir { path: dir, source }),
        }
    }
    unreachable!("u32 suffixes exhausted")
}

/// The backup location of a file: its absolute path mirrored under the run's backup folder.
fn backup_path(dir: &Path, file: &Path) -> PathBuf {
    dir.join(file.strip_prefix("/").unwrap_or(file))
}

/// Applies a plan. Never panics on I/O; every failure is in the result.
#[must_use]
pub fn execute(plan: &Plan, config: &ExecConfig) -> ExecutionResult {
    let files: Vec<FileResult> = plan.files.iter().map(|f| result_for(plan, f)).collect();
    if !plan.can_apply() {
        return stop(
            files,
            format!(
                "plan cannot apply ({} unauthorized conflicts, {} errors); nothing was written",
                plan.unauthorized_conflicts(),
                plan.error_count()
            ),
            Vec::new(),
            "not written: the plan cannot apply",
        );
    }
    clean_debris(plan, &config.backup_root);
    let pending: Vec<usize> = (0..plan.files.len())
        .filter(|&i| plan.files[i].change != Change::Keep)
        .collect();
    // Canonical folders recomputed now (one per folder): a folder swapped since planning shows
    // as a changed pre-image. Staging and the last check before each rename share them.
    let folders = Folders::default();
    let files = match check_pre_images(plan, &pending, files, &folders) {
        Ok(files) => files,
        Err(result) => return result,
    };
    let (files, backup_dir) = match back_up(plan, &pending, files, config) {
        Ok(done) => done,
        Err(result) => return result,
    };
    PausePoint::reached(config.pause.as_ref(), "writing");
    let result = write_all(plan, &pending, files, backup_dir, &folders);
    if result.success && result.backup_dir.is_some() {
        prune_backups(&config.backup_root, config.keep_backups);
    }
    result
}

/// The run's result when writing file `i` failed: the first failure stops the run.
fn write_failed(
    mut files: Vec<FileResult>,
    i: usize,
    path: &Path,
    e: &FsError,
    backup_dir: Option<PathBuf>,
) -> ExecutionResult {
    files[i].outcome = Outcome::Failed;
    files[i].detail = Some(e.to_string());
    let applied = files
        .iter()
        .filter(|f| f.outcome == Outcome::Applied)
        .count();
    let error = if applied == 0 {
        format!("write failed: {e}; nothing was written")
    } else {
        format!(
            "write failed: {e}; {applied} file(s) were already written (partial sync: restore from the backups or fix the cause and sync again)"
        )
    };
    let detail = if applied == 0 {
        "not written: another file could not be written"
    } else {
        "not attempted: an earlier write failed"
    };
    let mut result = stop(files, error, vec![path.to_path_buf()], detail);
    result.backup_dir = backup_dir;
    result
}

/// Removes the temp files an earlier, killed sync left behind: in the folders of this plan's files
/// (only of agents that were read, so only folders we write) and anywhere under the backup root
/// (ours entirely). A failure is logged, never fatal: debris is harmless to readers.
fn clean_debris(plan: &Plan, backup_root: &Path) {
    let mut folders: std::collections::BTreeSet<PathBuf> = plan
        .files
        .iter()
        .filter(|f| f.pre_image.is_some())
        .filter_map(|f| f.path.parent().map(Path::to_path_buf))
        .collect();
    let mut pending = vec![backup_root.to_path_buf()];
    while let Some(folder) = pending.pop() {
        if let Ok(entries) = fs::read_dir(&folder) {
            pending.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        folders.insert(folder);
    }
    for folder in &folders {
        match fs_atomic::clean_debris(folder) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(folder = %folder.display(), count = removed.len(), "removed temp files left by an interrupted sync");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not remove a leftover temp file"),
        }
    }
}

/// After a removal, the folder the target format made for that one subagent (agy's
/// `agents/<name>/agent.md`) goes too, but only when it is empty: nothing else is ever deleted.
fn remove_subagent_folder(plan: &Plan, file: &FilePlan) {
    let Some(folder) = file.target.parent() else {
        return;
    };
    let named_for_it = file.operations.iter().any(|&op| {
        folder.file_name().and_then(|n| n.to_str()) == Some(plan.operations[op].name.as_str())
    });
    if named_for_it && let Err(e) = fs_atomic::remove_empty_folder(folder) {
        tracing::debug!(error = %e, "subagent folder kept");
    }
}

/// Removes all but the newest `keep` run folders under `root` (0 keeps all). Only folders named
/// like ours (`YYYYMMDDTHHMMSS...Z[-n]`) are touched; a failure is logged, never fatal: the sync
/// itself succeeded.
fn prune_backups(root: &Path, keep: usize) {
    if keep == 0 {
        return;
    }
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut runs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_str().is_some_and(is_backup_run_name))
        .map(|e| e.path())
        .collect();
    // The timestamp names sort chronologically.
    runs.sort();
    let excess = runs.len().saturating_sub(keep);
    for old in &runs[..excess] {
        if let Err(e) = fs_atomic::remove_tree(old) {
            tracing::warn!(error = %e, "could not prune an old backup folder");
        }
    }
}

/// `20261129T235959.123Z`, optionally followed by `-<n>`.
fn is_backup_run_name(name: &str) -> bool {
    let stamp = name.split_once('-').map_or(name, |(stamp, _)| stamp);
    stamp.len() == 20
        && stamp.as_bytes()[8] == b'T'
        && stamp.ends_with('Z')
        && stamp[..8].bytes().all(|b| b.is_ascii_digit())
}

/// Re-reads every file about to change; any difference from its pre-image fails the run.
fn check_pre_images(
    plan: &Plan,
    pending: &[usize],
    mut files: Vec<FileResult>,
    folders: &Folders,
) -> Result<Vec<FileResult>, ExecutionResult> {
    let stale: Vec<usize> = pending
        .iter()
        .copied()
        .filter(|&i| {
            let file = &plan.files[i];
            file.pre_image.as_ref() != Some(&read_facts_in(&file.target, folders))
        })
        .collect();
    if stale.is_empty() {
        return Ok(files);
    }
    for &i in &stale {
        files[i].outcome = Outcome::Failed;
        files[i].detail = Some("changed since planning".to_owned());
    }
    let paths: Vec<PathBuf> = stale.iter().map(|&i| plan.files[i].path.clone()).collect();
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    Err(stop(
        files,
        format!(
            "plan is stale: {} changed since planning; nothing was written (run sync again)",
            names.join(", ")
        ),
        paths,
        "not written: the plan is stale",
    ))
}

/// Copies every file about to be replaced or removed into this run's backup folder.
fn back_up(
    plan: &Plan,
    pending: &[usize],
    mut files: Vec<FileResult>,
    config: &ExecConfig,
) -> Result<(Vec<FileResult>, Option<PathBuf>), ExecutionResult> {
    let mut backup_dir: Option<PathBuf> = None;
    let mut batch = fs_atomic::Batch::default();
    let mut staged = Vec::new();
    for &i in pending {
        let file = &plan.files[i];
        if !matches!(
            file.pre_image.as_ref().map(|f| &f.state),
            Some(FileState::File(_))
        ) {
            continue;
        }
        let made = match &backup_dir {
            Some(dir) => Ok(dir.clone()),
            None => new_backup_dir(&config.backup_root),
        }
        .and_then(|dir| {
            let path = backup_path(&dir, &file.path);
            backup_dir = Some(dir);
            let id = batch.stage_new(&path, file.current())?;
            Ok((path, id))
        });
        match made {
            Ok((path, id)) => {
                files[i].backup = Some(path);
                staged.push((i, id));
            }
            Err(e) => {
                files[i].outcome = Outcome::Failed;
                files[i].detail = Some(format!("backup failed: {e}"));
                let mut result = stop(
                    files,
                    format!(
                        "cannot back up {}: {e}; nothing was written",
                        file.path.display()
                    ),
                    vec![file.path.clone()],
                    "not written: a backup failed",
                );
                result.backup_dir = backup_dir;
                return Err(result);
            }
        }
    }
    // The backups are durable before the first target is touched: their contents (every temp
    // file fsynced), then each one's rename (never over an existing file), then their folder.
    let installed = batch.sync_data().and_then(|()| {
        staged
            .iter()
            .try_for_each(|&(_, id)| batch.apply(id, &|| true))
    });
    if let Err(e) = installed.and_then(|()| batch.finish()) {
        let mut result = stop(
            files,
            format!("cannot sync the backups to disk: {e}; nothing was written"),
            Vec::new(),
            "not written: a backup failed",
        );
        result.backup_dir = backup_dir;
        return Err(result);
    }
    Ok((files, backup_dir))
}

/// Writes in path order; the first failure stops the run. Every new file's contents are
/// written and made durable first (all fsynced before the first rename), then the renames and
/// removals run in path order, each after its own last pre-image check.
fn write_all(
    plan: &Plan,
    pending: &[usize],
    mut files: Vec<FileResult>,
    backup_dir: Option<PathBuf>,
    folders: &Folders,
) -> ExecutionResult {
    let mut batch = fs_atomic::Batch::default();
    let mut staged = Vec::with_capacity(pending.len());
    let mut stale = Vec::new();
    let changed_during = "changed during the sync; not written (your edit is kept)";
    for &i in pending {
        let file = &plan.files[i];
        let id = match &file.change {
            Change::Write(bytes) => batch.stage_write_in(&file.target, bytes, folders),
            Change::Remove => Ok(batch.stage_remove(&file.target)),
            Change::Keep => continue,
        };
        match id {
            Ok(id) => staged.push((i, id)),
            // Its folder was swapped since the check: refused like an edit, nothing written there.
            Err(FsError::Changed { .. }) => {
                files[i].outcome = Outcome::Failed;
                files[i].detail = Some(changed_during.to_owned());
                stale.push(file.path.clone());
            }
            Err(e) => return write_failed(files, i, &plan.files[i].path, &e, backup_dir),
        }
    }
    if let Err(e) = batch.sync_data() {
        let result = stop(
            files,
            format!("cannot sync the new contents to disk: {e}; nothing was written"),
            Vec::new(),
            "not written: the new contents could not be synced",
        );
        return ExecutionResult {
            backup_dir,
            ..result
        };
    }
    for (i, id) in staged {
        let file = &plan.files[i];
        // Asked again right before this file's own rename: an edit made while the sync ran is
        // never overwritten (and the batch checks that its folder is still the one checked).
        let unchanged = || file.pre_image.as_ref() == Some(&read_facts_in(&file.target, folders));
        let written = batch.apply(id, &unchanged);
        if let Err(FsError::Changed { .. }) = written {
            files[i].outcome = Outcome::Failed;
            files[i].detail = Some(changed_during.to_owned());
            stale.push(file.path.clone());
            continue;
        }
        if let Err(e) = written {
            return write_failed(files, i, &file.path, &e, backup_dir);
        }
        files[i].outcome = Outcome::Applied;
        files[i].detail = None;
    }
    if let Err(e) = batch.finish() {
        // Every file is in place; only its durability across a crash is in doubt.
        let mut result = stop(
            files,
            format!("files were written but their folder could not be synced to disk: {e}"),
            Vec::new(),
            "",
        );
        result.backup_dir = backup_dir;
        return result;
    }
    // Only once the removals are durable: their folders' fsync needs the folders.
    for &i in pending {
        if plan.files[i].change == Change::Remove && files[i].outcome == Outcome::Applied {
            remove_subagent_folder(plan, &plan.files[i]);
        }
    }
    let error = (!stale.is_empty()).then(|| {
        let names: Vec<String> = stale.iter().map(|p| p.display().to_string()).collect();
        format!(
            "plan is stale: {} changed during the sync and kept its new contents; every other file was written (run sync again)",
            names.join(", ")
        )
    });
    let partial = error.is_some() && files.iter().any(|f| f.outcome == Outcome::Applied);
    ExecutionResult {
        success: error.is_none(),
        files,
        error,
        failed_files: stale,
        partial,
        backup_dir,
    }
}
