//! How an error is shown to a person: the error and its chain of causes on one line
//! (`outer: cause: root cause`), and further clauses joined with `; `. One rule for the host's
//! results and the agent's replies.
//!
//! Invariant: a part that ends a sentence (an agent's "No API key configured.") loses its final
//! period before a separator, so a message never reads `.:` or `.;`. A name from outside (a file
//! name, a definition's command line) is shown through [`printable`], so it cannot rewrite the
//! line a person reads.

use std::borrow::Cow;
use std::path::Path;

/// `text` as a terminal can show it harmlessly: control characters (C0, DEL, C1: ESC, CR, LF,
/// backspace...) and the marks that reorder a line (bidirectional embeddings, overrides and
/// isolates) become escapes (`\u{1b}`, `\r`, `\u{202e}`); everything else is kept as it is.
#[must_use]
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hides) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hides(c) {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// A path's [`printable`] form.
#[must_use]
pub fn printable_path(path: &Path) -> String {
    printable(&path.display().to_string()).into_owned()
}

/// A character a terminal would act on, or that reorders what follows it.
fn hides(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The error and its causes, joined with `: `.
#[must_use]
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = join(&text, ": ", &cause.to_string());
        source = cause.source();
    }
    text
}

/// `first`, then a further clause: `first; clause`.
#[must_use]
pub fn clause(first: &str, clause: &str) -> String {
    join(first, "; ", clause)
}

fn join(first: &str, separator: &str, rest: &str) -> String {
    let first = first.trim_end();
    let first = first
        .strip_suffix('.')
        .filter(|s| !s.ends_with('.'))
        .unwrap_or(first);
    format!("{first}{separator}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_printed_without_the_characters_a_terminal_acts_on() {
        assert!(matches!(
            printable("plain café/x.md"),
            Cow::Borrowed("plain café/x.md")
        ));
        assert_eq!(
            printable("x\u{1b}[2K\rapproved\nnext\u{7f}\u{9b}\u{202e}dm.x\tend"),
            "x\\u{1b}[2K\\rapproved\\nnext\\u{7f}\\u{9b}\\u{202e}dm.x\\tend"
        );
        assert_eq!(printable("a\\b\u{2066}"), "a\\b\\u{2066}");
        assert_eq!(
            printable_path(Path::new("/repo\u{1b}]0;x\u{7}/subagents")),
            "/repo\\u{1b}]0;x\\u{7}/subagents"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read a.txt")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("Could not start.")]
    struct Sentence(#[source] std::io::Error);

    #[test]
    fn joins_the_cause_chain() {
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file",
        ));
        assert_eq!(describe(&error), "cannot read a.txt: no such file");
    }

    #[test]
    fn a_sentence_loses_its_period_before_a_separator() {
        assert_eq!(
            clause("No API key configured.", "the agent needs authentication"),
            "No API key configured; the agent needs authentication"
        );
        assert_eq!(clause("exited ", "it ended"), "exited; it ended");
        // An ellipsis is not a sentence's period.
        assert_eq!(clause("loading...", "then"), "loading...; then");
        let error = Outer(std::io::Error::other("Disk full."));
        assert_eq!(describe(&error), "cannot read a.txt: Disk full.");

        let error = Sentence(std::io::Error::other("denied"));
        assert_eq!(describe(&error), "Could not start: denied");
    }
}
