//! `acp-host serve`'s WebSocket connections, relayed by us rather than by the SDK's server: its
//! per-connection queues are unbounded, so a client that stops reading would grow the server's
//! memory by everything its agent writes. Here each frame is read from the agent's stdout only
//! once the previous one was taken by the socket, so a slow client slows its agent down (the agent
//! blocks on its full pipe), and what waits per connection is one frame plus the socket's buffers.
//!
//! Invariants:
//! - one WebSocket text message is one JSON-RPC frame, both ways; a client's message is written to
//!   the agent as one line (a raw line break can only be whitespace in JSON, so it becomes a
//!   space), and a JSON-RPC batch array is answered `-32600` and not forwarded, as the SDK's
//!   server does; binary messages are ignored;
//! - the agent's next frame is read only after the socket took the last one; a frame the client
//!   has not taken within the stall timeout ends the connection (the client is taken for dead);
//!   the client's next message is read only after the agent's stdin took the last one;
//! - an upgrade with an `Origin` header (a browser page's) never gets here: `serve` refuses it
//!   on every route, before the token;
//! - every ending (the agent's stdout ends, the client closes or vanishes, the server stops, a
//!   stall) tears the agent down through its [`Owned`] guard, which holds its slot until then.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts as _;
use axum::extract::Request;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _};

use super::agent::{Agents, Owned, agent_frames, start_agent};
use crate::process::AgentPipes;
use crate::run::DEFAULT_MAX_FRAME_BYTES;

/// How long a closing handshake may take before the socket is simply dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The answer to a JSON-RPC batch (not part of ACP), as the SDK's server gives it.
const BATCH_REJECTION: &str = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request","data":"JSON-RPC batches are not supported"}}"#;

/// Answers a WebSocket upgrade of the endpoint: the agent is spawned before the `101`, so a
/// failed spawn is an HTTP error the client sees.
pub(super) async fn upgrade(shared: Arc<Agents>, request: Request) -> Response {
    let (mut parts, _body) = request.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let (owned, pipes) = match start_agent(&shared) {
        Ok(Some(started)) => started,
        Ok(None) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "acp-host serve: stopping\n",
            )
                .into_response();
        }
        Err(message) => return (StatusCode::SERVICE_UNAVAILABLE, message).into_response(),
    };
    let id = owned.id;
    let mut response = ws
        .max_message_size(DEFAULT_MAX_FRAME_BYTES)
        .max_frame_size(DEFAULT_MAX_FRAME_BYTES)
        // If the upgrade fails, the callback is dropped with `owned`: its guard tears down.
        .on_upgrade(move |socket| relay(socket, shared, owned, pipes));
    if let Ok(value) = axum::http::HeaderValue::from_str(&format!("ws-{id}")) {
        response.headers_mut().insert("acp-connection-id", value);
    }
    response
}

/// How a connection ended (for the log).
#[derive(Debug, thiserror::Error)]
enum Ending {
    #[error("the agent's stdout ended")]
    AgentEnded,
    #[error("the client closed it")]
    ClientClosed,
    #[error("the client is gone: {0}")]
    ClientGone(String),
    #[error(
        "the client took no frame of its agent for {}s (--stall-timeout): ending it and its agent",
        .0.as_secs_f64()
    )]
    Stalled(Duration),
    #[error("the agent's stdin is closed")]
    AgentGone,
    #[error("{0}")]
    BadFrame(String),
    #[error("the server is stopping")]
    Stopped,
}

async fn relay(socket: WebSocket, shared: Arc<Agents>, mut owned: Owned, pipes: AgentPipes) {
    let (id, stall) = (owned.id, shared.config.stall_timeout);
    let (mut to_client, mut from_client) = socket.split();
    let AgentPipes { mut stdin, stdout } = pipes;
    let mut stdout = agent_frames(stdout, id);
    // Our own answers to the client (a batch's rejection), sent between the agent's frames.
    let (answer, mut answers) = tokio::sync::mpsc::channel::<&'static str>(1);
    let outbound = async {
        loop {
            let message = tokio::select! {
                line = stdout.next() => match line {
                    Some(Ok(line)) => Message::Text(line.into()),
                    Some(Err(err)) => return Ending::BadFrame(err.to_string()),
                    None => break,
                },
                Some(text) = answers.recv() => Message::Text(text.into()),
            };
            match tokio::time::timeout(stall, to_client.send(message)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Ending::ClientGone(err.to_string()),
                Err(_) => return Ending::Stalled(stall),
            }
        }
        // The agent ended: everything it wrote was sent; say goodbye (best effort).
        let _ = tokio::time::timeout(stall, to_client.send(Message::Close(None))).await;
        Ending::AgentEnded
    };
    let inbound = async {
        while let Some(message) = from_client.next().await {
            let text = match message {
                Ok(Message::Text(text)) => text,
                Ok(Message::Close(_)) => return Ending::ClientClosed,
                Ok(Message::Binary(_)) => {
                    tracing::warn!(
                        connection = id,
                        "ignored a binary WebSocket message (ACP frames are text)"
                    );
                    continue;
                }
                Ok(Message::Ping(_) | Message::Pong(_)) => continue,
                Err(err) => return Ending::ClientGone(err.to_string()),
            };
            if text.as_str().trim_start().starts_with('[') {
                if answer.send(BATCH_REJECTION).await.is_err() {
                    return Ending::AgentEnded;
                }
                continue;
            }
            if stdin.send(one_line(text.as_str())).await.is_err() {
                return Ending::AgentGone;
            }
        }
        Ending::ClientGone("the connection closed".to_owned())
    };
    let ending = tokio::select! {
        ending = outbound => ending,
        ending = inbound => ending,
        () = shared.stop.cancelled() => Ending::Stopped,
    };
    match &ending {
        Ending::Stalled(_) | Ending::BadFrame(_) => tracing::warn!(connection = id, "{ending}"),
        other => tracing::info!(connection = id, "connection ended: {other}"),
    }
    if matches!(ending, Ending::ClientClosed | Ending::Stopped) {
        // Completes the closing handshake (the client's, or ours), briefly: a client that reads
        // nothing does not hold the teardown up.
        let _ = tokio::time::timeout(CLOSE_GRACE, to_client.close()).await;
    }
    owned.tear_down().await;
}

/// A message as one line (of an agent's stdin, of the bridge's stdout).
pub(super) fn one_line(text: &str) -> String {
    if text.contains(['\n', '\r']) {
        text.replace(['\n', '\r'], " ")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_becomes_one_line_and_keeps_its_meaning() {
        let pretty = "{\n  \"jsonrpc\": \"2.0\",\r\n  \"method\": \"x\",\n  \"params\": {\"t\": \"a\\nb\"}\n}";
        let line = one_line(pretty);
        assert!(!line.contains(['\n', '\r']), "{line}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            serde_json::from_str::<serde_json::Value>(pretty).unwrap()
        );
        assert_eq!(one_line("{}"), "{}");
    }

    #[test]
    fn the_batch_rejection_is_a_json_rpc_error() {
        let value: serde_json::Value = serde_json::from_str(BATCH_REJECTION).unwrap();
        assert_eq!(value["error"]["code"], -32600);
        assert!(value["id"].is_null());
    }
}
