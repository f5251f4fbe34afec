//! Validation of a start request before anything is spawned ([`prepare`]): the working
//! directory, the `--env` forwards, the output schema, and the agent's environment and
//! delegation standing computed from the caller's.
//!
//! Invariants:
//! - validation happens before anything is spawned; its errors are usage errors (an output schema
//!   that does not compile, a persona with an unknown or unclosed `{{variable}}`, among them);
//! - the agent's `ACP_HOST_TOKEN_BUDGET` is its request's token budget, or unset (never a
//!   forwarded or inherited value);
//! - the agent's `ACP_HOST_DEPTH` / `ACP_HOST_MAX_DEPTH` are set here from the caller's own
//!   (`protocol::depth`), overriding any forwarded value: `--env ACP_HOST_DEPTH=0` cannot lift the
//!   budget;
//! - a start past the cap is not an error here: it is kept in [`Prepared`] and refused by `run`
//!   with `depth-limit`, as a result, before anything is spawned (a budget against runaway
//!   recursion, not a security boundary); a depth or cap past `protocol::depth::MAX_CHAIN_DEPTH`
//!   counts as at the cap, and a cap that reaches the agent that way is logged as a warning;
//! - the agent's environment is the caller's scrubbed of credentials (`protocol::env_scrub`),
//!   and the values withheld are what the run redacts from the agent's words.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::capabilities::template::{Template, TemplateError};
use protocol::depth::{self, DepthBudget, DepthError};
use protocol::env_scrub::{self, EnvForwardError, Redactor, Scrubbed};
use protocol::env_vars;
use protocol::request::StartRequest;
use protocol::sandbox::{SandboxError, Standing};
use protocol::structured::{OutputSchema, SchemaError};

/// The request was refused before anything was spawned.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("working directory must be absolute: {0} (resolve it first, e.g. with resolve_cwd)")]
    RelativeCwd(PathBuf),
    #[error("working directory is not an accessible directory: {path} ({reason})")]
    InaccessibleCwd { path: PathBuf, reason: String },
    #[error(transparent)]
    Env(#[from] EnvForwardError),
    #[error("no working directory: the current directory cannot be read ({0}); pass --cwd")]
    NoCurrentDir(#[source] std::io::Error),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error(
        "cannot both resume session {resume} and fork session {fork}: a run continues a session (--resume) or starts from a copy of one (--fork); pass one"
    )]
    ResumeAndFork { resume: String, fork: String },
    #[error(transparent)]
    Persona(#[from] TemplateError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// Resolves `--cwd` (or the caller's directory) to an absolute path, once, up front.
pub fn resolve_cwd(cwd: Option<&Path>) -> Result<PathBuf, PrepareError> {
    let current = || std::env::current_dir().map_err(PrepareError::NoCurrentDir);
    match cwd {
        Some(path) if path.is_absolute() => Ok(path.to_path_buf()),
        Some(path) => Ok(current()?.join(path)),
        None => current(),
    }
}

/// A validated run, ready to start.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(super) request: StartRequest,
    pub(super) env: Scrubbed,
    /// The agent's standing, or why it may not start (refused by [`run`](super::run), as a
    /// result).
    pub(super) budget: Result<DepthBudget, DepthError>,
    /// `request.wants.output`'s schema, compiled.
    pub(super) schema: Option<Arc<OutputSchema>>,
    /// The request's sandbox at its working directory, held to the caller's own.
    pub(super) sandbox: Standing,
}

impl Prepared {
    /// Names withheld from the agent's environment.
    #[must_use]
    pub fn scrubbed(&self) -> &[String] {
        &self.env.scrubbed
    }

    /// What replaces this run's credential values (withheld, and forwarded credential-shaped
    /// ones) in text: for a caller that relays the agent's words further (a delegating agent).
    #[must_use]
    pub fn redactor(&self) -> &Redactor {
        &self.env.redactor
    }

    /// The agent's complete environment (scrubbed, with its delegation standing), for the crate's
    /// other owner of agent processes (`remote::serve`, which spawns one per connection).
    #[cfg(feature = "remote")]
    pub(crate) fn agent_env(&self) -> &Scrubbed {
        &self.env
    }

    /// The agent's delegation depth and cap, or why it may not start.
    pub fn budget(&self) -> Result<DepthBudget, &DepthError> {
        self.budget.as_ref().copied()
    }

    /// The sandbox the agent will run in: the request's, held to the one the caller runs in.
    #[must_use]
    pub fn sandbox(&self) -> &Standing {
        &self.sandbox
    }

    /// This run with another prompt, its working directory checked again (it may have gone
    /// since): what a caller starting many runs of the same request builds each one from, so
    /// the environment is scrubbed and the schema compiled once (`acp-host batch`). Nothing
    /// else of a prepared run depends on its prompt.
    pub fn for_prompt(&self, prompt: String) -> Result<Prepared, PrepareError> {
        check_cwd(&self.request.cwd)?;
        let mut prepared = self.clone();
        prepared.request.prompt = prompt;
        Ok(prepared)
    }
}

/// Validates the request against the machine (cwd) and computes the agent's environment from
/// `ambient` (normally `std::env::vars_os()`: a variable need not be UTF-8).
pub fn prepare(
    request: StartRequest,
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<Prepared, PrepareError> {
    check_cwd(&request.cwd)?;
    if let (Some(resume), Some(fork)) = (&request.resume, &request.fork) {
        return Err(PrepareError::ResumeAndFork {
            resume: resume.clone(),
            fork: fork.clone(),
        });
    }
    // The persona's variables are checked here, whichever way it will reach the agent.
    if let Some(persona) = &request.wants.persona {
        Template::parse(&persona.text)?;
    }
    let schema = match &request.wants.output {
        Some(output) => Some(Arc::new(OutputSchema::compile(output.schema.clone())?)),
        None => None,
    };
    let ambient: Vec<(OsString, OsString)> = ambient.into_iter().collect();
    // The caller's own standing comes from its environment (what it inherited), never from a
    // forwarded value: `--env ACP_HOST_DEPTH=0` must not lift the budget.
    let own = |name: &str| {
        ambient
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
    };
    let (own_depth, own_max, own_sandbox) = (
        own(env_vars::ACP_HOST_DEPTH),
        own(env_vars::ACP_HOST_MAX_DEPTH),
        own(env_vars::ACP_HOST_SANDBOX),
    );
    let budget = depth::child(
        depth::Inherited {
            depth: own_depth.as_deref(),
            max_depth: own_max.as_deref(),
        },
        &[request.max_depth],
    )
    .map(|standing| {
        if let Some(past_bound) = standing.past_bound {
            tracing::warn!("{past_bound}: the agent may not delegate");
        }
        standing.budget
    });
    let mut env = env_scrub::scrub(ambient, &request.env)?;
    for name in [env_vars::ACP_HOST_DEPTH, env_vars::ACP_HOST_MAX_DEPTH] {
        env.env.remove(std::ffi::OsStr::new(name));
    }
    if let Ok(budget) = budget {
        for (name, value) in budget.env() {
            env.env.insert(name.into(), value.into());
        }
    }
    // The agent's own token budget, for what it gives its children; never a forwarded value.
    env.env
        .remove(std::ffi::OsStr::new(env_vars::ACP_HOST_TOKEN_BUDGET));
    if let Some(tokens) = request.budget.tokens {
        env.env.insert(
            env_vars::ACP_HOST_TOKEN_BUDGET.into(),
            tokens.to_string().into(),
        );
    }
    // The caller's own sandbox (inherited, never forwarded) bounds the agent's: a child is at
    // least as confined as its parent, which the kernel holds anyway; this makes the records
    // and the agent's own settings say so.
    let mut sandbox = request.sandbox.at(&request.cwd)?;
    match Standing::inherited(own_sandbox.as_deref()) {
        Ok(Some(floor)) => sandbox = sandbox.within(&floor),
        Ok(None) => {}
        Err((strictest, why)) => {
            tracing::warn!(%why, "{} cannot be read; the agent runs in the strictest sandbox", env_vars::ACP_HOST_SANDBOX);
            sandbox = sandbox.within(&strictest);
        }
    }
    env.env
        .remove(std::ffi::OsStr::new(env_vars::ACP_HOST_SANDBOX));
    if sandbox.is_active() {
        env.env.insert(
            env_vars::ACP_HOST_SANDBOX.into(),
            sandbox.env_value().into(),
        );
    }
    Ok(Prepared {
        request,
        env,
        budget,
        schema,
        sandbox,
    })
}

fn check_cwd(cwd: &Path) -> Result<(), PrepareError> {
    if !cwd.is_absolute() {
        return Err(PrepareError::RelativeCwd(cwd.to_path_buf()));
    }
    let inaccessible = |reason: String| PrepareError::InaccessibleCwd {
        path: cwd.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(cwd).map_err(|e| inaccessible(e.to_string()))?;
    if !meta.is_dir() {
        return Err(inaccessible("not a directory".into()));
    }
    nix::unistd::access(cwd, nix::unistd::AccessFlags::X_OK)
        .map_err(|e| inaccessible(format!("cannot enter it: {}", e.desc())))?;
    Ok(())
}
