//! Sync planning: from canonical definitions, a registry view and the current file contents to a
//! plan of operations per physical file. Pure: same inputs, same plan, zero writes.
//!
//! The flow, with the I/O done by the caller between the steps:
//! 1. [`RegistryView`]: the selected agents, each with its availability and [`Readiness`]
//!    (decided by [`readiness`] from facts the caller gathered).
//! 2. [`RegistryView::scan_request`]: which files to read and which folders to list.
//! 3. The caller fills a [`Snapshot`] (file facts: physical path, symlink, contents).
//! 4. [`plan()`]: operations (one row of the state table each), aggregated per physical file with
//!    the frozen pre-image and final contents; [`Plan::can_apply`] says whether it may execute.
//!
//! Invariants (docs/sync.md, "Invariants"): ownership comes only from the marker (see
//! [`render::is_managed`] and [`dsh`]); a conflict is written only when its exact `agent/name` is
//! forced; only managed orphans are removed, and only with prune; every mutation of one physical
//! file, the shared DSH file included, is folded into one final content. The [`Plan`] answers
//! every question about itself (can it apply, what blocks it, what each file's outcome is at
//! rest); the executor and the CLI ask it and never re-decide.

pub mod dsh;
pub mod fields;
pub mod import;
mod plan;
pub mod render;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use schemars::JsonSchema;
use serde::Serialize;

use crate::definition::{self, Definition};
use crate::registry::{self, AgentAvailability, AgentSpec, SyncTarget, TargetFormat};

pub use crate::registry::Scope;
pub use fields::{Dropped, dropped};
pub use plan::plan;
pub use report::{ChangeKind, Outcome};

/// What one operation does (one row of the state table, plus SKIP and ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The target is missing: write it.
    Create,
    /// Managed and changed, or unmanaged and forced: rewrite it.
    Update,
    /// Managed and identical.
    Noop,
    /// Present without our marker: preserved unless forced.
    Conflict,
    /// Managed, no longer defined: reported, preserved unless pruned.
    Orphan,
    /// Managed orphan, pruned.
    Remove,
    /// The agent cannot take definitions here (not installed, no project scope, missing extension).
    Skip,
    /// The target cannot be handled safely; blocks the whole plan.
    Error,
}

impl Action {
    /// Lowercase name as printed.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Noop => "noop",
            Action::Conflict => "conflict",
            Action::Orphan => "orphan",
            Action::Remove => "remove",
            Action::Skip => "skip",
            Action::Error => "error",
        }
    }
}

/// One planned operation on one target (a dedicated file, or one item of the shared file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub action: Action,
    pub agent: &'static str,
    /// The subagent name.
    pub name: String,
    /// The target path (as configured, before symlink resolution); `None` when the agent has no
    /// path in this scope.
    pub path: Option<PathBuf>,
    /// Why, in words.
    pub reason: String,
    /// Writing needs `--force agent/name` (an unmanaged target).
    pub requires_force: bool,
    /// Removing needs `--prune` (a managed orphan).
    pub requires_prune: bool,
    /// The operation may run: it needs no authorization, or it got it.
    pub authorized: bool,
}

impl Operation {
    /// `agent/name`, the identity `--force` takes.
    #[must_use]
    pub fn target(&self) -> String {
        format!("{}/{}", self.agent, self.name)
    }

    /// The flag that would resolve an operation that is held back, if one would.
    #[must_use]
    pub fn resolution(&self) -> Option<String> {
        match self.action {
            Action::Conflict => Some(format!("--force {}", self.target())),
            Action::Orphan => Some("--prune".to_owned()),
            _ => None,
        }
    }

    /// Whether the target is not what the definitions say (`sync --check`): it would be
    /// created, updated or removed, or it is a conflict, a managed orphan or an error. A no-op or
    /// a skip is in sync.
    #[must_use]
    pub fn drifts(&self) -> bool {
        !matches!(self.action, Action::Noop | Action::Skip)
    }

    /// Whether the operation holds the whole plan back: an error, or a conflict nobody
    /// authorized (an orphan without `--prune` is a notice, never a blocker).
    #[must_use]
    pub fn blocks(&self) -> bool {
        match self.action {
            Action::Error => true,
            Action::Conflict => !self.authorized,
            _ => false,
        }
    }
}

/// What the caller found at one target path. The caller resolves symlinks: a symlink that stays
/// in its folder is followed (`physical` is where it points), one that leaves it is
/// [`FileState::Unwritable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileFacts {
    /// The file that would be written.
    pub physical: PathBuf,
    /// The symlink target as read, when the path is a symlink.
    pub link: Option<PathBuf>,
    pub state: FileState,
}

/// The content side of [`FileFacts`]: the pre-image compared again just before writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    Missing,
    File(Vec<u8>),
    /// A folder, socket, device…
    NotAFile,
    /// It cannot be read or written safely (the reason, e.g. a symlink out of its folder).
    Unwritable(String),
}

/// The current state of every path the plan needs (see [`ScanRequest`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub files: BTreeMap<PathBuf, FileFacts>,
    /// Entry names of each listed folder (a missing folder lists nothing).
    pub folders: BTreeMap<PathBuf, Vec<String>>,
    /// Target paths whose folder the caller found it cannot write (permissions, a read-only file
    /// system), with why: writing or removing one is a plan error, so nothing is written.
    pub unwritable: BTreeMap<PathBuf, String>,
}

/// Whether an agent takes definitions now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "reason")]
pub enum Readiness {
    Ready,
    /// Every operation for the agent is SKIP, with this reason; it is not orphan-scanned.
    Skip(String),
    /// Every operation for the agent is ERROR, with this reason (blocks the plan).
    Blocked(String),
}

/// Decides whether an agent takes definitions, from facts the caller gathered: whether its
/// `requires` file exists under $HOME, and the contents of its config switch file, if any.
#[must_use]
pub fn readiness(
    (spec, target): (&AgentSpec, SyncTarget),
    scope: Scope,
    availability: &AgentAvailability,
    requires_present: bool,
    switch_contents: Option<&str>,
) -> Readiness {
    if !availability.is_installed() {
        let mut evidence: Vec<String> = spec
            .binaries
            .iter()
            .map(|b| format!("`{b}` on PATH"))
            .collect();
        evidence.extend(spec.marker_dirs.iter().map(|d| format!("~/{d}")));
        return Readiness::Skip(format!(
            "not installed on this host (no {})",
            evidence.join(", no ")
        ));
    }
    if target.template(scope).is_none() {
        return Readiness::Skip(format!(
            "{} has no project scope; use --scope user",
            spec.name
        ));
    }
    if let Some(required) = target.requires
        && !requires_present
    {
        return Readiness::Skip(format!(
            "needs ~/{required} (its subagent extension); install it, then sync again"
        ));
    }
    if let (Some(switch), Some(contents)) = (target.switch, switch_contents) {
        match switch.disables(contents) {
            Ok(false) => {}
            Ok(true) => {
                return Readiness::Blocked(format!(
                    "subagents are disabled in ~/{} ([{}] {} = false); enable them, or leave {} out with --agent",
                    switch.file, switch.table, switch.key, spec.name
                ));
            }
            Err(e) => return Readiness::Blocked(e.to_string()),
        }
    }
    Readiness::Ready
}

/// One selected agent as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    pub spec: &'static AgentSpec,
    /// Where and how the agent takes definitions ([`registry::sync_agents`]).
    #[serde(skip)]
    pub target: SyncTarget,
    pub availability: AgentAvailability,
    pub readiness: Readiness,
}

/// The agents a sync considers, in registry order, and where their paths are rooted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryView {
    pub scope: Scope,
    /// $HOME for `Scope::User`, the project root for `Scope::Project`.
    pub base: PathBuf,
    pub agents: Vec<AgentView>,
}

/// Where one agent's targets live in this scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub agent: &'static str,
    pub format: TargetFormat,
    pub base: PathBuf,
    pub template: &'static str,
}

impl Location {
    /// The target path of one subagent (the shared file for a shared format).
    #[must_use]
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.base.join(self.template.replace("{name}", name))
    }

    /// The folder listed to find orphans (`None` for a shared file).
    #[must_use]
    pub fn folder(&self) -> Option<PathBuf> {
        let (prefix, _) = self.template.split_once("{name}")?;
        Some(self.base.join(prefix.trim_end_matches('/')))
    }

    /// The subagent an entry of [`Location::folder`] would be, if any (`x.md` -> `x`, or the
    /// folder `x` for `{name}/agent.md`).
    #[must_use]
    pub fn name_of_entry(&self, entry: &str) -> Option<String> {
        let (_, suffix) = self.template.split_once("{name}")?;
        let name = if suffix.starts_with('/') {
            entry
        } else {
            entry.strip_suffix(suffix)?
        };
        definition::is_valid_name(name).then(|| name.to_owned())
    }
}

impl RegistryView {
    /// Where an agent's targets live (`None` when it has no path in this scope).
    #[must_use]
    pub fn location(&self, agent: &AgentView) -> Option<Location> {
        let target = agent.target;
        Some(Location {
            agent: agent.spec.name,
            format: target.format,
            base: self.base.clone(),
            template: target.template(self.scope)?,
        })
    }

    /// The files to read and folders to list before planning. Only ready agents are read: a
    /// skipped or blocked agent is never orphan-scanned.
    #[must_use]
    pub fn scan_request(&self, definitions: &[Definition]) -> ScanRequest {
        let mut request = ScanRequest::default();
        for agent in &self.agents {
            if agent.readiness != Readiness::Ready {
                continue;
            }
            let Some(location) = self.location(agent) else {
                continue;
            };
            match location.folder() {
                None => {
                    request.files.insert(location.path_for(""));
                }
                Some(folder) => {
                    for definition in definitions.iter().filter(|d| d.targets(agent.spec.name)) {
                        request.files.insert(location.path_for(&definition.name));
                    }
                    request.folders.insert(folder, location);
                }
            }
        }
        request
    }
}

/// What [`plan()`] needs read: `files` (each with [`FileFacts`]), and `folders` to list, whose
/// candidate entries ([`ScanRequest::candidates`]) must be read too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanRequest {
    pub files: BTreeSet<PathBuf>,
    pub folders: BTreeMap<PathBuf, Location>,
}

impl ScanRequest {
    /// The files to read among a listed folder's entries.
    #[must_use]
    pub fn candidates(&self, folder: &Path, entries: &[String]) -> Vec<PathBuf> {
        let Some(location) = self.folders.get(folder) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|entry| location.name_of_entry(entry))
            .map(|name| location.path_for(&name))
            .collect()
    }
}

/// The longest file name (one path component, in bytes) Linux and macOS file systems take.
pub const NAME_MAX: usize = 255;
/// The longest path (in bytes, without the final NUL) the kernel takes.
pub const PATH_MAX: usize = 4095;

/// Why a target path cannot exist on the file systems we write to, if it cannot: a component
/// longer than [`NAME_MAX`] bytes (the subagent name plus the agent's extension) or a path longer
/// than [`PATH_MAX`].
#[must_use]
pub fn path_too_long(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt as _;
    if let Some(long) = path
        .components()
        .map(|c| c.as_os_str().as_bytes().len())
        .find(|&len| len > NAME_MAX)
    {
        return Some(format!(
            "a file name of {long} bytes is too long (the limit is {NAME_MAX}, extension included); shorten the subagent name"
        ));
    }
    let len = path.as_os_str().as_bytes().len();
    (len > PATH_MAX).then(|| {
        format!("the path is {len} bytes long (the limit is {PATH_MAX}); shorten the subagent name")
    })
}

/// One `--force` target: exactly one agent and one subagent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForceTarget {
    pub agent: &'static str,
    pub name: String,
}

impl fmt::Display for ForceTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.agent, self.name)
    }
}

/// Why a `--force` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForceTargetError {
    #[error("empty --force target; name one target as <agent>/<name>, e.g. claude-code/review")]
    Empty,
    #[error(
        "wildcards are not allowed in --force `{0}`: each target is authorized one by one as <agent>/<name>"
    )]
    Wildcard(String),
    #[error("--force `{0}` is not <agent>/<name> (exactly one `/`), e.g. claude-code/review")]
    Shape(String),
    #[error("--force `{value}`: unknown agent `{agent}`; sync agents: {known}")]
    UnknownAgent {
        value: String,
        agent: String,
        known: String,
    },
    #[error("--force `{value}`: `{name}` is not a subagent name (^[a-z][a-z0-9-]*$)")]
    BadName { value: String, name: String },
}

impl FromStr for ForceTarget {
    type Err = ForceTargetError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.is_empty() {
            return Err(ForceTargetError::Empty);
        }
        if value.contains(['*', '?', '[', ']', '{', '}']) {
            return Err(ForceTargetError::Wildcard(value.to_owned()));
        }
        let (agent, name) = value
            .split_once('/')
            .filter(|(_, name)| !name.contains('/'))
            .ok_or_else(|| ForceTargetError::Shape(value.to_owned()))?;
        let (spec, _) =
            registry::find_sync(agent).ok_or_else(|| ForceTargetError::UnknownAgent {
                value: value.to_owned(),
                agent: agent.to_owned(),
                known: registry::sync_agent_names().join(", "),
            })?;
        if !definition::is_valid_name(name) {
            return Err(ForceTargetError::BadName {
                value: value.to_owned(),
                name: name.to_owned(),
            });
        }
        Ok(ForceTarget {
            agent: spec.name,
            name: name.to_owned(),
        })
    }
}

/// What the user authorized beyond the default (which writes only what it owns or creates).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Authorization {
    pub forces: BTreeSet<ForceTarget>,
    pub prune: bool,
    /// Files another tool wrote with the same marker convention, taken as ours for this run
    /// (`--adopt`); only with that tool's exact marker for the same name.
    pub adopt: Option<Adopt>,
}

/// A tool whose generated files `acp-host sync --adopt` takes over: its marker, at our marker's
/// position, for the same subagent, is read as ours once (and rewritten to ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopt {
    /// Aikito: `generated by aikito from subagents/<name>.md - edits will be overwritten`.
    Aikito,
}

impl Adopt {
    /// The tool's name, as its marker writes it.
    #[must_use]
    pub fn tool(self) -> &'static str {
        match self {
            Adopt::Aikito => "aikito",
        }
    }
}

/// What happens to one physical file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Left as it is.
    Keep,
    /// Replaced (or created) with exactly these bytes.
    Write(Vec<u8>),
    /// Deleted.
    Remove,
}

impl Change {
    #[must_use]
    pub fn kind(&self) -> ChangeKind {
        ChangeKind::from(self)
    }
}

/// Every operation on one physical file, folded into one change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePlan {
    /// The file written (symlinks inside the target folder resolved).
    pub path: PathBuf,
    /// The path as configured (re-read just before writing to check the pre-image).
    pub target: PathBuf,
    /// What was read at planning time; `None` when the file was never read (a skipped agent).
    pub pre_image: Option<FileFacts>,
    pub change: Change,
    /// Indices into [`Plan::operations`].
    pub operations: Vec<usize>,
}

impl FilePlan {
    /// The current bytes (empty when missing or unread).
    #[must_use]
    pub fn current(&self) -> &[u8] {
        match &self.pre_image {
            Some(FileFacts {
                state: FileState::File(bytes),
                ..
            }) => bytes,
            _ => &[],
        }
    }
}

/// The whole plan: operations in display order (agent registry order, then name), files sorted by
/// path, and plan-level errors (collisions, `--force` targets that match no conflict).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub operations: Vec<Operation>,
    pub files: Vec<FilePlan>,
    pub errors: Vec<String>,
}

impl Plan {
    /// No blocking operation ([`Operation::blocks`]) and no plan-level error.
    #[must_use]
    pub fn can_apply(&self) -> bool {
        self.errors.is_empty() && !self.operations.iter().any(Operation::blocks)
    }

    /// `sync --check`'s verdict: no plan-level error, no file that would change and no
    /// operation that drifts ([`Operation::drifts`]; so the plan can apply, too).
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.errors.is_empty()
            && self.changes() == 0
            && !self.operations.iter().any(Operation::drifts)
    }

    /// The operations that drift, for `sync --check`.
    pub fn drift(&self) -> impl Iterator<Item = &Operation> {
        self.operations.iter().filter(|op| op.drifts())
    }

    /// How many conflicts were not authorized by `--force`.
    #[must_use]
    pub fn unauthorized_conflicts(&self) -> usize {
        self.operations
            .iter()
            .filter(|op| op.action == Action::Conflict && !op.authorized)
            .count()
    }

    /// Error operations plus plan-level errors.
    #[must_use]
    pub fn error_count(&self) -> usize {
        self.count(Action::Error) + self.errors.len()
    }

    /// How many files would change.
    #[must_use]
    pub fn changes(&self) -> usize {
        self.files
            .iter()
            .filter(|f| f.change != Change::Keep)
            .count()
    }

    /// How many operations have this action.
    #[must_use]
    pub fn count(&self, action: Action) -> usize {
        self.operations
            .iter()
            .filter(|op| op.action == action)
            .count()
    }

    /// The operations of one file.
    pub fn operations_of<'a>(&'a self, file: &'a FilePlan) -> impl Iterator<Item = &'a Operation> {
        file.operations.iter().map(|&i| &self.operations[i])
    }

    /// The outcome of a file that is not written: conflicted when one of its operations blocks,
    /// skipped when every one is a skip, noop otherwise.
    #[must_use]
    pub fn resting_outcome(&self, file: &FilePlan) -> Outcome {
        if self.operations_of(file).any(Operation::blocks) {
            Outcome::Conflicted
        } else if self.operations_of(file).all(|op| op.action == Action::Skip) {
            Outcome::Skipped
        } else {
            Outcome::Noop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_targets() {
        let t: ForceTarget = "claude-code/verifier".parse().unwrap();
        assert_eq!(t.to_string(), "claude-code/verifier");
        assert_eq!("".parse::<ForceTarget>(), Err(ForceTargetError::Empty));
        assert!(matches!(
            "claude-code/*".parse::<ForceTarget>(),
            Err(ForceTargetError::Wildcard(_))
        ));
        assert!(matches!(
            "*/x".parse::<ForceTarget>(),
            Err(ForceTargetError::Wildcard(_))
        ));
        for shape in ["claude-code", "a/b/c", "claude-code:x"] {
            let refused = shape.parse::<ForceTarget>();
            assert!(
                matches!(refused, Err(ForceTargetError::Shape(_))),
                "{shape}"
            );
        }
        assert!(matches!(
            "claude/x".parse::<ForceTarget>(),
            Err(ForceTargetError::UnknownAgent { .. })
        ));
        assert!(matches!(
            "acp-child/x".parse::<ForceTarget>(),
            Err(ForceTargetError::UnknownAgent { .. })
        ));
        assert!(matches!(
            "codex/X".parse::<ForceTarget>(),
            Err(ForceTargetError::BadName { .. })
        ));
    }

    #[test]
    fn paths_longer_than_the_file_system_takes() {
        let name = "a".repeat(249);
        assert_eq!(
            path_too_long(Path::new(&format!("/h/.claude/agents/{name}.md"))),
            None
        );
        let copilot = format!("/h/.copilot/agents/{name}.agent.md");
        assert!(
            path_too_long(Path::new(&copilot))
                .is_some_and(|r| r.starts_with("a file name of 258 bytes")),
        );
        let deep = format!("/{}", vec!["b".repeat(200); 21].join("/"));
        assert!(path_too_long(Path::new(&deep)).is_some_and(|r| r.starts_with("the path is")));
    }

    #[test]
    fn locations() {
        let agy = Location {
            agent: "agy",
            format: TargetFormat::CodexToml,
            base: PathBuf::from("/h"),
            template: ".gemini/config/agents/{name}/agent.md",
        };
        assert_eq!(
            agy.path_for("x"),
            PathBuf::from("/h/.gemini/config/agents/x/agent.md")
        );
        assert_eq!(
            agy.folder(),
            Some(PathBuf::from("/h/.gemini/config/agents"))
        );
        assert_eq!(agy.name_of_entry("x").as_deref(), Some("x"));
        let copilot = Location {
            template: ".copilot/agents/{name}.agent.md",
            ..agy.clone()
        };
        assert_eq!(copilot.name_of_entry("x.agent.md").as_deref(), Some("x"));
        assert_eq!(copilot.name_of_entry("x.md"), None);
        let claude = Location {
            template: ".claude/agents/{name}.md",
            ..agy.clone()
        };
        assert_eq!(claude.name_of_entry("x.agent.md"), None);
        assert_eq!(claude.name_of_entry("Notes.md"), None);
        let dsh = Location {
            template: ".dsh/cordis.patch.yml",
            ..agy
        };
        assert_eq!(dsh.folder(), None);
    }

    #[test]
    fn readiness_rules() {
        let pi = registry::find_sync("pi").unwrap();
        let installed = AgentAvailability::MarkerDir(".pi".into());
        assert_eq!(
            readiness(pi, Scope::User, &installed, true, None),
            Readiness::Ready
        );
        assert!(
            matches!(readiness(pi, Scope::User, &installed, false, None), Readiness::Skip(r) if r.contains(".pi/agent/extensions/subagent/index.ts"))
        );
        assert!(
            matches!(readiness(pi, Scope::Project, &installed, true, None), Readiness::Skip(r) if r.contains("no project scope"))
        );
        assert!(
            matches!(readiness(pi, Scope::User, &AgentAvailability::NotInstalled, true, None), Readiness::Skip(r) if r.starts_with("not installed on this host"))
        );
        let codex = registry::find_sync("codex").unwrap();
        let on_path = AgentAvailability::OnPath("codex".into());
        assert!(
            matches!(readiness(codex, Scope::User, &on_path, true, Some("[agents]\nenabled = false\n")), Readiness::Blocked(r) if r.contains("disabled"))
        );
        assert_eq!(
            readiness(codex, Scope::User, &on_path, true, Some("")),
            Readiness::Ready
        );
    }

    #[test]
    fn an_actions_name_is_its_serialized_name() {
        for (action, name) in [
            (Action::Create, "create"),
            (Action::Update, "update"),
            (Action::Noop, "noop"),
            (Action::Conflict, "conflict"),
            (Action::Orphan, "orphan"),
            (Action::Remove, "remove"),
            (Action::Skip, "skip"),
            (Action::Error, "error"),
        ] {
            assert_eq!(action.as_str(), name);
            assert_eq!(serde_json::to_value(action).unwrap(), name);
        }
    }

    fn op(action: Action, authorized: bool) -> Operation {
        Operation {
            action,
            agent: "codex",
            name: "review".into(),
            path: None,
            reason: String::new(),
            requires_force: action == Action::Conflict,
            requires_prune: action == Action::Orphan,
            authorized,
        }
    }

    #[test]
    fn a_held_back_operation_names_the_flag_that_resolves_it() {
        assert_eq!(
            op(Action::Conflict, false).resolution().as_deref(),
            Some("--force codex/review")
        );
        assert_eq!(
            op(Action::Orphan, false).resolution().as_deref(),
            Some("--prune")
        );
        for action in [Action::Create, Action::Skip, Action::Error] {
            assert_eq!(op(action, true).resolution(), None, "{action:?}");
        }
    }

    fn file(operations: Vec<usize>, pre_image: Option<FileState>) -> FilePlan {
        FilePlan {
            path: PathBuf::from("/h/a.md"),
            target: PathBuf::from("/h/a.md"),
            pre_image: pre_image.map(|state| FileFacts {
                physical: PathBuf::from("/h/a.md"),
                link: None,
                state,
            }),
            change: Change::Keep,
            operations,
        }
    }

    #[test]
    fn a_plan_counts_its_blockers_and_the_resting_outcome_of_each_file() {
        let plan = Plan {
            operations: vec![
                op(Action::Conflict, false),
                op(Action::Conflict, true),
                op(Action::Skip, true),
                op(Action::Skip, true),
                op(Action::Noop, true),
                op(Action::Error, true),
            ],
            files: Vec::new(),
            errors: vec!["two definitions write one file".into()],
        };
        assert_eq!(plan.unauthorized_conflicts(), 1);
        assert!(!plan.in_sync());
        assert_eq!(plan.drift().count(), 3, "two conflicts and an error");
        assert_eq!(plan.error_count(), 2, "one error operation, one plan error");
        assert!(!plan.can_apply());
        assert_eq!(
            plan.resting_outcome(&file(vec![0, 2], None)),
            Outcome::Conflicted
        );
        assert_eq!(
            plan.resting_outcome(&file(vec![5], None)),
            Outcome::Conflicted
        );
        assert_eq!(
            plan.resting_outcome(&file(vec![2, 3], None)),
            Outcome::Skipped
        );
        assert_eq!(plan.resting_outcome(&file(vec![1, 2], None)), Outcome::Noop);
        assert_eq!(plan.resting_outcome(&file(vec![4], None)), Outcome::Noop);
    }

    #[test]
    fn only_noops_and_skips_are_in_sync() {
        for (action, drifts) in [
            (Action::Create, true),
            (Action::Update, true),
            (Action::Noop, false),
            (Action::Conflict, true),
            (Action::Orphan, true),
            (Action::Remove, true),
            (Action::Skip, false),
            (Action::Error, true),
        ] {
            assert_eq!(op(action, true).drifts(), drifts, "{action:?}");
        }
        let quiet = Plan {
            operations: vec![op(Action::Noop, true), op(Action::Skip, true)],
            ..Plan::default()
        };
        assert!(quiet.in_sync());
        let refused = Plan {
            errors: vec!["collision".into()],
            ..quiet
        };
        assert!(!refused.in_sync());
    }

    #[test]
    fn a_files_current_bytes_are_empty_unless_it_was_read_as_a_file() {
        let read = file(vec![], Some(FileState::File(b"old".to_vec())));
        assert_eq!(read.current(), b"old");
        assert_eq!(file(vec![], Some(FileState::Missing)).current(), b"");
        assert_eq!(file(vec![], Some(FileState::NotAFile)).current(), b"");
        assert_eq!(file(vec![], None).current(), b"");
    }

    #[test]
    fn a_change_has_the_kind_the_report_shows() {
        assert_eq!(Change::Keep.kind(), ChangeKind::Keep);
        assert_eq!(Change::Write(b"x".to_vec()).kind(), ChangeKind::Write);
        assert_eq!(Change::Remove.kind(), ChangeKind::Remove);
    }

    #[test]
    fn an_unreadable_config_switch_blocks_the_agent() {
        let codex = registry::find_sync("codex").unwrap();
        let on_path = AgentAvailability::OnPath("codex".into());
        let blocked = readiness(codex, Scope::User, &on_path, true, Some("[agents\n"));
        assert!(
            matches!(&blocked, Readiness::Blocked(reason) if reason.contains(".codex/config.toml")),
            "{blocked:?}"
        );
    }

    #[test]
    fn an_agent_without_a_path_in_the_scope_is_not_scanned() {
        let (spec, target) = registry::find_sync("pi").unwrap();
        let view = RegistryView {
            scope: Scope::Project,
            base: PathBuf::from("/p"),
            agents: vec![AgentView {
                spec,
                target,
                availability: AgentAvailability::MarkerDir(".pi".into()),
                readiness: Readiness::Ready,
            }],
        };
        assert_eq!(view.location(&view.agents[0]), None);
        assert_eq!(view.scan_request(&[]), ScanRequest::default());
        assert_eq!(
            ScanRequest::default().candidates(Path::new("/p/.pi"), &["a.md".into()]),
            Vec::<PathBuf>::new(),
            "a folder that was not asked for has no candidates"
        );
    }
}
