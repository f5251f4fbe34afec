//! `acp-host agents`: the registry as this host sees it — each agent, whether it is installed and
//! why (a binary on PATH or a marker folder under $HOME), where `sync` writes for it, and its ACP
//! launch command. Availability is decided by `protocol::registry::availability`, the same rule
//! `sync` (and `run`) use.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use acp_host::agents::{self, HostFacts};
use acp_host::installed;
use protocol::env_vars;
use protocol::registry::{AGENTS, AgentAvailability, AgentListing, AgentRow, SyncTarget};

use super::{CliError, write_listing};

const AFTER_HELP: &str = "\
Examples:
  acp-host agents          one line per agent: installed or not (and why), sync target, ACP command
  acp-host agents --json   the same as JSON, with each agent's sync options and their types

An agent is installed when one of its binaries is on PATH (acp-child: beside acp-host, else on
PATH) or its marker folder exists under $HOME.
`acp-host sync` skips agents that are not installed.";

/// List the agents the registry knows, whether each is installed, and where sync writes for it.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub(super) struct AgentsArgs {
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

fn status(availability: &AgentAvailability) -> String {
    match availability {
        AgentAvailability::OnPath(binary) => format!("installed (`{binary}` on PATH)"),
        AgentAvailability::BesideHost(binary) => format!("installed (`{binary}` beside acp-host)"),
        AgentAvailability::MarkerDir(dir) => format!("installed (~/{dir} exists)"),
        AgentAvailability::NotInstalled => "not installed".to_owned(),
    }
}

fn target(sync: Option<SyncTarget>) -> String {
    let Some(sync) = sync else {
        return "no sync target".to_owned();
    };
    let mut text = format!("~/{}", sync.user_path);
    match sync.project_path {
        Some(project) => {
            let _ = write!(text, " (project: {project})");
        }
        None => text.push_str(" (no project scope)"),
    }
    if let Some(requires) = sync.requires {
        let _ = write!(text, " [needs ~/{requires}]");
    }
    text
}

pub(super) fn execute(args: &AgentsArgs) -> Result<ExitCode, CliError> {
    let home = std::env::var_os(env_vars::HOME)
        .map(PathBuf::from)
        .unwrap_or_default();
    let path_var = std::env::var_os(env_vars::PATH);
    let listing = listing(&home, &HostFacts::new(path_var.as_deref()));
    write_listing(args.json, &listing, || table(&listing))
}

/// Every registry agent as this host sees it.
fn listing(home: &Path, facts: &HostFacts) -> AgentListing {
    let agents = AGENTS
        .iter()
        .map(|spec| {
            let availability = installed::availability(spec, home, facts.path_var.as_deref());
            // Whether `run --agent NAME` can start the agent: the same resolution `run` uses. This
            // differs from "installed" (the sync rule, which also accepts a marker folder).
            let found =
                agents::resolve(spec.name, facts).is_ok_and(|agent| agent.location.is_found());
            AgentRow::new(spec, availability, found)
        })
        .collect();
    AgentListing { agents }
}

/// One line per agent: name, installed or not (and why), sync target, ACP command.
fn table(listing: &AgentListing) -> String {
    let rows = &listing.agents;
    let name_width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let statuses: Vec<String> = rows.iter().map(|r| status(&r.availability)).collect();
    let status_width = statuses.iter().map(String::len).max().unwrap_or(0);
    let mut text = String::new();
    for (row, status) in rows.iter().zip(&statuses) {
        let mut acp = row.acp_command.map_or_else(
            || "no ACP command".to_owned(),
            |cmd| format!("acp: {}", cmd.join(" ")),
        );
        if row.acp_command_found == Some(false) {
            acp.push_str(" (not found");
            if let Some(install) = row.install {
                acp.push_str("; install: ");
                acp.push_str(install);
            }
            acp.push(')');
        }
        let _ = writeln!(
            text,
            "{:<name_width$}  {status:<status_width$}  {}  {acp}",
            row.name,
            target(row.sync)
        );
    }
    text
}
