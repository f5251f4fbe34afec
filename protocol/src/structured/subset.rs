//! The JSON Schema subset an output schema may use: the one place it is defined.
//!
//! Invariants:
//! - the dialect is JSON Schema 2020-12 (`$schema`, when given, must name it);
//! - every keyword of a schema (and of each subschema: under `properties`, `items`, `allOf`, ...)
//!   is one of [`KEYWORDS`], each enforced by the validator or a pure annotation; anything else
//!   (a misspelt `propertiez`, `minimun`, or a keyword of another vocabulary) is refused;
//! - `format` is asserted, never an annotation: only the [`FORMATS`] the validator checks are
//!   accepted, so no format is silently ignored;
//! - `$ref` is local (`#...`): nothing is fetched from the network or the disk;
//! - [`problems`] lists every problem in one pass (its own checks, then the meta-schema's), each
//!   at its location in the schema; the caller compiles only a schema with none.

use serde_json::Value;

use super::Violation;

/// The dialect (`$schema`) an output schema is read as.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Keywords whose value is one subschema.
const SUBSCHEMA: &[&str] = &[
    "not",
    "if",
    "then",
    "else",
    "items",
    "contains",
    "propertyNames",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
];

/// Keywords whose value is an array of subschemas.
const SUBSCHEMA_ARRAY: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];

/// Keywords whose value is an object of subschemas.
const SUBSCHEMA_MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
];

/// Keywords whose value is data, not a schema (assertions and annotations).
const VALUE: &[&str] = &[
    "$schema",
    "$ref",
    "$comment",
    "type",
    "enum",
    "const",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Every keyword an output schema may use.
pub const KEYWORDS: [&[&str]; 4] = [SUBSCHEMA, SUBSCHEMA_ARRAY, SUBSCHEMA_MAP, VALUE];

/// The `format` values that are checked (any other is refused).
pub const FORMATS: &[&str] = &[
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
    "regex",
    "json-pointer",
];

/// The JSON types `type` may name.
const TYPES: &[&str] = &[
    "array", "boolean", "integer", "null", "number", "object", "string",
];

/// Every problem of `schema` against the subset; empty when it is inside it (it may still fail
/// to compile: a `$ref` to a missing definition, a `pattern` that is not a regex).
#[must_use]
pub fn problems(schema: &Value) -> Vec<Violation> {
    let mut found = Vec::new();
    if !schema.is_object() && !schema.is_boolean() {
        found.push(at(
            "",
            "a schema is a JSON object (or true/false)".to_owned(),
        ));
        return found;
    }
    let dialect = schema.get("$schema");
    if let Some(dialect) = dialect
        && dialect.as_str().map(|d| d.trim_end_matches('#')) != Some(DIALECT)
    {
        found.push(at(
            "/$schema",
            format!("{dialect} is not supported; output schemas are JSON Schema 2020-12 (\"{DIALECT}\", or no $schema)"),
        ));
    }
    walk(schema, &mut String::new(), &mut found);
    if dialect.is_none() || found.iter().all(|problem| problem.path != "/$schema") {
        // The meta-schema's own checks (a `minimum` that is not a number, ...), where ours said
        // nothing: one problem per location.
        let meta = jsonschema::draft202012::meta::validator();
        for error in meta.iter_errors(schema) {
            let path = error.instance_path().to_string();
            if !found.iter().any(|problem| covers(&problem.path, &path)) {
                found.push(at(&path, error.to_string()));
            }
        }
    }
    found
}

/// Whether a problem at `reported` already accounts for one at `path` (the same place or under
/// it).
fn covers(reported: &str, path: &str) -> bool {
    path.strip_prefix(reported)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn at(path: &str, message: String) -> Violation {
    Violation {
        path: path.to_owned(),
        message,
    }
}

/// Checks the keywords of the schema at `path` (a JSON pointer into the root) and descends into
/// its subschemas. A subschema that is not an object is left to the meta-schema.
fn walk(schema: &Value, path: &mut String, found: &mut Vec<Violation>) {
    let Value::Object(keywords) = schema else {
        return;
    };
    for (keyword, value) in keywords {
        let len = path.len();
        push(path, keyword);
        check(keyword, value, path, found);
        path.truncate(len);
    }
}

fn check(keyword: &str, value: &Value, path: &mut String, found: &mut Vec<Violation>) {
    match keyword {
        _ if SUBSCHEMA.contains(&keyword) => walk(value, path, found),
        _ if SUBSCHEMA_ARRAY.contains(&keyword) => {
            for (index, item) in value.as_array().into_iter().flatten().enumerate() {
                let len = path.len();
                push(path, &index.to_string());
                walk(item, path, found);
                path.truncate(len);
            }
        }
        _ if SUBSCHEMA_MAP.contains(&keyword) => {
            for (name, item) in value.as_object().into_iter().flatten() {
                let len = path.len();
                push(path, name);
                walk(item, path, found);
                path.truncate(len);
            }
        }
        "$schema" if path != "/$schema" => {
            found.push(at(
                path,
                "$schema is read only at the root of an output schema".to_owned(),
            ));
        }
        "$ref" => match value.as_str() {
            Some(reference) if reference.starts_with('#') => {}
            _ => found.push(at(
                path,
                format!(
                    "{value} is not a local reference; only references into the schema itself \
                     (\"#/$defs/...\") are resolved, nothing is fetched"
                ),
            )),
        },
        "format" => {
            if let Some(format) = value.as_str()
                && !FORMATS.contains(&format)
            {
                found.push(at(
                    path,
                    format!(
                        "format {value} is not enforced; the formats checked are {}",
                        FORMATS.join(", ")
                    ),
                ));
            }
        }
        "type" => {
            let names: Vec<&Value> = match value {
                Value::Array(names) => names.iter().collect(),
                other => vec![other],
            };
            for name in names {
                if name.as_str().is_none_or(|name| !TYPES.contains(&name)) {
                    found.push(at(
                        path,
                        format!(
                            "type {name} is not a JSON type; the types are {}",
                            TYPES.join(", ")
                        ),
                    ));
                }
            }
        }
        _ if VALUE.contains(&keyword) => {}
        _ => found.push(at(path, unknown(keyword))),
    }
}

/// The message for a keyword outside the subset, suggesting the nearest one.
fn unknown(keyword: &str) -> String {
    let nearest = KEYWORDS
        .iter()
        .flat_map(|group| group.iter())
        .map(|known| (strsim::damerau_levenshtein(keyword, known), *known))
        .min();
    match nearest {
        Some((distance, known)) if distance <= 2 => {
            format!("unknown keyword \"{keyword}\" (did you mean \"{known}\"?)")
        }
        _ => format!(
            "unknown keyword \"{keyword}\"; output schemas use the enforced subset of JSON Schema \
             2020-12 (docs/run.md, \"Structured output\")"
        ),
    }
}

/// Appends `token` to a JSON pointer, escaped (RFC 6901).
fn push(path: &mut String, token: &str) {
    path.push('/');
    for c in token.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shown(schema: &Value) -> Vec<String> {
        problems(schema).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_schema_inside_the_subset_has_no_problem() {
        let schema = json!({
            "$schema": DIALECT,
            "$comment": "everything the subset has",
            "title": "t", "description": "d", "default": {}, "examples": [{}],
            "type": ["object", "null"],
            "properties": {
                "when": {"type": "string", "format": "date-time", "minLength": 1, "maxLength": 40},
                "n": {"type": "integer", "minimum": 0, "maximum": 9, "multipleOf": 1,
                      "exclusiveMinimum": -1, "exclusiveMaximum": 10, "deprecated": false},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 0,
                         "maxItems": 3, "uniqueItems": true, "contains": {"const": "a"},
                         "minContains": 1, "maxContains": 2},
                "pair": {"prefixItems": [{"type": "string"}, true], "unevaluatedItems": false},
                "kind": {"enum": ["a", "b"], "readOnly": true, "writeOnly": false},
                "either": {"anyOf": [{"type": "null"}], "oneOf": [true], "allOf": [{}],
                           "not": {"type": "boolean"}},
                "cond": {"if": {"type": "string"}, "then": {"pattern": "^a"}, "else": {}},
            },
            "patternProperties": {"^x-": {}},
            "additionalProperties": false,
            "unevaluatedProperties": false,
            "propertyNames": {"maxLength": 9},
            "required": ["n"],
            "dependentRequired": {"n": ["kind"]},
            "dependentSchemas": {"n": {"minProperties": 1, "maxProperties": 9}},
            "$defs": {"tag": {"type": "string", "format": "email"}},
        });
        assert_eq!(shown(&schema), Vec::<String>::new());
        assert_eq!(shown(&json!(true)), Vec::<String>::new());
    }

    #[test]
    fn every_problem_is_listed_at_its_location_in_schema_order() {
        let schema = json!({
            "type": "object",
            "propertiez": {},
            "properties": {
                "n": {"type": "integer", "minimun": 1},
                "mail": {"type": "string", "format": "idn-email"},
                "a/b": {"type": "integr"},
                "c~d": {"maxLenght": 1},
                "m": {"maximum": "five"},
            },
            "items": {"$ref": "https://example.com/s.json"},
            "x-vendor": 1,
        });
        assert_eq!(
            shown(&schema),
            [
                "/propertiez: unknown keyword \"propertiez\" (did you mean \"properties\"?)",
                "/properties/n/minimun: unknown keyword \"minimun\" (did you mean \"minimum\"?)",
                "/properties/mail/format: format \"idn-email\" is not enforced; the formats \
                 checked are date, date-time, time, duration, email, hostname, ipv4, ipv6, uri, \
                 uri-reference, uuid, regex, json-pointer",
                "/properties/a~1b/type: type \"integr\" is not a JSON type; the types are array, \
                 boolean, integer, null, number, object, string",
                "/properties/c~0d/maxLenght: unknown keyword \"maxLenght\" (did you mean \"maxLength\"?)",
                "/items/$ref: \"https://example.com/s.json\" is not a local reference; only \
                 references into the schema itself (\"#/$defs/...\") are resolved, nothing is \
                 fetched",
                "/x-vendor: unknown keyword \"x-vendor\"; output schemas use the enforced subset \
                 of JSON Schema 2020-12 (docs/run.md, \"Structured output\")",
                "/properties/m/maximum: \"five\" is not of type \"number\"",
            ]
        );
    }

    #[test]
    fn the_dialect_is_2020_12_named_at_the_root_only() {
        assert_eq!(
            shown(&json!({"$schema": "http://json-schema.org/draft-07/schema#", "minimum": "x"})),
            [
                "/$schema: \"http://json-schema.org/draft-07/schema#\" is not supported; output \
              schemas are JSON Schema 2020-12 (\"https://json-schema.org/draft/2020-12/schema\", \
              or no $schema)"
            ]
        );
        assert_eq!(
            shown(&json!({"$schema": format!("{DIALECT}#"), "items": {"$schema": DIALECT}})),
            ["/items/$schema: $schema is read only at the root of an output schema"]
        );
        assert_eq!(
            shown(&json!([{"type": "string"}])),
            ["(root): a schema is a JSON object (or true/false)"]
        );
        // A subschema that is not one is the meta-schema's to name.
        assert_eq!(shown(&json!({"items": 3})).len(), 1);
    }
}
