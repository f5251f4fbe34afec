//! The persona: the system prompt sent first in every model request.
//!
//! A persona is a template with two variables, `{{model}}` and `{{cwd}}` (the model name and the
//! session directory), by the one rule of `protocol::capabilities::template` (acp-host's persona
//! preamble uses it too). Variables are strict: an unknown name (`{{modle}}`) or an unclosed `{{`
//! is an error when the template is read (a `--persona` file at start-up, a session's system
//! prompt at `session/new`), never at rendering; substituted values are never scanned again, and
//! single braces are plain text (a persona may contain code). Without `--persona FILE` the built-in
//! persona is used; it names only the tools the session's filter lets through, and says the user
//! approves writes and commands only when a tool that writes or runs a command is one of them. A
//! session's system prompt goes before it, as the first section of the assembled prompt (`append`:
//! identity first, then the agent's guidance and tools, then a structured-output instruction), or
//! replaces it (`override`): [`Persona::with_session`]. `{{{{` is a literal `{{`. A persona that
//! is empty (or only whitespace: an empty `--persona` file) sends no system message at all, and
//! appending it adds no separator.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use protocol::capabilities::ToolFilter;
use thiserror::Error;

/// The built-in persona's opening; the tools it names follow ([`tools_sentence`]), then
/// [`DEFAULT_TAIL`].
const DEFAULT_HEAD: &str = "\
You are acp-child, a careful coding agent running as the model {{model}}, working in the directory {{cwd}}.
You help the user with software tasks in that directory";

/// The built-in persona's sentence on approvals, after the tools, when one of them needs it
/// (a write or a command).
const APPROVALS: &str = " The user approves each write and command; if a tool result says \
\"permission denied by the user\", do not retry it, explain what you wanted to do instead.";

/// The tools whose calls the user approves: [`APPROVALS`] is said only when one is offered.
const APPROVED_TOOLS: [&str; 3] = ["write_file", "edit_file", "run_command"];

/// The built-in persona's close.
const DEFAULT_TAIL: &str = " Be concise: say what you did and what you found.";

/// The file tools the built-in persona names, in groups, each with what it is for.
const TOOL_GROUPS: [(&[&str], &str); 3] = [
    (&["read_file", "list_dir", "search"], "to look around"),
    (&["write_file", "edit_file"], "to change files"),
    (
        &["run_command"],
        "to run shell commands (builds, tests, git)",
    ),
];

use protocol::capabilities::template::{self, Template, VARIABLES, Variable};

/// The persona file could not be read, or a template is malformed.
#[derive(Debug, Error)]
pub enum PersonaError {
    #[error("cannot read the persona file {}; pass a readable UTF-8 text file to --persona", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("persona template: {problem} (the variables are {VARIABLES})")]
    Template { problem: String },
    #[error("persona file {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: Box<PersonaError>,
    },
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Model,
    Cwd,
    /// The built-in persona's sentence naming the tools a session's filter lets through (no
    /// template can write it).
    Tools,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Persona {
    pieces: Vec<Piece>,
}

impl Default for Persona {
    /// The built-in persona: it names only the tools a session's filter lets through.
    fn default() -> Self {
        let mut pieces = Self::new(DEFAULT_HEAD).map_or_else(
            |_| vec![Piece::Text(DEFAULT_HEAD.to_owned())],
            |head| head.pieces,
        );
        pieces.push(Piece::Tools);
        pieces.push(Piece::Text(DEFAULT_TAIL.to_owned()));
        Self { pieces }
    }
}

/// The built-in persona's sentence naming the tools `allows` lets through, and how to use
/// `edit_file` when it is one of them; without any, the sentence just ends.
fn tools_sentence(allows: &dyn Fn(&str) -> bool, cwd: &str) -> String {
    let clauses: Vec<String> = TOOL_GROUPS
        .iter()
        .filter_map(|(tools, purpose)| {
            let tools: Vec<&str> = tools.iter().copied().filter(|tool| allows(tool)).collect();
            let named = match tools.as_slice() {
                [] => return None,
                [one] => (*one).to_owned(),
                [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
            };
            Some(format!("{named} {purpose}"))
        })
        .collect();
    if clauses.is_empty() {
        return ".".to_owned();
    }
    let approvals = if APPROVED_TOOLS.iter().any(|tool| allows(tool)) {
        APPROVALS
    } else {
        ""
    };
    let mut sentence = format!(", using the tools you are given:\n{}.", clauses.join("; "));
    let _ = write!(
        sentence,
        " Paths are relative to {cwd}; you cannot reach outside it."
    );
    if allows("edit_file") {
        let read_first = if allows("read_file") {
            "Read a file before editing it; "
        } else {
            ""
        };
        let _ = write!(
            sentence,
            "\n{read_first}edit_file replaces one exact, unique piece of text."
        );
    }
    sentence.push_str(approvals);
    sentence
}

impl Persona {
    /// Parses a template; every `{{` must open a known variable.
    pub(crate) fn new(text: &str) -> Result<Self, PersonaError> {
        let parsed = Template::parse(text).map_err(|error| template_error(error.problem))?;
        let pieces = parsed
            .pieces
            .into_iter()
            .map(|piece| match piece {
                template::Piece::Text(text) => Piece::Text(text),
                template::Piece::Variable(Variable::Model) => Piece::Model,
                template::Piece::Variable(Variable::Cwd) => Piece::Cwd,
            })
            .collect();
        Ok(Self { pieces })
    }

    pub(crate) fn load(path: &Path) -> Result<Self, PersonaError> {
        let text = std::fs::read_to_string(path).map_err(|source| PersonaError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(&text).map_err(|source| PersonaError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// This persona with a session's system prompt: the assembled prompt's sections in order,
    /// the session's persona first (identity), then this one (the agent's own guidance and its
    /// tools), `replace` false; or the session's instead of this one.
    #[must_use]
    pub(crate) fn with_session(&self, session: Option<&SessionPersona>) -> Persona {
        match session {
            None => self.clone(),
            Some(session) if session.replace => session.persona.clone(),
            Some(session) if session.persona.is_blank() => self.clone(),
            Some(session) if self.is_blank() => session.persona.clone(),
            Some(session) => {
                let mut pieces = session.persona.pieces.clone();
                pieces.push(Piece::Text("\n\n".to_owned()));
                pieces.extend(self.pieces.iter().cloned());
                Persona { pieces }
            }
        }
    }

    /// Whether it renders to nothing but whitespace, whatever the model, directory and tools.
    fn is_blank(&self) -> bool {
        self.pieces
            .iter()
            .all(|piece| matches!(piece, Piece::Text(text) if text.trim().is_empty()))
    }

    /// The system prompt for `model` working in `cwd`, naming only the tools `tools` lets
    /// through (all without a filter).
    #[must_use]
    pub(crate) fn render(&self, model: &str, cwd: &Path, tools: Option<&ToolFilter>) -> String {
        let cwd = cwd.display().to_string();
        let allows = |name: &str| tools.is_none_or(|filter| filter.allows(name));
        let mut text = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(piece) => text.push_str(piece),
                Piece::Model => text.push_str(model),
                Piece::Cwd => text.push_str(&cwd),
                Piece::Tools => text.push_str(&tools_sentence(&allows, &cwd)),
            }
        }
        text
    }
}

/// A session's system prompt (`session/new`'s `systemPrompt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionPersona {
    pub(crate) persona: Persona,
    /// ACP's `override` mode: it replaces the agent's persona.
    pub(crate) replace: bool,
    /// The template as the client sent it (saved with the session).
    pub(crate) template: String,
}

fn template_error(problem: String) -> PersonaError {
    PersonaError::Template { problem }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str) -> String {
        Persona::new(template)
            .unwrap()
            .render("deepseek-chat", Path::new("/p"), None)
    }

    #[test]
    fn variables_are_substituted_once_and_single_braces_kept() {
        assert_eq!(
            render("I am {{model}} in {{ cwd }}; fn f() { {x} } {{model}}"),
            "I am deepseek-chat in /p; fn f() { {x} } deepseek-chat"
        );
        // A value that looks like a variable is not substituted again.
        assert_eq!(
            Persona::new("in {{cwd}}")
                .unwrap()
                .render("m", Path::new("/{{model}}"), None),
            "in /{{model}}"
        );
    }

    #[test]
    fn unknown_or_unclosed_variables_are_errors() {
        assert_eq!(
            Persona::new("hi {{modle}}").unwrap_err().to_string(),
            "persona template: unknown variable `{{modle}}` (the variables are {{model}}, {{cwd}})"
        );
        assert_eq!(
            Persona::new("ab {{model").unwrap_err().to_string(),
            "persona template: `{{` at byte 3 is never closed; write `{{{{` for a literal `{{` \
             (the variables are {{model}}, {{cwd}})"
        );
    }

    #[test]
    fn a_session_persona_appends_or_replaces() {
        let base = Persona::new("base {{model}}").unwrap();
        let session = |replace| SessionPersona {
            persona: Persona::new("extra in {{cwd}}").unwrap(),
            replace,
            template: "extra in {{cwd}}".into(),
        };
        assert_eq!(
            base.with_session(Some(&session(false)))
                .render("m", Path::new("/w"), None),
            "extra in /w\n\nbase m"
        );
        assert_eq!(
            base.with_session(Some(&session(true)))
                .render("m", Path::new("/w"), None),
            "extra in /w"
        );
        assert_eq!(base.with_session(None), base);
    }

    #[test]
    fn an_empty_persona_renders_nothing_and_appends_without_a_separator() {
        let empty = Persona::new(" \n").unwrap();
        assert!(empty.is_blank());
        assert!(Persona::new("").unwrap().is_blank());
        assert!(!Persona::new("{{cwd}}").unwrap().is_blank());
        assert!(!Persona::default().is_blank());
        let session = |text: &str| SessionPersona {
            persona: Persona::new(text).unwrap(),
            replace: false,
            template: text.into(),
        };
        let base = Persona::new("base").unwrap();
        assert_eq!(base.with_session(Some(&session(""))), base);
        assert_eq!(
            empty
                .with_session(Some(&session("only {{model}}")))
                .render("m", Path::new("/w"), None),
            "only m"
        );
        assert_eq!(
            Persona::new("{{{{model}} is {{model}}")
                .unwrap()
                .render("m", Path::new("/w"), None),
            "{{model}} is m"
        );
    }

    #[test]
    fn the_default_names_model_cwd_and_tools() {
        let text = Persona::default().render("m", Path::new("/w"), None);
        assert!(text.contains("model m") && text.contains("directory /w"));
        assert!(!text.contains("{{"));
        let tools = crate::backend::model::tools::Toolbox::standard(
            std::time::Duration::from_secs(1),
            &protocol::sandbox::Policy::default(),
            false,
            false,
        );
        for tool in tools.names() {
            assert!(text.contains(tool), "{tool}");
        }
    }

    #[test]
    fn the_default_unfiltered_is_the_whole_text() {
        let template = "\
You are acp-child, a careful coding agent running as the model {{model}}, working in the directory {{cwd}}.
You help the user with software tasks in that directory, using the tools you are given:
read_file, list_dir and search to look around; write_file and edit_file to change files; run_command \
to run shell commands (builds, tests, git). Paths are relative to {{cwd}}; you cannot reach outside it.
Read a file before editing it; edit_file replaces one exact, unique piece of text. The user approves \
each write and command; if a tool result says \"permission denied by the user\", do not retry it, \
explain what you wanted to do instead. Be concise: say what you did and what you found.";
        assert_eq!(
            Persona::default().render("m", Path::new("/w"), None),
            Persona::new(template)
                .unwrap()
                .render("m", Path::new("/w"), None)
        );
    }

    #[test]
    fn the_default_names_only_the_tools_the_filter_lets_through() {
        let filter = ToolFilter {
            allow: None,
            deny: vec![
                "write_file".into(),
                "edit_file".into(),
                "run_command".into(),
            ],
        };
        let text = Persona::default().render("m", Path::new("/w"), Some(&filter));
        assert!(
            text.contains(
                "in that directory, using the tools you are given:\nread_file, list_dir and \
                 search to look around. Paths are relative to /w; you cannot reach outside it. \
                 Be concise"
            ),
            "{text}"
        );
        for denied in &filter.deny {
            assert!(!text.contains(denied.as_str()), "{denied}: {text}");
        }
        let none = ToolFilter {
            allow: Some(Vec::new()),
            deny: Vec::new(),
        };
        let text = Persona::default().render("m", Path::new("/w"), Some(&none));
        assert!(
            text.contains("software tasks in that directory. Be concise"),
            "{text}"
        );
        assert!(!text.contains("approves"), "{text}");
        // One tool that needs an approval is enough to say it.
        let commands = ToolFilter {
            allow: Some(vec!["read_file".into(), "run_command".into()]),
            deny: Vec::new(),
        };
        let text = Persona::default().render("m", Path::new("/w"), Some(&commands));
        assert!(
            text.ends_with(
                "you cannot reach outside it. The user approves each write and command; if a tool \
                 result says \"permission denied by the user\", do not retry it, explain what you \
                 wanted to do instead. Be concise: say what you did and what you found."
            ),
            "{text}"
        );
    }

    #[test]
    fn a_bad_file_names_the_file_then_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.md");
        std::fs::write(&path, "hi {{x}}").unwrap();
        let error = Persona::load(&path).unwrap_err();
        assert_eq!(
            protocol::report::describe(&error),
            format!(
                "persona file {}: persona template: unknown variable `{{{{x}}}}` (the variables \
                 are {{{{model}}}}, {{{{cwd}}}})",
                path.display()
            )
        );
    }

    #[test]
    fn a_missing_file_is_a_clear_error() {
        let error = Persona::load(Path::new("/nonexistent/persona.md")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot read the persona file /nonexistent/persona.md")
        );
    }
}
