//! Sync planning: from canonical definitions, a registry view and the current file contents to a
//! plan of operations per physical file. Pure: same inputs, same plan, zero writes.
//!
//! (Being built under the sync issue.)
