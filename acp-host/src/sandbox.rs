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
//! - files (`read-only`, `workspace-write`): every Landlock file right handled. Reading is
//!   granted on everything but the denied paths (the credential folders, acp-host's state and
//!   acp-child's session store, `--sandbox-deny`), in one of two ways. Where this process may
//!   give the agent a user and mount namespace of its own ([`namespaces`]), the denied paths are
//!   masked there (`mount`: acp-host's approvals bound back read-only, the session store
//!   replaced by the run's own folder of it, `store`) and reading is granted on `/` whole;
//!   otherwise Landlock, an allow-list, keeps them out by itself, granted as the folders around
//!   them ([`protocol::sandbox::cover`], "the walk"). Writing is granted on the agent's own
//!   temporary folder (its `TMPDIR`), the writable devices ([`DEVICES`]), acp-child's new
//!   sessions and, in `workspace-write`, the writable roots (their `.git` bound read-only in the
//!   namespace; by the walk, the roots are granted around `.git` instead, and nothing new can
//!   then be made at a root's top level);
//! - network (`off`, `tcp:PORT`): Landlock handles TCP bind and connect (connect granted on the
//!   ports of `tcp:`), seccomp refuses every other internet socket (UDP, raw) and `io_uring`
//!   (whose operations would bypass the socket filter);
//! - always, once active: signals and (with the network restricted) abstract Unix sockets are
//!   scoped to the domain, and new user namespaces and the parts of the new mount API Landlock
//!   does not refuse itself are refused (seccomp).
//!
//! What it does not hold, said plainly (docs/sandbox.md): a denied file reached by another
//! path (a hard link, a bind mount elsewhere) stays readable there; by the walk, the names
//! inside a denied folder can be listed; masks cover only what exists when the agent starts;
//! UDP is refused as a whole under `off` and `tcp:` (the kernel cannot
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
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use protocol::env_vars;
use protocol::sandbox::{Entry, EntryKind, Kernel, Mode, Network, Report, SandboxError, Standing};

mod mount;
mod store;

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
    /// The Landlock ruleset.
    ruleset: Option<OwnedFd>,
    /// The agent's own namespaces and what they hide (`None`: the ruleset keeps the denied
    /// paths out by itself, the walk).
    namespace: Option<mount::Plan>,
    filters: Vec<Vec<seccompiler::sock_filter>>,
    /// The agent's own temporary folder.
    temp: Option<Temp>,
    /// The run's own folder of acp-child's session store (with namespaces); settled when the
    /// confinement is dropped.
    _store: Option<store::RunStore>,
    report: Report,
}

/// The agent's own temporary folder (its `TMPDIR`).
enum Temp {
    /// A folder made for it on disk, removed when the confinement is dropped.
    Disk(tempfile::TempDir),
    /// A tmpfs of its own namespace, mounted inside acp-host's masked state (`<state>/tmp`):
    /// nothing on disk, gone with the agent's last process.
    Namespace(PathBuf),
}

impl Temp {
    fn path(&self) -> &Path {
        match self {
            Temp::Disk(dir) => dir.path(),
            Temp::Namespace(path) => path,
        }
    }
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
        self.temp.as_ref().map(Temp::path)
    }

    /// The form the forked child applies: raw descriptors and pointers into `self`, valid while
    /// `self` lives.
    pub(crate) fn raw(&self) -> Raw {
        let ruleset = self.ruleset.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        Raw {
            ruleset,
            namespace: self.namespace.as_ref().map(|plan| plan.raw(ruleset)),
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
    /// The Landlock ruleset's descriptor, or -1.
    ruleset: RawFd,
    namespace: Option<mount::RawPlan>,
    programs: Vec<nix::libc::sock_fprog>,
}

impl Raw {
    /// Puts the calling process (and all it will start) into the sandbox: no new privileges,
    /// its own namespaces with what they hide (when it has them), the Landlock domain, the
    /// seccomp filters. Async-signal-safe: system calls on data prepared before the fork.
    /// Returns the errno of the step that failed.
    #[expect(
        unsafe_code,
        reason = "raw system calls in a forked child: prctl, landlock_restrict_self, seccomp"
    )]
    pub(crate) fn enter(&self) -> Result<(), i32> {
        use nix::libc;
        if let Some(plan) = &self.namespace {
            plan.make()?;
        }
        // SAFETY: system calls on integers and on `sock_fprog`s pointing into programs that
        // outlive this call; nothing allocates or locks.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(errno());
            }
            if self.ruleset >= 0 {
                if libc::syscall(libc::SYS_landlock_restrict_self, self.ruleset, 0) != 0 {
                    return Err(errno());
                }
                libc::close(self.ruleset);
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
    Kernel {
        landlock_abi: landlock_abi(),
        seccomp: seccomp_mode().is_some(),
    }
}

/// This process's seccomp mode (0: no filter above it, 2: filtered), `None` when the kernel has
/// no seccomp.
#[expect(unsafe_code, reason = "prctl PR_GET_SECCOMP: an integer query")]
fn seccomp_mode() -> Option<i32> {
    // SAFETY: the query takes and returns integers.
    let mode = unsafe { nix::libc::prctl(nix::libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    (mode >= 0).then_some(mode)
}

/// Whether agents get user and mount namespaces of their own, where the denied paths are
/// masked and Landlock grants reading `/` whole (`mount`); otherwise the ruleset keeps them
/// out by itself (the walk, [`protocol::sandbox::cover`]). Decided once per process, from what
/// refuses an unprivileged user namespace before it is asked for (a seccomp filter above us, a
/// container's or our own sandbox's; `user.max_user_namespaces` 0; Debian's
/// `kernel.unprivileged_userns_clone` 0; Ubuntu's `kernel.apparmor_restrict_unprivileged_userns`
/// 1), or from `ACP_HOST_SANDBOX_NAMESPACES` (`0` or `1`). Where none of these says no and the
/// kernel refuses anyway, the start fails and says to set the variable to `0`.
#[must_use]
pub fn namespaces() -> bool {
    static NAMESPACES: OnceLock<bool> = OnceLock::new();
    *NAMESPACES.get_or_init(|| {
        match std::env::var_os(env_vars::ACP_HOST_SANDBOX_NAMESPACES) {
            Some(value) if value == "0" => return false,
            Some(value) if value == "1" => return true,
            _ => {}
        }
        let sysctl = |name: &str| {
            std::fs::read_to_string(Path::new("/proc/sys").join(name))
                .ok()
                .map(|value| value.trim().to_owned())
        };
        seccomp_mode() == Some(0)
            && sysctl("user/max_user_namespaces").is_some_and(|max| max != "0")
            && sysctl("kernel/unprivileged_userns_clone").is_none_or(|on| on != "0")
            && sysctl("kernel/apparmor_restrict_unprivileged_userns").is_none_or(|on| on != "1")
    })
}

/// Whether this kernel runs x32 system calls (`x86_64` only): where it does not, the seccomp
/// filter need not name their numbers. Asked only with no filter above us (one might kill a
/// process for trying).
#[expect(unsafe_code, reason = "an x32 getpid: no arguments, no memory")]
fn x32() -> bool {
    static X32: OnceLock<bool> = OnceLock::new();
    *X32.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") || seccomp_mode() != Some(0) {
            return cfg!(target_arch = "x86_64");
        }
        // SAFETY: getpid takes no argument; an x32 number the kernel does not run is ENOSYS.
        unsafe { nix::libc::syscall(nix::libc::SYS_getpid | 0x4000_0000) >= 0 }
    })
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
    // What the record lists of files holds only where Landlock enforces it.
    let files = standing.mode != Mode::Off && kernel.landlock_abi.is_some();
    let masked = files && namespaces();
    // A mask follows links itself (the kernel resolves a mount point); the walk needs to know
    // where each denied path really is.
    let places = Places::of(place, standing, !masked);
    // With namespaces, the agent's temporary folder is a tmpfs there, inside acp-host's masked
    // state (which must exist to be masked: acp-host's own folder, made once).
    let temp = match places.host.as_deref() {
        Some(state) if masked && std::fs::create_dir_all(state).is_ok() => {
            Some(Temp::Namespace(state.join("tmp")))
        }
        _ => own_temp(place, standing)?.map(Temp::Disk),
    };
    let readonly = if files {
        read_only_within(standing)
    } else {
        Vec::new()
    };
    let store_dir = places
        .store
        .clone()
        .filter(|store| files && std::fs::create_dir_all(store).is_ok());
    // With namespaces, the run's own folder of the store; where it cannot be made, the store
    // is masked whole (nothing of it read, nothing written).
    let run_store = store_dir
        .as_deref()
        .filter(|_| masked)
        .and_then(|store| store::RunStore::open(store, &place.sessions).ok());
    let ruleset = match kernel.landlock_abi {
        Some(abi) => Rules {
            abi: landlock_abi_of(abi),
            standing,
            masked,
            denied: &places.denied,
            readonly: &readonly,
            // A tmpfs of the namespace is granted there, by the child that mounts it.
            temp: match &temp {
                Some(Temp::Disk(dir)) => Some(dir.path()),
                _ => None,
            },
            host_state: places.host.as_deref(),
            store: match &run_store {
                Some(run) => Some(run.dir()),
                None if masked => None,
                None => store_dir.as_deref(),
            },
            sessions: &place.sessions,
        }
        .build()?,
        None => None,
    };
    let filters = if kernel.seccomp && standing.is_active() {
        filters(standing, x32()).map_err(|err| ConfineError::Filter(err.to_string()))?
    } else {
        Vec::new()
    };
    let namespace = masked.then(|| {
        let temp = match &temp {
            Some(Temp::Namespace(path)) => Some((path.as_path(), all_files(kernel).bits())),
            _ => None,
        };
        plan(&places, &readonly, run_store.as_ref(), temp)
    });
    let shown = |paths: &mut dyn Iterator<Item = &Path>| -> Vec<String> {
        paths.map(|path| path.display().to_string()).collect()
    };
    let mut writable = Vec::new();
    if files {
        writable = shown(&mut standing.writable.iter().map(PathBuf::as_path));
        writable.extend(shown(&mut temp.iter().map(Temp::path)));
        if !masked || run_store.is_some() {
            writable.extend(
                store_dir
                    .iter()
                    .map(|store| format!("{} (new files)", store.display())),
            );
        }
    }
    let report = Report {
        mode: standing.mode,
        network: standing.network.clone(),
        abi: kernel.landlock_abi,
        enforced,
        writable,
        read_only: shown(&mut readonly.iter().map(PathBuf::as_path)),
        denied: if files {
            shown(&mut places.denied.iter().map(PathBuf::as_path))
        } else {
            Vec::new()
        },
        not_enforced,
    };
    Ok(Confinement {
        ruleset,
        namespace,
        filters,
        temp,
        _store: run_store,
        report,
    })
}

/// The Landlock ABI this build asks for on a kernel of `abi`: at most 7, what it is tested on.
fn landlock_abi_of(abi: u32) -> landlock::ABI {
    landlock::ABI::from(i32::try_from(abi.min(7)).unwrap_or(7))
}

/// Every file right of the Landlock ABI this build asks for on `kernel`.
fn all_files(kernel: Kernel) -> landlock::BitFlags<landlock::AccessFs> {
    <landlock::AccessFs as landlock::Access>::from_all(landlock_abi_of(
        kernel.landlock_abi.unwrap_or(1),
    ))
}

/// What the agent's namespaces are made of: each denied path masked (acp-host's state but its
/// approvals; acp-child's store replaced by the run's own folder of it, or masked whole), each
/// writable root's `.git` bound read-only.
fn plan(
    places: &Places,
    readonly: &[PathBuf],
    run_store: Option<&store::RunStore>,
    temp: Option<(&Path, u64)>,
) -> mount::Plan {
    let c = |path: &Path| CString::new(path.as_os_str().as_encoded_bytes()).ok();
    let same = |one: Option<&PathBuf>, two: &PathBuf| {
        one.is_some_and(|one| one.as_os_str() == two.as_os_str())
    };
    let special = |path: &PathBuf| {
        same(places.host.as_ref(), path)
            || (run_store.is_some() && same(places.store.as_ref(), path))
    };
    mount::Plan {
        readonly: readonly.iter().filter_map(|path| c(path)).collect(),
        masks: places
            .denied
            .iter()
            .filter(|path| !special(path))
            .filter_map(|path| c(path))
            .collect(),
        state: places
            .host
            .as_deref()
            .and_then(|state| Some((c(state)?, c(&state.join("trust"))?))),
        temp: temp.and_then(|(path, access)| Some((c(path)?, access))),
        store: run_store
            .zip(places.store.as_deref())
            .and_then(|(run, store)| Some((c(run.dir())?, c(store)?))),
        maps: id_maps(),
    }
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
    /// Where they are as the environment says; with `resolve`, where each really is too.
    fn of(place: &Place<'_>, standing: &Standing, resolve: bool) -> Places {
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
        let denied = if resolve {
            canonical_too(denied)
        } else {
            // Compared as bytes (each is a home, a state folder or a flag's path joined with
            // plain names), not component by component.
            let mut seen = std::collections::HashSet::with_capacity(denied.len());
            denied.retain(|path| seen.insert(path.as_os_str().to_owned()));
            denied
        };
        Places {
            host: host_state,
            store,
            denied,
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

/// The name of session `id`'s file in acp-child's store, when `id` keeps acp-child's own rule
/// for a session id (letters, digits, `-`, `_`: no separator can lead elsewhere).
fn session_file(id: &str) -> Option<String> {
    let plain = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plain.then(|| format!("{id}.jsonl"))
}

/// What the Landlock ruleset is built from.
struct Rules<'a> {
    abi: landlock::ABI,
    standing: &'a Standing,
    /// Whether the denied paths are masked in the agent's namespaces (reading is then granted
    /// on `/` whole, the writable roots whole); otherwise the ruleset keeps them out itself.
    masked: bool,
    denied: &'a [PathBuf],
    /// Inside the writable roots, kept read-only (each root's `.git`): bound read-only when
    /// masked, granted around otherwise.
    readonly: &'a [PathBuf],
    temp: Option<&'a Path>,
    host_state: Option<&'a Path>,
    /// Where acp-child's new sessions are written (the run's own folder, when masked).
    store: Option<&'a Path>,
    sessions: &'a [&'a str],
}

impl Rules<'_> {
    /// The ruleset's descriptor (`None` when nothing is handled).
    fn build(&self) -> Result<Option<OwnedFd>, ConfineError> {
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
            self.grant_files(created.as_mut())?;
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

    /// The file rules: reading, the writable roots, the temporary folder, the devices, the
    /// session store.
    fn grant_files(&self, ruleset: &mut landlock::RulesetCreated) -> Result<(), ConfineError> {
        use landlock::{Access, AccessFs, RulesetCreatedAttr};
        let abi = self.abi;
        let read = AccessFs::from_read(abi);
        let all = AccessFs::from_all(abi);
        let mut grant = |path: &Path, access: landlock::BitFlags<AccessFs>| -> bool {
            let Ok(fd) = landlock::PathFd::new(path) else {
                return false;
            };
            // A file takes only a file's rights: the crate narrows them itself (it looks at
            // the opened descriptor), in its default best-effort compatibility.
            ruleset
                .add_rule(landlock::PathBeneath::new(fd, access))
                .is_ok()
        };
        if self.masked {
            grant(Path::new("/"), read);
        } else {
            for path in protocol::sandbox::cover(Path::new("/"), self.denied, &mut list) {
                grant(&path, read);
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
        }
        if self.standing.mode == Mode::WorkspaceWrite {
            for root in &self.standing.writable {
                std::fs::read_dir(root).map_err(|source| ConfineError::Root {
                    path: root.clone(),
                    source,
                })?;
                if self.masked {
                    grant(root, all);
                    continue;
                }
                let mut excluded = self.denied.to_vec();
                excluded.extend(self.readonly.iter().cloned());
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
            for name in self.sessions.iter().filter_map(|id| session_file(id)) {
                let file = store.join(name);
                if file.is_file() {
                    grant(&file, read | AccessFs::WriteFile);
                }
            }
        }
        Ok(())
    }
}

/// The seccomp programs of a standing, in the order they are installed: refusals (EPERM), then
/// `clone3` answered ENOSYS so that every new process goes through `clone`, whose flags a filter
/// can read. With `x32`, each refusal names the x32 number too.
fn filters(
    standing: &Standing,
    x32: bool,
) -> Result<Vec<Vec<seccompiler::sock_filter>>, seccompiler::Error> {
    use nix::libc;
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as When,
        SeccompFilter, SeccompRule as Rule,
    };
    /// `open_tree_attr` (Linux 6.15, one number on every architecture): not in libc yet.
    const SYS_OPEN_TREE_ATTR: libc::c_long = 467;
    let arch: seccompiler::TargetArch = std::env::consts::ARCH.try_into()?;
    // x86_64 may also take x32 system calls (their numbers with bit 30 set) under the same
    // audit architecture.
    let numbers = |nr: libc::c_long| -> Vec<i64> {
        if x32 {
            vec![nr, nr | 0x4000_0000]
        } else {
            vec![nr]
        }
    };
    // Clone flags are an int's worth: the low half of the argument is what the kernel reads.
    let flag = |bit: libc::c_int| {
        let bit = u64::try_from(bit).unwrap_or(0);
        When::new(0, Len::Dword, Op::MaskedEq(bit), bit)
    };
    let mut refused: BTreeMap<i64, Vec<Rule>> = BTreeMap::new();
    for nr in numbers(libc::SYS_clone)
        .into_iter()
        .chain(numbers(libc::SYS_unshare))
    {
        refused.insert(nr, vec![Rule::new(vec![flag(libc::CLONE_NEWUSER)?])?]);
    }
    // What of the new mount API Landlock does not refuse itself: `open_tree` would copy a
    // mount without the masks above it (see `mount`), `mount_setattr` would make a read-only
    // bind writable, `fspick` would reconfigure a mounted filesystem. (`move_mount`, `mount`,
    // `umount` and `pivot_root` Landlock refuses; a filesystem made with `fsopen` and
    // `fsmount` can only be attached with `move_mount`.) Each number listed costs every later
    // system call nothing, but the filter's install a few microseconds (the kernel runs it once
    // for every system call number to cache what it always allows).
    for nr in [
        libc::SYS_open_tree,
        SYS_OPEN_TREE_ATTR,
        libc::SYS_mount_setattr,
        libc::SYS_fspick,
    ]
    .into_iter()
    .flat_map(numbers)
    {
        refused.insert(nr, Vec::new());
    }
    if standing.network != Network::On {
        for nr in numbers(libc::SYS_socket) {
            refused.insert(nr, socket_rules()?);
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

/// The sockets refused with the network restricted: internet sockets other than TCP streams,
/// and every family but local, internet and netlink (the resolver asks the kernel for
/// interfaces over netlink).
fn socket_rules() -> Result<Vec<seccompiler::SeccompRule>, seccompiler::Error> {
    use nix::libc;
    use seccompiler::{
        SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as When, SeccompRule as Rule,
    };
    let domain = |op: Op, value: libc::c_int| {
        When::new(0, Len::Dword, op, u64::try_from(value).unwrap_or(0))
    };
    // A socket's type is its low four bits (the rest are SOCK_NONBLOCK and SOCK_CLOEXEC); every
    // type but a stream (1) is one of 2-3, 4-7 or 8-15 (datagram, raw, reliable datagram,
    // sequenced packet, DCCP, the obsolete SOCK_PACKET), three masked comparisons.
    let kinds = [(0xe, 2), (0xc, 4), (0x8, 8)];
    let mut socket = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        for (mask, value) in kinds {
            socket.push(Rule::new(vec![
                domain(Op::Eq, family)?,
                When::new(1, Len::Dword, Op::MaskedEq(mask), value)?,
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
    Ok(socket)
}
