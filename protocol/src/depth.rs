//! The delegation depth budget: how deep a chain of agents starting agents may go.
//!
//! Every agent started through acp-host's library is told its depth and the cap in its
//! environment ([`crate::env_vars::ACP_HOST_DEPTH`], [`crate::env_vars::ACP_HOST_MAX_DEPTH`]). An
//! agent started by a person (a shell, an editor: a process without `ACP_HOST_DEPTH`) has depth 0;
//! one started from a process with `ACP_HOST_DEPTH=d` (an agent delegating, or a command such an
//! agent runs) has depth `d + 1`. The cap is the smallest of the inherited `ACP_HOST_MAX_DEPTH`,
//! the definition's `maxDepth` and the flag, [`DEFAULT_MAX_DEPTH`] when none is given; an agent
//! whose depth would exceed it is not started, and an agent at the cap is not offered delegation.
//!
//! What this is: a budget against runaway recursion (a model delegating to itself forever). What
//! it is not: a security boundary: a process that clears its environment escapes it.
//!
//! Invariants: pure; a malformed inherited value fails closed (the start is refused, naming the
//! variable), never reads as "no limit"; the cap can only shrink down a chain.

use crate::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};

/// The cap when nobody sets one: an editor's agent (depth 0) may delegate, its children may not.
pub const DEFAULT_MAX_DEPTH: u32 = 1;

/// Where an agent stands: its depth and the deepest an agent of its chain may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub depth: u32,
    pub max_depth: u32,
}

impl Budget {
    /// Whether an agent standing here may start another one (prompt and execution face alike).
    #[must_use]
    pub fn may_delegate(self) -> bool {
        self.depth < self.max_depth
    }

    /// This standing with the cap lowered to `cap` (a session's own limit); never raised.
    #[must_use]
    pub fn lowered(self, cap: Option<u32>) -> Self {
        Budget {
            depth: self.depth,
            max_depth: cap.map_or(self.max_depth, |cap| cap.min(self.max_depth)),
        }
    }

    /// The environment an agent standing here is given: depth and cap, as decimal text.
    #[must_use]
    pub fn env(self) -> [(&'static str, String); 2] {
        [
            (ACP_HOST_DEPTH, self.depth.to_string()),
            (ACP_HOST_MAX_DEPTH, self.max_depth.to_string()),
        ]
    }
}

/// Why an agent may not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DepthError {
    #[error(
        "depth limit: the agent would run at depth {depth}, deeper than the limit of {max_depth} \
         (raise it with --max-depth or the definition's maxDepth where the limit allows; \
         {ACP_HOST_MAX_DEPTH} set by a parent can only shrink)"
    )]
    Exceeded { depth: u32, max_depth: u32 },
    #[error("depth limit: {name}={value:?} is not a whole number; refusing to start an agent")]
    Malformed { name: &'static str, value: String },
}

/// The inherited values, as the starting process sees them (`None`: unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inherited<'a> {
    pub depth: Option<&'a str>,
    pub max_depth: Option<&'a str>,
}

/// Where the process holding `inherited` stands itself (an agent reading its own environment):
/// unset depth is 0, unset cap is the default.
pub fn own(inherited: Inherited<'_>) -> Result<Budget, DepthError> {
    let depth = parse(ACP_HOST_DEPTH, inherited.depth)?.unwrap_or(0);
    let max_depth = parse(ACP_HOST_MAX_DEPTH, inherited.max_depth)?.unwrap_or(DEFAULT_MAX_DEPTH);
    Ok(Budget { depth, max_depth })
}

/// The budget of an agent started by a process holding `inherited`, with the caps `requested`
/// (definition, flag); refused when its depth would exceed the cap.
pub fn child(inherited: Inherited<'_>, requested: &[Option<u32>]) -> Result<Budget, DepthError> {
    let depth = match parse(ACP_HOST_DEPTH, inherited.depth)? {
        None => 0,
        Some(parent) => parent.saturating_add(1),
    };
    let max_depth = std::iter::once(parse(ACP_HOST_MAX_DEPTH, inherited.max_depth)?)
        .chain(requested.iter().copied())
        .flatten()
        .min()
        .unwrap_or(DEFAULT_MAX_DEPTH);
    if depth > max_depth {
        return Err(DepthError::Exceeded { depth, max_depth });
    }
    Ok(Budget { depth, max_depth })
}

/// An empty value counts as unset, like every variable of the workspace.
fn parse(name: &'static str, value: Option<&str>) -> Result<Option<u32>, DepthError> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| DepthError::Malformed {
            name,
            value: text.chars().take(40).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inherited<'a>(depth: Option<&'a str>, max_depth: Option<&'a str>) -> Inherited<'a> {
        Inherited { depth, max_depth }
    }

    #[test]
    fn a_person_starts_depth_0_and_its_agent_may_delegate_once_by_default() {
        let top = child(Inherited::default(), &[]).unwrap();
        assert_eq!(
            top,
            Budget {
                depth: 0,
                max_depth: 1
            }
        );
        assert!(top.may_delegate());
        let [(_, depth), (_, max)] = top.env();
        let second = child(inherited(Some(&depth), Some(&max)), &[]).unwrap();
        assert_eq!(
            second,
            Budget {
                depth: 1,
                max_depth: 1
            }
        );
        assert!(!second.may_delegate());
        let [(_, depth), (_, max)] = second.env();
        assert_eq!(
            child(inherited(Some(&depth), Some(&max)), &[]),
            Err(DepthError::Exceeded {
                depth: 2,
                max_depth: 1
            })
        );
    }

    #[test]
    fn the_cap_is_the_smallest_given_and_never_grows_down_a_chain() {
        assert_eq!(
            child(Inherited::default(), &[Some(3)]).unwrap().max_depth,
            3
        );
        assert_eq!(
            child(inherited(None, Some("2")), &[Some(5), None])
                .unwrap()
                .max_depth,
            2
        );
        assert_eq!(
            child(inherited(Some("0"), Some("4")), &[Some(3), Some(2)]).unwrap(),
            Budget {
                depth: 1,
                max_depth: 2
            }
        );
        assert_eq!(
            child(Inherited::default(), &[Some(0)]).unwrap(),
            Budget {
                depth: 0,
                max_depth: 0
            }
        );
        assert!(
            !child(Inherited::default(), &[Some(0)])
                .unwrap()
                .may_delegate()
        );
    }

    #[test]
    fn a_session_cap_only_lowers() {
        let budget = Budget {
            depth: 0,
            max_depth: 2,
        };
        assert_eq!(budget.lowered(None), budget);
        assert_eq!(budget.lowered(Some(5)), budget);
        let lowered = budget.lowered(Some(0));
        assert_eq!(lowered.max_depth, 0);
        assert!(!lowered.may_delegate());
    }

    #[test]
    fn an_agent_reads_its_own_standing() {
        assert_eq!(
            own(Inherited::default()).unwrap(),
            Budget {
                depth: 0,
                max_depth: 1
            }
        );
        assert_eq!(
            own(inherited(Some("1"), Some(""))).unwrap(),
            Budget {
                depth: 1,
                max_depth: 1
            }
        );
    }

    #[test]
    fn malformed_values_fail_closed_and_name_the_variable() {
        let error = child(inherited(Some("lots"), None), &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "depth limit: ACP_HOST_DEPTH=\"lots\" is not a whole number; refusing to start an agent"
        );
        assert!(matches!(
            own(inherited(None, Some("-1"))),
            Err(DepthError::Malformed {
                name: ACP_HOST_MAX_DEPTH,
                ..
            })
        ));
    }
}
