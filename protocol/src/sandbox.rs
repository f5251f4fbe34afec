//! Containment: the sandbox a person chose for an agent, and every decision about it that needs
//! no I/O.
//!
//! A run names a [`Policy`]: a [`Mode`] for files (`off`, `read-only`, `workspace-write`), a
//! [`Network`] (`on`, `off`, `tcp:PORT[,PORT]`), extra writable roots, more denied paths, and
//! whether a kernel that cannot enforce all of it may run it anyway (`best_effort`). Applied at
//! the run's working directory it becomes a [`Standing`]: absolute writable roots, the denied
//! paths. acp-host enforces a standing with Landlock and seccomp on the agent's whole process
//! tree before its exec (`acp_host::sandbox`); what a kernel offers decides what of it holds
//! ([`assess`]), and the run's record says so ([`Report`]).
//!
//! A standing travels down a chain of agents in [`crate::env_vars::ACP_HOST_SANDBOX`], set by
//! acp-host on every agent it starts: an agent that starts another (acp-child delegating, a
//! command it runs) gives it at most its own ([`Standing::within`]). The kernel holds that
//! anyway (a Landlock domain is inherited and only ever narrowed); the variable makes the
//! settings and the records say what holds. A malformed value fails closed: it reads as the
//! strictest standing, never as none.
//!
//! What this is: a kernel-enforced bound on the files an agent reads and writes and the TCP
//! ports it reaches. What it is not: a VM or a container: the agent shares the kernel, the
//! process table (it cannot signal outside its domain where the kernel scopes signals) and every
//! file it may read.
//!
//! Invariants: pure; a mode or network only ever tightens down a chain (stricter of the two,
//! ports intersected, writable roots kept only beneath the floor's, denied paths joined); the
//! credential folders ([`credential_paths`]) are denied in every mode but `off`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What an agent may do with files.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// No file restriction.
    #[default]
    Off,
    /// Read anywhere but the denied paths; write only the agent's own temporary folder and state.
    ReadOnly,
    /// As `read-only`, and write the working directory and the named extra roots (their `.git`
    /// kept read-only unless asked).
    WorkspaceWrite,
}

impl Mode {
    /// Every mode, loosest first.
    pub const ALL: [Mode; 3] = [Mode::Off, Mode::WorkspaceWrite, Mode::ReadOnly];

    /// The name on the command line and in records.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::ReadOnly => "read-only",
            Mode::WorkspaceWrite => "workspace-write",
        }
    }

    /// How much it withholds: `off` < `workspace-write` < `read-only`.
    fn strictness(self) -> u8 {
        match self {
            Mode::Off => 0,
            Mode::WorkspaceWrite => 1,
            Mode::ReadOnly => 2,
        }
    }

    /// The stricter of the two.
    #[must_use]
    pub fn stricter(self, other: Mode) -> Mode {
        if other.strictness() > self.strictness() {
            other
        } else {
            self
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = SandboxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| SandboxError::Mode(text.to_owned()))
    }
}

/// What an agent may reach over the network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    /// No network restriction.
    #[default]
    On,
    /// No TCP connection or bind, no other internet socket.
    Off,
    /// TCP connections to these ports only (no bind), no other internet socket.
    Tcp(BTreeSet<u16>),
}

impl Network {
    /// The tighter of the two: `off` wins, ports are intersected (none left: `off`).
    #[must_use]
    pub fn tighter(&self, other: &Network) -> Network {
        match (self, other) {
            (Network::On, other) | (other, Network::On) => other.clone(),
            (Network::Tcp(mine), Network::Tcp(theirs)) => {
                let both: BTreeSet<u16> = mine.intersection(theirs).copied().collect();
                if both.is_empty() {
                    Network::Off
                } else {
                    Network::Tcp(both)
                }
            }
            _ => Network::Off,
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Network::On => f.write_str("on"),
            Network::Off => f.write_str("off"),
            Network::Tcp(ports) => {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                write!(f, "tcp:{}", ports.join(","))
            }
        }
    }
}

impl std::str::FromStr for Network {
    type Err = SandboxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "on" => return Ok(Network::On),
            "off" => return Ok(Network::Off),
            _ => {}
        }
        let bad = || SandboxError::Network(text.to_owned());
        let ports = text.strip_prefix("tcp:").ok_or_else(bad)?;
        let ports = ports
            .split(',')
            .map(|port| port.trim().parse::<u16>().ok().filter(|port| *port != 0))
            .collect::<Option<BTreeSet<u16>>>()
            .ok_or_else(bad)?;
        Ok(Network::Tcp(ports))
    }
}

impl Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Network {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Network".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`on`, `off`, or `tcp:` and the TCP ports the agent may connect to, comma-separated.",
            "type": "string",
            "pattern": "^(on|off|tcp:[0-9]+(,[0-9]+)*)$"
        })
    }
}

/// A sandbox setting that cannot be read, or a sandbox that cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("unknown sandbox mode {0:?}: use off, read-only or workspace-write")]
    Mode(String),
    #[error(
        "unknown network setting {0:?}: use on, off, or tcp: and the ports to allow (tcp:443 or tcp:443,8080)"
    )]
    Network(String),
    #[error("sandbox path must be absolute: {0} (resolve it first)")]
    Relative(PathBuf),
    #[error(
        "the sandbox cannot be enforced on this machine: {}; pass --sandbox-best-effort to run with what the kernel enforces, or --sandbox off --network on to run without one",
        .0.join("; ")
    )]
    NotEnforceable(Vec<String>),
}

/// What a person asked of one run's sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    pub network: Network,
    /// Roots the agent may write besides its working directory (`--sandbox-write`): absolute.
    /// Only `workspace-write` writes them.
    pub write: Vec<PathBuf>,
    /// Whether the writable roots' `.git` is writable too (`--sandbox-write-git`).
    pub write_git: bool,
    /// Paths made unreadable beside the credential folders (`--sandbox-deny`): absolute.
    pub deny: Vec<PathBuf>,
    /// Run even when the kernel cannot enforce all of it, saying what was not.
    pub best_effort: bool,
}

/// The policy that restricts nothing (what `off` everywhere asks).
pub static UNRESTRICTED: Policy = Policy {
    mode: Mode::Off,
    network: Network::On,
    write: Vec::new(),
    write_git: false,
    deny: Vec::new(),
    best_effort: false,
};

impl Policy {
    /// Whether it restricts anything.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.mode != Mode::Off || self.network != Network::On
    }

    /// The policy applied at `cwd`: its writable roots made one absolute list. Relative extra
    /// roots or denied paths are refused (the CLI resolves them first).
    pub fn at(&self, cwd: &Path) -> Result<Standing, SandboxError> {
        if let Some(relative) = self
            .write
            .iter()
            .chain(&self.deny)
            .find(|p| p.is_relative())
        {
            return Err(SandboxError::Relative(relative.clone()));
        }
        let writable = if self.mode == Mode::WorkspaceWrite {
            std::iter::once(cwd.to_path_buf())
                .chain(self.write.iter().cloned())
                .collect()
        } else {
            Vec::new()
        };
        Ok(Standing {
            mode: self.mode,
            network: self.network.clone(),
            writable,
            write_git: self.write_git,
            deny: self.deny.clone(),
            best_effort: self.best_effort,
        })
    }
}

/// A policy applied at a working directory: what one agent may touch. What acp-host enforces,
/// and what an agent is told in [`crate::env_vars::ACP_HOST_SANDBOX`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Standing {
    pub mode: Mode,
    pub network: Network,
    /// The roots the agent may write (working directory first): empty unless `workspace-write`.
    #[serde(default)]
    pub writable: Vec<PathBuf>,
    #[serde(default)]
    pub write_git: bool,
    /// Denied beside the credential folders.
    #[serde(default)]
    pub deny: Vec<PathBuf>,
    #[serde(default)]
    pub best_effort: bool,
}

impl Standing {
    /// The strictest standing: what a malformed inherited value reads as.
    #[must_use]
    pub fn strictest() -> Standing {
        Standing {
            mode: Mode::ReadOnly,
            network: Network::Off,
            ..Standing::default()
        }
    }

    /// Whether it restricts anything.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.mode != Mode::Off || self.network != Network::On
    }

    /// This standing for an agent moved from `from` to `to` (its git worktree): a writable root
    /// that was `from` becomes `to`, the other roots stay. The worktree is the agent's workspace
    /// in place of the folder it was started from.
    #[must_use]
    pub fn moved(&self, from: &Path, to: &Path) -> Standing {
        let mut moved = self.clone();
        for root in &mut moved.writable {
            if root == from {
                *root = to.to_path_buf();
            }
        }
        moved
    }

    /// This standing held to `floor` (the starting agent's own): the stricter mode, the tighter
    /// network, what both let be written (a mode `off` writes everything; the roots beneath one
    /// of the other's), `.git` writable only when both let it be, both denied lists, best effort
    /// only when both allow it.
    #[must_use]
    pub fn within(&self, floor: &Standing) -> Standing {
        let mode = self.mode.stricter(floor.mode);
        let writable = match (self.mode, floor.mode) {
            (Mode::ReadOnly, _) | (_, Mode::ReadOnly) => Vec::new(),
            (Mode::Off, _) => floor.writable.clone(),
            (_, Mode::Off) => self.writable.clone(),
            (Mode::WorkspaceWrite, Mode::WorkspaceWrite) => {
                let beneath = |root: &PathBuf, roots: &[PathBuf]| {
                    roots.iter().any(|other| root.starts_with(other))
                };
                let mut both: Vec<PathBuf> = self
                    .writable
                    .iter()
                    .filter(|root| beneath(root, &floor.writable))
                    .cloned()
                    .collect();
                for root in &floor.writable {
                    if beneath(root, &self.writable) && !both.contains(root) {
                        both.push(root.clone());
                    }
                }
                both
            }
        };
        let git = |standing: &Standing| standing.mode == Mode::Off || standing.write_git;
        let mut deny = floor.deny.clone();
        deny.extend(
            self.deny
                .iter()
                .filter(|p| !floor.deny.contains(p))
                .cloned(),
        );
        Standing {
            mode,
            network: self.network.tighter(&floor.network),
            writable: if mode == Mode::WorkspaceWrite {
                writable
            } else {
                Vec::new()
            },
            write_git: git(self) && git(floor),
            deny,
            best_effort: self.best_effort && floor.best_effort,
        }
    }

    /// The value of [`crate::env_vars::ACP_HOST_SANDBOX`] for an agent standing here.
    #[must_use]
    pub fn env_value(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The standing an inherited [`crate::env_vars::ACP_HOST_SANDBOX`] gives: none (`Ok(None)`)
    /// when unset, the strictest when it cannot be read (with why, for the caller to log).
    pub fn inherited(value: Option<&str>) -> Result<Option<Standing>, (Standing, String)> {
        let Some(value) = value else {
            return Ok(None);
        };
        serde_json::from_str::<Standing>(value)
            .map(Some)
            .map_err(|err| (Standing::strictest(), err.to_string()))
    }
}

/// The credential folders and files denied in every mode but `off`, under `home`.
#[must_use]
pub fn credential_paths(home: &Path) -> Vec<PathBuf> {
    CREDENTIALS.iter().map(|path| home.join(path)).collect()
}

/// Relative to the home folder; docs/sandbox.md lists the same.
const CREDENTIALS: [&str; 15] = [
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gcloud",
    ".kube",
    ".netrc",
    ".docker/config.json",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".password-store",
    ".git-credentials",
    ".config/gh",
    ".cargo/credentials.toml",
    ".pypirc",
    ".azure",
];

/// One entry of a folder, as [`cover`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub kind: EntryKind,
}

/// What a folder entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    /// Anything else but a link: a file, a device, a socket.
    File,
    /// A symbolic link and where it leads, resolved; `None` when it leads nowhere.
    Link(Option<PathBuf>),
}

/// The paths that together grant everything beneath `root` except what lies beneath one of
/// `excluded`: `root` itself when nothing excluded is beneath it, else its entries (from `list`),
/// each covered the same way. A symbolic link is granted as its target (the kernel follows it),
/// so a link whose target holds or lies beneath an excluded path is left out, and a dangling one
/// too. Paths are compared as given: the caller canonicalizes. An excluded path need not exist:
/// its folder is still split, so it cannot be created.
pub fn cover(
    root: &Path,
    excluded: &[PathBuf],
    list: &mut dyn FnMut(&Path) -> Vec<Entry>,
) -> Vec<PathBuf> {
    let mut granted = Vec::new();
    cover_into(root, excluded, list, &mut granted);
    granted
}

fn cover_into(
    root: &Path,
    excluded: &[PathBuf],
    list: &mut dyn FnMut(&Path) -> Vec<Entry>,
    granted: &mut Vec<PathBuf>,
) {
    if excluded.iter().any(|ex| root.starts_with(ex)) {
        return;
    }
    if !excluded.iter().any(|ex| ex.starts_with(root)) {
        granted.push(root.to_path_buf());
        return;
    }
    for entry in list(root) {
        match entry.kind {
            EntryKind::Dir => cover_into(&entry.path, excluded, list, granted),
            EntryKind::File => {
                if !excluded.iter().any(|ex| entry.path.starts_with(ex)) {
                    granted.push(entry.path);
                }
            }
            EntryKind::Link(Some(target)) => {
                let touches = excluded
                    .iter()
                    .any(|ex| target.starts_with(ex) || ex.starts_with(&target));
                if !touches {
                    granted.push(entry.path);
                }
            }
            EntryKind::Link(None) => {}
        }
    }
}

/// How much of a sandbox the kernel enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Enforced {
    /// Everything asked.
    Full,
    /// Some of it (`notEnforced` says what not), under `--sandbox-best-effort`.
    Partial,
    /// Nothing: the kernel offers none of it, under `--sandbox-best-effort`.
    None,
}

/// What the kernel offers a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// The Landlock ABI version; `None` when Landlock is unavailable (not built in, not enabled,
    /// or refused).
    pub landlock_abi: Option<u32>,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
}

/// The Landlock ABI that first restricts truncating a file.
pub const ABI_TRUNCATE: u32 = 3;
/// The Landlock ABI that first restricts TCP bind and connect by port.
pub const ABI_NETWORK: u32 = 4;
/// The Landlock ABI that first scopes signals and abstract Unix sockets to the domain.
pub const ABI_SCOPES: u32 = 6;

/// What a standing needs of the kernel that `kernel` lacks, one phrase each; empty when it holds
/// in full.
#[must_use]
pub fn missing(standing: &Standing, kernel: Kernel) -> Vec<String> {
    let abi = kernel.landlock_abi.unwrap_or(0);
    let have = |needed: u32| abi >= needed;
    let landlock = |what: &str, needed: u32| match kernel.landlock_abi {
        None => format!("{what} (needs Landlock, which this kernel does not offer)"),
        Some(abi) => format!("{what} (needs Landlock ABI {needed}, this kernel has {abi})"),
    };
    let mut missing = Vec::new();
    if standing.mode != Mode::Off {
        if !have(1) {
            missing.push(landlock("file access limits", 1));
        } else if !have(ABI_TRUNCATE) {
            missing.push(landlock("truncation limits", ABI_TRUNCATE));
        }
    }
    if standing.network != Network::On {
        if !have(ABI_NETWORK) {
            missing.push(landlock("TCP limits", ABI_NETWORK));
        }
        if !kernel.seccomp {
            missing.push("non-TCP socket limits (needs seccomp)".to_owned());
        }
    }
    if standing.is_active() {
        if !have(ABI_SCOPES) {
            missing.push(landlock("signal and abstract socket scoping", ABI_SCOPES));
        }
        if !kernel.seccomp {
            missing.push("refusing new user namespaces (needs seccomp)".to_owned());
        }
    }
    missing
}

/// Whether a standing may run on `kernel`, and how much of it holds: `Err` when something is
/// missing and best effort was not asked.
pub fn assess(
    standing: &Standing,
    kernel: Kernel,
) -> Result<(Enforced, Vec<String>), SandboxError> {
    let missing = missing(standing, kernel);
    if missing.is_empty() {
        return Ok((Enforced::Full, missing));
    }
    if !standing.best_effort {
        return Err(SandboxError::NotEnforceable(missing));
    }
    let nothing = kernel.landlock_abi.is_none() && !kernel.seccomp;
    Ok((
        if nothing {
            Enforced::None
        } else {
            Enforced::Partial
        },
        missing,
    ))
}

/// A run's sandbox as its record reports it (`sandbox` of the result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub mode: Mode,
    pub network: Network,
    /// The Landlock ABI in use; `null` when the kernel offers none.
    pub abi: Option<u32>,
    pub enforced: Enforced,
    /// The roots the agent may write (its temporary folder included).
    pub writable: Vec<String>,
    /// Inside them, what stays read-only (each root's `.git`, unless `--sandbox-write-git`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    /// The paths made unreadable (credential folders, other runs' state, `--sandbox-deny`).
    pub denied: Vec<String>,
    /// What was asked and not enforced, one phrase each; absent when everything held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_enforced: Vec<String>,
}

impl Report {
    /// One line for a person: the mode, the network, the ABI and how much held.
    #[must_use]
    pub fn describe(&self) -> String {
        let abi = self.abi.map_or_else(
            || "no Landlock".to_owned(),
            |abi| format!("Landlock ABI {abi}"),
        );
        let held = match self.enforced {
            Enforced::Full => "enforced in full".to_owned(),
            Enforced::Partial => format!("partly enforced, not: {}", self.not_enforced.join("; ")),
            Enforced::None => format!("not enforced: {}", self.not_enforced.join("; ")),
        };
        format!(
            "sandbox {}, network {}, {abi}, {held}",
            self.mode, self.network
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(list: &[u16]) -> Network {
        Network::Tcp(list.iter().copied().collect())
    }

    #[test]
    fn modes_read_and_print_their_names_and_order_by_strictness() {
        for mode in Mode::ALL {
            assert_eq!(mode.as_str().parse::<Mode>(), Ok(mode));
            assert_eq!(mode.to_string(), mode.as_str());
        }
        assert_eq!(
            "sealed".parse::<Mode>().unwrap_err().to_string(),
            "unknown sandbox mode \"sealed\": use off, read-only or workspace-write"
        );
        assert_eq!(
            Mode::Off.stricter(Mode::WorkspaceWrite),
            Mode::WorkspaceWrite
        );
        assert_eq!(
            Mode::ReadOnly.stricter(Mode::WorkspaceWrite),
            Mode::ReadOnly
        );
        assert_eq!(
            Mode::WorkspaceWrite.stricter(Mode::Off),
            Mode::WorkspaceWrite
        );
    }

    #[test]
    fn network_settings_read_print_and_round_trip_as_strings() {
        assert_eq!("on".parse(), Ok(Network::On));
        assert_eq!("off".parse(), Ok(Network::Off));
        assert_eq!("tcp:443, 8080,443".parse(), Ok(ports(&[443, 8080])));
        assert_eq!(ports(&[8080, 443]).to_string(), "tcp:443,8080");
        assert_eq!(
            (Network::On.to_string(), Network::Off.to_string()),
            ("on".into(), "off".into())
        );
        for bad in ["tcp:", "tcp:0", "tcp:70000", "tcp:443,x", "udp:53", "yes"] {
            assert_eq!(
                bad.parse::<Network>(),
                Err(SandboxError::Network(bad.to_owned())),
                "{bad}"
            );
        }
        let json = serde_json::to_string(&ports(&[443])).unwrap();
        assert_eq!(json, "\"tcp:443\"");
        assert_eq!(
            serde_json::from_str::<Network>(&json).unwrap(),
            ports(&[443])
        );
        assert!(serde_json::from_str::<Network>("\"tcp:x\"").is_err());
        let schema = schemars::schema_for!(Network);
        assert_eq!(schema.get("type").unwrap(), "string");
    }

    #[test]
    fn the_tighter_network_wins_and_ports_intersect() {
        assert_eq!(Network::On.tighter(&Network::Off), Network::Off);
        assert_eq!(ports(&[443]).tighter(&Network::On), ports(&[443]));
        assert_eq!(Network::Off.tighter(&ports(&[443])), Network::Off);
        assert_eq!(ports(&[443]).tighter(&Network::Off), Network::Off);
        assert_eq!(ports(&[443, 80]).tighter(&ports(&[443, 22])), ports(&[443]));
        assert_eq!(ports(&[80]).tighter(&ports(&[22])), Network::Off);
    }

    #[test]
    fn a_moved_standing_writes_its_worktree_instead_of_its_cwd() {
        let standing = Standing {
            mode: Mode::WorkspaceWrite,
            writable: vec!["/repo/sub".into(), "/data".into()],
            ..Standing::default()
        };
        let moved = standing.moved(
            Path::new("/repo/sub"),
            Path::new("/repo/.acp-host/worktrees/x"),
        );
        assert_eq!(
            moved.writable,
            [PathBuf::from("/repo/.acp-host/worktrees/x"), "/data".into()]
        );
    }

    #[test]
    fn a_policy_at_a_cwd_writes_the_cwd_and_its_roots_only_in_workspace_write() {
        let policy = Policy {
            mode: Mode::WorkspaceWrite,
            write: vec!["/data".into()],
            deny: vec!["/secret".into()],
            ..Policy::default()
        };
        assert!(policy.is_active());
        let standing = policy.at(Path::new("/work")).unwrap();
        assert_eq!(standing.writable, [PathBuf::from("/work"), "/data".into()]);
        assert_eq!(standing.deny, [PathBuf::from("/secret")]);
        assert!(standing.is_active());
        let read_only = Policy {
            mode: Mode::ReadOnly,
            ..policy.clone()
        };
        assert!(
            read_only
                .at(Path::new("/work"))
                .unwrap()
                .writable
                .is_empty()
        );
        assert!(!Policy::default().is_active());
        assert_eq!(UNRESTRICTED, Policy::default());
        assert!(!Policy::default().at(Path::new("/w")).unwrap().is_active());
        let network_only = Policy {
            network: Network::Off,
            ..Policy::default()
        };
        assert!(network_only.is_active());
        let relative = Policy {
            write: vec!["data".into()],
            ..Policy::default()
        };
        assert_eq!(
            relative.at(Path::new("/w")).unwrap_err().to_string(),
            "sandbox path must be absolute: data (resolve it first)"
        );
    }

    #[test]
    fn a_child_stands_at_most_where_its_parent_stands() {
        let parent = Standing {
            mode: Mode::WorkspaceWrite,
            network: ports(&[443]),
            writable: vec!["/repo".into()],
            write_git: false,
            deny: vec!["/a".into()],
            best_effort: false,
        };
        let child = Standing {
            mode: Mode::Off,
            network: Network::On,
            writable: vec![],
            write_git: true,
            deny: vec!["/a".into(), "/b".into()],
            best_effort: true,
        };
        let held = child.within(&parent);
        assert_eq!(held.mode, Mode::WorkspaceWrite);
        assert_eq!(held.network, ports(&[443]));
        // Asking for everything gets what the parent may write.
        assert_eq!(held.writable, [PathBuf::from("/repo")]);
        assert!(!held.write_git);
        assert_eq!(held.deny, [PathBuf::from("/a"), "/b".into()]);
        assert!(!held.best_effort);

        let writer = Standing {
            mode: Mode::WorkspaceWrite,
            writable: vec!["/repo/sub".into(), "/elsewhere".into()],
            write_git: true,
            ..Standing::default()
        };
        assert_eq!(
            writer.within(&parent).writable,
            [PathBuf::from("/repo/sub")]
        );
        // A parent's root beneath one of the child's is what both may write.
        let narrow = Standing {
            writable: vec!["/repo/sub/deep".into(), "/repo/sub".into()],
            ..parent.clone()
        };
        let wide = Standing {
            mode: Mode::WorkspaceWrite,
            writable: vec!["/repo".into()],
            ..Standing::default()
        };
        assert_eq!(
            wide.within(&narrow).writable,
            [PathBuf::from("/repo/sub/deep"), "/repo/sub".into()]
        );
        // Under an unrestricted parent a child keeps its own.
        let free = Standing {
            best_effort: true,
            write_git: true,
            ..Standing::default()
        };
        let kept = writer.within(&free);
        assert_eq!(kept.writable, writer.writable);
        assert!(kept.write_git);
        // Read-only anywhere writes nothing.
        let sealed = Standing {
            mode: Mode::ReadOnly,
            ..Standing::default()
        };
        assert!(writer.within(&sealed).writable.is_empty());
    }

    #[test]
    fn a_standing_travels_in_the_environment_and_a_bad_value_is_the_strictest() {
        let standing = Standing {
            mode: Mode::WorkspaceWrite,
            network: ports(&[443]),
            writable: vec!["/repo".into()],
            ..Standing::default()
        };
        let value = standing.env_value();
        assert_eq!(Standing::inherited(Some(&value)), Ok(Some(standing)));
        assert_eq!(Standing::inherited(None), Ok(None));
        let (strictest, why) = Standing::inherited(Some("{nope")).unwrap_err();
        assert_eq!(strictest, Standing::strictest());
        assert!(!why.is_empty());
        assert_eq!(
            Standing::inherited(Some(r#"{"mode":"read-only","network":"off"}"#)),
            Ok(Some(Standing::strictest()))
        );
    }

    #[test]
    fn the_credential_folders_are_under_home() {
        let paths = credential_paths(Path::new("/home/me"));
        assert!(paths.contains(&PathBuf::from("/home/me/.ssh")));
        assert!(paths.contains(&PathBuf::from("/home/me/.docker/config.json")));
        assert_eq!(paths.len(), CREDENTIALS.len());
    }

    /// A folder tree for `cover`: each folder's entries.
    fn tree(path: &Path) -> Vec<Entry> {
        let dir = |name: &str| Entry {
            path: path.join(name),
            kind: EntryKind::Dir,
        };
        let file = |name: &str| Entry {
            path: path.join(name),
            kind: EntryKind::File,
        };
        let link = |name: &str, to: Option<&str>| Entry {
            path: path.join(name),
            kind: EntryKind::Link(to.map(PathBuf::from)),
        };
        match path.to_str().unwrap() {
            "/" => vec![dir("etc"), dir("home"), dir("empty"), file("vmlinuz")],
            "/home" => vec![dir("me")],
            "/home/me" => vec![
                dir(".ssh"),
                dir("src"),
                file(".netrc"),
                file(".bashrc"),
                link("keys", Some("/home/me/.ssh")),
                link("etc", Some("/etc")),
                link("all", Some("/home")),
                link("gone", None),
            ],
            _ => vec![],
        }
    }

    #[test]
    fn cover_grants_everything_but_the_excluded_paths() {
        let excluded = [
            PathBuf::from("/home/me/.ssh"),
            "/home/me/.netrc".into(),
            "/home/me/.aws".into(),
            // A folder that holds nothing but where an excluded path would be: listed, empty.
            "/empty/nothing".into(),
        ];
        let granted = cover(Path::new("/"), &excluded, &mut tree);
        let granted: Vec<&str> = granted.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            granted,
            [
                "/etc",
                "/home/me/src",
                "/home/me/.bashrc",
                "/home/me/etc",
                "/vmlinuz"
            ]
        );
        // Nothing excluded beneath: the root whole; the root excluded: nothing.
        assert_eq!(
            cover(Path::new("/etc"), &excluded, &mut tree),
            [PathBuf::from("/etc")]
        );
        assert!(cover(Path::new("/home/me/.ssh/x"), &excluded, &mut tree).is_empty());
    }

    fn kernel(abi: Option<u32>, seccomp: bool) -> Kernel {
        Kernel {
            landlock_abi: abi,
            seccomp,
        }
    }

    #[test]
    fn what_a_kernel_lacks_is_named_and_refused_unless_best_effort() {
        let full = Standing {
            mode: Mode::WorkspaceWrite,
            network: Network::Off,
            ..Standing::default()
        };
        assert_eq!(
            assess(&full, kernel(Some(7), true)),
            Ok((Enforced::Full, vec![]))
        );
        assert_eq!(
            missing(&full, kernel(None, false)),
            [
                "file access limits (needs Landlock, which this kernel does not offer)",
                "TCP limits (needs Landlock, which this kernel does not offer)",
                "non-TCP socket limits (needs seccomp)",
                "signal and abstract socket scoping (needs Landlock, which this kernel does not offer)",
                "refusing new user namespaces (needs seccomp)",
            ]
        );
        assert_eq!(
            missing(&full, kernel(Some(2), true)),
            [
                "truncation limits (needs Landlock ABI 3, this kernel has 2)",
                "TCP limits (needs Landlock ABI 4, this kernel has 2)",
                "signal and abstract socket scoping (needs Landlock ABI 6, this kernel has 2)",
            ]
        );
        let err = assess(&full, kernel(Some(5), true)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the sandbox cannot be enforced on this machine: signal and abstract socket scoping \
             (needs Landlock ABI 6, this kernel has 5); pass --sandbox-best-effort to run with \
             what the kernel enforces, or --sandbox off --network on to run without one"
        );
        let lenient = Standing {
            best_effort: true,
            ..full
        };
        assert_eq!(
            assess(&lenient, kernel(Some(5), true)).unwrap().0,
            Enforced::Partial
        );
        assert_eq!(
            assess(&lenient, kernel(None, true)).unwrap().0,
            Enforced::Partial
        );
        assert_eq!(
            assess(&lenient, kernel(None, false)).unwrap().0,
            Enforced::None
        );
        assert!(missing(&Standing::default(), kernel(None, false)).is_empty());
    }

    #[test]
    fn a_report_reads_as_one_line() {
        let mut report = Report {
            mode: Mode::ReadOnly,
            network: ports(&[443]),
            abi: Some(7),
            enforced: Enforced::Full,
            writable: vec![],
            read_only: vec![],
            denied: vec![],
            not_enforced: vec![],
        };
        assert_eq!(
            report.describe(),
            "sandbox read-only, network tcp:443, Landlock ABI 7, enforced in full"
        );
        report.abi = None;
        report.enforced = Enforced::Partial;
        report.not_enforced = vec!["a".into(), "b".into()];
        assert_eq!(
            report.describe(),
            "sandbox read-only, network tcp:443, no Landlock, partly enforced, not: a; b"
        );
        report.enforced = Enforced::None;
        assert!(
            report
                .describe()
                .ends_with("no Landlock, not enforced: a; b")
        );
    }
}
