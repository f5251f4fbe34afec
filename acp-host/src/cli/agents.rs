//! `acp-host agents`: the registry as this host sees it — each agent, whether it is installed and
//! why (a binary on PATH or a marker folder under $HOME), where `sync` writes for it, and its ACP
//! launch command. Availability is decided by `protocol::registry::availability`, the same rule
//! `sync` (and `run`) use.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use acp_host::agents::{self, HostFacts};
use acp_host::installed;
use protocol::env_vars;
use protocol::registry::{AGENTS, AgentAvailability, AgentSpec};
use serde_json::json;

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
pub struct AgentsArgs {
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

fn target(spec: &AgentSpec) -> String {
    let Some(sync) = spec.sync else {
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

pub fn execute(args: &AgentsArgs) -> ExitCode {
    let home = std::env::var_os(env_vars::HOME)
        .map(PathBuf::from)
        .unwrap_or_default();
    let path_var = std::env::var_os(env_vars::PATH);
    let facts = HostFacts::new(path_var.as_deref());
    // Whether `run --agent NAME` can start the agent: the same resolution `run` uses. This differs
    // from "installed" (the sync rule, which also accepts a marker folder).
    let runnable = |spec: &AgentSpec| {
        agents::resolve(spec.name, &facts).is_ok_and(|agent| agent.location.is_found())
    };
    let rows: Vec<_> = AGENTS
        .iter()
        .map(|spec| {
            (
                spec,
                installed::availability(spec, &home, path_var.as_deref()),
            )
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let agents: Vec<_> = rows
            .iter()
            .map(|(spec, availability)| {
                json!({
                    "name": spec.name,
                    "aliases": spec.aliases,
                    "summary": spec.summary,
                    "installed": availability.is_installed(),
                    "availability": availability,
                    "sync": spec.sync,
                    "acpCommand": spec.acp_command,
                    "acpCommandFound": spec.acp_command.is_some().then(|| runnable(spec)),
                    "install": spec.install,
                })
            })
            .collect();
        let _ = serde_json::to_writer_pretty(&mut out, &json!({ "agents": agents }));
        let _ = writeln!(out);
        return ExitCode::SUCCESS;
    }
    let name_width = rows.iter().map(|(s, _)| s.name.len()).max().unwrap_or(0);
    let statuses: Vec<String> = rows.iter().map(|(_, a)| status(a)).collect();
    let status_width = statuses.iter().map(String::len).max().unwrap_or(0);
    for ((spec, _), status) in rows.iter().zip(&statuses) {
        let mut acp = spec.acp_command.map_or_else(
            || "no ACP command".to_owned(),
            |cmd| format!("acp: {}", cmd.join(" ")),
        );
        if spec.acp_command.is_some() && !runnable(spec) {
            acp.push_str(" (not found");
            if let Some(install) = spec.install {
                acp.push_str("; install: ");
                acp.push_str(install);
            }
            acp.push(')');
        }
        // A closed stdout (`| head`) is not an error.
        let _ = writeln!(
            out,
            "{:<name_width$}  {status:<status_width$}  {}  {acp}",
            spec.name,
            target(spec)
        );
    }
    ExitCode::SUCCESS
}
