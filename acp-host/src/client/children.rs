//! The child sessions the agent announced in this run (ACP subagent sessions), for routing their
//! updates and permission requests and for the result's list.
//!
//! Invariants:
//! - a child is announced by the first `subagent_update` naming its session id, sent on our
//!   session or on a child already announced (nesting); our own id or the sender's is never one;
//! - a child is never re-parented, and one that reached a final state stays there;
//! - at most [`MAX_CHILDREN`] are tracked: later announcements are ignored (and their sessions
//!   are foreign);
//! - the list is taken when a result is settled (the run's, or each kept-session turn's): a child
//!   still running then is `disconnected`.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{StateUpdate, SubagentUpdate, UsageUpdate};
use protocol::child_session::{ChildSession, ChildState, Failure};
use protocol::usage::{Cost, Usage};

/// The most child sessions tracked in one run; later announcements are ignored (and their
/// sessions foreign), so a runaway agent cannot grow the result without bound.
pub(super) const MAX_CHILDREN: usize = 1024;

/// The child sessions announced so far, in order.
#[derive(Debug, Default)]
pub(super) struct Children {
    list: Vec<ChildSession>,
    index: HashMap<String, usize>,
}

impl Children {
    pub(super) fn get(&self, session_id: &str) -> Option<&ChildSession> {
        self.index.get(session_id).map(|&i| &self.list[i])
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
                self.list.push(ChildSession {
                    session_id: id.clone(),
                    parent_session_id: parent.to_owned(),
                    name: None,
                    task: None,
                    state: ChildState::Running,
                    stop_reason: None,
                    error: None,
                    stderr_tail: None,
                    usage: None,
                });
                self.index.insert(id, self.list.len() - 1);
                self.list.len() - 1
            }
            None => {
                tracing::debug!(session = %id, "too many child sessions; ignoring another");
                return;
            }
        };
        let child = &mut self.list[index];
        if child.parent_session_id != parent {
            tracing::debug!(session = %child.session_id, "ignoring a subagent_update from another parent");
            return;
        }
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
                let cost = child.usage.take().and_then(|usage| usage.cost);
                child.usage = Some(Usage {
                    cost,
                    ..Usage::from_acp(usage)
                });
            }
        }
    }

    /// A `usage_update` on a child's session: its cumulative counts (the `acp-host/usage`
    /// extension) and cost, until its final snapshot reports its usage.
    pub(super) fn usage(&mut self, session_id: &str, update: &UsageUpdate) {
        let Some(&index) = self.index.get(session_id) else {
            return;
        };
        let child = &mut self.list[index];
        let cost = update
            .cost
            .as_ref()
            .filter(|cost| cost.amount.is_finite())
            .map(|cost| Cost {
                amount: cost.amount,
                currency: cost.currency.clone(),
            });
        let counts = if child.state.is_final() {
            child.usage.take()
        } else {
            Usage::from_meta(update.meta.as_ref()).or_else(|| child.usage.take())
        };
        child.usage = match (counts, cost) {
            (Some(counts), cost) => Some(Usage {
                cost: cost.or(counts.cost.clone()),
                ..counts
            }),
            (None, _) => None,
        };
    }

    /// The list, a child that never reported its end being `disconnected`.
    pub(super) fn take(&mut self) -> Vec<ChildSession> {
        let mut list = std::mem::take(&mut self.list);
        self.index.clear();
        for child in &mut list {
            if !child.state.is_final() {
                child.state = ChildState::Disconnected;
            }
        }
        list
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
