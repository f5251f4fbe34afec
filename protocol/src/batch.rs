//! `acp-host batch`: one input line -> one run, and one output record per run.
//!
//! Invariants: a line is read strictly: it is a JSON object whose keys are the known fields
//! ([`FIELDS`]), each of its type; anything else is an error naming the line and the field, so
//! a typo never silently runs a different job. A line without `id` gets its line number. Reading
//! is pure (text in, [`BatchLine`] out); what needs the machine (the agent's program, the cwd, a
//! subagent definition) is checked by the CLI before anything starts.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::result::{EXIT_USAGE, RunResult, Status};
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
];

/// One run asked for by one input line. Adding a field is one member here and one arm in
/// [`parse_line`].
#[derive(Debug, Clone, PartialEq)]
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
}

/// Why a line was refused; `field` is `None` when the line as a whole is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {problem}", field.as_ref().map(|f| format!(", field `{f}`")).unwrap_or_default())]
pub struct LineError {
    pub line: usize,
    pub field: Option<String>,
    pub problem: String,
}

/// Reads line `number` (1-based) of the input. `None` for a blank line (skipped).
#[must_use]
pub fn parse_line(number: usize, text: &str) -> Option<Result<BatchLine, LineError>> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
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
        Err(err) => return Err(error(None, format!("not valid JSON ({err})"))),
    };
    let mut line = BatchLine {
        id: number.to_string(),
        prompt: String::new(),
        agent: None,
        subagent: None,
        cwd: None,
        timeout: None,
        env: Vec::new(),
        output_schema: None,
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

/// The exit code of a batch: 130 when Ctrl-C / SIGTERM stopped it, else 0 when every one of the
/// `ended` lines (run or not started) completed, else 1.
#[must_use]
pub fn exit_code(interrupted: bool, ended: usize, completed: usize) -> u8 {
    if interrupted {
        Status::Aborted.exit_code()
    } else if completed < ended {
        Status::Error.exit_code()
    } else {
        Status::Completed.exit_code()
    }
}

/// The exit codes of `acp-host batch` as text, for its `--help` (one source with [`exit_code`]).
#[must_use]
pub fn exit_code_table() -> String {
    [
        (exit_code(false, 1, 1), "every run completed"),
        (
            exit_code(false, 1, 0),
            "a run did not complete, or did not start (its record says why)",
        ),
        (EXIT_USAGE, "a bad flag or line; nothing was started"),
        (
            exit_code(true, 1, 0),
            "Ctrl-C / SIGTERM: running agents were cancelled, the rest not started",
        ),
    ]
    .iter()
    .fold(String::from("Exit codes:\n"), |mut table, (code, why)| {
        let _ = writeln!(table, "  {code:>3}  {why}");
        table
    })
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
            r#"{"id":"a","prompt":"p","agent":"codex","subagent":"rev","cwd":"sub","timeout":1.5,"env":["K"],"outputSchema":{"type":"object"}}"#,
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
            }
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
             subagent, cwd, timeout, env, outputSchema"
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
        assert!(refused("{").starts_with("line 7: not valid JSON ("));
    }

    #[test]
    fn exit_codes_follow_the_run_table() {
        assert_eq!(exit_code(false, 0, 0), 0);
        assert_eq!(exit_code(false, 3, 3), 0);
        assert_eq!(exit_code(false, 3, 2), 1);
        assert_eq!(exit_code(true, 3, 3), 130);
        assert!(exit_code_table().contains("  130  Ctrl-C"));
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
