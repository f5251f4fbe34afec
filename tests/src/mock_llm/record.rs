//! What the mock model saw and did, kept for the tests' assertions: every request as received
//! ([`RecordedRequest`]) and how every stream ended ([`StreamEnd`]).
//!
//! The accessors read the OpenAI-compatible Chat Completions request shape and are lenient about its two
//! spellings of message content (a string, or an array of `{"type": "text", "text"}` parts), so
//! tests assert meaning rather than one client's serialization.

use serde_json::Value;

/// One HTTP request the mock received, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// `POST`, `GET`, ...
    pub method: String,
    /// The path and query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Header names lowercased, in arrival order; values lossily decoded as UTF-8.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON; `Value::Null` when it is not JSON (see `raw_body`).
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub raw_body: String,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `Authorization` header, e.g. `Bearer test-key`.
    #[must_use]
    pub fn authorization(&self) -> Option<&str> {
        self.header("authorization")
    }

    /// The request's `messages` (empty when absent).
    #[must_use]
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The names of the function tools offered, in request order.
    #[must_use]
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools()
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect()
    }

    /// The request's `tools` (empty when absent).
    #[must_use]
    pub fn tools(&self) -> &[Value] {
        self.body["tools"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The text of the last message with role `user`.
    #[must_use]
    pub fn last_user_text(&self) -> Option<String> {
        self.messages()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(message_text)
    }

    /// The text of the `role: "tool"` message answering `tool_call_id`.
    #[must_use]
    pub fn tool_result(&self, tool_call_id: &str) -> Option<String> {
        self.messages()
            .iter()
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == tool_call_id)
            .map(message_text)
    }

    /// Whether an assistant message announces a tool call with this id before its tool result,
    /// as the real API requires (it rejects a tool message nothing asked for).
    #[must_use]
    pub fn tool_call_precedes_result(&self, tool_call_id: &str) -> bool {
        let messages = self.messages();
        let asked = messages.iter().position(|m| {
            m["role"] == "assistant"
                && m["tool_calls"]
                    .as_array()
                    .is_some_and(|calls| calls.iter().any(|c| c["id"] == tool_call_id))
        });
        let answered = messages
            .iter()
            .position(|m| m["role"] == "tool" && m["tool_call_id"] == tool_call_id);
        matches!((asked, answered), (Some(a), Some(b)) if a < b)
    }
}

/// A message's content as text: the string, or its text parts concatenated.
#[must_use]
pub fn message_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// How one streamed reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamEnd {
    /// Index of the request (in [`super::MockLlm::requests`]) this stream answered.
    pub request: usize,
    /// `data:` events handed to the connection before the stream ended.
    pub sent: usize,
    /// `data:` events the reply had in all.
    pub total: usize,
}

impl StreamEnd {
    /// Whether every event was handed over; `false` means the client left mid-stream (or the
    /// server shut down).
    #[must_use]
    pub fn complete(&self) -> bool {
        self.sent == self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> RecordedRequest {
        RecordedRequest {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: vec![("authorization".into(), "Bearer k".into())],
            raw_body: body.to_string(),
            body,
        }
    }

    #[test]
    fn accessors_read_both_content_spellings() {
        let r = request(json!({
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "read_file", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "data"},
            ],
            "tools": [{"type": "function", "function": {"name": "read_file"}}],
        }));
        assert_eq!(r.header("Authorization"), Some("Bearer k"));
        assert_eq!(r.authorization(), Some("Bearer k"));
        assert_eq!(r.last_user_text().as_deref(), Some("hi there"));
        assert_eq!(r.tool_result("c1").as_deref(), Some("data"));
        assert_eq!(r.tool_result("c2"), None);
        assert!(r.tool_call_precedes_result("c1"));
        assert!(!r.tool_call_precedes_result("c2"));
        assert_eq!(r.tool_names(), ["read_file"]);
    }

    #[test]
    fn a_non_json_body_has_no_messages() {
        let mut r = request(Value::Null);
        r.raw_body = "not json".into();
        assert!(r.messages().is_empty());
        assert!(r.tool_names().is_empty());
        assert_eq!(r.last_user_text(), None);
    }

    #[test]
    fn a_stream_is_complete_when_all_events_went_out() {
        let end = StreamEnd {
            request: 0,
            sent: 2,
            total: 3,
        };
        assert!(!end.complete());
        assert!(StreamEnd { sent: 3, ..end }.complete());
    }
}
