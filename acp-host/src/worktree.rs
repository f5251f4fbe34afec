//! Isolation in a git worktree: the one place acp-host runs `git`.
//!
//! [`create`] makes a child's worktree before it starts (from the parent's `HEAD` or a named
//! base, under the repository's `.acp-host/worktrees/<name>/`, on branch `acp/<name>`, locked
//! with a reason naming this process), [`settle`] decides what becomes of it once the child's
//! whole process tree is gone (`protocol::worktree::dispose`), and [`list`], [`remove`] and
//! [`prune`] are `acp-host worktrees`. The rules live in `protocol::worktree`; this module only
//! asks git and the file system.
//!
//! Invariants:
//! - every git failure is an error carrying git's stderr ([`WorktreeError::Git`]);
//! - git runs with hooks off (`core.hooksPath=/dev/null`), no automatic gc or maintenance, no
//!   terminal prompt, and none of the caller's `GIT_DIR`-style variables: what acp-host does to a
//!   repository is the same whoever runs it and whatever hooks it has; `git status` takes no
//!   optional lock, so twenty runs starting at once do not fight over the parent's index;
//! - `.acp-host/` is added to `.git/info/exclude`, never to a tracked file;
//! - a name is claimed by creating its folder (one winner between racing runs), then the
//!   worktree is added into it; a taken name goes to the next candidate;
//! - what changes or reads the repository's list of worktrees (add, remove, unlock, list, prune)
//!   runs under one lock per repository (`.acp-host/lock`, `repo_lock`): git reads every
//!   worktree's entry while it adds one, and fails on an entry another `git worktree add` is
//!   still writing;
//! - nothing holding a change is removed: [`settle`] commits or keeps it, [`prune`] keeps an
//!   abandoned worktree with changes, [`remove`] refuses one without `force`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use protocol::status::Status;
use protocol::worktree::{
    self as rules, DiffStat, ListedWorktree, NameError, Outcome, Owner, Prune, State,
    WorktreeListing, WorktreeRecord,
};

use crate::fs_atomic::{self, FsError};

/// What a run asks of its worktree (`--worktree[=NAME]`, `--worktree-base`,
/// `--worktree-keep-dirty`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// Its name; `None` makes one from the prompt and the run id.
    pub name: Option<String>,
    /// The commit-ish it starts from; `None` is the parent's `HEAD`.
    pub base: Option<String>,
    /// Leave changes uncommitted (staged) instead of committing them on the branch.
    pub keep_dirty: bool,
}

/// Why a worktree could not be made or cleaned.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error("{cwd} is not inside a git repository (a worktree needs one): {stderr}")]
    NotARepository { cwd: PathBuf, stderr: String },
    #[error(
        "the repository at {top} has no commit yet (unborn HEAD): commit once before asking for a worktree"
    )]
    UnbornHead { top: PathBuf },
    #[error("--worktree-base {base}: not a commit in {top}: {stderr}")]
    BadBase {
        base: String,
        top: PathBuf,
        stderr: String,
    },
    #[error(
        "the repository at {top} has submodules (.gitmodules at {base}): worktrees of repositories with submodules are not supported; run without a worktree"
    )]
    Submodules { top: PathBuf, base: String },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(
        "no free worktree name from {name} ({name}-2 ... are taken too): pass another name, or clean up with acp-host worktrees prune"
    )]
    NoFreeName { name: String },
    #[error("git {args} failed in {dir}: {stderr}")]
    Git {
        args: String,
        dir: PathBuf,
        stderr: String,
    },
    #[error("the worktree task failed: {0}")]
    Task(String),
    #[error("cannot run git (is it installed and on PATH?): {0}")]
    NoGit(#[source] std::io::Error),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("no worktree {name} in {top} (acp-host worktrees list shows them)")]
    NotFound { name: String, top: PathBuf },
    #[error("worktree {name} is in use by a running acp-host (pid {pid}); let it end first")]
    Running { name: String, pid: String },
    #[error(
        "worktree {name} has uncommitted changes: commit them there, or pass --force to throw them away"
    )]
    Dirty { name: String },
}

/// One `git` call in `dir`.
fn git<I, S>(dir: &Path, args: I) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    git_with(dir, args, &[])
}

fn git_with<I, S>(dir: &Path, args: I, env: &[(&str, &str)]) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let output = command(dir, &args, env)
        .output()
        .map_err(WorktreeError::NoGit)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(WorktreeError::Git {
        args: args
            .iter()
            .map(|arg| arg.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        dir: dir.to_path_buf(),
        stderr: stderr_of(&output),
    })
}

/// Whether a `git` call succeeds (a question, such as "does this ref exist").
fn git_ok<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> Result<bool, WorktreeError> {
    let status = command(dir, args, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(WorktreeError::NoGit)?;
    Ok(status.success())
}

fn command<S: AsRef<OsStr>>(dir: &Path, args: &[S], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "commit.gpgSign=false",
        ])
        .args(args)
        .stdin(Stdio::null())
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("LC_ALL", "C");
    for name in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
        "GIT_CEILING_DIRECTORIES",
        "GIT_NAMESPACE",
    ] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn stderr_of(output: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if text.is_empty() {
        format!("(no message; {})", output.status)
    } else {
        text
    }
}

fn line(text: &str) -> String {
    text.trim_end_matches(['\n', '\r']).to_owned()
}

/// A repository as a worktree's start sees it.
#[derive(Debug, Clone)]
struct Repository {
    /// The top folder of the worktree the caller is in.
    toplevel: PathBuf,
    /// The top folder of the main worktree (where `.acp-host/worktrees/` lives).
    main: PathBuf,
}

fn repository(cwd: &Path) -> Result<Repository, WorktreeError> {
    let not_a_repository = |err| match err {
        WorktreeError::Git { stderr, .. } => WorktreeError::NotARepository {
            cwd: cwd.to_path_buf(),
            stderr,
        },
        other => other,
    };
    let toplevel = PathBuf::from(line(
        &git(cwd, ["rev-parse", "--show-toplevel"]).map_err(not_a_repository)?,
    ));
    let common = PathBuf::from(line(&git(
        &toplevel,
        ["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )?));
    let main = match (common.file_name(), common.parent()) {
        (Some(name), Some(parent)) if name == ".git" => parent.to_path_buf(),
        _ => toplevel.clone(),
    };
    Ok(Repository { toplevel, main })
}

/// Whether `cwd` looks inside a git repository: it or a folder above it holds a `.git` (a
/// folder, or the file a worktree or submodule has). Only file-system lookups, no `git` process:
/// cheap enough to ask at every turn (acp-child offers the `subagent` tool's `isolation` only
/// where it holds). A start still asks git itself ([`create`]), which says why when a `.git` is
/// not a repository after all.
#[must_use]
pub fn in_repository(cwd: &Path) -> bool {
    cwd.ancestors()
        .any(|folder| std::fs::symlink_metadata(folder.join(".git")).is_ok())
}

/// A worktree made for a run, until [`settle`] decides what becomes of it.
#[derive(Debug, Clone)]
pub struct Created {
    pub name: String,
    /// Its top folder.
    pub root: PathBuf,
    /// The child's working directory: the caller's, relative to its repository, inside `root`.
    pub cwd: PathBuf,
    pub branch: String,
    /// The commit it starts from.
    pub base: String,
    /// Whether the caller's tree had uncommitted changes.
    pub parent_dirty: bool,
    main: PathBuf,
}

/// Holds the repository's worktree lock (see the module's invariants) until dropped.
fn repo_lock(main: &Path) -> Result<fs_atomic::Lock, WorktreeError> {
    Ok(fs_atomic::Lock::acquire(
        &main.join(rules::WORKTREES_DIR).with_file_name("lock"),
    )?)
}

/// This process as a worktree's lock names it.
fn this_owner() -> Owner {
    let pid = std::process::id();
    Owner {
        pid,
        start: start_time(pid).unwrap_or(0),
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    rules::proc_start_time(&stat)
}

/// Whether the process a lock names still runs (the same process: its start time matches).
fn alive(owner: Owner) -> bool {
    start_time(owner.pid).is_some_and(|start| owner.start == 0 || start == owner.start)
}

/// Makes the worktree of a run started in `cwd` (absolute) with `prompt`, as `spec` asks.
pub fn create(
    cwd: &Path,
    spec: &Spec,
    prompt: &str,
    run_id: &str,
) -> Result<Created, WorktreeError> {
    let wanted = match &spec.name {
        Some(name) => {
            rules::validate_name(name)?;
            name.clone()
        }
        None => rules::default_name(prompt, run_id),
    };
    let repo = repository(cwd)?;
    let top = &repo.toplevel;
    let base_name = spec.base.as_deref().unwrap_or("HEAD");
    let base = git(
        top,
        [
            "rev-parse",
            "--verify",
            "--end-of-options",
            &format!("{base_name}^{{commit}}"),
        ],
    )
    .map(|out| line(&out))
    .map_err(|err| match (err, &spec.base) {
        (WorktreeError::Git { .. }, None) => WorktreeError::UnbornHead { top: top.clone() },
        (WorktreeError::Git { stderr, .. }, Some(base)) => WorktreeError::BadBase {
            base: base.clone(),
            top: top.clone(),
            stderr,
        },
        (other, _) => other,
    })?;
    if git_ok(top, &["cat-file", "-e", &format!("{base}:.gitmodules")])? {
        return Err(WorktreeError::Submodules {
            top: top.clone(),
            base,
        });
    }
    exclude(top)?;
    let parent_dirty = !git(
        top,
        ["status", "--porcelain", "-z", "--untracked-files=normal"],
    )?
    .is_empty();
    let folder = repo.main.join(rules::WORKTREES_DIR);
    fs_atomic::create_folder(&folder)?;
    let reason = rules::lock_reason(run_id, this_owner());
    let (name, root, branch) = {
        let _lock = repo_lock(&repo.main)?;
        claim(top, &repo.main, &wanted, &base, &reason)?
    };
    let created = Created {
        cwd: child_cwd(cwd, top, &root)?,
        name,
        root,
        branch,
        base,
        parent_dirty,
        main: repo.main.clone(),
    };
    // From here a failure removes what was made: the run does not start.
    let filled = include(top, &created.root).and_then(|()| {
        fs_atomic::create_folder(&created.cwd)?;
        Ok(())
    });
    if let Err(err) = filled {
        let _ = discard(&created.main, &created.root, &created.branch);
        return Err(err);
    }
    Ok(created)
}

/// Claims the first free name of `wanted`'s candidates and adds its worktree at `base`, locked
/// with `reason`: its name, folder and branch.
fn claim(
    top: &Path,
    main: &Path,
    wanted: &str,
    base: &str,
    reason: &str,
) -> Result<(String, PathBuf, String), WorktreeError> {
    for name in rules::candidates(wanted) {
        let branch = rules::branch(&name);
        if git_ok(
            top,
            &[
                "show-ref",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ],
        )? {
            continue;
        }
        let root = rules::folder(main, &name);
        if !fs_atomic::claim_folder(&root)? {
            continue;
        }
        let added = git(
            top,
            [
                OsStr::new("worktree"),
                OsStr::new("add"),
                OsStr::new("--quiet"),
                OsStr::new("--lock"),
                OsStr::new("--reason"),
                OsStr::new(reason),
                OsStr::new("-b"),
                OsStr::new(&branch),
                root.as_os_str(),
                OsStr::new(base),
            ],
        );
        match added {
            Ok(_) => {
                return Ok((name, root, branch));
            }
            // Another run made the branch between the question and the add: the next name.
            Err(WorktreeError::Git { ref stderr, .. }) if stderr.contains("already exists") => {
                fs_atomic::remove_empty_folder(&root)?;
            }
            Err(err) => {
                let _ = fs_atomic::remove_empty_folder(&root);
                return Err(err);
            }
        }
    }
    Err(WorktreeError::NoFreeName {
        name: wanted.to_owned(),
    })
}

/// The caller's `cwd` moved into the worktree at `root`.
fn child_cwd(cwd: &Path, toplevel: &Path, root: &Path) -> Result<PathBuf, WorktreeError> {
    let real = std::fs::canonicalize(cwd).map_err(|source| FsError::Inspect {
        path: cwd.to_path_buf(),
        source,
    })?;
    let relative = real.strip_prefix(toplevel).unwrap_or(Path::new(""));
    Ok(root.join(relative))
}

/// Adds `.acp-host/` to the repository's `info/exclude` (shared by all its worktrees).
fn exclude(top: &Path) -> Result<(), WorktreeError> {
    let path = PathBuf::from(line(&git(
        top,
        [
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            "info/exclude",
        ],
    )?));
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(FsError::Inspect { path, source }.into()),
    };
    if let Some(text) = rules::with_exclude(&existing) {
        fs_atomic::write_atomic(&path, text.as_bytes())?;
    }
    Ok(())
}

/// Copies the ignored files `.worktreeinclude` names from `top` into `root`.
fn include(top: &Path, root: &Path) -> Result<(), WorktreeError> {
    let patterns = top.join(rules::INCLUDE_FILE);
    if !patterns.is_file() {
        return Ok(());
    }
    let listed = git(
        top,
        [
            OsStr::new("ls-files"),
            OsStr::new("-z"),
            OsStr::new("--others"),
            OsStr::new("--ignored"),
            OsStr::new("--exclude-from"),
            patterns.as_os_str(),
        ],
    )?;
    let named: Vec<&str> = listed
        .split('\0')
        .filter(|path| !path.is_empty() && !path.starts_with(".acp-host/"))
        .collect();
    if named.is_empty() {
        return Ok(());
    }
    // Only what git ignores is copied: a file it tracks or would show is the checkout's.
    let ignored = check_ignore(top, &named)?;
    for path in ignored.split('\0').filter(|path| !path.is_empty()) {
        let from = top.join(path);
        if from.is_file() {
            fs_atomic::copy_file(&from, &root.join(path))?;
        }
    }
    Ok(())
}

fn check_ignore(top: &Path, paths: &[&str]) -> Result<String, WorktreeError> {
    use std::io::Write as _;
    let mut child = command(top, &["check-ignore", "-z", "--stdin"], &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(WorktreeError::NoGit)?;
    let input: Vec<u8> = paths
        .iter()
        .flat_map(|path| path.bytes().chain([0]))
        .collect();
    let mut stdin = child.stdin.take();
    // Written from a thread: git answers as it reads, and a long list would fill both pipes.
    let writer = std::thread::spawn(move || {
        if let Some(stdin) = stdin.as_mut() {
            let _ = stdin.write_all(&input);
        }
    });
    let output = child.wait_with_output().map_err(WorktreeError::NoGit)?;
    let _ = writer.join();
    // Exit 1 is "none of them is ignored".
    match output.status.code() {
        Some(0 | 1) => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        _ => Err(WorktreeError::Git {
            args: "check-ignore -z --stdin".into(),
            dir: top.to_path_buf(),
            stderr: stderr_of(&output),
        }),
    }
}

/// Removes a worktree and its branch (after unlocking it).
fn discard(main: &Path, root: &Path, branch: &str) -> Result<(), WorktreeError> {
    let _lock = repo_lock(main)?;
    discard_locked(main, root, branch)
}

/// [`discard`], the repository's lock held.
fn discard_locked(main: &Path, root: &Path, branch: &str) -> Result<(), WorktreeError> {
    let _ = git_ok(
        main,
        &[
            OsStr::new("worktree"),
            OsStr::new("unlock"),
            root.as_os_str(),
        ],
    );
    git(
        main,
        [
            OsStr::new("worktree"),
            OsStr::new("remove"),
            OsStr::new("--force"),
            root.as_os_str(),
        ],
    )?;
    git(main, ["branch", "-D", "--quiet", branch])?;
    Ok(())
}

/// Settles a run's worktree once its agent's whole tree is gone: stages everything, then removes
/// it (no change), commits on its branch, or keeps it uncommitted (`protocol::worktree::dispose`).
pub fn settle(
    created: &Created,
    status: Status,
    keep_dirty: bool,
    prompt: &str,
    run_id: &str,
) -> Result<WorktreeRecord, WorktreeError> {
    let root = &created.root;
    git(root, ["add", "--all"])?;
    let stat = rules::parse_numstat(&git(
        root,
        [
            "diff",
            "--cached",
            "--numstat",
            "--no-renames",
            created.base.as_str(),
        ],
    )?);
    let outcome = rules::dispose(stat.changed_files > 0, status, keep_dirty);
    let mut commit = None;
    match outcome {
        Outcome::Removed => discard(&created.main, root, &created.branch)?,
        Outcome::Committed => {
            let (name, email) = rules::COMMIT_IDENTITY;
            git_with(
                root,
                [
                    "commit",
                    "--quiet",
                    "--no-verify",
                    "-m",
                    &rules::commit_message(prompt, run_id),
                ],
                &[
                    ("GIT_AUTHOR_NAME", name),
                    ("GIT_AUTHOR_EMAIL", email),
                    ("GIT_COMMITTER_NAME", name),
                    ("GIT_COMMITTER_EMAIL", email),
                ],
            )?;
            commit = Some(line(&git(root, ["rev-parse", "HEAD"])?));
        }
        Outcome::Uncommitted | Outcome::Interrupted => {}
    }
    if outcome != Outcome::Removed {
        let _lock = repo_lock(&created.main)?;
        git(
            &created.main,
            [
                OsStr::new("worktree"),
                OsStr::new("unlock"),
                root.as_os_str(),
            ],
        )?;
    }
    Ok(WorktreeRecord {
        name: created.name.clone(),
        path: root.display().to_string(),
        branch: created.branch.clone(),
        base: created.base.clone(),
        commit,
        outcome,
        parent_dirty: created.parent_dirty,
        stat: if outcome == Outcome::Removed {
            DiffStat::default()
        } else {
            stat
        },
    })
}

/// One of our worktrees and its lock reason.
type Found = (ListedWorktree, Option<String>);

/// Our worktrees of the repository `cwd` is in, with what state each is in.
fn ours(cwd: &Path) -> Result<(PathBuf, Vec<Found>), WorktreeError> {
    let repo = repository(cwd)?;
    let listed = {
        // A repository no run used has nothing of ours, and gets no lock file from a listing.
        let _lock = if repo.main.join(rules::WORKTREES_DIR).is_dir() {
            Some(repo_lock(&repo.main)?)
        } else {
            None
        };
        git(&repo.main, ["worktree", "list", "--porcelain", "-z"])?
    };
    let mut found = Vec::new();
    for entry in rules::parse_worktree_list(&listed) {
        let Some(name) = rules::name_of(&repo.main, &entry.path) else {
            continue;
        };
        let state = rules::state(entry.locked.as_deref(), &alive);
        found.push((
            ListedWorktree {
                name,
                path: entry.path.display().to_string(),
                branch: entry
                    .branch
                    .as_deref()
                    .map(|full| full.trim_start_matches("refs/heads/").to_owned()),
                head: entry.head,
                state,
            },
            entry.locked,
        ));
    }
    Ok((repo.main, found))
}

/// `acp-host worktrees list`.
pub fn list(cwd: &Path) -> Result<WorktreeListing, WorktreeError> {
    let (main, found) = ours(cwd)?;
    Ok(WorktreeListing {
        repository: main.display().to_string(),
        worktrees: found.into_iter().map(|(listed, _)| listed).collect(),
    })
}

fn dirty(root: &Path) -> Result<bool, WorktreeError> {
    if !root.is_dir() {
        return Ok(false);
    }
    Ok(!git(
        root,
        ["status", "--porcelain", "-z", "--untracked-files=normal"],
    )?
    .is_empty())
}

/// `acp-host worktrees remove NAME`: the worktree and its branch (unless `keep_branch`); one a
/// live run holds is refused, one with uncommitted changes too unless `force`.
pub fn remove(
    cwd: &Path,
    name: &str,
    force: bool,
    keep_branch: bool,
) -> Result<ListedWorktree, WorktreeError> {
    rules::validate_name(name)?;
    let (main, found) = ours(cwd)?;
    let Some((listed, locked)) = found.into_iter().find(|(listed, _)| listed.name == name) else {
        return Err(WorktreeError::NotFound {
            name: name.into(),
            top: main,
        });
    };
    if listed.state == State::Running {
        let pid = locked
            .as_deref()
            .and_then(rules::parse_lock_reason)
            .map_or_else(|| "unknown".to_owned(), |owner| owner.pid.to_string());
        return Err(WorktreeError::Running {
            name: name.into(),
            pid,
        });
    }
    let root = PathBuf::from(&listed.path);
    if !force && dirty(&root)? {
        return Err(WorktreeError::Dirty { name: name.into() });
    }
    let _ = git_ok(
        &main,
        &[
            OsStr::new("worktree"),
            OsStr::new("unlock"),
            root.as_os_str(),
        ],
    );
    git(
        &main,
        [
            OsStr::new("worktree"),
            OsStr::new("remove"),
            OsStr::new("--force"),
            root.as_os_str(),
        ],
    )?;
    if let (false, Some(branch)) = (keep_branch, &listed.branch) {
        git(&main, ["branch", "-D", "--quiet", branch])?;
    }
    Ok(listed)
}

/// What `prune` did with one worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub worktree: ListedWorktree,
    pub action: Prune,
}

/// `acp-host worktrees prune`: the worktrees whose run's host is gone without settling them
/// (killed): removed with their branch when clean, unlocked and kept when they hold changes;
/// then git's own `worktree prune` (entries whose folder is gone).
pub fn prune(cwd: &Path) -> Result<Vec<Pruned>, WorktreeError> {
    let (main, found) = ours(cwd)?;
    let mut done = Vec::new();
    for (listed, _) in found {
        let root = PathBuf::from(&listed.path);
        let action = rules::prune(listed.state, dirty(&root)?);
        match action {
            Prune::Leave => continue,
            Prune::Remove => {
                let branch = listed
                    .branch
                    .clone()
                    .unwrap_or_else(|| rules::branch(&listed.name));
                discard(&main, &root, &branch)?;
            }
            Prune::KeepChanges => {
                let _lock = repo_lock(&main)?;
                git(
                    &main,
                    [
                        OsStr::new("worktree"),
                        OsStr::new("unlock"),
                        root.as_os_str(),
                    ],
                )?;
            }
        }
        done.push(Pruned {
            worktree: listed,
            action,
        });
    }
    let _lock = repo_lock(&main)?;
    git(&main, ["worktree", "prune"])?;
    Ok(done)
}
