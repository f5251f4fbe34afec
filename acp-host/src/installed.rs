//! Facts about this host that decide where an agent's program is and whether an agent is
//! installed: executables on PATH, executables beside the acp-host binary, marker folders under
//! $HOME. The decisions themselves are `protocol::registry::{locate, availability}`; this module
//! only gathers the facts, from the PATH value and host folder the caller passes (never the
//! ambient environment behind its back), so tests can point them at temporary folders.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use protocol::registry::{self, AgentAvailability, AgentSpec, Location};

/// Where this host looks for programs: the PATH value and the folder of the acp-host binary (or of
/// whichever binary embeds this library: its siblings are the ones released with it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The PATH value to search; `None` finds nothing on PATH.
    pub path_var: Option<OsString>,
    /// The folder holding the acp-host binary; `None` finds nothing beside it.
    pub host_dir: Option<PathBuf>,
}

impl HostFacts {
    /// The given PATH value, and the folder of the running executable.
    #[must_use]
    pub fn new(path_var: Option<&OsStr>) -> Self {
        HostFacts {
            path_var: path_var.map(OsStr::to_os_string),
            host_dir: std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_path_buf)),
        }
    }

    /// This process's PATH, and the folder of the running executable.
    #[must_use]
    pub fn from_env() -> Self {
        HostFacts::new(std::env::var_os(protocol::env_vars::PATH).as_deref())
    }

    /// Where `program` is found (the rule is `protocol::registry::locate`).
    #[must_use]
    pub fn locate(&self, program: &str) -> Location {
        registry::locate(
            program,
            |name| {
                let candidate = self.host_dir.as_ref()?.join(name);
                executable(&candidate).then_some(candidate)
            },
            |name| {
                std::env::split_paths(self.path_var.as_deref()?)
                    .map(|dir| dir.join(name))
                    .find(|candidate| executable(candidate))
            },
            executable,
        )
    }
}

/// Whether `path` is a file with an execute bit.
#[cfg(feature = "registry")]
pub(crate) fn is_executable(path: &Path) -> bool {
    executable(path)
}

fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether an agent is installed: one of its binaries found (on PATH, or beside acp-host for the
/// programs the sibling rule names), or a marker folder under `home`.
#[must_use]
pub fn availability(spec: &AgentSpec, home: &Path, path_var: Option<&OsStr>) -> AgentAvailability {
    let facts = HostFacts::new(path_var);
    registry::availability(
        spec,
        |binary| facts.locate(binary),
        |dir| home.join(dir).is_dir(),
    )
}
