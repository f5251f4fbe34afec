//! Executes a sync plan: pre-image re-check, backups, atomic writes, per-file results.
//!
//! (Being built under the sync issue.)
