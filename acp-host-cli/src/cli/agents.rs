//! `acp-host agents`: the registry as this host sees it — each agent, whether it is installed and
//! why (a binary on PATH or a marker folder under $HOME), where `sync` writes for it, and its ACP
//! launch command. Availability is decided by `protocol::registry::availability`, the same rule
//! `sync` (and `run`) use.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use acp_host::acp_registry::{CachedRegistry, RegistryCache};
use acp_host::agents::{self, HostFacts};
use acp_host::installed;
use protocol::acp_registry::{self, Choice};
use protocol::env_vars;
use protocol::listing::{AgentListing, AgentRow, RegistryListing, RegistryRow};
use protocol::registry::{AGENTS, AgentAvailability, SyncTarget};

use super::{CliError, write_listing};

const AFTER_HELP: &str = "\
Examples:
  acp-host agents          one line per agent: installed or not (and why), sync target, ACP command
  acp-host agents --json   the same as JSON, with each agent's sync options and their types
  acp-host agents --refresh                 fetch the ACP Registry (again), cache it, list it too
  acp-host agents --registry ./registry.json  read (and cache) another registry, a file or a URL

An agent is installed when one of its binaries is on PATH (acp-child: beside acp-host, else on
PATH) or its marker folder exists under $HOME.
`acp-host sync` skips agents that are not installed.

The ACP Registry (agentclientprotocol/registry) is read only when asked (--refresh, --registry)
and cached with its source and time in $XDG_CACHE_HOME/acp-host/registry (default
~/.cache/acp-host/registry). `acp-host run --agent ID` then starts a registry agent that is not
one of the agents above nor a program on PATH: its binary for this platform, downloaded into the
cache on first use (checked against the registry's SHA-256 when it has one), else `npx` / `uvx`.
Later runs start from the cache, offline.";

fn after_help() -> String {
    format!(
        "{AFTER_HELP}\n\n{}",
        protocol::exit_table::Documented::Agents.exit_table()
    )
}

/// List the agents the registry knows, whether each is installed, and where sync writes for it.
#[derive(Debug, clap::Args)]
#[command(after_help = after_help())]
pub(super) struct AgentsArgs {
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
    /// Fetch the ACP Registry again from where it was last read (default: the official one) and
    /// cache it.
    #[arg(long)]
    refresh: bool,
    /// Read the ACP Registry from this registry.json (a path or an http(s) URL), cache it, and
    /// use it from now on.
    #[arg(long, value_name = "FILE|URL")]
    registry: Option<String>,
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
    let mut listing = listing(&home, &HostFacts::new(path_var.as_deref()));
    let cache = RegistryCache::from_env();
    let asked = args.registry.is_some() || args.refresh;
    let cached = match (&cache, asked) {
        (Ok(cache), true) => {
            let source = match &args.registry {
                Some(source) => source.clone(),
                None => cache
                    .load()
                    .ok()
                    .flatten()
                    .map_or_else(|| acp_registry::DEFAULT_URL.to_owned(), |c| c.source),
            };
            Some(
                cache
                    .refresh(&source)
                    .map_err(|err| CliError::Failed(err.to_string()))?,
            )
        }
        (Err(err), true) => return Err(CliError::Failed(err.to_string())),
        (Ok(cache), false) => cache
            .load()
            .map_err(|err| CliError::Failed(err.to_string()))?,
        (Err(_), false) => None,
    };
    if let (Ok(cache), Some(cached)) = (&cache, &cached) {
        listing.registry = Some(registry_listing(cache, cached));
    }
    write_listing(args.json, &listing, || table(&listing))
}

/// The cached registry's agents as `run --agent ID` would start them on this platform.
fn registry_listing(cache: &RegistryCache, cached: &CachedRegistry) -> RegistryListing {
    let platform = acp_registry::platform(std::env::consts::OS, std::env::consts::ARCH);
    let agents = cached
        .registry
        .agents
        .iter()
        .map(|manifest| {
            let installed = match manifest.choose(platform) {
                Some(Choice::Binary { platform, target }) => {
                    cache.installed(manifest, platform, target).is_some()
                }
                _ => false,
            };
            RegistryRow::new(manifest, platform, installed)
        })
        .collect();
    RegistryListing {
        source: cached.source.clone(),
        fetched_at: cached.fetched_at.clone(),
        agents,
    }
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
    AgentListing {
        agents,
        registry: None,
    }
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
    match &listing.registry {
        None => text.push_str(
            "\nNo ACP Registry cached: `acp-host agents --refresh` fetches it (--registry FILE|URL reads another).\n",
        ),
        Some(registry) => registry_table(&mut text, registry),
    }
    text
}

/// The registry's agents: id, version, how `run --agent ID` starts it here, name.
fn registry_table(text: &mut String, registry: &RegistryListing) {
    let _ = writeln!(
        text,
        "\nACP Registry ({}, fetched {}): {} agents",
        registry.source,
        registry.fetched_at,
        registry.agents.len()
    );
    let rows = &registry.agents;
    let id_width = rows.iter().map(|r| r.id.len()).max().unwrap_or(0);
    let version_width = rows.iter().map(|r| r.version.len()).max().unwrap_or(0);
    for row in rows {
        let how = match row.distribution.as_deref() {
            None => "no distribution for this platform".to_owned(),
            Some("binary") if row.cached => format!("binary {} (cached)", row.command.join(" ")),
            Some("binary") => format!("binary {} (downloaded on first run)", row.command.join(" ")),
            Some(_) => row.command.join(" "),
        };
        let shadowed = match (&row.linked_from, &row.shadowed_by) {
            (Some(ours), _) => {
                format!(" [--agent {ours} runs this when its own command is not installed]")
            }
            (None, Some(name)) => format!(" [--agent {} runs our {name}]", row.id),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            text,
            "{:<id_width$}  {:<version_width$}  {}  {how}{shadowed}",
            row.id, row.version, row.name
        );
    }
}
