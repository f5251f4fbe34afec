//! The children wing: everything about a subagent acp-child starts, in one folder. A child is
//! any ACP agent (acp-child itself included) run as its own process through acp-host's run
//! library; the model's tools and the offline `/delegate` reach children only through here.
//!
//! Map (docs/acp-child.md, "The children wing", has the diagram of a child's states):
//! - [`catalog`]: what may be started: the options the person gave, the registry agents they
//!   enabled and the definition folders ([`Subagents`], shared by the connection's sessions), a
//!   session's [`Catalog`], and a start validated whole before anything exists ([`Start`]);
//! - [`approval`]: the person's approval of a repository definition, asked before it starts;
//! - [`live`]: a child's process and kept session ([`LiveChild`]), the parallel slots, and the
//!   one path that drives every turn shown somewhere;
//! - [`exposure`]: how a turn of a child is shown: a subagent session of its own when the client
//!   speaks them (ids minted in [`ChildSessions`]), else its text on the tool card;
//! - [`table`]: the session's children and background tasks, which outlive a tool call.
//!
//! Invariants: a model or a prompt never names a command line (only enabled registry agents and
//! definitions); every failure is a [`Delegated`] result with `failed` set, never an error of
//! the parent's turn; no child outlives the session that owns it.

mod approval;
mod catalog;
mod exposure;
mod live;
pub(crate) mod table;

use agent_client_protocol::v1::schema::ToolKind;

pub use self::catalog::{
    DEFAULT_MAX_PARALLEL_SUBAGENTS, SubagentError, SubagentOptions, SubagentPermission, Subagents,
};
pub(crate) use self::exposure::ChildSessions;
pub(crate) use self::live::LiveChild;

/// How a subagent's tool call is shown: the kind ACP agents give delegated work.
pub(crate) const KIND: ToolKind = ToolKind::Think;

/// The title of a subagent's tool call: the subagent's name and [`label`].
pub(crate) fn title(name: &str, description: Option<&str>, prompt: &str) -> String {
    format!("Subagent {name}: {}", label(description, prompt))
}

/// What a child is doing, in a few words: the short label (else the prompt's first line, cut).
/// Also the task its session is announced with.
pub(crate) fn label(description: Option<&str>, prompt: &str) -> String {
    let label = description
        .map(str::trim)
        .filter(|label| !label.is_empty())
        .unwrap_or_else(|| prompt.lines().next().unwrap_or("").trim());
    if label.chars().count() > 60 {
        label.chars().take(59).chain(['…']).collect()
    } else {
        label.to_owned()
    }
}

/// A child's result, as the model (or the offline reply) gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delegated {
    pub(crate) text: String,
    pub(crate) failed: bool,
    /// The ACP session id the child's agent reported (to continue it later).
    pub(crate) session: Option<String>,
}

impl Delegated {
    pub(crate) fn failed(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            failed: true,
            session: None,
        }
    }
}
