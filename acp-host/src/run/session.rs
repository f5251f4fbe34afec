//! A kept session ([`run_session`](super::run_session)): the agent and its session stay after the
//! first turn and answer each further prompt with that turn's own result.
//!
//! Invariants:
//! - each further prompt is answered with that turn's own result (its output only), which records
//!   the agent as `alive`; the last one records how it ended;
//! - the caller's dropped sender, its idle timeout, a cancel, the overall timeout of a turn or a
//!   turn that fails end the session, and it ends like any run, with teardown;
//! - the overall timeout counts per turn, never while idle (`busy` tells supervision which);
//! - a prompt sent as the idle time runs out is still answered, and no later one is accepted only
//!   to be dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::env_scrub::Redactor;
use protocol::request::StartRequest;
use protocol::result::{EndedBy, RunResult};

use super::FollowUp;
use super::settle::settle_turn;
use crate::client::{self, DriveEnd, ResultOf, Shared};
use crate::lock;

/// What [`run_session`](super::run_session) hands to the run.
pub(super) struct KeptSession {
    /// The turn waiting for its result.
    pub(super) waiting: Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<RunResult>>>>,
    pub(super) follow_ups: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<FollowUp>>,
    pub(super) idle_timeout: Option<Duration>,
}

/// The drive's side of a kept session: settles each answered turn into its own result.
struct SessionTurns {
    kept: KeptSession,
    run_id: String,
    scrubbed: Vec<String>,
    request: StartRequest,
    redactor: Redactor,
    shared: Arc<Shared>,
    /// True while a turn runs: the overall timeout counts then only.
    busy: tokio::sync::watch::Sender<bool>,
    turn_started: std::sync::Mutex<Instant>,
}

impl client::Turns for SessionTurns {
    fn next(
        &self,
        end: &DriveEnd,
    ) -> std::pin::Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        let mut result = RunResult::unsettled(self.run_id.clone(), self.scrubbed.clone());
        result.agent_exit.ended_by = EndedBy::Alive;
        settle_turn(
            &mut result,
            ResultOf::Turn,
            Some(end.clone()),
            false,
            &self.request,
            &self.shared,
            &self.redactor,
        );
        let started = *lock(&self.turn_started);
        result.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.busy.send_replace(false);
        let reply = lock(&self.kept.waiting).take();
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
        Box::pin(async move {
            let mut follow_ups = self.kept.follow_ups.lock().await;
            let next = match self.kept.idle_timeout {
                Some(idle) => {
                    if let Ok(next) = tokio::time::timeout(idle, follow_ups.recv()).await {
                        next
                    } else {
                        // Closed first, then drained: a prompt sent as the idle time ran out is
                        // still answered, and no later one is accepted only to be dropped.
                        follow_ups.close();
                        follow_ups.try_recv().ok()
                    }
                }
                None => follow_ups.recv().await,
            }?;
            *lock(&self.kept.waiting) = Some(next.reply);
            *lock(&self.turn_started) = Instant::now();
            self.busy.send_replace(true);
            Some(next.prompt)
        })
    }
}

/// The drive's side of a kept session, and whether a turn runs (always, for a plain run).
pub(super) fn session_turns(
    kept: Option<KeptSession>,
    result: &RunResult,
    request: &StartRequest,
    redactor: &Redactor,
    shared: &Arc<Shared>,
) -> (
    Option<Arc<dyn client::Turns>>,
    tokio::sync::watch::Receiver<bool>,
) {
    let (busy, busy_rx) = tokio::sync::watch::channel(true);
    let turns = kept.map(|kept| {
        Arc::new(SessionTurns {
            kept,
            run_id: result.run_id.clone(),
            scrubbed: result.scrubbed_env.clone(),
            request: request.clone(),
            redactor: redactor.clone(),
            shared: Arc::clone(shared),
            busy,
            turn_started: std::sync::Mutex::new(Instant::now()),
        }) as Arc<dyn client::Turns>
    });
    (turns, busy_rx)
}
