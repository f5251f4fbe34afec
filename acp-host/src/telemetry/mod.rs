//! Trace export (OpenTelemetry): the spans of a run, a turn, a model request and a tool call,
//! sent over OTLP/HTTP (protobuf) to the collector the standard variables name, and/or written as
//! OTLP/JSON lines to the file `--trace-out` names (docs/observability.md).
//!
//! The spans are made with the SDK's tracer API directly, not through `tracing-opentelemetry`:
//! the ids a span carries are the ones `protocol::trace` minted and sent in `_meta` (the SDK is
//! told them through its id generator, `ids.rs`), so an exported span's id is by construction the
//! parent id its children received, and one trace spans every process; the `tracing` spans and
//! events stay what they are (logs), never copied into the trace.
//!
//! Invariants:
//! - off unless [`init`] was called with something to export (an endpoint variable set, or a
//!   file): then every entry point is one load of an unset `OnceLock` and returns, no thread, no
//!   allocation (attributes are built by closures that only run when on);
//! - export never blocks or fails a run: spans go to the SDK's batch processor (its one thread),
//!   a failed export is one warning through the binary's callback ([`Warn`]) for the whole
//!   process, and [`shutdown`] flushes within [`FLUSH_TIMEOUT`];
//! - no header value (`OTEL_EXPORTER_OTLP_HEADERS`, credentials) is ever printed, and without
//!   [`Settings::content`] no tool argument, result or file content goes into a span.

mod export;
mod ids;
mod run;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use opentelemetry::KeyValue as Attribute;
pub use opentelemetry::trace::{SpanKind, Status};
pub use run::RunTrace;

/// The longest a process waits at exit for its spans to be sent.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How a failed export is reported: called once per process, with a message that names the
/// collector's endpoint and never a header.
pub type Warn = Arc<dyn Fn(&str) + Send + Sync>;

/// What to export, from the binary's edge.
pub struct Settings {
    /// `service.name` when `OTEL_SERVICE_NAME` is unset.
    pub service: &'static str,
    /// OTLP/JSON lines appended to this file (`--trace-out`), beside any collector.
    pub trace_out: Option<PathBuf>,
    /// Tool arguments and results go into spans (`--trace-content`).
    pub content: bool,
    pub warn: Warn,
}

/// Why export could not be set up (the run goes on without it).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot open the trace file {path}: {source}; check the folder exists and is writable")]
    TraceOut {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot set up the OTLP exporter: {0}; check OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT)"
    )]
    Exporter(String),
}

struct State {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    content: bool,
}

static STATE: OnceLock<State> = OnceLock::new();

/// Whether a collector is named in this environment (an OTLP endpoint variable, non-empty).
#[must_use]
pub fn collector_named() -> bool {
    protocol::env_vars::otlp_export_wanted(|name| std::env::var(name).ok())
}

/// Starts export when there is something to export to (a collector named, or a file); `Ok(false)`
/// when there is not (nothing started). Call once, from the binary, after its spawner started
/// (the batch processor's thread must not exist when the spawner forks).
pub fn init(settings: Settings) -> Result<bool, TelemetryError> {
    let collector = collector_named();
    if !collector && settings.trace_out.is_none() {
        return Ok(false);
    }
    let exporter = export::Fanout::new(collector, settings.trace_out.as_deref(), settings.warn)?;
    let resource = if std::env::var_os(protocol::env_vars::OTEL_SERVICE_NAME)
        .is_some_and(|name| !name.is_empty())
    {
        opentelemetry_sdk::Resource::builder().build()
    } else {
        opentelemetry_sdk::Resource::builder()
            .with_service_name(settings.service)
            .build()
    };
    let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_id_generator(ids::Given)
        .with_resource(resource)
        .build();
    let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "acp-host");
    let _ = STATE.set(State {
        provider,
        tracer,
        content: settings.content,
    });
    Ok(true)
}

/// Whether spans are exported in this process.
#[must_use]
pub fn enabled() -> bool {
    STATE.get().is_some()
}

/// Whether tool arguments and results may go into spans (`--trace-content`).
#[must_use]
pub fn content() -> bool {
    STATE.get().is_some_and(|state| state.content)
}

/// Sends what is left, waiting at most [`FLUSH_TIMEOUT`]; a no-op when export is off.
pub fn shutdown() {
    if let Some(state) = STATE.get() {
        let _ = state.provider.shutdown_with_timeout(FLUSH_TIMEOUT);
    }
}

/// One exported span (`None` inside when export is off: every method returns at once).
#[derive(Debug, Default)]
pub struct Span(Option<opentelemetry_sdk::trace::Span>);

impl Span {
    /// Starts the span `context` names (its ids as sent in `_meta`) under `parent` (`None`: the
    /// root of its trace). `attributes` runs only when export is on.
    pub fn start(
        name: impl FnOnce() -> String,
        kind: SpanKind,
        context: &protocol::trace::TraceParent,
        parent: Option<&protocol::trace::TraceParent>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(state) = STATE.get() else {
            return Self(None);
        };
        let parent_cx = parent.map_or_else(Context::new, |parent| {
            Context::new().with_remote_span_context(span_context(parent))
        });
        let builder = state
            .tracer
            .span_builder(name())
            .with_kind(kind)
            .with_attributes(attributes());
        let span = ids::with_ids(&context.span, || {
            state.tracer.build_with_context(builder, &parent_cx)
        });
        Self(Some(span))
    }

    /// Whether the span records (export on and sampled).
    #[must_use]
    pub fn is_recording(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(opentelemetry::trace::Span::is_recording)
    }

    /// Adds attributes (built only when recording).
    pub fn set(&mut self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(span) = self.0.as_mut().filter(|span| span.is_recording()) {
            span.set_attributes(attributes());
        }
    }

    /// Adds an event (its attributes built only when recording).
    pub fn event(&mut self, name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(span) = self.0.as_mut().filter(|span| span.is_recording()) {
            span.add_event(name, attributes());
        }
    }

    /// Sets the span's status.
    pub fn status(&mut self, status: impl FnOnce() -> Status) {
        if let Some(span) = self.0.as_mut().filter(|span| span.is_recording()) {
            span.set_status(status());
        }
    }

    /// Ends the span now (dropping it does too).
    pub fn end(mut self) {
        if let Some(span) = self.0.as_mut() {
            span.end();
        }
    }
}

/// The SDK's form of a context we minted (or received).
fn span_context(parent: &protocol::trace::TraceParent) -> SpanContext {
    let state = parent
        .state
        .as_deref()
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanContext::new(
        TraceId::from_bytes(parent.span.trace_id),
        SpanId::from_bytes(parent.span.span_id),
        TraceFlags::new(parent.span.flags),
        true,
        state,
    )
}

/// The `GenAI` semantic-convention attribute names (OpenTelemetry's `gen_ai.*` registry).
pub mod gen_ai {
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const AGENT_NAME: &str = "gen_ai.agent.name";
    pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const TOOL_NAME: &str = "gen_ai.tool.name";
    pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    pub const TOOL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    pub const TOOL_RESULT: &str = "gen_ai.tool.call.result";
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// Ours (no convention yet): what the span spent, as the agent priced it.
    pub const COST: &str = "acp_host.usage.cost";
    /// Ours: the currency of [`COST`].
    pub const COST_CURRENCY: &str = "acp_host.usage.cost_currency";
}

/// `invoke_agent {name}` with the conventions' attributes.
#[must_use]
pub fn invoke_agent_name(agent: &str) -> String {
    format!("invoke_agent {agent}")
}

/// An attribute from a key and anything the SDK takes as a value.
pub fn attribute(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

/// `gen_ai.response.finish_reasons`: the one reason a response ended with.
#[must_use]
pub fn finish_reasons(reason: &str) -> KeyValue {
    KeyValue::new(
        gen_ai::FINISH_REASONS,
        opentelemetry::Value::Array(opentelemetry::Array::String(vec![reason.to_owned().into()])),
    )
}

/// The usage attributes of a span that spent `usage`: tokens, and cost when known.
#[must_use]
pub fn usage_attributes(usage: &protocol::usage::Usage) -> Vec<KeyValue> {
    let mut out = vec![
        attribute(
            gen_ai::INPUT_TOKENS,
            i64::try_from(usage.input_tokens).unwrap_or(i64::MAX),
        ),
        attribute(
            gen_ai::OUTPUT_TOKENS,
            i64::try_from(usage.output_tokens).unwrap_or(i64::MAX),
        ),
    ];
    if let Some(cost) = &usage.cost {
        out.push(attribute(gen_ai::COST, cost.amount));
        out.push(attribute(gen_ai::COST_CURRENCY, cost.currency.clone()));
    }
    out
}
