//! Canonical subagent definitions: `subagents/<name>.md` parsing and validation.
//!
//! (Being built under the sync issue.)
