//! Which lines of a batch this worker runs: its shard (`acp-host batch --shard INDEX/COUNT`, or
//! `--shard-from-env` for a scheduler's variables) and the lines already done (`--skip-done`).
//!
//! Invariants:
//! - a line belongs to shard `sha256(id)[..8] as a big-endian u64 % COUNT`: the SHA-256 digest of
//!   the id's UTF-8 bytes (the line number, in decimal, for a line without `id`), whose first 8
//!   bytes are read as a big-endian integer. SHA-256 is fixed by its standard, so the rule is the
//!   same on every machine, release and toolchain (the std hasher is not), and COUNT workers given
//!   the same input run every line exactly once between them;
//! - an index is 0-based and below its count; a count is at least 1 and at most [`MAX_SHARDS`];
//!   anything else is an error naming the flag and how to fix it;
//! - a results file is read record by record ([`completed_id`]): only a `result` record whose
//!   `status` is `completed` marks its id done. Whatever else a line holds (another status, a
//!   `not-started` record, a line cut by an interrupted batch) marks nothing, so a doubt only
//!   ever runs a line again, never skips one that did not complete.

use sha2::{Digest as _, Sha256};

use crate::status::Status;

/// The most workers a batch may be split over: far above any scheduler's array, low enough that
/// a typo (`--shard 3/40000000`) is caught.
pub const MAX_SHARDS: u64 = 1_000_000;

/// Why `--shard` or `--shard-from-env` was refused; each message names the flag as given and how
/// to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("{flag}: the count is {count}; it is from 1 to {MAX_SHARDS} workers")]
    Count { flag: String, count: u64 },
    #[error(
        "{flag}: index {index} is not below the count {count}; indexes are 0-based, from 0 to {}",
        .count - 1
    )]
    Index {
        flag: String,
        index: u64,
        count: u64,
    },
    #[error("{flag}: expected INDEX/COUNT, as in `--shard 0/4`")]
    Form { flag: String },
    #[error(
        "{flag}: the {what} {value:?} is not a whole number; expected INDEX/COUNT, as in `--shard 0/4`"
    )]
    NotANumber {
        flag: String,
        what: &'static str,
        value: String,
    },
    #[error(
        "{flag}: expected VARIABLE/COUNT or VARIABLE/VARIABLE, as in \
         `--shard-from-env JOB_COMPLETION_INDEX/4`"
    )]
    FromEnvForm { flag: String },
    #[error(
        "{flag}: the {what} {value:?} is neither a whole number nor a variable name (letters, \
         digits and `_`)"
    )]
    NotANumberOrName {
        flag: String,
        what: &'static str,
        value: String,
    },
    #[error(
        "{flag}: the variable {name} is not set; the scheduler sets it for each worker (or use \
         --shard INDEX/COUNT)"
    )]
    Unset { flag: String, name: String },
    #[error("{flag}: the variable {name} is {text:?}, not a whole number")]
    VariableNotANumber {
        flag: String,
        name: String,
        text: String,
    },
    /// An index variable past a count variable: the count is most likely the scheduler's count
    /// of this submission's tasks.
    #[error(
        "{index}; {count_name}={count} counts this submission's tasks, not the batch's shards (a \
         task resubmitted alone has a count of 1): give the count as a number, as in \
         `--shard-from-env {index_name}/4`"
    )]
    Submission {
        index: Box<ShardError>,
        count_name: String,
        count: u64,
        index_name: String,
    },
}

/// One worker's share of a batch: the lines whose id hashes to `index` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    index: u64,
    count: u64,
}

impl Shard {
    /// The shard `index` of `count`; the error says what is wrong (`flag` names where the values
    /// came from).
    pub fn new(index: u64, count: u64, flag: &str) -> Result<Self, ShardError> {
        let flag = flag.to_owned();
        if count == 0 || count > MAX_SHARDS {
            return Err(ShardError::Count { flag, count });
        }
        if index >= count {
            return Err(ShardError::Index { flag, index, count });
        }
        Ok(Shard { index, count })
    }

    /// Reads `--shard INDEX/COUNT`.
    pub fn parse(text: &str) -> Result<Self, ShardError> {
        let flag = format!("--shard {text}");
        let (index, count) = text
            .split_once('/')
            .ok_or_else(|| ShardError::Form { flag: flag.clone() })?;
        let number = |what: &'static str, value: &str| {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| ShardError::NotANumber {
                    flag: flag.clone(),
                    what,
                    value: value.to_owned(),
                })
        };
        Shard::new(number("index", index)?, number("count", count)?, &flag)
    }

    #[must_use]
    pub fn index(self) -> u64 {
        self.index
    }

    #[must_use]
    pub fn count(self) -> u64 {
        self.count
    }

    /// Whether the line with this id is this shard's to run.
    #[must_use]
    pub fn owns(self, id: &str) -> bool {
        shard_of(id, self.count) == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The shard (`0..count`) a line with this id belongs to; `count` is at least 1.
#[must_use]
pub fn shard_of(id: &str, count: u64) -> u64 {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0_u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % count.max(1)
}

/// `--shard-from-env INDEX/COUNT`: each side is a whole number or the name of an environment
/// variable holding one (`JOB_COMPLETION_INDEX/4`, `SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFromEnv {
    index: Source,
    count: Source,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Number(u64),
    Variable(String),
}

impl ShardFromEnv {
    /// Reads the flag's value (nothing is looked up yet).
    pub fn parse(text: &str) -> Result<Self, ShardError> {
        let flag = format!("--shard-from-env {text}");
        let (index, count) = text
            .split_once('/')
            .ok_or_else(|| ShardError::FromEnvForm { flag: flag.clone() })?;
        let source = |what: &'static str, value: &str| {
            let value = value.trim();
            if let Ok(number) = value.parse::<u64>() {
                return Ok(Source::Number(number));
            }
            let name_like = value
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if name_like {
                Ok(Source::Variable(value.to_owned()))
            } else {
                Err(ShardError::NotANumberOrName {
                    flag: flag.clone(),
                    what,
                    value: value.to_owned(),
                })
            }
        };
        Ok(ShardFromEnv {
            index: source("index", index)?,
            count: source("count", count)?,
            text: text.to_owned(),
        })
    }

    /// The names of the variables to look up, index first.
    #[must_use]
    pub fn variables(&self) -> Vec<&str> {
        [&self.index, &self.count]
            .into_iter()
            .filter_map(|source| match source {
                Source::Variable(name) => Some(name.as_str()),
                Source::Number(_) => None,
            })
            .collect()
    }

    /// The shard, with the variables' values from `lookup`; the error names the variable that is
    /// unset or not a number.
    pub fn resolve(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<Shard, ShardError> {
        let flag = format!("--shard-from-env {}", self.text);
        let value = |source: &Source| match source {
            Source::Number(number) => Ok(*number),
            Source::Variable(name) => {
                let text = lookup(name)
                    .filter(|value| !value.trim().is_empty())
                    .ok_or_else(|| ShardError::Unset {
                        flag: flag.clone(),
                        name: name.clone(),
                    })?;
                text.trim()
                    .parse::<u64>()
                    .map_err(|_| ShardError::VariableNotANumber {
                        flag: flag.clone(),
                        name: name.clone(),
                        text: text.clone(),
                    })
            }
        };
        let (index, count) = (value(&self.index)?, value(&self.count)?);
        Shard::new(index, count, &flag).map_err(|err| match (&self.index, &self.count) {
            (Source::Variable(index_name), Source::Variable(count_name))
                if count > 0 && index >= count =>
            {
                ShardError::Submission {
                    index: Box::new(err),
                    count_name: count_name.clone(),
                    count,
                    index_name: index_name.clone(),
                }
            }
            _ => err,
        })
    }
}

/// The id of a results line (`acp-host batch` output) that records a completed run; `None` for
/// anything else: another status, a `not-started` record, a blank line, or a line that is not a
/// record at all (say, cut short when a batch was killed while writing it).
#[must_use]
pub fn completed_id(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Record {
        #[serde(rename = "type")]
        kind: String,
        id: String,
        status: String,
    }
    let record: Record = serde_json::from_str(line.trim()).ok()?;
    (record.kind == "result" && record.status == Status::Completed.as_str()).then_some(record.id)
}

/// The id of a results line that is a record of a line (`result` or `not-started`); `None` for
/// anything else: a `--json-summary` line, a blank line, a line cut short. `acp-host batch
/// --merge` keeps the last record of each id.
#[must_use]
pub fn record_id(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Record {
        #[serde(rename = "type")]
        kind: String,
        id: String,
    }
    let record: Record = serde_json::from_str(line.trim()).ok()?;
    matches!(record.kind.as_str(), "result" | "not-started").then_some(record.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_either_kind_has_an_id_and_nothing_else_does() {
        assert_eq!(
            record_id(r#"{"type":"result","id":"a","status":"error"}"#).as_deref(),
            Some("a")
        );
        assert_eq!(
            record_id("{\"type\":\"not-started\",\"id\":\"b\",\"status\":\"not-started\"}\n")
                .as_deref(),
            Some("b")
        );
        assert_eq!(record_id(r#"{"type":"summary","completed":1}"#), None);
        assert_eq!(record_id(r#"{"type":"result","id":"a","stat"#), None);
        assert_eq!(record_id(r#"{"type":"other","id":"a"}"#), None);
        assert_eq!(record_id(""), None);
    }

    #[test]
    fn the_shard_of_an_id_is_the_documented_sha256_rule() {
        // sha256("a") = ca978112ca1bbdca...; 0xca978112ca1bbdca % 4 = 2, % 7 = 4.
        assert_eq!(u64::from_str_radix("ca978112ca1bbdca", 16).unwrap() % 4, 2);
        assert_eq!(shard_of("a", 4), 2);
        assert_eq!(shard_of("a", 7), 4);
        assert_eq!(shard_of("anything", 1), 0);
    }

    #[test]
    fn every_id_belongs_to_exactly_one_shard() {
        let shards: Vec<Shard> = (0..4).map(|i| Shard::new(i, 4, "t").unwrap()).collect();
        let mut sizes = [0_usize; 4];
        for n in 1..=1000 {
            let id = n.to_string();
            let owners: Vec<u64> = shards
                .iter()
                .filter(|shard| shard.owns(&id))
                .map(|shard| shard.index())
                .collect();
            assert_eq!(owners.len(), 1, "{id}: {owners:?}");
            sizes[usize::try_from(owners[0]).unwrap()] += 1;
        }
        // Spread, not all on one worker: each of 4 shards holds about 250 of 1000.
        assert!(
            sizes.iter().all(|&size| (180..320).contains(&size)),
            "{sizes:?}"
        );
    }

    #[test]
    fn a_shard_is_read_and_bad_ones_say_how_to_fix_them() {
        let shard = Shard::parse("1/4").unwrap();
        assert_eq!(
            (shard.index(), shard.count(), shard.to_string()),
            (1, 4, "1/4".into())
        );
        assert_eq!(
            Shard::parse("4/4").unwrap_err().to_string(),
            "--shard 4/4: index 4 is not below the count 4; indexes are 0-based, from 0 to 3"
        );
        assert_eq!(
            Shard::parse("0/0").unwrap_err().to_string(),
            "--shard 0/0: the count is 0; it is from 1 to 1000000 workers"
        );
        assert_eq!(
            Shard::parse("2").unwrap_err().to_string(),
            "--shard 2: expected INDEX/COUNT, as in `--shard 0/4`"
        );
        assert_eq!(
            Shard::parse("-1/4").unwrap_err().to_string(),
            "--shard -1/4: the index \"-1\" is not a whole number; expected INDEX/COUNT, as in \
             `--shard 0/4`"
        );
    }

    #[test]
    fn a_shard_from_the_environment_names_the_variable_that_is_wrong() {
        let spec = ShardFromEnv::parse("JOB_COMPLETION_INDEX/4").unwrap();
        assert_eq!(spec.variables(), vec!["JOB_COMPLETION_INDEX"]);
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        assert_eq!(
            spec.resolve(env(&[("JOB_COMPLETION_INDEX", "3")])),
            Ok(Shard::new(3, 4, "t").unwrap())
        );
        assert_eq!(
            spec.resolve(env(&[])).unwrap_err().to_string(),
            "--shard-from-env JOB_COMPLETION_INDEX/4: the variable JOB_COMPLETION_INDEX is not \
             set; the scheduler sets it for each worker (or use --shard INDEX/COUNT)"
        );
        assert_eq!(
            spec.resolve(env(&[("JOB_COMPLETION_INDEX", "x")]))
                .unwrap_err()
                .to_string(),
            "--shard-from-env JOB_COMPLETION_INDEX/4: the variable JOB_COMPLETION_INDEX is \"x\", \
             not a whole number"
        );
        assert_eq!(
            spec.resolve(env(&[("JOB_COMPLETION_INDEX", "4")]))
                .unwrap_err()
                .to_string(),
            "--shard-from-env JOB_COMPLETION_INDEX/4: index 4 is not below the count 4; indexes \
             are 0-based, from 0 to 3"
        );
        let both = ShardFromEnv::parse("SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT").unwrap();
        assert_eq!(
            both.variables(),
            vec!["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"]
        );
        assert_eq!(
            both.resolve(env(&[
                ("SLURM_ARRAY_TASK_ID", "0"),
                ("SLURM_ARRAY_TASK_COUNT", "2")
            ])),
            Ok(Shard::new(0, 2, "t").unwrap())
        );
        // `sbatch --array=2` alone: Slurm counts one task.
        assert_eq!(
            both.resolve(env(&[
                ("SLURM_ARRAY_TASK_ID", "2"),
                ("SLURM_ARRAY_TASK_COUNT", "1")
            ]))
            .unwrap_err()
            .to_string(),
            "--shard-from-env SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT: index 2 is not below the \
             count 1; indexes are 0-based, from 0 to 0; SLURM_ARRAY_TASK_COUNT=1 counts this \
             submission's tasks, not the batch's shards (a task resubmitted alone has a count of \
             1): give the count as a number, as in `--shard-from-env SLURM_ARRAY_TASK_ID/4`"
        );
        assert_eq!(
            both.resolve(env(&[
                ("SLURM_ARRAY_TASK_ID", "0"),
                ("SLURM_ARRAY_TASK_COUNT", "0")
            ]))
            .unwrap_err()
            .to_string(),
            "--shard-from-env SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT: the count is 0; it is \
             from 1 to 1000000 workers"
        );
        assert_eq!(
            ShardFromEnv::parse("JOB_COMPLETION_INDEX")
                .unwrap_err()
                .to_string(),
            "--shard-from-env JOB_COMPLETION_INDEX: expected VARIABLE/COUNT or VARIABLE/VARIABLE, \
             as in `--shard-from-env JOB_COMPLETION_INDEX/4`"
        );
        assert_eq!(
            ShardFromEnv::parse("$X/4").unwrap_err().to_string(),
            "--shard-from-env $X/4: the index \"$X\" is neither a whole number nor a variable name \
             (letters, digits and `_`)"
        );
    }

    #[test]
    fn only_a_completed_result_marks_its_id_done() {
        assert_eq!(
            completed_id(r#"{"type":"result","id":"a","status":"completed","output":"x"}"#),
            Some("a".into())
        );
        assert_eq!(
            completed_id(r#"{"type":"result","id":"a","status":"timeout"}"#),
            None
        );
        assert_eq!(
            completed_id(r#"{"type":"not-started","id":"a","status":"not-started"}"#),
            None
        );
        assert_eq!(completed_id(r#"{"type":"result","id":"a","sta"#), None);
        assert_eq!(completed_id(""), None);
    }
}
