//! The name half of the credential rule: word segments, not substrings.
//!
//! A name is cut into segments at every character that is not an ASCII letter or digit, at each
//! lower-to-upper case step (`authToken` -> `auth`, `Token`) and between letters and digits
//! (`OAUTH2` -> `OAUTH`, `2`). It is credential-shaped when, case-insensitively,
//! - a segment is one of [`SECRET_SEGMENTS`], or
//! - a segment ends with one of [`SECRET_SUFFIXES`] (`GITHUBTOKEN`, `DBPASS`, `OPENAIAPIKEY`) and
//!   is not one of [`HARMLESS_SEGMENTS`] (`BYPASS`, `ASKPASS`, `OLDPWD`),
//!
//! and the name is not on [`HARMLESS_NAMES`]. Substrings never count: `KEYBOARD_LAYOUT`, `MONKEY`,
//! `TOKENIZERS_PARALLELISM`, `SECRETARY_NAME` pass. `KEY` is deliberately not a suffix
//! (`MONKEY`, `TURNKEY`, `HOTKEY`); the `KEY` compounds that are secrets are listed instead.
//!
//! Invariant: the same segmenting is used for variable names and for the names inside values
//! (`AccountKey=` in a connection string, `_authToken=` in npmrc text, `?api_key=` in a URL).

/// Whole segments that mark a credential.
pub(super) const SECRET_SEGMENTS: &[&str] = &[
    "KEY",
    "KEYS",
    "APIKEY",
    "APIKEYS",
    "TOKEN",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "PWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "PRIVATE",
    "AUTH",
    "OAUTH",
    "AUTHORIZATION",
    "COOKIE",
    "COOKIES",
    "PAT",
    "BEARER",
];

/// Endings of compound segments that mark a credential (`GITHUBTOKEN`, `MYSQLPASS`, `DBPWD`).
/// `TOKENS` is absent on purpose: `MAX_TOKENS` and `TOKENS_PER_MINUTE` are model limits.
pub(super) const SECRET_SUFFIXES: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "PWD",
    "PASSPHRASE",
    "APIKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "PRIVATEKEY",
    "SIGNINGKEY",
    "MASTERKEY",
    "ENCRYPTIONKEY",
    "CREDENTIALS",
    "COOKIE",
    "COOKIES",
];

/// Segments that end with a secret suffix but are ordinary words or program paths.
pub(super) const HARMLESS_SEGMENTS: &[&str] = &[
    "BYPASS", "COMPASS", "SURPASS",
    "ASKPASS", // GIT_ASKPASS, SSH_ASKPASS, SUDO_ASKPASS: the path of a prompt program
    "OLDPWD",  // the shell's previous directory
];

/// Whole names (or, ending in `*`, name prefixes) that contain a secret segment but hold none.
pub(super) const HARMLESS_NAMES: &[&str] = &[
    "PWD",              // the shell's current directory
    "PASSWORD_STORE_*", // settings of `pass` (directories, key ids, clipboard time)
];

/// The name half of the rule (see the module doc).
#[must_use]
pub fn name_is_credential(name: &str) -> bool {
    CREDENTIAL_VARIABLES.contains(&name) || (!is_harmless_name(name) && has_secret_segment(name))
}

/// Variables that hold credentials whatever their segments say: OpenTelemetry's collector
/// headers (`Authorization=Bearer ...`, `x-honeycomb-team=...`), which a trace exporter reads and
/// no agent needs.
pub(super) const CREDENTIAL_VARIABLES: &[&str] = &[
    crate::env_vars::OTEL_EXPORTER_OTLP_HEADERS,
    crate::env_vars::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
];

/// Whether any segment of `name` marks a credential, ignoring [`HARMLESS_NAMES`]; used for names
/// found inside values, where the allow-list of variable names does not apply.
pub(crate) fn has_secret_segment(name: &str) -> bool {
    segments(name).any(|segment| {
        let is = |word: &&str| segment.eq_ignore_ascii_case(word);
        SECRET_SEGMENTS.iter().any(is)
            || (!HARMLESS_SEGMENTS.iter().any(is)
                && SECRET_SUFFIXES.iter().any(|suffix| {
                    segment.len() >= suffix.len()
                        && segment[segment.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                }))
    })
}

fn is_harmless_name(name: &str) -> bool {
    HARMLESS_NAMES
        .iter()
        .any(|allowed| match allowed.strip_suffix('*') {
            Some(prefix) => name
                .get(..prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(prefix)),
            None => name.eq_ignore_ascii_case(allowed),
        })
}

/// The segments of a name (see the module doc), as they are written: compare them ignoring ASCII
/// case. Every segment is a run of ASCII letters and digits, so it is a slice of `name`; nothing
/// is allocated (the rule runs over every variable of the environment at each start).
pub(crate) fn segments(name: &str) -> impl Iterator<Item = &str> + '_ {
    let bytes = name.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() && !bytes[at].is_ascii_alphanumeric() {
            at += 1;
        }
        if at == bytes.len() {
            return None;
        }
        let start = at;
        at += 1;
        while at < bytes.len() {
            let (p, c) = (bytes[at - 1], bytes[at]);
            let boundary = !c.is_ascii_alphanumeric()
                || (p.is_ascii_lowercase() && c.is_ascii_uppercase())
                || (p.is_ascii_alphabetic() != c.is_ascii_alphabetic());
            if boundary {
                break;
            }
            at += 1;
        }
        // Both ends sit next to ASCII bytes (or the ends of the name): char boundaries.
        Some(&name[start..at])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_on_separators_case_steps_and_digits() {
        let cut = |name| {
            segments(name)
                .map(str::to_ascii_uppercase)
                .collect::<Vec<_>>()
        };
        assert_eq!(cut("OPENAI_API_KEY"), ["OPENAI", "API", "KEY"]);
        assert_eq!(
            cut("npm_config__authToken"),
            ["NPM", "CONFIG", "AUTH", "TOKEN"]
        );
        assert_eq!(cut("OAUTH2-client.id"), ["OAUTH", "2", "CLIENT", "ID"]);
        assert_eq!(cut("AccountKey"), ["ACCOUNT", "KEY"]);
        assert_eq!(cut("OAuth"), ["OAUTH"]);
        assert_eq!(cut("__"), Vec::<String>::new());
    }

    #[test]
    fn allow_list_entries_are_exact_or_prefixes() {
        assert!(!name_is_credential("PWD"));
        assert!(!name_is_credential("pwd"));
        assert!(name_is_credential("DB_PWD"));
        assert!(!name_is_credential("PASSWORD_STORE_DIR"));
        assert!(name_is_credential("PASSWORD_STORE"));
        assert!(has_secret_segment("PWD"));
    }
}
