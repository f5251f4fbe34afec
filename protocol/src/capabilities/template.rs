//! Persona templates: the one rule for `{{model}}` and `{{cwd}}`, used by acp-child (its system
//! prompt) and acp-host (the persona preamble of an agent that takes no system prompt).
//!
//! Invariants:
//! - variables are strict: an unknown name (`{{modle}}`) or an unclosed `{{` is an error when the
//!   template is parsed ([`Template::parse`]), before anything is spawned; whitespace inside the
//!   braces is allowed (`{{ cwd }}`);
//! - substituted values are never scanned again (a cwd containing `{{model}}` stays as it is), and
//!   single braces are plain text (a persona may contain code);
//! - `{{{{` is a literal `{{` (doubled, as in Rust's and Python's format strings; no variable name
//!   starts with a brace, so it is never ambiguous); a lone `}}` needs no escape;
//! - rendering ([`Template::render`]) fails only for a variable used with no value, naming it.

/// The variables a template may use.
pub const VARIABLES: &str = "{{model}}, {{cwd}}";

/// A variable of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    Model,
    Cwd,
}

impl Variable {
    /// How a template writes it.
    #[must_use]
    pub fn reference(self) -> &'static str {
        match self {
            Variable::Model => "{{model}}",
            Variable::Cwd => "{{cwd}}",
        }
    }
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Variable(Variable),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub pieces: Vec<Piece>,
}

/// A template that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("persona template: {problem} (the variables are {VARIABLES})")]
pub struct TemplateError {
    pub problem: String,
}

/// A variable the template uses has no value here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the persona uses {}, which has no value here{}", .variable.reference(), .hint)]
pub struct Unbound {
    pub variable: Variable,
    /// How to give it one (from the caller), with its leading separator.
    pub hint: String,
}

/// The values of a render; `None`: unknown here.
#[derive(Debug, Clone, Copy, Default)]
pub struct Values<'a> {
    pub model: Option<&'a str>,
    pub cwd: Option<&'a str>,
}

impl Template {
    /// Parses `text`; every `{{` must open a known variable, or be doubled (`{{{{`: a literal
    /// `{{`).
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            push_text(&mut pieces, &rest[..open]);
            let after = &rest[open + 2..];
            if let Some(literal) = after.strip_prefix("{{") {
                push_text(&mut pieces, "{{");
                rest = literal;
                continue;
            }
            let Some(close) = after.find("}}") else {
                return Err(TemplateError {
                    problem: format!(
                        "`{{{{` at byte {} is never closed; write `{{{{{{{{` for a literal `{{{{`",
                        text.len() - rest.len() + open
                    ),
                });
            };
            pieces.push(Piece::Variable(match after[..close].trim() {
                "model" => Variable::Model,
                "cwd" => Variable::Cwd,
                other => {
                    return Err(TemplateError {
                        problem: format!("unknown variable `{{{{{other}}}}}`"),
                    });
                }
            }));
            rest = &after[close + 2..];
        }
        push_text(&mut pieces, rest);
        Ok(Self { pieces })
    }

    /// The variables it uses, in order, each once.
    #[must_use]
    pub fn variables(&self) -> Vec<Variable> {
        let mut used = Vec::new();
        for piece in &self.pieces {
            if let Piece::Variable(variable) = piece
                && !used.contains(variable)
            {
                used.push(*variable);
            }
        }
        used
    }

    /// The text with `values` substituted; the first variable used without a value is the error
    /// (`hint` says how to give one).
    pub fn render(&self, values: Values<'_>, hint: &str) -> Result<String, Unbound> {
        let mut text = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(piece) => text.push_str(piece),
                Piece::Variable(variable) => {
                    let value = match variable {
                        Variable::Model => values.model,
                        Variable::Cwd => values.cwd,
                    };
                    text.push_str(value.ok_or_else(|| Unbound {
                        variable: *variable,
                        hint: hint.to_owned(),
                    })?);
                }
            }
        }
        Ok(text)
    }
}

/// Appends `text` to the template's last text piece, or as a new one; nothing when it is empty.
fn push_text(pieces: &mut Vec<Piece>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(last)) = pieces.last_mut() {
        last.push_str(text);
    } else {
        pieces.push(Piece::Text(text.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variable_has_its_reference() {
        assert_eq!(Variable::Model.reference(), "{{model}}");
        assert_eq!(Variable::Cwd.reference(), "{{cwd}}");
    }

    fn values() -> Values<'static> {
        Values {
            model: Some("deepseek-chat"),
            cwd: Some("/p"),
        }
    }

    #[test]
    fn variables_are_substituted_once_and_single_braces_kept() {
        let template =
            Template::parse("I am {{model}} in {{ cwd }}; fn f() { {x} } {{model}}").unwrap();
        assert_eq!(
            template.render(values(), "").unwrap(),
            "I am deepseek-chat in /p; fn f() { {x} } deepseek-chat"
        );
        assert_eq!(template.variables(), [Variable::Model, Variable::Cwd]);
        let template = Template::parse("in {{cwd}}").unwrap();
        let cwd = Values {
            cwd: Some("/{{model}}"),
            ..Values::default()
        };
        assert_eq!(template.render(cwd, "").unwrap(), "in /{{model}}");
        assert_eq!(
            Template::parse("plain")
                .unwrap()
                .render(Values::default(), ""),
            Ok("plain".to_owned())
        );
    }

    #[test]
    fn unknown_or_unclosed_variables_are_errors() {
        assert_eq!(
            Template::parse("hi {{modle}}").unwrap_err().to_string(),
            "persona template: unknown variable `{{modle}}` (the variables are {{model}}, {{cwd}})"
        );
        assert_eq!(
            Template::parse("ab {{model").unwrap_err().to_string(),
            "persona template: `{{` at byte 3 is never closed; write `{{{{` for a literal `{{` \
             (the variables are {{model}}, {{cwd}})"
        );
    }

    #[test]
    fn a_doubled_opening_is_a_literal_one() {
        let template = Template::parse("{{{{model}} is {{model}}: {{{{ and {{{{{{cwd}}").unwrap();
        assert_eq!(
            template.pieces,
            [
                Piece::Text("{{model}} is ".into()),
                Piece::Variable(Variable::Model),
                Piece::Text(": {{ and {{".into()),
                Piece::Variable(Variable::Cwd),
            ]
        );
        assert_eq!(
            template.render(values(), "").unwrap(),
            "{{model}} is deepseek-chat: {{ and {{/p"
        );
        // After a variable, a literal starts a piece of its own; a lone `}}` is text.
        assert_eq!(
            Template::parse("{{cwd}}{{{{ }}").unwrap().pieces,
            [Piece::Variable(Variable::Cwd), Piece::Text("{{ }}".into())]
        );
        assert_eq!(Template::parse("").unwrap().pieces, []);
    }

    #[test]
    fn a_variable_without_a_value_is_named() {
        let template = Template::parse("{{cwd}} as {{model}}").unwrap();
        let cwd_only = Values {
            cwd: Some("/p"),
            ..Values::default()
        };
        assert_eq!(
            template
                .render(cwd_only, "; pass --model")
                .unwrap_err()
                .to_string(),
            "the persona uses {{model}}, which has no value here; pass --model"
        );
        assert_eq!(
            template.render(Values::default(), "").unwrap_err().variable,
            Variable::Cwd
        );
    }
}
