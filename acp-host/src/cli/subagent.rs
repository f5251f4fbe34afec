//! `acp-host run --subagent NAME`: a subagent definition's `run:` table applied to a run.
//!
//! The definition is `NAME.md` in `<cwd>/subagents/`, then in each `--subagents DIR`, the first
//! found; it is validated strictly (a bad file is a usage error naming the file and field) and
//! must have a `run:` table. What it asks of its agent (persona, model, tool filter) is
//! `protocol::definition::RunSpec::wants`, honoured or refused when the agent starts, as for
//! acp-child's subagent tool; flags given on the command line win over it.

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
