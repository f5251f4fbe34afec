//! End-to-end: delegated children exposed as ACP subagent sessions. A client advertising
//! `subagents` (the test client, or `acp-host` itself) sees each child announced on the parent's
//! session, the child's own updates and permission requests under the id acp-child minted for it,
//! then exactly one final state; one child cancelled through its own session leaves its sibling
//! and the parent running; a grandchild is announced on its parent's session, and cancelling its
//! own session (through acp-host's library, `Cancel::cancel_session`) ends the grandchild only; a
//! client without the capability gets the tool-card fallback. No process is left behind.

use std::sync::Arc;

use acp_tests::acp_client::{
    Launch, Permission, TurnLog, new_session, prompt, read_until, stop_reason, with_launch,
};
use acp_tests::mock_llm::MockLlm;
use acp_tests::{code, run_to_end, stderr};
use agent_client_protocol::v1::schema::{
    CancelNotification, SessionUpdate, StateUpdate, StopReason, SubagentUpdate, ToolCallContent,
};
use protocol::child_session::ChildState;
use protocol::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};
use serde_json::{Value, json};

use super::children::{assert_none_left, kept, offline_parent, parallel_calls, write_approved};
use super::common::json_run;

/// The outcome a `subagent_update` reports, if it carries a final state.
fn final_state(update: &SubagentUpdate) -> Option<(ChildState, Option<String>)> {
    let state = update.state.value()?;
    ChildState::from_update(state).filter(|(state, _)| state.is_final())
}

/// The `subagent_update`s among `updates`, with the session each was sent on.
fn subagent_updates(updates: &[(String, SessionUpdate)]) -> Vec<(usize, &str, &SubagentUpdate)> {
    updates
        .iter()
        .enumerate()
        .filter_map(|(at, (on, update))| match update {
            SessionUpdate::SubagentUpdate(child) => Some((at, on.as_str(), child)),
            _ => None,
        })
        .collect()
}

/// An offline acp-child that may delegate to acp-child, with a client advertising `subagents`.
fn delegating() -> Launch {
    Launch::offline()
        .arg("--subagent-agents")
        .arg("acp-child")
        .subagents()
}

#[tokio::test]
async fn a_client_advertising_subagents_sees_announce_then_child_updates_then_one_final_state() {
    let cwd = tempfile::tempdir().unwrap();
    let ((log, reason, root), finished) = with_launch(delegating(), async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let root = session.session_id().to_string();
        let (log, response) = prompt(
            &mut session,
            "/delegate acp-child /write notes.txt from the child",
            Permission::NotExpected,
        )
        .await?;
        Ok((log, stop_reason(response), root))
    })
    .await;
    assert_eq!(reason, StopReason::EndTurn);
    assert_eq!(log.text, "wrote 14 bytes to notes.txt");
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("notes.txt")).unwrap(),
        "from the child"
    );
    let all = &finished.all_updates;
    let subagent = subagent_updates(all);
    assert_eq!(subagent.len(), 2, "{subagent:#?}");
    // The announcement, on the parent's session: a minted id, the name, the task, cancellable.
    let (announced_at, on, announce) = subagent[0];
    assert_eq!(on, root);
    let child = announce.session_id.to_string();
    assert_eq!(child, "sub-1");
    assert_eq!(
        announce.title.value().map(String::as_str),
        Some("acp-child")
    );
    assert_eq!(
        announce.description.value().map(String::as_str),
        Some("/write notes.txt from the child")
    );
    assert!(
        announce
            .capabilities
            .value()
            .is_some_and(|caps| caps.cancel.is_some())
    );
    assert!(matches!(
        announce.state.value(),
        Some(StateUpdate::Running(_))
    ));
    // Exactly one final state, on the parent's session, after every update of the child.
    let (ended_at, on, ended) = subagent[1];
    assert_eq!(
        (on, ended.session_id.to_string()),
        (root.as_str(), child.clone())
    );
    assert_eq!(
        final_state(ended),
        Some((ChildState::Completed, Some("end_turn".into())))
    );
    let child_updates: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, (on, _))| *on == child)
        .map(|(at, _)| at)
        .collect();
    assert!(!child_updates.is_empty());
    assert!(
        child_updates
            .iter()
            .all(|&at| announced_at < at && at < ended_at),
        "{all:#?}"
    );
    // Only the parent's session and the minted one: the child agent's own ids never pass.
    let sessions: std::collections::BTreeSet<&str> =
        all.iter().map(|(on, _)| on.as_str()).collect();
    assert_eq!(sessions, [root.as_str(), "sub-1"].into_iter().collect());
    // The child's own text is on its session, not the parent's.
    assert!(
        all.iter()
            .any(|(on, update)| on == &child
                && matches!(update, SessionUpdate::AgentMessageChunk(_)))
    );
    // Its permission request came on its session, about its own tool call, with its options.
    assert_eq!(finished.child_permissions.len(), 1);
    let asked = &finished.child_permissions[0];
    assert_eq!(asked.session_id.to_string(), child);
    assert_eq!(
        asked.tool_call.fields.title.as_deref(),
        Some("Write notes.txt")
    );
    let options: Vec<String> = asked
        .options
        .iter()
        .map(|o| o.option_id.to_string())
        .collect();
    assert_eq!(options, ["allow-once", "reject-once"]);
    // The parent's card references the child's session.
    assert!(log.tool_call_updates().iter().any(|update| {
        update.fields.content.as_ref().is_some_and(|content| {
            content.iter().any(
                |c| matches!(c, ToolCallContent::Session(s) if s.session_id.to_string() == child),
            )
        })
    }));
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn without_the_capability_the_child_is_a_tool_card_and_asks_on_the_parent_session() {
    let cwd = tempfile::tempdir().unwrap();
    let launch = Launch::offline().arg("--subagent-agents").arg("acp-child");
    let ((log, reason), finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (log, response) = prompt(
            &mut session,
            "/delegate acp-child /write notes.txt x",
            Permission::Allow,
        )
        .await?;
        Ok((log, stop_reason(response)))
    })
    .await;
    assert_eq!(reason, StopReason::EndTurn);
    assert_eq!(log.text, "wrote 1 bytes to notes.txt");
    assert!(
        !log.updates
            .iter()
            .any(|u| matches!(u, SessionUpdate::SubagentUpdate(_)))
    );
    assert!(finished.all_updates.iter().all(|(on, _)| on == "sess-1"));
    // Asked on the parent's session, about a card of its own titled with the subagent's name.
    assert_eq!(log.permission_requests.len(), 1);
    let asked = &log.permission_requests[0].tool_call.tool_call_id;
    let card = log
        .tool_calls()
        .into_iter()
        .find(|call| &call.tool_call_id == asked)
        .expect("the request's tool call was announced");
    assert_eq!(card.title, "acp-child: Write notes.txt");
    // The card showed the child's text while it ran.
    assert!(log.tool_call_updates().iter().any(|update| {
        update.fields.content.as_ref().is_some_and(|content| {
            content.iter().any(|c| {
                serde_json::to_value(c).unwrap()["content"]["text"] == "wrote 1 bytes to notes.txt"
            })
        })
    }));
    assert_none_left(cwd.path());
}

/// Reads until the next child is announced; returns its id and task.
async fn next_announcement(
    session: &mut agent_client_protocol::v1::ActiveSession<'static, agent_client_protocol::Agent>,
    log: &mut TurnLog,
) -> (String, String) {
    let stopped = read_until(
        session,
        log,
        Permission::NotExpected,
        |update| matches!(update, SessionUpdate::SubagentUpdate(child) if child.title.is_value()),
    )
    .await
    .unwrap();
    assert!(
        stopped.is_none(),
        "the turn ended before a child was announced"
    );
    let Some(SessionUpdate::SubagentUpdate(child)) = log.updates.last() else {
        unreachable!("read_until stopped at an announcement");
    };
    (
        child.session_id.to_string(),
        child.description.value().cloned().unwrap_or_default(),
    )
}

#[tokio::test]
async fn cancelling_one_childs_session_leaves_its_sibling_and_the_parent_running() {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let llm = MockLlm::start(vec![
        parallel_calls(&["/sleep 60", "/sleep 3"]),
        acp_tests::mock_llm::Reply::text(["both back"]),
    ]);
    let launch = Launch::model(&llm.base_url(), state.path())
        .arg("--subagent-agents")
        .arg("acp-child")
        .subagents();
    let ((log, reason, cancelled), finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        session.send_prompt("go")?;
        let mut log = TurnLog::default();
        let first = next_announcement(&mut session, &mut log).await;
        let second = next_announcement(&mut session, &mut log).await;
        let sleeper = [first, second]
            .into_iter()
            .find(|(_, task)| task == "/sleep 60")
            .expect("the long child was announced")
            .0;
        cx.send_notification(CancelNotification::new(sleeper.clone()))?;
        let response = read_until(&mut session, &mut log, Permission::NotExpected, |_| false)
            .await?
            .expect("the turn ends");
        Ok((log, stop_reason(response), sleeper))
    })
    .await;
    // The parent went on and answered after both children.
    assert_eq!(reason, StopReason::EndTurn);
    assert_eq!(log.text, "both back");
    let finals: Vec<(String, (ChildState, Option<String>))> =
        subagent_updates(&finished.all_updates)
            .into_iter()
            .filter_map(|(_, _, child)| {
                final_state(child).map(|s| (child.session_id.to_string(), s))
            })
            .collect();
    assert_eq!(finals.len(), 2, "{finals:?}");
    // The cancelled child ended first, cancelled; its sibling was still running and completed.
    assert_eq!(
        finals[0],
        (
            cancelled.clone(),
            (ChildState::Cancelled, Some("cancelled".into()))
        )
    );
    assert_ne!(finals[1].0, cancelled);
    assert_eq!(
        finals[1].1,
        (ChildState::Completed, Some("end_turn".into()))
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    // The cancelled child's result says so (with its stop reason when the cancel found its prompt
    // already sent); the sibling's is its answer.
    let cancelled_result = requests[1].tool_result("call_0").unwrap();
    assert!(
        cancelled_result.starts_with("subagent acp-child ended aborted"),
        "{cancelled_result}"
    );
    assert_eq!(
        requests[1].tool_result("call_1"),
        Some(kept("slept 3 s", "agent-2"))
    );
    assert_none_left(cwd.path());
}

/// A `subagent_update` seen: where in the log, on which session, about which child, its final state.
type Seen = (usize, String, String, Option<(ChildState, Option<String>)>);

#[tokio::test]
async fn a_grandchild_is_announced_on_its_parents_session_under_a_minted_id() {
    let cwd = tempfile::tempdir().unwrap();
    // In the session's folder, so the child finds it too; the cap allows depth 2.
    write_approved(
        &cwd.path().join("subagents"),
        "leaf.md",
        "---\ndescription: an acp-child\nrun: {}\n---\nDo as told.\n",
    );
    let launch = Launch::offline().env(ACP_HOST_MAX_DEPTH, "2").subagents();
    let ((log, reason, root), finished) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let root = session.session_id().to_string();
        let (log, response) = prompt(
            &mut session,
            "/delegate leaf /delegate leaf /write g.txt from the grandchild",
            Permission::NotExpected,
        )
        .await?;
        Ok((log, stop_reason(response), root))
    })
    .await;
    assert_eq!(reason, StopReason::EndTurn);
    assert_eq!(log.text, "wrote 19 bytes to g.txt");
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("g.txt")).unwrap(),
        "from the grandchild"
    );
    let subagent: Vec<Seen> = subagent_updates(&finished.all_updates)
        .into_iter()
        .map(|(at, on, child)| {
            (
                at,
                on.to_owned(),
                child.session_id.to_string(),
                final_state(child),
            )
        })
        .collect();
    let shape: Vec<(&str, &str, Option<ChildState>)> = subagent
        .iter()
        .map(|(_, on, id, state)| (on.as_str(), id.as_str(), state.as_ref().map(|s| s.0)))
        .collect();
    // The child on the parent's session, the grandchild on the child's; each ends on the session
    // it was announced on, the grandchild first.
    assert_eq!(
        shape,
        [
            (root.as_str(), "sub-1", None),
            ("sub-1", "sub-2", None),
            ("sub-1", "sub-2", Some(ChildState::Completed)),
            (root.as_str(), "sub-1", Some(ChildState::Completed)),
        ]
    );
    // The grandchild is offered cancel (forwarded to the child); its updates and request came on
    // its own id.
    let nested = subagent_updates(&finished.all_updates)[1].2;
    assert!(
        nested
            .capabilities
            .value()
            .is_some_and(|capabilities| capabilities.cancel.is_some()),
        "{nested:?}"
    );
    assert_eq!(nested.title.value().map(String::as_str), Some("leaf"));
    assert!(
        finished
            .all_updates
            .iter()
            .any(|(on, update)| on == "sub-2" && matches!(update, SessionUpdate::ToolCall(_)))
    );
    assert_eq!(finished.child_permissions.len(), 1);
    assert_eq!(
        finished.child_permissions[0].session_id.to_string(),
        "sub-2"
    );
    let (announced, ended) = (subagent[1].0, subagent[2].0);
    assert!(
        finished
            .all_updates
            .iter()
            .enumerate()
            .filter(|(_, (on, _))| on == "sub-2")
            .all(|(at, _)| announced < at && at < ended)
    );
    assert_none_left(cwd.path());
}

#[test]
fn acp_host_json_carries_the_child_session_and_the_result_lists_the_children() {
    let dir = tempfile::tempdir().unwrap();
    let (records, result) = json_run(
        offline_parent(dir.path(), &[]).args([
            "--json",
            "--permission",
            "allow",
            "/delegate acp-child /write notes.txt from the child",
        ]),
        0,
    );
    assert_eq!(result["output"], "wrote 14 bytes to notes.txt");
    assert_eq!(
        result["children"],
        json!([{
            "sessionId": "sub-1",
            "parentSessionId": "sess-1",
            "name": "acp-child",
            "task": "/write notes.txt from the child",
            "state": "completed",
            "stopReason": "end_turn",
        }])
    );
    // The child's permission request was answered by the run's policy, and says whose it was.
    let permissions = result["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 1);
    assert_eq!(permissions[0]["sessionId"], "sub-1");
    assert_eq!(permissions[0]["title"], "Write notes.txt");
    assert_eq!(permissions[0]["verdict"], "allow");
    // The child's updates carry its session id and name; the parent's carry neither.
    let child_updates: Vec<&Value> = records
        .iter()
        .filter(|r| r["type"] == "update" && r["sessionId"] == "sub-1")
        .collect();
    assert!(child_updates.iter().all(|r| r["subagent"] == "acp-child"));
    assert!(child_updates.iter().any(|r| {
        r["update"]["sessionUpdate"] == "agent_message_chunk"
            && r["update"]["content"]["text"] == "wrote 14 bytes to notes.txt"
    }));
    let kinds: Vec<&str> = records
        .iter()
        .filter(|r| r["update"]["sessionUpdate"] == "subagent_update")
        .map(|r| r["update"]["state"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["running", "idle"]);
    assert_none_left(dir.path());
}

#[test]
fn acp_host_verbose_shows_child_activity_prefixed_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(offline_parent(dir.path(), &[]).args([
        "--verbose",
        "--permission",
        "allow",
        "/delegate acp-child /write notes.txt from the child",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(acp_tests::stdout(&out), "wrote 14 bytes to notes.txt");
    // The lines about the run's sessions (not the agent's own log lines, nor the pid).
    let stderr = stderr(&out);
    let shown: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("acp-host: [") || line.starts_with("acp-host: permission"))
        .collect();
    insta::assert_snapshot!("verbose_child_activity", shown.join("\n"));
    assert_none_left(dir.path());
}

/// Cancels child session `target` through the run's [`Cancel`] once an update of it is seen.
struct CancelOnSight {
    target: &'static str,
    cancel: acp_host::run::Cancel,
    sent: std::sync::atomic::AtomicBool,
}

impl acp_host::run::Observer for CancelOnSight {
    fn on_event(
        &self,
        event: &protocol::events::Event,
    ) -> Result<(), acp_host::run::ObserverError> {
        if let protocol::events::Event::Update {
            session_id: Some(id),
            ..
        } = event
            && id == self.target
            && !self.sent.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            self.cancel.cancel_session(id);
        }
        Ok(())
    }
}

#[test]
fn cancelling_a_grandchilds_own_session_ends_only_the_grandchild() {
    use protocol::request::{AgentCommand, StartRequest, Timeouts};
    use protocol::status::Status;

    let cwd = tempfile::tempdir().unwrap();
    write_approved(
        &cwd.path().join("subagents"),
        "leaf.md",
        "---\ndescription: an acp-child\nrun: {}\n---\nDo as told.\n",
    );
    let request = StartRequest {
        agent: AgentCommand {
            program: acp_tests::bin("acp-child"),
            args: Vec::new(),
            display: "acp-child".into(),
            install_hint: None,
        },
        prompt: "/delegate leaf /delegate leaf /sleep 60".into(),
        cwd: cwd.path().to_path_buf(),
        env: Vec::new(),
        permission: protocol::permission::PermissionPolicy::Reject,
        timeouts: Timeouts::default(),
        // Room for the grandchild (depth 2).
        max_depth: Some(2),
        wants: protocol::capabilities::Wants::default(),
        resume: None,
        fork: None,
        budget: protocol::usage::Budget::default(),
        on_unreported: protocol::usage::Unreported::default(),
        sandbox: protocol::sandbox::Policy::default(),
    };
    // The approval above is kept in the suite's state directory.
    let ambient = std::env::vars_os()
        .filter(|(name, _)| {
            name != ACP_HOST_DEPTH && name != ACP_HOST_MAX_DEPTH && name != "ACP_CHILD_MODEL"
        })
        .chain([(
            protocol::env_vars::XDG_STATE_HOME.into(),
            acp_tests::suite_state().into(),
        )]);
    let prepared = acp_host::run::prepare(request, ambient).unwrap();
    let cancel = acp_host::run::Cancel::new();
    // The parent mints `sub-1` for its child and `sub-2` for the grandchild the child announces.
    let observer = Arc::new(CancelOnSight {
        target: "sub-2",
        cancel: cancel.clone(),
        sent: std::sync::atomic::AtomicBool::new(false),
    });
    let options = acp_host::run::RunOptions {
        observers: vec![observer.clone() as Arc<dyn acp_host::run::Observer>],
        ..acp_host::run::RunOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(acp_host::run::run(prepared, &options, &cancel));
    assert!(observer.sent.load(std::sync::atomic::Ordering::SeqCst));
    // The run, the parent and the child went on to the end; only the grandchild was cancelled.
    assert_eq!(result.status, Status::Completed, "{result:?}");
    assert!(
        result.output.starts_with("subagent leaf ended aborted"),
        "{}",
        result.output
    );
    let states: Vec<(&str, &str, ChildState)> = result
        .children
        .iter()
        .map(|c| (c.session_id.as_str(), c.parent_session_id.as_str(), c.state))
        .collect();
    let root = result.session_id.clone().unwrap();
    assert_eq!(
        states,
        [
            ("sub-1", root.as_str(), ChildState::Completed),
            ("sub-2", "sub-1", ChildState::Cancelled),
        ]
    );
    assert_none_left(cwd.path());
}

/// The content, locations and raw input of the one permission request in `asked`.
fn what_was_asked(
    asked: &[agent_client_protocol::v1::schema::RequestPermissionRequest],
) -> (Value, Value, Value) {
    assert_eq!(asked.len(), 1, "{asked:#?}");
    let fields = &asked[0].tool_call.fields;
    (
        serde_json::to_value(&fields.content).unwrap(),
        serde_json::to_value(&fields.locations).unwrap(),
        serde_json::to_value(&fields.raw_input).unwrap(),
    )
}

#[tokio::test]
async fn a_relayed_write_shows_the_childs_diff_exactly_as_a_direct_one_in_both_modes() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("notes.txt"), "old\n").unwrap();
    let ask = async |launch: Launch, prompt_text: &str| {
        let (log, finished) = with_launch(launch, async |cx, _| {
            let mut session = new_session(&cx, cwd.path()).await?;
            let (log, response) = prompt(&mut session, prompt_text, Permission::Reject).await?;
            assert_eq!(stop_reason(response), StopReason::EndTurn);
            Ok(log)
        })
        .await;
        (log, finished)
    };
    let (log, _) = ask(Launch::offline(), "/write notes.txt new").await;
    assert_eq!(log.text, "permission denied: did not write notes.txt");
    let direct = what_was_asked(&log.permission_requests);
    let (content, _, _) = &direct;
    assert!(
        content.to_string().contains(r#""type":"diff""#),
        "a direct write shows its diff: {content}"
    );
    // As a tool card of the parent: the same diff and raw input, as the child reported them.
    let (card, _) = ask(
        Launch::offline().arg("--subagent-agents").arg("acp-child"),
        "/delegate acp-child /write notes.txt new",
    )
    .await;
    assert_eq!(card.text, "permission denied: did not write notes.txt");
    assert_eq!(what_was_asked(&card.permission_requests), direct);
    // On the child's own session (the test client allows those): the same again.
    let (_, finished) = ask(delegating(), "/delegate acp-child /write notes.txt new").await;
    assert_eq!(what_was_asked(&finished.child_permissions), direct);
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("notes.txt")).unwrap(),
        "new"
    );
    assert_none_left(cwd.path());
}

#[tokio::test]
async fn after_three_rejections_in_a_row_a_childs_requests_are_rejected_without_asking() {
    let cwd = tempfile::tempdir().unwrap();
    let defs = tempfile::tempdir().unwrap();
    super::children::write_definition(
        defs.path(),
        "asker.md",
        &format!(
            "---\ndescription: asks\nrun:\n  agent: {}\n---\nAsk.\n",
            serde_json::to_string(&super::common::mock(&["permission", "--count", "6"])).unwrap()
        ),
    );
    let launch = Launch::offline()
        .arg("--subagents")
        .arg(defs.path())
        .env(ACP_HOST_DEPTH, "0")
        .env(ACP_HOST_MAX_DEPTH, "1");
    let (log, _) = with_launch(launch, async |cx, _| {
        let mut session = new_session(&cx, cwd.path()).await?;
        let (log, response) =
            prompt(&mut session, "/delegate asker go", Permission::Reject).await?;
        assert_eq!(stop_reason(response), StopReason::EndTurn);
        Ok(log)
    })
    .await;
    // The person was asked three times; the other three were rejected without asking.
    assert_eq!(log.permission_requests.len(), 3);
    assert_eq!(log.text.lines().count(), 6, "{}", log.text);
    assert!(
        log.text.lines().all(|line| line == "selected reject_once"),
        "{}",
        log.text
    );
    // Said once, on the child's card.
    let told = "subagent asker: you rejected 3 of its requests in a row; its further requests \
                are rejected without asking";
    let said = log
        .tool_call_updates()
        .iter()
        .filter(|update| {
            serde_json::to_string(&update.fields.content)
                .unwrap()
                .contains(told)
        })
        .count();
    assert_eq!(said, 1);
    assert_none_left(cwd.path());
}
