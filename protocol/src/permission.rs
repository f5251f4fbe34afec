//! The permission policy: how the host answers `session/request_permission`.
//!
//! A request is decided in two steps: a handler (the policy, the user at a terminal, or a library
//! caller relaying to its own editor) gives an [`Answer`]; [`choose_answer`] picks the offered
//! option for it.
//!
//! Invariants: an option is chosen by its KIND, never its position (agents may list `allow_always`
//! first, and `allow_always` can persist rules inside the agent); an option of a kind this host does
//! not know (a newer protocol's `allow_forever`) is recorded but never chosen; a request that offers
//! one `optionId` under two kinds is ambiguous (the id could mean allow) and gets the `cancelled`
//! outcome; otherwise `cancelled` is used only when no option of a wanted kind exists, and for every
//! request once the host has cancelled the turn (ACP requires it).

use serde::{Deserialize, Serialize};

/// What the user configured with `--permission`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PermissionPolicy {
    /// Answer every request with a rejection (the default: safe when unattended).
    #[default]
    Reject,
    /// Answer every request with an approval.
    Allow,
    /// Ask on the terminal; behaves as `Reject` when there is no terminal.
    Ask,
}

/// The kind of a permission option, mirroring ACP's `PermissionOptionKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
}

/// The kind of an offered option as the agent sent it: one this host knows, or another string
/// (a newer kind, or whatever a faulty agent sent) that is never chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum OfferedKind {
    Known(OptionKind),
    /// The kind's wire text; empty when the agent gave none.
    Unknown(String),
}

impl OfferedKind {
    /// Reads a kind from its wire name.
    #[must_use]
    pub fn from_wire(name: &str) -> Self {
        serde_json::from_value(serde_json::Value::String(name.to_owned())).map_or_else(
            |_| OfferedKind::Unknown(name.to_owned()),
            OfferedKind::Known,
        )
    }

    /// The kind, when this host knows it.
    #[must_use]
    pub fn known(&self) -> Option<OptionKind> {
        match self {
            OfferedKind::Known(kind) => Some(*kind),
            OfferedKind::Unknown(_) => None,
        }
    }
}

impl From<OptionKind> for OfferedKind {
    fn from(kind: OptionKind) -> Self {
        OfferedKind::Known(kind)
    }
}

/// One option as offered by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OfferedOption {
    /// The id as the agent sent it: a string as is, any other JSON value (a number) as its JSON
    /// text.
    pub option_id: String,
    pub kind: OfferedKind,
}

/// What the host wants to answer, once the policy (or the user) has decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Allow,
    Reject,
    /// The turn was cancelled: every request gets the `cancelled` outcome.
    Cancelled,
}

impl Verdict {
    /// The kebab-case name, as serialized and printed.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Reject => "reject",
            Verdict::Cancelled => "cancelled",
        }
    }
}

/// The answer sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "outcome"
)]
pub enum Outcome {
    Selected { option_id: String, kind: OptionKind },
    Cancelled,
}

/// A handler's answer to one request: a verdict, or the exact kind of option it wants (a relayed
/// editor's `allow_always`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    /// Allow: `allow_once`, else `allow_always`.
    Allow,
    /// Reject: `reject_once`, else `reject_always`.
    Reject,
    /// The turn is cancelled: the `cancelled` outcome.
    Cancelled,
    /// This kind of option when the agent offers it, else the verdict of its kind.
    Kind(OptionKind),
}

impl Answer {
    /// The verdict the answer amounts to.
    #[must_use]
    pub fn verdict(self) -> Verdict {
        match self {
            Answer::Allow | Answer::Kind(OptionKind::AllowOnce | OptionKind::AllowAlways) => {
                Verdict::Allow
            }
            Answer::Reject | Answer::Kind(OptionKind::RejectOnce | OptionKind::RejectAlways) => {
                Verdict::Reject
            }
            Answer::Cancelled => Verdict::Cancelled,
        }
    }
}

impl From<Verdict> for Answer {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Allow => Answer::Allow,
            Verdict::Reject => Answer::Reject,
            Verdict::Cancelled => Answer::Cancelled,
        }
    }
}

/// Picks the option for an answer by kind: the exact kind asked for when offered, else as
/// [`choose`] does for its verdict; `cancelled` for an [`ambiguous`] offer.
#[must_use]
pub fn choose_answer(answer: Answer, options: &[OfferedOption]) -> Outcome {
    if ambiguous(options) {
        return Outcome::Cancelled;
    }
    if let Answer::Kind(kind) = answer
        && let Some(option) = options.iter().find(|o| o.kind.known() == Some(kind))
    {
        return Outcome::Selected {
            option_id: option.option_id.clone(),
            kind,
        };
    }
    choose(answer.verdict(), options)
}

/// Picks the option for `verdict` by kind: once before always; `Cancelled` when none fits or the
/// offer is [`ambiguous`]. Options of unknown kinds are never picked.
#[must_use]
pub fn choose(verdict: Verdict, options: &[OfferedOption]) -> Outcome {
    if ambiguous(options) {
        return Outcome::Cancelled;
    }
    let preference: &[OptionKind] = match verdict {
        Verdict::Allow => &[OptionKind::AllowOnce, OptionKind::AllowAlways],
        Verdict::Reject => &[OptionKind::RejectOnce, OptionKind::RejectAlways],
        Verdict::Cancelled => &[],
    };
    preference
        .iter()
        .find_map(|kind| {
            options
                .iter()
                .find(|o| o.kind.known() == Some(*kind))
                .map(|o| Outcome::Selected {
                    option_id: o.option_id.clone(),
                    kind: *kind,
                })
        })
        .unwrap_or(Outcome::Cancelled)
}

/// Whether one `optionId` is offered under two different kinds: whatever the host selects, the
/// agent may read it as the other kind (an allow), so such an offer is answered `cancelled`.
#[must_use]
pub fn ambiguous(options: &[OfferedOption]) -> bool {
    options.iter().enumerate().any(|(i, a)| {
        options[i + 1..]
            .iter()
            .any(|b| a.option_id == b.option_id && a.kind != b.kind)
    })
}

/// The verdict a non-interactive policy gives (`Ask` without a terminal rejects).
#[must_use]
pub fn policy_verdict(policy: PermissionPolicy) -> Verdict {
    match policy {
        PermissionPolicy::Allow => Verdict::Allow,
        PermissionPolicy::Reject | PermissionPolicy::Ask => Verdict::Reject,
    }
}

/// What one permission request is about, as a handler sees it: the agent's own fields, completed
/// from earlier tool call updates (a request may carry only the tool call id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionRequest {
    /// The child session the request was made on, when it is not the run's own session (a
    /// child the agent exposed); `None` for the run's own session.
    pub session_id: Option<String>,
    pub tool_call_id: String,
    pub title: Option<String>,
    /// The tool kind (`edit`, `execute`, ...).
    pub tool_kind: Option<String>,
    /// The options offered, in the agent's order, with their ids and kinds (options of a kind
    /// newer than this host are included as [`OfferedKind::Unknown`]: they are never chosen).
    pub offered: Vec<OfferedOption>,
    /// The tool call as the agent sent it with the request (its content, `diff` blocks included,
    /// its locations and raw input), so a handler that asks a person further (a delegating agent
    /// relaying to its editor) shows what is being approved; `None` when it did not decode.
    pub tool_call: Option<Box<agent_client_protocol_schema::v1::ToolCallUpdateFields>>,
}

/// Who decided a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DecidedBy {
    /// The `--permission` policy (`reject`, `allow`, or `ask` without a terminal).
    Policy,
    /// A person: at the terminal, or behind a library caller's handler (an editor).
    User,
    /// The host had cancelled the turn.
    Cancel,
}

impl DecidedBy {
    /// The kebab-case name, as serialized and printed.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Policy => "policy",
            DecidedBy::User => "user",
            DecidedBy::Cancel => "cancel",
        }
    }
}

/// One answered request, recorded in the run result and streamed under `--json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionDecision {
    /// The child session the request was made on; absent for the run's own session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub tool_call_id: String,
    /// The tool call's title, when the agent gave one.
    pub title: Option<String>,
    /// The tool kind (`edit`, `execute`, ...), when the agent gave one.
    pub tool_kind: Option<String>,
    pub offered: Vec<OfferedOption>,
    pub verdict: Verdict,
    pub decided_by: DecidedBy,
    pub outcome: Outcome,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serialized_ones_and_a_verdict_answers_as_itself() {
        for (verdict, name) in [
            (Verdict::Allow, "allow"),
            (Verdict::Reject, "reject"),
            (Verdict::Cancelled, "cancelled"),
        ] {
            assert_eq!(verdict.as_str(), name);
            assert_eq!(serde_json::to_value(verdict).unwrap(), name);
            assert_eq!(Answer::from(verdict).verdict(), verdict);
        }
        for (decided_by, name) in [
            (DecidedBy::Policy, "policy"),
            (DecidedBy::User, "user"),
            (DecidedBy::Cancel, "cancel"),
        ] {
            assert_eq!(decided_by.as_str(), name);
            assert_eq!(serde_json::to_value(decided_by).unwrap(), name);
        }
    }

    fn opt(id: &str, kind: OptionKind) -> OfferedOption {
        OfferedOption {
            option_id: id.into(),
            kind: kind.into(),
        }
    }

    fn unknown(id: &str, kind: &str) -> OfferedOption {
        OfferedOption {
            option_id: id.into(),
            kind: OfferedKind::Unknown(kind.into()),
        }
    }

    #[test]
    fn kinds_are_read_from_their_wire_names() {
        assert_eq!(
            OfferedKind::from_wire("allow_always"),
            OfferedKind::Known(OptionKind::AllowAlways)
        );
        assert_eq!(
            OfferedKind::from_wire("allow_forever"),
            OfferedKind::Unknown("allow_forever".into())
        );
        // Recorded as the agent sent it: known kinds keep their wire shape.
        let json = serde_json::to_value([opt("a", OptionKind::AllowOnce), unknown("b", "x")]);
        assert_eq!(
            json.unwrap(),
            serde_json::json!([{"optionId": "a", "kind": "allow_once"},
                               {"optionId": "b", "kind": "x"}])
        );
    }

    #[test]
    fn unknown_kinds_are_never_chosen() {
        let options = [
            unknown("forever", "allow_forever"),
            unknown("nameless", ""),
            opt("no", OptionKind::RejectOnce),
        ];
        assert_eq!(choose(Verdict::Allow, &options), Outcome::Cancelled);
        assert_eq!(
            choose(Verdict::Reject, &options),
            Outcome::Selected {
                option_id: "no".into(),
                kind: OptionKind::RejectOnce
            }
        );
        assert_eq!(
            choose_answer(Answer::Kind(OptionKind::AllowAlways), &options[..2]),
            Outcome::Cancelled
        );
    }

    #[test]
    fn an_id_offered_under_two_kinds_is_cancelled_whatever_the_verdict() {
        let options = [
            opt("x", OptionKind::AllowOnce),
            opt("x", OptionKind::RejectOnce),
            opt("never", OptionKind::RejectAlways),
        ];
        assert!(ambiguous(&options));
        for verdict in [Verdict::Allow, Verdict::Reject] {
            assert_eq!(choose(verdict, &options), Outcome::Cancelled, "{verdict:?}");
        }
        assert_eq!(
            choose_answer(Answer::Kind(OptionKind::RejectAlways), &options),
            Outcome::Cancelled
        );
        // An unknown kind sharing an id with a reject could mean allow: ambiguous too.
        let options = [
            opt("1", OptionKind::RejectOnce),
            unknown("1", "allow_forever"),
        ];
        assert_eq!(choose(Verdict::Reject, &options), Outcome::Cancelled);
        // The same id twice under one kind means one thing.
        let options = [
            opt("no", OptionKind::RejectOnce),
            opt("no", OptionKind::RejectOnce),
        ];
        assert!(!ambiguous(&options));
        assert!(matches!(
            choose(Verdict::Reject, &options),
            Outcome::Selected { .. }
        ));
    }

    #[test]
    fn allow_prefers_once_over_always_regardless_of_order() {
        let options = [
            opt("always", OptionKind::AllowAlways),
            opt("no", OptionKind::RejectOnce),
            opt("once", OptionKind::AllowOnce),
        ];
        assert_eq!(
            choose(Verdict::Allow, &options),
            Outcome::Selected {
                option_id: "once".into(),
                kind: OptionKind::AllowOnce
            }
        );
        assert_eq!(
            choose(Verdict::Allow, &options[..2]),
            Outcome::Selected {
                option_id: "always".into(),
                kind: OptionKind::AllowAlways
            }
        );
    }

    #[test]
    fn reject_prefers_once_then_always_then_cancelled() {
        let options = [
            opt("never", OptionKind::RejectAlways),
            opt("no", OptionKind::RejectOnce),
        ];
        assert_eq!(
            choose(Verdict::Reject, &options),
            Outcome::Selected {
                option_id: "no".into(),
                kind: OptionKind::RejectOnce
            }
        );
        assert_eq!(
            choose(Verdict::Reject, &[opt("yes", OptionKind::AllowOnce)]),
            Outcome::Cancelled
        );
    }

    #[test]
    fn allow_without_allow_option_is_cancelled() {
        assert_eq!(
            choose(Verdict::Allow, &[opt("no", OptionKind::RejectOnce)]),
            Outcome::Cancelled
        );
    }

    #[test]
    fn cancelled_verdict_always_cancels() {
        assert_eq!(
            choose(Verdict::Cancelled, &[opt("yes", OptionKind::AllowOnce)]),
            Outcome::Cancelled
        );
    }

    #[test]
    fn an_answer_by_kind_picks_that_kind_else_its_verdict() {
        let options = [
            opt("once", OptionKind::AllowOnce),
            opt("always", OptionKind::AllowAlways),
            opt("no", OptionKind::RejectOnce),
        ];
        assert_eq!(
            choose_answer(Answer::Kind(OptionKind::AllowAlways), &options),
            Outcome::Selected {
                option_id: "always".into(),
                kind: OptionKind::AllowAlways
            }
        );
        assert_eq!(
            choose_answer(Answer::Kind(OptionKind::RejectAlways), &options),
            Outcome::Selected {
                option_id: "no".into(),
                kind: OptionKind::RejectOnce
            }
        );
        assert_eq!(
            choose_answer(Answer::Allow, &options),
            choose(Verdict::Allow, &options)
        );
        assert_eq!(
            choose_answer(Answer::Cancelled, &options),
            Outcome::Cancelled
        );
        assert_eq!(
            Answer::Kind(OptionKind::RejectAlways).verdict(),
            Verdict::Reject
        );
    }

    #[test]
    fn ask_without_terminal_rejects() {
        assert_eq!(policy_verdict(PermissionPolicy::Ask), Verdict::Reject);
        assert_eq!(policy_verdict(PermissionPolicy::Reject), Verdict::Reject);
        assert_eq!(policy_verdict(PermissionPolicy::Allow), Verdict::Allow);
    }
}
