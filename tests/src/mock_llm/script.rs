//! What the mock model answers: the [`Reply`] vocabulary of a script, and the pure translation
//! of one reply into the SSE `data:` payloads of an OpenAI-style `chat.completion.chunk` stream.
//!
//! Invariants: every streamed reply opens with the assistant role delta, as the
//! `OpenAI` and `DeepSeek` APIs do, and (except [`Reply::Events`], which is verbatim) ends with a delta carrying the
//! `finish_reason`, an optional usage chunk, then `[DONE]`. Splitting never cuts a UTF-8
//! character, so every payload is valid JSON text. No I/O here: the server in the parent module
//! writes these payloads.

use std::time::Duration;

use serde_json::{Value, json};

/// The `data:` payload that ends every OpenAI-compatible stream.
pub const DONE: &str = "[DONE]";

/// Why a streamed completion ended: the `finish_reason` of its last chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `stop`: the model ended its answer.
    Stop,
    /// `length`: the token limit cut the answer.
    Length,
    /// `tool_calls`: the model wants tools run.
    ToolCalls,
    /// `content_filter`: the provider withheld the answer.
    ContentFilter,
}

impl Finish {
    /// The wire spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::ContentFilter => "content_filter",
        }
    }
}

/// One scripted answer; each `POST /v1/chat/completions` consumes the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Message text in these chunks (one `delta.content` each), then `finish`.
    Text { chunks: Vec<String>, finish: Finish },
    /// DeepSeek-style thoughts (`delta.reasoning_content`), then message text; finish `stop`.
    Reasoning {
        thoughts: Vec<String>,
        text: Vec<String>,
    },
    /// One function call whose `arguments` JSON text is split across `split_into` chunks
    /// (at least one, at most one per character); finish `tool_calls`.
    ToolCall {
        id: String,
        name: String,
        arguments_json: String,
        split_into: usize,
    },
    /// An HTTP error status with an OpenAI-style error body `{"error": {"message", ...}}`.
    Status { status: u16, message: String },
    /// Like [`Reply::Status`], with a `Retry-After: <seconds>` header.
    StatusRetryAfter {
        status: u16,
        message: String,
        seconds: u64,
    },
    /// Message text with `interval` between chunks (the first is immediate); finish `stop`.
    /// The server stops writing as soon as the client is gone.
    Slow {
        chunks: Vec<String>,
        interval: Duration,
    },
    /// Accepts the request and never answers (until the client leaves or the server stops).
    Hang,
    /// These `data:` payloads verbatim: no role delta, no finish, no `[DONE]` added. For streams
    /// a well-formed script cannot express (garbage chunks, a stream cut short).
    Events(Vec<String>),
}

impl Reply {
    /// Message text in these chunks, finish `stop`.
    #[must_use]
    pub fn text<S: Into<String>>(chunks: impl IntoIterator<Item = S>) -> Reply {
        Reply::Text {
            chunks: chunks.into_iter().map(Into::into).collect(),
            finish: Finish::Stop,
        }
    }

    /// A tool call whose arguments are `arguments` serialized, split into `split_into` chunks.
    #[must_use]
    pub fn tool_call(id: &str, name: &str, arguments: &Value, split_into: usize) -> Reply {
        Reply::ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments_json: arguments.to_string(),
            split_into,
        }
    }

    /// An HTTP error status with an OpenAI-style error body carrying `message`.
    #[must_use]
    pub fn status(status: u16, message: &str) -> Reply {
        Reply::Status {
            status,
            message: message.to_owned(),
        }
    }
}

/// What one reply's usage chunk reports, when the request asks for it
/// (`stream_options.include_usage`); all zeros unless the script says otherwise
/// ([`crate::mock_llm::MockLlmBuilder::reply_with_usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `completion_tokens_details.reasoning_tokens`, when set.
    pub reasoning_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens`, when set.
    pub cached_tokens: Option<u64>,
}

impl Usage {
    #[must_use]
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            ..Usage::default()
        }
    }

    /// `total_tokens`, as servers report it: prompt + completion.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// What identifies one completion in its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Completion {
    /// The chunks' `id` (`chatcmpl-mock-<n>`).
    pub id: String,
    /// The request's `model`, echoed as real servers do.
    pub model: String,
    /// Whether the request asked for a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// What that chunk reports.
    pub usage: Usage,
}

/// The `data:` payloads of a streamed reply, in order, with the delay before each one.
/// `None` for the replies that are not a stream ([`Reply::Status`],
/// [`Reply::StatusRetryAfter`], [`Reply::Hang`]).
#[must_use]
pub(super) fn stream(reply: &Reply, completion: &Completion) -> Option<Vec<(Duration, String)>> {
    let immediate = |payloads: Vec<String>| payloads.into_iter().map(|p| (Duration::ZERO, p));
    let frames = match reply {
        Reply::Status { .. } | Reply::StatusRetryAfter { .. } | Reply::Hang => return None,
        Reply::Events(payloads) => immediate(payloads.clone()).collect(),
        Reply::Text { chunks, finish } => {
            immediate(completion.framed(text_deltas(chunks), *finish)).collect()
        }
        Reply::Reasoning { thoughts, text } => {
            let thoughts = thoughts
                .iter()
                .map(|t| json!({ "content": null, "reasoning_content": t }));
            let text = text
                .iter()
                .map(|t| json!({ "content": t, "reasoning_content": null }));
            immediate(completion.framed(thoughts.chain(text).collect(), Finish::Stop)).collect()
        }
        Reply::ToolCall {
            id,
            name,
            arguments_json,
            split_into,
        } => {
            let opening = json!({ "tool_calls": [{
                "index": 0,
                "id": id,
                "type": "function",
                "function": { "name": name, "arguments": "" },
            }]});
            let parts = split(arguments_json, *split_into).into_iter().map(
                |part| json!({ "tool_calls": [{ "index": 0, "function": { "arguments": part } }] }),
            );
            let deltas = std::iter::once(opening).chain(parts).collect();
            immediate(completion.framed(deltas, Finish::ToolCalls)).collect()
        }
        Reply::Slow { chunks, interval } => completion
            .framed(text_deltas(chunks), Finish::Stop)
            .into_iter()
            .enumerate()
            // The role delta and the first text chunk go at once, so a client sees text early.
            .map(|(i, p)| (if i < 2 { Duration::ZERO } else { *interval }, p))
            .collect(),
    };
    Some(frames)
}

fn text_deltas(chunks: &[String]) -> Vec<Value> {
    chunks.iter().map(|c| json!({ "content": c })).collect()
}

impl Completion {
    /// Role delta, `deltas`, finish delta, usage chunk if asked for, `[DONE]`.
    fn framed(&self, deltas: Vec<Value>, finish: Finish) -> Vec<String> {
        let role = json!({ "role": "assistant", "content": "" });
        let mut payloads: Vec<String> = std::iter::once(role)
            .chain(deltas)
            .map(|delta| self.chunk(&delta, None).to_string())
            .collect();
        payloads.push(self.chunk(&json!({}), Some(finish)).to_string());
        if self.include_usage {
            payloads.push(self.usage_chunk().to_string());
        }
        payloads.push(DONE.to_owned());
        payloads
    }

    fn chunk(&self, delta: &Value, finish: Option<Finish>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "finish_reason": finish.map(Finish::as_str),
            }],
        })
    }

    /// The last chunk of `OpenAI` streams when usage is requested: no choices at all.
    fn usage_chunk(&self) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "total_tokens": self.usage.total(),
        });
        if let Some(cached) = self.usage.cached_tokens {
            usage["prompt_tokens_details"] = json!({ "cached_tokens": cached });
        }
        if let Some(reasoning) = self.usage.reasoning_tokens {
            usage["completion_tokens_details"] = json!({ "reasoning_tokens": reasoning });
        }
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [],
            "usage": usage,
        })
    }
}

/// `text` cut into `parts` pieces of nearly equal character counts, never splitting a character;
/// at least one piece (possibly empty), at most one per character.
#[must_use]
pub fn split(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let parts = parts.clamp(1, chars.len().max(1));
    let (base, extra) = (chars.len() / parts, chars.len() % parts);
    let mut pieces = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        pieces.push(chars[start..start + len].iter().collect());
        start += len;
    }
    pieces
}

/// An OpenAI-style error body: `{"error": {"message", "type", "code"}}`, the type following
/// the status as `OpenAI` does.
#[must_use]
pub(super) fn error_body(status: u16, message: &str) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", Value::from("invalid_api_key")),
        429 => ("rate_limit_error", Value::from("rate_limit_exceeded")),
        500.. => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    };
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(include_usage: bool) -> Completion {
        Completion {
            id: "chatcmpl-mock-1".into(),
            model: "m".into(),
            include_usage,
            usage: Usage::default(),
        }
    }

    fn payloads(reply: &Reply, include_usage: bool) -> Vec<String> {
        stream(reply, &completion(include_usage))
            .unwrap()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    fn deltas(payloads: &[String]) -> Vec<Value> {
        payloads
            .iter()
            .filter(|p| *p != DONE)
            .map(|p| serde_json::from_str::<Value>(p).unwrap())
            .map(|c| json!([c["choices"][0]["delta"], c["choices"][0]["finish_reason"]]))
            .collect()
    }

    #[test]
    fn text_opens_with_the_role_and_ends_with_finish_and_done() {
        let reply = Reply::Text {
            chunks: vec!["Hello".into(), " world".into()],
            finish: Finish::Length,
        };
        let payloads = payloads(&reply, false);
        assert_eq!(payloads.last().unwrap(), DONE);
        assert_eq!(
            deltas(&payloads),
            vec![
                json!([{"role": "assistant", "content": ""}, null]),
                json!([{"content": "Hello"}, null]),
                json!([{"content": " world"}, null]),
                json!([{}, "length"]),
            ]
        );
        let first: Value = serde_json::from_str(&payloads[0]).unwrap();
        assert_eq!(first["id"], "chatcmpl-mock-1");
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["model"], "m");
    }

    #[test]
    fn a_usage_chunk_without_choices_precedes_done_only_when_asked_for() {
        let with_usage = payloads(&Reply::text(["x"]), true);
        let usage: Value = serde_json::from_str(&with_usage[with_usage.len() - 2]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 0);
        assert_eq!(payloads(&Reply::text(["x"]), false).len(), 4);
    }

    #[test]
    fn reasoning_streams_thoughts_before_text() {
        let reply = Reply::Reasoning {
            thoughts: vec!["hmm".into()],
            text: vec!["ok".into()],
        };
        assert_eq!(
            deltas(&payloads(&reply, false))[1..],
            [
                json!([{"content": null, "reasoning_content": "hmm"}, null]),
                json!([{"content": "ok", "reasoning_content": null}, null]),
                json!([{}, "stop"]),
            ]
        );
    }

    #[test]
    fn a_tool_call_names_itself_once_then_streams_argument_pieces() {
        let reply = Reply::tool_call("call_1", "read_file", &json!({"path": "a"}), 3);
        let deltas = deltas(&payloads(&reply, false));
        assert_eq!(
            deltas[1],
            json!([{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": ""}}]}, null])
        );
        let pieces: Vec<&str> = deltas[2..5]
            .iter()
            .map(|d| {
                d[0]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(pieces.concat(), r#"{"path":"a"}"#);
        assert_eq!(deltas[5], json!([{}, "tool_calls"]));
        assert_eq!(deltas.len(), 6);
    }

    #[test]
    fn slow_sends_the_first_text_at_once_and_the_rest_after_the_interval() {
        let interval = Duration::from_millis(7);
        let reply = Reply::Slow {
            chunks: vec!["a".into(), "b".into()],
            interval,
        };
        let delays: Vec<Duration> = stream(&reply, &completion(false))
            .unwrap()
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        let z = Duration::ZERO;
        assert_eq!(delays, [z, z, interval, interval, interval]);
    }

    #[test]
    fn events_are_verbatim_and_statuses_are_not_streams() {
        let reply = Reply::Events(vec!["{oops".into()]);
        assert_eq!(payloads(&reply, true), ["{oops"]);
        assert_eq!(stream(&Reply::status(401, "no"), &completion(false)), None);
        assert_eq!(stream(&Reply::Hang, &completion(false)), None);
    }

    #[test]
    fn split_is_even_keeps_characters_whole_and_clamps() {
        assert_eq!(split("abcdefg", 3), ["abc", "de", "fg"]);
        assert_eq!(split("héllo", 5), ["h", "é", "l", "l", "o"]);
        assert_eq!(split("ab", 10), ["a", "b"]);
        assert_eq!(split("ab", 0), ["ab"]);
        assert_eq!(split("", 4), [""]);
    }

    #[test]
    fn error_bodies_follow_openai() {
        assert_eq!(
            error_body(401, "bad key"),
            json!({"error": {"message": "bad key", "type": "invalid_request_error",
                "param": null, "code": "invalid_api_key"}})
        );
        assert_eq!(error_body(429, "slow")["error"]["type"], "rate_limit_error");
        assert_eq!(error_body(503, "down")["error"]["type"], "server_error");
    }
}
