//! Asking the user before a tool call changes something: the one permission flow of both
//! backends.
//!
//! A call that needs permission names its [`PermissionKind`] (`edit` or `execute`). The flow:
//! a standing answer for that kind in this session decides at once; otherwise the client is asked
//! with `session/request_permission`, offering [`Offer::Once`] (allow once, reject once) or
//! [`Offer::Always`] (also allow always, reject always). The answer becomes a [`Verdict`];
//! an "always" answer is remembered for the rest of the session and that kind only.
//!
//! Anything but an allow is a refusal: an unknown option, the `cancelled` outcome, or a client
//! that answers the request with a JSON-RPC error (the tool call is not run, the turn goes on).
//! Cancellation of the turn wins over any answer.
//!
//! A subagent's request is relayed ([`relay`]), offering the subagent's options, the answer going
//! back to the subagent by the kind of the option chosen: on the subagent's own session when it is
//! exposed as one ([`Via::Session`], about the subagent's tool call, which the client saw there),
//! else on this session as a tool call of its own titled with the subagent's name
//! ([`Via::Parent`]). Nothing is remembered here: the subagent keeps its own standing answers.

use acp_host::permission::Decision;
use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, SessionId, ToolCall, ToolCallId, ToolCallStatus,
    ToolCallUpdateFields, ToolKind,
};
use protocol::permission::{self as host, DecidedBy, OptionKind, PermissionRequest};
use tokio_util::sync::CancellationToken;

use super::{Turn, TurnError};

pub(crate) const ALLOW_ONCE: &str = "allow-once";
pub(crate) const ALLOW_ALWAYS: &str = "allow-always";
pub(crate) const REJECT_ONCE: &str = "reject-once";
pub(crate) const REJECT_ALWAYS: &str = "reject-always";

/// The group a standing ("always") answer applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PermissionKind {
    Edit,
    Execute,
}

impl PermissionKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Edit => "edit",
            Self::Execute => "execute",
        }
    }
}

/// Which options the user is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    Once,
    Always,
}

impl Offer {
    /// The options, in the order clients show them.
    pub(crate) fn options(self) -> Vec<PermissionOption> {
        let once = |id, name, kind| PermissionOption::new(id, name, kind);
        match self {
            Self::Once => vec![
                once(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
                once(REJECT_ONCE, "Reject once", PermissionOptionKind::RejectOnce),
            ],
            Self::Always => vec![
                once(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
                once(
                    ALLOW_ALWAYS,
                    "Allow always (this session)",
                    PermissionOptionKind::AllowAlways,
                ),
                once(REJECT_ONCE, "Reject once", PermissionOptionKind::RejectOnce),
                once(
                    REJECT_ALWAYS,
                    "Reject always (this session)",
                    PermissionOptionKind::RejectAlways,
                ),
            ],
        }
    }
}

/// How the client answered a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Selected(String),
    /// The `cancelled` outcome (or one a later protocol revision adds).
    Dismissed,
    /// The client answered with a JSON-RPC error; the text explains it.
    ClientError(String),
    /// `session/cancel` arrived first; the pending request was withdrawn.
    TurnCancelled,
}

/// What the caller does with the tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    Rejected,
    /// The client's permission handler failed; the text says so, for the tool result.
    ClientError(String),
    Cancelled,
}

/// What an answer means: the verdict, and whether it stands for the rest of the session.
fn decide(answer: &Answer) -> (Verdict, bool) {
    match answer {
        Answer::Selected(option) => match option.as_str() {
            ALLOW_ONCE => (Verdict::Allowed, false),
            ALLOW_ALWAYS => (Verdict::Allowed, true),
            REJECT_ALWAYS => (Verdict::Rejected, true),
            _ => (Verdict::Rejected, false),
        },
        Answer::Dismissed => (Verdict::Rejected, false),
        Answer::ClientError(error) => (
            Verdict::ClientError(format!(
                "the client answered the permission request with an error ({error}); the call was not run"
            )),
            false,
        ),
        Answer::TurnCancelled => (Verdict::Cancelled, false),
    }
}

/// Asks permission for tool call `id` (or applies the session's standing answer for `kind`).
/// `preview` (a diff, a command line) travels with the request so the client can show it.
pub(crate) async fn ask(
    turn: &Turn,
    id: &ToolCallId,
    kind: PermissionKind,
    offer: Offer,
    preview: ToolCallUpdateFields,
) -> Result<Verdict, TurnError> {
    if let Some(allow) = turn.memory().standing(kind.as_str()) {
        return Ok(if allow {
            Verdict::Allowed
        } else {
            Verdict::Rejected
        });
    }
    let answer = turn
        .request_permission(id, preview, offer.options())
        .await?;
    // A cancelled turn never runs the call, whatever the answer raced with.
    if turn.is_cancelled() {
        return Ok(Verdict::Cancelled);
    }
    if let Answer::ClientError(error) = &answer {
        tracing::warn!(%error, "the client answered a permission request with an error");
    }
    let (verdict, stands) = decide(&answer);
    if stands {
        turn.memory()
            .set_standing(kind.as_str(), verdict == Verdict::Allowed);
    }
    Ok(verdict)
}

/// The fields of a subagent's tool call that show what it asks to do: its content (`diff` blocks
/// included), locations and raw input.
fn what_it_shows(shown: ToolCallUpdateFields) -> ToolCallUpdateFields {
    let mut fields = ToolCallUpdateFields::new();
    fields.content = shown.content;
    fields.locations = shown.locations;
    fields.raw_input = shown.raw_input;
    fields
}

/// Where a subagent's permission request is asked.
pub(crate) enum Via<'a> {
    /// On this turn's session, as a tool call titled `subagent: title`.
    Parent { subagent: &'a str },
    /// On the subagent's own session (exposed to the client), about its own tool call; withdrawn
    /// when `withdraw` fires first (the subagent's turn answered).
    Session {
        session: SessionId,
        withdraw: &'a CancellationToken,
    },
}

/// Asks this agent's client about a subagent's permission request and returns the answer for
/// the subagent: the kind of the option chosen, `cancelled` when the turn was cancelled or the
/// request dismissed or withdrawn, a rejection when the client failed.
pub(crate) async fn relay(turn: &Turn, via: Via<'_>, request: &PermissionRequest) -> Decision {
    let title = request.title.as_deref().unwrap_or("a tool call");
    let kind = request
        .tool_kind
        .as_deref()
        .and_then(|kind| serde_json::from_value(serde_json::Value::from(kind)).ok())
        .unwrap_or(ToolKind::Other);
    let rejected = Decision {
        answer: host::Answer::Reject,
        decided_by: DecidedBy::User,
    };
    // Kinds this agent does not know are never chosen, so they are not offered upstream either.
    let options = request
        .offered
        .iter()
        .filter_map(|option| {
            let (name, kind) = match option.kind.known()? {
                OptionKind::AllowOnce => ("Allow once", PermissionOptionKind::AllowOnce),
                OptionKind::AllowAlways => ("Allow always", PermissionOptionKind::AllowAlways),
                OptionKind::RejectOnce => ("Reject once", PermissionOptionKind::RejectOnce),
                OptionKind::RejectAlways => ("Reject always", PermissionOptionKind::RejectAlways),
            };
            Some(PermissionOption::new(option.option_id.clone(), name, kind))
        })
        .collect();
    // What the child showed with its request (content with its `diff` blocks, locations, raw
    // input), relayed whole, paths as the child reported them: the person approves what they see.
    let shown = request.tool_call.as_deref().cloned().unwrap_or_default();
    let (answer, card) = match via {
        Via::Parent { subagent } => {
            let mut call = ToolCall::new("", format!("{subagent}: {title}"))
                .kind(kind)
                .status(ToolCallStatus::Pending);
            call.content
                .clone_from(shown.content.as_ref().unwrap_or(&Vec::new()));
            call.locations
                .clone_from(shown.locations.as_ref().unwrap_or(&Vec::new()));
            call.raw_input.clone_from(&shown.raw_input);
            let Ok(id) = turn.announce_tool_call(call, "") else {
                return rejected;
            };
            let answer = match turn
                .request_permission(&id, what_it_shows(shown), options)
                .await
            {
                Ok(answer) => answer,
                Err(error) => Answer::ClientError(protocol::report::describe(&error)),
            };
            (answer, Some(id))
        }
        Via::Session { session, withdraw } => {
            let fields = what_it_shows(shown).title(title.to_owned()).kind(kind);
            let id = ToolCallId::new(request.tool_call_id.clone());
            let answer = turn
                .request_permission_on(session, id, fields, options, withdraw)
                .await;
            (answer, None)
        }
    };
    let decision = match answer {
        Answer::Selected(chosen) => request
            .offered
            .iter()
            .find(|option| option.option_id == chosen)
            .and_then(|option| option.kind.known())
            .map_or(rejected, |kind| Decision {
                answer: host::Answer::Kind(kind),
                decided_by: DecidedBy::User,
            }),
        Answer::Dismissed => Decision {
            answer: host::Answer::Cancelled,
            decided_by: DecidedBy::User,
        },
        Answer::ClientError(error) => {
            tracing::warn!(%error, "the client answered a relayed permission request with an error");
            rejected
        }
        Answer::TurnCancelled => Decision {
            answer: host::Answer::Cancelled,
            decided_by: DecidedBy::Cancel,
        },
    };
    // The subagent updates its own tool call on its own session; a card of ours is ours to end.
    if let Some(id) = card {
        let status = if decision.answer.verdict() == host::Verdict::Allow {
            ToolCallStatus::Completed
        } else {
            ToolCallStatus::Failed
        };
        let _ = turn.update_tool_call(&id, ToolCallUpdateFields::new().status(status));
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_verdicts() {
        let selected = |id: &str| decide(&Answer::Selected(id.into()));
        assert_eq!(selected(ALLOW_ONCE), (Verdict::Allowed, false));
        assert_eq!(selected(ALLOW_ALWAYS), (Verdict::Allowed, true));
        assert_eq!(selected(REJECT_ONCE), (Verdict::Rejected, false));
        assert_eq!(selected(REJECT_ALWAYS), (Verdict::Rejected, true));
        assert_eq!(selected("something-else"), (Verdict::Rejected, false));
        assert_eq!(decide(&Answer::Dismissed), (Verdict::Rejected, false));
        assert_eq!(
            decide(&Answer::ClientError("boom".into())),
            (
                Verdict::ClientError(
                    "the client answered the permission request with an error (boom); the call was not run"
                        .into()
                ),
                false
            )
        );
        assert_eq!(decide(&Answer::TurnCancelled), (Verdict::Cancelled, false));
    }

    #[test]
    fn offers_list_their_options_in_order() {
        let ids = |offer: Offer| -> Vec<String> {
            offer
                .options()
                .iter()
                .map(|option| option.option_id.0.to_string())
                .collect()
        };
        assert_eq!(ids(Offer::Once), [ALLOW_ONCE, REJECT_ONCE]);
        assert_eq!(
            ids(Offer::Always),
            [ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS]
        );
    }
}
