//! What the agent reported spending in this run, and the run's budget held against it.
//!
//! Two reports are read (`protocol::usage`): each prompt response's `usage` (a turn's), summed
//! over the run's prompts; and each `usage_update` of our session, whose `cost` is the session's
//! cumulative cost and whose `_meta` may carry the `acp-host/usage` extension's cumulative token
//! counts (acp-child sends both; opencode sends `cost` on the update and `usage` on the answer),
//! or a `session_info_update` carrying the extension alone (acp-child without a context window).
//!
//! Invariants:
//! - what was spent so far is the larger of the two token reports (the cumulative counts run
//!   ahead of the answers mid-turn; an agent sending only one report is read from that one), with
//!   the last reported cost; nothing when the agent reported no token counts;
//! - the budget is checked on every report; the first overrun is kept and fires [`Tally::passed`]
//!   once, which the run's supervision turns into a cancel (as a deadline does);
//! - when the agent's first reply ends (its first prompt response: an agent reporting through
//!   ACP reports a turn's usage by then at the latest) a budget with nothing reported to hold it
//!   against is judged unheld (`Budget::unheld`): under `Unreported::Error` (the default) that
//!   fires [`Tally::passed`] too and the run ends as an error, under `Unreported::Warn` it only
//!   warns at the end.

use protocol::usage::{Budget, Cost, Overrun, Unreported, Usage};
use tokio_util::sync::CancellationToken;

/// The run's usage reports and budget.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    budget: Budget,
    /// Sum of the prompt responses' `usage`.
    answered: Option<Usage>,
    /// The last `usage_update`'s cumulative counts (the extension).
    cumulative: Option<Usage>,
    /// The last `usage_update`'s cost.
    cost: Option<Cost>,
    overrun: Option<Overrun>,
    passed: CancellationToken,
    /// What [`Tally::take_turn`] last handed out: a kept session's turns each report their own.
    taken: Option<Usage>,
    on_unreported: Unreported,
    /// The first answer came: the budget was judged then.
    judged: bool,
    /// Why the budget cannot be held, when it was judged so under `Unreported::Error`.
    unheld: Option<&'static str>,
}

impl Tally {
    pub(crate) fn new(budget: Budget) -> Self {
        Tally {
            budget,
            ..Tally::default()
        }
    }

    /// What to do when the agent reports nothing to hold the budget against.
    pub(crate) fn on_unreported(self, on_unreported: Unreported) -> Self {
        Tally {
            on_unreported,
            ..self
        }
    }

    /// Why the run was cancelled although its budget was not passed (see the module docs).
    pub(crate) fn unheld(&self) -> Option<&'static str> {
        self.unheld
    }

    /// Fires once the budget is passed.
    pub(crate) fn passed(&self) -> CancellationToken {
        self.passed.clone()
    }

    /// The budget the run holds the agent to (handed to an agent that holds it itself).
    pub(crate) fn budget(&self) -> Budget {
        self.budget
    }

    /// A prompt response's `usage` (the raw answer: a malformed or absent one is no report), and
    /// the budget stop of an agent that holds its budget itself (`protocol::usage::Breakdown`):
    /// the turn it ended for the budget is over budget, as one acp-host cancelled.
    pub(crate) fn answered(&mut self, response: &serde_json::Value) {
        if self.overrun.is_none()
            && self.budget.is_set()
            && let Some(stop) = protocol::usage::answer_budget_stop(response)
        {
            tracing::info!(overrun = %stop, "the agent ended its turn for the run's budget");
            self.overrun = Some(stop);
            self.passed.cancel();
        }
        self.add_answer(response);
        if !self.judged {
            self.judged = true;
            self.judge();
        }
    }

    /// The first reply ended: a budget nothing was reported against cannot be held.
    fn judge(&mut self) {
        let counts = self.answered.is_some() || self.cumulative.is_some();
        let Some(why) = self.budget.unheld(counts, self.cost.is_some()) else {
            return;
        };
        if self.on_unreported == Unreported::Error && self.overrun.is_none() {
            tracing::info!(why, "cancelling the run");
            self.unheld = Some(why);
            self.passed.cancel();
        }
    }

    /// Adds a prompt response's `usage` to the answers' sum.
    fn add_answer(&mut self, response: &serde_json::Value) {
        let Some(usage) = response
            .get("usage")
            .filter(|usage| !usage.is_null())
            .and_then(|usage| {
                serde_json::from_value::<agent_client_protocol::v1::schema::Usage>(usage.clone())
                    .ok()
            })
        else {
            return;
        };
        let usage = Usage {
            estimated: protocol::usage::answer_estimated(response),
            ..Usage::from_acp(&usage)
        };
        match &mut self.answered {
            Some(sum) => sum.add(&usage),
            None => self.answered = Some(usage),
        }
        self.check();
    }

    /// A `usage_update` of our session.
    pub(crate) fn updated(&mut self, update: &agent_client_protocol::v1::schema::UsageUpdate) {
        self.counted(update.meta.as_ref(), update.cost.as_ref());
    }

    /// The cumulative counts of an update's `_meta` (the extension: on a `usage_update`, or on a
    /// `session_info_update` from an agent that knows no context window) and its cost: the
    /// update's own, else the extension's.
    pub(crate) fn counted(
        &mut self,
        meta: Option<&agent_client_protocol::v1::schema::Meta>,
        cost: Option<&agent_client_protocol::v1::schema::Cost>,
    ) {
        let mut counts = Usage::from_meta(meta);
        let cost = cost
            .map(|cost| Cost {
                amount: cost.amount,
                currency: cost.currency.clone(),
            })
            .or_else(|| counts.as_mut().and_then(|counts| counts.cost.take()))
            .filter(|cost| cost.amount.is_finite());
        if let Some(counts) = counts {
            self.cumulative = Some(counts);
        }
        if let Some(cost) = cost {
            self.cost = Some(cost);
        }
        self.check();
    }

    /// What was spent so far (see the module invariants); `None`: no token counts reported.
    pub(crate) fn spent(&self) -> Option<Usage> {
        let tokens = match (&self.answered, &self.cumulative) {
            (Some(answered), Some(cumulative)) => {
                if cumulative.total_tokens > answered.total_tokens {
                    cumulative
                } else {
                    answered
                }
            }
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => return None,
        };
        Some(Usage {
            cost: self.cost.clone(),
            ..tokens.clone()
        })
    }

    /// What was spent since the previous call (a kept session's turn), or in all (a run's only
    /// turn); `None` when the agent never reported token counts.
    pub(crate) fn take_turn(&mut self) -> Option<Usage> {
        let now = self.spent()?;
        let turn = match &self.taken {
            Some(taken) => now.since(taken),
            None => now.clone(),
        };
        self.taken = Some(now);
        Some(turn)
    }

    /// The overrun, once the budget was passed.
    pub(crate) fn overrun(&self) -> Option<&Overrun> {
        self.overrun.as_ref()
    }

    /// Why the budget could not be held, for the result's warnings (none when the run already
    /// ended as an error for it, or was held to it: an agent holding its budget may stop before
    /// it spent anything).
    pub(crate) fn unenforceable(&self) -> Option<&'static str> {
        if self.unheld.is_some() || self.overrun.is_some() {
            return None;
        }
        self.budget.unenforceable(self.spent().as_ref())
    }

    fn check(&mut self) {
        if self.overrun.is_some() || !self.budget.is_set() {
            return;
        }
        // A cost alone (no token counts) is still held against a cost budget.
        let spent = self.spent().unwrap_or_else(|| Usage {
            cost: self.cost.clone(),
            ..Usage::default()
        });
        if let Some(overrun) = self.budget.check(&spent) {
            tracing::info!(%overrun, "the run passed its budget; cancelling");
            self.overrun = Some(overrun);
            self.passed.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::UsageUpdate;
    use serde_json::json;

    use super::*;

    fn update(meta_total: Option<u64>, cost: Option<f64>) -> UsageUpdate {
        let mut value = json!({"used": 1, "size": 10});
        if let Some(total) = meta_total {
            value["_meta"] = json!({"acp-host/usage": {"version": 1, "inputTokens": total,
                "outputTokens": 0, "totalTokens": total}});
        }
        if let Some(amount) = cost {
            value["cost"] = json!({"amount": amount, "currency": "USD"});
        }
        serde_json::from_value(value).unwrap()
    }

    fn answer(total: u64) -> serde_json::Value {
        json!({"stopReason": "end_turn",
            "usage": {"totalTokens": total, "inputTokens": total, "outputTokens": 0}})
    }

    #[test]
    fn nothing_reported_is_no_usage_and_an_unheld_budget() {
        let budget = Budget {
            tokens: Some(10),
            cost: None,
        };
        let mut tally = Tally::new(budget).on_unreported(Unreported::Warn);
        tally.answered(&json!({"stopReason": "end_turn"}));
        tally.answered(&json!({"stopReason": "end_turn", "usage": "lots"}));
        assert_eq!(tally.spent(), None);
        assert!(tally.unenforceable().is_some());
        assert!(!tally.passed().is_cancelled());
        assert_eq!(tally.unheld(), None);
        // By default the first reply's end cancels it.
        let mut tally = Tally::new(budget);
        tally.answered(&json!({"stopReason": "end_turn"}));
        assert!(tally.passed().is_cancelled());
        assert_eq!(tally.unheld(), Some(protocol::usage::UNREPORTED_USAGE));
        assert_eq!(tally.unenforceable(), None, "an error, not also a warning");
        // Reported by then: held.
        let mut tally = Tally::new(budget);
        tally.answered(&answer(5));
        tally.answered(&json!({"stopReason": "end_turn"}));
        assert!(!tally.passed().is_cancelled());
    }

    #[test]
    fn answers_are_summed_and_cumulative_counts_win_while_ahead() {
        let mut tally = Tally::new(Budget::default());
        tally.answered(&answer(5));
        tally.answered(&answer(7));
        assert_eq!(tally.spent().map(|u| u.total_tokens), Some(12));
        tally.updated(&update(Some(20), Some(0.5)));
        let spent = tally.spent().unwrap();
        assert_eq!(spent.total_tokens, 20);
        assert_eq!(spent.cost.map(|c| c.amount), Some(0.5));
        tally.answered(&answer(30));
        assert_eq!(tally.spent().map(|u| u.total_tokens), Some(42));
    }

    #[test]
    fn each_turn_taken_reports_what_was_spent_since_the_last() {
        let mut tally = Tally::new(Budget::default());
        assert_eq!(tally.take_turn(), None);
        tally.answered(&answer(5));
        assert_eq!(tally.take_turn().map(|u| u.total_tokens), Some(5));
        tally.answered(&answer(7));
        assert_eq!(tally.take_turn().map(|u| u.total_tokens), Some(7));
        assert_eq!(tally.take_turn().map(|u| u.total_tokens), Some(0));
    }

    #[test]
    fn the_first_overrun_is_kept_and_fires_once() {
        let mut tally = Tally::new(Budget {
            tokens: Some(10),
            cost: None,
        });
        tally.updated(&update(Some(8), None));
        assert!(tally.overrun().is_none());
        tally.updated(&update(Some(11), None));
        assert!(tally.passed().is_cancelled());
        tally.updated(&update(Some(50), None));
        assert_eq!(
            tally.overrun().map(ToString::to_string).as_deref(),
            Some("used 11 tokens, over the token budget of 10")
        );
    }

    #[test]
    fn an_agent_that_stopped_for_the_budget_is_over_it() {
        let stop = json!({"stopReason": "max_tokens", "_meta": {"acp-host/usage": {"version": 1,
            "own": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "budgetStop": {"passed": "nextTokens", "used": 0, "next": 30, "limit": 20}}}});
        let mut unbudgeted = Tally::new(Budget::default());
        unbudgeted.answered(&stop);
        assert!(
            unbudgeted.overrun().is_none(),
            "no budget of ours: not ours to judge"
        );
        let mut tally = Tally::new(Budget {
            tokens: Some(20),
            cost: None,
        });
        assert_eq!(tally.budget().tokens, Some(20));
        tally.answered(&stop);
        assert!(tally.passed().is_cancelled());
        assert_eq!(
            tally.unenforceable(),
            None,
            "held, though nothing was spent"
        );
        assert!(
            tally
                .overrun()
                .map(ToString::to_string)
                .is_some_and(|text| text.contains("the next model request (about 30 tokens)")),
            "{:?}",
            tally.overrun()
        );
    }

    #[test]
    fn a_cost_alone_is_held_against_a_cost_budget() {
        let mut tally = Tally::new(Budget {
            tokens: None,
            cost: Some(0.1),
        });
        tally.updated(&update(None, Some(0.05)));
        assert!(tally.overrun().is_none());
        tally.updated(&update(None, Some(0.2)));
        assert!(tally.passed().is_cancelled());
        assert_eq!(tally.spent(), None, "no token counts: no usage");
    }
}
