//! `acp-host run --subagent NAME`: a subagent definition's `run:` table applied to a run.
//!
//! The definition is `NAME.md` in `<cwd>/subagents/`, then in each `--subagents DIR`, the first
//! found; it is validated strictly (a bad file is a usage error naming the file and field) and
//! must have a `run:` table. What it asks of its agent (persona, model, tool filter) is
//! `protocol::definition::RunSpec::wants`, honoured or refused when the agent starts, as for
//! acp-child's subagent tool; flags given on the command line win over it.
//!
//! Trust (`protocol::trust`): a definition from `<cwd>/subagents/` is repository content. It
//! starts only once approved (`acp-host trust --approve`) or under `--permission allow`, and its
//! `permission:` only ever makes the run stricter than `--permission` (default `reject`); one from
//! a `--subagents` folder is the person's own and is applied as written.

use std::path::{Path, PathBuf};

use acp_host::definitions;
use acp_host::trust::TrustStore;
use protocol::definition::{self, Definition, RunSpec};
use protocol::permission::PermissionPolicy;
use protocol::trust::{Digest, Source, TrustState};

/// The definition found for `--subagent NAME`.
pub(super) struct Found {
    pub(super) definition: Definition,
    pub(super) run: RunSpec,
    /// The file, symlinks resolved (the identity an approval names).
    pub(super) file: PathBuf,
    /// `<cwd>/subagents/` (repository content) or a `--subagents` folder (named by the person).
    pub(super) source: Source,
    pub(super) digest: Digest,
}

/// Finds and validates `name`'s definition.
pub(super) fn find(name: &str, cwd: &Path, dirs: &[PathBuf]) -> Result<Found, String> {
    if !definition::is_valid_name(name) {
        return Err(format!(
            "--subagent {name:?}: a subagent name matches ^[a-z][a-z0-9-]*$"
        ));
    }
    let file = format!("{name}.md");
    let searched: Vec<(PathBuf, Source)> =
        std::iter::once((definitions::repository_folder(cwd), Source::Repository))
            .chain(dirs.iter().map(|dir| (dir.clone(), Source::Folder)))
            .collect();
    for (dir, source) in &searched {
        let path = dir.join(&file);
        let contents = match std::fs::read(&path) {
            Ok(contents) => contents,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
        };
        let definition = definition::parse(&file, &contents)
            .map_err(|problem| format!("{}: {problem}", path.display()))?;
        let Some(run) = definition.run.clone() else {
            return Err(format!(
                "{}: has no `run:` table; add `run: {{}}` to run it with the defaults (acp-child)",
                path.display()
            ));
        };
        return Ok(Found {
            definition,
            run,
            file: std::fs::canonicalize(&path).unwrap_or(path),
            source: *source,
            digest: Digest::of(&contents),
        });
    }
    Err(format!(
        "--subagent {name}: no {file} in {} (add the definition, or pass --subagents DIR)",
        searched
            .iter()
            .map(|(dir, _)| dir.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

impl Found {
    /// Whether it may start: from a folder the person named, approved (`acp-host trust`), or
    /// under `--permission allow` (the person said yes to everything). A repository definition
    /// otherwise is refused before anything is spawned, naming what it would run.
    pub(super) fn check_trust(
        &self,
        flag: Option<PermissionPolicy>,
        command_line: &str,
        env: &[String],
    ) -> Result<(), String> {
        if self.source.trusted() || flag == Some(PermissionPolicy::Allow) {
            return Ok(());
        }
        let state = TrustStore::from_env().map_or(TrustState::NotApproved, |store| {
            store.state(&self.file, &self.digest)
        });
        if state.may_start() {
            return Ok(());
        }
        let changed = if state == TrustState::Changed {
            " (it changed since it was approved)"
        } else {
            ""
        };
        let env = if env.is_empty() {
            String::new()
        } else {
            format!(", forwarding {}", env.join(", "))
        };
        Err(format!(
            "subagent {name} needs your approval to run {command_line}{env}: {file} is a file of \
             this folder, not one you named{changed}. Approve it with `acp-host trust --approve \
             {file}`, or pass its folder with --subagents DIR",
            name = self.definition.name,
            file = self.file.display(),
        ))
    }
}
