//! `acp-host agents --json`: our agent table ([`crate::registry`]) and the cached ACP Registry
//! ([`crate::acp_registry`]) side by side, each registry entry with the agent of ours it relates
//! to (one whose name shadows its id, one whose ACP command falls back to it).

use serde::Serialize;

use crate::acp_registry::{Choice, Manifest};
use crate::registry::{self, AgentAvailability, AgentSpec, SyncTarget};

/// `acp-host agents --json`: every known agent as this host sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentListing {
    pub agents: Vec<AgentRow>,
    /// The cached ACP Registry's agents (`acp-host agents --refresh`); `None` when none is
    /// cached.
    pub registry: Option<RegistryListing>,
}

/// One agent of the listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRow {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub summary: &'static str,
    /// Whether `sync` counts the agent as installed (see `availability`).
    pub installed: bool,
    pub availability: AgentAvailability,
    /// Where `sync` writes, when the agent takes subagent definitions.
    pub sync: Option<SyncTarget>,
    /// The ACP launch command line, when the agent speaks ACP.
    pub acp_command: Option<&'static [&'static str]>,
    /// Whether `run --agent NAME` finds the ACP command's program; `None` without one.
    pub acp_command_found: Option<bool>,
    /// How to install the ACP command.
    pub install: Option<&'static str>,
}

impl AgentRow {
    /// The row of `spec`, from its availability and whether its ACP program was found.
    #[must_use]
    pub fn new(spec: &'static AgentSpec, availability: AgentAvailability, found: bool) -> Self {
        AgentRow {
            name: spec.name,
            aliases: spec.aliases,
            summary: spec.summary,
            installed: availability.is_installed(),
            availability,
            sync: spec.sync,
            acp_command: spec.acp_command,
            acp_command_found: spec.acp_command.is_some().then_some(found),
            install: spec.install,
        }
    }
}

/// `acp-host agents --json`: the cached ACP Registry beside our own table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryListing {
    /// The path or URL the registry was read from.
    pub source: String,
    /// When it was read (RFC 3339).
    pub fetched_at: String,
    pub agents: Vec<RegistryRow>,
}

/// One agent of the registry, as `run --agent ID` would start it here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryRow {
    pub id: String,
    pub name: String,
    pub version: String,
    pub description: String,
    /// `binary`, `npx` or `uvx`: what runs the agent on this platform; `None` when nothing does.
    pub distribution: Option<String>,
    /// The command line: the program inside the archive (relative to its folder) for a binary,
    /// the `npx` / `uvx` line for a package; empty when nothing runs the agent here.
    pub command: Vec<String>,
    /// Whether the binary is installed in the cache already (a run then needs no network).
    pub cached: bool,
    /// Our table's agent that `--agent ID` names first, when the id is also one of its names.
    pub shadowed_by: Option<String>,
    /// Our table's agent whose ACP command falls back to this entry when it is not installed
    /// (`protocol::registry::REGISTRY_IDS`).
    pub linked_from: Option<String>,
}

impl RegistryRow {
    /// The row of `manifest` on `platform`; `cached`: whether its binary is in the cache.
    #[must_use]
    pub fn new(manifest: &Manifest, platform: Option<&str>, cached: bool) -> Self {
        let choice = manifest.choose(platform);
        let command = match choice {
            Some(Choice::Binary { target, .. }) => std::iter::once(target.cmd.clone())
                .chain(target.args.iter().cloned())
                .collect(),
            Some(choice) => choice.package_command().unwrap_or_default(),
            None => Vec::new(),
        };
        RegistryRow {
            id: manifest.id.clone(),
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            description: manifest.description.clone(),
            distribution: choice.map(|choice| choice.kind().to_owned()),
            command,
            cached: cached && matches!(choice, Some(Choice::Binary { .. })),
            shadowed_by: registry::find(&manifest.id).map(|spec| spec.name.to_owned()),
            linked_from: registry::linked_to_registry(&manifest.id).map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acp_registry::Registry;
    use crate::registry::{AGENTS, find};

    #[test]
    fn a_listing_row_says_found_only_for_an_agent_with_an_acp_command() {
        let codex = find("codex").unwrap();
        let row = AgentRow::new(codex, AgentAvailability::OnPath("codex".into()), true);
        assert_eq!(row.name, "codex");
        assert!(row.installed);
        assert_eq!(row.acp_command, Some(&["codex-acp"][..]));
        assert_eq!(row.acp_command_found, Some(true));
        assert_eq!(
            AgentRow::new(codex, AgentAvailability::NotInstalled, false).acp_command_found,
            Some(false)
        );
        let without = AGENTS
            .iter()
            .find(|spec| spec.acp_command.is_none())
            .unwrap();
        let row = AgentRow::new(without, AgentAvailability::NotInstalled, true);
        assert!(!row.installed);
        assert_eq!(row.acp_command_found, None, "{}: no ACP command", row.name);
    }

    #[test]
    fn a_registry_row_shows_what_runs_here_and_how_it_relates_to_our_table() {
        let registry = registry_of(CODEX);
        let codex = registry.find("codex-acp").unwrap();
        let row = RegistryRow::new(codex, Some("linux-x86_64"), true);
        assert_eq!(row.id, "codex-acp");
        assert_eq!(
            (row.name.as_str(), row.version.as_str()),
            ("Codex CLI", "0.9.2")
        );
        assert_eq!(row.distribution.as_deref(), Some("binary"));
        assert_eq!(row.command, ["./codex-acp"]);
        assert!(row.cached);
        assert_eq!(row.shadowed_by, None);
        assert_eq!(row.linked_from.as_deref(), Some("codex"));
        let mac = RegistryRow::new(codex, Some("darwin-aarch64"), false);
        assert_eq!(mac.command, ["./codex-acp", "acp"]);
        assert!(!mac.cached);
        let npx = RegistryRow::new(codex, Some("linux-aarch64"), true);
        assert_eq!(npx.distribution.as_deref(), Some("npx"));
        assert_eq!(
            npx.command,
            ["npx", "--yes", "@zed-industries/codex-acp@0.9.2"]
        );
        assert!(!npx.cached, "only a binary is cached");

        let gemini = registry_of(
            r#"{"id": "gemini", "name": "Gemini", "version": "1.0.0", "description": "d",
            "distribution": {"binary": {"windows-x86_64": {"archive": "https://x/g.zip", "cmd": "g.exe"}}}}"#,
        );
        let row = RegistryRow::new(gemini.find("gemini").unwrap(), Some("linux-x86_64"), false);
        assert_eq!(row.distribution, None, "nothing runs it on this platform");
        assert!(row.command.is_empty());
        assert_eq!(
            row.shadowed_by.as_deref(),
            Some("gemini"),
            "our table names it first"
        );
        assert_eq!(row.linked_from.as_deref(), Some("gemini"));
    }

    fn registry_of(agents: &str) -> Registry {
        Registry::parse(
            format!(r#"{{"version": "1.0.0", "agents": [{agents}], "extensions": []}}"#).as_bytes(),
            "test.json",
        )
        .unwrap()
    }

    const CODEX: &str = r#"{"id": "codex-acp", "name": "Codex CLI", "version": "0.9.2",
        "description": "d", "distribution": {"binary": {
            "linux-x86_64": {"archive": "https://x/codex.tar.gz", "cmd": "./codex-acp"},
            "darwin-aarch64": {"archive": "https://x/codex-mac.tar.gz", "cmd": "./codex-acp", "args": ["acp"]}},
          "npx": {"package": "@zed-industries/codex-acp@0.9.2"}}}"#;
}
