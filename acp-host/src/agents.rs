//! Agent resolution: what command runs agent X on this host, and why (or why not).
//!
//! One function, [`resolve`], serves `run` (CLI and library) and `agents`: the pure half (registry
//! name -> launch words, install hint, which agents speak ACP, the sibling rule) is
//! `protocol::registry`; the facts (PATH, the folder of the acp-host binary) come from
//! [`HostFacts`]. A program that is not found is not an error here: the run reports it when the
//! spawn fails, with the install hint; `agents` shows it as "not found".

use std::path::PathBuf;

use protocol::registry::{self, AgentSpec, LaunchError, Location};
use protocol::request::AgentCommand;

pub use crate::installed::HostFacts;

/// An agent resolved to the command that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedAgent {
    /// What `run` spawns: the program beside acp-host when it was found there, else the program as
    /// named (the spawn looks it up on the agent's PATH, as the system would).
    pub command: AgentCommand,
    /// Where the program was found, when it was.
    pub location: Location,
    /// The registry agent, when one was named.
    pub spec: Option<&'static AgentSpec>,
    /// Variables the agent's ACP Registry manifest sets for it (empty otherwise).
    pub env: Vec<(String, String)>,
}

impl ResolvedAgent {
    /// Why the agent cannot start here, when its program was found nowhere: what is missing and
    /// how to fix it (`protocol::registry::not_found`). `run`, `batch` and `serve` refuse such an
    /// agent before anything is spawned, with this message (exit 2).
    #[must_use]
    pub fn not_found(&self) -> Option<String> {
        (!self.location.is_found()).then(|| {
            let program = &self.command.program;
            registry::not_found(
                &self.command.display,
                &program.display().to_string(),
                self.command.install_hint.as_deref(),
                program.components().count() > 1 && program.exists(),
            )
        })
    }
}

/// `--agent` names nothing that can be launched (a usage error: nothing is spawned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ResolveError(#[from] LaunchError);

/// Resolves a registry name (or alias) or a command line to the command that runs it.
pub fn resolve(agent: &str, facts: &HostFacts) -> Result<ResolvedAgent, ResolveError> {
    let launch = registry::launch(agent)?;
    let location = facts.locate(&launch.program);
    let program = match &location {
        Location::BesideHost(path) => path.clone(),
        _ => PathBuf::from(&launch.program),
    };
    Ok(ResolvedAgent {
        command: AgentCommand {
            program,
            args: launch.args,
            display: agent.to_owned(),
            install_hint: launch.install_hint.map(str::to_owned),
        },
        location,
        spec: launch.spec,
        env: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_program_beside_acp_host_is_used_only_for_acp_child() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["acp-child", "codex-acp"] {
            let path = dir.path().join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let facts = HostFacts {
            path_var: None,
            host_dir: Some(dir.path().to_path_buf()),
        };
        let child = resolve("acp-child", &facts).unwrap();
        assert_eq!(child.command.program, dir.path().join("acp-child"));
        assert_eq!(child.location.describe(), "beside acp-host");
        let codex = resolve("codex", &facts).unwrap();
        assert_eq!(codex.command.program, PathBuf::from("codex-acp"));
        assert_eq!(codex.location, Location::NotFound);
        assert_eq!(
            codex.command.install_hint.as_deref(),
            Some("npm install -g @zed-industries/codex-acp")
        );
        let facts = HostFacts {
            path_var: Some(dir.path().as_os_str().to_owned()),
            host_dir: None,
        };
        let codex = resolve("codex", &facts).unwrap();
        assert_eq!(
            codex.location,
            Location::OnPath(dir.path().join("codex-acp"))
        );
        // Found on PATH, the program is still spawned by name.
        assert_eq!(codex.command.program, PathBuf::from("codex-acp"));
    }
}
