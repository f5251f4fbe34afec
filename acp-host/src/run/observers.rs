//! Delivery of a run's events to its observers ([`Notifier`]): on a thread of their own, behind a
//! bounded queue, in batches of updates; or, for a caller that reads them on its own runtime (an
//! agent relaying its child's updates), through the same queue into an [`EventStream`], with no
//! thread at all.
//!
//! Invariants:
//! - observers are called in isolation, in order: one that fails or panics is logged and the
//!   others still see every event;
//! - one that is slow (a stalled stdout) slows the agent down through a queue of at most
//!   [`OBSERVER_BUDGET_BYTES`], and never delays cancellation, the timeout or teardown: once the
//!   run is cancelled, timed out or killed, events that do not fit are dropped for observers (the
//!   result still has them) and counted;
//! - the observers' thread starts once the first request is on its way to the agent, so its
//!   creation overlaps the agent's start-up; without observers, or with an [`EventStream`],
//!   there is none;
//! - an [`EventStream`] is held to the same budget: an event's share is released once the
//!   caller asked for the next one, so a caller that stops reading slows the agent down;
//! - an update is freed on the thread that made it, not on the observers' thread (one allocator
//!   arena per producer: docs/benchmarks.md).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agent_client_protocol::v1::schema::SessionUpdate;
use protocol::events::{Event, StartEvent};
use protocol::permission::PermissionDecision;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Cancel, OBSERVER_BUDGET_BYTES, Observer};
use crate::client::{self, DriveEvents};
use crate::lock;

/// The least an event weighs against [`OBSERVER_BUDGET_BYTES`]: its fixed overhead, at least
/// what a queued [`Delivery`] holds inline (a typed update is held in place, not behind a box), so
/// the budget bounds the queue's real memory.
const EVENT_MIN_BYTES: usize = {
    let inline = size_of::<Delivery>();
    if inline > 256 { inline } else { 256 }
};
/// After a cancel, a timeout or a kill, how long observers get to catch up before the run returns
/// anyway.
const LATE_FLUSH: Duration = Duration::from_millis(100);

/// One event on its way to the observers' thread, holding its share of the budget.
#[expect(
    clippy::large_enum_variant,
    reason = "an event is nearly every delivery: boxing it would cost each update an allocation"
)]
enum Delivery {
    Event(Event, Option<OwnedSemaphorePermit>),
    /// Updates decoded from one read of the agent's stdout, sent together: one wake-up of the
    /// observers' thread per read, not per update.
    Batch(Vec<Delivery>),
    /// Answered once everything queued before it was delivered.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The most updates held back for one batch.
const BATCH_MAX: usize = 64;

/// Delivers on the observers' thread. Delivered updates go to `spent`, to be freed by the thread
/// that made them (see [`Notifier::queue`]); their share of the budget is released at once. Other
/// events are few and are dropped here: the end event shares the run's output, which the run
/// takes back as soon as the observers are done with it.
fn deliver_on_thread(
    observers: &[Arc<dyn Observer>],
    delivery: Delivery,
    run_id: &str,
    spent: &mut Vec<Event>,
) {
    match delivery {
        Delivery::Event(event, permit) => {
            notify(observers, &event, run_id);
            drop(permit);
            if matches!(event, Event::Update { .. }) {
                spent.push(event);
            }
        }
        Delivery::Batch(all) => {
            for delivery in all {
                deliver_on_thread(observers, delivery, run_id, spent);
            }
        }
        Delivery::Flush(done) => {
            flush_all(observers, run_id);
            let _ = done.send(());
        }
    }
}

fn flush_all(observers: &[Arc<dyn Observer>], run_id: &str) {
    for observer in observers {
        if std::panic::catch_unwind(AssertUnwindSafe(|| observer.flush())).is_err() {
            tracing::warn!(run_id, "observer panicked");
        }
    }
}

/// The observers' thread's queue, and the way back for what it delivered.
///
/// The updates that thread delivered come back (one vector per wake-up) and are freed where they
/// were made, in [`Notifier::send_pending`]: freed on the observers' thread, each of a streamed
/// update's allocations went back to the allocator arena the producing thread was allocating
/// from, and glibc's lock on that arena was half of a streaming run's futex calls
/// (docs/benchmarks.md). What waits on the way back is bounded like the queue: the producer frees
/// it before it sends each batch.
struct Queue {
    tx: Tx,
    /// In a mutex only to be shared: the producer is the one reader. `None` for a stream, whose
    /// reader frees what it took.
    spent: Option<std::sync::Mutex<std::sync::mpsc::Receiver<Vec<Event>>>>,
}

/// Where the queue leads.
enum Tx {
    /// The observers' thread.
    Thread(std::sync::mpsc::Sender<Delivery>),
    /// The caller's [`EventStream`].
    Stream(tokio::sync::mpsc::UnboundedSender<Delivery>),
}

impl Queue {
    /// Whether the observers' thread (or the caller's stream) is still there to take it.
    fn send(&self, delivery: Delivery) -> bool {
        match &self.tx {
            Tx::Thread(tx) => tx.send(delivery).is_ok(),
            Tx::Stream(tx) => tx.send(delivery).is_ok(),
        }
    }

    /// Frees the updates the observers are done with, on the calling (producing) thread.
    fn free_spent(&self) {
        if let Some(spent) = &self.spent {
            lock(spent).try_iter().for_each(drop);
        }
    }
}

/// Where a run sends its events instead of calling observers on a thread of their own: the
/// sending half of [`event_stream`], given to the run in `RunOptions::events`.
#[derive(Clone, Debug)]
pub struct EventSink(tokio::sync::mpsc::UnboundedSender<Delivery>);

/// A run's events in order, for a caller that reads them on its own runtime: an agent that
/// relays its child's updates (and may wait for its own client while it does) needs no thread
/// for that. The run waits, as it waits for a slow observer, while the events it sent and the
/// caller has not asked past yet weigh [`super::OBSERVER_BUDGET_BYTES`]: reading slowly slows the
/// agent down. Dropping the stream drops the events still to come.
#[derive(Debug)]
pub struct EventStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<Delivery>,
    /// The rest of a batch being handed out.
    batch: std::vec::IntoIter<Delivery>,
    /// The share of the budget of the event handed out last, released at the next call.
    held: Option<OwnedSemaphorePermit>,
}

/// A sink for `RunOptions::events` and the stream its events come out of.
#[must_use]
pub fn event_stream() -> (EventSink, EventStream) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (
        EventSink(tx),
        EventStream {
            rx,
            batch: Vec::new().into_iter(),
            held: None,
        },
    )
}

impl EventStream {
    /// The next event; `None` once every run given the sink has ended and its events were read.
    pub async fn recv(&mut self) -> Option<Event> {
        // The caller is done with the event handed out last.
        self.held = None;
        loop {
            let delivery = match self.batch.next() {
                Some(delivery) => delivery,
                None => self.rx.recv().await?,
            };
            match delivery {
                Delivery::Event(event, permit) => {
                    self.held = permit;
                    return Some(event);
                }
                Delivery::Batch(all) => self.batch = all.into_iter(),
                // Everything queued before it was handed out, and the caller asked past it.
                Delivery::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::Event(event, _) => f.debug_tuple("Event").field(event).finish(),
            Delivery::Batch(all) => f.debug_tuple("Batch").field(&all.len()).finish(),
            Delivery::Flush(_) => f.write_str("Flush"),
        }
    }
}

/// Fans events out to observers, each in isolation, on a thread of their own behind a queue of
/// at most [`OBSERVER_BUDGET_BYTES`]; or hands them, behind the same queue, to the caller's
/// [`EventStream`].
pub(super) struct Notifier {
    run_id: String,
    agent: String,
    cwd: String,
    scrubbed: Vec<String>,
    pid: std::sync::atomic::AtomicU32,
    /// Handed to the observers' thread when it starts.
    observers: std::sync::Mutex<Vec<Arc<dyn Observer>>>,
    /// The caller's stream, which takes the events instead of the observers' thread.
    sink: Option<EventSink>,
    /// Started on first use, which for a run is once its first request was written to the
    /// agent: the thread's creation then overlaps the agent's own start-up instead of delaying
    /// the spawn or that request. `None` when there are no observers.
    queue: std::sync::OnceLock<Option<Queue>>,
    budget: Arc<Semaphore>,
    /// Updates waiting for the end of the current read of the agent's stdout ([`Notifier::flush`]).
    pending: std::sync::Mutex<Vec<Delivery>>,
    /// Fired at a cancel, timeout or kill: from then on events that do not fit are dropped, not
    /// waited for.
    shed: CancellationToken,
    dropped: std::sync::atomic::AtomicU64,
    /// The run's exported spans (off unless export is on).
    trace: crate::telemetry::RunTrace,
}

impl Notifier {
    pub(super) fn new(
        run_id: String,
        destination: (Vec<Arc<dyn Observer>>, Option<EventSink>),
        agent: String,
        cwd: String,
        scrubbed: Vec<String>,
    ) -> Self {
        let (observers, sink) = destination;
        Notifier {
            run_id,
            agent,
            cwd,
            scrubbed,
            pid: std::sync::atomic::AtomicU32::new(0),
            observers: std::sync::Mutex::new(observers),
            sink,
            queue: std::sync::OnceLock::new(),
            budget: Arc::new(Semaphore::new(OBSERVER_BUDGET_BYTES)),
            pending: std::sync::Mutex::default(),
            shed: CancellationToken::new(),
            dropped: std::sync::atomic::AtomicU64::new(0),
            trace: crate::telemetry::RunTrace::default(),
        }
    }

    /// The run's exported spans.
    pub(super) fn traced(mut self, trace: crate::telemetry::RunTrace) -> Self {
        self.trace = trace;
        self
    }

    /// The run's exported spans.
    pub(super) fn trace(&self) -> &crate::telemetry::RunTrace {
        &self.trace
    }

    /// Starts the observers' thread once `token` fires (the first request is on its way to the
    /// agent): its creation then overlaps the agent's start-up instead of delaying the request.
    pub(super) fn start_after(self: &Arc<Self>, token: CancellationToken) {
        let notifier = Arc::clone(self);
        tokio::spawn(async move {
            token.cancelled().await;
            notifier.queue();
        });
    }

    /// The observers' queue, their thread started on first use (`None` without observers).
    fn queue(&self) -> Option<&Queue> {
        self.queue
            .get_or_init(|| {
                if let Some(EventSink(tx)) = &self.sink {
                    return Some(Queue {
                        tx: Tx::Stream(tx.clone()),
                        spent: None,
                    });
                }
                let observers = std::mem::take(&mut *lock(&self.observers));
                if observers.is_empty() {
                    return None;
                }
                let (tx, rx) = std::sync::mpsc::channel::<Delivery>();
                let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<Event>>();
                let run_id = self.run_id.clone();
                std::thread::Builder::new()
                    .name("acp-host-observers".into())
                    .spawn(move || {
                        let mut spent = Vec::new();
                        while let Ok(delivery) = rx.recv() {
                            deliver_on_thread(&observers, delivery, &run_id, &mut spent);
                            // Everything already queued first; flush before waiting for more.
                            while let Ok(delivery) = rx.try_recv() {
                                deliver_on_thread(&observers, delivery, &run_id, &mut spent);
                                // A queue that never empties (an observer that keeps pace with
                                // the agent, as a slow reader makes it) must not hold every
                                // update delivered: they go back in bounded batches.
                                if spent.len() >= BATCH_MAX {
                                    let _ = spent_tx.send(std::mem::take(&mut spent));
                                }
                            }
                            flush_all(&observers, &run_id);
                            if !spent.is_empty() {
                                let _ = spent_tx.send(std::mem::take(&mut spent));
                            }
                        }
                    })
                    .inspect_err(|err| tracing::warn!(%err, "cannot start the observers' thread"))
                    .ok()
                    .map(|_| Queue {
                        tx: Tx::Thread(tx),
                        spent: Some(std::sync::Mutex::new(spent_rx)),
                    })
            })
            .as_ref()
    }

    fn weight(size: usize) -> u32 {
        u32::try_from(size.clamp(EVENT_MIN_BYTES, OBSERVER_BUDGET_BYTES)).unwrap_or(u32::MAX)
    }

    /// Sends the batch of updates held so far (and frees the events the observers are done with).
    fn send_pending(&self) {
        let Some(queue) = self.queue() else {
            return;
        };
        queue.free_spent();
        let batch = std::mem::take(&mut *lock(&self.pending));
        if !batch.is_empty() {
            let _ = queue.send(Delivery::Batch(batch));
        }
    }

    /// Queues `event`, waiting while the queue is full (unless shedding, then it is dropped). With
    /// `batch`, the event waits for [`DriveEvents::flush`] (or a full batch).
    async fn deliver(&self, event: Event, size: usize, batch: bool) {
        let Some(queue) = self.queue() else {
            return;
        };
        let weight = Self::weight(size);
        let permit = tokio::select! {
            biased;
            permit = Arc::clone(&self.budget).acquire_many_owned(weight) => permit.ok(),
            () = self.shed.cancelled() => {
                if let Ok(permit) = Arc::clone(&self.budget).try_acquire_many_owned(weight) {
                    Some(permit)
                } else {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        };
        if batch {
            let full = {
                let mut pending = lock(&self.pending);
                pending.push(Delivery::Event(event, permit));
                pending.len() >= BATCH_MAX
            };
            if full {
                self.send_pending();
            }
        } else {
            self.send_pending();
            let _ = queue.send(Delivery::Event(event, permit));
        }
    }

    /// Queues `event` without waiting, for events bounded in number (start, end, held updates).
    pub(super) fn deliver_now(&self, event: Event) {
        self.send_pending();
        if let Some(queue) = self.queue() {
            let _ = queue.send(Delivery::Event(event, None));
        }
    }

    /// Queues `event` if it fits now; otherwise it is dropped (and counted). For callers that
    /// cannot wait (the stderr reader's callback).
    fn try_deliver(&self, event: Event, size: usize) {
        let Some(queue) = self.queue() else {
            return;
        };
        match Arc::clone(&self.budget).try_acquire_many_owned(Self::weight(size)) {
            Ok(permit) => {
                let _ = queue.send(Delivery::Event(event, Some(permit)));
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until the observers have seen every queued event; not after a kill, and only briefly
    /// after a cancel or a timeout.
    pub(super) async fn caught_up(&self, cancel: &Cancel) {
        self.send_pending();
        if let Some(queue) = self.queue() {
            let (done, flushed) = tokio::sync::oneshot::channel();
            if queue.send(Delivery::Flush(done)) {
                let flushed = async {
                    let _ = flushed.await;
                };
                if self.shed.is_cancelled() {
                    let _ = tokio::time::timeout(LATE_FLUSH, flushed).await;
                } else {
                    tokio::select! {
                        biased;
                        () = cancel.immediate.cancelled() => {}
                        () = flushed => {}
                    }
                }
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                events = dropped,
                run_id = %self.run_id,
                "events were not shown: the reader of the output was too slow"
            );
        }
    }

    /// The agent as the user named it.
    pub(super) fn agent(&self) -> &str {
        &self.agent
    }

    /// The agent's pid, for the start event, once its start is confirmed.
    pub(super) fn set_pid(&self, pid: u32) {
        self.pid.store(pid, Ordering::Relaxed);
    }

    /// From now on (a cancel, a timeout, a kill) events that do not fit are dropped, not waited
    /// for.
    pub(super) fn shed(&self) {
        self.shed.cancel();
    }

    pub(super) fn is_shedding(&self) -> bool {
        self.shed.is_cancelled()
    }

    pub(super) fn stderr(&self, line: &str) {
        self.try_deliver(
            Event::Stderr {
                run_id: self.run_id.clone(),
                line: line.to_owned(),
            },
            line.len(),
        );
    }
}

/// Calls every observer with `event`, each in isolation.
fn notify(observers: &[Arc<dyn Observer>], event: &Event, run_id: &str) {
    for observer in observers {
        match std::panic::catch_unwind(AssertUnwindSafe(|| observer.on_event(event))) {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, run_id, "observer failed"),
            Err(_) => tracing::warn!(run_id, "observer panicked"),
        }
    }
}

impl DriveEvents for Notifier {
    fn ready(&self, session_id: &str) {
        self.trace.ready(session_id);
        let pid = self.pid.load(Ordering::Relaxed);
        self.deliver_now(Event::Start(StartEvent {
            run_id: self.run_id.clone(),
            agent: self.agent.clone(),
            provider: self.agent.clone(),
            cwd: self.cwd.clone(),
            pid: (pid != 0).then_some(pid),
            session_id: session_id.to_owned(),
            scrubbed_env: self.scrubbed.clone(),
        }));
    }

    fn update(
        &self,
        update: SessionUpdate,
        size: usize,
        child: Option<client::ChildRef>,
    ) -> client::Queued<'_> {
        self.trace
            .update(&update, child.as_ref().map(|c| c.session_id.as_str()));
        let (session_id, subagent) = child.map(|c| (c.session_id, c.name)).unzip();
        let event = Event::Update {
            run_id: self.run_id.clone(),
            session_id,
            subagent: subagent.flatten(),
            update,
        };
        Box::pin(self.deliver(event, size, true))
    }

    fn flush(&self) {
        self.send_pending();
    }

    fn update_now(&self, update: SessionUpdate, child: Option<client::ChildRef>) {
        self.trace
            .update(&update, child.as_ref().map(|c| c.session_id.as_str()));
        let (session_id, subagent) = child.map(|c| (c.session_id, c.name)).unzip();
        self.deliver_now(Event::Update {
            run_id: self.run_id.clone(),
            session_id,
            subagent: subagent.flatten(),
            update,
        });
    }

    fn delivered(&self) -> client::Queued<'_> {
        self.send_pending();
        let flushed = self.queue().and_then(|queue| {
            let (done, flushed) = tokio::sync::oneshot::channel();
            queue.send(Delivery::Flush(done)).then_some(flushed)
        });
        Box::pin(async move {
            if let Some(flushed) = flushed {
                let _ = flushed.await;
            }
        })
    }

    fn permission(&self, decision: &PermissionDecision, waited: Duration) -> client::Queued<'_> {
        self.trace.permission(decision, waited);
        let event = Event::Permission {
            run_id: self.run_id.clone(),
            decision: decision.clone(),
        };
        Box::pin(self.deliver(event, 0, false))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, TextContent};

    use super::*;
    use crate::run::OBSERVER_BUDGET_BYTES;

    fn streamed() -> (Arc<Notifier>, EventStream) {
        let (sink, stream) = event_stream();
        let notifier = Notifier::new(
            "run-1".to_owned(),
            (Vec::new(), Some(sink)),
            "agent".to_owned(),
            "/".to_owned(),
            Vec::new(),
        );
        (Arc::new(notifier), stream)
    }

    fn chunk(text: &str) -> SessionUpdate {
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
            text,
        ))))
    }

    fn text_of(event: Option<Event>) -> String {
        match event {
            Some(Event::Update {
                update: SessionUpdate::AgentMessageChunk(chunk),
                ..
            }) => match chunk.content {
                ContentBlock::Text(text) => text.text,
                other => panic!("not text: {other:?}"),
            },
            other => panic!("not a chunk: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stream_gets_every_event_in_order_and_a_flush_waits_until_it_read_past_them() {
        let (notifier, mut stream) = streamed();
        // Held for the end of a read, then sent as one batch.
        notifier.update(chunk("one"), 3, None).await;
        notifier.update(chunk("two"), 3, None).await;
        DriveEvents::flush(&*notifier);
        notifier.update_now(chunk("three"), None);
        let mut delivered = notifier.delivered();
        assert_eq!(text_of(stream.recv().await), "one");
        assert_eq!(text_of(stream.recv().await), "two");
        assert_eq!(text_of(stream.recv().await), "three");
        // "three" is handed out, not yet read past.
        assert!(futures::poll!(&mut delivered).is_pending());
        let end = tokio::spawn(async move { stream.recv().await.is_none() });
        tokio::time::timeout(Duration::from_secs(10), delivered)
            .await
            .unwrap();
        drop(notifier);
        assert!(end.await.unwrap(), "the stream ends with the run's sink");
    }

    #[tokio::test]
    async fn a_run_waits_while_what_its_stream_has_not_read_fills_the_budget() {
        let (notifier, mut stream) = streamed();
        notifier
            .update(chunk("big"), OBSERVER_BUDGET_BYTES, None)
            .await;
        DriveEvents::flush(&*notifier);
        let mut next = notifier.update(chunk("next"), 3, None);
        assert!(
            futures::poll!(&mut next).is_pending(),
            "the budget is spent"
        );
        assert_eq!(text_of(stream.recv().await), "big");
        // Handed out, but the reader has not asked past it: still its share.
        assert!(futures::poll!(&mut next).is_pending());
        let read = tokio::spawn(async move {
            let event = stream.recv().await;
            (text_of(event), stream)
        });
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .unwrap();
        DriveEvents::flush(&*notifier);
        assert_eq!(read.await.unwrap().0, "next");
    }
}
