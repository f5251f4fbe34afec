//! How a run (or a kept session's turn) ended, mapped onto its [`RunResult`]: status, stop
//! reason, error kind and message ([`settle`], a pure decision), then what teardown observed and
//! what the drive collected.
//!
//! Invariants:
//! - every way the drive ends has exactly one status, and an error kind exactly when there is an
//!   error message;
//! - a message names the agent and says how to get past it (an install hint, a login, the keys
//!   acp-host withheld, `--verbose`);
//! - where the result repeats the agent's words (stderr tail, error, stop reason), credential
//!   values are redacted (`protocol::env_scrub::Redactor`); the output is the answer itself and is
//!   left alone;
//! - a structured answer that does not match turns only an otherwise completed run into
//!   `schema-mismatch`.

use std::time::Duration;

use protocol::env_scrub::Redactor;
use protocol::request::StartRequest;
use protocol::result::{AgentExit, ErrorKind, RunResult, Status};
use protocol::structured;

use crate::client::{DriveEnd, Shared, Stage, Structured};
use crate::process::{AgentProcess, SpawnError, Teardown};

/// The result before anything happened: status error until settled, nothing spawned yet.
pub(super) fn unsettled_result(run_id: String, scrubbed_env: Vec<String>) -> RunResult {
    RunResult {
        run_id,
        status: Status::Error,
        stop_reason: None,
        output: String::new(),
        output_truncated_bytes: None,
        error: None,
        error_kind: None,
        scrubbed_env,
        agent_exit: AgentExit {
            ended_by: "not-spawned".into(),
            ..AgentExit::default()
        },
        stderr_tail: String::new(),
        duration_ms: 0,
        permissions: Vec::new(),
        permissions_dropped: None,
        session_id: None,
        children: Vec::new(),
        persona_delivery: None,
        structured: None,
        structured_via: None,
    }
}

/// Maps how the drive ended onto status, stop reason, error message and error kind.
fn settle(result: &mut RunResult, end: Option<DriveEnd>, timed_out: bool, request: &StartRequest) {
    let timeouts = &request.timeouts;
    let agent = request.agent.display.as_str();
    let exit = describe_exit(&result.agent_exit);
    let (status, stop_reason, error) = match end {
        // A second Ctrl-C: killed at once.
        None => (Status::Aborted, None, None),
        Some(_) if timed_out => (
            Status::Timeout,
            None,
            Some((
                ErrorKind::Timeout,
                format!(
                    "timed out after {}",
                    human_duration(timeouts.overall.unwrap_or_default())
                ),
            )),
        ),
        Some(DriveEnd::Stopped { stop_reason }) => {
            let status = Status::from_stop_reason(&stop_reason);
            let error = (status == Status::Error).then(|| {
                (
                    ErrorKind::Protocol,
                    format!("agent returned an unknown stop reason: {stop_reason:?}"),
                )
            });
            (status, Some(stop_reason), error)
        }
        Some(DriveEnd::Cancelled { stop_reason, .. }) => (Status::Aborted, stop_reason, None),
        Some(DriveEnd::HandshakeTimeout { stage }) => (
            Status::Error,
            None,
            Some((
                ErrorKind::Handshake,
                format!(
                    "agent did not answer {} within {} (is it an ACP agent? try --verbose)",
                    stage.method(),
                    human_duration(timeouts.handshake)
                ),
            )),
        ),
        Some(DriveEnd::Failed {
            stage,
            closed,
            message,
        }) => {
            let error = if closed {
                (
                    ErrorKind::Crash,
                    protocol::report::clause(&message, &format!("it {exit}")),
                )
            } else if stage == Stage::Prompt {
                (ErrorKind::Protocol, message)
            } else {
                (ErrorKind::Handshake, message)
            };
            (Status::Error, None, Some(error))
        }
        Some(DriveEnd::Refused(refusal)) => (
            Status::Error,
            None,
            Some((ErrorKind::Capability, refusal.to_string())),
        ),
        Some(DriveEnd::ConnectionFailed { message }) => {
            (Status::Error, None, Some((ErrorKind::Protocol, message)))
        }
        Some(DriveEnd::AuthRequired { stage, message }) => {
            let kind = if stage == Stage::Prompt {
                ErrorKind::Protocol
            } else {
                ErrorKind::Handshake
            };
            let hint = auth_hint(agent, &result.scrubbed_env);
            (
                Status::Error,
                None,
                Some((kind, protocol::report::clause(&message, &hint))),
            )
        }
        // Loading a saved session is a capability the agent advertises (`loadSession`) or not,
        // like the start-time ones: a refusal, not a failed handshake.
        Some(DriveEnd::CannotResume) => (
            Status::Error,
            None,
            Some((
                ErrorKind::Capability,
                format!(
                    "cannot resume session {}: agent {agent} does not advertise loadSession, so \
                     it cannot continue a saved session; start a new session instead",
                    request.resume.as_deref().unwrap_or_default()
                ),
            )),
        ),
    };
    result.status = status;
    result.stop_reason = stop_reason;
    (result.error_kind, result.error) = error.unzip();
}

/// How to get past an agent's auth-required answer, naming the variables acp-host withheld that
/// most likely hold its key.
fn auth_hint(agent: &str, withheld: &[String]) -> String {
    let fix = "the agent needs authentication: log in with the agent itself once, or forward its \
               API key with --env";
    match protocol::registry::likely_keys(agent, withheld).as_slice() {
        [] => format!("{fix} NAME"),
        [name] => format!("{fix} {name} (acp-host withheld it)"),
        names => format!("{fix} NAME (acp-host withheld {})", names.join(", ")),
    }
}

fn describe_exit(exit: &AgentExit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}

fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// The error of a failed spawn; a missing program comes with how to install it, when known.
pub(super) fn spawn_failure_message(err: &SpawnError, request: &StartRequest) -> String {
    let message = protocol::report::describe(err);
    let SpawnError::NotFound { .. } = err else {
        return message;
    };
    let install = request
        .agent
        .install_hint
        .as_ref()
        .map_or_else(String::new, |hint| format!(" (`{hint}`)"));
    protocol::report::clause(
        &message,
        &format!("install it{install}, put it on PATH, or pass --agent with a full path"),
    )
}

/// Copies what teardown observed into the result.
pub(super) fn record_teardown(result: &mut RunResult, teardown: &Teardown, process: &AgentProcess) {
    result.agent_exit = AgentExit {
        code: teardown.code,
        signal: teardown.signal,
        ended_by: teardown.rung.as_str().to_owned(),
    };
    if !teardown.survivors.is_empty() {
        tracing::warn!(survivors = ?teardown.survivors, "processes of the agent survived SIGKILL");
    }
    result.stderr_tail = process.stderr_tail();
}

/// Settles one turn's result (a kept session's, or the run's last): how the drive ended, what the
/// drive collected for the turn (taken from `shared`), and credential values redacted. Both kinds
/// of turn go through here, so a new field the drive collects is taken in one place.
pub(super) fn settle_turn(
    result: &mut RunResult,
    end: Option<DriveEnd>,
    timed_out: bool,
    request: &StartRequest,
    shared: &Shared,
    redactor: &Redactor,
) {
    settle(result, end, timed_out, request);
    (result.output, result.output_truncated_bytes) = shared.take_output();
    (result.permissions, result.permissions_dropped) = shared.take_permissions();
    result.session_id = shared.session_id();
    result.children = shared.take_children();
    result.persona_delivery = shared.persona_delivery();
    record_structured(result, shared.take_structured());
    redact_agent_text(result, redactor);
}

/// The checked structured answer: its value, or (on a run that otherwise completed) status
/// `schema-mismatch` with the last violations.
fn record_structured(result: &mut RunResult, structured: Option<Structured>) {
    match structured {
        Some(Structured::Matched { value, via }) => {
            result.structured = Some(value);
            result.structured_via = Some(via);
        }
        Some(Structured::Mismatched { via, violations }) => {
            result.structured_via = Some(via);
            if result.status == Status::Completed {
                result.status = Status::SchemaMismatch;
                result.error_kind = Some(ErrorKind::SchemaMismatch);
                result.error = Some(format!(
                    "the answer does not match the output schema: {}",
                    structured::describe(&violations)
                ));
            }
        }
        None => {}
    }
}

/// The agent may print a credential it was given or found: where the result repeats the agent's
/// words (stderr tail, error, an unknown stop reason), credential values are redacted. The output
/// is the answer itself and is left alone.
fn redact_agent_text(result: &mut RunResult, redactor: &Redactor) {
    result.stderr_tail = redactor.redact(&result.stderr_tail);
    result.error = result.error.as_deref().map(|error| redactor.redact(error));
    result.stop_reason = result.stop_reason.as_deref().map(|r| redactor.redact(r));
}
