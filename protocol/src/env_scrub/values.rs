//! The value half of the credential rule: shapes that are credentials whatever the variable is
//! called.
//!
//! A value is credential-shaped when it contains
//! - a token of a known format ([`TOKEN_SHAPES`]): the prefix followed by a body of the format's
//!   alphabet and length (so `hf_demo` passes), and for the generic `sk-` a run of 16 letters and
//!   digits (so a branch name `sk-1234-add-login-page` passes); an AWS access key id; a JWT
//!   (3 parts) or JWE (5 parts);
//! - a URL with a password (`scheme://user:password@host`), a token as its user
//!   (`https://ghp_…@host`), a credential-named query parameter (`?api_key=…`, `&sig=…`), or a
//!   webhook whose path is the secret (Slack, Discord, Microsoft Teams, Telegram bots);
//! - an assignment to a credential-named key (`AccountKey=…;`, `Password=…;`, npmrc
//!   `//registry/:_authToken=…`), judged by the name rule;
//! - an authorization value (`Bearer …`, `Basic …`, `Token …`, `Authorization: …`);
//! - netrc text (`machine … login … password …`);
//! - as a whole, base64 of `user:password`;
//! - a PEM private-key block.
//!
//! Quotes around a value or a token do not hide it. Tokens are matched by shape only: checksums
//! (GitHub's CRC32) could only turn a withheld look-alike into a forwarded one, and withholding a
//! look-alike costs nothing (`--env NAME` forwards it).
//!
//! Invariant: pure and total; any text, of any size, is answered in linear time without panicking.

use super::names::has_secret_segment;

/// The alphabet of a token body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alphabet {
    /// `A-Z a-z 0-9`.
    Base62,
    /// Base62 plus `_`.
    Base62Underscore,
    /// Base62 plus `-` and `_`.
    Base64Url,
    /// Base64url plus `.`.
    Dotted,
    /// `0-9 a-f`.
    Hex,
    /// `A-Z 0-9`.
    Upper,
}

impl Alphabet {
    fn contains(self, c: u8) -> bool {
        match self {
            Alphabet::Base62 => c.is_ascii_alphanumeric(),
            Alphabet::Base62Underscore => c.is_ascii_alphanumeric() || c == b'_',
            Alphabet::Base64Url => c.is_ascii_alphanumeric() || c == b'_' || c == b'-',
            Alphabet::Dotted => c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'),
            Alphabet::Hex => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
            Alphabet::Upper => c.is_ascii_uppercase() || c.is_ascii_digit(),
        }
    }
}

/// A token format: prefix, then a body of `min..=max` characters of `alphabet`.
#[derive(Debug, Clone, Copy)]
pub(super) struct TokenShape {
    pub prefix: &'static str,
    pub alphabet: Alphabet,
    pub min: usize,
    pub max: usize,
}

const fn shape(prefix: &'static str, alphabet: Alphabet, min: usize, max: usize) -> TokenShape {
    TokenShape {
        prefix,
        alphabet,
        min,
        max,
    }
}

/// Longest a token body is allowed to be; real tokens are far shorter.
const LONG: usize = 1024;

/// Known token formats. `sk-`, shared by several model vendors, additionally needs a run of 16
/// letters and digits, which a branch or a slug never has.
pub(super) const TOKEN_SHAPES: &[TokenShape] = &[
    shape("sk-", Alphabet::Base64Url, 20, LONG), // OpenAI, Anthropic, DeepSeek, OpenRouter
    shape("ghp_", Alphabet::Base62, 36, 251),    // GitHub personal access token
    shape("gho_", Alphabet::Base62, 36, 251),    // GitHub OAuth token
    shape("ghu_", Alphabet::Base62, 36, 251),    // GitHub user-to-server token
    shape("ghs_", Alphabet::Base62, 36, 251),    // GitHub server-to-server token
    shape("ghr_", Alphabet::Base62, 36, 251),    // GitHub refresh token
    shape("github_pat_", Alphabet::Base62Underscore, 40, 251), // GitHub fine-grained token
    shape("glpat-", Alphabet::Base64Url, 20, LONG), // GitLab personal access token
    shape("glrt-", Alphabet::Base64Url, 20, LONG), // GitLab runner token
    shape("xoxb-", Alphabet::Base64Url, 20, LONG), // Slack bot token
    shape("xoxp-", Alphabet::Base64Url, 20, LONG), // Slack user token
    shape("xoxa-", Alphabet::Base64Url, 20, LONG), // Slack app token
    shape("xoxr-", Alphabet::Base64Url, 20, LONG), // Slack refresh token
    shape("xoxe-", Alphabet::Base64Url, 20, LONG), // Slack config token
    shape("xapp-", Alphabet::Base64Url, 20, LONG), // Slack app-level token
    shape("AIza", Alphabet::Base64Url, 35, 35),  // Google API key
    shape("ya29.", Alphabet::Dotted, 20, LONG),  // Google OAuth access token
    shape("SG.", Alphabet::Dotted, 60, 80),      // SendGrid API key
    shape("dop_v1_", Alphabet::Hex, 64, 64),     // DigitalOcean personal token
    shape("doo_v1_", Alphabet::Hex, 64, 64),     // DigitalOcean OAuth token
    shape("dor_v1_", Alphabet::Hex, 64, 64),     // DigitalOcean refresh token
    shape("sk_live_", Alphabet::Base62, 16, LONG), // Stripe secret key
    shape("sk_test_", Alphabet::Base62, 16, LONG), // Stripe test secret key
    shape("rk_live_", Alphabet::Base62, 16, LONG), // Stripe restricted key
    shape("rk_test_", Alphabet::Base62, 16, LONG), // Stripe test restricted key
    shape("whsec_", Alphabet::Base62, 24, LONG), // Stripe webhook secret
    shape("npm_", Alphabet::Base62, 36, 36),     // npm access token
    shape("hf_", Alphabet::Base62, 30, LONG),    // Hugging Face token
    shape("gsk_", Alphabet::Base62, 40, LONG),   // Groq API key
    shape("xai-", Alphabet::Base62, 40, LONG),   // xAI API key
    shape("r8_", Alphabet::Base62, 30, LONG),    // Replicate API token
    shape("pypi-", Alphabet::Base64Url, 50, LONG), // PyPI upload token
    shape("dckr_pat_", Alphabet::Base64Url, 20, LONG), // Docker Hub access token
    shape("lin_api_", Alphabet::Base62, 30, LONG), // Linear API key
    shape("shpat_", Alphabet::Hex, 32, 32),      // Shopify access token
    shape("shpss_", Alphabet::Hex, 32, 32),      // Shopify shared secret
    shape("PMAK-", Alphabet::Base64Url, 50, LONG), // Postman API key
    shape("secret_", Alphabet::Base62, 40, LONG), // Notion integration secret
    shape("ntn_", Alphabet::Base62, 40, LONG),   // Notion token
    shape("key-", Alphabet::Hex, 32, 32),        // Mailgun API key
    shape("AKIA", Alphabet::Upper, 16, 16),      // AWS access key id
    shape("ASIA", Alphabet::Upper, 16, 16),      // AWS temporary access key id
    shape("AGE-SECRET-KEY-1", Alphabet::Upper, 50, LONG), // age secret key
];

/// Hosts whose URL path is itself the secret, with the path that starts it.
const WEBHOOKS: &[(&str, &str)] = &[
    ("hooks.slack.com", "/services/"),
    ("hooks.slack.com", "/workflows/"),
    ("hooks.slack.com", "/triggers/"),
    ("discord.com", "/api/webhooks/"),
    ("discordapp.com", "/api/webhooks/"),
    ("ptb.discord.com", "/api/webhooks/"),
    ("canary.discord.com", "/api/webhooks/"),
    ("outlook.office.com", "/webhook/"),
    ("api.telegram.org", "/bot"),
];

/// Query parameters that carry a signature rather than a name the name rule knows.
const SIGNATURE_PARAMS: &[&str] = &["sig", "signature", "x-amz-signature", "x-goog-signature"];

/// The shortest assigned value, query parameter or authorization credential that counts: shorter
/// ones are flags and placeholders (`auth=1`, `key=on`).
const MIN_ASSIGNED_LEN: usize = 4;
const MIN_PARAM_LEN: usize = 8;

/// The value half of the rule (see the module doc).
#[must_use]
pub fn value_is_credential(value: &str) -> bool {
    let v = value.trim();
    if v.is_empty() {
        return false;
    }
    private_key_block(v)
        || words(v).any(is_token)
        || url_candidates(v).any(url_is_credential)
        || assignments(v)
        || authorization(v)
        || netrc(v)
        || basic_pair(unquote(v))
}

/// The known format of `word`, if it is a token.
#[must_use]
pub(super) fn token_shape(word: &str) -> Option<&'static TokenShape> {
    TOKEN_SHAPES.iter().find(|shape| {
        word.strip_prefix(shape.prefix)
            .is_some_and(|body| body_fits(shape, body))
    })
}

fn body_fits(shape: &TokenShape, body: &str) -> bool {
    let bytes = body.as_bytes();
    (shape.min..=shape.max).contains(&bytes.len())
        && bytes.iter().all(|&c| shape.alphabet.contains(c))
        && (shape.prefix != "sk-" || longest_mixed_run(bytes) >= 16)
        && (shape.prefix != "SG." || body.split('.').filter(|p| p.len() >= 16).count() == 2)
}

/// Length of the longest run of letters and digits.
fn longest_mixed_run(bytes: &[u8]) -> usize {
    bytes
        .split(|c| !c.is_ascii_alphanumeric())
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0)
}

fn is_token(word: &str) -> bool {
    token_shape(word).is_some() || is_jose(word)
}

/// The words of a value: maximal runs of token characters, so quotes, `=`, `:`, `/` and `@` around
/// a token do not hide it. A trailing `.` (end of a sentence) is not part of the word.
fn words(v: &str) -> impl Iterator<Item = &str> {
    v.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| w.len() >= 8)
}

/// A JWT (`header.payload.signature`) or JWE (`header.key.iv.ciphertext.tag`, the key part empty
/// under direct encryption), header first: base64url of `{"`.
fn is_jose(word: &str) -> bool {
    if !word.starts_with("eyJ") {
        return false;
    }
    let parts: Vec<&str> = word.split('.').collect();
    let b64 = |p: &&str| {
        p.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'='))
    };
    if !parts.iter().all(b64) {
        return false;
    }
    match parts.len() {
        3 => parts.iter().all(|p| !p.is_empty()) && parts[1].len() >= 4,
        5 => parts[2..].iter().all(|p| !p.is_empty()) && parts[3].len() >= 4,
        _ => false,
    }
}

fn private_key_block(v: &str) -> bool {
    v.contains("-----BEGIN") && v.contains("PRIVATE KEY")
}

/// Pieces of a value that may be URLs, each after its `scheme://`: a value may hold several
/// (`NO_PROXY`-like lists).
fn url_candidates(v: &str) -> impl Iterator<Item = &str> {
    v.split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\'' | '<' | '>'))
        .filter_map(|token| Some(token.split_once("://")?.1))
}

/// Whether a URL (`rest`: what follows its `scheme://`) carries a credential.
fn url_is_credential(rest: &str) -> bool {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            if userinfo_is_credential(userinfo) {
                return true;
            }
            host
        }
        None => authority,
    };
    let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
    let path = tail.split(['?', '#']).next().unwrap_or("");
    let webhook = WEBHOOKS
        .iter()
        .any(|(h, p)| host == *h && path.starts_with(p) && path.len() >= p.len() + 8)
        || (host.ends_with(".webhook.office.com")
            && path.starts_with("/webhook")
            && path.len() >= 20);
    webhook || query_is_credential(tail)
}

/// `user:password` (a non-empty password), or a user that is a token: a known shape, or 20+
/// letters and digits (a classic 40-hex GitHub token as the user of a clone URL).
fn userinfo_is_credential(userinfo: &str) -> bool {
    match userinfo.split_once(':') {
        Some((_, password)) => !password.is_empty(),
        None => {
            is_token(userinfo)
                || (userinfo.len() >= 20
                    && userinfo
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
                    && userinfo.bytes().any(|c| c.is_ascii_digit())
                    && userinfo.bytes().any(|c| c.is_ascii_alphabetic()))
        }
    }
}

fn query_is_credential(tail: &str) -> bool {
    let Some((_, query)) = tail.split_once('?') else {
        return false;
    };
    let query = query.split('#').next().unwrap_or(query);
    query.split('&').any(|pair| {
        let Some((name, value)) = pair.split_once('=') else {
            return false;
        };
        value.len() >= MIN_PARAM_LEN
            && (has_secret_segment(name)
                || SIGNATURE_PARAMS
                    .iter()
                    .any(|s| name.eq_ignore_ascii_case(s)))
    })
}

/// `name=value` items (separated by `;`, `&`, `,` or whitespace) whose name has a secret segment:
/// connection strings (`AccountKey=…`, `Password=…`), npmrc (`//host/:_authToken=…`), cookies.
fn assignments(v: &str) -> bool {
    v.split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | ','))
        .filter_map(|item| item.split_once('='))
        .any(|(name, value)| {
            let value = unquote(value);
            value.len() >= MIN_ASSIGNED_LEN
                && !value.bytes().all(|c| c.is_ascii_digit())
                && !["true", "false", "none", "null", "never", "always"]
                    .iter()
                    .any(|word| value.eq_ignore_ascii_case(word))
                && has_secret_segment(name)
        })
}

/// `Bearer <credential>`, `Basic <credential>`, `Token <credential>` or `Authorization: <anything>`.
fn authorization(v: &str) -> bool {
    let mut words = v.split_whitespace().map(unquote);
    // No word at all: "" names no scheme, and there is no next word to judge.
    let mut word = words.next().unwrap_or_default();
    words.any(|next| {
        let label = word.trim_end_matches(':');
        let is = |name: &str| label.eq_ignore_ascii_case(name);
        let found = if is("authorization") || is("proxy-authorization") {
            word.ends_with(':') && !next.is_empty()
        } else if is("bearer") || is("basic") || is("token") {
            credential_word(next)
        } else {
            false
        };
        word = next;
        found
    })
}

/// A word after `Bearer`/`Basic`/`Token`: 8+ token characters that are not an ordinary word.
fn credential_word(word: &str) -> bool {
    let bytes = word.as_bytes();
    bytes.len() >= 8
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"-._~+/=".contains(&c))
        && ((bytes.iter().any(u8::is_ascii_digit) && bytes.iter().any(u8::is_ascii_alphabetic))
            || (bytes.len() >= 16 && bytes.iter().any(|c| b"-._~+/=".contains(c))))
}

/// netrc text: a `machine`, `default` or `login` entry with a `password`.
fn netrc(v: &str) -> bool {
    let (mut entry, mut password) = (false, false);
    let mut after_password = false;
    for word in v.split_whitespace() {
        // Words are never empty: a word after `password` is its value.
        password |= after_password;
        after_password = matches!(word, "password" | "passwd");
        entry |= matches!(word, "machine" | "default" | "login");
    }
    entry && password
}

/// The whole value is base64 of `user:password` (printable, no spaces, both sides non-empty).
fn basic_pair(v: &str) -> bool {
    if v.len() < 8 {
        return false;
    }
    let Some(decoded) = decode_base64(v) else {
        return false;
    };
    decoded.iter().all(u8::is_ascii_graphic)
        && decoded
            .iter()
            .position(|&c| c == b':')
            .is_some_and(|i| i > 0 && i + 1 < decoded.len())
}

/// Standard base64 (padding optional), `None` when `v` is not base64.
fn decode_base64(v: &str) -> Option<Vec<u8>> {
    let body = v.trim_end_matches('=');
    if v.len() - body.len() > 2 || body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in body.bytes() {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

/// `v` without one pair of surrounding quotes.
fn unquote(v: &str) -> &str {
    let v = v.trim();
    for quote in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(quote).and_then(|s| s.strip_suffix(quote)) {
            return inner;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_built_by_its_constructor() {
        let ghp = shape("ghp_", Alphabet::Base62, 36, 251);
        let found = token_shape(&format!("ghp_{}", "a1".repeat(18))).unwrap();
        assert_eq!(
            (found.prefix, found.alphabet, found.min, found.max),
            (ghp.prefix, ghp.alphabet, ghp.min, ghp.max)
        );
    }

    #[test]
    fn edge_values_of_each_rule() {
        // A user of a URL that starts like a JWT but is none.
        assert!(!value_is_credential("https://eyJa!bc.de.fg@example.com/"));
        assert!(
            !value_is_credential("eyJhbGciOi.eyJzdWIiOi.c2ln.ZXh0cmE"),
            "4 parts"
        );
        // A query item without `=` is skipped, the next one still counts.
        assert!(value_is_credential(
            "https://h.example/x?flag&token=abcdefgh12"
        ));
        assert!(!value_is_credential("https://h.example/x?flag&page=2"));
        // Letters and punctuation, no digit: a credential only from 16 characters on.
        assert!(value_is_credential("Bearer abcdefghij-klmnopq"));
        assert!(!value_is_credential("Bearer abcd-efg"));
        // A quoted `user:password` pair in base64.
        assert!(value_is_credential("\"dXNlcjpwYXNz\""));
        assert_eq!(unquote(" 'x' "), "x");
        assert_eq!(unquote("\"y"), "\"y", "one quote is no pair");
    }

    #[test]
    fn base64_decoding() {
        assert_eq!(decode_base64("Pj4+").unwrap(), b">>>");
        assert_eq!(decode_base64("Pz8/").unwrap(), b"???");
        assert_eq!(decode_base64("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert_eq!(decode_base64("YTpi").unwrap(), b"a:b");
        assert_eq!(decode_base64("YWI=").unwrap(), b"ab");
        assert!(decode_base64("a").is_none());
        assert!(decode_base64("ab!d").is_none());
    }

    #[test]
    fn every_shape_has_a_sane_range() {
        for shape in TOKEN_SHAPES {
            assert!(
                shape.min >= 16 && shape.min <= shape.max,
                "{}",
                shape.prefix
            );
        }
    }

    #[test]
    fn token_shapes_check_length_and_alphabet() {
        let shape = |t| token_shape(t).map(|s| s.prefix);
        assert_eq!(
            shape("ghp_0123456789abcdefghijABCDEFGHIJ012345"),
            Some("ghp_")
        );
        assert_eq!(shape("ghp_0123456789abcdefghijABCDEFGHIJ01234"), None);
        assert_eq!(shape("ghp_0123456789abcdefghijABCDEFGHIJ01234!"), None);
        assert_eq!(shape("AKIAIOSFODNN7EXAMPLE"), Some("AKIA"));
        assert_eq!(shape("AKIAIOSFODNN7EXAMPLEX"), None);
        assert_eq!(shape("sk-1234-add-login-page-and-more"), None);
    }
}
