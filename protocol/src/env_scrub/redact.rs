//! Redaction of credential values in text the host prints or records.
//!
//! A [`Redactor`] knows the values of the credential-shaped variables of one run (withheld ones,
//! and forwarded ones that are credential-shaped by name or value) and replaces every occurrence of
//! them in a text with `[redacted NAME]`.
//!
//! Invariants: values shorter than [`MIN_REDACTED_LEN`] bytes are not redacted (a withheld `x` or
//! `true` would otherwise mangle every text it occurs in); when values overlap, the longest match
//! at a position wins; replacement is one pass, so a placeholder is never rewritten; `Debug` shows
//! names, never values.

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
        while let Some(c) = rest.chars().next() {
            if let Some((value, name)) = self
                .secrets
                .iter()
                .find(|(v, _)| rest.starts_with(v.as_str()))
            {
                out.push_str("[redacted ");
                out.push_str(name);
                out.push(']');
                rest = &rest[value.len()..];
            } else {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        out
    }
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
    fn debug_shows_names_not_values() {
        let r = redactor(&[("API_KEY", "do-not-print-me-0123")]);
        let debug = format!("{r:?}");
        assert!(debug.contains("API_KEY"));
        assert!(!debug.contains("do-not-print-me"));
    }
}
