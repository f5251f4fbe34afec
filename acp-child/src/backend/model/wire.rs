//! The Chat Completions wire format: the request body, streamed chunks, and the pure rules that
//! turn one into the other's inputs.
//!
//! - [`messages`] assembles the request's messages from the system prompt and the session's
//!   [`Record`]s. It guarantees the shape OpenAI-compatible servers insist on: every assistant
//!   tool call is followed by a tool message answering it (a turn that was interrupted between the
//!   two gets a placeholder result). A background task's completion notice is sent as a tool
//!   exchange the agent makes up: an assistant message calling `task_output` for the task, under
//!   a call id of its own ([`NOTICE_CALL_PREFIX`] and the notice's number in the conversation, so
//!   the same history always gives the same ids), then the tool message answering it with the
//!   notice. A child's output thus reaches the model as tool output, never as the user's words.
//! - [`Accumulator`] folds streamed chunks into one [`Reply`]: text, reasoning (DeepSeek's
//!   `reasoning_content`; `reasoning` on vLLM and Ollama) and tool calls, which arrive in pieces
//!   keyed by `index`.
//! - [`Finish`] maps `finish_reason` to what the turn does next.
//!
//! Only the fields acp-child uses are modelled; unknown fields are ignored, so servers that add
//! their own (usage, logprobs, ...) are fine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::tools;
use crate::store::{Record, RecordedCall};

/// The tool result recorded for a call whose turn ended before it ran.
pub(crate) const INTERRUPTED_RESULT: &str = "not run: the turn ended before this tool call ran";

/// How the call ids of made-up notice exchanges start; then the notice's number (1, 2, ...).
/// Models' own ids look otherwise (`call_...`, `toolu_...`, short random ids), and each made-up
/// call is answered in the very next message, so the two never pair up wrongly.
pub(crate) const NOTICE_CALL_PREFIX: &str = "acp_child_notice_";

/// A `POST /chat/completions` body.
#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    pub(crate) model: &'a str,
    pub(crate) messages: &'a [Message],
    pub(crate) stream: bool,
    /// `{"include_usage": true}`: the stream ends with a chunk reporting the request's usage.
    pub(crate) stream_options: StreamOptions,
    pub(crate) tools: &'a serde_json::Value,
}

/// A streamed request's options.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct StreamOptions {
    pub(crate) include_usage: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(crate) enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        // `null` rather than "" when the reply was only tool calls, as OpenAI itself sends.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

/// A tool call in an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct WireToolCall {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: WireFunction,
}

/// The function a tool call invokes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct WireFunction {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// Builds the request's messages: the system prompt, then the conversation.
#[must_use]
pub(crate) fn messages(system: String, history: &[Record]) -> Vec<Message> {
    // An empty persona (an empty `--persona` file) sends no system message at all.
    let mut out = if system.trim().is_empty() {
        Vec::new()
    } else {
        vec![Message::System { content: system }]
    };
    // Calls announced by the last assistant message and not answered yet.
    let mut pending: Vec<String> = Vec::new();
    let close = |pending: &mut Vec<String>, out: &mut Vec<Message>| {
        for id in pending.drain(..) {
            out.push(Message::Tool {
                tool_call_id: id,
                content: INTERRUPTED_RESULT.to_owned(),
            });
        }
    };
    let mut notices = 0;
    for record in history {
        match record {
            Record::Session { .. } | Record::Child(_) => {}
            Record::User { text } => {
                close(&mut pending, &mut out);
                out.push(Message::User {
                    content: text.clone(),
                });
            }
            Record::Notice { text, task } => {
                close(&mut pending, &mut out);
                notices += 1;
                let id = format!("{NOTICE_CALL_PREFIX}{notices}");
                let (task, content) = match task {
                    Some(task) => (Some(task.as_str()), text.clone()),
                    None => crate::backend::children::table::saved_notice(text),
                };
                // A saved notice naming no task (hand-edited) is the answer of a task listing.
                let (name, arguments) = match task {
                    Some(task) => (
                        tools::TASK_OUTPUT,
                        serde_json::json!({ "task_id": task }).to_string(),
                    ),
                    None => (tools::TASK_LIST, "{}".to_owned()),
                };
                out.push(Message::Assistant {
                    content: None,
                    tool_calls: vec![WireToolCall {
                        id: id.clone(),
                        kind: "function",
                        function: WireFunction {
                            name: name.to_owned(),
                            arguments,
                        },
                    }],
                });
                out.push(Message::Tool {
                    tool_call_id: id,
                    content,
                });
            }
            Record::Assistant { text, tool_calls } => {
                close(&mut pending, &mut out);
                pending = tool_calls.iter().map(|call| call.id.clone()).collect();
                out.push(Message::Assistant {
                    content: (!text.is_empty()).then(|| text.clone()),
                    tool_calls: tool_calls
                        .iter()
                        .map(|call| WireToolCall {
                            id: call.id.clone(),
                            kind: "function",
                            function: WireFunction {
                                name: call.name.clone(),
                                arguments: call.arguments.clone(),
                            },
                        })
                        .collect(),
                });
            }
            Record::Tool {
                call_id, content, ..
            } => {
                // A result for a call that is not pending would be rejected by the server.
                if let Some(position) = pending.iter().position(|id| id == call_id) {
                    pending.remove(position);
                    out.push(Message::Tool {
                        tool_call_id: call_id.clone(),
                        content: content.clone(),
                    });
                }
            }
        }
    }
    close(&mut pending, &mut out);
    out
}

/// One streamed `chat.completion.chunk`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default)]
    pub(crate) choices: Vec<Choice>,
    /// Some servers report failures mid-stream as a chunk with an `error` object.
    #[serde(default)]
    pub(crate) error: Option<ApiError>,
    /// The request's usage: on the last chunk (no choices) when `include_usage` was asked for;
    /// some servers send it on every chunk, `null` until the last. Read leniently
    /// ([`WireUsage::read`]): a usage a server shapes its own way is no reason to fail a turn.
    #[serde(default)]
    pub(crate) usage: Option<serde_json::Value>,
}

/// A completion's `usage`, as OpenAI-compatible servers report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: u64,
    #[serde(default)]
    pub(crate) completion_tokens: u64,
    #[serde(default)]
    pub(crate) total_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub(crate) completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek's count of prompt tokens read from its cache.
    #[serde(default)]
    pub(crate) prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct PromptDetails {
    #[serde(default)]
    pub(crate) cached_tokens: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct CompletionDetails {
    #[serde(default)]
    pub(crate) reasoning_tokens: Option<u64>,
}

impl WireUsage {
    /// A chunk's `usage`, when it is one (`null`, or counts that are not numbers, are none).
    #[must_use]
    pub(crate) fn read(value: serde_json::Value) -> Option<WireUsage> {
        if value.is_null() {
            return None;
        }
        serde_json::from_value(value).ok()
    }

    /// As acp-child reports it: input = prompt tokens, output = completion tokens (reasoning
    /// included, as servers count it), total as the server says (else their sum).
    #[must_use]
    pub(crate) fn to_usage(&self) -> protocol::usage::Usage {
        protocol::usage::Usage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            total_tokens: self
                .total_tokens
                .unwrap_or(self.prompt_tokens.saturating_add(self.completion_tokens)),
            thought_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|details| details.reasoning_tokens),
            cached_read_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|details| details.cached_tokens)
                .or(self.prompt_cache_hit_tokens),
            cached_write_tokens: None,
            estimated: false,
            cost: None,
        }
    }
}

/// An error object, as in `{"error": {"message": ...}}`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ApiError {
    #[serde(default)]
    pub(crate) message: Option<String>,
}

/// The error body of a failed request, if it is the usual JSON shape.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub(crate) error: Option<ApiError>,
}

/// One choice of a chunk (acp-child asks for one).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub(crate) delta: Option<Delta>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

/// What a chunk adds.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A piece of a tool call.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallDelta {
    #[serde(default)]
    pub(crate) index: Option<usize>,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) function: Option<FunctionDelta>,
}

impl ToolCallDelta {
    /// The bytes of the call's name and arguments this piece carries.
    fn len(&self) -> usize {
        self.function.as_ref().map_or(0, |function| {
            function.name.as_ref().map_or(0, String::len)
                + function.arguments.as_ref().map_or(0, String::len)
        })
    }
}

/// A piece of a tool call's function.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionDelta {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) arguments: Option<String>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finish {
    /// A complete answer.
    Stop,
    /// It wants tool results.
    ToolCalls,
    /// It hit its output limit.
    Length,
    /// The provider's content filter stopped it.
    ContentFilter,
}

impl Finish {
    /// Maps `finish_reason`. Servers disagree on what they send with tool calls (Ollama and
    /// llama.cpp may say `stop`, some send nothing), so tool calls present means [`Finish::ToolCalls`]
    /// unless the output was cut or filtered.
    #[must_use]
    pub(crate) fn from_reason(reason: Option<&str>, has_tool_calls: bool) -> Self {
        match reason {
            Some("length") => Self::Length,
            Some("content_filter") => Self::ContentFilter,
            _ if has_tool_calls => Self::ToolCalls,
            _ => Self::Stop,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) text: String,
    pub(crate) tool_calls: Vec<RecordedCall>,
    pub(crate) finish: Finish,
    /// The request's usage, when the server reported it.
    pub(crate) usage: Option<WireUsage>,
    /// What was streamed, for an estimate when the server reports no usage.
    pub(crate) generated: Generated,
}

/// What a reply streamed: the deltas that carried something (text, reasoning, a tool call's name
/// or arguments) and their bytes, for `protocol::usage::estimate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Generated {
    pub(crate) deltas: u64,
    pub(crate) bytes: u64,
}

impl Generated {
    /// What a request of `input_bytes` that streamed this is estimated to have spent.
    #[must_use]
    pub(crate) fn estimate(self, input_bytes: u64) -> protocol::usage::Usage {
        protocol::usage::estimate(input_bytes, self.deltas, self.bytes)
    }
}

/// What a chunk contributes that should be shown at once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) text: Option<String>,
    pub(crate) thought: Option<String>,
}

/// Folds a stream of chunks into a [`Reply`].
#[derive(Debug, Default)]
pub(crate) struct Accumulator {
    text: String,
    calls: BTreeMap<usize, PartialCall>,
    last_index: Option<usize>,
    finish_reason: Option<String>,
    usage: Option<WireUsage>,
    generated: Generated,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl Accumulator {
    /// Adds a chunk; returns the text and reasoning to stream to the client now.
    pub(crate) fn push(&mut self, chunk: Chunk) -> Shown {
        let mut shown = Shown::default();
        // The last usage reported wins (servers that repeat it grow it as they go).
        if let Some(usage) = chunk.usage.and_then(WireUsage::read) {
            self.usage = Some(usage);
        }
        // acp-child requests one choice; extra choices, if a server sends them, are ignored.
        let Some(choice) = chunk.choices.into_iter().next() else {
            return shown;
        };
        if let Some(reason) = choice.finish_reason {
            self.finish_reason = Some(reason);
        }
        let Some(delta) = choice.delta else {
            return shown;
        };
        let bytes = delta.content.as_ref().map_or(0, String::len)
            + delta.reasoning_content.as_ref().map_or(0, String::len)
            + delta.reasoning.as_ref().map_or(0, String::len)
            + delta
                .tool_calls
                .iter()
                .flatten()
                .map(ToolCallDelta::len)
                .sum::<usize>();
        if bytes > 0 {
            self.generated.deltas += 1;
            self.generated.bytes += bytes as u64;
        }
        if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
            self.text.push_str(&text);
            shown.text = Some(text);
        }
        let thought: String = [delta.reasoning_content, delta.reasoning]
            .into_iter()
            .flatten()
            .collect();
        if !thought.is_empty() {
            shown.thought = Some(thought);
        }
        for piece in delta.tool_calls.unwrap_or_default() {
            self.push_call(piece);
        }
        shown
    }

    fn push_call(&mut self, piece: ToolCallDelta) {
        let starts_new = piece.id.as_deref().is_some_and(|id| !id.is_empty());
        // Without an index (some local servers), a piece with an id starts a new call and the
        // others continue the latest one.
        let index = piece.index.unwrap_or_else(|| match self.last_index {
            Some(last) if !starts_new => last,
            Some(last) => last + 1,
            None => 0,
        });
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if let Some(id) = piece.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = piece.function {
            if let Some(name) = function.name {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    /// The reply so far: its text, and tool calls with missing ids filled in (`new_id` makes one).
    pub(crate) fn finish(self, mut new_id: impl FnMut() -> String) -> Reply {
        let tool_calls: Vec<RecordedCall> = self
            .calls
            .into_values()
            .filter(|call| !call.name.is_empty())
            .map(|call| RecordedCall {
                id: if call.id.is_empty() {
                    new_id()
                } else {
                    call.id
                },
                name: call.name,
                arguments: call.arguments,
            })
            .collect();
        Reply {
            finish: Finish::from_reason(self.finish_reason.as_deref(), !tool_calls.is_empty()),
            text: self.text,
            tool_calls,
            usage: self.usage,
            generated: self.generated,
        }
    }

    /// What was streamed so far (for the budget's hold while it streams).
    #[must_use]
    pub(crate) fn generated(&self) -> Generated {
        self.generated
    }

    /// The text streamed so far (kept when a turn is cancelled mid-stream).
    #[must_use]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(json: &str) -> Chunk {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn an_empty_system_prompt_sends_no_system_message() {
        let history = [Record::User { text: "hi".into() }];
        for empty in ["", " \n\t"] {
            assert_eq!(
                serde_json::to_value(messages(empty.into(), &history)).unwrap(),
                serde_json::json!([{"role": "user", "content": "hi"}])
            );
        }
    }

    #[test]
    fn text_reasoning_and_tool_calls_accumulate() {
        let mut acc = Accumulator::default();
        assert_eq!(
            acc.push(chunk(
                r#"{"choices":[{"delta":{"role":"assistant","reasoning_content":"hmm"}}]}"#
            )),
            Shown {
                text: None,
                thought: Some("hmm".into())
            }
        );
        assert_eq!(
            acc.push(chunk(
                r#"{"choices":[{"delta":{"content":"Let me look."}}]}"#
            )),
            Shown {
                text: Some("Let me look.".into()),
                thought: None
            }
        );
        acc.push(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}}]}"#));
        acc.push(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"list_dir","arguments":"{\"path\":"}}]}}]}"#));
        acc.push(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":\"a\"}"}}]}}]}"#));
        acc.push(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\".\"}"}}]}}]}"#));
        acc.push(chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}],"usage":{"total_tokens":5}}"#,
        ));
        let reply = acc.finish(|| unreachable!());
        assert_eq!(reply.text, "Let me look.");
        assert_eq!(reply.finish, Finish::ToolCalls);
        assert_eq!(
            reply.tool_calls,
            vec![
                RecordedCall {
                    id: "call_a".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a"}"#.into()
                },
                RecordedCall {
                    id: "call_b".into(),
                    name: "list_dir".into(),
                    arguments: r#"{"path":"."}"#.into()
                },
            ]
        );
    }

    #[test]
    fn calls_without_index_or_id_are_handled() {
        let mut acc = Accumulator::default();
        acc.push(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"search","arguments":"{}"}}]},"finish_reason":"stop"}]}"#));
        let mut made = 0;
        let reply = acc.finish(|| {
            made += 1;
            format!("call_gen{made}")
        });
        assert_eq!(
            reply.finish,
            Finish::ToolCalls,
            "tool calls with `stop` still run"
        );
        assert_eq!(reply.tool_calls[0].id, "call_gen1");
    }

    #[test]
    fn finish_reasons_map_to_turn_outcomes() {
        assert_eq!(Finish::from_reason(Some("stop"), false), Finish::Stop);
        assert_eq!(Finish::from_reason(None, false), Finish::Stop);
        assert_eq!(Finish::from_reason(Some("length"), true), Finish::Length);
        assert_eq!(
            Finish::from_reason(Some("content_filter"), false),
            Finish::ContentFilter
        );
        assert_eq!(
            Finish::from_reason(Some("tool_calls"), true),
            Finish::ToolCalls
        );
        assert_eq!(Finish::from_reason(Some("tool_calls"), false), Finish::Stop);
    }

    #[test]
    fn notices_are_made_up_tool_exchanges_never_user_messages() {
        let saved = "Background task subagent-1 (subagent echo, child agent-1) completed. Its \
                     result:\nhi";
        let history = vec![
            Record::User { text: "q".into() },
            Record::Assistant {
                text: String::new(),
                tool_calls: vec![RecordedCall {
                    id: "a".into(),
                    name: "list_dir".into(),
                    arguments: "{}".into(),
                }],
            },
            // Told between a reply's calls and their results (never done): the calls are closed.
            Record::Notice {
                text: "quoted 2".into(),
                task: Some("subagent-2".into()),
            },
            Record::Tool {
                call_id: "a".into(),
                content: "late".into(),
                failed: false,
            },
            Record::Notice {
                text: saved.into(),
                task: None,
            },
            Record::Notice {
                text: "hand-edited".into(),
                task: None,
            },
        ];
        let json = serde_json::to_value(messages("sys".into(), &history)).unwrap();
        let call = |n: u32, name: &str, arguments: &str| {
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("acp_child_notice_{n}"), "type": "function",
                 "function": {"name": name, "arguments": arguments}}
            ]})
        };
        let result = |n: u32, content: String| {
            serde_json::json!({"role": "tool", "tool_call_id": format!("acp_child_notice_{n}"),
                               "content": content})
        };
        assert_eq!(
            json,
            serde_json::json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "a", "content": INTERRUPTED_RESULT},
                call(1, "task_output", r#"{"task_id":"subagent-2"}"#),
                result(1, "quoted 2".into()),
                call(2, "task_output", r#"{"task_id":"subagent-1"}"#),
                result(2, crate::backend::children::table::saved_notice(saved).1),
                call(3, "task_list", "{}"),
                result(3, crate::backend::children::table::saved_notice("hand-edited").1),
            ])
        );
    }

    #[test]
    fn messages_pair_every_tool_call_with_a_result() {
        let call = |id: &str| RecordedCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: "{}".into(),
        };
        let history = vec![
            Record::User { text: "q".into() },
            Record::Assistant {
                text: String::new(),
                tool_calls: vec![call("a"), call("b")],
            },
            Record::Tool {
                call_id: "a".into(),
                content: "A".into(),
                failed: false,
            },
            // "b" never got a result (the turn was interrupted).
            Record::User {
                text: "again".into(),
            },
            Record::Assistant {
                text: "done".into(),
                tool_calls: vec![],
            },
            Record::Tool {
                call_id: "stray".into(),
                content: "x".into(),
                failed: false,
            },
        ];
        let json = serde_json::to_value(messages("sys".into(), &history)).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "a", "content": "A"},
                {"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_RESULT},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": "done"}
            ])
        );
    }
}
