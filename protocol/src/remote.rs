//! Remote agents over ACP's Streamable HTTP / WebSocket transport: the decisions, without I/O.
//!
//! - [`remote_agent`]: whether an `--agent` value names a remote agent (a `ws://`, `wss://`,
//!   `http://` or `https://` URL) rather than a registry name or a command line;
//! - [`bridge_args`]: the arguments of the hidden `acp-host bridge` an `acp-host run` spawns as
//!   the agent process for such a URL, where the token comes from (never its value);
//! - [`parse_token`]: what a token file or variable holds, checked once (one line, printable,
//!   usable as a bearer credential);
//! - [`check_listen`]: whether `acp-host serve` may listen where it was asked to without a token;
//! - [`check_browser`]: whether a request to `acp-host serve` may be a web page's (a foreign
//!   `Host` after DNS rebinding, an `Origin`), checked on every route before anything else.
//!
//! Invariants: a token's value never appears in an argument list, an error message or a `Debug`
//! rendering; only loopback addresses may serve without a token, and then only to requests that
//! name a loopback host; no request carrying an `Origin` (a browser's) is served.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

/// The URL schemes the transport speaks (`agent-client-protocol-http`'s client).
pub const SCHEMES: [&str; 4] = ["ws", "wss", "http", "https"];

/// The hidden subcommand of `acp-host` that carries one agent connection over the network.
pub const BRIDGE_SUBCOMMAND: &str = "bridge";

/// How acp-host's command line starts the one line of an error (the bridge's included), so a run
/// can tell its bridge's error in the stderr tail.
pub const ERROR_PREFIX: &str = "acp-host: error: ";

/// The longest token accepted, in bytes: a bearer token, not a file's worth of text.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Default `acp-host serve --max-connections`: each connection is an agent process.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4;

/// The `--agent` value when it is a remote agent's URL (`scheme://...`, one of [`SCHEMES`],
/// case-insensitive scheme), else `None` (a registry name or a command line).
#[must_use]
pub fn remote_agent(agent: &str) -> Option<&str> {
    let agent = agent.trim();
    let (scheme, rest) = agent.split_once("://")?;
    let known = SCHEMES
        .iter()
        .any(|known| scheme.eq_ignore_ascii_case(known));
    (known && !rest.is_empty() && !agent.contains(char::is_whitespace)).then_some(agent)
}

/// What replaces a secret of a remote agent's URL wherever the URL is shown.
pub const REDACTED: &str = "[redacted]";

/// A remote agent's URL as it may be shown (in a run's events and result, the bridge's errors),
/// and the secrets it held: the userinfo (`user:TOKEN@`, `TOKEN@`) and every query value
/// (`?token=...`) become [`REDACTED`]. The URL itself still reaches the bridge whole.
#[must_use]
pub fn shown_url(url: &str) -> (String, Vec<String>) {
    let mut secrets = Vec::new();
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            secrets.push(userinfo.to_owned());
            format!("{REDACTED}@{host}")
        }
        None => authority.to_owned(),
    };
    let (before_fragment, fragment) = tail.split_at(tail.find('#').unwrap_or(tail.len()));
    let tail = match before_fragment.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if !value.is_empty() => {
                        secrets.push(value.to_owned());
                        format!("{key}={REDACTED}")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => before_fragment.to_owned(),
    };
    let scheme = if scheme.is_empty() {
        String::new()
    } else {
        format!("{scheme}://")
    };
    (format!("{scheme}{authority}{tail}{fragment}"), secrets)
}

/// `text` with every one of `secrets` (from [`shown_url`]) replaced by [`REDACTED`], the longest
/// first.
#[must_use]
pub fn redact_url_secrets(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.into_iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret.as_str(), REDACTED)
    })
}

/// Where the bearer token of a remote agent comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--token-file FILE` (absolute by the time it reaches the bridge: the bridge runs in the
    /// agent's working directory).
    File(PathBuf),
    /// `--token-env NAME`: the variable is forwarded to the bridge alone (the run's `--env NAME`),
    /// past the credential scrub.
    Env(String),
}

/// The arguments after the `acp-host` program that run the bridge to `url`.
#[must_use]
pub fn bridge_args(url: &str, token: Option<&TokenSource>) -> Vec<String> {
    let mut args = vec![BRIDGE_SUBCOMMAND.to_owned(), url.to_owned()];
    match token {
        Some(TokenSource::File(path)) => {
            args.extend(["--token-file".to_owned(), path.display().to_string()]);
        }
        Some(TokenSource::Env(name)) => args.extend(["--token-env".to_owned(), name.clone()]),
        None => {}
    }
    args
}

/// A bearer token, checked. Its `Debug` never shows the value (it has no `Display`).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The value, for the one place that sends or compares it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

/// Why a token file or variable holds no usable token (the value is never shown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("is empty")]
    Empty,
    #[error("holds more than one line (a token is one line)")]
    MultiLine,
    #[error("is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("holds whitespace or control characters (a token is printable ASCII without spaces)")]
    NotPrintable,
}

/// The token in `text` (a file's content or a variable's value): one line, its line ending and
/// surrounding whitespace ignored, printable ASCII without spaces (what an HTTP header carries).
pub fn parse_token(text: &str) -> Result<Token, TokenError> {
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::Empty);
    }
    if token.contains(['\n', '\r']) {
        return Err(TokenError::MultiLine);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLong);
    }
    if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(TokenError::NotPrintable);
    }
    Ok(Token(token.to_owned()))
}

/// The shortest token `acp-host serve` accepts: one shorter could be guessed.
pub const MIN_SERVE_TOKEN_BYTES: usize = 16;

/// `acp-host serve`'s token is too short to guard it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "is shorter than {MIN_SERVE_TOKEN_BYTES} bytes: anyone could guess it (make one with \
     `head -c 32 /dev/urandom | base64 > FILE`)"
)]
pub struct ShortToken;

/// Whether `token` may guard `acp-host serve` (a client sends whatever its server wants).
pub fn check_serve_token(token: &Token) -> Result<(), ShortToken> {
    if token.0.len() < MIN_SERVE_TOKEN_BYTES {
        return Err(ShortToken);
    }
    Ok(())
}

/// Whether a token file of permission bits `mode` can be read by users other than its owner
/// (its group or everyone): worth a warning, as ssh gives for a private key.
#[must_use]
pub fn token_file_exposed(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// `acp-host serve` may not listen there as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    #[error(
        "acp-host serve needs a token: pass --token-file FILE (clients send it as a bearer token), \
         or --insecure-no-auth on a loopback address"
    )]
    NoToken,
    #[error(
        "--insecure-no-auth is only allowed on a loopback address, not {0}: anyone who reaches \
         it could run the agent; pass --token-file FILE"
    )]
    InsecureNotLoopback(SocketAddr),
    #[error("--insecure-no-auth and --token-file exclude each other")]
    Both,
    #[error("--max-connections must be at least 1")]
    NoConnections,
}

/// Checks where and how `acp-host serve` listens: a token, or no token on loopback only.
pub fn check_listen(
    addr: SocketAddr,
    has_token: bool,
    insecure_no_auth: bool,
    max_connections: usize,
) -> Result<(), ListenError> {
    if max_connections == 0 {
        return Err(ListenError::NoConnections);
    }
    match (has_token, insecure_no_auth) {
        (true, true) => Err(ListenError::Both),
        (true, false) => Ok(()),
        (false, false) => Err(ListenError::NoToken),
        (false, true) if addr.ip().is_loopback() => Ok(()),
        (false, true) => Err(ListenError::InsecureNotLoopback(addr)),
    }
}

/// Why `acp-host serve` refused a request as a web page's (the header's value is not echoed: it
/// is the requester's text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrowserRefusal {
    #[error(
        "requests from browser pages are refused (the request carries an Origin header; ACP \
         clients send none)"
    )]
    Origin,
    #[error(
        "a server without a token (--insecure-no-auth) answers only requests to a loopback host \
         (localhost, 127.0.0.1, [::1]); this one names another (a web page after DNS rebinding?)"
    )]
    ForeignHost,
}

/// Whether a request may be served: none that carries an `Origin` (every browser sends one on a
/// POST and a WebSocket upgrade, same-origin after DNS rebinding included; ACP clients send
/// none), and, when `loopback_only` (a server without a token), none whose `host` (the `Host`
/// header or the URI's authority; `None` when absent) is not a loopback name: a page whose name
/// was rebound to 127.0.0.1 still sends its own name.
pub fn check_browser(
    host: Option<&[u8]>,
    has_origin: bool,
    loopback_only: bool,
) -> Result<(), BrowserRefusal> {
    if has_origin {
        return Err(BrowserRefusal::Origin);
    }
    let loopback = host
        .and_then(|host| std::str::from_utf8(host).ok())
        .is_some_and(is_loopback_host);
    if loopback_only && !loopback {
        return Err(BrowserRefusal::ForeignHost);
    }
    Ok(())
}

/// `localhost`, an IPv4 loopback address or `[::1]`, with or without a port (and a final dot).
fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        Some(_) if !host.ends_with(']') => return false,
        _ => host,
    };
    if let Some(v6) = name
        .strip_prefix('[')
        .and_then(|name| name.strip_suffix(']'))
    {
        return v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_transport_are_remote_agents_and_everything_else_is_not() {
        for url in [
            "ws://127.0.0.1:8080/acp",
            "wss://agents.example/acp",
            "http://host:1/",
            "HTTPS://host",
        ] {
            assert_eq!(remote_agent(url), Some(url), "{url}");
        }
        assert_eq!(remote_agent("  ws://h/acp "), Some("ws://h/acp"));
        for other in [
            "acp-child",
            "codex",
            "ssh -T host acp-child",
            "ftp://host/x",
            "ws://",
            "ws://host/a b",
            "./ws://x",
        ] {
            assert_eq!(remote_agent(other), None, "{other}");
        }
    }

    #[test]
    fn a_urls_secrets_are_never_shown() {
        let (shown, secrets) =
            shown_url("wss://bob:s3cr3t-tok@agents.example:443/acp?token=q-secret&x&e=#frag");
        assert_eq!(
            shown,
            "wss://[redacted]@agents.example:443/acp?token=[redacted]&x&e=#frag"
        );
        assert_eq!(secrets, ["bob:s3cr3t-tok", "q-secret"]);
        assert_eq!(
            shown_url("ws://h:1/acp"),
            ("ws://h:1/acp".to_owned(), Vec::new())
        );
        assert_eq!(shown_url("tok@h?k=v").0, "[redacted]@h?k=[redacted]");
        assert_eq!(
            redact_url_secrets(
                "connect to wss://bob:s3cr3t-tok@h/?token=q-secret failed (q-secret)",
                &[String::new(), "q-secret".into(), "bob:s3cr3t-tok".into()]
            ),
            "connect to wss://[redacted]@h/?token=[redacted] failed ([redacted])"
        );
    }

    #[test]
    fn the_bridge_gets_where_the_token_is_never_the_token() {
        assert_eq!(bridge_args("ws://h/acp", None), ["bridge", "ws://h/acp"]);
        assert_eq!(
            bridge_args("ws://h/acp", Some(&TokenSource::File("/k/t".into()))),
            ["bridge", "ws://h/acp", "--token-file", "/k/t"]
        );
        assert_eq!(
            bridge_args("ws://h/acp", Some(&TokenSource::Env("ACP_TOKEN".into()))),
            ["bridge", "ws://h/acp", "--token-env", "ACP_TOKEN"]
        );
    }

    #[test]
    fn a_token_is_one_printable_line_and_is_never_shown() {
        let token = parse_token("s3cr3t-Token_1\n").unwrap();
        assert_eq!(token.expose(), "s3cr3t-Token_1");
        assert_eq!(format!("{token:?}"), "Token(…)");
        assert_eq!(parse_token(" \n"), Err(TokenError::Empty));
        assert_eq!(parse_token("a\nb"), Err(TokenError::MultiLine));
        assert_eq!(parse_token("a b"), Err(TokenError::NotPrintable));
        assert_eq!(parse_token("caf\u{e9}"), Err(TokenError::NotPrintable));
        assert_eq!(
            parse_token(&"x".repeat(MAX_TOKEN_BYTES + 1)),
            Err(TokenError::TooLong)
        );
        for err in [
            TokenError::Empty,
            TokenError::MultiLine,
            TokenError::TooLong,
            TokenError::NotPrintable,
        ] {
            assert!(!err.to_string().contains("s3cr3t"));
        }
    }

    #[test]
    fn serve_wants_a_token_that_cannot_be_guessed_in_a_file_only_its_owner_reads() {
        let short = parse_token("x").unwrap();
        assert_eq!(check_serve_token(&short), Err(ShortToken));
        assert!(
            ShortToken
                .to_string()
                .starts_with("is shorter than 16 bytes")
        );
        let enough = parse_token(&"k".repeat(MIN_SERVE_TOKEN_BYTES)).unwrap();
        assert_eq!(check_serve_token(&enough), Ok(()));
        assert!(!token_file_exposed(0o600) && !token_file_exposed(0o400));
        assert!(
            token_file_exposed(0o644) && token_file_exposed(0o640) && token_file_exposed(0o604)
        );
    }

    #[test]
    fn only_loopback_serves_without_a_token() {
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(check_listen(any, true, false, 4), Ok(()));
        assert_eq!(check_listen(loopback, false, true, 4), Ok(()));
        assert_eq!(check_listen(v6, false, true, 4), Ok(()));
        assert_eq!(
            check_listen(loopback, false, false, 4),
            Err(ListenError::NoToken)
        );
        assert_eq!(
            check_listen(any, false, true, 4),
            Err(ListenError::InsecureNotLoopback(any))
        );
        assert_eq!(
            check_listen(loopback, true, true, 4),
            Err(ListenError::Both)
        );
        assert_eq!(
            check_listen(loopback, true, false, 0),
            Err(ListenError::NoConnections)
        );
    }

    #[test]
    fn a_web_page_is_refused_and_a_tokenless_server_answers_loopback_names_only() {
        for host in [
            "localhost",
            "LOCALHOST:8765",
            "localhost.",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8765",
        ] {
            assert_eq!(
                check_browser(Some(host.as_bytes()), false, true),
                Ok(()),
                "{host}"
            );
        }
        for host in [
            "attacker.example:8765",
            "localhost.attacker.example",
            "localhost:",
            "localhost:80x",
            "10.0.0.1:80",
            "[::2]:80",
            "[::1",
            "::1",
            "",
        ] {
            assert_eq!(
                check_browser(Some(host.as_bytes()), false, true),
                Err(BrowserRefusal::ForeignHost),
                "{host}"
            );
            // With a token, the host is a reverse proxy's business.
            assert_eq!(check_browser(Some(host.as_bytes()), false, false), Ok(()));
        }
        assert_eq!(
            check_browser(Some(b"\xff:80"), false, true),
            Err(BrowserRefusal::ForeignHost)
        );
        assert_eq!(
            check_browser(None, false, true),
            Err(BrowserRefusal::ForeignHost)
        );
        assert_eq!(check_browser(None, false, false), Ok(()));
        for loopback_only in [true, false] {
            assert_eq!(
                check_browser(Some(b"localhost"), true, loopback_only),
                Err(BrowserRefusal::Origin)
            );
        }
        for refusal in [BrowserRefusal::Origin, BrowserRefusal::ForeignHost] {
            assert!(
                refusal.to_string().contains("refused") || refusal.to_string().contains("loopback")
            );
        }
    }
}
