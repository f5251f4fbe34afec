//! SIGTERM handling. Registering a tokio listener replaces the default action (terminate),
//! which is how the mock "traps TERM"; scenarios that do not ask for it keep the default, so
//! SIGTERM kills them like any plain program.

use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};

use super::files;

/// What SIGTERM does when trapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TermAction {
    /// Nothing: only SIGKILL ends the process.
    Ignore,
    /// Create the marker file and exit 0 (proves the SIGTERM rung of a teardown fired).
    Marker(PathBuf),
}

/// Registers the listener now (before any frame is sent, so a test that saw output can rely on
/// the trap) and handles signals on a background task. Must run inside the tokio runtime.
pub(super) fn trap_term(action: TermAction) -> std::io::Result<()> {
    let mut terms = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        while terms.recv().await.is_some() {
            match &action {
                TermAction::Ignore => eprintln!("mock: SIGTERM received and ignored"),
                TermAction::Marker(marker) => {
                    files::touch(marker);
                    std::process::exit(0);
                }
            }
        }
    });
    Ok(())
}
