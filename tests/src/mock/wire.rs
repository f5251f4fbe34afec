//! The NDJSON JSON-RPC 2.0 wire, written by hand with `serde_json` rather than the ACP SDK:
//! the mock must be able to send frames the SDK would refuse to build (unknown stop reasons,
//! a `session/new` answer without a session id, non-JSON noise lines).
//!
//! Frame builders and inbound classification are pure; [`Outbound`] is the only writer of
//! stdout, and it flushes after every frame so the host sees each one as soon as it is sent.

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, Stdout};

/// The session id `session/new` hands out. One session per process is all the host uses.
pub const SESSION_ID: &str = "mock-session-1";

/// JSON-RPC "method not found".
pub const METHOD_NOT_FOUND: i64 = -32601;

/// Non-JSON lines the `garbage` scenario prints; real agents print banners like these.
pub const NOISE: &[&str] = &["Loading model...", "{not json", ""];

/// One message received from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response to a request the mock sent: `Ok(result)` or `Err(error object)`.
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
}

impl Inbound {
    /// Classifies one line; `None` for a line that is not a JSON-RPC message.
    #[must_use]
    pub fn parse(line: &str) -> Option<Self> {
        let Value::Object(mut message) = serde_json::from_str(line).ok()? else {
            return None;
        };
        let params = message.remove("params").unwrap_or(Value::Null);
        let id = message.remove("id");
        match (message.remove("method"), id) {
            (Some(Value::String(method)), Some(id)) => Some(Self::Request { id, method, params }),
            (Some(Value::String(method)), None) => Some(Self::Notification { method, params }),
            (None, Some(id)) => {
                let outcome = match message.remove("error") {
                    Some(error) => Err(error),
                    None => Ok(message.remove("result").unwrap_or(Value::Null)),
                };
                Some(Self::Response { id, outcome })
            }
            _ => None,
        }
    }

    /// The `--log` line for this message: the method, or `response <id>`.
    #[must_use]
    pub fn log_line(&self) -> String {
        match self {
            Self::Request { method, .. } | Self::Notification { method, .. } => method.clone(),
            Self::Response { id, .. } => format!("response {id}"),
        }
    }
}

/// A successful response to the client's request `id`.
#[must_use]
pub fn response(id: &Value, result: Value) -> Value {
    // Moved in, not serialized by reference as `json!` would: a `huge` frame is 8 MiB.
    let mut frame = json!({"jsonrpc": "2.0", "id": id});
    frame["result"] = result;
    frame
}

/// An error response to the client's request `id`.
#[must_use]
pub fn error_response(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// A request from the mock to the client.
#[must_use]
pub fn request(id: u64, method: &str, params: Value) -> Value {
    let mut frame = json!({"jsonrpc": "2.0", "id": id, "method": method});
    frame["params"] = params;
    frame
}

/// A `session/update` notification carrying `update` (which holds the `sessionUpdate` tag).
#[must_use]
pub fn session_update(session_id: &str, update: Value) -> Value {
    let mut frame = json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session_id},
    });
    frame["params"]["update"] = update;
    frame
}

/// A content-chunk update: `kind` is `agent_message_chunk`, `agent_thought_chunk` or
/// `user_message_chunk`.
#[must_use]
pub fn text_chunk(kind: &str, text: impl Into<String>) -> Value {
    let mut update = json!({"sessionUpdate": kind, "content": {"type": "text"}});
    update["content"]["text"] = Value::String(text.into());
    update
}

/// The `initialize` result: protocol v1, no capabilities, no authentication.
#[must_use]
pub fn initialize_result() -> Value {
    json!({"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []})
}

/// The `agentCapabilities` advertising `advertise` (`--advertise`, [`super::cli::ADVERTISABLE`]).
#[must_use]
pub fn advertised(advertise: &[String]) -> Value {
    let has = |what: &str| advertise.iter().any(|a| a == what);
    let mut capabilities = json!({});
    if has("system-prompt") || has("override") {
        capabilities["sessionCapabilities"] = if has("override") {
            json!({"systemPrompt": {"mode": {"override": {}}}})
        } else {
            json!({"systemPrompt": {}})
        };
    }
    let fields: Vec<&str> = [
        ("tools", "tools"),
        ("output-schema", "outputSchema"),
        ("max-depth", "maxDepth"),
    ]
    .into_iter()
    .filter(|(name, _)| has(name))
    .map(|(_, field)| field)
    .collect();
    if !fields.is_empty() {
        capabilities["_meta"] = json!({"acp-host/start": {"version": 1, "fields": fields}});
    }
    capabilities
}

/// A select config option `llm` of category `model`.
#[must_use]
pub fn model_options(models: &[String], current: Option<&str>) -> Value {
    let options: Vec<Value> = models
        .iter()
        .map(|m| json!({"value": m, "name": m}))
        .collect();
    json!([{"id": "llm", "name": "Model", "category": "model", "type": "select",
            "currentValue": current, "options": options}])
}

/// The stdout writer. With noise enabled it interleaves [`NOISE`] lines between frames.
pub struct Outbound {
    stdout: Stdout,
    noise: Option<usize>,
}

impl Outbound {
    #[must_use]
    pub fn new(noisy: bool) -> Self {
        Self {
            stdout: tokio::io::stdout(),
            noise: noisy.then_some(0),
        }
    }

    /// Writes every noise line once (the banner a noisy agent prints before speaking).
    pub async fn preamble(&mut self) -> std::io::Result<()> {
        if self.noise.is_some() {
            for line in NOISE {
                self.write_line(line.as_bytes()).await?;
            }
        }
        Ok(())
    }

    /// Writes one frame as a single line, preceded by one noise line when noisy.
    pub async fn send(&mut self, frame: &Value) -> std::io::Result<()> {
        if let Some(next) = self.noise.as_mut() {
            let line = NOISE[*next % NOISE.len()];
            *next += 1;
            self.write_line(line.as_bytes()).await?;
        }
        // `Value`'s serializer cannot fail (all keys are strings).
        let bytes = serde_json::to_vec(frame).map_err(std::io::Error::other)?;
        self.write_line(&bytes).await
    }

    /// Writes one line as given, without noise.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write_line(bytes).await
    }

    async fn write_line(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stdout.write_all(bytes).await?;
        self.stdout.write_all(b"\n").await?;
        self.stdout.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_requests_notifications_and_responses() {
        assert_eq!(
            Inbound::parse(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#),
            Some(Inbound::Request {
                id: json!(0),
                method: "initialize".into(),
                params: json!({})
            })
        );
        assert_eq!(
            Inbound::parse(
                r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#
            ),
            Some(Inbound::Notification {
                method: "session/cancel".into(),
                params: json!({"sessionId": "s"})
            })
        );
        let error = Inbound::parse(r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32601}}"#);
        assert_eq!(
            error,
            Some(Inbound::Response {
                id: json!("a"),
                outcome: Err(json!({"code": -32601}))
            })
        );
        assert_eq!(error.unwrap().log_line(), r#"response "a""#);
        assert_eq!(
            Inbound::parse(r#"{"jsonrpc":"2.0","id":3,"result":null}"#)
                .unwrap()
                .log_line(),
            "response 3"
        );
    }

    #[test]
    fn rejects_non_messages() {
        for line in [
            "",
            "{not json",
            "[1]",
            r#"{"jsonrpc":"2.0"}"#,
            r#"{"method":3}"#,
        ] {
            assert_eq!(Inbound::parse(line), None, "{line}");
        }
    }
}
