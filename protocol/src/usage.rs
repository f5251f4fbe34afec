//! What a run spent and what it may spend: token usage (the result's `usage`), its sums across a
//! tree of subagents, the `acp-host/usage` extension that carries cumulative counts on a
//! `usage_update`, the pricing acp-child computes a cost from, and budgets.
//!
//! Invariants:
//! - usage is what an agent reported (for acp-child, what its model server reported); where a
//!   server reports none, acp-child counts what it streamed ([`estimate`]: a delta a token, at
//!   least one token per [`BYTES_PER_TOKEN`] bytes) and the figure says so (`estimated`), down to
//!   every sum it is part of; a cost exists only when it was reported or priced from figures the
//!   person gave ([`Pricing`]);
//! - a sum's cost is the sum of its parts' costs only when every part that spent something
//!   reported one, in one currency; otherwise the sum has no cost (a partial figure would pass
//!   for the whole);
//! - a budget is passed when a reported figure goes over it (`>`), an estimated one included (a
//!   marked estimate is the best figure there is); an agent that reports nothing cannot be held to
//!   one ([`Budget::check`] then says nothing);
//! - budgets only go down the tree: a child's budget is at most what is left of its parent's
//!   ([`child_budget`]).

use serde::{Deserialize, Serialize};

use agent_client_protocol_schema::v1 as acp;

/// The key of the `acp-host/usage` extension in an ACP `_meta` (docs/start-extension.md).
pub const META_KEY: &str = "acp-host/usage";
/// The extension's version.
pub const META_VERSION: u64 = 1;
/// The most children a turn's breakdown lists; later ones are summed into the total only.
pub const MAX_BREAKDOWN_CHILDREN: usize = 256;

/// Tokens (and, when known, cost) spent: a run's, a turn's, or a child's. Serialized as the
/// result's `usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// As reported: usually input + output.
    pub total_tokens: u64,
    /// Reasoning tokens, when reported (most servers count them in `outputTokens` too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought_tokens: Option<u64>,
    /// Input tokens read from the server's cache, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_read_tokens: Option<u64>,
    /// Input tokens written to the server's cache, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_write_tokens: Option<u64>,
    /// What it cost, when the agent reported a cost (priced from estimated counts when
    /// `estimated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// The counts are (at least in part) an estimate: the model server reported none, so the agent
    /// counted what it streamed ([`estimate`]). Absent when every count was reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

/// The bytes of text counted as one token where nothing better is known: English text and code
/// run at about four bytes a token on the tokenizers of today's models.
pub const BYTES_PER_TOKEN: u64 = 4;

/// What one model request spent, estimated (its server reported no usage): the input at
/// [`BYTES_PER_TOKEN`] (`input_bytes`: the request's body), the output the larger of the deltas
/// streamed (`deltas`: llama.cpp-style servers send a token a delta) and its text at
/// [`BYTES_PER_TOKEN`] (`output_bytes`; a server sending several tokens a delta is not counted
/// short). Marked `estimated`.
#[must_use]
pub fn estimate(input_bytes: u64, deltas: u64, output_bytes: u64) -> Usage {
    let input_tokens = input_bytes.div_ceil(BYTES_PER_TOKEN);
    let output_tokens = deltas.max(output_bytes.div_ceil(BYTES_PER_TOKEN));
    Usage {
        input_tokens,
        output_tokens,
        total_tokens: input_tokens.saturating_add(output_tokens),
        estimated: true,
        ..Usage::default()
    }
}

/// An amount in a currency (an ISO 4217 code such as `USD`, or another unit the agent names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub amount: f64,
    pub currency: String,
}

impl Usage {
    /// Nothing spent and no cost: adding it changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.total_tokens == 0
            && self.input_tokens == 0
            && self.output_tokens == 0
            && self.cost.is_none()
    }

    /// Adds `other` (a child's usage to its parent's turn, a turn to a session, a record to a
    /// batch's total). See the module invariants for the cost.
    pub fn add(&mut self, other: &Usage) {
        if other.is_empty() {
            return;
        }
        self.cost = match (self.cost.take(), &other.cost) {
            (Some(mine), Some(theirs)) if mine.currency == theirs.currency => Some(Cost {
                amount: mine.amount + theirs.amount,
                currency: mine.currency,
            }),
            (None, Some(theirs)) if self.is_empty() => Some(theirs.clone()),
            _ => None,
        };
        self.estimated |= other.estimated;
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
        self.thought_tokens = add_optional(self.thought_tokens, other.thought_tokens);
        self.cached_read_tokens = add_optional(self.cached_read_tokens, other.cached_read_tokens);
        self.cached_write_tokens =
            add_optional(self.cached_write_tokens, other.cached_write_tokens);
    }

    /// What was spent since `earlier` (a figure of the same reports, taken before): each count
    /// less `earlier`'s (never below zero), the cost likewise when both are in one currency.
    #[must_use]
    pub fn since(&self, earlier: &Usage) -> Usage {
        let less = |now: Option<u64>, then: Option<u64>| {
            now.map(|now| now.saturating_sub(then.unwrap_or(0)))
        };
        Usage {
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
            total_tokens: self.total_tokens.saturating_sub(earlier.total_tokens),
            thought_tokens: less(self.thought_tokens, earlier.thought_tokens),
            cached_read_tokens: less(self.cached_read_tokens, earlier.cached_read_tokens),
            cached_write_tokens: less(self.cached_write_tokens, earlier.cached_write_tokens),
            cost: match (&self.cost, &earlier.cost) {
                (Some(now), Some(then)) if now.currency == then.currency => Some(Cost {
                    amount: (now.amount - then.amount).max(0.0),
                    currency: now.currency.clone(),
                }),
                (Some(now), None) => Some(now.clone()),
                _ => None,
            },
            estimated: self.estimated,
        }
    }

    /// The sum of `parts` (`None` when there are none).
    #[must_use]
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a Usage>) -> Option<Usage> {
        let mut parts = parts.into_iter();
        let mut total = parts.next()?.clone();
        for part in parts {
            total.add(part);
        }
        Some(total)
    }

    /// The prompt response's `usage`, as ACP types it (no cost: ACP reports cost on
    /// `usage_update` only).
    #[must_use]
    pub fn from_acp(usage: &acp::Usage) -> Usage {
        Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            thought_tokens: usage.thought_tokens,
            cached_read_tokens: usage.cached_read_tokens,
            cached_write_tokens: usage.cached_write_tokens,
            cost: None,
            estimated: false,
        }
    }

    /// As a prompt response's `usage`.
    #[must_use]
    pub fn to_acp(&self) -> acp::Usage {
        acp::Usage::new(self.total_tokens, self.input_tokens, self.output_tokens)
            .thought_tokens(self.thought_tokens)
            .cached_read_tokens(self.cached_read_tokens)
            .cached_write_tokens(self.cached_write_tokens)
    }

    /// The counts as a `_meta` carrying the extension: `{"acp-host/usage": {"version": 1,
    /// "inputTokens": ..., ..., "cost": ...}}`. On a `usage_update` the cost rides on the update
    /// too; on a `session_info_update` (an agent that knows no context window, so can send no
    /// `usage_update`) the extension is all there is.
    #[must_use]
    pub fn to_meta(&self) -> acp::Meta {
        let mut counts = serde_json::to_value(self).unwrap_or_default();
        if let Some(object) = counts.as_object_mut() {
            object.insert("version".into(), META_VERSION.into());
        }
        let mut meta = acp::Meta::new();
        meta.insert(META_KEY.into(), counts);
        meta
    }

    /// The counts (and cost, when given) of the extension in a `_meta`, when present, of this
    /// version and well formed.
    #[must_use]
    pub fn from_meta(meta: Option<&acp::Meta>) -> Option<Usage> {
        let counts = meta?.get(META_KEY)?;
        if counts.get("version").and_then(serde_json::Value::as_u64) != Some(META_VERSION) {
            return None;
        }
        serde_json::from_value(counts.clone()).ok()
    }

    /// One line for people: `1,234 tokens (1,000 in, 234 out), 0.0123 USD`.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut line = format!(
            "{} tokens ({} in, {} out)",
            thousands(self.total_tokens),
            thousands(self.input_tokens),
            thousands(self.output_tokens)
        );
        if let Some(cost) = &self.cost {
            line.push_str(", ");
            line.push_str(&cost.describe());
        }
        if self.estimated {
            line.push_str(" (estimated)");
        }
        line
    }
}

impl Cost {
    /// `0.0123 USD`: four decimals, enough for a cheap model's single request.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("{:.4} {}", self.amount, self.currency)
    }
}

fn add_optional(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// `1234567` as `1,234,567`.
#[must_use]
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A turn's usage split into the agent's own and each child's (in the order they ended), as
/// acp-child reports it in the prompt response's `_meta` (`acp-host/usage`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    /// What the agent's own model requests spent.
    pub own: Usage,
    /// Each child that reported usage, at most [`MAX_BREAKDOWN_CHILDREN`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildUsage>,
    /// Children that reported usage but are not listed (counted in the turn's total).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children_dropped: Option<u64>,
    /// The agent ended the turn (`max_tokens`) because of the session's budget
    /// (docs/start-extension.md, the start extension's `budget`): what it would have passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_stop: Option<Overrun>,
}

/// One child's share of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildUsage {
    /// The subagent's name (its definition or agent).
    pub name: String,
    pub usage: Usage,
}

impl Breakdown {
    /// Adds a child's share (listed while there is room).
    pub fn push_child(&mut self, name: &str, usage: Usage) {
        if self.children.len() < MAX_BREAKDOWN_CHILDREN {
            self.children.push(ChildUsage {
                name: name.to_owned(),
                usage,
            });
        } else {
            self.children_dropped = Some(self.children_dropped.unwrap_or(0) + 1);
        }
    }

    /// Whether any part is an estimate (the turn's `usage` then is too).
    #[must_use]
    pub fn estimated(&self) -> bool {
        self.own.estimated || self.children.iter().any(|child| child.usage.estimated)
    }

    /// As the `_meta` of a prompt response: `{"acp-host/usage": {"version": 1, "own": ...,
    /// "children": [...]}}`, with `"estimated": true` when the turn's `usage` is an estimate
    /// (ACP's `usage` has no such field: [`answer_estimated`] reads it).
    #[must_use]
    pub fn to_meta(&self) -> acp::Meta {
        // A struct serializes to an object (and `Null`, were it to fail, indexes as an empty one).
        let mut value = serde_json::to_value(self).unwrap_or_default();
        value["version"] = META_VERSION.into();
        if self.estimated() {
            value["estimated"] = true.into();
        }
        let mut meta = acp::Meta::new();
        meta.insert(META_KEY.into(), value);
        meta
    }
}

/// Whether a prompt response (the raw answer) marks its `usage` as an estimate, in the
/// extension of its `_meta` ([`Breakdown::to_meta`]).
#[must_use]
pub fn answer_estimated(response: &serde_json::Value) -> bool {
    response
        .get("_meta")
        .and_then(|meta| meta.get(META_KEY))
        .filter(|value| {
            value.get("version").and_then(serde_json::Value::as_u64) == Some(META_VERSION)
        })
        .and_then(|value| value.get("estimated"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false)
}

/// The budget stop a prompt response reports in the extension of its `_meta`
/// ([`Breakdown::budget_stop`]), when there is one of this version and well formed.
#[must_use]
pub fn answer_budget_stop(response: &serde_json::Value) -> Option<Overrun> {
    let value = response.get("_meta")?.get(META_KEY)?;
    if value.get("version").and_then(serde_json::Value::as_u64) != Some(META_VERSION) {
        return None;
    }
    serde_json::from_value(value.get("budgetStop")?.clone()).ok()
}

/// What a person priced the model at (acp-child's `--price-input`, `--price-output`,
/// `--price-currency`), per million tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Pricing {
    pub input_per_million: f64,
    pub output_per_million: f64,
    pub currency: String,
}

/// The default of `--price-currency`.
pub const DEFAULT_CURRENCY: &str = "USD";

impl Pricing {
    /// The cost of `usage` at these prices: input and output tokens (reasoning tokens are part of
    /// the output count servers report; cached input is priced as input).
    #[must_use]
    pub fn cost(&self, usage: &Usage) -> Cost {
        #[expect(
            clippy::cast_precision_loss,
            reason = "token counts stay far below 2^52; a cost is a float anyway"
        )]
        let amount = usage.input_tokens as f64 * self.input_per_million / 1e6
            + usage.output_tokens as f64 * self.output_per_million / 1e6;
        Cost {
            amount,
            currency: self.currency.clone(),
        }
    }
}

/// What a run may spend: tokens (`--token-budget`, `tokenBudget`) and cost (`--cost-budget`,
/// `costBudget`, in the agent's currency).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
}

/// The error of a budgeted run whose agent reported no usage by the end of its first reply.
pub const UNREPORTED_USAGE: &str = "the agent reports no usage; the budget cannot be held";
/// The error of a cost-budgeted run whose agent reported token counts but no cost by then.
pub const UNREPORTED_COST: &str = "the agent reports no cost; the cost budget cannot be held";

/// What a budgeted run does when its agent reported no usage (or no cost, for a cost budget) by
/// the end of its first reply ([`Budget::unheld`]): `--on-unreported`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Unreported {
    /// Cancel the run: status `error`, `errorKind: "budget"`. A cap that does not cap must not
    /// pass silently.
    #[default]
    Error,
    /// Let it run to its end and say so in the result's `warnings`.
    Warn,
}

impl Unreported {
    /// The names, as `--on-unreported` takes them.
    pub const NAMES: &'static str = "error, warn";

    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "error" => Some(Self::Error),
            "warn" => Some(Self::Warn),
            _ => None,
        }
    }
}

/// A cost limit (`run.costBudget`, `--cost-budget`): a finite amount of zero or more (in the
/// agent's currency), so it compares totally and a settled run can be `Eq`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(transparent)]
pub struct CostLimit(f64);

// Never NaN (see `CostLimit::new`): equality is total.
impl Eq for CostLimit {}

impl CostLimit {
    /// `amount` as a limit; `None` unless it is finite and not negative.
    #[must_use]
    pub fn new(amount: f64) -> Option<Self> {
        (amount.is_finite() && amount >= 0.0).then_some(Self(amount))
    }

    #[must_use]
    pub fn amount(self) -> f64 {
        self.0
    }

    /// The lowest of the limits given: a budget is only ever lowered.
    #[must_use]
    pub fn lowest(limits: impl IntoIterator<Item = Option<CostLimit>>) -> Option<CostLimit> {
        limits
            .into_iter()
            .flatten()
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }
}

/// A budget passed: which figure, how much was spent, and the limit; or, where the agent holds
/// its budget itself, the model request it did not send because it would have passed it.
/// Serialized (tagged `passed`) as an agent's budget stop in a prompt response's
/// [`Breakdown`].
#[derive(
    Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(
    tag = "passed",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Overrun {
    #[error("used {} tokens, over the token budget of {}", thousands(*.used), thousands(*.limit))]
    Tokens { used: u64, limit: u64 },
    #[error("spent {used:.4} {currency}, over the cost budget of {limit:.4} {currency}")]
    Cost {
        used: f64,
        limit: f64,
        currency: String,
    },
    #[error(
        "used {} tokens, and the next model request (about {} tokens) would pass the token budget of {}: the agent ended its turn before sending it",
        thousands(*.used), thousands(*.next), thousands(*.limit)
    )]
    NextTokens { used: u64, next: u64, limit: u64 },
    #[error(
        "spent {used:.4} {currency}, and the next model request (about {next:.4} {currency}) would pass the cost budget of {limit:.4} {currency}: the agent ended its turn before sending it"
    )]
    NextCost {
        used: f64,
        next: f64,
        limit: f64,
        currency: String,
    },
}

impl Budget {
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.tokens.is_some() || self.cost.is_some()
    }

    /// Whether `spent` (what the agent reported so far) passed the budget.
    #[must_use]
    pub fn check(&self, spent: &Usage) -> Option<Overrun> {
        if let Some(limit) = self.tokens
            && spent.total_tokens > limit
        {
            return Some(Overrun::Tokens {
                used: spent.total_tokens,
                limit,
            });
        }
        if let (Some(limit), Some(cost)) = (self.cost, &spent.cost)
            && cost.amount > limit
        {
            return Some(Overrun::Cost {
                used: cost.amount,
                limit,
                currency: cost.currency.clone(),
            });
        }
        None
    }

    /// Whether spending `next` (a model request about to be sent, estimated) on top of `spent`
    /// would pass the budget: the agent holding its budget then ends its turn instead. A cost is
    /// compared only when both have one, in one currency.
    #[must_use]
    pub fn would_pass(&self, spent: &Usage, next: &Usage) -> Option<Overrun> {
        if let Some(limit) = self.tokens
            && spent.total_tokens.saturating_add(next.total_tokens) > limit
        {
            return Some(Overrun::NextTokens {
                used: spent.total_tokens,
                next: next.total_tokens,
                limit,
            });
        }
        let used = spent.cost.as_ref().map_or(0.0, |cost| cost.amount);
        if let (Some(limit), Some(cost)) = (self.cost, &next.cost)
            && spent
                .cost
                .as_ref()
                .is_none_or(|spent| spent.currency == cost.currency)
            && used + cost.amount > limit
        {
            return Some(Overrun::NextCost {
                used,
                next: cost.amount,
                limit,
                currency: cost.currency.clone(),
            });
        }
        None
    }

    /// Why this budget cannot be held on `spent` (`None` when it can, or there is none): the
    /// agent reported no usage, or a cost budget without a reported cost. For the result's
    /// warning (`--on-unreported warn`).
    #[must_use]
    pub fn unenforceable(&self, spent: Option<&Usage>) -> Option<&'static str> {
        match spent {
            None if self.is_set() => {
                Some("the agent reported no usage, so the budget could not be held (usage is null)")
            }
            Some(spent) if self.cost.is_some() && spent.cost.is_none() => {
                Some("the agent reported no cost, so the cost budget could not be held")
            }
            _ => None,
        }
    }

    /// Why this budget cannot be held, judged when the agent's first reply ended (its first
    /// prompt response: the latest an agent reporting through ACP reports a turn's usage) on
    /// what it reported by then (`counts`: token counts came; `cost`: a cost came): the error
    /// of a run that `--on-unreported error` (the default) then cancels. `None` when it can be
    /// held, or there is no budget.
    #[must_use]
    pub fn unheld(&self, counts: bool, cost: bool) -> Option<&'static str> {
        let cost_unheld = self.cost.is_some() && !cost;
        if !counts && (self.tokens.is_some() || cost_unheld) {
            Some(UNREPORTED_USAGE)
        } else if cost_unheld {
            Some(UNREPORTED_COST)
        } else {
            None
        }
    }

    /// The smaller of each figure of the two (either may be unset).
    #[must_use]
    pub fn lowered(self, other: Budget) -> Budget {
        Budget {
            tokens: min_option(self.tokens, other.tokens),
            cost: match (self.cost, other.cost) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

fn min_option(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A child's token budget: the one it asks for (a definition's `tokenBudget`), at most the
/// parent's per-child limit (`--subagent-token-budget`) and what is left of the parent's own
/// budget. Never raised: each given figure can only lower it.
#[must_use]
pub fn child_budget(asked: Option<u64>, per_child: Option<u64>, left: Option<u64>) -> Option<u64> {
    min_option(min_option(asked, per_child), left)
}

/// What is left of a token budget after `spent`: `None` when there is no budget.
#[must_use]
pub fn left(budget: Option<u64>, spent: u64) -> Option<u64> {
    budget.map(|limit| limit.saturating_sub(spent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spending_since_an_earlier_figure_keeps_a_cost_only_in_one_currency() {
        let now = priced(30, 10, 0.5, "USD");
        assert_eq!(
            now.since(&usage(10, 5)),
            priced(20, 5, 0.5, "USD"),
            "no earlier cost: all of it is new"
        );
        assert_eq!(now.since(&priced(10, 5, 0.2, "EUR")).cost, None);
        assert_eq!(usage(3, 3).since(&priced(1, 1, 0.1, "USD")).cost, None);
    }

    #[test]
    fn a_prompt_responses_usage_round_trips_without_a_cost() {
        let spent = Usage {
            thought_tokens: Some(4),
            cached_read_tokens: Some(2),
            cached_write_tokens: Some(1),
            ..priced(10, 5, 0.3, "USD")
        };
        let wire = spent.to_acp();
        assert_eq!(
            (wire.total_tokens, wire.input_tokens, wire.output_tokens),
            (15, 10, 5)
        );
        assert_eq!(
            Usage::from_acp(&wire),
            Usage {
                cost: None,
                ..spent
            }
        );
    }

    #[test]
    fn a_breakdown_lists_children_while_there_is_room_and_counts_the_rest() {
        let mut breakdown = Breakdown {
            own: usage(1, 1),
            ..Breakdown::default()
        };
        for n in 0..MAX_BREAKDOWN_CHILDREN + 2 {
            breakdown.push_child(&format!("child-{n}"), usage(2, 2));
        }
        assert_eq!(breakdown.children.len(), MAX_BREAKDOWN_CHILDREN);
        assert_eq!(breakdown.children[0].name, "child-0");
        assert_eq!(breakdown.children_dropped, Some(2));
        let meta = breakdown.to_meta();
        let value = &meta[META_KEY];
        assert_eq!(value["version"], META_VERSION);
        assert_eq!(value["own"]["inputTokens"], 1);
        assert_eq!(value["childrenDropped"], 2);
        assert_eq!(
            value["children"].as_array().map(Vec::len),
            Some(MAX_BREAKDOWN_CHILDREN)
        );
    }

    #[test]
    fn a_cost_limit_keeps_its_amount_and_a_lowered_budget_takes_the_smaller_figure() {
        assert_eq!(CostLimit::new(0.25).map(CostLimit::amount), Some(0.25));
        let lowered = Budget {
            tokens: Some(100),
            cost: Some(0.5),
        }
        .lowered(Budget {
            tokens: None,
            cost: Some(0.2),
        });
        assert_eq!(
            lowered,
            Budget {
                tokens: Some(100),
                cost: Some(0.2)
            }
        );
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            total_tokens: input + output,
            ..Usage::default()
        }
    }

    fn priced(input: u64, output: u64, amount: f64, currency: &str) -> Usage {
        Usage {
            cost: Some(Cost {
                amount,
                currency: currency.into(),
            }),
            ..usage(input, output)
        }
    }

    #[test]
    fn sums_add_every_count_and_keep_optional_ones_optional() {
        let mut total = usage(10, 5);
        total.add(&Usage {
            thought_tokens: Some(3),
            ..usage(1, 2)
        });
        assert_eq!(total.input_tokens, 11);
        assert_eq!(total.output_tokens, 7);
        assert_eq!(total.total_tokens, 18);
        assert_eq!(total.thought_tokens, Some(3));
        assert_eq!(total.cached_read_tokens, None);
        assert_eq!(Usage::sum([]), None);
        assert_eq!(Usage::sum([&usage(1, 1), &usage(2, 2)]), Some(usage(3, 3)));
    }

    #[test]
    fn a_sum_has_a_cost_only_when_every_part_that_spent_reported_one_in_one_currency() {
        let mut both = priced(1, 1, 0.5, "USD");
        both.add(&priced(1, 1, 0.25, "USD"));
        assert_eq!(both.cost.as_ref().map(|c| c.amount), Some(0.75));
        // An empty part changes nothing; an empty total takes the other's cost.
        both.add(&Usage::default());
        assert_eq!(both.cost.as_ref().map(|c| c.amount), Some(0.75));
        let mut empty = Usage::default();
        empty.add(&priced(1, 1, 0.5, "EUR"));
        assert_eq!(
            empty.cost.as_ref().map(|c| c.currency.as_str()),
            Some("EUR")
        );
        let mut mixed = priced(1, 1, 0.5, "USD");
        mixed.add(&priced(1, 1, 0.5, "EUR"));
        assert_eq!(mixed.cost, None);
        let mut partial = priced(1, 1, 0.5, "USD");
        partial.add(&usage(1, 1));
        assert_eq!(
            partial.cost, None,
            "an unpriced part makes the sum unpriced"
        );
        partial.add(&priced(1, 1, 0.5, "USD"));
        assert_eq!(partial.cost, None, "and it stays so");
    }

    #[test]
    fn what_was_spent_since_an_earlier_figure() {
        let now = Usage {
            thought_tokens: Some(5),
            ..priced(30, 10, 0.75, "USD")
        };
        let then = priced(10, 4, 0.25, "USD");
        let since = now.since(&then);
        assert_eq!(since.input_tokens, 20);
        assert_eq!(since.output_tokens, 6);
        assert_eq!(since.total_tokens, 26);
        assert_eq!(since.thought_tokens, Some(5));
        assert_eq!(since.cost.map(|c| c.amount), Some(0.5));
        assert_eq!(then.since(&now).total_tokens, 0, "never below zero");
        let nothing = now.since(&now);
        assert_eq!(nothing.total_tokens, 0);
        assert_eq!(nothing.cost.map(|c| c.amount), Some(0.0));
    }

    #[test]
    fn the_meta_extension_round_trips_counts_and_refuses_other_versions() {
        let spent = Usage {
            cached_read_tokens: Some(4),
            ..priced(10, 5, 1.0, "USD")
        };
        let meta = spent.to_meta();
        assert_eq!(
            serde_json::Value::Object(meta.clone()),
            serde_json::json!({"acp-host/usage": {"version": 1, "inputTokens": 10,
                "outputTokens": 5, "totalTokens": 15, "cachedReadTokens": 4,
                "cost": {"amount": 1.0, "currency": "USD"}}})
        );
        assert_eq!(Usage::from_meta(Some(&meta)), Some(spent));
        let mut other = meta.clone();
        other[META_KEY]["version"] = 2.into();
        assert_eq!(Usage::from_meta(Some(&other)), None);
        assert_eq!(Usage::from_meta(None), None);
        let mut broken = meta;
        broken[META_KEY]["inputTokens"] = "ten".into();
        assert_eq!(Usage::from_meta(Some(&broken)), None);
    }

    #[test]
    fn budgets_pass_only_on_reported_figures_over_the_limit() {
        let budget = Budget {
            tokens: Some(100),
            cost: Some(0.5),
        };
        assert_eq!(
            budget.check(&usage(50, 50)),
            None,
            "at the limit is within it"
        );
        assert_eq!(
            budget
                .check(&usage(50, 51))
                .map(|o| o.to_string())
                .as_deref(),
            Some("used 101 tokens, over the token budget of 100")
        );
        assert_eq!(
            budget
                .check(&priced(1, 1, 0.75, "USD"))
                .map(|o| o.to_string())
                .as_deref(),
            Some("spent 0.7500 USD, over the cost budget of 0.5000 USD")
        );
        assert_eq!(budget.check(&usage(1, 1)), None, "no cost reported");
        assert!(budget.unenforceable(None).is_some());
        assert!(budget.unenforceable(Some(&usage(1, 1))).is_some());
        assert_eq!(budget.unenforceable(Some(&priced(1, 1, 0.1, "USD"))), None);
        assert_eq!(Budget::default().unenforceable(None), None);
        let thousand = Budget {
            tokens: Some(1_000),
            cost: None,
        };
        assert_eq!(
            thousand
                .check(&usage(1_000, 234))
                .map(|o| o.to_string())
                .as_deref(),
            Some("used 1,234 tokens, over the token budget of 1,000")
        );
    }

    #[test]
    fn an_agent_holding_its_budget_stops_before_a_request_that_would_pass_it() {
        let budget = Budget {
            tokens: Some(100),
            cost: Some(0.5),
        };
        assert_eq!(budget.would_pass(&usage(40, 10), &usage(50, 0)), None);
        let stop = budget.would_pass(&usage(40, 10), &usage(51, 0)).unwrap();
        assert_eq!(
            stop.to_string(),
            "used 50 tokens, and the next model request (about 51 tokens) would pass the token \
             budget of 100: the agent ended its turn before sending it"
        );
        let cost = budget
            .would_pass(&priced(1, 1, 0.25, "USD"), &priced(1, 0, 0.3, "USD"))
            .unwrap();
        assert_eq!(
            cost.to_string(),
            "spent 0.2500 USD, and the next model request (about 0.3000 USD) would pass the cost \
             budget of 0.5000 USD: the agent ended its turn before sending it"
        );
        assert!(
            budget
                .would_pass(&usage(1, 1), &priced(1, 0, 0.6, "USD"))
                .is_some(),
            "nothing spent yet"
        );
        assert_eq!(
            budget.would_pass(&priced(1, 1, 0.25, "EUR"), &priced(1, 0, 0.3, "USD")),
            None,
            "two currencies do not add up"
        );
        // Carried in a prompt response's breakdown, and read back.
        let breakdown = Breakdown {
            budget_stop: Some(stop.clone()),
            ..Breakdown::default()
        };
        let answer = serde_json::json!({"stopReason": "max_tokens", "_meta": breakdown.to_meta()});
        assert_eq!(
            answer["_meta"][META_KEY]["budgetStop"],
            serde_json::json!({"passed": "nextTokens", "used": 50, "next": 51, "limit": 100})
        );
        assert_eq!(answer_budget_stop(&answer), Some(stop));
        assert_eq!(answer_budget_stop(&serde_json::json!({})), None);
        let mut other = answer;
        other["_meta"][META_KEY]["version"] = 2.into();
        assert_eq!(answer_budget_stop(&other), None);
    }

    #[test]
    fn a_budget_is_unheld_when_nothing_or_no_cost_was_reported_by_the_first_reply() {
        let tokens = Budget {
            tokens: Some(10),
            cost: None,
        };
        let cost = Budget {
            tokens: None,
            cost: Some(0.1),
        };
        assert_eq!(tokens.unheld(false, false), Some(UNREPORTED_USAGE));
        assert_eq!(
            tokens.unheld(false, true),
            Some(UNREPORTED_USAGE),
            "a cost alone"
        );
        assert_eq!(cost.unheld(false, false), Some(UNREPORTED_USAGE));
        assert_eq!(
            cost.unheld(false, true),
            None,
            "a cost alone holds a cost budget"
        );
        assert_eq!(tokens.unheld(true, false), None);
        assert_eq!(cost.unheld(true, false), Some(UNREPORTED_COST));
        assert_eq!(cost.unheld(true, true), None);
        assert_eq!(Budget::default().unheld(false, false), None);
        assert_eq!(Unreported::parse("warn"), Some(Unreported::Warn));
        assert_eq!(Unreported::parse("error"), Some(Unreported::default()));
        assert_eq!(Unreported::parse("ignore"), None);
        assert_eq!(Unreported::NAMES, "error, warn");
    }

    #[test]
    fn budgets_only_go_down_the_tree() {
        assert_eq!(child_budget(None, None, None), None);
        assert_eq!(child_budget(Some(500), None, None), Some(500));
        assert_eq!(child_budget(Some(500), Some(300), None), Some(300));
        assert_eq!(child_budget(Some(500), Some(800), Some(200)), Some(200));
        assert_eq!(child_budget(None, Some(800), Some(900)), Some(800));
        assert_eq!(left(Some(100), 30), Some(70));
        assert_eq!(left(Some(100), 300), Some(0));
        assert_eq!(left(None, 300), None);
        let lowered = Budget {
            tokens: Some(10),
            cost: None,
        }
        .lowered(Budget {
            tokens: Some(20),
            cost: Some(1.0),
        });
        assert_eq!(lowered.tokens, Some(10));
        assert_eq!(lowered.cost, Some(1.0));
    }

    #[test]
    fn pricing_is_per_million_tokens() {
        let pricing = Pricing {
            input_per_million: 2.0,
            output_per_million: 8.0,
            currency: "USD".into(),
        };
        let cost = pricing.cost(&usage(500_000, 250_000));
        assert!((cost.amount - 3.0).abs() < 1e-9);
        assert_eq!(cost.currency, "USD");
        assert_eq!(cost.describe(), "3.0000 USD");
    }

    #[test]
    fn an_estimate_counts_deltas_or_bytes_whichever_is_more_and_marks_every_sum() {
        let spent = estimate(401, 10, 12);
        assert_eq!(
            (spent.input_tokens, spent.output_tokens, spent.total_tokens),
            (101, 10, 111)
        );
        assert!(spent.estimated);
        assert_eq!(estimate(0, 2, 40).output_tokens, 10, "long deltas: bytes");
        let mut total = usage(1, 1);
        total.add(&spent);
        assert!(total.estimated, "a sum with an estimate in it is one");
        assert!(total.since(&usage(1, 1)).estimated);
        assert!(!Usage::from_acp(&total.to_acp()).estimated);
        assert_eq!(spent.describe(), "111 tokens (101 in, 10 out) (estimated)");
        let serialized = serde_json::to_value(&spent).unwrap();
        assert_eq!(serialized["estimated"], true);
        assert!(
            serde_json::to_value(usage(1, 1))
                .unwrap()
                .get("estimated")
                .is_none()
        );
        let mut breakdown = Breakdown::default();
        assert!(!breakdown.estimated());
        breakdown.push_child("c", spent);
        assert!(breakdown.estimated());
        let answer = serde_json::json!({"stopReason": "end_turn", "_meta": breakdown.to_meta()});
        assert!(answer_estimated(&answer));
        assert!(!answer_estimated(
            &serde_json::json!({"stopReason": "end_turn"})
        ));
        let mut other = answer;
        other["_meta"][META_KEY]["version"] = 2.into();
        assert!(!answer_estimated(&other), "another version is not read");
    }

    #[test]
    fn people_read_thousands_separated_counts() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(
            priced(1_000, 234, 0.01234, "USD").describe(),
            "1,234 tokens (1,000 in, 234 out), 0.0123 USD"
        );
    }
}
