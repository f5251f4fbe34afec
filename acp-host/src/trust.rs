//! The person's approvals of repository subagent definitions (`protocol::trust` has the rules):
//! one small file per approval in `<state>/acp-host/trust/`, named by
//! `protocol::trust::approval_key` of the definition's path and content digest, like direnv's
//! allow list.
//!
//! Invariants: a lookup reads one file (an approval is found by name, never by scanning), except
//! to tell "changed since approved" from "never approved"; only regular files of at most
//! `MAX_APPROVAL_BYTES` that parse as an approval of exactly that path and content count;
//! writes go through `fs_atomic` (a crash leaves an approval whole or absent). The store is the
//! user's own: nothing a repository contains can write to it.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use protocol::env_vars;
use protocol::trust::{Approval, Digest, TrustState, approval_key};

use crate::fs_atomic::{self, FsError};

/// An approval file is one JSON line; anything larger is not one.
const MAX_APPROVAL_BYTES: u64 = 4096;

/// The store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "no state directory to keep approvals in: set HOME or XDG_STATE_HOME (approvals live in <state>/acp-host/trust)"
    )]
    NoStateDir,
    #[error("cannot read the approvals in {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot record the approval")]
    Write(#[source] FsError),
}

/// The approvals of this user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustStore {
    dir: PathBuf,
}

impl TrustStore {
    /// The store in folder `dir`.
    #[must_use]
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The store of the user this process runs as: `<state>/acp-host/trust`, the state
    /// directory from `HOME` and `XDG_STATE_HOME` (`protocol::env_vars::state_home`).
    pub fn from_env() -> Result<Self, TrustError> {
        let home = std::env::var_os(env_vars::HOME).map(PathBuf::from);
        let xdg = std::env::var_os(env_vars::XDG_STATE_HOME).map(PathBuf::from);
        env_vars::state_home(home.as_deref(), xdg.as_deref())
            .map(|state| Self::at(state.join("acp-host").join("trust")))
            .ok_or(TrustError::NoStateDir)
    }

    /// The folder the approvals live in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `file` (absolute) with content `digest` was approved, approved with other content
    /// (it changed since), or never. A store that cannot be read approves nothing.
    #[must_use]
    pub fn state(&self, file: &Path, digest: &Digest) -> TrustState {
        if self
            .read(&self.dir.join(approval_key(file, digest)))
            .is_some_and(|approval| approval.approves(file, digest))
        {
            return TrustState::Approved;
        }
        if self
            .approvals()
            .iter()
            .any(|approval| approval.path == file)
        {
            TrustState::Changed
        } else {
            TrustState::NotApproved
        }
    }

    /// Records that the person approved `file` with content `digest`. Earlier approvals of other
    /// contents of the same file are removed: only what the person last saw stays approved.
    pub fn approve(&self, file: &Path, digest: &Digest) -> Result<(), TrustError> {
        self.revoke(file)?;
        let approval = Approval::new(file, digest);
        fs_atomic::write_atomic(
            &self.dir.join(approval_key(file, digest)),
            &approval.to_bytes(),
        )
        .map_err(TrustError::Write)
    }

    /// Removes every approval of `file`; returns how many there were.
    pub fn revoke(&self, file: &Path) -> Result<usize, TrustError> {
        let mut removed = 0;
        for (path, approval) in self.entries()? {
            if approval.path == file {
                fs_atomic::remove(&path).map_err(TrustError::Write)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Every approval recorded (unreadable entries skipped).
    #[must_use]
    pub fn approvals(&self) -> Vec<Approval> {
        self.entries()
            .map(|entries| entries.into_iter().map(|(_, approval)| approval).collect())
            .unwrap_or_default()
    }

    /// The approval files and what they say; a missing folder holds none.
    fn entries(&self) -> Result<Vec<(PathBuf, Approval)>, TrustError> {
        let read_error = |source| TrustError::Read {
            path: self.dir.clone(),
            source,
        };
        let listing = match fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(read_error(error)),
        };
        let mut entries = Vec::new();
        for entry in listing {
            let path = entry.map_err(read_error)?.path();
            if let Some(approval) = self.read(&path) {
                entries.push((path, approval));
            }
        }
        Ok(entries)
    }

    /// The approval in file `path`, when it is a small regular file holding one.
    #[expect(
        clippy::unused_self,
        reason = "a method of the store it reads from, beside the others"
    )]
    fn read(&self, path: &Path) -> Option<Approval> {
        let meta = fs::symlink_metadata(path).ok()?;
        if !meta.is_file() || meta.len() > MAX_APPROVAL_BYTES {
            return None;
        }
        let mut bytes = Vec::new();
        fs::File::open(path)
            .ok()?
            .take(MAX_APPROVAL_BYTES)
            .read_to_end(&mut bytes)
            .ok()?;
        Approval::parse(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approval_holds_for_its_content_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrustStore::at(dir.path().join("trust"));
        let file = Path::new("/repo/subagents/x.md");
        let first = Digest::of(b"first");
        let second = Digest::of(b"second");
        assert_eq!(store.state(file, &first), TrustState::NotApproved);
        store.approve(file, &first).unwrap();
        assert_eq!(store.state(file, &first), TrustState::Approved);
        assert_eq!(store.state(file, &second), TrustState::Changed);
        assert_eq!(
            store.state(Path::new("/repo/subagents/y.md"), &first),
            TrustState::NotApproved
        );
        // Approving the new content replaces the old approval.
        store.approve(file, &second).unwrap();
        assert_eq!(store.state(file, &second), TrustState::Approved);
        assert_eq!(store.state(file, &first), TrustState::Changed);
        assert_eq!(store.approvals().len(), 1);
        assert_eq!(store.revoke(file).unwrap(), 1);
        assert_eq!(store.state(file, &second), TrustState::NotApproved);
    }

    #[test]
    fn a_foreign_file_under_an_approval_name_is_not_an_approval() {
        let dir = tempfile::tempdir().unwrap();
        let store = TrustStore::at(dir.path().to_path_buf());
        let file = Path::new("/repo/subagents/x.md");
        let digest = Digest::of(b"x");
        let key = dir.path().join(approval_key(file, &digest));
        fs::write(&key, b"{}").unwrap();
        assert_eq!(store.state(file, &digest), TrustState::NotApproved);
        // An approval of another file stored under this one's name approves nothing here.
        fs::write(
            &key,
            Approval::new(Path::new("/elsewhere.md"), &digest).to_bytes(),
        )
        .unwrap();
        assert_eq!(store.state(file, &digest), TrustState::NotApproved);
    }
}
