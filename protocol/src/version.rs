//! What `--version` says, for both binaries: the package version, the git commit the binary was
//! built from (when the build knew it) and the ACP protocol version the workspace speaks.
//!
//! Invariants: [`ACP_PROTOCOL_VERSION`] is the one version acp-host asks for in `initialize` and
//! acp-child answers with; the text is built here only, so the two binaries say it alike.

use agent_client_protocol_schema::ProtocolVersion;

/// The ACP protocol version acp-host asks for and acp-child answers with.
pub const ACP_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V1;

/// The `--version` text after the program name: `0.1.0 (commit 1a2b3c4d5e6f, ACP protocol
/// version 1)`, without the commit when it is not known.
#[must_use]
pub fn describe(version: &str, commit: Option<&str>) -> String {
    let protocol = ACP_PROTOCOL_VERSION.as_u16();
    match commit.filter(|commit| !commit.is_empty()) {
        Some(commit) => format!("{version} (commit {commit}, ACP protocol version {protocol})"),
        None => format!("{version} (ACP protocol version {protocol})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_is_said_only_when_known() {
        assert_eq!(
            describe("0.1.0", Some("1a2b3c4d5e6f")),
            "0.1.0 (commit 1a2b3c4d5e6f, ACP protocol version 1)"
        );
        assert_eq!(describe("0.1.0", None), "0.1.0 (ACP protocol version 1)");
        assert_eq!(
            describe("0.1.0", Some("")),
            "0.1.0 (ACP protocol version 1)"
        );
    }
}
