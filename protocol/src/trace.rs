//! W3C trace context (`traceparent`, `tracestate`) as it travels between our processes: in an
//! ACP request's `params._meta` (root keys, the ACP meta-propagation convention shared with MCP)
//! and in the environment (`TRACEPARENT`, `TRACESTATE`, OpenTelemetry's environment carrier).
//!
//! Invariants: parsing follows the W3C Trace Context rules (version `00` exactly 55 characters,
//! lowercase hex, neither id all zeros; a later version may append `-` fields, which are ignored;
//! version `ff` is invalid), so a malformed value is refused, never forwarded; a span made here
//! always keeps its parent's trace id and flags. Random ids come from the caller (this module is
//! pure); an all-zero id handed in is replaced by a fixed non-zero one rather than producing an
//! invalid header.

use serde_json::{Map, Value};

/// The `_meta` key (and W3C header name) of the trace parent.
pub const TRACEPARENT_KEY: &str = "traceparent";
/// The `_meta` key (and W3C header name) of vendor trace state.
pub const TRACESTATE_KEY: &str = "tracestate";

/// The W3C limit on a `tracestate` value's length; a longer one is dropped, not truncated.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// One span's place in a trace: what a `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace's id (never all zeros).
    pub trace_id: [u8; 16],
    /// This span's id (never all zeros).
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// A trace context to continue: the parent span and its vendors' state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// The parent span.
    pub span: SpanContext,
    /// `tracestate`, passed on verbatim when valid.
    pub state: Option<String>,
}

/// Why a `traceparent` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceparentError {
    /// Not `version-traceid-spanid-flags` in lowercase hex of the right lengths.
    #[error(
        "traceparent {0:?} is not a W3C trace parent; expected 00-<32 hex>-<16 hex>-<2 hex>, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    )]
    Malformed(String),
    /// The trace or span id is all zeros, which the specification forbids.
    #[error(
        "traceparent {0:?} has an all-zero trace or span id; give a real one or leave it unset"
    )]
    ZeroId(String),
}

impl SpanContext {
    /// A new trace's root span from random bytes (the caller's randomness).
    #[must_use]
    pub fn root(random: [u8; 24]) -> Self {
        let mut trace_id = [0; 16];
        trace_id.copy_from_slice(&random[..16]);
        if trace_id == [0; 16] {
            trace_id[15] = 1;
        }
        Self {
            trace_id,
            span_id: nonzero(&random[16..]),
            flags: 1,
        }
    }

    /// A span under this one: the same trace and flags, a new span id from `random`.
    #[must_use]
    pub fn child(&self, random: [u8; 8]) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: nonzero(&random),
            flags: self.flags,
        }
    }

    /// Whether the parent asked for this trace to be recorded.
    #[must_use]
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lowercase hex characters.
    #[must_use]
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex characters.
    #[must_use]
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// The `traceparent` value naming this span (version `00`).
    #[must_use]
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.span_id_hex(),
            self.flags
        )
    }
}

/// An id that is never all zeros (the specification's invalid value).
fn nonzero(random: &[u8]) -> [u8; 8] {
    let mut id = [0; 8];
    id.copy_from_slice(random);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// Lowercase hex of exactly `N` bytes, or `None`.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// Parses a `traceparent` value (surrounding whitespace ignored).
pub fn parse_traceparent(value: &str) -> Result<SpanContext, TraceparentError> {
    let malformed = || TraceparentError::Malformed(value.to_owned());
    let text = value.trim();
    let version = text.get(..2).and_then(unhex::<1>).ok_or_else(malformed)?;
    // Version 00 is exactly 55 characters; a later one may carry more fields after a `-`.
    let fits = match text.len() {
        55 => true,
        len => version[0] != 0 && len > 55 && text.as_bytes()[55] == b'-',
    };
    if version[0] == 0xff || !fits {
        return Err(malformed());
    }
    let mut fields = text[..55].split('-').skip(1);
    let trace_id = fields.next().and_then(unhex::<16>).ok_or_else(malformed)?;
    let span_id = fields.next().and_then(unhex::<8>).ok_or_else(malformed)?;
    let flags = fields.next().and_then(unhex::<1>).ok_or_else(malformed)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return Err(TraceparentError::ZeroId(value.to_owned()));
    }
    Ok(SpanContext {
        trace_id,
        span_id,
        flags: flags[0],
    })
}

/// A `tracestate` worth passing on: non-empty, at most [`MAX_TRACESTATE_LEN`], printable ASCII.
#[must_use]
pub fn valid_tracestate(value: &str) -> Option<&str> {
    let value = value.trim();
    let printable = value.bytes().all(|byte| (0x20..0x7f).contains(&byte));
    (!value.is_empty() && value.len() <= MAX_TRACESTATE_LEN && printable).then_some(value)
}

impl TraceParent {
    /// The context a process was given: `traceparent` (refused when malformed) and its
    /// `tracestate` (dropped when invalid); `None` when no parent was given (empty counts as
    /// unset).
    pub fn given(
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Result<Option<Self>, TraceparentError> {
        let Some(parent) = traceparent.filter(|value| !value.trim().is_empty()) else {
            return Ok(None);
        };
        Ok(Some(Self {
            span: parse_traceparent(parent)?,
            state: tracestate.and_then(valid_tracestate).map(str::to_owned),
        }))
    }

    /// The context an ACP request's `_meta` carries, if any valid one: a malformed
    /// `traceparent` there is ignored (the sender's problem; the receiver starts its own trace).
    #[must_use]
    pub fn from_meta(meta: Option<&Map<String, Value>>) -> Option<Self> {
        let meta = meta?;
        let parent = meta.get(TRACEPARENT_KEY)?.as_str()?;
        let state = meta.get(TRACESTATE_KEY).and_then(Value::as_str);
        Self::given(Some(parent), state).ok().flatten()
    }

    /// Writes this context into a request's `_meta` as root keys (creating it when absent),
    /// beside whatever else it carries.
    pub fn put_in(&self, meta: &mut Option<Map<String, Value>>) {
        let meta = meta.get_or_insert_with(Map::new);
        meta.insert(
            TRACEPARENT_KEY.to_owned(),
            Value::String(self.span.traceparent()),
        );
        match &self.state {
            Some(state) => meta.insert(TRACESTATE_KEY.to_owned(), Value::String(state.clone())),
            None => meta.remove(TRACESTATE_KEY),
        };
    }

    /// A span under this context (same trace, same state), from the caller's random bytes.
    #[must_use]
    pub fn child(&self, random: [u8; 8]) -> Self {
        Self {
            span: self.span.child(random),
            state: self.state.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_parent_round_trips() {
        let span = parse_traceparent(GIVEN).unwrap();
        assert_eq!(span.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.span_id_hex(), "00f067aa0ba902b7");
        assert!(span.sampled());
        assert_eq!(span.traceparent(), GIVEN);
        assert_eq!(parse_traceparent(&format!("  {GIVEN}\n")), Ok(span));
        let unsampled = parse_traceparent(&GIVEN.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let later = format!("01{}-extra", &GIVEN[2..]);
        assert_eq!(
            parse_traceparent(&later).unwrap().span_id_hex(),
            "00f067aa0ba902b7"
        );
        // Version 00 may not; nor may any version run on without a dash.
        assert!(parse_traceparent(&format!("{GIVEN}-extra")).is_err());
        assert!(parse_traceparent(&format!("01{}x", &GIVEN[2..])).is_err());
    }

    #[test]
    fn malformed_parents_are_refused_with_the_expected_shape() {
        for bad in [
            "",
            "0",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bx-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-3600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-001",
        ] {
            let error = parse_traceparent(bad).unwrap_err();
            assert_eq!(error, TraceparentError::Malformed(bad.to_owned()), "{bad}");
            assert!(
                error.to_string().contains("expected 00-<32 hex>"),
                "{error}"
            );
        }
        let zero_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zero_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for zero in [zero_trace, zero_span] {
            let error = parse_traceparent(zero).unwrap_err();
            assert_eq!(error, TraceparentError::ZeroId(zero.to_owned()));
            assert!(error.to_string().contains("all-zero"), "{error}");
        }
    }

    #[test]
    fn new_spans_keep_the_trace_and_are_never_zero() {
        let root = SpanContext::root([7; 24]);
        assert_eq!(root.trace_id, [7; 16]);
        assert_eq!(root.span_id, [7; 8]);
        assert!(root.sampled());
        let zero = SpanContext::root([0; 24]);
        assert!(parse_traceparent(&zero.traceparent()).is_ok());
        let child = root.child([9; 8]);
        assert_eq!((child.trace_id, child.flags), (root.trace_id, root.flags));
        assert_eq!(child.span_id, [9; 8]);
        assert_eq!(root.child([0; 8]).span_id, [0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn tracestate_is_passed_on_only_when_valid() {
        assert_eq!(
            valid_tracestate(" congo=t61rcWkgMzE "),
            Some("congo=t61rcWkgMzE")
        );
        assert_eq!(valid_tracestate(""), None);
        assert_eq!(valid_tracestate("a=\u{7}"), None);
        assert_eq!(valid_tracestate(&"a".repeat(MAX_TRACESTATE_LEN + 1)), None);
    }

    #[test]
    fn a_given_context_comes_from_the_environment_or_meta() {
        assert_eq!(TraceParent::given(None, Some("a=b")), Ok(None));
        assert_eq!(TraceParent::given(Some(" "), None), Ok(None));
        assert!(TraceParent::given(Some("nope"), None).is_err());
        let given = TraceParent::given(Some(GIVEN), Some("a=b"))
            .unwrap()
            .unwrap();
        assert_eq!(given.state.as_deref(), Some("a=b"));

        let meta = json!({"traceparent": GIVEN, "tracestate": "a=b", "other": 1});
        let meta = meta.as_object().cloned();
        assert_eq!(TraceParent::from_meta(meta.as_ref()), Some(given.clone()));
        assert_eq!(TraceParent::from_meta(None), None);
        let bad = json!({"traceparent": "nope"}).as_object().cloned();
        assert_eq!(TraceParent::from_meta(bad.as_ref()), None);
        let not_text = json!({"traceparent": 1}).as_object().cloned();
        assert_eq!(TraceParent::from_meta(not_text.as_ref()), None);
    }

    #[test]
    fn a_context_goes_into_meta_beside_other_keys() {
        let given = TraceParent::given(Some(GIVEN), Some("a=b"))
            .unwrap()
            .unwrap();
        let mut meta = None;
        given.put_in(&mut meta);
        assert_eq!(
            Value::Object(meta.clone().unwrap()),
            json!({"traceparent": GIVEN, "tracestate": "a=b"})
        );
        let child = given.child([3; 8]);
        assert_eq!(child.state, given.state);
        let stateless = TraceParent {
            state: None,
            ..child
        };
        let mut meta = json!({"acp-host/start": {}, "tracestate": "old"})
            .as_object()
            .cloned();
        stateless.put_in(&mut meta);
        assert_eq!(
            Value::Object(meta.unwrap()),
            json!({"acp-host/start": {}, "traceparent": stateless.span.traceparent()})
        );
    }
}
