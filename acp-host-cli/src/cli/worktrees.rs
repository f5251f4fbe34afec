//! `acp-host worktrees [list|remove NAME|prune]`: the git worktrees runs left in a repository
//! (`--worktree`), shown and cleaned through `acp_host::worktree`.
//!
//! `list` is the default; `--json` prints `protocol::worktree::WorktreeListing` for `list`, and
//! the worktrees acted on (in the same shape) for `remove` and `prune`.

use std::path::PathBuf;
use std::process::ExitCode;

use acp_host::worktree::{self, Pruned};
use protocol::report::printable;
use protocol::worktree::{ListedWorktree, Prune, State, WorktreeListing};

use super::{CliError, write_listing};

const AFTER_HELP: &str = "\
`acp-host run --worktree` (and batch lines, definitions' run.isolation, acp-child's subagent
tool) make each under the repository's .acp-host/worktrees/NAME/ on branch acp/NAME. A worktree
the agent left unchanged is removed when its run ends; one with changes is committed on its
branch and kept for you to merge or remove. A run whose host was killed leaves its worktree
locked: `prune` removes it when it holds no change, and unlocks and keeps it when it does.

States: running (a live run holds it), abandoned (its host is gone), kept (settled, yours).

Examples:
  acp-host worktrees                    list this repository's worktrees
  acp-host worktrees remove fix-login   remove one and its branch acp/fix-login
  acp-host worktrees prune --json       clean up after killed runs";

/// Show and clean the git worktrees runs left (`--worktree`).
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub(super) struct WorktreesArgs {
    #[command(subcommand)]
    action: Option<Action>,
    /// The repository: any folder inside it [default: the current directory].
    #[arg(long, value_name = "DIR", global = true)]
    cwd: Option<PathBuf>,
    /// Print JSON instead of lines (schemas/worktrees.json).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// List the worktrees runs made, with their branch and state (the default).
    List,
    /// Remove one worktree and its branch; refused while a run holds it.
    Remove {
        name: String,
        /// Throw away its uncommitted changes.
        #[arg(long)]
        force: bool,
        /// Keep the branch acp/NAME (only the folder goes).
        #[arg(long)]
        keep_branch: bool,
    },
    /// Remove the worktrees killed runs left unchanged; unlock and keep those with changes.
    Prune,
}

pub(super) fn execute(args: &WorktreesArgs) -> Result<ExitCode, CliError> {
    let cwd = acp_host::run::resolve_cwd(args.cwd.as_deref())
        .map_err(|err| CliError::Usage(err.to_string()))?;
    let failed = |err: worktree::WorktreeError| CliError::Failed(err.to_string());
    match &args.action {
        None | Some(Action::List) => {
            let listing = worktree::list(&cwd).map_err(failed)?;
            write_listing(args.json, &listing, || human(&listing, "no worktrees"))
        }
        Some(Action::Remove {
            name,
            force,
            keep_branch,
        }) => {
            let repository = worktree::list(&cwd).map_err(failed)?.repository;
            let removed = worktree::remove(&cwd, name, *force, *keep_branch).map_err(failed)?;
            let listing = WorktreeListing {
                repository,
                worktrees: vec![removed],
            };
            write_listing(args.json, &listing, || {
                format!("removed worktree {}\n", printable(name))
            })
        }
        Some(Action::Prune) => {
            let repository = worktree::list(&cwd).map_err(failed)?.repository;
            let pruned = worktree::prune(&cwd).map_err(failed)?;
            let text = pruned.iter().map(pruned_line).collect::<String>();
            let listing = WorktreeListing {
                repository,
                worktrees: pruned.into_iter().map(|p| p.worktree).collect(),
            };
            write_listing(args.json, &listing, || {
                if text.is_empty() {
                    "nothing to prune\n".to_owned()
                } else {
                    text
                }
            })
        }
    }
}

fn pruned_line(pruned: &Pruned) -> String {
    let name = printable(&pruned.worktree.name);
    match pruned.action {
        Prune::Remove => format!("removed worktree {name} (its run was killed; no changes)\n"),
        Prune::KeepChanges => format!(
            "kept worktree {name} (its run was killed; it holds changes): {}\n",
            printable(&pruned.worktree.path)
        ),
        Prune::Leave => String::new(),
    }
}

fn human(listing: &WorktreeListing, empty: &str) -> String {
    if listing.worktrees.is_empty() {
        return format!("{empty}\n");
    }
    listing.worktrees.iter().map(row).collect()
}

fn row(worktree: &ListedWorktree) -> String {
    let state = match worktree.state {
        State::Running => "running",
        State::Abandoned => "abandoned",
        State::Kept => "kept",
    };
    format!(
        "{:<24} {:<10} {:<30} {}\n",
        printable(&worktree.name),
        state,
        printable(worktree.branch.as_deref().unwrap_or("(detached)")),
        printable(&worktree.path)
    )
}
