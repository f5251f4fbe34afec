//! The child sessions the agent announced in this run (ACP subagent sessions), for routing their
//! updates and permission requests and for the result's list.
//!
//! Invariants:
//! - a child is announced by the first `subagent_update` naming its session id, sent on our
//!   session or on a child already announced (nesting); our own id or the sender's is never one;
//! - a child is never re-parented, and one that reached a final state stays there until a
//!   result listed it (then it is let go);
//! - at most [`MAX_CHILDREN`] are tracked at once: later announcements are ignored (and their
//!   sessions are foreign);
//! - a result lists the children announced or updated since the result before it: a kept
//!   session's turn lists its own, with running ones still `running` and still tracked (their
//!   updates and requests keep their routing in later turns); the run's final result marks a
//!   child still running `disconnected`.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{Cost as AcpCost, Meta, StateUpdate, SubagentUpdate};
use protocol::child_session::{ChildSession, ChildState, Failure};
use protocol::usage::{Cost, Usage};

/// The most child sessions tracked in one run; later announcements are ignored (and their
/// sessions foreign), so a runaway agent cannot grow the result without bound.
pub(super) const MAX_CHILDREN: usize = 1024;

/// The child sessions announced so far, in order.
#[derive(Debug, Default)]
pub(super) struct Children {
    list: Vec<Tracked>,
    index: HashMap<String, usize>,
}

/// One announced child, and whether it changed since the last result listed the children.
#[derive(Debug)]
struct Tracked {
    child: ChildSession,
    changed: bool,
}

impl Children {
    pub(super) fn get(&self, session_id: &str) -> Option<&ChildSession> {
        self.index.get(session_id).map(|&i| &self.list[i].child)
    }

    /// Applies one `subagent_update` sent on `parent` (ours or a known child's): the first for a
    /// session id announces it, later ones patch it. A child is never re-parented, and one that
    /// ended stays ended.
    pub(super) fn apply(&mut self, parent: &str, ours: &str, update: &SubagentUpdate) {
        let id = update.session_id.to_string();
        if id == ours || id == parent {
            return;
        }
        let index = match self.index.get(&id) {
            Some(&index) => index,
            None if self.list.len() < MAX_CHILDREN => {
                self.list.push(Tracked {
                    child: ChildSession {
                        session_id: id.clone(),
                        parent_session_id: parent.to_owned(),
                        name: None,
                        task: None,
                        state: ChildState::Running,
                        stop_reason: None,
                        error: None,
                        stderr_tail: None,
                        usage: None,
                    },
                    changed: true,
                });
                self.index.insert(id, self.list.len() - 1);
                self.list.len() - 1
            }
            None => {
                tracing::debug!(session = %id, "too many child sessions; ignoring another");
                return;
            }
        };
        let tracked = &mut self.list[index];
        let child = &mut tracked.child;
        if child.parent_session_id != parent {
            tracing::debug!(session = %child.session_id, "ignoring a subagent_update from another parent");
            return;
        }
        tracked.changed = true;
        if let Some(title) = update.title.value() {
            child.name = Some(title.clone());
        }
        if let Some(task) = update.description.value() {
            child.task = Some(task.clone());
        }
        if let Some(snapshot) = update.state.value()
            && !child.state.is_final()
            && let Some((state, stop_reason)) = ChildState::from_update(snapshot)
        {
            child.state = state;
            child.stop_reason = stop_reason;
            if let Some(failure) = Failure::of(snapshot) {
                child.error = failure.error;
                child.stderr_tail = failure.stderr_tail;
            }
            // The final snapshot's usage is the child's own report of what its turn spent.
            if let StateUpdate::Idle(idle) = snapshot
                && let Some(usage) = &idle.usage
            {
                // What the counts before it were says whether they are an estimate: ACP's
                // `usage` cannot say.
                let (cost, estimated) = child
                    .usage
                    .take()
                    .map_or((None, false), |usage| (usage.cost, usage.estimated));
                child.usage = Some(Usage {
                    cost,
                    estimated,
                    ..Usage::from_acp(usage)
                });
            }
        }
    }

    /// A `usage_update` (or a `session_info_update`) on a child's session: its cumulative counts
    /// (the `acp-host/usage` extension of `meta`) and cost (the update's, else the extension's),
    /// until its final snapshot reports its usage.
    pub(super) fn usage(&mut self, session_id: &str, meta: Option<&Meta>, cost: Option<&AcpCost>) {
        let Some(&index) = self.index.get(session_id) else {
            return;
        };
        let tracked = &mut self.list[index];
        tracked.changed = true;
        let child = &mut tracked.child;
        let cost = cost
            .filter(|cost| cost.amount.is_finite())
            .map(|cost| Cost {
                amount: cost.amount,
                currency: cost.currency.clone(),
            });
        let counts = if child.state.is_final() {
            child.usage.take()
        } else {
            Usage::from_meta(meta).or_else(|| child.usage.take())
        };
        child.usage = match (counts, cost) {
            (Some(counts), cost) => Some(Usage {
                cost: cost.or(counts.cost.clone()),
                ..counts
            }),
            (None, _) => None,
        };
    }

    /// A kept session's turn's list: the children that changed since the last list, as they
    /// are now. Those still running stay tracked; an ended one, listed, is let go, so a session
    /// of many turns holds its live children only, never [`MAX_CHILDREN`] of its past.
    pub(super) fn changed(&mut self) -> Vec<ChildSession> {
        let listed = self
            .list
            .iter_mut()
            .filter_map(|tracked| {
                std::mem::take(&mut tracked.changed).then(|| tracked.child.clone())
            })
            .collect();
        self.list.retain(|tracked| !tracked.child.state.is_final());
        self.index = (self.list.iter().enumerate())
            .map(|(i, tracked)| (tracked.child.session_id.clone(), i))
            .collect();
        listed
    }

    /// The run's final list: the children that changed since the last list, and every one that
    /// never reported its end, now `disconnected`.
    pub(super) fn take(&mut self) -> Vec<ChildSession> {
        self.index.clear();
        std::mem::take(&mut self.list)
            .into_iter()
            .filter_map(|Tracked { mut child, changed }| {
                if !child.state.is_final() {
                    child.state = ChildState::Disconnected;
                    return Some(child);
                }
                changed.then_some(child)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn subagent(value: Value) -> SubagentUpdate {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn children_are_announced_patched_nested_and_settled() {
        let mut children = Children::default();
        children.apply(
            "root",
            "root",
            &subagent(
                json!({"sessionId": "a", "title": "one", "description": "task",
                "state": {"state": "running"}}),
            ),
        );
        // Nested on `a`; an update for `b` from another parent, or one naming ours, is ignored.
        children.apply(
            "a",
            "root",
            &subagent(json!({"sessionId": "b", "title": "two"})),
        );
        children.apply(
            "root",
            "root",
            &subagent(json!({"sessionId": "b", "title": "moved"})),
        );
        children.apply("root", "root", &subagent(json!({"sessionId": "root"})));
        // A final state sticks; a later snapshot does not revive the child.
        children.apply(
            "root",
            "root",
            &subagent(
                json!({"sessionId": "a", "state": {"state": "idle", "stopReason": "cancelled"}}),
            ),
        );
        children.apply(
            "root",
            "root",
            &subagent(json!({"sessionId": "a", "state": {"state": "running"}})),
        );
        let list = children.take();
        let seen: Vec<String> = list
            .iter()
            .map(|c| {
                format!(
                    "{} on {}: {:?} {} {:?}",
                    c.session_id, c.parent_session_id, c.name, c.state, c.stop_reason
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                "a on root: Some(\"one\") cancelled Some(\"cancelled\")",
                // Never ended: disconnected once the run settled.
                "b on a: Some(\"two\") disconnected None",
            ]
        );
        assert_eq!(list[0].task.as_deref(), Some("task"));
    }

    #[test]
    fn a_kept_sessions_turn_lists_what_changed_in_it_and_keeps_tracking_the_rest() {
        let mut children = Children::default();
        let snapshot = |state: &str| json!({"sessionId": "a", "state": {"state": state, "stopReason": "end_turn"}});
        children.apply("root", "root", &subagent(snapshot("running")));
        children.apply(
            "root",
            "root",
            &subagent(
                json!({"sessionId": "c", "state": {"state": "idle", "stopReason": "end_turn"}}),
            ),
        );
        let names = |list: Vec<ChildSession>| -> Vec<String> {
            list.iter()
                .map(|c| format!("{} {}", c.session_id, c.state))
                .collect()
        };
        // The first turn: both, `a` still running.
        assert_eq!(names(children.changed()), ["a running", "c completed"]);
        // The second: `a` is still known, so a child nested on it is routed and listed; `c`,
        // ended and listed, is let go.
        assert!(children.get("c").is_none());
        children.apply("a", "root", &subagent(json!({"sessionId": "d"})));
        assert_eq!(
            children.get("d").map(|d| d.parent_session_id.as_str()),
            Some("a")
        );
        assert_eq!(names(children.changed()), ["d running"]);
        // Nothing changed in the third.
        assert!(children.changed().is_empty());
        // The run's end: those that never ended, disconnected; `c` was listed already.
        assert_eq!(names(children.take()), ["a disconnected", "d disconnected"]);
    }

    #[test]
    fn a_kept_session_of_many_turns_tracks_its_live_children_only() {
        let mut children = Children::default();
        for turn in 0..=MAX_CHILDREN {
            let id = format!("c{turn}");
            children.apply(
                "root",
                "root",
                &subagent(
                    json!({"sessionId": id, "state": {"state": "idle", "stopReason": "end_turn"}}),
                ),
            );
            assert_eq!(children.changed().len(), 1, "turn {turn}");
        }
        assert!(children.take().is_empty());
    }

    #[test]
    fn children_beyond_the_cap_are_not_tracked() {
        let mut children = Children::default();
        for n in 0..=MAX_CHILDREN {
            children.apply(
                "root",
                "root",
                &subagent(json!({"sessionId": format!("c{n}")})),
            );
        }
        assert_eq!(children.take().len(), MAX_CHILDREN);
    }
}
