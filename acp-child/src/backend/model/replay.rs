//! `session/load`: a saved conversation, replayed as the session updates a client would have seen.
//!
//! Pure: records in, updates out. User prompts become `user_message_chunk`, the model's text
//! `agent_message_chunk`, and each tool call one `tool_call` carrying its final status and result
//! (reasoning is not saved, so it is not replayed).

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, SessionUpdate, TextContent, ToolCallStatus,
};

use super::tools::announcement;
use crate::store::Record;
use crate::tools::Workspace;

/// The updates replaying `history`.
#[must_use]
pub fn updates(history: &[Record], workspace: &Workspace) -> Vec<SessionUpdate> {
    let results: HashMap<&str, (&str, bool)> = history
        .iter()
        .filter_map(|record| match record {
            Record::Tool {
                call_id,
                content,
                failed,
            } => Some((call_id.as_str(), (content.as_str(), *failed))),
            _ => None,
        })
        .collect();
    let text = |text: &str| ContentChunk::new(ContentBlock::Text(TextContent::new(text)));
    let mut updates = Vec::new();
    for record in history {
        match record {
            Record::User { text: prompt } => {
                updates.push(SessionUpdate::UserMessageChunk(text(prompt)));
            }
            Record::Assistant {
                text: reply,
                tool_calls,
            } => {
                if !reply.is_empty() {
                    updates.push(SessionUpdate::AgentMessageChunk(text(reply)));
                }
                for call in tool_calls {
                    let mut shown = announcement(call, workspace);
                    shown = match results.get(call.id.as_str()) {
                        Some((content, failed)) => shown
                            .status(if *failed {
                                ToolCallStatus::Failed
                            } else {
                                ToolCallStatus::Completed
                            })
                            .content(vec![(*content).to_owned().into()]),
                        None => shown.status(ToolCallStatus::Failed),
                    };
                    updates.push(SessionUpdate::ToolCall(shown));
                }
            }
            Record::Session { .. } | Record::Tool { .. } => {}
        }
    }
    updates
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::ToolKind;

    use super::*;
    use crate::store::RecordedCall;

    #[test]
    fn history_replays_as_chunks_and_tool_calls() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let history = vec![
            Record::User {
                text: "read a".into(),
            },
            Record::Assistant {
                text: "Reading.".into(),
                tool_calls: vec![RecordedCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
            },
            Record::Tool {
                call_id: "call_1".into(),
                content: "A".into(),
                failed: false,
            },
            Record::Assistant {
                text: "It says A.".into(),
                tool_calls: vec![],
            },
        ];
        let updates = updates(&history, &workspace);
        assert_eq!(updates.len(), 4);
        assert!(matches!(&updates[0], SessionUpdate::UserMessageChunk(_)));
        assert!(matches!(&updates[1], SessionUpdate::AgentMessageChunk(_)));
        let SessionUpdate::ToolCall(call) = &updates[2] else {
            panic!("expected a tool call, got {:?}", updates[2]);
        };
        assert_eq!(call.tool_call_id.0.as_ref(), "call_1");
        assert_eq!(call.title, "Read a.txt");
        assert_eq!(call.kind, ToolKind::Read);
        assert_eq!(call.status, ToolCallStatus::Completed);
        assert_eq!(call.locations[0].path, workspace.root().join("a.txt"));
        assert!(matches!(&updates[3], SessionUpdate::AgentMessageChunk(_)));
    }
}
