//! The SDK's id generator, told the ids `protocol::trace` minted: a span is started inside
//! [`with_ids`], which puts its ids in a thread-local slot the generator reads, so the SDK's span
//! carries exactly the ids sent in `_meta`. Outside `with_ids` (never, in this crate) it falls
//! back to random ids.
//!
//! Invariant: the slot is filled and emptied around one synchronous `build_with_context` on the
//! same thread, so no other span can take its ids.

use std::cell::Cell;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

thread_local! {
    static NEXT: Cell<Option<protocol::trace::SpanContext>> = const { Cell::new(None) };
}

/// Runs `start` with `ids` as the next span's trace and span id.
pub(super) fn with_ids<T>(ids: &protocol::trace::SpanContext, start: impl FnOnce() -> T) -> T {
    NEXT.with(|next| next.set(Some(*ids)));
    let started = start();
    NEXT.with(|next| next.set(None));
    started
}

/// Reads the slot [`with_ids`] fills.
#[derive(Debug)]
pub(super) struct Given;

impl IdGenerator for Given {
    fn new_trace_id(&self) -> TraceId {
        NEXT.with(Cell::get).map_or_else(
            || RandomIdGenerator::default().new_trace_id(),
            |ids| TraceId::from_bytes(ids.trace_id),
        )
    }

    fn new_span_id(&self) -> SpanId {
        NEXT.with(Cell::get).map_or_else(
            || RandomIdGenerator::default().new_span_id(),
            |ids| SpanId::from_bytes(ids.span_id),
        )
    }
}
