//! What `acp-host run` shows of a run: the agent's message text on stdout as it arrives (human
//! mode) or one NDJSON event per line and the result record last (`--json`); under `--verbose`,
//! thoughts, tool calls, plans and children's activity on stderr.
//!
//! Invariants: the renderer runs on the library's observers' thread, so a write blocked on a
//! stalled reader slows the agent down and never a signal or the timeout; text goes out in pieces
//! of at least [`OUT_BUFFER_BYTES`] (or when a burst of events ends), and a record is serialized
//! straight into those pieces, never copied whole; once stdout is closed nothing more is written
//! and the run goes on; what it remembers (children's names, tool call titles) is bounded; while
//! the live view's tree is drawn on the terminal stdout writes to, the text is written by the
//! view's thread instead, whole lines with the tree hidden meanwhile (`live`).

use protocol::report::printable;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use acp_host::run::{Observer, ObserverError};
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, SessionUpdate, SubagentUpdate, ToolCallStatus,
};
use protocol::events::{Event, ResultRecord};
use protocol::permission::Outcome;
use protocol::result::RunResult;
use protocol::status::Status;

use crate::cli::{Written, write_stdout};

/// Stdout text is written in pieces of at least this size while the agent streams.
const OUT_BUFFER_BYTES: usize = 64 * 1024;

/// The renderer's pending text as a writer: appends, and writes out whenever a piece is
/// complete; a slice larger than a piece (a long string) goes to stdout without being copied.
struct Chunked<'a> {
    renderer: &'a Renderer,
    pending: &'a mut Vec<u8>,
    /// Whether part of the current line already went out (it can no longer be taken back).
    flushed: bool,
}

impl Write for Chunked<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pending.len() + buf.len() < OUT_BUFFER_BYTES {
            self.pending.extend_from_slice(buf);
            return Ok(buf.len());
        }
        self.flushed = true;
        self.renderer.write_out(self.pending);
        if buf.len() >= OUT_BUFFER_BYTES {
            self.renderer.emit_out(buf);
        } else {
            self.pending.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders events as they arrive: the message text (human) or NDJSON (`--json`).
pub(super) struct Renderer {
    json: bool,
    verbose: bool,
    /// A structured answer is asked for: in human mode stdout carries only its value, so the
    /// agent's text goes to stderr (with --verbose) instead.
    structured: bool,
    /// Set once stdout is gone (e.g. `| head`): stop writing, keep running.
    stdout_closed: AtomicBool,
    /// Text not yet written: filled by a burst of events, written when the burst ends
    /// ([`Observer::flush`]) or [`OUT_BUFFER_BYTES`] is reached, so a stream of small chunks does
    /// not cost one write per chunk.
    pending: Mutex<Vec<u8>>,
    /// Whether the last text written ended with a newline (for the final newline on a TTY).
    ended_with_newline: Mutex<bool>,
    /// The names of the child sessions announced so far, by session id (`--verbose` names a
    /// child in every line about it; the library tracks a bounded number of children).
    child_names: Mutex<std::collections::HashMap<String, String>>,
    /// The titles of the tool calls announced so far, by session and call id (`--verbose` names
    /// the call in a status-only update), at most [`MAX_TITLES`].
    titles: Mutex<std::collections::HashMap<(Option<String>, String), String>>,
    /// The live view drawn on the terminal, if any: while it is up, its thread writes the text
    /// (whole lines, with the tree hidden meanwhile).
    live: std::sync::OnceLock<Arc<dyn Drawn>>,
}

/// What the renderer needs of a view drawn on the terminal (the live tree, `super::live`): a trait,
/// so the renderer names no view and the view points down at the renderer alone.
pub(super) trait Drawn: Send + Sync {
    /// Whether it is drawn at all (not stopped).
    fn drawing(&self) -> bool;
    /// Whether it is drawn on the terminal stdout writes to: stdout's text then waits for it.
    fn holds(&self) -> bool;
    /// Runs `write` with the view hidden.
    fn around(&self, write: &mut dyn FnMut());
}

/// The most tool call titles `--verbose` remembers: later calls' updates show their id.
const MAX_TITLES: usize = 1024;

impl Renderer {
    pub(super) fn new(json: bool, verbose: bool, structured: bool) -> Self {
        Renderer {
            json,
            verbose,
            structured,
            stdout_closed: AtomicBool::new(false),
            pending: Mutex::default(),
            ended_with_newline: Mutex::new(true),
            child_names: Mutex::default(),
            titles: Mutex::default(),
            live: std::sync::OnceLock::new(),
        }
    }

    /// From now on, while `live`'s tree is drawn, stdout text on the same terminal waits for its
    /// thread, and a line for stderr hides the tree meanwhile.
    pub(super) fn hold_for(&self, live: Arc<dyn Drawn>) {
        let _ = self.live.set(live);
    }

    /// The live view, while its tree is drawn on the terminal stdout writes to.
    fn held(&self) -> Option<&dyn Drawn> {
        self.live
            .get()
            .map(AsRef::as_ref)
            .filter(|live| live.holds())
    }

    /// `live`'s tick: the whole lines of the pending text, written with the tree hidden.
    pub(super) fn write_held(&self, live: &dyn Drawn) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let whole = pending
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        if whole > 0 {
            let rest = pending.split_off(whole);
            live.around(&mut || self.emit(&pending));
            *pending = rest;
        }
    }

    /// [`Renderer::emit`], with the live view's tree hidden meanwhile.
    fn emit_out(&self, bytes: &[u8]) {
        match self.held() {
            Some(live) => live.around(&mut || self.emit(bytes)),
            None => self.emit(bytes),
        }
    }

    fn write_stdout(&self, text: &str) {
        if self.stdout_closed.load(Ordering::Relaxed) {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.extend_from_slice(text.as_bytes());
        if pending.len() >= OUT_BUFFER_BYTES {
            self.write_out(&mut pending);
        }
    }

    /// Writes what is pending (blocking while the reader is slow: this is the backpressure).
    fn write_out(&self, pending: &mut Vec<u8>) {
        self.emit_out(pending);
        pending.clear();
        if pending.capacity() > OUT_BUFFER_BYTES * 2 {
            *pending = Vec::new();
        }
    }

    /// Writes `bytes` to stdout unless it is gone.
    fn emit(&self, bytes: &[u8]) {
        if bytes.is_empty() || self.stdout_closed.load(Ordering::Relaxed) {
            return;
        }
        match write_stdout(bytes) {
            Ok(Written::Done) => {}
            Ok(Written::Closed) => self.stdout_closed.store(true, Ordering::Relaxed),
            Err(err) => {
                // The run goes on (its result and exit code still matter); the output is lost.
                tracing::warn!(%err, "stopped writing the agent's output");
                self.stdout_closed.store(true, Ordering::Relaxed);
            }
        }
    }

    /// One NDJSON line, serialized straight into the pending text and written out in pieces of
    /// [`OUT_BUFFER_BYTES`] as it grows: a record holding megabytes of output (the result, the
    /// end event) is never copied whole into memory again.
    fn write_json(&self, value: &impl serde::Serialize) {
        if self.stdout_closed.load(Ordering::Relaxed) {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let before = pending.len();
        let mut out = Chunked {
            renderer: self,
            pending: &mut pending,
            flushed: false,
        };
        if let Err(err) = serde_json::to_writer(&mut out, value) {
            tracing::warn!(%err, "cannot serialize an event");
            if !out.flushed {
                pending.truncate(before);
                return;
            }
        }
        pending.push(b'\n');
        if pending.len() >= OUT_BUFFER_BYTES {
            self.write_out(&mut pending);
        }
    }

    /// Whether [`Renderer::finish`] without a record or a value line would write nothing: no text
    /// pending, and no final newline owed to a terminal.
    /// Never waits: a lock held by a write still blocked on a stalled reader means "not nothing".
    pub(super) fn nothing_to_finish(&self) -> bool {
        let pending = self.pending.try_lock().is_ok_and(|p| p.is_empty());
        let newline = self.ended_with_newline.try_lock().is_ok_and(|g| *g);
        pending && (self.structured || newline || !std::io::stdout().is_terminal())
    }

    /// The last stdout write: the result record, the structured value's line, or the final newline
    /// on a terminal. May block on a stalled reader, so it runs off the main thread.
    pub(super) fn finish(&self, record: Option<RunResult>, value_line: Option<&str>) {
        if let Some(result) = record {
            self.write_json(&ResultRecord::Result(result));
        } else if let Some(line) = value_line {
            self.write_stdout(line);
        } else if !self.structured {
            let newline = *self
                .ended_with_newline
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !newline && std::io::stdout().is_terminal() {
                self.write_stdout("\n");
            }
        }
        Observer::flush(self);
    }

    /// What went wrong, on stderr (human mode; `--json` has it in the result record).
    pub(super) fn report(&self, result: &RunResult) {
        for warning in &result.warnings {
            note!("acp-host: warning: {warning}");
        }
        // A sandbox that did not hold in full is said whenever it ran (best effort).
        if let Some(sandbox) = &result.sandbox {
            if self.verbose {
                note!("acp-host: {}", sandbox.describe());
            } else if sandbox.enforced != protocol::sandbox::Enforced::Full {
                note!("acp-host: warning: {}", sandbox.describe());
            }
        }
        // A worktree is always said: where the work is, or that there was none.
        if let Some(worktree) = &result.worktree {
            note!("acp-host: {}", worktree.describe());
        }
        // What the run spent: under --verbose, or whenever a person watches stderr.
        if let Some(usage) = &result.usage
            && (self.verbose || std::io::stderr().is_terminal())
        {
            note!("acp-host: usage: {}", usage.describe());
        }
        if result.status == Status::Completed {
            return;
        }
        if let Some(error) = &result.error {
            note!("acp-host: {}: {error}", result.status);
        } else {
            note!("acp-host: {}", result.status);
        }
        if result.status == Status::Error && !self.verbose && !result.stderr_tail.trim().is_empty()
        {
            note!("acp-host: agent stderr (last lines):");
            for line in last_lines(&result.stderr_tail, 20) {
                note!("  {line}");
            }
        }
    }

    /// One update in human mode: our session's text on stdout; under `--verbose`, the rest on
    /// stderr, a child's activity prefixed with its name (`child`).
    fn human_update(&self, update: &SessionUpdate, child: Option<&str>) {
        let (kind, text) = kind_and_text(update);
        if !self.verbose && child.is_some() {
            return;
        }
        let prefix = child.map_or_else(String::new, |name| format!("[{name}] "));
        match (kind, text) {
            ("subagent_update", _) => {
                if let SessionUpdate::SubagentUpdate(announced) = update {
                    self.subagent_line(announced, &prefix);
                }
            }
            ("agent_message_chunk" | "agent_thought_chunk", Some(text))
                if child.is_some() && !text.trim().is_empty() =>
            {
                note!("acp-host: {prefix}{}", text.trim_end());
            }
            ("agent_message_chunk" | "agent_thought_chunk", Some(_)) if child.is_some() => {}
            // Stdout carries only the structured value.
            ("agent_message_chunk", Some(text)) if self.structured && self.verbose => {
                note_text!("{text}");
            }
            ("agent_message_chunk", Some(_)) if self.structured => {}
            ("agent_message_chunk", Some(text)) => {
                if !text.is_empty() {
                    *self
                        .ended_with_newline
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = text.ends_with('\n');
                }
                self.write_stdout(text);
            }
            _ if !self.verbose => {}
            ("agent_thought_chunk", Some(text)) => note_text!("{text}"),
            ("tool_call" | "tool_call_update", _) => {
                let (title, status) = match update {
                    // A pending status is the default, not sent: shown as none.
                    SessionUpdate::ToolCall(call) => {
                        self.remember_title(child, &call.tool_call_id.0, &call.title);
                        (
                            Some(call.title.clone()),
                            Some(call.status).filter(|s| *s != ToolCallStatus::Pending),
                        )
                    }
                    SessionUpdate::ToolCallUpdate(call) => {
                        let id = &call.tool_call_id.0;
                        if let Some(title) = &call.fields.title {
                            self.remember_title(child, id, title);
                        }
                        // A status-only update names the call by the title it was announced
                        // with (its id when that is unknown).
                        let title = call
                            .fields
                            .title
                            .clone()
                            .or_else(|| call.fields.status.map(|_| self.title_of(child, id)));
                        (title, call.fields.status)
                    }
                    _ => (None, None),
                };
                // An update carrying neither (streamed content of a card) says nothing here.
                if title.is_some() || status.is_some() {
                    note!(
                        "acp-host: {prefix}[{kind}] {} {}",
                        title.as_deref().unwrap_or(""),
                        status.map_or_else(String::new, status_name)
                    );
                }
            }
            ("plan", _) => {
                if let SessionUpdate::Plan(plan) = update {
                    note!(
                        "acp-host: {prefix}[plan] {}",
                        serde_json::to_string(&plan.entries).unwrap_or_default()
                    );
                }
            }
            _ => {}
        }
    }
}

impl Renderer {
    fn remember_title(&self, child: Option<&str>, id: &str, title: &str) {
        let mut titles = self.titles.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (child.map(str::to_owned), id.to_owned());
        if titles.len() < MAX_TITLES || titles.contains_key(&key) {
            titles.insert(key, title.to_owned());
        }
    }

    /// The title tool call `id` was announced with, else its id.
    fn title_of(&self, child: Option<&str>, id: &str) -> String {
        let titles = self.titles.lock().unwrap_or_else(PoisonError::into_inner);
        titles
            .get(&(child.map(str::to_owned), id.to_owned()))
            .cloned()
            .unwrap_or_else(|| id.to_owned())
    }

    /// A child's name for a line about it (its session id when it has none).
    fn child_name(&self, session_id: &str) -> String {
        self.child_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session_id)
            .cloned()
            .unwrap_or_else(|| session_id.to_owned())
    }

    /// `--verbose`: a child announced (`[subagent] NAME started: TASK`) or ended
    /// (`[subagent] NAME completed (end_turn)`), on the session it was announced on (`prefix`).
    fn subagent_line(&self, update: &SubagentUpdate, prefix: &str) {
        let id: &str = &update.session_id.0;
        let name = {
            let mut names = self
                .child_names
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(title) = update.title.value() {
                names.insert(id.to_owned(), title.clone());
            }
            names.get(id).cloned().unwrap_or_else(|| id.to_owned())
        };
        if !self.verbose {
            return;
        }
        let state = update
            .state
            .value()
            .and_then(protocol::child_session::ChildState::from_update);
        match state {
            Some((state, stop_reason)) if state.is_final() => {
                let reason = stop_reason.map_or_else(String::new, |r| format!(" ({r})"));
                let failure = update
                    .state
                    .value()
                    .and_then(protocol::child_session::Failure::of)
                    .unwrap_or_default();
                let error = failure.error.map_or_else(String::new, |e| format!(": {e}"));
                note!("acp-host: {prefix}[subagent] {name} {state}{reason}{error}");
                if let Some(stderr) = failure.stderr_tail {
                    for line in stderr.lines() {
                        note!("acp-host: {prefix}[subagent] {name} stderr: {line}");
                    }
                }
            }
            _ => {
                let task = update
                    .description
                    .value()
                    .map_or_else(String::new, |task| format!(": {task}"));
                note!("acp-host: {prefix}[subagent] {name} started{task}");
            }
        }
    }
}

impl Observer for Renderer {
    fn flush(&self) {
        // While the live tree is drawn, its thread writes the text.
        if self.held().is_some() {
            return;
        }
        self.write_out(&mut self.pending.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        if let Event::Stderr { line, .. } = event {
            // Not streamed under --json: stdout stays the conversation; stderrTail keeps the end.
            if self.verbose {
                note!("{line}");
            }
            return Ok(());
        }
        if self.json {
            self.write_json(event);
            return Ok(());
        }
        match event {
            Event::Update {
                update,
                session_id,
                subagent,
                ..
            } => self.human_update(
                update,
                session_id
                    .as_deref()
                    .map(|id| subagent.as_deref().unwrap_or(id)),
            ),
            Event::Permission { decision, .. } => {
                let answer = match &decision.outcome {
                    Outcome::Selected { option_id, .. } => format!("selected {option_id}"),
                    Outcome::Cancelled => "cancelled".to_owned(),
                };
                let prefix = decision
                    .session_id
                    .as_deref()
                    .map_or_else(String::new, |id| format!("[{}] ", self.child_name(id)));
                let said = format!(
                    "acp-host: {prefix}permission {} for {} ({}): {answer} [by {}]",
                    decision.verdict.as_str(),
                    printable(decision.title.as_deref().unwrap_or("a tool call")),
                    printable(decision.tool_kind.as_deref().unwrap_or("unknown kind")),
                    decision.decided_by.as_str()
                );
                if let Some(live) = self.live.get().filter(|live| live.drawing()) {
                    live.around(&mut || note!("{said}"));
                } else {
                    note!("{said}");
                }
            }
            Event::Start(start) if self.verbose => note!(
                "acp-host: agent {} ready (pid {}, session {})",
                start.agent,
                start.pid.unwrap_or_default(),
                start.session_id
            ),
            Event::Start(_) | Event::End(_) | Event::Stderr { .. } => {}
        }
        Ok(())
    }
}

/// An update's `sessionUpdate` tag, for the kinds shown (empty for the others), and the text of a
/// chunk carrying text.
fn kind_and_text(update: &SessionUpdate) -> (&'static str, Option<&str>) {
    match update {
        SessionUpdate::AgentMessageChunk(chunk) => ("agent_message_chunk", chunk_text(chunk)),
        SessionUpdate::AgentThoughtChunk(chunk) => ("agent_thought_chunk", chunk_text(chunk)),
        SessionUpdate::UserMessageChunk(chunk) => ("user_message_chunk", chunk_text(chunk)),
        SessionUpdate::ToolCall(_) => ("tool_call", None),
        SessionUpdate::ToolCallUpdate(_) => ("tool_call_update", None),
        SessionUpdate::Plan(_) => ("plan", None),
        SessionUpdate::SubagentUpdate(_) => ("subagent_update", None),
        _ => ("", None),
    }
}

/// The text of a chunk carrying text.
fn chunk_text(chunk: &ContentChunk) -> Option<&str> {
    match &chunk.content {
        ContentBlock::Text(text) => Some(text.text.as_str()),
        _ => None,
    }
}

/// A tool call status's wire name (`in_progress`, ...).
fn status_name(status: ToolCallStatus) -> String {
    match status {
        ToolCallStatus::Pending => "pending".to_owned(),
        ToolCallStatus::InProgress => "in_progress".to_owned(),
        ToolCallStatus::Completed => "completed".to_owned(),
        ToolCallStatus::Failed => "failed".to_owned(),
        // A status of a later schema: its serialized name.
        future => serde_json::to_value(future)
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_default(),
    }
}

/// The last `n` lines of `text` (all of them when it has fewer).
fn last_lines(text: &str, n: usize) -> impl Iterator<Item = &str> {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(n);
    lines.into_iter().skip(skip)
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{ImageContent, Plan, TextContent};

    use super::*;

    fn text_chunk(text: &str) -> ContentChunk {
        ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
    }

    #[test]
    fn the_shown_kinds_are_the_updates_wire_tags_and_only_text_chunks_have_text() {
        let message = SessionUpdate::AgentMessageChunk(text_chunk("hi"));
        assert_eq!(kind_and_text(&message), ("agent_message_chunk", Some("hi")));
        let thought = SessionUpdate::AgentThoughtChunk(text_chunk("hmm"));
        assert_eq!(
            kind_and_text(&thought),
            ("agent_thought_chunk", Some("hmm"))
        );
        let image = SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Image(
            ImageContent::new("AAAA", "image/png"),
        )));
        assert_eq!(kind_and_text(&image), ("agent_message_chunk", None));
        let plan = SessionUpdate::Plan(Plan::new(Vec::new()));
        assert_eq!(kind_and_text(&plan), ("plan", None));
        for update in [message, thought, plan] {
            let tag = serde_json::to_value(&update).unwrap()["sessionUpdate"].clone();
            assert_eq!(tag, kind_and_text(&update).0);
        }
    }

    #[test]
    fn a_status_is_named_as_on_the_wire() {
        for status in [
            ToolCallStatus::Pending,
            ToolCallStatus::InProgress,
            ToolCallStatus::Completed,
            ToolCallStatus::Failed,
        ] {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                status_name(status).as_str()
            );
        }
    }

    #[test]
    fn last_lines_keeps_the_end() {
        let text = "one\ntwo\nthree\n";
        assert_eq!(last_lines(text, 2).collect::<Vec<_>>(), ["two", "three"]);
        assert_eq!(
            last_lines(text, 5).collect::<Vec<_>>(),
            ["one", "two", "three"]
        );
        assert_eq!(last_lines("", 3).count(), 0);
    }

    #[test]
    fn titles_are_kept_per_session_up_to_the_cap_and_an_unknown_call_is_named_by_its_id() {
        let renderer = Renderer::new(false, true, false);
        renderer.remember_title(None, "call-1", "Read a.txt");
        renderer.remember_title(Some("child"), "call-1", "Write b.txt");
        assert_eq!(renderer.title_of(None, "call-1"), "Read a.txt");
        assert_eq!(renderer.title_of(Some("child"), "call-1"), "Write b.txt");
        assert_eq!(renderer.title_of(None, "call-2"), "call-2");
        for n in 0..MAX_TITLES {
            renderer.remember_title(None, &format!("more-{n}"), "more");
        }
        // Full: a new call is not remembered, a known one still takes its new title.
        renderer.remember_title(None, "late", "Late");
        assert_eq!(renderer.title_of(None, "late"), "late");
        renderer.remember_title(None, "call-1", "Read c.txt");
        assert_eq!(renderer.title_of(None, "call-1"), "Read c.txt");
    }
}
