//! The bridge's WebSocket client (`ws://`, `wss://`), ours rather than the SDK's: the SDK's
//! client hands every frame it receives to an unbounded queue, so a server that floods frames
//! faster than the run reads them grows the bridge without limit. Here the next message is read
//! from the socket only once stdout took the previous one, so a fast server is slowed down by TCP
//! (as `acp-host serve` slows a fast agent down: `super::websocket`), and what the bridge holds is
//! one message plus the socket's buffers.
//!
//! Invariants:
//! - the upgrade is the transport's: HTTP/1.1, no redirect, no subprotocol or extension, the
//!   server's `Sec-WebSocket-Accept` checked; the token travels in the client's default headers,
//!   marked sensitive;
//! - one text message is one line of stdout (a raw line break in it can only be JSON whitespace,
//!   so it becomes a space), one line of stdin one text message; a message is at most
//!   [`DEFAULT_MAX_FRAME_BYTES`]; binary messages are ignored;
//! - the bridge ends when its stdin closes (the connection is closed) or the server ends the
//!   connection (an error: the run sees its agent exit).

use async_tungstenite::WebSocketStream;
use async_tungstenite::tokio::TokioAdapter;
use async_tungstenite::tungstenite::Message;
use async_tungstenite::tungstenite::handshake::client::generate_key;
use async_tungstenite::tungstenite::handshake::derive_accept_key;
use async_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use futures::StreamExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio_util::codec::{FramedRead, LinesCodec};

use crate::run::DEFAULT_MAX_FRAME_BYTES;

/// Connects to `endpoint` (`ws://` or `wss://`, its path final) with `http`, then relays stdin
/// and stdout until either ends. The error says what failed (an HTTP status among it).
pub(super) async fn bridge(
    http: reqwest::Client,
    endpoint: reqwest::Url,
) -> Result<(), super::failure::Failure> {
    let socket = connect(&http, endpoint).await?;
    relay(socket).await.map_err(super::failure::Failure::Other)
}

type Socket = WebSocketStream<TokioAdapter<reqwest::Upgraded>>;

async fn connect(
    http: &reqwest::Client,
    mut endpoint: reqwest::Url,
) -> Result<Socket, super::failure::Failure> {
    use super::failure::Failure;
    let scheme = if endpoint.scheme() == "wss" {
        "https"
    } else {
        "http"
    };
    endpoint
        .set_scheme(scheme)
        .map_err(|()| Failure::Other("cannot convert the WebSocket URL".to_owned()))?;
    let key = generate_key();
    let response = http
        .get(endpoint)
        .version(reqwest::Version::HTTP_11)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", &key)
        .send()
        .await
        .map_err(|err| {
            if super::failure::refused(&err) {
                Failure::Refused
            } else {
                Failure::Other(format!("WebSocket connect failed: {err}"))
            }
        })?;
    check_upgrade(&response, &derive_accept_key(key.as_bytes()))
        .map_err(|reason| Failure::Other(format!("WebSocket connect failed: {reason}")))?;
    let upgraded = response
        .upgrade()
        .await
        .map_err(|err| Failure::Other(format!("WebSocket connect failed: {err}")))?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(DEFAULT_MAX_FRAME_BYTES))
        .max_frame_size(Some(DEFAULT_MAX_FRAME_BYTES));
    Ok(
        WebSocketStream::from_raw_socket(TokioAdapter::new(upgraded), Role::Client, Some(config))
            .await,
    )
}

/// The server's answer is an upgrade to a plain WebSocket, for this key.
fn check_upgrade(response: &reqwest::Response, accept: &str) -> Result<(), String> {
    let status = response.status();
    if status != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        return Err(format!("unexpected status {status}"));
    }
    let headers = response.headers();
    let is = |name: &str, value: &str| {
        headers
            .get(name)
            .is_some_and(|given| given.as_bytes().eq_ignore_ascii_case(value.as_bytes()))
    };
    if !is("upgrade", "websocket") {
        return Err("invalid upgrade header".to_owned());
    }
    if headers
        .get("sec-websocket-accept")
        .map(reqwest::header::HeaderValue::as_bytes)
        != Some(accept.as_bytes())
    {
        return Err("invalid Sec-WebSocket-Accept".to_owned());
    }
    for header in ["sec-websocket-protocol", "sec-websocket-extensions"] {
        if headers.contains_key(header) {
            return Err(format!("unsupported {header}"));
        }
    }
    Ok(())
}

async fn relay(socket: Socket) -> Result<(), String> {
    let (mut to_server, mut from_server) = socket.split();
    let outbound = async {
        let mut stdin = FramedRead::new(
            tokio::io::stdin(),
            LinesCodec::new_with_max_length(DEFAULT_MAX_FRAME_BYTES),
        );
        while let Some(line) = stdin.next().await {
            let line = line.map_err(|err| format!("cannot read stdin: {err}"))?;
            if line.trim().is_empty() {
                continue;
            }
            to_server
                .send(Message::text(line))
                .await
                .map_err(|err| format!("ws send: {err}"))?;
        }
        // The run closed our stdin: it is done with the agent; say goodbye (best effort).
        let _ = to_server.close(None).await;
        Ok(())
    };
    let inbound = async {
        let mut stdout = tokio::io::stdout();
        loop {
            let text = match from_server.next().await {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Binary(_))) => {
                    tracing::warn!("ignored a binary WebSocket message (ACP frames are text)");
                    continue;
                }
                Some(Ok(Message::Close(_))) | None => {
                    return Err("the server closed the connection".to_owned());
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => return Err(format!("ws recv: {err}")),
            };
            // The next message is read only once stdout took this one: the bound.
            let mut line = super::websocket::one_line(text.as_str()).into_bytes();
            line.push(b'\n');
            stdout
                .write_all(&line)
                .await
                .and(stdout.flush().await)
                .map_err(|err| format!("cannot write stdout: {err}"))?;
        }
    };
    tokio::select! {
        result = outbound => result,
        result = inbound => result,
    }
}
