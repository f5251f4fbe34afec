//! `acp-host sync --adopt AGENT`: an agent's own subagent file read back into a canonical
//! definition, the mapping of [`super::render`] in reverse.
//!
//! Invariants: the canonical text [`import`] returns parses ([`crate::definition::parse`]) into
//! the same description, body and options the agent's file holds, wherever the canonical format
//! can hold them (rendering it again for the agent gives back the agent's fields); everything it
//! cannot hold (a field that is not one of the agent's options in the registry, a value of
//! another type, a `name` that differs from the file name) is listed in [`Imported::lost`], never
//! dropped silently. [`adopt_one`] decides what happens to one file: a file acp-host already
//! manages is not imported (its definition is canonical already), and an existing canonical file
//! is never replaced. Pure: the caller reads the files and writes the results.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::render::{self, inline, quote};
use crate::definition::{self, AgentOptions};
use crate::registry::{Frontmatter, SyncTarget, TargetFormat};

/// One agent file read back as a canonical definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The text of `subagents/<name>.md`.
    pub text: String,
    /// What the canonical definition cannot hold, one entry per field in the file's order
    /// (`temperature: not an option acp-host knows for gemini; dropped`).
    pub lost: Vec<String>,
}

/// Why an agent's file cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("is not UTF-8 text")]
    NotUtf8,
    #[error("has no frontmatter (a `---` line, YAML, a `---` line)")]
    NoFrontmatter,
    #[error("has invalid frontmatter: {0}")]
    Yaml(String),
    #[error("has frontmatter that is not a mapping of fields")]
    NotAMapping,
    #[error("is not valid TOML: {0}")]
    Toml(String),
    #[error("has no description; add one (what the subagent does), then adopt it")]
    NoDescription,
    #[error("has no instructions (its body is empty)")]
    EmptyBody,
    #[error(
        "is {0}'s shared file of many subagents; only dedicated files (one subagent each) are adopted"
    )]
    Shared(&'static str),
}

/// The first line of a body that carries a generated-file marker for `name` (ours, or Aikito's)
/// is not instructions: drop it.
fn without_marker<'a>(body: &'a str, name: &str) -> &'a str {
    let (first, rest) = body.split_once('\n').unwrap_or((body, ""));
    let ours = [render::marker(name), render::marker_of("aikito", name)]
        .iter()
        .any(|marker| first == format!("<!-- {marker} -->"));
    if ours { rest } else { body }
}

/// The fields and the body of an agent's file.
fn fields_and_body(
    agent: &'static str,
    format: TargetFormat,
    name: &str,
    text: &str,
) -> Result<(serde_json::Map<String, Value>, String), ImportError> {
    match format {
        TargetFormat::Markdown(_) => {
            let (frontmatter, body) =
                definition::split_frontmatter(text).ok_or(ImportError::NoFrontmatter)?;
            let value: Value = if frontmatter.trim().is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_saphyr::from_str(frontmatter).map_err(|e| ImportError::Yaml(e.to_string()))?
            };
            match value {
                Value::Object(fields) => Ok((fields, without_marker(body, name).to_owned())),
                _ => Err(ImportError::NotAMapping),
            }
        }
        TargetFormat::CodexToml => {
            let table: toml::Table = text
                .parse()
                .map_err(|e: toml::de::Error| ImportError::Toml(e.message().to_owned()))?;
            let mut fields: serde_json::Map<String, Value> = table
                .into_iter()
                .map(|(key, value)| (key, toml_to_json(value)))
                .collect();
            let body = match fields.remove("developer_instructions") {
                Some(Value::String(body)) => body,
                _ => String::new(),
            };
            Ok((fields, body))
        }
        TargetFormat::DshShared => Err(ImportError::Shared(agent)),
    }
}

/// A TOML value as JSON (dates become their text).
fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(n) => Value::from(n),
        toml::Value::Float(f) => Value::from(f),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(key, value)| (key, toml_to_json(value)))
                .collect(),
        ),
    }
}

/// Reads `agent`'s file for subagent `name` back into a canonical definition.
pub fn import(
    agent: &'static str,
    target: &SyncTarget,
    name: &str,
    contents: &[u8],
) -> Result<Imported, ImportError> {
    let text = std::str::from_utf8(contents).map_err(|_| ImportError::NotUtf8)?;
    let text = text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .replace("\r\n", "\n");
    let (fields, body) = fields_and_body(agent, target.format, name, &text)?;
    let mut description = None;
    let mut options = AgentOptions::new();
    let mut lost = Vec::new();
    for (key, value) in fields {
        let implied = match key.as_str() {
            "description" => match &value {
                Value::String(s) if !s.trim().is_empty() => {
                    description = Some(s.clone());
                    true
                }
                _ => false,
            },
            // The subagent's name is its file name; only an agent that takes `name` as an option
            // (github-copilot) keeps a different one.
            "name" => value.as_str() == Some(name),
            "mode" => {
                target.format == TargetFormat::Markdown(Frontmatter::DescriptionModeOptions)
                    && value.as_str() == Some("subagent")
            }
            _ => false,
        };
        if implied {
            continue;
        }
        match target.option(&key) {
            Some(spec) => match definition::parse_option(spec.kind, &value) {
                Some(parsed) => {
                    options.insert(key, parsed);
                }
                None => lost.push(format!(
                    "{key}: not {} as acp-host takes it for {agent}; dropped",
                    spec.kind.describe()
                )),
            },
            None if key == "name" => lost.push(format!(
                "name: {value} differs from the file name; the subagent is named {name}"
            )),
            None => lost.push(format!(
                "{key}: not an option acp-host knows for {agent}; dropped"
            )),
        }
    }
    let description = description.ok_or(ImportError::NoDescription)?;
    let body = definition::normalize_body(&body);
    if body.is_empty() {
        return Err(ImportError::EmptyBody);
    }
    let mut out = format!(
        "---\ndescription: {}\nagents: [{}]\n",
        quote(&description),
        quote(agent)
    );
    if !options.is_empty() {
        let entries: Vec<String> = options
            .iter()
            .map(|(key, value)| format!("{}: {}", quote(key), inline(value)))
            .collect();
        let _ = writeln!(out, "{agent}: {{{}}}", entries.join(", "));
    }
    let _ = write!(out, "---\n\n{body}\n");
    Ok(Imported { text: out, lost })
}

/// What `--adopt` does with one agent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AdoptAction {
    /// `subagents/<name>.md` is written from it.
    Create,
    /// `subagents/<name>.md` already says exactly this.
    Noop,
    /// `subagents/<name>.md` exists and says something else: never replaced (blocks the run).
    Conflict,
    /// The file carries acp-host's marker: its definition is canonical already.
    Managed,
    /// It cannot be read back (blocks the run).
    Error,
}

impl AdoptAction {
    /// Lowercase name as printed (its serialized name).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AdoptAction::Create => "create",
            AdoptAction::Noop => "noop",
            AdoptAction::Conflict => "conflict",
            AdoptAction::Managed => "managed",
            AdoptAction::Error => "error",
        }
    }
}

/// The verdict on one agent file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Adoption {
    pub action: AdoptAction,
    pub agent: &'static str,
    /// The subagent name.
    pub name: String,
    /// The agent's file.
    pub path: std::path::PathBuf,
    pub reason: String,
    /// The canonical file's text, for `create` (and `noop`).
    #[serde(skip)]
    pub text: Option<String>,
    /// What the canonical definition cannot hold ([`Imported::lost`]).
    pub lost: Vec<String>,
}

impl Adoption {
    /// Whether it holds the whole adoption back (nothing is written then).
    #[must_use]
    pub fn blocks(&self) -> bool {
        matches!(self.action, AdoptAction::Conflict | AdoptAction::Error)
    }
}

/// Decides what happens to `agent`'s file for `name` at `path`: `contents` as read (or why it
/// could not be), `canonical` the current `subagents/<name>.md`, if there is one.
#[must_use]
pub fn adopt_one(
    agent: &'static str,
    target: &SyncTarget,
    (name, path): (&str, &std::path::Path),
    contents: Result<&[u8], String>,
    canonical: Option<&[u8]>,
) -> Adoption {
    let verdict = |action, reason: String, text, lost| Adoption {
        action,
        agent,
        name: name.to_owned(),
        path: path.to_path_buf(),
        reason,
        text,
        lost,
    };
    let contents = match contents {
        Ok(contents) => contents,
        Err(reason) => return verdict(AdoptAction::Error, reason, None, Vec::new()),
    };
    if render::is_managed(target.format, name, contents) {
        let reason = format!("managed by acp-host already (from subagents/{name}.md)");
        return verdict(AdoptAction::Managed, reason, None, Vec::new());
    }
    let imported = match import(agent, target, name, contents) {
        Ok(imported) => imported,
        Err(e) => return verdict(AdoptAction::Error, e.to_string(), None, Vec::new()),
    };
    let (action, reason) = match canonical {
        None => (AdoptAction::Create, format!("becomes subagents/{name}.md")),
        Some(existing) if existing == imported.text.as_bytes() => (
            AdoptAction::Noop,
            format!("subagents/{name}.md says this already"),
        ),
        Some(_) => (
            AdoptAction::Conflict,
            format!("subagents/{name}.md exists and differs; not replaced (merge by hand)"),
        ),
    };
    verdict(action, reason, Some(imported.text), imported.lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::Definition;
    use crate::registry;

    const EXAMPLE: &str = include_str!("../../tests/golden/source/review.md");

    fn target(agent: &str) -> (&'static str, SyncTarget) {
        let (spec, target) = registry::find_sync(agent).unwrap();
        (spec.name, target)
    }

    fn imported(agent: &str, text: &str) -> Result<Imported, ImportError> {
        let (agent, target) = target(agent);
        import(agent, &target, "review", text.as_bytes())
    }

    fn canonical(text: &str) -> Definition {
        definition::parse("review.md", text.as_bytes()).unwrap()
    }

    /// Canonical -> every dedicated target -> adopted back: the same definition, field by field
    /// (for the one agent adopted from), and the same file when rendered again.
    #[test]
    fn every_dedicated_target_round_trips_back_to_its_canonical_definition() {
        let example = canonical(EXAMPLE);
        for (spec, target) in registry::sync_agents() {
            let agent = spec.name;
            let rendered = render::render_file(target.format, agent, &example);
            if target.format == TargetFormat::DshShared {
                let refused = import(agent, &target, "review", rendered.as_bytes());
                assert_eq!(refused, Err(ImportError::Shared("dsh")));
                continue;
            }
            let back = import(agent, &target, "review", rendered.as_bytes()).unwrap();
            assert!(back.lost.is_empty(), "{agent}: {:?}", back.lost);
            let adopted = canonical(&back.text);
            assert_eq!(adopted.description, example.description, "{agent}");
            assert_eq!(adopted.body, example.body, "{agent}");
            assert_eq!(adopted.agents, [agent], "{agent}");
            assert_eq!(
                adopted.options_for(agent),
                example.options_for(agent),
                "{agent}"
            );
            assert_eq!(
                render::render_file(target.format, agent, &adopted),
                rendered,
                "{agent}: rendering the adopted definition gives the file back"
            );
        }
    }

    #[test]
    fn what_the_canonical_format_cannot_hold_is_listed() {
        let back = imported(
            "gemini",
            "\u{feff}---\r\nname: other\r\ndescription: Audits\r\nkind: local\r\ntemperature: 0.2\r\nmax_turns: \"ten\"\r\ntools: [read_file]\r\n---\r\n\r\nAudit.\r\n",
        )
        .unwrap();
        assert_eq!(
            back.lost,
            [
                "name: \"other\" differs from the file name; the subagent is named review",
                "kind: not an option acp-host knows for gemini; dropped",
                "temperature: not an option acp-host knows for gemini; dropped",
                "max_turns: not a positive integer (unquoted) as acp-host takes it for gemini; dropped",
            ],
            "in the file's order"
        );
        assert_eq!(
            back.text,
            "---\ndescription: \"Audits\"\nagents: [\"gemini\"]\ngemini: {\"tools\": [\"read_file\"]}\n---\n\nAudit.\n"
        );
        // github-copilot keeps a different name as its own option; opencode's mode is implied.
        let copilot = imported(
            "github-copilot",
            "---\nname: Reviewer\ndescription: d\n---\nB\n",
        )
        .unwrap();
        assert!(copilot.lost.is_empty());
        assert_eq!(
            canonical(&copilot.text).options_for("github-copilot")["name"],
            definition::OptionValue::String("Reviewer".into())
        );
        let opencode =
            imported("opencode", "---\ndescription: d\nmode: subagent\n---\nB\n").unwrap();
        assert!(opencode.lost.is_empty(), "{:?}", opencode.lost);
        let primary = imported("opencode", "---\ndescription: d\nmode: primary\n---\nB\n").unwrap();
        assert_eq!(primary.lost.len(), 1, "another mode is not ours to keep");
        // A second description key cannot exist in YAML; a blank one is no description.
        assert_eq!(
            imported("claude-code", "---\ndescription: \" \"\n---\nB\n"),
            Err(ImportError::NoDescription)
        );
        // Aikito's marker is not instructions either.
        let aikito = format!(
            "---\ndescription: d\n---\n<!-- {} -->\n\nB\n",
            render::marker_of("aikito", "review")
        );
        assert_eq!(
            canonical(&imported("claude-code", &aikito).unwrap().text).body,
            "B"
        );
    }

    #[test]
    fn unreadable_files_are_errors_that_name_the_problem() {
        let (agent, pi) = target("pi");
        assert_eq!(
            import(agent, &pi, "review", b"\xff"),
            Err(ImportError::NotUtf8)
        );
        for (text, error) in [
            ("no fence\n", ImportError::NoFrontmatter),
            ("---\n- a list\n---\nB\n", ImportError::NotAMapping),
            ("---\ndescription: d\n---\n\n", ImportError::EmptyBody),
            ("---\n---\nB\n", ImportError::NoDescription),
        ] {
            assert_eq!(imported("pi", text), Err(error.clone()), "{text:?}");
            assert!(!error.to_string().is_empty());
        }
        assert!(matches!(
            imported("pi", "---\nkey: [unclosed\n---\nB\n"),
            Err(ImportError::Yaml(_))
        ));
        for (error, says) in [
            (ImportError::NotUtf8, "is not UTF-8 text"),
            (ImportError::Yaml("x".into()), "has invalid frontmatter: x"),
            (ImportError::Toml("y".into()), "is not valid TOML: y"),
            (
                ImportError::Shared("dsh"),
                "is dsh's shared file of many subagents; only dedicated files (one subagent each) are adopted",
            ),
        ] {
            assert_eq!(error.to_string(), says);
        }
        assert!(matches!(
            imported("codex", "name = \n"),
            Err(ImportError::Toml(_))
        ));
        assert_eq!(
            imported("codex", "description = \"d\"\n"),
            Err(ImportError::EmptyBody)
        );
        // TOML's other value kinds are kept as JSON (and dropped as unknown fields).
        let codex = imported(
            "codex",
            "description = \"d\"\ndeveloper_instructions = \"B\"\nn = 1\nf = 1.5\nb = true\nwhen = 1979-05-27\nlist = [1]\n[t]\nk = \"v\"\n",
        )
        .unwrap();
        assert_eq!(codex.lost.len(), 6, "{:?}", codex.lost);
    }

    #[test]
    fn an_adoptions_action_prints_as_it_serializes() {
        for action in [
            AdoptAction::Create,
            AdoptAction::Noop,
            AdoptAction::Conflict,
            AdoptAction::Managed,
            AdoptAction::Error,
        ] {
            assert_eq!(serde_json::to_value(action).unwrap(), action.as_str());
        }
    }

    #[test]
    fn adopting_one_file_never_replaces_a_canonical_one() {
        let (agent, claude) = target("claude-code");
        let at = (
            "review",
            std::path::Path::new("/h/.claude/agents/review.md"),
        );
        let file = b"---\nname: review\ndescription: d\nmodel: sonnet\n---\nB\n";
        let created = adopt_one(agent, &claude, at, Ok(file), None);
        assert_eq!(created.action, AdoptAction::Create);
        assert_eq!(created.path, at.1);
        assert!(!created.blocks());
        let text = created.text.clone().unwrap();
        let again = adopt_one(agent, &claude, at, Ok(file), Some(text.as_bytes()));
        assert_eq!(again.action, AdoptAction::Noop);
        let other = adopt_one(agent, &claude, at, Ok(file), Some(b"mine"));
        assert_eq!(other.action, AdoptAction::Conflict);
        assert!(other.blocks());
        let unreadable = adopt_one(agent, &claude, at, Err("denied".into()), None);
        assert_eq!(
            (unreadable.action, unreadable.reason.as_str()),
            (AdoptAction::Error, "denied")
        );
        assert!(unreadable.blocks());
        let broken = adopt_one(agent, &claude, at, Ok(b"nothing"), None);
        assert_eq!(broken.action, AdoptAction::Error);
        let ours = render::render_file(claude.format, agent, &canonical(&text));
        let managed = adopt_one(agent, &claude, at, Ok(ours.as_bytes()), None);
        assert_eq!(managed.action, AdoptAction::Managed);
        assert_eq!(managed.text, None);
    }
}
