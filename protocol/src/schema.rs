//! JSON Schemas of every machine-readable output (`--json`), generated from the types that
//! serialize them, and a check of real output against them.
//!
//! Invariants: the checked-in `schemas/` folder at the repository root holds exactly
//! [`OUTPUTS`], each as generated here (a test fails on drift; `ACP_UPDATE_SCHEMAS=1` rewrites
//! them). A new `--json` output is one more line in [`OUTPUTS`].

use std::collections::BTreeSet;

use schemars::{Schema, schema_for};
use serde_json::Value;

use crate::batch::{BatchRecord, BatchSummary};
use crate::events::{Event, ResultRecord};
use crate::listing::AgentListing;
use crate::sync::report::SyncOutput;
use crate::trust::TrustListing;
use crate::worktree::WorktreeListing;

/// Generates one schema.
pub type SchemaFn = fn() -> Schema;

/// Every output with a schema: (file name under `schemas/`, generator).
pub const OUTPUTS: &[(&str, SchemaFn)] = &[
    // `acp-host run --json`: each line before the last.
    ("run-event.json", || schema_for!(Event)),
    // `acp-host run --json`: the last line.
    ("run-result.json", || schema_for!(ResultRecord)),
    // `acp-host batch`: one record per input line, as each run ends.
    ("batch-result.json", || schema_for!(BatchRecord)),
    // `acp-host batch --json-summary`: the last line, after the records.
    ("batch-summary.json", || schema_for!(BatchSummary)),
    // `acp-host agents --json`.
    ("agents.json", || schema_for!(AgentListing)),
    // `acp-host sync --json`: the report, or why the sync could not be planned.
    ("sync.json", || schema_for!(SyncOutput)),
    // `acp-host trust --json`: a folder's definitions and their trust state.
    ("trust.json", || schema_for!(TrustListing)),
    // `acp-host worktrees list --json`: the worktrees runs left in a repository.
    ("worktrees.json", || schema_for!(WorktreeListing)),
];

/// The schema of output `file` (one of [`OUTPUTS`]).
#[must_use]
pub fn output(file: &str) -> Option<Schema> {
    OUTPUTS
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, f)| f())
}

/// The text written to `schemas/<file>`: pretty JSON with keys sorted at every level (so the text
/// does not depend on whether a build enables `serde_json`'s `preserve_order`) and a final newline.
#[must_use]
pub fn render(schema: &Schema) -> String {
    let mut text =
        serde_json::to_string_pretty(&crate::json::sorted(schema.as_value())).unwrap_or_default();
    text.push('\n');
    text
}

/// Why a record does not match its output schema ([`check_keys`]); each message shows the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error("not a JSON object: {0}")]
    NotAnObject(Value),
    /// A tagged union without a variant of the record's `type`.
    #[error("no schema variant for type {0:?}")]
    NoVariant(Option<Value>),
    #[error(
        "record does not match its schema: undeclared keys {undeclared:?}, missing keys \
         {missing:?}: {record}"
    )]
    Mismatch {
        undeclared: Vec<String>,
        missing: Vec<String>,
        record: Value,
    },
}

/// Checks the top-level keys of an output record against its schema: every key is a declared
/// property and every required property is present. For a tagged union (`oneOf`), the variant is
/// the one whose `type` constant matches the record's `type`. Not a full validator: nested
/// values are checked by the types' own tests and by serde.
pub fn check_keys(schema: &Schema, record: &Value) -> Result<(), KeysError> {
    let object = record
        .as_object()
        .ok_or_else(|| KeysError::NotAnObject(record.clone()))?;
    let root = schema.as_value();
    let variant = match root.get("oneOf").and_then(Value::as_array) {
        Some(variants) => variants
            .iter()
            .find(|v| v.pointer("/properties/type/const") == record.get("type"))
            .ok_or_else(|| KeysError::NoVariant(record.get("type").cloned()))?,
        None => root,
    };
    let mut declared = BTreeSet::new();
    let mut required = BTreeSet::new();
    collect_keys(root, variant, &mut declared, &mut required);
    let present: BTreeSet<String> = object.keys().cloned().collect();
    let undeclared: Vec<String> = present.difference(&declared).cloned().collect();
    let missing: Vec<String> = required.difference(&present).cloned().collect();
    if undeclared.is_empty() && missing.is_empty() {
        Ok(())
    } else {
        Err(KeysError::Mismatch {
            undeclared,
            missing,
            record: record.clone(),
        })
    }
}

/// The properties and required keys of an object schema, following `$ref` (into the root's
/// `$defs`) and `allOf`, which is how variants and flattened fields are written.
fn collect_keys(
    root: &Value,
    node: &Value,
    declared: &mut BTreeSet<String>,
    required: &mut BTreeSet<String>,
) {
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        declared.extend(properties.keys().cloned());
    }
    if let Some(keys) = node.get("required").and_then(Value::as_array) {
        required.extend(keys.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    if let Some(target) = node
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| root.get("$defs")?.get(name))
    {
        collect_keys(root, target, declared, required);
    }
    for part in node
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        collect_keys(root, part, declared, required);
    }
}

/// The developer's path of the drift test: rewriting `schemas/` (left out of the coverage figure,
/// docs/coverage.md).
#[cfg(test)]
mod update;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The checked-in schemas are the generated ones; `ACP_UPDATE_SCHEMAS=1` rewrites them.
    #[test]
    fn checked_in_schemas_match_the_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
        let stale: Vec<(&str, String)> = OUTPUTS
            .iter()
            .map(|(file, generate)| (*file, render(&generate())))
            .filter(|(file, want)| {
                std::fs::read_to_string(dir.join(file)).ok().as_deref() != Some(want.as_str())
            })
            .collect();
        let stale = update::rewrite_when_asked(&dir, stale);
        let mut extra: Vec<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|name| !OUTPUTS.iter().any(|(file, _)| file == name))
                    .collect()
            })
            .unwrap_or_default();
        extra.sort();
        assert!(
            stale.is_empty() && extra.is_empty(),
            "schemas/ is out of date (stale: {stale:?}; not generated: {extra:?}): run \
             `ACP_UPDATE_SCHEMAS=1 cargo test -p acp-host-protocol --lib schema` and commit schemas/"
        );
    }

    #[test]
    fn keys_of_a_plain_object_schema_follow_refs_and_all_of() {
        let schema = Schema::try_from(serde_json::json!({
            "type": "object",
            "properties": {"a": {}},
            "required": ["a"],
            "allOf": [{"$ref": "#/$defs/more"}, {"properties": {"c": {}}}],
            "$defs": {"more": {"properties": {"b": {}}, "required": ["b"]}}
        }))
        .unwrap();
        check_keys(&schema, &serde_json::json!({"a": 1, "b": 2, "c": 3})).unwrap();
        check_keys(&schema, &serde_json::json!({"a": 1, "b": 2})).unwrap();
        assert_eq!(
            check_keys(&schema, &serde_json::json!({"a": 1, "d": 4}))
                .unwrap_err()
                .to_string(),
            r#"record does not match its schema: undeclared keys ["d"], missing keys ["b"]: {"a":1,"d":4}"#
        );
        assert_eq!(
            check_keys(&schema, &serde_json::json!([1]))
                .unwrap_err()
                .to_string(),
            "not a JSON object: [1]"
        );
    }

    #[test]
    fn keys_are_checked_per_variant() {
        let schema = output("run-event.json").unwrap();
        let end = serde_json::json!({"type": "end", "runId": "r", "provider": "p", "status": "completed",
            "lastAssistantMessage": null});
        check_keys(&schema, &end).unwrap();
        let extra = serde_json::json!({"type": "end", "runId": "r", "provider": "p", "status": "completed",
            "lastAssistantMessage": null, "surprise": 1});
        assert!(
            check_keys(&schema, &extra)
                .unwrap_err()
                .to_string()
                .contains("surprise")
        );
        let unknown = serde_json::json!({"type": "later", "runId": "r"});
        assert_eq!(
            check_keys(&schema, &unknown).unwrap_err().to_string(),
            r#"no schema variant for type Some(String("later"))"#
        );
        let missing = serde_json::json!({"type": "end", "runId": "r"});
        assert!(
            check_keys(&schema, &missing)
                .unwrap_err()
                .to_string()
                .contains("status")
        );
    }
}
