//! Trust in subagent definitions: where a definition comes from decides what it may do.
//!
//! A definition's `run:` table is code and authority a folder asks to be given: a command line
//! to run (`agent`), variables to hand over (`env`), a permission policy (`permission`). The rules
//! (one home; acp-child and `acp-host run --subagent` / `batch` apply them):
//! - a definition's [`Source`] is trusted when the person named it: a registry agent they
//!   enabled, a folder they named (`--subagents DIR`). One found in the session's own folder
//!   (`<cwd>/subagents/`: repository content) is not, until the person approved that file's exact
//!   content ([`Approval`], stored under [`approval_key`]);
//! - an untrusted definition starts only once the person said yes, for this start or for this
//!   content; a changed file is other content and asks again;
//! - a repository definition only ever lowers privileges: its permission policy is capped at the
//!   parent's ([`crate::definition::cap`]), approved or not (an approval lets its command run; it never lets it answer
//!   its own permission requests).
//!
//! Pure: digests and keys are computed from values; the store of approvals (files in the user's
//! state directory) is `acp_host::trust`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

// `Source` is the definition's (where it was found); named here too, where trust is decided.
pub use crate::definition::Source;
use crate::definition::{RunContext, RunPermission};

/// The SHA-256 of a definition file's bytes, lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest(String);

impl Digest {
    /// The digest of `contents`.
    #[must_use]
    pub fn of(contents: &[u8]) -> Self {
        Self(hex(&Sha256::digest(contents)))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name an approval of `path` with content `digest` is stored under: a hash of both, so a
/// lookup is one file and neither a path nor a content can be confused with another.
#[must_use]
pub fn approval_key(path: &Path, digest: &Digest) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"acp-host trust v1\0");
    hasher.update(path.as_os_str().as_encoded_bytes());
    hasher.update(b"\0");
    hasher.update(digest.0.as_bytes());
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// The version of [`Approval`]'s file format.
pub const APPROVAL_VERSION: u32 = 1;

/// One approval, as stored: the definition file (absolute, symlinks resolved) and its content's
/// digest. Anything else in the file is refused, so a hand-edited or foreign file is not taken
/// for an approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Approval {
    pub version: u32,
    pub path: PathBuf,
    pub sha256: String,
}

impl Approval {
    #[must_use]
    pub fn new(path: &Path, digest: &Digest) -> Self {
        Self {
            version: APPROVAL_VERSION,
            path: path.to_path_buf(),
            sha256: digest.0.clone(),
        }
    }

    /// Reads a stored approval; `None` when it is not one this version wrote.
    #[must_use]
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(bytes)
            .ok()
            .filter(|approval| approval.version == APPROVAL_VERSION)
    }

    /// The stored form (one JSON line).
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Whether this approves `path` with content `digest`.
    #[must_use]
    pub fn approves(&self, path: &Path, digest: &Digest) -> bool {
        self.path == path && self.sha256 == digest.0
    }
}

/// Whether a definition may start: trusted by its source, approved for its content, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TrustState {
    /// From a source the person named: starts without asking.
    Trusted,
    /// A repository definition whose exact content the person approved.
    Approved,
    /// A repository definition that was approved with other content: it changed since.
    Changed,
    /// A repository definition never approved: starting it asks first.
    NotApproved,
}

impl TrustState {
    /// Whether a definition in this state starts without asking.
    #[must_use]
    pub fn may_start(self) -> bool {
        matches!(self, Self::Trusted | Self::Approved)
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trusted => "trusted",
            Self::Approved => "approved",
            Self::Changed => "changed since approved",
            Self::NotApproved => "not approved",
        }
    }
}

/// `acp-host trust --json`: the definitions of one folder with their trust state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustListing {
    /// The folder listed (`<DIR>/subagents`).
    pub folder: String,
    pub definitions: Vec<TrustEntry>,
    /// Files that are not usable definitions, one line each naming the file.
    pub problems: Vec<String>,
}

/// One definition of a [`TrustListing`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrustEntry {
    pub name: String,
    /// The file, absolute.
    pub file: String,
    pub source: Source,
    pub state: TrustState,
    /// What this run of the command did to it: `approved` or `revoked`; absent when listing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<TrustAction>,
    /// The command line its `run.agent` names (a registry name, or a command line).
    pub agent: String,
    /// The variables it asks to be forwarded (names, never values).
    pub env: Vec<String>,
    /// Its permission policy, when it names one.
    pub permission: Option<RunPermission>,
    /// What its child starts from, when it names it (`fork`: a copy of the parent's
    /// conversation, read from the parent's state directory).
    pub context: Option<RunContext>,
    /// The SHA-256 of its content.
    pub sha256: String,
}

/// What `acp-host trust --approve` / `--revoke` did to a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TrustAction {
    Approved,
    Revoked,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trust_state_says_whether_it_starts_and_how_it_is_listed() {
        for (state, starts, shown) in [
            (TrustState::Trusted, true, "trusted"),
            (TrustState::Approved, true, "approved"),
            (TrustState::Changed, false, "changed since approved"),
            (TrustState::NotApproved, false, "not approved"),
        ] {
            assert_eq!(state.may_start(), starts, "{state:?}");
            assert_eq!(state.as_str(), shown);
        }
    }

    #[test]
    fn the_digest_is_sha256_hex() {
        assert_eq!(
            Digest::of(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_key_depends_on_path_and_content() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let key = approval_key(Path::new("/p/x.md"), &a);
        assert_eq!(key.len(), 64);
        assert_eq!(key, approval_key(Path::new("/p/x.md"), &a));
        assert_ne!(key, approval_key(Path::new("/p/x.md"), &b));
        assert_ne!(key, approval_key(Path::new("/p/y.md"), &a));
    }

    #[test]
    fn an_approval_round_trips_and_approves_only_its_content() {
        let digest = Digest::of(b"content");
        let approval = Approval::new(Path::new("/p/x.md"), &digest);
        let parsed = Approval::parse(&approval.to_bytes()).unwrap();
        assert_eq!(parsed, approval);
        assert!(parsed.approves(Path::new("/p/x.md"), &digest));
        assert!(!parsed.approves(Path::new("/p/x.md"), &Digest::of(b"changed")));
        assert!(!parsed.approves(Path::new("/q/x.md"), &digest));
        assert_eq!(Approval::parse(b"not json"), None);
        assert_eq!(
            Approval::parse(br#"{"version":2,"path":"/p","sha256":"x"}"#),
            None
        );
        assert_eq!(
            Approval::parse(br#"{"version":1,"path":"/p","sha256":"x","all":true}"#),
            None
        );
    }

    #[test]
    fn only_repository_definitions_are_untrusted() {
        assert!(Source::Registry.trusted());
        assert!(Source::Folder.trusted());
        assert!(!Source::Repository.trusted());
        assert!(TrustState::Approved.may_start());
        assert!(!TrustState::Changed.may_start());
        assert!(!TrustState::NotApproved.may_start());
    }
}
