//! The conversation with the agent over one connection: the handshake (initialize, the
//! start-time capabilities decided, session/new or session/load, the model selected), the first
//! turn with its structured-answer follow-ups, and a kept session's further turns.
//!
//! Invariants:
//! - what the run asks at start is decided from the `initialize` answer
//!   (`protocol::capabilities`): `session/new` carries a `systemPrompt` or the start extension's
//!   `_meta` only when advertised, a model is selected with `session/set_config_option` before the
//!   prompt, and a refusal ends the drive before `session/new` (persona, tools) or before the
//!   prompt (model); `ready` is announced only once the session is configured; resuming sends
//!   `session/load` instead of `session/new`, only to an agent that advertises `loadSession`, and
//!   forking sends `session/fork`, only to an agent that advertises `sessionCapabilities.fork`;
//! - the prompt is never sent if cancellation came before `session/new` answered; every prompt
//!   (first, follow-up or further turn) is raced against cancellation, which sends
//!   session/cancel and waits a bounded grace for the answer;
//! - while a prompt runs, a child session the caller cancels ([`super::SessionCancels`]) gets a
//!   `session/cancel` naming it, only if the agent announced it in this run;
//! - with an output schema, every turn that ends `end_turn` is checked (`protocol::structured`):
//!   the agent's captured value, else the value extracted from the turn's text (kept bounded); a
//!   mismatch gets a follow-up prompt in the same session, at most `retries` times;
//! - a kept session ([`super::DriveConfig::turns`]) answers further prompts one turn at a time;
//!   a turn's result is handed over once the observers saw that turn's updates; waiting for the
//!   next prompt is raced against cancellation; any turn that does not end with a stop reason
//!   ends the drive.

use std::sync::Mutex;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, ForkSessionRequest, Implementation,
    InitializeRequest, LoadSessionRequest, NewSessionRequest, PromptRequest,
    SetSessionConfigOptionRequest, SubagentCapabilities, SystemPrompt, SystemPromptMode,
    TextContent,
};
use agent_client_protocol::{Agent, UntypedMessage};
use protocol::capabilities::{self, Offers, SessionPlan};
use protocol::structured;
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use super::{DriveConfig, DriveEnd, DriveEvents, Stage, Structured};
use crate::lock;

pub(super) async fn converse(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    events: &dyn DriveEvents,
    cancel: &CancellationToken,
) -> DriveEnd {
    let (session_id, plan) = match handshake(cx, config, shared, cancel).await {
        Ok(started) => started,
        Err(end) => return end,
    };
    shared.open_start_gate(&session_id, events);

    let mut text = match &plan.preamble {
        Some(persona) => capabilities::preamble(persona, &config.prompt),
        None => config.prompt.clone(),
    };
    if let Some(instruction) = &plan.output_instruction {
        text.push_str(instruction);
    }
    let mut end = first_turn(cx, config, shared, &session_id, &plan, text, cancel).await;
    let Some(turns) = &config.turns else {
        return end;
    };
    // A kept session: each further prompt is a plain turn, raced against cancellation like the
    // first; waiting for it is raced too (a cancel while idle ends the drive at once).
    loop {
        if !matches!(end, DriveEnd::Stopped { .. }) {
            return end;
        }
        // The turn's result is handed over only once the observers saw its updates, so a caller
        // routing them per turn gets each turn whole.
        tokio::select! {
            biased;
            () = cancel.cancelled() => {}
            () = events.delivered() => {}
        }
        let next = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                return DriveEnd::Cancelled { prompt_sent: false, stop_reason: None };
            }
            next = turns.next(&end) => next,
        };
        let Some(text) = next else {
            return end;
        };
        end = match prompt_turn(cx, config, shared, &session_id, text, cancel).await {
            Ok(response) => stop_reason_of(&response),
            Err(end) => end,
        };
    }
}

/// The first prompt, checked against the output schema when one was asked for.
async fn first_turn(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    session_id: &str,
    plan: &SessionPlan,
    mut text: String,
    cancel: &CancellationToken,
) -> DriveEnd {
    let (Some(schema), Some(output), Some(expected)) =
        (&config.schema, &config.wants.output, plan.structured_via)
    else {
        return match prompt_turn(cx, config, shared, session_id, text, cancel).await {
            Ok(response) => stop_reason_of(&response),
            Err(end) => end,
        };
    };
    // The answer is checked after each turn that ends normally; a mismatch is answered with a
    // follow-up in the same session, up to the retries.
    let mut follow_ups = output.retries;
    loop {
        shared.begin_turn_text(config.max_answer_bytes);
        let response = match prompt_turn(cx, config, shared, session_id, text, cancel).await {
            Ok(response) => response,
            Err(end) => return end,
        };
        let end = stop_reason_of(&response);
        if !matches!(&end, DriveEnd::Stopped { stop_reason } if stop_reason == "end_turn") {
            return end;
        }
        let captured = capabilities::Answer::read(&response);
        // Without a capture, the answer's text is the candidate (an agent may answer in text
        // even when it has a capture tool). Checked off the runtime, raced against the cancel.
        let (turn_text, dropped) = shared.take_turn_text();
        let answer = structured::Answer {
            captured,
            text: turn_text,
            dropped,
            limit: config.max_answer_bytes,
        };
        let Ok(checked) = crate::answer::check(schema, answer, expected, cancel).await else {
            return DriveEnd::Cancelled {
                prompt_sent: true,
                stop_reason: Some("end_turn".to_owned()),
            };
        };
        let via = checked.via;
        let outcome = match checked.value {
            Ok(value) => Structured::Matched { value, via },
            Err(violations) if follow_ups > 0 => {
                follow_ups -= 1;
                tracing::info!(violations = %structured::describe(&violations), "answer does not match the output schema; following up");
                text = structured::nudge(&violations);
                continue;
            }
            Err(violations) => Structured::Mismatched { via, violations },
        };
        shared.set_structured(outcome);
        return end;
    }
}

/// One `session/prompt` with `text`, raced against cancellation: the agent's answer, or how the
/// drive ended (a failure, or the cancel, after session/cancel and a bounded wait).
async fn prompt_turn(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    session_id: &str,
    text: String,
    cancel: &CancellationToken,
) -> Result<serde_json::Value, DriveEnd> {
    let mut prompt = PromptRequest::new(
        session_id.to_owned(),
        vec![ContentBlock::Text(TextContent::new(text))],
    );
    config.trace.put_in(&mut prompt.meta);
    let prompt = match UntypedMessage::new("session/prompt", prompt) {
        Ok(message) => message,
        Err(err) => return Err(failed(Stage::Prompt, &err)),
    };
    let answer = cx.send_request(prompt).block_task();
    tokio::pin!(answer);
    loop {
        tokio::select! {
            biased;
            response = &mut answer => {
                if let Ok(response) = &response {
                    shared.answered(response);
                }
                return response.map_err(|err| failed(Stage::Prompt, &err));
            }
            () = cancel.cancelled() => break,
            () = config.child_cancels.notify.notified() => {
                for child in config.child_cancels.take() {
                    // Only a session the agent announced in this run: never ours, never foreign.
                    if shared.child(&child).is_none() {
                        tracing::debug!(session = %child, "not a child session of this run; not cancelled");
                        continue;
                    }
                    if let Err(err) = cx.send_notification(CancelNotification::new(child)) {
                        tracing::debug!(%err, "could not send session/cancel for a child session");
                    }
                }
            }
        }
    }
    shared.begin_cancelling();
    if let Err(err) = cx.send_notification(CancelNotification::new(session_id.to_owned())) {
        tracing::debug!(%err, "could not send session/cancel");
    }
    let stop_reason = match tokio::time::timeout(config.cancel_grace, answer).await {
        Ok(Ok(value)) => {
            shared.answered(&value);
            match stop_reason_of(&value) {
                DriveEnd::Stopped { stop_reason } => Some(stop_reason),
                _ => None,
            }
        }
        // A torn pipe after cancel, or no answer within the grace: still a cancel.
        Ok(Err(_)) | Err(_) => None,
    };
    Err(DriveEnd::Cancelled {
        prompt_sent: true,
        stop_reason,
    })
}

/// The model the run asked for, selected through the agent's config option when it offers one
/// (`options`: the session's `configOptions`); refused when it offers none that matches.
async fn select_model(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    session_id: &str,
    options: Option<&serde_json::Value>,
    at: &impl Fn(Stage),
) -> Result<(), DriveEnd> {
    let Some(model) = &config.wants.model else {
        return Ok(());
    };
    let choice =
        capabilities::plan_model(model, options, &config.agent).map_err(DriveEnd::Refused)?;
    if let Some(choice) = choice {
        at(Stage::SetConfigOption);
        let set = SetSessionConfigOptionRequest::new(
            session_id.to_owned(),
            choice.config_id,
            choice.value.as_str(),
        );
        let set = UntypedMessage::new("session/set_config_option", set)
            .map_err(|err| failed(Stage::SetConfigOption, &err))?;
        cx.send_request(set)
            .block_task()
            .await
            .map_err(|err| failed(Stage::SetConfigOption, &err))?;
    }
    Ok(())
}

/// initialize, the start-time capabilities decided, session/new (or session/load when resuming),
/// then the model selected, all within the handshake deadline: the session id and what the prompt
/// still needs, or how the drive ended (cancelled first, timed out, refused, or failed).
async fn handshake(
    cx: &ConnectionTo<Agent>,
    config: &DriveConfig,
    shared: &Shared,
    cancel: &CancellationToken,
) -> Result<(String, SessionPlan), DriveEnd> {
    // Which handshake step a timeout interrupted, for the message.
    let stage = Mutex::new(Stage::Initialize);
    let at = |next: Stage| {
        *lock(&stage) = next;
    };
    let steps = async {
        let mut initialize = InitializeRequest::new(protocol::version::ACP_PROTOCOL_VERSION)
            .client_capabilities(ClientCapabilities::new().subagents(SubagentCapabilities::new()))
            .client_info(Implementation::new("acp-host", env!("CARGO_PKG_VERSION")));
        config.trace.put_in(&mut initialize.meta);
        let initialized = cx
            .send_request(initialize)
            .block_task()
            .await
            .map_err(|err| failed(Stage::Initialize, &err))?;
        shared.set_resumable(initialized.agent_capabilities.load_session);
        let offers =
            Offers::from_initialize(&serde_json::to_value(&initialized).unwrap_or_default());
        let mut plan =
            capabilities::plan_session(&config.wants, config.max_depth, &offers, &config.agent)
                .map_err(DriveEnd::Refused)?;
        // The budget goes to an agent that holds it where the spending happens; ours stays the
        // backstop for every agent.
        capabilities::plan_budget(&mut plan, shared.budget(), &offers);
        shared.set_persona_delivery(plan.persona_delivery);
        let system_prompt = plan.system_prompt.as_ref().map(|system| {
            SystemPrompt::new(vec![ContentBlock::Text(TextContent::new(
                system.text.clone(),
            ))])
            .mode(if system.replace {
                SystemPromptMode::Override
            } else {
                SystemPromptMode::Append
            })
        });
        let (session_id, response) = if let Some(session_id) = &config.resume {
            if !initialized.agent_capabilities.load_session {
                return Err(DriveEnd::CannotResume);
            }
            at(Stage::LoadSession);
            let mut request = LoadSessionRequest::new(session_id.clone(), &config.cwd)
                .system_prompt(system_prompt);
            request.meta.clone_from(&plan.meta);
            config.trace.put_in(&mut request.meta);
            // An error answer (unknown session) fails here.
            let load = UntypedMessage::new("session/load", request)
                .map_err(|err| failed(Stage::LoadSession, &err))?;
            let response = cx
                .send_request(load)
                .block_task()
                .await
                .map_err(|err| failed(Stage::LoadSession, &err))?;
            (session_id.clone(), response)
        } else if let Some(source) = &config.fork {
            if initialized
                .agent_capabilities
                .session_capabilities
                .fork
                .is_none()
            {
                return Err(DriveEnd::CannotFork);
            }
            at(Stage::ForkSession);
            let mut request =
                ForkSessionRequest::new(source.clone(), &config.cwd).system_prompt(system_prompt);
            request.meta.clone_from(&plan.meta);
            config.trace.put_in(&mut request.meta);
            // An error answer (unknown session) fails here; the answer names the new session.
            new_session_as(cx, "session/fork", Stage::ForkSession, request).await?
        } else {
            at(Stage::NewSession);
            let mut request = NewSessionRequest::new(&config.cwd).system_prompt(system_prompt);
            request.meta.clone_from(&plan.meta);
            config.trace.put_in(&mut request.meta);
            new_session(cx, request).await?
        };
        shared.set_session_id(&session_id);
        select_model(cx, config, &session_id, response.get("configOptions"), &at).await?;
        // A persona sent as a preamble gets its variables here (acp-child substitutes those of
        // a system prompt itself).
        if let Some(persona) = &mut plan.preamble {
            *persona = capabilities::render_persona(
                persona,
                &config.cwd.display().to_string(),
                config.wants.model.as_deref(),
                response.get("configOptions"),
                &config.agent,
            )
            .map_err(DriveEnd::Refused)?;
        }
        Ok((session_id, plan))
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(DriveEnd::Cancelled { prompt_sent: false, stop_reason: None }),
        answer = tokio::time::timeout(config.handshake_timeout, steps) => answer.unwrap_or_else(|_| {
            let stage = *lock(&stage);
            Err(DriveEnd::HandshakeTimeout { stage })
        }),
    }
}

/// `session/new`: the new session's id, with the whole answer (its config options).
async fn new_session(
    cx: &ConnectionTo<Agent>,
    request: NewSessionRequest,
) -> Result<(String, serde_json::Value), DriveEnd> {
    new_session_as(cx, "session/new", Stage::NewSession, request).await
}

/// A request answered with a new session (`session/new`, `session/fork`): its id, with the whole
/// answer (its config options).
async fn new_session_as(
    cx: &ConnectionTo<Agent>,
    method: &str,
    stage: Stage,
    request: impl serde::Serialize,
) -> Result<(String, serde_json::Value), DriveEnd> {
    // Untyped so that a response without a session id is reported as such, not as a parse error.
    let message = UntypedMessage::new(method, request).map_err(|err| failed(stage, &err))?;
    let response = cx
        .send_request(message)
        .block_task()
        .await
        .map_err(|err| failed(stage, &err))?;
    let session_id = match response
        .get("sessionId")
        .and_then(serde_json::Value::as_str)
    {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => {
            return Err(DriveEnd::Failed {
                stage,
                closed: false,
                message: format!("agent answered {method} without a sessionId: {response}"),
            });
        }
    };
    Ok((session_id, response))
}

fn stop_reason_of(value: &serde_json::Value) -> DriveEnd {
    match value.get("stopReason").and_then(serde_json::Value::as_str) {
        Some(reason) => DriveEnd::Stopped {
            stop_reason: reason.to_owned(),
        },
        None => DriveEnd::Failed {
            stage: Stage::Prompt,
            closed: false,
            message: format!("agent answered session/prompt without a stopReason: {value}"),
        },
    }
}

fn failed(stage: Stage, err: &agent_client_protocol::Error) -> DriveEnd {
    let closed = err
        .data
        .as_ref()
        .and_then(|d| d.get("reason"))
        .and_then(serde_json::Value::as_str)
        .is_some_and(|r| r.contains("closed"));
    let message = if closed {
        format!(
            "agent closed its output before answering {}",
            stage.method()
        )
    } else {
        let data = err
            .data
            .as_ref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        let message = format!(
            "agent answered {} with error {}: {}{data}",
            stage.method(),
            err.code.value(),
            err.message
        );
        if err.code == agent_client_protocol::ErrorCode::AUTH_REQUIRED {
            return DriveEnd::AuthRequired { stage, message };
        }
        message
    };
    DriveEnd::Failed {
        stage,
        closed,
        message,
    }
}
