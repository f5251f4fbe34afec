//! Permission decisions: the [`PermissionHandler`] a run asks for each `session/request_permission`.
//!
//! A handler returns a future, so a decision may take as long as it needs (a person at a terminal,
//! a parent agent relaying the request to its own editor) without holding up the run: the drive
//! awaits it off the protocol's dispatch loop. The policies `reject` and `allow` are handlers that
//! answer at once ([`PermissionPolicy`] implements the trait).
//!
//! Invariants: a handler is never asked once the host is cancelling the turn, and a pending
//! question is abandoned (answered `cancelled`) when cancellation begins; the option is chosen by
//! kind from the handler's [`Answer`] (`protocol::permission::choose_answer`), never by position.

use std::future::Future;
use std::pin::Pin;

use protocol::permission::{self, Answer, DecidedBy, PermissionPolicy, PermissionRequest};

/// A handler's decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub answer: Answer,
    /// Recorded in the run's permission decisions.
    pub decided_by: DecidedBy,
}

/// The future a handler returns; `'static` so the run can await it on its own task.
pub type DecisionFuture = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

/// Decides permission requests for a run.
pub trait PermissionHandler: Send + Sync {
    /// Decides one request. Dropped unfinished when the run cancels the turn meanwhile.
    fn decide(&self, request: PermissionRequest) -> DecisionFuture;
}

/// A fixed policy: `allow` allows, `reject` rejects, `ask` (with no handler that can ask) rejects.
impl PermissionHandler for PermissionPolicy {
    fn decide(&self, _request: PermissionRequest) -> DecisionFuture {
        let decision = Decision {
            answer: permission::policy_verdict(*self).into(),
            decided_by: DecidedBy::Policy,
        };
        Box::pin(std::future::ready(decision))
    }
}
