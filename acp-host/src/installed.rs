//! Facts about this host that decide whether an agent is installed: binaries on PATH and marker
//! folders under $HOME. The decision itself is `protocol::registry::availability`; this module
//! only gathers the facts, from the PATH and HOME values the caller passes (never the ambient
//! environment), so tests can point both at temporary folders.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

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

/// Whether an agent is installed: a binary on PATH, or a marker folder under `home`.
#[must_use]
pub fn availability(spec: &AgentSpec, home: &Path, path_var: Option<&OsStr>) -> AgentAvailability {
    registry::availability(
        spec,
        |binary| on_path(binary, path_var),
        |dir| home.join(dir).is_dir(),
    )
}
