//! Structured output: a JSON result checked against a JSON Schema, the texts that ask an agent for
//! one, and the extraction of a JSON value from an answer given as text.
//!
//! Invariants:
//! - a schema outside the enforced subset ([`subset`]: JSON Schema 2020-12, known keywords, the
//!   formats that are checked, local `$ref` only) or that does not compile is refused up front
//!   ([`OutputSchema::compile`]), listing every problem; no `$ref` is fetched from the network or
//!   the disk, and every `format` the schema names is asserted;
//! - a value is valid exactly when [`OutputSchema::violations`] is empty, and every violation is
//!   listed (instance path and message), for the follow-up prompt and the error;
//! - extraction ([`extract`]) takes the last fenced `json` block, else the whole answer, else the
//!   last top-level JSON value in it: the same answer always gives the same value, in time linear
//!   in its length (one scan per rule, never a parse restarted at every bracket), whatever the
//!   answer: it is untrusted input;
//! - an answer's text is read only whole, or through a fenced block complete within its kept tail
//!   ([`OutputSchema::check_answer`]); a cut text is never guessed at, and the violation names the
//!   limit that cut it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod subset;

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

/// The schema cannot be used: every problem, each at its location in the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("output schema is refused: {}", describe(.problems))]
pub struct SchemaError {
    pub problems: Vec<Violation>,
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
    /// Compiles `schema`, inside the enforced subset ([`subset`]) only, with every `format` it
    /// names asserted; the error lists every problem.
    pub fn compile(schema: Value) -> Result<Self, SchemaError> {
        let problems = subset::problems(&schema);
        if !problems.is_empty() {
            return Err(SchemaError { problems });
        }
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .should_ignore_unknown_formats(false)
            .build(&schema)
            .map_err(|error| SchemaError {
                problems: vec![Violation {
                    path: error.instance_path().to_string(),
                    message: error.to_string(),
                }],
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
            // Keys sorted, as they always came out: `serde_json`'s `preserve_order` (turned on in
            // the workspace by the HTTP transport) would otherwise keep the agent's order, and
            // the output would depend on which crates a build includes.
            Ok(crate::json::sorted(value))
        } else {
            Err(violations)
        }
    }
}

/// A turn's answer as the structured check gets it: what the agent's capture tool returned, else
/// the turn's text, kept up to a limit (the run's `--max-output`).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The value of the agent's capture tool, if it used one.
    pub captured: Option<Value>,
    /// The turn's text: all of it, or its last `limit` bytes when `dropped` bytes did not fit.
    pub text: String,
    /// How many bytes of the text were not kept.
    pub dropped: Option<u64>,
    /// The most bytes of a turn's text kept for the check.
    pub limit: usize,
}

/// A checked answer: how its value was obtained, and the value or every violation.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub via: StructuredVia,
    pub value: Result<Value, Vec<Violation>>,
}

impl OutputSchema {
    /// Checks a turn's answer: its captured value, else the value extracted from its text
    /// ([`extract`]), via `expected` when there is neither. Text cut to its limit is not guessed
    /// at: only a fenced `json` block complete within the kept tail is read from it (the last one
    /// of the whole answer, as nothing follows the tail); otherwise the one violation names the
    /// limit that was hit. CPU-bound (linear in the text, then the schema's own checks): callers
    /// on an async runtime run it off the runtime's threads.
    #[must_use]
    pub fn check_answer(&self, answer: &Answer, expected: StructuredVia) -> Checked {
        if let Some(value) = &answer.captured {
            return Checked {
                via: StructuredVia::CaptureTool,
                value: self.check(Some(value)),
            };
        }
        let extracted = match answer.dropped {
            None => extract(&answer.text),
            Some(dropped) => match last_fenced_json(&answer.text) {
                Some(block) => whole_value(block),
                None => {
                    return Checked {
                        via: expected,
                        value: Err(vec![Violation {
                            path: String::new(),
                            message: over_limit(answer.limit, dropped),
                        }]),
                    };
                }
            },
        };
        Checked {
            via: if extracted.is_some() {
                StructuredVia::Text
            } else {
                expected
            },
            value: self.check(extracted.as_ref()),
        }
    }
}

/// The violation of an answer whose text did not fit the limit.
fn over_limit(limit: usize, dropped: u64) -> String {
    format!(
        "the answer is {dropped} bytes over the {limit}-byte limit on a structured answer's text \
         (acp-host --max-output), so it was not read; answer with a shorter JSON value, in a \
         fenced code block marked json"
    )
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
/// else the last top-level JSON object or array in it. Linear in the length of `text` (one pass
/// per rule), whatever the text: an answer is untrusted input.
#[must_use]
pub fn extract(text: &str) -> Option<Value> {
    if let Some(block) = last_fenced_json(text) {
        return whole_value(block);
    }
    whole_value(text).or_else(|| last_embedded_value(text))
}

/// `text` (trimmed) as one JSON value. Scanned first, without allocating: `serde_json` builds the
/// value only for a text that is one, never megabytes of values for a text that breaks at its end.
fn whole_value(text: &str) -> Option<Value> {
    let text = text.trim();
    let bytes = text.as_bytes();
    let end = match bytes.first()? {
        b'{' | b'[' => match scan(bytes, 0) {
            Scan::Complete { end } => end,
            Scan::Broken { .. } => return None,
        },
        _ => scalar_end(bytes, 0).ok()?,
    };
    if end == bytes.len() {
        serde_json::from_str(text).ok()
    } else {
        None
    }
}

/// The opening of a fenced JSON block.
const FENCE_JSON: &str = "```json";
/// The closing of any fenced block.
const FENCE: &str = "```";

/// The body of the last ```` ```json ```` block that is closed. The rest of a fence line must be
/// blank; each byte is looked at a bounded number of times (no rescan of a long line per fence).
fn last_fenced_json(text: &str) -> Option<&str> {
    let mut found = None;
    let mut at = 0;
    while let Some(open) = text[at..].find(FENCE_JSON) {
        let after = at + open + FENCE_JSON.len();
        // The fence line ends at its newline; anything but blanks before it is not a JSON fence.
        let Some((offset, end)) = text[after..]
            .char_indices()
            .find(|&(_, c)| c == '\n' || !c.is_whitespace())
        else {
            break;
        };
        if end != '\n' {
            at = after + offset;
            continue;
        }
        let body = after + offset + 1;
        let Some(close) = text[body..].find(FENCE) else {
            break;
        };
        found = Some(&text[body..body + close]);
        at = body + close + FENCE.len();
    }
    found
}

/// The last JSON object or array of `text` that is not inside an earlier one. One pass: a
/// candidate starts at a `{` or `[` outside any other candidate and is followed by a JSON scanner
/// ([`scan`]); a complete one is a value and scanning goes on after it; a broken one contributes
/// the last container it completed before breaking (a valid value inside it), and scanning goes
/// on where it broke. A `{` or `[` inside a candidate's strings never starts one.
fn last_embedded_value(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    // Disjoint, in order: only one is parsed unless serde refuses what the scanner accepted
    // (a number out of range, a lone surrogate), so the whole is linear.
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = bytes[at..].iter().position(|&b| b == b'{' || b == b'[') {
        let start = at + offset;
        match scan(bytes, start) {
            Scan::Complete { end } => {
                found.push(start..end);
                at = end;
            }
            Scan::Broken { at: broke, inner } => {
                found.extend(inner);
                at = broke;
            }
        }
    }
    found
        .into_iter()
        .rev()
        .find_map(|span| serde_json::from_str(&text[span]).ok())
}

/// How deep a candidate may nest: `serde_json`'s own limit (it refuses the 128th level).
const MAX_DEPTH: usize = 127;

/// What [`scan`] found from a `{` or `[`.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// A complete value, ending before `end`.
    Complete { end: usize },
    /// Not JSON from the byte at `at` (`at` > start; the length when the text ended first);
    /// `inner` is the last container completed before that, if any.
    Broken {
        at: usize,
        inner: Option<std::ops::Range<usize>>,
    },
}

/// Where the scanner stands between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (after `:` or `,` in an array).
    Value,
    /// A value or `]` (after `[`).
    ValueOrClose,
    /// A key or `}` (after `{`).
    KeyOrClose,
    /// A key (after `,` in an object).
    Key,
    /// `:` after a key.
    Colon,
    /// `,` or the container's close, after a value.
    CommaOrClose,
}

/// Scans one JSON value starting at `bytes[start]` (a `{` or `[`), strictly (RFC 8259, the depth
/// limit of `serde_json`), each byte once.
fn scan(bytes: &[u8], start: usize) -> Scan {
    // The open containers: their opening byte and position.
    let mut stack: Vec<(u8, usize)> = Vec::new();
    let mut inner = None;
    let mut expect = Expect::Value;
    let mut at = start;
    let broken = |at: usize, inner| Scan::Broken { at, inner };
    while at < bytes.len() {
        let byte = bytes[at];
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            at += 1;
            continue;
        }
        match (expect, byte) {
            (Expect::Value | Expect::ValueOrClose, b'{' | b'[') => {
                if stack.len() == MAX_DEPTH {
                    return broken(at, inner);
                }
                stack.push((byte, at));
                expect = if byte == b'{' {
                    Expect::KeyOrClose
                } else {
                    Expect::ValueOrClose
                };
                at += 1;
            }
            (Expect::ValueOrClose, b']')
            | (Expect::KeyOrClose, b'}')
            | (Expect::CommaOrClose, b']' | b'}') => {
                // A close that matches no open container (the stack is never empty here: the
                // scan starts at a bracket and returns when it closes) breaks the candidate.
                let opened = match stack.pop() {
                    Some((open, opened)) if (open == b'[') == (byte == b']') => opened,
                    _ => return broken(at, inner),
                };
                at += 1;
                if stack.is_empty() {
                    return Scan::Complete { end: at };
                }
                inner = Some(opened..at);
                expect = Expect::CommaOrClose;
            }
            (Expect::CommaOrClose, b',') => {
                expect = match stack.last() {
                    Some((b'{', _)) => Expect::Key,
                    _ => Expect::Value,
                };
                at += 1;
            }
            (Expect::Colon, b':') => {
                expect = Expect::Value;
                at += 1;
            }
            (Expect::KeyOrClose | Expect::Key, b'"') => match string_end(bytes, at) {
                Ok(end) => {
                    at = end;
                    expect = Expect::Colon;
                }
                Err(broke) => return broken(broke, inner),
            },
            (Expect::Value | Expect::ValueOrClose, _) => match scalar_end(bytes, at) {
                Ok(end) => {
                    at = end;
                    expect = Expect::CommaOrClose;
                }
                Err(broke) => return broken(broke, inner),
            },
            _ => return broken(at, inner),
        }
    }
    broken(bytes.len(), inner)
}

/// The end of the string opening at `bytes[start]` (a `"`), or where it stops being one.
fn string_end(bytes: &[u8], start: usize) -> Result<usize, usize> {
    let mut at = start + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => return Ok(at + 1),
            b'\\' => match bytes.get(at + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at += 2,
                Some(b'u') => {
                    let digits = bytes.get(at + 2..at + 6).ok_or(bytes.len())?;
                    if let Some(bad) = digits.iter().position(|b| !b.is_ascii_hexdigit()) {
                        return Err(at + 2 + bad);
                    }
                    at += 6;
                }
                _ => return Err(at + 1),
            },
            // Control characters must be escaped.
            0..0x20 => return Err(at),
            _ => at += 1,
        }
    }
    Err(bytes.len())
}

/// The end of the string, number or literal (`true`, `false`, `null`) at `bytes[start]`, or
/// where it stops being one.
fn scalar_end(bytes: &[u8], start: usize) -> Result<usize, usize> {
    match bytes[start] {
        b'"' => string_end(bytes, start),
        b't' => literal_end(bytes, start, b"true"),
        b'f' => literal_end(bytes, start, b"false"),
        b'n' => literal_end(bytes, start, b"null"),
        b'-' | b'0'..=b'9' => number_end(bytes, start),
        _ => Err(start),
    }
}

fn literal_end(bytes: &[u8], start: usize, literal: &[u8]) -> Result<usize, usize> {
    let end = start + literal.len();
    if bytes.get(start..end) == Some(literal) {
        Ok(end)
    } else {
        Err(start)
    }
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
fn number_end(bytes: &[u8], start: usize) -> Result<usize, usize> {
    let digits = |from: usize| {
        from + bytes[from.min(bytes.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut at = start;
    if bytes[at] == b'-' {
        at += 1;
    }
    match bytes.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => at = digits(at),
        _ => return Err(at),
    }
    if bytes.get(at) == Some(&b'.') {
        let end = digits(at + 1);
        if end == at + 1 {
            return Err(end);
        }
        at = end;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let end = digits(at);
        if end == at {
            return Err(end);
        }
        at = end;
    }
    Ok(at)
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
    fn a_matching_value_comes_out_with_its_keys_sorted_whatever_the_agent_wrote() {
        let any = OutputSchema::compile(json!({"type": "object"})).unwrap();
        let value: Value =
            serde_json::from_str(r#"{"b":{"z":1,"y":2},"a":[{"d":3,"c":4}]}"#).unwrap();
        let checked = any.check(Some(&value)).unwrap();
        assert_eq!(
            checked.to_string(),
            r#"{"a":[{"c":4,"d":3}],"b":{"y":2,"z":1}}"#
        );
    }

    #[test]
    fn a_schema_that_cannot_compile_is_refused_naming_the_problem() {
        let error = OutputSchema::compile(json!({"type": "integr", "minimun": 1})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "output schema is refused: /type: type \"integr\" is not a JSON type; the types are \
             array, boolean, integer, null, number, object, string; /minimun: unknown keyword \
             \"minimun\" (did you mean \"minimum\"?)"
        );
        assert_eq!(
            OutputSchema::compile(json!([1])).unwrap_err().to_string(),
            "output schema is refused: (root): a schema is a JSON object (or true/false)"
        );
        // Inside the subset, and still not compiling.
        let error = OutputSchema::compile(json!({"$ref": "#/$defs/missing"})).unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
        assert!(error.to_string().contains("missing"), "{error}");
        let error = OutputSchema::compile(json!({"pattern": "(unclosed"})).unwrap_err();
        assert_eq!(error.problems.len(), 1, "{error}");
    }

    #[test]
    fn every_format_named_is_asserted() {
        let schema = OutputSchema::compile(json!({
            "type": "object",
            "properties": {
                "mail": {"type": "string", "format": "email"},
                "when": {"type": "string", "format": "date-time"},
                "id": {"type": "string", "format": "uuid"},
            },
        }))
        .unwrap();
        assert_eq!(
            schema.check(Some(
                &json!({"mail": "a@example.com", "when": "2026-12-01T16:00:00Z",
                "id": "67e55044-10b1-426f-9247-bb680e5fe0c8"})
            )),
            Ok(
                json!({"mail": "a@example.com", "when": "2026-12-01T16:00:00Z",
                "id": "67e55044-10b1-426f-9247-bb680e5fe0c8"})
            )
        );
        let violations = schema
            .check(Some(
                &json!({"mail": "not-an-email", "when": "yesterday", "id": "x"}),
            ))
            .unwrap_err();
        let paths: Vec<&str> = violations.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(paths.len(), 3, "{violations:?}");
        for path in ["/mail", "/when", "/id"] {
            assert!(paths.contains(&path), "{violations:?}");
        }
        // Every format the subset lists is one the validator checks.
        for format in subset::FORMATS {
            let schema = OutputSchema::compile(json!({"format": format})).unwrap();
            assert!(
                !schema.violations(&json!("( \u{0}")).is_empty(),
                "{format} is not checked"
            );
        }
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
    fn a_broken_candidate_leaves_the_last_value_it_completed() {
        assert_eq!(extract("[1, {\"a\": 1} oops"), Some(json!({"a": 1})));
        assert_eq!(
            extract("see [draft] then {\"n\": 1}"),
            Some(json!({"n": 1}))
        );
        assert_eq!(extract("{ [1]"), Some(json!([1])));
        assert_eq!(extract("[1 [2]]"), Some(json!([2])));
        // A bracket inside a string of a candidate is not a candidate of its own.
        assert_eq!(extract("{\"note\": \"see [1]\" oops"), None);
        // serde_json's depth limit, no deeper.
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(extract(&format!("x {}", deep(127))).is_some());
        assert!(serde_json::from_str::<Value>(&deep(128)).is_err());
        // Too deep: the candidate breaks at its 128th bracket, where scanning goes on.
        assert_eq!(extract(&format!("x {}", deep(128))), Some(json!([])));
        // What the scanner accepts and serde refuses falls back to the value before it.
        assert_eq!(extract("[1] then [1e999]"), Some(json!([1])));
    }

    #[test]
    fn adversarial_answers_give_their_value_or_none() {
        let n = 200_000;
        let nested_numbers = format!("{}{}", "[".repeat(127), "1,".repeat(n));
        assert_eq!(extract(&nested_numbers), None);
        assert_eq!(extract(&"[".repeat(n)), None);
        assert_eq!(extract(&"{\"a\":".repeat(n)), None);
        assert_eq!(extract(&"[\"[\",".repeat(n)), None);
        assert_eq!(
            extract(&format!("{}\n{{\"n\": 1}}", "```jsonx".repeat(n))),
            Some(json!({"n": 1}))
        );
        assert_eq!(
            extract(&format!("{}{{\"n\": 2}}", "[0,".repeat(n))),
            Some(json!({"n": 2}))
        );
    }

    #[test]
    fn a_cut_answer_is_read_only_through_a_complete_fenced_block() {
        let schema = OutputSchema::compile(json!({"type": "object"})).unwrap();
        let cut = |text: &str| Answer {
            captured: None,
            text: text.to_owned(),
            dropped: Some(10),
            limit: 64,
        };
        let checked = schema.check_answer(&cut("1}, {\"b\": 2}]}"), StructuredVia::Text);
        assert_eq!(checked.via, StructuredVia::Text);
        assert_eq!(
            checked.value.unwrap_err()[0].to_string(),
            "(root): the answer is 10 bytes over the 64-byte limit on a structured answer's \
             text (acp-host --max-output), so it was not read; answer with a shorter JSON \
             value, in a fenced code block marked json"
        );
        let checked = schema.check_answer(
            &cut("...\n```json\n{\"a\": 1}\n```\n"),
            StructuredVia::CaptureTool,
        );
        assert_eq!(checked.via, StructuredVia::Text);
        assert_eq!(checked.value, Ok(json!({"a": 1})));
        let whole = Answer {
            dropped: None,
            ..cut("done: {\"a\": 2}")
        };
        assert_eq!(
            schema.check_answer(&whole, StructuredVia::Text).value,
            Ok(json!({"a": 2}))
        );
        let captured = Answer {
            captured: Some(json!({"c": 3})),
            ..cut("")
        };
        let checked = schema.check_answer(&captured, StructuredVia::Text);
        assert_eq!(
            (checked.via, checked.value),
            (StructuredVia::CaptureTool, Ok(json!({"c": 3})))
        );
    }

    proptest::proptest! {
        /// The scanner accepts exactly what serde_json reads as the first value from a bracket.
        #[test]
        fn the_scanner_agrees_with_serde(tokens in proptest::collection::vec(0..TOKENS.len(), 0..40), object in proptest::bool::ANY) {
            let text: String = std::iter::once(if object { "{" } else { "[" })
                .chain(tokens.iter().map(|&t| TOKENS[t]))
                .collect();
            let mut values = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
            let serde = match values.next() {
                Some(Ok(_)) => Some(values.byte_offset()),
                _ => None,
            };
            let scanned = match scan(text.as_bytes(), 0) {
                Scan::Complete { end } => Some(end),
                Scan::Broken { .. } => None,
            };
            proptest::prop_assert_eq!(scanned, serde, "{}", text);
        }
    }

    const TOKENS: &[&str] = &[
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        " ",
        "\"a\"",
        "\"[\"",
        "\"\\n\"",
        "\"\\u00e9\"",
        "\"\\x\"",
        "1",
        "-0.5",
        "01",
        "2e3",
        "1.",
        "true",
        "nul",
        "null",
        "x",
        "\n",
        "\"\u{1}\"",
        "é",
    ];

    #[test]
    fn the_instruction_carries_the_schema() {
        let text = instruction(&json!({"type": "object"}));
        assert!(
            text.contains("```json\n{\n  \"type\": \"object\"\n}\n```"),
            "{text}"
        );
    }

    #[test]
    fn the_scanner_reads_each_json_token_and_breaks_where_one_is_wrong() {
        for (text, value) in [
            (
                r#"got {"a": 1, "b": [true, false, null]} done"#,
                json!({"a": 1, "b": [true, false, null]}),
            ),
            (
                r#"got [-0.5e+3, 2E-2, 10, "\u00e9\n"] done"#,
                json!([-500.0, 0.02, 10, "é\n"]),
            ),
        ] {
            assert_eq!(extract(text), Some(value), "{text}");
        }
        let broken_at = |text: &str| match scan(text.as_bytes(), 0) {
            Scan::Broken { at, .. } => Some(at),
            Scan::Complete { .. } => None,
        };
        assert_eq!(broken_at(r#"["\u12x4"]"#), Some(6), "a bad hex digit");
        assert_eq!(
            broken_at(r#"["\u12"#),
            Some(6),
            "an escape cut short: the end"
        );
        assert_eq!(broken_at(r#"["open"#), Some(6), "an unterminated string");
        assert_eq!(broken_at("[-x]"), Some(2), "a minus without digits");
        assert_eq!(broken_at("[1e]"), Some(3), "an exponent without digits");
        assert_eq!(broken_at("[1.]"), Some(3), "a fraction without digits");
        assert_eq!(broken_at("[fals]"), Some(1), "a broken literal");
        assert_eq!(broken_at("[1}"), Some(2), "a close of the other kind");
        assert_eq!(broken_at("[1]"), None);
    }

    #[test]
    fn only_a_closed_json_fence_on_its_own_line_is_a_block() {
        assert_eq!(
            last_fenced_json("text ```json"),
            None,
            "a fence at the very end"
        );
        assert_eq!(
            last_fenced_json("```json\n{\"a\": 1}"),
            None,
            "never closed"
        );
        assert_eq!(
            last_fenced_json("```json\n[1]\n```\nthen ```json\n[2"),
            Some("[1]\n"),
            "an unclosed later fence leaves the closed one"
        );
        assert_eq!(extract("no json at all"), None);
    }

    #[test]
    fn an_answer_without_a_value_keeps_the_expected_route() {
        let schema = schema();
        let answer = Answer {
            captured: None,
            text: "I could not do it.".into(),
            dropped: None,
            limit: 1024,
        };
        let checked = schema.check_answer(&answer, StructuredVia::CaptureTool);
        assert_eq!(checked.via, StructuredVia::CaptureTool);
        assert!(checked.value.is_err());
    }

    #[test]
    fn a_compiled_schema_keeps_and_shows_its_source() {
        let source = json!({"type": "object"});
        let schema = OutputSchema::compile(source.clone()).unwrap();
        assert_eq!(schema.schema(), &source);
        assert_eq!(
            format!("{schema:?}"),
            r#"OutputSchema { schema: Object {"type": String("object")}, .. }"#
        );
    }
}
