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
use protocol::permission::PermissionPolicy;
use protocol::report::{printable, printable_path};
use protocol::trust::TrustState;

/// The definition found for `--subagent NAME`.
pub(super) type Found = definitions::Found;

/// Finds and validates `name`'s definition.
pub(super) fn find(name: &str, cwd: &Path, dirs: &[PathBuf]) -> Result<Found, String> {
    definitions::find(name, cwd, dirs).map_err(|error| error.to_string())
}

/// Whether `found` may start: from a folder the person named, approved (`acp-host trust`), or
/// under `--permission allow` (the person said yes to everything). A repository definition
/// otherwise is refused before anything is spawned, naming what it would run.
pub(super) fn check_trust(
    found: &Found,
    flag: Option<PermissionPolicy>,
    command_line: &str,
    env: &[String],
    sandbox: &protocol::sandbox::Policy,
) -> Result<(), String> {
    let found = &found.located;
    if found.source.trusted() || flag == Some(PermissionPolicy::Allow) {
        return Ok(());
    }
    let state = TrustStore::from_env().map_or(TrustState::NotApproved, |store| {
        store.state(&found.file, &found.digest)
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
    let sandbox = if sandbox.is_active() {
        format!(" in sandbox {}, network {}", sandbox.mode, sandbox.network)
    } else {
        " without a sandbox".to_owned()
    };
    Err(format!(
        "subagent {name} needs your approval to run {command_line}{env}{sandbox}: {file} is a \
         file of this folder, not one you named{changed}. Approve it with `acp-host trust \
         --approve {file}`, or pass its folder with --subagents DIR",
        name = found.definition.name,
        command_line = printable(command_line),
        env = printable(&env),
        file = printable_path(&found.file),
    ))
}
