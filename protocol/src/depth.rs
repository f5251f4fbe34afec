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
//! variable), never reads as "no limit"; a number past [`MAX_CHAIN_DEPTH`] (depth or cap) reads
//! as standing at the cap, with a [`PastBound`] for the caller to log: the agent holding it runs
//! but may not start another; the cap can only shrink down a chain.

use std::num::IntErrorKind;

use crate::env_vars::{ACP_HOST_DEPTH, ACP_HOST_MAX_DEPTH};

/// The cap when nobody sets one: an editor's agent (depth 0) may delegate, its children may not.
pub const DEFAULT_MAX_DEPTH: u32 = 1;

/// The deepest a chain of agents may go, whatever its cap says. A depth or cap past it (counted
/// up towards `u32::MAX`, typed by hand, or forged) reads as standing at the cap, so a chain
/// always ends: with arithmetic that saturated instead, a depth near `u32::MAX` would stay at a
/// cap of `u32::MAX` forever and never be refused. 64 is far past any real chain (a person's
/// agent, its subagents and theirs: a handful of levels) and far from overflowing `depth + 1`.
pub const MAX_CHAIN_DEPTH: u32 = 64;

/// Where an agent stands in its chain: its depth and the deepest an agent of the chain may be
/// (not [`crate::usage::Budget`], the tokens and cost a run may spend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthBudget {
    pub depth: u32,
    pub max_depth: u32,
}

impl DepthBudget {
    /// Whether an agent standing here may start another one (prompt and execution face alike).
    #[must_use]
    pub fn may_delegate(self) -> bool {
        self.depth < self.max_depth
    }

    /// This standing with the cap lowered to `cap` (a session's own limit); never raised.
    #[must_use]
    pub fn lowered(self, cap: Option<u32>) -> Self {
        DepthBudget {
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
    /// The starting process stands at the cap because a value it inherited is past the bound.
    #[error("depth limit: {0}; refusing to start an agent")]
    PastBound(PastBound),
}

/// A number past [`MAX_CHAIN_DEPTH`], read as standing at the cap. Not an error for the agent
/// holding it (it runs, without delegation): a warning its caller logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name}={value} is past {MAX_CHAIN_DEPTH}, the deepest a chain of agents may go, so it reads \
     as at the cap"
)]
pub struct PastBound {
    /// The variable, or `maxDepth` for a cap requested at start (`--max-depth`, a definition's
    /// `maxDepth`).
    pub name: &'static str,
    /// The value as given (at most its first 40 characters).
    pub value: String,
}

/// A standing as read, and the number past [`MAX_CHAIN_DEPTH`] that put it at the cap, if one
/// did (for the caller to log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub budget: DepthBudget,
    pub past_bound: Option<PastBound>,
}

impl Standing {
    /// Standing at `depth` with the cap there: may run, may not start another agent.
    fn at_cap(depth: u32, past_bound: PastBound) -> Self {
        Standing {
            budget: DepthBudget {
                depth,
                max_depth: depth,
            },
            past_bound: Some(past_bound),
        }
    }
}

/// The inherited values, as the starting process sees them (`None`: unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inherited<'a> {
    pub depth: Option<&'a str>,
    pub max_depth: Option<&'a str>,
}

/// Where the process holding `inherited` stands itself (an agent reading its own environment):
/// unset depth is 0, unset cap is the default. A depth past [`MAX_CHAIN_DEPTH`] stands at the
/// cap there; a cap past it puts the cap at the depth.
pub fn own(inherited: Inherited<'_>) -> Result<Standing, DepthError> {
    let depth = parse(ACP_HOST_DEPTH, inherited.depth)?;
    let max_depth = parse(ACP_HOST_MAX_DEPTH, inherited.max_depth)?;
    Ok(match (depth, max_depth) {
        (Value::Past(past), _) => Standing::at_cap(MAX_CHAIN_DEPTH, past),
        (depth, Value::Past(past)) => Standing::at_cap(depth.or(0), past),
        (depth, max_depth) => Standing {
            budget: DepthBudget {
                depth: depth.or(0),
                max_depth: max_depth.or(DEFAULT_MAX_DEPTH),
            },
            past_bound: None,
        },
    })
}

/// The budget of an agent started by a process holding `inherited`, with the caps `requested`
/// (definition, flag); refused when its depth would exceed the cap, or when the starting agent
/// stands at the cap because a value it inherited is past [`MAX_CHAIN_DEPTH`]. A cap past it
/// that reaches the new agent anyway (a person's process holding one, or one requested) puts the
/// cap at the new agent's depth: it runs, but may not delegate.
pub fn child(inherited: Inherited<'_>, requested: &[Option<u32>]) -> Result<Standing, DepthError> {
    let parent = parse(ACP_HOST_DEPTH, inherited.depth)?;
    let inherited_cap = parse(ACP_HOST_MAX_DEPTH, inherited.max_depth)?;
    let (depth, inherited_cap) = match (parent, inherited_cap) {
        // An agent at the cap may not start another.
        (Value::Past(past), _) | (Value::Within(_), Value::Past(past)) => {
            return Err(DepthError::PastBound(past));
        }
        // Not an agent (a person's shell) but holding a cap past the bound.
        (Value::Unset, Value::Past(past)) => return Ok(Standing::at_cap(0, past)),
        (parent, cap) => (
            match parent {
                // At most MAX_CHAIN_DEPTH + 1: no overflow.
                Value::Within(parent) => parent + 1,
                Value::Unset | Value::Past(_) => 0,
            },
            match cap {
                Value::Within(cap) => Some(cap),
                Value::Unset | Value::Past(_) => None,
            },
        ),
    };
    let max_depth = std::iter::once(inherited_cap)
        .chain(requested.iter().copied())
        .flatten()
        .min()
        .unwrap_or(DEFAULT_MAX_DEPTH);
    let (max_depth, past_bound) = if max_depth > MAX_CHAIN_DEPTH {
        let past = PastBound {
            name: "maxDepth",
            value: max_depth.to_string(),
        };
        (depth.min(MAX_CHAIN_DEPTH), Some(past))
    } else {
        (max_depth, None)
    };
    if depth > max_depth {
        return Err(DepthError::Exceeded { depth, max_depth });
    }
    Ok(Standing {
        budget: DepthBudget { depth, max_depth },
        past_bound,
    })
}

/// An inherited value, read.
enum Value {
    Unset,
    /// A whole number up to [`MAX_CHAIN_DEPTH`].
    Within(u32),
    /// A whole number past it (one too large for a `u32` included).
    Past(PastBound),
}

impl Value {
    /// The number, or `unset` for an unset value (callers deal with [`Value::Past`] first).
    fn or(self, unset: u32) -> u32 {
        match self {
            Value::Within(value) => value,
            Value::Unset | Value::Past(_) => unset,
        }
    }
}

/// An empty value counts as unset, like every variable of the workspace; a whole number too large
/// for `u32` is past the bound like any other above it, anything else is malformed.
fn parse(name: &'static str, value: Option<&str>) -> Result<Value, DepthError> {
    let Some(text) = value.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(Value::Unset);
    };
    let past = || {
        Value::Past(PastBound {
            name,
            value: text.chars().take(40).collect(),
        })
    };
    match text.parse::<u32>() {
        Ok(value) if value <= MAX_CHAIN_DEPTH => Ok(Value::Within(value)),
        Ok(_) => Ok(past()),
        Err(error) if *error.kind() == IntErrorKind::PosOverflow => Ok(past()),
        Err(_) => Err(DepthError::Malformed {
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

    /// A child's budget, asserting no value was past the bound.
    fn child_budget(inherited: Inherited<'_>, requested: &[Option<u32>]) -> DepthBudget {
        let standing = child(inherited, requested).unwrap();
        assert_eq!(standing.past_bound, None);
        standing.budget
    }

    /// An agent's own budget, asserting no value was past the bound.
    fn own_budget(inherited: Inherited<'_>) -> DepthBudget {
        let standing = own(inherited).unwrap();
        assert_eq!(standing.past_bound, None);
        standing.budget
    }

    fn budget(depth: u32, max_depth: u32) -> DepthBudget {
        DepthBudget { depth, max_depth }
    }

    fn past(name: &'static str, value: &str) -> PastBound {
        PastBound {
            name,
            value: value.to_owned(),
        }
    }

    #[test]
    fn a_person_starts_depth_0_and_its_agent_may_delegate_once_by_default() {
        let top = child_budget(Inherited::default(), &[]);
        assert_eq!(
            top,
            DepthBudget {
                depth: 0,
                max_depth: 1
            }
        );
        assert!(top.may_delegate());
        let [(_, depth), (_, max)] = top.env();
        let second = child_budget(inherited(Some(&depth), Some(&max)), &[]);
        assert_eq!(
            second,
            DepthBudget {
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
        assert_eq!(child_budget(Inherited::default(), &[Some(3)]).max_depth, 3);
        assert_eq!(
            child_budget(inherited(None, Some("2")), &[Some(5), None]).max_depth,
            2
        );
        assert_eq!(
            child_budget(inherited(Some("0"), Some("4")), &[Some(3), Some(2)]),
            DepthBudget {
                depth: 1,
                max_depth: 2
            }
        );
        assert_eq!(
            child_budget(Inherited::default(), &[Some(0)]),
            DepthBudget {
                depth: 0,
                max_depth: 0
            }
        );
        assert!(!child_budget(Inherited::default(), &[Some(0)]).may_delegate());
    }

    #[test]
    fn a_session_cap_only_lowers() {
        let budget = DepthBudget {
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
            own_budget(Inherited::default()),
            DepthBudget {
                depth: 0,
                max_depth: 1
            }
        );
        assert_eq!(
            own_budget(inherited(Some("1"), Some(""))),
            DepthBudget {
                depth: 1,
                max_depth: 1
            }
        );
    }

    #[test]
    fn values_up_to_the_bound_count_as_they_are() {
        let bound = MAX_CHAIN_DEPTH.to_string();
        assert_eq!(MAX_CHAIN_DEPTH, 64);
        assert_eq!(
            own_budget(inherited(Some(&bound), Some(&bound))),
            budget(64, 64)
        );
        assert_eq!(own_budget(inherited(Some("3"), Some("64"))), budget(3, 64));
        assert!(own_budget(inherited(Some("63"), Some("64"))).may_delegate());
        assert_eq!(
            child_budget(inherited(Some("63"), Some("64")), &[]),
            budget(64, 64)
        );
        assert_eq!(
            child(inherited(Some("64"), Some("64")), &[]),
            Err(DepthError::Exceeded {
                depth: 65,
                max_depth: 64
            })
        );
        assert_eq!(
            child_budget(Inherited::default(), &[Some(64)]),
            budget(0, 64)
        );
    }

    #[test]
    fn a_depth_past_the_bound_stands_at_the_cap_and_starts_nothing() {
        for depth in [
            "65",
            "4294967294",
            "4294967295",
            "4294967296",
            "99999999999999999999",
        ] {
            for cap in [None, Some("1"), Some("64"), Some("65"), Some("4294967295")] {
                let standing = own(inherited(Some(depth), cap)).unwrap();
                assert_eq!(standing.budget, budget(64, 64), "{depth}/{cap:?}");
                assert!(!standing.budget.may_delegate());
                assert_eq!(standing.past_bound, Some(past(ACP_HOST_DEPTH, depth)));
                assert_eq!(
                    child(inherited(Some(depth), cap), &[]),
                    Err(DepthError::PastBound(past(ACP_HOST_DEPTH, depth))),
                    "{depth}/{cap:?}"
                );
                // What such an agent passes on to its commands is refused one level down.
                let [(_, depth), (_, max)] = standing.budget.env();
                assert!(matches!(
                    child(inherited(Some(&depth), Some(&max)), &[]),
                    Err(DepthError::Exceeded { .. })
                ));
            }
        }
        assert_eq!(
            child(inherited(Some("4294967294"), Some("4294967295")), &[])
                .unwrap_err()
                .to_string(),
            "depth limit: ACP_HOST_DEPTH=4294967294 is past 64, the deepest a chain of agents may \
             go, so it reads as at the cap; refusing to start an agent"
        );
    }

    #[test]
    fn a_cap_past_the_bound_puts_the_cap_at_the_depth() {
        for cap in ["65", "4294967294", "4294967295", "4294967296"] {
            for (depth, at) in [(None, 0), (Some("0"), 0), (Some("3"), 3), (Some("64"), 64)] {
                let standing = own(inherited(depth, Some(cap))).unwrap();
                assert_eq!(standing.budget, budget(at, at), "{depth:?}/{cap}");
                assert!(!standing.budget.may_delegate());
                assert_eq!(standing.past_bound, Some(past(ACP_HOST_MAX_DEPTH, cap)));
            }
            // An agent holding it may not start another...
            assert_eq!(
                child(inherited(Some("3"), Some(cap)), &[]),
                Err(DepthError::PastBound(past(ACP_HOST_MAX_DEPTH, cap)))
            );
            // ...and a person's process holding it starts an agent at the cap.
            let standing = child(inherited(None, Some(cap)), &[Some(5)]).unwrap();
            assert_eq!(standing.budget, budget(0, 0));
            assert_eq!(standing.past_bound, Some(past(ACP_HOST_MAX_DEPTH, cap)));
        }
        assert_eq!(
            past(ACP_HOST_MAX_DEPTH, "65").to_string(),
            "ACP_HOST_MAX_DEPTH=65 is past 64, the deepest a chain of agents may go, so it reads \
             as at the cap"
        );
    }

    #[test]
    fn a_requested_cap_past_the_bound_puts_the_cap_at_the_new_depth() {
        for cap in [65, u32::MAX - 1, u32::MAX] {
            let standing = child(Inherited::default(), &[Some(cap)]).unwrap();
            assert_eq!(standing.budget, budget(0, 0));
            assert_eq!(
                standing.past_bound,
                Some(past("maxDepth", &cap.to_string()))
            );
            let standing = child(inherited(Some("2"), None), &[Some(cap)]).unwrap();
            assert_eq!(standing.budget, budget(3, 3));
            assert!(!standing.budget.may_delegate());
            // A smaller cap in the chain still wins, and nothing is past the bound then.
            assert_eq!(
                child_budget(inherited(Some("2"), Some("5")), &[Some(cap)]),
                budget(3, 5)
            );
            assert_eq!(
                child(inherited(Some("64"), None), &[Some(cap)]),
                Err(DepthError::Exceeded {
                    depth: 65,
                    max_depth: 64
                })
            );
        }
    }

    #[test]
    fn a_chain_that_keeps_starting_agents_ends_at_the_bound() {
        // The cap as high as it may be: every level starts the next until the bound refuses it.
        let mut env = [
            (ACP_HOST_DEPTH, String::new()),
            (ACP_HOST_MAX_DEPTH, MAX_CHAIN_DEPTH.to_string()),
        ];
        let mut levels = 0;
        while let Ok(standing) = child(inherited(Some(&env[0].1), Some(&env[1].1)), &[]) {
            assert_eq!(standing.past_bound, None);
            env = standing.budget.env();
            levels += 1;
            assert!(levels <= MAX_CHAIN_DEPTH + 1, "the chain never ended");
        }
        assert_eq!(levels, MAX_CHAIN_DEPTH + 1);
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
        // Checked before any bound: a malformed value beside one past it still fails closed.
        for (depth, cap) in [("4294967295", "x"), ("deep", "4294967295")] {
            assert!(matches!(
                own(inherited(Some(depth), Some(cap))),
                Err(DepthError::Malformed { .. })
            ));
            assert!(matches!(
                child(inherited(Some(depth), Some(cap)), &[]),
                Err(DepthError::Malformed { .. })
            ));
        }
    }
}
