//! JSON helpers shared by the output types' schemas and structured output: a leaf, importing
//! nothing of the crate.

use serde_json::Value;

/// `value` with every object's keys in sorted order, whatever `serde_json`'s `preserve_order`.
pub(crate) fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}
