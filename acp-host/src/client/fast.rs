//! The hot path of `session/update`: notifications decoded straight from the line into the typed
//! update observers get, without the SDK's generic dispatch (which parses every frame into a JSON
//! tree first).
//!
//! Two decoders, tried in turn:
//! - [`text_chunk`]: the streaming shape (`agent_message_chunk`, `agent_thought_chunk`,
//!   `user_message_chunk` carrying one text block) into plain structs of borrowed strings. The
//!   SDK's `SessionUpdate` and `ContentBlock` are internally tagged enums, which serde can only
//!   decode by first buffering every key and value of the object (an allocation each, the text
//!   copied twice); here the text is copied once, or moved when it had escapes;
//! - the SDK's `SessionNotification` through serde derive ([`general`]): every other update.
//!
//! Invariants:
//! - anything this does not recognise exactly goes to the SDK, which stays the reference: every
//!   struct denies unknown fields and every field has the SDK's own type or a stricter one, so a
//!   frame is either decoded exactly as the SDK would, or declined (an annotation, a `messageId`
//!   that is not a string, a `_meta` that is not an object, a duplicate key, non-text content);
//! - only notifications: a frame with an `id` (a request) is declined;
//! - whichever decoder took a frame, observers get the update the SDK would have decoded (a
//!   property test holds both equal to the SDK's).

use std::borrow::Cow;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, MessageId, Meta, SessionId, SessionNotification, SessionUpdate,
    TextContent,
};
use serde::Deserialize;
use serde::de::IgnoredAny;

#[derive(Deserialize)]
struct Notification<'a, P> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(borrow)]
    method: &'a str,
    /// Present means a request, which this path does not handle.
    #[serde(default)]
    id: Option<IgnoredAny>,
    params: P,
}

/// `SessionNotification` with a [`Chunk`] as its update.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ChunkParams<'a> {
    #[serde(borrow)]
    session_id: Cow<'a, str>,
    #[serde(borrow)]
    update: Chunk<'a>,
    /// The SDK reads any other value as absent; here it declines.
    #[serde(default, rename = "_meta")]
    meta: Option<Meta>,
}

/// `SessionUpdate::*Chunk(ContentChunk)`: the tag and the chunk's fields in one object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(borrow)]
    session_update: Cow<'a, str>,
    #[serde(borrow)]
    content: TextBlock<'a>,
    /// The SDK reads a value that is not a string as absent; here it declines.
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default, rename = "_meta")]
    meta: Option<Meta>,
}

/// `ContentBlock::Text(TextContent)`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextBlock<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Cow<'a, str>,
    /// Any value but `null` declines: rare on a chunk, and not worth a second copy of the
    /// SDK's lenient reading of it.
    #[serde(default)]
    annotations: Option<IgnoredAny>,
    #[serde(default, rename = "_meta")]
    meta: Option<Meta>,
}

/// The params of a `session/update` notification, or `None` for anything else (including a
/// `session/update` that does not decode: the SDK then reports it as it always did).
pub(super) fn session_notification(line: &str) -> Option<SessionNotification> {
    // Cheap filter first: most other frames never reach the decoder.
    if !line.contains("\"session/update\"") {
        return None;
    }
    text_chunk(line).or_else(|| general(line))
}

/// Any update, through the SDK's types.
fn general(line: &str) -> Option<SessionNotification> {
    let frame: Notification<'_, SessionNotification> = serde_json::from_str(line).ok()?;
    is_notification(&frame).then_some(frame.params)
}

/// A text chunk, decoded without buffering; `None` declines (the general decoder decides).
fn text_chunk(line: &str) -> Option<SessionNotification> {
    let frame: Notification<'_, ChunkParams<'_>> = serde_json::from_str(line).ok()?;
    if !is_notification(&frame) {
        return None;
    }
    let ChunkParams {
        session_id,
        update,
        meta,
    } = frame.params;
    let Chunk {
        session_update,
        content,
        message_id,
        meta: chunk_meta,
    } = update;
    if content.kind != "text" || content.annotations.is_some() {
        return None;
    }
    let wrap: fn(ContentChunk) -> SessionUpdate = match &*session_update {
        "agent_message_chunk" => SessionUpdate::AgentMessageChunk,
        "agent_thought_chunk" => SessionUpdate::AgentThoughtChunk,
        "user_message_chunk" => SessionUpdate::UserMessageChunk,
        _ => return None,
    };
    // `into_owned` moves the text out when it had escapes, else copies it: once either way.
    let text = TextContent::new(content.text.into_owned()).meta(content.meta);
    let chunk = ContentChunk::new(ContentBlock::Text(text))
        .message_id(message_id.map(MessageId::new))
        .meta(chunk_meta);
    Some(SessionNotification::new(SessionId::new(&*session_id), wrap(chunk)).meta(meta))
}

fn is_notification<P>(frame: &Notification<'_, P>) -> bool {
    frame.jsonrpc == "2.0" && frame.method == "session/update" && frame.id.is_none()
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::JsonRpcMessage;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// What the SDK's dispatch makes of a line: the JSON-RPC envelope, then the typed
    /// notification through the SDK's own parser.
    fn through_the_sdk(line: &str) -> Option<SessionNotification> {
        let message: Value = serde_json::from_str(line).ok()?;
        if message.get("jsonrpc")? != "2.0" || message.get("id").is_some() {
            return None;
        }
        let method = message.get("method")?.as_str()?;
        let params = message.get("params")?;
        SessionNotification::parse_message(method, params).ok()
    }

    fn update_strategy() -> impl Strategy<Value = Value> {
        let text = ".{0,40}";
        prop_oneof![
            chunk_strategy(),
            (
                text,
                prop::sample::select(vec!["read", "edit", "execute", "other"]),
                prop::sample::select(vec!["pending", "in_progress", "completed"])
            )
                .prop_map(|(title, kind, status)| json!({
                    "sessionUpdate": "tool_call",
                    "toolCallId": "call-1",
                    "title": title,
                    "kind": kind,
                    "status": status,
                })),
            (text, prop::option::of(Just("failed"))).prop_map(|(title, status)| json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": "call-2",
                "title": title,
                "status": status,
            })),
            text.prop_map(|content| json!({
                "sessionUpdate": "plan",
                "entries": [{"content": content, "priority": "high", "status": "pending"}],
            })),
            text.prop_map(|name| json!({"sessionUpdate": name, "content": 1})),
            (
                text,
                prop::sample::select(vec![
                    json!({"state": "running"}),
                    json!({"state": "idle", "stopReason": "end_turn"}),
                    json!({"state": "idle", "stopReason": "error", "error": {"code": -32603, "message": "boom"}}),
                    json!({"state": "unknown"}),
                ])
            )
                .prop_map(|(title, state)| json!({
                    "sessionUpdate": "subagent_update",
                    "sessionId": "child-1",
                    "title": title,
                    "capabilities": {"cancel": {}},
                    "state": state,
                })),
        ]
    }

    /// An object with `pairs` in the order `order` gives (a permutation of at least their
    /// number): `serde_json` keeps insertion order here, so the tag may come first, last or between.
    fn ordered(pairs: &[(&str, Value)], order: &[usize]) -> Value {
        let mut object = serde_json::Map::new();
        for &i in order {
            if let Some((key, value)) = pairs.get(i) {
                object.insert((*key).to_owned(), value.clone());
            }
        }
        Value::Object(object)
    }

    /// The streaming shapes and their neighbours: every chunk kind, text with characters JSON
    /// escapes, any key order, each optional field absent, `null`, well-formed or of a wrong type,
    /// annotations, unknown fields, and content that is not text.
    fn chunk_strategy() -> impl Strategy<Value = Value> {
        let kind = prop::sample::select(vec![
            "agent_message_chunk",
            "agent_thought_chunk",
            "user_message_chunk",
        ]);
        let text = prop_oneof![
            ".{0,40}",
            "[a-z \"\\\\/\t\u{1}\u{7f}\u{e9}\u{2028}\u{1F600}]{0,24}"
        ];
        let optional = |values: Vec<Value>| prop::option::of(prop::sample::select(values));
        let meta = optional(vec![
            json!({"k": [1, "v", {"n": null}], "a": 1.5}),
            json!({}),
            Value::Null,
            json!("not an object"),
        ]);
        let content_kind =
            prop::sample::select(vec!["text", "text", "text", "image", "resource_link"]);
        let annotations = prop::option::weighted(
            0.2,
            prop::sample::select(vec![
                Value::Null,
                json!({"priority": 1, "audience": ["user"]}),
            ]),
        );
        let message_id = optional(vec![json!("m-1"), Value::Null, json!(7)]);
        let unknown =
            prop::sample::select(vec![None, None, None, None, Some("content"), Some("chunk")]);
        let order = || Just((0..5).collect::<Vec<usize>>()).prop_shuffle();
        (
            (kind, text, content_kind, annotations, meta.clone()),
            (message_id, meta, unknown, order(), order()),
        )
            .prop_map(
                |(
                    (kind, text, content_kind, annotations, content_meta),
                    (message_id, chunk_meta, unknown, content_order, chunk_order),
                )| {
                    let mut content = match content_kind {
                        "text" => vec![("type", json!("text")), ("text", json!(text))],
                        "image" => vec![
                            ("type", json!("image")),
                            ("data", json!("aGk=")),
                            ("mimeType", json!("image/png")),
                        ],
                        _ => vec![
                            ("type", json!("resource_link")),
                            ("uri", json!("file:///a")),
                            ("name", json!(text)),
                        ],
                    };
                    content.extend(annotations.map(|a| ("annotations", a)));
                    content.extend(content_meta.map(|m| ("_meta", m)));
                    if unknown == Some("content") {
                        content.push(("unknownField", json!(true)));
                    }
                    // Past the permutation's length: the last extras always come last.
                    let content_order: Vec<usize> = content_order.into_iter().chain(5..8).collect();
                    let mut chunk = vec![
                        ("sessionUpdate", json!(kind)),
                        ("content", ordered(&content, &content_order)),
                    ];
                    chunk.extend(message_id.map(|id| ("messageId", id)));
                    chunk.extend(chunk_meta.map(|m| ("_meta", m)));
                    if unknown == Some("chunk") {
                        chunk.push(("unknownField", json!(1)));
                    }
                    ordered(&chunk, &chunk_order)
                },
            )
    }

    /// Frames around `update`; with `noise`, also another method, a request id and an unknown
    /// field in the update.
    fn frame_strategy(
        update: impl Strategy<Value = Value>,
        noise: bool,
    ) -> impl Strategy<Value = String> {
        (
            update,
            prop::sample::select(vec!["session/update", "session/other"]),
            prop::option::of(0_u32..3),
            prop::option::of(prop::sample::select(vec![
                json!({"x": [1, 2]}),
                Value::Null,
                json!(false),
            ])),
            prop::bool::ANY,
            prop::bool::ANY,
            prop::bool::ANY,
        )
            .prop_map(move |(update, method, id, meta, extra, escaped, pretty)| {
                let (method, id, extra) = if noise {
                    (method, id, extra)
                } else {
                    ("session/update", None, false)
                };
                let mut frame = json!({
                    "jsonrpc": "2.0",
                    "method": method,
                    "params": {"sessionId": "s", "update": update},
                });
                if let Some(id) = id {
                    frame["id"] = json!(id);
                }
                if let Some(meta) = meta {
                    frame["params"]["_meta"] = meta;
                }
                if extra {
                    frame["params"]["update"]["unknownField"] = json!(true);
                }
                let line = if pretty {
                    // Still one line: pretty printing with the newlines turned into spaces.
                    serde_json::to_string_pretty(&frame)
                        .unwrap()
                        .replace('\n', " ")
                } else {
                    frame.to_string()
                };
                if escaped {
                    // Escapes serde_json never writes, in keys, tags and text alike: an escape
                    // inside a JSON string never changes what it means.
                    line.replace("_chunk", "\\u005fchunk")
                        .replace("\"text\"", "\"t\\u0065xt\"")
                        .replace('\u{e9}', "\\u00e9")
                        .replace('\u{1F600}', "\\ud83d\\ude00")
                } else {
                    line
                }
            })
    }

    fn frame(params: &Value) -> String {
        json!({"jsonrpc": "2.0", "method": "session/update", "params": params}).to_string()
    }

    fn chunk_frame(update: &Value) -> String {
        frame(&json!({"sessionId": "s", "update": update}))
    }

    #[test]
    fn the_streaming_shapes_take_the_text_chunk_path() {
        let lines = [
            chunk_frame(&json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}})),
            // The tag last, every optional field set or null, escapes in the text.
            chunk_frame(&json!({"content": {"_meta": {"a": 1}, "text": "a\"b\\c\n\u{e9}",
                "annotations": null, "type": "text"}, "messageId": "m", "_meta": null,
                "sessionUpdate": "agent_thought_chunk"})),
            frame(&json!({"_meta": {"x": [1]}, "update": {"sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": ""}, "messageId": null}, "sessionId": "s"})),
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent\u005fmessage_chunk","content":{"t\u0079pe":"t\u0065xt","text":"\ud83d\ude00"}}}}"#.to_owned(),
        ];
        for line in &lines {
            let fast = text_chunk(line);
            assert!(fast.is_some(), "declined: {line}");
            assert_eq!(fast, through_the_sdk(line), "{line}");
        }
    }

    #[test]
    fn the_text_chunk_path_declines_what_it_does_not_understand_exactly() {
        let declined = [
            // Content that is not text, or text with annotations.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "image", "data": "aGk=", "mimeType": "image/png"}}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "annotations": {"priority": 1}}}),
            // Values the SDK reads as absent.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "messageId": 7}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "_meta": "x"}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "_meta": [1]}}),
            // Unknown fields, at either level.
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi"}, "extra": 1}),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "hi", "extra": 1}}),
            // Another update.
            json!({"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t"}),
        ];
        for update in &declined {
            let line = chunk_frame(update);
            assert!(text_chunk(&line).is_none(), "taken: {line}");
            // The general decoder takes it, as the SDK does.
            let general = session_notification(&line);
            assert!(general.is_some(), "{line}");
            assert_eq!(general, through_the_sdk(&line), "{line}");
        }
        // A chunk tag given as the variant's index: serde's tagged enums accept it.
        let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":1,"content":{"type":"text","text":"hi"}}}}"#;
        assert!(text_chunk(line).is_none());
        assert_eq!(session_notification(line), through_the_sdk(line));
        // Unknown params fields, a request id, a null text: declined here too.
        for line in [
            frame(&json!({"sessionId": "s", "extra": 1,
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}})),
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}})
            .to_string(),
            chunk_frame(&json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": null}})),
        ] {
            assert!(text_chunk(&line).is_none(), "taken: {line}");
        }
    }

    #[test]
    fn a_duplicate_key_is_left_to_the_sdk() {
        // The SDK reads the frame into a JSON tree first, where the last duplicate wins; both
        // decoders here refuse duplicates, so such a frame reaches the SDK unchanged.
        for line in [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a","text":"b"}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"a"}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","sessionId":"t","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}}}"#,
        ] {
            assert!(text_chunk(line).is_none(), "taken: {line}");
            assert!(session_notification(line).is_none(), "taken: {line}");
            assert!(through_the_sdk(line).is_some(), "{line}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn both_paths_give_the_same_update_for_the_same_frame(
            line in prop_oneof![
                frame_strategy(update_strategy(), true),
                frame_strategy(chunk_strategy(), false),
            ]
        ) {
            let fast = session_notification(&line);
            let sdk = through_the_sdk(&line);
            // The fast path may decline a frame (the SDK then handles it), never disagree: what
            // observers get is the SDK's decode, whichever path took the frame.
            if fast.is_some() {
                prop_assert_eq!(&fast, &sdk, "{}", line);
            }
            // The text chunk decoder agrees with the general one whenever it takes a frame.
            if let Some(chunk) = text_chunk(&line) {
                prop_assert_eq!(Some(chunk), general(&line), "{}", line);
            }
            // And it declines no well-formed update the SDK accepts.
            prop_assert_eq!(fast.is_some(), through_the_sdk(&line).is_some(), "{}", line);
        }
    }
}
