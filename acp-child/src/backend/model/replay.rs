//! `session/load`: a saved conversation, replayed as the session updates a client would have seen.
//!
//! Records in, updates out. User prompts become `user_message_chunk`, the model's text
//! `agent_message_chunk`, and each tool call one `tool_call` carrying its final status and result
//! (reasoning is not saved, so it is not replayed; nor are background tasks' completion notices,
//! which a live turn does not show either). The replay shows what the live turns showed:
//! text resuming after a tool call gets the same separator, and tool call ids are claimed in the
//! session's memory as a live turn claims them (a reused id is shown under a fresh one).

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, SessionUpdate, TextContent, ToolCallId, ToolCallStatus,
};

use super::tools::Toolbox;
use crate::backend::TextFlow;
use crate::session::Memory;
use crate::store::Record;
use crate::workspace::Workspace;

/// The updates replaying `history` (the conversation `memory` holds). Tool call ids are claimed
/// in `memory` as a live turn claims them, so a replayed id is never announced again.
pub(crate) fn updates(
    tools: &Toolbox,
    history: &[Record],
    workspace: &Workspace,
    memory: &Memory,
) -> Vec<SessionUpdate> {
    let text = |text: &str| ContentChunk::new(ContentBlock::Text(TextContent::new(text)));
    let mut updates = Vec::new();
    let mut flow = TextFlow::default();
    for (at, record) in history.iter().enumerate() {
        match record {
            Record::User { text: prompt } => {
                flow = TextFlow::default();
                updates.push(SessionUpdate::UserMessageChunk(text(prompt)));
            }
            Record::Assistant {
                text: reply,
                tool_calls,
            } => {
                if let Some(separator) = flow.text(reply) {
                    updates.push(SessionUpdate::AgentMessageChunk(text(separator)));
                }
                if !reply.is_empty() {
                    updates.push(SessionUpdate::AgentMessageChunk(text(reply)));
                }
                for call in tool_calls {
                    let mut shown = tools.announcement(call, workspace);
                    shown.tool_call_id = ToolCallId::new(memory.claim_tool_call_id(&call.id));
                    shown = match result_of(&history[at + 1..], &call.id) {
                        Some((content, failed)) => shown
                            .status(if failed {
                                ToolCallStatus::Failed
                            } else {
                                ToolCallStatus::Completed
                            })
                            .content(vec![content.to_owned().into()]),
                        None => shown.status(ToolCallStatus::Failed),
                    };
                    flow.tool_call();
                    updates.push(SessionUpdate::ToolCall(shown));
                }
            }
            Record::Session { .. }
            | Record::Tool { .. }
            | Record::Notice { .. }
            | Record::Child(_) => {}
        }
    }
    updates
}

/// The result of call `id` among the tool results that follow its reply (a model may reuse an
/// id in a later reply, so the search stops at the next reply or prompt).
fn result_of<'a>(after: &'a [Record], id: &str) -> Option<(&'a str, bool)> {
    after
        .iter()
        .take_while(|record| matches!(record, Record::Tool { .. }))
        .find_map(|record| match record {
            Record::Tool {
                call_id,
                content,
                failed,
            } if call_id == id => Some((content.as_str(), *failed)),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{ToolCallContent, ToolKind};

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
            // A completion notice is told the model (as a made-up tool exchange), not shown.
            Record::Notice {
                text: "Background task subagent-1 ...".into(),
                task: Some("subagent-1".into()),
            },
            Record::Assistant {
                text: "It says A.".into(),
                tool_calls: vec![],
            },
        ];
        let tools = Toolbox::standard(
            std::time::Duration::from_secs(1),
            &protocol::sandbox::Policy::default(),
            false,
            false,
        );
        let updates = updates(&tools, &history, &workspace, &Memory::default());
        assert_eq!(updates.len(), 5);
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
        assert_eq!(
            updates[3..],
            [
                SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
                    TextContent::new("\n\n")
                ))),
                SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
                    TextContent::new("It says A.")
                ))),
            ]
        );
    }

    #[test]
    fn a_reused_call_id_is_replayed_under_a_fresh_one_with_its_own_result() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path()).unwrap();
        let call = || RecordedCall {
            id: "call_1".into(),
            name: "list_dir".into(),
            arguments: r#"{"path":"."}"#.into(),
        };
        let reply = || Record::Assistant {
            text: String::new(),
            tool_calls: vec![call()],
        };
        let result = |content: &str| Record::Tool {
            call_id: "call_1".into(),
            content: content.into(),
            failed: false,
        };
        let history = vec![reply(), result("first"), reply(), result("second")];
        let tools = Toolbox::standard(
            std::time::Duration::from_secs(1),
            &protocol::sandbox::Policy::default(),
            false,
            false,
        );
        let shown: Vec<(String, Vec<ToolCallContent>)> =
            updates(&tools, &history, &workspace, &Memory::default())
                .into_iter()
                .map(|update| match update {
                    SessionUpdate::ToolCall(call) => {
                        (call.tool_call_id.0.to_string(), call.content)
                    }
                    other => panic!("expected a tool call, got {other:?}"),
                })
                .collect();
        assert_eq!(
            shown,
            [
                ("call_1".to_owned(), vec!["first".to_owned().into()]),
                ("call-1".to_owned(), vec!["second".to_owned().into()]),
            ]
        );
    }
}
