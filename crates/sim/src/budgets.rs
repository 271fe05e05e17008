//! The retry budgets the simulations compare, each with its own defaults.

use std::fmt;

use tower_backoff_core::budget::TokenBucket;
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::{BackoffBuilder, BackoffLayer, BackoffRetry};

/// A budget semantics to compare, on the same layer otherwise.
///
/// Every budget is built with its type's defaults, so the tables show what a
/// user gets by naming the type and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetKind {
    /// No budget: only the attempt limit bounds retries.
    None,
    /// What a layer built with no budget option gets
    /// ([`BackoffLayer::builder`](tower_backoff_core::BackoffLayer::builder)).
    Default,
    /// [`TokenBucket::new`]: the AWS SDKs' standard mode (500 tokens, a
    /// retry costs 5, 10 after a timeout; a success refunds 1, or the cost
    /// of the retry that led to it).
    TokenBucket,
    /// A [`TokenBucket`] earning on requests, as Finagle's `RetryBudget`:
    /// each first attempt earns a fifth of a retry, whatever its outcome,
    /// plus a reserve of 100 retries.
    ShareOfRequests,
}

impl BudgetKind {
    /// Every kind, in the order the tables show them.
    pub const ALL: [BudgetKind; 4] = [
        BudgetKind::None,
        BudgetKind::Default,
        BudgetKind::TokenBucket,
        BudgetKind::ShareOfRequests,
    ];

    /// A short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            BudgetKind::None => "no budget",
            BudgetKind::Default => "defaults",
            BudgetKind::TokenBucket => "token bucket (AWS)",
            BudgetKind::ShareOfRequests => "20 % of requests (Finagle)",
        }
    }

    /// `builder` with this budget; [`Default`](BudgetKind::Default) leaves
    /// it as it is.
    ///
    /// # Errors
    /// Never for the built-in settings.
    pub fn apply<P>(self, builder: BackoffBuilder<P>) -> Result<BackoffBuilder<P>, ConfigError> {
        Ok(match self {
            BudgetKind::None => builder.no_budget(),
            BudgetKind::Default => builder,
            BudgetKind::TokenBucket => builder.budget(TokenBucket::new()),
            BudgetKind::ShareOfRequests => builder.budget(
                TokenBucket::builder()
                    .capacity(500)
                    .timeout_cost(5)
                    .success_refund(0)
                    .request_deposit(1)
                    .build()?,
            ),
        })
    }
}

impl BudgetKind {
    /// `count` layers with the layer's defaults and this budget, layer `i`
    /// seeding its jitter with `seed + i`: independent processes, a budget
    /// each.
    pub(crate) fn per_process(
        self,
        count: usize,
        seed: u64,
    ) -> Result<Vec<BackoffLayer>, ConfigError> {
        (0..count as u64)
            .map(|i| {
                self.apply(BackoffLayer::builder().seed(seed.wrapping_add(i)))?
                    .build()
            })
            .collect()
    }
}

/// A client maker that wraps each clone in the next of `layers`.
pub(crate) fn one_layer_each<S: Clone>(
    layers: &[BackoffLayer],
) -> impl FnMut(S) -> BackoffRetry<S> + '_ {
    let mut layers = layers.iter();
    move |inner| {
        let layer = layers.next().expect("one layer per clone");
        tower_layer::Layer::layer(layer, inner)
    }
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
