//! Start-time capabilities: what a run asks of its agent beyond the prompt (a persona, a model, a
//! tool filter), what the agent offers, and the decision between the two, made before the prompt.
//!
//! The wire shapes are ACP's own where ACP has them: the persona is `session/new`'s `systemPrompt`
//! (offered as `sessionCapabilities.systemPrompt`), the model a session config option of category
//! `model` (selected with `session/set_config_option`). The rest travels in one namespaced `_meta`
//! object on `session/new` ([`EXTENSION`], version [`EXTENSION_VERSION`], documented in
//! docs/start-extension.md), sent only to an agent that lists the fields it honours under the same
//! key in `agentCapabilities._meta`.
//!
//! Invariants:
//! - a restriction the agent cannot honour (a tool filter, a model it does not offer, a persona
//!   that must not degrade) is a [`Refusal`], never silently dropped: the prompt is not sent;
//! - a persona in `append` mode degrades to a delimited preamble of the first prompt
//!   ([`preamble`]) when the agent takes no system prompt; the result says how it travelled
//!   ([`PersonaDelivery`]);
//! - nothing is sent that the agent did not advertise (no `systemPrompt`, no `_meta` object);
//! - a delegation depth cap travels as the extension's `maxDepth` only when one was asked for
//!   explicitly: the default budget (in the environment of every agent) is never a refusal.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::structured::{self, OutputSpec, StructuredVia};

mod extension;
pub mod template;

pub use self::extension::{Advertised, Answer, SessionStart, StartError};

/// The `_meta` key of the extension, in `agentCapabilities._meta` and on `session/new`.
pub const EXTENSION: &str = "acp-host/start";
/// The version of the extension's fields this side speaks.
pub const EXTENSION_VERSION: u64 = 1;
/// The extension field carrying a tool filter.
pub const FIELD_TOOLS: &str = "tools";
/// The extension field carrying an output schema (the agent answers through a capture tool and
/// returns the value in the prompt response's `_meta`, under [`EXTENSION`], as `structured`).
pub const FIELD_OUTPUT_SCHEMA: &str = "outputSchema";
/// The extension field carrying a delegation depth cap the agent enforces on itself, as it would
/// a lower `ACP_HOST_MAX_DEPTH` (`crate::depth`).
pub const FIELD_MAX_DEPTH: &str = "maxDepth";
/// The extension field carrying the run's budget (`{"tokens": N, "cost": X}`), which the agent
/// holds where the spending happens: it ends its turn (`max_tokens`) before a model request would
/// pass it. Never a refusal: the client's own check is the backstop for an agent that does not
/// take it ([`plan_budget`]).
pub const FIELD_BUDGET: &str = "budget";

/// How a persona joins the agent's own instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersonaMode {
    /// Added to the agent's instructions; a prompt preamble when the agent takes no system prompt.
    #[default]
    Append,
    /// Like `Append`, but refused rather than degraded to a preamble.
    Strict,
    /// Replaces the agent's default instructions; refused when the agent cannot (a preamble
    /// cannot replace anything).
    Override,
}

impl PersonaMode {
    /// The names, as `--persona-mode` and a definition's `run.personaMode` take them.
    pub const NAMES: &'static str = "append, strict, override";

    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "append" => Some(Self::Append),
            "strict" => Some(Self::Strict),
            "override" => Some(Self::Override),
            _ => None,
        }
    }
}

/// A persona to give the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persona {
    pub text: String,
    pub mode: PersonaMode,
}

/// Allow and deny lists of tool names. `allow: None` means every tool; `Some(empty)` none; a name
/// in both is denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl ToolFilter {
    /// Whether `name` passes the filter.
    #[must_use]
    pub fn allows(&self, name: &str) -> bool {
        !self.deny.iter().any(|d| d == name)
            && self
                .allow
                .as_ref()
                .is_none_or(|allow| allow.iter().any(|a| a == name))
    }

    /// Checks every name against the tools that exist (`known`); `Err` names the unknown ones.
    pub fn check(&self, known: &[&str]) -> Result<(), UnknownTools> {
        let mut unknown: Vec<&str> = Vec::new();
        for name in self.allow.iter().flatten().chain(&self.deny) {
            if !known.contains(&name.as_str()) && !unknown.contains(&name.as_str()) {
                unknown.push(name);
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        Err(UnknownTools {
            unknown: unknown.into_iter().map(str::to_owned).collect(),
            known: known.iter().map(|name| (*name).to_owned()).collect(),
        })
    }
}

/// A tool filter's names that are none of the tools ([`ToolFilter::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown tool name{} {}; the tools are {}",
    if .unknown.len() == 1 { "" } else { "s" },
    .unknown.join(", "),
    .known.join(", ")
)]
pub struct UnknownTools {
    pub unknown: Vec<String>,
    pub known: Vec<String>,
}

/// What a run asks of its agent at start. The default asks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wants {
    pub persona: Option<Persona>,
    /// A value of the agent's `model` config option.
    pub model: Option<String>,
    pub tools: Option<ToolFilter>,
    /// A structured answer: never refused (text extraction is the fallback).
    pub output: Option<OutputSpec>,
}

/// What the agent advertised at `initialize`, as far as [`Wants`] are concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offers {
    /// `sessionCapabilities.systemPrompt` is advertised.
    pub system_prompt: bool,
    /// ... with `mode.override`.
    pub system_prompt_override: bool,
    /// The extension's fields the agent honours, when it advertises [`EXTENSION`] at
    /// [`EXTENSION_VERSION`].
    pub extension_fields: Option<Vec<String>>,
}

impl Offers {
    /// Reads the offers from an `initialize` result (leniently: anything malformed is "not
    /// offered").
    #[must_use]
    pub fn from_initialize(result: &Value) -> Self {
        let capabilities = result.get("agentCapabilities").unwrap_or(&Value::Null);
        let system_prompt = capabilities
            .pointer("/sessionCapabilities/systemPrompt")
            .filter(|v| v.is_object());
        Offers {
            system_prompt: system_prompt.is_some(),
            system_prompt_override: system_prompt
                .and_then(|sp| sp.pointer("/mode/override"))
                .is_some_and(Value::is_object),
            extension_fields: Advertised::read(capabilities),
        }
    }

    fn honours(&self, field: &str) -> bool {
        self.extension_fields
            .as_ref()
            .is_some_and(|fields| fields.iter().any(|f| f == field))
    }
}

/// How the persona reached the agent (the result's `personaDelivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PersonaDelivery {
    /// As `session/new`'s `systemPrompt`.
    SystemPrompt,
    /// As a delimited preamble of the prompt: the agent takes no system prompt.
    Preamble,
}

/// The system prompt to send with `session/new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemPrompt {
    pub text: String,
    /// `true`: ACP's `override` mode; else `append`.
    pub replace: bool,
}

/// What to send, decided from [`Wants`] and [`Offers`] before `session/new`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPlan {
    pub system_prompt: Option<SystemPrompt>,
    /// Put before the prompt text ([`preamble`]).
    pub preamble: Option<String>,
    /// `session/new`'s `_meta`.
    pub meta: Option<Map<String, Value>>,
    pub persona_delivery: Option<PersonaDelivery>,
    /// Appended to the first prompt: the schema and how to answer ([`structured::instruction`]).
    pub output_instruction: Option<String>,
    /// Where the structured answer is expected from, when one is asked for.
    pub structured_via: Option<StructuredVia>,
}

/// A capability the agent cannot honour: the run is refused before the prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("capability {capability}: agent {agent} {reason}")]
pub struct Refusal {
    /// `persona`, `model`, `tools` or `depth`.
    pub capability: &'static str,
    pub agent: String,
    pub reason: String,
}

/// What to send with `session/new`, or why the run must not go on. `max_depth` is the delegation
/// cap the agent must enforce, given only when a cap was asked for explicitly (a flag, a
/// definition); `agent` names the agent in messages.
pub fn plan_session(
    wants: &Wants,
    max_depth: Option<u32>,
    offers: &Offers,
    agent: &str,
) -> Result<SessionPlan, Refusal> {
    let refuse = |capability, reason: String| Refusal {
        capability,
        agent: agent.to_owned(),
        reason,
    };
    let mut plan = SessionPlan::default();
    if let Some(persona) = &wants.persona {
        match (persona.mode, offers.system_prompt) {
            (PersonaMode::Override, true) if !offers.system_prompt_override => {
                return Err(refuse(
                    "persona",
                    "takes a system prompt only in append mode (sessionCapabilities.systemPrompt \
                     without mode.override); use persona mode append"
                        .to_owned(),
                ));
            }
            (mode, true) => {
                plan.system_prompt = Some(SystemPrompt {
                    text: persona.text.clone(),
                    replace: mode == PersonaMode::Override,
                });
                plan.persona_delivery = Some(PersonaDelivery::SystemPrompt);
            }
            (PersonaMode::Append, false) => {
                plan.preamble = Some(persona.text.clone());
                plan.persona_delivery = Some(PersonaDelivery::Preamble);
            }
            (mode, false) => {
                return Err(refuse(
                    "persona",
                    format!(
                        "takes no system prompt (no sessionCapabilities.systemPrompt), and persona \
                         mode {} does not fall back to a prompt preamble; use persona mode append",
                        if mode == PersonaMode::Override {
                            "override"
                        } else {
                            "strict"
                        }
                    ),
                ));
            }
        }
    }
    let mut start = SessionStart::default();
    if let Some(tools) = &wants.tools {
        if !offers.honours(FIELD_TOOLS) {
            return Err(refuse(
                "tools",
                format!(
                    "cannot take a tool filter: it does not advertise the {EXTENSION} extension \
                     (version {EXTENSION_VERSION}, field {FIELD_TOOLS}) in \
                     agentCapabilities._meta; drop the tool filter or run an agent that honours it"
                ),
            ));
        }
        start.tools = Some(tools.clone());
    }
    if let Some(max_depth) = max_depth {
        if !offers.honours(FIELD_MAX_DEPTH) {
            return Err(refuse(
                "depth",
                format!(
                    "cannot take a delegation depth cap ({max_depth}): it does not advertise the \
                     {EXTENSION} extension (version {EXTENSION_VERSION}, field {FIELD_MAX_DEPTH}) \
                     in agentCapabilities._meta; drop --max-depth (or the definition's maxDepth) \
                     or run an agent that honours it"
                ),
            ));
        }
        start.max_depth = Some(max_depth);
    }
    if let Some(output) = &wants.output {
        if offers.honours(FIELD_OUTPUT_SCHEMA) {
            start.output_schema = Some(output.schema.clone());
            plan.structured_via = Some(StructuredVia::CaptureTool);
        } else {
            plan.output_instruction = Some(structured::instruction(&output.schema));
            plan.structured_via = Some(StructuredVia::Text);
        }
    }
    if !start.is_empty() {
        plan.meta = Some(start.to_meta());
    }
    Ok(plan)
}

/// Adds the run's budget to what `session/new` sends, when the agent honours [`FIELD_BUDGET`]
/// and there is one; otherwise nothing (the client holds the budget against what the agent
/// reports, as for any agent).
pub fn plan_budget(plan: &mut SessionPlan, budget: crate::usage::Budget, offers: &Offers) {
    if !budget.is_set() || !offers.honours(FIELD_BUDGET) {
        return;
    }
    let meta = plan
        .meta
        .get_or_insert_with(|| SessionStart::default().to_meta());
    if let Some(Value::Object(extension)) = meta.get_mut(EXTENSION) {
        extension.insert(FIELD_BUDGET.into(), extension::budget_value(budget));
    }
}

/// The `session/set_config_option` selecting a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    pub config_id: String,
    pub value: String,
}

/// Which config option and value select `model`, from `session/new`'s `configOptions` (`None`
/// when absent); `Ok(None)` when it is already the current value.
pub fn plan_model(
    model: &str,
    config_options: Option<&Value>,
    agent: &str,
) -> Result<Option<ModelChoice>, Refusal> {
    let refuse = |reason: String| Refusal {
        capability: "model",
        agent: agent.to_owned(),
        reason,
    };
    let option = config_options
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
        .ok_or_else(|| {
            refuse(format!(
                "offers no session config option of category model, so model {model} cannot be \
                 selected; drop the model or choose it in the agent's own configuration"
            ))
        })?;
    let config_id = option.get("id").and_then(Value::as_str).unwrap_or_default();
    let values = select_values(option);
    if !values.iter().any(|v| v == model) {
        return Err(refuse(format!(
            "does not offer model {model}; it offers: {}",
            if values.is_empty() {
                "none".to_owned()
            } else {
                values.join(", ")
            }
        )));
    }
    if option.get("currentValue").and_then(Value::as_str) == Some(model) {
        return Ok(None);
    }
    Ok(Some(ModelChoice {
        config_id: config_id.to_owned(),
        value: model.to_owned(),
    }))
}

/// The values of a select option, grouped or not.
fn select_values(option: &Value) -> Vec<String> {
    let value_of = |o: &Value| o.get("value").and_then(Value::as_str).map(str::to_owned);
    option
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(
            |entry| match entry.get("options").and_then(Value::as_array) {
                Some(group) => group.iter().filter_map(value_of).collect(),
                None => value_of(entry).into_iter().collect::<Vec<_>>(),
            },
        )
        .collect()
}

/// Arguments added to the command line of an agent started by registry name (`spec`): acp-child
/// runs its model backend only when told a model at start, so a model asked of it is also given
/// as `--model`, where it becomes the session's current value (the `model` config option then
/// confirms it). An agent given as a command line is left as written.
#[must_use]
pub fn launch_args(wants: &Wants, spec: Option<&crate::registry::AgentSpec>) -> Vec<String> {
    match (&wants.model, spec) {
        (Some(model), Some(spec)) if spec.name == crate::registry::ACP_CHILD => {
            vec!["--model".to_owned(), model.clone()]
        }
        _ => Vec::new(),
    }
}

/// The persona of a preamble ([`SessionPlan::preamble`]) with its variables substituted by the
/// one rule ([`template`]): `{{cwd}}` is the session's directory, `{{model}}` the model asked for
/// (`wanted`), else the current value of the agent's model config option (from `session/new`'s
/// `configOptions`); a variable without a value refuses the run, naming it.
pub fn render_persona(
    persona: &str,
    cwd: &str,
    wanted: Option<&str>,
    config_options: Option<&Value>,
    agent: &str,
) -> Result<String, Refusal> {
    let refuse = |reason: String| Refusal {
        capability: "persona",
        agent: agent.to_owned(),
        reason,
    };
    let parsed = template::Template::parse(persona)
        .map_err(|error| refuse(format!("was given a {error}")))?;
    let current = config_options
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
        .and_then(|o| o.get("currentValue"))
        .and_then(Value::as_str);
    let values = template::Values {
        model: wanted.or(current),
        cwd: Some(cwd),
    };
    parsed.render(values, "").map_err(|unbound| {
        refuse(format!(
            "takes no system prompt and names no current model (no session config option of \
                 category model), so the persona preamble's {} has no value; pass --model (or \
                 run.model in the definition), or drop it from the persona",
            unbound.variable.reference()
        ))
    })
}

/// The first prompt of an agent that takes no system prompt: the persona, clearly delimited, then
/// the task.
#[must_use]
pub fn preamble(persona: &str, task: &str) -> String {
    format!(
        "<persona>\nAct as the following persona for this whole session.\n\n{persona}\n</persona>\n\n{task}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn persona(mode: PersonaMode) -> Wants {
        Wants {
            persona: Some(Persona {
                text: "P".into(),
                mode,
            }),
            ..Wants::default()
        }
    }

    fn offers(init: &Value) -> Offers {
        Offers::from_initialize(init)
    }

    #[test]
    fn offers_are_read_leniently() {
        let full = offers(&json!({"agentCapabilities": {
            "sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}},
            "_meta": {EXTENSION: {"version": 1, "fields": ["tools", 3]}},
        }}));
        assert_eq!(
            full,
            Offers {
                system_prompt: true,
                system_prompt_override: true,
                extension_fields: Some(vec!["tools".into()]),
            }
        );
        assert_eq!(offers(&json!({})), Offers::default());
        let odd = offers(&json!({"agentCapabilities": {
            "sessionCapabilities": {"systemPrompt": "yes"},
            "_meta": {EXTENSION: {"version": 2, "fields": ["tools"]}},
        }}));
        assert_eq!(odd, Offers::default(), "another version is not ours");
    }

    #[test]
    fn a_persona_is_a_system_prompt_or_degrades_only_in_append_mode() {
        let both = offers(&json!({"agentCapabilities": {
            "sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}}}}));
        let append_only = offers(&json!({"agentCapabilities": {
            "sessionCapabilities": {"systemPrompt": {}}}}));
        let none = Offers::default();
        let plan = plan_session(&persona(PersonaMode::Override), None, &both, "a").unwrap();
        assert_eq!(
            plan.system_prompt,
            Some(SystemPrompt {
                text: "P".into(),
                replace: true
            })
        );
        assert_eq!(plan.persona_delivery, Some(PersonaDelivery::SystemPrompt));
        let plan = plan_session(&persona(PersonaMode::Strict), None, &append_only, "a").unwrap();
        assert_eq!(plan.system_prompt.map(|s| s.replace), Some(false));
        let plan = plan_session(&persona(PersonaMode::Append), None, &none, "a").unwrap();
        assert_eq!(
            (plan.preamble.as_deref(), plan.persona_delivery),
            (Some("P"), Some(PersonaDelivery::Preamble))
        );
        assert!(plan.system_prompt.is_none() && plan.meta.is_none());
        let refused =
            plan_session(&persona(PersonaMode::Strict), None, &none, "codex").unwrap_err();
        assert_eq!(refused.capability, "persona");
        assert!(
            refused
                .to_string()
                .starts_with("capability persona: agent codex takes no system prompt"),
            "{refused}"
        );
        assert!(plan_session(&persona(PersonaMode::Override), None, &append_only, "a").is_err());
        assert!(plan_session(&persona(PersonaMode::Override), None, &none, "a").is_err());
        assert_eq!(
            plan_session(&Wants::default(), None, &none, "a"),
            Ok(SessionPlan::default())
        );
    }

    #[test]
    fn a_tool_filter_needs_the_extension_field() {
        let wants = Wants {
            tools: Some(ToolFilter {
                allow: Some(vec!["read_file".into()]),
                deny: vec!["run_command".into()],
            }),
            ..Wants::default()
        };
        let refused = plan_session(&wants, None, &Offers::default(), "mock").unwrap_err();
        assert_eq!(refused.capability, "tools");
        assert!(
            refused
                .to_string()
                .starts_with("capability tools: agent mock cannot take a tool filter")
        );
        let other_fields = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": []}}}}));
        assert!(plan_session(&wants, None, &other_fields, "a").is_err());
        let honoured = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": ["tools"]}}}}));
        let plan = plan_session(&wants, None, &honoured, "a").unwrap();
        assert_eq!(
            Value::Object(plan.meta.unwrap()),
            json!({EXTENSION: {"version": 1, "tools": {"allow": ["read_file"], "deny": ["run_command"]}}})
        );
    }

    #[test]
    fn an_explicit_depth_cap_needs_the_extension_field() {
        let refused =
            plan_session(&Wants::default(), Some(2), &Offers::default(), "mock").unwrap_err();
        assert_eq!(refused.capability, "depth");
        assert!(
            refused
                .to_string()
                .starts_with("capability depth: agent mock cannot take a delegation depth cap (2)"),
            "{refused}"
        );
        let tools_only = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": ["tools"]}}}}));
        assert!(plan_session(&Wants::default(), Some(0), &tools_only, "a").is_err());
        let honoured = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": ["maxDepth"]}}}}));
        let plan = plan_session(&Wants::default(), Some(0), &honoured, "a").unwrap();
        assert_eq!(
            Value::Object(plan.meta.unwrap()),
            json!({EXTENSION: {"version": 1, "maxDepth": 0}})
        );
        // No cap asked for: nothing sent, nothing refused.
        assert_eq!(
            plan_session(&Wants::default(), None, &Offers::default(), "a"),
            Ok(SessionPlan::default())
        );
    }

    #[test]
    fn a_budget_goes_only_to_an_agent_that_holds_it_and_is_never_a_refusal() {
        let budget = crate::usage::Budget {
            tokens: Some(20),
            cost: None,
        };
        let mut plan = SessionPlan::default();
        plan_budget(&mut plan, budget, &Offers::default());
        assert_eq!(plan, SessionPlan::default(), "not honoured: nothing sent");
        let honoured = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": ["budget", "maxDepth"]}}}}));
        plan_budget(&mut plan, crate::usage::Budget::default(), &honoured);
        assert!(plan.meta.is_none(), "no budget: nothing sent");
        plan_budget(&mut plan, budget, &honoured);
        assert_eq!(
            Value::Object(plan.meta.clone().unwrap()),
            json!({EXTENSION: {"version": 1, "budget": {"tokens": 20}}})
        );
        let mut capped = plan_session(&Wants::default(), Some(1), &honoured, "a").unwrap();
        plan_budget(&mut capped, budget, &honoured);
        assert_eq!(
            Value::Object(capped.meta.unwrap()),
            json!({EXTENSION: {"version": 1, "maxDepth": 1, "budget": {"tokens": 20}}})
        );
    }

    #[test]
    fn an_output_schema_goes_to_a_capture_tool_or_into_the_prompt() {
        let wants = Wants {
            output: Some(OutputSpec {
                schema: json!({"type": "object"}),
                retries: 2,
            }),
            ..Wants::default()
        };
        let plan = plan_session(&wants, None, &Offers::default(), "a").unwrap();
        assert_eq!(plan.structured_via, Some(StructuredVia::Text));
        assert!(plan.meta.is_none());
        assert_eq!(
            plan.output_instruction,
            Some(structured::instruction(&json!({"type": "object"})))
        );
        let capture = offers(&json!({"agentCapabilities": {
            "_meta": {EXTENSION: {"version": 1, "fields": ["outputSchema"]}}}}));
        let plan = plan_session(&wants, None, &capture, "a").unwrap();
        assert_eq!(plan.structured_via, Some(StructuredVia::CaptureTool));
        assert!(plan.output_instruction.is_none());
        assert_eq!(
            Value::Object(plan.meta.unwrap()),
            json!({EXTENSION: {"version": 1, "outputSchema": {"type": "object"}}})
        );
    }

    #[test]
    fn a_model_is_one_of_the_offered_values() {
        let options = json!([
            {"id": "mode", "category": "mode", "type": "select", "currentValue": "a", "options": []},
            {"id": "llm", "category": "model", "type": "select", "currentValue": "m1",
             "options": [{"value": "m1", "name": "M1"},
                         {"group": "g", "name": "G", "options": [{"value": "m2", "name": "M2"}]}]},
        ]);
        assert_eq!(plan_model("m1", Some(&options), "a"), Ok(None));
        assert_eq!(
            plan_model("m2", Some(&options), "a"),
            Ok(Some(ModelChoice {
                config_id: "llm".into(),
                value: "m2".into()
            }))
        );
        assert_eq!(
            plan_model("m3", Some(&options), "mock")
                .unwrap_err()
                .to_string(),
            "capability model: agent mock does not offer model m3; it offers: m1, m2"
        );
        assert!(
            plan_model("m1", None, "codex")
                .unwrap_err()
                .to_string()
                .starts_with("capability model: agent codex offers no session config option")
        );
        let empty = json!([{"id": "llm", "category": "model", "type": "select", "options": []}]);
        assert_eq!(
            plan_model("m1", Some(&empty), "mock")
                .unwrap_err()
                .to_string(),
            "capability model: agent mock does not offer model m1; it offers: none"
        );
    }

    #[test]
    fn tool_filters_allow_deny_and_check_names() {
        let filter = ToolFilter {
            allow: Some(vec!["a".into(), "b".into()]),
            deny: vec!["b".into()],
        };
        assert!(filter.allows("a") && !filter.allows("b") && !filter.allows("c"));
        assert!(ToolFilter::default().allows("anything"));
        let none = ToolFilter {
            allow: Some(Vec::new()),
            deny: Vec::new(),
        };
        assert!(!none.allows("a"));
        assert_eq!(filter.check(&["a", "b"]), Ok(()));
        assert_eq!(
            filter.check(&["a"]).map_err(|err| err.to_string()),
            Err("unknown tool name b; the tools are a".into())
        );
        assert_eq!(
            filter.check(&["c"]).unwrap_err().to_string(),
            "unknown tool names a, b; the tools are c"
        );
    }

    #[test]
    fn acp_child_by_name_is_told_the_model_at_start() {
        let wants = Wants {
            model: Some("m".into()),
            ..Wants::default()
        };
        let child = crate::registry::find("acp-child");
        assert_eq!(launch_args(&wants, child), ["--model", "m"]);
        assert!(launch_args(&wants, crate::registry::find("codex")).is_empty());
        assert!(launch_args(&wants, None).is_empty());
        assert!(launch_args(&Wants::default(), child).is_empty());
    }

    #[test]
    fn a_preamble_persona_gets_the_cwd_and_the_model_asked_for_or_current() {
        let options = serde_json::json!([{"id": "m", "category": "model", "type": "select",
            "currentValue": "fast", "options": [{"value": "fast"}, {"value": "slow"}]}]);
        let persona = "Be {{model}} in {{ cwd }}.";
        assert_eq!(
            render_persona(persona, "/p", Some("slow"), Some(&options), "a"),
            Ok("Be slow in /p.".to_owned())
        );
        assert_eq!(
            render_persona(persona, "/p", None, Some(&options), "a"),
            Ok("Be fast in /p.".to_owned())
        );
        assert_eq!(
            render_persona("In {{cwd}}.", "/p", None, None, "a"),
            Ok("In /p.".to_owned())
        );
        assert_eq!(
            render_persona(persona, "/p", None, None, "codex")
                .unwrap_err()
                .to_string(),
            "capability persona: agent codex takes no system prompt and names no current model \
             (no session config option of category model), so the persona preamble's {{model}} \
             has no value; pass --model (or run.model in the definition), or drop it from the \
             persona"
        );
        assert_eq!(
            render_persona("{{x}}", "/p", None, None, "a")
                .unwrap_err()
                .reason,
            "was given a persona template: unknown variable `{{x}}` (the variables are \
             {{model}}, {{cwd}})"
        );
    }

    #[test]
    fn the_preamble_is_delimited() {
        assert_eq!(
            preamble("Be terse.", "task"),
            "<persona>\nAct as the following persona for this whole session.\n\nBe terse.\n</persona>\n\ntask"
        );
    }
}
