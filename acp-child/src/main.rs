//! The `acp-child` binary.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
