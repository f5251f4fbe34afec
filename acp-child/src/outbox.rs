//! How far behind the client is: the `session/update` notifications handed to the SDK for it
//! against those written to stdout ([`Backlog`]), so what a child sends reaches the client no
//! faster than the client reads.
//!
//! The SDK queues outgoing messages without bound, so a stalled client (an editor busy
//! rendering, a script that stopped reading) would let a fast child fill this agent's memory.
//! Counting both ends closes the loop: every update this agent sends goes through [`send`]
//! (counted queued), and stdout is wrapped in [`Metered`], which counts the `session/update` lines
//! that actually left. A child's relay waits ([`Backlog::room`]) while more than [`MAX_QUEUED`]
//! are on their way; its text on a tool card is coalesced meanwhile, and its other updates wait
//! in a bounded channel, which stops the child's run library from reading the child's stdout, so
//! the child itself blocks on a full pipe.
//!
//! Invariants:
//! - an update is counted queued only once the SDK took it, and written once its line's last
//!   byte was written; `queued - written` is then what is in memory on its way to the client;
//! - a line counts as an update when its first [`HEAD_BYTES`] hold `"method":"session/update"`:
//!   inside a JSON string every `"` is escaped, so that text appears unescaped only as the
//!   envelope's own key and value;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::SessionNotification;
use agent_client_protocol::{Client, Error as AcpError};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

/// The most updates on their way to the client before a child's relay waits. Each is at most one
/// frame of the child's (bounded by the run library's frame cap) or one tool-card tail.
pub(crate) const MAX_QUEUED: u64 = 32;

/// How much of a line's start is looked at for the method.
const HEAD_BYTES: usize = 64;
/// What marks a line as an update.
const UPDATE_METHOD: &[u8] = br#""method":"session/update""#;

/// The client's backlog of updates (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    queued: AtomicU64,
    written: AtomicU64,
    /// Woken whenever updates were written.
    drained: Notify,
}

impl Backlog {
    /// Updates handed to the SDK and not yet written.
    pub(crate) fn pending(&self) -> u64 {
        let written = self.written.load(Ordering::Acquire);
        self.queued.load(Ordering::Acquire).saturating_sub(written)
    }

    /// Whether one more update may be queued without waiting.
    pub(crate) fn has_room(&self) -> bool {
        self.pending() < MAX_QUEUED
    }

    /// Completes once [`Backlog::has_room`] (at once when it has).
    pub(crate) async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            // Registered before the check: a write between the check and the wait still wakes.
            drained.as_mut().enable();
            if self.has_room() {
                return;
            }
            drained.await;
        }
    }

    fn written(&self, lines: u64) {
        self.written.fetch_add(lines, Ordering::AcqRel);
        self.drained.notify_waiters();
    }
}

/// Sends `notification` to the client, counted in `backlog`: the one way this agent sends a
/// `session/update`.
pub(crate) fn send(
    client: &ConnectionTo<Client>,
    backlog: &Backlog,
    notification: SessionNotification,
) -> Result<(), AcpError> {
    client.send_notification(notification)?;
    backlog.queued.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// A writer that counts the `session/update` lines written through it into a [`Backlog`].
pub(crate) struct Metered<W> {
    inner: W,
    backlog: Arc<Backlog>,
    /// The start of the line being written, up to [`HEAD_BYTES`].
    head: Vec<u8>,
    /// The line being written was already classified (its head is full).
    classified: bool,
    /// ... and is an update.
    update: bool,
}

impl<W> Metered<W> {
    pub(crate) fn new(inner: W, backlog: Arc<Backlog>) -> Self {
        Self {
            inner,
            backlog,
            head: Vec::with_capacity(HEAD_BYTES),
            classified: false,
            update: false,
        }
    }

    /// Counts the updates whose lines end in `written` (bytes that left).
    fn observe(&mut self, mut written: &[u8]) {
        let mut ended = 0;
        loop {
            let newline = memchr::memchr(b'\n', written);
            let part = newline.map_or(written, |at| &written[..at]);
            if !self.classified {
                let take = part.len().min(HEAD_BYTES - self.head.len());
                self.head.extend_from_slice(&part[..take]);
                if self.head.len() == HEAD_BYTES || newline.is_some() {
                    self.update = memchr::memmem::find(&self.head, UPDATE_METHOD).is_some();
                    self.classified = true;
                }
            }
            let Some(at) = newline else { break };
            ended += u64::from(self.update);
            self.head.clear();
            self.classified = false;
            self.update = false;
            written = &written[at + 1..];
        }
        if ended > 0 {
            self.backlog.written(ended);
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Metered<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.observe(&buf[..n]);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metered() -> Metered<Vec<u8>> {
        Metered::new(Vec::new(), Arc::default())
    }

    #[test]
    fn updates_are_counted_when_their_line_ends_whatever_the_writes() {
        let update = br#"{"jsonrpc":"2.0","method":"session/update","params":{"x":1}}"#;
        let response =
            br#"{"jsonrpc":"2.0","id":1,"result":{"text":"\"method\":\"session/update\""}}"#;
        let mut all = Vec::new();
        for line in [&update[..], &response[..], &update[..]] {
            all.extend_from_slice(line);
            all.push(b'\n');
        }
        for split in [1, 7, 43, 64, 200] {
            let mut writer = metered();
            for piece in all.chunks(split) {
                writer.observe(piece);
            }
            assert_eq!(
                writer.backlog.written.load(Ordering::Acquire),
                2,
                "split {split}"
            );
        }
    }

    #[test]
    fn an_unfinished_line_is_not_written_yet() {
        let mut writer = metered();
        writer.observe(br#"{"jsonrpc":"2.0","method":"session/update","params":{"#);
        assert_eq!(writer.backlog.written.load(Ordering::Acquire), 0);
        writer.observe(b"}}\n");
        assert_eq!(writer.backlog.written.load(Ordering::Acquire), 1);
    }

    #[test]
    fn room_is_what_was_queued_and_not_written() {
        let backlog = Backlog::default();
        backlog.queued.store(MAX_QUEUED, Ordering::Release);
        assert!(!backlog.has_room());
        backlog.written(1);
        assert!(backlog.has_room());
    }
}
