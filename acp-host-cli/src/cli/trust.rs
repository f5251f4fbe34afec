//! `acp-host trust [PATH]`: the repository definitions a folder ships and whether each may start
//! (`protocol::trust`); `--approve` / `--revoke` record or remove the person's approval of their
//! exact content (`acp_host::trust::TrustStore`), so a repository's definitions can be approved
//! once from a shell.
//!
//! Only definitions with a `run:` table are listed: the others start nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use acp_host::definitions::{self, Located};
use acp_host::trust::TrustStore;
use protocol::definition::RunContext;
use protocol::registry;
use protocol::report::{printable, printable_path};
use protocol::trust::{Source, TrustAction, TrustEntry, TrustListing};

use super::{CliError, write_listing};

const AFTER_HELP: &str = "\
Definitions found in a session's own folder (<cwd>/subagents/) are repository content: acp-child
asks before it starts one (allow once, allow always, reject), and `acp-host run --subagent` refuses
one unless it was approved. An approval holds for the file's exact content: a changed file asks
again. Folders you name with --subagents DIR are yours and start without asking.

Examples:
  acp-host trust                         list ./subagents/ and each definition's state
  acp-host trust ~/src/repo --approve    approve every definition of ~/src/repo/subagents/
  acp-host trust subagents/x.md --approve
  acp-host trust subagents/x.md --revoke
  acp-host trust --json                  the listing as JSON (schemas/trust.json)

Approvals live in $XDG_STATE_HOME/acp-host/trust (default ~/.local/state/acp-host/trust).";

fn after_help() -> String {
    format!(
        "{AFTER_HELP}\n\n{}",
        protocol::exit_table::Documented::Trust.exit_table()
    )
}

/// List a folder's subagent definitions and whether each may start; approve or revoke them.
#[derive(Debug, clap::Args)]
#[command(after_help = after_help())]
pub(super) struct TrustArgs {
    /// A folder (its subagents/ is listed) or one definition file [default: the current
    /// directory].
    #[arg(value_name = "PATH")]
    path: Option<PathBuf>,
    /// Approve the definitions listed, as their files are now.
    #[arg(long, conflicts_with = "revoke")]
    approve: bool,
    /// Remove the approvals of the definitions listed.
    #[arg(long)]
    revoke: bool,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

pub(super) fn execute(args: &TrustArgs) -> Result<ExitCode, CliError> {
    let path = match &args.path {
        Some(path) => path.clone(),
        None => std::env::current_dir()
            .map_err(|err| CliError::Failed(format!("cannot read the current directory: {err}")))?,
    };
    let (folder, only) = target(&path)?;
    let store = TrustStore::from_env().map_err(|err| CliError::Failed(err.to_string()))?;
    // A folder without subagents/ simply has none.
    let read = definitions::read_folder(&folder, Source::Repository, false);
    let mut listing = TrustListing {
        folder: folder.display().to_string(),
        definitions: Vec::new(),
        problems: read.problems,
    };
    for located in read
        .definitions
        .into_iter()
        .filter(|located| located.definition.run.is_some())
        .filter(|located| {
            only.as_ref()
                .is_none_or(|name| located.file.file_name() == Some(name))
        })
    {
        let action = if args.approve {
            store
                .approve(&located.file, &located.digest)
                .map_err(|err| failed(&located.file, &err))?;
            Some(TrustAction::Approved)
        } else if args.revoke {
            store
                .revoke(&located.file)
                .map_err(|err| failed(&located.file, &err))?;
            Some(TrustAction::Revoked)
        } else {
            None
        };
        listing.definitions.push(entry(&store, located, action));
    }
    if let Some(name) = &only
        && listing.definitions.is_empty()
    {
        return Err(CliError::Usage(format!(
            "{}: not a definition with a `run:` table{}",
            printable_path(&folder.join(name)),
            listing
                .problems
                .iter()
                .find(|problem| problem.contains(&*name.to_string_lossy()))
                .map(|problem| format!(" ({})", printable(problem)))
                .unwrap_or_default()
        )));
    }
    write_listing(args.json, &listing, || human(&listing))
}

/// The folder to read and, for a file, its name.
fn target(path: &Path) -> Result<(PathBuf, Option<std::ffi::OsString>), CliError> {
    let meta = std::fs::metadata(path).map_err(|err| {
        CliError::Usage(format!(
            "{}: {err}; give a folder (its subagents/ is listed) or a definition file",
            printable_path(path)
        ))
    })?;
    if meta.is_dir() {
        return Ok((definitions::repository_folder(path), None));
    }
    let name = path.file_name().map(ToOwned::to_owned);
    let folder = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok((folder.to_path_buf(), name))
}

fn failed(file: &Path, err: &acp_host::trust::TrustError) -> CliError {
    CliError::Failed(format!(
        "{}: {}",
        printable_path(file),
        protocol::report::describe(err)
    ))
}

fn entry(store: &TrustStore, located: Located, action: Option<TrustAction>) -> TrustEntry {
    let state = store.state(&located.file, &located.digest);
    let run = located.definition.run.unwrap_or_default();
    TrustEntry {
        name: located.definition.name,
        file: located.file.display().to_string(),
        source: located.source,
        state,
        action,
        agent: run.agent.unwrap_or_else(|| registry::ACP_CHILD.to_owned()),
        env: run.env,
        permission: run.permission,
        context: run.context,
        sha256: located.digest.as_str().to_owned(),
    }
}

/// The listing a person reads before `--approve`: every name from the folder (file names, the
/// folder's own, a definition's command line and variables, the problems naming them) through
/// `protocol::report::printable`, so none can rewrite a line.
fn human(listing: &TrustListing) -> String {
    let mut text = String::new();
    if listing.definitions.is_empty() {
        let _ = writeln!(
            text,
            "no definitions with a `run:` table in {}",
            printable(&listing.folder)
        );
    }
    for entry in &listing.definitions {
        let state = match entry.action {
            Some(TrustAction::Approved) => "approved now",
            Some(TrustAction::Revoked) => "revoked",
            None => entry.state.as_str(),
        };
        let _ = write!(
            text,
            "{}: {state}: runs {}",
            printable(&entry.name),
            printable(&entry.agent)
        );
        if !entry.env.is_empty() {
            let _ = write!(text, "; forwards {}", printable(&entry.env.join(", ")));
        }
        if let Some(permission) = entry.permission {
            let _ = write!(text, "; permission {}", permission.as_str());
        }
        if entry.context == Some(RunContext::Fork) {
            text.push_str("; starts from a copy of the conversation");
        }
        let _ = writeln!(text, "\n  {}", printable(&entry.file));
    }
    for problem in &listing.problems {
        let _ = writeln!(text, "not a usable definition: {}", printable(problem));
    }
    if listing
        .definitions
        .iter()
        .any(|entry| entry.action.is_none() && !entry.state.may_start())
    {
        text.push_str(
            "Definitions not approved ask before they start; approve them with acp-host trust --approve.\n",
        );
    }
    text
}
