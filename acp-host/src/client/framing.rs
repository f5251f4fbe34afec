//! Framing of the agent's stdout and the one task that reads it ([`pump`]): lines split without
//! copies ([`Reader`]), each classified ([`classify`]), `session/update` notifications handled
//! on the spot, every other frame handed to the SDK.
//!
//! Invariants:
//! - one task reads the agent's stdout: `session/update` notifications are decoded and handled
//!   there ([`super::fast`]), everything else goes to the SDK through a one-frame channel, so a
//!   slow consumer stops the reading (the agent's pipe fills) instead of growing a queue;
//! - that task keeps draining (and discarding) the agent's stdout after the drive ended, until EOF
//!   or teardown ends it: an agent flushing a last line during the EOF grace never dies of EPIPE;
//! - a non-JSON line is skipped (and counted), never fatal; a `{` line that is not valid UTF-8 is
//!   decoded lossily (with a warning); a batch array is answered with an "invalid request" error;
//! - a frame larger than the drive's `max_frame_bytes` ends the run with a clear error instead of
//!   eating memory, and a buffer a large frame grew is released afterwards.

use std::sync::Arc;

use futures::SinkExt;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

use super::shared::{Shared, handle_update};
use super::{DriveEvents, fast};

/// A read buffer grown past this by a large frame is released afterwards, so one 8 MiB frame does
/// not keep 8 MiB for the rest of the run.
const KEEP_BUFFER_BYTES: usize = 1024 * 1024;
/// Read size on the agent's stdout.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What one line of the agent's stdout is.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Blank,
    /// Not JSON-RPC (a banner, a log line): skipped and counted.
    Garbage,
    /// A JSON-RPC batch: not part of ACP, answered with an error.
    Batch,
    /// A JSON object; `lossy` when invalid UTF-8 had to be replaced.
    Frame {
        text: String,
        lossy: bool,
    },
}

/// Classifies the line in `buf`, moving a frame out without copying when it needs no trimming.
/// `buf` keeps a garbage line for the caller to report.
fn classify(buf: &mut Vec<u8>) -> Line {
    let trimmed = buf.trim_ascii();
    match trimmed.first() {
        None => {
            buf.clear();
            Line::Blank
        }
        Some(b'[') => Line::Batch,
        Some(b'{') => {
            let whole = trimmed.len() == buf.len();
            match std::str::from_utf8(trimmed) {
                Ok(_) if whole => Line::Frame {
                    // Checked just above: the whole line is valid UTF-8.
                    text: String::from_utf8(std::mem::take(buf)).unwrap_or_default(),
                    lossy: false,
                },
                Ok(text) => Line::Frame {
                    text: text.to_owned(),
                    lossy: false,
                },
                Err(_) => Line::Frame {
                    text: String::from_utf8_lossy(trimmed).into_owned(),
                    lossy: true,
                },
            }
        }
        Some(_) => Line::Garbage,
    }
}

/// The answer to a batch array: ACP has no batches, and a silent drop would leave the agent
/// waiting for answers forever.
fn batch_error() -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32600,
            "message": "batch requests are not supported by this ACP client; send one message per line",
        },
    })
    .to_string()
}

/// The agent's stdout, split into lines. A line that lies whole in one read is handed out where
/// it lies, not copied; a line spread over reads is put together in `joined`.
pub(super) struct Reader {
    stdout: pipe::Receiver,
    /// What the last read got (its length); [`READ_BUFFER_BYTES`] of capacity, read into without
    /// zeroing it first, so a run of small frames touches one page of it, not sixteen.
    data: Vec<u8>,
    /// The unread part of `data` is `start..end`.
    start: usize,
    end: usize,
    joined: Vec<u8>,
    /// Where the current line is: `data[range]`, or `joined` when `None`.
    current: Option<std::ops::Range<usize>>,
    max: usize,
}

/// The first `\n` in `bytes`. On x86-64 this is memchr's SSE2 search, which every x86-64 CPU
/// has, chosen at compile time: `memchr::memchr` picks AVX2 at run time, and its first call asks
/// the CPU for every feature it has (`cpuid`, which traps to the hypervisor on a virtual machine:
/// about 0.1 ms of a one-shot run there, measured), for no gain on lines of a few kilobytes.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if let Some(newline) = memchr::arch::x86_64::sse2::memchr::One::new(b'\n') {
        return newline.find(bytes);
    }
    memchr::memchr(b'\n', bytes)
}

impl Reader {
    pub(super) fn new(stdout: pipe::Receiver, max: usize) -> Self {
        Reader {
            stdout,
            data: Vec::with_capacity(READ_BUFFER_BYTES),
            start: 0,
            end: 0,
            joined: Vec::new(),
            current: None,
            max,
        }
    }

    /// Finds the next `\n`-terminated line ([`Reader::line`], without the newline); `false` at
    /// EOF. `before_read` runs whenever the pipe itself is about to be read (which may wait).
    async fn next_line(&mut self, before_read: impl Fn()) -> std::io::Result<bool> {
        self.release();
        self.joined.clear();
        self.current = None;
        loop {
            if self.start == self.end {
                before_read();
                (self.start, self.end) = (0, 0);
                self.data.clear();
                // Into the capacity (never beyond it: the buffer does not grow).
                let n = self.stdout.read_buf(&mut self.data).await?;
                if n == 0 {
                    return Ok(!self.joined.is_empty());
                }
                self.end = n;
            }
            let available = &self.data[self.start..self.end];
            let (chunk, found) = match find_newline(available) {
                Some(i) => (&available[..i], true),
                None => (available, false),
            };
            if self.joined.len() + chunk.len() > self.max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("agent sent a frame larger than {} bytes", self.max),
                ));
            }
            let from = self.start;
            self.start += chunk.len() + usize::from(found);
            if found && self.joined.is_empty() {
                self.current = Some(from..from + chunk.len());
                return Ok(true);
            }
            self.joined.extend_from_slice(chunk);
            if found {
                return Ok(true);
            }
        }
    }

    /// The current line (valid until the next [`Reader::next_line`]).
    fn line(&self) -> &[u8] {
        match &self.current {
            Some(range) => &self.data[range.clone()],
            None => &self.joined,
        }
    }

    /// The current line, owned.
    fn take_line(&mut self) -> Vec<u8> {
        match self.current.take() {
            Some(range) => self.data[range].to_vec(),
            None => std::mem::take(&mut self.joined),
        }
    }

    /// Lets go of a buffer a large frame grew, so one 8 MiB frame does not keep 8 MiB for the
    /// rest of the run.
    fn release(&mut self) {
        if self.joined.capacity() > KEEP_BUFFER_BYTES {
            self.joined = Vec::new();
        }
    }
}

/// Reads the agent's stdout for the whole life of the process: `session/update` notifications are
/// handled here, other frames go to the SDK one at a time; once the SDK is gone (the drive ended)
/// the rest is read and discarded until EOF or `drain_until`.
pub(super) async fn pump(
    mut reader: Reader,
    mut frames: futures::channel::mpsc::Sender<std::io::Result<String>>,
    replies: futures::channel::mpsc::UnboundedSender<String>,
    shared: Arc<Shared>,
    events: Arc<dyn DriveEvents>,
    drain_until: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            biased;
            () = drain_until.cancelled() => return,
            line = reader.next_line(|| events.flush()) => line,
        };
        match line {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                let _ = frames.send(Err(err)).await;
                return;
            }
        }
        if frames.is_closed() {
            continue;
        }
        // The hot path decodes from the read buffer itself: no copy of the line.
        let update = std::str::from_utf8(reader.line().trim_ascii())
            .ok()
            .and_then(fast::session_notification);
        if let Some(update) = update {
            let size = reader.line().len();
            // Released before the update is handled: a large frame is not held twice.
            reader.release();
            handle_update(&shared, events.as_ref(), update, size).await;
            continue;
        }
        let mut buf = reader.take_line();
        match classify(&mut buf) {
            Line::Blank => {}
            Line::Garbage => {
                shared.count_garbage_line();
                tracing::debug!(
                    line = %String::from_utf8_lossy(&buf[..buf.len().min(200)]),
                    "skipped a non-JSON line on the agent's stdout"
                );
            }
            Line::Batch => {
                tracing::warn!("the agent sent a JSON-RPC batch array; answered with an error");
                let _ = replies.unbounded_send(batch_error());
            }
            Line::Frame { text, lossy } => {
                if lossy {
                    tracing::warn!(
                        "the agent sent a frame that is not valid UTF-8; decoded it with \
                         replacement characters"
                    );
                }
                // Only a lossily decoded line can still be an update here.
                if lossy && let Some(update) = fast::session_notification(&text) {
                    let size = text.len();
                    drop(text);
                    handle_update(&shared, events.as_ref(), update, size).await;
                    continue;
                }
                events.flush();
                if frames.send(Ok(text)).await.is_err() {
                    // The drive ended: from now on the line is only drained.
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn lines_are_classified() {
        let mut buf = b"  \r".to_vec();
        assert_eq!(classify(&mut buf), Line::Blank);
        let mut buf = b"Loading model...".to_vec();
        assert_eq!(classify(&mut buf), Line::Garbage);
        assert_eq!(buf, b"Loading model...", "kept for the report");
        let mut buf = b"[{\"jsonrpc\":\"2.0\"}]".to_vec();
        assert_eq!(classify(&mut buf), Line::Batch);
        let mut buf = b"{\"a\":1}".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":1}".into(),
                lossy: false
            }
        );
        let mut buf = b" {\"a\":1}\r".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":1}".into(),
                lossy: false
            }
        );
        let mut buf = b"{\"a\":\"caf\xe9\"}".to_vec();
        assert_eq!(
            classify(&mut buf),
            Line::Frame {
                text: "{\"a\":\"caf\u{FFFD}\"}".into(),
                lossy: true
            }
        );
    }

    #[test]
    fn the_batch_answer_is_an_invalid_request_with_a_null_id() {
        let answer: Value = serde_json::from_str(&batch_error()).unwrap();
        assert_eq!(answer["id"], Value::Null);
        assert_eq!(answer["error"]["code"], -32600);
    }
}
