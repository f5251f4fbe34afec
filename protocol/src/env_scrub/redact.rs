//! Redaction of credential values in text the host prints or records.
//!
//! A [`Redactor`] knows the values of the credential-shaped variables of one run (withheld ones,
//! and forwarded ones that are credential-shaped by name or value) and replaces every occurrence of
//! them in a text with `[redacted NAME]`.
//!
//! Invariants: values shorter than [`MIN_REDACTED_LEN`] bytes are not redacted (a withheld `x` or
//! `true` would otherwise mangle every text it occurs in); when values overlap, the longest match
//! at a position wins; replacement is one pass, so a placeholder is never rewritten; a text that
//! starts inside a value (a tail cut to its last bytes) or ends inside one has that fragment
//! redacted too, when it is at least [`MIN_REDACTED_LEN`] bytes; `Debug` shows names, never values.

use std::ffi::OsStr;
use std::fmt;

/// Values shorter than this many bytes are left alone.
pub const MIN_REDACTED_LEN: usize = 8;

/// Replaces known credential values in text (see the module doc).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// `(value, name)`, longest value first.
    secrets: Vec<(String, String)>,
}

impl Redactor {
    /// Adds the value of `name`. A non-UTF-8 value is matched in its lossy form, which is how it
    /// reaches any text decoded from the agent's output.
    pub fn add(&mut self, name: &str, value: &OsStr) {
        let value = value.to_string_lossy();
        for candidate in [value.as_ref(), value.trim()] {
            if candidate.len() >= MIN_REDACTED_LEN
                && !self.secrets.iter().any(|(v, _)| v == candidate)
            {
                self.secrets.push((candidate.to_owned(), name.to_owned()));
            }
        }
        self.secrets
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.cmp(b)));
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every known value replaced by `[redacted NAME]`.
    #[must_use]
    pub fn redact(&self, text: &str) -> String {
        if self.secrets.is_empty() {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        if let Some((len, name)) = self.leading_fragment(rest) {
            placeholder(&mut out, name);
            rest = &rest[len..];
        }
        let trailing = self.trailing_fragment(rest);
        if let Some((len, _)) = trailing {
            rest = &rest[..rest.len() - len];
        }
        while let Some(c) = rest.chars().next() {
            if let Some((value, name)) = self
                .secrets
                .iter()
                .find(|(v, _)| rest.starts_with(v.as_str()))
            {
                placeholder(&mut out, name);
                rest = &rest[value.len()..];
            } else {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if let Some((_, name)) = trailing {
            placeholder(&mut out, name);
        }
        out
    }

    /// The longest proper suffix of a value that `text` starts with (`text` was cut inside it).
    fn leading_fragment(&self, text: &str) -> Option<(usize, &str)> {
        if self
            .secrets
            .iter()
            .any(|(v, _)| text.starts_with(v.as_str()))
        {
            return None; // a whole value: the scan replaces it
        }
        self.secrets.iter().find_map(|(value, name)| {
            value
                .char_indices()
                .skip(1)
                .map(|(i, _)| &value[i..])
                .take_while(|suffix| suffix.len() >= MIN_REDACTED_LEN)
                .find(|suffix| text.starts_with(suffix))
                .map(|suffix| (suffix.len(), name.as_str()))
        })
    }

    /// The longest proper prefix of a value that `text` ends with.
    fn trailing_fragment(&self, text: &str) -> Option<(usize, &str)> {
        if self.secrets.iter().any(|(v, _)| text.ends_with(v.as_str())) {
            return None; // a whole value: the scan replaces it
        }
        self.secrets.iter().find_map(|(value, name)| {
            value
                .char_indices()
                .rev()
                .map(|(i, _)| &value[..i])
                .take_while(|prefix| prefix.len() >= MIN_REDACTED_LEN)
                .find(|prefix| text.ends_with(prefix))
                .map(|prefix| (prefix.len(), name.as_str()))
        })
    }
}

fn placeholder(out: &mut String, name: &str) {
    out.push_str("[redacted ");
    out.push_str(name);
    out.push(']');
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.secrets.iter().map(|(_, n)| n.as_str()).collect();
        names.dedup();
        f.debug_struct("Redactor").field("names", &names).finish()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn redactor(pairs: &[(&str, &str)]) -> Redactor {
        let mut r = Redactor::default();
        for (name, value) in pairs {
            r.add(name, OsStr::new(value));
        }
        r
    }

    #[test]
    fn every_occurrence_is_replaced_by_the_name() {
        let r = redactor(&[("GH_TOKEN", "ghp_fakefakefake0123456789")]);
        assert_eq!(
            r.redact("a ghp_fakefakefake0123456789 b ghp_fakefakefake0123456789"),
            "a [redacted GH_TOKEN] b [redacted GH_TOKEN]"
        );
        assert_eq!(r.redact("nothing here"), "nothing here");
    }

    #[test]
    fn short_values_are_left_alone() {
        let r = redactor(&[("MY_SECRET", "x"), ("FLAG_TOKEN", "1234567")]);
        assert!(r.is_empty());
        assert_eq!(r.redact("x 1234567"), "x 1234567");
        let r = redactor(&[("PIN_TOKEN", "12345678")]);
        assert_eq!(r.redact("pin 12345678"), "pin [redacted PIN_TOKEN]");
    }

    #[test]
    fn the_longest_value_wins_and_placeholders_are_not_rewritten() {
        let r = redactor(&[
            ("SHORT_KEY", "abcdefgh"),
            ("LONG_KEY", "abcdefghijkl"),
            ("NAME_KEY", "redacted LONG_KEY"),
        ]);
        assert_eq!(
            r.redact("abcdefghijkl abcdefgh"),
            "[redacted LONG_KEY] [redacted SHORT_KEY]"
        );
    }

    #[test]
    fn surrounding_whitespace_of_a_value_does_not_hide_it() {
        let r = redactor(&[("PASTED_TOKEN", "  s3cr3t-value-42\n")]);
        assert_eq!(
            r.redact("got s3cr3t-value-42."),
            "got [redacted PASTED_TOKEN]."
        );
    }

    #[test]
    fn multibyte_text_and_values_are_handled() {
        let r = redactor(&[("PASSPHRASE", "päss-wörd-très-long")]);
        assert_eq!(
            r.redact("é päss-wörd-très-long ü"),
            "é [redacted PASSPHRASE] ü"
        );
    }

    #[test]
    fn a_text_cut_inside_a_value_has_the_fragment_redacted() {
        let r = redactor(&[("GH_TOKEN", "ghp_fakefakefake0123456789")]);
        assert_eq!(
            r.redact("fakefake0123456789 was printed"),
            "[redacted GH_TOKEN] was printed"
        );
        assert_eq!(
            r.redact("printing ghp_fakefakefa"),
            "printing [redacted GH_TOKEN]"
        );
        // Fragments shorter than the minimum, or not at an edge, are ordinary text.
        assert_eq!(r.redact("3456789 a"), "3456789 a");
        assert_eq!(r.redact("a fakefake0123456789 b"), "a fakefake0123456789 b");
    }

    #[test]
    fn debug_shows_names_not_values() {
        let r = redactor(&[("API_KEY", "do-not-print-me-0123")]);
        let debug = format!("{r:?}");
        assert!(debug.contains("API_KEY"));
        assert!(!debug.contains("do-not-print-me"));
    }

    proptest! {
        #[test]
        fn no_value_survives_redaction(
            secret in "[a-z0-9]{8,30}",
            before in "[ -~]{0,40}",
            after in "[ -~]{0,40}",
            times in 1..4usize,
        ) {
            let r = redactor(&[("SOME_TOKEN", &secret)]);
            let text = format!("{before}{}{after}", secret.repeat(times));
            let out = r.redact(&text);
            prop_assert!(!out.contains(&secret), "{out}");
            prop_assert!(out.contains("[redacted SOME_TOKEN]"), "{out}");
        }
    }
}
