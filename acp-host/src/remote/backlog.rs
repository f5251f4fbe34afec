//! The output of a served agent that waits for its client over `http://`: the transport's queues
//! (`agent-client-protocol-http`'s mailboxes) are unbounded, so `acp-host serve` counts what it
//! handed them and what left on an event stream, and stops reading the agent's stdout while too
//! much waits. The agent then blocks on its own full pipe: a slow client slows it down. The same
//! count bounds the other way: a client's POSTs the transport holds for its agent's stdin (a POST
//! waits for room before the transport takes it).
//!
//! Invariants: at most [`MAX_QUEUED_FRAMES`] frames and [`MAX_QUEUED_BYTES`] bytes (or one frame,
//! however large, when it alone is over) wait at once; a frame is counted delivered when the
//! server's HTTP stack takes its event from the stream (what hyper and the kernel buffer beyond is
//! bounded by them); a client that takes nothing for the stall timeout while the backlog is full
//! is taken for dead ([`Stalled`]), so it cannot hold its agent and slot for ever.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// Frames waiting for an `http://` client, at most.
pub const MAX_QUEUED_FRAMES: usize = 256;

/// Bytes of frames waiting for an `http://` client, at most (one larger frame may wait alone).
pub const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;

/// A connection's frames given to the transport and not yet taken by its client.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// The sizes of the waiting frames, oldest first.
    queued: Mutex<Queued>,
    /// Signalled whenever a frame was delivered.
    room: Notify,
}

#[derive(Debug, Default)]
struct Queued {
    sizes: VecDeque<usize>,
    bytes: usize,
}

impl Queued {
    fn has_room_for(&self, bytes: usize) -> bool {
        self.sizes.is_empty()
            || (self.sizes.len() < MAX_QUEUED_FRAMES
                && self.bytes.saturating_add(bytes) <= MAX_QUEUED_BYTES)
    }
}

/// The client took nothing for the stall timeout while its backlog was full.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "the client took none of its agent's output for {}s (acp-host serve --stall-timeout)",
    stall.as_secs_f64()
)]
pub struct Stalled {
    pub stall: Duration,
}

impl Backlog {
    /// Waits until a frame of `bytes` fits, then counts it as waiting.
    pub(super) async fn admit(&self, bytes: usize, stall: Duration) -> Result<(), Stalled> {
        loop {
            {
                let mut queued = crate::lock(&self.queued);
                if queued.has_room_for(bytes) {
                    queued.sizes.push_back(bytes);
                    queued.bytes += bytes;
                    return Ok(());
                }
            }
            // A delivery between the check and here left a permit: `notified` returns at once.
            if tokio::time::timeout(stall, self.room.notified())
                .await
                .is_err()
            {
                return Err(Stalled { stall });
            }
        }
    }

    /// The client took one frame.
    pub(super) fn delivered(&self) {
        let mut queued = crate::lock(&self.queued);
        if let Some(bytes) = queued.sizes.pop_front() {
            queued.bytes -= bytes;
        }
        drop(queued);
        self.room.notify_one();
    }

    /// Frames waiting now.
    #[cfg(test)]
    fn frames(&self) -> usize {
        crate::lock(&self.queued).sizes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_mins(1);

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn frames_wait_for_room_and_a_delivery_makes_it() {
        runtime().block_on(async {
            let backlog = Backlog::default();
            for _ in 0..MAX_QUEUED_FRAMES {
                backlog.admit(10, LONG).await.unwrap();
            }
            assert_eq!(backlog.frames(), MAX_QUEUED_FRAMES);
            let admit = backlog.admit(10, LONG);
            futures::pin_mut!(admit);
            assert!(
                futures::poll!(&mut admit).is_pending(),
                "the backlog is full"
            );
            backlog.delivered();
            admit.await.unwrap();
            assert_eq!(backlog.frames(), MAX_QUEUED_FRAMES);
        });
    }

    #[test]
    fn bytes_are_bounded_but_one_large_frame_always_fits() {
        runtime().block_on(async {
            let backlog = Backlog::default();
            backlog.admit(MAX_QUEUED_BYTES * 3, LONG).await.unwrap();
            let admit = backlog.admit(1, LONG);
            futures::pin_mut!(admit);
            assert!(futures::poll!(&mut admit).is_pending());
            backlog.delivered();
            admit.await.unwrap();
            backlog.admit(MAX_QUEUED_BYTES - 1, LONG).await.unwrap();
            let admit = backlog.admit(1, LONG);
            futures::pin_mut!(admit);
            assert!(futures::poll!(&mut admit).is_pending(), "4 MiB + 1 byte");
        });
    }

    #[test]
    fn a_client_that_takes_nothing_is_stalled() {
        runtime().block_on(async {
            let backlog = Backlog::default();
            backlog.admit(MAX_QUEUED_BYTES, LONG).await.unwrap();
            let stall = Duration::from_millis(20);
            assert_eq!(backlog.admit(1, stall).await, Err(Stalled { stall }));
            assert_eq!(
                Stalled { stall: Duration::from_mins(2) }.to_string(),
                "the client took none of its agent's output for 120s (acp-host serve --stall-timeout)"
            );
        });
    }
}
