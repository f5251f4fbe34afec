//! A structured answer's check, off the async runtime: extraction and the schema's own checks are
//! CPU work on untrusted input (megabytes of an agent's text), so they run on tokio's blocking
//! pool, raced against the run's cancellation.
//!
//! Invariants: no runtime thread ever runs [`OutputSchema::check_answer`]; a cancel or the run's
//! deadline ends the wait at once (the check, linear and bounded by the run's `--max-output`,
//! finishes on its own thread and is dropped); a check that panicked is a violation, never a
//! lost run.

use std::sync::Arc;

use protocol::structured::{Answer, Checked, OutputSchema, StructuredVia, Violation};
use tokio_util::sync::CancellationToken;

/// The check was abandoned: the run was cancelled (or its deadline passed) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Abandoned;

/// Checks `answer` against `schema` on the blocking pool; `Err` when `cancel` came first.
pub(crate) async fn check(
    schema: &Arc<OutputSchema>,
    answer: Answer,
    expected: StructuredVia,
    cancel: &CancellationToken,
) -> Result<Checked, Abandoned> {
    let schema = Arc::clone(schema);
    let task = tokio::task::spawn_blocking(move || schema.check_answer(&answer, expected));
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(Abandoned),
        joined = task => Ok(joined.unwrap_or_else(|err| Checked {
            via: expected,
            value: Err(vec![Violation {
                path: String::new(),
                message: format!("the answer could not be checked: {err}"),
            }]),
        })),
    }
}
