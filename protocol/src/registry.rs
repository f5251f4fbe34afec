//! The agent registry: every agent this project knows, how to launch it over ACP (when it can be),
//! where `sync` writes its subagent definitions, and how to tell whether it is installed.
//!
//! Invariants: `run`, `agents` and `sync` resolve agents only here; what `--agent` names
//! ([`launch`]), where its program is found ([`locate`], with the one sibling rule
//! [`looked_up_beside_host`]) and whether an agent is installed ([`availability`]) are pure
//! functions over facts the caller gathered (binaries on PATH or beside acp-host, folders under
//! $HOME), so they are unit-tested without touching the machine. Everything `sync` knows about
//! an agent (its format, its paths, the options its definitions may carry and their types, the
//! switch that disables its subagents) is data in [`AGENTS`]; the sync planner and the definition
//! validator read it here.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::env_vars;

use OptionKind::{
    Bool, DepthCap, List, OneOf, PositiveInt, StringOrList, StringOrListAsWritten, StringOrTable,
};
// `String` would shadow the std type in this module.
const STRING: OptionKind = OptionKind::String;

/// The on-disk format `sync` renders for an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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
    /// A non-empty string or a list of them, each kept as written: for an agent that reads a
    /// string its own way (Claude Code's `tools: Read, Grep`, Factory Droid's `tools: read-only`).
    StringOrListAsWritten,
    /// A non-empty string or a table (rendered as inline JSON).
    StringOrTable,
    /// An integer >= 1 (a boolean or a quoted number is refused).
    PositiveInt,
    /// One of the listed strings.
    OneOf(&'static [&'static str]),
    /// A delegation depth cap: a whole number (0 and up), or `provider-managed` (the provider,
    /// out of process, keeps its own).
    DepthCap,
}

/// The [`OptionKind::DepthCap`] value that leaves the cap to the provider.
pub const PROVIDER_MANAGED: &str = "provider-managed";

impl OptionKind {
    /// How the kind is named in error messages and `acp-host agents`.
    #[must_use]
    pub fn describe(self) -> String {
        match self {
            Self::String => "a non-empty string".to_owned(),
            Self::Bool => "true or false".to_owned(),
            Self::List => "a list of non-empty strings".to_owned(),
            Self::StringOrList => "a non-empty string or a list of them".to_owned(),
            Self::StringOrListAsWritten => {
                "a non-empty string (kept as written) or a list of them".to_owned()
            }
            Self::StringOrTable => "a non-empty string or a table".to_owned(),
            Self::PositiveInt => "a positive integer (unquoted)".to_owned(),
            Self::OneOf(values) => format!("one of: {}", values.join(", ")),
            Self::DepthCap => format!("a whole number (unquoted) or {PROVIDER_MANAGED}"),
        }
    }
}

/// One option a definition may set for an agent (`codex: {model: "o3"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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

/// A field most agents have in some form, each under its own name (docs/sync.md, "Fields
/// across targets"): what `sync --check` reports a target drops.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Field {
    /// The model the subagent runs on.
    Model,
    /// Which tools it may use (an allow or deny list).
    Tools,
    /// It may not change files.
    Readonly,
    /// It runs in the background, the caller not waiting for it.
    Background,
}

impl Field {
    /// Every field, in display order.
    pub const ALL: [Field; 4] = [
        Field::Model,
        Field::Tools,
        Field::Readonly,
        Field::Background,
    ];

    /// How the field is named in messages.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Model => "model",
            Field::Tools => "tools",
            Field::Readonly => "readonly",
            Field::Background => "background",
        }
    }
}

/// Which of an agent's options holds each [`Field`]; `None`: the agent has no equivalent, and a
/// definition's value for it is dropped from that agent's file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Equivalents {
    pub model: Option<&'static str>,
    pub tools: Option<&'static str>,
    pub readonly: Option<&'static str>,
    pub background: Option<&'static str>,
}

impl Equivalents {
    /// The agent's option that holds `field`, if it has one.
    #[must_use]
    pub fn get(&self, field: Field) -> Option<&'static str> {
        match field {
            Field::Model => self.model,
            Field::Tools => self.tools,
            Field::Readonly => self.readonly,
            Field::Background => self.background,
        }
    }
}

/// `model` and nothing else (most targets).
const MODEL_ONLY: Equivalents = Equivalents {
    model: Some("model"),
    tools: None,
    readonly: None,
    background: None,
};

/// `model` and `tools`.
const MODEL_AND_TOOLS: Equivalents = Equivalents {
    tools: Some("tools"),
    ..MODEL_ONLY
};

/// Where definitions go for one scope. `{name}` is replaced with the subagent name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
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
    /// Which options hold the fields most agents share.
    pub equivalents: Equivalents,
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
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
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
    /// The variables the agent reads its API key from: the auth-required hint names the ones
    /// acp-host withheld.
    pub keys: &'static [&'static str],
}

/// The name of our own agent, launched from the sibling binary of `acp-host`.
pub const ACP_CHILD: &str = "acp-child";

/// Most names the auth-required hint lists when nothing points at the agent's own key.
const MAX_KEY_GUESSES: usize = 3;

/// The withheld variables most likely to hold `agent`'s API key, for the auth-required hint:
/// the agent's known key variables (`agent` as named with `--agent`) when any was withheld, else
/// the withheld names that look like an API key or token (`*API_KEY*`, `*APIKEY*`, `*TOKEN`),
/// at most a few, in the order given.
#[must_use]
pub fn likely_keys<'a>(agent: &str, withheld: &'a [String]) -> Vec<&'a str> {
    let known = find(agent).map_or(&[][..], |spec| spec.keys);
    let own: Vec<&str> = withheld
        .iter()
        .map(String::as_str)
        .filter(|name| known.contains(name))
        .collect();
    if !own.is_empty() {
        return own;
    }
    withheld
        .iter()
        .map(String::as_str)
        .filter(|name| {
            let upper = name.to_ascii_uppercase();
            upper.contains("API_KEY") || upper.contains("APIKEY") || upper.ends_with("TOKEN")
        })
        .take(MAX_KEY_GUESSES)
        .collect()
}

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
        keys: &[
            env_vars::ACP_CHILD_API_KEY,
            env_vars::DEEPSEEK_API_KEY,
            env_vars::OPENAI_API_KEY,
        ],
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
            options: &[
                opt("effort", STRING),
                opt("model", STRING),
                opt("tools", StringOrListAsWritten),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Claude Code (ACP via claude-code-acp)",
        install: Some("npm install -g @zed-industries/claude-code-acp"),
        keys: &["ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"],
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
            equivalents: MODEL_ONLY,
        }),
        summary: "OpenAI Codex CLI (ACP via codex-acp)",
        install: Some("npm install -g @zed-industries/codex-acp"),
        keys: &["OPENAI_API_KEY", "CODEX_API_KEY"],
    },
    AgentSpec {
        name: "gemini",
        aliases: &["gemini-cli"],
        binaries: &["gemini"],
        marker_dirs: &[".gemini"],
        acp_command: Some(&["gemini", "--acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".gemini/agents/{name}.md",
            project_path: Some(".gemini/agents/{name}.md"),
            requires: None,
            options: &[
                opt("max_turns", PositiveInt),
                opt("model", STRING),
                opt("timeout_mins", PositiveInt),
                opt("tools", List),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Gemini CLI (ACP via gemini --acp)",
        install: Some("npm install -g @google/gemini-cli"),
        keys: &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
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
            equivalents: MODEL_ONLY,
        }),
        summary: "OpenCode (ACP via opencode acp)",
        install: Some("npm install -g opencode-ai"),
        keys: &[],
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
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "GitHub Copilot CLI",
        install: None,
        keys: &[],
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
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Antigravity CLI",
        install: None,
        keys: &[],
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
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Grok CLI",
        install: None,
        keys: &[],
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
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "pi coding agent (needs its subagent extension)",
        install: None,
        keys: &[],
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
                opt("denyTools", List),
                opt("maxDepth", DepthCap),
                opt("maxTokens", PositiveInt),
                opt("model", STRING),
                opt("provider", STRING),
                opt("providerHonoursDepth", Bool),
                opt("tools", StringOrList),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "DeepSeek Harness (shared .dsh/cordis.patch.yml)",
        install: None,
        keys: &[],
    },
    AgentSpec {
        name: "cursor",
        aliases: &["cursor-agent"],
        binaries: &["cursor-agent"],
        marker_dirs: &[".cursor"],
        acp_command: Some(&["cursor-agent", "acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".cursor/agents/{name}.md",
            project_path: Some(".cursor/agents/{name}.md"),
            requires: None,
            options: &[
                opt("is_background", Bool),
                opt("model", STRING),
                opt("readonly", Bool),
            ],
            switch: None,
            equivalents: Equivalents {
                readonly: Some("readonly"),
                background: Some("is_background"),
                ..MODEL_ONLY
            },
        }),
        summary: "Cursor (ACP via cursor-agent acp)",
        install: Some("curl https://cursor.com/install -fsS | bash"),
        keys: &["CURSOR_API_KEY"],
    },
    AgentSpec {
        name: "factory-droid",
        aliases: &["droid"],
        binaries: &["droid"],
        marker_dirs: &[".factory"],
        acp_command: Some(&["droid", "exec", "--output-format", "acp-daemon"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".factory/droids/{name}.md",
            project_path: Some(".factory/droids/{name}.md"),
            requires: None,
            options: &[
                opt("model", STRING),
                opt("reasoningEffort", STRING),
                opt("tools", StringOrListAsWritten),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Factory Droid (ACP via droid exec --output-format acp-daemon)",
        install: Some("npm install -g droid"),
        keys: &["FACTORY_API_KEY"],
    },
    AgentSpec {
        name: "kiro",
        aliases: &["kiro-cli"],
        binaries: &["kiro-cli"],
        marker_dirs: &[".kiro"],
        acp_command: Some(&["kiro-cli", "acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".kiro/agents/{name}.md",
            project_path: Some(".kiro/agents/{name}.md"),
            requires: None,
            options: &[
                opt("model", STRING),
                opt("tools", List),
                opt("welcomeMessage", STRING),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Kiro (ACP via kiro-cli acp)",
        install: Some("curl -fsSL https://cli.kiro.dev/install | bash"),
        keys: &[],
    },
    AgentSpec {
        name: "qwen-code",
        aliases: &["qwen"],
        binaries: &["qwen"],
        marker_dirs: &[".qwen"],
        acp_command: Some(&["qwen", "--acp"]),
        sync: Some(SyncTarget {
            format: TargetFormat::Markdown(Frontmatter::NameDescriptionOptions),
            user_path: ".qwen/agents/{name}.md",
            project_path: Some(".qwen/agents/{name}.md"),
            requires: None,
            options: &[
                opt(
                    "approvalMode",
                    OneOf(&["default", "plan", "auto-edit", "yolo", "bubble"]),
                ),
                opt("disallowedTools", List),
                opt("model", STRING),
                opt("tools", List),
            ],
            switch: None,
            equivalents: MODEL_AND_TOOLS,
        }),
        summary: "Qwen Code (ACP via qwen --acp)",
        install: Some("npm install -g @qwen-code/qwen-code"),
        keys: &["DASHSCOPE_API_KEY"],
    },
];

/// Our agents whose ACP command the official ACP Registry also distributes, with its id there
/// (`protocol::acp_registry`): when the command is not installed here, `run --agent NAME` starts
/// the cached registry's distribution of that id instead. The registry knows how to install and
/// launch them; this table keeps only what it does not say: which agents `sync` writes for and
/// in which format, marker folders, key variables, and short names (`claude`).
pub const REGISTRY_IDS: &[(&str, &str)] = &[
    ("claude-code", "claude-code-acp"),
    ("codex", "codex-acp"),
    ("gemini", "gemini"),
    ("opencode", "opencode"),
    ("cursor", "cursor"),
    ("factory-droid", "factory-droid"),
    ("kiro", "kiro"),
    ("qwen-code", "qwen-code"),
];

/// The ACP Registry id of our agent `name` (canonical), when it has one ([`REGISTRY_IDS`]).
#[must_use]
pub fn registry_id(name: &str) -> Option<&'static str> {
    REGISTRY_IDS
        .iter()
        .find(|(ours, _)| *ours == name)
        .map(|(_, id)| *id)
}

/// Our agent whose ACP command falls back to the registry's `id` ([`REGISTRY_IDS`]).
#[must_use]
pub fn linked_to_registry(id: &str) -> Option<&'static str> {
    REGISTRY_IDS
        .iter()
        .find(|(_, theirs)| *theirs == id)
        .map(|(ours, _)| *ours)
}

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case", tag = "state", content = "evidence")]
pub enum AgentAvailability {
    /// A binary was found on PATH (the binary's name).
    OnPath(String),
    /// A binary was found beside the acp-host binary (the binary's name; see
    /// [`looked_up_beside_host`]).
    BesideHost(String),
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

/// Decides availability from facts gathered by the caller: `locate(binary)` (see [`locate`]) and
/// `home_dir_exists(relative folder)`.
pub fn availability(
    spec: &AgentSpec,
    locate: impl Fn(&str) -> Location,
    home_dir_exists: impl Fn(&str) -> bool,
) -> AgentAvailability {
    availability_with(spec, &locate, &home_dir_exists)
}

/// [`availability`], compiled once (not once per caller's closures).
fn availability_with(
    spec: &AgentSpec,
    locate: &dyn Fn(&str) -> Location,
    home_dir_exists: &dyn Fn(&str) -> bool,
) -> AgentAvailability {
    for binary in spec.binaries {
        match locate(binary) {
            Location::OnPath(_) | Location::Given(_) => {
                return AgentAvailability::OnPath((*binary).to_owned());
            }
            Location::BesideHost(_) => return AgentAvailability::BesideHost((*binary).to_owned()),
            Location::NotFound => {}
        }
    }
    if let Some(dir) = spec.marker_dirs.iter().find(|d| home_dir_exists(d)) {
        return AgentAvailability::MarkerDir((*dir).to_owned());
    }
    AgentAvailability::NotInstalled
}

/// The agents that speak ACP (have a launch command), in display order.
pub fn acp_agents() -> impl Iterator<Item = &'static AgentSpec> {
    AGENTS.iter().filter(|a| a.acp_command.is_some())
}

/// The install command of the registry agent whose ACP program is `program`, if there is one.
#[must_use]
pub fn install_hint_for(program: &str) -> Option<&'static str> {
    acp_agents()
        .find(|a| a.acp_command.and_then(<[_]>::first) == Some(&program))
        .and_then(|a| a.install)
}

/// The one sibling rule: whether `program` is looked up beside the acp-host binary before PATH.
/// Only this project's own agent is: acp-host and acp-child are built and released together, so
/// the pair's own copy wins over whatever PATH holds. Every other program is found on PATH (as the
/// system would run it), so a stray file beside acp-host never changes what runs.
#[must_use]
pub fn looked_up_beside_host(program: &str) -> bool {
    program == ACP_CHILD
}

/// The names `--agent` takes for an agent that speaks ACP: each one's name, then its aliases.
pub fn acp_names() -> impl Iterator<Item = &'static str> {
    acp_agents().flat_map(|spec| std::iter::once(spec.name).chain(spec.aliases.iter().copied()))
}

/// Why `agent` cannot start here, its program (`program`, the first word of what it launches)
/// being found nowhere (`exists`: a file is at that path, but not an executable one), and what to
/// do: install it (with `install`, a registry agent's install command), fix the path or the
/// file's mode, or pick a name `acp-host agents` lists (the close ones suggested).
#[must_use]
pub fn not_found(agent: &str, program: &str, install: Option<&str>, exists: bool) -> String {
    if let Some(install) = install {
        return format!(
            "agent {agent} is not installed: {program} is not on PATH; install it (`{install}`), \
             or pass --agent with its full path"
        );
    }
    if program.contains('/') && exists {
        return format!(
            "agent {agent} cannot start: {program} is not an executable file; make it one \
             (`chmod +x {program}`) or fix the path"
        );
    }
    if program.contains('/') {
        return format!(
            "agent {agent} not found: no executable file at {program}; fix the path, or pass a \
             command on PATH"
        );
    }
    let close = crate::suggest::closest(program, acp_names());
    let hint = crate::suggest::did_you_mean(&close).map_or_else(String::new, |hint| hint + " ");
    format!(
        "agent {agent} not found: {program} is neither a known agent nor a program on PATH; \
         {hint}`acp-host agents` lists the known agents (install one, or pass a command on PATH \
         or its full path)"
    )
}

/// What `--agent` names, split into the program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// The registry agent named (by name or alias), when one was.
    pub spec: Option<&'static AgentSpec>,
    /// How to install the program, when it is a registry agent's ACP program (named directly or
    /// through a command line).
    pub install_hint: Option<&'static str>,
}

/// Why `--agent` names nothing that can be launched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("agent {agent} does not speak ACP; agents that do: {acp_agents}")]
    NotAcp {
        agent: String,
        /// The registry agents that do, comma-separated.
        acp_agents: String,
    },
    #[error("cannot parse --agent {agent:?}: {message}")]
    Unparsable { agent: String, message: String },
    #[error("--agent is empty (pass a registry name or a command line)")]
    Empty,
}

/// A registry name (or alias) launches its ACP command; anything else is a command line, split
/// shell-style.
pub fn launch(agent: &str) -> Result<Launch, LaunchError> {
    let spec = find(agent);
    let words: Vec<String> = match spec {
        Some(spec) => match spec.acp_command {
            Some(command) => command.iter().map(|w| (*w).to_owned()).collect(),
            None => {
                return Err(LaunchError::NotAcp {
                    agent: agent.to_owned(),
                    acp_agents: acp_agents().map(|a| a.name).collect::<Vec<_>>().join(", "),
                });
            }
        },
        None => shell_words::split(agent).map_err(|err| LaunchError::Unparsable {
            agent: agent.to_owned(),
            message: err.to_string(),
        })?,
    };
    let mut words = words.into_iter();
    let program = words.next().ok_or(LaunchError::Empty)?;
    Ok(Launch {
        install_hint: install_hint_for(&program),
        program,
        args: words.collect(),
        spec,
    })
}

/// Where the program of an agent command was found on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "where", content = "path")]
pub enum Location {
    /// Beside the acp-host binary (only for [`looked_up_beside_host`] programs).
    BesideHost(PathBuf),
    /// In a folder of PATH.
    OnPath(PathBuf),
    /// The command names a path (it contains a `/`) and an executable file is there.
    Given(PathBuf),
    /// Nowhere: spawning it will fail with "not found" (plus the install hint, when known).
    NotFound,
}

impl Location {
    #[must_use]
    pub fn is_found(&self) -> bool {
        !matches!(self, Location::NotFound)
    }

    /// How `agents` and messages say where it is.
    #[must_use]
    pub fn describe(&self) -> &'static str {
        match self {
            Location::BesideHost(_) => "beside acp-host",
            Location::OnPath(_) => "on PATH",
            Location::Given(_) => "at the given path",
            Location::NotFound => "not found",
        }
    }
}

/// Decides where `program` is found from facts the caller gathered: `beside_host(name)` (an
/// executable of that name beside acp-host), `on_path(name)` (the first executable of that name in
/// PATH) and `executable(path)`.
pub fn locate(
    program: &str,
    beside_host: impl Fn(&str) -> Option<PathBuf>,
    on_path: impl Fn(&str) -> Option<PathBuf>,
    executable: impl Fn(&Path) -> bool,
) -> Location {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return if executable(&path) {
            Location::Given(path)
        } else {
            Location::NotFound
        };
    }
    if looked_up_beside_host(program)
        && let Some(path) = beside_host(program)
    {
        return Location::BesideHost(path);
    }
    on_path(program).map_or(Location::NotFound, Location::OnPath)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_sync_options_are_the_table_its_definitions_are_checked_against() {
        let codex = find("codex").and_then(|spec| spec.sync).unwrap();
        assert_eq!(
            codex.options,
            [
                opt("model", OptionKind::String),
                opt("model_reasoning_effort", OptionKind::String)
            ]
        );
        for (kind, described) in [
            (OptionKind::String, "a non-empty string"),
            (Bool, "true or false"),
            (List, "a list of non-empty strings"),
            (StringOrList, "a non-empty string or a list of them"),
            (
                StringOrListAsWritten,
                "a non-empty string (kept as written) or a list of them",
            ),
            (StringOrTable, "a non-empty string or a table"),
            (PositiveInt, "a positive integer (unquoted)"),
            (OneOf(&["a", "b"]), "one of: a, b"),
            (DepthCap, "a whole number (unquoted) or provider-managed"),
        ] {
            assert_eq!(kind.describe(), described);
        }
    }

    #[test]
    fn the_known_names_are_every_canonical_name_in_table_order() {
        let names = names();
        assert_eq!(names.len(), AGENTS.len());
        assert_eq!(names[0], AGENTS[0].name);
        assert!(names.contains(&ACP_CHILD) && names.contains(&"codex"));
        for name in &names {
            assert_eq!(find_canonical(name).map(|spec| spec.name), Some(*name));
        }
    }

    #[test]
    fn a_location_says_where_it_is() {
        for (location, found, said) in [
            (Location::BesideHost("/a".into()), true, "beside acp-host"),
            (Location::OnPath("/b".into()), true, "on PATH"),
            (Location::Given("/c".into()), true, "at the given path"),
            (Location::NotFound, false, "not found"),
        ] {
            assert_eq!(location.is_found(), found);
            assert_eq!(location.describe(), said);
        }
    }

    #[test]
    fn likely_keys_prefer_the_agents_own_then_key_shaped_names() {
        let withheld: Vec<String> = ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "GEMINI_API_KEY"]
            .map(String::from)
            .to_vec();
        assert_eq!(likely_keys("gemini", &withheld), ["GEMINI_API_KEY"]);
        // An agent with no known key withheld (or a command line): key-shaped names.
        assert_eq!(
            likely_keys("codex", &withheld),
            ["GITHUB_TOKEN", "GEMINI_API_KEY"]
        );
        assert_eq!(
            likely_keys("/opt/agent --acp", &withheld),
            ["GITHUB_TOKEN", "GEMINI_API_KEY"]
        );
        assert_eq!(
            likely_keys("claude", &["ANTHROPIC_API_KEY".to_owned()]),
            ["ANTHROPIC_API_KEY"]
        );
        assert!(likely_keys("gemini", &["PGPASSWORD".to_owned()]).is_empty());
        let many: Vec<String> = (0..5).map(|i| format!("K{i}_API_KEY")).collect();
        assert_eq!(likely_keys("x", &many).len(), MAX_KEY_GUESSES);
    }

    #[test]
    fn registry_links_name_our_acp_agents_once() {
        for (ours, id) in REGISTRY_IDS {
            let spec = find_canonical(ours).unwrap();
            assert!(spec.acp_command.is_some(), "{ours} speaks ACP");
            assert!(crate::acp_registry::valid_id(id), "{id}");
            assert_eq!(registry_id(ours), Some(*id));
            assert_eq!(linked_to_registry(id), Some(*ours));
        }
        assert_eq!(registry_id("claude-code"), Some("claude-code-acp"));
        assert_eq!(registry_id("acp-child"), None);
    }

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

    /// Facts: `beside` holds the programs beside acp-host, `path` those on PATH.
    fn located(program: &str, beside: &[&str], path: &[&str]) -> Location {
        locate(
            program,
            |p| beside.contains(&p).then(|| PathBuf::from("/host").join(p)),
            |p| path.contains(&p).then(|| PathBuf::from("/bin").join(p)),
            |p| p == Path::new("/opt/agent"),
        )
    }

    #[test]
    fn availability_prefers_path_then_marker() {
        let codex = find("codex").unwrap();
        let on_path = |b: &str| located(b, &[], &["codex"]);
        assert_eq!(
            availability(codex, on_path, |_| true),
            AgentAvailability::OnPath("codex".into())
        );
        let nowhere = |b: &str| located(b, &[], &[]);
        assert_eq!(
            availability(codex, nowhere, |d| d == ".codex"),
            AgentAvailability::MarkerDir(".codex".into())
        );
        assert!(!availability(codex, nowhere, |_| false).is_installed());
    }

    #[test]
    fn only_acp_child_is_looked_up_beside_acp_host() {
        assert_eq!(
            located("acp-child", &["acp-child"], &["acp-child"]),
            Location::BesideHost("/host/acp-child".into())
        );
        assert_eq!(
            located("acp-child", &[], &["acp-child"]),
            Location::OnPath("/bin/acp-child".into())
        );
        // A codex-acp beside acp-host is not what `run --agent codex` starts.
        assert_eq!(
            located("codex-acp", &["codex-acp"], &[]),
            Location::NotFound
        );
        let codex = find("codex").unwrap();
        let facts = |b: &str| located(b, &["codex", "codex-acp"], &[]);
        assert!(!availability(codex, facts, |_| false).is_installed());
        let child = find(ACP_CHILD).unwrap();
        let facts = |b: &str| located(b, &["acp-child"], &[]);
        assert_eq!(
            availability(child, facts, |_| false),
            AgentAvailability::BesideHost("acp-child".into())
        );
    }

    #[test]
    fn a_path_is_found_only_where_it_points() {
        assert_eq!(
            located("/opt/agent", &[], &["agent"]),
            Location::Given("/opt/agent".into())
        );
        assert_eq!(located("./agent", &[], &["agent"]), Location::NotFound);
    }

    #[test]
    fn launch_words_and_hints() {
        let claude = launch("claude").unwrap();
        assert_eq!(claude.program, "claude-code-acp");
        assert_eq!(claude.spec.unwrap().name, "claude-code");
        assert_eq!(
            claude.install_hint,
            Some("npm install -g @zed-industries/claude-code-acp")
        );
        let gemini = launch("gemini").unwrap();
        assert_eq!(
            (gemini.program.as_str(), gemini.args),
            ("gemini", vec!["--acp".to_owned()])
        );
        // A registry program named in a command line keeps its hint.
        let line = launch("codex-acp --verbose 'a b'").unwrap();
        assert_eq!(line.args, ["--verbose", "a b"]);
        assert!(line.spec.is_none());
        assert_eq!(
            line.install_hint,
            Some("npm install -g @zed-industries/codex-acp")
        );
        assert_eq!(launch("  ").unwrap_err(), LaunchError::Empty);
        assert!(matches!(
            launch("'open"),
            Err(LaunchError::Unparsable { .. })
        ));
        assert_eq!(
            launch("copilot").unwrap_err().to_string(),
            "agent copilot does not speak ACP; agents that do: acp-child, claude-code, codex, \
             gemini, opencode, cursor, factory-droid, kiro, qwen-code"
        );
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
    fn every_equivalent_is_one_of_the_agents_options() {
        for (spec, target) in sync_agents() {
            for field in Field::ALL {
                if let Some(option) = target.equivalents.get(field) {
                    let known = target.option(option).is_some();
                    assert!(known, "{} {option}", spec.name);
                }
            }
        }
        let names: Vec<_> = Field::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(names, ["model", "tools", "readonly", "background"]);
        let cursor = find_sync("cursor").unwrap().1.equivalents;
        assert_eq!(cursor.get(Field::Background), Some("is_background"));
        assert_eq!(cursor.get(Field::Tools), None);
    }

    #[test]
    fn codex_switch() {
        let switch = find("codex").unwrap().sync.unwrap().switch.unwrap();
        assert!(switch.disables("[agents]\nenabled = false\n").unwrap());
        assert!(!switch.disables("[agents]\nenabled = true\n").unwrap());
        assert!(!switch.disables("model = \"o3\"\n").unwrap());
        assert!(switch.disables("[agents\n").is_err());
    }

    #[test]
    fn not_found_says_what_is_missing_and_how_to_fix_it() {
        assert!(acp_names().any(|name| name == "claude"));
        assert_eq!(
            not_found("claude", "claude-code-acp", Some("npm install -g x"), false),
            "agent claude is not installed: claude-code-acp is not on PATH; install it \
             (`npm install -g x`), or pass --agent with its full path"
        );
        assert_eq!(
            not_found("/opt/agent --acp", "/opt/agent", None, false),
            "agent /opt/agent --acp not found: no executable file at /opt/agent; fix the path, \
             or pass a command on PATH"
        );
        assert_eq!(
            not_found("cladue", "cladue", None, false),
            "agent cladue not found: cladue is neither a known agent nor a program on PATH; did \
             you mean claude? `acp-host agents` lists the known agents (install one, or pass a \
             command on PATH or its full path)"
        );
        assert_eq!(
            not_found("zzzzzz", "zzzzzz", None, false),
            "agent zzzzzz not found: zzzzzz is neither a known agent nor a program on PATH; \
             `acp-host agents` lists the known agents (install one, or pass a command on PATH or \
             its full path)"
        );
        assert_eq!(
            not_found("./agent.sh", "./agent.sh", None, true),
            "agent ./agent.sh cannot start: ./agent.sh is not an executable file; make it one \
             (`chmod +x ./agent.sh`) or fix the path"
        );
    }
}
