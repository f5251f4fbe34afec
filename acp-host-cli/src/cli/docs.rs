//! `acp-host completions SHELL` and `acp-host man`: shell completions and man pages generated from
//! the clap definitions themselves, so they cannot drift from the flags the binary takes.
//!
//! Completions go to stdout (`acp-host completions bash > ~/.local/share/bash-completion/completions/acp-host`).
//! `acp-host man` prints the page of acp-host itself; `--dir DIR` writes one page per subcommand
//! (`acp-host.1`, `acp-host-run.1`, ...) into DIR through `fs_atomic`, replacing pages of those
//! names and nothing else.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory as _;

use super::{Cli, CliError, write_stdout};

/// Print a shell completion script for acp-host.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  source <(acp-host completions bash)        this shell only
  acp-host completions bash > ~/.local/share/bash-completion/completions/acp-host
  acp-host completions zsh > ~/.zfunc/_acp-host      (with fpath+=~/.zfunc before compinit)
  acp-host completions fish > ~/.config/fish/completions/acp-host.fish")]
pub(super) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    shell: clap_complete::Shell,
}

/// Print acp-host's man page, or write one page per subcommand into a folder.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  acp-host man | man -l -                  read it now
  acp-host man --dir ~/.local/share/man/man1")]
pub(super) struct ManArgs {
    /// Write acp-host.1 and one acp-host-SUBCOMMAND.1 per subcommand into DIR (created if
    /// missing) instead of printing acp-host.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub(super) fn completions(args: &CompletionsArgs) -> Result<ExitCode, CliError> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "acp-host", &mut script);
    write_stdout(&script)?;
    Ok(ExitCode::SUCCESS)
}

pub(super) fn man(args: &ManArgs) -> Result<ExitCode, CliError> {
    let pages = pages(Cli::command())?;
    let Some(dir) = &args.dir else {
        // The first page is acp-host's own.
        write_stdout(&pages[0].1)?;
        return Ok(ExitCode::SUCCESS);
    };
    for (name, page) in &pages {
        let path = dir.join(name);
        acp_host::fs_atomic::write_atomic(&path, page).map_err(|err| {
            CliError::Failed(format!(
                "cannot write the man page {}: {err}",
                path.display()
            ))
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `(file name, roff)` of acp-host's page and of each subcommand's (`acp-host-run.1`), in the
/// help's order. Built first, so each subcommand knows its display name (`acp-host-run`) and the
/// command line that reaches it (`acp-host run`).
fn pages(command: clap::Command) -> Result<Vec<(String, Vec<u8>)>, CliError> {
    fn render(command: &clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<(), CliError> {
        let man = clap_mangen::Man::new(command.clone());
        let name = man.get_filename();
        let mut page = Vec::new();
        man.render(&mut page)
            .map_err(|err| CliError::Failed(format!("cannot render the man page {name}: {err}")))?;
        pages.push((name, page));
        for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
            render(sub, pages)?;
        }
        Ok(())
    }
    let mut command = command
        .version(super::VERSION.as_str())
        .disable_help_subcommand(true);
    command.build();
    let mut pages = Vec::new();
    render(&command, &mut pages)?;
    Ok(pages)
}
