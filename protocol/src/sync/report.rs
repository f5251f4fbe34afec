//! The records a sync hands back: what happened to each physical file ([`ExecutionResult`]) and
//! the one JSON object `acp-host sync --json` prints ([`SyncOutput`]).
//!
//! Invariant: these types are the machine contract. Field order and names are the JSON users
//! parse (camelCase); a change here is a change of `sync --json`, and of its JSON Schema
//! (`schemars`).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Serialize;

use super::import::Adoption;
use super::{Change, Dropped, Operation, Plan};

/// What happens to one physical file, without its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    Keep,
    Write,
    Remove,
}

impl From<&Change> for ChangeKind {
    fn from(change: &Change) -> Self {
        match change {
            Change::Keep => ChangeKind::Keep,
            Change::Write(_) => ChangeKind::Write,
            Change::Remove => ChangeKind::Remove,
        }
    }
}

/// What happened to one physical file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Written or removed.
    Applied,
    /// Nothing to change (up to date, or an orphan left in place).
    Noop,
    /// Not written: the agent is skipped, or the run stopped before this file.
    Skipped,
    /// Holds an unauthorized conflict or an error; never written.
    Conflicted,
    /// The write (or the pre-image check) failed.
    Failed,
}

/// The result for one physical file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileResult {
    pub path: PathBuf,
    pub outcome: Outcome,
    pub change: ChangeKind,
    /// Why it was skipped or how it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The copy of the previous contents, when the file was replaced or removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<PathBuf>,
}

/// The structured result of executing a plan: every physical file with its outcome, and what
/// stopped the run if something did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionResult {
    /// Every file that had to change did, and the plan could apply.
    pub success: bool,
    /// One entry per physical file of the plan, in path order.
    pub files: Vec<FileResult>,
    /// What stopped the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub failed_files: Vec<PathBuf>,
    /// Some files were written before a failure: the targets are a mix of old and new.
    pub partial: bool,
    /// Where this run's backups are (only when it made some).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_dir: Option<PathBuf>,
}

impl ExecutionResult {
    /// How many files ended with this outcome.
    #[must_use]
    pub fn count(&self, outcome: Outcome) -> usize {
        self.files.iter().filter(|f| f.outcome == outcome).count()
    }

    /// Whether restoring from backups may be needed (a partial run).
    #[must_use]
    pub fn recovery_required(&self) -> bool {
        self.partial
    }
}

/// One physical file of the plan as `sync --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedFile {
    pub path: PathBuf,
    pub change: ChangeKind,
    /// Indices into [`SyncReport::operations`].
    pub operations: Vec<usize>,
}

/// The unified diff of one file that changes (`--diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileDiff {
    pub path: PathBuf,
    /// Unified diff, old contents to new (no `---`/`+++` header).
    pub diff: String,
}

/// The object `acp-host sync --json` prints once a plan exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    /// The run applied (or, under `--dry-run`, would apply; under `--check`, every target is in
    /// sync).
    pub success: bool,
    pub dry_run: bool,
    /// `--check`: nothing written, and `success` says whether any target drifts.
    pub check: bool,
    pub can_apply: bool,
    /// How many files change.
    pub changes: usize,
    pub operations: Vec<Operation>,
    pub files: Vec<PlannedFile>,
    /// Plan-level errors (collisions, a `--force` that matches no conflict).
    pub errors: Vec<String>,
    /// The execution result; `null` under `--dry-run`.
    pub result: Option<ExecutionResult>,
    /// Only with `--diff`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diffs: Option<Vec<FileDiff>>,
    /// The fields a target cannot hold for a subagent written to it (`crate::sync::dropped`).
    pub dropped: Vec<Dropped>,
}

impl SyncReport {
    /// The report of a plan and, unless it was a dry run, its execution.
    #[must_use]
    pub fn new(
        plan: &Plan,
        result: Option<ExecutionResult>,
        diffs: Option<Vec<FileDiff>>,
        dropped: Vec<Dropped>,
    ) -> Self {
        SyncReport {
            success: result
                .as_ref()
                .map_or_else(|| plan.can_apply(), |r| r.success),
            dry_run: result.is_none(),
            check: false,
            can_apply: plan.can_apply(),
            changes: plan.changes(),
            operations: plan.operations.clone(),
            files: plan
                .files
                .iter()
                .map(|f| PlannedFile {
                    path: f.path.clone(),
                    change: ChangeKind::from(&f.change),
                    operations: f.operations.clone(),
                })
                .collect(),
            errors: plan.errors.clone(),
            result,
            diffs,
            dropped,
        }
    }

    /// The report of `sync --check`: nothing executed, success only when every target is in
    /// sync ([`Plan::in_sync`]).
    #[must_use]
    pub fn check(plan: &Plan, diffs: Option<Vec<FileDiff>>, dropped: Vec<Dropped>) -> Self {
        SyncReport {
            success: plan.in_sync(),
            check: true,
            ..SyncReport::new(plan, None, diffs, dropped)
        }
    }
}

/// The object `acp-host sync --adopt AGENT --json` prints: every file of the agent's read back,
/// and the sync that marked the originals as managed, when one ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptReport {
    /// Every adoption could be written (and the marking sync, if one ran, applied).
    pub success: bool,
    pub dry_run: bool,
    pub adoptions: Vec<Adoption>,
    /// The canonical files written.
    pub written: Vec<PathBuf>,
    /// The sync that took the originals over (`--adopt-mark`, or `--force` for each), if one ran.
    pub sync: Option<SyncReport>,
}

/// The object `acp-host sync --json` prints when no plan could be made (unreadable source,
/// invalid definitions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncAborted {
    /// Always `false`.
    pub success: bool,
    pub error: String,
}

/// Everything `acp-host sync --json` may print: one object, a report or an abort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SyncOutput {
    Report(Box<SyncReport>),
    Adopted(Box<AdoptReport>),
    Aborted(SyncAborted),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_dry_run_serializes_in_the_documented_shape() {
        let report = SyncReport::new(&Plan::default(), None, None, Vec::new());
        let json = serde_json::to_string(&SyncOutput::Report(Box::new(report))).unwrap();
        assert_eq!(
            json,
            r#"{"success":true,"dryRun":true,"check":false,"canApply":true,"changes":0,"operations":[],"files":[],"errors":[],"result":null,"dropped":[]}"#
        );
        let check = SyncReport::check(&Plan::default(), None, Vec::new());
        assert!(check.success && check.check && check.dry_run);
        let aborted = SyncOutput::Aborted(SyncAborted {
            success: false,
            error: "x".into(),
        });
        assert_eq!(
            serde_json::to_string(&aborted).unwrap(),
            r#"{"success":false,"error":"x"}"#
        );
        let schema = serde_json::to_value(schemars::schema_for!(SyncOutput)).unwrap();
        assert!(schema["anyOf"].is_array(), "{schema}");
    }

    #[test]
    fn a_report_lists_each_planned_file_with_its_change_and_the_run_counts_outcomes() {
        let plan = Plan {
            operations: Vec::new(),
            files: vec![
                super::super::FilePlan {
                    path: PathBuf::from("/h/a.md"),
                    target: PathBuf::from("/h/a.md"),
                    pre_image: None,
                    change: Change::Write(b"new".to_vec()),
                    operations: vec![0],
                },
                super::super::FilePlan {
                    path: PathBuf::from("/h/b.md"),
                    target: PathBuf::from("/h/b.md"),
                    pre_image: None,
                    change: Change::Remove,
                    operations: vec![1, 2],
                },
            ],
            errors: Vec::new(),
        };
        let file = |path: &str, outcome| FileResult {
            path: PathBuf::from(path),
            outcome,
            change: ChangeKind::Write,
            detail: None,
            backup: None,
        };
        let result = ExecutionResult {
            success: false,
            files: vec![
                file("/h/a.md", Outcome::Applied),
                file("/h/b.md", Outcome::Failed),
            ],
            error: Some("disk full".into()),
            failed_files: vec![PathBuf::from("/h/b.md")],
            partial: true,
            backup_dir: None,
        };
        assert_eq!(result.count(Outcome::Applied), 1);
        assert_eq!(result.count(Outcome::Failed), 1);
        assert_eq!(result.count(Outcome::Skipped), 0);
        assert!(result.recovery_required());
        let report = SyncReport::new(&plan, Some(result), None, Vec::new());
        assert!(!report.success, "the execution decides, not the plan");
        assert!(
            !SyncReport::check(&plan, None, Vec::new()).success,
            "two files would change: not in sync"
        );
        assert!(!report.dry_run);
        assert!(report.can_apply);
        assert_eq!(report.changes, 2);
        assert_eq!(
            report.files,
            [
                PlannedFile {
                    path: PathBuf::from("/h/a.md"),
                    change: ChangeKind::Write,
                    operations: vec![0],
                },
                PlannedFile {
                    path: PathBuf::from("/h/b.md"),
                    change: ChangeKind::Remove,
                    operations: vec![1, 2],
                },
            ]
        );
    }
}
