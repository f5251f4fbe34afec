//! The `acp-host/start` extension's three wire shapes, each one typed value with its encoder and
//! decoder here, for both sides (docs/start-extension.md): what an agent advertises
//! ([`Advertised`], `agentCapabilities._meta`), what a session asks ([`SessionStart`],
//! `session/new`'s `_meta`) and the answer it returns ([`Answer`], the prompt response's `_meta`).
//!
//! Invariants: a client reads an advertisement leniently (anything malformed is "not offered");
//! an agent reads a session's request strictly (every problem is an invalid-params message
//! naming the field); a field the agent does not honour is refused, never ignored.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ToolFilter;
use super::{
    EXTENSION, EXTENSION_VERSION, FIELD_BUDGET, FIELD_MAX_DEPTH, FIELD_OUTPUT_SCHEMA, FIELD_TOOLS,
};
use crate::usage::Budget;

/// `agentCapabilities._meta["acp-host/start"]`: the fields an agent honours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Advertised {
    pub version: u64,
    pub fields: Vec<String>,
}

impl Advertised {
    /// This side's version, honouring `fields`.
    #[must_use]
    pub fn new<'a>(fields: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            version: EXTENSION_VERSION,
            fields: fields.into_iter().map(str::to_owned).collect(),
        }
    }

    /// The `_meta` object carrying it.
    #[must_use]
    pub fn to_meta(&self) -> Map<String, Value> {
        meta(serde_json::to_value(self).unwrap_or_default())
    }

    /// The fields honoured per an agent's `agentCapabilities` (`capabilities`), when it
    /// advertises this version; leniently: a field that is not a string is skipped, a
    /// malformed advertisement is none.
    #[must_use]
    pub fn read(capabilities: &Value) -> Option<Vec<String>> {
        let extension = capabilities
            .get("_meta")
            .and_then(|meta| meta.get(EXTENSION))
            .filter(|ext| ext.get("version").and_then(Value::as_u64) == Some(EXTENSION_VERSION))?;
        Some(
            extension
                .get("fields")
                .and_then(Value::as_array)
                .map(|fields| {
                    fields
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        )
    }
}

/// `session/new`'s `_meta["acp-host/start"]`: what a session asks of its agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStart {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolFilter>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// The run's budget, held by the agent ([`FIELD_BUDGET`]); sent through
    /// [`super::plan_budget`].
    #[serde(skip)]
    pub budget: Option<Budget>,
}

/// A budget as the extension carries it: `{"tokens": N, "cost": X}`, each when set.
pub(super) fn budget_value(budget: Budget) -> Value {
    let mut value = Map::new();
    if let Some(tokens) = budget.tokens {
        value.insert("tokens".into(), tokens.into());
    }
    if let Some(cost) = budget.cost {
        value.insert("cost".into(), cost.into());
    }
    Value::Object(value)
}

/// Why an agent refused a session's `acp-host/start` request: an invalid-params message naming
/// the field ([`SessionStart::read`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartError {
    #[error("_meta.{key}: must be an object", key = EXTENSION)]
    NotAnObject,
    #[error("_meta.{key}: version must be {version}", key = EXTENSION, version = EXTENSION_VERSION)]
    Version,
    /// `tools` is not a tool filter (serde's words).
    #[error("_meta.{key}.tools: {0}", key = EXTENSION)]
    Tools(String),
    #[error("_meta.{key}.maxDepth: must be a whole number, not {0}", key = EXTENSION)]
    MaxDepth(Value),
    #[error(
        "_meta.{key}: field {0} is not honoured by this agent (see its initialize answer)",
        key = EXTENSION
    )]
    NotHonoured(String),
    #[error(
        "_meta.{key}.{budget}: must be an object, not {0}",
        key = EXTENSION, budget = FIELD_BUDGET
    )]
    BudgetNotAnObject(Value),
    #[error(
        "_meta.{key}.{budget}.tokens: must be a whole number, not {0}",
        key = EXTENSION, budget = FIELD_BUDGET
    )]
    BudgetTokens(Value),
    #[error(
        "_meta.{key}.{budget}.cost: must be a non-negative number, not {0}",
        key = EXTENSION, budget = FIELD_BUDGET
    )]
    BudgetCost(Value),
    #[error(
        "_meta.{key}.{budget}: unknown field {0}; it takes tokens and cost",
        key = EXTENSION, budget = FIELD_BUDGET
    )]
    BudgetField(String),
}

/// The extension's `budget`, strictly: an object of a whole number of `tokens` and a
/// non-negative `cost`, each optional, nothing else.
fn read_budget(value: &Value) -> Result<Budget, StartError> {
    let Some(fields) = value.as_object() else {
        return Err(StartError::BudgetNotAnObject(value.clone()));
    };
    let mut budget = Budget::default();
    for (name, value) in fields {
        match name.as_str() {
            "tokens" => {
                budget.tokens = Some(
                    value
                        .as_u64()
                        .ok_or_else(|| StartError::BudgetTokens(value.clone()))?,
                );
            }
            "cost" => {
                budget.cost = Some(
                    value
                        .as_f64()
                        .filter(|cost| cost.is_finite() && *cost >= 0.0)
                        .ok_or_else(|| StartError::BudgetCost(value.clone()))?,
                );
            }
            other => {
                return Err(StartError::BudgetField(other.to_owned()));
            }
        }
    }
    Ok(budget)
}

impl SessionStart {
    /// Whether it asks for nothing (then nothing is sent).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tools.is_none()
            && self.output_schema.is_none()
            && self.max_depth.is_none()
            && self.budget.is_none()
    }

    /// The `_meta` object carrying it, with this side's version.
    #[must_use]
    pub fn to_meta(&self) -> Map<String, Value> {
        // A struct serializes to an object; were it anything else, only the version would go.
        let mut fields = serde_json::to_value(self)
            .and_then(serde_json::from_value::<Map<String, Value>>)
            .unwrap_or_default();
        fields.insert("version".into(), Value::from(EXTENSION_VERSION));
        if let Some(budget) = self.budget {
            fields.insert(FIELD_BUDGET.into(), budget_value(budget));
        }
        meta(Value::Object(fields))
    }

    /// Reads a session's request (`extension`, the value under the key) strictly, taking only the
    /// fields `honours` names; `Err` is an invalid-params message naming the field.
    pub fn read(extension: &Value, honours: impl Fn(&str) -> bool) -> Result<Self, StartError> {
        Self::read_with(extension, &honours)
    }

    /// [`SessionStart::read`], compiled once (not once per caller's closure).
    fn read_with(extension: &Value, honours: &dyn Fn(&str) -> bool) -> Result<Self, StartError> {
        let Some(fields) = extension.as_object() else {
            return Err(StartError::NotAnObject);
        };
        if fields.get("version").and_then(Value::as_u64) != Some(EXTENSION_VERSION) {
            return Err(StartError::Version);
        }
        let mut taken = Self::default();
        for (name, value) in fields {
            match name.as_str() {
                "version" => {}
                FIELD_TOOLS if honours(FIELD_TOOLS) => {
                    taken.tools = Some(
                        serde_json::from_value(value.clone())
                            .map_err(|error| StartError::Tools(error.to_string()))?,
                    );
                }
                FIELD_OUTPUT_SCHEMA if honours(FIELD_OUTPUT_SCHEMA) => {
                    taken.output_schema = Some(value.clone());
                }
                FIELD_MAX_DEPTH if honours(FIELD_MAX_DEPTH) => {
                    let cap = value
                        .as_u64()
                        .and_then(|cap| u32::try_from(cap).ok())
                        .ok_or_else(|| StartError::MaxDepth(value.clone()))?;
                    taken.max_depth = Some(cap);
                }
                FIELD_BUDGET if honours(FIELD_BUDGET) => {
                    taken.budget = Some(read_budget(value)?);
                }
                other => {
                    return Err(StartError::NotHonoured(other.to_owned()));
                }
            }
        }
        Ok(taken)
    }
}

/// The prompt response's `_meta["acp-host/start"]`: the structured answer the session captured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub structured: Value,
}

impl Answer {
    /// The `_meta` object carrying it.
    #[must_use]
    pub fn to_meta(&self) -> Map<String, Value> {
        meta(serde_json::to_value(self).unwrap_or_default())
    }

    /// The captured value in a prompt response (`response`, as JSON), if it carries one.
    #[must_use]
    pub fn read(response: &Value) -> Option<Value> {
        response
            .get("_meta")
            .and_then(|meta| meta.get(EXTENSION))
            .and_then(|extension| extension.get("structured"))
            .cloned()
    }
}

/// A `_meta` object holding `value` under the extension's key.
fn meta(value: Value) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(EXTENSION.into(), value);
    meta
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_shape_round_trips_through_its_encoder_and_decoder() {
        let advertised = Advertised::new(["maxDepth", "tools"]);
        let capabilities = json!({"_meta": advertised.to_meta()});
        assert_eq!(
            Advertised::read(&capabilities),
            Some(vec!["maxDepth".to_owned(), "tools".to_owned()])
        );
        let start = SessionStart {
            tools: Some(ToolFilter {
                allow: Some(vec!["read_file".into()]),
                deny: Vec::new(),
            }),
            output_schema: Some(json!({"type": "object"})),
            max_depth: Some(0),
            budget: Some(Budget {
                tokens: Some(20),
                cost: Some(0.5),
            }),
        };
        let meta = start.to_meta();
        assert_eq!(
            Value::Object(meta.clone()),
            json!({EXTENSION: {"version": 1, "tools": {"allow": ["read_file"]}, "outputSchema": {"type": "object"}, "maxDepth": 0, "budget": {"tokens": 20, "cost": 0.5}}})
        );
        assert_eq!(SessionStart::read(&meta[EXTENSION], |_| true), Ok(start));
        let answer = Answer {
            structured: json!({"ok": true}),
        };
        assert_eq!(
            Answer::read(&json!({"stopReason": "end_turn", "_meta": answer.to_meta()})),
            Some(json!({"ok": true}))
        );
    }

    #[test]
    fn a_session_request_is_read_strictly() {
        let read = |value: Value| {
            SessionStart::read(&value, |field| field != "tools").map_err(|err| err.to_string())
        };
        assert_eq!(
            read(json!(1)),
            Err("_meta.acp-host/start: must be an object".into())
        );
        assert_eq!(
            read(json!({"version": 2})),
            Err("_meta.acp-host/start: version must be 1".into())
        );
        assert_eq!(
            read(json!({"version": 1, "maxDepth": -1})),
            Err("_meta.acp-host/start.maxDepth: must be a whole number, not -1".into())
        );
        let tools = SessionStart::read(&json!({"version": 1, "tools": 7}), |_| true)
            .unwrap_err()
            .to_string();
        assert!(
            tools.starts_with("_meta.acp-host/start.tools: invalid type: integer `7`"),
            "{tools}"
        );
        assert_eq!(
            read(json!({"version": 1, "tools": {}})),
            Err(
                "_meta.acp-host/start: field tools is not honoured by this agent (see its \
                 initialize answer)"
                    .into()
            )
        );
    }

    #[test]
    fn a_budget_is_read_strictly() {
        let read = |budget: Value| {
            SessionStart::read(&json!({"version": 1, "budget": budget}), |_| true)
                .map(|start| start.budget)
                .map_err(|err| err.to_string())
        };
        assert_eq!(
            read(json!({"tokens": 5})),
            Ok(Some(Budget {
                tokens: Some(5),
                cost: None
            }))
        );
        assert_eq!(read(json!({})), Ok(Some(Budget::default())));
        assert_eq!(
            read(json!(3)),
            Err("_meta.acp-host/start.budget: must be an object, not 3".into())
        );
        assert_eq!(
            read(json!({"tokens": 1.5})),
            Err("_meta.acp-host/start.budget.tokens: must be a whole number, not 1.5".into())
        );
        assert_eq!(
            read(json!({"cost": -1})),
            Err("_meta.acp-host/start.budget.cost: must be a non-negative number, not -1".into())
        );
        assert_eq!(
            read(json!({"turns": 1})),
            Err(
                "_meta.acp-host/start.budget: unknown field turns; it takes tokens and cost".into()
            )
        );
        let only_a_budget = SessionStart {
            budget: Some(Budget::default()),
            ..SessionStart::default()
        };
        assert!(!only_a_budget.is_empty(), "a budget alone is sent");
    }

    #[test]
    fn an_advertisement_is_read_leniently() {
        assert_eq!(
            Advertised::read(
                &json!({"_meta": {EXTENSION: {"version": 1, "fields": ["tools", 3]}}})
            ),
            Some(vec!["tools".to_owned()])
        );
        assert_eq!(
            Advertised::read(&json!({"_meta": {EXTENSION: {"version": 2, "fields": ["tools"]}}})),
            None
        );
        assert_eq!(Advertised::read(&json!({})), None);
    }
}
