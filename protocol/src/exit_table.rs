//! The exit-code tables of the subcommands, as their `--help` prints them and the manual (`docs/`) lists
//! them (a test holds the two together): `run`'s is [`Status`]'s, `batch`'s is
//! [`crate::batch::exit_rows`], the others are written here.

use std::fmt::Write as _;

use crate::status::{EXIT_FAILED, EXIT_USAGE, ExitRow, Status};

/// A subcommand whose exit codes are documented as a table, in its `--help` and in the manual (`docs/`)
/// (a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Documented {
    Run,
    Batch,
    Serve,
    Agents,
    Trust,
}

/// The usage row every table ends with: what was wrong depends on the subcommand.
const fn usage(when: &'static str) -> ExitRow {
    ExitRow {
        code: EXIT_USAGE,
        name: "usage",
        when,
    }
}

impl Documented {
    /// Every documented subcommand.
    pub const ALL: [Documented; 5] = [
        Documented::Run,
        Documented::Batch,
        Documented::Serve,
        Documented::Agents,
        Documented::Trust,
    ];

    /// The subcommand's name (`acp-host NAME`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Documented::Run => "run",
            Documented::Batch => "batch",
            Documented::Serve => "serve",
            Documented::Agents => "agents",
            Documented::Trust => "trust",
        }
    }

    /// The subcommand's exit codes, in the order they are documented.
    #[must_use]
    pub fn exit_rows(self) -> Vec<ExitRow> {
        let failed = |when| ExitRow {
            code: EXIT_FAILED,
            name: "failed",
            when,
        };
        let done = |name, when| ExitRow {
            code: Status::Completed.exit_code(),
            name,
            when,
        };
        match self {
            Documented::Run => Status::ALL
                .iter()
                .map(|status| ExitRow {
                    code: status.exit_code(),
                    name: status.as_str(),
                    when: status.when(),
                })
                .chain([usage(
                    "bad flags, cwd or --env, or an agent not found; nothing was spawned",
                )])
                .collect(),
            Documented::Batch => crate::batch::exit_rows(),
            Documented::Serve => vec![
                done(
                    "stopped",
                    "SIGINT / SIGTERM, once every agent was torn down",
                ),
                failed("it could not listen on --listen, or the sandbox cannot be held here"),
                usage("bad flags or token file, or an agent not found; nothing listened"),
            ],
            Documented::Agents => vec![
                done("listed", "the listing was printed"),
                failed("the ACP Registry could not be fetched, read or cached"),
                usage("bad flags"),
            ],
            Documented::Trust => vec![
                done("done", "listed, approved or revoked"),
                failed("the approvals, or the current directory, could not be read or written"),
                usage("a path that is neither a folder nor a definition file, or bad flags"),
            ],
        }
    }

    /// The exit-code table as `--help` prints it.
    #[must_use]
    pub fn exit_table(self) -> String {
        self.exit_rows()
            .iter()
            .fold(String::from("Exit codes:\n"), |mut out, row| {
                let _ = writeln!(out, "  {:>3}  {:<17}  {}", row.code, row.name, row.when);
                out
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_table_is_every_status() {
        let table = Documented::Run.exit_table();
        for status in Status::ALL {
            assert!(table.contains(status.as_str()));
        }
    }

    #[test]
    fn batchs_table_is_batchs_rows() {
        let table = Documented::Batch.exit_table();
        assert!(table.contains("  130  aborted            Ctrl-C"));
        assert!(table.contains("  141  output-lost        records were not all written ("));
    }

    #[test]
    fn every_documented_table_has_distinct_codes_and_a_usage_row() {
        for command in Documented::ALL {
            let rows = command.exit_rows();
            let codes: std::collections::HashSet<u8> = rows.iter().map(|row| row.code).collect();
            assert_eq!(codes.len(), rows.len(), "{}", command.name());
            assert!(
                rows.iter()
                    .any(|row| row.code == EXIT_USAGE && row.name == "usage")
            );
            let table = command.exit_table();
            assert!(table.starts_with("Exit codes:\n"), "{table}");
            assert_eq!(table.lines().count(), rows.len() + 1, "{table}");
            // Each row fits a 100-column help text on one line (clap wraps longer ones).
            assert!(table.lines().all(|line| line.len() <= 100), "{table}");
        }
        assert_eq!(
            Documented::ALL.map(Documented::name),
            ["run", "batch", "serve", "agents", "trust"]
        );
        assert!(
            Documented::Serve
                .exit_table()
                .contains("    0  stopped            SIGINT / SIGTERM")
        );
        assert!(Documented::Agents.exit_table().contains("    1  failed "));
        assert!(Documented::Trust.exit_table().contains("    0  done "));
    }
}
