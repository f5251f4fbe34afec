//! The agent's own user and mount namespaces: where what it may not read is hidden, and what it
//! may not write is bound read-only, before Landlock is entered.
//!
//! In them, the forked child (the watchdog, a direct child, or a command's child) masks each
//! denied path (an empty read-only tmpfs over a folder, `/dev/null` over a file), so that
//! Landlock can grant reading on `/` whole: one rule, where keeping the denied paths out by
//! Landlock alone takes a rule for every entry of every folder that holds one (the walk, still
//! used where the kernel gives no user namespace). acp-host's state is masked with its approvals
//! (`trust`) bound back read-only; acp-child's session store is replaced by the run's own folder
//! of it ([`super::store`]); each writable root's `.git` is bound read-only.
//!
//! Why the masks hold: once the agent is in its Landlock domain it can neither mount nor unmount
//! (Landlock refuses every change of the mount topology to a process whose files it restricts),
//! and the seccomp filter refuses the new mount API (`open_tree` would clone a mount without the
//! masks above it) and new user namespaces. A mount point cannot be renamed or removed. What
//! masking does not cover, said in docs/sandbox.md: a denied path that does not exist when the agent
//! starts is not masked (one made while it runs is readable to it), and a file descriptor opened
//! before the masks (none is passed to the agent but its three pipes) would see beneath them.
//!
//! Invariants: every call is a raw system call on data the host prepared (C strings and byte
//! buffers owned by the `Confinement`), so it is async-signal-safe in a child forked from a
//! multi-threaded process; a path that does not exist (or that the agent could not reach either)
//! is passed over, any other failure fails the start (fail closed).

use std::ffi::{CStr, CString, c_char};
use std::os::fd::RawFd;

use nix::libc;

/// `open_tree`'s flags and `move_mount`'s (linux/mount.h; the libc crate has them only for
/// Android).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// What the forked child makes of the namespaces, prepared in the host.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Inside the writable roots, bound read-only (each root's `.git`).
    pub(super) readonly: Vec<CString>,
    /// The denied paths, masked.
    pub(super) masks: Vec<CString>,
    /// acp-host's state and its approvals inside it: the state masked, the approvals bound back
    /// read-only.
    pub(super) state: Option<(CString, CString)>,
    /// The agent's temporary folder inside the masked state, a tmpfs of its own, and the
    /// Landlock rights granted on it (added to the ruleset here: it exists only in the
    /// namespace).
    pub(super) temp: Option<(CString, u64)>,
    /// The run's own folder of acp-child's session store, and the store it is bound over.
    pub(super) store: Option<(CString, CString)>,
    /// `uid_map` and `gid_map` of the user namespace: the user as themself, nobody else.
    pub(super) maps: [Vec<u8>; 2],
}

impl Plan {
    /// The form the forked child applies: pointers into `self`, valid while `self` lives; rules
    /// made in the namespace go into `ruleset`.
    pub(super) fn raw(&self, ruleset: RawFd) -> RawPlan {
        let pair = |pair: &Option<(CString, CString)>| {
            pair.as_ref().map(|(one, two)| (one.as_ptr(), two.as_ptr()))
        };
        RawPlan {
            readonly: self.readonly.iter().map(|path| path.as_ptr()).collect(),
            masks: self.masks.iter().map(|path| path.as_ptr()).collect(),
            state: pair(&self.state),
            temp: self
                .temp
                .as_ref()
                .map(|(path, access)| (path.as_ptr(), *access)),
            ruleset,
            store: pair(&self.store),
            maps: [
                (self.maps[0].as_ptr(), self.maps[0].len()),
                (self.maps[1].as_ptr(), self.maps[1].len()),
            ],
        }
    }
}

/// A [`Plan`] as the forked child reads it.
pub(super) struct RawPlan {
    readonly: Vec<*const c_char>,
    masks: Vec<*const c_char>,
    state: Option<(*const c_char, *const c_char)>,
    temp: Option<(*const c_char, u64)>,
    ruleset: RawFd,
    store: Option<(*const c_char, *const c_char)>,
    maps: [(*const u8, usize); 2],
}

impl RawPlan {
    /// Makes the namespaces and everything in them; the errno of the step that failed.
    pub(super) fn make(&self) -> Result<(), i32> {
        as_self_alone(&self.maps)?;
        for &path in &self.masks {
            mask(path)?;
        }
        if let Some((state, trust)) = self.state {
            let temp = self.temp.map(|(path, access)| (path, access, self.ruleset));
            mask_but(state, trust, temp)?;
        }
        if let Some((run, store)) = self.store {
            bind(run, store, false)?;
        }
        for &path in &self.readonly {
            bind(path, path, true)?;
        }
        Ok(())
    }
}

/// A user and mount namespace of our own, as this user, with nothing propagating out of it.
#[expect(
    unsafe_code,
    reason = "raw system calls in a forked child: unshare, /proc writes"
)]
fn as_self_alone(maps: &[(*const u8, usize); 2]) -> Result<(), i32> {
    // SAFETY: system calls on integers, static C strings and the byte buffers `maps` points
    // into, which the `Confinement` keeps alive.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
            return Err(super::errno());
        }
        let write = |path: &CStr, bytes: *const u8, len: usize| -> Result<(), i32> {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(super::errno());
            }
            let written = libc::write(fd, bytes.cast(), len);
            libc::close(fd);
            if usize::try_from(written) == Ok(len) {
                Ok(())
            } else {
                Err(super::errno())
            }
        };
        let deny = b"deny";
        write(c"/proc/self/setgroups", deny.as_ptr(), deny.len())?;
        write(c"/proc/self/uid_map", maps[0].0, maps[0].1)?;
        write(c"/proc/self/gid_map", maps[1].0, maps[1].1)?;
    }
    // Nothing made here propagates out: a mount namespace copied into a less privileged user
    // namespace receives its shared mounts as slaves (no `MS_PRIVATE` pass needed).
    Ok(())
}

/// Whether a failure to reach a path means there is nothing there the agent could reach: it
/// does not exist, a folder on its way is a file, or the user cannot get there anyway.
fn absent(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::ELOOP | libc::ENAMETOOLONG
    )
}

/// The flags of a mask: nothing can be written, run or opened as a device beneath it.
const MASK_FLAGS: libc::c_ulong =
    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// Mounts an empty tmpfs (only its owner may enter) at `path`, with `flags`.
#[expect(unsafe_code, reason = "raw system calls in a forked child: mount")]
fn tmpfs(path: *const c_char, flags: libc::c_ulong) -> Result<(), i32> {
    // SAFETY: `mount` on static C strings and on `path`, which the `Confinement` keeps alive.
    let mounted = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            path,
            c"tmpfs".as_ptr(),
            flags,
            c"mode=700".as_ptr().cast(),
        )
    };
    if mounted == 0 {
        Ok(())
    } else {
        Err(super::errno())
    }
}

/// Hides what `path` holds: an empty read-only folder over a folder, `/dev/null` over anything
/// else.
#[expect(unsafe_code, reason = "raw system calls in a forked child: mount")]
fn mask(path: *const c_char) -> Result<(), i32> {
    match tmpfs(path, MASK_FLAGS) {
        Ok(()) => return Ok(()),
        Err(errno) if errno != libc::ENOTDIR => {
            return if absent(errno) { Ok(()) } else { Err(errno) };
        }
        Err(_) => {}
    }
    // SAFETY: `mount` on a static C string and on `path`, which the `Confinement` keeps alive.
    unsafe {
        // Not a folder (a tmpfs only covers one): the empty device.
        if libc::mount(
            c"/dev/null".as_ptr(),
            path,
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) == 0
        {
            return Ok(());
        }
        let errno = super::errno();
        if absent(errno) { Ok(()) } else { Err(errno) }
    }
}

/// Hides what `state` holds but `trust` inside it, which stays readable (bound back read-only),
/// and `temp` inside it, a writable tmpfs of its own whose rights are added to the ruleset.
#[expect(
    unsafe_code,
    reason = "raw system calls in a forked child: open_tree, mount, mkdir, move_mount"
)]
fn mask_but(
    state: *const c_char,
    trust: *const c_char,
    temp: Option<(*const c_char, u64, RawFd)>,
) -> Result<(), i32> {
    // SAFETY: system calls on integers, static C strings and on `state`, `trust` and `temp`,
    // which the `Confinement` keeps alive; the one descriptor opened is closed on every path.
    unsafe {
        // A copy of the approvals' mount, taken before the mask hides them.
        let tree: RawFd = libc::c_int::try_from(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            trust,
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        ))
        .unwrap_or(-1);
        if tree < 0 {
            let errno = super::errno();
            if !absent(errno) {
                return Err(errno);
            }
            if temp.is_none() {
                return mask(state);
            }
        }
        let outcome = (|| {
            tmpfs(state, MASK_FLAGS & !libc::MS_RDONLY)?;
            if tree >= 0 {
                if libc::mkdir(trust, 0o700) != 0 {
                    return Err(super::errno());
                }
                if libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    trust,
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) != 0
                {
                    return Err(super::errno());
                }
                read_only(trust)?;
            }
            if let Some((temp, access, ruleset)) = temp {
                own_temp(temp, access, ruleset)?;
            }
            let remount = libc::MS_REMOUNT | MASK_FLAGS;
            if libc::mount(
                std::ptr::null(),
                state,
                std::ptr::null(),
                remount,
                std::ptr::null(),
            ) != 0
            {
                return Err(super::errno());
            }
            Ok(())
        })();
        if tree >= 0 {
            libc::close(tree);
        }
        outcome
    }
}

/// The agent's temporary folder at `path` (inside a writable mask): a tmpfs of its own, granted
/// `access` in `ruleset` (its rule can only be made once it exists, here).
#[expect(
    unsafe_code,
    reason = "raw system calls in a forked child: mkdir, mount, open, landlock_add_rule"
)]
fn own_temp(path: *const c_char, access: u64, ruleset: RawFd) -> Result<(), i32> {
    /// `struct landlock_path_beneath_attr` (linux/landlock.h), packed as the kernel reads it.
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: system calls on integers, static C strings, `path` (kept alive by the
    // `Confinement`) and a stack struct; the descriptor opened is closed on every path.
    unsafe {
        if libc::mkdir(path, 0o700) != 0 {
            return Err(super::errno());
        }
        tmpfs(path, libc::MS_NOSUID | libc::MS_NODEV)?;
        let fd = libc::open(path, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(super::errno());
        }
        let rule = PathBeneath {
            allowed_access: access,
            parent_fd: fd,
        };
        let added = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &raw const rule,
            0,
        );
        libc::close(fd);
        if added != 0 {
            return Err(super::errno());
        }
    }
    Ok(())
}

/// Binds `from` over `to` (read-only when asked).
#[expect(unsafe_code, reason = "raw system calls in a forked child: mount")]
fn bind(from: *const c_char, to: *const c_char, read_only_too: bool) -> Result<(), i32> {
    // SAFETY: `mount` on `from` and `to`, which the `Confinement` keeps alive.
    unsafe {
        let none = std::ptr::null::<c_char>();
        if libc::mount(
            from,
            to,
            none,
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ) != 0
        {
            return Err(super::errno());
        }
    }
    if read_only_too { read_only(to) } else { Ok(()) }
}

/// Makes the bind mount at `path` read-only, keeping the flags it is locked with (a remount in
/// a user namespace must keep them).
#[expect(
    unsafe_code,
    reason = "raw system calls in a forked child: statvfs, mount"
)]
fn read_only(path: *const c_char) -> Result<(), i32> {
    // SAFETY: `statvfs` into a stack struct and `mount` on `path`, which the `Confinement`
    // keeps alive. glibc's statvfs is statfs and its flags (no mount table read since Linux
    // 2.6.36).
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path, &raw mut stat) != 0 {
            return Err(super::errno());
        }
        let mut kept = 0;
        for (st, ms) in [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if stat.f_flag & st != 0 {
                kept |= ms;
            }
        }
        let none = std::ptr::null::<c_char>();
        let remount = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept;
        if libc::mount(none, path, none, remount, std::ptr::null()) != 0 {
            return Err(super::errno());
        }
    }
    Ok(())
}
