//! The stdin side: a task reads lines, records each message in `--log` the moment it arrives
//! (even while the script is busy, e.g. gated in `session/new`), and queues it for the script.
//!
//! Stdin EOF is recorded as the log line `eof` and closes the queue; what EOF means for the
//! process is the script's decision (see `agent::EofPolicy`), not the reader's.

use std::collections::VecDeque;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use super::files::Log;
use super::wire::Inbound;

/// Messages from the client, plus those a waiting script step set aside for the main loop.
pub(super) struct Inbox {
    fresh: mpsc::UnboundedReceiver<Inbound>,
    deferred: VecDeque<Inbound>,
}

impl Inbox {
    /// Starts the reader task; must be called inside the tokio runtime.
    #[must_use]
    pub(super) fn spawn(log: Log) -> Self {
        let (sender, fresh) = mpsc::unbounded_channel();
        tokio::spawn(read_stdin(log, sender));
        Self {
            fresh,
            deferred: VecDeque::new(),
        }
    }

    /// The next deferred message, else the next fresh one; `None` once stdin is at EOF and
    /// everything has been handed out.
    pub(super) async fn next(&mut self) -> Option<Inbound> {
        match self.deferred.pop_front() {
            Some(message) => Some(message),
            None => self.fresh.recv().await,
        }
    }

    /// The next message from stdin, ignoring deferred ones. Cancel-safe, so a script can race
    /// it against a timer.
    pub(super) async fn next_fresh(&mut self) -> Option<Inbound> {
        self.fresh.recv().await
    }

    /// Sets `message` aside for the main loop.
    pub(super) fn defer(&mut self, message: Inbound) {
        self.deferred.push_back(message);
    }
}

async fn read_stdin(log: Log, sender: mpsc::UnboundedSender<Inbound>) {
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        line.clear();
        match stdin.read_until(b'\n', &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                eprintln!("mock: reading stdin failed, treating it as EOF: {error}");
                break;
            }
        }
        let text = String::from_utf8_lossy(&line);
        let Some(message) = Inbound::parse(text.trim_end()) else {
            if !text.trim().is_empty() {
                eprintln!("mock: ignoring a stdin line that is not JSON-RPC: {text:?}");
            }
            continue;
        };
        log.line(&message.log_line());
        if sender.send(message).is_err() {
            return;
        }
    }
    log.line("eof");
}
