//! acp-host: run any ACP agent as an out-of-process subagent, and sync subagent definitions.
//!
//! The I/O edges of the host. Decisions live in `protocol`; this crate spawns, drives, tears down
//! and writes files, then reports through the types `protocol` defines. It never writes to the
//! process's own stdout or stderr (logs go through `tracing`), so it can be embedded in an agent
//! whose stdout carries protocol frames and whose stderr is its log channel.
//!
//! The library surface, in the order a caller meets it:
//! - [`agents::resolve`]: a registry name or a command line -> the command that runs it, and where
//!   its program was found ([`agents::HostFacts`] holds PATH and the acp-host folder);
//! - [`run::prepare`]: validates a `protocol::request::StartRequest` (cwd, `--env` forwards) and
//!   computes the agent's scrubbed environment and its delegation depth (`protocol::depth`: the
//!   caller's `ACP_HOST_DEPTH` + 1, or 0), before anything is spawned;
//! - [`run::run`] with [`run::RunOptions`] (observers of every [`protocol::events::Event`] on a
//!   thread of the run's, or a [`run::event_stream`] the caller reads on its own runtime; a
//!   [`permission::PermissionHandler`]) and a [`run::Cancel`]: spawns, drives, settles and tears
//!   down, returning a `protocol::result::RunResult` (status, output, `error` and `error_kind`) on
//!   every path; a start past the depth limit is refused with `error_kind` `depth-limit`, nothing
//!   spawned;
//! - [`run::run_session`]: the same, but the agent and its session are kept after the first turn
//!   and answer each [`run::FollowUp`] with that turn's own result, until the caller lets go (or
//!   an idle timeout, a cancel, a failed turn); then teardown;
//! - [`sync_exec::prepare`] / [`sync_exec::execute`]: plan and apply a sync of subagent
//!   definitions;
//! - `remote` (feature `remote`): agents over ACP's HTTP/WebSocket transport, the bridge a run
//!   spawns for `--agent ws://...` and `serve` for the other end;
//! - `acp_registry` (feature `registry`): the ACP Registry's cache, its downloads, and
//!   `acp_registry::resolve` ([`agents::resolve`], then the registry).
//!
//! # Features
//!
//! Each is off unless asked for: a program that only runs agents (acp-child) compiles neither the
//! HTTP server and WebSocket stacks nor the archive readers. The `acp-host` command (the
//! `acp-host-cli` package) turns both on. Sync has no feature: it needs nothing beyond what a run
//! needs, and acp-child reads definitions through it.
//!
//! - `remote`: `acp_host::remote` (axum, ACP's HTTP transport with its TLS stack, WebSocket).
//! - `registry`: `acp_host::acp_registry` (an HTTP client, tar, gzip, zip, SHA-256).
//!
//! Lower level: [`process::AgentProcess`] is the one owner of a child process (group,
//! parent-death signal, stderr lines and tail, the EOF -> TERM -> KILL ladder over the whole
//! tree); nothing else sends signals. [`process::harden_host`] is the process-wide hardening a
//! program running agents calls once (non-dumpable, child subreaper). [`watchdog`] is the fork
//! (no exec) that sits between host and agent and kills the agent's whole tree when the host
//! dies; [`spawner::start`], called first thing in `main`, makes each watchdog a fork of a small
//! copy of the program instead of the whole program. [`fs_atomic`] is the one place that writes files; [`installed`] gathers
//! PATH/$HOME facts. [`worktree`] is the one place that runs `git`: a run's worktree
//! ([`run::RunOptions::worktree`]) and `acp-host worktrees`.
//!
//! # Example: run an agent from a library
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use acp_host::agents::{self, HostFacts};
//! use acp_host::run::{self, Cancel, Observer, ObserverError, RunOptions};
//! use protocol::capabilities::Wants;
//! use protocol::events::Event;
//! use protocol::permission::PermissionPolicy;
//! use protocol::request::{StartRequest, Timeouts};
//! use protocol::sandbox::{Mode, Network, Policy};
//! use protocol::usage::{Budget, Unreported};
//!
//! /// Logs the agent's stderr lines; a real caller might relay updates to its own client.
//! struct Log;
//!
//! impl Observer for Log {
//!     fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
//!         if let Event::Stderr { line, .. } = event {
//!             tracing::debug!(%line, "agent stderr");
//!         }
//!         Ok(())
//!     }
//! }
//!
//! async fn delegate(prompt: String) -> Result<String, Box<dyn std::error::Error>> {
//!     let agent = agents::resolve("acp-child", &HostFacts::from_env())?;
//!     let request = StartRequest {
//!         agent: agent.command,
//!         prompt,
//!         cwd: run::resolve_cwd(None)?,
//!         env: Vec::new(),
//!         permission: PermissionPolicy::Reject,
//!         timeouts: Timeouts::default(),
//!         max_depth: None,
//!         // A persona, a model, a tool filter: honoured by the agent or refused before the prompt.
//!         wants: Wants::default(),
//!         resume: None,
//!         fork: None,
//!         // What the agent may spend, as it reports it: passing it ends the run `over-budget`.
//!         budget: Budget {
//!             tokens: Some(200_000),
//!             cost: None,
//!         },
//!         // Files and network the agent may touch, enforced by the kernel (Landlock, seccomp).
//!         // An agent that reports no usage by its first answer cannot be held to it: an error.
//!         on_unreported: Unreported::Error,
//!         sandbox: Policy {
//!             mode: Mode::WorkspaceWrite,
//!             network: Network::Off,
//!             ..Policy::default()
//!         },
//!     };
//!     // Validation happens here, before anything is spawned.
//!     let prepared = run::prepare(request, std::env::vars_os())?;
//!     let options = RunOptions {
//!         observers: vec![Arc::new(Log)],
//!         ..RunOptions::default()
//!     };
//!     // Clone `cancel` to another task: .cancel() is graceful, .kill() skips the graces.
//!     let cancel = Cancel::new();
//!     let result = run::run(prepared, &options, &cancel).await;
//!     match (result.error_kind, result.error) {
//!         (Some(kind), Some(error)) => Err(format!("{kind}: {error}").into()),
//!         _ => Ok(result.output),
//!     }
//! }
//! ```

#[cfg(feature = "registry")]
pub mod acp_registry;
pub mod agents;
mod answer;
pub(crate) mod client;
pub mod definitions;
pub mod fs_atomic;
pub mod installed;
pub mod permission;
pub mod process;
mod reaper;
#[cfg(feature = "remote")]
pub mod remote;
pub mod run;
pub mod sandbox;
mod spawn_spec;
pub mod spawner;
pub mod sync_exec;
pub mod telemetry;
pub mod trust;
pub mod watchdog;
pub mod worktree;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The git commit this build was made from, when the build knew it (release builds and packages
/// from crates.io; see `build.rs`): what `--version` of acp-host and acp-child says.
pub const BUILD_COMMIT: Option<&str> = option_env!("ACP_HOST_BUILD_COMMIT");

/// The `--version` text of a binary of this workspace at `version` (its package version):
/// `protocol::version::describe` with [`BUILD_COMMIT`].
#[must_use]
pub fn version_text(version: &str) -> String {
    protocol::version::describe(version, BUILD_COMMIT)
}

/// Locks `mutex`, recovering it when a panic elsewhere poisoned it: the crate's one lock-poison
/// policy. Every critical section here leaves its data whole (a push, a take, a swap), so a
/// poisoned lock holds nothing half-done, while skipping the work would lose data silently (a
/// kept turn's reply, a permission record, output).
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
