//! End-to-end: what a streaming child costs this agent's client. A client without subagent
//! sessions sees the child's text on its tool card as a bounded tail, sent at a bounded rate: a
//! large answer reaches it in at most twice its size (plus one tail per card delay), never once
//! per chunk; a client with subagent sessions gets every chunk, once. The figures for a 1 MB
//! answer and a stalled client are measured by `scripts/bench-relay`, not here.

use std::time::Instant;

use acp_tests::acp_client::{Launch, Permission, new_session, prompt, stop_reason, with_launch};
use agent_client_protocol::v1::schema::{
    ContentBlock, SessionUpdate, StopReason, ToolCallContent, ToolCallStatus, ToolCallUpdate,
};

use super::children::{assert_none_left, mock_definition};

/// The bytes of the flood the mock child sends: `CHUNKS` chunks of `BYTES`.
const CHUNKS: usize = 20_000;
const BYTES: usize = 50;
/// How much of its text a card shows, and how long new text waits at most (acp-child's
/// `SHOWN_BYTES` and `CARD_DELAY`).
const SHOWN_BYTES: usize = 8 * 1024;
const CARD_DELAY_MS: u128 = 100;

/// The text of a tool call content list.
fn texts(content: &[ToolCallContent]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Content(c) => match &c.content {
                ContentBlock::Text(text) => Some(text.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_large_child_answer_reaches_a_tool_card_client_in_at_most_twice_its_size() {
    let cwd = tempfile::tempdir().unwrap();
    mock_definition(
        cwd.path(),
        "flood",
        &format!("flood --chunks {CHUNKS} --bytes {BYTES}"),
    );
    let started = Instant::now();
    let ((log, reason), _) = with_launch(Launch::offline(), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (log, response) =
            prompt(&mut session, "/delegate flood go", Permission::NotExpected).await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    let elapsed = started.elapsed().as_millis();
    assert_eq!(reason, StopReason::EndTurn);
    let answer: String = (0..CHUNKS)
        .map(|i| acp_tests::mock::cli::flood_chunk(i, BYTES))
        .collect();
    // The call's result is the whole answer, once.
    assert_eq!(log.text, answer);
    let updates = log.tool_call_updates();
    let (shown, result): (Vec<&&ToolCallUpdate>, Vec<_>) = updates
        .iter()
        .filter(|update| update.fields.content.is_some())
        .partition(|update| update.fields.status != Some(ToolCallStatus::Completed));
    assert_eq!(result.len(), 1, "one completion");
    let shown: Vec<String> = shown
        .iter()
        .map(|update| texts(update.fields.content.as_deref().unwrap()))
        .collect();
    // Each card is a tail of the answer so far, at most SHOWN_BYTES, each further on.
    let mut end: usize = 0;
    for text in &shown {
        assert!(text.len() <= SHOWN_BYTES, "{}", text.len());
        let at = answer[end.saturating_sub(SHOWN_BYTES)..]
            .find(text.as_str())
            .expect("a card shows a piece of the answer")
            + end.saturating_sub(SHOWN_BYTES);
        assert!(at + text.len() > end, "a card went back");
        end = at + text.len();
    }
    let sent: usize = shown.iter().map(String::len).sum();
    let bound =
        2 * answer.len() + SHOWN_BYTES * usize::try_from(elapsed / CARD_DELAY_MS + 2).unwrap();
    assert!(
        sent <= bound,
        "{sent} bytes of cards for a {} byte answer in {elapsed} ms (bound {bound}), {} cards",
        answer.len(),
        shown.len()
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn a_client_with_subagent_sessions_gets_every_chunk_of_the_child_once() {
    let cwd = tempfile::tempdir().unwrap();
    mock_definition(cwd.path(), "flood", "flood --chunks 2000 --bytes 50");
    let ((), finished) = with_launch(Launch::offline().subagents(), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (_, response) =
            prompt(&mut session, "/delegate flood go", Permission::NotExpected).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(())
    })
    .await;
    let child: String = finished
        .all_updates
        .iter()
        .filter(|(on, _)| on == "sub-1")
        .filter_map(|(_, update)| match update {
            SessionUpdate::AgentMessageChunk(chunk) => match &chunk.content {
                ContentBlock::Text(text) => Some(text.text.as_str()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let answer: String = (0..2000)
        .map(|i| acp_tests::mock::cli::flood_chunk(i, 50))
        .collect();
    assert_eq!(child, answer);
    assert_none_left(cwd.path());
}
