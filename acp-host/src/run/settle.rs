//! How a run (or a kept session's turn) ended, mapped onto its [`RunResult`]: status, stop
//! reason, error kind and message ([`settle`], a pure decision), then what teardown observed and
//! what the drive collected.
//!
//! Invariants:
//! - every way the drive ends (or none, after a kill) maps onto one status, with an error kind
//!   exactly when there is an error message;
//! - where acp-host knows how to get past a failure, the message says so (an install hint, a
//!   login or the keys it withheld, `--verbose`);
//! - where the result repeats the agent's words (stderr tail, error, stop reason), credential
//!   values are redacted (`protocol::env_scrub::Redactor`); the output is the answer itself and is
//!   left alone;
//! - a structured answer that does not match turns only an otherwise completed run into
//!   `schema-mismatch`.

use std::time::Duration;

use protocol::env_scrub::Redactor;
use protocol::request::StartRequest;
use protocol::result::{AgentExit, ErrorKind, RunResult};
use protocol::status::Status;
use protocol::structured;
use protocol::usage::Overrun;

use crate::client::{DriveEnd, ResultOf, Shared, Stage, Structured};
use crate::process::{AgentProcess, SpawnError, Teardown};

/// What a drive that failed at `stage` is: the bridge's own words for a remote agent that could
/// not connect, a crash when the agent closed its end, else a protocol or handshake error.
fn failure(
    request: &StartRequest,
    result: &RunResult,
    stage: Stage,
    closed: bool,
    message: String,
    exit: &str,
) -> (ErrorKind, String) {
    if let Some(cause) = (closed && stage == Stage::Initialize)
        .then(|| bridge_error(request, &result.stderr_tail))
        .flatten()
    {
        // A remote agent's bridge that could not connect: its own words say why.
        (ErrorKind::Handshake, cause.to_owned())
    } else if closed {
        (
            ErrorKind::Crash,
            protocol::report::clause(&message, &format!("it {exit}")),
        )
    } else if stage == Stage::Prompt {
        (ErrorKind::Protocol, message)
    } else {
        (ErrorKind::Handshake, message)
    }
}

/// Maps how the drive ended onto status, stop reason, error message and error kind.
fn settle(
    result: &mut RunResult,
    end: Option<DriveEnd>,
    timed_out: bool,
    overrun: Option<&Overrun>,
    unheld: Option<&str>,
    request: &StartRequest,
) {
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
        // Passing the budget cancels the turn; a turn that ended as its last report passed it
        // is over budget all the same.
        Some(end) if let Some(overrun) = overrun => (
            Status::OverBudget,
            answered(end),
            Some((ErrorKind::Budget, overrun.to_string())),
        ),
        // Nothing reported to hold the budget against by the end of the first reply.
        Some(end) if let Some(why) = unheld => (
            Status::Error,
            answered(end),
            Some((ErrorKind::Budget, why.to_owned())),
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
        }) => (
            Status::Error,
            None,
            Some(failure(request, result, stage, closed, message, &exit)),
        ),
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
        // like the start-time ones, and so is forking one (`sessionCapabilities.fork`): a
        // refusal before anything is prompted, not a failed handshake.
        Some(end @ (DriveEnd::CannotResume | DriveEnd::CannotFork)) => (
            Status::Error,
            None,
            Some((ErrorKind::Capability, cannot_start(&end, request))),
        ),
    };
    result.status = status;
    result.stop_reason = stop_reason;
    (result.error_kind, result.error) = error.unzip();
}

/// Why a remote agent's bridge (`acp-host bridge URL`) ended before its connection carried an
/// answer: the error it printed last (a refused connection, the server's 401 or 503).
fn bridge_error<'a>(request: &StartRequest, stderr_tail: &'a str) -> Option<&'a str> {
    protocol::remote::remote_agent(&request.agent.display)?;
    stderr_tail
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix(protocol::remote::ERROR_PREFIX))
}

/// Why the session the request names cannot be started from: the agent does not advertise
/// loading (resume) or forking sessions.
fn cannot_start(end: &DriveEnd, request: &StartRequest) -> String {
    let agent = request.agent.display.as_str();
    if *end == DriveEnd::CannotFork {
        format!(
            "cannot fork session {}: agent {agent} does not advertise sessionCapabilities.fork, \
             so it cannot start from a copy of a session; resume it (--resume) or start a new \
             session instead",
            request.fork.as_deref().unwrap_or_default()
        )
    } else {
        format!(
            "cannot resume session {}: agent {agent} does not advertise loadSession, so it \
             cannot continue a saved session; start a new session instead",
            request.resume.as_deref().unwrap_or_default()
        )
    }
}

/// The stop reason the agent answered with, when it answered (ended, or after a cancel).
fn answered(end: DriveEnd) -> Option<String> {
    match end {
        DriveEnd::Stopped { stop_reason } => Some(stop_reason),
        DriveEnd::Cancelled { stop_reason, .. } => stop_reason,
        _ => None,
    }
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
        ended_by: teardown.rung.into(),
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
    of: ResultOf,
    end: Option<DriveEnd>,
    timed_out: bool,
    request: &StartRequest,
    shared: &Shared,
    redactor: &Redactor,
) {
    settle(
        result,
        end,
        timed_out,
        shared.overrun().as_ref(),
        shared.budget_unheld(),
        request,
    );
    (result.output, result.output_truncated_bytes) = shared.take_output();
    (result.permissions, result.permissions_dropped) = shared.take_permissions();
    result.session_id = shared.session_id();
    // Named only once the fork exists: a refused or failed `session/fork` started nothing.
    result.forked_from = request.fork.clone().filter(|_| result.session_id.is_some());
    result.resumable = shared.resumable();
    result.children = shared.children_for(of);
    if of == ResultOf::Run && shared.garbage_lines() > 0 {
        tracing::info!(
            lines = shared.garbage_lines(),
            "skipped non-JSON lines on the agent's stdout"
        );
    }
    result.persona_delivery = shared.persona_delivery();
    result.usage = shared.take_turn_usage();
    if let Some(warning) = shared.budget_unenforceable() {
        tracing::debug!(%warning, "the budget could not be held");
        result.warnings.push(warning.to_owned());
    }
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use protocol::capabilities::{Refusal, Wants};
    use protocol::permission::PermissionPolicy;
    use protocol::request::{AgentCommand, Timeouts};
    use protocol::structured::{StructuredVia, Violation};

    use super::*;

    /// What settling one way of ending must give: status, stop reason, and the error (kind and
    /// message), given the agent's exit and the names acp-host withheld.
    struct Case {
        name: &'static str,
        end: Option<DriveEnd>,
        timed_out: bool,
        exit: (Option<i32>, Option<i32>),
        withheld: &'static [&'static str],
        status: Status,
        stop_reason: Option<&'static str>,
        error: Option<(ErrorKind, &'static str)>,
    }

    fn request() -> StartRequest {
        StartRequest {
            agent: AgentCommand {
                program: PathBuf::from("mock-agent"),
                args: Vec::new(),
                display: "mock".into(),
                install_hint: None,
            },
            prompt: "hi".into(),
            cwd: PathBuf::new(),
            env: Vec::new(),
            permission: PermissionPolicy::Reject,
            timeouts: Timeouts {
                overall: Some(Duration::from_millis(1500)),
                handshake: Duration::from_secs(2),
                ..Timeouts::default()
            },
            max_depth: None,
            wants: Wants::default(),
            resume: Some("s-1".into()),
            fork: Some("s-2".into()),
            budget: protocol::usage::Budget::default(),
            on_unreported: protocol::usage::Unreported::default(),
            sandbox: protocol::sandbox::Policy::default(),
        }
    }

    fn stopped(reason: &str) -> DriveEnd {
        DriveEnd::Stopped {
            stop_reason: reason.into(),
        }
    }

    fn failed(stage: Stage, closed: bool) -> DriveEnd {
        DriveEnd::Failed {
            stage,
            closed,
            message: "it broke".into(),
        }
    }

    fn auth(stage: Stage) -> DriveEnd {
        DriveEnd::AuthRequired {
            stage,
            message: "agent answered initialize with error -32000: auth".into(),
        }
    }

    /// The auth-required message of [`auth`], with how to get past it, then `$rest`.
    macro_rules! login {
        ($rest:literal) => {
            concat!(
                "agent answered initialize with error -32000: auth; the agent needs \
                 authentication: log in with the agent itself once, or forward its API key with \
                 --env",
                $rest
            )
        };
    }

    #[expect(
        clippy::too_many_lines,
        reason = "one table: a row per way the drive ends"
    )]
    fn cases() -> Vec<Case> {
        let case = |name, end, status, stop_reason, error| Case {
            name,
            end,
            timed_out: false,
            exit: (None, None),
            withheld: &[],
            status,
            stop_reason,
            error,
        };
        vec![
            case("killed", None, Status::Aborted, None, None),
            Case {
                timed_out: true,
                ..case(
                    "timed out, whatever the drive said",
                    Some(stopped("end_turn")),
                    Status::Timeout,
                    None,
                    Some((ErrorKind::Timeout, "timed out after 1500 ms")),
                )
            },
            Case {
                timed_out: true,
                ..case(
                    "killed after the deadline",
                    None,
                    Status::Aborted,
                    None,
                    None,
                )
            },
            case(
                "end_turn",
                Some(stopped("end_turn")),
                Status::Completed,
                Some("end_turn"),
                None,
            ),
            case(
                "max_tokens",
                Some(stopped("max_tokens")),
                Status::MaxTokens,
                Some("max_tokens"),
                None,
            ),
            case(
                "max_turn_requests",
                Some(stopped("max_turn_requests")),
                Status::MaxTurnRequests,
                Some("max_turn_requests"),
                None,
            ),
            case(
                "refusal",
                Some(stopped("refusal")),
                Status::Refusal,
                Some("refusal"),
                None,
            ),
            case(
                "the agent's own cancelled",
                Some(stopped("cancelled")),
                Status::Aborted,
                Some("cancelled"),
                None,
            ),
            case(
                "an unknown stop reason",
                Some(stopped("done!")),
                Status::Error,
                Some("done!"),
                Some((
                    ErrorKind::Protocol,
                    "agent returned an unknown stop reason: \"done!\"",
                )),
            ),
            case(
                "cancelled, answered within the grace",
                Some(DriveEnd::Cancelled {
                    prompt_sent: true,
                    stop_reason: Some("cancelled".into()),
                }),
                Status::Aborted,
                Some("cancelled"),
                None,
            ),
            case(
                "cancelled before the prompt",
                Some(DriveEnd::Cancelled {
                    prompt_sent: false,
                    stop_reason: None,
                }),
                Status::Aborted,
                None,
                None,
            ),
            case(
                "a silent handshake",
                Some(DriveEnd::HandshakeTimeout {
                    stage: Stage::NewSession,
                }),
                Status::Error,
                None,
                Some((
                    ErrorKind::Handshake,
                    "agent did not answer session/new within 2 s (is it an ACP agent? try \
                     --verbose)",
                )),
            ),
            Case {
                exit: (Some(3), None),
                ..case(
                    "stdout closed: it exited",
                    Some(failed(Stage::Prompt, true)),
                    Status::Error,
                    None,
                    Some((ErrorKind::Crash, "it broke; it exited with code 3")),
                )
            },
            Case {
                exit: (None, Some(9)),
                ..case(
                    "stdout closed: it was killed",
                    Some(failed(Stage::Initialize, true)),
                    Status::Error,
                    None,
                    Some((ErrorKind::Crash, "it broke; it was killed by signal 9")),
                )
            },
            case(
                "stdout closed, nothing known of its exit",
                Some(failed(Stage::Prompt, true)),
                Status::Error,
                None,
                Some((ErrorKind::Crash, "it broke; it ended")),
            ),
            case(
                "a failed prompt",
                Some(failed(Stage::Prompt, false)),
                Status::Error,
                None,
                Some((ErrorKind::Protocol, "it broke")),
            ),
            case(
                "a failed handshake",
                Some(failed(Stage::SetConfigOption, false)),
                Status::Error,
                None,
                Some((ErrorKind::Handshake, "it broke")),
            ),
            case(
                "a refused capability",
                Some(DriveEnd::Refused(Refusal {
                    capability: "model",
                    agent: "mock".into(),
                    reason: "offers no model choice".into(),
                })),
                Status::Error,
                None,
                Some((
                    ErrorKind::Capability,
                    "capability model: agent mock offers no model choice",
                )),
            ),
            case(
                "a broken transport",
                Some(DriveEnd::ConnectionFailed {
                    message: "agent sent a frame larger than 8 bytes".into(),
                }),
                Status::Error,
                None,
                Some((
                    ErrorKind::Protocol,
                    "agent sent a frame larger than 8 bytes",
                )),
            ),
            case(
                "auth required, nothing withheld",
                Some(auth(Stage::Initialize)),
                Status::Error,
                None,
                Some((ErrorKind::Handshake, login!(" NAME"))),
            ),
            Case {
                withheld: &["HOME_TOKEN_PATH", "OPENAI_API_KEY"],
                ..case(
                    "auth required, one key withheld",
                    Some(auth(Stage::NewSession)),
                    Status::Error,
                    None,
                    Some((
                        ErrorKind::Handshake,
                        login!(" OPENAI_API_KEY (acp-host withheld it)"),
                    )),
                )
            },
            Case {
                withheld: &["A_API_KEY", "B_TOKEN"],
                ..case(
                    "auth required at the prompt, two keys withheld",
                    Some(auth(Stage::Prompt)),
                    Status::Error,
                    None,
                    Some((
                        ErrorKind::Protocol,
                        login!(" NAME (acp-host withheld A_API_KEY, B_TOKEN)"),
                    )),
                )
            },
            case(
                "cannot resume",
                Some(DriveEnd::CannotResume),
                Status::Error,
                None,
                Some((
                    ErrorKind::Capability,
                    "cannot resume session s-1: agent mock does not advertise loadSession, so it \
                     cannot continue a saved session; start a new session instead",
                )),
            ),
            case(
                "cannot fork",
                Some(DriveEnd::CannotFork),
                Status::Error,
                None,
                Some((
                    ErrorKind::Capability,
                    "cannot fork session s-2: agent mock does not advertise \
                     sessionCapabilities.fork, so it cannot start from a copy of a session; \
                     resume it (--resume) or start a new session instead",
                )),
            ),
        ]
    }

    #[test]
    fn a_remote_agents_bridge_error_is_the_runs_error_before_initialize() {
        let mut remote = request();
        remote.agent.display = "ws://127.0.0.1:9/acp".into();
        let tail = "noise\nacp-host: error: connection refused to 127.0.0.1:9: is acp-host serve \
                    running there?\n";
        assert_eq!(
            bridge_error(&remote, tail),
            Some("connection refused to 127.0.0.1:9: is acp-host serve running there?")
        );
        assert_eq!(bridge_error(&remote, "just noise\n"), None);
        // A local agent's stderr is its own.
        assert_eq!(bridge_error(&request(), tail), None);
        let mut result = RunResult::unsettled("r".into(), Vec::new());
        result.stderr_tail = tail.into();
        settle(
            &mut result,
            Some(failed(Stage::Initialize, true)),
            false,
            None,
            None,
            &remote,
        );
        assert_eq!(result.error_kind, Some(ErrorKind::Handshake));
        assert_eq!(
            result.error.as_deref(),
            Some("connection refused to 127.0.0.1:9: is acp-host serve running there?")
        );
        // After initialize, a closed connection is the crash it always was.
        settle(
            &mut result,
            Some(failed(Stage::Prompt, true)),
            false,
            None,
            None,
            &remote,
        );
        assert_eq!(result.error_kind, Some(ErrorKind::Crash));
    }

    #[test]
    fn every_way_the_drive_ends_settles_into_one_status_and_error() {
        for case in cases() {
            let mut result = RunResult::unsettled(
                "run".into(),
                case.withheld.iter().map(ToString::to_string).collect(),
            );
            (result.agent_exit.code, result.agent_exit.signal) = case.exit;
            settle(
                &mut result,
                case.end,
                case.timed_out,
                None,
                None,
                &request(),
            );
            assert_eq!(result.status, case.status, "{}", case.name);
            assert_eq!(
                result.stop_reason.as_deref(),
                case.stop_reason,
                "{}",
                case.name
            );
            assert_eq!(
                result.error_kind.zip(result.error.as_deref()),
                case.error,
                "{}",
                case.name
            );
            assert_eq!(
                result.error_kind.is_some(),
                result.error.is_some(),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn a_passed_budget_is_over_budget_whether_the_turn_was_cancelled_or_had_ended() {
        let overrun = Overrun::Tokens {
            used: 120,
            limit: 100,
        };
        for (end, stop_reason) in [
            (
                DriveEnd::Cancelled {
                    prompt_sent: true,
                    stop_reason: Some("cancelled".into()),
                },
                Some("cancelled"),
            ),
            (stopped("end_turn"), Some("end_turn")),
        ] {
            let mut result = RunResult::unsettled("run".into(), Vec::new());
            settle(
                &mut result,
                Some(end),
                false,
                Some(&overrun),
                None,
                &request(),
            );
            assert_eq!(result.status, Status::OverBudget);
            assert_eq!(result.exit_code(), 7);
            assert_eq!(result.stop_reason.as_deref(), stop_reason);
            assert_eq!(result.error_kind, Some(ErrorKind::Budget));
            assert_eq!(
                result.error.as_deref(),
                Some("used 120 tokens, over the token budget of 100")
            );
        }
        // The deadline came first: a timeout.
        let mut result = RunResult::unsettled("run".into(), Vec::new());
        settle(
            &mut result,
            Some(stopped("end_turn")),
            true,
            Some(&overrun),
            None,
            &request(),
        );
        assert_eq!(result.status, Status::Timeout);
        // Nothing reported to hold it against: an error of kind budget, the answer's stop kept.
        let mut result = RunResult::unsettled("run".into(), Vec::new());
        settle(
            &mut result,
            Some(stopped("end_turn")),
            false,
            None,
            Some(protocol::usage::UNREPORTED_USAGE),
            &request(),
        );
        assert_eq!(result.status, Status::Error);
        assert_eq!(result.error_kind, Some(ErrorKind::Budget));
        assert_eq!(result.stop_reason.as_deref(), Some("end_turn"));
        assert_eq!(
            result.error.as_deref(),
            Some("the agent reports no usage; the budget cannot be held")
        );
    }

    #[test]
    fn a_mismatched_answer_turns_only_a_completed_run_into_a_schema_mismatch() {
        let mismatched = || {
            Some(Structured::Mismatched {
                via: StructuredVia::Text,
                violations: vec![Violation {
                    path: "/n".into(),
                    message: "is not a number".into(),
                }],
            })
        };
        let mut completed = RunResult::unsettled("run".into(), Vec::new());
        settle(
            &mut completed,
            Some(stopped("end_turn")),
            false,
            None,
            None,
            &request(),
        );
        record_structured(&mut completed, mismatched());
        assert_eq!(completed.status, Status::SchemaMismatch);
        assert_eq!(completed.error_kind, Some(ErrorKind::SchemaMismatch));
        assert_eq!(
            completed.error.as_deref(),
            Some("the answer does not match the output schema: /n: is not a number")
        );
        assert_eq!(completed.structured_via, Some(StructuredVia::Text));

        let mut refused = RunResult::unsettled("run".into(), Vec::new());
        settle(
            &mut refused,
            Some(stopped("refusal")),
            false,
            None,
            None,
            &request(),
        );
        record_structured(&mut refused, mismatched());
        assert_eq!(refused.status, Status::Refusal);
        assert_eq!(refused.error, None);
        assert_eq!(refused.structured_via, Some(StructuredVia::Text));

        let mut matched = RunResult::unsettled("run".into(), Vec::new());
        settle(
            &mut matched,
            Some(stopped("end_turn")),
            false,
            None,
            None,
            &request(),
        );
        record_structured(
            &mut matched,
            Some(Structured::Matched {
                value: serde_json::json!({"n": 1}),
                via: StructuredVia::CaptureTool,
            }),
        );
        assert_eq!(matched.status, Status::Completed);
        assert_eq!(matched.structured, Some(serde_json::json!({"n": 1})));
    }
}
