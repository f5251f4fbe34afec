//! Shared helpers of the end-to-end suites.

use std::path::PathBuf;

/// The path of a workspace binary (`acp-host`, `acp-child`, `mock-agent`), found next to the
/// test executable: `target/<profile>/deps/<test>` -> `target/<profile>/<name>`.
///
/// Cargo builds the binaries of other workspace packages only when they are part of the build:
/// `cargo test --workspace` does; with `cargo test -p acp-tests`, run `cargo build -p acp-host`
/// first.
///
/// # Panics
/// When the binary is missing, with the command that builds it.
#[must_use]
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("test executables live in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "binary `{name}` not found at {}: build it first (`cargo build --workspace`, or run `cargo test --workspace`)",
        path.display()
    );
    path
}
