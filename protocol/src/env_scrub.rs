//! The credential rule: which inherited environment variables an agent may see.
//!
//! The agent gets the host's environment minus every credential-shaped variable, plus exactly what
//! the user forwards with `--env`. A variable is credential-shaped when
//! - its NAME contains (case-insensitive) one of [`NAME_SUBSTRINGS`], or has an `_`-separated segment
//!   in [`NAME_SEGMENTS`] (so `SSH_AUTH_SOCK` is withheld but `GIT_AUTHOR_NAME` is kept), or
//! - its VALUE looks like a credential: a URL with `user:password@`, a well-known token prefix
//!   ([`VALUE_PREFIXES`]), an AWS access key id, a JWT, or a PEM private-key block.
//!
//! Invariants: this module is the only home of the rule; it reports scrubbed NAMES and never values;
//! an explicitly forwarded variable always reaches the agent, whatever its shape.

use std::collections::BTreeMap;

/// Case-insensitive substrings of a name that mark it as a credential.
pub const NAME_SUBSTRINGS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "PRIVATE",
];

/// Whole `_`-separated name segments that mark a credential (substring matching would catch AUTHOR).
pub const NAME_SEGMENTS: &[&str] = &["AUTH", "OAUTH", "AUTHORIZATION", "COOKIE"];

/// Value prefixes of well-known token formats (OpenAI/DeepSeek/Anthropic `sk-`, GitHub, GitLab,
/// Slack, Google API keys, Stripe, npm, Hugging Face).
pub const VALUE_PREFIXES: &[&str] = &[
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxr-",
    "xapp-",
    "AIza",
    "npm_",
    "hf_",
];

/// A prefixed token is only a token when the rest is long and token-like; this keeps values such as
/// `sk-SK` (a locale) or `hf_demo` visible.
const MIN_PREFIXED_TOKEN_LEN: usize = 20;

/// One `--env` argument: forward the ambient value of a name, or set a value explicitly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvForward {
    /// `--env NAME`: the host's own value of NAME reaches the agent even if credential-shaped.
    Inherit(String),
    /// `--env NAME=VALUE`.
    Set(String, String),
}

/// Why an `--env` argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvForwardError {
    #[error("invalid --env {0:?}: expected NAME or NAME=VALUE with a non-empty NAME without '='")]
    Malformed(String),
    #[error(
        "--env {0}: the variable is not set in this environment (set it, or pass --env {0}=VALUE)"
    )]
    NotSet(String),
}

impl EnvForward {
    /// Parses `NAME` or `NAME=VALUE`.
    pub fn parse(arg: &str) -> Result<EnvForward, EnvForwardError> {
        let (name, value) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (arg, None),
        };
        if name.is_empty() || name.contains('\0') || value.is_some_and(|v| v.contains('\0')) {
            return Err(EnvForwardError::Malformed(arg.to_owned()));
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

/// The agent's environment and what was withheld from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// The complete environment of the agent, sorted by name.
    pub env: BTreeMap<String, String>,
    /// Names withheld, sorted. Values are never recorded.
    pub scrubbed: Vec<String>,
}

/// Why a variable is credential-shaped, if it is.
#[must_use]
pub fn is_credential(name: &str, value: &str) -> bool {
    name_is_credential(name) || value_is_credential(value)
}

/// The name half of the rule.
#[must_use]
pub fn name_is_credential(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    NAME_SUBSTRINGS.iter().any(|s| upper.contains(s))
        || upper
            .split(['_', '-', '.'])
            .any(|segment| NAME_SEGMENTS.contains(&segment))
}

/// The value half of the rule.
#[must_use]
pub fn value_is_credential(value: &str) -> bool {
    let v = value.trim();
    url_has_password(v)
        || prefixed_token(v)
        || aws_access_key_id(v)
        || is_jwt(v)
        || (v.contains("-----BEGIN") && v.contains("PRIVATE KEY"))
}

fn token_chars(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn prefixed_token(v: &str) -> bool {
    v.len() >= MIN_PREFIXED_TOKEN_LEN
        && token_chars(v)
        && VALUE_PREFIXES.iter().any(|p| v.starts_with(p))
}

fn aws_access_key_id(v: &str) -> bool {
    v.len() == 20
        && (v.starts_with("AKIA") || v.starts_with("ASIA"))
        && v.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

fn is_jwt(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && v.starts_with("eyJ")
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '=')
        })
        && parts[1].len() >= 4
}

/// `scheme://user:password@host...` (a password, possibly empty user, before the host).
fn url_has_password(v: &str) -> bool {
    // A value may hold several URLs (`NO_PROXY`-like lists): check each whitespace/comma token.
    v.split([' ', ',', ';']).any(|token| {
        let Some((_, rest)) = token.split_once("://") else {
            return false;
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

/// Applies the rule to `ambient` and merges `forwards` on top.
///
/// An `Inherit` forward of a name absent from `ambient` is an error: silently forwarding nothing
/// would leave the user wondering why the agent cannot authenticate.
pub fn scrub<I, K, V>(ambient: I, forwards: &[EnvForward]) -> Result<Scrubbed, EnvForwardError>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    let ambient: BTreeMap<String, String> = ambient
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let mut out = Scrubbed::default();
    for (name, value) in &ambient {
        if is_credential(name, value) {
            out.scrubbed.push(name.clone());
        } else {
            out.env.insert(name.clone(), value.clone());
        }
    }
    for forward in forwards {
        match forward {
            EnvForward::Inherit(name) => {
                let value = ambient
                    .get(name)
                    .ok_or_else(|| EnvForwardError::NotSet(name.clone()))?;
                out.env.insert(name.clone(), value.clone());
            }
            EnvForward::Set(name, value) => {
                out.env.insert(name.clone(), value.clone());
            }
        }
        out.scrubbed.retain(|n| n != forward.name());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pairs: &[(&str, &str)], forwards: &[EnvForward]) -> (Vec<String>, Vec<String>) {
        let s = scrub(pairs.iter().copied(), forwards).unwrap();
        (s.env.keys().cloned().collect(), s.scrubbed)
    }

    #[test]
    fn name_rule() {
        for name in [
            "OPENAI_API_KEY",
            "github_token",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "MYSQL_PASSWD",
            "GPG_PASSPHRASE",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "PRIVATE_THING",
            "SSH_AUTH_SOCK",
            "NPM_AUTH",
            "X_OAUTH_CLIENT",
        ] {
            assert!(name_is_credential(name), "{name} should be scrubbed");
        }
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "HTTPS_PROXY",
            "GIT_AUTHOR_NAME",
            "AUTHOR",
            "TERM",
            "USER",
        ] {
            assert!(!name_is_credential(name), "{name} should be kept");
        }
    }

    #[test]
    fn value_rule() {
        for value in [
            "https://alice:hunter2@example.com/repo.git",
            "postgres://u:p@db:5432/x",
            "sk-abcdefghijklmnopqrstuvwx",
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "xoxb-1234-5678-abcdefghijkl",
            "AKIAIOSFODNN7EXAMPLE",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----",
        ] {
            assert!(value_is_credential(value), "{value} should be scrubbed");
        }
        for value in [
            "/usr/bin:/bin",
            "sk-SK",
            "https://example.com/a:b@c",
            "http://proxy:3128",
            "en_US.UTF-8",
            "hello.world.again",
        ] {
            assert!(!value_is_credential(value), "{value} should be kept");
        }
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
}
