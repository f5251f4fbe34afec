//! The credential rule: which inherited environment variables an agent may see, and how their
//! values are kept out of what the host prints.
//!
//! The agent gets the host's environment minus every credential-shaped variable, plus exactly what
//! the user forwards with `--env`. A variable is credential-shaped when
//! - its NAME has a secret word segment (`names.rs`: `KEY`, `API_KEY`, `APIKEY`, `TOKEN`, `SECRET`,
//!   `PASSWORD`, `PASS`, `PWD`, `AUTH`, `COOKIES`, … as `_`/`-`/`.`-separated or camel-case
//!   segments, or known compounds such as `GITHUBTOKEN`), unless it is on the short allow-list
//!   (`names::HARMLESS_NAMES`); substrings never count, so `KEYBOARD_LAYOUT`, `MONKEY`,
//!   `TOKENIZERS_PARALLELISM` and `SECRETARY_NAME` pass; or
//! - its VALUE has a credential shape (`values.rs`): a token of a known format with its real length
//!   and alphabet, a JWT/JWE, a URL with a password, a token user, a secret query parameter or a
//!   secret webhook path, a connection string or npmrc/netrc text with a password or key, an
//!   authorization value, base64 of `user:password`, or a private key; or
//! - its name is not UTF-8: such a name cannot be matched reliably (a lossy view may hide a
//!   segment), no real tool needs one, so it is withheld and reported in its lossy form.
//!
//! Values are matched on their lossy UTF-8 view, so a non-UTF-8 value is judged by the same rule
//! and, when harmless, forwarded byte for byte. The corpus in `corpus.rs` (credential shapes and
//! harmless variables, each named) is the rule's specification.
//!
//! What the scrub is: a guard against accidental leaks (an agent quoting its environment into a
//! transcript, a log or a model request). What it is not: a barrier against a determined process
//! of the same user, which can read the host's own memory or files.
//!
//! Invariants: this module is the only home of the rule; it reports withheld NAMES and never
//! values (no error message, `Debug` output or report contains one); an explicitly forwarded
//! variable always reaches the agent, whatever its shape; the rule is total over any bytes.

mod names;
mod redact;
mod values;

#[cfg(test)]
mod corpus;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;

pub use names::name_is_credential;
pub use redact::{MIN_REDACTED_LEN, Redactor};
pub use values::value_is_credential;

/// The rule in a few lines, for `acp-host run --help` (docs/run.md and the module doc say more).
#[must_use]
pub fn help_section() -> String {
    "Environment:\n  \
The agent gets this environment minus credential-shaped variables: names with a secret word\n  \
segment (KEY, API_KEY, TOKEN, SECRET, PASSWORD, PASS, PWD, AUTH, COOKIE, ...; not KEYBOARD or\n  \
TOKENIZERS) and values shaped like tokens (sk-, ghp_, AKIA, JWT, ...), passworded or webhook\n  \
URLs, Bearer/Basic credentials, connection strings or private keys. Forward one with --env NAME.\n  \
Withheld names are listed, never values; credential values in the agent's stderr tail and in\n  \
errors are shown as [redacted NAME].\n"
        .to_owned()
}

/// One `--env` argument: forward the ambient value of a name, or set a value explicitly.
#[derive(Clone, PartialEq, Eq)]
pub enum EnvForward {
    /// `--env NAME`: the host's own value of NAME reaches the agent even if credential-shaped.
    Inherit(String),
    /// `--env NAME=VALUE`.
    Set(String, String),
}

impl fmt::Debug for EnvForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvForward::Inherit(name) => f.debug_tuple("Inherit").field(name).finish(),
            EnvForward::Set(name, _) => f.debug_tuple("Set").field(name).field(&"…").finish(),
        }
    }
}

/// Why an `--env` argument was refused. Messages name the variable, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvForwardError {
    #[error(
        "invalid --env {}: expected NAME or NAME=VALUE with a non-empty NAME and no NUL byte{}",
        shown_name(name),
        if *with_value { " (the value is not shown)" } else { "" }
    )]
    Malformed { name: String, with_value: bool },
    #[error(
        "--env {0}: the variable is not set in this environment (set it, or pass --env {0}=VALUE)"
    )]
    NotSet(String),
}

fn shown_name(name: &str) -> String {
    if name.is_empty() {
        "with an empty NAME".to_owned()
    } else {
        format!("{name:?}")
    }
}

impl EnvForward {
    /// Parses `NAME` or `NAME=VALUE`.
    pub fn parse(arg: &str) -> Result<EnvForward, EnvForwardError> {
        let (name, value) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (arg, None),
        };
        if name.is_empty() || name.contains('\0') || value.is_some_and(|v| v.contains('\0')) {
            return Err(EnvForwardError::Malformed {
                name: name.to_owned(),
                with_value: value.is_some(),
            });
        }
        Ok(match value {
            Some(value) => EnvForward::Set(name.to_owned(), value.to_owned()),
            None => EnvForward::Inherit(name.to_owned()),
        })
    }

    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            EnvForward::Inherit(name) | EnvForward::Set(name, _) => name,
        }
    }
}

/// The agent's environment, what was withheld from it, and the values to redact.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// The complete environment of the agent, sorted by name.
    pub env: BTreeMap<OsString, OsString>,
    /// Names withheld, sorted (a non-UTF-8 name in its lossy form). Values are never recorded.
    pub scrubbed: Vec<String>,
    /// The values of withheld and forwarded credential-shaped variables.
    pub redactor: Redactor,
}

impl fmt::Debug for Scrubbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrubbed")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("scrubbed", &self.scrubbed)
            .field("redactor", &self.redactor)
            .finish()
    }
}

/// The whole rule for one variable.
#[must_use]
pub fn is_credential(name: &str, value: &str) -> bool {
    name_is_credential(name) || value_is_credential(value)
}

/// The rule over OS strings: a non-UTF-8 name is withheld; a value is judged on its lossy view.
fn is_credential_os(name: &OsStr, value: &OsStr) -> bool {
    name.to_str()
        .is_none_or(|name| is_credential(name, &value.to_string_lossy()))
}

/// Applies the rule to `ambient` (normally `std::env::vars_os()`) and merges `forwards` on top.
///
/// An `Inherit` forward of a name absent from `ambient` is an error: silently forwarding nothing
/// would leave the user wondering why the agent cannot authenticate.
pub fn scrub<I, K, V>(ambient: I, forwards: &[EnvForward]) -> Result<Scrubbed, EnvForwardError>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    let ambient: BTreeMap<OsString, OsString> = ambient
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let mut out = Scrubbed::default();
    let mut withheld = BTreeMap::new();
    for (name, value) in &ambient {
        if is_credential_os(name, value) {
            let shown = name.to_string_lossy().into_owned();
            out.redactor.add(&shown, value);
            withheld.insert(shown, name.clone());
        } else {
            out.env.insert(name.clone(), value.clone());
        }
    }
    for forward in forwards {
        let name = forward.name();
        let value: OsString = match forward {
            EnvForward::Inherit(name) => ambient
                .get(OsStr::new(name))
                .cloned()
                .ok_or_else(|| EnvForwardError::NotSet(name.clone()))?,
            EnvForward::Set(_, value) => value.into(),
        };
        if is_credential_os(OsStr::new(name), &value) {
            out.redactor.add(name, &value);
        }
        out.env.insert(name.into(), value);
        withheld.remove(name);
    }
    out.scrubbed = withheld.into_keys().collect();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn a_forwards_debug_form_never_shows_its_value() {
        assert_eq!(
            format!("{:?}", EnvForward::Inherit("HOME".into())),
            r#"Inherit("HOME")"#
        );
        assert_eq!(
            format!("{:?}", EnvForward::Set("TOKEN".into(), "sk-secret".into())),
            r#"Set("TOKEN", "…")"#
        );
    }

    fn names(pairs: &[(&str, &str)], forwards: &[EnvForward]) -> (Vec<String>, Vec<String>) {
        let s = scrub(pairs.iter().copied(), forwards).unwrap();
        let env = s
            .env
            .keys()
            .map(|k| k.to_string_lossy().into_owned())
            .collect();
        (env, s.scrubbed)
    }

    #[test]
    fn scrub_reports_names_and_keeps_forwards() {
        let ambient = [
            ("PATH", "/bin"),
            ("OPENAI_API_KEY", "x"),
            ("DEEPSEEK_API_KEY", "y"),
            ("GIT_URL", "https://u:p@h/"),
        ];
        let forwards = [
            EnvForward::Inherit("DEEPSEEK_API_KEY".into()),
            EnvForward::Set("EXTRA".into(), "1".into()),
        ];
        let (env, scrubbed) = names(&ambient, &forwards);
        assert_eq!(env, ["DEEPSEEK_API_KEY", "EXTRA", "PATH"]);
        assert_eq!(scrubbed, ["GIT_URL", "OPENAI_API_KEY"]);
    }

    #[test]
    fn forwarding_an_unset_variable_is_an_error() {
        let err = scrub([("PATH", "/bin")], &[EnvForward::Inherit("NOPE".into())]).unwrap_err();
        assert_eq!(err, EnvForwardError::NotSet("NOPE".into()));
        assert!(err.to_string().contains("--env NOPE=VALUE"));
    }

    #[test]
    fn parse_forwards() {
        assert_eq!(
            EnvForward::parse("A").unwrap(),
            EnvForward::Inherit("A".into())
        );
        assert_eq!(
            EnvForward::parse("A=b=c").unwrap(),
            EnvForward::Set("A".into(), "b=c".into())
        );
        assert_eq!(
            EnvForward::parse("A=").unwrap(),
            EnvForward::Set("A".into(), String::new())
        );
        assert!(EnvForward::parse("=x").is_err());
        assert!(EnvForward::parse("").is_err());
    }

    #[test]
    fn malformed_forwards_never_echo_the_value() {
        let value = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
        for arg in [
            format!("={value}"),
            format!("A={value}\0"),
            format!("A\0B={value}"),
        ] {
            let err = EnvForward::parse(&arg).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains(value), "{shown}");
            assert!(shown.contains("the value is not shown"), "{shown}");
        }
        assert_eq!(
            EnvForward::parse("=secret-value").unwrap_err().to_string(),
            "invalid --env with an empty NAME: expected NAME or NAME=VALUE with a non-empty NAME \
             and no NUL byte (the value is not shown)"
        );
        assert_eq!(
            EnvForward::parse("").unwrap_err().to_string(),
            "invalid --env with an empty NAME: expected NAME or NAME=VALUE with a non-empty NAME \
             and no NUL byte"
        );
        let set = EnvForward::Set("A".into(), "do-not-print".into());
        assert!(!format!("{set:?}").contains("do-not-print"));
    }

    #[test]
    fn non_utf8_names_are_withheld_and_non_utf8_values_judged_by_the_rule() {
        let os = |b: &[u8]| OsStr::from_bytes(b).to_owned();
        let ambient = vec![
            (os(b"ODD\xffNAME"), os(b"plain")),
            (os(b"LATIN1_GREETING"), os(b"gr\xfc\xdf dich")),
            (os(b"LATIN1_TOKEN"), os(b"\xfcber-geheim-0123")),
            (os(b"ODD_URL"), os(b"https://u:p\xff@example.com/")),
        ];
        let s = scrub(ambient, &[]).unwrap();
        assert_eq!(s.scrubbed, ["LATIN1_TOKEN", "ODD_URL", "ODD\u{fffd}NAME"]);
        assert_eq!(
            s.env.get(OsStr::new("LATIN1_GREETING")),
            Some(&os(b"gr\xfc\xdf dich")),
            "a harmless non-UTF-8 value is forwarded byte for byte"
        );
        assert_eq!(
            s.redactor.redact("leaked \u{fffd}ber-geheim-0123"),
            "leaked [redacted LATIN1_TOKEN]"
        );
    }

    #[test]
    fn the_redactor_knows_withheld_and_credential_shaped_forwarded_values() {
        let ambient = [
            ("OPENAI_API_KEY", "sk-proj-aaaaBBBB1111cccc2222dddd"),
            ("GITHUB_TOKEN", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
            ("EDITOR_THEME", "solarized-dark-high"),
        ];
        let forwards = [
            EnvForward::Inherit("GITHUB_TOKEN".into()),
            EnvForward::Set("DB_PASS".into(), "correct-horse-battery".into()),
            EnvForward::Set("GREETING".into(), "hello there friend".into()),
        ];
        let s = scrub(ambient, &forwards).unwrap();
        assert_eq!(s.scrubbed, ["OPENAI_API_KEY"]);
        assert_eq!(
            s.redactor.redact(
                "sk-proj-aaaaBBBB1111cccc2222dddd ghp_0123456789abcdefghijABCDEFGHIJ012345 \
                 correct-horse-battery solarized-dark-high hello there friend"
            ),
            "[redacted OPENAI_API_KEY] [redacted GITHUB_TOKEN] [redacted DB_PASS] \
             solarized-dark-high hello there friend"
        );
        assert!(!format!("{s:?}").contains("correct-horse"));
    }

    #[test]
    fn help_section_names_the_rule_and_fits_the_terminal() {
        let help = help_section();
        assert!(help.starts_with("Environment:\n"));
        assert!(help.contains("--env NAME"));
        assert!(help.lines().all(|line| line.len() <= 100), "{help}");
    }
}
