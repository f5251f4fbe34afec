//! acp-host: run any ACP agent as an out-of-process subagent, and sync subagent definitions.
//!
//! The I/O edges of the host. Decisions live in `protocol`; this crate spawns, drives, tears down
//! and writes files, then reports through the types `protocol` defines.
//!
//! - [`process`]: the one owner of a child process (group, parent-death signal, stderr tail, the
//!   EOF -> TERM -> KILL ladder over the whole tree). Nothing else sends signals.
//!   [`process::harden_host`] is the process-wide hardening a program running agents calls once.
//! - [`watchdog`]: the second mode of the `acp-host` binary that sits between host and agent and
//!   kills the agent's whole tree when the host dies; `reaper` finds a tree's processes in /proc.
//! - [`client`]: the ACP client connection on the official SDK.
//! - [`run`]: validate -> spawn -> drive -> settle -> teardown, returning a result on every path.
//! - [`sync_exec`]: prepares (reads definitions and targets, plans) and executes a sync plan;
//!   [`fs_atomic`] is the one place that writes files; [`installed`] gathers PATH/$HOME facts.

pub mod client;
pub mod fs_atomic;
pub mod installed;
pub mod process;
mod reaper;
pub mod run;
pub mod sync_exec;
pub mod watchdog;
