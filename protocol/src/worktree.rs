//! Isolation in a git worktree: every rule of `isolation: worktree` that needs no I/O.
//!
//! A child started with a worktree works in its own checkout of the parent's `HEAD` (or a base
//! the person names), under the repository's [`WORKTREES_DIR`]`/<name>/`, on a new branch
//! [`branch`]`(name)`. acp-host creates it through git before the child starts and settles it
//! after the child ends ([`dispose`]): no change removes it with its branch; changes are
//! committed on the branch (or left uncommitted when asked, or when the child did not finish)
//! and kept; the run's record says which ([`WorktreeRecord`]). While its run lives, a worktree
//! is locked with a reason naming the run's process ([`lock_reason`]), so that `acp-host
//! worktrees prune` can tell a live run's worktree from one a killed host left ([`prune`]).
//!
//! Invariants: pure; a name is one path component and a valid branch name ([`validate_name`]),
//! so `<dir>/<name>` and `acp/<name>` never escape or collide with git's own names; the exclude
//! line is added to `.git/info/exclude` once ([`with_exclude`]), never to a tracked file;
//! nothing is removed that holds a change.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::status::Status;

/// Where worktrees go, relative to the main worktree's top folder.
pub const WORKTREES_DIR: &str = ".acp-host/worktrees";

/// The line of `.git/info/exclude` that keeps [`WORKTREES_DIR`] out of `git status`.
pub const EXCLUDE_LINE: &str = "/.acp-host/";

/// The prefix of every branch a worktree is created on.
pub const BRANCH_PREFIX: &str = "acp/";

/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// How many names are tried (`name`, `name-2`, ...) before a start gives up.
pub const MAX_CANDIDATES: usize = 100;

/// The file (gitignore syntax, at the parent's top folder) naming ignored files to copy in.
pub const INCLUDE_FILE: &str = ".worktreeinclude";

/// The name and email a worktree's commit is made with (author and committer).
pub const COMMIT_IDENTITY: (&str, &str) = ("acp-host", "acp-host@localhost");

/// The longest commit subject, in characters (a longer first line is cut, with `...`).
pub const MAX_SUBJECT_CHARS: usize = 72;

/// A worktree name that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("worktree name is empty: pass a name such as fix-login, or none to get one")]
    Empty,
    #[error("worktree name {name:?} is longer than {MAX_NAME_LEN} characters: pass a shorter one")]
    TooLong { name: String },
    #[error(
        "worktree name {name:?} has {found:?}: use letters, digits, '-', '_' and '.' (not first, not '..', not ending in .lock)"
    )]
    Invalid { name: String, found: String },
}

/// Checks that `name` is one path component and a valid branch name after [`BRANCH_PREFIX`]:
/// ASCII letters, digits, `-`, `_`, `.`; not starting with `-` or `.`; no `..`; not ending in
/// `.lock` or `.`.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { name: name.into() });
    }
    let invalid = |found: &str| NameError::Invalid {
        name: name.into(),
        found: found.into(),
    };
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(&bad.to_string()));
    }
    for (bad, found) in [
        (name.starts_with('-'), "a leading '-'"),
        (name.starts_with('.'), "a leading '.'"),
        (name.contains(".."), "'..'"),
        (
            name.to_ascii_lowercase().ends_with(".lock"),
            "a trailing .lock",
        ),
        (name.ends_with('.'), "a trailing '.'"),
    ] {
        if bad {
            return Err(invalid(found));
        }
    }
    Ok(())
}

/// The name of a worktree nobody named: the prompt's first words (letters and digits, joined
/// by `-`, at most 24 characters) and the first 8 characters of the run id, or `run-<id>`.
#[must_use]
pub fn default_name(prompt: &str, run_id: &str) -> String {
    let mut slug = String::new();
    for word in prompt
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty())
    {
        let word = word.to_ascii_lowercase();
        if slug.len() + word.len() + 1 > 24 {
            break;
        }
        slug.push_str(&word);
        slug.push('-');
    }
    let id: String = run_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    if slug.is_empty() {
        format!("run-{id}")
    } else {
        format!("{slug}{id}")
    }
}

/// The names tried in turn for `name` (already valid): `name`, `name-2`, ... up to
/// [`MAX_CANDIDATES`] of them, each cut so that it stays within [`MAX_NAME_LEN`].
pub fn candidates(name: &str) -> impl Iterator<Item = String> + '_ {
    (1..=MAX_CANDIDATES).map(move |n| {
        if n == 1 {
            return name.to_owned();
        }
        let suffix = format!("-{n}");
        let keep = MAX_NAME_LEN - suffix.len();
        let stem = name.get(..keep.min(name.len())).unwrap_or(name);
        format!("{}{suffix}", stem.trim_end_matches('.'))
    })
}

/// The branch of worktree `name`.
#[must_use]
pub fn branch(name: &str) -> String {
    format!("{BRANCH_PREFIX}{name}")
}

/// The folder of worktree `name` in the repository whose main worktree is `top`.
#[must_use]
pub fn folder(top: &Path, name: &str) -> PathBuf {
    top.join(WORKTREES_DIR).join(name)
}

/// The name of the worktree at `path` when it is one of ours (a folder directly in
/// [`WORKTREES_DIR`] of `top`), else `None`.
#[must_use]
pub fn name_of(top: &Path, path: &Path) -> Option<String> {
    let name = path.strip_prefix(top.join(WORKTREES_DIR)).ok()?;
    let name = name.to_str()?;
    validate_name(name).ok().map(|()| name.to_owned())
}

/// `.git/info/exclude`'s new text when `existing` lacks [`EXCLUDE_LINE`], else `None`.
#[must_use]
pub fn with_exclude(existing: &str) -> Option<String> {
    if existing.lines().any(|line| line.trim() == EXCLUDE_LINE) {
        return None;
    }
    let mut text = existing.to_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# acp-host's worktrees (acp-host run --worktree)\n");
    text.push_str(EXCLUDE_LINE);
    text.push('\n');
    Some(text)
}

/// The commit message of a worktree's changes: the prompt's first non-empty line (at most
/// [`MAX_SUBJECT_CHARS`]) as subject, or `acp-host run <id>`; then the run id.
#[must_use]
pub fn commit_message(prompt: &str, run_id: &str) -> String {
    let first = prompt.lines().map(str::trim).find(|line| !line.is_empty());
    let subject = match first {
        None => format!("acp-host run {run_id}"),
        Some(line) if line.chars().count() > MAX_SUBJECT_CHARS => {
            let cut: String = line.chars().take(MAX_SUBJECT_CHARS - 3).collect();
            format!("{}...", cut.trim_end())
        }
        Some(line) => line.to_owned(),
    };
    format!("{subject}\n\nacp-host run {run_id}\n")
}

/// What a worktree's changes add up to.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct DiffStat {
    pub changed_files: u64,
    pub insertions: u64,
    pub deletions: u64,
}

/// Adds up `git diff --numstat` output: one line per file, `added<TAB>deleted<TAB>path`
/// (`-` for both in a binary file, which counts as changed with no lines).
#[must_use]
pub fn parse_numstat(text: &str) -> DiffStat {
    let mut stat = DiffStat::default();
    for line in text.lines().filter(|line| !line.is_empty()) {
        let mut fields = line.splitn(3, '\t');
        let mut count = || {
            fields
                .next()
                .and_then(|field| field.parse::<u64>().ok())
                .unwrap_or(0)
        };
        stat.insertions += count();
        stat.deletions += count();
        stat.changed_files += 1;
    }
    stat
}

/// What became of a worktree when its child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Nothing changed: the worktree and its branch are gone.
    Removed,
    /// The changes were committed on the branch; the worktree is kept.
    Committed,
    /// The changes were left uncommitted (staged) as asked (`--worktree-keep-dirty`); kept.
    Uncommitted,
    /// The child did not finish (killed, timed out, failed): its changes are left uncommitted
    /// (staged) in the kept worktree for a person to look at.
    Interrupted,
}

impl Outcome {
    /// The name in records.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Removed => "removed",
            Outcome::Committed => "committed",
            Outcome::Uncommitted => "uncommitted",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// Whether a run that ended with `status` finished its turn (its changes are its answer) rather
/// than being stopped part way (cancelled, timed out, over budget, failed).
#[must_use]
pub fn finished(status: Status) -> bool {
    matches!(
        status,
        Status::Completed
            | Status::MaxTokens
            | Status::MaxTurnRequests
            | Status::Refusal
            | Status::SchemaMismatch
    )
}

/// What to do with a worktree at its child's end: `changed` says whether anything (tracked or
/// untracked, not ignored) differs from its base.
#[must_use]
pub fn dispose(changed: bool, status: Status, keep_dirty: bool) -> Outcome {
    if !changed {
        Outcome::Removed
    } else if !finished(status) {
        Outcome::Interrupted
    } else if keep_dirty {
        Outcome::Uncommitted
    } else {
        Outcome::Committed
    }
}

/// A worktree a run used, as its record says (`worktree` of the result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeRecord {
    pub name: String,
    /// Its folder (gone when `outcome` is `removed`).
    pub path: String,
    /// Its branch (gone when `outcome` is `removed`).
    pub branch: String,
    /// The commit it was created from.
    pub base: String,
    /// The commit holding the child's changes; `null` unless `outcome` is `committed`.
    pub commit: Option<String>,
    pub outcome: Outcome,
    /// Whether the parent's own tree had uncommitted changes (not carried into the worktree).
    pub parent_dirty: bool,
    #[serde(flatten)]
    pub stat: DiffStat,
}

impl WorktreeRecord {
    /// One line for a person (stderr, a tool result): what became of it and where.
    #[must_use]
    pub fn describe(&self) -> String {
        let DiffStat {
            changed_files,
            insertions,
            deletions,
        } = self.stat;
        let stat = format!(
            "{changed_files} file{} changed, {insertions} insertion{}(+), {deletions} deletion{}(-)",
            plural(changed_files),
            plural(insertions),
            plural(deletions)
        );
        let dirty = if self.parent_dirty {
            " (the parent's uncommitted changes were not in it)"
        } else {
            ""
        };
        let short = |commit: &str| commit.chars().take(12).collect::<String>();
        match self.outcome {
            Outcome::Removed => format!(
                "worktree {}: no changes, removed with its branch{dirty}",
                self.name
            ),
            Outcome::Committed => format!(
                "worktree {}: committed {} on branch {} (base {}), {stat}; kept at {}{dirty}",
                self.name,
                short(self.commit.as_deref().unwrap_or_default()),
                self.branch,
                short(&self.base),
                self.path
            ),
            Outcome::Uncommitted | Outcome::Interrupted => format!(
                "worktree {}: {} changes left uncommitted on branch {} (base {}), {stat}; kept at {}{dirty}",
                self.name,
                if self.outcome == Outcome::Interrupted {
                    "the child did not finish;"
                } else {
                    "as asked,"
                },
                self.branch,
                short(&self.base),
                self.path
            ),
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The process holding a worktree while its run lives: its pid and its start time (clock ticks
/// since boot, `/proc/PID/stat`'s 22nd field), so a reused pid is not taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub start: u64,
}

/// The lock reason of a live run's worktree.
#[must_use]
pub fn lock_reason(run_id: &str, owner: Owner) -> String {
    format!(
        "acp-host run {run_id} pid {} start {}",
        owner.pid, owner.start
    )
}

/// The owner named by a lock reason [`lock_reason`] wrote; `None` for any other reason (a
/// person's own lock).
#[must_use]
pub fn parse_lock_reason(reason: &str) -> Option<Owner> {
    let words: Vec<&str> = reason.split_whitespace().collect();
    match words.as_slice() {
        ["acp-host", "run", _, "pid", pid, "start", start] => Some(Owner {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        }),
        _ => None,
    }
}

/// The start time in a `/proc/PID/stat` line (the field after the command's closing `)`, 20th
/// of the rest).
#[must_use]
pub fn proc_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// One entry of `git worktree list --porcelain -z`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitWorktree {
    pub path: PathBuf,
    pub head: Option<String>,
    /// The branch's full ref (`refs/heads/...`); `None` when detached.
    pub branch: Option<String>,
    /// The lock reason (empty when locked without one); `None` when not locked.
    pub locked: Option<String>,
    /// Git found its folder gone.
    pub prunable: bool,
}

/// Parses `git worktree list --porcelain -z`: attributes separated by NUL, entries by an empty
/// attribute.
#[must_use]
pub fn parse_worktree_list(text: &str) -> Vec<GitWorktree> {
    let mut all = Vec::new();
    let mut current: Option<GitWorktree> = None;
    for attribute in text.split('\0') {
        let (key, value) = attribute.split_once(' ').unwrap_or((attribute, ""));
        if key == "worktree" {
            all.extend(current.take());
            current = Some(GitWorktree {
                path: PathBuf::from(value),
                ..GitWorktree::default()
            });
            continue;
        }
        let Some(entry) = current.as_mut() else {
            continue;
        };
        match key {
            "HEAD" => entry.head = Some(value.to_owned()),
            "branch" => entry.branch = Some(value.to_owned()),
            "locked" => entry.locked = Some(value.to_owned()),
            "prunable" => entry.prunable = true,
            _ => {}
        }
    }
    all.extend(current);
    all
}

/// What one of our worktrees is, as `acp-host worktrees list` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// A live run holds it.
    Running,
    /// Its run's host is gone (killed) before settling it: `prune` removes it when clean.
    Abandoned,
    /// Its run settled it and kept it (committed or uncommitted changes).
    Kept,
}

/// The state of a worktree locked with `locked` (see [`GitWorktree::locked`]), where `alive`
/// tells whether an owner's process still runs.
#[must_use]
pub fn state(locked: Option<&str>, alive: &dyn Fn(Owner) -> bool) -> State {
    match locked.map(parse_lock_reason) {
        Some(Some(owner)) if !alive(owner) => State::Abandoned,
        Some(_) => State::Running,
        None => State::Kept,
    }
}

/// What `prune` does with a worktree in `state` that holds uncommitted changes or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prune {
    /// Leave it (a live run's, or a settled one a person decides about).
    Leave,
    /// Remove it and its branch: an abandoned run changed nothing.
    Remove,
    /// Unlock it and keep it: an abandoned run's changes are not thrown away.
    KeepChanges,
}

/// `prune`'s rule.
#[must_use]
pub fn prune(state: State, dirty: bool) -> Prune {
    match (state, dirty) {
        (State::Abandoned, false) => Prune::Remove,
        (State::Abandoned, true) => Prune::KeepChanges,
        _ => Prune::Leave,
    }
}

/// One of our worktrees, as `acp-host worktrees list --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedWorktree {
    pub name: String,
    pub path: String,
    /// Its branch's name (`acp/...`); `null` when detached.
    pub branch: Option<String>,
    pub head: Option<String>,
    pub state: State,
}

/// `acp-host worktrees list --json`: the repository's worktrees acp-host made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeListing {
    /// The main worktree's top folder.
    pub repository: String,
    pub worktrees: Vec<ListedWorktree>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_component_and_a_branch_name() {
        for good in ["fix-login", "a", "v1.2_x", &"n".repeat(MAX_NAME_LEN)] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(
            validate_name(&"n".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong {
                name: "n".repeat(MAX_NAME_LEN + 1)
            })
        );
        for (bad, found) in [
            ("a/b", "/"),
            ("a b", " "),
            ("é", "é"),
            ("-x", "a leading '-'"),
            (".x", "a leading '.'"),
            ("a..b", "'..'"),
            ("x.lock", "a trailing .lock"),
            ("x.", "a trailing '.'"),
        ] {
            assert_eq!(
                validate_name(bad),
                Err(NameError::Invalid {
                    name: bad.into(),
                    found: found.into()
                }),
                "{bad}"
            );
        }
        assert_eq!(
            NameError::Invalid {
                name: "a/b".into(),
                found: "/".into()
            }
            .to_string(),
            "worktree name \"a/b\" has \"/\": use letters, digits, '-', '_' and '.' (not first, not '..', not ending in .lock)"
        );
        assert!(NameError::Empty.to_string().contains("empty"));
        assert!(
            NameError::TooLong { name: "x".into() }
                .to_string()
                .contains("longer than 64")
        );
    }

    #[test]
    fn a_default_name_is_the_prompt_s_first_words_and_the_run_id() {
        let id = "1a2b3c4d-5e6f-0000";
        assert_eq!(
            default_name("Fix the login bug, please!", id),
            "fix-the-login-bug-1a2b3c4d"
        );
        assert_eq!(
            default_name("internationalisation of everything", id),
            "internationalisation-of-1a2b3c4d"
        );
        assert_eq!(default_name("¿?", id), "run-1a2b3c4d");
        assert_eq!(default_name(&"x".repeat(30), id), "run-1a2b3c4d");
        for prompt in ["Fix the login bug", "", "a.b-c"] {
            assert_eq!(validate_name(&default_name(prompt, id)), Ok(()));
        }
    }

    #[test]
    fn candidates_count_up_and_stay_valid() {
        let all: Vec<String> = candidates("fix").collect();
        assert_eq!(all.len(), MAX_CANDIDATES);
        assert_eq!(&all[..3], ["fix", "fix-2", "fix-3"]);
        assert_eq!(all[99], "fix-100");
        let long = format!("{}.", "n".repeat(MAX_NAME_LEN - 3));
        let second = candidates(&long).nth(1).unwrap();
        assert_eq!(second, format!("{}-2", "n".repeat(MAX_NAME_LEN - 3)));
        for name in candidates(&"m".repeat(MAX_NAME_LEN)) {
            assert_eq!(validate_name(&name), Ok(()), "{name}");
        }
    }

    #[test]
    fn branch_folder_and_name_of() {
        assert_eq!(branch("x"), "acp/x");
        let top = Path::new("/repo");
        assert_eq!(
            folder(top, "x"),
            PathBuf::from("/repo/.acp-host/worktrees/x")
        );
        assert_eq!(
            name_of(top, Path::new("/repo/.acp-host/worktrees/x")),
            Some("x".into())
        );
        assert_eq!(
            name_of(top, Path::new("/repo/.acp-host/worktrees/a/b")),
            None
        );
        assert_eq!(name_of(top, Path::new("/elsewhere/x")), None);
        let odd = Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                b"/repo/.acp-host/worktrees/\xff",
            ),
        );
        assert_eq!(name_of(top, odd), None);
    }

    #[test]
    fn the_exclude_line_is_added_once() {
        assert_eq!(
            with_exclude("").unwrap(),
            "# acp-host's worktrees (acp-host run --worktree)\n/.acp-host/\n"
        );
        assert_eq!(
            with_exclude("*.o").unwrap(),
            "*.o\n# acp-host's worktrees (acp-host run --worktree)\n/.acp-host/\n"
        );
        assert_eq!(with_exclude("*.o\n /.acp-host/ \n"), None);
    }

    #[test]
    fn the_commit_message_is_the_prompt_s_first_line() {
        assert_eq!(
            commit_message("\n  Fix the bug  \nin detail", "r1"),
            "Fix the bug\n\nacp-host run r1\n"
        );
        assert_eq!(
            commit_message(" \n", "r1"),
            "acp-host run r1\n\nacp-host run r1\n"
        );
        let long = format!("{} tail", "word ".repeat(20));
        let subject = commit_message(&long, "r1")
            .lines()
            .next()
            .unwrap()
            .to_owned();
        assert_eq!(subject.chars().count(), MAX_SUBJECT_CHARS);
        assert!(subject.ends_with("word..."), "{subject}");
    }

    #[test]
    fn numstat_adds_up_binary_files_included() {
        assert_eq!(
            parse_numstat("3\t1\ta.txt\n-\t-\tlogo.png\n\n10\t0\tdir/b c.txt\n"),
            DiffStat {
                changed_files: 3,
                insertions: 13,
                deletions: 1
            }
        );
        assert_eq!(parse_numstat(""), DiffStat::default());
    }

    #[test]
    fn the_end_of_a_child_decides_its_worktree() {
        for status in Status::ALL {
            assert_eq!(dispose(false, status, false), Outcome::Removed);
            assert_eq!(dispose(false, status, true), Outcome::Removed);
        }
        assert_eq!(dispose(true, Status::Completed, false), Outcome::Committed);
        assert_eq!(dispose(true, Status::Refusal, true), Outcome::Uncommitted);
        for status in [
            Status::Aborted,
            Status::Timeout,
            Status::Error,
            Status::OverBudget,
        ] {
            assert_eq!(dispose(true, status, false), Outcome::Interrupted);
        }
        for status in [
            Status::MaxTokens,
            Status::MaxTurnRequests,
            Status::SchemaMismatch,
        ] {
            assert!(finished(status));
        }
        let names: Vec<&str> = [
            Outcome::Removed,
            Outcome::Committed,
            Outcome::Uncommitted,
            Outcome::Interrupted,
        ]
        .map(Outcome::as_str)
        .to_vec();
        assert_eq!(
            names,
            ["removed", "committed", "uncommitted", "interrupted"]
        );
    }

    fn record(outcome: Outcome, parent_dirty: bool) -> WorktreeRecord {
        WorktreeRecord {
            name: "fix".into(),
            path: "/repo/.acp-host/worktrees/fix".into(),
            branch: "acp/fix".into(),
            base: "0123456789abcdef0123".into(),
            commit: (outcome == Outcome::Committed).then(|| "fedcba9876543210fedc".into()),
            outcome,
            parent_dirty,
            stat: DiffStat {
                changed_files: 1,
                insertions: 2,
                deletions: 0,
            },
        }
    }

    #[test]
    fn a_record_describes_itself_in_one_line() {
        assert_eq!(
            record(Outcome::Removed, false).describe(),
            "worktree fix: no changes, removed with its branch"
        );
        assert_eq!(
            record(Outcome::Committed, true).describe(),
            "worktree fix: committed fedcba987654 on branch acp/fix (base 0123456789ab), 1 file changed, 2 insertions(+), 0 deletions(-); kept at /repo/.acp-host/worktrees/fix (the parent's uncommitted changes were not in it)"
        );
        assert_eq!(
            record(Outcome::Uncommitted, false).describe(),
            "worktree fix: as asked, changes left uncommitted on branch acp/fix (base 0123456789ab), 1 file changed, 2 insertions(+), 0 deletions(-); kept at /repo/.acp-host/worktrees/fix"
        );
        assert!(
            record(Outcome::Interrupted, false)
                .describe()
                .contains("the child did not finish; changes left uncommitted")
        );
        let json = serde_json::to_value(record(Outcome::Committed, false)).unwrap();
        assert_eq!(json["changedFiles"], 1);
        assert_eq!(json["outcome"], "committed");
        assert_eq!(json["parentDirty"], false);
    }

    #[test]
    fn lock_reasons_name_their_owner() {
        let owner = Owner {
            pid: 42,
            start: 777,
        };
        let reason = lock_reason("r1", owner);
        assert_eq!(reason, "acp-host run r1 pid 42 start 777");
        assert_eq!(parse_lock_reason(&reason), Some(owner));
        for other in [
            "",
            "mine",
            "acp-host run r1 pid x start 1",
            "acp-host run r1 pid 1 start x",
        ] {
            assert_eq!(parse_lock_reason(other), None, "{other}");
        }
        let stat = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19";
        assert_eq!(proc_start_time(stat), Some(777));
        assert_eq!(proc_start_time("42 no paren"), None);
        assert_eq!(proc_start_time("42 (x) S 1"), None);
    }

    #[test]
    fn git_s_worktree_list_is_read() {
        let text = "worktree /repo\0HEAD abc\0branch refs/heads/main\0\0\
                    worktree /repo/.acp-host/worktrees/x\0HEAD def\0branch refs/heads/acp/x\0locked acp-host run r pid 1 start 2\0\0\
                    worktree /gone\0HEAD 123\0detached\0locked\0prunable gitdir file points to non-existent location\0\0";
        let all = parse_worktree_list(text);
        assert_eq!(
            all,
            [
                GitWorktree {
                    path: "/repo".into(),
                    head: Some("abc".into()),
                    branch: Some("refs/heads/main".into()),
                    locked: None,
                    prunable: false,
                },
                GitWorktree {
                    path: "/repo/.acp-host/worktrees/x".into(),
                    head: Some("def".into()),
                    branch: Some("refs/heads/acp/x".into()),
                    locked: Some("acp-host run r pid 1 start 2".into()),
                    prunable: false,
                },
                GitWorktree {
                    path: "/gone".into(),
                    head: Some("123".into()),
                    branch: None,
                    locked: Some(String::new()),
                    prunable: true,
                },
            ]
        );
        assert!(parse_worktree_list("HEAD orphan\0").is_empty());
    }

    #[test]
    fn state_and_prune() {
        let ours = "acp-host run r pid 1 start 2";
        assert_eq!(state(Some(ours), &|_| false), State::Abandoned);
        assert_eq!(state(Some(ours), &|_| true), State::Running);
        assert_eq!(state(Some("a person's"), &|_| false), State::Running);
        assert_eq!(state(None, &|_| false), State::Kept);
        assert_eq!(prune(State::Abandoned, false), Prune::Remove);
        assert_eq!(prune(State::Abandoned, true), Prune::KeepChanges);
        assert_eq!(prune(State::Running, false), Prune::Leave);
        assert_eq!(prune(State::Kept, false), Prune::Leave);
    }
}
