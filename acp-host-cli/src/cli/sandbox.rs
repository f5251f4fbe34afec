//! The sandbox flags `run`, `batch` and `serve` share, and their conversion into the run
//! library's [`Policy`] (`protocol::sandbox`, enforced by `acp_host::sandbox`).

use std::path::{Path, PathBuf};

use protocol::sandbox::{Mode, Network, Policy};

/// How the agent is contained (Landlock and seccomp, enforced by the kernel; docs/sandbox.md).
#[derive(Debug, Clone, Default, clap::Args)]
pub(super) struct SandboxArgs {
    /// What the agent may do with files: `off`, `read-only` (read anywhere but the credential
    /// folders; write only its own temporary folder), `workspace-write` (also write the working
    /// directory and each --sandbox-write root, their `.git` kept read-only) [default: off].
    #[arg(long = "sandbox", value_name = "MODE", help_heading = "Sandbox")]
    pub(super) mode: Option<Mode>,

    /// What the agent may reach: `on`, `off` (no TCP, UDP or raw socket), or `tcp:PORT[,PORT]`
    /// (TCP connections to those ports only; names resolve only where a resolver is reached over
    /// them or /etc/hosts) [default: on].
    #[arg(long, value_name = "on|off|tcp:PORT", help_heading = "Sandbox")]
    pub(super) network: Option<Network>,

    /// Under `workspace-write`, another folder the agent may write (repeatable).
    #[arg(long = "sandbox-write", value_name = "PATH", help_heading = "Sandbox")]
    pub(super) write: Vec<PathBuf>,

    /// Under `workspace-write`, let the agent write `.git` too (commits, branches).
    #[arg(long = "sandbox-write-git", help_heading = "Sandbox")]
    pub(super) write_git: bool,

    /// Another path the agent may not read, beside the credential folders (repeatable).
    #[arg(long = "sandbox-deny", value_name = "PATH", help_heading = "Sandbox")]
    pub(super) deny: Vec<PathBuf>,

    /// Run even where the kernel cannot enforce all of the sandbox, saying in the record what was
    /// not (without it, such a run fails before anything starts: errorKind `sandbox`).
    #[arg(long = "sandbox-best-effort", help_heading = "Sandbox")]
    pub(super) best_effort: bool,
}

impl SandboxArgs {
    /// The policy these flags ask for, its paths made absolute against `base` (the directory
    /// acp-host was started in); flags that only mean something under a mode are refused
    /// without it.
    pub(super) fn policy(&self, base: &Path) -> Result<Policy, String> {
        let mode = self.mode.unwrap_or_default();
        if mode != Mode::WorkspaceWrite && (!self.write.is_empty() || self.write_git) {
            let flag = if self.write_git {
                "--sandbox-write-git"
            } else {
                "--sandbox-write"
            };
            return Err(format!(
                "{flag} needs --sandbox workspace-write (the mode that writes the working directory)"
            ));
        }
        let absolute = |paths: &[PathBuf]| paths.iter().map(|path| base.join(path)).collect();
        Ok(Policy {
            mode,
            network: self.network.clone().unwrap_or_default(),
            write: absolute(&self.write),
            write_git: self.write_git,
            deny: absolute(&self.deny),
            best_effort: self.best_effort,
        })
    }

    /// These flags with a batch line's own `sandbox` and `network` over them: a line only
    /// tightens what the flags set (the person's floor), never loosens it.
    pub(super) fn with_line(&self, mode: Option<Mode>, network: Option<&Network>) -> SandboxArgs {
        let mine = self.mode.unwrap_or_default();
        let network = match (&self.network, network) {
            (Some(flag), Some(line)) => Some(flag.tighter(line)),
            (flag, line) => flag.clone().or_else(|| line.cloned()),
        };
        SandboxArgs {
            mode: Some(mode.map_or(mine, |line| mine.stricter(line))),
            network,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_roots_need_workspace_write_and_paths_are_made_absolute() {
        let args = SandboxArgs {
            write: vec!["out".into()],
            ..SandboxArgs::default()
        };
        assert_eq!(
            args.policy(Path::new("/here")).unwrap_err(),
            "--sandbox-write needs --sandbox workspace-write (the mode that writes the working directory)"
        );
        let args = SandboxArgs {
            mode: Some(Mode::WorkspaceWrite),
            deny: vec!["/abs".into(), "rel".into()],
            ..args
        };
        let policy = args.policy(Path::new("/here")).unwrap();
        assert_eq!(policy.write, [PathBuf::from("/here/out")]);
        assert_eq!(policy.deny, [PathBuf::from("/abs"), "/here/rel".into()]);
    }

    #[test]
    fn a_batch_line_only_tightens_the_flags() {
        let flags = SandboxArgs {
            mode: Some(Mode::WorkspaceWrite),
            network: Some("tcp:443,80".parse().unwrap()),
            ..SandboxArgs::default()
        };
        let line = flags.with_line(Some(Mode::Off), Some(&Network::On));
        assert_eq!(line.mode, Some(Mode::WorkspaceWrite));
        assert_eq!(line.network, Some("tcp:443,80".parse().unwrap()));
        let line = flags.with_line(Some(Mode::ReadOnly), Some(&"tcp:443".parse().unwrap()));
        assert_eq!(line.mode, Some(Mode::ReadOnly));
        assert_eq!(line.network, Some("tcp:443".parse().unwrap()));
        let open = SandboxArgs::default().with_line(None, Some(&Network::Off));
        assert_eq!(
            (open.mode, open.network),
            (Some(Mode::Off), Some(Network::Off))
        );
    }
}
