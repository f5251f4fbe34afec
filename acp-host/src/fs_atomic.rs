//! The one place that writes files: atomic replace (temp file in the same folder, fsync, rename),
//! keeping the file mode, never following a symlink out of the target folder.
//!
//! (Being built under the sync issue.)
