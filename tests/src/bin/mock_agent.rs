//! `mock-agent <scenario> [flags]`: the scripted ACP agent the end-to-end suites launch as a
//! subprocess. Usage errors exit 64; see `acp_tests::mock::cli` for scenarios and flags.

#![expect(
    clippy::print_stderr,
    reason = "the mock agent reports its usage errors"
)]

use acp_tests::mock::{self, SETUP_FAILURE_EXIT, cli};

fn main() {
    let args: Result<Vec<String>, cli::UsageError> = std::env::args_os()
        .skip(1)
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| cli::UsageError::NotUtf8(arg.to_string_lossy().into_owned()))
        })
        .collect();
    let config = match args.and_then(cli::parse) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("mock-agent: {error}");
            std::process::exit(cli::USAGE_EXIT);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mock-agent: cannot start the tokio runtime: {error}");
            std::process::exit(SETUP_FAILURE_EXIT);
        }
    };
    let code = runtime.block_on(mock::run(config));
    // `exit`, not a return: dropping the runtime would wait for the blocked stdin read.
    std::process::exit(code);
}
