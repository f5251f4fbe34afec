//! How an error is shown to a person: the error and its chain of causes on one line
//! (`outer: cause: root cause`). One rule for the host's results and the agent's replies.

/// The error and its causes, joined with `: `.
#[must_use]
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read a.txt")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn joins_the_cause_chain() {
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file",
        ));
        assert_eq!(describe(&error), "cannot read a.txt: no such file");
    }
}
