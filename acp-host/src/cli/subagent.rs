//! `acp-host run --subagent NAME`: a subagent definition's `run:` table applied to a run.
//!
//! The definition is `NAME.md` in `<cwd>/subagents/`, then in each `--subagents DIR`, the first
//! found; it is validated strictly (a bad file is a usage error naming the file and field) and
//! must have a `run:` table. How its fields reach the agent is `protocol::definition::plan_run`,
//! the rule acp-child's subagent tool uses too; flags given on the command line win over it.
//!
//! Invariant: the persona file written for acp-child lives in a private temporary folder that the
//! caller keeps until the run has ended (acp-child reads it when it starts).

use std::path::{Path, PathBuf};

use protocol::definition::{self, Definition, RunSpec};

/// The definition found for `--subagent NAME`.
pub(super) struct Found {
    pub(super) definition: Definition,
    pub(super) run: RunSpec,
}

/// Finds and validates `name`'s definition.
pub(super) fn find(name: &str, cwd: &Path, dirs: &[PathBuf]) -> Result<Found, String> {
    if !definition::is_valid_name(name) {
        return Err(format!(
            "--subagent {name:?}: a subagent name matches ^[a-z][a-z0-9-]*$"
        ));
    }
    let file = format!("{name}.md");
    let searched: Vec<PathBuf> = std::iter::once(cwd.join("subagents"))
        .chain(dirs.iter().cloned())
        .collect();
    for dir in &searched {
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
        return Ok(Found { definition, run });
    }
    Err(format!(
        "--subagent {name}: no {file} in {} (add the definition, or pass --subagents DIR)",
        searched
            .iter()
            .map(|dir| dir.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Writes `persona` for acp-child's `--persona`, in a private temporary folder kept by the
/// caller until the run ends; returns the folder and the file.
pub(super) fn persona_file(persona: &str) -> Result<(tempfile::TempDir, PathBuf), String> {
    let dir = tempfile::Builder::new()
        .prefix("acp-host-persona-")
        .tempdir()
        .map_err(|error| format!("cannot create a temporary folder for the persona: {error}"))?;
    let path = dir.path().join("persona.md");
    acp_host::fs_atomic::write_new(&path, persona.as_bytes())
        .map_err(|error| format!("cannot write the persona to {}: {error}", path.display()))?;
    Ok((dir, path))
}
