//! The end-to-end suite: one test binary (one link step on a small CI machine), a module per area.
//!
//! Every module drives the real binaries (`acp-host`, `acp-child`, the scripted `mock-agent`)
//! over real pipes, or the library through its public API, and asserts outcomes: exit codes, exact
//! output, files on disk, and that no process is left behind. Shared helpers live in `acp_tests`,
//! `common` (this binary's own environment) and `children` (a parent that delegates).

mod acp_child;
mod acp_child_manifest;
mod acp_child_model;
mod acp_registry;
mod background;
mod batch;
mod batch_shards;
mod capabilities;
mod child_streaming;
mod children;
mod cli_snapshots;
mod cluster_recipes;
mod common;
mod delegation;
mod docs;
mod errors;
mod fork;
mod hardening;
mod host_child;
mod install;
mod library;
mod live_children;
mod live_view;
mod mock_agent;
mod mock_llm;
mod model;
mod otel;
mod perf_behaviour;
mod protocol_edges;
mod real_model;
mod run;
mod sandbox;
mod scrub;
mod serve;
mod ssh;
mod structured;
mod subagent_sessions;
mod sync;
mod tracing;
mod trust;
mod usage;
mod worktree;
