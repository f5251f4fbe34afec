//! The agent registry: every agent this project knows, how to launch it over ACP (when it can be),
//! where `sync` writes its subagent definitions, and how to tell whether it is installed.
//!
//! Invariants: `run` and `sync` resolve agents only here (INV-SUB-05); availability is decided by a
//! pure function over facts the caller gathered (binaries on PATH, folders under $HOME), so it is
//! unit-tested without touching the machine.

use serde::Serialize;

/// The on-disk format `sync` renders for an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetFormat {
    /// One Markdown file per subagent, YAML frontmatter (claude-code, opencode, copilot, agy, grok, pi).
    Markdown,
    /// One TOML file per subagent (codex).
    CodexToml,
    /// One shared YAML list, one item per subagent (dsh `.dsh/cordis.patch.yml`).
    DshShared,
}

/// Where definitions go for one scope. `{name}` is replaced with the subagent name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncTarget {
    pub format: TargetFormat,
    /// Relative to $HOME.
    pub user_path: &'static str,
    /// Relative to the project root; `None` when the agent has no project scope.
    pub project_path: Option<&'static str>,
    /// A file that must exist under $HOME for the agent to accept subagents (pi's extension).
    pub requires: Option<&'static str>,
}

/// One known agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AgentSpec {
    /// The canonical name used by `--agent`, definitions' `agents:` lists and `--force`.
    pub name: &'static str,
    /// Other names accepted by `run --agent`.
    pub aliases: &'static [&'static str],
    /// Executables whose presence on PATH means the agent is installed.
    pub binaries: &'static [&'static str],
    /// Folders under $HOME whose presence means the agent is installed.
    pub marker_dirs: &'static [&'static str],
    /// The ACP launch command line, when the agent speaks ACP.
    pub acp_command: Option<&'static [&'static str]>,
    /// Where `sync` writes, when the agent takes subagent definitions.
    pub sync: Option<SyncTarget>,
    /// One line for `acp-host agents` and `--help`.
    pub summary: &'static str,
}

/// The name of our own agent, launched from the sibling binary of `acp-host`.
pub const ACP_CHILD: &str = "acp-child";

/// Every known agent, in display order.
pub const AGENTS: &[AgentSpec] = &[
    AgentSpec {
        name: ACP_CHILD,
        aliases: &[],
        binaries: &["acp-child"],
        marker_dirs: &[],
        acp_command: Some(&["acp-child"]),
        sync: None,
        summary: "this project's agent (offline backend unless a model is configured)",
    },
    AgentSpec {
        name: "claude-code",
        aliases: &["claude"],
        binaries: &["claude", "claude-code-acp"],
        marker_dirs: &[".claude"],
        acp_command: Some(&["claude-code-acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".claude/agents/{name}.md",
            project_path: Some(".claude/agents/{name}.md"),
            requires: None,
        }),
        summary: "Claude Code (ACP via claude-code-acp)",
    },
    AgentSpec {
        name: "codex",
        aliases: &[],
        binaries: &["codex", "codex-acp"],
        marker_dirs: &[".codex"],
        acp_command: Some(&["codex-acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::CodexToml,
            user_path: ".codex/agents/{name}.toml",
            project_path: Some(".codex/agents/{name}.toml"),
            requires: None,
        }),
        summary: "OpenAI Codex CLI (ACP via codex-acp)",
    },
    AgentSpec {
        name: "gemini",
        aliases: &[],
        binaries: &["gemini"],
        marker_dirs: &[],
        acp_command: Some(&["gemini", "--acp"]),
        sync: None,
        summary: "Gemini CLI (ACP via gemini --acp)",
    },
    AgentSpec {
        name: "opencode",
        aliases: &[],
        binaries: &["opencode"],
        marker_dirs: &[".config/opencode"],
        acp_command: Some(&["opencode", "acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".config/opencode/agents/{name}.md",
            project_path: Some(".opencode/agents/{name}.md"),
            requires: None,
        }),
        summary: "OpenCode (ACP via opencode acp)",
    },
    AgentSpec {
        name: "github-copilot",
        aliases: &["copilot"],
        binaries: &["copilot"],
        marker_dirs: &[".copilot"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".copilot/agents/{name}.agent.md",
            project_path: Some(".github/agents/{name}.agent.md"),
            requires: None,
        }),
        summary: "GitHub Copilot CLI",
    },
    AgentSpec {
        name: "agy",
        aliases: &["antigravity"],
        binaries: &["agy"],
        marker_dirs: &[".gemini/config"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".gemini/config/agents/{name}/agent.md",
            project_path: Some(".agents/agents/{name}/agent.md"),
            requires: None,
        }),
        summary: "Antigravity CLI",
    },
    AgentSpec {
        name: "grok",
        aliases: &[],
        binaries: &["grok"],
        marker_dirs: &[".grok"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".grok/agents/{name}.md",
            project_path: None,
            requires: None,
        }),
        summary: "Grok CLI",
    },
    AgentSpec {
        name: "pi",
        aliases: &[],
        binaries: &["pi"],
        marker_dirs: &[".pi"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown,
            user_path: ".pi/agent/agents/{name}.md",
            project_path: None,
            requires: Some(".pi/agent/extensions/subagent/index.ts"),
        }),
        summary: "pi coding agent (needs its subagent extension)",
    },
    AgentSpec {
        name: "dsh",
        aliases: &[],
        binaries: &["dsh"],
        marker_dirs: &[".dsh"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::DshShared,
            user_path: ".dsh/cordis.patch.yml",
            project_path: None,
            requires: None,
        }),
        summary: "DeepSeek Harness (shared .dsh/cordis.patch.yml)",
    },
];

/// Looks an agent up by canonical name or alias.
#[must_use]
pub fn find(name: &str) -> Option<&'static AgentSpec> {
    AGENTS
        .iter()
        .find(|a| a.name == name || a.aliases.contains(&name))
}

/// Looks an agent up by canonical name only (definitions and `--force` use canonical names).
#[must_use]
pub fn find_canonical(name: &str) -> Option<&'static AgentSpec> {
    AGENTS.iter().find(|a| a.name == name)
}

/// The canonical names, for error messages ("known agents: ...").
#[must_use]
pub fn names() -> Vec<&'static str> {
    AGENTS.iter().map(|a| a.name).collect()
}

/// Why an agent counts as installed, or that it does not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "evidence")]
pub enum AgentAvailability {
    /// A binary was found on PATH (the binary's name).
    OnPath(String),
    /// A marker folder exists under $HOME (the folder, relative to $HOME).
    MarkerDir(String),
    NotInstalled,
}

impl AgentAvailability {
    #[must_use]
    pub fn is_installed(&self) -> bool {
        !matches!(self, AgentAvailability::NotInstalled)
    }
}

/// Decides availability from facts gathered by the caller: `on_path(binary)` and
/// `home_dir_exists(relative folder)`.
pub fn availability(
    spec: &AgentSpec,
    on_path: impl Fn(&str) -> bool,
    home_dir_exists: impl Fn(&str) -> bool,
) -> AgentAvailability {
    if let Some(bin) = spec.binaries.iter().find(|b| on_path(b)) {
        return AgentAvailability::OnPath((*bin).to_owned());
    }
    if let Some(dir) = spec.marker_dirs.iter().find(|d| home_dir_exists(d)) {
        return AgentAvailability::MarkerDir((*dir).to_owned());
    }
    AgentAvailability::NotInstalled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for agent in AGENTS {
            assert!(seen.insert(agent.name), "duplicate {}", agent.name);
            for alias in agent.aliases {
                assert!(seen.insert(alias), "duplicate alias {alias}");
            }
        }
    }

    #[test]
    fn lookups() {
        assert_eq!(find("claude").unwrap().name, "claude-code");
        assert!(find_canonical("claude").is_none());
        assert_eq!(
            find("acp-child").unwrap().acp_command,
            Some(&["acp-child"][..])
        );
        assert!(find("nope").is_none());
    }

    #[test]
    fn availability_prefers_path_then_marker() {
        let codex = find("codex").unwrap();
        assert_eq!(
            availability(codex, |b| b == "codex", |_| true),
            AgentAvailability::OnPath("codex".into())
        );
        assert_eq!(
            availability(codex, |_| false, |d| d == ".codex"),
            AgentAvailability::MarkerDir(".codex".into())
        );
        assert!(!availability(codex, |_| false, |_| false).is_installed());
    }
}
