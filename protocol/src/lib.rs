//! The shared vocabulary of acp-host and acp-child, and every decision that can be made without I/O.
//!
//! Invariants: nothing in this crate spawns a process, touches the terminal, or performs file I/O
//! hidden behind a decision; functions take values and return values, so each decision has exactly
//! one home and is unit-tested here. `acp-host` and `acp-child` call into it; it never calls back.

pub mod acp_registry;
pub mod batch;
pub mod capabilities;
pub mod child_session;
pub mod definition;
pub mod depth;
pub mod env_scrub;
pub mod env_vars;
pub mod events;
pub mod exit_table;
mod json;
pub mod listing;
pub mod live;
pub mod permission;
pub mod registry;
pub mod remote;
pub mod report;
pub mod request;
pub mod result;
pub mod sandbox;
pub mod schema;
pub mod shard;
pub mod status;
pub mod structured;
pub mod suggest;
pub mod sync;
pub mod trace;
pub mod trust;
pub mod usage;
pub mod version;
pub mod worktree;
