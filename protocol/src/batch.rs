//! `acp-host batch`: one input line -> one run, and one output record per run.
//!
//! Invariants: a line is read strictly: it is a JSON object whose keys are the known fields
//! ([`FIELDS`]), each of its type and each once (a key given twice, at any depth, is refused:
//! JSON would silently take the last); anything else is an error naming the line and the field, so
//! a typo never silently runs a different job. A line without `id` gets its line number. Reading
//! is pure (text in, [`BatchLine`] out); what needs the machine (the agent's program, the cwd, a
//! subagent definition) is checked by the CLI before anything starts.
//!
//! How many agents may run at once is decided here too ([`check_jobs`]): at most [`MAX_JOBS`],
//! and no more than the process's open-file and process limits leave room for. The exit code
//! ([`exit_code`]) says first whether the output is whole: a record that could not be written
//! (stdout closed, failing, or stalled after Ctrl-C) is [`EXIT_OUTPUT_LOST`], whatever the runs
//! did.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::result::RunResult;
use crate::status::{EXIT_USAGE, ExitRow, Status};
use crate::structured::OutputSchema;

/// The fields a line may have, in documentation order.
pub const FIELDS: &[&str] = &[
    "id",
    "prompt",
    "agent",
    "subagent",
    "cwd",
    "timeout",
    "env",
    "outputSchema",
    "fork",
    "tokenBudget",
    "costBudget",
    "sandbox",
    "network",
    "worktree",
];

/// One run asked for by one input line. Adding a field is one member here and one arm in
/// [`parse_line`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchLine {
    /// The line's `id`, or its line number; echoed in its record.
    pub id: String,
    pub prompt: String,
    /// A registry name or a command line, like `acp-host run --agent`.
    pub agent: Option<String>,
    /// A subagent definition's name, like `acp-host run --subagent`.
    pub subagent: Option<String>,
    /// The run's working directory; a relative one is taken from the batch's.
    pub cwd: Option<PathBuf>,
    pub timeout: Option<Duration>,
    /// Names of variables forwarded to the agent (never values: the input is data, not secrets).
    pub env: Vec<String>,
    /// A JSON Schema the answer must match, like `acp-host run --output-schema` (checked to
    /// compile when the line is read).
    pub output_schema: Option<Value>,
    /// A session of the agent to start from a copy of, like `acp-host run --fork`.
    pub fork: Option<String>,
    /// Like `acp-host run --token-budget`.
    pub token_budget: Option<u64>,
    /// Like `acp-host run --cost-budget`.
    pub cost_budget: Option<f64>,
    /// Like `acp-host run --sandbox`; it only tightens the batch's `--sandbox`.
    pub sandbox: Option<crate::sandbox::Mode>,
    /// Like `acp-host run --network`; it only tightens the batch's `--network`.
    pub network: Option<crate::sandbox::Network>,
    /// Like `acp-host run --worktree[=NAME]`: `true` is `Some(None)`, a name `Some(Some(name))`
    /// (checked when the line is read), `false` none.
    pub worktree: Option<Option<String>>,
}

/// Why a line was refused; `field` is `None` when the line as a whole is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {problem}", field.as_ref().map(|f| format!(", field `{f}`")).unwrap_or_default())]
pub struct LineError {
    pub line: usize,
    pub field: Option<String>,
    pub problem: String,
}

/// What is wrong with a line that is not JSON, where in the line: serde's own message less its
/// ` at line 1 column N` (the line is the input's, already named).
fn json_problem(err: &serde_json::Error) -> String {
    let message = err.to_string();
    let place = format!(" at line {} column {}", err.line(), err.column());
    let message = message.strip_suffix(&place).unwrap_or(&message);
    format!(
        "not valid JSON at column {}: {message}; each line is one JSON object, {{\"prompt\": \"...\"}}",
        err.column()
    )
}

/// Reads line `number` (1-based) of the input. `None` for a blank line (skipped).
#[must_use]
pub fn parse_line(number: usize, text: &str) -> Option<Result<BatchLine, LineError>> {
    if text.trim().is_empty() {
        return None;
    }
    // Untrimmed, so a JSON error's column is the line's own.
    Some(parse_object(number, text))
}

fn parse_object(number: usize, text: &str) -> Result<BatchLine, LineError> {
    let error = |field: Option<&str>, problem: String| LineError {
        line: number,
        field: field.map(str::to_owned),
        problem,
    };
    let object: Map<String, Value> = match serde_json::from_str(text) {
        Ok(Value::Object(object)) => object,
        Ok(_) => {
            return Err(error(
                None,
                "not a JSON object; each line is {\"prompt\": \"...\", ...}".into(),
            ));
        }
        Err(err) => return Err(error(None, json_problem(&err))),
    };
    if let Some((field, problem)) = duplicate(text) {
        return Err(error(Some(&field), problem));
    }
    let mut line = BatchLine {
        id: number.to_string(),
        ..BatchLine::default()
    };
    let mut prompt = None;
    for (key, value) in object {
        let field = Some(key.as_str());
        let text = |expected: &str| match &value {
            Value::String(text) if !text.trim().is_empty() => Ok(text.clone()),
            Value::String(_) => Err(error(field, "is empty".into())),
            other => Err(error(
                field,
                format!("expected {expected}, got {}", kind(other)),
            )),
        };
        match key.as_str() {
            "id" => {
                line.id = match &value {
                    Value::Number(n) if n.is_u64() || n.is_i64() => n.to_string(),
                    _ => text("a string or an integer")?,
                };
            }
            "prompt" => prompt = Some(text("a string")?),
            "agent" => line.agent = Some(text("a string")?),
            "subagent" => line.subagent = Some(text("a string")?),
            "fork" => line.fork = Some(text("a session id")?),
            "cwd" => line.cwd = Some(PathBuf::from(text("a string")?)),
            "timeout" => {
                let seconds = value.as_f64().ok_or_else(|| {
                    error(
                        field,
                        format!("expected a number of seconds, got {}", kind(&value)),
                    )
                })?;
                line.timeout = Some(Duration::try_from_secs_f64(seconds).map_err(|_| {
                    error(
                        field,
                        format!("{seconds} is not a non-negative number of seconds"),
                    )
                })?);
            }
            "env" => line.env = env_names(&value).map_err(|problem| error(field, problem))?,
            "outputSchema" => {
                OutputSchema::compile(value.clone())
                    .map_err(|err| error(field, err.to_string()))?;
                line.output_schema = Some(value);
            }
            "tokenBudget" => {
                line.token_budget = Some(tokens(&value).map_err(|problem| error(field, problem))?);
            }
            "costBudget" => {
                line.cost_budget = Some(amount(&value).map_err(|problem| error(field, problem))?);
            }
            "sandbox" => line.sandbox = Some(setting(&text("a sandbox mode")?, &error, field)?),
            "network" => line.network = Some(setting(&text("a network")?, &error, field)?),
            "worktree" => {
                line.worktree = if let Value::Bool(wanted) = value {
                    wanted.then_some(None)
                } else {
                    Some(Some(
                        worktree_name(&text("true, false or a worktree name")?)
                            .map_err(|problem| error(field, problem))?,
                    ))
                };
            }
            _ => {
                return Err(error(
                    field,
                    format!("unknown field; a line has {}", FIELDS.join(", ")),
                ));
            }
        }
    }
    line.prompt = prompt.ok_or_else(|| error(Some("prompt"), "missing (it is required)".into()))?;
    Ok(line)
}

/// The first field (and the problem) given twice in `text`, valid JSON, at any depth.
fn duplicate(text: &str) -> Option<(String, String)> {
    // The text is valid JSON: this second reading cannot fail for any other reason.
    if let Ok(FirstDuplicate(Some(path))) = serde_json::from_str::<FirstDuplicate>(text)
        && let Some((field, within)) = path.split_first()
    {
        let problem = match within.split_last() {
            None => "given twice; a line has each field once".to_owned(),
            Some((key, [])) => format!("key {key:?} is given twice"),
            Some((key, parents)) => {
                let pointer = parents.iter().fold(String::new(), |mut pointer, part| {
                    pointer.push('/');
                    pointer.push_str(&part.replace('~', "~0").replace('/', "~1"));
                    pointer
                });
                format!("key {key:?} is given twice (in {pointer})")
            }
        };
        return Some((field.clone(), problem));
    }
    None
}

/// `worktree`: a name, checked as `--worktree=NAME` checks it.
fn worktree_name(name: &str) -> Result<String, String> {
    crate::worktree::validate_name(name)
        .map(|()| name.to_owned())
        .map_err(|err| err.to_string())
}

/// `sandbox`, `network`: a value read as its flag reads it.
fn setting<T: std::str::FromStr<Err = crate::sandbox::SandboxError>>(
    text: &str,
    error: &dyn Fn(Option<&str>, String) -> LineError,
    field: Option<&str>,
) -> Result<T, LineError> {
    text.parse()
        .map_err(|err: crate::sandbox::SandboxError| error(field, err.to_string()))
}

/// `tokenBudget`: a whole number of tokens.
fn tokens(value: &Value) -> Result<u64, String> {
    value
        .as_u64()
        .ok_or_else(|| format!("expected a whole number of tokens, got {}", kind(value)))
}

/// `costBudget`: a non-negative amount.
fn amount(value: &Value) -> Result<f64, String> {
    value
        .as_f64()
        .filter(|amount| amount.is_finite() && *amount >= 0.0)
        .ok_or_else(|| format!("expected a non-negative amount, got {}", kind(value)))
}

/// `env`: an array of variable names.
fn env_names(value: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "expected an array of variable names, got {}",
            kind(value)
        ));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(name) if name.contains('=') => Err(format!(
                "{:?}: names only (the value is taken from acp-host's environment)",
                name.split('=').next().unwrap_or_default()
            )),
            Value::String(name) if !name.is_empty() && !name.contains('\0') => Ok(name.clone()),
            Value::String(_) => Err("an empty or malformed variable name".into()),
            other => Err(format!("expected a variable name, got {}", kind(other))),
        })
        .collect()
}

/// The first key given twice in a JSON text, as the keys (and array indexes) down to it, the
/// repeated key last; `None` when every object's keys are distinct. `serde_json` keeps the last of
/// repeated keys without a word, so a repeated field would silently change what runs.
struct FirstDuplicate(Option<Vec<String>>);

impl<'de> Deserialize<'de> for FirstDuplicate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DuplicateVisitor)
    }
}

struct DuplicateVisitor;

impl<'de> serde::de::Visitor<'de> for DuplicateVisitor {
    type Value = FirstDuplicate;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_unit<E>(self) -> Result<FirstDuplicate, E> {
        Ok(FirstDuplicate(None))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<FirstDuplicate, A::Error> {
        let mut first = None;
        let mut index = 0_usize;
        while let Some(FirstDuplicate(inner)) = seq.next_element()? {
            if first.is_none()
                && let Some(mut path) = inner
            {
                path.insert(0, index.to_string());
                first = Some(path);
            }
            index += 1;
        }
        Ok(FirstDuplicate(first))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<FirstDuplicate, A::Error> {
        let mut keys = std::collections::HashSet::new();
        let mut first = None;
        while let Some(key) = map.next_key::<String>()? {
            let FirstDuplicate(inner) = map.next_value()?;
            if first.is_some() {
                continue;
            }
            if keys.contains(&key) {
                first = Some(vec![key]);
            } else if let Some(mut path) = inner {
                path.insert(0, key);
                first = Some(path);
            } else {
                keys.insert(key);
            }
        }
        Ok(FirstDuplicate(first))
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The exit code of a batch whose records could not all be written (stdout closed, failing, or
/// taking nothing for a while after Ctrl-C): the output is not whole. 128 + SIGPIPE, the status a
/// shell reports for a writer killed by a closed pipe.
pub const EXIT_OUTPUT_LOST: u8 = 141;

/// How a batch ended, for its exit code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchEnd {
    /// Ctrl-C or SIGTERM stopped it.
    pub interrupted: bool,
    /// Lines that ended: run, or not started.
    pub ended: usize,
    /// Lines whose run completed.
    pub completed: usize,
    /// Records that were not written whole to stdout.
    pub lost: usize,
}

/// The exit code of a batch: [`EXIT_OUTPUT_LOST`] when a record was not written, else 130 when
/// Ctrl-C / SIGTERM stopped it, else 0 when every one of the ended lines completed, else 1.
#[must_use]
pub fn exit_code(end: BatchEnd) -> u8 {
    if end.lost > 0 {
        EXIT_OUTPUT_LOST
    } else if end.interrupted {
        Status::Aborted.exit_code()
    } else if end.completed < end.ended {
        Status::Error.exit_code()
    } else {
        Status::Completed.exit_code()
    }
}

/// The exit codes of `acp-host batch`, for its `--help` and docs/batch.md (one source with
/// [`exit_code`]).
#[must_use]
pub fn exit_rows() -> Vec<ExitRow> {
    let end = |interrupted, completed, lost| BatchEnd {
        interrupted,
        ended: 1,
        completed,
        lost,
    };
    let row = |code, name, when| ExitRow { code, name, when };
    vec![
        row(
            exit_code(end(false, 1, 0)),
            "completed",
            "every run completed",
        ),
        row(
            exit_code(end(false, 0, 0)),
            "failed",
            "a run did not complete, or did not start (its record says why)",
        ),
        row(
            EXIT_USAGE,
            "usage",
            "a bad flag or line (an agent not found included); nothing was started",
        ),
        row(
            exit_code(end(true, 0, 0)),
            "aborted",
            "Ctrl-C / SIGTERM: running agents were cancelled, the rest not started",
        ),
        row(
            exit_code(end(false, 1, 1)),
            "output-lost",
            "records were not all written (stdout closed, failed, or stalled)",
        ),
    ]
}

/// The most agents a batch runs at once, whatever the machine allows (`--jobs` above it is
/// refused): each holds its pipes, a watchdog and up to `--max-output` of output.
pub const MAX_JOBS: usize = 256;

/// Open files acp-host holds for each running agent (its pipes, the watchdog's pidfd and pipe:
/// six, measured; two to spare).
pub const FILES_PER_JOB: u64 = 8;

/// Open files kept for acp-host itself (its runtime, stdio, the input).
pub const FILES_RESERVED: u64 = 32;

/// Processes each running agent takes at least: the watchdog and the agent.
pub const PROCESSES_PER_JOB: u64 = 2;

/// The process's limits that bound how many agents can run at once (soft limits; `None`:
/// unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLimits {
    /// `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
    /// `RLIMIT_NPROC` (the user's processes, all of them).
    pub processes: Option<u64>,
}

impl JobLimits {
    /// The most agents that may run at once under these limits, and what bounds it.
    #[must_use]
    pub fn max_jobs(&self) -> (usize, String) {
        let mut most = (MAX_JOBS, format!("at most {MAX_JOBS} agents run at once"));
        let fits = |limit: u64, reserved: u64, per: u64| {
            usize::try_from(limit.saturating_sub(reserved) / per).unwrap_or(usize::MAX)
        };
        if let Some(files) = self.open_files {
            let jobs = fits(files, FILES_RESERVED, FILES_PER_JOB);
            if jobs < most.0 {
                most = (
                    jobs,
                    format!(
                        "this process may open {files} files and each running agent takes \
                         {FILES_PER_JOB}; raise the limit (`ulimit -n`)"
                    ),
                );
            }
        }
        if let Some(processes) = self.processes {
            let jobs = fits(processes, 0, PROCESSES_PER_JOB);
            if jobs < most.0 {
                most = (
                    jobs,
                    format!(
                        "this user may run {processes} processes and each running agent takes \
                         {PROCESSES_PER_JOB}; raise the limit (`ulimit -u`)"
                    ),
                );
            }
        }
        most
    }
}

/// Why a `--jobs` was refused, or why no agent can run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobsError {
    #[error(
        "--jobs 0: no agent could ever run; pass --jobs 1 or more, or leave it out (the number of \
         CPUs)"
    )]
    Zero,
    /// More than the limits allow (`why` says which limit, and how to raise it).
    #[error("--jobs {jobs}: at most {most} ({why}); lower --jobs")]
    AboveLimit {
        jobs: usize,
        most: usize,
        why: String,
    },
    /// Not given, and the limits leave room for none.
    #[error("no agent can run: {why}")]
    NoRoom { why: String },
}

/// `--jobs`: how many agents run at once. Given, it is refused above what `limits` allow (the
/// error says why and how to raise it); not given, it is `default` (the number of CPUs) lowered
/// to fit.
pub fn check_jobs(
    jobs: Option<usize>,
    default: usize,
    limits: &JobLimits,
) -> Result<usize, JobsError> {
    let (most, why) = limits.max_jobs();
    match jobs {
        Some(0) => Err(JobsError::Zero),
        Some(jobs) if jobs > most => Err(JobsError::AboveLimit { jobs, most, why }),
        Some(jobs) => Ok(jobs),
        None if most == 0 => Err(JobsError::NoRoom { why }),
        None => Ok(default.clamp(1, most)),
    }
}

/// One line of `acp-host batch` output, written as each run ends: the run's result record with
/// the line's `id`, or, for a line that never started (Ctrl-C came first, or its request failed
/// when it was its turn), a `not-started` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum BatchRecord {
    /// A run that started, with its result (the same fields as `acp-host run --json`'s result).
    Result {
        /// The line's `id`, or its line number.
        id: String,
        #[serde(flatten)]
        result: Box<RunResult>,
    },
    /// A line that was never run.
    NotStarted {
        /// The line's `id`, or its line number.
        id: String,
        status: NotStarted,
        /// Why it could not start, when something other than Ctrl-C stopped it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// The last line of `acp-host batch --json-summary`'s output, after every line's record: how the
/// batch went, and what its runs reported spending in all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchSummary {
    /// Always `summary`.
    #[serde(rename = "type")]
    pub kind: SummaryKind,
    /// Lines whose run completed.
    pub completed: u64,
    /// Lines whose run did not complete, or that never started.
    pub failed: u64,
    /// Of `failed`, the lines that never started.
    pub not_started: u64,
    /// The sum of the records' `usage` (`null` when no run reported any; runs that reported none
    /// are not in it).
    pub usage: Option<crate::usage::Usage>,
}

/// The `type` of a [`BatchSummary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SummaryKind {
    Summary,
}

/// The status of a run that never started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NotStarted {
    NotStarted,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BatchLine, LineError> {
        parse_line(7, text).expect("not blank")
    }

    fn refused(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_full_line_is_read_and_the_id_defaults_to_the_line_number() {
        let line = parse(
            r#"{"id":"a","prompt":"p","agent":"codex","subagent":"rev","cwd":"sub","timeout":1.5,"env":["K"],"outputSchema":{"type":"object"},"fork":"sess-1","sandbox":"read-only","network":"tcp:443"}"#,
        )
        .unwrap();
        assert_eq!(
            line,
            BatchLine {
                id: "a".into(),
                prompt: "p".into(),
                agent: Some("codex".into()),
                subagent: Some("rev".into()),
                cwd: Some("sub".into()),
                timeout: Some(Duration::from_millis(1500)),
                env: vec!["K".into()],
                output_schema: Some(serde_json::json!({"type": "object"})),
                fork: Some("sess-1".into()),
                token_budget: None,
                cost_budget: None,
                sandbox: Some(crate::sandbox::Mode::ReadOnly),
                network: Some("tcp:443".parse().unwrap()),
                worktree: None,
            }
        );
        assert_eq!(
            parse(r#"{"prompt":"p","worktree":true}"#).unwrap().worktree,
            Some(None)
        );
        assert_eq!(
            parse(r#"{"prompt":"p","worktree":false}"#)
                .unwrap()
                .worktree,
            None
        );
        assert_eq!(
            parse(r#"{"prompt":"p","worktree":"fix"}"#)
                .unwrap()
                .worktree,
            Some(Some("fix".into()))
        );
        assert_eq!(
            refused(r#"{"prompt":"p","worktree":"a/b"}"#),
            "line 7, field `worktree`: worktree name \"a/b\" has \"/\": use letters, digits, '-', '_' and '.' (not first, not '..', not ending in .lock)"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","worktree":1}"#),
            "line 7, field `worktree`: expected true, false or a worktree name, got a number"
        );
        assert_eq!(parse(r#"{"prompt":"p"}"#).unwrap().id, "7");
        assert_eq!(parse(r#"{"prompt":"p","id":42}"#).unwrap().id, "42");
        assert_eq!(parse_line(3, "  \t"), None);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_field() {
        assert_eq!(
            refused(r#"{"prompt":"p","model":"m"}"#),
            "line 7, field `model`: unknown field; a line has id, prompt, agent, \
             subagent, cwd, timeout, env, outputSchema, fork, tokenBudget, costBudget, sandbox, \
             network, worktree"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","sandbox":"sealed"}"#),
            "line 7, field `sandbox`: unknown sandbox mode \"sealed\": use off, read-only or \
             workspace-write"
        );
        assert!(
            refused(r#"{"prompt":"p","network":"udp:53"}"#)
                .starts_with("line 7, field `network`: ")
        );
        assert!(
            refused(r#"{"prompt":"p","outputSchema":{"type":7}}"#)
                .starts_with("line 7, field `outputSchema`: "),
        );
        assert_eq!(
            refused(r#"{"agent":"x"}"#),
            "line 7, field `prompt`: missing (it is required)"
        );
        assert_eq!(
            refused(r#"{"prompt":5}"#),
            "line 7, field `prompt`: expected a string, got a number"
        );
        assert_eq!(
            refused(r#"{"prompt":"  "}"#),
            "line 7, field `prompt`: is empty"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","timeout":"5"}"#),
            "line 7, field `timeout`: expected a number of seconds, got a string"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","timeout":-1}"#),
            "line 7, field `timeout`: -1 is not a non-negative number of seconds"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","env":"K"}"#),
            "line 7, field `env`: expected an array of variable names, got a string"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","env":["K=secret"]}"#),
            "line 7, field `env`: \"K\": names only (the value is taken from acp-host's \
             environment)"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","id":true}"#),
            "line 7, field `id`: expected a string or an integer, got a boolean"
        );
        assert_eq!(
            refused("[1]"),
            "line 7: not a JSON object; each line is {\"prompt\": \"...\", ...}"
        );
        assert_eq!(
            refused(r#"  {"prompt" "b"}"#),
            "line 7: not valid JSON at column 13: expected `:`; each line is one JSON object, \
             {\"prompt\": \"...\"}"
        );
        assert_eq!(
            refused("{"),
            "line 7: not valid JSON at column 1: EOF while parsing an object; each line is one \
             JSON object, {\"prompt\": \"...\"}"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","cwd":null}"#),
            "line 7, field `cwd`: expected a string, got null"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","env":[""]}"#),
            "line 7, field `env`: an empty or malformed variable name"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","env":[["K"]]}"#),
            "line 7, field `env`: expected a variable name, got an array"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","agent":{"name":"x"}}"#),
            "line 7, field `agent`: expected a string, got an object"
        );
    }

    #[test]
    fn budgets_are_a_whole_number_of_tokens_and_a_non_negative_amount() {
        let line = parse(r#"{"prompt":"p","tokenBudget":5000,"costBudget":0.25}"#).unwrap();
        assert_eq!(
            (line.token_budget, line.cost_budget),
            (Some(5000), Some(0.25))
        );
        assert_eq!(
            parse(r#"{"prompt":"p","costBudget":0}"#)
                .unwrap()
                .cost_budget,
            Some(0.0)
        );
        assert_eq!(
            refused(r#"{"prompt":"p","tokenBudget":1.5}"#),
            "line 7, field `tokenBudget`: expected a whole number of tokens, got a number"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","tokenBudget":"5000"}"#),
            "line 7, field `tokenBudget`: expected a whole number of tokens, got a string"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","costBudget":-0.5}"#),
            "line 7, field `costBudget`: expected a non-negative amount, got a number"
        );
        assert_eq!(
            refused(r#"{"prompt":"p","costBudget":true}"#),
            "line 7, field `costBudget`: expected a non-negative amount, got a boolean"
        );
    }

    #[test]
    fn exit_codes_follow_the_run_table_and_lost_records_come_first() {
        let end = |interrupted, ended, completed, lost| {
            exit_code(BatchEnd {
                interrupted,
                ended,
                completed,
                lost,
            })
        };
        assert_eq!(end(false, 0, 0, 0), 0);
        assert_eq!(end(false, 3, 3, 0), 0);
        assert_eq!(end(false, 3, 2, 0), 1);
        assert_eq!(end(true, 3, 3, 0), 130);
        assert_eq!(end(true, 3, 0, 1), 141);
        assert_eq!(end(false, 3, 3, 2), 141);
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_it() {
        assert_eq!(
            refused(r#"{"prompt":"a","agent":"x","prompt":"b"}"#),
            "line 7, field `prompt`: given twice; a line has each field once"
        );
        assert_eq!(
            refused(r#"{"prompt":"a","outputSchema":{"type":"object","type":"array"}}"#),
            "line 7, field `outputSchema`: key \"type\" is given twice"
        );
        assert_eq!(
            refused(r#"{"prompt":"a","prompt":"b","agent":"x","agent":"y"}"#),
            "line 7, field `prompt`: given twice; a line has each field once",
            "the first repeated key is named"
        );
        // Only JSON reaches the duplicate check; another input type is named as unexpected.
        let bytes = serde::de::value::BytesDeserializer::<serde::de::value::Error>::new(b"x");
        assert_eq!(
            FirstDuplicate::deserialize(bytes)
                .err()
                .unwrap()
                .to_string(),
            "invalid type: byte array, expected a JSON value"
        );
        assert_eq!(
            refused(
                r#"{"prompt":"a","outputSchema":{"anyOf":[{"properties":{"a/b":{"x":1,"x":2}}}]}}"#
            ),
            "line 7, field `outputSchema`: key \"x\" is given twice (in /anyOf/0/properties/a~1b)"
        );
        // The same key in two objects is no repeat.
        assert!(parse(r#"{"prompt":"p","outputSchema":{"properties":{"a":{"type":"string"},"b":{"type":"string"}}}}"#).is_ok());
    }

    #[test]
    fn jobs_are_capped_by_the_fixed_cap_and_the_process_limits() {
        let unlimited = JobLimits::default();
        assert_eq!(check_jobs(Some(256), 2, &unlimited), Ok(256));
        assert_eq!(
            check_jobs(Some(0), 2, &unlimited).map_err(|err| err.to_string()),
            Err(
                "--jobs 0: no agent could ever run; pass --jobs 1 or more, or leave it out (the \
                 number of CPUs)"
                    .into()
            )
        );
        assert_eq!(
            check_jobs(Some(100_000), 2, &unlimited).map_err(|err| err.to_string()),
            Err("--jobs 100000: at most 256 (at most 256 agents run at once); lower --jobs".into())
        );
        let files = JobLimits {
            open_files: Some(1024),
            processes: Some(100_000),
        };
        assert_eq!(files.max_jobs().0, 124);
        assert_eq!(
            check_jobs(Some(200), 2, &files).map_err(|err| err.to_string()),
            Err(
                "--jobs 200: at most 124 (this process may open 1024 files and each running \
                 agent takes 8; raise the limit (`ulimit -n`)); lower --jobs"
                    .into()
            )
        );
        let processes = JobLimits {
            open_files: None,
            processes: Some(21),
        };
        assert_eq!(check_jobs(Some(10), 2, &processes), Ok(10));
        assert!(
            check_jobs(Some(11), 2, &processes)
                .unwrap_err()
                .to_string()
                .contains("`ulimit -u`")
        );
        // The default (the CPUs) is lowered to fit, never refused while one agent fits.
        assert_eq!(check_jobs(None, 64, &processes), Ok(10));
        assert_eq!(check_jobs(None, 0, &unlimited), Ok(1));
        let none = JobLimits {
            open_files: Some(16),
            processes: None,
        };
        assert!(
            check_jobs(None, 2, &none)
                .unwrap_err()
                .to_string()
                .starts_with("no agent can run: ")
        );
    }

    #[test]
    fn records_carry_the_id_and_a_not_started_status() {
        let record = BatchRecord::NotStarted {
            id: "a".into(),
            status: NotStarted::NotStarted,
            error: None,
        };
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            serde_json::json!({"type": "not-started", "id": "a", "status": "not-started"})
        );
        let schema = crate::schema::output("batch-result.json").unwrap();
        crate::schema::check_keys(&schema, &serde_json::to_value(&record).unwrap()).unwrap();
    }
}
