//! `sdk-client --command 'PROGRAM ARG...' PROMPT`: the benchmarks' SDK peer, the shape of the ACP
//! Rust SDK's `yolo_one_shot_client` example: clap, a multi-thread tokio runtime, the SDK's
//! `Client` builder printing every update with `{:?}` and approving permission requests by kind,
//! then initialize, session/new and one prompt. It spawns the agent with tokio (the example's
//! `AcpAgent` needs the SDK's `process` feature, which brings a second process runtime) and waits
//! for it to exit once its stdin is closed, as the example's transport does.

#![expect(
    clippy::print_stderr,
    clippy::print_stdout,
    reason = "a benchmark tool: it prints the updates, as the SDK's example does"
)]

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PermissionOptionKind, PromptRequest,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, TextContent,
};
use agent_client_protocol::{
    Agent, ByteStreams, Client, on_receive_notification, on_receive_request,
};
use clap::Parser;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// A one-shot ACP client, the SDK example's shape.
#[derive(Parser)]
#[command(name = "sdk-client")]
struct Cli {
    /// The agent's command line (split as a shell would, without a shell)
    #[arg(short, long)]
    command: String,
    /// The prompt
    prompt: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sdk-client: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let words = shell_words::split(&cli.command)?;
    let (program, args) = words.split_first().ok_or("--command is empty")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the agent's pipes are missing".into());
    };
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let prompt = cli.prompt.clone();
    Client
        .v1()
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                println!("{:?}", notification.update);
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let chosen = [
                    PermissionOptionKind::AllowOnce,
                    PermissionOptionKind::AllowAlways,
                ]
                .iter()
                .find_map(|kind| request.options.iter().find(|option| option.kind == *kind));
                responder.respond(RequestPermissionResponse::new(match chosen {
                    Some(option) => RequestPermissionOutcome::Selected(
                        SelectedPermissionOutcome::new(option.option_id.clone()),
                    ),
                    None => RequestPermissionOutcome::Cancelled,
                }))
            },
            on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            eprintln!("agent: {:?}", init.agent_info);
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
            let session = cx
                .send_request(NewSessionRequest::new(cwd))
                .block_task()
                .await?;
            let response = cx
                .send_request(PromptRequest::new(
                    session.session_id,
                    vec![ContentBlock::Text(TextContent::new(prompt))],
                ))
                .block_task()
                .await?;
            eprintln!("stop reason: {:?}", response.stop_reason);
            Ok(())
        })
        .await?;
    // The transport (and with it the agent's stdin) is gone: wait for the agent to exit.
    child.wait().await?;
    Ok(())
}
