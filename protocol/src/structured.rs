//! Structured output: a JSON result checked against a JSON Schema, the texts that ask an agent for
//! one, and the extraction of a JSON value from an answer given as text.
//!
//! Invariants:
//! - a schema that does not compile is refused up front ([`OutputSchema::compile`]), naming what
//!   is wrong; no `$ref` is fetched from the network or the disk;
//! - a value is valid exactly when [`OutputSchema::violations`] is empty, and every violation is
//!   listed (instance path and message), for the follow-up prompt and the error;
//! - extraction ([`extract`]) takes the last fenced `json` block, else the whole answer, else the
//!   last top-level JSON value in it: the same answer always gives the same value.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many follow-up prompts a run sends after an answer that does not match (`--schema-retries`).
pub const DEFAULT_SCHEMA_RETRIES: u32 = 2;

/// The name of acp-child's capture tool.
pub const CAPTURE_TOOL: &str = "submit_result";

/// A structured answer asked of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// The JSON Schema (compiled by [`OutputSchema::compile`] before anything is spawned).
    pub schema: Value,
    /// Follow-up prompts after an answer that does not match.
    pub retries: u32,
}

/// How the structured value was obtained (the result's `structuredVia`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StructuredVia {
    /// The agent's capture tool, returned in the prompt response's `_meta`.
    CaptureTool,
    /// Extracted from the answer's text.
    Text,
}

/// A compiled output schema.
pub struct OutputSchema {
    schema: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputSchema")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// The schema cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("output schema is not a valid JSON Schema: {reason}")]
pub struct SchemaError {
    pub reason: String,
}

/// One way a value does not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// A JSON pointer into the value (`""`: the value itself).
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.path.is_empty() {
            "(root)"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)
    }
}

impl OutputSchema {
    /// Compiles `schema`; the error names what is wrong.
    pub fn compile(schema: Value) -> Result<Self, SchemaError> {
        if !schema.is_object() && !schema.is_boolean() {
            return Err(SchemaError {
                reason: "a schema is a JSON object (or true/false)".to_owned(),
            });
        }
        let validator = jsonschema::validator_for(&schema).map_err(|error| SchemaError {
            reason: {
                let path = error.instance_path().to_string();
                if path.is_empty() {
                    error.to_string()
                } else {
                    format!("at {path}: {error}")
                }
            },
        })?;
        Ok(Self { schema, validator })
    }

    #[must_use]
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Every violation of `value`; empty when it matches.
    #[must_use]
    pub fn violations(&self, value: &Value) -> Vec<Violation> {
        self.validator
            .iter_errors(value)
            .map(|error| Violation {
                path: error.instance_path().to_string(),
                message: error.to_string(),
            })
            .collect()
    }

    /// The value of `answer` (the text of a turn, or a captured value) and whether it matches:
    /// `Ok(value)`, or every violation (a missing value is one violation at the root).
    pub fn check(&self, value: Option<&Value>) -> Result<Value, Vec<Violation>> {
        let Some(value) = value else {
            return Err(vec![Violation {
                path: String::new(),
                message: "no JSON value found in the answer".to_owned(),
            }]);
        };
        let violations = self.violations(value);
        if violations.is_empty() {
            Ok(value.clone())
        } else {
            Err(violations)
        }
    }
}

/// What is appended to the prompt of an agent without a capture tool.
#[must_use]
pub fn instruction(schema: &Value) -> String {
    let schema = serde_json::to_string_pretty(schema).unwrap_or_default();
    format!(
        "\n\nEnd your answer with a JSON value matching this JSON Schema, in a fenced code block \
         marked json:\n\n```json\n{schema}\n```"
    )
}

/// The follow-up prompt after an answer that did not match: every violation, one per line.
#[must_use]
pub fn nudge(violations: &[Violation]) -> String {
    let mut text =
        String::from("Your answer did not match the required JSON Schema. Violations:\n");
    for violation in violations {
        text.push_str("- ");
        text.push_str(&violation.to_string());
        text.push('\n');
    }
    text.push_str(
        "Answer again: give the corrected JSON value, complete, in a fenced code block marked \
         json (or through the result tool, if you have one).",
    );
    text
}

/// The violations as one line, for a result's `error`.
#[must_use]
pub fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The JSON value of an answer given as text: the last fenced `json` block, else the whole answer,
/// else the last top-level JSON object or array in it.
#[must_use]
pub fn extract(text: &str) -> Option<Value> {
    if let Some(block) = last_fenced_json(text) {
        return serde_json::from_str(block).ok();
    }
    if let Ok(value) = serde_json::from_str(text.trim()) {
        return Some(value);
    }
    last_embedded_value(text)
}

/// The body of the last ```` ```json ```` block that is closed.
fn last_fenced_json(text: &str) -> Option<&str> {
    let mut found = None;
    let mut rest = text;
    let mut offset = 0;
    while let Some(open) = rest.find("```json") {
        let body_start = open + "```json".len();
        let after = &rest[body_start..];
        // The fence line ends at its newline.
        let Some(newline) = after.find('\n') else {
            break;
        };
        if !after[..newline].trim().is_empty() {
            rest = &rest[body_start..];
            offset += body_start;
            continue;
        }
        let body = &after[newline + 1..];
        let Some(close) = body.find("```") else {
            break;
        };
        let start = offset + body_start + newline + 1;
        found = Some(&text[start..start + close]);
        let consumed = body_start + newline + 1 + close + 3;
        rest = &rest[consumed..];
        offset += consumed;
    }
    found
}

/// The last JSON object or array that starts at top level (not inside an earlier one).
fn last_embedded_value(text: &str) -> Option<Value> {
    let mut last = None;
    let mut at = 0;
    while let Some(found) = text[at..].find(['{', '[']) {
        let start = at + found;
        let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                last = Some(value);
                at = start + values.byte_offset();
            }
            _ => at = start + 1,
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> OutputSchema {
        OutputSchema::compile(json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["n"],
        }))
        .unwrap()
    }

    #[test]
    fn a_schema_that_cannot_compile_is_refused_naming_the_problem() {
        let error = OutputSchema::compile(json!({"type": "integr"})).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("output schema is not a valid JSON Schema: "),
            "{error}"
        );
        assert!(error.to_string().contains("integr"), "{error}");
        assert_eq!(
            OutputSchema::compile(json!([1])).unwrap_err().reason,
            "a schema is a JSON object (or true/false)"
        );
    }

    #[test]
    fn every_violation_is_listed_with_its_path() {
        let schema = schema();
        assert_eq!(schema.check(Some(&json!({"n": 1}))), Ok(json!({"n": 1})));
        let violations = schema
            .check(Some(&json!({"n": "one", "tags": ["a", 2]})))
            .unwrap_err();
        let shown: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(shown.iter().any(|v| v.starts_with("/n: ")), "{shown:?}");
        assert!(
            shown.iter().any(|v| v.starts_with("/tags/1: ")),
            "{shown:?}"
        );
        assert_eq!(
            schema.check(None).unwrap_err()[0].to_string(),
            "(root): no JSON value found in the answer"
        );
        let nudge = nudge(&violations);
        assert!(
            nudge.contains("\n- /n: ") && nudge.contains("\n- /tags/1: "),
            "{nudge}"
        );
    }

    #[test]
    fn extraction_prefers_the_last_fenced_block_then_the_whole_then_the_last_value() {
        assert_eq!(
            extract("first ```json\n{\"a\":1}\n``` then ```json\n{\"a\":2}\n```"),
            Some(json!({"a": 2}))
        );
        assert_eq!(extract("  [1, 2]\n"), Some(json!([1, 2])));
        assert_eq!(
            extract("Here: {\"a\": {\"b\": 1}} and finally {\"c\": [2]}."),
            Some(json!({"c": [2]}))
        );
        assert_eq!(extract("no json {here"), None);
        // A broken fenced block is not rescued by a value elsewhere.
        assert_eq!(extract("{\"a\":1}\n```json\n{oops\n```"), None);
        assert_eq!(extract("```json\n\"text\"\n```"), Some(json!("text")));
    }

    #[test]
    fn the_instruction_carries_the_schema() {
        let text = instruction(&json!({"type": "object"}));
        assert!(
            text.contains("```json\n{\n  \"type\": \"object\"\n}\n```"),
            "{text}"
        );
    }
}
