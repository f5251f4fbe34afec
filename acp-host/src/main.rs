//! The `acp-host` binary: everything lives in the CLI module.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
