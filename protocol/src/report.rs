//! How an error is shown to a person: the error and its chain of causes on one line
//! (`outer: cause: root cause`), and further clauses joined with `; `. One rule for the host's
//! results and the agent's replies.
//!
//! Invariant: a part that ends a sentence (an agent's "No API key configured.") loses its final
//! period before a separator, so a message never reads `.:` or `.;`.

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
