//! Canonical subagent definitions: `subagents/<name>.md` parsing and validation.
//!
//! A definition is YAML frontmatter (`description`, `agents`, one option map per agent name, and
//! an optional `run` table saying how to run the subagent out of process, see [`RunSpec`])
//! followed by a non-blank body: the subagent's instructions. A definition with `run` may omit
//! `agents` (run-only); sync ignores `run`. This module takes the folder's entries
//! as values (the caller read them) and either returns every definition, sorted by name, or every
//! problem found, each naming the file and the field. Invariants: validation is total — an unknown
//! agent, an unknown option, a wrongly typed option, a symlink or a stray entry is an error, never a
//! silent skip — and one bad file rejects the whole set, so a sync never writes or prunes from a
//! partial view of the canonical folder. Option names and types come from the registry
//! ([`crate::registry::SyncTarget::options`]); nothing here repeats them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capabilities::{Persona, PersonaMode, ToolFilter, Wants};
use crate::registry::{self, AgentSpec, OptionKind, SyncTarget, TargetFormat};

/// The folder of a project (or any directory) that holds its definitions: `<dir>/subagents/`.
pub const DEFINITION_DIR: &str = "subagents";

/// OS junk files that may sit in any folder; ignored rather than reported.
pub const IGNORED_ENTRIES: &[&str] = &[".DS_Store", "Thumbs.db", "desktop.ini"];

/// One entry of the canonical folder, as the caller found it (symlinks are not followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEntry {
    File {
        name: String,
        contents: Vec<u8>,
    },
    Symlink {
        name: String,
    },
    Folder {
        name: String,
    },
    /// A socket, fifo, device…
    Other {
        name: String,
    },
}

impl SourceEntry {
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            SourceEntry::File { name, .. }
            | SourceEntry::Symlink { name }
            | SourceEntry::Folder { name }
            | SourceEntry::Other { name } => name,
        }
    }
}

/// A validated option value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum OptionValue {
    String(String),
    Bool(bool),
    Int(u64),
    List(Vec<String>),
    Table(serde_json::Map<String, Value>),
}

/// One agent's options, sorted by name (rendering is deterministic whatever the source order).
pub type AgentOptions = BTreeMap<String, OptionValue>;

/// One validated canonical definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Definition {
    /// The file name without `.md`; matches `^[a-z][a-z0-9-]*$`.
    pub name: String,
    pub description: String,
    /// Canonical agent names, in the order written, unique.
    pub agents: Vec<&'static str>,
    /// Option maps keyed by canonical agent name (may include agents not in `agents`: validated,
    /// unused, so a user can drop an agent from `agents` without deleting its options).
    pub options: BTreeMap<&'static str, AgentOptions>,
    /// Trailing whitespace trimmed, leading blank lines dropped, line endings LF.
    pub body: String,
    /// How to run it out of process (acp-child's `subagent` tool, `acp-host run --subagent`).
    pub run: Option<RunSpec>,
}

/// The `run` table: how a definition runs as an out-of-process subagent. Every field is optional;
/// the body is the subagent's persona.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    /// A registry name or a command line; `None`: acp-child.
    pub agent: Option<String>,
    pub model: Option<String>,
    /// Allow-list of the child's tool names (`Some(empty)`: no tools).
    pub tools: Option<Vec<String>>,
    /// Tool names the child may not use (wins over `tools`).
    pub deny_tools: Vec<String>,
    /// How the body joins the child's instructions; `None`: append.
    pub persona_mode: Option<PersonaMode>,
    pub permission: Option<RunPermission>,
    /// Names of variables forwarded to the child (never values).
    pub env: Vec<String>,
    /// Seconds the child may run.
    pub timeout: Option<u64>,
    pub max_depth: Option<u32>,
    /// What the child starts from; `None`: a fresh session (acp-child's `subagent` call may say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<RunContext>,
    /// The most tokens the child may spend (as its agent reports them); it only ever lowers the
    /// starter's budget ([`RunSpec::settle`]).
    pub token_budget: Option<u64>,
    /// The most the child may cost (as its agent reports it, in its currency); only ever lowers
    /// the starter's (`acp-host run --cost-budget`).
    pub cost_budget: Option<crate::usage::CostLimit>,
    /// The child's sandbox for files (`crate::sandbox`); only ever tightens the starter's
    /// ([`RunSpec::sandbox_within`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<crate::sandbox::Mode>,
    /// The child's network; only ever tightens the starter's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::sandbox::Network>,
    /// Where the child works: `worktree` gives it a git worktree of its own
    /// (`crate::worktree`); only ever adds isolation ([`RunSpec::settle`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
}

/// `run.isolation` (and the `subagent` tool's `isolation`, `acp-host run --worktree`): where a
/// child works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// A git worktree of its own, from the parent's `HEAD`, on branch `acp/NAME`
    /// (`crate::worktree`): removed when it changed nothing, else committed and kept.
    Worktree,
}

impl Isolation {
    /// The names, as written.
    pub const NAMES: &str = "worktree";

    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "worktree" => Some(Self::Worktree),
            _ => None,
        }
    }

    /// The name, as written.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worktree => "worktree",
        }
    }
}

/// `run.context` (and the `subagent` tool's `context`): what a child starts from.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum RunContext {
    /// A new session: it knows only its prompt.
    #[default]
    Fresh,
    /// A fork of the parent's session as of its last completed turn (ACP `session/fork`): it
    /// knows what the parent knows without being told.
    Fork,
}

impl RunContext {
    /// The names, as written.
    pub const NAMES: &str = "fresh, fork";

    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fresh" => Some(Self::Fresh),
            "fork" => Some(Self::Fork),
            _ => None,
        }
    }
}

/// Where a definition was found, which decides whether it may start unasked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A registry agent the person enabled (`--subagent-agents`).
    Registry,
    /// A folder the person named (`--subagents DIR`).
    Folder,
    /// The session's own `subagents/` folder: repository content, untrusted until approved.
    Repository,
}

impl Source {
    /// Whether a definition of this source starts without the person's approval.
    #[must_use]
    pub fn trusted(self) -> bool {
        self != Self::Repository
    }
}

/// `run.permission`: how the child's permission requests are answered. The default, `relay`,
/// leaves them to the person (acp-child's `--subagent-permission` default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunPermission {
    /// Asked of the parent's own client.
    #[default]
    Relay,
    Reject,
    Allow,
}

impl RunPermission {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Reject => "reject",
            Self::Allow => "allow",
        }
    }
}

/// A repository definition's permission policy under the parent's: the stricter wins
/// (`reject` before `relay` before `allow`), so a definition can lower what its child may do,
/// never raise it.
#[must_use]
pub fn cap(definition: RunPermission, ceiling: RunPermission) -> RunPermission {
    let rank = |permission| match permission {
        RunPermission::Reject => 0,
        RunPermission::Relay => 1,
        RunPermission::Allow => 2,
    };
    if rank(definition) <= rank(ceiling) {
        definition
    } else {
        ceiling
    }
}

impl RunSpec {
    /// What running the definition asks of its agent: the body as persona (in `personaMode`),
    /// the model, the tool filter. Whether the agent can honour them is decided when it starts
    /// (`crate::capabilities::plan_session`), for `acp-host run --subagent` and acp-child's
    /// `subagent` tool alike.
    #[must_use]
    pub fn wants(&self, body: &str) -> Wants {
        Wants {
            persona: Some(Persona {
                text: body.to_owned(),
                mode: self.persona_mode.unwrap_or_default(),
            }),
            model: self.model.clone(),
            tools: (self.tools.is_some() || !self.deny_tools.is_empty()).then(|| ToolFilter {
                allow: self.tools.clone(),
                deny: self.deny_tools.clone(),
            }),
            output: None,
        }
    }

    /// The one rule for what a definition's permission, timeout, depth limit and variables
    /// become when it starts (`acp-host run --subagent`, batch lines and acp-child's children
    /// alike): the starter's `explicit` settings (the person's flags for this run, a `subagent`
    /// call's parameters) win over the definition's, which win over the starter's `defaults`
    /// (acp-child's `--subagent-*`, or acp-host's default `reject`). Isolation is only ever added:
    /// whichever of the three asks for a worktree gets one (there is no setting that takes one
    /// away, so neither a definition nor a call can put a child back in the parent's tree). A repository definition's (`source`, decided in `crate::trust`)
    /// permission only ever lowers the explicit-or-default one. Variables: the definition's names
    /// the starter does not forward already. What `relay` means is the starter's: asked on
    /// acp-host's terminal, relayed to acp-child's client.
    #[must_use]
    pub fn settle(
        &self,
        source: Source,
        explicit: &RunSettings,
        defaults: &RunSettings,
    ) -> Settled {
        let ceiling = explicit
            .permission
            .or(defaults.permission)
            .unwrap_or(RunPermission::Reject);
        let permission = match (self.permission, source) {
            (Some(asked), Source::Repository) => cap(asked, ceiling),
            (asked, _) => explicit.permission.or(asked).unwrap_or(ceiling),
        };
        let forwarded = |name: &String| explicit.env.contains(name) || defaults.env.contains(name);
        Settled {
            permission,
            timeout: explicit
                .timeout
                .or(self.timeout.map(std::time::Duration::from_secs))
                .or(defaults.timeout),
            max_depth: explicit.max_depth.or(self.max_depth).or(defaults.max_depth),
            // Only ever lowered: the smallest of the definition's and the starter's.
            token_budget: crate::usage::child_budget(
                self.token_budget,
                explicit.token_budget,
                defaults.token_budget,
            ),
            cost_budget: crate::usage::CostLimit::lowest([
                self.cost_budget,
                explicit.cost_budget,
                defaults.cost_budget,
            ]),
            env: self
                .env
                .iter()
                .filter(|name| !forwarded(name))
                .cloned()
                .collect(),
            isolation: explicit.isolation.or(self.isolation).or(defaults.isolation),
        }
    }
}

impl RunSpec {
    /// The sandbox a definition's child runs in: the starter's `policy` (the person's flags, or
    /// acp-child's `--subagent-sandbox`), tightened by the definition's `sandbox` and `network`,
    /// never loosened: a repository cannot lift a sandbox the person chose.
    #[must_use]
    pub fn sandbox_within(&self, policy: &crate::sandbox::Policy) -> crate::sandbox::Policy {
        crate::sandbox::Policy {
            mode: self
                .sandbox
                .map_or(policy.mode, |mode| mode.stricter(policy.mode)),
            network: self.network.as_ref().map_or_else(
                || policy.network.clone(),
                |network| network.tighter(&policy.network),
            ),
            ..policy.clone()
        }
    }
}

/// A starter's own settings for a definition's run ([`RunSpec::settle`]); `None`: not given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSettings {
    pub permission: Option<RunPermission>,
    pub timeout: Option<std::time::Duration>,
    pub max_depth: Option<u32>,
    /// The starter's token budget for the child (`--token-budget`, `--subagent-token-budget`).
    pub token_budget: Option<u64>,
    /// The starter's cost budget for the child (`--cost-budget`).
    pub cost_budget: Option<crate::usage::CostLimit>,
    /// Names the starter forwards already.
    pub env: Vec<String>,
    /// A worktree the starter asks for (`--worktree`, a call's `isolation`).
    pub isolation: Option<Isolation>,
}

/// What a definition's run settles to ([`RunSpec::settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub permission: RunPermission,
    pub timeout: Option<std::time::Duration>,
    pub max_depth: Option<u32>,
    /// The smallest of the definition's `tokenBudget` and the starter's.
    pub token_budget: Option<u64>,
    /// The smallest of the definition's `costBudget` and the starter's.
    pub cost_budget: Option<crate::usage::CostLimit>,
    /// The definition's variable names to forward as well (never values).
    pub env: Vec<String>,
    /// Where the child works: a worktree when any of the three asked for one.
    pub isolation: Option<Isolation>,
}

/// The fields a `run` table may hold.
pub const RUN_FIELDS: &[&str] = &[
    "agent",
    "model",
    "tools",
    "denyTools",
    "personaMode",
    "permission",
    "env",
    "timeout",
    "maxDepth",
    "context",
    "tokenBudget",
    "costBudget",
    "sandbox",
    "network",
    "isolation",
];

impl Definition {
    /// The options for one agent (empty when none were given).
    #[must_use]
    pub fn options_for(&self, agent: &str) -> &AgentOptions {
        static EMPTY: AgentOptions = BTreeMap::new();
        self.options.get(agent).unwrap_or(&EMPTY)
    }

    /// Whether the definition targets this agent.
    #[must_use]
    pub fn targets(&self, agent: &str) -> bool {
        self.agents.contains(&agent)
    }
}

/// What is wrong with one file of the canonical folder.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error(
        "not a subagent definition: the source folder holds only <name>.md files whose name matches ^[a-z][a-z0-9-]*$ (rename or move it)"
    )]
    BadFileName,
    #[error(
        "is a symlink; canonical definitions must be regular files (replace the link with the file it points to)"
    )]
    Symlink,
    #[error("is a folder; the source folder holds only <name>.md files (move it elsewhere)")]
    Folder,
    #[error("is not a regular file (remove it from the source folder)")]
    NotAFile,
    #[error("is not UTF-8 text (save it as UTF-8)")]
    NotUtf8,
    #[error(
        "has no YAML frontmatter: start the file with a line `---`, then the fields, then a closing `---` line"
    )]
    NoFrontmatter,
    #[error("frontmatter is not valid YAML: {0}")]
    Yaml(#[source] serde_saphyr::Error),
    #[error("frontmatter must be a mapping of fields (description, agents, per-agent options)")]
    NotAMapping,
    #[error("field `{field}`: {message}")]
    Field { field: String, message: String },
    #[error("the body is empty: write the subagent's instructions after the closing `---` line")]
    EmptyBody,
    /// Several problems of one file, each its own message, in the order they were found.
    #[error("{} problems: {}", .0.len(), describe_all(.0))]
    Several(Vec<Problem>),
}

impl Problem {
    /// `problems` as one problem: none is `None`, one is itself, more are [`Problem::Several`].
    fn all(mut problems: Vec<Problem>) -> Option<Problem> {
        match problems.len() {
            0 => None,
            1 => problems.pop(),
            _ => Some(Problem::Several(problems)),
        }
    }
}

/// The messages of `problems`, joined by "; " (a nested list is flattened by its own message).
fn describe_all(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One problem, with the file it is in.
#[derive(Debug, thiserror::Error)]
#[error("subagents/{file}: {problem}")]
pub struct DefinitionError {
    /// The entry's name inside the source folder.
    pub file: String,
    #[source]
    pub problem: Problem,
}

/// Every problem found in the canonical folder (never empty).
#[derive(Debug, thiserror::Error)]
pub struct DefinitionErrors(pub Vec<DefinitionError>);

impl fmt::Display for DefinitionErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        let s = if n == 1 { "" } else { "s" };
        let what = "invalid subagent definition";
        write!(f, "{n} {what}{s}; nothing was written (fix and re-run):")?;
        for error in &self.0 {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

/// Whether a string is a valid subagent name: `^[a-z][a-z0-9-]*$`.
#[must_use]
pub fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The definition an entry of a folder of definitions holds: a regular file's, parsed; a symlink,
/// a folder or anything else is a problem (a link would let a folder borrow a file, and an
/// approval of it, from elsewhere). The one rule for every reader of such a folder. With the
/// definition come the bytes it was parsed from (what trust digests).
pub fn parse_entry(entry: &SourceEntry) -> Result<(Definition, &[u8]), Problem> {
    match entry {
        SourceEntry::File { name, contents } => Ok((parse(name, contents)?, contents)),
        SourceEntry::Symlink { .. } => Err(Problem::Symlink),
        SourceEntry::Folder { .. } => Err(Problem::Folder),
        SourceEntry::Other { .. } => Err(Problem::NotAFile),
    }
}

/// Validates every entry of the canonical folder. Returns the definitions sorted by name, or every
/// problem found (one bad file rejects the set).
pub fn load_set(entries: Vec<SourceEntry>) -> Result<Vec<Definition>, DefinitionErrors> {
    let mut definitions = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let file = entry.name().to_owned();
        if IGNORED_ENTRIES.contains(&file.as_str()) {
            continue;
        }
        match parse_entry(&entry).map(|(definition, _)| definition) {
            Ok(definition) => definitions.push(definition),
            Err(problem) => errors.push(DefinitionError { file, problem }),
        }
    }
    if errors.is_empty() {
        definitions.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(definitions)
    } else {
        errors.sort_by(|a, b| a.file.cmp(&b.file));
        Err(DefinitionErrors(errors))
    }
}

/// Parses and validates one file of the canonical folder, given its entry name and bytes.
pub fn parse(file_name: &str, contents: &[u8]) -> Result<Definition, Problem> {
    let name = file_name
        .strip_suffix(".md")
        .filter(|n| is_valid_name(n))
        .ok_or(Problem::BadFileName)?;
    let text = std::str::from_utf8(contents).map_err(|_| Problem::NotUtf8)?;
    // Editors on Windows start UTF-8 files with a byte-order mark; it is not content.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n");
    let (frontmatter, body) = split_frontmatter(&text).ok_or(Problem::NoFrontmatter)?;
    let value: Value = if frontmatter.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_saphyr::from_str(frontmatter).map_err(Problem::Yaml)?
    };
    let Value::Object(fields) = value else {
        return Err(Problem::NotAMapping);
    };
    let body = normalize_body(body);
    if body.is_empty() {
        return Err(Problem::EmptyBody);
    }
    let mut description = None;
    let mut agents = None;
    let mut run = None;
    let mut options = BTreeMap::new();
    // Every field is checked (in the file's order), so one message lists
    // all of the file's problems, deterministically.
    let mut problems = Vec::new();
    for (key, value) in &fields {
        let checked = match key.as_str() {
            "description" => parse_description(value).map(|d| description = Some(d)),
            "agents" => parse_agents(value).map(|a| agents = Some(a)),
            "run" => parse_run(value).map(|r| run = Some(r)),
            other => match registry::find_sync(other) {
                Some((spec, target)) => parse_options(spec, target, value)
                    .map(|parsed| drop(options.insert(spec.name, parsed))),
                None => Err(field(
                    other,
                    format!(
                        "unknown field; allowed: description, agents, run, or an agent name with its options ({})",
                        registry::sync_agent_names().join(", ")
                    ),
                )),
            },
        };
        match checked {
            Err(Problem::Several(several)) => problems.extend(several),
            Err(problem) => problems.push(problem),
            Ok(()) => {}
        }
    }
    if !fields.contains_key("description") {
        problems.push(field(
            "description",
            "missing: add `description: \"what this subagent does\"`",
        ));
    }
    if !fields.contains_key("agents") && !fields.contains_key("run") {
        problems.push(field(
            "agents",
            "missing: add `agents: [\"claude-code\", \"codex\"]` (the agents to sync to), or a `run:` table to run it out of process",
        ));
    }
    if let Some(problem) = Problem::all(problems) {
        return Err(problem);
    }
    // Both known by now: a missing description is a problem, and agents may be missing only
    // beside a `run:` table (run-only: nothing to sync).
    Ok(Definition {
        name: name.to_owned(),
        description: description.unwrap_or_default(),
        agents: agents.unwrap_or_default(),
        options,
        body,
        run,
    })
}

/// Splits `---\n<frontmatter>\n---\n<body>` (LF only). The closing fence is the first line that is
/// exactly `---` (trailing spaces allowed).
pub(crate) fn split_frontmatter(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix("---\n")?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    None
}

/// Trailing whitespace trimmed, leading blank lines dropped (the first line keeps its indentation).
pub(crate) fn normalize_body(body: &str) -> String {
    let trimmed = body.trim_end();
    let mut start = 0;
    for line in trimmed.split_inclusive('\n') {
        if line.trim().is_empty() && line.ends_with('\n') {
            start += line.len();
        } else {
            break;
        }
    }
    trimmed[start..].to_owned()
}

fn field(field: &str, message: impl Into<String>) -> Problem {
    Problem::Field {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// How a JSON value is named in "got ..." messages.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

fn parse_description(value: &Value) -> Result<String, Problem> {
    match value {
        Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
        Value::String(_) => Err(field("description", "must not be empty")),
        other => Err(field(
            "description",
            format!("must be a non-empty string, got {}", kind_of(other)),
        )),
    }
}

fn parse_agents(value: &Value) -> Result<Vec<&'static str>, Problem> {
    let Value::Array(items) = value else {
        return Err(field(
            "agents",
            format!(
                "must be a list of agent names, got {}; e.g. agents: [\"claude-code\"]",
                kind_of(value)
            ),
        ));
    };
    if items.is_empty() {
        return Err(field(
            "agents",
            "must list at least one agent (known: ".to_owned()
                + &registry::sync_agent_names().join(", ")
                + ")",
        ));
    }
    let mut agents: Vec<&'static str> = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(name) = item else {
            return Err(field(
                "agents",
                format!("each item must be an agent name, got {}", kind_of(item)),
            ));
        };
        let Some(spec) = registry::find_canonical(name) else {
            return Err(field(
                "agents",
                format!(
                    "unknown agent `{name}`; known: {}",
                    registry::sync_agent_names().join(", ")
                ),
            ));
        };
        if registry::find_sync(spec.name).is_none() {
            return Err(field(
                "agents",
                format!(
                    "agent `{name}` takes no subagent definitions; sync targets: {}",
                    registry::sync_agent_names().join(", ")
                ),
            ));
        }
        if agents.contains(&spec.name) {
            return Err(field("agents", format!("`{name}` is listed twice")));
        }
        agents.push(spec.name);
    }
    Ok(agents)
}

/// `run.env`: variable names, never values.
fn variable_names(
    value: &Value,
    path: &str,
    wrong: impl Fn(&str) -> Problem,
) -> Result<Vec<String>, Problem> {
    let env = names(value).ok_or_else(|| wrong("a list of variable names"))?;
    if let Some(bad) = env.iter().find(|name| name.contains('=')) {
        let name = bad.split_once('=').map_or("", |(name, _)| name);
        return Err(field(
            path,
            format!("lists variable names, never values: write `{name}`, not `{name}=...`"),
        ));
    }
    Ok(env)
}

/// `run.sandbox`, `run.network`: a value read as its flag reads it. YAML reads a bare `off` /
/// `on` as a boolean: it means the same here.
fn sandbox_field(run: &mut RunSpec, key: &str, value: &Value, path: &str) -> Result<(), Problem> {
    use crate::sandbox::{Mode, Network, SandboxError};
    let text = || match value {
        Value::String(text) if non_empty(text) => Ok(text.as_str()),
        _ => Err(field(
            path,
            format!("must be a non-empty string, got {}", describe_value(value)),
        )),
    };
    let refused = |err: SandboxError| field(path, err.to_string());
    match (key, value) {
        ("sandbox", Value::Bool(false)) => run.sandbox = Some(Mode::Off),
        ("sandbox", _) => run.sandbox = Some(text()?.parse().map_err(refused)?),
        (_, Value::Bool(on)) => run.network = Some(if *on { Network::On } else { Network::Off }),
        _ => run.network = Some(text()?.parse().map_err(refused)?),
    }
    Ok(())
}

/// `run.context`, `run.isolation`: one of a few names; `Err` is what was expected.
fn choice_field(run: &mut RunSpec, key: &str, value: &Value) -> Result<(), String> {
    let text = value.as_str().unwrap_or_default();
    if key == "context" {
        run.context = Some(RunContext::parse(text).ok_or(format!("one of {}", RunContext::NAMES))?);
    } else {
        run.isolation = Some(Isolation::parse(text).ok_or(format!("one of {}", Isolation::NAMES))?);
    }
    Ok(())
}

fn parse_run(value: &Value) -> Result<RunSpec, Problem> {
    let Value::Object(map) = value else {
        return Err(field(
            "run",
            format!(
                "must be a table of {}, got {}",
                RUN_FIELDS.join(", "),
                kind_of(value)
            ),
        ));
    };
    let mut run = RunSpec::default();
    // Every field is checked, so one message lists all of the table's problems.
    let problems: Vec<Problem> = map
        .iter()
        .filter_map(|(key, value)| run_field(&mut run, key, value).err())
        .collect();
    match Problem::all(problems) {
        Some(problem) => Err(problem),
        None => Ok(run),
    }
}

/// Checks field `key` of a `run:` table and sets it on `run`.
fn run_field(run: &mut RunSpec, key: &str, value: &Value) -> Result<(), Problem> {
    {
        let path = format!("run.{key}");
        let wrong = |expected: &str| {
            field(
                &path,
                format!("must be {expected}, got {}", describe_value(value)),
            )
        };
        let text = || match value {
            Value::String(s) if non_empty(s) => Ok(s.clone()),
            _ => Err(wrong("a non-empty string")),
        };
        match key {
            "agent" => run.agent = Some(text()?),
            "model" => run.model = Some(text()?),
            // An explicit empty list means "no tools"; omitting the field means no filter.
            "tools" => run.tools = Some(names(value).ok_or_else(|| wrong("a list of tool names"))?),
            "denyTools" => {
                run.deny_tools = names(value).ok_or_else(|| wrong("a list of tool names"))?;
            }
            "personaMode" => {
                run.persona_mode = Some(
                    value
                        .as_str()
                        .and_then(PersonaMode::parse)
                        .ok_or_else(|| wrong(&format!("one of {}", PersonaMode::NAMES)))?,
                );
            }
            "permission" => {
                run.permission = Some(match value.as_str() {
                    Some("relay") => RunPermission::Relay,
                    Some("reject") => RunPermission::Reject,
                    Some("allow") => RunPermission::Allow,
                    _ => return Err(wrong("one of relay, reject, allow")),
                });
            }
            "env" => run.env = variable_names(value, &path, wrong)?,
            "timeout" => {
                run.timeout = Some(
                    value
                        .as_u64()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| wrong("a whole number of seconds, at least 1"))?,
                );
            }
            "maxDepth" => {
                run.max_depth = Some(
                    value
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| wrong("a whole number"))?,
                );
            }
            "context" | "isolation" => {
                choice_field(run, key, value).map_err(|expected| wrong(&expected))?;
            }
            "tokenBudget" => {
                run.token_budget = Some(
                    value
                        .as_u64()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| wrong("a whole number of tokens, at least 1"))?,
                );
            }
            "costBudget" => {
                run.cost_budget = Some(
                    value
                        .as_f64()
                        .filter(|amount| *amount > 0.0)
                        .and_then(crate::usage::CostLimit::new)
                        .ok_or_else(|| wrong("an amount above zero, in the agent's currency"))?,
                );
            }
            "sandbox" | "network" => sandbox_field(run, key, value, &path)?,
            _ => {
                return Err(field(
                    &path,
                    format!("unknown run field; allowed: {}", RUN_FIELDS.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

fn parse_options(
    spec: &AgentSpec,
    target: SyncTarget,
    value: &Value,
) -> Result<AgentOptions, Problem> {
    let Value::Object(map) = value else {
        return Err(field(
            spec.name,
            format!(
                "must be a table of {} options, got {}",
                spec.name,
                kind_of(value)
            ),
        ));
    };
    let mut options = AgentOptions::new();
    for (key, value) in map {
        let path = format!("{}.{key}", spec.name);
        let Some(option) = target.option(key) else {
            let allowed: Vec<_> = target.options.iter().map(|o| o.name).collect();
            return Err(field(
                &path,
                format!(
                    "unknown {} option; allowed: {}",
                    spec.name,
                    allowed.join(", ")
                ),
            ));
        };
        let parsed = parse_option(option.kind, value).ok_or_else(|| {
            field(
                &path,
                format!(
                    "must be {}, got {}",
                    option.kind.describe(),
                    describe_value(value)
                ),
            )
        })?;
        options.insert(key.clone(), parsed);
    }
    if target.format == TargetFormat::DshShared {
        check_dsh_depth(spec.name, &options)?;
        check_dsh_background(spec.name, &options)?;
    }
    Ok(options)
}

/// A numeric DSH `maxDepth` must be backed by its provider: the definition says so with
/// `providerHonoursDepth: true`, else it is refused (DSH's schema rule); `provider-managed` needs
/// nothing.
fn check_dsh_depth(agent: &str, options: &AgentOptions) -> Result<(), Problem> {
    let honoured = options.get("providerHonoursDepth") == Some(&OptionValue::Bool(true));
    match options.get("maxDepth") {
        Some(OptionValue::Int(n)) if !honoured => Err(field(
            &format!("{agent}.maxDepth"),
            format!(
                "a number ({n}) must be enforced by the provider: set \
                 {agent}.providerHonoursDepth: true if provider {} enforces it, or write \
                 maxDepth: {}",
                match options.get("provider") {
                    Some(OptionValue::String(provider)) => provider.as_str(),
                    _ => "spawn",
                },
                registry::PROVIDER_MANAGED
            ),
        )),
        _ => Ok(()),
    }
}

/// An ACP provider runs a background subagent as a one-shot task (DSH's table: continuing an ACP
/// child is not offered), so `backgroundMode: continuable` is refused for it rather than synced
/// as a promise the provider does not keep.
fn check_dsh_background(agent: &str, options: &AgentOptions) -> Result<(), Problem> {
    let acp = options.get("provider") == Some(&OptionValue::String("acp".to_owned()));
    let continuable =
        options.get("backgroundMode") == Some(&OptionValue::String("continuable".to_owned()));
    if acp && continuable {
        return Err(field(
            &format!("{agent}.backgroundMode"),
            "provider acp runs a background subagent one-shot: write backgroundMode: one-shot \
             or leave it out",
        ));
    }
    Ok(())
}

fn describe_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("the string {}", Value::String(s.clone())),
        Value::Number(n) => format!("the number {n}"),
        Value::Bool(b) => format!("the boolean {b}"),
        other => kind_of(other).to_owned(),
    }
}

fn non_empty(s: &str) -> bool {
    !s.trim().is_empty()
}

/// A list of names, possibly empty; `None` when it is not a list of non-blank strings.
fn names(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Array(items) if items.is_empty() => Some(Vec::new()),
        Value::Array(items) => string_list(items),
        _ => None,
    }
}

fn string_list(items: &[Value]) -> Option<Vec<String>> {
    if items.is_empty() {
        return None;
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(s) if non_empty(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// Checks one option value against its kind; `None` when it does not fit.
pub(crate) fn parse_option(kind: OptionKind, value: &Value) -> Option<OptionValue> {
    match (kind, value) {
        (
            OptionKind::String | OptionKind::StringOrTable | OptionKind::StringOrListAsWritten,
            Value::String(s),
        ) if non_empty(s) => Some(OptionValue::String(s.clone())),
        (OptionKind::Bool, Value::Bool(b)) => Some(OptionValue::Bool(*b)),
        (
            OptionKind::List | OptionKind::StringOrList | OptionKind::StringOrListAsWritten,
            Value::Array(items),
        ) => string_list(items).map(OptionValue::List),
        (OptionKind::StringOrList, Value::String(s)) if non_empty(s) => {
            Some(OptionValue::List(vec![s.clone()]))
        }
        (OptionKind::StringOrTable, Value::Object(map)) if !map.is_empty() => {
            Some(OptionValue::Table(map.clone()))
        }
        (OptionKind::PositiveInt, Value::Number(n)) => {
            n.as_u64().filter(|n| *n >= 1).map(OptionValue::Int)
        }
        (OptionKind::OneOf(allowed), Value::String(s)) if allowed.contains(&s.as_str()) => {
            Some(OptionValue::String(s.clone()))
        }
        (OptionKind::DepthCap, Value::Number(n)) => n.as_u64().map(OptionValue::Int),
        (OptionKind::DepthCap, Value::String(s)) if s == registry::PROVIDER_MANAGED => {
            Some(OptionValue::String(s.clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Definition {
        parse("review.md", text.as_bytes()).unwrap()
    }

    fn err(text: &str) -> String {
        DefinitionError {
            file: "review.md".into(),
            problem: parse("review.md", text.as_bytes()).unwrap_err(),
        }
        .to_string()
    }

    #[test]
    fn a_definition_only_lowers_the_permission() {
        use RunPermission::{Allow, Reject, Relay};
        for (definition, ceiling, expected) in [
            (Allow, Reject, Reject),
            (Allow, Relay, Relay),
            (Allow, Allow, Allow),
            (Relay, Reject, Reject),
            (Relay, Allow, Relay),
            (Reject, Allow, Reject),
            (Reject, Relay, Reject),
        ] {
            assert_eq!(
                cap(definition, ceiling),
                expected,
                "{definition:?} under {ceiling:?}"
            );
        }
    }

    #[test]
    fn every_problem_of_a_file_is_reported_at_once() {
        let error = parse(
            "x.md",
            b"---\nrun: {modle: x, timeout: 0}\ncodex: {model: 3}\n---\nB\n",
        )
        .unwrap_err();
        assert!(
            matches!(&error, Problem::Several(all) if all.len() == 4),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "4 problems: field `run.modle`: unknown run field; allowed: {}; field \
                 `run.timeout`: must be a whole number of seconds, at least 1, got the number 0; \
                 field `codex.model`: must be a non-empty string, got the number 3; field \
                 `description`: missing: add `description: \"what this subagent does\"`",
                RUN_FIELDS.join(", ")
            )
        );
        let one = parse("x.md", b"---\ndescription: d\nrun: {timeout: 0}\n---\nB\n").unwrap_err();
        assert!(matches!(one, Problem::Field { .. }), "{one:?}");
    }

    #[test]
    fn parses_the_documented_example() {
        let d = ok(
            "---\ndescription: \"Review code changes\"\nagents: [\"codex\", \"claude-code\"]\ncodex: {\"model\": \"o3\"}\n---\n\nReview the changes and report findings.\n",
        );
        assert_eq!(d.name, "review");
        assert_eq!(d.description, "Review code changes");
        assert_eq!(d.agents, vec!["codex", "claude-code"]);
        assert_eq!(
            d.options_for("codex").get("model"),
            Some(&OptionValue::String("o3".into()))
        );
        assert_eq!(d.body, "Review the changes and report findings.");
        assert!(d.options_for("claude-code").is_empty());
    }

    #[test]
    fn a_run_table_is_validated_strictly_and_makes_agents_optional() {
        let d = ok(
            "---\ndescription: d\nrun:\n  agent: codex\n  model: m\n  tools: []\n  permission: allow\n  env: [OPENAI_API_KEY]\n  timeout: 30\n  maxDepth: 0\n  context: fork\n  tokenBudget: 5000\n  costBudget: 0.25\n  sandbox: read-only\n  network: tcp:443\n  isolation: worktree\n---\nBody.\n",
        );
        assert!(d.agents.is_empty());
        assert_eq!(
            d.run,
            Some(RunSpec {
                agent: Some("codex".into()),
                model: Some("m".into()),
                tools: Some(Vec::new()),
                deny_tools: Vec::new(),
                persona_mode: None,
                permission: Some(RunPermission::Allow),
                env: vec!["OPENAI_API_KEY".into()],
                timeout: Some(30),
                max_depth: Some(0),
                context: Some(RunContext::Fork),
                token_budget: Some(5000),
                cost_budget: crate::usage::CostLimit::new(0.25),
                sandbox: Some(crate::sandbox::Mode::ReadOnly),
                network: Some("tcp:443".parse().unwrap()),
                isolation: Some(Isolation::Worktree),
            })
        );
        assert_eq!(
            ok("---\ndescription: d\nrun: {}\n---\nB\n").run,
            Some(RunSpec::default())
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {modle: x}\n---\nB\n"),
            "subagents/review.md: field `run.modle`: unknown run field; allowed: agent, model, tools, denyTools, personaMode, permission, env, timeout, maxDepth, context, tokenBudget, costBudget, sandbox, network, isolation"
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {timeout: \"soon\"}\n---\nB\n"),
            "subagents/review.md: field `run.timeout`: must be a whole number of seconds, at least 1, got the string \"soon\""
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {permission: ask}\n---\nB\n"),
            "subagents/review.md: field `run.permission`: must be one of relay, reject, allow, got the string \"ask\""
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {env: [\"KEY=sk-secret\"]}\n---\nB\n"),
            "subagents/review.md: field `run.env`: lists variable names, never values: write `KEY`, not `KEY=...`"
        );
        assert_eq!(
            err("---\ndescription: d\nrun: [acp-child]\n---\nB\n"),
            "subagents/review.md: field `run`: must be a table of agent, model, tools, denyTools, personaMode, permission, env, timeout, maxDepth, context, tokenBudget, costBudget, sandbox, network, isolation, got a list"
        );
        assert!(err("---\ndescription: d\n---\nB\n").contains("field `agents`: missing"));
        assert_eq!(
            err("---\ndescription: d\nrun: {context: parent}\n---\nB\n"),
            "subagents/review.md: field `run.context`: must be one of fresh, fork, got the string \"parent\""
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {isolation: true}\n---\nB\n"),
            "subagents/review.md: field `run.isolation`: must be one of worktree, got the boolean true"
        );
        assert_eq!(Isolation::Worktree.as_str(), Isolation::NAMES);
    }

    #[test]
    fn a_run_asks_for_its_persona_model_and_tool_filter() {
        let d = ok(
            "---\ndescription: d\nrun:\n  model: m\n  denyTools: [run_command]\n  personaMode: strict\n---\nBe terse.\n",
        );
        let run = d.run.unwrap();
        assert_eq!(
            run.wants(&d.body),
            Wants {
                persona: Some(Persona {
                    text: "Be terse.".into(),
                    mode: PersonaMode::Strict
                }),
                model: Some("m".into()),
                tools: Some(ToolFilter {
                    allow: None,
                    deny: vec!["run_command".into()]
                }),
                output: None,
            }
        );
        let plain = RunSpec::default().wants("B");
        assert_eq!(
            (plain.persona.map(|p| p.mode), plain.model, plain.tools),
            (Some(PersonaMode::Append), None, None)
        );
        assert_eq!(
            err("---\ndescription: d\nrun: {personaMode: loud}\n---\nB\n"),
            "subagents/review.md: field `run.personaMode`: must be one of append, strict, override, got the string \"loud\""
        );
    }

    #[test]
    fn a_run_settles_explicit_over_definition_over_defaults_and_a_repository_only_lowers() {
        use super::Source::{Folder, Repository};
        use std::time::Duration;
        let run = |text: &str| ok(text).run.unwrap();
        let spec = run(
            "---\ndescription: d\nrun: {permission: allow, timeout: 5, maxDepth: 2, tokenBudget: 1000, costBudget: 2, env: [A, B]}\n---\nB\n",
        );
        let none = RunSettings::default();
        let defaults = RunSettings {
            permission: Some(RunPermission::Relay),
            timeout: Some(Duration::from_mins(1)),
            max_depth: None,
            token_budget: Some(900),
            cost_budget: crate::usage::CostLimit::new(3.0),
            env: vec!["A".into()],
            isolation: None,
        };
        let explicit = RunSettings {
            permission: Some(RunPermission::Reject),
            timeout: Some(Duration::from_secs(1)),
            max_depth: Some(1),
            token_budget: None,
            cost_budget: crate::usage::CostLimit::new(0.5),
            env: Vec::new(),
            isolation: None,
        };
        // A folder the person named: the definition over the defaults, the flags over both.
        let settled = spec.settle(Folder, &none, &defaults);
        assert_eq!(settled.permission, RunPermission::Allow);
        assert_eq!(settled.timeout, Some(Duration::from_secs(5)));
        assert_eq!(settled.max_depth, Some(2));
        // A budget is only ever lowered: the definition's 1,000 under the starter's 900.
        assert_eq!(settled.token_budget, Some(900));
        assert_eq!(spec.settle(Folder, &none, &none).token_budget, Some(1000));
        // The cost budget too: the definition's 2 under the defaults' 3, the flag's 0.5 under it.
        assert_eq!(settled.cost_budget, crate::usage::CostLimit::new(2.0));
        assert_eq!(
            spec.settle(Folder, &explicit, &defaults).cost_budget,
            crate::usage::CostLimit::new(0.5)
        );
        assert_eq!(settled.env, ["B"]);
        let settled = spec.settle(Folder, &explicit, &defaults);
        assert_eq!(settled.permission, RunPermission::Reject);
        assert_eq!(settled.timeout, Some(Duration::from_secs(1)));
        assert_eq!(settled.max_depth, Some(1));
        // A repository's `allow` is capped: at the defaults, at the flags, at reject with neither.
        assert_eq!(
            spec.settle(Repository, &none, &defaults).permission,
            RunPermission::Relay
        );
        assert_eq!(
            spec.settle(Repository, &none, &none).permission,
            RunPermission::Reject
        );
        let lower = run("---\ndescription: d\nrun: {permission: reject}\n---\nB\n");
        let allow = RunSettings {
            permission: Some(RunPermission::Allow),
            ..RunSettings::default()
        };
        assert_eq!(
            lower.settle(Repository, &allow, &none).permission,
            RunPermission::Reject,
            "a repository definition may lower"
        );
        // Isolation is only ever added: the call's, the definition's or the defaults' worktree.
        assert_eq!(settled.isolation, None);
        let isolated = run("---\ndescription: d\nrun: {isolation: worktree}\n---\nB\n");
        assert_eq!(
            isolated.settle(Repository, &none, &none).isolation,
            Some(Isolation::Worktree)
        );
        let asked = RunSettings {
            isolation: Some(Isolation::Worktree),
            ..RunSettings::default()
        };
        assert_eq!(
            spec.settle(Folder, &asked, &none).isolation,
            Some(Isolation::Worktree)
        );
        assert_eq!(
            spec.settle(Folder, &none, &asked).isolation,
            Some(Isolation::Worktree)
        );
        // Without a permission of its own, the flags, else the defaults, else reject.
        let plain = run("---\ndescription: d\nrun: {}\n---\nB\n");
        assert_eq!(
            plain.settle(Repository, &none, &defaults).permission,
            RunPermission::Relay
        );
        assert_eq!(
            plain.settle(Folder, &none, &none).permission,
            RunPermission::Reject
        );
    }

    #[test]
    fn a_byte_order_mark_is_not_content() {
        let d = ok("\u{feff}---\ndescription: d\nagents: [codex]\n---\nBody.\n");
        assert_eq!((d.description.as_str(), d.body.as_str()), ("d", "Body."));
    }

    #[test]
    fn body_is_normalized() {
        let d = ok(
            "---\r\ndescription: d\r\nagents: [codex]\r\n---\r\n\r\n  \r\n  indented\r\nnext  \r\n\r\n",
        );
        assert_eq!(d.body, "  indented\nnext");
    }

    #[test]
    fn names() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name("code-review2"));
        for bad in ["", "A", "1a", "-a", "a_b", "a.b", "é"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        assert!(matches!(
            parse("Bad.md", b"---\n---\nx"),
            Err(Problem::BadFileName)
        ));
        assert!(matches!(
            parse("bad.txt", b"---\n---\nx"),
            Err(Problem::BadFileName)
        ));
    }

    #[test]
    fn field_errors_name_the_file_and_field() {
        let cases = [
            (
                "---\nagents: [codex]\n---\nx",
                "field `description`: missing",
            ),
            (
                "---\ndescription: \"\"\nagents: [codex]\n---\nx",
                "field `description`: must not be empty",
            ),
            ("---\ndescription: d\n---\nx", "field `agents`: missing"),
            (
                "---\ndescription: d\nagents: []\n---\nx",
                "field `agents`: must list at least one agent",
            ),
            (
                "---\ndescription: d\nagents: [codex, codex]\n---\nx",
                "`codex` is listed twice",
            ),
            (
                "---\ndescription: d\nagents: [nope]\n---\nx",
                "unknown agent `nope`",
            ),
            (
                "---\ndescription: d\nagents: [acp-child]\n---\nx",
                "agent `acp-child` takes no subagent definitions",
            ),
            (
                "---\ndescripton: d\nagents: [codex]\n---\nx",
                "field `descripton`: unknown field",
            ),
            (
                "---\ndescription: d\nagents: [codex]\ncodex: {temperature: \"1\"}\n---\nx",
                "field `codex.temperature`: unknown codex option; allowed: model, model_reasoning_effort",
            ),
            (
                "---\ndescription: d\nagents: [codex]\ncodex: {model: 3}\n---\nx",
                "field `codex.model`: must be a non-empty string, got the number 3",
            ),
            (
                "---\ndescription: d\nagents: [codex]\ncodex: o3\n---\nx",
                "field `codex`: must be a table of codex options",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {tools: 123}\n---\nx",
                "field `dsh.tools`",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {tools: [\"\"]}\n---\nx",
                "field `dsh.tools`",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {maxTokens: -10}\n---\nx",
                "field `dsh.maxTokens`: must be a positive integer (unquoted), got the number -10",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {maxTokens: \"4096\"}\n---\nx",
                "got the string \"4096\"",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {maxTokens: true}\n---\nx",
                "got the boolean true",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {backgroundMode: invalid}\n---\nx",
                "field `dsh.backgroundMode`: must be one of: one-shot, continuable",
            ),
            (
                "---\ndescription: d\nagents: [codex]\n---\n  \n",
                "the body is empty",
            ),
            ("description: d\n", "has no YAML frontmatter"),
            ("---\ndescription: d\n", "has no YAML frontmatter"),
            ("---\n- a\n---\nx", "frontmatter must be a mapping"),
            (
                "---\ndescription: [\n---\nx",
                "frontmatter is not valid YAML",
            ),
        ];
        for (text, expected) in cases {
            let message = err(text);
            assert!(message.starts_with("subagents/review.md: "), "{message}");
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn wrong_kinds_of_value_are_named_in_the_error() {
        let cases = [
            (
                "---\ndescription: null\nagents: [codex]\n---\nx",
                "field `description`: must be a non-empty string, got nothing (null)",
            ),
            (
                "---\ndescription: true\nagents: [codex]\n---\nx",
                "field `description`: must be a non-empty string, got a boolean",
            ),
            (
                "---\ndescription: 7\nagents: [codex]\n---\nx",
                "field `description`: must be a non-empty string, got a number",
            ),
            (
                "---\ndescription: {a: b}\nagents: [codex]\n---\nx",
                "field `description`: must be a non-empty string, got a table",
            ),
            (
                "---\ndescription: d\nagents: codex\n---\nx",
                "field `agents`: must be a list of agent names, got a string; e.g. agents: [\"claude-code\"]",
            ),
            (
                "---\ndescription: d\nagents: [[codex]]\n---\nx",
                "field `agents`: each item must be an agent name, got a list",
            ),
            (
                "---\ndescription: d\nrun: {agent: 3}\n---\nx",
                "field `run.agent`: must be a non-empty string, got the number 3",
            ),
            (
                "---\ndescription: d\nrun: {tools: nope}\n---\nx",
                "field `run.tools`: must be a list of tool names, got the string \"nope\"",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {tools: []}\n---\nx",
                "field `dsh.tools`",
            ),
            (
                "---\ndescription: d\nagents: [dsh]\ndsh: {maxDepth: 3}\n---\nx",
                "field `dsh.maxDepth`: a number (3) must be enforced by the provider: set dsh.providerHonoursDepth: true if provider spawn enforces it, or write maxDepth: provider-managed",
            ),
            ("---\n---\nx", "field `description`: missing"),
            (
                "---\ndescription: d\nrun: {env: OPENAI_API_KEY}\n---\nx",
                "field `run.env`: must be a list of variable names, got the string \"OPENAI_API_KEY\"",
            ),
            (
                "---\ndescription: d\nrun: {denyTools: [1]}\n---\nx",
                "field `run.denyTools`: must be a list of tool names, got a list",
            ),
            (
                "---\ndescription: d\nrun: {maxDepth: -1}\n---\nx",
                "field `run.maxDepth`: must be a whole number, got the number -1",
            ),
            (
                "---\ndescription: d\nrun: {tokenBudget: 0}\n---\nx",
                "field `run.tokenBudget`: must be a whole number of tokens, at least 1, got the number 0",
            ),
            (
                "---\ndescription: d\nrun: {costBudget: 0}\n---\nx",
                "field `run.costBudget`: must be an amount above zero, in the agent's currency, got the number 0",
            ),
            (
                "---\ndescription: d\nrun: {sandbox: sealed}\n---\nx",
                "field `run.sandbox`: unknown sandbox mode \"sealed\": use off, read-only or workspace-write",
            ),
            (
                "---\ndescription: d\nrun: {network: udp}\n---\nx",
                "field `run.network`: unknown network setting \"udp\"",
            ),
        ];
        for (text, expected) in cases {
            let message = err(text);
            assert!(message.starts_with("subagents/review.md: "), "{message}");
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn a_definitions_sandbox_only_tightens_the_starters() {
        use crate::sandbox::{Mode, Network, Policy};
        let starter = Policy {
            mode: Mode::WorkspaceWrite,
            network: "tcp:443".parse().unwrap(),
            best_effort: true,
            ..Policy::default()
        };
        let loose = RunSpec {
            sandbox: Some(Mode::Off),
            network: Some(Network::On),
            ..RunSpec::default()
        };
        assert_eq!(loose.sandbox_within(&starter), starter);
        let tight = RunSpec {
            sandbox: Some(Mode::ReadOnly),
            network: Some(Network::Off),
            ..RunSpec::default()
        };
        let held = tight.sandbox_within(&starter);
        assert_eq!((held.mode, held.network), (Mode::ReadOnly, Network::Off));
        assert!(held.best_effort);
        assert_eq!(RunSpec::default().sandbox_within(&starter), starter);
        // YAML's bare on/off are booleans; they read as the settings they spell.
        let run = ok("---\ndescription: d\nrun: {sandbox: off, network: off}\n---\nB\n").run;
        let run = run.unwrap();
        assert_eq!(
            (run.sandbox, run.network),
            (Some(Mode::Off), Some(Network::Off))
        );
        let run = ok("---\ndescription: d\nrun: {network: on}\n---\nB\n")
            .run
            .unwrap();
        assert_eq!(run.network, Some(Network::On));
        assert!(
            err("---\ndescription: d\nrun: {sandbox: on}\n---\nB\n")
                .contains("field `run.sandbox`: must be a non-empty string, got the boolean true")
        );
    }

    #[test]
    fn option_coercions() {
        let d = ok(
            "---\ndescription: d\nagents: [dsh, grok]\ndsh: {tools: x, maxTokens: 4096, backgroundMode: continuable}\ngrok: {mcpInheritance: {a: 1}, agents_md: true}\n---\nx",
        );
        let dsh = d.options_for("dsh");
        assert_eq!(dsh["tools"], OptionValue::List(vec!["x".into()]));
        assert_eq!(dsh["maxTokens"], OptionValue::Int(4096));
        let grok = d.options_for("grok");
        assert_eq!(grok["agents_md"], OptionValue::Bool(true));
        assert!(matches!(grok["mcpInheritance"], OptionValue::Table(_)));
    }

    #[test]
    fn load_set_reports_every_problem_and_ignores_junk() {
        let good = b"---\ndescription: d\nagents: [codex]\n---\nbody\n".to_vec();
        let entries = vec![
            SourceEntry::File {
                name: "b.md".into(),
                contents: good.clone(),
            },
            SourceEntry::File {
                name: "a.md".into(),
                contents: good.clone(),
            },
            SourceEntry::File {
                name: ".DS_Store".into(),
                contents: vec![0xff],
            },
        ];
        let set = load_set(entries).unwrap();
        assert_eq!(
            set.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );

        let entries = vec![
            SourceEntry::File {
                name: "a.md".into(),
                contents: good,
            },
            SourceEntry::Symlink {
                name: "link.md".into(),
            },
            SourceEntry::Folder {
                name: "nested".into(),
            },
            SourceEntry::File {
                name: "notes.txt".into(),
                contents: vec![],
            },
            SourceEntry::Other {
                name: "pipe.md".into(),
            },
        ];
        let errors = load_set(entries).unwrap_err();
        let files: Vec<_> = errors.0.iter().map(|e| e.file.as_str()).collect();
        assert_eq!(files, ["link.md", "nested", "notes.txt", "pipe.md"]);
        assert!(
            errors
                .to_string()
                .starts_with("4 invalid subagent definitions; nothing was written")
        );
        assert_eq!(
            errors.0[3].problem.to_string(),
            Problem::NotAFile.to_string()
        );
        let one = load_set(vec![SourceEntry::Symlink {
            name: "link.md".into(),
        }])
        .unwrap_err();
        assert!(
            one.to_string()
                .starts_with("1 invalid subagent definition; nothing was written"),
            "{one}"
        );
    }

    #[test]
    fn a_run_permissions_name_is_its_serialized_name() {
        for (permission, name) in [
            (RunPermission::Relay, "relay"),
            (RunPermission::Reject, "reject"),
            (RunPermission::Allow, "allow"),
        ] {
            assert_eq!(permission.as_str(), name);
            assert_eq!(serde_json::to_value(permission).unwrap(), Value::from(name));
        }
    }
}
