//! The persona: the system prompt sent first in every model request.
//!
//! A persona is a template; `{model}` and `{cwd}` are replaced by the model name and the session
//! directory when a request is assembled (other braces are left alone, so a persona may contain
//! code). Without `--persona FILE` the built-in [`DEFAULT_PERSONA`] is used.

use std::path::{Path, PathBuf};

use thiserror::Error;

pub(crate) const DEFAULT_PERSONA: &str = "\
You are acp-child, a careful coding agent running as the model {model}, working in the directory {cwd}.
You help the user with software tasks in that directory, using the tools you are given:
read_file, list_dir and search to look around; write_file and edit_file to change files; run_command \
to run shell commands (builds, tests, git). Paths are relative to {cwd}; you cannot reach outside it.
Read a file before editing it; edit_file replaces one exact, unique piece of text. The user approves \
each write and command; if a tool result says \"permission denied by the user\", do not retry it, \
explain what you wanted to do instead. Be concise: say what you did and what you found.";

/// The persona file could not be read.
#[derive(Debug, Error)]
pub enum PersonaError {
    #[error("cannot read the persona file {}; pass a readable UTF-8 text file to --persona", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Persona {
    template: String,
}

impl Default for Persona {
    fn default() -> Self {
        Self {
            template: DEFAULT_PERSONA.to_owned(),
        }
    }
}

impl Persona {
    #[must_use]
    pub(crate) fn new(template: impl Into<String>) -> Self {
        Self {
            template: template.into(),
        }
    }

    pub(crate) fn load(path: &Path) -> Result<Self, PersonaError> {
        std::fs::read_to_string(path)
            .map(Self::new)
            .map_err(|source| PersonaError::Read {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The system prompt for `model` working in `cwd`.
    #[must_use]
    pub(crate) fn render(&self, model: &str, cwd: &Path) -> String {
        self.template
            .replace("{model}", model)
            .replace("{cwd}", &cwd.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_substituted_and_other_braces_kept() {
        let persona = Persona::new("I am {model} in {cwd}; fn f() { {x} } {model}");
        assert_eq!(
            persona.render("deepseek-chat", Path::new("/p")),
            "I am deepseek-chat in /p; fn f() { {x} } deepseek-chat"
        );
    }

    #[test]
    fn the_default_names_model_cwd_and_tools() {
        let text = Persona::default().render("m", Path::new("/w"));
        assert!(text.contains("model m") && text.contains("directory /w"));
        let tools = super::super::tools::Toolbox::standard(std::time::Duration::from_secs(1), None);
        for tool in tools.names() {
            assert!(text.contains(tool), "{tool}");
        }
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
