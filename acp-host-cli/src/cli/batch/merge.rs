//! `acp-host batch --merge FILE...`: the results files of one batch (its shards, its resumed runs)
//! as one, keeping the last record of each id.
//!
//! Invariants: "last" is in the order the files are given, then line order within each file (a
//! resumed batch appends, so a line's newer record comes after its older ones); a line is a
//! record when `protocol::shard::record_id` says so, anything else (a `--json-summary` line, a
//! line cut short by a killed worker, text) is left out and counted on stderr. The files are
//! read twice: once to find each id's last record (only the ids and their positions are kept,
//! never a record's text, so memory is the ids', not the outputs'), once to copy those lines
//! to stdout as they are, in that same order. A file that is also stdout is refused before
//! anything is read.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use protocol::batch::EXIT_OUTPUT_LOST;
use protocol::report::printable_path;
use protocol::shard;

use crate::cli::CliError;

/// Where a line is: the file's place among the arguments, then the line's number in it.
type Position = (usize, u64);

/// What the first pass found.
#[derive(Debug, Default)]
struct Found {
    /// Each id's last record.
    last: HashMap<String, Position>,
    records: u64,
    /// Lines that are not records (blank lines aside).
    others: u64,
}

pub(in crate::cli) fn execute(files: &[PathBuf]) -> Result<ExitCode, CliError> {
    for path in files {
        refuse_stdout(path)?;
    }
    let mut found = Found::default();
    for (index, path) in files.iter().enumerate() {
        each_line(path, |number, line| {
            let text = std::str::from_utf8(line).ok();
            match text.and_then(shard::record_id) {
                Some(id) => {
                    found.records += 1;
                    found.last.insert(id, (index, number));
                }
                None if text.is_some_and(|text| text.trim().is_empty()) => {}
                None => found.others += 1,
            }
            true
        })?;
    }
    let keep: HashSet<Position> = found.last.values().copied().collect();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failure: Option<std::io::Error> = None;
    for (index, path) in files.iter().enumerate() {
        each_line(path, |number, line| {
            if !keep.contains(&(index, number)) {
                return true;
            }
            let written = out.write_all(line).and_then(|()| {
                if line.ends_with(b"\n") {
                    Ok(())
                } else {
                    out.write_all(b"\n")
                }
            });
            written.map_err(|err| failure = Some(err)).is_ok()
        })?;
        if failure.is_some() {
            break;
        }
    }
    if failure.is_none() {
        failure = out.flush().err();
    }
    note(files.len(), &found);
    match failure {
        None => Ok(ExitCode::SUCCESS),
        Some(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
            note!("acp-host: batch: --merge: stdout was closed before every record was written");
            Ok(ExitCode::from(EXIT_OUTPUT_LOST))
        }
        Some(err) => Err(CliError::Failed(format!(
            "--merge: cannot write to stdout: {err}"
        ))),
    }
}

/// Says what was merged: records, ids, how many a later record replaced, what was left out.
fn note(files: usize, found: &Found) {
    let ids = u64::try_from(found.last.len()).unwrap_or(u64::MAX);
    let replaced = found.records - ids;
    let others = match found.others {
        0 => String::new(),
        1 => "; 1 line that is not a record left out".to_owned(),
        n => format!("; {n} lines that are not records left out"),
    };
    note!(
        "acp-host: batch: merged {files} file{}: {} records of {ids} ids ({replaced} replaced by \
         a later record){others}",
        if files == 1 { "" } else { "s" },
        found.records
    );
}

/// Calls `each(number, bytes)` for every line of `path` (its line break included), numbered from
/// 1, until it returns false.
fn each_line(path: &Path, mut each: impl FnMut(u64, &[u8]) -> bool) -> Result<(), CliError> {
    let cannot = |err: std::io::Error| {
        CliError::Usage(if err.kind() == std::io::ErrorKind::NotFound {
            format!(
                "--merge {}: no such file; give the results files of a batch (its stdout)",
                printable_path(path)
            )
        } else {
            format!("--merge {}: cannot read it: {err}", printable_path(path))
        })
    };
    let mut reader = std::io::BufReader::new(std::fs::File::open(path).map_err(cannot)?);
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(cannot)? == 0 {
            return Ok(());
        }
        number += 1;
        if !each(number, &line) {
            return Ok(());
        }
    }
}

/// Refuses a results file that is also stdout: the shell has already emptied it (`>`), or the
/// merged records would be appended to what is being read (`>>`).
fn refuse_stdout(path: &Path) -> Result<(), CliError> {
    if super::stdout_is(path).is_some() {
        return Err(CliError::Usage(format!(
            "--merge {0}: it is also stdout (`> {0}` has already emptied it); write the merged \
             records to another file",
            printable_path(path)
        )));
    }
    Ok(())
}
