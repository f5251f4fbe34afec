//! Facts about this host that decide whether an agent is installed: binaries on PATH and marker
//! folders under $HOME. The decision itself is `protocol::registry::availability`; this module
//! only gathers the facts, from the PATH and HOME values the caller passes (never the ambient
//! environment), so tests can point both at temporary folders.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use protocol::registry::{self, AgentAvailability, AgentSpec};

/// Whether an executable file named `binary` is in one of the PATH folders.
#[must_use]
pub fn on_path(binary: &str, path_var: Option<&OsStr>) -> bool {
    let Some(path_var) = path_var else {
        return false;
    };
    std::env::split_paths(path_var).any(|dir| {
        std::fs::metadata(dir.join(binary))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// `name` installed next to the running `acp-host`, if it is there: the pair (acp-host and
/// acp-child) is built and released together, so the sibling wins over whatever PATH holds.
#[must_use]
pub fn sibling(name: &str) -> Option<PathBuf> {
    let candidate = std::env::current_exe().ok()?.parent()?.join(name);
    candidate.is_file().then_some(candidate)
}

/// Whether an agent is installed: a binary on PATH or beside acp-host, or a marker folder under
/// `home`.
#[must_use]
pub fn availability(spec: &AgentSpec, home: &Path, path_var: Option<&OsStr>) -> AgentAvailability {
    registry::availability(
        spec,
        |binary| on_path(binary, path_var) || sibling(binary).is_some(),
        |dir| home.join(dir).is_dir(),
    )
}
