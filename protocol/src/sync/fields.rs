//! The fields most agents share ([`Field`]: model, tools, readonly, background) and which of them
//! a target drops: what `acp-host sync --check` warns about, per target.
//!
//! A definition expresses a field where it sets it: in its `run` table (`run.model`,
//! `run.tools`, `run.denyTools`) or in any agent's options, through the option the registry
//! names as that agent's equivalent ([`registry::Equivalents`]; a `false` switch expresses
//! nothing). A target drops the field when it has no equivalent at all: the file written for it
//! cannot say it, so the subagent there behaves differently (a Codex agent with every tool where
//! `run.tools` allows two). A target that has an equivalent the definition left unset drops
//! nothing: leaving it unset is the definition's choice. Pure: the definitions and the registry
//! view decide; nothing here reads a file.

use schemars::JsonSchema;
use serde::Serialize;

use super::{Readiness, RegistryView};
use crate::definition::{Definition, OptionValue};
use crate::registry::{self, Field};

/// One field a target cannot hold for one subagent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dropped {
    pub agent: &'static str,
    /// The subagent name.
    pub name: String,
    pub field: Field,
    /// Where the definition sets it (`run.tools`, `cursor.readonly`), in the order found.
    pub set_by: Vec<String>,
}

impl Dropped {
    /// The warning `sync --check` prints.
    #[must_use]
    pub fn message(&self) -> String {
        format!(
            "{}/{}: {} (set by {}) has no equivalent in {}; its file is written without it",
            self.agent,
            self.name,
            self.field.as_str(),
            self.set_by.join(", "),
            self.agent
        )
    }
}

/// Where `definition` sets `field`.
fn set_by(definition: &Definition, field: Field) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(run) = &definition.run {
        match field {
            Field::Model if run.model.is_some() => found.push("run.model".to_owned()),
            Field::Tools => {
                if run.tools.is_some() {
                    found.push("run.tools".to_owned());
                }
                if !run.deny_tools.is_empty() {
                    found.push("run.denyTools".to_owned());
                }
            }
            _ => {}
        }
    }
    // Each agent's value for its equivalent of `field` (the options were validated against the
    // registry, so every agent named there takes definitions).
    let set = definition.options.iter().filter_map(|(agent, options)| {
        let option = registry::find_sync(agent)?.1.equivalents.get(field)?;
        Some((agent, option, options.get(option)?))
    });
    for (agent, option, value) in set {
        if *value != OptionValue::Bool(false) {
            found.push(format!("{agent}.{option}"));
        }
    }
    found
}

/// Every field a ready target of `view` drops for a definition it is written for, in the view's
/// agent order, then by subagent name, then field order.
#[must_use]
pub fn dropped(definitions: &[Definition], view: &RegistryView) -> Vec<Dropped> {
    let mut out = Vec::new();
    for agent in view
        .agents
        .iter()
        .filter(|a| a.readiness == Readiness::Ready && view.location(a).is_some())
    {
        for definition in definitions.iter().filter(|d| d.targets(agent.spec.name)) {
            for field in Field::ALL {
                if agent.target.equivalents.get(field).is_some() {
                    continue;
                }
                let set_by = set_by(definition, field);
                if !set_by.is_empty() {
                    out.push(Dropped {
                        agent: agent.spec.name,
                        name: definition.name.clone(),
                        field,
                        set_by,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::registry::{AgentAvailability, Scope};
    use crate::sync::AgentView;

    fn definition(frontmatter: &str) -> Definition {
        crate::definition::parse(
            "review.md",
            format!("---\ndescription: d\n{frontmatter}---\nBody.\n").as_bytes(),
        )
        .unwrap()
    }

    fn view(scope: Scope, agents: &[(&str, Readiness)]) -> RegistryView {
        RegistryView {
            scope,
            base: PathBuf::from("/h"),
            agents: agents
                .iter()
                .map(|(name, readiness)| {
                    let (spec, target) = registry::find_sync(name).unwrap();
                    AgentView {
                        spec,
                        target,
                        availability: AgentAvailability::MarkerDir(".x".into()),
                        readiness: readiness.clone(),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn a_target_without_an_equivalent_drops_what_the_definition_sets_elsewhere() {
        let d = definition(
            "agents: [codex, cursor, kiro]\nrun: {model: m, tools: [read], denyTools: [shell]}\ncursor: {readonly: true, is_background: false}\n",
        );
        let ready = view(
            Scope::User,
            &[
                ("codex", Readiness::Ready),
                ("cursor", Readiness::Ready),
                ("kiro", Readiness::Ready),
            ],
        );
        let dropped = dropped(std::slice::from_ref(&d), &ready);
        let found: Vec<(&str, Field, Vec<String>)> = dropped
            .iter()
            .map(|d| (d.agent, d.field, d.set_by.clone()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "codex",
                    Field::Tools,
                    vec!["run.tools".to_owned(), "run.denyTools".to_owned()]
                ),
                ("codex", Field::Readonly, vec!["cursor.readonly".to_owned()]),
                (
                    "cursor",
                    Field::Tools,
                    vec!["run.tools".to_owned(), "run.denyTools".to_owned()]
                ),
                ("kiro", Field::Readonly, vec!["cursor.readonly".to_owned()]),
            ],
            "a false switch sets nothing; model has an equivalent everywhere"
        );
        assert_eq!(
            dropped[1].message(),
            "codex/review: readonly (set by cursor.readonly) has no equivalent in codex; its \
             file is written without it"
        );
    }

    #[test]
    fn a_field_is_set_in_the_run_table_or_through_an_agents_equivalent() {
        let d = definition(
            "agents: [codex]\nrun: {model: m, denyTools: [shell]}\ncodex: {model: o3}\ncursor: {model: fast, is_background: true}\nopencode: {model: x}\n",
        );
        assert_eq!(
            set_by(&d, Field::Model),
            ["run.model", "codex.model", "cursor.model", "opencode.model"]
        );
        assert_eq!(set_by(&d, Field::Tools), ["run.denyTools"]);
        assert_eq!(set_by(&d, Field::Background), ["cursor.is_background"]);
        assert!(set_by(&d, Field::Readonly).is_empty());
        assert!(set_by(&definition("agents: [codex]\n"), Field::Model).is_empty());
    }

    #[test]
    fn only_ready_targets_in_their_scope_and_their_definitions_are_checked() {
        let d = definition("agents: [codex, grok]\ngrok: {tools: [read]}\nrun: {model: m}\n");
        let other = definition("agents: [grok]\n");
        let skipped = view(
            Scope::User,
            &[("codex", Readiness::Skip("not installed".into()))],
        );
        assert!(dropped(std::slice::from_ref(&d), &skipped).is_empty());
        // grok has no project scope: nothing is written, so nothing is dropped.
        let project = view(Scope::Project, &[("grok", Readiness::Ready)]);
        assert!(dropped(std::slice::from_ref(&d), &project).is_empty());
        let user = view(Scope::User, &[("codex", Readiness::Ready)]);
        let found = dropped(&[d, other], &user);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].field, found[0].set_by.as_slice()),
            (Field::Tools, &["grok.tools".to_owned()][..])
        );
        // A run-only definition with a run model: every target has a model.
        let run_only = definition("run: {model: m}\n");
        assert!(dropped(&[run_only], &user).is_empty());
    }
}
