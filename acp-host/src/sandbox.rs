//! Containment's I/O edge: a run's sandbox standing (`protocol::sandbox`) made into what the
//! kernel enforces on the agent's whole process tree.
//!
//! Before anything is spawned, [`confine`] asks the kernel what it offers (the Landlock ABI,
//! seccomp), refuses a standing it cannot hold unless best effort was asked, and prepares
//! everything the start needs: a Landlock ruleset (its file descriptor), seccomp programs, and
//! the agent's own temporary folder. The forked process that starts the agent (the watchdog, or
//! a direct child) then calls `Raw::enter` before the agent's exec: `PR_SET_NO_NEW_PRIVS`,
//! `landlock_restrict_self`, the seccomp filters. The agent, everything it starts, and the
//! watchdog above it live in that domain; nothing can leave it (a Landlock domain is inherited
//! across fork and exec and only ever narrowed), so a `setsid` grandchild is confined too.
//!
//! What a standing becomes:
//! - files (`read-only`, `workspace-write`): every Landlock file right handled; reading granted
//!   on everything but the denied paths (the credential folders, acp-host's state and
//!   acp-child's session store, `--sandbox-deny`), which Landlock, an allow-list, expresses as
//!   the folders around them ([`protocol::sandbox::cover`]); writing granted on the agent's own
//!   temporary folder (its `TMPDIR`), the writable devices ([`DEVICES`]) and, in
//!   `workspace-write`, the writable roots (their `.git` bound read-only in a user and mount
//!   namespace of the agent's own; where the kernel gives no user namespace, the roots are
//!   granted around `.git` instead, and nothing new can then be made at a root's top level);
//!   acp-host's approvals stay readable
//!   (a delegating agent checks them), never writable; acp-child's session store takes new
//!   files, and only the sessions the run names (`--resume`, `--fork`) read;
//! - network (`off`, `tcp:PORT`): Landlock handles TCP bind and connect (connect granted on the
//!   ports of `tcp:`), seccomp refuses every other internet socket (UDP, raw) and `io_uring`
//!   (whose operations would bypass the socket filter);
//! - always, once active: signals and (with the network restricted) abstract Unix sockets are
//!   scoped to the domain, and new user namespaces are refused (seccomp).
//!
//! What it does not hold, said plainly (README "Sandbox"): a denied file reached by another
//! path (a hard link, a bind mount elsewhere) stays readable there; the names inside a denied
//! folder can be listed; UDP is refused as a whole under `off` and `tcp:` (the kernel cannot
//! limit it by port); anything the agent may read it may send wherever the network lets it; a
//! path Unix socket (a session bus, a Docker socket) can be connected to (Landlock refuses that
//! only from ABI 9, which this build does not ask for yet: it caps the ABI at 7, what it is
//! tested on).
//!
//! Invariants: everything is prepared in the host (the forked child allocates nothing); a path
//! that cannot be opened or listed is left out (fail closed: less access, never more); the
//! temporary folder lives as long as the [`Confinement`] (the caller keeps it past teardown); a
//! sandboxed agent's watchdog is forked from the host, never the spawner (its descriptors live
//! here).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr, OsString, c_char};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use protocol::env_vars;
use protocol::sandbox::{Entry, EntryKind, Kernel, Mode, Network, Report, SandboxError, Standing};

/// The devices an agent may open for writing in every mode: what programs write to or open
/// read-write as a matter of course.
pub const DEVICES: [&str; 6] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// Where a run's sandbox is applied: what [`confine`] reads besides the standing.
#[derive(Debug)]
pub struct Place<'a> {
    /// The agent's environment as it will be spawned: its `HOME`, `XDG_STATE_HOME`,
    /// `ACP_CHILD_STATE_DIR` and `TMPDIR` say where its state and temporary folders are.
    pub env: &'a BTreeMap<OsString, OsString>,
    /// The sessions the run opens (`--resume`, `--fork`): their files in acp-child's session
    /// store stay readable.
    pub sessions: Vec<&'a str>,
}

impl Place<'_> {
    /// A variable of the agent's environment, as a path.
    fn var(&self, name: &str) -> Option<PathBuf> {
        self.env.get(OsStr::new(name)).map(PathBuf::from)
    }
}

/// Why a sandbox could not be prepared: nothing was spawned.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error(transparent)]
    Refused(#[from] SandboxError),
    #[error("sandbox: writable root {} is not an accessible folder ({source}); create it or drop --sandbox-write", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sandbox: could not prepare the agent's temporary folder in {} ({source}); set TMPDIR to a writable folder", dir.display())]
    Temp {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sandbox: the kernel refused the Landlock ruleset ({0})")]
    Ruleset(String),
    #[error("sandbox: could not build the seccomp filter ({0})")]
    Filter(String),
}

/// A prepared sandbox: what the agent's start applies, and what the record reports.
pub struct Confinement {
    /// The Landlock ruleset (with `readonly`'s binds made: the writable roots whole).
    ruleset: Option<OwnedFd>,
    /// Where the binds cannot be made (no user namespaces here): the ruleset that keeps
    /// `readonly` out of the writable roots by itself.
    split: Option<OwnedFd>,
    /// Paths inside the writable roots bound read-only in the agent's own mount namespace
    /// (each root's `.git`), NUL-terminated.
    readonly: Vec<CString>,
    /// `/proc/self/uid_map` and `gid_map` of that namespace: the user as themself.
    maps: [Vec<u8>; 2],
    filters: Vec<Vec<seccompiler::sock_filter>>,
    /// The agent's own temporary folder; removed when the confinement is dropped.
    temp: Option<tempfile::TempDir>,
    report: Report,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl Confinement {
    /// What the run's record says of it.
    #[must_use]
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// The agent's temporary folder, to set as its `TMPDIR`.
    #[must_use]
    pub fn temp_dir(&self) -> Option<&Path> {
        self.temp.as_ref().map(tempfile::TempDir::path)
    }

    /// The form the forked child applies: raw descriptors and pointers into `self`, valid while
    /// `self` lives.
    pub(crate) fn raw(&self) -> Raw {
        let fd = |fd: &Option<OwnedFd>| fd.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        Raw {
            ruleset: fd(&self.ruleset),
            split: fd(&self.split),
            readonly: self.readonly.iter().map(|path| path.as_ptr()).collect(),
            maps: [
                (self.maps[0].as_ptr(), self.maps[0].len()),
                (self.maps[1].as_ptr(), self.maps[1].len()),
            ],
            programs: self
                .filters
                .iter()
                .map(|program| nix::libc::sock_fprog {
                    len: u16::try_from(program.len()).unwrap_or(u16::MAX),
                    filter: program.as_ptr().cast_mut().cast(),
                })
                .collect(),
        }
    }
}

/// A prepared sandbox as the forked child applies it: plain integers and pointers into the
/// [`Confinement`] it came from.
pub(crate) struct Raw {
    /// The Landlock rulesets' descriptors, or -1.
    ruleset: RawFd,
    split: RawFd,
    readonly: Vec<*const c_char>,
    maps: [(*const u8, usize); 2],
    programs: Vec<nix::libc::sock_fprog>,
}

impl Raw {
    /// Puts the calling process (and all it will start) into the sandbox: no new privileges,
    /// the read-only binds (in a user and mount namespace of its own, when there are any), the
    /// Landlock domain, the seccomp filters. Async-signal-safe: system calls on data prepared
    /// before the fork. Returns the errno of the step that failed.
    #[expect(
        unsafe_code,
        reason = "raw system calls in a forked child: prctl, landlock_restrict_self, seccomp"
    )]
    pub(crate) fn enter(&self) -> Result<(), i32> {
        use nix::libc;
        // SAFETY: system calls on integers and on `sock_fprog`s pointing into programs that
        // outlive this call; nothing allocates or locks.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(errno());
            }
            let mut ruleset = self.ruleset;
            if !self.readonly.is_empty() && !self.isolate()? {
                // No namespace to bind in: the ruleset that keeps them unwritable itself.
                ruleset = self.split;
            }
            if ruleset >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
                return Err(errno());
            }
            for fd in [self.ruleset, self.split] {
                if fd >= 0 {
                    libc::close(fd);
                }
            }
            for program in &self.programs {
                let set = libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &raw const *program,
                );
                if set != 0 {
                    return Err(errno());
                }
            }
        }
        Ok(())
    }

    /// A user and mount namespace of our own with `readonly` bound read-only in it: `Ok(false)`
    /// when the kernel gives no user namespace (nothing changed), an error when it gave one and
    /// a later step failed.
    #[expect(
        unsafe_code,
        reason = "raw system calls in a forked child: unshare, /proc writes, mount, statfs"
    )]
    fn isolate(&self) -> Result<bool, i32> {
        use nix::libc;
        // SAFETY: system calls on integers, on C strings and byte buffers owned by the
        // `Confinement` this came from, and on a stack `statfs`.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Ok(false);
            }
            let write = |path: &CStr, bytes: *const u8, len: usize| -> Result<(), i32> {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(errno());
                }
                let written = libc::write(fd, bytes.cast(), len);
                libc::close(fd);
                if usize::try_from(written) == Ok(len) {
                    Ok(())
                } else {
                    Err(errno())
                }
            };
            let deny = b"deny";
            write(c"/proc/self/setgroups", deny.as_ptr(), deny.len())?;
            write(c"/proc/self/uid_map", self.maps[0].0, self.maps[0].1)?;
            write(c"/proc/self/gid_map", self.maps[1].0, self.maps[1].1)?;
            let none = std::ptr::null::<c_char>();
            if libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(errno());
            }
            for &path in &self.readonly {
                if libc::mount(
                    path,
                    path,
                    none,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(errno());
                }
                // A remount in a user namespace must keep the flags the mount is locked with.
                // glibc's statvfs is statfs and its flags (no mount table read since Linux 2.6.36).
                let mut stat: libc::statvfs = std::mem::zeroed();
                if libc::statvfs(path, &raw mut stat) != 0 {
                    return Err(errno());
                }
                let flags = stat.f_flag;
                let mut kept = 0;
                for (st, ms) in [
                    (libc::ST_NOSUID, libc::MS_NOSUID),
                    (libc::ST_NODEV, libc::MS_NODEV),
                    (libc::ST_NOEXEC, libc::MS_NOEXEC),
                    (libc::ST_NOATIME, libc::MS_NOATIME),
                    (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
                    (libc::ST_RELATIME, libc::MS_RELATIME),
                ] {
                    if flags & st != 0 {
                        kept |= ms;
                    }
                }
                let remount = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept;
                if libc::mount(none, path, none, remount, std::ptr::null()) != 0 {
                    return Err(errno());
                }
            }
        }
        Ok(true)
    }
}

/// The calling thread's errno (no allocation).
fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(nix::libc::EPERM)
}

// SAFETY: the pointers point into the `Confinement` this came from, which outlives every use;
// nothing writes through them.
#[expect(unsafe_code, reason = "read-only pointers into an owned confinement")]
unsafe impl Send for Raw {}
// SAFETY: as for `Send`: shared access only reads.
#[expect(unsafe_code, reason = "read-only pointers into an owned confinement")]
unsafe impl Sync for Raw {}

/// What this kernel offers, asked once per process.
#[must_use]
pub fn kernel() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(probe)
}

fn probe() -> Kernel {
    // The kernel lists a `Seccomp:` line in a process's status exactly when it has seccomp.
    let seccomp = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("Seccomp:")));
    Kernel {
        landlock_abi: landlock_abi(),
        seccomp,
    }
}

/// The Landlock ABI version, `None` when the kernel has no Landlock (not built in, disabled at
/// boot, or refused by a filter above us). The landlock crate keeps its own probe private.
#[expect(
    unsafe_code,
    reason = "landlock_create_ruleset's version query: no pointer, no descriptor"
)]
fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
    // SAFETY: the version query reads no memory (a null attribute, size 0) and returns a number.
    let version = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(version).ok().filter(|version| *version > 0)
}

/// What a standing comes to on this kernel, before any agent is started (`None`: it restricts
/// nothing): its report without paths, or why it would be refused.
pub fn foresee(standing: &Standing) -> Result<Option<Report>, SandboxError> {
    if !standing.is_active() {
        return Ok(None);
    }
    let kernel = kernel();
    let (enforced, not_enforced) = protocol::sandbox::assess(standing, kernel)?;
    Ok(Some(Report {
        mode: standing.mode,
        network: standing.network.clone(),
        abi: kernel.landlock_abi,
        enforced,
        writable: Vec::new(),
        read_only: Vec::new(),
        denied: Vec::new(),
        not_enforced,
    }))
}

/// Prepares the sandbox of one agent, or refuses it: what the kernel cannot hold fails the run
/// unless `standing.best_effort` (`protocol::sandbox::assess`).
pub fn confine(standing: &Standing, place: &Place<'_>) -> Result<Confinement, ConfineError> {
    let kernel = kernel();
    let (enforced, not_enforced) = protocol::sandbox::assess(standing, kernel)?;
    let Places {
        host: host_state,
        store,
        denied,
    } = Places::of(place, standing);
    let temp = own_temp(place, standing)?;
    // What the record lists of files holds only where Landlock enforces it.
    let files = standing.mode != Mode::Off && kernel.landlock_abi.is_some();
    let readonly = if files {
        read_only_within(standing)
    } else {
        Vec::new()
    };
    let store = store.filter(|store| files && std::fs::create_dir_all(store).is_ok());
    let (ruleset, split) = match kernel.landlock_abi {
        Some(abi) => {
            let readable = if files {
                protocol::sandbox::cover(Path::new("/"), &denied, &mut list)
            } else {
                Vec::new()
            };
            let rules = Rules {
                abi: landlock::ABI::from(i32::try_from(abi.min(7)).unwrap_or(7)),
                standing,
                denied: &denied,
                readable: &readable,
                readonly: &readonly,
                temp: temp.as_ref().map(tempfile::TempDir::path),
                host_state: host_state.as_deref(),
                store: store.as_deref(),
                sessions: &place.sessions,
            };
            let split = if readonly.is_empty() {
                None
            } else {
                rules.build(true)?
            };
            (rules.build(false)?, split)
        }
        None => (None, None),
    };
    let filters = if kernel.seccomp && standing.is_active() {
        filters(standing).map_err(|err| ConfineError::Filter(err.to_string()))?
    } else {
        Vec::new()
    };
    let shown = |paths: &mut dyn Iterator<Item = &Path>| -> Vec<String> {
        paths.map(|path| path.display().to_string()).collect()
    };
    let mut writable = Vec::new();
    if files {
        writable = shown(&mut standing.writable.iter().map(PathBuf::as_path));
        writable.extend(shown(&mut temp.iter().map(tempfile::TempDir::path)));
        writable.extend(
            store
                .iter()
                .map(|store| format!("{} (new files)", store.display())),
        );
    }
    let report = Report {
        mode: standing.mode,
        network: standing.network.clone(),
        abi: kernel.landlock_abi,
        enforced,
        writable,
        read_only: shown(&mut readonly.iter().map(PathBuf::as_path)),
        denied: if files {
            shown(&mut denied.iter().map(PathBuf::as_path))
        } else {
            Vec::new()
        },
        not_enforced,
    };
    let readonly = if split.is_some() {
        readonly
            .iter()
            .filter_map(|path| CString::new(path.as_os_str().as_encoded_bytes()).ok())
            .collect()
    } else {
        Vec::new()
    };
    Ok(Confinement {
        ruleset,
        split,
        readonly,
        maps: id_maps(),
        filters,
        temp,
        report,
    })
}

/// The agent's own temporary folder (its `TMPDIR`), in the one it was given; none when files
/// are not restricted.
fn own_temp(
    place: &Place<'_>,
    standing: &Standing,
) -> Result<Option<tempfile::TempDir>, ConfineError> {
    if standing.mode == Mode::Off {
        return Ok(None);
    }
    let dir = place
        .var("TMPDIR")
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("acp-sandbox-")
        .tempdir_in(&dir)
        .map(Some)
        .map_err(|source| ConfineError::Temp { dir, source })
}

/// A user namespace's `uid_map` and `gid_map`: this user as themself, nobody else.
fn id_maps() -> [Vec<u8>; 2] {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    [
        format!("{uid} {uid} 1\n").into_bytes(),
        format!("{gid} {gid} 1\n").into_bytes(),
    ]
}

/// What stays read-only inside the writable roots: each one's `.git` unless asked (a worktree's
/// is a file).
fn read_only_within(standing: &Standing) -> Vec<PathBuf> {
    if standing.mode != Mode::WorkspaceWrite || standing.write_git {
        return Vec::new();
    }
    standing
        .writable
        .iter()
        .map(|root| root.join(".git"))
        .filter(|git| git.symlink_metadata().is_ok())
        .collect()
}

/// Where the agent's state and everybody's credentials are, as its environment says.
struct Places {
    /// acp-host's state (approvals, sync backups): denied, its approvals readable.
    host: Option<PathBuf>,
    /// acp-child's session store: denied, new files writable.
    store: Option<PathBuf>,
    /// Every denied path, with where each really is.
    denied: Vec<PathBuf>,
}

impl Places {
    fn of(place: &Place<'_>, standing: &Standing) -> Places {
        let home = place.var(env_vars::HOME).filter(|home| home.is_absolute());
        let xdg = place.var(env_vars::XDG_STATE_HOME);
        let state = env_vars::state_home(home.as_deref(), xdg.as_deref());
        let host_state = state.as_ref().map(|state| state.join("acp-host"));
        let store = place
            .var(env_vars::ACP_CHILD_STATE_DIR)
            .filter(|dir| dir.is_absolute())
            .or_else(|| state.map(|state| state.join(env_vars::ACP_CHILD_SESSIONS)));
        let mut denied: Vec<PathBuf> = home
            .as_deref()
            .map(protocol::sandbox::credential_paths)
            .unwrap_or_default();
        denied.extend(host_state.iter().cloned());
        denied.extend(store.iter().cloned());
        denied.extend(standing.deny.iter().cloned());
        Places {
            host: host_state,
            store,
            denied: canonical_too(denied),
        }
    }
}

/// Each path, and where it really is when that differs (a link's target is what the kernel
/// sees), without duplicates.
fn canonical_too(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    // Most denied paths share a few folders (the home, `.config`, the state folder) and most do
    // not exist: each folder is resolved once, and only a path that is itself a link is
    // resolved whole.
    let mut folders: std::collections::HashMap<PathBuf, PathBuf> = std::collections::HashMap::new();
    let mut all: Vec<PathBuf> = Vec::with_capacity(paths.len() * 2);
    for path in paths {
        let real = real_path(&path, &mut folders);
        for path in std::iter::once(path).chain(real) {
            if !all.contains(&path) {
                all.push(path);
            }
        }
    }
    all
}

/// Where `path` really is: its folder resolved (the nearest one that exists, the rest joined
/// as written), and the path itself when it is a link.
fn real_path(
    path: &Path,
    folders: &mut std::collections::HashMap<PathBuf, PathBuf>,
) -> Option<PathBuf> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Some(path.to_path_buf());
    };
    let folder = if let Some(folder) = folders.get(parent) {
        folder.clone()
    } else {
        let folder = std::fs::canonicalize(parent)
            .ok()
            .or_else(|| real_path(parent, folders))?;
        folders.insert(parent.to_path_buf(), folder.clone());
        folder
    };
    let joined = folder.join(name);
    if joined
        .symlink_metadata()
        .is_ok_and(|meta| meta.file_type().is_symlink())
    {
        return std::fs::canonicalize(&joined).ok().or(Some(joined));
    }
    Some(joined)
}

/// A folder's entries as [`protocol::sandbox::cover`] reads them; an unreadable folder has none
/// (nothing beneath it is granted).
fn list(dir: &Path) -> Vec<Entry> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let kind = entry.file_type().ok()?;
            let path = entry.path();
            let kind = if kind.is_symlink() {
                EntryKind::Link(std::fs::canonicalize(&path).ok())
            } else if kind.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::File
            };
            Some(Entry { path, kind })
        })
        .collect()
}

/// What the Landlock ruleset is built from.
struct Rules<'a> {
    abi: landlock::ABI,
    standing: &'a Standing,
    denied: &'a [PathBuf],
    /// What grants reading all but `denied` ([`protocol::sandbox::cover`] of `/`): walked once,
    /// though a start that may bind `.git` read-only builds two rulesets.
    readable: &'a [PathBuf],
    /// Inside the writable roots, kept read-only (each root's `.git`).
    readonly: &'a [PathBuf],
    temp: Option<&'a Path>,
    host_state: Option<&'a Path>,
    store: Option<&'a Path>,
    sessions: &'a [&'a str],
}

impl Rules<'_> {
    /// The ruleset's descriptor (`None` when nothing is handled). With `split`, the writable
    /// roots are granted around `readonly` (for a start that cannot bind it read-only); without,
    /// whole.
    fn build(&self, split: bool) -> Result<Option<OwnedFd>, ConfineError> {
        use landlock::{
            Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
        };
        let abi = self.abi;
        let refused = |err: landlock::RulesetError| ConfineError::Ruleset(err.to_string());
        let files = self.standing.mode != Mode::Off;
        let network = self.standing.network != Network::On && abi >= landlock::ABI::V4;
        let mut ruleset = Ruleset::default();
        if files {
            ruleset = ruleset
                .handle_access(AccessFs::from_all(abi))
                .map_err(refused)?;
        }
        if network {
            ruleset = ruleset
                .handle_access(AccessNet::from_all(abi))
                .map_err(refused)?;
        }
        if abi >= landlock::ABI::V6 {
            ruleset = ruleset.scope(Scope::Signal).map_err(refused)?;
            if self.standing.network != Network::On {
                ruleset = ruleset.scope(Scope::AbstractUnixSocket).map_err(refused)?;
            }
        }
        let mut created = ruleset.create().map_err(refused)?;
        if files {
            let read = AccessFs::from_read(abi);
            let all = AccessFs::from_all(abi);
            let mut grant = |path: &Path, access: landlock::BitFlags<AccessFs>| -> bool {
                let Ok(fd) = landlock::PathFd::new(path) else {
                    return false;
                };
                // A file takes only a file's rights: the crate narrows them itself (it looks at
                // the opened descriptor), in its default best-effort compatibility.
                created
                    .as_mut()
                    .add_rule(landlock::PathBeneath::new(fd, access))
                    .is_ok()
            };
            for path in self.readable {
                grant(path, read);
            }
            // Listing folders is granted everywhere: a folder that holds a denied path (`/`,
            // the home) must stay listable, and Landlock grants a folder's right to its whole
            // tree. So the names inside a denied folder can be listed; what they hold cannot
            // be read.
            grant(Path::new("/"), AccessFs::ReadDir.into());
            // Approvals stay readable (a delegating agent checks them), never writable.
            if let Some(state) = self.host_state {
                grant(&state.join("trust"), read);
            }
            if self.standing.mode == Mode::WorkspaceWrite {
                for root in &self.standing.writable {
                    std::fs::read_dir(root).map_err(|source| ConfineError::Root {
                        path: root.clone(),
                        source,
                    })?;
                    let mut excluded = self.denied.to_vec();
                    if split {
                        excluded.extend(self.readonly.iter().cloned());
                    }
                    for path in protocol::sandbox::cover(root, &excluded, &mut list) {
                        grant(&path, all);
                    }
                }
            }
            if let Some(temp) = self.temp {
                grant(temp, all);
            }
            for device in DEVICES {
                grant(Path::new(device), AccessFs::from_file(abi));
            }
            // acp-child's session store: new sessions may be written, only the run's own read.
            if let Some(store) = self.store {
                grant(store, AccessFs::MakeReg | AccessFs::WriteFile);
                for session in self.sessions {
                    let file = store.join(format!("{session}.jsonl"));
                    // acp-child's own rule for a session id: no separator can lead elsewhere.
                    let plain = session
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                    if plain && file.is_file() {
                        grant(&file, read | AccessFs::WriteFile);
                    }
                }
            }
        }
        if network && let Network::Tcp(ports) = &self.standing.network {
            for port in ports {
                created = created
                    .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                    .map_err(refused)?;
            }
        }
        Ok(created.into())
    }
}

/// The seccomp programs of a standing, in the order they are installed: refusals (EPERM,
/// EACCES), then `clone3` answered ENOSYS so that every new process goes through `clone`, whose
/// flags a filter can read.
fn filters(standing: &Standing) -> Result<Vec<Vec<seccompiler::sock_filter>>, seccompiler::Error> {
    use nix::libc;
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as When,
        SeccompFilter, SeccompRule as Rule,
    };
    let arch: seccompiler::TargetArch = std::env::consts::ARCH.try_into()?;
    // x86_64 also takes x32 system calls (their numbers with bit 30 set) under the same audit
    // architecture: each refusal names both.
    let numbers = |nr: libc::c_long| -> Vec<i64> {
        if cfg!(target_arch = "x86_64") {
            vec![nr, nr | 0x4000_0000]
        } else {
            vec![nr]
        }
    };
    let flag = |bit: libc::c_int| {
        let bit = u64::try_from(bit).unwrap_or(0);
        When::new(0, Len::Qword, Op::MaskedEq(bit), bit)
    };
    let mut refused: BTreeMap<i64, Vec<Rule>> = BTreeMap::new();
    for nr in numbers(libc::SYS_clone) {
        refused.insert(nr, vec![Rule::new(vec![flag(libc::CLONE_NEWUSER)?])?]);
    }
    for nr in numbers(libc::SYS_unshare) {
        refused.insert(nr, vec![Rule::new(vec![flag(libc::CLONE_NEWUSER)?])?]);
    }
    if standing.network != Network::On {
        // Internet sockets other than TCP streams, and every family but local, internet and
        // netlink (the resolver asks the kernel for interfaces over netlink).
        let domain = |op: Op, value: libc::c_int| {
            When::new(0, Len::Dword, op, u64::try_from(value).unwrap_or(0))
        };
        let mut socket = Vec::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            for kind in [
                libc::SOCK_DGRAM,
                libc::SOCK_RAW,
                libc::SOCK_RDM,
                libc::SOCK_SEQPACKET,
                libc::SOCK_DCCP,
                // SOCK_PACKET (obsolete, still accepted by the kernel).
                10,
            ] {
                socket.push(Rule::new(vec![
                    domain(Op::Eq, family)?,
                    When::new(
                        1,
                        Len::Dword,
                        Op::MaskedEq(0xf),
                        u64::try_from(kind).unwrap_or(0),
                    )?,
                ])?);
            }
        }
        socket.push(Rule::new(vec![
            domain(Op::Gt, libc::AF_UNIX)?,
            domain(Op::Lt, libc::AF_INET6)?,
            domain(Op::Ne, libc::AF_INET)?,
        ])?);
        socket.push(Rule::new(vec![
            domain(Op::Gt, libc::AF_INET6)?,
            domain(Op::Ne, libc::AF_NETLINK)?,
        ])?);
        for nr in numbers(libc::SYS_socket) {
            refused.insert(nr, socket.clone());
        }
        for nr in numbers(libc::SYS_io_uring_setup) {
            refused.insert(nr, Vec::new());
        }
    }
    let refusals = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(libc::EPERM).unwrap_or(1)),
        arch,
    )?;
    let clone3 = SeccompFilter::new(
        numbers(libc::SYS_clone3)
            .into_iter()
            .map(|nr| (nr, Vec::new()))
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(libc::ENOSYS).unwrap_or(38)),
        arch,
    )?;
    Ok(vec![refusals.try_into()?, clone3.try_into()?])
}
