//! `sdk-agent [N] [B]`: the benchmarks' SDK-based trivial agent, the shape of the ACP Rust SDK's
//! streaming example agent: the SDK's `Agent` builder on a multi-thread tokio runtime, answering
//! `initialize` and `session/new`, and a prompt with N `agent_message_chunk` updates of B bytes
//! (default 1 of 16) before `end_turn`. It is what a typical agent built on the SDK costs, beside
//! `bench-agent` (no SDK, no serde), so `scripts/bench` can tell a client's own cost from the
//! agent's.

#![expect(
    clippy::print_stderr,
    reason = "a benchmark tool reporting its own failures"
)]

use std::process::ExitCode;

use agent_client_protocol::v1::schema::{
    AgentCapabilities, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse,
    NewSessionRequest, NewSessionResponse, PromptRequest, PromptResponse, SessionNotification,
    SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, on_receive_request};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut number = |default: usize| {
        args.next()
            .map_or(Some(default), |arg| arg.parse::<usize>().ok())
    };
    let (Some(chunks), Some(bytes)) = (number(1), number(16)) else {
        eprintln!("usage: sdk-agent [CHUNKS] [BYTES]");
        return ExitCode::from(2);
    };
    let text = "x".repeat(bytes);
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    let served = Agent
        .v1()
        .name("sdk-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(AgentCapabilities::new()),
                )
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: NewSessionRequest, responder, _cx| {
                responder.respond(NewSessionResponse::new("s"))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                for _ in 0..chunks {
                    cx.send_notification(SessionNotification::new(
                        request.session_id.clone(),
                        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
                            TextContent::new(text.clone()),
                        ))),
                    ))?;
                }
                responder.respond(PromptResponse::new(StopReason::EndTurn))
            },
            on_receive_request!(),
        )
        .connect_to(transport)
        .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sdk-agent: {error}");
            ExitCode::FAILURE
        }
    }
}
