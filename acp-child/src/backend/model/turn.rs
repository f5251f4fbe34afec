//! One prompt turn against the model: request -> stream -> tool calls -> results -> next request.
//!
//! Invariants:
//! - at most `max_turn_requests` model requests per turn (retries of one request do not count);
//!   reaching the limit with tool results still unanswered ends the turn with `max_turn_requests`;
//! - the conversation is recorded (memory and, for persistent sessions, the session file) as it
//!   happens: the prompt together with the first reply (or the cancellation), each later model
//!   reply once complete, each tool result once known. A prompt whose first request fails (a bad
//!   key, an unreachable server) is not recorded, so sending it again does not show it twice. A
//!   reply cut off by cancellation keeps its streamed text but drops its unfinished tool calls;
//!   calls a cancelled turn did not run are recorded as cancelled, so the next request is valid;
//! - the calls of one reply run in order, except that consecutive `subagent` calls run together
//!   (bounded by the subagents' own limit); their results are recorded in call order;
//! - a structured answer captured (`submit_result` with a value that matches) ends the turn: the
//!   reply's later calls are refused unrun (their results say the answer was recorded) and no
//!   further request is made;
//! - a background task's completion notice goes into the next request once (`backend::children::table`),
//!   one [`Record::Notice`] per task, and stays in the conversation. It is sent as a made-up
//!   `task_output` exchange (`wire::messages`), never as a user message: it quotes a child's
//!   output. The client is not shown it, live or replayed: it is no call the model made, and the
//!   client saw (or chose not to see) the child's own activity;
//! - with a session budget (the start extension's `budget`), no model request is sent that would
//!   pass it on its estimated input ([`Hold::next_request`]), and a reply is cut off once what it
//!   streamed passes it ([`Hold::streamed`]): the turn then ends with `max_tokens`, the reason in
//!   the prompt response's `_meta` (`Turn::stop_for_budget`); a cut-off reply keeps its text and
//!   drops its tool calls, as a cancelled one;
//! - cancellation is raced at every wait (request, stream, permission, command) and the turn then
//!   returns `cancelled`; model failures become [`TurnError::Model`] (a JSON-RPC error).

use std::sync::Arc;

use agent_client_protocol::v1::schema::StopReason;
use futures::StreamExt as _;

use super::client::{ModelClient, ModelError};
use super::tools::{CANCELLED, CAPTURE_RECORDED, ToolResult, Toolbox, subagent};
use super::wire::{self, Accumulator, ChatRequest, Chunk, Finish, Reply};
use crate::backend::children::{Children, Subagents};
use crate::backend::{Turn, TurnError};
use crate::store::Record;

/// The context window of `model`, for usage updates: the flag, else what the server's listing
/// says.
fn context_window(
    flag: Option<u64>,
    listed: &[super::client::ListedModel],
    model: &str,
) -> Option<u64> {
    flag.or_else(|| {
        listed
            .iter()
            .find(|listed| listed.id == model)
            .and_then(|listed| listed.context_window)
    })
}

/// The turn's system prompt: the persona (a session's own with the agent's), then the
/// structured-output instruction when the session asks for a structured answer. Empty, it is not
/// sent.
fn system_prompt(
    config: &super::ModelConfig,
    settings: &crate::session::Settings,
    model: &str,
    root: &std::path::Path,
) -> String {
    let mut system = config
        .persona
        .with_session(settings.persona.as_ref())
        .render(model, root, settings.tools.as_ref());
    if settings.output.is_some() {
        if !system.trim().is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(super::tools::CAPTURE_INSTRUCTION);
    }
    system
}

pub(super) async fn run(
    client: &ModelClient,
    tools: &Toolbox,
    subagents: Option<&Arc<Subagents>>,
    (default_model, listed): (&str, &[super::client::ListedModel]),
    turn: &mut Turn,
) -> Result<StopReason, TurnError> {
    if turn.is_cancelled() {
        return Ok(StopReason::Cancelled);
    }
    let config = client.config();
    let memory = Arc::clone(turn.memory());
    // Recorded with the first reply (see the module invariants).
    let mut prompt = Some(Record::User {
        text: turn.prompt_text(),
    });
    let settings = memory.settings();
    let model = settings.model.as_deref().unwrap_or(default_model);
    let window = context_window(config.context_window, listed, model);
    let system = system_prompt(config, &settings, model, turn.workspace().root());
    // What may be delegated to is read once per turn.
    let children = subagents.map(|subagents| Children::new(subagents, turn));
    let offered = tools.definitions(
        children.as_ref(),
        settings.tools.as_ref(),
        settings.output.as_deref(),
    );
    for request_number in 1..=config.max_turn_requests {
        tracing::debug!(request_number, "model request");
        tell_notices(turn, &memory);
        let mut history = memory.history();
        history.extend(prompt.clone());
        let messages = wire::messages(system.clone(), &history);
        let request = ChatRequest {
            model,
            messages: &messages,
            stream: true,
            stream_options: wire::StreamOptions {
                include_usage: true,
            },
            tools: &offered,
        };
        let input_bytes = body_bytes(&request);
        let hold = Hold::of(settings.budget, &memory, input_bytes, config);
        if let Some(overrun) = hold.as_ref().and_then(Hold::next_request) {
            turn.stop_for_budget(overrun);
            return Ok(StopReason::MaxTokens);
        }
        let mut chat = chat_span(turn, model);
        let streamed = stream_reply(client, &request, turn, hold.as_ref()).await?;
        if let Some(prompt) = prompt.take() {
            memory.extend([prompt]);
        }
        let reply = match streamed {
            Streamed::Complete(reply) => {
                let spent = reply.usage.as_ref().map_or_else(
                    || reply.generated.estimate(input_bytes),
                    wire::WireUsage::to_usage,
                );
                chat.set(|| finish_attribute(&reply.finish));
                record_usage(config, window, spent, turn, &mut chat)?;
                reply
            }
            Streamed::OverBudget { reply, overrun } => {
                let spent = reply.generated.estimate(input_bytes);
                record_usage(config, window, spent, turn, &mut chat)?;
                chat.event("budget_overrun", || {
                    vec![acp_host::telemetry::attribute(
                        "acp.error",
                        overrun.to_string(),
                    )]
                });
                keep_partial(&memory, reply.text);
                turn.stop_for_budget(overrun);
                return Ok(StopReason::MaxTokens);
            }
            Streamed::Cancelled { partial } => {
                keep_partial(&memory, partial);
                return Ok(StopReason::Cancelled);
            }
        };
        let calls = match reply.finish {
            // Tool calls of a cut-off or filtered reply may be truncated: never run them.
            Finish::Length | Finish::ContentFilter | Finish::Stop => Vec::new(),
            Finish::ToolCalls => reply.tool_calls,
        };
        memory.extend([Record::Assistant {
            text: reply.text,
            tool_calls: calls.clone(),
        }]);
        match reply.finish {
            Finish::Stop => return Ok(StopReason::EndTurn),
            Finish::Length => return Ok(StopReason::MaxTokens),
            Finish::ContentFilter => return Ok(StopReason::Refusal),
            Finish::ToolCalls => {}
        }
        run_calls(tools, turn, children.as_ref(), &calls).await?;
        if turn.is_cancelled() {
            return Ok(StopReason::Cancelled);
        }
        if memory.has_captured() {
            return Ok(StopReason::EndTurn);
        }
    }
    Ok(StopReason::MaxTurnRequests)
}

/// Background tasks that finished since the last request: told once, between requests (never
/// between a reply's tool calls and their results).
fn tell_notices(turn: &Turn, memory: &crate::session::Memory) {
    let notices = memory.tasks().take_notices();
    for notice in &notices {
        crate::backend::children::count_spending(turn, memory.tasks(), &notice.task);
    }
    if !notices.is_empty() {
        memory.extend(notices.into_iter().map(|notice| Record::Notice {
            text: notice.text,
            task: Some(notice.task),
        }));
    }
}

/// Keeps the text of a reply cut off (cancelled, or past the budget) that the user already saw;
/// its tool calls never ran and are dropped.
fn keep_partial(memory: &crate::session::Memory, text: String) {
    if !text.is_empty() {
        memory.extend([Record::Assistant {
            text,
            tool_calls: Vec::new(),
        }]);
    }
}

/// One request's usage (reported, else estimated), priced when the person gave prices, added to
/// the turn's: its context (the request's input tokens) against the window, when the window is
/// known.
fn record_usage(
    config: &super::config::ModelConfig,
    window: Option<u64>,
    mut spent: protocol::usage::Usage,
    turn: &Turn,
    chat: &mut acp_host::telemetry::Span,
) -> Result<(), TurnError> {
    spent.cost = config.pricing.as_ref().map(|pricing| pricing.cost(&spent));
    chat.set(|| acp_host::telemetry::usage_attributes(&spent));
    let context = window.map(|size| (spent.input_tokens, size));
    turn.spent_own(&spent, context)
}

/// One model request's span (`chat {model}`, the `GenAI` conventions' client span) under the
/// turn's; a no-op when export is off.
fn chat_span(turn: &Turn, model: &str) -> acp_host::telemetry::Span {
    use acp_host::telemetry::{Span, SpanKind, attribute, gen_ai};
    if !acp_host::telemetry::enabled() {
        return Span::default();
    }
    let context = acp_host::run::new_span(Some(turn.trace()));
    Span::start(
        || format!("chat {model}"),
        SpanKind::Client,
        &context,
        Some(turn.trace()),
        || {
            vec![
                attribute(gen_ai::OPERATION_NAME, "chat"),
                attribute(gen_ai::REQUEST_MODEL, model.to_owned()),
            ]
        },
    )
}

/// A reply's finish reason, as the conventions name it.
fn finish_attribute(finish: &Finish) -> Vec<acp_host::telemetry::Attribute> {
    let reason = match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ContentFilter => "content_filter",
        Finish::ToolCalls => "tool_calls",
    };
    vec![acp_host::telemetry::finish_reasons(reason)]
}

/// The size of a request's JSON body (what an estimate of its input counts), without keeping it.
fn body_bytes(request: &ChatRequest<'_>) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serialising plain structs and a JSON value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, request);
    count.0
}

/// Runs one reply's tool calls and records their results, in the order the model made them.
/// Consecutive `subagent` calls run together (each waits for a free slot); every other call runs
/// alone, in order. Once the turn's answer is captured, the calls left are refused unrun.
async fn run_calls(
    tools: &Toolbox,
    turn: &Turn,
    children: Option<&Children<'_>>,
    calls: &[crate::store::RecordedCall],
) -> Result<(), TurnError> {
    let memory = turn.memory();
    let mut rest = calls;
    while let Some(first) = rest.first() {
        let together = if first.name == subagent::NAME {
            rest.iter().take_while(|c| c.name == subagent::NAME).count()
        } else {
            1
        };
        let (batch, after) = rest.split_at(together);
        rest = after;
        if memory.has_captured() {
            for call in batch {
                let result = tools.refuse(turn, call, CAPTURE_RECORDED.to_owned())?;
                memory.extend([Record::Tool {
                    call_id: call.id.clone(),
                    content: result.content,
                    failed: result.failed,
                }]);
            }
            continue;
        }
        let results = futures::future::join_all(
            batch
                .iter()
                .map(|call| run_call(tools, turn, children, call)),
        )
        .await;
        for (call, result) in batch.iter().zip(results) {
            let result = result?;
            memory.extend([Record::Tool {
                call_id: call.id.clone(),
                content: result.content,
                failed: result.failed,
            }]);
        }
    }
    Ok(())
}

/// Runs one call, unless the turn was cancelled first.
async fn run_call(
    tools: &Toolbox,
    turn: &Turn,
    children: Option<&Children<'_>>,
    call: &crate::store::RecordedCall,
) -> Result<ToolResult, TurnError> {
    if turn.is_cancelled() {
        return Ok(ToolResult {
            content: CANCELLED.to_owned(),
            failed: true,
        });
    }
    tools.run(turn, children, call).await
}

/// The session's budget, held around one model request: what the session spent before it and
/// the request's size (its input, estimated at `protocol::usage::BYTES_PER_TOKEN`).
struct Hold<'a> {
    budget: protocol::usage::Budget,
    spent: protocol::usage::Usage,
    input_bytes: u64,
    pricing: Option<&'a protocol::usage::Pricing>,
}

impl<'a> Hold<'a> {
    /// The hold of a request of `input_bytes`, when the session has a budget.
    fn of(
        budget: Option<protocol::usage::Budget>,
        memory: &crate::session::Memory,
        input_bytes: u64,
        config: &'a super::config::ModelConfig,
    ) -> Option<Self> {
        budget.map(|budget| Hold {
            budget,
            spent: memory.spent(),
            input_bytes,
            pricing: config.pricing.as_ref(),
        })
    }

    fn priced(&self, mut usage: protocol::usage::Usage) -> protocol::usage::Usage {
        usage.cost = self.pricing.map(|pricing| pricing.cost(&usage));
        usage
    }

    /// Whether sending the request would pass the budget on its input alone.
    fn next_request(&self) -> Option<protocol::usage::Overrun> {
        let next = self.priced(protocol::usage::estimate(self.input_bytes, 0, 0));
        self.budget.would_pass(&self.spent, &next)
    }

    /// Whether what the reply streamed so far (`generated`) passed the budget.
    fn streamed(&self, generated: wire::Generated) -> Option<protocol::usage::Overrun> {
        let mut total = self.spent.clone();
        total.add(&self.priced(generated.estimate(self.input_bytes)));
        self.budget.check(&total)
    }
}

/// How streaming one reply ended, when it did not fail.
enum Streamed {
    Complete(Reply),
    /// What it streamed passed the session's budget: cut off there.
    OverBudget {
        reply: Reply,
        overrun: protocol::usage::Overrun,
    },
    /// The turn was cancelled; `partial` is the text the user already saw.
    Cancelled {
        partial: String,
    },
}

/// Sends one request and streams its reply to the client (text as message chunks, reasoning as
/// thought chunks).
async fn stream_reply(
    client: &ModelClient,
    request: &ChatRequest<'_>,
    turn: &Turn,
    hold: Option<&Hold<'_>>,
) -> Result<Streamed, TurnError> {
    let Some(mut events) = client.stream(request, turn.cancellation()).await? else {
        return Ok(Streamed::Cancelled {
            partial: String::new(),
        });
    };
    let mut accumulator = Accumulator::default();
    loop {
        let event = tokio::select! {
            biased;
            () = turn.cancelled() => None,
            event = events.next() => Some(event),
        };
        let Some(event) = event else {
            return Ok(Streamed::Cancelled {
                partial: accumulator.text().to_owned(),
            });
        };
        let Some(event) = event else { break };
        let event = event.map_err(|source| ModelError::Stream {
            base_url: client.config().base_url.clone(),
            source,
        })?;
        let data = event.data.trim();
        if data == "[DONE]" {
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|source| ModelError::BadChunk {
            data: data.chars().take(200).collect(),
            source,
        })?;
        if let Some(error) = &chunk.error {
            let message = error.message.as_deref().unwrap_or("no message").to_owned();
            return Err(ModelError::InStream { message }.into());
        }
        let shown = accumulator.push(chunk);
        if let Some(thought) = shown.thought {
            turn.think(thought)?;
        }
        if let Some(text) = shown.text {
            turn.say(text)?;
        }
        if let Some(overrun) = hold.and_then(|hold| hold.streamed(accumulator.generated())) {
            // Its tool calls may be cut short: never run them.
            let mut reply = accumulator.finish(String::new);
            reply.tool_calls.clear();
            return Ok(Streamed::OverBudget { reply, overrun });
        }
    }
    Ok(Streamed::Complete(accumulator.finish(|| {
        format!("call_{}", uuid::Uuid::new_v4().simple())
    })))
}
