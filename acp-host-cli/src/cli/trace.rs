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
