//! The live view of a run's children (`acp-host run --progress`): which children the agent
//! announced (ACP subagent sessions, nested ones under their parent), the state of each (queued,
//! running, awaiting approval, completed, failed, cancelled, disconnected), when it started and
//! ended, what it spent, and its last line of output. Fed by the run's [`Event`]s and by the
//! permission questions put to the person ([`Tree::asking`]); it draws nothing itself: it gives
//! the lines of the tree ([`Tree::lines`]) and one plain line per change of state.
//!
//! Invariants:
//! - pure: the caller passes the time (milliseconds since the run started), so a redraw is a
//!   function of the model and the clock;
//! - bounded: at most [`MAX_TRACKED`] children are tracked (later ones are counted, not kept), a
//!   name is cut at [`NAME_CHARS`] and a last line at [`LAST_LINE_CHARS`] characters, a line not
//!   yet ended included;
//! - nothing an agent sent reaches a terminal as a control character (escapes are shown escaped:
//!   [`printable`]);
//! - a final state sticks: a later snapshot does not revive a child;
//! - a child waiting for its session (acp-child's subagent tool call, titled `Subagent NAME: ...`,
//!   before the session it refers to is announced) is `queued`; once its session is announced
//!   the session's row takes its place.

use std::collections::HashMap;

use agent_client_protocol_schema::v1::{
    ContentBlock, SessionUpdate, SubagentUpdate, ToolCallContent, ToolCallStatus, ToolKind,
};

use crate::child_session::{ChildState, Failure};
use crate::events::Event;
use crate::report::printable;
use crate::usage::{Cost, Usage, thousands};

/// The most children tracked in one run; later ones are counted in [`Tree::untracked`] only.
pub const MAX_TRACKED: usize = 1024;
/// The most characters of a child's last line kept.
pub const LAST_LINE_CHARS: usize = 160;
/// The most characters of a child's name kept.
pub const NAME_CHARS: usize = 40;

/// The title acp-child gives a subagent's tool call before its session exists.
const QUEUED_PREFIX: &str = "Subagent ";

/// `--progress`: how a run's children are shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The tree on a terminal, plain lines otherwise.
    Auto,
    /// The tree, redrawn in place (on a terminal only: plain lines otherwise).
    Tree,
    /// One line per change of a child's state.
    Plain,
    Off,
}

impl Progress {
    /// What is shown (`Tree`, `Plain` or `Off`): a tree only on a terminal, so no escape code
    /// reaches a pipe or a file, and never beside `--verbose`'s lines (which it would overwrite);
    /// under `--verbose`, `auto` adds nothing to its own lines of each child's start and end.
    #[must_use]
    pub fn shown(self, stderr_terminal: bool, verbose: bool) -> Progress {
        match self {
            Progress::Auto | Progress::Tree if stderr_terminal && !verbose => Progress::Tree,
            Progress::Auto if verbose => Progress::Off,
            Progress::Off => Progress::Off,
            Progress::Auto | Progress::Tree | Progress::Plain => Progress::Plain,
        }
    }
}

/// A child's state as the live view shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveState {
    /// Asked for (a subagent tool call), its session not announced yet.
    Queued,
    Running,
    /// A permission question of the child waits for the person.
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
    /// The outcome is unknown: reported so by the agent, or the run ended first.
    Disconnected,
}

impl LiveState {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            LiveState::Queued => "queued",
            LiveState::Running => "running",
            LiveState::AwaitingApproval => "awaiting approval",
            LiveState::Completed => "completed",
            LiveState::Failed => "failed",
            LiveState::Cancelled => "cancelled",
            LiveState::Disconnected => "disconnected",
        }
    }

    /// Whether no further change is expected.
    #[must_use]
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            LiveState::Queued | LiveState::Running | LiveState::AwaitingApproval
        )
    }

    fn of(state: ChildState) -> LiveState {
        match state {
            ChildState::Running => LiveState::Running,
            ChildState::Completed => LiveState::Completed,
            ChildState::Failed => LiveState::Failed,
            ChildState::Cancelled => LiveState::Cancelled,
            ChildState::Disconnected => LiveState::Disconnected,
        }
    }
}

/// One child in the view.
#[derive(Debug, Clone)]
struct Child {
    /// The child's session id; `None` while it is queued (known by its tool call only).
    session_id: Option<String>,
    /// The row of the child it was announced on; `None` for the run's own session.
    parent: Option<usize>,
    depth: usize,
    name: String,
    state: LiveState,
    started_ms: u64,
    ended_ms: Option<u64>,
    tokens: Option<u64>,
    cost: Option<Cost>,
    /// Why it failed, when it said.
    error: Option<String>,
    last: String,
    /// Text of the line not yet ended.
    partial: String,
    /// Replaced by its session's row (a queued tool call that got its session).
    hidden: bool,
    /// The row of the session that took this queued row's place (shown where this one was).
    moved_to: Option<usize>,
}

/// The children of one run, in the order they were announced.
#[derive(Debug, Default)]
pub struct Tree {
    children: Vec<Child>,
    /// Rows by session id, and queued rows by `<session>\0<tool call id>`.
    index: HashMap<String, usize>,
    untracked: usize,
}

impl Tree {
    #[must_use]
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Whether any child was seen.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.children.iter().all(|child| child.hidden)
    }

    /// How many children were announced beyond [`MAX_TRACKED`].
    #[must_use]
    pub fn untracked(&self) -> usize {
        self.untracked
    }

    /// Whether some child is still queued, running or waiting for an approval.
    #[must_use]
    pub fn active(&self) -> bool {
        self.shown().any(|child| !child.state.is_final())
    }

    fn shown(&self) -> impl Iterator<Item = &Child> {
        self.children.iter().filter(|child| !child.hidden)
    }

    /// Takes one event of the run at `now_ms`; the plain lines of the changes of state it made.
    pub fn apply(&mut self, event: &Event, now_ms: u64) -> Vec<String> {
        let mut lines = Vec::new();
        match event {
            Event::Update {
                session_id, update, ..
            } => self.update(session_id.as_deref(), update, now_ms, &mut lines),
            Event::Permission { decision, .. } => {
                if let Some(row) = self.row(decision.session_id.as_deref()) {
                    self.set(row, LiveState::Running, now_ms, &mut lines);
                }
            }
            Event::End(_) => {
                for row in 0..self.children.len() {
                    if !self.children[row].hidden {
                        self.set(row, LiveState::Disconnected, now_ms, &mut lines);
                    }
                }
            }
            Event::Start(_) | Event::Stderr { .. } => {}
        }
        lines
    }

    /// A permission question for `session` (a child's; `None`: the run's own) is put to the
    /// person: the child awaits approval until the decision's event.
    pub fn asking(&mut self, session: Option<&str>, now_ms: u64) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(row) = self.row(session) {
            self.set(row, LiveState::AwaitingApproval, now_ms, &mut lines);
        }
        lines
    }

    fn row(&self, session: Option<&str>) -> Option<usize> {
        self.index.get(session?).copied()
    }

    fn update(
        &mut self,
        on: Option<&str>,
        update: &SessionUpdate,
        now_ms: u64,
        lines: &mut Vec<String>,
    ) {
        let parent = self.row(on);
        if on.is_some() && parent.is_none() {
            return;
        }
        match update {
            SessionUpdate::SubagentUpdate(announced) => {
                self.announced(on, parent, announced, now_ms, lines);
            }
            SessionUpdate::ToolCall(call) => {
                let title = call.title.as_str();
                if call.kind == ToolKind::Think && title.starts_with(QUEUED_PREFIX) {
                    let key = queued_key(on, &call.tool_call_id.0);
                    let name = title[QUEUED_PREFIX.len()..].split(':').next();
                    let row = self.add(key, None, parent, name.unwrap_or(title), now_ms);
                    if let Some(row) = row {
                        lines.push(self.plain(row, now_ms));
                    }
                } else if let Some(row) = parent {
                    self.children[row].said_line(title);
                }
            }
            SessionUpdate::ToolCallUpdate(call) => {
                let key = queued_key(on, &call.tool_call_id.0);
                if let Some(&row) = self.index.get(&key) {
                    if self.children[row].hidden {
                        return;
                    }
                    let linked =
                        (call.fields.content.iter().flatten()).find_map(|content| match content {
                            ToolCallContent::Session(session) => {
                                Some(session.session_id.0.as_ref())
                            }
                            _ => None,
                        });
                    match call.fields.status {
                        _ if linked.is_some() => {
                            let to = linked.and_then(|id| self.index.get(id).copied());
                            let queued = &mut self.children[row];
                            queued.hidden = true;
                            queued.moved_to = to.filter(|&to| to > row);
                        }
                        Some(ToolCallStatus::Completed) => {
                            self.set(row, LiveState::Completed, now_ms, lines);
                        }
                        Some(ToolCallStatus::Failed) => {
                            self.set(row, LiveState::Failed, now_ms, lines);
                        }
                        _ => {}
                    }
                } else if let (Some(row), Some(title)) = (parent, &call.fields.title) {
                    self.children[row].said_line(title);
                }
            }
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let (Some(row), ContentBlock::Text(text)) = (parent, &chunk.content) {
                    self.children[row].said(&text.text);
                }
            }
            SessionUpdate::UsageUpdate(usage) => {
                if let Some(row) = parent {
                    let cost = usage.cost.as_ref().map(|cost| Cost {
                        amount: cost.amount,
                        currency: cost.currency.clone(),
                    });
                    self.children[row].spent(Usage::from_meta(usage.meta.as_ref()), cost);
                }
            }
            SessionUpdate::SessionInfoUpdate(info) => {
                if let Some(row) = parent {
                    self.children[row].spent(Usage::from_meta(info.meta.as_ref()), None);
                }
            }
            _ => {}
        }
    }

    /// A `subagent_update` sent on `on` (row `parent`): announces a child, or patches one.
    fn announced(
        &mut self,
        on: Option<&str>,
        parent: Option<usize>,
        update: &SubagentUpdate,
        now_ms: u64,
        lines: &mut Vec<String>,
    ) {
        let id = update.session_id.0.as_ref();
        if Some(id) == on {
            return;
        }
        let name = update.title.value().map_or(id, String::as_str);
        let row = match self.index.get(id) {
            Some(&row) if self.children[row].parent == parent => row,
            // Never re-parented.
            Some(_) => return,
            None => match self.add(id.to_owned(), Some(id), parent, name, now_ms) {
                Some(row) => {
                    lines.push(self.plain(row, now_ms));
                    row
                }
                None => return,
            },
        };
        if let Some(title) = update.title.value() {
            self.children[row].name = cut(&printable(title), NAME_CHARS);
        }
        let Some(snapshot) = update.state.value() else {
            return;
        };
        let Some((state, _)) = ChildState::from_update(snapshot) else {
            return;
        };
        if let Some(failure) = Failure::of(snapshot) {
            self.children[row].error = failure.error.map(|error| cut(&printable(&error), 200));
        }
        if let agent_client_protocol_schema::v1::StateUpdate::Idle(idle) = snapshot
            && let Some(usage) = &idle.usage
        {
            self.children[row].spent(Some(Usage::from_acp(usage)), None);
        }
        // An announcement's `running` is no change; a running child waiting on the person stays so.
        if state != ChildState::Running {
            self.set(row, LiveState::of(state), now_ms, lines);
        }
    }

    /// A new row under `parent`, unless [`MAX_TRACKED`] are tracked already.
    fn add(
        &mut self,
        key: String,
        session_id: Option<&str>,
        parent: Option<usize>,
        name: &str,
        now_ms: u64,
    ) -> Option<usize> {
        if self.children.len() >= MAX_TRACKED {
            self.untracked += 1;
            return None;
        }
        let depth = parent.map_or(0, |row| self.children[row].depth + 1);
        self.children.push(Child {
            session_id: session_id.map(str::to_owned),
            parent,
            depth,
            name: cut(&printable(name), NAME_CHARS),
            state: if session_id.is_some() {
                LiveState::Running
            } else {
                LiveState::Queued
            },
            started_ms: now_ms,
            ended_ms: None,
            tokens: None,
            cost: None,
            error: None,
            last: String::new(),
            partial: String::new(),
            hidden: false,
            moved_to: None,
        });
        let row = self.children.len() - 1;
        self.index.insert(key, row);
        Some(row)
    }

    /// Moves row `row` to `state`, unless it ended already or is there; the change's plain line.
    fn set(&mut self, row: usize, state: LiveState, now_ms: u64, lines: &mut Vec<String>) {
        let child = &mut self.children[row];
        if child.state.is_final() || child.state == state {
            return;
        }
        child.state = state;
        if state.is_final() {
            child.ended_ms = Some(now_ms);
        }
        lines.push(self.plain(row, now_ms));
    }

    /// The plain line of row `row` as it is now: `acp-host: child NAME (ID): STATE ...`.
    fn plain(&self, row: usize, now_ms: u64) -> String {
        let child = &self.children[row];
        let under = child
            .parent
            .and_then(|parent| self.children[parent].session_id.as_deref())
            .map(|parent| format!("in {parent}"));
        let id = match (child.session_id.as_deref(), under) {
            (Some(id), Some(under)) => format!(" ({id} {under})"),
            (Some(id), None) => format!(" ({id})"),
            (None, Some(under)) => format!(" ({under})"),
            (None, None) => String::new(),
        };
        let mut line = format!(
            "acp-host: child {}{id}: {}",
            child.name,
            child.state.as_str()
        );
        if child.state.is_final() {
            line.push_str(" after ");
            line.push_str(&elapsed(child.elapsed_ms(now_ms)));
            line.push_str(&child.spending());
            if let Some(error) = &child.error {
                line.push_str(": ");
                line.push_str(error);
            }
        }
        line
    }

    /// The tree as it is at `now_ms`, one string per terminal line, each at most `width`
    /// characters: a finished child on one line, an active one with its last line under it, at
    /// most `max_children` children (finished ones left out first, then the latest), and a last
    /// line `+N more` for those left out.
    #[must_use]
    pub fn lines(&self, now_ms: u64, width: usize, max_children: usize) -> Vec<String> {
        let mut order = self.order();
        let total = order.len() + self.untracked;
        let mut finished = order
            .iter()
            .filter(|&&row| self.children[row].state.is_final())
            .count();
        while order.len() > max_children && finished > 0 {
            if let Some(at) = order
                .iter()
                .position(|&row| self.children[row].state.is_final())
            {
                order.remove(at);
            }
            finished -= 1;
        }
        order.truncate(max_children);
        let mut lines = Vec::new();
        for &row in &order {
            let child = &self.children[row];
            let indent = "  ".repeat(child.depth);
            lines.push(cut(
                &format!(
                    "{indent}{} {} {}{}",
                    child.name,
                    child.state.as_str(),
                    elapsed(child.elapsed_ms(now_ms)),
                    child.spending()
                ),
                width,
            ));
            let last = if child.partial.is_empty() {
                &child.last
            } else {
                &child.partial
            };
            if !child.state.is_final() && !last.is_empty() {
                lines.push(cut(&format!("{indent}  > {last}"), width));
            }
        }
        if total > order.len() {
            lines.push(cut(&format!("+{} more", total - order.len()), width));
        }
        lines
    }

    /// The rows shown, depth first: each child under the one it was announced on.
    fn order(&self) -> Vec<usize> {
        let mut under: Vec<Vec<usize>> = vec![Vec::new(); self.children.len()];
        let mut top = Vec::new();
        let moved: std::collections::HashSet<usize> = self
            .children
            .iter()
            .filter_map(|child| child.moved_to)
            .collect();
        for (row, child) in self.children.iter().enumerate() {
            // A session that took a queued row's place is shown there.
            let shown = match child.moved_to {
                Some(to) => to,
                None if child.hidden || moved.contains(&row) => continue,
                None => row,
            };
            match self.children[shown].parent {
                Some(parent) => under[parent].push(shown),
                None => top.push(shown),
            }
        }
        let mut order = Vec::with_capacity(self.children.len());
        let mut stack: Vec<usize> = top.into_iter().rev().collect();
        while let Some(row) = stack.pop() {
            order.push(row);
            stack.extend(under[row].iter().rev());
        }
        order
    }
}

impl Child {
    fn elapsed_ms(&self, now_ms: u64) -> u64 {
        self.ended_ms
            .unwrap_or(now_ms)
            .saturating_sub(self.started_ms)
    }

    /// `, 1,234 tokens, 0.0100 USD` (what is known of it; empty when nothing is).
    fn spending(&self) -> String {
        let mut text = String::new();
        if let Some(tokens) = self.tokens {
            text.push_str(", ");
            text.push_str(&thousands(tokens));
            text.push_str(" tokens");
        }
        if let Some(cost) = &self.cost {
            text.push_str(", ");
            text.push_str(&cost.describe());
        }
        text
    }

    /// Counts reported (cumulative), and a cost (the update's, else the counts').
    fn spent(&mut self, usage: Option<Usage>, cost: Option<Cost>) {
        let cost = cost.or_else(|| usage.as_ref().and_then(|usage| usage.cost.clone()));
        if let Some(usage) = usage {
            self.tokens = Some(usage.total_tokens);
        }
        if let Some(cost) = cost.filter(|cost| cost.amount.is_finite()) {
            self.cost = Some(cost);
        }
    }

    /// Streamed text: its last non-empty line becomes the child's last line.
    fn said(&mut self, text: &str) {
        let mut pieces = text.split('\n').peekable();
        while let Some(piece) = pieces.next() {
            if self.partial.chars().count() < LAST_LINE_CHARS {
                self.partial
                    .push_str(&cut(&printable(piece), LAST_LINE_CHARS));
                self.partial = cut(&self.partial, LAST_LINE_CHARS);
            }
            if pieces.peek().is_some() {
                let line = std::mem::take(&mut self.partial);
                if !line.trim().is_empty() {
                    self.last = line;
                }
            }
        }
    }

    /// A whole line said (a tool call's title).
    fn said_line(&mut self, line: &str) {
        self.partial.clear();
        self.last = cut(&printable(line), LAST_LINE_CHARS);
    }
}

fn queued_key(on: Option<&str>, call: &str) -> String {
    format!("{}\0{call}", on.unwrap_or(""))
}

/// `text` cut to at most `max` characters (the last one `…` when cut).
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    text.chars()
        .take(max.saturating_sub(1))
        .chain(['…'])
        .collect()
}

/// `850ms`, `12.3s`, `4m05s`, `1h02m`.
#[must_use]
pub fn elapsed(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", ms / 1_000, ms % 1_000 / 100),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1_000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::events::EndEvent;
    use crate::permission::{DecidedBy, Outcome, PermissionDecision, Verdict};
    use crate::status::Status;

    /// An update on `on` (`None`: the run's own session).
    fn update(on: Option<&str>, update: Value) -> Event {
        Event::Update {
            run_id: "r".into(),
            session_id: on.map(str::to_owned),
            subagent: None,
            update: serde_json::from_value(update).unwrap(),
        }
    }

    fn announce(on: Option<&str>, id: &str, title: &str) -> Event {
        update(
            on,
            json!({"sessionUpdate": "subagent_update", "sessionId": id, "title": title,
                "state": {"state": "running"}}),
        )
    }

    fn ended(on: Option<&str>, id: &str, state: &Value) -> Event {
        update(
            on,
            json!({"sessionUpdate": "subagent_update", "sessionId": id, "state": state}),
        )
    }

    fn text(on: &str, text: &str) -> Event {
        update(
            Some(on),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
        )
    }

    fn decision(session: Option<&str>) -> Event {
        Event::Permission {
            run_id: "r".into(),
            decision: PermissionDecision {
                session_id: session.map(str::to_owned),
                tool_call_id: "c".into(),
                title: None,
                tool_kind: None,
                offered: Vec::new(),
                verdict: Verdict::Allow,
                decided_by: DecidedBy::User,
                outcome: Outcome::Cancelled,
            },
        }
    }

    fn end() -> Event {
        Event::End(EndEvent {
            run_id: "r".into(),
            provider: "p".into(),
            status: Status::Completed,
            stop_reason: None,
            last_assistant_message: Some(Arc::new(String::new())),
        })
    }

    #[test]
    fn children_are_announced_nested_talk_spend_and_end_each_on_one_line() {
        let mut tree = Tree::new();
        assert!(tree.is_empty() && !tree.active());
        assert_eq!(
            tree.apply(&announce(None, "sub-1", "alpha"), 0),
            ["acp-host: child alpha (sub-1): running"]
        );
        assert_eq!(
            tree.apply(&announce(Some("sub-1"), "sub-2", "beta\u{1b}[2J"), 100),
            ["acp-host: child beta\\u{1b}[2J (sub-2 in sub-1): running"]
        );
        // Text: the last non-empty line, a line not ended shown as it grows.
        assert!(tree.apply(&text("sub-1", "one\ntwo\n\n"), 200).is_empty());
        tree.apply(&text("sub-2", "half a li"), 200);
        tree.apply(&text("sub-2", "ne"), 200);
        // A tool call names what the child does; its update with a title too.
        tree.apply(
            &update(
                Some("sub-1"),
                json!({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "Read a.txt"}),
            ),
            300,
        );
        tree.apply(
            &update(
                Some("sub-1"),
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "title": "Read b.txt"}),
            ),
            300,
        );
        tree.apply(
            &update(
                Some("sub-1"),
                json!({"sessionUpdate": "usage_update", "used": 1, "size": 2,
                    "cost": {"amount": 0.01, "currency": "USD"},
                    "_meta": {"acp-host/usage": {"version": 1, "inputTokens": 1000,
                        "outputTokens": 234, "totalTokens": 1234}}}),
            ),
            400,
        );
        tree.apply(
            &update(
                Some("sub-2"),
                json!({"sessionUpdate": "session_info_update",
                    "_meta": {"acp-host/usage": {"version": 1, "inputTokens": 5,
                        "outputTokens": 5, "totalTokens": 10,
                        "cost": {"amount": 0.5, "currency": "EUR"}}}}),
            ),
            400,
        );
        assert!(tree.active());
        assert_eq!(
            tree.lines(1_500, 80, 10),
            [
                "alpha running 1.5s, 1,234 tokens, 0.0100 USD",
                "  > Read b.txt",
                "  beta\\u{1b}[2J running 1.4s, 10 tokens, 0.5000 EUR",
                "    > half a line",
            ]
        );
        // Width: each line cut.
        assert_eq!(tree.lines(1_500, 8, 10)[0], "alpha r…");
        let failed = json!({"state": "idle", "stopReason": "error",
            "error": {"code": -32603, "message": "boom"}});
        assert_eq!(
            tree.apply(&ended(Some("sub-1"), "sub-2", &failed), 2_000),
            [
                "acp-host: child beta\\u{1b}[2J (sub-2 in sub-1): failed after 1.9s, 10 tokens, 0.5000 EUR: boom"
            ]
        );
        let done = json!({"state": "idle", "stopReason": "end_turn",
            "usage": {"inputTokens": 2000, "outputTokens": 500, "totalTokens": 2500}});
        assert_eq!(
            tree.apply(&ended(None, "sub-1", &done), 3_000),
            ["acp-host: child alpha (sub-1): completed after 3.0s, 2,500 tokens, 0.0100 USD"]
        );
        // A final state sticks.
        assert!(
            tree.apply(&announce(None, "sub-1", "alpha"), 3_100)
                .is_empty()
        );
        assert!(!tree.active());
        assert_eq!(
            tree.lines(9_000, 80, 10),
            [
                "alpha completed 3.0s, 2,500 tokens, 0.0100 USD",
                "  beta\\u{1b}[2J failed 1.9s, 10 tokens, 0.5000 EUR",
            ]
        );
        // Nothing reaches the run's own session or unknown ones.
        assert!(tree.apply(&text("sub-9", "x\n"), 9_000).is_empty());
        assert!(tree.apply(&end(), 9_000).is_empty());
    }

    #[test]
    fn a_subagent_call_is_queued_until_its_session_takes_its_place() {
        let mut tree = Tree::new();
        let call = |id: &str, title: &str| {
            update(
                None,
                json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": title, "kind": "think"}),
            )
        };
        assert_eq!(
            tree.apply(&call("c1", "Subagent alpha: do it"), 0),
            ["acp-host: child alpha: queued"]
        );
        tree.apply(&call("c2", "Subagent beta: do it"), 0);
        tree.apply(&call("c3", "Subagent gamma: do it"), 0);
        // One a child asked for is said to be in it.
        let mut other = Tree::new();
        other.apply(&announce(None, "sub-9", "parent"), 0);
        let nested = update(
            Some("sub-9"),
            json!({"sessionUpdate": "tool_call", "toolCallId": "c9", "title": "Subagent leaf: x", "kind": "think"}),
        );
        assert_eq!(
            other.apply(&nested, 0),
            ["acp-host: child leaf (in sub-9): queued"]
        );
        // Another tool call of the run's own session is no child.
        assert!(tree.apply(&call("c4", "Think hard"), 0).is_empty());
        assert_eq!(
            tree.lines(10, 80, 10),
            ["alpha queued 10ms", "beta queued 10ms", "gamma queued 10ms"]
        );
        tree.apply(&announce(None, "sub-1", "alpha"), 20);
        let linked = update(
            None,
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
                "content": [{"type": "session", "sessionId": "sub-1"}]}),
        );
        assert!(tree.apply(&linked, 20).is_empty());
        // The call's own end, once its session took its place, says nothing more.
        let completed = update(
            None,
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed"}),
        );
        assert!(tree.apply(&completed, 25).is_empty());
        let status = |id: &str, status: &str| {
            update(
                None,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status}),
            )
        };
        // Refused before its session existed: the call's outcome is the child's.
        assert_eq!(
            tree.apply(&status("c2", "failed"), 30),
            ["acp-host: child beta: failed after 30ms"]
        );
        tree.apply(&status("c3", "in_progress"), 30);
        assert_eq!(
            tree.apply(&status("c3", "completed"), 40),
            ["acp-host: child gamma: completed after 40ms"]
        );
        assert_eq!(
            tree.lines(50, 80, 10),
            // Each where its call was made.
            [
                "alpha running 30ms",
                "beta failed 30ms",
                "gamma completed 40ms"
            ]
        );
        // The run ended with a child still running: disconnected.
        assert_eq!(
            tree.apply(&end(), 60),
            ["acp-host: child alpha (sub-1): disconnected after 40ms"]
        );
    }

    #[test]
    fn a_question_to_the_person_holds_a_child_awaiting_approval_until_answered() {
        let mut tree = Tree::new();
        tree.apply(&announce(None, "sub-1", "alpha"), 0);
        assert!(tree.asking(None, 5).is_empty());
        assert!(tree.asking(Some("sub-9"), 5).is_empty());
        assert_eq!(
            tree.asking(Some("sub-1"), 5),
            ["acp-host: child alpha (sub-1): awaiting approval"]
        );
        // A snapshot saying `running` meanwhile changes nothing; the answer does.
        assert!(tree.apply(&announce(None, "sub-1", "alpha"), 6).is_empty());
        assert!(tree.active());
        assert!(tree.apply(&decision(None), 7).is_empty());
        assert_eq!(
            tree.apply(&decision(Some("sub-1")), 8),
            ["acp-host: child alpha (sub-1): running"]
        );
    }

    #[test]
    fn odd_updates_are_ignored() {
        let mut tree = Tree::new();
        tree.apply(&announce(None, "sub-1", "alpha"), 0);
        // Naming the session it is sent on, re-parenting, a state this host does not know, an
        // untitled announcement (named by its id), other events.
        assert!(
            tree.apply(&announce(Some("sub-1"), "sub-1", "x"), 0)
                .is_empty()
        );
        assert!(
            tree.apply(&announce(Some("sub-2"), "sub-1", "x"), 0)
                .is_empty()
        );
        tree.apply(&announce(Some("sub-1"), "sub-2", "beta"), 0);
        assert!(tree.apply(&announce(None, "sub-2", "x"), 0).is_empty());
        assert!(
            tree.apply(&ended(None, "sub-1", &json!({"state": "_custom"})), 0)
                .is_empty()
        );
        assert!(
            tree.apply(
                &update(
                    None,
                    json!({"sessionUpdate": "subagent_update", "sessionId": "sub-3"})
                ),
                0
            )
            .len()
                == 1
        );
        let unknown = json!({"state": "unknown"});
        assert_eq!(
            tree.apply(&ended(None, "sub-3", &unknown), 0),
            ["acp-host: child sub-3 (sub-3): disconnected after 0ms"]
        );
        let stderr = Event::Stderr {
            run_id: "r".into(),
            line: "x".into(),
        };
        assert!(tree.apply(&stderr, 0).is_empty());
        let plan = update(
            Some("sub-1"),
            json!({"sessionUpdate": "plan", "entries": []}),
        );
        assert!(tree.apply(&plan, 0).is_empty());
        let image = update(
            Some("sub-1"),
            json!({"sessionUpdate": "agent_message_chunk",
                "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"}}),
        );
        tree.apply(&image, 0);
        // A status-only update of a child's tool call; an infinite cost is not kept.
        tree.apply(
            &update(
                Some("sub-1"),
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "completed"}),
            ),
            0,
        );
        assert_eq!(tree.lines(0, 80, 10)[0], "alpha running 0ms");
        assert_eq!(tree.lines(0, 80, 10)[1], "  beta running 0ms");
    }

    #[test]
    fn a_queued_calls_other_content_links_nothing_and_usage_not_a_childs_is_ignored() {
        let mut tree = Tree::new();
        tree.apply(
            &update(
                None,
                json!({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Subagent leaf: x", "kind": "think"}),
            ),
            0,
        );
        let queued = tree.lines(0, 80, 10);
        // Text content on the call is no session: the call stays queued.
        tree.apply(
            &update(
                None,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
                    "content": [{"type": "content", "content": {"type": "text", "text": "hi"}}]}),
            ),
            0,
        );
        assert_eq!(tree.lines(0, 80, 10), queued);
        // The run's own usage is no child's; a session the tree does not know, nobody's.
        for on in [None, Some("sub-9")] {
            let usage = update(
                on,
                json!({"sessionUpdate": "usage_update", "used": 5, "size": 10}),
            );
            assert!(tree.apply(&usage, 0).is_empty());
        }
        assert_eq!(tree.lines(0, 80, 10), queued);
    }

    #[test]
    fn what_is_kept_and_shown_is_bounded() {
        let mut tree = Tree::new();
        for n in 0..=MAX_TRACKED {
            tree.apply(&announce(None, &format!("sub-{n}"), "c"), 0);
        }
        assert_eq!(tree.untracked(), 1);
        assert!(
            tree.apply(&text("sub-0", &"x".repeat(10_000)), 0)
                .is_empty()
        );
        tree.apply(&text("sub-0", "more"), 0);
        let lines = tree.lines(0, 1_000, 2);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1].chars().count(), 4 + LAST_LINE_CHARS);
        assert_eq!(lines[3], format!("+{} more", MAX_TRACKED - 1));
        // Finished children are left out first.
        let mut tree = Tree::new();
        for n in 0..4 {
            tree.apply(&announce(None, &format!("sub-{n}"), &format!("c{n}")), 0);
        }
        let done = json!({"state": "idle", "stopReason": "end_turn"});
        tree.apply(&ended(None, "sub-0", &done), 0);
        tree.apply(&ended(None, "sub-2", &done), 0);
        assert_eq!(
            tree.lines(0, 80, 2),
            ["c1 running 0ms", "c3 running 0ms", "+2 more"]
        );
        assert_eq!(
            tree.lines(0, 80, 3),
            [
                "c1 running 0ms",
                "c2 completed 0ms",
                "c3 running 0ms",
                "+1 more"
            ]
        );
        assert_eq!(tree.lines(0, 80, 1), ["c1 running 0ms", "+3 more"]);
        assert_eq!(
            cut(&"é".repeat(NAME_CHARS + 5), NAME_CHARS).chars().count(),
            NAME_CHARS
        );
    }

    #[test]
    fn a_tree_is_drawn_only_on_a_terminal_and_never_beside_verbose_lines() {
        use Progress::{Auto, Off, Plain, Tree};
        let shown = |progress: Progress| {
            [(true, false), (false, false), (true, true)]
                .map(|(terminal, verbose)| progress.shown(terminal, verbose))
        };
        assert_eq!(shown(Auto), [Tree, Plain, Off]);
        assert_eq!(shown(Tree), [Tree, Plain, Plain]);
        assert_eq!(shown(Plain), [Plain, Plain, Plain]);
        assert_eq!(shown(Off), [Off, Off, Off]);
    }

    #[test]
    fn states_and_durations_have_their_names() {
        let names: Vec<&str> = [
            LiveState::Queued,
            LiveState::Running,
            LiveState::AwaitingApproval,
            LiveState::Completed,
            LiveState::Failed,
            LiveState::Cancelled,
            LiveState::Disconnected,
        ]
        .iter()
        .map(|state| state.as_str())
        .collect();
        assert_eq!(
            names,
            [
                "queued",
                "running",
                "awaiting approval",
                "completed",
                "failed",
                "cancelled",
                "disconnected"
            ]
        );
        assert_eq!(LiveState::of(ChildState::Cancelled), LiveState::Cancelled);
        assert_eq!(LiveState::of(ChildState::Running), LiveState::Running);
        assert_eq!(
            [850, 12_345, 245_000, 3_720_000].map(elapsed),
            ["850ms", "12.3s", "4m05s", "1h02m"]
        );
    }
}
