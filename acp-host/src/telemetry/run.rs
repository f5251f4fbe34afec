//! A run's spans in acp-host: `invoke_agent {agent}` (client side) from the run's start to its
//! result, an `execute_tool` span per tool call the agent announced (ours or a child session's),
//! and events for answered permission requests (with how long the answer took), a cancel, a
//! budget overrun and the teardown (the escalation step that ended the agent: `endedBy`).
//!
//! Invariants: off (`RunTrace(None)`) unless export is on, and then every method returns at
//! once; tool titles, arguments and results go in only with `--trace-content` (a title often
//! quotes a path or a command line); the agent's name is redacted like its stderr.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use agent_client_protocol::v1::schema::{SessionUpdate, ToolCallStatus, ToolKind};
use opentelemetry::trace::{SpanKind, Status};
use protocol::permission::PermissionDecision;
use protocol::result::{ErrorKind, RunResult};
use protocol::trace::TraceParent;

use super::{Span, attribute, gen_ai};

/// A run's live spans.
#[derive(Debug, Default)]
pub struct RunTrace(Option<Mutex<Live>>);

#[derive(Debug)]
struct Live {
    run: Span,
    context: TraceParent,
    /// Open tool calls, by session and tool call id: at most [`MAX_OPEN_TOOLS`], so an agent that
    /// announces calls and never ends them cannot grow it.
    tools: HashMap<(String, String), Span>,
}

/// The most tool calls of a run with a span open at once; a call past it gets none (its
/// permission events go on the run's span).
const MAX_OPEN_TOOLS: usize = 1024;

fn kind_name(kind: ToolKind) -> &'static str {
    match kind {
        ToolKind::Read => "read",
        ToolKind::Edit => "edit",
        ToolKind::Delete => "delete",
        ToolKind::Move => "move",
        ToolKind::Search => "search",
        ToolKind::Execute => "execute",
        ToolKind::Think => "think",
        ToolKind::Fetch => "fetch",
        ToolKind::SwitchMode => "switch_mode",
        _ => "other",
    }
}

impl RunTrace {
    /// The run's span (`context`, as sent to the agent) under `parent`; `agent` as the person
    /// named it, credential values already redacted.
    #[must_use]
    pub fn start(
        context: &TraceParent,
        parent: Option<&TraceParent>,
        agent: impl FnOnce() -> String,
    ) -> Self {
        Self::open(SpanKind::Client, context, parent, agent)
    }

    /// An agent's side of a prompt turn (acp-child): `invoke_agent {agent}`, a server span under
    /// the context the prompt carried.
    #[must_use]
    pub fn serve(
        context: &TraceParent,
        parent: Option<&TraceParent>,
        agent: &str,
        session_id: &str,
    ) -> Self {
        let trace = Self::open(SpanKind::Server, context, parent, || agent.to_owned());
        trace.ready(session_id);
        trace
    }

    fn open(
        kind: SpanKind,
        context: &TraceParent,
        parent: Option<&TraceParent>,
        agent: impl FnOnce() -> String,
    ) -> Self {
        if !super::enabled() {
            return Self(None);
        }
        let agent = agent();
        let run = Span::start(
            || super::invoke_agent_name(&agent),
            kind,
            context,
            parent,
            || {
                vec![
                    attribute(gen_ai::OPERATION_NAME, "invoke_agent"),
                    attribute(gen_ai::AGENT_NAME, agent.clone()),
                ]
            },
        );
        Self(Some(Mutex::new(Live {
            run,
            context: context.clone(),
            tools: HashMap::new(),
        })))
    }

    fn with(&self, act: impl FnOnce(&mut Live)) {
        if let Some(live) = &self.0 {
            act(&mut live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner));
        }
    }

    /// The agent's session is open: the conversation's id.
    pub fn ready(&self, session_id: &str) {
        self.with(|live| {
            live.run
                .set(|| vec![attribute(gen_ai::CONVERSATION_ID, session_id.to_owned())]);
        });
    }

    /// One `session/update` of the run's session (`session` `None`) or a child session's. A
    /// child session's tool calls are left to the child (an acp-child below exports its own
    /// spans; twice would be one tool call shown as two).
    pub fn update(&self, update: &SessionUpdate, session: Option<&str>) {
        if session.is_some() {
            return;
        }
        let (id, status) = match update {
            SessionUpdate::ToolCall(call) => (&call.tool_call_id.0, Some(call.status)),
            SessionUpdate::ToolCallUpdate(call) => (&call.tool_call_id.0, call.fields.status),
            _ => return,
        };
        self.with(|live| {
            let key = (session.unwrap_or_default().to_owned(), id.to_string());
            if let SessionUpdate::ToolCall(call) = update
                && live.tools.len() < MAX_OPEN_TOOLS
            {
                let context = crate::run::new_span(Some(&live.context));
                let name = kind_name(call.kind);
                let with_content = super::content();
                let span = Span::start(
                    || format!("execute_tool {name}"),
                    SpanKind::Internal,
                    &context,
                    Some(&live.context),
                    || {
                        let mut out = vec![
                            attribute(gen_ai::OPERATION_NAME, "execute_tool"),
                            attribute(gen_ai::TOOL_NAME, name),
                            attribute(gen_ai::TOOL_CALL_ID, id.to_string()),
                        ];
                        if let Some(session) = session {
                            out.push(attribute("acp.session.id", session.to_owned()));
                        }
                        if with_content {
                            out.push(attribute("acp.tool.title", call.title.clone()));
                            if let Some(input) = &call.raw_input {
                                out.push(attribute(gen_ai::TOOL_ARGUMENTS, input.to_string()));
                            }
                        }
                        out
                    },
                );
                live.tools.insert(key.clone(), span);
            }
            let content = super::content();
            if let (SessionUpdate::ToolCallUpdate(call), true) = (update, content)
                && let Some(span) = live.tools.get_mut(&key)
                && let Some(output) = &call.fields.raw_output
            {
                span.set(|| vec![attribute(gen_ai::TOOL_RESULT, output.to_string())]);
            }
            if let Some(ToolCallStatus::Completed | ToolCallStatus::Failed) = status
                && let Some(mut span) = live.tools.remove(&key)
            {
                let failed = status == Some(ToolCallStatus::Failed);
                span.set(|| {
                    vec![attribute(
                        "acp.tool.status",
                        if failed { "failed" } else { "completed" },
                    )]
                });
                if failed {
                    span.status(|| Status::error("the tool call failed"));
                }
                span.end();
            }
        });
    }

    /// One answered permission request, `waited` after it was asked: an event on its tool call's
    /// span when that is open, else on the run's.
    pub fn permission(&self, decision: &PermissionDecision, waited: Duration) {
        let decided_by = serde_json::to_value(decision.decided_by)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned));
        self.answered(
            (decision.session_id.as_deref(), &decision.tool_call_id),
            decision.verdict.as_str(),
            decided_by.as_deref(),
            waited,
        );
    }

    /// A permission request about tool call `call` (of `session`, `None`: the run's own) was
    /// asked: an event on its tool call's span when that is open, else on the run's.
    pub fn asked(&self, (session, call): (Option<&str>, &str)) {
        self.with(|live| {
            let key = (session.unwrap_or_default().to_owned(), call.to_owned());
            let attributes = || vec![attribute(gen_ai::TOOL_CALL_ID, call.to_owned())];
            match live.tools.get_mut(&key) {
                Some(span) => span.event("permission_asked", attributes),
                None => live.run.event("permission_asked", attributes),
            }
        });
    }

    /// A permission request about tool call `call` (of `session`, `None`: the run's own) was
    /// answered `verdict` (`decided_by` whom, when known) after `waited`.
    pub fn answered(
        &self,
        (session, call): (Option<&str>, &str),
        verdict: &str,
        decided_by: Option<&str>,
        waited: Duration,
    ) {
        self.with(|live| {
            let key = (session.unwrap_or_default().to_owned(), call.to_owned());
            let attributes = || {
                let mut out = vec![
                    attribute(gen_ai::TOOL_CALL_ID, call.to_owned()),
                    attribute("acp.permission.verdict", verdict.to_owned()),
                    attribute(
                        "acp.permission.wait_ms",
                        i64::try_from(waited.as_millis()).unwrap_or(i64::MAX),
                    ),
                ];
                if let Some(decided_by) = decided_by {
                    out.push(attribute(
                        "acp.permission.decided_by",
                        decided_by.to_owned(),
                    ));
                }
                out
            };
            match live.tools.get_mut(&key) {
                Some(span) => span.event("permission", attributes),
                None => live.run.event("permission", attributes),
            }
        });
    }

    /// A prompt turn's end (acp-child): its stop reason (or error), what it spent tree-wide and
    /// a budget stop; the span ends with any tool call still open.
    pub fn end_turn(
        &self,
        stop_reason: Result<&str, &str>,
        usage: Option<&protocol::usage::Usage>,
        budget_stop: Option<&str>,
    ) {
        self.with(|live| {
            for (_, span) in live.tools.drain() {
                span.end();
            }
            let run = &mut live.run;
            run.set(|| {
                let mut out = Vec::new();
                if let Ok(reason) = stop_reason {
                    out.push(super::finish_reasons(reason));
                }
                if let Some(usage) = usage {
                    out.extend(super::usage_attributes(usage));
                }
                out
            });
            if stop_reason == Ok("cancelled") {
                run.event("cancel", Vec::new);
            }
            if let Some(overrun) = budget_stop {
                run.event("budget_overrun", || {
                    vec![attribute("acp.error", overrun.to_owned())]
                });
            }
            if let Err(error) = stop_reason {
                run.status(|| Status::error(error.to_owned()));
            }
            std::mem::take(run).end();
        });
    }

    /// The run's result: its status, usage and cost, a cancel, a budget overrun, how the agent
    /// ended; the span ends (and any tool call still open with it).
    pub fn end(&self, result: &RunResult) {
        self.with(|live| {
            for (_, span) in live.tools.drain() {
                span.end();
            }
            let run = &mut live.run;
            run.set(|| {
                let mut out = vec![attribute("acp.run.status", result.status.as_str())];
                if let Some(reason) = &result.stop_reason {
                    out.push(super::finish_reasons(reason));
                }
                if let Some(usage) = &result.usage {
                    out.extend(super::usage_attributes(usage));
                }
                out
            });
            if result.status == protocol::status::Status::Aborted {
                run.event("cancel", Vec::new);
            }
            if result.error_kind == Some(ErrorKind::Budget)
                || result.status == protocol::status::Status::OverBudget
            {
                run.event("budget_overrun", || {
                    vec![attribute(
                        "acp.error",
                        result.error.clone().unwrap_or_default(),
                    )]
                });
            }
            let ended_by = result.agent_exit.ended_by;
            run.event("teardown", || {
                vec![attribute("acp.agent.ended_by", ended_by.as_str())]
            });
            if let Some(error) = &result.error {
                run.status(|| Status::error(error.clone()));
            }
            std::mem::take(run).end();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_tool_spans_are_bounded_and_an_ended_call_frees_its_place() {
        let trace = RunTrace(Some(Mutex::new(Live {
            run: Span(None),
            context: crate::run::new_span(None),
            tools: HashMap::new(),
        })));
        let call = |id: usize| -> SessionUpdate {
            serde_json::from_value(serde_json::json!(
                {"sessionUpdate": "tool_call", "toolCallId": format!("t{id}"), "title": "x"}
            ))
            .unwrap()
        };
        let open = |trace: &RunTrace| {
            let mut n = 0;
            trace.with(|live| n = live.tools.len());
            n
        };
        for id in 0..MAX_OPEN_TOOLS + 10 {
            trace.update(&call(id), None);
        }
        assert_eq!(open(&trace), MAX_OPEN_TOOLS);
        let done: SessionUpdate = serde_json::from_value(serde_json::json!(
            {"sessionUpdate": "tool_call_update", "toolCallId": "t0", "status": "completed"}
        ))
        .unwrap();
        trace.update(&done, None);
        assert_eq!(open(&trace), MAX_OPEN_TOOLS - 1);
        trace.update(&call(MAX_OPEN_TOOLS + 20), None);
        assert_eq!(open(&trace), MAX_OPEN_TOOLS);
    }
}
