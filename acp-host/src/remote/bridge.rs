//! The bridge: one ACP connection to a remote agent, carried between this process's stdin/stdout
//! (newline-delimited JSON-RPC, as any stdio agent speaks) and the SDK's HTTP/SSE client or our
//! own WebSocket client (`super::bridge_ws`, which reads a frame only once stdout took the last),
//! chosen by the URL's scheme.
//!
//! Invariants: nothing but frames is written to stdout; the token is sent as an `Authorization:
//! Bearer` header marked sensitive (never logged) and is never printed; the bridge ends when its
//! stdin closes (the run's teardown: the connection is closed) or when the server ends the
//! connection (the run then sees its agent exit).

use std::path::{Path, PathBuf};

use agent_client_protocol::{ByteStreams, Client, ConnectTo};
use agent_client_protocol_http::HttpClient;
use protocol::remote::{self, Token, TokenError};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use super::failure::Failure;

/// What the bridge connects to.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// `ws://`, `wss://`, `http://` or `https://`; an empty path means the transport's `/acp`.
    pub url: String,
    pub token: Option<Token>,
}

/// Why the bridge could not connect, or why the connection failed.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("invalid remote agent URL {url}")]
    Url {
        url: String,
        #[source]
        source: agent_client_protocol_http::HttpClientError,
    },
    #[error("the connection to {url} failed{}", hint(&format!("{source:?}")))]
    Connection {
        url: String,
        #[source]
        source: agent_client_protocol::Error,
    },
    #[error("the connection to {url} failed: {reason}{}", hint(reason))]
    WebSocket { url: String, reason: String },
    /// Nothing listens at the URL's address: the likeliest fix first.
    #[error(
        "connection refused to {address}: is acp-host serve running there? (start it there with \
         `acp-host serve --listen {address}`, or fix --agent's URL)"
    )]
    Refused { address: String },
}

/// `HOST:PORT` of a URL (the scheme's port when it names none), for messages; the URL itself
/// when it does not parse.
fn address(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|parsed| {
            let port = parsed.port_or_known_default().or(match parsed.scheme() {
                "ws" => Some(80),
                "wss" => Some(443),
                _ => None,
            })?;
            Some(format!("{}:{port}", parsed.host_str()?))
        })
        .unwrap_or_else(|| url.to_owned())
}

/// Why a token could not be read (the value is never shown).
#[derive(Debug, thiserror::Error)]
pub enum TokenReadError {
    #[error("cannot read the token file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the token file {} {source}", path.display())]
    BadFile {
        path: PathBuf,
        #[source]
        source: TokenError,
    },
    #[error("the token variable {name} is not set (export it, or pass --token-file)")]
    Unset { name: String },
    #[error("the token variable {name} {source}")]
    BadVar {
        name: String,
        #[source]
        source: TokenError,
    },
}

/// What to do about a refusal by `acp-host serve`, from the error's text (the SDK reports the
/// HTTP status as text only).
fn hint(text: &str) -> &'static str {
    if text.contains("401 Unauthorized") {
        " (the server wants its bearer token: acp-host run --token-file FILE or --token-env NAME)"
    } else if text.contains("503 Service Unavailable") {
        " (the server runs as many agents as it allows at once; try again later)"
    } else {
        ""
    }
}

/// The token in `path`.
pub fn token_from_file(path: &Path) -> Result<Token, TokenReadError> {
    // A token file is a line; reading at most a little past the limit keeps a wrong path (a log,
    // a device) from being read whole.
    use std::io::Read as _;
    let limit = u64::try_from(remote::MAX_TOKEN_BYTES + 2).unwrap_or(u64::MAX);
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(limit).read_to_string(&mut text))
        .map_err(|source| TokenReadError::File {
            path: path.to_path_buf(),
            source,
        })?;
    remote::parse_token(&text).map_err(|source| TokenReadError::BadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The token in the variable `name` of `value` (the caller looked it up).
pub fn token_from_var(name: &str, value: Option<&str>) -> Result<Token, TokenReadError> {
    let value = value.ok_or_else(|| TokenReadError::Unset {
        name: name.to_owned(),
    })?;
    remote::parse_token(value).map_err(|source| TokenReadError::BadVar {
        name: name.to_owned(),
        source,
    })
}

/// Relays this process's stdin/stdout to the remote agent until either side ends.
pub async fn bridge(config: BridgeConfig) -> Result<(), BridgeError> {
    let url = config.url.clone();
    let client = http_client(&config).map_err(|source| BridgeError::Url {
        url: url.clone(),
        source,
    })?;
    if let Some(endpoint) = websocket_endpoint(&config) {
        // Our own client: the SDK's queues a server's frames without a bound (`bridge_ws`).
        let http = configure(reqwest::Client::builder(), &config)
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| BridgeError::WebSocket {
                url: url.clone(),
                reason: err.to_string(),
            })?;
        return super::bridge_ws::bridge(http, endpoint)
            .await
            .map_err(|failure| match failure {
                Failure::Refused => BridgeError::Refused {
                    address: address(&url),
                },
                Failure::Other(reason) => BridgeError::WebSocket { url, reason },
            });
    }
    let stdio = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    let Err(source) = ConnectTo::<Client>::connect_to(client, stdio).await else {
        return Ok(());
    };
    // The SDK's error carries its cause as text only, and "error sending request" is any failure
    // to connect: only then is the address tried once more, to tell a refusal.
    let text = format!("{source:?}");
    let address = address(&url);
    if text.contains("Connection refused")
        || (text.contains("error sending request")
            && tokio::net::TcpStream::connect(&address)
                .await
                .is_err_and(|err| err.kind() == std::io::ErrorKind::ConnectionRefused))
    {
        return Err(BridgeError::Refused { address });
    }
    Err(BridgeError::Connection { url, source })
}

/// The endpoint of a `ws://` or `wss://` URL (the transport's `/acp` for a bare one); `None`
/// for `http://` and `https://` (the SDK's client), and for a URL the SDK's parser refused
/// already.
fn websocket_endpoint(config: &BridgeConfig) -> Option<reqwest::Url> {
    let mut endpoint = reqwest::Url::parse(&config.url).ok()?;
    if !matches!(endpoint.scheme(), "ws" | "wss") {
        return None;
    }
    if is_bare(&config.url) {
        endpoint.set_path("/acp");
    }
    Some(endpoint)
}

/// A URL without a path (or with `/` alone) means the transport's default endpoint.
fn is_bare(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(_, rest)| rest.split_once('/').is_none_or(|(_, path)| path.is_empty()))
}

fn http_client(
    config: &BridgeConfig,
) -> Result<HttpClient, agent_client_protocol_http::HttpClientError> {
    // An empty path is the transport's default endpoint (`/acp`); any other is taken as it is.
    let builder = if is_bare(&config.url) {
        HttpClient::builder(&config.url)
    } else {
        HttpClient::builder_with_endpoint(&config.url)
    };
    builder
        .configure_http(|http| configure(http, config))
        .build()
}

/// The HTTP client's setup for either client: the token as a sensitive default header, and no
/// TLS roots for a plain connection.
fn configure(http: reqwest::ClientBuilder, config: &BridgeConfig) -> reqwest::ClientBuilder {
    let headers = config.token.as_ref().map(|token| {
        let mut value =
            reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .expect("protocol::remote::parse_token admits only header-safe ASCII");
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        headers
    });
    // A plain connection never uses TLS: an empty set of roots spares loading the system's (a
    // few tens of milliseconds on every run), and a redirect to TLS fails instead.
    let plain = config.url.get(..5).is_some_and(|scheme| {
        scheme.eq_ignore_ascii_case("ws://") || scheme.eq_ignore_ascii_case("http:")
    });
    let http = match headers {
        Some(headers) => http.default_headers(headers),
        None => http,
    };
    if plain {
        http.tls_certs_only(Vec::new())
    } else {
        http
    }
}
