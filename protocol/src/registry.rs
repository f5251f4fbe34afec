//! The agent registry: every agent this project knows, how to launch it over ACP (when it can be),
//! where `sync` writes its subagent definitions, and how to tell whether it is installed.
//!
//! Invariants: `run` and `sync` resolve agents only here; availability is decided by a
//! pure function over facts the caller gathered (binaries on PATH, folders under $HOME), so it is
//! unit-tested without touching the machine. Everything `sync` knows about an agent (its format, its
//! paths, the options its definitions may carry and their types, the switch that disables its
//! subagents) is data in [`AGENTS`]; the sync planner and the definition validator read it here.

use serde::Serialize;

use OptionKind::{Bool, List, OneOf, PositiveInt, StringOrList, StringOrTable};
// `String` would shadow the std type in this module.
const STRING: OptionKind = OptionKind::String;

/// The on-disk format `sync` renders for an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetFormat {
    /// One Markdown file per subagent, YAML frontmatter (claude-code, opencode, copilot, agy, grok, pi).
    Markdown(Frontmatter),
    /// One TOML file per subagent (codex).
    CodexToml,
    /// One shared YAML list, one item per subagent (dsh `.dsh/cordis.patch.yml`).
    DshShared,
}

/// How the YAML frontmatter of a Markdown target orders its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Frontmatter {
    /// `name`, `description`, then the options sorted by key (claude-code, agy, grok, pi).
    NameDescriptionOptions,
    /// `description`, `mode: "subagent"`, then the options sorted by key (opencode).
    DescriptionModeOptions,
    /// Every key sorted, `name` defaulting to the subagent name (github-copilot).
    AllSorted,
}

/// The type an agent option must have in a canonical definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "type", content = "values")]
pub enum OptionKind {
    /// A non-empty string.
    String,
    /// `true` or `false`.
    Bool,
    /// A list of non-empty strings.
    List,
    /// A non-empty string or a list of them; a string becomes a one-item list.
    StringOrList,
    /// A non-empty string or a table (rendered as inline JSON).
    StringOrTable,
    /// An integer >= 1 (a boolean or a quoted number is refused).
    PositiveInt,
    /// One of the listed strings.
    OneOf(&'static [&'static str]),
}

impl OptionKind {
    /// How the kind is named in error messages and `acp-host agents`.
    #[must_use]
    pub fn describe(self) -> String {
        match self {
            Self::String => "a non-empty string".to_owned(),
            Self::Bool => "true or false".to_owned(),
            Self::List => "a list of non-empty strings".to_owned(),
            Self::StringOrList => "a non-empty string or a list of them".to_owned(),
            Self::StringOrTable => "a non-empty string or a table".to_owned(),
            Self::PositiveInt => "a positive integer (unquoted)".to_owned(),
            Self::OneOf(values) => format!("one of: {}", values.join(", ")),
        }
    }
}

/// One option a definition may set for an agent (`codex: {model: "o3"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OptionSpec {
    pub name: &'static str,
    pub kind: OptionKind,
}

const fn opt(name: &'static str, kind: OptionKind) -> OptionSpec {
    OptionSpec { name, kind }
}

/// A boolean in a TOML config file under $HOME that, when `false`, disables the agent's subagents
/// (codex: `[agents] enabled = false` in `.codex/config.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSwitch {
    /// Relative to $HOME.
    pub file: &'static str,
    pub table: &'static str,
    pub key: &'static str,
}

/// Why a [`ConfigSwitch`] could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "~/{file} is not valid TOML ({message}); fix it so acp-host can tell whether subagents are enabled"
)]
pub struct ConfigSwitchError {
    pub file: &'static str,
    pub message: String,
}

impl ConfigSwitch {
    /// Whether the config file's contents disable subagents. A missing table or key leaves them
    /// enabled; a value that is not a boolean counts as enabled too (the agent decides, not us).
    pub fn disables(&self, contents: &str) -> Result<bool, ConfigSwitchError> {
        let table: toml::Table =
            contents
                .parse()
                .map_err(|e: toml::de::Error| ConfigSwitchError {
                    file: self.file,
                    message: e.message().to_owned(),
                })?;
        Ok(table
            .get(self.table)
            .and_then(|t| t.get(self.key))
            .and_then(toml::Value::as_bool)
            == Some(false))
    }
}

/// Where definitions go for one scope. `{name}` is replaced with the subagent name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncTarget {
    pub format: TargetFormat,
    /// Relative to $HOME.
    pub user_path: &'static str,
    /// Relative to the project root; `None` when the agent has no project scope.
    pub project_path: Option<&'static str>,
    /// A file that must exist under $HOME for the agent to accept subagents (pi's extension).
    pub requires: Option<&'static str>,
    /// The options a definition may set for this agent, sorted by name.
    pub options: &'static [OptionSpec],
    /// A config switch that disables the agent's subagents; syncing to it then is an error.
    pub switch: Option<ConfigSwitch>,
}

impl SyncTarget {
    /// The path template for a scope (`None`: the agent has no project scope).
    #[must_use]
    pub fn template(&self, scope: Scope) -> Option<&'static str> {
        match scope {
            Scope::User => Some(self.user_path),
            Scope::Project => self.project_path,
        }
    }

    /// Looks an option up by name.
    #[must_use]
    pub fn option(&self, name: &str) -> Option<&'static OptionSpec> {
        self.options.iter().find(|o| o.name == name)
    }
}

/// Where `sync` writes: under $HOME (`user`) or under the project root (`project`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    User,
    Project,
}

/// One known agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
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
    /// How to install the ACP command, shown when it cannot be started.
    pub install: Option<&'static str>,
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
        install: Some("build it beside acp-host: cargo build --workspace"),
    },
    AgentSpec {
        name: "claude-code",
        aliases: &["claude"],
        binaries: &["claude", "claude-code-acp"],
        marker_dirs: &[".claude"],
        acp_command: Some(&["claude-code-acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".claude/agents/{name}.md",
            project_path: Some(".claude/agents/{name}.md"),
            requires: None,
            options: &[opt("effort", STRING), opt("model", STRING)],
            switch: None,
        }),
        summary: "Claude Code (ACP via claude-code-acp)",
        install: Some("npm install -g @zed-industries/claude-code-acp"),
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
            options: &[opt("model", STRING), opt("model_reasoning_effort", STRING)],
            switch: Some(ConfigSwitch {
                file: ".codex/config.toml",
                table: "agents",
                key: "enabled",
            }),
        }),
        summary: "OpenAI Codex CLI (ACP via codex-acp)",
        install: Some("npm install -g @zed-industries/codex-acp"),
    },
    AgentSpec {
        name: "gemini",
        aliases: &[],
        binaries: &["gemini"],
        marker_dirs: &[],
        acp_command: Some(&["gemini", "--acp"]),
        sync: None,
        summary: "Gemini CLI (ACP via gemini --acp)",
        install: Some("npm install -g @google/gemini-cli"),
    },
    AgentSpec {
        name: "opencode",
        aliases: &[],
        binaries: &["opencode"],
        marker_dirs: &[".config/opencode"],
        acp_command: Some(&["opencode", "acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::DescriptionModeOptions),
            user_path: ".config/opencode/agents/{name}.md",
            project_path: Some(".opencode/agents/{name}.md"),
            requires: None,
            options: &[opt("model", STRING)],
            switch: None,
        }),
        summary: "OpenCode (ACP via opencode acp)",
        install: Some("npm install -g opencode-ai"),
    },
    AgentSpec {
        name: "github-copilot",
        aliases: &["copilot"],
        binaries: &["copilot"],
        marker_dirs: &[".copilot"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::AllSorted),
            user_path: ".copilot/agents/{name}.agent.md",
            project_path: Some(".github/agents/{name}.agent.md"),
            requires: None,
            options: &[
                opt("description", STRING),
                opt("disable-model-invocation", Bool),
                opt("model", STRING),
                opt("name", STRING),
                opt("target", STRING),
                opt("tools", List),
                opt("user-invocable", Bool),
            ],
            switch: None,
        }),
        summary: "GitHub Copilot CLI",
        install: None,
    },
    AgentSpec {
        name: "agy",
        aliases: &["antigravity"],
        binaries: &["agy"],
        marker_dirs: &[".gemini/config"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".gemini/config/agents/{name}/agent.md",
            project_path: Some(".agents/agents/{name}/agent.md"),
            requires: None,
            options: &[opt("model", STRING), opt("tools", StringOrList)],
            switch: None,
        }),
        summary: "Antigravity CLI",
        install: None,
    },
    AgentSpec {
        name: "grok",
        aliases: &[],
        binaries: &["grok"],
        marker_dirs: &[".grok"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".grok/agents/{name}.md",
            project_path: None,
            requires: None,
            options: &[
                opt("agents_md", Bool),
                opt("mcpInheritance", StringOrTable),
                opt("model", STRING),
                opt("permission_mode", STRING),
                opt("prompt_mode", STRING),
                opt("reasoning_effort", STRING),
                opt("skills", List),
                opt("tools", List),
            ],
            switch: None,
        }),
        summary: "Grok CLI",
        install: None,
    },
    AgentSpec {
        name: "pi",
        aliases: &[],
        binaries: &["pi"],
        marker_dirs: &[".pi"],
        acp_command: None,
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".pi/agent/agents/{name}.md",
            project_path: None,
            requires: Some(".pi/agent/extensions/subagent/index.ts"),
            options: &[opt("model", STRING), opt("tools", StringOrList)],
            switch: None,
        }),
        summary: "pi coding agent (needs its subagent extension)",
        install: None,
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
            options: &[
                opt("backgroundMode", OneOf(&["one-shot", "continuable"])),
                opt("maxTokens", PositiveInt),
                opt("model", STRING),
                opt("provider", STRING),
                opt("tools", StringOrList),
            ],
            switch: None,
        }),
        summary: "DeepSeek Harness (shared .dsh/cordis.patch.yml)",
        install: None,
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

/// The agents that take subagent definitions, each with its target, in registry order: the one
/// answer to "which agents does `sync` write to" (definitions, `--agent`, `--force`, the planner).
pub fn sync_agents() -> impl Iterator<Item = (&'static AgentSpec, SyncTarget)> {
    AGENTS
        .iter()
        .filter_map(|spec| spec.sync.map(|target| (spec, target)))
}

/// A sync agent by canonical name (definitions and `--force` use canonical names).
#[must_use]
pub fn find_sync(name: &str) -> Option<(&'static AgentSpec, SyncTarget)> {
    sync_agents().find(|(spec, _)| spec.name == name)
}

/// The canonical names of the sync agents, for error messages ("sync agents: ...").
#[must_use]
pub fn sync_agent_names() -> Vec<&'static str> {
    sync_agents().map(|(spec, _)| spec.name).collect()
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

    #[test]
    fn option_tables_are_sorted_and_unique() {
        for agent in AGENTS {
            if let Some(target) = agent.sync {
                let names: Vec<_> = target.options.iter().map(|o| o.name).collect();
                let mut sorted = names.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(names, sorted, "{}", agent.name);
            }
        }
    }

    #[test]
    fn codex_switch() {
        let switch = find("codex").unwrap().sync.unwrap().switch.unwrap();
        assert!(switch.disables("[agents]\nenabled = false\n").unwrap());
        assert!(!switch.disables("[agents]\nenabled = true\n").unwrap());
        assert!(!switch.disables("model = \"o3\"\n").unwrap());
        assert!(switch.disables("[agents\n").is_err());
    }
}
