//! `--permission ask`: each permission request put to the person on the terminal (`/dev/tty`),
//! or, without one, rejected as the policy would, said once on stderr.

use protocol::report::printable;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use acp_host::permission::{Decision, DecisionFuture, PermissionHandler};
use protocol::permission::{Answer, DecidedBy, PermissionPolicy, PermissionRequest};

/// `--permission ask`'s handler: the terminal, or without one the policy.
pub(super) fn handler() -> Arc<dyn PermissionHandler> {
    TerminalAsker::open().map_or_else(
        || Arc::new(NoTerminal::default()) as Arc<dyn PermissionHandler>,
        |asker| Arc::new(asker) as Arc<dyn PermissionHandler>,
    )
}

/// `--permission ask` with no terminal to ask on: rejects like the policy, and says so on stderr
/// at the first request (once, not per request; a run that asks nothing says nothing).
#[derive(Default)]
pub(super) struct NoTerminal {
    said: AtomicBool,
}

impl PermissionHandler for NoTerminal {
    fn decide(&self, request: PermissionRequest) -> DecisionFuture {
        if !self.said.swap(true, Ordering::Relaxed) {
            note!(
                "acp-host: --permission ask: no terminal to ask on (/dev/tty cannot be opened); \
                 rejecting the agent's permission requests"
            );
        }
        PermissionPolicy::Ask.decide(request)
    }
}

/// Asks on the controlling terminal (`/dev/tty`), so it works even when stdin carries the prompt.
pub(super) struct TerminalAsker {
    tty: Arc<Mutex<std::fs::File>>,
}

impl TerminalAsker {
    pub(super) fn open() -> Option<TerminalAsker> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .ok()
            .map(|tty| TerminalAsker {
                tty: Arc::new(Mutex::new(tty)),
            })
    }
}

impl PermissionHandler for TerminalAsker {
    fn decide(&self, request: PermissionRequest) -> DecisionFuture {
        let tty = Arc::clone(&self.tty);
        // A plain thread, not spawn_blocking: a question nobody answers must not hold up runtime
        // shutdown. The run drops the receiver when it cancels the turn meanwhile.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ask(&tty, &request));
        });
        Box::pin(async move {
            Decision {
                answer: if rx.await.unwrap_or(false) {
                    Answer::Allow
                } else {
                    Answer::Reject
                },
                decided_by: DecidedBy::User,
            }
        })
    }
}

/// `true` when the user typed y or yes.
fn ask(tty: &Mutex<std::fs::File>, request: &PermissionRequest) -> bool {
    let mut tty = tty.lock().unwrap_or_else(PoisonError::into_inner);
    let question = format!(
        "acp-host: allow {} \"{}\"? [y/N] ",
        printable(request.tool_kind.as_deref().unwrap_or("tool call")),
        printable(request.title.as_deref().unwrap_or("(untitled)"))
    );
    if tty.write_all(question.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = tty.read(&mut byte) {
        if byte[0] == b'\n' {
            break;
        }
        answer.push(byte[0]);
    }
    matches!(
        String::from_utf8_lossy(&answer)
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "y" | "yes"
    )
}
