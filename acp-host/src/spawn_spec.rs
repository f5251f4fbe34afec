//! What to spawn, fully resolved: the one type both spawn paths take, the host's own
//! ([`crate::process::AgentProcess`]) and the spawner's ([`crate::spawner`], which encodes it onto
//! its socket). A leaf: the process module and the spawner both point down at it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// Receives the agent's stderr one line at a time (without the line ending, lossily decoded).
pub type StderrSink = Arc<dyn Fn(&str) + Send + Sync>;

/// What to spawn, fully resolved.
#[derive(Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Absolute, already validated.
    pub cwd: PathBuf,
    /// The complete environment of the child; nothing else is inherited. OS strings: a variable
    /// need not be UTF-8.
    pub env: BTreeMap<OsString, OsString>,
    /// How many trailing bytes of stderr to keep for the result.
    pub stderr_tail_bytes: usize,
    /// Where each stderr line goes as it arrives, if anywhere.
    pub stderr_lines: Option<StderrSink>,
    /// The sandbox the agent starts in (applied before its exec, on every path), if any.
    pub sandbox: Option<Arc<crate::sandbox::Confinement>>,
}

impl std::fmt::Debug for SpawnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("stderr_tail_bytes", &self.stderr_tail_bytes)
            .field("stderr_lines", &self.stderr_lines.is_some())
            .field("sandbox", &self.sandbox)
            .finish_non_exhaustive()
    }
}
