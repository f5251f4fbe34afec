//! The trace a CLI run continues: `--traceparent`, else `TRACEPARENT` in acp-host's environment
//! (OpenTelemetry's environment carrier), with `TRACESTATE` beside either. Parsing and its rules
//! are `protocol::trace`'s; a malformed value is a usage error naming where it came from.

use protocol::env_vars;
use protocol::trace::TraceParent;

use super::CliError;

/// The given trace context, if any: the flag wins over the environment.
pub(super) fn given(flag: Option<&str>) -> Result<Option<TraceParent>, CliError> {
    let from_env = std::env::var(env_vars::TRACEPARENT).ok();
    let state = std::env::var(env_vars::TRACESTATE).ok();
    let (value, source) = match flag {
        Some(value) => (Some(value), "--traceparent".to_owned()),
        None => (from_env.as_deref(), format!("${}", env_vars::TRACEPARENT)),
    };
    TraceParent::given(value, state.as_deref()).map_err(|err| {
        CliError::Usage(format!(
            "{source}: {err}; fix it or unset it to start a new trace"
        ))
    })
}

/// The `--trace-out` file of this process, absolute, once export started: every agent gets it as
/// `ACP_TRACE_OUT`, so an acp-child below appends its spans to the same file.
static TRACE_OUT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// `--trace-content` of this process, once export started: agents get `ACP_TRACE_CONTENT=1`.
static TRACE_CONTENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ends export when dropped: what is left is sent within `telemetry::FLUSH_TIMEOUT`.
pub(super) struct Exporting(bool);

impl Drop for Exporting {
    fn drop(&mut self) {
        if self.0 {
            acp_host::telemetry::shutdown();
        }
    }
}

/// Starts trace export when a collector is named (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...) or
/// `--trace-out` is given; a failed export later is one warning on stderr (never a header's
/// value), and the run goes on. A trace file that cannot be opened is a usage error.
pub(super) fn export(
    trace_out: Option<&std::path::Path>,
    content: bool,
) -> Result<Exporting, CliError> {
    let trace_out = trace_out
        .map(std::path::absolute)
        .transpose()
        .map_err(|err| CliError::Usage(format!("--trace-out: {err}")))?;
    let started = acp_host::telemetry::init(acp_host::telemetry::Settings {
        service: "acp-host",
        trace_out: trace_out.clone(),
        content,
        warn: std::sync::Arc::new(|what: &str| note!("acp-host: warning: {what}")),
    });
    match started {
        Ok(started) => {
            if let Some(path) = trace_out.filter(|_| started) {
                let _ = TRACE_OUT.set(path);
            }
            TRACE_CONTENT.store(started && content, std::sync::atomic::Ordering::Relaxed);
            Ok(Exporting(started))
        }
        Err(err @ acp_host::telemetry::TelemetryError::TraceOut { .. }) => {
            Err(CliError::Usage(format!("--trace-out: {err}")))
        }
        Err(err) => {
            note!("acp-host: warning: {err}; spans are not exported");
            Ok(Exporting(false))
        }
    }
}

/// The environment an agent is prepared from: acp-host's own, plus `ACP_TRACE_OUT` when spans
/// go to a file and `ACP_TRACE_CONTENT=1` under `--trace-content`.
pub(super) fn agent_env() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    let content = TRACE_CONTENT
        .load(std::sync::atomic::Ordering::Relaxed)
        .then(|| (env_vars::ACP_TRACE_CONTENT.into(), "1".into()));
    std::env::vars_os()
        .chain(TRACE_OUT.get().map(|path| {
            (
                env_vars::ACP_TRACE_OUT.into(),
                path.clone().into_os_string(),
            )
        }))
        .chain(content)
}

/// The batch's own span (`trace`, every line's run under it), exported when export is on.
pub(super) fn batch_span(
    trace: &TraceParent,
    parent: Option<&TraceParent>,
) -> acp_host::telemetry::Span {
    acp_host::telemetry::Span::start(
        || "batch".to_owned(),
        acp_host::telemetry::SpanKind::Internal,
        trace,
        parent,
        Vec::new,
    )
}

/// A command's trace flags: `--traceparent`, `--trace-out`, `--trace-content`.
pub(super) trait Traced {
    fn traced(&self) -> (Option<&str>, Option<&std::path::Path>, bool);
}

/// The given trace context and the started export, for a command with trace flags.
pub(super) fn given_and_export(
    args: &impl Traced,
) -> Result<(Option<TraceParent>, Exporting), CliError> {
    let (traceparent, trace_out, content) = args.traced();
    Ok((given(traceparent)?, export(trace_out, content)?))
}
